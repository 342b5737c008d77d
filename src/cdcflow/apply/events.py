"""Decoded events as Arrow rows: the form that crosses from Spark executors to the apply.

:func:`decode_kafka_batch` is what runs inside Spark's ``mapInArrow``: it takes an Arrow
batch with the columns of Spark's Kafka source and returns an Arrow batch of
:data:`EVENT_SCHEMA` rows, one per decoded event, skipped record or dead letter, so
every consumed record is accounted for (``kind`` says which).

Row images travel as canonical JSON (``cdcflow decode`` form: decimals as strings,
dates/timestamps ISO-8601, binary base64) beside ``columns``, the logical type of every
column, from which :mod:`cdcflow.apply.typing` rebuilds typed Arrow columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa

from cdcflow.formats.base import Decoder, DecodeResult, Record
from cdcflow.model import ROW_OPS, Op, Origin, dumps, seq_key
from cdcflow.types import infer_type

__all__ = [
    "EVENT_SCHEMA",
    "KIND_DEAD",
    "KIND_EVENT",
    "KIND_JOINED",
    "KIND_SKIP",
    "decode_kafka_batch",
    "flatten",
    "records_from_kafka_batch",
]

KIND_EVENT = "event"
KIND_JOINED = "joined"  # decoded, and its change is part of another record's event
KIND_SKIP = "skip"
KIND_DEAD = "dead"

#: One row per decoded event / skipped record / dead letter.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),  # event | joined | skip | dead
        pa.field("op", pa.string()),
        pa.field("format", pa.string()),
        pa.field("database", pa.string()),
        pa.field("schema", pa.string()),
        pa.field("table", pa.string()),
        pa.field("key", pa.string()),  # canonical JSON object, key columns in key order
        pa.field("old_key", pa.string()),  # key of the before image when an update moved it
        pa.field("before", pa.string()),  # canonical JSON object or null
        pa.field("after", pa.string()),
        pa.field("partial", pa.bool_()),  # after image lacks some declared columns
        pa.field("columns", pa.string()),  # JSON {column: logical type}
        pa.field("seq", pa.string()),  # model.seq_key form
        pa.field("ts_ms", pa.int64()),
        pa.field("txn_id", pa.string()),
        pa.field("txn_order", pa.int64()),
        pa.field("txn_last", pa.bool_()),
        pa.field("ddl", pa.string()),
        pa.field("meta", pa.string()),  # JSON object
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("event_index", pa.int32()),  # position among one record's events
        pa.field("reason", pa.string()),  # skip reason or dead-letter code
        pa.field("error", pa.string()),  # dead-letter message
        pa.field("raw_key", pa.binary()),  # dead letters only
        pa.field("raw_value", pa.binary()),  # dead letters only
    ]
)
_NAMES = EVENT_SCHEMA.names


def _json(obj: Any) -> str | None:
    return None if obj is None else dumps(obj).decode()


def flatten(result: DecodeResult) -> pa.RecordBatch:
    """Turn a :class:`DecodeResult` into one :data:`EVENT_SCHEMA` batch."""
    cols: dict[str, list[Any]] = {n: [] for n in _NAMES}
    index_in_record: dict[tuple[str, int, int], int] = {}

    def add(**values: Any) -> None:
        for n in _NAMES:
            cols[n].append(values.get(n))

    for e in result.events:
        o = e.origin
        pos = (o.topic, o.partition, o.offset)
        idx = index_in_record.get(pos, 0)
        index_in_record[pos] = idx + 1
        columns = dict(e.columns) if e.columns else {}
        partial = False
        if e.op in ROW_OPS:
            image = e.after if e.after is not None else e.before
            if e.op is Op.UPDATE and e.after is not None and columns:
                partial = any(c not in e.after for c in columns)
            if image:
                for c, v in image.items():
                    if c not in columns:
                        t = infer_type(v)
                        if t is not None:
                            columns[c] = t
        old_key = None
        if e.key is not None and e.before is not None and e.after is not None:
            if all(c in e.before for c in e.key):
                before_key = {c: e.before[c] for c in e.key}
                if before_key != e.key:
                    old_key = before_key
        txn = e.txn
        add(
            kind=KIND_EVENT,
            op=e.op.value,
            format=e.source.format,
            database=e.source.database,
            schema=e.source.schema,
            table=e.source.table,
            key=_json(e.key),
            old_key=_json(old_key),
            before=_json(e.before),
            after=_json(e.after),
            partial=partial,
            columns=_json(columns) if columns else None,
            seq=seq_key(e.seq),
            ts_ms=e.ts_ms,
            txn_id=txn.id if txn else None,
            txn_order=txn.order if txn else None,
            txn_last=txn.last if txn else None,
            ddl=e.ddl,
            meta=_json(
                {**(e.meta or {}), **({"changed": list(e.changed)} if e.changed else {})}
            )
            if (e.meta or e.changed)
            else None,
            topic=o.topic,
            partition=o.partition,
            offset=o.offset,
            event_index=idx,
        )
    for o in result.decoded_origins:
        if (o.topic, o.partition, o.offset) not in index_in_record:
            add(kind=KIND_JOINED, reason="JOINED", topic=o.topic, partition=o.partition, offset=o.offset)
    for s in result.skipped:
        o = s.origin
        add(kind=KIND_SKIP, reason=s.reason, topic=o.topic, partition=o.partition, offset=o.offset)
    for d in result.dead_letters:
        o = d.origin
        add(
            kind=KIND_DEAD,
            format=d.format,
            reason=d.code,
            error=d.message,
            topic=o.topic,
            partition=o.partition,
            offset=o.offset,
            raw_key=d.key,
            raw_value=d.value,
        )
    return pa.RecordBatch.from_pydict(cols, schema=EVENT_SCHEMA)


def records_from_kafka_batch(batch: pa.RecordBatch) -> list[Record]:
    """Records from an Arrow batch with Spark's Kafka-source columns.

    Expects ``key``, ``value`` (binary), ``topic``, ``partition``, ``offset``; uses
    ``headers`` (list of struct key/value) and ``timestamp`` when present.
    """
    d = batch.to_pydict()
    n = batch.num_rows
    headers = d.get("headers") or [None] * n
    stamps = d.get("timestamp") or [None] * n
    out = []
    for i in range(n):
        h = headers[i]
        ts = stamps[i]
        out.append(
            Record(
                value=d["value"][i],
                key=d["key"][i],
                headers=tuple((x["key"], x["value"]) for x in h) if h else (),
                origin=Origin(d["topic"][i], d["partition"][i], d["offset"][i]),
                timestamp_ms=int(ts.timestamp() * 1000) if ts is not None else None,
            )
        )
    return out


def decode_kafka_batch(decoder: Decoder, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decode one Arrow batch of Kafka records into an :data:`EVENT_SCHEMA` batch."""
    return flatten(decoder.decode_batch(records_from_kafka_batch(batch)))


class DecodeFunction:
    """The picklable function handed to ``DataFrame.mapInArrow``.

    Args:
        format_name: registered format identifier.
        options: the format's options as a plain mapping.
    """

    def __init__(self, format_name: str, options: dict[str, Any] | None = None) -> None:
        self.format_name = format_name
        self.options = options or {}

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from cdcflow.formats import decoder_for

        decoder = decoder_for(self.format_name, self.options or None)
        for batch in batches:
            yield decode_kafka_batch(decoder, batch)


def loads(text: str | None) -> Any:
    """Parse a JSON column value (``None`` stays ``None``)."""
    return None if text is None else orjson.loads(text)

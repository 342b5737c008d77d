"""Kafka batches -> decoded event batches: the decode stage that runs in Spark's executors.

:func:`decode_kafka_batch` is what runs inside Spark's ``mapInArrow`` (or the fused
``cdcflow_changes`` source): it takes an Arrow batch with the columns of Spark's Kafka
source and returns an Arrow batch of :data:`~cdcflow.event_schema.EVENT_SCHEMA` rows, one
per decoded event, skipped record or dead letter, so every consumed record is accounted
for (``kind`` says which).

Row images travel as canonical JSON (``cdcflow decode`` form: decimals as strings,
dates/timestamps ISO-8601, binary base64) beside ``columns``, the logical type of every
column, from which :mod:`cdcflow.images` rebuilds typed Arrow columns.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import decimal
import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.errors import Code, SkipReason
from cdcflow.event_schema import EVENT_SCHEMA, KIND_DEAD, KIND_EVENT, KIND_JOINED, KIND_SKIP
from cdcflow.formats import decoder_for
from cdcflow.formats.base import (
    ColumnarEvents,
    Decoder,
    DecodeResult,
    FlatEvent,
    Record,
    Skipped,
    new_record,
)
from cdcflow.model import (
    ROW_OPS,
    ChangeEvent,
    DeadLetter,
    Op,
    Origin,
    dumps,
    json_default,
    new_origin,
    seq_key,
    seq_keys,
)
from cdcflow.types import infer_type

__all__ = [
    "DecodeFunction",
    "decode_kafka_batch",
    "decode_records",
    "flatten",
    "load_decoder_state",
    "records_from_kafka_batch",
]

_NAMES = EVENT_SCHEMA.names

#: a :class:`_ColumnsCache` key: the declared types, the image's column names and the
#: types of its values
_Shape = tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[type[Any], ...]]

_dumps = orjson.dumps
_OPTS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_NON_STR_KEYS


def _json(obj: Any) -> str | None:
    if obj is None:
        return None
    try:
        return _dumps(obj, default=json_default, option=_OPTS).decode()
    except orjson.JSONEncodeError:
        return dumps(obj).decode()  # integers beyond 64 bits


def _json_with_times(obj: Any) -> str | None:
    """:func:`_json` for images holding ``datetime.time`` values (see
    :data:`cdcflow.model.EXACT_TIME_OPTS`); slower, so only used for those."""
    if obj is None:
        return None
    return dumps(obj).decode()


#: Python type -> logical type, for images whose format declares no types.
_INFERRED = {bool: "boolean", float: "float64", str: "string", bytes: "binary"}


def _inferred(value: Any) -> str | None:
    t = _INFERRED.get(type(value))
    if t is not None:
        return t
    if type(value) is int:
        return "int64" if -(2**63) <= value < 2**63 else "decimal(38,0)"
    return infer_type(value)


class _ColumnsCache:
    """Canonical ``columns`` JSON, computed once per distinct (declared, image shape), and
    whether the table has ``time`` columns (their images need :func:`_json_with_times`)."""

    def __init__(self) -> None:
        self._shapes: dict[_Shape, tuple[str | None, bool]] = {}
        self._declared: dict[tuple[tuple[str, str], ...], tuple[str | None, bool]] = {}

    def get(
        self, declared: dict[str, str] | None, image: dict[str, Any] | None
    ) -> tuple[str | None, bool]:
        shape: _Shape = (
            tuple(declared.items()) if declared else (),
            tuple(image) if image else (),
            tuple(map(type, image.values())) if image else (),
        )
        cached = self._shapes.get(shape)
        if cached is not None:
            return cached
        columns = dict(declared) if declared else {}
        per_value = False
        for c, v in (image or {}).items():
            if c not in columns:
                t = _inferred(v)
                if t is not None:
                    columns[c] = t
                    # an undeclared decimal's precision/scale is this value's own: another
                    # row of the same shape may need more, so it is never cached
                    per_value = per_value or type(v) is decimal.Decimal
        has_time = "time" in columns.values() or any(
            type(v) is dt.time for v in (image or {}).values()
        )
        out = (_json(columns) if columns else None, has_time)
        if not per_value and len(self._shapes) < 10_000:
            self._shapes[shape] = out
        return out

    def of_declared(self, declared: dict[str, str]) -> tuple[str | None, bool]:
        """:meth:`get` for a flat event (:data:`~cdcflow.formats.base.FlatEvent`), whose
        declared types name every non-null value of its image: they are the whole
        declaration, so the image's shape is not needed for the key."""
        shape = tuple(declared.items())
        cached = self._declared.get(shape)
        if cached is None:
            cached = (_json(declared) if declared else None, "time" in declared.values())
            if len(self._declared) < 10_000:
                self._declared[shape] = cached
        return cached


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _int64(value: Any, what: str) -> Any:
    if value is not None and not (_INT64_MIN <= value <= _INT64_MAX):
        raise OverflowError(f"{what} {value} does not fit a 64-bit integer")
    return value


def _event_row(
    e: ChangeEvent,
    idx: int,
    cache: _ColumnsCache,
    state_of: Callable[[ChangeEvent], list[Any]] | None,
) -> tuple[Any, ...]:
    """The EVENT_SCHEMA values of one event (``columns`` still the full declaration).

    Raises:
        TypeError, ValueError, OverflowError: a value with no representation (JSON nested
            beyond orjson's 254 levels, an integer beyond 64 bits where Arrow needs int64).
    """
    src = e.source
    ek, eb, ea = e.key, e.before, e.after
    declared = e.columns
    if e.op in ROW_OPS:
        image = ea if ea is not None else eb
        decl, has_time = cache.get(declared, image)
        partial = (
            e.op is Op.UPDATE
            and ea is not None
            and (
                e.partial
                if e.partial is not None
                else declared is not None and any(c not in ea for c in declared)
            )
        )
    else:
        decl, has_time = cache.get(declared, None)
        partial = False
    image_json = _json_with_times if has_time else _json
    moved = None
    if ek is not None and eb is not None and ea is not None:
        moved = _moved_from(ek, eb)
    txn = e.txn
    meta = None
    if e.meta or e.changed:
        meta = _json({**(e.meta or {}), **({"changed": list(e.changed)} if e.changed else {})})
    items = state_of(e) if state_of is not None else None
    o = e.origin
    return (
        e.op.value,
        src.format,
        src.database,
        src.schema,
        src.table,
        image_json(ek),
        image_json(moved),
        image_json(eb),
        image_json(ea),
        partial,
        decl,
        e.seq,  # encoded for the whole batch by flatten (seq_keys)
        _int64(e.ts_ms, "ts_ms"),
        None if txn is None else txn.id,
        None if txn is None else _int64(txn.order, "txn order"),
        None if txn is None else txn.last,
        e.ddl,
        meta,
        o.topic,
        o.partition,
        o.offset,
        idx,
        _json(items) if items else None,
    )


def _moved_from(key: dict[str, Any], before: dict[str, Any]) -> dict[str, Any] | None:
    """The old key of an update whose before image holds another key (a row that moved),
    else ``None`` (same key, or a before image without the key columns)."""
    try:
        before_key = {c: before[c] for c in key}
    except KeyError:
        return None
    return before_key if before_key != key else None


def _flat_event_row(parts: FlatEvent, o: Origin, idx: int, cache: _ColumnsCache) -> tuple[Any, ...]:
    """The EVENT_SCHEMA values of a :data:`~cdcflow.formats.base.FlatEvent`: what
    :func:`_event_row` gives for its :class:`ChangeEvent` (no meta, DDL, state or
    partial update by the FlatEvent's contract), without building one.

    Raises:
        TypeError, ValueError, OverflowError: as :func:`_event_row`.
    """
    op, src, ek, eb, ea, declared, seq, ts_ms, txn = parts
    decl, has_time = cache.of_declared(declared)
    image_json = _json_with_times if has_time else _json
    moved = _moved_from(ek, eb) if eb is not None and ea is not None else None
    return (
        op.value,
        src.format,
        src.database,
        src.schema,
        src.table,
        image_json(ek),
        image_json(moved),
        image_json(eb),
        image_json(ea),
        False,
        decl,
        seq,
        _int64(ts_ms, "ts_ms"),
        None if txn is None else txn.id,
        None if txn is None else _int64(txn.order, "txn order"),
        None if txn is None else txn.last,
        None,
        None,
        o.topic,
        o.partition,
        o.offset,
        idx,
        None,
    )


_ROW_FIELDS = (
    "op",
    "format",
    "database",
    "schema",
    "table",
    "key",
    "old_key",
    "before",
    "after",
    "partial",
    "columns",
    "seq",
    "ts_ms",
    "txn_id",
    "txn_order",
    "txn_last",
    "ddl",
    "meta",
    "topic",
    "partition",
    "offset",
    "event_index",
    "state",
)


_SEQ_AT = _ROW_FIELDS.index("seq")


def _seq_keys_of(
    built: list[tuple[Any, ...]], failed: dict[tuple[str, int, int], str]
) -> list[str | None]:
    """The ``seq`` column of rows whose ``seq`` still holds the sequence tuple, encoded
    for the whole batch at once (:func:`~cdcflow.model.seq_keys`). A sequence that
    cannot be encoded fails its record (into ``failed``), as any other value does."""
    try:
        return seq_keys([r[_SEQ_AT] for r in built])
    except (TypeError, ValueError, OverflowError):
        keys: list[str | None] = []
        for r in built:
            try:
                keys.append(seq_key(r[_SEQ_AT]))
            except (TypeError, ValueError, OverflowError) as exc:
                message = f"event cannot be stored: {type(exc).__name__}: {exc}"
                failed.setdefault((r[18], r[19], r[20]), message)
                keys.append(None)
        return keys


@dataclass
class _MixedResult:
    """What :func:`_decode_mixed` gives: a :class:`DecodeResult` whose ``events`` hold,
    in record order, ``(FlatEvent, origin)`` pairs among the :class:`ChangeEvent` s."""

    events: list[ChangeEvent | tuple[FlatEvent, Origin]] = field(default_factory=list)
    decoded_origins: list[Origin] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)


def flatten(
    result: DecodeResult | _MixedResult,
    state_of: Callable[[ChangeEvent], list[Any]] | None = None,
    records: Iterable[Record] | None = None,
) -> pa.RecordBatch:
    """Turn a :class:`DecodeResult` into one :data:`EVENT_SCHEMA` batch.

    Rows: one per event (``kind="event"``), one per record whose change another record's
    event carries (``joined``), per skipped record (``skip``) and per dead letter
    (``dead``). ``state`` holds ``state_of(event)`` (the decoder's
    :meth:`~cdcflow.formats.base.Decoder.state_items`) where non-empty. ``columns`` is the
    event's declared types completed with the types of undeclared image values; it is set
    on the first row event of each table that carries a given declaration and null on
    the rest (the apply needs the distinct set only).

    Never raises for a value: a record with an event that cannot be represented (JSON
    nested deeper than 254 levels, an integer beyond 64 bits in ``ts_ms``) becomes one
    dead letter ``BAD_VALUE``, with its raw bytes when ``records`` (the decoded records)
    are given, and none of its events is kept.
    """
    cols: dict[str, list[Any]] = {name: [] for name in _NAMES}
    index_in_record: dict[tuple[str, int, int], int] = {}
    cache = _ColumnsCache()
    declared_once: set[tuple[str, str, str, str, str | None]] = set()
    built: list[tuple[Any, ...]] = []
    failed: dict[tuple[str, int, int], str] = {}
    events: Sequence[ChangeEvent | tuple[FlatEvent, Origin]] = result.events
    for e in events:
        o = e[1] if isinstance(e, tuple) else e.origin  # (FlatEvent, origin): _decode_mixed
        pos = (o.topic, o.partition, o.offset)
        idx = index_in_record.get(pos, 0)
        index_in_record[pos] = idx + 1
        try:
            if isinstance(e, tuple):
                built.append(_flat_event_row(e[0], o, idx, cache))
            else:
                built.append(_event_row(e, idx, cache, state_of))
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            failed.setdefault(pos, f"event cannot be stored: {type(exc).__name__}: {exc}")
    row_ops = {op.value for op in ROW_OPS}
    seqs = _seq_keys_of(built, failed)
    if failed:
        kept = [i for i, r in enumerate(built) if (r[18], r[19], r[20]) not in failed]
        built = [built[i] for i in kept]
        seqs = [seqs[i] for i in kept]
    n = len(built)
    if n:
        transposed: list[Sequence[Any]] = list(zip(*built, strict=True))
        transposed[_SEQ_AT] = seqs
        # a table's declaration travels once per batch (on its first row event), not per
        # row; other events (DDL, truncate) always keep theirs
        columns_at = _ROW_FIELDS.index("columns")
        decls = list(transposed[columns_at])
        for i, (op, f, d, sc, t, decl) in enumerate(zip(*transposed[:5], decls, strict=True)):
            if op in row_ops:
                once = (f, d, sc, t, decl)
                if once in declared_once:
                    decls[i] = None
                else:
                    declared_once.add(once)
        transposed[columns_at] = decls
        for name, values in zip(_ROW_FIELDS, transposed, strict=True):
            cols[name] = list(values)
    cols["kind"] = [KIND_EVENT] * n
    for name in ("reason", "error", "raw_key", "raw_value"):
        cols[name].extend([None] * n)

    def add(**values: Any) -> None:
        for name in _NAMES:
            cols[name].append(values.get(name))

    for o in result.decoded_origins:
        pos = (o.topic, o.partition, o.offset)
        if pos not in index_in_record:
            add(
                kind=KIND_JOINED,
                reason=SkipReason.JOINED,
                topic=o.topic,
                partition=o.partition,
                offset=o.offset,
            )
    if failed:
        raw = {(r.origin.topic, r.origin.partition, r.origin.offset): r for r in records or ()}
        first = events[0]
        fmt = (first[0][1] if isinstance(first, tuple) else first.source).format
        for (t, part, off), message in failed.items():
            rec = raw.get((t, part, off))
            add(
                kind=KIND_DEAD,
                format=fmt,
                reason=Code.BAD_VALUE,
                error=message,
                topic=t,
                partition=part,
                offset=off,
                raw_key=rec.key if rec else None,
                raw_value=rec.value if rec else None,
            )
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
    ``headers`` (list of struct key/value) and ``timestamp`` when present. Columns are
    converted whole (no per-row ``datetime``); a timestamp becomes epoch milliseconds,
    truncated toward zero.
    """
    n = batch.num_rows
    names = batch.schema.names
    values = batch.column("value").to_pylist()
    keys = batch.column("key").to_pylist()
    topics = batch.column("topic").to_pylist()
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    stamps: list[Any] = [None] * n
    if "timestamp" in names:
        ts = batch.column("timestamp")
        if ts.null_count < n:
            micros = pc.cast(ts, pa.timestamp("us", tz=ts.type.tz)).cast(pa.int64())
            stamps = pc.divide(micros, 1000).to_pylist()  # integer division truncates
    headers: list[Any] = [None] * n
    if "headers" in names:
        h = batch.column("headers")
        if h.null_count < n:
            headers = h.to_pylist()
    return [
        new_record(
            v, k, tuple((x["key"], x["value"]) for x in hs) if hs else (), new_origin(t, p, o), ms
        )
        for v, k, t, p, o, ms, hs in zip(
            values, keys, topics, partitions, offsets, stamps, headers, strict=True
        )
    ]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for one batch, its state restored after
    (also on error). Decoding makes a few objects per record, none of them in cycles, and
    the collector's passes over them cost about a fifth of the step (measured: 35.7k ->
    44.4k msg/s per core on 100k Debezium messages); reference counting frees them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_records(decoder: Decoder, records: list[Record]) -> pa.RecordBatch:
    """Decode Kafka records into one :data:`EVENT_SCHEMA` batch (collector paused).

    Where the format answers :meth:`~cdcflow.formats.base.Decoder.decode_flat` for a
    record (the common shape of its messages), its row is built from that answer
    without a :class:`ChangeEvent`; the other records go through
    :meth:`~cdcflow.formats.base.Decoder.decode_batch`, a run of them at a time, and
    :func:`flatten`. The batch is the same either way (tests compare the two).
    """
    with _collector_paused():
        kind = type(decoder)
        if kind.decode_flat is Decoder.decode_flat or kind.combine is not Decoder.combine:
            return flatten(decoder.decode_batch(records), decoder.state_items, records)
        if kind.decode_columnar is not Decoder.decode_columnar:
            return _decode_columnar_first(decoder, records)
        return flatten(_decode_mixed(decoder, records), decoder.state_items, records)


#: records per window asked of :meth:`~cdcflow.formats.base.Decoder.decode_columnar`
_COLUMNAR_WINDOW = 4096


def _decode_columnar_first(decoder: Decoder, records: list[Record]) -> pa.RecordBatch:
    """Windows of ``records`` decoded as columns while the format answers for them; from
    the first window it declines on, the rest record by record (:func:`_decode_mixed`).

    The batch equals :func:`flatten` of the records decoded record by record: the
    columnar windows hold one event per record and nothing else, so their rows followed
    by ``flatten``'s rows of the rest (its events, then its skipped and dead-lettered
    records) are in ``flatten``'s order; each declaration is then kept on its first row
    event of the whole batch (:func:`_declared_once`).
    """
    parts: list[pa.RecordBatch] = []
    done = 0
    while done < len(records):
        window = records[done : done + _COLUMNAR_WINDOW]
        events = decoder.decode_columnar(window)
        if events is None:
            break
        parts.append(_columnar_rows(events, window))
        done += len(window)
    if not parts:
        return flatten(_decode_mixed(decoder, records), decoder.state_items, records)
    if done < len(records):
        rest = records[done:]
        parts.append(flatten(_decode_mixed(decoder, rest), decoder.state_items, rest))
    return _declared_once(parts)


def _columnar_rows(events: ColumnarEvents, records: list[Record]) -> pa.RecordBatch:
    """The :data:`EVENT_SCHEMA` rows of a window's :class:`ColumnarEvents` (every row an
    event; ``columns`` still on every row)."""
    n = len(records)
    at = pa.array(events.table_index)

    def of_tables(attr: str) -> pa.Array:
        return pa.array([getattr(t, attr) for t in events.tables], pa.string()).take(at)

    origins = [r.origin for r in records]
    values = {
        "kind": pa.repeat(pa.scalar(KIND_EVENT), n),
        "op": events.op,
        "format": of_tables("format"),
        "database": of_tables("database"),
        "schema": of_tables("schema"),
        "table": of_tables("table"),
        "key": events.key,
        "old_key": events.old_key,
        "before": events.before,
        "after": events.after,
        "partial": pa.repeat(pa.scalar(False), n),
        "columns": events.columns,
        "seq": events.seq,
        "ts_ms": events.ts_ms,
        "txn_id": events.txn_id,
        "topic": pa.array([o.topic for o in origins], pa.string()),
        "partition": pa.array([o.partition for o in origins], pa.int32()),
        "offset": pa.array([o.offset for o in origins], pa.int64()),
        "event_index": pa.repeat(pa.scalar(0, pa.int32()), n),
    }
    return pa.RecordBatch.from_arrays(
        [
            values[f.name].cast(f.type) if f.name in values else pa.nulls(n, f.type)
            for f in EVENT_SCHEMA
        ],
        schema=EVENT_SCHEMA,
    )


def _declared_once(parts: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of ``parts`` (a columnar window first, so never empty) whose ``columns``
    is kept on the first row event of each (format, database, schema, table,
    declaration) only, as :func:`flatten` keeps it."""
    table = pa.Table.from_batches(parts, schema=EVENT_SCHEMA).combine_chunks()
    n = table.num_rows
    decl = table["columns"]
    row_ops = pa.array([op.value for op in ROW_OPS], pa.string())
    candidate = pc.and_(
        pc.and_(pc.equal(table["kind"], KIND_EVENT), pc.is_in(table["op"], row_ops)),
        pc.is_valid(decl),
    )
    rows = np.flatnonzero(candidate.to_numpy(zero_copy_only=False))
    if len(rows):
        picked = table.select(["format", "database", "schema", "table", "columns"]).take(rows)
        picked = picked.append_column("row", pa.array(rows))
        first = picked.group_by(["format", "database", "schema", "table", "columns"]).aggregate(
            [("row", "min")]
        )["row_min"]
        keep = np.ones(n, bool)
        keep[rows] = False
        keep[first.to_numpy()] = True
        table = table.set_column(
            table.schema.get_field_index("columns"),
            EVENT_SCHEMA.field("columns"),
            pc.if_else(pa.array(keep), decl, pa.scalar(None, pa.string())),
        )
    return table.combine_chunks().to_batches(max_chunksize=n)[0]


#: :func:`_decode_mixed` asks ``decode_flat`` window by window: when more than half of
#: the first ``_FLAT_PROBE`` records of a window of ``_FLAT_WINDOW`` went the general way,
#: the rest of that window goes to ``decode_batch`` whole.
_FLAT_WINDOW = 1024
_FLAT_PROBE = 64


def _decode_mixed(decoder: Decoder, records: list[Record]) -> _MixedResult:
    """One :class:`_MixedResult` for ``records``: its ``events`` hold, in record order,
    ``(FlatEvent, origin)`` pairs for the records :meth:`Decoder.decode_flat` answered
    and the events :meth:`Decoder.decode_batch` gave for the others (its skipped
    records and dead letters are kept in order too).

    Records the general way rejects on their size (``max_record_bytes``) or column count
    (``max_columns``) go to it, whatever ``decode_flat`` says, so the dead letter is its.
    A record ``decode_flat`` refuses is decoded at once, before the next one is asked:
    the general way teaches the decoder what its fast way needs (a table first seen,
    key columns from the options). Where most records take the general way anyway (a
    format's uncommon shape: each would be parsed twice), a window of records is handed
    to ``decode_batch`` whole once its first :data:`_FLAT_PROBE` records said so.
    """
    out = _MixedResult()
    items = out.events
    decode_flat = decoder.decode_flat
    decode_batch = decoder.decode_batch
    max_bytes = decoder.options.max_record_bytes
    max_columns = decoder.options.max_columns

    def general(run: list[Record]) -> None:
        part = decode_batch(run)
        items.extend(part.events)
        out.decoded_origins.extend(part.decoded_origins)
        out.skipped.extend(part.skipped)
        out.dead_letters.extend(part.dead_letters)

    for start in range(0, len(records), _FLAT_WINDOW):
        window = records[start : start + _FLAT_WINDOW]
        refused = 0
        for i, record in enumerate(window):
            value = record.value
            # the limits decode_batch enforces (TOO_LARGE, TOO_MANY_COLUMNS) are left to it
            parts = None if value is None or len(value) > max_bytes else decode_flat(record)
            if parts is not None:
                before, after, columns = parts[3], parts[4], parts[5]
                if (
                    (after is None or len(after) <= max_columns)
                    and (before is None or len(before) <= max_columns)
                    and len(columns) <= max_columns
                ):
                    items.append((parts, record.origin))
                    continue
            general([record])
            refused += 1
            if i < _FLAT_PROBE and refused * 2 > _FLAT_PROBE:
                if i + 1 < len(window):
                    general(window[i + 1 :])
                break
    return out


def decode_kafka_batch(decoder: Decoder, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decode one Arrow batch of Kafka records (Spark's Kafka-source columns) into one
    :data:`EVENT_SCHEMA` batch (collector paused, see :func:`decode_records`)."""
    with _collector_paused():  # the records too; decode_records then leaves it paused
        return decode_records(decoder, records_from_kafka_batch(batch))


def load_decoder_state(
    path: str | None, key: str, storage_options: dict[str, str] | None = None
) -> list[Any]:
    """The decoder-state items persisted for source ``key`` at ``path``, oldest first.

    ``path`` is the warehouse's ``_cdcflow/decoder_state`` table
    (``DeltaWarehouse.system_path("decoder_state")``); a missing table means no state yet.
    It is read through a warehouse at its root, so ``storage_options`` and the
    warehouse's error mapping (``StorageError``) apply.
    """
    if not path:
        return []
    # deferred: the warehouse loads deltalake, which only decoders that keep state need
    from cdcflow.sinks.system_tables import DECODER_STATE_SCHEMA
    from cdcflow.sinks.warehouse import DeltaWarehouse

    root = path.rstrip("/").rsplit("/", 2)[0]  # <root>/_cdcflow/decoder_state
    warehouse = DeltaWarehouse(root, storage_options=storage_options)
    table = warehouse.read_table(path, DECODER_STATE_SCHEMA, filters=[("source", "=", key)])
    table = table.sort_by([("batch_id", "ascending"), ("position", "ascending")])
    return [orjson.loads(x) for x in table["item"].to_pylist()]


class DecodeFunction:
    """The picklable function handed to ``DataFrame.mapInArrow``.

    Args:
        format_name: registered format identifier.
        options: the format's options as a plain mapping.
        state_path, state_key: the warehouse's decoder-state table and the source's key
            in it (:func:`load_decoder_state`); no path: no state.
        storage_options: the warehouse's storage options, for reading that table.
    """

    def __init__(
        self,
        format_name: str,
        options: dict[str, Any] | None = None,
        state_path: str | None = None,
        state_key: str = "",
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.format_name = format_name
        self.options = options or {}
        self.state_path = state_path
        self.state_key = state_key
        self.storage_options = storage_options

    def load_state(self) -> list[Any]:
        """The source's persisted decoder-state items (:func:`load_decoder_state`)."""
        return load_decoder_state(self.state_path, self.state_key, self.storage_options)

    def new_decoder(self, state: list[Any] | None = None) -> Decoder:
        """A decoder of the format with its options and the source's persisted state.

        Args:
            state: the items :meth:`load_state` returned, when already read (a task
                reading several partitions of one source reads them once); they are
                copied, so one list serves several decoders. ``None``: read them now.
        """
        decoder = decoder_for(self.format_name, self.options or None)
        decoder.load_state(self.load_state() if state is None else copy.deepcopy(state))
        return decoder

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Event batches of Arrow batches with Spark's Kafka-source columns."""
        decoder = self.new_decoder()
        for batch in batches:
            yield decode_kafka_batch(decoder, batch)

    def records(
        self, chunks: Iterable[list[Record]], state: list[Any] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Event batches of record lists (the fused source reads Kafka into records
        directly, without an Arrow batch in between); ``state`` as :meth:`new_decoder`."""
        decoder = self.new_decoder(state)
        for records in chunks:
            yield decode_records(decoder, records)

"""Every record of an apply accounted for: the rows of the bookkeeping system tables.

Each consumed record ends as exactly one of: an event (in the changelog), ``joined``,
skipped on purpose, or a dead letter. This module builds what the applier writes about
that, without writing it: the changelog rows, the dead letters (one builder,
:func:`dead_letters`, for decode failures and for events a table refused), the progress
row, the per-partition accounting rows of ``_cdcflow/batches``, and the
:class:`BatchReport` returned to the caller. See docs/semantics.md#every-record-accounted-for.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.errors import Code
from cdcflow.event_schema import KIND_DEAD, KIND_EVENT, KIND_JOINED, KIND_SKIP
from cdcflow.sinks.mirror import MirrorResult
from cdcflow.sinks.system_tables import (
    BATCHES_SCHEMA,
    CHANGELOG_COLUMNS,
    DEAD_LETTER_SCHEMA,
    PROGRESS_SCHEMA,
)
from cdcflow.transform.router import ROW_CHANGE_OPS, TABLE_OPS

__all__ = [
    "BatchReport",
    "batches_rows",
    "changelog_rows",
    "combined",
    "dead_letters",
    "origin",
    "per_record",
    "progress_row",
    "records_of",
    "rejected_events",
    "shaped_out",
]


@dataclass(slots=True)
class BatchReport:
    """Counts for one applied batch."""

    batch_id: int  # the warehouse's apply id (the last one, when a delivery finished two)
    delivery_id: int | None = None  # Spark's micro-batch id
    replayed: int = 0  # records of the delivery that were applied before (skipped)
    records: int = 0
    events: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    mirrors: list[MirrorResult] = field(default_factory=list)
    seconds: float = 0.0
    #: transaction-consistent apply only: complete, released_open, held, held_events,
    #: max_wait_ms (see :class:`~cdcflow.apply.transactions.TransactionSplit`)
    transactions: dict[str, int] = field(default_factory=dict)
    #: what maintenance did after the apply (one line per table; none most batches)
    maintenance: list[str] = field(default_factory=list)
    #: ``(topic, partition) -> (first, last)`` offsets of the records applied
    ranges: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    #: wall clock of the commit minus the newest source time of the batch's events, in
    #: milliseconds (``_cdcflow/progress.lag_ms``); ``None`` when no event had a time
    lag_ms: int | None = None
    #: records between the batch's end and the log ends last seen (``None``: not known)
    records_behind: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "delivery_id": self.delivery_id,
            "replayed": self.replayed,
            "records": self.records,
            "events": self.events,
            "skipped": dict(self.skipped),
            "dead_letters": dict(self.dead_letters),
            "tables": {
                m.target: {
                    "upserts": m.upserts,
                    "deletes": m.deletes,
                    "dropped_by_guard": m.dropped_by_guard,
                    "truncated": m.truncated,
                    "replayed": m.skipped_replay,
                }
                for m in self.mirrors
            },
            "transactions": dict(self.transactions),
            "maintenance": list(self.maintenance),
            "lag_ms": self.lag_ms,
            "seconds": round(self.seconds, 3),
        }


def combined(reports: list[BatchReport], delivery_id: int | None, last_id: int) -> BatchReport:
    """One report for the applies of a delivery (none, one, or a finished one and a new one)."""
    if len(reports) == 1:
        return reports[0]
    out = BatchReport(
        batch_id=reports[-1].batch_id if reports else last_id, delivery_id=delivery_id
    )
    for r in reports:
        out.records += r.records
        out.events += r.events
        out.skipped.update(r.skipped)
        out.dead_letters.update(r.dead_letters)
        out.mirrors.extend(r.mirrors)
        out.seconds += r.seconds
        out.transactions = r.transactions or out.transactions
        out.ranges.update(r.ranges)
        out.lag_ms = r.lag_ms if r.lag_ms is not None else out.lag_ms
        if r.records_behind is not None:
            out.records_behind = r.records_behind
    return out


def records_of(events: pa.Table) -> pa.Table:
    """One row per record of ``events``: distinct ``(topic, partition, offset)``."""
    return (
        events.select(["topic", "partition", "offset"])
        .group_by(["topic", "partition", "offset"])
        .aggregate([])
    )


def origin(part: pa.Table, i: int) -> dict[str, Any]:
    """Where event ``i`` of ``part`` came from (``seq`` and Kafka coordinates)."""
    i = max(0, i)
    return {
        "seq": part["seq"][i].as_py(),
        "topic": part["topic"][i].as_py(),
        "partition": part["partition"][i].as_py(),
        "offset": part["offset"][i].as_py(),
    }


def changelog_rows(rows: pa.Table, batch_id: int, now_ms: int | None = None) -> pa.Table:
    """The ``_cdcflow/changelog`` rows of an apply's events, stamped with the batch id
    and ``committed_at_ms`` (``now_ms``, default the wall clock), which retention counts
    from."""
    out = rows.select(CHANGELOG_COLUMNS)
    n = out.num_rows
    now_ms = _now_ms() if now_ms is None else now_ms
    out = out.append_column("batch_id", pa.array([batch_id] * n, pa.int64()))
    return out.append_column("committed_at_ms", pa.array([now_ms] * n, pa.int64()))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _event_json(part: pa.Table) -> pa.Array:
    """Each event as JSON (op, key, before, after, seq): a refused event's ``raw_value``."""
    return pa.array(
        [
            orjson.dumps({"op": op, "key": k, "before": b, "after": a, "seq": s})
            for op, k, b, a, s in zip(
                part["op"].to_pylist(),
                part["key"].to_pylist(),
                part["before"].to_pylist(),
                part["after"].to_pylist(),
                part["seq"].to_pylist(),
                strict=True,
            )
        ],
        pa.binary(),
    )


def dead_letters(
    rows: pa.Table,
    batch_id: int,
    stage: str,
    code: str | pa.ChunkedArray,
    message: str | pa.ChunkedArray,
    target: str | None = None,
    now_ms: int | None = None,
) -> pa.Table:
    """``_cdcflow/dead_letters`` rows, one per row of ``rows``: the only builder.

    Args:
        rows: EVENT_SCHEMA rows: decode dead letters (``stage="decode"``, their raw
            record bytes are kept) or events a table refused (``stage="apply"``, the
            event's JSON is kept in ``raw_value``).
        batch_id: the apply's id.
        stage: ``decode`` | ``apply``.
        code, message: one for all rows, or one per row.
        target: the table that refused the events (apply).
        now_ms: ``committed_at_ms`` of the rows (default: the wall clock), which
            retention counts from.
    """
    n = rows.num_rows
    if stage == "decode":
        raw_key, raw_value = rows["raw_key"], rows["raw_value"]
    else:
        raw_key, raw_value = pa.nulls(n, pa.binary()), _event_json(rows)

    def each(value: str | pa.ChunkedArray | None) -> Any:
        if value is None or isinstance(value, str):
            return pa.array([value] * n, pa.string())
        return value

    return pa.table(
        {
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "topic": rows["topic"],
            "partition": rows["partition"],
            "offset": rows["offset"],
            "format": rows["format"],
            "stage": pa.array([stage] * n, pa.string()),
            "code": each(code),
            "message": each(message),
            "target_table": each(target),
            "raw_key": raw_key,
            "raw_value": raw_value,
            "committed_at_ms": pa.array([_now_ms() if now_ms is None else now_ms] * n, pa.int64()),
        },
        schema=DEAD_LETTER_SCHEMA,
    )


def rejected_events(part: pa.Table, key: str | None, code: str) -> pa.Table:
    """The events of one ``(key, code)`` a table refused (:attr:`MirrorResult.rejected`).

    Key ``None`` stands for the row changes without a key; a ``MISSING_SEQ`` entry for
    the key's (key ``None``: all) events without a sequence, truncates included.
    """
    if key is None:  # the row changes that carry no key
        mask = pc.and_(pc.is_null(part["key"]), pc.is_in(part["op"], ROW_CHANGE_OPS))
    else:
        mask = pc.or_(
            pc.equal(part["key"], key), pc.fill_null(pc.equal(part["old_key"], key), False)
        )
    if code == Code.MISSING_SEQ:
        mask = pc.is_null(part["seq"]) if key is None else pc.and_(mask, pc.is_null(part["seq"]))
    return part.filter(pc.fill_null(mask, False))


def progress_row(
    rows: pa.Table,
    report: BatchReport,
    batch_id: int,
    source: str,
    records_behind: int | None = None,
) -> pa.Table:
    """One ``_cdcflow/progress`` row for the batch (also for a batch of heartbeats only)."""
    if rows.num_rows == 0:
        return PROGRESS_SCHEMA.empty_table()
    last_seq = pc.max(rows["seq"]).as_py()
    last_ts = pc.max(rows["ts_ms"]).as_py()
    now = int(time.time() * 1000)
    changed = sum(m.upserts + m.deletes for m in report.mirrors)
    return pa.table(
        {
            "source": [source],
            "batch_id": pa.array([batch_id], pa.int64()),
            "last_seq": pa.array([last_seq], pa.string()),
            "last_source_ts_ms": pa.array([last_ts], pa.int64()),
            "events": pa.array([rows.num_rows], pa.int64()),
            "rows_changed": pa.array([changed], pa.int64()),
            "committed_at_ms": pa.array([now], pa.int64()),
            "lag_ms": pa.array([None if last_ts is None else now - last_ts], pa.int64()),
            "records_behind": pa.array([records_behind], pa.int64()),
            **{
                f"txn_{k}": pa.array([report.transactions.get(k)], pa.int64())
                for k in ("complete", "released_open", "held", "max_wait_ms")
            },
        },
        schema=PROGRESS_SCHEMA,
    )


#: the columns that name one event: its record's coordinates and its place in the record
_EVENT_AT = ("topic", "partition", "offset", "event_index")


def _event_ids(rows: pa.Table) -> pa.Array:
    """One text per row naming its event (topic, partition, offset, event_index)."""
    parts = [pc.cast(rows[c], pa.string()) for c in _EVENT_AT]
    return pc.binary_join_element_wise(*(pc.fill_null(p, "") for p in parts), "\x1f")


def shaped_out(excluded: pa.Table, filtered: pa.Table, refused: pa.Table) -> pa.Table:
    """The events routing and shaping took out of an apply, and what each became:
    ``(topic, partition, offset, event_index, kind)``, kind ``skip`` for the events of
    tables left out and the rows a filter left out, ``dead`` for the events a target
    could not shape (dead letters ``EXPRESSION_FAILED``). Given to :func:`per_record`."""
    parts = [
        rows.select(list(_EVENT_AT)).append_column(
            "kind", pa.array([kind] * rows.num_rows, pa.string())
        )
        for rows, kind in ((excluded, KIND_SKIP), (filtered, KIND_SKIP), (refused, KIND_DEAD))
    ]
    return pa.concat_tables(parts)


def per_record(events: pa.Table, removed: pa.Table | None = None) -> pa.Table:
    """One row per consumed record: (topic, partition, offset, kind_min, events).

    Args:
        events: the apply's rows (every kind), as decoded.
        removed: :func:`shaped_out`: events routing and shaping took out, with the kind
            each became (rows naming no event of ``events`` are ignored: the events of
            held transactions released now were counted by the apply that read them).

    A record is one kind only: ``event`` when any of its events changes a table (and was
    not taken out), else the least of its kinds by name ("dead" < "joined" < "skip"). An
    event that changes no table (heartbeat, transaction marker, DDL, message) counts as
    "skip". ``events``: the record's events of kind event that stay (those the changelog
    holds, or will hold once their transaction is released).
    """
    kind = events["kind"]
    if removed is not None and removed.num_rows:
        at = pc.index_in(_event_ids(events), value_set=_event_ids(removed))
        became = pc.take(removed["kind"], at)
        kind = pc.coalesce(became, kind)
    is_event = pc.equal(kind, KIND_EVENT)
    changes = pc.fill_null(pc.is_in(events["op"], TABLE_OPS), False)
    is_change = pc.and_(is_event, changes)
    kinds = pc.if_else(pc.and_(is_event, pc.invert(changes)), KIND_SKIP, kind)
    slim = pa.table(
        {
            "topic": events["topic"],
            "partition": events["partition"],
            "offset": events["offset"],
            "kind": kinds,
            "change": is_change,
            "event": pc.cast(is_event, pa.int64()),
        }
    )
    out = slim.group_by(["topic", "partition", "offset"]).aggregate(
        [("kind", "min"), ("change", "any"), ("event", "sum")]
    )
    record_kind = pc.if_else(out["change_any"], KIND_EVENT, out["kind_min"])
    return pa.table(
        {
            "topic": out["topic"],
            "partition": out["partition"],
            "offset": out["offset"],
            "kind_min": record_kind,
            "events": out["event_sum"],
        }
    )


def batches_rows(
    records: pa.Table, batch_id: int, delivery_id: int | None, source: str
) -> pa.Table:
    """The ``_cdcflow/batches`` rows of an apply, one per Kafka partition: its offset
    range, its events (those the changelog holds) and the count of each kind of record.

    Args:
        records: :func:`per_record` of the apply's rows.
    """
    if records.num_rows == 0:
        return pa.Table.from_batches([], schema=BATCHES_SCHEMA)
    ranges = records.group_by(["topic", "partition"]).aggregate(
        [("offset", "min"), ("offset", "max"), ("offset", "count")]
    )
    kinds = records.group_by(["topic", "partition", "kind_min"]).aggregate([("offset", "count")])
    counts: dict[tuple[str, int, str], int] = {
        (t, p, k): c
        for t, p, k, c in zip(
            kinds["topic"].to_pylist(),
            kinds["partition"].to_pylist(),
            kinds["kind_min"].to_pylist(),
            kinds["offset_count"].to_pylist(),
            strict=True,
        )
    }
    per_event = records.group_by(["topic", "partition"]).aggregate([("events", "sum")])
    events = {
        (t, p): c
        for t, p, c in zip(
            per_event["topic"].to_pylist(),
            per_event["partition"].to_pylist(),
            per_event["events_sum"].to_pylist(),
            strict=True,
        )
    }
    topics = ranges["topic"].to_pylist()
    parts = ranges["partition"].to_pylist()
    keys = list(zip(topics, parts, strict=True))
    now = int(time.time() * 1000)

    def count(kind: str) -> pa.Array:
        return pa.array([counts.get((t, p, kind), 0) for t, p in keys], pa.int64())

    return pa.table(
        {
            "batch_id": pa.array([batch_id] * len(keys), pa.int64()),
            "topic": topics,
            "partition": pa.array(parts, pa.int32()),
            "first_offset": ranges["offset_min"].cast(pa.int64()),
            "last_offset": ranges["offset_max"].cast(pa.int64()),
            "records": ranges["offset_count"].cast(pa.int64()),
            "events": pa.array([events.get(k, 0) for k in keys], pa.int64()),
            "joined": count(KIND_JOINED),
            "skipped": count(KIND_SKIP),
            "dead_letters": count(KIND_DEAD),
            "committed_at_ms": pa.array([now] * len(keys), pa.int64()),
            "source": [source] * len(keys),
            "delivery_id": pa.array([delivery_id] * len(keys), pa.int64()),
        },
        schema=BATCHES_SCHEMA,
    )

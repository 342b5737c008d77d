"""Apply one micro-batch of decoded events to the warehouse.

The same code serves the streaming job (``foreachBatch``) and ``cdcflow apply``. Order of
writes, each idempotent per ``(pipeline, batch_id)``:

1. dead letters (decode failures, with raw bytes);
2. the changelog (every decoded event, with its origin);
3. one merge per mirror table (apply failures become dead letters, other tables go on);
4. tombstones of deleted keys and truncates;
5. the batch's accounting row per Kafka partition (records, events, skipped, dead);
6. a progress row: last source sequence and time (heartbeats count), rows changed, lag.

Every record of the batch is accounted for: ``records = records with events + joined +
skipped + dead`` (``joined``: an update half whose change its partner's event carries).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.apply.events import KIND_DEAD, KIND_EVENT, KIND_JOINED, KIND_SKIP
from cdcflow.apply.netchange import net_change
from cdcflow.apply.schema import logical_from_arrow, merge_types
from cdcflow.errors import ApplyError, Code
from cdcflow.model import Op
from cdcflow.sinks.delta import (
    BATCHES_SCHEMA,
    CHANGELOG_COLUMNS,
    DEAD_LETTER_SCHEMA,
    DECODER_STATE_SCHEMA,
    PROGRESS_SCHEMA,
    SEQ_COLUMN,
    TS_COLUMN,
    DeltaWarehouse,
    MirrorResult,
    arrow_schema,
)

__all__ = ["BatchApplier", "BatchReport", "Router"]

log = logging.getLogger(__name__)

_TABLE_OPS = pa.array(
    [Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value, Op.SNAPSHOT.value, Op.TRUNCATE.value]
)


class Router:
    """Source table -> target table name.

    Args:
        template: ``str.format`` template over ``database``, ``schema``, ``table``,
            ``format``; empty parts and the dots around them are dropped. Default
            ``"{database}.{schema}.{table}"`` (``inventory.public.customers``; MySQL
            sources without a schema give ``inventory.customers``).
    """

    def __init__(self, template: str = "{database}.{schema}.{table}") -> None:
        self.template = template

    def target(self, fmt: str, database: str, schema: str, table: str) -> str:
        name = self.template.format(
            format=fmt or "", database=database or "", schema=schema or "", table=table or ""
        )
        return ".".join(p for p in name.split(".") if p)


@dataclass(slots=True)
class BatchReport:
    """Counts for one applied batch."""

    batch_id: int
    records: int = 0
    events: int = 0
    skipped: Counter = field(default_factory=Counter)
    dead_letters: Counter = field(default_factory=Counter)
    mirrors: list[MirrorResult] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
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
            "seconds": round(self.seconds, 3),
        }


def _only(events: pa.Table, kind: pa.ChunkedArray, value: str, all_events: bool) -> pa.Table:
    """The rows of one kind (an empty table without scanning when every row is an event)."""
    if all_events:
        return events.slice(0, 0)
    return events.filter(pc.equal(kind, value))


class BatchApplier:
    """Applies :data:`~cdcflow.apply.events.EVENT_SCHEMA` batches to a warehouse.

    Args:
        warehouse: the pipeline's Delta tables.
        router: source -> target naming.
        changelog: also append every event to ``_cdcflow/changelog`` (default on).
    """

    def __init__(
        self, warehouse: DeltaWarehouse, router: Router | None = None, changelog: bool = True
    ):
        self.warehouse = warehouse
        self.router = router or Router()
        self.changelog = changelog

    def apply(self, events: pa.Table, batch_id: int) -> BatchReport:
        """Apply one batch. Replaying the same ``batch_id`` with the same rows is a no-op.

        Raises:
            deltalake exceptions / OSError: storage failures; the batch should be retried.
        """
        started = time.perf_counter()
        report = BatchReport(batch_id=batch_id)
        wh = self.warehouse
        kind = events["kind"]
        is_event = pc.equal(kind, KIND_EVENT)
        n_events = pc.sum(pc.cast(is_event, pa.int64())).as_py() or 0
        all_events = n_events == events.num_rows
        rows = events if all_events else events.filter(is_event)
        dead = _only(events, kind, KIND_DEAD, all_events)
        skips = _only(events, kind, KIND_SKIP, all_events)
        report.events = n_events
        report.skipped.update(skips["reason"].to_pylist())
        # heartbeats, transaction markers, DDL and messages are kept in the changelog but
        # change no table: their records count as skipped on purpose, by op
        markers = rows.filter(pc.invert(pc.is_in(rows["op"], _TABLE_OPS)))
        report.skipped.update(op.upper() for op in markers["op"].to_pylist())
        report.dead_letters.update(dead["reason"].to_pylist())

        dead_letters = [self._decode_dead_letters(dead, batch_id)]
        self._persist_decoder_state(rows, batch_id)
        if self.changelog and rows.num_rows:
            wh.append(wh.system_path("changelog"), self._changelog(rows, batch_id), batch_id)

        for target, part in self._by_target(rows):
            try:
                mirror = self._apply_mirror(target, part, batch_id)
                report.mirrors.append(mirror)
                if mirror.rejected:
                    dead_letters.append(self._rejected_dead_letters(part, target, mirror, batch_id))
                    report.dead_letters[Code.TYPE_CONFLICT] += dead_letters[-1].num_rows
            except ApplyError as exc:
                log.error("table %s: batch %s not applied: %s", target, batch_id, exc)
                report.dead_letters[exc.code] += part.num_rows
                dead_letters.append(self._apply_dead_letters(part, target, exc, batch_id))
        all_dead = pa.concat_tables(dead_letters)
        # dead letters are written after the mirrors so apply failures land in the same commit
        wh.append(wh.system_path("dead_letters"), all_dead, batch_id)
        per_record = self._per_record(events)
        wh.append(wh.system_path("batches"), self._accounting(per_record, rows, batch_id), batch_id)
        wh.append(wh.system_path("progress"), self._progress(rows, report, batch_id), batch_id)
        report.records = per_record.num_rows
        report.seconds = time.perf_counter() - started
        return report

    def _persist_decoder_state(self, rows: pa.Table, batch_id: int) -> None:
        """Append what the decoders learned in this batch (before anything else uses it)."""
        learned = rows.filter(pc.is_valid(rows["state"]))["state"].to_pylist()
        items = [orjson.dumps(i).decode() for lst in learned for i in orjson.loads(lst)]
        if not items:
            return
        data = pa.table(
            {
                "source": [self.warehouse.pipeline_id] * len(items),
                "batch_id": pa.array([batch_id] * len(items), pa.int64()),
                "position": pa.array(range(len(items)), pa.int64()),
                "item": items,
            },
            schema=DECODER_STATE_SCHEMA,
        )
        self.warehouse.append(self.warehouse.system_path("decoder_state"), data, batch_id)

    def _by_target(self, rows: pa.Table):
        """``(target, rows)`` per target table, for the row changes and truncates."""
        is_table_op = pc.is_in(rows["op"], _TABLE_OPS)
        if not pc.all(is_table_op).as_py():
            rows = rows.filter(is_table_op)
        if rows.num_rows == 0:
            return
        source = pc.binary_join_element_wise(
            rows["format"], rows["database"], rows["schema"], rows["table"], "\x1f"
        )
        by_target: dict[str, list[str]] = {}
        for combo in pc.unique(source).to_pylist():
            target = self.router.target(*combo.split("\x1f"))
            by_target.setdefault(target, []).append(combo)
        if len(by_target) == 1:
            yield next(iter(by_target)), rows
            return
        for target in sorted(by_target):
            yield target, rows.filter(pc.is_in(source, pa.array(by_target[target], pa.string())))

    # ------------------------------------------------------------------ pieces

    def _apply_mirror(self, target: str, part: pa.Table, batch_id: int) -> MirrorResult:
        # distinct declarations, in order of first appearance
        declared = [orjson.loads(c) for c in pc.unique(part["columns"]).to_pylist() if c]
        table = self.warehouse.open(self.warehouse.table_path(target))
        existing: dict[str, str] = {}
        if table is not None:
            existing = {
                f.name: logical_from_arrow(f.type)
                for f in arrow_schema(table)
                if f.name not in (SEQ_COLUMN, TS_COLUMN)
            }
        types, conflicts = merge_types(existing, declared)
        for c in conflicts:
            log.warning("table %s: %s", target, c)
        keys = part.filter(pc.is_valid(part["key"]))["key"]
        key_columns = list(orjson.loads(keys[0].as_py())) if len(keys) else []
        if not key_columns and table is None:
            # only a truncate was seen for a table that does not exist yet: nothing to do
            return MirrorResult(target=target, path=self.warehouse.table_path(target))
        net = net_change(part)
        result = self.warehouse.apply_mirror(target, net, types, key_columns, batch_id)
        self.warehouse.append_tombstones(target, net, batch_id)
        return result

    @staticmethod
    def _changelog(rows: pa.Table, batch_id: int) -> pa.Table:
        out = rows.select(CHANGELOG_COLUMNS)
        return out.append_column("batch_id", pa.array([batch_id] * out.num_rows, pa.int64()))

    @staticmethod
    def _decode_dead_letters(dead: pa.Table, batch_id: int) -> pa.Table:
        n = dead.num_rows
        return pa.table(
            {
                "batch_id": pa.array([batch_id] * n, pa.int64()),
                "topic": dead["topic"],
                "partition": dead["partition"],
                "offset": dead["offset"],
                "format": dead["format"],
                "stage": pa.array(["decode"] * n, pa.string()),
                "code": dead["reason"],
                "message": dead["error"],
                "target_table": pa.nulls(n, pa.string()),
                "raw_key": dead["raw_key"],
                "raw_value": dead["raw_value"],
            },
            schema=DEAD_LETTER_SCHEMA,
        )

    def _rejected_dead_letters(
        self, part: pa.Table, target: str, mirror: MirrorResult, batch_id: int
    ) -> pa.Table:
        """Dead letters for the events of keys whose net change did not fit the table."""
        out = []
        for key, reason in mirror.rejected:
            events = part.filter(
                pc.or_(
                    pc.equal(part["key"], key), pc.fill_null(pc.equal(part["old_key"], key), False)
                )
            )
            out.append(
                self._apply_dead_letters(
                    events, target, ApplyError(reason, Code.TYPE_CONFLICT), batch_id
                )
            )
        return pa.concat_tables(out)

    @staticmethod
    def _apply_dead_letters(
        part: pa.Table, target: str, exc: ApplyError, batch_id: int
    ) -> pa.Table:
        n = part.num_rows
        event_json = [
            orjson.dumps({"op": op, "key": k, "before": b, "after": a, "seq": s})
            for op, k, b, a, s in zip(
                part["op"].to_pylist(),
                part["key"].to_pylist(),
                part["before"].to_pylist(),
                part["after"].to_pylist(),
                part["seq"].to_pylist(),
                strict=True,
            )
        ]
        return pa.table(
            {
                "batch_id": pa.array([batch_id] * n, pa.int64()),
                "topic": part["topic"],
                "partition": part["partition"],
                "offset": part["offset"],
                "format": part["format"],
                "stage": pa.array(["apply"] * n, pa.string()),
                "code": pa.array([exc.code] * n, pa.string()),
                "message": pa.array([exc.message] * n, pa.string()),
                "target_table": pa.array([target] * n, pa.string()),
                "raw_key": pa.nulls(n, pa.binary()),
                "raw_value": pa.array(event_json, pa.binary()),
            },
            schema=DEAD_LETTER_SCHEMA,
        )

    def _progress(self, rows: pa.Table, report: BatchReport, batch_id: int) -> pa.Table:
        """One progress row for the batch (also for a batch of heartbeats only)."""
        if rows.num_rows == 0:
            return PROGRESS_SCHEMA.empty_table()
        last_seq = pc.max(rows["seq"]).as_py()
        last_ts = pc.max(rows["ts_ms"]).as_py()
        now = int(time.time() * 1000)
        changed = sum(m.upserts + m.deletes for m in report.mirrors)
        return pa.table(
            {
                "source": [self.warehouse.pipeline_id],
                "batch_id": pa.array([batch_id], pa.int64()),
                "last_seq": pa.array([last_seq], pa.string()),
                "last_source_ts_ms": pa.array([last_ts], pa.int64()),
                "events": pa.array([rows.num_rows], pa.int64()),
                "rows_changed": pa.array([changed], pa.int64()),
                "committed_at_ms": pa.array([now], pa.int64()),
                "lag_ms": pa.array([None if last_ts is None else now - last_ts], pa.int64()),
            },
            schema=PROGRESS_SCHEMA,
        )

    @staticmethod
    def _per_record(events: pa.Table) -> pa.Table:
        """One row per consumed record: (topic, partition, offset, kind_min).

        A record is one kind only ("dead" < "event" < "joined" < "skip" by name). An event
        that changes no table (heartbeat, transaction marker, DDL, message) counts as
        "skip"; a record with any table change among its events stays "event".
        """
        is_marker = pc.and_(
            pc.equal(events["kind"], KIND_EVENT),
            pc.invert(pc.fill_null(pc.is_in(events["op"], _TABLE_OPS), False)),
        )
        kinds = pc.if_else(is_marker, KIND_SKIP, events["kind"])
        slim = pa.table(
            {
                "topic": events["topic"],
                "partition": events["partition"],
                "offset": events["offset"],
                "kind": kinds,
            }
        )
        return slim.group_by(["topic", "partition", "offset"]).aggregate([("kind", "min")])

    @staticmethod
    def _accounting(per_record: pa.Table, rows: pa.Table, batch_id: int) -> pa.Table:
        if per_record.num_rows == 0:
            return pa.Table.from_batches([], schema=BATCHES_SCHEMA)
        ranges = per_record.group_by(["topic", "partition"]).aggregate(
            [("offset", "min"), ("offset", "max"), ("offset", "count")]
        )
        kinds = per_record.group_by(["topic", "partition", "kind_min"]).aggregate(
            [("offset", "count")]
        )
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
        per_event = rows.group_by(["topic", "partition"]).aggregate([("offset", "count")])
        events = {
            (t, p): c
            for t, p, c in zip(
                per_event["topic"].to_pylist(),
                per_event["partition"].to_pylist(),
                per_event["offset_count"].to_pylist(),
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
            },
            schema=BATCHES_SCHEMA,
        )

"""Apply one micro-batch of decoded events to the warehouse.

The same code serves the streaming job (``foreachBatch``) and ``cdcflow apply``. Order of
writes, each idempotent per ``(pipeline, batch_id)``:

1. dead letters (decode failures, with raw bytes);
2. the changelog (every decoded event, with its origin);
3. one merge per mirror table (apply failures become dead letters, other tables go on);
4. tombstones of deleted keys and truncates;
5. the batch's accounting row per Kafka partition (records, events, skipped, dead).

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
from cdcflow.apply.schema import merge_types
from cdcflow.errors import ApplyError, Code
from cdcflow.model import Op
from cdcflow.sinks.delta import (
    BATCHES_SCHEMA,
    CHANGELOG_COLUMNS,
    DEAD_LETTER_SCHEMA,
    DeltaWarehouse,
    MirrorResult,
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
                m.target: {"upserts": m.upserts, "deletes": m.deletes, "dropped_by_guard": m.dropped_by_guard,
                           "truncated": m.truncated, "replayed": m.skipped_replay}
                for m in self.mirrors
            },
            "seconds": round(self.seconds, 3),
        }


class BatchApplier:
    """Applies :data:`~cdcflow.apply.events.EVENT_SCHEMA` batches to a warehouse.

    Args:
        warehouse: the pipeline's Delta tables.
        router: source -> target naming.
        changelog: also append every event to ``_cdcflow/changelog`` (default on).
    """

    def __init__(self, warehouse: DeltaWarehouse, router: Router | None = None, changelog: bool = True):
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
        rows = events.filter(pc.equal(kind, KIND_EVENT))
        dead = events.filter(pc.equal(kind, KIND_DEAD))
        skips = events.filter(pc.equal(kind, KIND_SKIP))
        report.events = rows.num_rows
        report.skipped.update(skips["reason"].to_pylist())
        report.dead_letters.update(dead["reason"].to_pylist())

        dead_letters = [self._decode_dead_letters(dead, batch_id)]
        if self.changelog and rows.num_rows:
            wh.append(wh.system_path("changelog"), self._changelog(rows, batch_id), batch_id)

        table_rows = rows.filter(pc.is_in(rows["op"], _TABLE_OPS))
        targets = [
            self.router.target(f, d, s, t)
            for f, d, s, t in zip(
                table_rows["format"].to_pylist(), table_rows["database"].to_pylist(),
                table_rows["schema"].to_pylist(), table_rows["table"].to_pylist(), strict=True,
            )
        ]
        if targets:
            table_rows = table_rows.append_column("_target", pa.array(targets, pa.string()))
            for target in sorted(set(targets)):
                part = table_rows.filter(pc.equal(table_rows["_target"], target))
                try:
                    report.mirrors.append(self._apply_mirror(target, part, batch_id))
                except ApplyError as exc:
                    log.error("table %s: batch %s not applied: %s", target, batch_id, exc)
                    report.dead_letters[exc.code] += part.num_rows
                    dead_letters.append(self._apply_dead_letters(part, target, exc, batch_id))
        all_dead = pa.concat_tables(dead_letters)
        # dead letters are written after the mirrors so apply failures land in the same commit
        wh.append(wh.system_path("dead_letters"), all_dead, batch_id)
        wh.append(wh.system_path("batches"), self._accounting(events, batch_id), batch_id)
        report.records = self._record_count(events)
        report.seconds = time.perf_counter() - started
        return report

    # ------------------------------------------------------------------ pieces

    def _apply_mirror(self, target: str, part: pa.Table, batch_id: int) -> MirrorResult:
        declared = [orjson.loads(c) if c else None for c in part["columns"].to_pylist()]
        table = self.warehouse.open(self.warehouse.table_path(target))
        existing: dict[str, str] = {}
        if table is not None:
            from cdcflow.apply.schema import logical_from_arrow
            from cdcflow.sinks.delta import SEQ_COLUMN, TS_COLUMN, arrow_schema

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

    @staticmethod
    def _apply_dead_letters(part: pa.Table, target: str, exc: ApplyError, batch_id: int) -> pa.Table:
        n = part.num_rows
        event_json = [
            orjson.dumps({"op": op, "key": k, "before": b, "after": a, "seq": s})
            for op, k, b, a, s in zip(
                part["op"].to_pylist(), part["key"].to_pylist(), part["before"].to_pylist(),
                part["after"].to_pylist(), part["seq"].to_pylist(), strict=True,
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

    @staticmethod
    def _record_count(events: pa.Table) -> int:
        """Distinct (topic, partition, offset) in the batch: every consumed record once."""
        if events.num_rows == 0:
            return 0
        unique = events.group_by(["topic", "partition", "offset"]).aggregate([])
        return unique.num_rows

    @staticmethod
    def _accounting(events: pa.Table, batch_id: int) -> pa.Table:
        if events.num_rows == 0:
            return pa.Table.from_batches([], schema=BATCHES_SCHEMA)
        per_record = events.group_by(["topic", "partition", "offset"]).aggregate(
            [("kind", "min")]  # "dead" < "event" < "joined" < "skip": one kind per record
        )
        grouped = per_record.group_by(["topic", "partition"]).aggregate(
            [("offset", "min"), ("offset", "max"), ("offset", "count")]
        )
        counts: dict[tuple[str, int], Counter] = {}
        for t, p, k in zip(per_record["topic"].to_pylist(), per_record["partition"].to_pylist(),
                           per_record["kind_min"].to_pylist(), strict=True):
            counts.setdefault((t, p), Counter())[k] += 1
        ev_counts = Counter(
            zip(events.filter(pc.equal(events["kind"], KIND_EVENT))["topic"].to_pylist(),
                events.filter(pc.equal(events["kind"], KIND_EVENT))["partition"].to_pylist(), strict=True)
        )
        now = int(time.time() * 1000)
        topics = grouped["topic"].to_pylist()
        parts = grouped["partition"].to_pylist()
        return pa.table(
            {
                "batch_id": pa.array([batch_id] * len(topics), pa.int64()),
                "topic": topics,
                "partition": pa.array(parts, pa.int32()),
                "first_offset": grouped["offset_min"].cast(pa.int64()),
                "last_offset": grouped["offset_max"].cast(pa.int64()),
                "records": grouped["offset_count"].cast(pa.int64()),
                "events": pa.array([ev_counts[(t, p)] for t, p in zip(topics, parts, strict=True)], pa.int64()),
                "joined": pa.array([counts[(t, p)][KIND_JOINED] for t, p in zip(topics, parts, strict=True)], pa.int64()),
                "skipped": pa.array([counts[(t, p)][KIND_SKIP] for t, p in zip(topics, parts, strict=True)], pa.int64()),
                "dead_letters": pa.array([counts[(t, p)][KIND_DEAD] for t, p in zip(topics, parts, strict=True)], pa.int64()),
                "committed_at_ms": pa.array([now] * len(topics), pa.int64()),
            },
            schema=BATCHES_SCHEMA,
        )

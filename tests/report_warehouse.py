"""A small real warehouse for the report's tests (``tests/test_report.py`` and the browser
test ``tests/e2e/test_report_browser.py``): the ``_cdcflow`` tables a pipeline writes,
written with delta-rs in their own schemas (:mod:`cdcflow.sinks.system_tables`), and
target tables with a few rows, with what the report must show of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from cdcflow.sinks.system_tables import (
    BATCHES,
    BATCHES_SCHEMA,
    DEAD_LETTER_SCHEMA,
    DEAD_LETTERS,
    PROGRESS,
    PROGRESS_SCHEMA,
    SCHEMA_CHANGES,
    SCHEMA_CHANGES_SCHEMA,
    SYSTEM_FOLDER,
)

#: commit time of the first micro-batch (2026-01-15 10:00:00 UTC)
T0_MS = 1_768_471_200_000


@dataclass
class SourcePlan:
    """One source's micro-batches: events of each (``0``: dead letters only, which has no
    progress row) and its dead letters ``{batch index: {code: count}}``."""

    name: str  # <pipeline>.<source>
    topic: str
    events: list[int]
    dead_letters: dict[int, dict[str, int]] = field(default_factory=dict)
    every_ms: int = 1_500  # between commits
    start_ms: int = T0_MS


@dataclass
class BuiltWarehouse:
    """What was written, and what the report must show of it."""

    root: Path
    sources: list[SourcePlan]
    tables: dict[str, int]  # table folder -> rows
    records_behind: bool  # the progress table has the column

    def commits(self, source: SourcePlan) -> list[int]:
        return [source.start_ms + i * source.every_ms for i in range(len(source.events))]

    def rate_points(self, source: SourcePlan) -> int:
        """Events/s points: every micro-batch but the first."""
        return len(source.events) - 1

    def progress_points(self, source: SourcePlan) -> int:
        """Lag points: micro-batches with events (a progress row)."""
        return sum(1 for e in source.events if e)

    def behind_points(self, source: SourcePlan) -> int:
        """Records-behind points: progress rows but the first (NULL, as Spark had not
        reported the log ends yet); none without the column."""
        return max(0, self.progress_points(source) - 1) if self.records_behind else 0

    def dead_letter_codes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.sources:
            for codes in s.dead_letters.values():
                for code, n in codes.items():
                    out[code] = out.get(code, 0) + n
        return out


def default_sources() -> list[SourcePlan]:
    """Two sources: ``shop.pg`` with six micro-batches and no dead letters, ``shop.mysql``
    with five, one of them dead letters only."""
    return [
        SourcePlan("shop.pg", "pg.cdc", [400, 380, 520, 610, 300, 150]),
        SourcePlan(
            "shop.mysql",
            "mysql.cdc",
            [200, 180, 0, 260, 90],
            dead_letters={1: {"BAD_JSON": 3}, 2: {"BAD_JSON": 2, "MISSING_FIELD": 4}},
            every_ms=2_000,
            start_ms=T0_MS + 700,
        ),
    ]


def build_warehouse(
    root: Path,
    sources: list[SourcePlan] | None = None,
    tables: dict[str, int] | None = None,
    records_behind: bool = True,
    stopped: dict[str, str] | None = None,
) -> BuiltWarehouse:
    """Write the ``_cdcflow`` tables ``batches``, ``progress`` and ``dead_letters`` of
    ``sources`` (two partitions per topic, one commit per micro-batch as the pipeline
    makes them) and the target tables ``{folder: rows}`` under ``root``.

    ``records_behind=False`` writes ``progress`` without its ``records_behind`` column, as
    warehouses written before it have it. ``stopped``: ``{table folder: reason}`` of the
    tables a schema change stopped (``_cdcflow/schema_changes`` rows, as the pipeline
    writes them).
    """
    sources = default_sources() if sources is None else sources
    tables = {"shop.public.orders": 3} if tables is None else tables
    built = BuiltWarehouse(Path(root), sources, tables, records_behind)
    system = Path(root) / SYSTEM_FOLDER
    progress_schema = (
        PROGRESS_SCHEMA
        if records_behind
        else pa.schema([f for f in PROGRESS_SCHEMA if f.name != "records_behind"])
    )
    for s in sources:
        offsets = [0, 0]
        for i, (events, at) in enumerate(zip(s.events, built.commits(s), strict=True)):
            letters = s.dead_letters.get(i, {})
            n_dead = sum(letters.values())
            per_partition = [events // 2, events - events // 2]
            dead_per_partition = [n_dead, 0]
            batch_rows = []
            for p in (0, 1):
                records = per_partition[p] + dead_per_partition[p]
                if not records:
                    continue
                batch_rows.append(
                    {
                        "batch_id": i,
                        "topic": s.topic,
                        "partition": p,
                        "first_offset": offsets[p],
                        "last_offset": offsets[p] + records - 1,
                        "records": records,
                        "events": per_partition[p],
                        "joined": 0,
                        "skipped": 0,
                        "dead_letters": dead_per_partition[p],
                        "committed_at_ms": at,
                        "source": s.name,
                        "delivery_id": i,
                    }
                )
                offsets[p] += records
            if letters:
                rows = [
                    {
                        "batch_id": i,
                        "topic": s.topic,
                        "partition": 0,
                        "offset": offsets[0] - n_dead + k,
                        "format": "debezium-json",
                        "stage": "decode",
                        "code": code,
                        "message": f"{code} in test",
                        "target_table": None,
                        "raw_key": None,
                        "raw_value": b"not json",
                        "committed_at_ms": at,
                    }
                    for k, code in enumerate(
                        c for c, n in sorted(letters.items()) for _ in range(n)
                    )
                ]
                _append(system / DEAD_LETTERS, rows, DEAD_LETTER_SCHEMA)
            if events:
                row = {
                    "source": s.name,
                    "batch_id": i,
                    "last_seq": f"{i:08d}",
                    "last_source_ts_ms": at - 800 - 100 * i,
                    "events": events,
                    "rows_changed": events,
                    "committed_at_ms": at,
                    "lag_ms": 800 + 100 * i,
                }
                if records_behind:
                    row["records_behind"] = None if i == 0 else 1_000 * (len(s.events) - i)
                _append(system / PROGRESS, [row], progress_schema)
            _append(system / BATCHES, batch_rows, BATCHES_SCHEMA)
    for folder, rows in tables.items():
        path = Path(root) / folder
        first = max(1, rows - 1)
        write_deltalake(str(path), pa.table({"id": list(range(first)), "amount": [1.5] * first}))
        if rows > first:
            more = pa.table({"id": list(range(first, rows)), "amount": [2.5] * (rows - first)})
            write_deltalake(str(path), more, mode="append")
    for folder, reason in (stopped or {}).items():
        row = {
            "target_table": folder,
            "batch_id": 1,
            "change": "stop",
            "policy": "fail",
            "applied": False,
            "message": reason,
            "recorded_at_ms": T0_MS,
        }
        _append(system / SCHEMA_CHANGES, [row], SCHEMA_CHANGES_SCHEMA)
    return built


def build_empty_warehouse(root: Path, tables: dict[str, int] | None = None) -> None:
    """A warehouse whose pipeline has started but applied nothing: empty ``_cdcflow``
    tables (``batches``, ``progress``) and, if given, target tables."""
    system = Path(root) / SYSTEM_FOLDER
    write_deltalake(str(system / BATCHES), BATCHES_SCHEMA.empty_table())
    write_deltalake(str(system / PROGRESS), PROGRESS_SCHEMA.empty_table())
    for folder, rows in (tables or {}).items():
        write_deltalake(str(Path(root) / folder), pa.table({"id": list(range(rows))}))


def _append(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    if rows:
        write_deltalake(str(path), pa.Table.from_pylist(rows, schema=schema), mode="append")

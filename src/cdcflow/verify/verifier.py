"""``cdcflow verify``'s engine: every mirror of a pipeline against its source table.

1. **Which tables.** The source database's tables, each routed as the pipeline routes it
   (:class:`~cdcflow.transform.router.Router` of every configured source, first match):
   a table whose target mirror exists is compared with it; the rows of a sharded target
   are those whose shard column names the table.
2. **One snapshot.** Every table is read in one read-only snapshot of the database,
   whose position is recorded (:mod:`cdcflow.verify.databases`). Before the mirrors are
   read, verify waits (``wait_s``) until the pipeline's applied offsets reach the log
   ends the brokers had once the snapshot was open: the changes in Kafka before the
   snapshot are then in the mirrors. Each mirror is read at its newest Delta version
   after that wait (recorded).
3. **Cheap when equal.** Per table, key ranges of about ``chunk_rows`` rows, a checksum
   per range on each side, bisection of the differing ones, rows compared at the leaves
   (:mod:`cdcflow.verify.ranges`). ``quick`` hashes the key only (missing and extra rows);
   ``full`` every compared column; ``sample`` compares ``sample_ranges`` random ranges in
   full.
4. **Never a false mismatch while both move.** A key found different is read again, both
   sides, after ``recheck_after_s`` in a new snapshot (and the wait of 2.), up to
   ``rechecks`` times. It is a mismatch only if it still differs while its source row
   stayed the same between the last two snapshots; if its source row kept changing it is
   reported *in flight*; if it became equal it was a change on its way (counted, not
   reported as a difference). The report says whether the pipeline had caught up.

What is compared: the columns the source table and the mirror both have, less the
mirror's own (``_cdc_*``, history columns, the shard column). Columns on one side only are
listed as left out (excluded columns, computed columns).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdcflow.errors import ConfigError
from cdcflow.sinks.history import IS_CURRENT
from cdcflow.sinks.warehouse import DeltaWarehouse, arrow_schema
from cdcflow.transform.expressions import Expression
from cdcflow.transform.router import Router, compile_pattern
from cdcflow.verify.canonical import Column, readable
from cdcflow.verify.databases import SourceDatabase, SourceTable, redact
from cdcflow.verify.ranges import (
    Difference,
    KeyRange,
    RangeStats,
    Row,
    bisect,
    row_differences,
    sample,
)
from cdcflow.verify.sides import MirrorSide, SourceSide

__all__ = [
    "MODES",
    "Mismatch",
    "Plan",
    "Resumed",
    "TableResult",
    "Verification",
    "VerifyOptions",
    "key_dict",
    "selection",
    "verify",
]

MODES = ("quick", "full", "sample")


@dataclass(frozen=True)
class VerifyOptions:
    """How to verify (the command's flags).

    Attributes:
        mode: ``quick`` | ``full`` | ``sample``.
        tables: a regular expression over target names (whole match); ``None``: all.
        chunk_rows: rows per first-level key range.
        leaf_rows: a differing range with at most this many rows is compared row by row.
        fanout: parts a differing range is split into.
        sample_ranges: ranges compared in ``sample`` mode.
        wait_s: how long to wait for the pipeline to apply what Kafka held at the
            snapshot (0: do not wait).
        rechecks: how many times a differing key is read again.
        recheck_after_s: the pause before each recheck.
        statement_timeout_s: the longest statement on the source.
        threads: DuckDB's threads for the mirror (``None``: its default, every core).
        resume: go on with the newest interrupted run of this mode, if there is one
            (its tables whose first round ended are not read again).
    """

    mode: str = "full"
    tables: str | None = None
    chunk_rows: int = 100_000
    leaf_rows: int = 256
    fanout: int = 16
    sample_ranges: int = 8
    wait_s: float = 60.0
    rechecks: int = 2
    recheck_after_s: float = 5.0
    statement_timeout_s: float = 60.0
    threads: int | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode}: give one of {', '.join(MODES)}")


@dataclass
class TableResult:
    """One mirror against one source table.

    ``missing``/``extra``/``different``: keys (as read, JSON-ready) differing after the
    rechecks; ``different`` items also name each differing column with both texts.
    ``in_flight``: keys whose source row kept changing; ``settled``: keys that differed
    once and caught up. ``refused``: why the table was not compared (no key...).
    """

    target: str
    source_table: str
    rows_source: int = 0
    rows_mirror: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)
    different: list[dict[str, Any]] = field(default_factory=list)
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    settled: int = 0
    compared_columns: list[str] = field(default_factory=list)
    left_out_columns: dict[str, str] = field(default_factory=dict)
    mirror_version: int | None = None
    ranges: int = 0
    checksums: int = 0
    differing_ranges: int = 0
    leaves: int = 0
    rows_read: int = 0
    seconds: float = 0.0
    refused: str | None = None

    @property
    def equal(self) -> bool:
        return self.refused is None and not (self.missing or self.extra or self.different)


@dataclass
class Verification:
    """One run of ``cdcflow verify``."""

    source_db: str
    mode: str
    position: str = ""
    started_at_ms: int = 0
    seconds: float = 0.0
    caught_up: bool | None = None  # None: not asked (no wait, or no brokers)
    records_behind: int | None = None
    rounds: int = 1
    tables: list[TableResult] = field(default_factory=list)
    not_mirrored: list[str] = field(default_factory=list)
    #: the differing keys as read, per table with any (not part of the report)
    mismatches: list[Mismatch] = field(default_factory=list, repr=False)
    #: ``--repair``'s :class:`~cdcflow.verify.repair.RepairReport` per source repaired
    repairs: list[Any] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.tables)


@dataclass
class Plan:
    """One source table and its mirror: the configured source whose routing sends the
    table there (its name), and a sharded target's shard column and this table's value."""

    table: SourceTable
    target: str
    source: str
    shard_column: str | None
    shard_value: str | None


@dataclass
class Mismatch:
    """The keys of one table still differing after the rechecks, as read (tuples in key
    order), for ``--repair``: ``key`` and ``columns`` are the compared columns."""

    plan: Plan
    key: list[Column]
    columns: list[Column]
    missing: list[tuple] = field(default_factory=list)
    extra: list[tuple] = field(default_factory=list)
    different: list[tuple] = field(default_factory=list)


@dataclass
class _Compared:
    """A table under comparison between rounds."""

    plan: Plan
    result: TableResult
    key: list[Column]
    columns: list[Column]
    candidates: dict[tuple, Difference]
    last_source: dict[tuple, Row]
    #: candidates whose source row changed in the last recheck
    moved: set[tuple] = field(default_factory=set)


# ----------------------------------------------------------------------------- planning


def plan_tables(
    config: Any, db: SourceDatabase, warehouse: DeltaWarehouse, tables: str | None
) -> tuple[list[Plan], list[str]]:
    """The source tables with a mirror (routed as the pipeline routes them), and the names
    of those without."""
    routers = [
        (s.name, s.format, Router(config.target_template, s.routing())) for s in config.sources
    ]
    wanted = compile_pattern(tables) if tables else None
    plans, missing = [], []
    for table in db.tables():
        chosen, source = None, ""
        for name, fmt, router in routers:
            route = router.route(fmt, table.database, table.schema, table.table)
            if route is None:
                continue
            if warehouse.open(warehouse.table_path(route.target)) is not None:
                chosen, source = route, name
                break
        if chosen is None:
            missing.append(table.name)
            continue
        if wanted is not None and not wanted.fullmatch(chosen.target):
            continue
        plans.append(
            Plan(
                table,
                chosen.target,
                source,
                chosen.shard_column,
                chosen.source if chosen.shard_column else None,
            )
        )
    return plans, missing


def _is_own_column(name: str) -> bool:
    return name.startswith(("_cdc_", "__"))


def _columns(
    plan: Plan, schema: pa.Schema
) -> tuple[list[Column], list[Column], dict[str, str]] | str:
    """``(key, other compared columns, left out)`` or why the table cannot be compared."""
    table = plan.table
    if not table.key:
        return (
            f"{table.name} has no primary key: verify plans its ranges on the key's index; "
            "give the table a primary key (or leave it out with --tables)"
        )
    by_name = {c.name: c for c in table.columns}
    mirror = set(schema.names)
    lost = [k for k in table.key if k not in mirror]
    if lost:
        return f"the mirror has no key column {', '.join(lost)} of {table.name}"
    left: dict[str, str] = {}
    for c in table.columns:
        if c.name not in mirror:
            left[c.name] = "not in the mirror (excluded or not yet added)"
    for name in schema.names:
        if name in by_name:
            continue
        if name == plan.shard_column:
            left[name] = "the shard column"
        elif _is_own_column(name):
            continue
        else:
            left[name] = "the mirror's only (computed or metadata)"
    key = [by_name[k] for k in table.key]
    others = [
        _as_mirrored(c, schema.field(c.name).type)
        for c in table.columns
        if c.name in mirror and c.name not in table.key
    ]
    return key, others, left


def _as_mirrored(column: Column, mirror_type: pa.DataType) -> Column:
    """The column compared as the format mirrored it: a decimal the format turned into a
    float (Maxwell's JSON numbers, Debezium's ``decimal.handling.mode=double``) is
    compared as a float on both sides (15 significant digits), as exactness was lost on
    the way."""
    if column.kind == "decimal" and pa.types.is_floating(mirror_type):
        return dataclasses.replace(column, kind="float", digits=15)
    return column


# ----------------------------------------------------------------------------- verify


def verify(
    config: Any,
    db: SourceDatabase,
    options: VerifyOptions,
    say: Callable[[str], None] = lambda line: None,
    caught_up: Callable[[float], tuple[bool | None, int | None]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    resume: Resumed | None = None,
    on_table: Callable[[int, str, str, dict[str, Any]], None] | None = None,
) -> Verification:
    """Verify every mirror of ``config``'s pipeline against ``db`` (see the module).

    Args:
        config: the pipeline's :class:`~cdcflow.config.PipelineConfig`.
        db: the source database (read-only).
        say: receives one progress line per table and round.
        caught_up: waits up to its argument (seconds) until the pipeline has applied what
            the brokers held when called; returns ``(caught up, records behind)``
            (``None``: not known). ``None``: do not wait.
        sleep: the pause before a recheck (a test's clock).
        resume: an interrupted run to go on with: its start time and the state of each
            table whose first round it finished (those tables are not read again; their
            differing keys are rechecked with the rest).
        on_table: called after each table's first round with the run's start (epoch ms),
            the target, the source table and the table's state (JSON-ready), so that an
            interrupted run can be resumed.

    Raises:
        ConfigError: ``--tables`` is not a valid pattern; no table of the database has a
            mirror.
        StorageError: a mirror cannot be read.
    """
    started = time.monotonic()
    warehouse = DeltaWarehouse(config.warehouse, storage_options=dict(config.storage))
    run = Verification(redact(db.url), options.mode, started_at_ms=int(time.time() * 1000))
    if resume is not None:
        run.started_at_ms = resume.started_at_ms
    plans, run.not_mirrored = plan_tables(config, db, warehouse, options.tables)
    if not plans:
        raise ConfigError(
            f"cdcflow verify: no table of {redact(db.url)} has a mirror in {config.warehouse}"
            + (f" matching --tables {options.tables}" if options.tables else "")
            + "; check --source-db and the sources' routing"
        )
    full = options.mode != "quick"
    run.position = db.begin_snapshot()
    say(f"source snapshot at {run.position}")
    if caught_up is not None and options.wait_s > 0:
        run.caught_up, run.records_behind = caught_up(options.wait_s)
        say(_caught_up_line(run))
    compared: list[_Compared] = []
    done = resume.tables if resume is not None else {}
    try:
        for plan in plans:
            state = done.get((plan.target, plan.table.name))
            restored = _restored(config, plan, warehouse, full, state) if state else None
            if restored is not None:
                compared.append(restored)
                say(f"{_table_line(restored.result, len(restored.candidates))} [resumed]")
                continue
            compared.append(_first_round(config, plan, db, warehouse, options, full))
            result = compared[-1].result
            say(_table_line(result, len(compared[-1].candidates)))
            if on_table is not None:
                on_table(run.started_at_ms, plan.target, plan.table.name, _state(compared[-1]))
    finally:
        db.end_snapshot()
    # rechecks: read the differing keys again, in a new snapshot, after a pause
    pending = [c for c in compared if c.candidates]
    for _ in range(options.rechecks):
        if not pending:
            break
        sleep(options.recheck_after_s)
        run.rounds += 1
        position = db.begin_snapshot()
        say(
            f"recheck {run.rounds - 1}: {sum(len(c.candidates) for c in pending)} keys at {position}"
        )
        if caught_up is not None and options.wait_s > 0:
            run.caught_up, run.records_behind = caught_up(options.wait_s)
        try:
            for c in pending:
                _recheck(config, c, db, warehouse, full)
        finally:
            db.end_snapshot()
        # a table whose differing source rows all held still is settled
        pending = [c for c in pending if c.candidates and c.moved]
    for c in compared:
        mismatch = _settle(c)
        if mismatch is not None:
            run.mismatches.append(mismatch)
    run.tables = [c.result for c in compared]
    run.seconds = time.monotonic() - started
    return run


@dataclass(frozen=True)
class Selection:
    """Which rows compare: the mirror's (a DuckDB condition over ``columns``: the shard
    column naming the source table; a history table's current versions) and the source's
    (the target's row filter, evaluated as the pipeline evaluates it)."""

    where: str | None
    columns: tuple[str, ...]
    row_filter: Expression | None


def selection(config: Any, plan: Plan) -> Selection:
    """Which rows of ``plan``'s mirror and source compare (:class:`Selection`)."""
    options = config.tables(plan.target)
    conditions, columns = [], []
    if plan.shard_column:
        value = (plan.shard_value or "").replace("'", "''")
        conditions.append(f"\"{plan.shard_column}\" = '{value}'")
        columns.append(plan.shard_column)
    if options.mode == "history":
        conditions.append(f'"{IS_CURRENT}"')
        columns.append(IS_CURRENT)
    return Selection(" AND ".join(conditions) or None, tuple(columns), options.shaping.filter)


def _first_round(
    config: Any,
    plan: Plan,
    db: SourceDatabase,
    warehouse: DeltaWarehouse,
    options: VerifyOptions,
    full: bool,
) -> _Compared:
    began = time.monotonic()
    result = TableResult(plan.target, plan.table.name)
    table = warehouse.open(warehouse.table_path(plan.target))
    assert table is not None  # planned only with a mirror
    result.mirror_version = table.version()
    dataset = table.to_pyarrow_dataset()
    shaped = _columns(plan, dataset.schema)
    if isinstance(shaped, str):
        result.refused = shaped
        return _Compared(plan, result, [], [], {}, {})
    key, columns, result.left_out_columns = shaped
    if not full:  # quick: keys only, at the leaves too (no value is half compared)
        columns = []
    result.compared_columns = [c.name for c in key + columns]
    chosen = selection(config, plan)
    mirror = MirrorSide(
        dataset,
        dataset.schema,
        key,
        columns,
        full,
        chosen.where,
        options.threads,
        keyed=False,
        where_columns=chosen.columns,
    )
    source = SourceSide(db, plan.table, key, columns, full, chosen.row_filter)
    try:
        # the first cuts from the mirror's keys alone; then its keyed table is built in a
        # thread while the database computes the first ranges' checksums
        _, bounds = mirror.first_cuts(options.chunk_rows)
        ranges = KeyRange().cut(bounds)
        if options.mode == "sample":
            ranges = sample(ranges, options.sample_ranges)
        result.ranges = len(ranges)
        mirror.start_build()
        source.prefetch(ranges)
        stats = RangeStats()
        found, source_rows = bisect(
            source, mirror, ranges, columns, options.leaf_rows, options.fanout, stats
        )
    finally:
        mirror.close()
    result.rows_source, result.rows_mirror = stats.source_rows, stats.mirror_rows
    result.checksums = stats.checksums
    result.differing_ranges, result.leaves, result.rows_read = (
        stats.differing,
        stats.leaves,
        stats.rows_read,
    )
    result.seconds = time.monotonic() - began
    last = {k: source_rows[k] for k in found if k in source_rows}
    return _Compared(plan, result, key, columns, found, last)


def _recheck(
    config: Any, c: _Compared, db: SourceDatabase, warehouse: DeltaWarehouse, full: bool
) -> None:
    """Read the candidate keys again on both sides; keep those still differing, and
    remember which source rows changed since the last round."""
    table = warehouse.open(warehouse.table_path(c.plan.target))
    assert table is not None
    c.result.mirror_version = table.version()
    dataset = table.to_pyarrow_dataset()
    keys = [d.key for d in c.candidates.values()]
    chosen = selection(config, c.plan)
    source = SourceSide(db, c.plan.table, c.key, c.columns, full, chosen.row_filter)
    src = source.rows_by_key(keys)
    mirror = _key_reader(dataset, c, chosen)
    try:
        mir = mirror.rows_by_key(keys)
    finally:
        mirror.close()
    still = row_differences(src, mir, c.columns)
    c.result.settled += len([k for k in c.candidates if k not in still])
    moved = {k for k in still if src.get(k) != c.last_source.get(k)}
    c.candidates = still
    c.last_source = {k: v for k, v in src.items() if k in still}
    c.moved = moved


def _key_reader(dataset: Any, c: _Compared, chosen: Selection) -> MirrorSide:
    """A mirror side that only reads rows by key (no sorted key table built)."""
    return MirrorSide(
        dataset,
        dataset.schema,
        c.key,
        c.columns,
        False,
        chosen.where,
        keyed=False,
        where_columns=chosen.columns,
    )


def _settle(c: _Compared) -> Mismatch | None:
    """Sort the remaining candidates: in flight (source row moved in the last round) or
    missing/extra/different; the latter's keys as read, if any."""
    r = c.result
    by_name = {col.name: col for col in c.columns}
    mismatch = Mismatch(c.plan, c.key, c.columns)
    for k, d in sorted(c.candidates.items()):
        item = key_dict(c.key, d.key)
        if k in c.moved:
            r.in_flight.append(item)
            continue
        getattr(mismatch, d.kind).append(d.key)
        if d.kind == "missing":
            r.missing.append(item)
        elif d.kind == "extra":
            r.extra.append(item)
        else:
            item = {
                "key": item,
                "columns": {
                    n: {"source": readable(by_name[n], a), "mirror": readable(by_name[n], b)}
                    for n, (a, b) in d.columns.items()
                },
            }
            r.different.append(item)
    return mismatch if mismatch.missing or mismatch.extra or mismatch.different else None


def key_dict(key: Sequence[Column], values: tuple) -> dict[str, Any]:
    return {c.name: _jsonable(v) for c, v in zip(key, values, strict=True)}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


# ----------------------------------------------------------------------------- resume


@dataclass
class Resumed:
    """An interrupted run: its start (epoch ms, the run's identity in the warehouse) and,
    by ``(target, source table)``, the state :func:`verify` gave ``on_table``."""

    started_at_ms: int
    tables: dict[tuple[str, str], dict[str, Any]]


#: TableResult fields a table's state keeps from its first round
_FIRST_ROUND = (
    "rows_source", "rows_mirror", "compared_columns", "left_out_columns", "mirror_version",
    "ranges", "checksums", "differing_ranges", "leaves", "rows_read", "seconds", "refused",
)  # fmt: skip


def _state(c: _Compared) -> dict[str, Any]:
    """A table after its first round, as JSON: its result so far, and its differing keys
    (canonical texts, the key as read with its types, what differed, the source row)."""
    return {
        "result": {name: getattr(c.result, name) for name in _FIRST_ROUND},
        "candidates": [
            {
                "canonical": list(k),
                "kind": d.kind,
                "key": [_typed(v) for v in d.key],
                "columns": {n: list(v) for n, v in d.columns.items()},
                "source": list(c.last_source[k].texts) if k in c.last_source else None,
            }
            for k, d in c.candidates.items()
        ],
    }


def _restored(
    config: Any, plan: Plan, warehouse: DeltaWarehouse, full: bool, state: dict[str, Any]
) -> _Compared | None:
    """The table as its first round left it, or ``None`` (read it again) when its mirror
    no longer has the columns that round compared."""
    table = warehouse.open(warehouse.table_path(plan.target))
    if table is None:
        return None
    shaped = _columns(plan, arrow_schema(table))
    result = TableResult(plan.target, plan.table.name, **state["result"])
    if isinstance(shaped, str) or result.refused:
        return None
    key, columns, _ = shaped
    if not full:
        columns = []
    if [c.name for c in key + columns] != result.compared_columns:
        return None
    candidates, last = {}, {}
    for item in state["candidates"]:
        k = tuple(item["canonical"])
        as_read = tuple(_untyped(v) for v in item["key"])
        candidates[k] = Difference(
            item["kind"], as_read, {n: (v[0], v[1]) for n, v in item["columns"].items()}
        )
        if item["source"] is not None:
            last[k] = Row(as_read, tuple(item["source"]))
    return _Compared(plan, result, key, columns, candidates, last)


def _typed(v: Any) -> Any:
    """A key value as read, as JSON that gives it back with its type (:func:`_untyped`)."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    for name, kind in _TYPES.items():
        if type(v) is kind:
            return {"$": name, "v": _text_of(v)}
    return {"$": "str", "v": str(v)}


def _text_of(v: Any) -> str:
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dt.timedelta):
        return str(v // dt.timedelta(microseconds=1))
    return str(v)


def _untyped(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    name, text = v["$"], v["v"]
    if name == "bytes":
        return bytes.fromhex(text)
    if name == "decimal":
        return decimal.Decimal(text)
    if name == "datetime":
        return dt.datetime.fromisoformat(text)
    if name == "date":
        return dt.date.fromisoformat(text)
    if name == "time":
        return dt.time.fromisoformat(text)
    if name == "timedelta":
        return dt.timedelta(microseconds=int(text))
    return text


_TYPES: dict[str, type] = {
    "bytes": bytes,
    "decimal": decimal.Decimal,
    "datetime": dt.datetime,
    "date": dt.date,
    "time": dt.time,
    "timedelta": dt.timedelta,
}


# ----------------------------------------------------------------------------- lines


def _caught_up_line(run: Verification) -> str:
    if run.caught_up is None:
        return "pipeline progress: not known (no brokers to ask)"
    if run.caught_up:
        return "pipeline caught up with what Kafka held at the snapshot"
    return (
        f"pipeline NOT caught up: {run.records_behind} records behind after waiting; "
        "differences may be changes on their way (rechecked)"
    )


def _table_line(r: TableResult, candidates: int) -> str:
    name = r.target if r.source_table == r.target else f"{r.target} <- {r.source_table}"
    if r.refused:
        return f"{name}: not compared: {r.refused}"
    return (
        f"{name}: {r.rows_source} rows in the source, {r.rows_mirror} in the mirror "
        f"(version {r.mirror_version}); {r.ranges} ranges, {r.differing_ranges} differing; "
        f"{candidates} keys differ before rechecks ({r.seconds:.1f} s)"
    )

"""``cdcflow status``: what a pipeline's warehouse says about it, read from the ``_cdcflow``
tables (and, given the configuration, the brokers' log ends), without running anything.

- per source: the last micro-batch applied, when, the next offset of each partition, the
  records behind the log end (needs the brokers) and the source lag of that batch;
- per table: rows, last change, stopped (why, and how to resume);
- dead letters by code; who holds the pipeline's lease.

Read-only: it takes no lease and writes nothing, so it can run beside the pipeline (Delta
readers see the last committed version). Kafka Connect's ``GET /connectors/<name>/status``
and Databricks' pipeline event log are the models.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.apply.schema_log import SchemaLog
from cdcflow.errors import ConfigError
from cdcflow.runtime.progress import counts, human_duration
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.system_tables import (
    BATCHES,
    BATCHES_SCHEMA,
    DEAD_LETTER_SCHEMA,
    DEAD_LETTERS,
    LEASES,
    PROGRESS,
    PROGRESS_SCHEMA,
    SYSTEM_FOLDER,
)
from cdcflow.sinks.warehouse import DeltaWarehouse

__all__ = [
    "PartitionStatus",
    "SourceStatus",
    "Status",
    "TableStatus",
    "brokers_log_ends",
    "describe",
    "status",
]


@dataclass
class PartitionStatus:
    """One topic-partition of a source: the next offset to apply and the log end."""

    topic: str
    partition: int
    next_offset: int
    log_end: int | None = None  # the brokers' high watermark (``None``: not asked)

    @property
    def behind(self) -> int | None:
        return None if self.log_end is None else max(0, self.log_end - self.next_offset)


@dataclass
class SourceStatus:
    """One source (``<pipeline>.<source>`` in the ``_cdcflow`` tables)."""

    name: str
    last_apply_id: int | None = None  # the warehouse's apply number
    last_micro_batch: int | None = None  # Spark's micro-batch id of it
    last_applied_at_ms: int | None = None
    records: int = 0  # applied, over the retained history of _cdcflow/batches
    lag_ms: int | None = None  # of the last batch with a source time
    partitions: list[PartitionStatus] = field(default_factory=list)

    @property
    def behind(self) -> int | None:
        known = [p.behind for p in self.partitions if p.behind is not None]
        return sum(known) if known else None


@dataclass
class TableStatus:
    """One target table."""

    name: str  # its folder under the warehouse
    rows: int
    version: int
    last_change_ms: int | None
    stopped: str | None = None  # why (``None``: taking changes)


@dataclass
class Status:
    """Everything :func:`describe` prints (``--json``: :meth:`as_dict`)."""

    warehouse: str
    pipeline_id: str | None
    sources: list[SourceStatus]
    tables: list[TableStatus]
    dead_letters: dict[str, int]
    lease: str  # one line: who holds it, or that no run holds it
    brokers: str | None = None  # why the log ends are unknown, if they are

    def partitions(self) -> list[PartitionStatus]:
        """Every source's topic-partitions, in source order."""
        return [p for s in self.sources for p in s.partitions]

    def add_log_ends(self, log_ends: Mapping[tuple[str, int], int]) -> None:
        """Set each partition's log end from ``(topic, partition) -> high watermark``
        (a partition not in ``log_ends`` keeps ``None``: not known)."""
        for p in self.partitions():
            p.log_end = log_ends.get((p.topic, p.partition))

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for source, data in zip(self.sources, out["sources"], strict=True):
            data["behind"] = source.behind
            for p, pd in zip(source.partitions, data["partitions"], strict=True):
                pd["behind"] = p.behind
        return out


def brokers_log_ends(config: Any) -> tuple[dict[tuple[str, int], int] | None, str | None]:
    """Every source's partitions' log ends (``(topic, partition) -> high watermark``) as the
    brokers give them within ``kafka.startup_timeout_s``, or ``None`` and why not (the
    client's first line)."""
    # deferred: pyspark (~1 s), only a reading of the brokers needs it
    from cdcflow.source.kafka.admin import log_end_offsets

    options = {**config.kafka.reader_options(), **config.subscription()}
    try:
        ends = log_end_offsets(options, config.kafka.startup_timeout_s, "kafka.startup_timeout_s")
    except Exception as exc:  # noqa: BLE001 - the callers report what they can
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ends, None


def status(
    warehouse: str,
    pipeline_id: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    log_ends: Mapping[tuple[str, int], int] | None = None,
) -> Status:
    """Read the status of ``warehouse`` (of one pipeline, or of every pipeline in it).

    Args:
        warehouse: the warehouse folder or URI.
        pipeline_id: only this pipeline's sources and lease (``None``: all).
        storage_options: delta-rs storage options.
        log_ends: ``(topic, partition) -> high watermark``, for records behind.

    Raises:
        ConfigError: ``warehouse`` holds no cdcflow tables (a wrong folder).
        StorageError: a table cannot be read.
    """

    wh = DeltaWarehouse(warehouse, storage_options=dict(storage_options or {}))
    if wh.open(wh.system_path(BATCHES)) is None and not wh.mirrors():
        raise ConfigError(
            f"{warehouse} holds no cdcflow tables (no {SYSTEM_FOLDER}/{BATCHES}): give the "
            "warehouse of a pipeline that has run, or its configuration"
        )
    prefix = None if pipeline_id is None else f"{pipeline_id}."
    sources = _sources(wh, prefix, log_ends or {})
    return Status(
        warehouse=warehouse,
        pipeline_id=pipeline_id,
        sources=sources,
        tables=_tables(wh),
        dead_letters=_dead_letters(wh),
        lease=_lease(wh, warehouse, pipeline_id),
    )


def _sources(
    wh: DeltaWarehouse, prefix: str | None, log_ends: Mapping[tuple[str, int], int]
) -> list[SourceStatus]:
    batches = wh.read_system(BATCHES, BATCHES_SCHEMA)
    progress = wh.read_system(PROGRESS, PROGRESS_SCHEMA)
    batches = batches.filter(pc.is_valid(batches["source"]))
    out = []
    for name in sorted(set(batches["source"].to_pylist())):
        if prefix is not None and not name.startswith(prefix):
            continue
        own = batches.filter(pc.equal(batches["source"], name))
        s = SourceStatus(name=name, records=pc.sum(own["records"]).as_py() or 0)
        last = own.take([pc.index(own["batch_id"], pc.max(own["batch_id"])).as_py()])
        s.last_apply_id = last["batch_id"][0].as_py()
        s.last_micro_batch = last["delivery_id"][0].as_py()
        s.last_applied_at_ms = pc.max(own["committed_at_ms"]).as_py()
        ends = own.group_by(["topic", "partition"]).aggregate([("last_offset", "max")])
        for row in sorted(ends.to_pylist(), key=lambda r: (r["topic"], r["partition"])):
            tp = (row["topic"], row["partition"])
            s.partitions.append(
                PartitionStatus(tp[0], tp[1], row["last_offset_max"] + 1, log_ends.get(tp))
            )
        mine = progress.filter(
            pc.and_(pc.equal(progress["source"], name), pc.is_valid(progress["lag_ms"]))
        )
        if mine.num_rows:
            at = pc.index(mine["batch_id"], pc.max(mine["batch_id"])).as_py()
            s.lag_ms = mine["lag_ms"][at].as_py()
        out.append(s)
    return out


def _tables(wh: DeltaWarehouse) -> list[TableStatus]:
    stopped = SchemaLog(wh).stopped()
    out = []
    for folder in wh.mirrors():
        table = wh.open(wh.table_path(folder))
        if table is None:
            continue
        actions = pa.table(table.get_add_actions(flatten=True))
        rows = pc.sum(actions["num_records"]).as_py() if actions.num_rows else 0
        history = table.history(1)
        last = history[0].get("timestamp") if history else None
        reason = stopped.get(folder) or next(
            (m for t, m in stopped.items() if wh.table_path(t) == wh.table_path(folder)), None
        )
        out.append(TableStatus(folder, int(rows or 0), table.version(), last, reason))
    return out


def _dead_letters(wh: DeltaWarehouse) -> dict[str, int]:
    letters = wh.read_system(DEAD_LETTERS, DEAD_LETTER_SCHEMA, columns=["code"])
    if not letters.num_rows:
        return {}
    counted = letters.group_by("code").aggregate([("code", "count")])
    pairs = zip(counted["code"].to_pylist(), counted["code_count"].to_pylist(), strict=True)
    return dict(sorted(pairs, key=lambda kv: -kv[1]))


def _lease(wh: DeltaWarehouse, warehouse: str, pipeline_id: str | None) -> str:
    ids = [pipeline_id] if pipeline_id is not None else wh.storage.folders(SYSTEM_FOLDER, LEASES)
    now_ms = int(time.time() * 1000)
    lines = []
    for pid in ids:
        state = PipelineLease(warehouse, pid, storage_options=wh.storage_options or None).read()
        if state is None or state.released:
            lines.append(f"pipeline {pid}: no run holds its lease")
        elif state.expired(now_ms):
            lines.append(
                f"pipeline {pid}: its last run (host {state.owner.host}, pid {state.owner.pid}) "
                f"stopped renewing its lease {_ago(now_ms - state.renewed_at_ms)} ago; the next "
                "run takes it"
            )
        else:
            lines.append(
                f"pipeline {pid}: running on host {state.owner.host} (pid {state.owner.pid}) "
                f"since {_ago(now_ms - state.acquired_at_ms)} ago, renewed "
                f"{_ago(now_ms - state.renewed_at_ms)} ago"
            )
    return "; ".join(lines) or "no lease recorded"


def _ago(ms: int) -> str:
    return human_duration(max(0, ms) / 1000)


def _when(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "never"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
    return f"{stamp} ({_ago(now_ms - ms)} ago)"


def describe(s: Status, now_ms: int | None = None) -> list[str]:
    """The lines ``cdcflow status`` prints."""

    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    lines = [f"warehouse {s.warehouse}", f"lease     {s.lease}"]
    lines.append(f"sources   {len(s.sources)}")
    for src in s.sources:
        behind = "" if src.behind is None else f"; {src.behind:,} records behind"
        lag = "" if src.lag_ms is None else f"; lag {human_duration(src.lag_ms / 1000)}"
        lines.append(
            f"  {src.name}: micro-batch {src.last_micro_batch} (apply {src.last_apply_id}) "
            f"applied {_when(src.last_applied_at_ms, now_ms)}; {src.records:,} records{behind}{lag}"
        )
        for p in src.partitions[:8]:
            end = "" if p.log_end is None else f" of {p.log_end:,} ({p.behind:,} behind)"
            lines.append(f"    {p.topic}[{p.partition}] next offset {p.next_offset:,}{end}")
        if len(src.partitions) > 8:
            lines.append(f"    ... and {len(src.partitions) - 8} more partitions (--json)")
    if s.brokers:
        lines.append(f"  (records behind unknown: {s.brokers})")
    lines.append(f"tables    {len(s.tables)}")
    width = max([12, *(len(t.name) for t in s.tables)])
    for t in s.tables:
        state = "taking changes" if t.stopped is None else f"STOPPED: {t.stopped}"
        lines.append(
            f"  {t.name:{width}} {t.rows:>12,} rows  v{t.version:<6} last change "
            f"{_when(t.last_change_ms, now_ms)}  {state}"
        )
    if any(t.stopped for t in s.tables):
        lines.append(
            "  a stopped table takes changes again after `cdcflow resume --warehouse "
            f"{s.warehouse} TABLE` (fix its schema or policy first)"
        )
    total = sum(s.dead_letters.values())
    lines.append(
        f"dead letters {total:,}" + (f" ({counts(s.dead_letters)})" if s.dead_letters else "")
    )
    return lines

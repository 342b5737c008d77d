"""``cdcflow verify CONFIG --source-db URL``: is every mirror still its source table?

Runs :func:`cdcflow.verify.verifier.verify` with the pipeline's configuration, waits for
the pipeline through the brokers and the warehouse's offsets (the status command's
reading), prints one block per table (or one JSON object), records each table's outcome
in ``_cdcflow/verifications``, and writes the Prometheus gauges to a file for
node_exporter's textfile collector when asked (a one-shot command has no endpoint to be
scraped). Each table's first round is saved in ``_cdcflow/verify_progress`` as it ends,
so that ``--resume`` goes on with an interrupted run. ``--repair`` takes the pipeline's
lease first, finishes a repair a killed run left, verifies, then repairs
(:mod:`cdcflow.verify.repair`). Exit 0 when every compared mirror equals its source (or
every differing key was repaired: :func:`settled`), 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdcflow.commands.status import brokers_log_ends, status
from cdcflow.errors import ConfigError
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.system_tables import (
    VERIFICATIONS,
    VERIFICATIONS_SCHEMA,
    VERIFY_PROGRESS,
    VERIFY_PROGRESS_SCHEMA,
)
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.verify.databases import SourceDatabase
from cdcflow.verify.repair import OUTCOMES, finish_interrupted
from cdcflow.verify.repair import repair as repair_keys
from cdcflow.verify.verifier import Resumed, TableResult, Verification, VerifyOptions, verify

__all__ = [
    "VERIFICATIONS",
    "VERIFICATIONS_SCHEMA",
    "as_dict",
    "describe",
    "last_verifications",
    "metrics_text",
    "pipeline_caught_up",
    "record",
    "run_verify",
    "settled",
    "unfinished",
    "write_metrics",
]


def pipeline_caught_up(config: Any) -> Callable[[float], tuple[bool | None, int | None]]:
    """A wait for the pipeline: the brokers' log ends now, then the warehouse's applied
    offsets polled every second until they reach them or ``wait_s`` passes. Returns
    ``(caught up, records behind)``; ``(None, None)`` when the brokers cannot be asked."""

    def wait(wait_s: float) -> tuple[bool | None, int | None]:
        ends, _ = brokers_log_ends(config)
        if ends is None:  # progress is then not known; verify goes on
            return None, None
        deadline = time.monotonic() + wait_s
        while True:
            found = status(config.warehouse, config.pipeline_id, dict(config.storage))
            applied = {(p.topic, p.partition): p.next_offset for p in found.partitions()}
            behind = sum(max(0, end - applied.get(tp, 0)) for tp, end in ends.items())
            if behind == 0 or time.monotonic() >= deadline:
                return behind == 0, behind
            time.sleep(1.0)

    return wait


def run_verify(
    config: Any,
    url: str,
    options: VerifyOptions,
    say: Callable[[str], None] = print,
    repair: bool = False,
) -> Verification:
    """Verify (waiting for the pipeline as ``options.wait_s`` says), record the outcome in
    the warehouse, return it. With ``repair``, under the pipeline's lease taken first
    (the pipeline must not run: nothing to wait for), the differing keys are written again
    from the source and checked (:mod:`cdcflow.verify.repair`; ``run.repairs``).

    Raises:
        ConfigError: see :func:`~cdcflow.verify.verifier.verify`; a bad ``url``;
            ``repair`` with ``sink: delta-spark``.
        LeaseHeld: ``repair`` while the pipeline runs (exit 75).
        StorageError: a mirror or the verifications table cannot be read or written.
    """
    if not repair:
        return _verify(config, url, options, say)
    if config.sink == "delta-spark":
        raise ConfigError(
            "cdcflow verify --repair: sink delta-spark is not supported yet (the repair "
            "writes with delta-rs, as dead-letter replay does); verify without --repair"
        )
    with PipelineLease(
        config.warehouse, config.pipeline_id, storage_options=config.storage
    ) as lease:
        for line in finish_interrupted(config, lease.fence):
            say(line)
        waitless = dataclasses.replace(options, wait_s=0.0)  # the pipeline is stopped
        return _verify(
            config,
            url,
            waitless,
            say,
            lambda db, run: repair_keys(config, db, run, lease.fence, say),
        )


def _verify(
    config: Any,
    url: str,
    options: VerifyOptions,
    say: Callable[[str], None],
    then: Callable[[SourceDatabase, Verification], list[Any]] | None = None,
) -> Verification:
    db = SourceDatabase(url, options.statement_timeout_s)
    warehouse = DeltaWarehouse(config.warehouse, storage_options=dict(config.storage))
    resumed = None
    if options.resume:
        resumed = unfinished(warehouse, config.pipeline_id, options.mode)
        say(
            "nothing to resume: a new run"
            if resumed is None
            else f"resuming the run of {_when(resumed.started_at_ms)}: "
            f"{len(resumed.tables)} tables done"
        )

    def saved(started_at_ms: int, target: str, source_table: str, state: dict) -> None:
        row = {
            "pipeline": config.pipeline_id,
            "started_at_ms": started_at_ms,
            "mode": options.mode,
            "target_table": target,
            "source_table": source_table,
            "saved_at_ms": int(time.time() * 1000),
            "state": json.dumps(state),
        }
        table = pa.Table.from_pylist([row], schema=VERIFY_PROGRESS_SCHEMA)
        warehouse.append_rows(warehouse.system_path(VERIFY_PROGRESS), table)

    try:
        run = verify(
            config,
            db,
            options,
            say=say,
            caught_up=pipeline_caught_up(config),
            resume=resumed,
            on_table=saved,
        )
        record(config, run)
        _forget_progress(warehouse, config.pipeline_id, run.started_at_ms)
        if then is not None and run.mismatches:
            run.repairs = then(db, run)
    finally:
        db.close()
    return run


def unfinished(warehouse: DeltaWarehouse, pipeline: str, mode: str) -> Resumed | None:
    """The newest run of ``pipeline`` in ``mode`` that saved tables' first rounds and never
    recorded its outcome (it was interrupted), or ``None``."""
    rows = warehouse.read_system(VERIFY_PROGRESS, VERIFY_PROGRESS_SCHEMA).to_pylist()
    rows = [r for r in rows if r["pipeline"] == pipeline and r["mode"] == mode]
    if not rows:
        return None
    ended = {
        r["started_at_ms"]
        for r in warehouse.read_system(VERIFICATIONS, VERIFICATIONS_SCHEMA).to_pylist()
        if r["pipeline"] == pipeline
    }
    open_runs = {r["started_at_ms"] for r in rows} - ended
    if not open_runs:
        return None
    newest = max(open_runs)
    tables = {
        (r["target_table"], r["source_table"]): json.loads(r["state"])
        for r in rows
        if r["started_at_ms"] == newest
    }
    return Resumed(newest, tables)


def _forget_progress(warehouse: DeltaWarehouse, pipeline: str, started_at_ms: int) -> None:
    """Delete the progress rows of a run whose outcome is recorded (and of older runs of
    the pipeline, which can no longer be resumed)."""
    table = warehouse.open(warehouse.system_path(VERIFY_PROGRESS))
    if table is None:
        return
    quoted = pipeline.replace("'", "''")
    table.delete(f"pipeline = '{quoted}' AND started_at_ms <= {int(started_at_ms)}")
    warehouse.forget(warehouse.system_path(VERIFY_PROGRESS))


def _when(epoch_ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_ms / 1000))


def settled(run: Verification) -> bool:
    """Exit 0: every mirror equalled its source, or ``--repair`` made every differing key
    equal (or found its source row moving) and refused no table."""
    if run.equal:
        return True
    if not run.repairs or any(t.refused for t in run.tables):
        return False
    repaired = {k.target for r in run.repairs for k in r.keys}
    differing = {t.target for t in run.tables if not t.equal}
    return differing <= repaired and all(r.complete for r in run.repairs)


def record(config: Any, run: Verification) -> None:
    """Append one row per table of ``run`` to ``_cdcflow/verifications``."""
    rows = [
        {
            "pipeline": config.pipeline_id,
            "started_at_ms": run.started_at_ms,
            "target_table": t.target,
            "source_table": t.source_table,
            "source_db": run.source_db,
            "mode": run.mode,
            "position": run.position,
            "mirror_version": t.mirror_version,
            "equal": t.equal,
            "rows_source": t.rows_source,
            "rows_mirror": t.rows_mirror,
            "missing": len(t.missing),
            "extra": len(t.extra),
            "different": len(t.different),
            "in_flight": len(t.in_flight),
            "caught_up": run.caught_up,
            "refused": t.refused,
            "seconds": t.seconds,
            "details": json.dumps(_details(t)),
        }
        for t in run.tables
    ]
    warehouse = DeltaWarehouse(config.warehouse, storage_options=dict(config.storage))
    table = pa.Table.from_pylist(rows, schema=VERIFICATIONS_SCHEMA)
    warehouse.append_rows(warehouse.system_path(VERIFICATIONS), table)


def _details(t: TableResult) -> dict[str, Any]:
    return {k: getattr(t, k) for k in ("missing", "extra", "different", "in_flight")}


def last_verifications(warehouse: DeltaWarehouse, pipeline: str | None) -> list[dict[str, Any]]:
    """The newest verification row of each table (of ``pipeline``; ``None``: all)."""
    rows = warehouse.read_system(VERIFICATIONS, VERIFICATIONS_SCHEMA).to_pylist()
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if pipeline is not None and row["pipeline"] != pipeline:
            continue
        k = (row["pipeline"], row["target_table"])
        if k not in newest or row["started_at_ms"] >= newest[k]["started_at_ms"]:
            newest[k] = row
    return sorted(newest.values(), key=lambda r: r["target_table"])


# ----------------------------------------------------------------------------- output


def describe(run: Verification, show: int = 10) -> list[str]:
    """The text report: one block per table, then the verdict."""
    lines = [
        f"verify {run.source_db} ({run.mode}) at {run.position}; "
        f"{len(run.tables)} tables, {run.rounds} round(s), {run.seconds:.1f} s"
    ]
    if run.caught_up is False:
        lines.append(
            f"  the pipeline had not caught up ({run.records_behind} records behind): "
            "a difference may be a change on its way"
        )
    for t in run.tables:
        if t.refused:
            lines.append(f"{t.target}: NOT COMPARED: {t.refused}")
            continue
        verdict = "equal" if t.equal else "DIFFERS"
        moved = " at the first read" if t.settled or t.in_flight else ""
        lines.append(
            f"{t.target} <- {t.source_table}: {verdict}; {t.rows_source} rows in the source, "
            f"{t.rows_mirror} in the mirror{moved} (version {t.mirror_version})"
        )
        for kind in ("missing", "extra", "in_flight"):
            keys = getattr(t, kind)
            if keys:
                shown = ", ".join(_key_text(k) for k in keys[:show])
                more = f" and {len(keys) - show} more" if len(keys) > show else ""
                lines.append(f"  {kind.replace('_', ' ')} ({len(keys)}): {shown}{more}")
        if t.different:
            lines.append(f"  different ({len(t.different)}):")
            for d in t.different[:show]:
                cols = "; ".join(
                    f"{n}: source {v['source']!r}, mirror {v['mirror']!r}"
                    for n, v in d["columns"].items()
                )
                lines.append(f"    {_key_text(d['key'])}: {cols}")
            if len(t.different) > show:
                lines.append(f"    and {len(t.different) - show} more (--json lists all)")
        if t.settled:
            lines.append(f"  {t.settled} keys differed at first and caught up on a recheck")
        if t.left_out_columns:
            lines.append(
                "  not compared: "
                + ", ".join(f"{n} ({why})" for n, why in sorted(t.left_out_columns.items()))
            )
    if run.not_mirrored:
        lines.append(f"source tables without a mirror: {', '.join(run.not_mirrored)}")
    for r in run.repairs:
        lines.extend(_repair_lines(r, show))
    if run.equal:
        lines.append("EQUAL: every mirror matches its source")
    elif run.repairs:
        lines.append(
            "REPAIRED: every differing key now matches its source"
            if settled(run)
            else "MISMATCH after repair: see the keys not repaired above"
        )
    else:
        lines.append(
            "MISMATCH: "
            + ", ".join(t.target for t in run.tables if not t.equal)
            + " (--repair writes the source's rows over them, the pipeline stopped)"
        )
    return lines


def _repair_lines(r: Any, show: int) -> list[str]:
    lines = []
    if r.generation is not None:
        counts = ", ".join(f"{r.outcomes.get(o, 0)} {o.replace('_', ' ')}" for o in OUTCOMES)
        lines.append(
            f"repair {r.generation} of {r.source}: {len(r.keys)} keys; {counts} ({r.seconds:.1f} s)"
        )
    for target, why in sorted(r.refused.items()):
        lines.append(f"  {target}: NOT REPAIRED: {why}")
    for outcome in ("not_repaired", "in_flight"):
        keys = [k for k in r.keys if k.outcome == outcome]
        if keys:
            shown = ", ".join(f"{k.target} {_key_text(k.key)}" for k in keys[:show])
            more = f" and {len(keys) - show} more" if len(keys) > show else ""
            lines.append(f"  {outcome.replace('_', ' ')} ({len(keys)}): {shown}{more}")
    return lines


def _key_text(key: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in key.items())


def as_dict(run: Verification) -> dict[str, Any]:
    """``run`` as one JSON-ready object (every key listed)."""
    out = asdict(run)
    del out["mismatches"]  # keys as read: the tables list them as JSON
    out["equal"] = run.equal
    out["settled"] = settled(run)
    for r, d in zip(run.repairs, out["repairs"], strict=True):
        d["outcomes"] = dict(r.outcomes)
    for t, d in zip(run.tables, out["tables"], strict=True):
        d["equal"] = t.equal
    return out


def metrics_text(run: Verification, pipeline: str) -> str:
    """The Prometheus text exposition of one run (node_exporter's textfile collector)."""
    lines = [
        "# HELP cdcflow_verify_equal Whether the mirror equalled its source at the last verify.",
        "# TYPE cdcflow_verify_equal gauge",
    ]
    gauges = {
        "equal": lambda t: int(t.equal),
        "rows_source": lambda t: t.rows_source,
        "rows_mirror": lambda t: t.rows_mirror,
        "missing_keys": lambda t: len(t.missing),
        "extra_keys": lambda t: len(t.extra),
        "different_keys": lambda t: len(t.different),
        "in_flight_keys": lambda t: len(t.in_flight),
    }
    for name, value in gauges.items():
        if name != "equal":
            lines += [f"# TYPE cdcflow_verify_{name} gauge"]
        for t in run.tables:
            if t.refused:
                continue
            lines.append(
                f'cdcflow_verify_{name}{{pipeline="{pipeline}",table="{t.target}"}} {value(t)}'
            )
    lines += [
        "# TYPE cdcflow_verify_last_run_timestamp_seconds gauge",
        f'cdcflow_verify_last_run_timestamp_seconds{{pipeline="{pipeline}"}} '
        f"{run.started_at_ms / 1000:.3f}",
    ]
    return "\n".join(lines) + "\n"


def write_metrics(path: str, run: Verification, pipeline: str) -> None:
    """Write :func:`metrics_text` to ``path`` atomically (a temporary file renamed)."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(metrics_text(run, pipeline))
    temporary.replace(target)

"""One micro-batch over many tables: the apply path's fixed cost per table.

    python bench/many_tables.py                        # 500 tables x 50 changes, 3 batches
    python bench/many_tables.py --tables 100 --changes 50

Issue 18's first target: a Debezium-style topic set of 500 tables with 50 changes each per
micro-batch, one micro-batch applied in <= 5 s on this machine. This measures the apply
path alone, where the per-table cost lives: the workload generator and the
``debezium-json`` encoder make the changes (schemaless envelopes, the demo tables' shapes
over ``--tables`` tables), the decoder turns each micro-batch into ``EVENT_SCHEMA`` rows
once, untimed, and :class:`~cdcflow.apply.batch.BatchApplier` applies them to a delta-rs
warehouse in a temporary folder, as the pipeline's driver does. No Kafka, no Spark.

The first micro-batch (it creates the tables) is a warm-up; then ``--batches`` are timed,
and the median is the figure, at the defaults (``apply.parallel_tables: 4``, the Arrow
merge). Beside it: the same one table at a time, and with delta-rs's MERGE. The reference
is the same number of changes in one table, applied the same way in its own warehouse,
so ``(many - one) / tables`` is the fixed cost of a table touched by a micro-batch. One
batch of the one-at-a-time run is profiled to count, per table, what that cost is made
of: merges, commits, writes (appends), table opens and log updates, and the Arrow reads
of stored tables.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import demo_shaped_tables, emit, row  # noqa: E402

FORMAT = "debezium-json"

#: what a table's fixed cost is made of -> whether a profiled function is one of them,
#: by ``(file, name)`` as pstats keys them (built-in methods have the file ``~``)
DELTA_CALLS = {
    "merges (delta-rs MERGE)": lambda file, name: "merge_execute" in name,
    "merges (Arrow merge)": lambda file, name: (
        file.endswith("sinks/arrow_merge.py") and name == "rewrite_actions"
    ),
    "commits of file actions": lambda file, name: "create_write_transaction' of" in name,
    "appends": lambda file, name: (
        name == "<method 'write' of 'deltalake._internal.RawDeltaTable' objects>"
    ),
    "table opens": lambda file, name: file.endswith("deltalake/table.py") and name == "__init__",
    "log updates": lambda file, name: "update_incremental' of" in name,
    "stored-table reads": lambda file, name: name == "to_pyarrow_table",
}


def micro_batches(tables: int, changes: int, batches: int, seed: int = 7) -> list[Any]:
    """``batches + 1`` micro-batches of ``EVENT_SCHEMA`` rows, each about ``changes``
    changes per table over ``tables`` tables (the first: inserts that create them)."""
    import pyarrow as pa

    from cdcflow.decode.batches import decode_records
    from cdcflow.formats import decoder_for
    from cdcflow.formats.base import Record
    from cdcflow.model import Origin
    from cdcflow_testkit.encoders import encoder_for
    from cdcflow_testkit.workload import Workload

    encoder = encoder_for(FORMAT)
    specs = demo_shaped_tables(encoder.exact_types, tables, name_width=3)
    workload = Workload(specs, database="shop", seed=seed)
    out, offset = [], 0
    decoder = None
    for b in range(batches + 1):
        chosen = list(workload.changes(tables * changes, p_insert=1.0 if b == 0 else 0.5))
        if decoder is None:
            decoder = decoder_for(FORMAT, encoder.decoder_options(chosen) or None)
        records = []
        for change in chosen:
            for m in encoder.encode(change):
                records.append(Record(value=m.value, key=m.key, origin=Origin("t", 0, offset)))
                offset += 1
        out.append(pa.Table.from_batches([decode_records(decoder, records)]))
    return out


def apply_all(
    batches: list[Any],
    profile_batch: int | None = None,
    parallel_tables: int = 4,
    merge_engine: str = "arrow",
) -> tuple[list[float], Any]:
    """Apply the micro-batches in order to a fresh warehouse; the seconds of each after
    the first, and the profile of the ``profile_batch``-th of those (or ``None``; the
    profile sees the calling thread only, so profile with ``parallel_tables=1``)."""
    from cdcflow.apply.batch import BatchApplier
    from cdcflow.sinks.warehouse import DeltaWarehouse
    from cdcflow.transform.router import Router

    with tempfile.TemporaryDirectory(prefix="cdcflow-many-") as root:
        warehouse = DeltaWarehouse(root, pipeline_id="bench", merge_engine=merge_engine)
        applier = BatchApplier(warehouse, Router(), parallel_tables=parallel_tables)
        applier.apply(batches[0], delivery_id=0)
        seconds, profile = [], None
        for i, events in enumerate(batches[1:], 1):
            prof = cProfile.Profile() if i - 1 == profile_batch else None
            t = time.perf_counter()
            if prof:
                prof.enable()
            applier.apply(events, delivery_id=i)
            if prof:
                prof.disable()
                profile = pstats.Stats(prof)
            seconds.append(time.perf_counter() - t)
    return seconds, profile


def _count(stats: pstats.Stats, matches: Any) -> tuple[int, float]:
    """Calls and cumulative seconds of the profiled functions ``matches(file, name)``."""
    calls, seconds = 0, 0.0
    for (file, _line, name), (_cc, nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if matches(file, name):
            calls, seconds = calls + nc, seconds + ct
    return calls, seconds


def run(tables: int, changes: int, batches: int) -> list[dict[str, Any]]:
    print(f"many tables: {tables} tables x {changes} changes per micro-batch, {batches} timed")
    t = time.perf_counter()
    many = micro_batches(tables, changes, batches)
    one = micro_batches(1, tables * changes, batches)
    print(f"  generated and decoded in {time.perf_counter() - t:.1f}s")
    many_s, _ = apply_all(many)
    serial_s, profile = apply_all(many, profile_batch=0, parallel_tables=1)
    sql_s, _ = apply_all(many, merge_engine="delta-rs")
    one_s, _ = apply_all(one)
    # the profiled batch runs slower: leave it out of the figure when there are others
    serial = serial_s[1:] if len(serial_s) > 1 else serial_s
    many_med, one_med = statistics.median(many_s), statistics.median(one_s)
    per_table_ms = (many_med - one_med) / tables * 1000
    events = many[1].num_rows
    print(
        f"  {tables} tables: {[round(s, 2) for s in many_s]} s (one by one "
        f"{[round(s, 2) for s in serial_s]} s, delta-rs MERGE {[round(s, 2) for s in sql_s]} s); "
        f"1 table: {[round(s, 2) for s in one_s]} s"
    )
    rows = [
        row(
            "many_tables",
            f"one micro-batch, {tables} tables x {changes} changes",
            many_med,
            "s",
            reference=one_med,
            reference_name=f"the same {events:,} changes in 1 table",
            target="<= 5 s" if tables == 500 and changes == 50 else None,
            met=(many_med <= 5.0) if tables == 500 and changes == 50 else None,
            tables=tables,
            changes=changes,
            events=events,
        ),
        row(
            "many_tables",
            "the same, one table at a time (apply.parallel_tables: 1)",
            statistics.median(serial),
            "s",
        ),
        row(
            "many_tables",
            "the same, merge_engine: delta-rs",
            statistics.median(sql_s),
            "s",
        ),
        row("many_tables", "fixed apply cost per table touched", per_table_ms, "ms"),
    ]
    if profile is not None:
        for what, matches in DELTA_CALLS.items():
            calls, secs = _count(profile, matches)
            rows.append(
                row(
                    "many_tables",
                    f"per table: {what} (profiled, one by one)",
                    calls / tables,
                    f"calls, {secs / tables * 1000:.1f} ms",
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=500)
    parser.add_argument("--changes", type=int, default=50, help="per table per micro-batch")
    parser.add_argument("--batches", type=int, default=3, help="timed micro-batches")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    emit(run(args.tables, args.changes, args.batches), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End to end over a topic per table: 500 Debezium topics, 50 changes each per micro-batch.

    python bench/many_topics.py                       # 500 topics x 50 changes, 4 batches
    python bench/many_topics.py --tables 100 --batches 3

Issue 18's first target is "a Debezium-style topic set of 500 tables with 50 changes
each per micro-batch: one micro-batch applied in <= 5 s". ``many_tables.py`` measures
the apply path alone; this measures the whole pipeline on the Debezium layout, where each
table has its own topic, so a micro-batch reads 500 topic-partitions (decision 54).

The workload generator and the ``debezium-json`` encoder make ``--tables`` tables'
changes (the demo tables' shapes); they are produced to the embedded broker three ways
and each is read by ``cdcflow run --once`` of this checkout with ``max_offsets_per_trigger``
= one micro-batch's changes, in the same run:

* a topic per table, the ranges packed into read tasks (the default ``kafka.read_tasks``);
* a topic per table, a Spark task per topic-partition as Spark's Kafka source plans
  (``kafka.read_tasks`` larger than the topic count: the behaviour before decision 54);
* every table in one topic (the reference: the same records and tables, one range).

Reported per arm: seconds per micro-batch past start-up (the median interval between
the commits of ``_cdcflow/batches``), peak RSS of the pipeline's process tree, and whether
every mirror has its table's final row count.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROW_COUNTS_EQUAL,
    check_row_counts,
    demo_shaped_tables,
    emit,
    row,
    run_cdcflow_once,
)

FORMAT = "debezium-json"
DATABASE = "shop"
TARGET_S = 5.0

#: arm -> (topic per table, kafka.read_tasks or None for the default)
ARMS = {
    "topic per table, packed read tasks": (True, None),
    "topic per table, a task per topic-partition": (True, 1_000_000),
    "one topic (reference)": (False, None),
}


def generate(tables: int, changes: int, batches: int) -> tuple[dict[str, list[Any]], dict]:
    """The messages by table, in source order, and each table's final row count."""
    from cdcflow_testkit.encoders import encoder_for
    from cdcflow_testkit.workload import Workload

    encoder = encoder_for(FORMAT)
    specs = demo_shaped_tables(encoder.exact_types, tables, name_width=3)
    workload = Workload(specs, database=DATABASE, seed=3)
    by_table: dict[str, list[Any]] = {s.name: [] for s in specs}
    for change in workload.changes(tables * changes * batches):
        by_table[change.table.table].extend(encoder.encode(change))
    counts = {s.name: len(workload.state[s.name]) for s in specs}
    return by_table, counts


def measure(
    broker: Any, by_table: dict, counts: dict, per_table: bool, read_tasks: int | None, batch: int
) -> dict[str, Any]:
    """Produce to fresh topics, run ``cdcflow run --once``; its figures."""
    root = Path(tempfile.mkdtemp(prefix="cdcflow-bench-topics-"))
    prefix = f"bench{int(time.time() * 1000) % 10**9}"
    try:
        if per_table:
            for table, messages in by_table.items():
                broker.create_topic(f"{prefix}.{table}")
                broker.produce(f"{prefix}.{table}", messages, partition=0)
        else:
            # interleaved as the tables changed: round-robin over the tables' changes
            merged = [m for group in zip(*by_table.values(), strict=False) for m in group]
            rest = [m for ms in by_table.values() for m in ms[min(map(len, by_table.values())) :]]
            broker.create_topic(f"{prefix}.all")
            broker.produce(f"{prefix}.all", merged + rest, partition=0)
        kafka: dict[str, Any] = {
            "bootstrap_servers": broker.bootstrap_servers,
            "max_offsets_per_trigger": batch,
        }
        if read_tasks is not None:
            kafka["read_tasks"] = read_tasks
        config = {
            "pipeline_id": "bench-topics",
            "warehouse": str(root / "wh"),
            "checkpoint": str(root / "ck"),
            "trigger": "available_now",
            "target_template": "{database}.{table}",
            "kafka": kafka,
            "sources": [{"format": FORMAT, "topic_pattern": rf"{prefix}\..*"}],
        }
        out = run_cdcflow_once(config, root / "run")
        ends = [t / 1000 for t, _ in out["batches"]]
        gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        return {
            "per_batch_s": statistics.median(gaps) if gaps else None,
            "wall_s": out["wall_s"],
            "batches": len(ends),
            "peak_rss_bytes": out["peak_rss_bytes"],
            "mirrors": check_row_counts(root / "wh", DATABASE, counts),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(tables: int, changes: int, batches: int) -> list[dict[str, Any]]:
    """Every arm, one after another on one broker; the result rows."""
    from cdcflow_testkit.services.broker import EmbeddedBroker

    print(f"many topics: {tables} tables x {changes} changes x {batches} micro-batches ...")
    by_table, counts = generate(tables, changes, batches)
    batch = tables * changes
    extra = {"tables": tables, "changes_per_table": changes, "batches": batches}
    results = {}
    with EmbeddedBroker() as broker:
        for arm, (per_table, read_tasks) in ARMS.items():
            results[arm] = r = measure(broker, by_table, counts, per_table, read_tasks, batch)
            print(
                f"  {arm}: {r['per_batch_s']} s per micro-batch, {r['batches']} batches, "
                f"{r['wall_s']:.1f} s in all, mirrors {r['mirrors']}",
                flush=True,
            )
    reference = results["one topic (reference)"]["per_batch_s"]
    rows = []
    for arm, r in results.items():
        if r["per_batch_s"] is None:
            continue
        packed = arm.endswith("packed read tasks")
        rows.append(
            row(
                "many-topics",
                f"e2e {tables} topics x {changes}: {arm}, s per micro-batch",
                r["per_batch_s"],
                "s",
                reference=reference if arm != "one topic (reference)" else None,
                reference_name="one topic",
                target=f"<= {TARGET_S:g} s" if packed else None,
                met=r["per_batch_s"] <= TARGET_S if packed else None,
                mirrors=r["mirrors"],
                peak_rss_gib=round(r["peak_rss_bytes"] / 2**30, 2),
                **extra,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=500)
    parser.add_argument("--changes", type=int, default=50, help="per table per micro-batch")
    parser.add_argument("--batches", type=int, default=4, help="micro-batches per arm")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = run(args.tables, args.changes, args.batches)
    emit(rows, args.json)
    return 0 if all(r.get("mirrors") == ROW_COUNTS_EQUAL for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end benchmark: Canal JSON events of 20 tables in one topic, into 20 Delta mirrors,
beside the same number of events of one table (issue 18: the 20 tables at >= 0.9x the
one table's rate).

    python bench/e2e_multitable.py                     # 1,000,000 events, 20 tables and 1
    python bench/e2e_multitable.py --events 100000 --tables 5
    python bench/e2e_multitable.py --no-reference --keep /tmp/mt   # 20 tables only, log kept

This process generates the events with the workload generator and the ``canal-json``
encoder (20 tables shaped like the demo's customers / orders / order_lines, inserts,
updates and deletes) and produces them to one topic on the embedded broker; then
``cdcflow run --once CONFIG`` of this checkout runs in a child process, whose tree
(driver Python, JVM, Python workers) is sampled for peak RSS (and PSS).

Prints cdcflow's events/s past start-up (after the first micro-batch, from the commit
times in ``_cdcflow/batches``) and overall, and checks that every mirror has the source
table's final row count. The one-table reference runs the same way, in the same process
tree and on the same machine state, right after.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    check_row_counts,
    demo_shaped_tables,
    emit,
    past_startup_rate,
    row,
    run_cdcflow_once,
)

FORMAT = "canal-json"
TOPIC = "bench.canal"
PARTITIONS = 2
DATABASE = "shop"


def generate(events: int, tables: int, seed: int = 5) -> tuple[list[Any], dict[str, int]]:
    """``events`` Canal JSON messages over ``tables`` tables, and each table's final row
    count."""
    from cdcflow_testkit.encoders import encoder_for
    from cdcflow_testkit.workload import Workload

    encoder = encoder_for(FORMAT)
    specs = demo_shaped_tables(encoder.exact_types, tables, name_width=2)
    workload = Workload(specs, database=DATABASE, seed=seed)
    messages = []
    for change in workload.changes(events):
        messages.extend(encoder.encode(change))
    counts = {s.name: len(workload.state[s.name]) for s in specs}
    return messages, counts


def config(bootstrap: str, root: Path, batch: int) -> dict[str, Any]:
    """The pipeline configuration (as its YAML file holds it)."""
    return {
        "pipeline_id": "bench-multitable",
        "warehouse": str(root / "wh"),
        "checkpoint": str(root / "ck"),
        "trigger": "available_now",
        "target_template": "{database}.{table}",
        "kafka": {"bootstrap_servers": bootstrap, "max_offsets_per_trigger": batch},
        "sources": [{"format": FORMAT, "topics": [TOPIC]}],
    }


def measure(events: int, tables: int, batch: int, keep: Path | None) -> dict[str, Any]:
    """Generate, produce, run ``cdcflow run --once``; its figures (``steady``: events/s
    past start-up, ``overall``, ``peak_rss_bytes``, ``peak_pss_bytes``, ``mirrors``)."""
    from cdcflow_testkit.services.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix="cdcflow-bench-mt-"))
    print(f"e2e multi-table: generating {events:,} {FORMAT} events over {tables} tables ...")
    t = time.perf_counter()
    messages, counts = generate(events, tables)
    avg = sum(len(m.value) for m in messages) / len(messages)
    print(
        f"  {len(messages):,} messages, {avg:.0f} bytes on average, {time.perf_counter() - t:.1f}s"
    )
    try:
        with EmbeddedBroker() as broker:
            broker.create_topic(TOPIC, partitions=PARTITIONS)
            t = time.perf_counter()
            by_partition: dict[int, list[Any]] = {}
            for m in messages:  # one row's changes stay in one partition, in order
                by_partition.setdefault(zlib.crc32(m.key or m.value) % PARTITIONS, []).append(m)
            for p, ms in sorted(by_partition.items()):
                broker.produce(TOPIC, ms, partition=p)
            print(f"  produced to the embedded broker in {time.perf_counter() - t:.1f}s")
            n = len(messages)
            del messages, by_partition
            out = run_cdcflow_once(config(broker.bootstrap_servers, root, batch), root / "run")
        steady = past_startup_rate([(t / 1000, k) for t, k in out["batches"]])
        ok = check_row_counts(root / "wh", DATABASE, counts)
        print(f"  cdcflow: {out['wall_s']:.1f}s, {len(out['batches'])} batches, mirrors: {ok}")
        if keep is not None:
            dest = keep / f"tables-{tables}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(root, dest)
            print(f"  warehouse and log kept in {dest}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "events": n,
        "steady": steady,
        "overall": n / out["wall_s"],
        "peak_rss_bytes": out["peak_rss_bytes"],
        "peak_pss_bytes": out["peak_pss_bytes"],
        "mirrors": ok,
    }


def run(
    events: int, tables: int, batch: int, reference: bool = True, keep: Path | None = None
) -> list[dict[str, Any]]:
    """The ``tables``-table run and (``reference``) the one-table run; the result rows."""
    many = measure(events, tables, batch, keep)
    one = measure(events, 1, batch, keep) if reference else None
    extra = {"events": many["events"], "tables": tables, "batch": batch}
    rows = []
    if many["steady"] is not None:
        rows.append(
            row(
                "e2e-multitable",
                f"e2e {tables} tables past start-up",
                many["steady"],
                "events/s",
                mirrors=many["mirrors"],
                **extra,
            )
        )
    if one is not None and one["steady"] is not None:
        rows.append(
            row(
                "e2e-multitable",
                "e2e 1 table past start-up (reference)",
                one["steady"],
                "events/s",
                mirrors=one["mirrors"],
                **{**extra, "tables": 1},
            )
        )
        if many["steady"] is not None:
            ratio = many["steady"] / one["steady"]
            rows.append(
                row(
                    "e2e-multitable",
                    f"e2e {tables} tables / 1 table, past start-up",
                    ratio,
                    "x",
                    target=">= 0.9x",
                    met=ratio >= 0.9,
                    **extra,
                )
            )
    rows.append(
        row(
            "e2e-multitable",
            f"e2e {tables} tables overall (start-up incl.)",
            many["overall"],
            "events/s",
            **extra,
        )
    )
    rows.append(
        row(
            "memory",
            f"peak RSS, e2e {tables} tables pipeline",
            many["peak_rss_bytes"] / 2**30,
            "GiB",
            target="<= 2 GiB",
            met=many["peak_rss_bytes"] <= 2 * 2**30,
            **extra,
        )
    )
    rows.append(
        row(
            "memory",
            f"peak PSS, e2e {tables} tables pipeline",
            many["peak_pss_bytes"] / 2**30,
            "GiB",
            **extra,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--batch", type=int, default=250_000, help="maxOffsetsPerTrigger")
    parser.add_argument(
        "--no-reference", action="store_true", help="leave out the one-table reference run"
    )
    parser.add_argument("--keep", type=Path, help="copy each run's warehouse and log here")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = run(args.events, args.tables, args.batch, not args.no_reference, args.keep)
    emit(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

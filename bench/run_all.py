"""The benchmark suite (issue 9): one command, one table, ``bench/results/latest.json``.

    make bench                                     # the full sizes below
    python bench/run_all.py --scale 0.1            # every size a tenth (a quick look)
    python bench/run_all.py --skip multitable      # leave a benchmark out

Runs in sequence, each in a process of its own (so one-core pinning and memory do not
carry over from one to the next):

* ``decode``: :mod:`decode_formats` -- decode per core for every registered format,
  ``--decode-events`` messages each, beside ``orjson.loads`` / fastavro;
* ``debezium``: :mod:`e2e_debezium` -- ``--e2e-events`` Debezium events into one
  mirror, cdcflow vs a plain PySpark reference, with the peak RSS of each pipeline;
* ``multitable``: :mod:`e2e_multitable` -- ``--multitable-events`` Canal JSON events of
  20 tables in one topic, beside the same of one table (issue 18: >= 0.9x);
* ``many_tables``: :mod:`many_tables` -- one micro-batch of ``--many-tables`` tables with
  ``--many-tables-changes`` changes each through the apply path (issue 18: <= 5 s for
  500 x 50), beside the same changes in one table, and the fixed cost per table;
* ``store_requests``: :mod:`store_requests` -- the same micro-batches of 1, 50 and
  ``--many-tables`` tables on S3Proxy behind a proxy adding ``--store-latency-ms`` to
  every request, beside local disk: requests by kind per touched table (against a
  budget) and seconds per micro-batch (issue 34: within 3x local disk for 500 tables);
* ``many_topics``: :mod:`many_topics` -- the same tables end to end, a Debezium topic per
  table, through ``cdcflow run --once``: read tasks packed (default), a task per
  topic-partition, and every table in one topic (the reference), seconds per micro-batch;
* ``many_sources``: :mod:`many_sources` -- ``cdcflow run --once`` of every embedded
  format as a source of its own, ``--many-sources-changes`` changes each, beside one
  source with as many changes (issue 18: the demo's pipeline well under 15 s);
* ``merge_scale``: :mod:`merge_scale` -- 1k and 20k new, recent and uniform keys merged
  into mirrors of ``--merge-scale-rows`` rows (10M and 100M; uniform keys only into the
  smallest), the Arrow merge beside delta-rs's MERGE;
* ``verify_cost``: :mod:`verify_cost` -- ``cdcflow verify`` of a ``--verify-rows`` row
  PostgreSQL table against its Delta mirror, ``quick`` and ``full``, beside the floor of
  one hash sum over the source plus one read of the mirror (issue 35: <= 2x), and ``full``
  with 10 damaged keys beside the equal run (<= 1.5x);
* ``freshness``: :mod:`freshness` -- a producer at ``--freshness-rate`` changes/s for
  ``--freshness-seconds`` into a streaming ``cdcflow run`` with the default configuration;
  p50/p95/max of (Delta commit time - source commit time);
* ``freshness_new_keys``: the same with new-key inserts for ``--long-freshness-seconds``
  (600: issue 18's 10 minutes), the worst minute's p95 and whether the backlog stays;
* ``long_run``: :mod:`long_run` -- ``--long-run-batches`` micro-batches into
  ``--long-run-tables`` tables through the apply path, without and with maintenance: files,
  log, read and apply time at batches 100, 1k, 5k and 20k. At the full size this alone
  takes hours on 2 cores (``--skip long_run``, or ``--scale``).

Then prints one table (figure, value, reference, ratio, target) and writes every row,
with the sizes and the machine, to ``bench/results/latest.json`` (or ``--out``).
Each module also runs alone (``python bench/decode_formats.py --events 20000``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, child_env, format_table, read_rows, write_rows  # noqa: E402

HERE = Path(__file__).resolve().parent
BENCHMARKS = (
    "decode",
    "debezium",
    "multitable",
    "many_tables",
    "store_requests",
    "many_topics",
    "many_sources",
    "merge_scale",
    "verify_cost",
    "freshness",
    "freshness_new_keys",
    "long_run",
)


def commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """The command line of each benchmark, at the sizes asked for."""

    def n(x: int) -> str:
        return str(max(1, int(x * args.scale)))

    return {
        "decode": [
            "decode_formats.py",
            "--events",
            n(args.decode_events),
            "--repeats",
            str(args.repeats),
        ],
        "debezium": [
            "e2e_debezium.py",
            "--events",
            n(args.e2e_events),
            "--keys",
            n(args.e2e_events // 10),
            "--batch",
            n(args.batch),
        ],
        "multitable": [
            "e2e_multitable.py",
            "--events",
            n(args.multitable_events),
            "--batch",
            n(args.batch),
        ],
        "many_tables": [
            "many_tables.py",
            "--tables",
            n(args.many_tables),
            "--changes",
            str(args.many_tables_changes),
        ],
        "store_requests": [
            "store_requests.py",
            "--tables",
            ",".join(sorted({"1", n(50), n(args.many_tables)}, key=int)),
            "--changes",
            str(args.many_tables_changes),
            "--latency-ms",
            str(args.store_latency_ms),
        ],
        "many_topics": [
            "many_topics.py",
            "--tables",
            n(args.many_tables),
            "--changes",
            str(args.many_tables_changes),
        ],
        "many_sources": [
            "many_sources.py",
            "--changes",
            n(args.many_sources_changes),
        ],
        "merge_scale": [
            "merge_scale.py",
            "--rows",
            ",".join(n(r) for r in args.merge_scale_rows),
            "--uniform-max-rows",
            n(min(args.merge_scale_rows)),
        ],
        "verify_cost": [
            "verify_cost.py",
            "--rows",
            n(args.verify_rows),
        ],
        "freshness": [
            "freshness.py",
            "--rate",
            str(args.freshness_rate),
            "--seconds",
            str(max(10.0, args.freshness_seconds * args.scale)),
        ],
        "freshness_new_keys": [
            "freshness.py",
            "--new-keys",
            "--rate",
            str(args.freshness_rate),
            "--seconds",
            str(max(10.0, args.long_freshness_seconds * args.scale)),
        ],
        "long_run": [
            "long_run.py",
            "--batches",
            n(args.long_run_batches),
            "--tables",
            str(args.long_run_tables),
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--decode-events", type=int, default=20_000, help="per format")
    parser.add_argument("--repeats", type=int, default=3, help="decode: best of this many")
    parser.add_argument(
        "--many-sources-changes", type=int, default=2000, help="many_sources: per source"
    )
    parser.add_argument("--e2e-events", type=int, default=1_000_000)
    parser.add_argument("--multitable-events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=250_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--many-tables", type=int, default=500, help="tables per micro-batch")
    parser.add_argument(
        "--many-tables-changes", type=int, default=50, help="changes per table per micro-batch"
    )
    parser.add_argument(
        "--store-latency-ms", type=float, default=30.0, help="store_requests: per request"
    )
    parser.add_argument("--freshness-rate", type=int, default=20_000, help="changes/s")
    parser.add_argument("--freshness-seconds", type=float, default=120.0)
    parser.add_argument(
        "--long-freshness-seconds", type=float, default=600.0, help="new-key inserts, seconds"
    )
    parser.add_argument(
        "--merge-scale-rows",
        type=int,
        nargs="+",
        default=[10_000_000, 100_000_000],
        help="mirror sizes the merges go into",
    )
    parser.add_argument(
        "--verify-rows", type=int, default=10_000_000, help="verify_cost: rows of the table"
    )
    parser.add_argument(
        "--long-run-batches", type=int, default=20_000, help="micro-batches, with and without"
    )
    parser.add_argument("--long-run-tables", type=int, default=50)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every size by this")
    parser.add_argument("--skip", action="append", choices=BENCHMARKS, default=[])
    parser.add_argument("--out", default=str(RESULTS / "latest.json"))
    args = parser.parse_args(argv)

    rows, seconds, failed = [], {}, []
    with tempfile.TemporaryDirectory(prefix="cdcflow-bench-") as tmp:
        for name, cmd in commands(args).items():
            if name in args.skip:
                continue
            out = Path(tmp) / f"{name}.json"
            print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
            t = time.perf_counter()
            rc = subprocess.call(
                [sys.executable, str(HERE / cmd[0]), *cmd[1:], "--json", str(out)],
                env=child_env(),
            )
            seconds[name] = round(time.perf_counter() - t, 1)
            if rc != 0 or not out.exists():
                failed.append(name)
                print(f"=== {name} FAILED (exit {rc})", flush=True)
                continue
            rows.extend(read_rows(out))
    print("\n" + format_table(rows))
    print(f"\nseconds per benchmark: {seconds}" + (f"; FAILED: {failed}" if failed else ""))
    write_rows(
        args.out,
        rows,
        finished_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        sizes={k: v for k, v in vars(args).items() if k not in ("out", "skip")},
        skipped=args.skip,
        failed=failed,
        seconds=seconds,
        machine={
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    )
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

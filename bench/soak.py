"""Fault soak: a million Debezium events, the pipeline SIGKILLed mid-batch and restarted.

    make soak                                   # 1,000,000 changes, 5 kill/restart cycles
    python bench/soak.py --events 200000 --kills 3

The topic (3 partitions, keyed by primary key) carries schemaless Debezium changes of
three tables with Kafka tombstones after deletes, plus delivery faults: exact
duplicates, replayed ranges, malformed messages. It is produced in slices, one before
each start of ``cdcflow run CONFIG`` (a child process with its own Spark JVM); each
process is SIGKILLed with its JVM and Python workers while a micro-batch is in flight,
and after the last kill ``cdcflow run CONFIG --once`` drains the topic. Then every Delta
mirror is compared with the source state, the changelog and the dead letters are matched
record by record with what was produced, and ``_cdcflow/batches`` must cover every
offset exactly once (``cdcflow_testkit.faults``). Prints the counts; exits 1 if any
check fails (the work folder is then kept).

Before the middle restart the checkpoint is deleted (``--lose-checkpoint CYCLE``; -1:
never): the restart must finish the apply the kill interrupted from Kafka and go on from
the warehouse's offsets.

``--broker-restart`` puts the broker on durable storage (tansu's s3 engine on a local
moto server) and SIGKILLs and restarts it between two pipeline processes.

``--broker apache-kafka`` runs the soak on a real Apache Kafka broker
(``cdcflow_testkit.services.apache_kafka``; its log is on disk, so ``--broker-restart`` needs no
other storage) instead of the embedded tansu.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

TOPIC = "soak.debezium"


def _rss_of(pid: int) -> int:
    """Peak resident memory (VmHWM) of a process, bytes; 0 if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="source changes")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILL/restart cycles")
    parser.add_argument(
        "--lose-checkpoint",
        type=int,
        default=None,
        metavar="CYCLE",
        help="delete the checkpoint before this restart (default: the middle one; -1: never)",
    )
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--batch", type=int, default=50_000, help="max_offsets_per_trigger")
    parser.add_argument("--duplicate-rate", type=float, default=0.005)
    parser.add_argument("--replays", type=int, default=12, help="ranges re-sent")
    parser.add_argument("--replay-length", type=int, default=5_000, help="records per range, max")
    parser.add_argument("--malformed", type=int, default=25)
    parser.add_argument("--truncate-every", type=int, default=400_000, help="0: no truncates")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--broker-restart", action="store_true")
    parser.add_argument("--broker", choices=("tansu", "apache-kafka"), default="tansu")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    if args.events < 1 or args.kills < 0:
        parser.error("--events must be >= 1 and --kills >= 0")

    from cdcflow.sinks.warehouse import DeltaWarehouse
    from cdcflow_testkit.faults import (
        fast_stream,
        inject_faults,
        run_with_kills,
        verify,
        write_config,
    )
    from cdcflow_testkit.services.apache_kafka import ApacheKafkaBroker
    from cdcflow_testkit.services.broker import EmbeddedBroker

    rng = random.Random(args.seed)
    started = time.perf_counter()
    print(f"generating {args.events:,} Debezium changes (schemaless, 3 tables) ...", flush=True)
    stream = fast_stream(args.events, seed=args.seed, truncate_every=args.truncate_every)
    faulty = inject_faults(
        stream,
        TOPIC,
        args.partitions,
        rng,
        duplicate_rate=args.duplicate_rate,
        replays=args.replays,
        max_replay_length=args.replay_length,
        malformed=args.malformed,
    )
    del stream
    print(
        f"  {faulty.records:,} records over {args.partitions} partitions in "
        f"{time.perf_counter() - started:.1f}s",
        flush=True,
    )

    root = Path(tempfile.mkdtemp(prefix="cdcflow-soak-"))
    rounds = args.kills + 1
    ok = False
    try:
        if args.broker == "apache-kafka":
            chosen = ApacheKafkaBroker()
        else:
            chosen = EmbeddedBroker(storage="s3" if args.broker_restart else "memory")
        with chosen as broker:
            broker.create_topic(TOPIC, partitions=args.partitions)
            config = write_config(
                root / "pipeline.yaml",
                broker.bootstrap_servers,
                TOPIC,
                warehouse=root / "warehouse",
                checkpoint=root / "checkpoint",
                max_offsets_per_trigger=args.batch,
                processing_time="1 second",
                pipeline_id="soak",
            )
            broker_restarts = 0
            lose_at = args.lose_checkpoint
            if lose_at is None:
                lose_at = max(1, (args.kills + 1) // 2) if args.kills else -1

            def before_start(i: int) -> None:
                nonlocal broker_restarts
                if i == lose_at:
                    # after a SIGKILL mid-apply: the warehouse alone says what was applied
                    shutil.rmtree(root / "checkpoint", ignore_errors=True)
                    print("  checkpoint deleted before this restart", flush=True)
                if args.broker_restart and i == max(1, args.kills // 2):
                    broker.restart(hard=True)
                    broker_restarts += 1
                    print(f"  {broker.name} SIGKILLed and restarted (its records kept)", flush=True)
                t = time.perf_counter()
                n = faulty.produce(broker, i, rounds)
                label = "drain" if i == args.kills else f"process {i}"
                print(
                    f"  {label}: produced {n:,} records in {time.perf_counter() - t:.1f}s",
                    flush=True,
                )

            print(f"pipeline: {args.kills} kills, then a drain; work folder {root}", flush=True)
            run = run_with_kills(config, args.kills, rng, before_start, log_dir=root / "logs")
            for k in run.kills:
                print(
                    f"  kill {k.cycle}: {k.after_s:5.1f}s after start, committed batch "
                    f"{k.committed}, in flight {k.in_flight} ({k.stage}"
                    f"{', before its first commit' if k.first_of_process else ''})"
                )
            print(f"  drain: exit {run.drain_exit_code}; {run.drain_output.splitlines()[-1:]}")
            ends = broker.end_offsets(TOPIC)
            broker_rss = _rss_of(broker._proc.pid) if broker._proc is not None else 0

        t = time.perf_counter()
        wh = DeltaWarehouse(str(root / "warehouse"), pipeline_id="soak.debezium-json")
        problems, counts = verify(wh, faulty, ends, run)
        print(f"checked in {time.perf_counter() - t:.1f}s\n")
        print(counts.summary())
        print(f"{'broker restarts':32} {broker_restarts}")
        print(f"{f'peak RSS broker ({broker.name})':32} {broker_rss / 2**30:.2f} GiB")
        harness = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"{'peak RSS this process':32} {harness / 2**30:.2f} GiB")
        print(f"{'wall time':32} {time.perf_counter() - started:.1f} s")
        if problems:
            print(f"\nFAILED: {len(problems)} problems")
            for p in problems[:40]:
                print(f"  {p}")
        else:
            print(
                "\nRESULT: every mirror equals its source; every offset applied, skipped "
                "or dead-lettered exactly once"
            )
        ok = not problems
    finally:
        if ok and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"work folder kept: {root}")
    sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no interpreter teardown: delta-rs thread pools (docs/decisions.md #10)

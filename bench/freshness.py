"""Freshness benchmark: how long a change takes from its source commit to its Delta commit.

    make bench                                   # (with the others) 20,000 events/s for 120 s
    python bench/freshness.py --rate 20000 --seconds 120
    python bench/freshness.py --trigger "1 second"    # another trigger than the default
    python bench/freshness.py --new-keys --seconds 600  # issue 18: 10 min of new keys

A producer in this process writes schemaless Debezium changes (PostgreSQL connector, one
table, 2 partitions) to the embedded broker at a steady ``--rate``, in slices every
``--slice-ms``; each change's ``source.ts_ms`` (its source commit time, as Debezium sets
it) is the wall-clock time it is produced. ``cdcflow run CONFIG`` runs meanwhile in
streaming mode in a child process with the **default configuration** (no ``trigger``
key, unless ``--trigger`` is given). After the producer stops and every change is
applied, the run is stopped with SIGINT.

Freshness of one change = the commit time of the apply that made it visible (the
``committed_at_ms`` of its micro-batch in ``_cdcflow/batches``, written after the mirror
commit, so an upper bound) minus its source commit time. Printed: p50, p95 and max over
every change, the events/s the run kept up with, and the peak RSS of the pipeline's own
processes (driver Python, its JVM, Python workers; the broker and the producer run in
this process, outside the measured tree).

With ``--new-keys`` every change inserts a key never seen, in key order (an auto-increment
table growing: 12 million rows in 10 minutes at 20k/s). A run longer than a minute also
reports the p95 of its worst minute and whether the backlog stayed bounded (its largest
value in the second half of the run against the first half's).

The run must keep up: if the backlog grows past ``--max-backlog-s`` seconds of input, the
benchmark reports that instead of a latency that only measures a queue.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PeakRss, child_env, emit, row  # noqa: E402

TOPIC = "bench.freshness"
PARTITIONS = 2
TARGET_P95_S = 3.0


def _changes(
    start: int, n: int, keys: int, rng: random.Random, now_ms: int, lsn: int, new_keys: bool = False
):
    """``n`` Debezium changes committed at ``now_ms``: updates of random keys among
    ``keys``, or (``new_keys``) inserts of keys never seen, in order (an auto-increment
    table growing)."""
    out = []
    for i in range(n):
        k = start + i + 1 if new_keys else rng.randint(1, keys)
        lsn += rng.randint(1, 64)
        after = {
            "id": k,
            "name": f"name {rng.randint(0, 10**6)}",
            "email": f"user{k}@example.com",
            "balance": rng.randint(0, 10**7) / 100,
            "visits": start + i,
        }
        envelope = {
            "before": None,
            "after": after,
            "source": {
                "version": "2.7.0.Final",
                "connector": "postgresql",
                "name": "bench",
                "ts_ms": now_ms,
                "snapshot": "false",
                "db": "shop",
                "sequence": f'["{lsn - 1}","{lsn}"]',
                "schema": "public",
                "table": "customers",
                "txId": 5000 + (start + i) // 10,
                "lsn": lsn,
                "xmin": None,
            },
            "op": "c" if new_keys else "u",
            "ts_ms": now_ms,
            "transaction": None,
        }
        out.append((orjson.dumps({"id": k}), orjson.dumps(envelope)))
    return out, lsn


def _applied(batches_path: Path) -> int:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        t = DeltaTable(str(batches_path)).to_pyarrow_table(columns=["records"])
    except (TableNotFoundError, OSError):
        return 0
    return sum(t["records"].to_pylist())


def _percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[i]


def freshness_s(
    warehouse: Path, by_minute: dict[int, list[float]] | None = None, since_ms: int = 0
) -> list[float]:
    """Per applied change with a source time from ``since_ms`` on (the warm-up change,
    produced before the run started, left out): batch commit time - source commit time,
    seconds (sorted); ``by_minute`` (when given) gets the same per minute of source time
    since the first change."""
    from deltalake import DeltaTable

    batches = (
        DeltaTable(str(warehouse / "_cdcflow" / "batches"))
        .to_pyarrow_table(columns=["batch_id", "committed_at_ms"])
        .to_pylist()
    )
    committed: dict[int, int] = {}
    for b in batches:
        committed[b["batch_id"]] = max(committed.get(b["batch_id"], 0), b["committed_at_ms"])
    log = DeltaTable(str(warehouse / "_cdcflow" / "changelog")).to_pyarrow_table(
        columns=["batch_id", "ts_ms"]
    )
    pairs = [
        (ts, (committed[b] - ts) / 1000)
        for b, ts in zip(log["batch_id"].to_pylist(), log["ts_ms"].to_pylist(), strict=True)
        if ts is not None and ts >= since_ms
    ]
    if by_minute is not None and pairs:
        first = min(ts for ts, _ in pairs)
        for ts, lat in pairs:
            by_minute.setdefault((ts - first) // 60_000, []).append(lat)
        for values in by_minute.values():
            values.sort()
    out = sorted(lat for _, lat in pairs)
    return out


def run(
    rate: int,
    seconds: float,
    keys: int = 100_000,
    slice_ms: int = 100,
    trigger: str | None = None,
    max_backlog_s: float = 30.0,
    seed: int = 7,
    new_keys: bool = False,
    keep: str | None = None,
) -> list[dict[str, Any]]:
    """Produce at ``rate`` for ``seconds`` into a streaming ``cdcflow run``; result rows.
    With ``keep`` (a folder), the run logs at INFO and its log and warehouse are moved
    there for a look afterwards (one line per micro-batch, what maintenance did)."""
    from cdcflow_testkit.encoders import Message
    from cdcflow_testkit.services.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix="cdcflow-fresh-"))
    rng = random.Random(seed)
    warehouse = root / "warehouse"
    rows: list[dict[str, Any]] = []
    try:
        with EmbeddedBroker() as broker:
            broker.create_topic(TOPIC, partitions=PARTITIONS)
            config: dict[str, Any] = {
                "pipeline_id": "fresh",
                "warehouse": str(warehouse),
                "checkpoint": str(root / "checkpoint"),
                "kafka": {"bootstrap_servers": broker.bootstrap_servers},
                "sources": [{"format": "debezium-json", "topics": [TOPIC]}],
            }
            if trigger:
                config["trigger"] = {"processing_time": trigger}
            path = root / "pipeline.yaml"
            path.write_text(json.dumps(config, indent=2))  # JSON is YAML
            # one change first: the run is up once it is applied (Spark's start-up apart)
            lsn = 10_000_000
            warm, lsn = _changes(0, 1, keys, rng, int(time.time() * 1000), lsn)
            broker.produce(TOPIC, [Message(value=v, key=k) for k, v in warm])
            produced = 1
            cmd = [
                sys.executable,
                "-c",
                "import sys; from cdcflow.cli import main; sys.exit(main())",
                *(["--log-level", "INFO"] if keep else []),
                "run",
                str(path),
            ]
            log = root / "cdcflow.log"
            started = time.monotonic()
            with open(log, "wb") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env())
            try:
                with PeakRss(proc.pid) as mem:
                    while _applied(warehouse / "_cdcflow" / "batches") < produced:
                        if proc.poll() is not None:
                            raise RuntimeError(f"cdcflow run exited:\n{log.read_text()[-3000:]}")
                        if time.monotonic() - started > 300:
                            raise RuntimeError("cdcflow run applied nothing in 300 s")
                        time.sleep(0.2)
                    startup_s = time.monotonic() - started
                    print(f"freshness: cdcflow run is up after {startup_s:.1f} s", flush=True)

                    per_slice = max(1, round(rate * slice_ms / 1000))
                    backlogs: list[int] = []
                    report_every = max(12, round(seconds / 10))  # about every 10 s
                    t0 = time.monotonic()
                    t0_ms = int(time.time() * 1000)
                    n_slices = round(seconds * 1000 / slice_ms)
                    behind_s = 0.0
                    for s in range(n_slices):
                        due = t0 + s * slice_ms / 1000
                        wait = due - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)
                        else:
                            behind_s = max(behind_s, -wait)
                        now_ms = int(time.time() * 1000)
                        batch, lsn = _changes(produced, per_slice, keys, rng, now_ms, lsn, new_keys)
                        broker.produce(TOPIC, [Message(value=v, key=k) for k, v in batch])
                        produced += per_slice
                        if s % max(1, n_slices // report_every) == 0:
                            backlog = produced - _applied(warehouse / "_cdcflow" / "batches")
                            backlogs.append(backlog)
                            print(
                                f"  {time.monotonic() - t0:5.0f} s: produced {produced:,}, "
                                f"backlog {backlog:,}",
                                flush=True,
                            )
                            if backlog > rate * max_backlog_s:
                                raise RuntimeError(
                                    f"cdcflow fell {backlog:,} changes behind a {rate:,}/s "
                                    "producer: it does not keep up"
                                )
                    produce_s = time.monotonic() - t0
                    deadline = time.monotonic() + 300
                    while _applied(warehouse / "_cdcflow" / "batches") < produced:
                        if proc.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"not all applied:\n{log.read_text()[-3000:]}")
                        time.sleep(0.2)
                    proc.send_signal(signal.SIGINT)
                    proc.wait(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            by_minute: dict[int, list[float]] = {}
            lat = freshness_s(warehouse, by_minute, since_ms=t0_ms) if produced > 1 else []
            achieved = (produced - 1) / produce_s
            print(
                f"  produced {produced - 1:,} changes in {produce_s:.1f} s "
                f"({achieved:,.0f}/s; producer at most {behind_s:.2f} s behind schedule); "
                f"{len(lat):,} applied"
            )
    finally:
        if keep:
            shutil.rmtree(keep, ignore_errors=True)
            shutil.move(root, keep)
            print(f"  log and warehouse kept in {keep}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    extra = {
        "keys": "new" if new_keys else keys,
        "rate": rate,
        "seconds": seconds,
        "trigger": trigger or "default",
        "changes": len(lat),
        "producer_rate": achieved,
    }
    p50, p95, worst = _percentile(lat, 50), _percentile(lat, 95), lat[-1] if lat else None
    label = f"freshness at {rate // 1000}k/s" + (" new keys" if new_keys else "")
    rows.append(row("freshness", f"{label} p50", p50, "s", **extra))
    rows.append(
        row(
            "freshness",
            f"{label} p95",
            p95,
            "s",
            target=f"<= {TARGET_P95_S:g} s",
            met=p95 <= TARGET_P95_S,
            **extra,
        )
    )
    rows.append(row("freshness", f"{label} max", worst or float("nan"), "s", **extra))
    if len(by_minute) > 1:  # a long run: the worst minute, and whether the backlog stays
        minutes = [_percentile(v, 95) for _, v in sorted(by_minute.items())]
        print("  p95 per minute: " + ", ".join(f"{m:.2f}" for m in minutes))
        print(f"  backlog every ~10 s: {backlogs}")
        worst_minute = max(minutes)
        rows.append(
            row(
                "freshness",
                f"{label} p95 of the worst minute",
                worst_minute,
                "s",
                target=f"<= {TARGET_P95_S:g} s",
                met=worst_minute <= TARGET_P95_S,
                **extra,
            )
        )
        half = len(backlogs) // 2
        first_half, second_half = max(backlogs[:half] or [0]), max(backlogs[half:] or [0])
        rows.append(
            row(
                "freshness",
                f"{label} largest backlog, second half of the run",
                second_half,
                "changes",
                reference=first_half or None,
                reference_name="first half",
                target="bounded: <= 1.5x the first half's",
                met=second_half <= 1.5 * max(first_half, rate),
                **extra,
            )
        )
    rows.append(row("memory", "peak RSS, streaming run", mem.peak_bytes / 2**30, "GiB", **extra))
    rows.append(
        row("memory", "peak PSS, streaming run", mem.peak_pss_bytes / 2**30, "GiB", **extra)
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=20_000, help="changes per second")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to produce")
    parser.add_argument("--keys", type=int, default=100_000, help="updates of random keys")
    parser.add_argument(
        "--new-keys", action="store_true", help="inserts of new keys instead (a growing table)"
    )
    parser.add_argument("--slice-ms", type=int, default=100, help="produce every N ms")
    parser.add_argument("--trigger", help='processing-time trigger, e.g. "1 second"')
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument(
        "--keep", metavar="DIR", help="log at INFO; keep the run's log and warehouse in DIR"
    )
    args = parser.parse_args(argv)
    rows = run(
        args.rate,
        args.seconds,
        args.keys,
        args.slice_ms,
        args.trigger,
        new_keys=args.new_keys,
        keep=args.keep,
    )
    emit(rows, args.json)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

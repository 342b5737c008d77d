"""End-to-end benchmark: Debezium JSON events from Kafka into one Delta mirror.

    make bench                      # 1,000,000 events, 100,000 keys
    python bench/e2e_debezium.py --events 200000 --keys 20000

Both pipelines read the same topic on the embedded broker, with the same Kafka source,
the same micro-batch size, into a fresh Delta table, in the same run:

* **cdcflow**: ``cdcflow run --once`` (decode in mapInArrow, net change, guarded merge,
  changelog and accounting tables written too);
* **reference**: a plain PySpark pipeline -- ``from_json`` with an explicit schema, window
  dedup (latest event per key by LSN), ``toArrow``, delta-rs merge -- no changelog, no
  dead letters, no guards.

Prints events/s (whole run, and past start-up = without the first micro-batch), peak
memory of the process tree (driver + JVM + Python workers), and the ratio cdcflow /
reference. Both results are checked against the generated source's final state.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

TOPIC = "bench.debezium"
PARTITIONS = 2


# --------------------------------------------------------------------------- memory


class PeakRss:
    """Samples the resident memory of this process and all its descendants."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _tree_rss(root: int) -> int:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
        total, stack = 0, [root]
        page = os.sysconf("SC_PAGE_SIZE")
        while stack:
            pid = stack.pop()
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * page
            except OSError:
                pass
            stack.extend(children.get(pid, []))
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._tree_rss(os.getpid()))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self.peak_bytes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop.clear()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- workload


def generate(events: int, keys: int, seed: int = 42):
    """Debezium (schemaless, PostgreSQL connector) messages and the final source state.

    The first ``keys`` events insert every key; the rest are updates (95%) and deletes
    (5%) of random keys; a deleted key is inserted again by its next change.
    """
    rng = random.Random(seed)
    state: dict[int, dict] = {}
    messages: list[tuple[bytes, bytes, int]] = []
    lsn = 10_000_000
    for i in range(events):
        k = i + 1 if i < keys else rng.randint(1, keys)
        lsn += rng.randint(1, 64)
        before = state.get(k)
        op = "c" if before is None else ("d" if rng.random() < 0.05 else "u")
        after = (
            None
            if op == "d"
            else {
                "id": k,
                "first_name": f"first {rng.randint(0, 10**6)}",
                "last_name": f"last {rng.randint(0, 10**6)}",
                "email": f"user{k}@example.com",
                "balance": rng.randint(0, 10**7) / 100,
                "visits": rng.randint(0, 10**5),
            }
        )
        envelope = {
            "before": before,
            "after": after,
            "source": {
                "version": "2.7.0.Final",
                "connector": "postgresql",
                "name": "bench",
                "ts_ms": 1_700_000_000_000 + i,
                "snapshot": "false",
                "db": "shop",
                "sequence": f'["{lsn - 1}","{lsn}"]',
                "schema": "public",
                "table": "customers",
                "txId": 5000 + i // 10,
                "lsn": lsn,
                "xmin": None,
            },
            "op": op,
            "ts_ms": 1_700_000_000_100 + i,
            "transaction": None,
        }
        if op == "d":
            del state[k]
        else:
            state[k] = after
        key = orjson.dumps({"id": k})
        messages.append((key, orjson.dumps(envelope), k % PARTITIONS))
    return messages, state


# --------------------------------------------------------------------------- pipelines


def run_cdcflow(spark, bootstrap: str, root: Path, batch: int) -> dict:
    from cdcflow.config import parse_config
    from cdcflow.pipeline import Pipeline

    times: list[tuple[float, int]] = []
    config = parse_config(
        {
            "pipeline_id": "bench",
            "warehouse": str(root / "cdcflow"),
            "checkpoint": str(root / "cdcflow-checkpoint"),
            "trigger": "available_now",
            "kafka": {"bootstrap_servers": bootstrap, "max_offsets_per_trigger": batch},
            "sources": [{"format": "debezium-json", "topics": [TOPIC]}],
        }
    )
    started = time.perf_counter()
    applied: list[float] = []

    def on_batch(_source, report):
        times.append((time.perf_counter(), report.events))
        applied.append(report.seconds)

    Pipeline(config, spark=spark, on_batch=on_batch).run(once=True)
    return {
        "start": started,
        "end": time.perf_counter(),
        "batches": times,
        "apply_s": sum(applied),
        "table": str(root / "cdcflow" / "shop.public.customers"),
    }


def run_reference(spark, bootstrap: str, root: Path, batch: int) -> dict:
    """Plain PySpark: from_json + window dedup + toArrow + delta-rs merge."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from cdcflow.source.kafka import read_stream

    row = "id BIGINT, first_name STRING, last_name STRING, email STRING, balance DOUBLE, visits BIGINT"
    schema = f"before STRUCT<{row}>, after STRUCT<{row}>, source STRUCT<lsn: BIGINT>, op STRING"
    path = str(root / "reference" / "customers")
    times: list[tuple[float, int]] = []

    def apply(df, batch_id):
        parsed = df.select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select(
            "e.*"
        )
        keyed = parsed.select(
            F.coalesce(F.col("after.id"), F.col("before.id")).alias("id"),
            F.col("source.lsn").alias("lsn"),
            "op",
            "after",
        )
        w = Window.partitionBy("id").orderBy(F.col("lsn").desc())
        latest = (
            keyed.withColumn("rn", F.row_number().over(w))
            .where("rn = 1")
            .select(
                "id",
                "lsn",
                (F.col("op") == "d").alias("is_delete"),
                "after.first_name",
                "after.last_name",
                "after.email",
                "after.balance",
                "after.visits",
            )
        )
        data = latest.toArrow()
        if data.num_rows:
            try:
                table = DeltaTable(path)
            except Exception:  # noqa: BLE001
                write_deltalake(
                    path,
                    data.filter(pa.compute.invert(data["is_delete"])).drop_columns(["is_delete"]),
                )
                times.append((time.perf_counter(), data.num_rows))
                return
            (
                table.merge(data, predicate="t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_delete(predicate="s.is_delete")
                .when_matched_update_all(predicate="NOT s.is_delete", except_cols=["is_delete"])
                .when_not_matched_insert_all(predicate="NOT s.is_delete", except_cols=["is_delete"])
                .execute()
            )
        times.append((time.perf_counter(), data.num_rows))

    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": TOPIC,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": str(batch),
    }
    started = time.perf_counter()
    query = (
        read_stream(spark, options)
        .writeStream.foreachBatch(apply)
        .option("checkpointLocation", str(root / "reference-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return {"start": started, "end": time.perf_counter(), "batches": times, "table": path}


def check(table_path: str, state: dict) -> str:
    from deltalake import DeltaTable

    rows = DeltaTable(table_path).to_pyarrow_table(columns=["id", "email", "visits"]).to_pylist()
    got = {r["id"]: (r["email"], r["visits"]) for r in rows}
    want = {k: (v["email"], v["visits"]) for k, v in state.items()}
    return "equals the source" if got == want else f"DIFFERS ({len(got)} rows vs {len(want)})"


def summarize(name: str, run: dict, events: int, peak: int, batch: int) -> float:
    total_s = run["end"] - run["start"]
    rate = events / total_s
    batches = run["batches"]
    steady = None
    if len(batches) >= 2:
        first_end = batches[0][0]
        steady = (events - batch) / (run["end"] - first_end) if run["end"] > first_end else None
    steady_txt = f"{steady:,.0f} events/s past start-up" if steady else "n/a (one batch)"
    print(
        f"{name:10} {total_s:7.1f} s  {rate:>10,.0f} events/s overall  {steady_txt:>32}  "
        f"peak RSS {peak / 2**30:5.2f} GiB  ({len(batches)} batches)"
    )
    if "apply_s" in run:
        print(
            f"           of which {run['apply_s']:.1f} s in the driver-side apply (net change, "
            "Delta merge, changelog, accounting); the rest is Spark: read, decode, collect"
        )
    return steady or rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=250_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()

    from cdcflow.spark import get_or_create_session
    from cdcflow.testing.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix="cdcflow-bench-"))
    print(f"generating {args.events:,} Debezium events over {args.keys:,} keys ...")
    messages, state = generate(args.events, args.keys)
    avg = sum(len(v) for _, v, _ in messages) / len(messages)
    print(f"  {avg:.0f} bytes per message on average; final source table: {len(state):,} rows")
    try:
        with EmbeddedBroker() as broker:
            broker.create_topic(TOPIC, partitions=PARTITIONS)
            t = time.perf_counter()
            from cdcflow.formats.base import Message

            for p in range(PARTITIONS):
                broker.produce(
                    TOPIC, [Message(value=v, key=k) for k, v, q in messages if q == p], partition=p
                )
            print(f"  produced to the embedded broker in {time.perf_counter() - t:.1f}s")
            del messages
            spark = get_or_create_session(app_name="cdcflow-bench")
            spark.range(10).mapInArrow(lambda it: it, "id long").count()  # warm the Python workers
            with PeakRss() as mem:
                ours = run_cdcflow(spark, broker.bootstrap_servers, root, args.batch)
            ours_peak = mem.peak_bytes
            print()
            rate_ours = summarize("cdcflow", ours, args.events, ours_peak, args.batch)
            print(f"           mirror {check(ours['table'], state)}")
            if not args.skip_reference:
                with PeakRss() as mem:
                    ref = run_reference(spark, broker.bootstrap_servers, root, args.batch)
                rate_ref = summarize("reference", ref, args.events, mem.peak_bytes, args.batch)
                print(f"           mirror {check(ref['table'], state)}")
                print(f"\nratio cdcflow / reference (past start-up): {rate_ours / rate_ref:.2f}x")
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""End-to-end benchmark: Debezium JSON events from Kafka into one Delta mirror.

    make bench                      # (with the other benchmarks) 1,000,000 events, 100,000 keys
    python bench/e2e_debezium.py --events 200000 --keys 20000

This process generates the events and runs the embedded broker; each pipeline then runs
in a child process of its own, which reads the same topic with the same Kafka source and
micro-batch size into a fresh Delta table:

* **cdcflow**: ``cdcflow run --once CONFIG`` of this checkout (decode in mapInArrow, net
  change, guarded merge, changelog and accounting tables written too);
* **reference**: a plain PySpark pipeline -- ``from_json`` with an explicit schema, window
  dedup (latest event per key by LSN), ``toArrow``, delta-rs merge -- no changelog, no
  dead letters, no guards.

Prints events/s (whole run, start-up included, and past start-up = after the first
micro-batch), the peak RSS of each pipeline's own processes (its driver Python, JVM and
Python workers: the child process tree, sampled every 100 ms; the broker and the
generator are not in it; PSS beside it, which counts the pages forked workers share once),
and the ratios cdcflow / reference. Both mirrors are checked
against the generated source's final state.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    emit,
    past_startup_rate,
    row,
    run_cdcflow_once,
    run_measured,
)

TOPIC = "bench.debezium"
PARTITIONS = 2


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


def run_reference(spark, bootstrap: str, root: Path, batch: int) -> dict:
    """Plain PySpark: from_json + window dedup + toArrow + delta-rs merge."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from cdcflow.source.kafka.datasource import read_stream

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


def reference_child(bootstrap: str, root: Path, batch: int) -> int:
    """The reference pipeline, run in a child process: writes its batch times to
    ``root/reference.json``."""
    from cdcflow.runtime.spark import get_or_create_session

    spark = get_or_create_session(app_name="cdcflow-bench-reference")
    ref = run_reference(spark, bootstrap, root, batch)
    (root / "reference.json").write_text(json.dumps(ref))
    spark.stop()
    return 0


def config(bootstrap: str, root: Path, batch: int) -> dict[str, Any]:
    """The cdcflow pipeline configuration (as its YAML file holds it)."""
    return {
        "pipeline_id": "bench",
        "warehouse": str(root / "cdcflow"),
        "checkpoint": str(root / "cdcflow-checkpoint"),
        "trigger": "available_now",
        "kafka": {"bootstrap_servers": bootstrap, "max_offsets_per_trigger": batch},
        "sources": [{"format": "debezium-json", "topics": [TOPIC]}],
    }


def run(
    events: int, keys: int, batch: int, reference: bool = True, seed: int = 42
) -> list[dict[str, Any]]:
    """Generate, produce, run cdcflow (and the reference); the result rows."""
    from cdcflow_testkit.encoders import Message
    from cdcflow_testkit.services.broker import EmbeddedBroker

    root = Path(tempfile.mkdtemp(prefix="cdcflow-bench-"))
    print(f"e2e debezium: generating {events:,} events over {keys:,} keys ...", flush=True)
    messages, state = generate(events, keys, seed)
    avg = sum(len(v) for _, v, _ in messages) / len(messages)
    print(f"  {avg:.0f} bytes per message on average; final source table: {len(state):,} rows")
    rows: list[dict[str, Any]] = []
    try:
        with EmbeddedBroker() as broker:
            broker.create_topic(TOPIC, partitions=PARTITIONS)
            t = time.perf_counter()
            for p in range(PARTITIONS):
                broker.produce(
                    TOPIC, [Message(value=v, key=k) for k, v, q in messages if q == p], partition=p
                )
            print(f"  produced to the embedded broker in {time.perf_counter() - t:.1f}s")
            del messages
            bootstrap = broker.bootstrap_servers

            ours = run_cdcflow_once(config(bootstrap, root, batch), root / "run")
            ours_steady = past_startup_rate([(t / 1000, n) for t, n in ours["batches"]])
            ours_ok = check(str(root / "cdcflow" / "shop.public.customers"), state)
            print(
                f"  cdcflow: {ours['wall_s']:.1f}s, {len(ours['batches'])} batches, mirror {ours_ok}"
            )
            ref: dict[str, Any] = {}
            ref_steady = None
            if reference:
                cmd = [sys.executable, __file__, "--reference-child", str(root), "--batch"]
                ref = run_measured([*cmd, str(batch), "--bootstrap", bootstrap], root / "ref.log")
                times = json.loads((root / "reference.json").read_text())
                ends = [t for t, _ in times["batches"]]
                # records (not deduplicated rows) per batch: every batch but the last is full
                ref_steady = (events - batch) / (ends[-1] - ends[0]) if len(ends) >= 2 else None
                ref_ok = check(times["table"], state)
                print(f"  reference: {ref['wall_s']:.1f}s, {len(ends)} batches, mirror {ref_ok}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    extra = {"events": events, "keys": keys, "batch": batch, "mirror": ours_ok}
    name = "plain PySpark"
    if ours_steady is not None:
        rows.append(
            row(
                "e2e-debezium",
                "e2e debezium past start-up",
                ours_steady,
                "events/s",
                ref_steady,
                name,
                target=">= 250,000 events/s and >= 2x reference",
                met=ours_steady >= 250_000
                and (ref_steady is None or ours_steady >= 2 * ref_steady),
                **extra,
            )
        )
    rows.append(
        row(
            "e2e-debezium",
            "e2e debezium overall (start-up incl.)",
            events / ours["wall_s"],
            "events/s",
            events / ref["wall_s"] if ref else None,
            name,
            **extra,
        )
    )
    rows.append(
        row(
            "memory",
            "peak RSS, e2e debezium pipeline",
            ours["peak_rss_bytes"] / 2**30,
            "GiB",
            ref["peak_rss_bytes"] / 2**30 if ref else None,
            name,
            target=f"<= 2 GiB at {batch:,} events per micro-batch",
            met=ours["peak_rss_bytes"] <= 2 * 2**30,
            **extra,
        )
    )
    rows.append(
        row(
            "memory",
            "peak PSS, e2e debezium pipeline",
            ours["peak_pss_bytes"] / 2**30,
            "GiB",
            ref["peak_pss_bytes"] / 2**30 if ref else None,
            name,
            **extra,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=250_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--reference-child", metavar="ROOT", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reference_child:
        return reference_child(args.bootstrap, Path(args.reference_child), args.batch)
    rows = run(args.events, args.keys, args.batch, reference=not args.skip_reference)
    emit(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

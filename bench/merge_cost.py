"""Seconds to merge 1,000 updated rows into a mirror of 100k, 1M and 4M rows, per sink.

The same mirror (``id`` bigint key, a text, a bigint, a double, and cdcflow's
``_cdc_seq``/``_cdc_ts_ms``; written once by delta-rs as one table of 4 files) is merged
with the same merge source -- 1,000 updates of existing keys spread over the table, the
shape :meth:`cdcflow.sinks.mirror.Mirrors.apply` builds -- by:

* ``arrow (driver)``: :class:`~cdcflow.sinks.warehouse.DeltaWarehouse` (the driver, the
  Arrow merge, the default: decision 44);
* ``delta-rs``: the same with ``merge_engine="delta-rs"`` (delta-rs's MERGE);
* ``delta-spark``: :class:`~cdcflow.sinks.delta_spark.SparkDeltaWarehouse` (Delta Lake's
  ``MERGE INTO`` on a local ``local[2]`` Spark, the executors);
* ``delta-spark + DV``: the same with deletion vectors on the copy (what Delta could do;
  cdcflow keeps them off because delta-rs cannot read such a table: decision 39).

Each merge runs on a fresh copy of the mirror; the figure is the median of 3 after one
warm-up. Wall seconds (2 cores).

    PYTHONPATH=src .venv/bin/python bench/merge_cost.py [--rows 100000,1000000,4000000]

Writes ``bench/results/merge_cost.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdcflow.runtime.spark import get_or_create_session
from cdcflow.sinks.delta_spark import SparkDeltaWarehouse
from cdcflow.sinks.merge import MergeSpec
from cdcflow.sinks.warehouse import DeltaWarehouse

UPDATES = 1000
COLUMNS = ["id", "name", "qty", "price"]


def _mirror(rows: int) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"name {i}" for i in range(rows)]),
            "qty": ids % 97,
            "price": ids * 0.25,
            "_cdc_seq": pa.array([f"{i:020d}" for i in range(rows)]),
            "_cdc_ts_ms": np.full(rows, 1_700_000_000_000, dtype=np.int64),
        }
    )


def _source(rows: int) -> pa.Table:
    ids = np.linspace(0, rows - 1, UPDATES, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "name": pa.array([f"updated {i}" for i in ids]),
            "qty": ids % 89,
            "price": ids * 0.5,
            "_cdc_seq": pa.array([f"{rows + i:020d}" for i in range(UPDATES)]),
            "_cdc_ts_ms": np.full(UPDATES, 1_700_000_001_000, dtype=np.int64),
            "_cdc_delete": np.zeros(UPDATES, dtype=bool),
        }
    )


def _time_merge(wh: DeltaWarehouse, base: Path, work: Path, source: pa.Table, batch: int) -> float:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    table = DeltaTable(str(work))
    started = time.perf_counter()
    spec = MergeSpec(tuple(COLUMNS), ("id",), batch)
    wh.engine.merge(wh, table, source, spec, wh.commit_context(batch))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000,4000000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/merge_cost.json")
    args = parser.parse_args()
    spark = get_or_create_session(app_name="cdcflow-bench-merge", delta_spark=True)
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    with tempfile.TemporaryDirectory(prefix="cdcflow-merge-") as tmp:
        root = Path(tmp)
        for rows in (int(r) for r in args.rows.split(",")):
            base = root / f"mirror-{rows}"
            data = _mirror(rows)
            for part in range(4):  # four files, as several micro-batches leave them
                write_deltalake(str(base), data.slice(part * rows // 4, rows // 4), mode="append")
            dv_base = root / f"mirror-{rows}-dv"
            shutil.copytree(base, dv_base)
            spark.sql(
                f"ALTER TABLE delta.`{dv_base}` SET TBLPROPERTIES "
                "('delta.enableDeletionVectors' = true)"
            )
            source = _source(rows)
            sinks = {
                "arrow (driver)": (DeltaWarehouse(str(root), pipeline_id="bench"), base),
                "delta-rs": (
                    DeltaWarehouse(str(root), pipeline_id="bench", merge_engine="delta-rs"),
                    base,
                ),
                "delta-spark": (SparkDeltaWarehouse(str(root), spark, pipeline_id="bench"), base),
                "delta-spark + DV": (
                    SparkDeltaWarehouse(str(root), spark, pipeline_id="bench"),
                    dv_base,
                ),
            }
            for name, (wh, mirror) in sinks.items():
                work = root / "work"
                _time_merge(wh, mirror, work, source, 0)  # warm-up
                times = [_time_merge(wh, mirror, work, source, i + 1) for i in range(args.repeats)]
                row = {
                    "sink": name,
                    "mirror_rows": rows,
                    "updates": UPDATES,
                    "median_s": round(statistics.median(times), 3),
                    "min_s": round(min(times), 3),
                }
                results.append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": platform.node(),
        "cpus": 2,
        "spark": spark.version,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out.write_text(json.dumps({"meta": meta, "rows": results}, indent=1) + "\n")
    print(f"{'sink':<18}{'mirror rows':>12}{'median s':>10}{'min s':>8}")
    for r in results:
        print(f"{r['sink']:<18}{r['mirror_rows']:>12,}{r['median_s']:>10.3f}{r['min_s']:>8.3f}")


if __name__ == "__main__":
    main()

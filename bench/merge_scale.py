"""Merge cost against mirror size: does a micro-batch cost follow the change or the mirror?

    python bench/merge_scale.py                          # 10M and 100M rows
    python bench/merge_scale.py --rows 1000000 --changes 1000

Issue 18, part 2. A mirror of ``--rows`` rows (``id`` bigint key, a text, a bigint, a
double, cdcflow's ``_cdc_seq``/``_cdc_ts_ms``) is written directly with delta-rs, in key
order, in files as large as the Arrow merge writes them
(:func:`cdcflow.sinks.arrow_merge.rows_per_file`: 480k rows here), each with delta-rs's
own statistics, as a table written by ``apply.merge_engine: arrow`` is laid out. Then, per engine and per change
count (``--changes``, default 1,000 and 20,000), one merge of each workload:

* ``new``: keys above the largest (auto-increment inserts, the common growing table);
* ``recent``: updates of keys in the last 1% of the key range;
* ``uniform``: updates of keys spread over the whole range (only up to
  ``--uniform-max-rows`` rows: every file is rewritten, by either engine).

The merge is :meth:`~cdcflow.sinks.engines.MergeEngine.merge` with the merge source
:meth:`~cdcflow.sinks.mirror.Mirrors.apply` builds (no Kafka, no Spark, no bookkeeping
tables): wall seconds, files
scanned and skipped (their key bounds ruled them out) and rewritten, for ``arrow``
(cdcflow's Arrow merge, the default) against ``delta-rs`` (its MERGE, the reference).
The workloads run one after another on the same mirror (each leaves it a little larger).

Target (issue 18): new and recent keys <= 0.5 s per merge at 100M rows.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, row  # noqa: E402

COLUMNS = ("id", "name", "qty", "price")


def _rows(ids: np.ndarray, seq_from: int, label: str) -> dict[str, Any]:
    return {
        "id": ids,
        "name": pa.array([f"{label} {i}" for i in ids]),
        "qty": ids % 97,
        "price": ids * 0.25,
        "_cdc_seq": pa.array([f"{seq_from + i:020d}" for i in range(len(ids))]),
        "_cdc_ts_ms": np.full(len(ids), 1_700_000_000_000, dtype=np.int64),
    }


def write_mirror(path: str, rows: int) -> float:
    """Write the mirror in key order, one file (and commit) per
    :func:`~cdcflow.sinks.arrow_merge.rows_per_file` rows; seconds."""
    from deltalake import write_deltalake

    from cdcflow.sinks.arrow_merge import rows_per_file

    per_file = rows_per_file(pa.table(_rows(np.arange(10_000, dtype=np.int64), 0, "name")))
    started = time.perf_counter()
    for start in range(0, rows, per_file):
        ids = np.arange(start, min(rows, start + per_file), dtype=np.int64)
        write_deltalake(path, pa.table(_rows(ids, 0, "name")), mode="append")
    return time.perf_counter() - started


def merge_source(kind: str, rows: int, changes: int, seq_from: int) -> pa.Table:
    """The merge source of one workload (keys per module docstring)."""
    rng = np.random.default_rng(changes + rows)
    if kind == "new":
        ids = np.arange(rows, rows + changes, dtype=np.int64)
    elif kind == "recent":
        low = rows - max(changes, rows // 100)
        ids = np.sort(rng.choice(np.arange(low, rows, dtype=np.int64), changes, replace=False))
    else:
        ids = np.sort(rng.choice(rows, changes, replace=False).astype(np.int64))
    data = _rows(ids, seq_from, kind)
    data["_cdc_delete"] = np.zeros(len(ids), dtype=bool)
    return pa.table(data)


def run(rows_list: list[int], changes_list: list[int], uniform_max_rows: int) -> list[dict]:
    from deltalake import DeltaTable

    from cdcflow.sinks.merge import MergeSpec
    from cdcflow.sinks.warehouse import DeltaWarehouse

    out = []
    for rows in rows_list:
        with tempfile.TemporaryDirectory(prefix="cdcflow-merge-scale-") as tmp:
            base = f"{tmp}/base"
            took = write_mirror(base, rows)
            print(f"mirror of {rows:,} rows written in {took:.0f} s", flush=True)
            for engine in ("arrow", "delta-rs"):
                path = f"{tmp}/{engine}"
                shutil.copytree(base, path)
                wh = DeltaWarehouse(tmp, pipeline_id="bench", merge_engine=engine)
                batch, seq = 0, 10**12
                size = rows
                for changes in changes_list:
                    for kind in ("new", "recent", "uniform"):
                        if kind == "uniform" and rows > uniform_max_rows:
                            continue
                        batch, seq = batch + 1, seq + changes
                        source = merge_source(kind, size, changes, seq)
                        spec = MergeSpec(COLUMNS, ("id",), batch)
                        table = DeltaTable(path)
                        started = time.perf_counter()
                        metrics = wh.engine.merge(wh, table, source, spec, wh.commit_context(batch))
                        seconds = time.perf_counter() - started
                        skipped = metrics.get(
                            "num_target_files_skipped",
                            metrics.get("num_target_files_skipped_during_scan"),
                        )
                        if kind == "new":
                            size += changes
                        files = len(DeltaTable(path).file_uris())
                        print(
                            f"  {engine:8} {kind:7} {changes:6,} into {rows:,}: {seconds:.3f} s "
                            f"(scanned {metrics.get('num_target_files_scanned', '-')}, "
                            f"skipped {skipped}, "
                            f"removed {metrics.get('num_target_files_removed')}, "
                            f"files now {files})",
                            flush=True,
                        )
                        target = kind in ("new", "recent") and rows >= 100_000_000
                        out.append(
                            row(
                                "merge_scale",
                                f"{engine} {kind} {changes:,} into {rows / 1e6:g}M",
                                seconds,
                                "s",
                                target="<= 0.5 s" if target and engine == "arrow" else None,
                                met=(seconds <= 0.5) if target and engine == "arrow" else None,
                                engine=engine,
                                workload=kind,
                                changes=changes,
                                rows=rows,
                                files_scanned=metrics.get("num_target_files_scanned"),
                                files_skipped=skipped,
                                files_removed=metrics.get("num_target_files_removed"),
                            )
                        )
                shutil.rmtree(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="10000000,100000000", help="mirror sizes")
    parser.add_argument("--changes", default="1000,20000", help="changes per merge")
    parser.add_argument("--uniform-max-rows", type=int, default=10_000_000)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = [int(x) for x in args.rows.split(",")]
    changes = [int(x) for x in args.changes.split(",")]
    emit(run(rows, changes, args.uniform_max_rows), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

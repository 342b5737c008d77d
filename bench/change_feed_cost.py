"""What a change data feed costs a mirror's merge (issue 20, part 3; docs/decisions.md 58).

    python bench/change_feed_cost.py                        # 1M and 10M rows
    python bench/change_feed_cost.py --rows 1000000 --changes 1000

The mirror of :mod:`merge_scale` (``id`` key, a text, a bigint, a double, ``_cdc_seq``/
``_cdc_ts_ms``, in key order, in files as large as the Arrow merge writes them), then per
mode one merge of each workload (``new`` keys above the largest, ``recent`` updates in
the last 1% of the range, ``uniform`` updates over the whole range), on a copy each:

* ``arrow``: the default merge, no feed (:mod:`cdcflow.sinks.arrow_merge`);
* ``delta-rs``: delta-rs's MERGE, no feed (``merge_engine: delta-rs``);
* ``change-feed``: the table with ``delta.enableChangeDataFeed``: new keys alone are the
  Arrow append, the rest delta-rs's MERGE of the rows that change something (the stored
  rows of the batch's keys read first: :func:`~cdcflow.sinks.arrow_merge.effective_rows`,
  its seconds reported apart), writing ``_change_data`` files.

The merge is :meth:`~cdcflow.sinks.engines.MergeEngine.merge` with the merge source
:meth:`~cdcflow.sinks.mirror.Mirrors.apply` builds (no Kafka, no Spark, no bookkeeping
tables); wall seconds,
and the bytes of change files the commit wrote.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, row  # noqa: E402
from merge_scale import COLUMNS, merge_source, write_mirror  # noqa: E402

MODES = ("arrow", "delta-rs", "change-feed")


def _change_bytes(path: str) -> int:
    folder = Path(path, "_change_data")
    return sum(f.stat().st_size for f in folder.rglob("*.parquet")) if folder.exists() else 0


def run(rows_list: list[int], changes_list: list[int], uniform_max_rows: int) -> list[dict]:
    from deltalake import DeltaTable

    from cdcflow.sinks.arrow_merge import effective_rows
    from cdcflow.sinks.merge import CHANGE_FEED_PROPERTY, MergeSpec
    from cdcflow.sinks.warehouse import DeltaWarehouse

    out = []
    for rows in rows_list:
        with tempfile.TemporaryDirectory(prefix="cdcflow-change-feed-") as tmp:
            base = f"{tmp}/base"
            took = write_mirror(base, rows)
            print(f"mirror of {rows:,} rows written in {took:.0f} s", flush=True)
            for mode in MODES:
                path = f"{tmp}/{mode}"
                shutil.copytree(base, path)
                if mode == "change-feed":
                    DeltaTable(path).alter.set_table_properties({CHANGE_FEED_PROPERTY: "true"})
                engine = "delta-rs" if mode == "delta-rs" else "arrow"
                wh = DeltaWarehouse(tmp, pipeline_id="bench", merge_engine=engine)
                batch, seq, size = 0, 10**12, rows
                for changes in changes_list:
                    for kind in ("new", "recent", "uniform"):
                        if kind == "uniform" and rows > uniform_max_rows:
                            continue
                        batch, seq = batch + 1, seq + changes
                        source = merge_source(kind, size, changes, seq)
                        spec = MergeSpec(COLUMNS, ("id",), batch)
                        table = DeltaTable(path)
                        read_s = None
                        if mode == "change-feed" and kind != "new":
                            started = time.perf_counter()
                            effective_rows(table, source, spec)
                            read_s = time.perf_counter() - started
                        cdc_before = _change_bytes(path)
                        started = time.perf_counter()
                        wh.engine.merge(wh, table, source, spec, wh.commit_context(batch))
                        seconds = time.perf_counter() - started
                        cdc = _change_bytes(path) - cdc_before
                        if kind == "new":
                            size += changes
                        note = "" if read_s is None else f" (effective_rows {read_s:.3f} s)"
                        print(
                            f"  {mode:11} {kind:7} {changes:6,} into {rows:,}: "
                            f"{seconds:.3f} s{note}, change files {cdc / 1e6:.2f} MB",
                            flush=True,
                        )
                        out.append(
                            row(
                                "change_feed_cost",
                                f"{mode} {kind} {changes:,} into {rows / 1e6:g}M",
                                seconds,
                                "s",
                                mode=mode,
                                workload=kind,
                                changes=changes,
                                rows=rows,
                                effective_rows_s=read_s,
                                change_file_bytes=cdc,
                            )
                        )
                shutil.rmtree(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1000000,10000000", help="mirror sizes")
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

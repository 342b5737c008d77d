"""Seconds to apply one wide row: the first apply (create + insert), then an update.

Each size gets a fresh warehouse. One Debezium JSON message (bare payload, PostgreSQL
source block) with ``id`` plus N columns is applied with ``cdcflow apply``, then a second
message updates the same row (the merge path with a matched row). Runs in-process, so
interpreter start-up is not counted; wall and CPU seconds are both reported (the merge is
single-threaded planning, so CPU time is the steadier number on a busy machine).

    PYTHONPATH=src .venv/bin/python bench/wide_rows.py [--columns 100,1000,2000,4000]

Writes ``bench/results/wide_rows.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import resource
import tempfile
import time
from pathlib import Path

import deltalake

from cdcflow.cli import main as cdcflow_main


def _message(columns: int, op: str, lsn: int) -> str:
    """One bare-payload Debezium message: ``id`` = 1 plus ``c0..c{columns-1}``."""
    after = {"id": 1, **{f"c{i}": (f"v{i}-{lsn}" if i % 2 else i + lsn) for i in range(columns)}}
    return json.dumps(
        {
            "before": None,
            "after": after,
            "op": op,
            "ts_ms": 1_700_000_000_000 + lsn,
            "source": {
                "connector": "postgresql",
                "db": "erp",
                "schema": "public",
                "table": "wide",
                "lsn": lsn,
                "txId": lsn,
                "ts_ms": 1_700_000_000_000 + lsn,
            },
        }
    )


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _apply(folder: Path, name: str, message: str) -> tuple[float, float]:
    """``cdcflow apply`` one message; returns (wall seconds, CPU seconds)."""
    path = folder / name
    path.write_text(message + "\n")
    args = ["apply", "--format", "debezium-json", "--warehouse", str(folder / "w")]
    args += ["--primary-key", "id", str(path)]
    wall, cpu = time.perf_counter(), _cpu_s()
    with contextlib.redirect_stdout(io.StringIO()):
        code = cdcflow_main(args)
    if code != 0:
        raise SystemExit(f"cdcflow apply exited {code} for {name}")
    return time.perf_counter() - wall, _cpu_s() - cpu


def _warm_up() -> None:
    """Apply one narrow row first, so lazy imports are not counted in the first size."""
    with tempfile.TemporaryDirectory(prefix="wide-warm-") as tmp:
        _apply(Path(tmp), "warm.jsonl", _message(2, "c", 1))


def run(sizes: list[int]) -> list[dict]:
    """Measure each size; returns one dict per size (seconds, rounded to ms)."""
    _warm_up()
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix=f"wide-{n}-") as tmp:
            folder = Path(tmp)
            insert = _apply(folder, "insert.jsonl", _message(n, "c", 10))
            update = _apply(folder, "update.jsonl", _message(n, "u", 20))
        rows.append(
            {
                "columns": n,
                "insert_s": round(insert[0], 3),
                "insert_cpu_s": round(insert[1], 3),
                "update_s": round(update[0], 3),
                "update_cpu_s": round(update[1], 3),
            }
        )
        r = rows[-1]
        print(
            f"{n:>8} {r['insert_s']:>10.3f} {r['insert_cpu_s']:>10.3f}"
            f" {r['update_s']:>10.3f} {r['update_cpu_s']:>10.3f}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--columns", default="100,1000,2000,4000", help="comma-separated sizes")
    parser.add_argument("--label", default="", help="stored with the results, e.g. before/after")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "wide_rows.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.columns.split(",")]
    print(f"{'columns':>8} {'insert s':>10} {'insert cpu':>10} {'update s':>10} {'update cpu':>10}")
    rows = run(sizes)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "label": args.label,
                "deltalake": deltalake.__version__,
                "python": platform.python_version(),
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written to {out}")


if __name__ == "__main__":
    main()

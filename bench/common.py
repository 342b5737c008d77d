"""What the benchmarks share: timing, one-core pinning, RSS sampling of a process tree,
result rows, the printed table and ``bench/results/latest.json``.

A result row is a plain dict (so it goes to JSON as it is)::

    {"benchmark": "decode", "figure": "debezium-json decode_kafka_batch",
     "value": 123456.0, "unit": "msg/s per core", "reference": 98765.0,
     "reference_name": "orjson.loads", "ratio": 1.25, "target": ">= 1.5x reference",
     "met": False}

``reference``, ``ratio``, ``target`` and ``met`` may be ``None``. Targets live here, in
the benchmark output, beside the figure -- never in the tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------- timing


def best_of(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> float:
    """The shortest wall time of ``repeats`` calls of ``fn``, in seconds, after ``warmup``
    untimed calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def pin_one_core() -> int | None:
    """Pin this process to one CPU (the last one it may use); returns it, or ``None`` where
    ``os.sched_setaffinity`` does not exist."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


# --------------------------------------------------------------------------- memory


def tree_rss_bytes(root: int) -> int:
    """Resident memory of process ``root`` and all its descendants, in bytes (``/proc``)."""
    return tree_memory_bytes(root)[0]


def _pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` (``/proc/PID/smaps_rollup``), 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_memory_bytes(root: int) -> tuple[int, int]:
    """``(RSS, PSS)`` of process ``root`` and all its descendants, summed, in bytes.

    RSS counts a page shared by several processes once in each: PySpark forks its Python
    workers from a daemon, so the pages they share copy-on-write count two or more times
    in the RSS sum. PSS divides a shared page among its sharers: the sum is the tree's
    real footprint. Issue 9's target is on the RSS sum; PSS is printed beside it.
    """
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
    total, pss, stack = 0, 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            pass
        pss += _pss_bytes(pid)
        stack.extend(children.get(pid, []))
    return total, pss


class PeakRss:
    """Samples the summed RSS of process ``pid`` and its descendants every ``interval_s``
    (default: this process). Use as a context manager; ``peak_bytes`` is the largest sum.

    Start what must not be counted (broker, generator) outside that process tree.
    ``peak_pss_bytes`` is the largest summed PSS (see :func:`tree_memory_bytes`).
    """

    def __init__(self, pid: int | None = None, interval_s: float = 0.1) -> None:
        self.pid = pid if pid is not None else os.getpid()
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.peak_pss_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, pss = tree_memory_bytes(self.pid)
            self.peak_bytes = max(self.peak_bytes, rss)
            self.peak_pss_bytes = max(self.peak_pss_bytes, pss)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self.peak_bytes = 0
        self.peak_pss_bytes = 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------- results


def row(
    benchmark: str,
    figure: str,
    value: float,
    unit: str,
    reference: float | None = None,
    reference_name: str | None = None,
    target: str | None = None,
    met: bool | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One result row (see the module docstring); ``ratio`` is ``value / reference``."""
    return {
        "benchmark": benchmark,
        "figure": figure,
        "value": value,
        "unit": unit,
        "reference": reference,
        "reference_name": reference_name,
        "ratio": value / reference if reference else None,
        "target": target,
        "met": met,
        **extra,
    }


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"


def format_table(rows: Iterable[dict[str, Any]]) -> str:
    """The rows as one text table: figure, value, reference, ratio, target."""
    lines = [
        f"{'figure':44} {'value':>12} {'unit':16} {'reference':>12} {'ratio':>7}  target",
        "-" * 110,
    ]
    for r in rows:
        ref = _num(r["reference"])
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        target = r["target"] or ""
        if r["met"] is not None:
            target += "  met" if r["met"] else "  NOT met"
        lines.append(
            f"{r['figure'][:44]:44} {_num(r['value']):>12} {r['unit'][:16]:16} {ref:>12} "
            f"{ratio:>7}  {target}"
        )
    return "\n".join(lines)


def write_rows(path: str | Path, rows: list[dict[str, Any]], **meta: Any) -> None:
    """Write ``{"rows": rows, **meta}`` as JSON to ``path`` (folders created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a file :func:`write_rows` wrote."""
    return json.loads(Path(path).read_text())["rows"]


# --------------------------------------------------------------------------- pipelines


SRC = Path(__file__).resolve().parents[1] / "src"


def child_env() -> dict[str, str]:
    """Environment of a benchmark child process: this checkout's ``src`` first on
    ``PYTHONPATH``, and Spark's Python workers on this interpreter (unless set)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


def run_measured(cmd: list[str], log: Path) -> dict[str, Any]:
    """Run ``cmd`` as a child process, sampling the RSS of it and its descendants (driver
    Python, its JVM, Spark's Python workers) every 100 ms.

    Returns:
        ``{"wall_s", "peak_rss_bytes", "peak_pss_bytes"}``.

    Raises:
        RuntimeError: the command failed (the tail of its output in the message).
    """
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env())
        with PeakRss(proc.pid) as mem:
            rc = proc.wait()
        wall = time.perf_counter() - started
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}:\n{tail}")
    return {"wall_s": wall, "peak_rss_bytes": mem.peak_bytes, "peak_pss_bytes": mem.peak_pss_bytes}


def run_cdcflow_once(config: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """``cdcflow run --once CONFIG`` of this checkout in a child process, measured.

    Args:
        config: the pipeline configuration as its YAML file holds it.
        workdir: where the configuration file and the output log go.

    Returns:
        :func:`run_measured`'s figures plus ``batches``: ``(committed_at_ms, records)`` per
        micro-batch, from the warehouse's ``_cdcflow/batches`` accounting table.
    """
    from deltalake import DeltaTable

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "pipeline.yaml"
    # an A/B of apply settings: CDCFLOW_BENCH_APPLY='{"merge_engine": "delta-rs"}'
    extra = json.loads(os.environ.get("CDCFLOW_BENCH_APPLY", "{}"))
    if extra:
        config = {**config, "apply": {**config.get("apply", {}), **extra}}
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    cmd = [
        sys.executable,
        "-c",
        "import sys; from cdcflow.cli import main; sys.exit(main())",
        "-v",  # a line per micro-batch in the log: what it applied, and in how long
        "run",
        "--once",
        str(path),
    ]
    out = run_measured(cmd, workdir / "cdcflow.log")
    rows = (
        DeltaTable(str(Path(config["warehouse"]) / "_cdcflow" / "batches"))
        .to_pyarrow_table(columns=["batch_id", "records", "committed_at_ms"])
        .to_pylist()
    )
    per_batch: dict[int, list[int]] = {}
    for r in rows:
        b = per_batch.setdefault(r["batch_id"], [0, 0])
        b[0] = max(b[0], r["committed_at_ms"])
        b[1] += r["records"]
    out["batches"] = sorted((t, n) for t, n in per_batch.values())
    return out


def past_startup_rate(batches: list[tuple[float, int]]) -> float | None:
    """Records per second after the first micro-batch: the records of batches 2..n over
    the time from the first batch's end to the last's (``batches``: ``(end, records)``,
    times in seconds). ``None`` with fewer than two batches."""
    if len(batches) < 2:
        return None
    span = batches[-1][0] - batches[0][0]
    return sum(n for _, n in batches[1:]) / span if span > 0 else None


def emit(rows: list[dict[str, Any]], json_path: str | Path | None = None) -> None:
    """Print the rows as one table; also write them to ``json_path`` when given."""
    print()
    print(format_table(rows))
    if json_path:
        write_rows(json_path, rows)


#: what :func:`check_row_counts` says when every mirror has its source table's rows
ROW_COUNTS_EQUAL = "row counts equal the source"


def check_row_counts(warehouse: Path, database: str, counts: dict[str, int]) -> str:
    """:data:`ROW_COUNTS_EQUAL` when every mirror ``<warehouse>/<database>.<table>`` has
    its source table's row count (``counts``), else the first differences."""
    from deltalake import DeltaTable

    wrong = []
    for table, want in counts.items():
        path = warehouse / f"{database}.{table}"
        got = DeltaTable(str(path)).to_pyarrow_dataset().count_rows() if path.exists() else 0
        if got != want:
            wrong.append(f"{table}: {got} rows, source {want}")
    return ROW_COUNTS_EQUAL if not wrong else "DIFFERS: " + "; ".join(wrong[:5])


def demo_shaped_tables(exact_types: Any, tables: int, name_width: int) -> list[Any]:
    """``tables`` table specifications shaped like the demo's tables in turn (customers,
    orders, order lines, ...), named ``t<i>_<demo table>`` with ``i`` zero-padded to
    ``name_width`` digits; ``exact_types``: the encoder's (``Encoder.exact_types``)."""
    from cdcflow_testkit.workload import DEMO_TABLES, TableSpec, tables_for

    shapes = tables_for(exact_types)
    return [
        TableSpec(
            f"t{i:0{name_width}d}_{DEMO_TABLES[i % len(DEMO_TABLES)].name}",
            shapes[i % len(shapes)].columns,
            shapes[i % len(shapes)].key_columns,
        )
        for i in range(tables)
    ]

"""Months of micro-batches, quickly: whether the apply's cost stays flat over time.

    python bench/long_run.py                              # 20,000 batches x 50 tables
    python bench/long_run.py --batches 2000 --tables 50   # a shorter run
    python bench/long_run.py --no-maintenance             # only the run without

Issue 18, part 4. ``--batches`` micro-batches of small changes into ``--tables`` tables go
through :class:`~cdcflow.apply.batch.BatchApplier` into a delta-rs warehouse in a temporary
folder, as the pipeline's driver applies them (no Kafka, no Spark: this measures what time
does to the tables, not the transport). Each table starts as a mirror of ``--rows`` rows
(written once with delta-rs, past the whole-table rewrite of small tables, so every batch
adds files as it does to a real mirror), and each batch brings, per table, two new keys
(the growing table), two updates of recent keys and, every fifth batch, a delete.

The run is made twice, without maintenance and with the defaults, time compressed: one
simulated day is ``--day-s`` seconds of wall clock (default 60), so a vacuum is due every
simulated day (``vacuum_every_hours``), the bookkeeping rows expire after their simulated
retention, and the Delta log's retention (``maintenance.log_retention_hours``, 24 h) is
one simulated day on every table. Compaction needs no compression: it follows the
number of batches (``compact_min_files``).

Reported at batches 100, 1k, 5k and 20k (those within ``--batches``, and the last), per
run: data files per mirror (mean), the mirror's ``_delta_log`` (files and MiB), the
bookkeeping tables' data files, the seconds to open one mirror (its log replayed from the
last checkpoint) and to read it in full (mean of a reading every 10 batches over the 50
before the mark), and the apply time per batch, maintenance included (mean and p95 over
the 50 batches before the mark). The target (issue 18): with
maintenance every curve is flat, the last value within 1.5x of the first; the log's files
on disk are bounded by its retention instead (one simulated day, and delta-rs keeps the
log from the checkpoint before the last), so they are reported without a target.

Time compression makes maintenance look dearer than it is: a simulated hour is a few
batches here (``--day-s`` / 24 of wall clock), where a pipeline at the 1-second trigger
runs 3,600 batches an hour, so the hourly row expiry and the daily vacuum run about a
thousand times more often per batch than in real use.

At the full size the run takes hours on 2 cores (about 0.7 s per batch of 50 tables,
twice); ``--batches`` shortens it (``make bench BENCH_ARGS="--scale 0.05"``: 1,000).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, row  # noqa: E402

MARKS = (100, 1_000, 5_000, 20_000)
WINDOW = 50  # batches the apply time is averaged over before a mark
SAMPLE_EVERY = 10  # open and read are sampled every this many batches of that window
FLAT = 1.5  # target: last value within this factor of the first
#: figures bounded by the log's retention (one simulated day), with a sawtooth between
#: checkpoints; what the log costs shows in "open one mirror" and the apply time
LOG_RETAINED = ("mirror log files", "mirror log MiB")

COLUMNS = {"id": "int64", "name": "string", "qty": "int64", "note": "string"}


class Workload:
    """Small changes into ``tables`` mirrors of ``rows`` rows each: per table and batch,
    two new keys, two updates of recent keys and, every fifth batch, a delete."""

    def __init__(self, tables: int, rows: int) -> None:
        from cdcflow.model import SourceTable

        self.sources = [SourceTable("bench", "shop", "", f"t{i:03d}") for i in range(tables)]
        self.next_key = [rows + 1] * tables
        self.offset = 0
        self.seq = 1

    def batch(self, b: int) -> Any:
        """EVENT_SCHEMA rows of micro-batch ``b``."""
        import pyarrow as pa

        from cdcflow.decode.batches import flatten
        from cdcflow.formats.base import DecodeResult
        from cdcflow.model import ChangeEvent, Op, Origin

        events = []

        def add(op: Op, source: Any, key: int, image: dict | None) -> None:
            self.seq += 1
            self.offset += 1
            events.append(
                ChangeEvent(
                    op=op,
                    source=source,
                    key={"id": key},
                    before={"id": key} if op is Op.DELETE else None,
                    after=image,
                    columns=COLUMNS,
                    seq=(self.seq,),
                    ts_ms=int(time.time() * 1000),
                    origin=Origin("bench", 0, self.offset),
                )
            )

        for t, source in enumerate(self.sources):
            first = self.next_key[t]
            for k in (first, first + 1):
                add(Op.INSERT, source, k, _image(k, b))
            self.next_key[t] = first + 2
            for k in (first - 7, first - 31):  # recent keys: the last 1% of a 100k table
                add(Op.UPDATE, source, k, _image(k, b))
            if b % 5 == 4:
                add(Op.DELETE, source, first - 101, None)
        return pa.Table.from_batches([flatten(DecodeResult(events=events))])


def _image(key: int, b: int) -> dict:
    return {"id": key, "name": f"name {key}", "qty": b, "note": f"changed in batch {b}"}


def prefill(
    warehouse: Any, workload: Workload, rows: int, log_retention_hours: float | None
) -> None:
    """Each mirror (and the bookkeeping tables) created by the apply path (one insert),
    with the run's ``log_retention_hours``, then ``rows`` more rows appended as one
    sorted file, as a mirror loaded long ago would be."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from cdcflow.apply.batch import BatchApplier
    from cdcflow.decode.batches import flatten
    from cdcflow.formats.base import DecodeResult
    from cdcflow.model import ChangeEvent, Op, Origin, seq_key
    from cdcflow.sinks.maintenance import MaintenancePolicy

    first = [
        ChangeEvent(
            op=Op.INSERT,
            source=s,
            key={"id": 0},
            after=_image(0, 0),
            columns=COLUMNS,
            seq=(1,),
            ts_ms=0,
            origin=Origin("bench", 0, 0),
        )
        for s in workload.sources
    ]
    creation = MaintenancePolicy(enabled=False, log_retention_hours=log_retention_hours)
    BatchApplier(warehouse, maintenance=creation).apply(
        pa.Table.from_batches([flatten(DecodeResult(events=first))]), delivery_id=0
    )
    ids = pa.array(range(1, rows + 1), pa.int64())
    data = {
        "id": ids,
        "name": pa.array([f"name {k}" for k in range(1, rows + 1)]),
        "qty": pa.array([0] * rows, pa.int64()),
        "note": pa.array(["loaded"] * rows),
        "_cdc_seq": pa.array([seq_key((1,))] * rows),
        "_cdc_ts_ms": pa.array([0] * rows, pa.int64()),
    }
    for s in workload.sources:
        path = warehouse.table_path(_target(s))
        schema = warehouse.open(path).schema().to_arrow()
        write_deltalake(path, pa.table(data).cast(pa.schema(schema)), mode="append")
        warehouse.forget(path)


def _target(source: Any) -> str:
    return f"{source.database}.{source.table}"


def _dir_stats(path: str) -> tuple[int, int]:
    """(files, bytes) in a folder, not recursing."""
    files = total = 0
    with os.scandir(path) as it:
        for entry in it:
            if entry.is_file():
                files += 1
                total += entry.stat().st_size
    return files, total


def open_and_read(warehouse: Any, workload: Workload) -> tuple[float, float]:
    """Seconds to open one mirror afresh and to read it in full (median of three)."""
    from deltalake import DeltaTable

    opens, reads = [], []
    for s in workload.sources[:3]:
        t = time.perf_counter()
        table = DeltaTable(warehouse.table_path(_target(s)))
        opens.append(time.perf_counter() - t)
        table.to_pyarrow_table()
        reads.append(time.perf_counter() - t)
    return statistics.median(opens), statistics.median(reads)


def measure(
    warehouse: Any,
    workload: Workload,
    seconds: list[float],
    samples: list[tuple[float, float]],
) -> dict[str, float]:
    """The figures at a mark (module docstring); ``samples``: :func:`open_and_read` every
    :data:`SAMPLE_EVERY` batches of the window before the mark (an open replays the
    commits since the last checkpoint, 0 to 99 of them: one reading is a point on a
    sawtooth)."""
    from deltalake import DeltaTable

    mirrors = [warehouse.table_path(_target(s)) for s in workload.sources]
    files = [len(DeltaTable(p).file_uris()) for p in mirrors]
    log_files, log_bytes = _dir_stats(os.path.join(mirrors[0], "_delta_log"))
    system = Path(warehouse.root) / "_cdcflow"
    bookkeeping = sum(
        len(DeltaTable(str(system / name)).file_uris())
        for name in ("changelog", "batches", "offsets", "progress")
        if (system / name / "_delta_log").is_dir()
    )
    samples = samples or [open_and_read(warehouse, workload)]
    window = seconds[-WINDOW:]
    return {
        "files per mirror": statistics.mean(files),
        "mirror log files": log_files,
        "mirror log MiB": log_bytes / 2**20,
        "bookkeeping data files": bookkeeping,
        "open one mirror (s)": statistics.mean(o for o, _ in samples),
        "read one mirror (s)": statistics.mean(r for _, r in samples),
        "apply per batch (s)": statistics.mean(window),
        "apply per batch p95 (s)": sorted(window)[max(0, int(len(window) * 0.95) - 1)],
    }


def run_one(
    batches: int, tables: int, rows: int, maintained: bool, day_s: float
) -> dict[int, dict[str, float]]:
    """One run; ``{mark: figures}``."""
    from cdcflow.apply.batch import BatchApplier
    from cdcflow.sinks.maintenance import MaintenancePolicy
    from cdcflow.sinks.retention import RetentionPolicy
    from cdcflow.sinks.warehouse import DeltaWarehouse

    hour_h = day_s / 24 / 3600  # one simulated hour, in hours of wall clock
    if maintained:
        policy = MaintenancePolicy(
            vacuum_every_hours=24 * hour_h,
            vacuum_retention_hours=168 * hour_h,
            retention=RetentionPolicy(
                changelog_hours=168 * hour_h,
                dead_letters_hours=720 * hour_h,
                batches_hours=720 * hour_h,
                progress_hours=720 * hour_h,
                offsets_hours=720 * hour_h,
            ),
            retention_every_hours=hour_h,
            log_retention_hours=24 * hour_h,
        )
    else:
        policy = MaintenancePolicy(enabled=False)
    marks = sorted({m for m in MARKS if m <= batches} | {batches})
    label = "with maintenance" if maintained else "without maintenance"
    out: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cdcflow-long-") as root:
        warehouse = DeltaWarehouse(root, pipeline_id="bench.long")
        workload = Workload(tables, rows)
        prefill(warehouse, workload, rows, policy.log_retention_hours)
        applier = BatchApplier(warehouse, maintenance=policy)
        seconds: list[float] = []
        samples: list[tuple[float, float]] = []
        started = time.perf_counter()
        for b in range(1, batches + 1):
            events = workload.batch(b)
            t = time.perf_counter()
            applier.apply(events, delivery_id=b)
            seconds.append(time.perf_counter() - t)
            if any(m - WINDOW < b <= m for m in marks) and b % SAMPLE_EVERY == 0:
                samples.append(open_and_read(warehouse, workload))  # not in the apply time
            if b in marks:
                out[b] = measure(warehouse, workload, seconds, samples)
                samples = []
                print(
                    f"  {label}, batch {b:,} ({time.perf_counter() - started:.0f} s): "
                    + ", ".join(f"{k} {v:.3g}" for k, v in out[b].items()),
                    flush=True,
                )
    return out


def rows_of(runs: dict[str, dict[int, dict[str, float]]]) -> list[dict[str, Any]]:
    """Result rows: each figure at each mark, per run; the flatness target for the run
    with maintenance (last mark against the first)."""
    out = []
    for label, marks in runs.items():
        if not marks:
            continue
        first, last = min(marks), max(marks)
        for figure in marks[first]:
            for mark, figures in sorted(marks.items()):
                value = figures[figure]
                flat_check = (
                    label == "with maintenance"
                    and mark == last
                    and mark != first
                    and figure not in LOG_RETAINED
                )
                base = marks[first][figure]
                out.append(
                    row(
                        "long_run",
                        f"{label}: {figure} at batch {mark:,}",
                        value,
                        "",
                        reference=base if mark != first else None,
                        reference_name=f"at batch {first:,}" if mark != first else None,
                        target=f"<= {FLAT}x batch {first:,}" if flat_check else None,
                        met=(value <= FLAT * max(base, 1e-9)) if flat_check else None,
                    )
                )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per mirror at start")
    parser.add_argument("--day-s", type=float, default=60.0, help="one simulated day, seconds")
    parser.add_argument("--no-maintenance", action="store_true", help="only the run without")
    parser.add_argument("--only-maintained", action="store_true", help="only the run with")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    print(
        f"long run: {args.batches:,} micro-batches x {args.tables} tables "
        f"({args.rows:,} rows each at start), one simulated day = {args.day_s:g} s"
    )
    runs = {}
    if not args.only_maintained:
        runs["without maintenance"] = run_one(
            args.batches, args.tables, args.rows, False, args.day_s
        )
    if not args.no_maintenance:
        runs["with maintenance"] = run_one(args.batches, args.tables, args.rows, True, args.day_s)
    emit(rows_of(runs), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``cdcflow verify`` costs against the least any comparison must do: read both sides once.

    python bench/verify_cost.py                             # 10M rows
    python bench/verify_cost.py --rows 200000               # a quick look
    python bench/verify_cost.py --rows 200000 --chunk-rows 50000 --fanout 32

Issue 35's cost targets. A PostgreSQL table of ``--rows`` rows (``id bigint`` primary
key, ``amount numeric(12,2)``, ``note text``, ``created_at timestamptz``, ``score double
precision``, ``flag boolean``), loaded server-side from ``generate_series`` then
``VACUUM ANALYZE``d, in a server of the test kit's own
(:class:`~cdcflow_testkit.services.postgres.LocalPostgres`, its default settings), and
its mirror written directly with delta-rs's ``write_deltalake`` from the same values
computed in Arrow (the mirror target ``shop.public.big``; no ``_cdc_*`` columns). A second
mirror, in a warehouse of its own, has ``--differences`` rows (10) whose ``amount`` is one
more, at keys spread over the range.

Measured, each the median of ``--repeats`` runs after one untimed warm-up of each (so
that PostgreSQL's buffers and the page cache are as warm for one as for the other), the
runs of the floor and of each mode interleaved:

* the *floor*: one ``SELECT count(*), sum(<row hash>)`` over the source table -- the hash
  verify's full mode computes (:func:`cdcflow.verify.canonical.sql_row_hash` of every
  column's :func:`~cdcflow.verify.canonical.sql_text`) -- plus one full read of the mirror
  (``DeltaTable.to_pyarrow_table()``): the seconds of the two, one after the other, as
  verify does them;
* :func:`cdcflow.verify.verifier.verify` of the equal mirror in ``quick`` and ``full``
  mode (``wait_s=0``: no pipeline to wait for), as a ratio to that floor;
* ``verify`` ``full`` of the damaged mirror (``recheck_after_s=0``, the rechecks' reads
  counted, their pauses not), as a ratio to the equal ``full`` run. The run must report
  exactly the damaged keys as ``different``, in ``amount`` only, and the equal runs must
  say equal with no differing range (else the bench fails: its numbers would mean nothing).

Beside each figure: rows/s, this process's peak RSS (verify's DuckDB and the mirror's
Arrow data are in it) and the PostgreSQL server's (its process tree, RSS and PSS: shared
buffers are counted in every backend's RSS, once in the PSS sum), and where verify's time
went: the mirror's keyed table (DuckDB reading the Delta table, hashing and sorting every
row), the source's range checksums, the mirror's range checksums, splits and row reads.

Targets (issue 35): verify of equal tables <= 2x the floor in each mode; with 10
differing keys, ``full`` <= 1.5x the same of equal tables.

At 10M rows on this 2-core machine (``bench/results/verify_cost.json``, load 3-5 during
the runs): floor 17.2 s (medians; the source's sum with PostgreSQL's two parallel
workers, the mirror's read about 1.1 s; the floor varied 16.3-23.0 s between runs);
quick 15.6 s (0.91x), full 26.6 s (1.55x), full with 10 differing keys 35.3 s (1.33x the
equal run). Full mode is the source's 100 range checksums (hashing costs PostgreSQL about
3 us a row a core, half of it ``md5`` and the cast of its hex to ``bit(60)``) *beside*
DuckDB's keyed table, built in a thread of its own since the first cuts come from the
mirror's key columns alone (0.6 s): alone the build takes 9 s (the row's ``md5`` about
6 s, the ``numeric`` column's two ``regexp_replace`` about 3 s), beside PostgreSQL's
three processes on two cores it takes 26 s, and the two end together (23 s and 26 s
overlapped; before the overlap, full mode was their sum: 31.8 s, 1.84x). On a database
on another host the build would not compete for cores. Before verify stopped preparing
its statements, quick mode's checksums ran on PostgreSQL's *generic* plan from their
fifth run (an index scan without parallel workers): 25.2 s (1.19x) where they take
15.6 s.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testkit" / "src"))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PeakRss, emit, row, tree_rss_bytes  # noqa: E402

#: verify of equal tables within this many times the floor, in each mode
EQUAL_TARGET_RATIO = 2.0
#: verify full with the differing keys within this many times the same of equal tables
DIFFERENCES_TARGET_RATIO = 1.5

DATABASE, SCHEMA, TABLE = "shop", "public", "big"
TARGET = f"{DATABASE}.{SCHEMA}.{TABLE}"
#: created_at of row i is this plus i seconds
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

CREATE = f"""
CREATE TABLE {SCHEMA}.{TABLE} (
    id bigint NOT NULL, amount numeric(12, 2), note text, created_at timestamptz,
    score double precision, flag boolean
)
"""
# every value computed from i, as mirror_table() computes it in Arrow
INSERT = f"""
INSERT INTO {SCHEMA}.{TABLE}
SELECT i, (i %% 100000)::numeric / 100, 'note ' || i,
       timestamptz '2026-01-01 00:00:00+00' + i * interval '1 second',
       i::float8 / 7, i %% 3 = 0
FROM generate_series(%s::bigint, %s::bigint) AS i
"""


# --------------------------------------------------------------------------- the data


def load_source(pg: Any, rows: int, batch: int = 2_000_000) -> float:
    """Create and fill the source table (ids 1..rows), its primary key built after the
    rows, then ``VACUUM ANALYZE`` and a checkpoint; returns the seconds."""
    t = time.perf_counter()
    with pg.connect() as conn:
        conn.execute(CREATE)
        for lo in range(1, rows + 1, batch):
            conn.execute(INSERT, (lo, min(rows, lo + batch - 1)))
        conn.execute(f"ALTER TABLE {SCHEMA}.{TABLE} ADD PRIMARY KEY (id)")
        conn.execute(f"VACUUM ANALYZE {SCHEMA}.{TABLE}")
        conn.execute("CHECKPOINT")  # nothing left dirty for the measured reads to write
    return time.perf_counter() - t


def mirror_table(rows: int, damaged: np.ndarray | None = None) -> pa.Table:
    """The source table's rows as Arrow computes them (ids 1..rows); ``damaged``: ids
    whose ``amount`` is one more."""
    ids = np.arange(1, rows + 1, dtype=np.int64)
    cents = ids % 100_000
    if damaged is not None:
        cents[damaged - 1] += 100
    # decimal128(12, 2) from its unscaled value: 16 bytes each, little-endian, high word 0
    words = np.zeros((rows, 2), dtype=np.int64)
    words[:, 0] = cents
    amount = pa.Array.from_buffers(pa.decimal128(12, 2), rows, [None, pa.py_buffer(words)])
    id_array = pa.array(ids)
    note = pc.binary_join_element_wise("note ", pc.cast(id_array, pa.string()), "")
    base_us = int(EPOCH.timestamp()) * 1_000_000
    created = pa.array(base_us + ids * 1_000_000, pa.timestamp("us", tz="UTC"))
    return pa.table(
        {
            "id": id_array,
            "amount": amount,
            "note": note,
            "created_at": created,
            "score": pa.array(ids.astype(np.float64) / 7.0),
            "flag": pa.array(ids % 3 == 0),
        }
    )


def damaged_keys(rows: int, differences: int) -> np.ndarray:
    """``differences`` ids spread over 1..rows: the middle of each of as many slices."""
    return np.array(
        sorted({1 + (2 * k + 1) * rows // (2 * differences) for k in range(differences)}),
        dtype=np.int64,
    )


def write_mirror(warehouse: Path, rows: int, damaged: np.ndarray | None = None) -> Path:
    """Write the mirror ``<warehouse>/shop.public.big`` (delta-rs, its default file
    sizes); returns its path."""
    from deltalake import write_deltalake

    path = warehouse / TARGET
    data = mirror_table(rows, damaged)
    write_deltalake(str(path), data)
    del data
    return path


def config_for(warehouse: Path) -> Any:
    """A pipeline whose warehouse is ``warehouse`` and whose one source routes the
    PostgreSQL table ``shop.public.big`` to the mirror ``shop.public.big``."""
    from cdcflow.config import parse_config

    return parse_config(
        {
            "pipeline_id": "bench",
            "warehouse": str(warehouse),
            "checkpoint": str(warehouse.parent / "checkpoint"),
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},  # not asked: wait_s=0
            "sources": [{"format": "debezium-json", "topic_pattern": r"pg\..*"}],
        }
    )


# --------------------------------------------------------------------------- the floor


def floor_sql(url: str) -> str:
    """``SELECT count(*), sum(<row hash>)`` over the source table, the hash verify's
    full mode computes, from the table's columns as verify reads them."""
    from cdcflow.verify.canonical import sql_row_hash, sql_text
    from cdcflow.verify.databases import SourceDatabase

    db = SourceDatabase(url)
    try:
        (table,) = [t for t in db.tables() if (t.schema, t.table) == (SCHEMA, TABLE)]
        texts = [sql_text(c, db.dialect, db.quote(c.name)) for c in table.columns]
        return f"SELECT count(*), sum({sql_row_hash(texts, db.dialect)}) FROM {db.relation(table)}"
    finally:
        db.close()


def floor_once(url: str, sql: str, mirror: Path, parallel: bool = True) -> dict[str, float]:
    """One floor: the source's count and hash sum, then one full read of the mirror.
    ``parallel=False``: the source's query without PostgreSQL's parallel workers (as
    verify's range queries run: one backend each)."""
    import psycopg
    from deltalake import DeltaTable

    with psycopg.connect(url, autocommit=True) as conn:
        if not parallel:
            conn.execute("SET max_parallel_workers_per_gather = 0")
        t = time.perf_counter()
        count, _ = conn.execute(sql).fetchone()  # type: ignore[misc]
        source_s = time.perf_counter() - t
    t = time.perf_counter()
    data = DeltaTable(str(mirror)).to_pyarrow_table()
    mirror_s = time.perf_counter() - t
    assert data.num_rows == count, (data.num_rows, count)
    del data
    return {"seconds": source_s + mirror_s, "source_s": source_s, "mirror_s": mirror_s}


# --------------------------------------------------------------------------- verify


class PhaseTimers:
    """Seconds spent in each of verify's side operations, by wrapping the methods of
    :class:`~cdcflow.verify.sides.SourceSide` and :class:`~cdcflow.verify.sides.MirrorSide`
    while in use (the outermost call of each thread counted: a split's own checksum is the
    split's). ``MirrorSide.build`` is the keyed table's build (DuckDB reading the Delta
    table, hashing and sorting every row), in a thread of its own while the source's
    ``prefetch`` computes the first ranges' checksums: the two overlap, so the phases add
    up to more than the run; ``_built`` is the time the bisection waited for the build."""

    WRAPPED = {
        "SourceSide": ("prefetch", "checksum", "split", "rows", "rows_by_key"),
        "MirrorSide": ("first_cuts", "build", "_built", "checksum", "split", "rows", "rows_by_key"),
    }
    NAMES = {"build": "keyed table", "_built": "wait for the keyed table"}

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._depth = threading.local()

    @contextlib.contextmanager
    def installed(self) -> Iterator[PhaseTimers]:
        from cdcflow.verify import sides

        saved = []
        for cls_name, methods in self.WRAPPED.items():
            cls = getattr(sides, cls_name)
            side = "source" if cls_name == "SourceSide" else "mirror"
            for m in methods:
                original = cls.__dict__[m]
                name = f"{side} {self.NAMES.get(m, m)}"
                saved.append((cls, m, original))
                setattr(cls, m, self._timed(name, original))
        try:
            yield self
        finally:
            for cls, m, original in saved:
                setattr(cls, m, original)

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth
                if depth == 0:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
                    self.calls[name] = self.calls.get(name, 0) + 1

        return timed


def verify_once(url: str, warehouse: Path, mode: str, options: dict[str, Any]) -> dict[str, Any]:
    """One ``verify`` of the mirror in ``warehouse``: seconds, the table's result and the
    seconds per side operation."""
    from cdcflow.verify.databases import SourceDatabase
    from cdcflow.verify.verifier import VerifyOptions, verify

    config = config_for(warehouse)
    timers = PhaseTimers()
    t = time.perf_counter()
    db = SourceDatabase(url, statement_timeout_s=600)
    try:
        with timers.installed():
            run = verify(
                config,
                db,
                VerifyOptions(
                    mode=mode, wait_s=0, recheck_after_s=0, statement_timeout_s=600, **options
                ),
            )
    finally:
        db.close()
    seconds = time.perf_counter() - t
    (result,) = run.tables
    return {
        "seconds": seconds,
        "result": result,
        "rounds": run.rounds,
        "phases": {k: round(v, 3) for k, v in sorted(timers.seconds.items())},
        "calls": dict(sorted(timers.calls.items())),
    }


def check_equal(got: dict[str, Any], rows: int) -> None:
    r = got["result"]
    assert r.equal, f"the equal mirror is not equal: {r}"
    assert (r.rows_source, r.rows_mirror) == (rows, rows), r
    assert r.differing_ranges == 0, f"equal tables gave differing checksums: {r}"


def check_damaged(got: dict[str, Any], damaged: np.ndarray) -> None:
    r = got["result"]
    assert not r.missing and not r.extra and not r.in_flight, r
    keys = sorted(d["key"]["id"] for d in r.different)
    assert keys == damaged.tolist(), f"verify found {keys}, damaged {damaged.tolist()}"
    assert all(set(d["columns"]) == {"amount"} for d in r.different), r.different


# --------------------------------------------------------------------------- measuring


def _settle() -> None:
    """Give back what the last measured thing left in the allocators (so that the next
    peak is its own)."""
    gc.collect()
    with contextlib.suppress(Exception):
        pa.default_memory_pool().release_unused()


def _postmaster_pid(pg: Any) -> int | None:
    try:
        return int(Path(pg.data_dir, "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError, TypeError):
        return None


def measure(
    things: dict[str, Callable[[], dict[str, Any]]], repeats: int, server_pid: int | None
) -> dict[str, dict[str, Any]]:
    """Each of ``things`` once untimed, then ``repeats`` rounds of each in turn; per
    thing the median of each figure in seconds, every run's total, the peak RSS of this
    process and of the server, and the last run's other figures."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in things}
    peaks: dict[str, list[int]] = {name: [0, 0, 0] for name in things}
    before: dict[str, int] = {}  # this process's RSS as each run began (the least)
    loads: dict[str, list[float]] = {name: [] for name in things}
    for name, fn in things.items():
        _settle()
        print(f"  warm-up: {name}", flush=True)
        fn()
    for i in range(repeats):
        for name, fn in things.items():
            _settle()
            rss = tree_rss_bytes(os.getpid())
            before[name] = min(before.get(name, rss), rss)
            loads[name].append(round(os.getloadavg()[0], 2))
            server = PeakRss(server_pid) if server_pid else contextlib.nullcontext()
            with PeakRss() as mine, server as theirs:
                got = fn()
            runs[name].append(got)
            p = peaks[name]
            p[0] = max(p[0], mine.peak_bytes)
            if theirs is not None:
                p[1] = max(p[1], theirs.peak_bytes)
                p[2] = max(p[2], theirs.peak_pss_bytes)
            print(f"  run {i + 1}: {name} {got['seconds']:.2f} s", flush=True)
    out = {}
    for name, got in runs.items():
        out[name] = {
            **got[-1],
            # every figure in seconds (the total, the floor's parts, verify's phases)
            # their median
            **{
                k: statistics.median(g[k] for g in got)
                for k, v in got[0].items()
                if isinstance(v, float)
            },
            **{
                k: {p: round(statistics.median(g[k].get(p, 0.0) for g in got), 3) for p in v}
                for k, v in got[0].items()
                if k == "phases"
            },
            "runs_s": [round(g["seconds"], 3) for g in got],
            "loads": loads[name],
            "peak_rss_mb": round(peaks[name][0] / 2**20),
            "rss_before_mb": round(before[name] / 2**20),
            "server_peak_rss_mb": round(peaks[name][1] / 2**20) if server_pid else None,
            "server_peak_pss_mb": round(peaks[name][2] / 2**20) if server_pid else None,
        }
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(
    rows: int,
    repeats: int = 3,
    differences: int = 10,
    chunk_rows: int = 100_000,
    leaf_rows: int = 256,
    fanout: int = 16,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    from cdcflow_testkit.services.postgres import LocalPostgres

    options = {"chunk_rows": chunk_rows, "leaf_rows": leaf_rows, "fanout": fanout}
    if threads:
        options["threads"] = threads
    damaged = damaged_keys(rows, differences)
    load_before = _load()
    with (
        LocalPostgres(database=DATABASE) as pg,
        tempfile.TemporaryDirectory(prefix="cdcflow-verify-bench-") as tmp,
    ):
        url = f"postgresql://{pg.user}@{pg.host}:{pg.port}/{pg.database}"
        print(f"loading {rows:,} rows into PostgreSQL ...", flush=True)
        load_s = load_source(pg, rows)
        t = time.perf_counter()
        equal_wh, damaged_wh = Path(tmp, "equal"), Path(tmp, "damaged")
        mirror = write_mirror(equal_wh, rows)
        write_mirror(damaged_wh, rows, damaged)
        write_s = time.perf_counter() - t
        files = len(list(mirror.glob("*.parquet")))
        print(
            f"  loaded in {load_s:.1f} s; mirrors written in {write_s:.1f} s ({files} files each)",
            flush=True,
        )
        with pg.connect() as conn:
            source_mb = conn.execute(
                f"SELECT pg_total_relation_size('{SCHEMA}.{TABLE}') / 1048576"
            ).fetchone()[0]
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', "
                    "'work_mem', 'max_parallel_workers_per_gather', 'server_version')"
                ).fetchall()
            )
        sql = floor_sql(url)
        # the mirrors say equal, and the damage is found, before anything is timed
        check_equal(verify_once(url, equal_wh, "full", options), rows)
        check_damaged(verify_once(url, damaged_wh, "full", options), damaged)

        def checked(warehouse: Path, mode: str, check: Callable[[dict], None]) -> Callable:
            def once() -> dict[str, Any]:
                got = verify_once(url, warehouse, mode, options)
                check(got)
                return got

            return once

        got = measure(
            {
                "floor": lambda: floor_once(url, sql, mirror),
                "floor serial": lambda: floor_once(url, sql, mirror, parallel=False),
                "quick": checked(equal_wh, "quick", lambda g: check_equal(g, rows)),
                "full": checked(equal_wh, "full", lambda g: check_equal(g, rows)),
                "differences": checked(damaged_wh, "full", lambda g: check_damaged(g, damaged)),
            },
            repeats,
            _postmaster_pid(pg),
        )
        mirror_mb = sum(f.stat().st_size for f in mirror.glob("*.parquet")) / 2**20
    load_after = _load()
    floor, quick, full, diff = (got[k] for k in ("floor", "quick", "full", "differences"))
    serial = got["floor serial"]
    common = {
        "rows": rows,
        "repeats": repeats,
        "load_before": load_before,
        "load_after": load_after,
        "source_mb": int(source_mb),
        "mirror_mb": round(mirror_mb),
        "mirror_files": files,
        "postgres": settings,
        **options,
    }

    def memory(m: dict[str, Any]) -> dict[str, Any]:
        keys = ("peak_rss_mb", "rss_before_mb", "server_peak_rss_mb", "server_peak_pss_mb")
        return {"loads": m["loads"], **{k: m[k] for k in keys}}

    def verify_extra(m: dict[str, Any]) -> dict[str, Any]:
        r = m["result"]
        return {
            "rows_per_s": round(rows / m["seconds"]),
            "runs_s": m["runs_s"],
            "ranges": r.ranges,
            "checksums": r.checksums,
            "differing_ranges": r.differing_ranges,
            "leaves": r.leaves,
            "rows_read": r.rows_read,
            "rounds": m["rounds"],
            "phases_s": m["phases"],
            "calls": m["calls"],
            **memory(m),
        }

    out = [
        row(
            "verify_cost",
            f"verify floor, {rows:,} rows (source sum + mirror read)",
            floor["seconds"],
            "s",
            rows_per_s=round(rows / floor["seconds"]),
            runs_s=floor["runs_s"],
            source_s=round(floor["source_s"], 3),
            mirror_s=round(floor["mirror_s"], 3),
            # the source's sum without parallel workers (median of as many runs)
            source_serial_s=round(serial["source_s"], 3),
            serial_runs_s=serial["runs_s"],
            **memory(floor),
            **common,
        )
    ]
    for name, m in (("quick", quick), ("full", full)):
        out.append(
            row(
                "verify_cost",
                f"verify {name}, {rows:,} rows",
                m["seconds"],
                "s",
                reference=floor["seconds"],
                reference_name="the floor",
                target=f"<= {EQUAL_TARGET_RATIO:g}x reference",
                met=m["seconds"] <= EQUAL_TARGET_RATIO * floor["seconds"],
                **verify_extra(m),
                **common,
            )
        )
    out.append(
        row(
            "verify_cost",
            f"verify full, {len(damaged)} differing keys",
            diff["seconds"],
            "s",
            reference=full["seconds"],
            reference_name="verify full, equal",
            target=f"<= {DIFFERENCES_TARGET_RATIO:g}x reference",
            met=diff["seconds"] <= DIFFERENCES_TARGET_RATIO * full["seconds"],
            differences=len(damaged),
            **verify_extra(diff),
            **common,
        )
    )
    for r in out:
        extra = {k: r[k] for k in ("runs_s", "phases_s") if k in r}
        print(f"  {r['figure']}: {r['value']:.2f} s {extra}", flush=True)
    print(f"  load average before {load_before}, after {load_after}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the table")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each (median)")
    parser.add_argument(
        "--differences", type=int, default=10, help="damaged keys of the second mirror"
    )
    parser.add_argument("--chunk-rows", type=int, default=100_000, help="VerifyOptions")
    parser.add_argument("--leaf-rows", type=int, default=256, help="VerifyOptions")
    parser.add_argument("--fanout", type=int, default=16, help="VerifyOptions")
    parser.add_argument("--threads", type=int, help="VerifyOptions: DuckDB's (default: all)")
    parser.add_argument("--json", "--out", dest="json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = run(
        args.rows,
        args.repeats,
        args.differences,
        args.chunk_rows,
        args.leaf_rows,
        args.fanout,
        args.threads,
    )
    emit(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

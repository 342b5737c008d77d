"""The tables of a micro-batch applied at once (``apply.parallel_tables``): really
concurrent, the same result as one by one, and exactly once across a SIGKILL in the
middle. Real delta-rs tables in a temp folder, read back with ``deltalake``; the crash is
a real process killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from tests.apply.helpers import dele, ins, table_of

from cdcflow.apply.batch import BatchApplier
from cdcflow.model import SourceTable
from cdcflow.sinks.mirror import Mirrors
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

ROOT = Path(__file__).resolve().parents[2]
TABLES = 12


def _table(i: int) -> SourceTable:
    return SourceTable("test", "db", "", f"t{i:02d}")


def _batches() -> list[pa.Table]:
    """Three micro-batches over :data:`TABLES` tables, offsets numbered from 0.

    0: keys 1-5 inserted (seq 1); 1: key 1 updated, key 2 deleted, key 6 inserted (seq
    2-4); 2: a late insert of key 2 older than its delete (seq 2), which the tombstone
    must drop."""
    offset = 0
    out = []
    plans = [
        lambda t: [ins(k, f"v{k}", seq=1, table=t) for k in range(1, 6)],
        lambda t: [
            ins(1, "updated", seq=2, table=t),
            dele(2, seq=3, table=t),
            ins(6, "v6", seq=4, table=t),
        ],
        lambda t: [ins(2, "late", seq=2, table=t)],
    ]
    for plan in plans:
        events = []
        for i in range(TABLES):
            for e in plan(_table(i)):
                events.append(_at(e, offset))
                offset += 1
        out.append(table_of(*events))
    return out


def _at(event, offset: int):
    """``event`` at Kafka offset ``offset`` of partition 0 of topic ``t``."""
    from dataclasses import replace

    return replace(event, origin=replace(event.origin, offset=offset))


EXPECTED = {1: "updated", 3: "v3", 4: "v4", 5: "v5", 6: "v6"}


def _rows(root: str, i: int) -> dict[int, str]:
    data = DeltaTable(f"{root}/db.t{i:02d}").to_pyarrow_table(columns=["id", "name"])
    return mirror_by_key(data, column="name")


def test_tables_are_applied_at_once_on_worker_threads(tmp_path):
    """Two tables meet at a barrier inside their applies: one after another, the first
    would wait alone until the barrier's timeout breaks it."""
    barrier = threading.Barrier(2, timeout=30)
    threads: set[str] = set()

    class MeetingMirrors(Mirrors):
        def apply(self, target, *args, **kwargs):
            threads.add(threading.current_thread().name)
            barrier.wait()
            return super().apply(target, *args, **kwargs)

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    applier = BatchApplier(wh, parallel_tables=2)
    applier.table_applier.mirrors = MeetingMirrors(wh)
    report = applier.apply(
        table_of(ins(1, "a", seq=1, table=_table(0)), ins(1, "b", seq=1, table=_table(1)))
    )
    assert sorted(m.target for m in report.mirrors) == ["db.t00", "db.t01"]
    assert len(threads) == 2 and all(t.startswith("cdcflow-apply") for t in threads)


def test_one_by_one_and_at_once_give_the_same_tables(tmp_path):
    results = {}
    for parallel in (1, 8):
        root = str(tmp_path / f"wh{parallel}")
        ap = BatchApplier(DeltaWarehouse(root, pipeline_id="test"), parallel_tables=parallel)
        reports = [ap.apply(b, delivery_id=i) for i, b in enumerate(_batches())]
        tombs = DeltaTable(f"{root}/_cdcflow/tombstones").to_pyarrow_table()
        results[parallel] = (
            [_rows(root, i) for i in range(TABLES)],
            sorted(zip(tombs["target_table"].to_pylist(), tombs["key"].to_pylist(), strict=True)),
            [(r.events, dict(r.dead_letters), len(r.mirrors)) for r in reports],
        )
    assert results[1] == results[8]
    tables, tombstones, _ = results[8]
    assert tables == [EXPECTED] * TABLES  # the late insert of key 2 was dropped
    assert tombstones == [(f"db.t{i:02d}", '{"id":2}') for i in range(TABLES)]


def test_one_tombstone_commit_per_micro_batch(tmp_path):
    """Every mirror's deleted keys of a micro-batch are one commit, not one per mirror."""
    root = str(tmp_path / "wh")
    ap = BatchApplier(DeltaWarehouse(root, pipeline_id="test"))
    first, second, _ = _batches()
    ap.apply(first, 0)
    ap.apply(second, 1)
    history = DeltaTable(f"{root}/_cdcflow/tombstones").history()
    assert len([h for h in history if h.get("operation") != "CREATE TABLE"]) == 1


_CHILD = """
import os, signal, sys
from tests.apply.test_parallel_apply import _batches
from cdcflow.apply.batch import BatchApplier
from cdcflow.sinks.mirror import Mirrors
from cdcflow.sinks.warehouse import DeltaWarehouse

root, kill_after = sys.argv[1], int(sys.argv[2])
batches = _batches()
ap = BatchApplier(DeltaWarehouse(root, pipeline_id="test"), parallel_tables=4)
ap.apply(batches[0], delivery_id=0)
real, done = Mirrors.apply, []

def apply_then_die(self, target, *args, **kwargs):
    result = real(self, target, *args, **kwargs)
    done.append(target)
    if len(done) == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)  # the other tables are mid-apply
    return result

Mirrors.apply = apply_then_die
ap.apply(batches[1], delivery_id=1)
"""


def test_a_sigkill_in_the_middle_of_a_parallel_apply_loses_and_repeats_nothing(tmp_path):
    root = str(tmp_path / "wh")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "src"), str(ROOT / "testkit" / "src")]
        ),
    }
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, root, "5"], cwd=ROOT, env=env, capture_output=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    applied = [
        DeltaTable(f"{root}/db.t{i:02d}").transaction_version("cdcflow-test") == 1
        for i in range(TABLES)
    ]
    assert 5 <= sum(applied) < TABLES  # cut in the middle: some tables hold apply 1
    assert not os.path.exists(f"{root}/_cdcflow/tombstones")  # written after the tables

    # the restart: Kafka delivers batch 1 again (Spark had not recorded it), then batch 2
    ap = BatchApplier(DeltaWarehouse(root, pipeline_id="test"), parallel_tables=4)
    batches = _batches()
    report = ap.apply(batches[1], delivery_id=1)
    assert report.batch_id == 1
    assert sorted(m.skipped_replay for m in report.mirrors) == sorted(applied)
    ap.apply(batches[2], delivery_id=2)

    assert [_rows(root, i) for i in range(TABLES)] == [EXPECTED] * TABLES
    changelog = DeltaTable(f"{root}/_cdcflow/changelog").to_pyarrow_table()
    offsets = sorted(changelog["offset"].to_pylist())
    assert offsets == list(range(sum(b.num_rows for b in batches)))  # each once
    batches_rows = DeltaTable(f"{root}/_cdcflow/batches").to_pyarrow_table()
    assert sorted(batches_rows["batch_id"].to_pylist()) == [0, 1, 2]
    tombs = DeltaTable(f"{root}/_cdcflow/tombstones").to_pyarrow_table()
    assert pc.count_distinct(tombs["target_table"]).as_py() == TABLES == tombs.num_rows

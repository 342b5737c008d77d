"""Exactly once across a Delta log checkpoint and the clean-up of the log files before it.

A replayed micro-batch is skipped by application transactions (``txn`` actions): the
mirrors' ``(app_id, apply_id)`` and the per-partition next offsets in
``_cdcflow/batches`` (:mod:`cdcflow.apply.offsets`). Maintenance drops log files past the
table's log retention at a checkpoint (``cleanup_metadata`` in
:mod:`cdcflow.sinks.maintenance`), and with them the commits that wrote those ``txn``
actions; only the checkpoint still carries them. Real delta-rs tables: the log files are
aged past the retention (their modification time, which delta-rs's clean-up reads), each
table is checkpointed and cleaned up, and a new warehouse view (a restarted process)
gets the same micro-batch again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from deltalake import DeltaTable
from tests.apply.helpers import dele, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.sinks.maintenance import MaintenancePolicy
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import compare_with_mirror

TARGET = "db.items"
NO_MAINTENANCE = MaintenancePolicy(enabled=False)


def _batches() -> list[list]:
    """Four micro-batches of topic ``t`` partition 0, offsets 0-15."""
    return [
        [ins(k, "a", qty=k, seq=1, offset=k) for k in range(6)],
        [
            upd(1, "b", qty=10, seq=2, offset=6),
            dele(2, seq=2, offset=7),
            ins(7, "c", seq=2, offset=8),
        ],
        [upd(3, "d", qty=30, seq=3, offset=9), dele(4, seq=3, offset=10)],
        [upd(5, "e", qty=50, seq=4, offset=11), ins(8, "f", seq=4, offset=12)],
    ]


EXPECTED = [
    {"id": 0, "name": "a", "qty": 0},
    {"id": 1, "name": "b", "qty": 10},
    {"id": 3, "name": "d", "qty": 30},
    {"id": 5, "name": "e", "qty": 50},
    {"id": 7, "name": "c", "qty": 1},
    {"id": 8, "name": "f", "qty": 1},
]


def _delta_tables(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("_delta_log") if p.is_dir())


def _checkpoint_and_clean_up(table_path: Path) -> list[str]:
    """Age every log file past the table's log retention, checkpoint, clean up; the log
    files removed."""
    log = table_path / "_delta_log"
    before = {p.name for p in log.glob("*.json")}
    old = time.time() - 30 * 24 * 3600  # past any retention cdcflow sets (24 h)
    for p in log.glob("*.json"):
        os.utime(p, (old, old))
    table = DeltaTable(str(table_path))
    table.create_checkpoint()
    table.cleanup_metadata()
    return sorted(before - {p.name for p in log.glob("*.json")})


def test_a_replayed_micro_batch_is_skipped_after_the_log_is_checkpointed_and_cleaned(tmp_path):
    root = tmp_path / "wh"
    wh = DeltaWarehouse(str(root), pipeline_id="p")
    applier = BatchApplier(wh, maintenance=NO_MAINTENANCE)
    batches = [table_of(*events) for events in _batches()]
    for delivery, batch in enumerate(batches):
        report = applier.apply(batch, delivery)
        assert report.replayed == 0 and not report.dead_letters
    mirror_path = root / TARGET
    mirror = DeltaTable(str(mirror_path))
    applied = mirror.transaction_version(wh.app_id)
    assert applied == 3
    mirror_version = mirror.version()

    tables = _delta_tables(root)
    assert mirror_path in tables and any(p.name == "batches" for p in tables)
    for path in tables:
        removed = _checkpoint_and_clean_up(path)
        assert f"{0:020d}.json" in removed, (path, removed)  # the first commits are gone
    first_log = mirror_path / "_delta_log" / f"{0:020d}.json"
    assert not first_log.exists()
    # the transactions are read from the checkpoint alone
    assert DeltaTable(str(mirror_path)).transaction_version(wh.app_id) == applied

    restarted = DeltaWarehouse(str(root), pipeline_id="p")
    again = BatchApplier(restarted, maintenance=NO_MAINTENANCE)
    assert again.ledger.completed_id() == applied and again.ledger.pending() is None
    assert restarted.committed(str(mirror_path), applied)
    for delivery, batch in enumerate(batches[1:], start=10):  # Spark replays them
        report = again.apply(batch, delivery)
        assert report.replayed == batch.num_rows and report.records == 0
    assert DeltaTable(str(mirror_path)).version() == mirror_version  # nothing committed
    assert compare_with_mirror(EXPECTED, restarted.read(TARGET), ["id"]) == []

    # the same offsets with other contents: still skipped (they are the records applied)
    changed = table_of(upd(1, "not again", seq=9, offset=6), dele(0, seq=9, offset=7))
    assert again.apply(changed, 20).replayed == 2
    assert compare_with_mirror(EXPECTED, restarted.read(TARGET), ["id"]) == []

    # the next offsets are applied, under the next apply id
    report = again.apply(table_of(upd(0, "g", qty=5, seq=5, offset=13)), 21)
    assert report.replayed == 0 and report.batch_id == applied + 1
    expected = [{"id": 0, "name": "g", "qty": 5}, *EXPECTED[1:]]
    assert compare_with_mirror(expected, restarted.read(TARGET), ["id"]) == []
    assert DeltaTable(str(mirror_path)).transaction_version(wh.app_id) == applied + 1

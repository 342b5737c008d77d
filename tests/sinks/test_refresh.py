"""Cached table handles: refreshed without listing the log, opened again once worn
(cdcflow.sinks.refresh, decision 49), on real Delta tables."""

from __future__ import annotations

import os

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from tests.sinks.log_clock import age_log

from cdcflow.sinks.refresh import REOPEN_AFTER_VERSIONS, refresh
from cdcflow.sinks.warehouse import DeltaWarehouse


def _append(path: str, value: int) -> None:
    write_deltalake(path, pa.table({"id": [value]}), mode="append")


def test_a_refresh_sees_every_commit_of_another_writer(tmp_path):
    path = str(tmp_path / "t")
    _append(path, 0)
    handle = DeltaTable(path)
    refresh(handle, path)  # nothing newer: the handle stays
    assert handle.version() == 0
    for v in range(1, 4):
        _append(path, v)
    refresh(handle, path)
    assert handle.version() == 3
    assert sorted(handle.to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2, 3]


def test_a_handle_older_than_the_cleaned_up_log_is_brought_up_to_date(tmp_path):
    path = str(tmp_path / "t")
    _append(path, 0)
    stale = DeltaTable(path)
    writer = DeltaTable(path)
    writer.alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 1 seconds"}, raise_if_not_exists=False
    )
    for v in range(1, 6):
        _append(path, v)
    writer.update_incremental()
    writer.create_checkpoint()
    age_log(path, 10)  # past the one second of retention
    _append(path, 6)
    writer.update_incremental()
    writer.cleanup_metadata()
    log = os.path.join(path, "_delta_log")
    assert not os.path.exists(os.path.join(log, f"{1:020d}.json"))  # the next one is gone
    refresh(stale, path)
    assert stale.version() == 7
    assert sorted(stale.to_pyarrow_table()["id"].to_pylist()) == list(range(7))


def test_the_warehouse_opens_a_worn_handle_again(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    path = wh.table_path("db.t")
    _append(path, 0)
    first = wh.open(path)
    for v in range(1, REOPEN_AFTER_VERSIONS):
        _append(path, v)
    assert wh.open(path) is first  # 99 versions on: refreshed in place
    _append(path, REOPEN_AFTER_VERSIONS)
    again = wh.open(path)
    assert again is not first and again.version() == REOPEN_AFTER_VERSIONS
    assert again.to_pyarrow_table().num_rows == REOPEN_AFTER_VERSIONS + 1
    assert wh.open(path) is again


def test_expired_log_files_are_cleaned_up_by_the_checkpoints_commit_only(tmp_path):
    """cdcflow's commits leave the log's clean-up (a listing of the whole log) to the
    commit that writes a checkpoint: expired commit files stay until then, and go then."""
    from cdcflow.sinks.refresh import CHECKPOINT_INTERVAL
    from cdcflow.sinks.warehouse import CommitContext

    path = str(tmp_path / "t")
    wh = DeltaWarehouse(str(tmp_path), pipeline_id="p")
    write_deltalake(
        path,
        pa.table({"id": [0]}),
        configuration={"delta.logRetentionDuration": "interval 1 hour"},
    )
    log = os.path.join(path, "_delta_log")

    def commits() -> int:
        return len([n for n in os.listdir(log) if n.endswith(".json")])

    for batch in range(1, CHECKPOINT_INTERVAL - 1):  # versions 1 .. 98
        wh.append(path, pa.table({"id": [batch]}), CommitContext("cdcflow-p", batch, {}))
    age_log(path, 2 * 3600)  # every commit so far expired
    wh.append(path, pa.table({"id": [99]}), CommitContext("cdcflow-p", 99, {}))  # version 99
    checkpoint = os.path.join(log, f"{CHECKPOINT_INTERVAL - 1:020d}.checkpoint.parquet")
    assert os.path.exists(checkpoint)  # delta-rs's checkpoint
    assert commits() == CHECKPOINT_INTERVAL  # expired, but not cleaned up by a commit
    wh.append(path, pa.table({"id": [100]}), CommitContext("cdcflow-p", 100, {}))
    assert commits() == 2  # the next commit cleaned up what the checkpoint holds
    assert DeltaTable(path).transaction_version("cdcflow-p") == 100

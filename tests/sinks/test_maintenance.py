"""Maintenance (``cdcflow.sinks.maintenance``, ``cdcflow maintain``): small files
compacted after micro-batches without changing a row or exactly-once, a merge that races
a compaction merged again (never written twice), vacuum within its retention. Real
delta-rs tables, read back with ``deltalake``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake
from tests.apply.helpers import dele, ins, table_of, upd
from tests.sinks.log_clock import age_log

import cdcflow
from cdcflow.apply.batch import BatchApplier
from cdcflow.errors import Code, LeaseHeld
from cdcflow.sinks import engines as engines_module
from cdcflow.sinks import maintenance as maintenance_module
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.maintenance import MaintenancePolicy, small_files
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

TARGET = "db.items"


@pytest.fixture
def file_per_batch(monkeypatch):
    """Tables past the small-table rewrite (``SMALL_TABLE_BYTES``): a batch's new keys
    are a file of their own, as in a large mirror."""
    from cdcflow.sinks import arrow_merge

    monkeypatch.setattr(arrow_merge, "SMALL_TABLE_BYTES", 0)


OFTEN = MaintenancePolicy(compact_min_files=4, budget_s=60)


def _files(path: str) -> int:
    return len(DeltaTable(path).file_uris())


def _names(wh: DeltaWarehouse) -> dict[int, str]:
    return mirror_by_key(wh.read(TARGET), column="name")


def _new_keys(ap: BatchApplier, batches: int, start: int = 0) -> list:
    """``batches`` micro-batches of 10 new keys each (each adds a file to the mirror)."""
    reports = []
    for b in range(start, start + batches):
        reports.append(
            ap.apply(table_of(*(ins(b * 10 + k, f"v{b}", seq=b + 1) for k in range(10))), b)
        )
    return reports


def test_small_files_are_compacted_after_a_batch_and_every_row_stays(tmp_path, file_per_batch):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh, maintenance=OFTEN)
    reports = _new_keys(ap, 3)
    assert _files(wh.table_path(TARGET)) == 3 and not any(r.maintenance for r in reports)
    fourth = _new_keys(ap, 1, start=3)[0]
    assert any(line.startswith(wh.table_path(TARGET)) for line in fourth.maintenance)
    assert _files(wh.table_path(TARGET)) == 1
    assert _files(wh.system_path("changelog")) == 1  # the bookkeeping tables too
    assert _names(wh) == {b * 10 + k: f"v{b}" for b in range(4) for k in range(10)}


def test_a_job_that_would_outrun_the_budget_left_waits_for_the_next_batch(
    tmp_path, file_per_batch, monkeypatch
):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh, maintenance=OFTEN)
    ap.maintainer.compact_bytes_per_s = 1.0  # every job is estimated at hours
    # and stays so: a job slowed past the measuring threshold by a loaded host would
    # otherwise set a real rate, and the later jobs would fit (a CI run saw 4 jobs, not 1)
    monkeypatch.setattr(maintenance_module, "MEASURED_JOB_S", float("inf"))
    reports = _new_keys(ap, 4)
    # the first job of a batch runs whatever its estimate; the others wait
    assert len([line for line in reports[3].maintenance if "->" in line]) == 1
    fifth = _new_keys(ap, 1, start=4)[0]  # the waiting tables are due again at once
    assert len(fifth.maintenance) == 1
    assert _names(wh) == {b * 10 + k: f"v{b}" for b in range(5) for k in range(10)}


def test_compaction_keeps_exactly_once_and_the_tombstone_index(tmp_path, file_per_batch):
    root = str(tmp_path / "wh")
    wh = DeltaWarehouse(root, pipeline_id="t")
    ap = BatchApplier(wh, maintenance=OFTEN)
    batches = [table_of(ins(k, "a", seq=1, offset=k)) for k in range(3)]
    batches.append(table_of(dele(1, seq=5, offset=3)))
    for i, b in enumerate(batches):
        ap.apply(b, i)
    tombs = DeltaTable(wh.tombstones.path)
    # the tombstones and the offsets were compacted; the index follows without a reread
    assert wh.tombstones._index.version == tombs.version()
    assert _files(wh.system_path("batches")) == 1 and _files(wh.system_path("offsets")) == 1
    # a new process: every delivery is applied already, and the delete still guards
    again = BatchApplier(DeltaWarehouse(root, pipeline_id="t"), maintenance=OFTEN)
    assert [again.apply(b, 9).replayed for b in batches] == [1, 1, 1, 1]
    again.apply(table_of(ins(1, "late", seq=2, offset=4)), 10)
    assert _names(wh) == {0: "a", 2: "a"}


def test_a_merge_that_races_a_compaction_is_merged_again_never_written_twice(
    tmp_path, monkeypatch, file_per_batch
):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh, maintenance=MaintenancePolicy(enabled=False))
    _new_keys(ap, 3)
    real, calls = engines_module.rewrite_actions, []

    def then_compacted(table, *args, **kwargs):
        actions = real(table, *args, **kwargs)
        if not calls:  # another writer compacts the files this merge just read
            DeltaTable(table.table_uri).optimize.compact()
        calls.append(1)
        return actions

    monkeypatch.setattr(engines_module, "rewrite_actions", then_compacted)
    (mirror,) = ap.apply(table_of(upd(5, "updated", seq=9), upd(25, "updated", seq=9)), 3).mirrors
    assert len(calls) == 2 and mirror.metrics["merge_attempts"] == 2
    rows = wh.read(TARGET)
    assert rows.num_rows == 30  # no row twice
    assert _names(wh)[5] == _names(wh)[25] == "updated"


def test_a_merge_that_loses_every_race_stops_its_table_after_three_attempts(
    tmp_path, monkeypatch, file_per_batch
):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh, maintenance=MaintenancePolicy(enabled=False))
    _new_keys(ap, 3)
    real, calls = engines_module.rewrite_actions, []

    def always_raced(table, *args, **kwargs):
        actions = real(table, *args, **kwargs)
        other = DeltaTable(table.table_uri)  # another writer commits first, every time
        write_deltalake(other, other.to_pyarrow_table().slice(0, 0), mode="append")
        calls.append(1)
        return actions

    before = _names(wh)
    monkeypatch.setattr(engines_module, "rewrite_actions", always_raced)
    report = ap.apply(table_of(upd(5, "updated", seq=9)), 3)
    assert len(calls) == 3  # _MERGE_ATTEMPTS, then the table stops
    assert report.dead_letters == {Code.TABLE_FAULT: 1} and not report.mirrors
    assert _names(wh) == before  # nothing of the batch written, no row twice


def test_vacuum_deletes_only_what_no_version_within_retention_needs(tmp_path, file_per_batch):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh, maintenance=MaintenancePolicy(enabled=False))
    _new_keys(ap, 4)
    path = wh.table_path(TARGET)

    def parquet_on_disk() -> int:
        return sum(1 for f in os.listdir(path) if f.endswith(".parquet"))

    from cdcflow.sinks.maintenance import Maintainer

    kept = Maintainer(wh, MaintenancePolicy()).run_all([path])  # 168 h: nothing is old
    assert kept[0].files_after == 1 and kept[0].vacuumed == 0 and parquet_on_disk() == 5
    now = Maintainer(wh, MaintenancePolicy(vacuum_retention_hours=0)).run_all([path])
    assert now[0].vacuumed == 4 and parquet_on_disk() == 1
    assert len(_names(wh)) == 40


def test_cdcflow_maintain_compacts_every_table_under_the_lease(tmp_path, file_per_batch):
    config = tmp_path / "p.yaml"
    config.write_text(
        "pipeline_id: m\nwarehouse: wh\ncheckpoint: ck\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "sources: [{name: a, format: debezium-json, topics: [t]}]\n"
        "maintenance: {vacuum_retention_hours: 0}\n"
    )
    root = str(tmp_path / "wh")
    ap = BatchApplier(
        DeltaWarehouse(root, pipeline_id="m.a"), maintenance=MaintenancePolicy(enabled=False)
    )
    _new_keys(ap, 5)
    loaded = cdcflow.load_config(config)
    with PipelineLease(loaded.warehouse, loaded.pipeline_id, ttl_s=600), pytest.raises(LeaseHeld):
        cdcflow.maintain(config)
    report = cdcflow.maintain(config)
    done = {Path(t.path).name: t for t in report.tables}
    assert {"db.items", "changelog", "batches", "offsets", "progress"} <= set(done)
    assert done["db.items"].files_before == 5 and done["db.items"].files_after == 1
    table = DeltaTable(f"{root}/db.items")
    assert small_files(table, 1 << 30) == (1, 1) and table.to_pyarrow_table().num_rows == 50


def test_a_tables_own_maintenance_settings_override_the_pipelines(tmp_path, file_per_batch):
    from cdcflow.apply.options import TableRules
    from cdcflow.model import SourceTable

    other = SourceTable("test", "db", "", "other")
    rules = TableRules.of(
        [
            ("db.*", {"maintenance": {"compact_min_files": 4}}),
            ("db.other", {"maintenance": {"enabled": False}}),
        ]
    )
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    never = MaintenancePolicy(compact_min_files=1000, budget_s=60)  # the pipeline's
    ap = BatchApplier(wh, tables=rules, maintenance=never)
    for b in range(4):
        ap.apply(
            table_of(
                *(ins(b * 10 + k, "v", seq=1, offset=b * 20 + k) for k in range(10)),
                *(
                    ins(b * 10 + k, "v", seq=1, offset=b * 20 + 10 + k, table=other)
                    for k in range(10)
                ),
            ),
            b,
        )
    # db.items: its own compact_min_files (4); db.other: both rules, key by key (off)
    assert rules("db.other").maintenance.overrides() == {"compact_min_files": 4, "enabled": False}
    assert _files(wh.table_path(TARGET)) == 1
    assert _files(wh.table_path("db.other")) == 4
    assert _files(wh.system_path("changelog")) == 4  # the pipeline's 1000 for the rest
    report = cdcflow.maintain(
        _config(tmp_path, "tables: [{match: 'db.other', maintenance: {enabled: false}}]")
    )
    assert {Path(t.path).name for t in report.tables} >= {"changelog"}
    assert "db.other" not in {Path(t.path).name for t in report.tables}
    assert _files(wh.table_path("db.other")) == 4


def _config(tmp_path: Path, extra: str) -> Path:
    config = tmp_path / "p.yaml"
    config.write_text(
        "pipeline_id: t\nwarehouse: wh\ncheckpoint: ck\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "sources: [{name: a, format: debezium-json, topics: [t]}]\n" + extra + "\n"
    )
    return config


# ------------------------------------------------------------------ log retention


def _log_retention(path: str) -> str | None:
    return DeltaTable(path).metadata().configuration.get("delta.logRetentionDuration")


def _tombstone_retention(path: str) -> str | None:
    return DeltaTable(path).metadata().configuration.get("delta.deletedFileRetentionDuration")


def test_every_table_an_apply_creates_keeps_log_retention_hours_of_log(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    _new_keys(BatchApplier(wh), 1)
    made = [wh.table_path(TARGET), *(wh.system_path(n) for n in ("changelog", "batches"))]
    assert {_log_retention(p) for p in made} == {"interval 86400 seconds"}  # 24 h
    assert {_tombstone_retention(p) for p in made} == {"interval 86400 seconds"}
    other = DeltaWarehouse(str(tmp_path / "other"), pipeline_id="t")
    _new_keys(BatchApplier(other, maintenance=MaintenancePolicy(log_retention_hours=None)), 1)
    assert _log_retention(other.table_path(TARGET)) is None  # Delta's own 30 days


def test_delta_rs_drops_log_files_past_the_retention_at_a_checkpoint(tmp_path):
    """The property's value is one delta-rs reads: with a retention of one second, the
    checkpoint after version 199 removes the commit files older than that and than the
    checkpoint before it, and the table reads the same. delta-rs 1.6 keeps the log from
    the last checkpoint at or before the oldest version still within the retention, so
    versions 0-100 are made older than a second before the checkpoint at 199 (their files'
    mtimes set 10 s back: :func:`~tests.sinks.log_clock.age_log`)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    second = MaintenancePolicy(enabled=False, log_retention_hours=1 / 3600)
    _new_keys(BatchApplier(wh, maintenance=second), 1)
    path = wh.table_path(TARGET)
    assert _log_retention(path) == "interval 1 seconds"
    table = DeltaTable(path)
    row = table.to_pyarrow_table().slice(0, 1)
    for until in (101, 200):
        age_log(path, 10)  # the versions so far: past the retention (instead of a pause)
        while table.version() < until:
            write_deltalake(table, pa.Table.from_batches([], schema=row.schema), mode="append")
            table.update_incremental()
    log = sorted(os.listdir(os.path.join(path, "_delta_log")))
    assert "00000000000000000199.checkpoint.parquet" in log
    assert log[0] == "00000000000000000099.checkpoint.parquet"  # 0..98: cleaned up
    assert DeltaTable(path).to_pyarrow_table().num_rows == 10


def test_cdcflow_maintain_gives_older_tables_the_retention_and_keeps_a_set_one(
    tmp_path, file_per_batch
):
    root = str(tmp_path / "wh")
    old = MaintenancePolicy(enabled=False, log_retention_hours=None)  # as before 0.4.0
    wh = DeltaWarehouse(root, pipeline_id="t.a")
    _new_keys(BatchApplier(wh, maintenance=old), 2)
    changelog = wh.system_path("changelog")
    DeltaTable(changelog).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 30 days"}
    )
    report = cdcflow.maintain(_config(tmp_path, "maintenance: {log_retention_hours: 2}"))
    done = {Path(t.path).name: t for t in report.tables}
    assert _log_retention(wh.table_path(TARGET)) == "interval 7200 seconds"
    assert (
        done["db.items"].log_retention_hours == 2 and "log kept 2 h" in done["db.items"].describe()
    )
    assert _log_retention(changelog) == "interval 30 days"  # someone's own setting
    assert _tombstone_retention(changelog) == "interval 7200 seconds"  # what it lacked
    again = cdcflow.maintain(_config(tmp_path, "maintenance: {log_retention_hours: 2}"))
    assert all(t.log_retention_hours is None for t in again.tables)  # once in a table's life


def test_a_vacuum_retention_under_an_hour_is_rounded_up_never_down(tmp_path, file_per_batch):
    """delta-rs takes whole hours; 0.5 h must not become 0 (every removed file deleted)."""
    from cdcflow.sinks.maintenance import Maintainer

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    _new_keys(BatchApplier(wh, maintenance=MaintenancePolicy(enabled=False)), 4)
    path = wh.table_path(TARGET)
    done = Maintainer(wh, MaintenancePolicy(vacuum_retention_hours=0.5)).run_all([path])
    assert done[0].files_after == 1 and done[0].vacuumed == 0  # removed just now: kept
    assert sum(1 for f in os.listdir(path) if f.endswith(".parquet")) == 5


def test_checkpoints_carry_no_tombstone_older_than_the_retention(tmp_path, file_per_batch):
    """A mirror removes a file or two every batch; Delta's default keeps each removal in
    every checkpoint for 7 days (a week at a batch a second is about 1M tombstones)."""
    import glob
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    second = MaintenancePolicy(compact_min_files=4, budget_s=60, log_retention_hours=1 / 3600)
    _new_keys(BatchApplier(wh, maintenance=second), 4)  # compacted: 4 files removed
    path = wh.table_path(TARGET)
    assert _tombstone_retention(path) == "interval 1 seconds"
    time.sleep(1.5)
    table = DeltaTable(path)
    schema = table.to_pyarrow_table().schema
    while table.version() < 100:
        write_deltalake(table, pa.Table.from_batches([], schema=schema), mode="append")
        table.update_incremental()
    checkpoint = sorted(glob.glob(os.path.join(path, "_delta_log", "*.checkpoint.parquet")))[-1]
    assert pq.read_table(checkpoint)["remove"].drop_null().to_pylist() == []
    assert len(_names(wh)) == 40

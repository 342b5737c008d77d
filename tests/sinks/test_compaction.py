"""Size-tiered compaction (``cdcflow.sinks.compaction``): the plan's bounds (no job reads
more than the target, each byte rewritten a few times, the file count bounded over a
long stream of batches), and a job on a real Delta table (same rows, sorted by key,
statistics, ``dataChange = false``, nothing committed over another writer)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from cdcflow.sinks.compaction import DataFile, compact_once, plan, tier

MIB = 1024 * 1024


def test_tiers_grow_by_the_fanout():
    assert [tier(s, MIB, 16) for s in (1, MIB - 1, MIB, 15 * MIB, 16 * MIB, 300 * MIB)] == [
        0,
        0,
        1,
        1,
        2,
        3,
    ]


def _files(*sizes: int) -> list[DataFile]:
    return [DataFile(f"f{i}", size, i) for i, size in enumerate(sizes)]


def test_a_tier_is_compacted_from_min_files_oldest_first_within_the_target():
    assert plan(_files(*[MIB // 2] * 3), MIB, 64 * MIB, 4) == []  # 3 < 4: not due
    job = plan(_files(*[MIB // 2] * 5), MIB, 64 * MIB, 4)
    assert [f.path for f in job] == ["f0", "f1", "f2", "f3", "f4"]
    # a tier of 3 MiB files with a 10 MiB target: the three oldest that fit
    job = plan(_files(*[3 * MIB] * 6), MIB, 10 * MIB, 4)
    assert [f.path for f in job] == ["f0", "f1", "f2"]
    # files over half the target are done: never planned, never counted
    assert plan(_files(*[40 * MIB] * 20), MIB, 64 * MIB, 4) == []


def test_over_a_long_stream_the_files_stay_bounded_and_each_byte_is_rewritten_a_few_times():
    """1 MB a batch for 20,000 batches (a changelog at about 20k changes/s), one job at
    most per batch, as the maintainer runs it."""
    small, target, fanout = MIB, 64 * MIB, 16
    files: list[DataFile] = []
    written = rewritten = largest_job = most_files = 0
    for batch in range(20_000):
        files.append(DataFile(f"b{batch}", 1_100_000, batch))
        written += 1_100_000
        job = plan(files, small, target, fanout)
        if job:
            size = sum(f.size_bytes for f in job)
            largest_job = max(largest_job, size)
            rewritten += size
            done = {f.path for f in job}
            files = [f for f in files if f.path not in done] + [DataFile(f"c{batch}", size, batch)]
        live = [f for f in files if f.size_bytes * 2 <= target]  # what is not done yet
        most_files = max(most_files, len(live))
    assert largest_job <= target
    assert rewritten / written < 3  # write amplification: a few rewrites per byte
    assert most_files <= 3 * fanout  # at most min_files per tier, a few tiers
    assert sum(f.size_bytes for f in files) == written  # no byte lost or doubled


def _table(tmp_path: Path, batches: int, rows: int = 10) -> DeltaTable:
    """A mirror-like table (``id`` NOT NULL) of one file per batch, keys not in file
    order."""
    path = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string())])
    for b in range(batches):
        ids = [(b * 7 + k * 13) % (batches * rows) for k in range(rows)]
        data = pa.table({"id": ids, "name": [f"v{b}"] * rows}, schema=schema)
        write_deltalake(path, data, mode="append")
    return DeltaTable(path)


def _log_actions(table: DeltaTable, version: int) -> list[dict]:
    log = Path(table.table_uri.removeprefix("file://")) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_job_merges_the_files_with_the_same_rows_sorted_by_key(tmp_path):
    table = _table(tmp_path, 6)
    order = [("id", "ascending"), ("name", "ascending")]
    before = table.to_pyarrow_table().sort_by(order)
    metrics = compact_once(table, MIB, 64 * MIB, 4, sort_by_key=True)
    assert metrics["numFilesRemoved"] == 6 and metrics["numFilesAdded"] == 1
    assert not metrics["more"]
    after = DeltaTable(table.table_uri)
    assert after.version() == table.version() + 1
    assert after.to_pyarrow_table().sort_by(order).equals(before)
    (add,) = pa.table(after.get_add_actions(flatten=True)).to_pylist()
    ids = after.to_pyarrow_table()["id"].to_pylist()
    assert ids == sorted(ids)  # one file, in key order
    assert add["min.id"] == min(ids) and add["max.id"] == max(ids)  # statistics
    actions = _log_actions(after, after.version())
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 7 and not any(c["dataChange"] for c in changes)
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info.get("cdcflow.operation") == "compaction"


def test_a_job_commits_nothing_over_another_writers_commit(tmp_path):
    table = _table(tmp_path, 6)
    write_deltalake(table.table_uri, table.to_pyarrow_table().slice(0, 1), mode="append")
    rows = DeltaTable(table.table_uri).to_pyarrow_table().num_rows
    with pytest.raises(CommitFailedError):
        compact_once(table, MIB, 64 * MIB, 4, sort_by_key=True)  # its handle is behind
    again = DeltaTable(table.table_uri)
    assert again.to_pyarrow_table().num_rows == rows and len(again.file_uris()) == 7


def test_no_job_when_no_tier_is_due(tmp_path):
    table = _table(tmp_path, 3)
    assert compact_once(table, MIB, 64 * MIB, 4, sort_by_key=True)["numFilesRemoved"] == 0
    assert DeltaTable(table.table_uri).version() == table.version()

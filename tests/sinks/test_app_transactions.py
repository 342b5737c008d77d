"""Application transaction versions read from the commits since the last ask
(cdcflow.sinks.app_transactions), held against delta-rs's own replay of the log after
every commit of a real table: the pipeline's own commits, another application's, a
commit without a transaction (a compaction), and more commits than are read one by one."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from cdcflow.sinks.app_transactions import MAX_COMMITS_READ, AppTransactions


class _Counting(DeltaTable):
    """A real table handle that counts delta-rs's log replays for a transaction version."""

    replays = 0

    def transaction_version(self, app_id: str) -> int | None:
        type(self).replays += 1
        return super().transaction_version(app_id)


def _commit(path: str, version: int | None = None, app: str = "cdcflow-p", options=None) -> None:
    txns = [] if version is None else [Transaction(app, version)]
    write_deltalake(
        path,
        pa.table({"id": [1]}),
        mode="append",
        commit_properties=CommitProperties(app_transactions=txns),
        storage_options=options,
    )


@pytest.mark.parametrize("where", ["local", pytest.param("moto", marks=pytest.mark.services)])
def test_versions_equal_delta_rs_replay_after_every_kind_of_commit(where, tmp_path, request):
    options = None
    path = str(tmp_path / "t")
    if where == "moto":
        store = request.getfixturevalue("moto_s3")
        options, path = store.storage_options(), store.warehouse_uri("t")
    _commit(path, 0, options=options)
    known = AppTransactions(options)
    table = _Counting(path, storage_options=options)
    _Counting.replays = 0

    def check(expected_replays: int) -> None:
        table.update_incremental()
        for app in ("cdcflow-p", "other"):
            truth = DeltaTable(path, storage_options=options).transaction_version(app)
            assert known.version(path, table, app) == truth, (app, table.version())
        assert _Counting.replays == expected_replays

    check(2)  # the first ask of each application replays the log
    _commit(path, 1, options=options)  # the pipeline's own next apply
    check(2)
    _commit(path, 5, app="other", options=options)  # another application
    check(2)
    _commit(path, None, options=options)  # a commit without a transaction
    _commit(path, 2, options=options)
    check(2)
    for batch in range(3, 3 + MAX_COMMITS_READ):  # too many to read one by one
        _commit(path, batch, options=options)
    check(4)
    known.forget(path)
    check(6)
    assert known.version(path, table, "cdcflow-p") == 2 + MAX_COMMITS_READ


def test_a_commit_cdcflow_made_itself_is_not_read_back(tmp_path):
    """Told of its own commit, the cache reads no commit file when the table moved by
    exactly that one: the commit file is altered afterwards to show it was not read; a
    second commit by another writer makes it read the files again."""
    import os

    path = str(tmp_path / "t")
    _commit(path, 0)
    known = AppTransactions()
    table = DeltaTable(path)
    assert known.version(path, table, "cdcflow-p") == 0
    on_version = table.version()
    _commit(path, 1)
    known.committed(f"file://{path}", on_version, {"cdcflow-p": 1, "offsets": 7})
    log = os.path.join(path, "_delta_log", f"{on_version + 1:020d}.json")
    with open(log, "rb") as f:
        text = f.read()
    with open(log, "wb") as f:
        f.write(text.replace(b'"version":1', b'"version":999'))
    table.update_incremental()
    assert known.version(path, table, "cdcflow-p") == 1  # told, not read
    assert known.version(path, table, "offsets") == 7

    _commit(path, 2)
    _commit(path, 3, app="other")  # not told: two versions on, both are read
    table.update_incremental()
    assert known.version(path, table, "cdcflow-p") == 2
    assert known.version(path, table, "other") == 3

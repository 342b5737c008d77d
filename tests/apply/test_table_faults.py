"""Faults confined to one table (issue 8, items 2, 3 and 6; decision 25).

Real Delta tables, damaged the way operators find them: a last commit file cut in half,
a folder the pipeline's user cannot read, a full volume (a real tmpfs, when this process
may mount one), a table whose apply overruns its time budget.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import pathlib
import shutil
import subprocess

import orjson
import pytest
from tests.apply.helpers import dele, ins, table_of, upd
from tests.volumes import fill, tmpfs, truncate_last_commit

from cdcflow.apply.batch import BatchApplier
from cdcflow.errors import Code, StorageError
from cdcflow.model import SourceTable
from cdcflow.sinks.faults import storage_error
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

ITEMS = "db.items"
OTHER = SourceTable("test", "db", "", "things")
THINGS = "db.things"
NOBODY = 65534


def _setup(root: pathlib.Path, **kw) -> tuple[DeltaWarehouse, BatchApplier]:
    wh = DeltaWarehouse(str(root), pipeline_id="faults")
    return wh, BatchApplier(wh, **kw)


def _ids(wh: DeltaWarehouse, target: str) -> dict[int, str]:
    return mirror_by_key(wh.read(target), column="name")


def _system(wh: DeltaWarehouse, name: str):
    return wh.read(name, system=True)


def _stops(wh: DeltaWarehouse) -> list[dict]:
    if wh.open(wh.system_path("schema_changes")) is None:
        return []
    return [r for r in _system(wh, "schema_changes").to_pylist() if r["change"] == "stop"]


def test_a_truncated_log_stops_that_table_and_the_others_go_on(tmp_path):
    wh, ap = _setup(tmp_path / "wh")
    ap.apply(table_of(ins(1, "a", seq=1), ins(1, "x", seq=1, table=OTHER)), 0)
    last, whole = truncate_last_commit(wh.table_path(ITEMS))

    hit = upd(1, "b", seq=2, partition=3, offset=500)
    report = ap.apply(table_of(hit, ins(2, "y", seq=2, table=OTHER)), 1)

    assert report.dead_letters[Code.TABLE_FAULT] == 1
    assert _ids(wh, THINGS) == {1: "x", 2: "y"}  # the other table went on
    (stop,) = _stops(wh)
    assert stop["target_table"] == ITEMS and stop["offset"] == 500 and stop["partition"] == 3
    assert wh.table_path(ITEMS) in stop["message"]
    assert "Truncated record" in stop["message"] and "cdcflow resume" in stop["message"]
    assert "\n" not in stop["message"]
    dead = _system(wh, "dead_letters").to_pylist()
    (letter,) = [d for d in dead if d["code"] == Code.TABLE_FAULT]
    assert (letter["partition"], letter["offset"], letter["target_table"]) == (3, 500, ITEMS)
    assert orjson.loads(orjson.loads(letter["raw_value"])["after"])["name"] == "b"

    # later batches: the stopped table's events are dead letters, the other table applies
    report = ap.apply(table_of(ins(3, "c", seq=3), dele(1, seq=3, table=OTHER)), 2)
    assert report.dead_letters[Code.TABLE_STOPPED] == 1
    assert _ids(wh, THINGS) == {2: "y"}

    # the way out the message names: repair the log, resume; the table applies again
    last.write_bytes(whole)
    wh.resume_table(ITEMS, by="test")
    ap.apply(table_of(ins(4, "d", seq=4)), 3)
    assert _ids(wh, ITEMS) == {1: "a", 4: "d"}  # the dead-lettered b and c stay dead letters
    assert set(_system(wh, "batches")["batch_id"].to_pylist()) == {0, 1, 2, 3}


@contextlib.contextmanager
def _as_user_without_rights_to(path: str):
    """Run the block as a user the folder ``path`` refuses (``nobody`` when root, since
    root reads every file; the process's own user otherwise)."""
    os.chmod(path, 0)
    root = os.geteuid() == 0
    groups = os.getgroups()
    try:
        if root:
            os.setgroups([])
            os.setegid(NOBODY)
            os.seteuid(NOBODY)
        yield
    finally:
        if root:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups(groups)
        os.chmod(path, 0o755)


def test_permission_denied_on_one_mirror_stops_that_table_alone(tmp_path, tmp_path_factory):
    base = tmp_path / "open"
    base.mkdir(mode=0o777)
    os.chmod(tmp_path, 0o755)  # pytest's base folder is 0700: let `nobody` reach ours
    # every folder of pytest's between: pytest-of-root/, pytest-N/ (popen-gwK/ under xdist)
    top = tmp_path_factory.getbasetemp()
    while top.name != f"pytest-of-{getpass.getuser()}" and top != top.parent:
        top = top.parent
    for parent in tmp_path.parents:
        if parent == top.parent:
            break
        with contextlib.suppress(PermissionError):
            os.chmod(parent, os.stat(parent).st_mode | 0o005)
    wh, ap = _setup(base / "wh")
    ap.apply(table_of(ins(1, "a", seq=1), ins(1, "x", seq=1, table=OTHER)), 0)
    subprocess.run(["chmod", "-R", "a+rwX", str(base)], check=True)
    items = wh.table_path(ITEMS)

    with _as_user_without_rights_to(items):
        report = ap.apply(table_of(upd(1, "b", seq=2), ins(2, "y", seq=2, table=OTHER)), 1)

    assert report.dead_letters[Code.TABLE_FAULT] == 1
    assert _ids(wh, THINGS) == {1: "x", 2: "y"}
    assert _ids(wh, ITEMS) == {1: "a"}
    (stop,) = _stops(wh)
    assert items in stop["message"] and "read and write access" in stop["message"]


def test_a_damaged_system_table_stops_the_run_with_one_line(tmp_path):
    wh, ap = _setup(tmp_path / "wh")
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    truncate_last_commit(wh.system_path("changelog"))
    with pytest.raises(StorageError) as caught:
        ap.apply(table_of(ins(2, "b", seq=2)), 1)
    err = caught.value
    assert err.kind == "damaged" and err.target is None
    assert str(err).startswith("[STORAGE_ERROR] ") and "\n" not in str(err)
    assert wh.system_path("changelog") in str(err)


def test_a_table_over_its_time_budget_is_stopped_after_its_batch(tmp_path):
    wh, ap = _setup(tmp_path / "wh", table_budget_s=1e-9)
    report = ap.apply(table_of(ins(1, "a", seq=1)), 0)
    assert report.dead_letters == {}  # the slow batch itself is applied
    assert _ids(wh, ITEMS) == {1: "a"}
    (stop,) = _stops(wh)
    assert "apply.table_budget_s" in stop["message"]
    report = ap.apply(table_of(ins(2, "b", seq=2)), 1)
    assert report.dead_letters[Code.TABLE_STOPPED] == 1
    assert _ids(wh, ITEMS) == {1: "a"}


def test_without_a_budget_no_table_is_stopped(tmp_path):
    wh, ap = _setup(tmp_path / "wh", table_budget_s=0)
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    ap.apply(table_of(ins(2, "b", seq=2)), 1)
    assert _ids(wh, ITEMS) == {1: "a", 2: "b"}
    assert _stops(wh) == []


def test_a_full_disk_stops_the_run_with_one_line_and_loses_nothing(tmp_path):
    with tmpfs(tmp_path / "volume", "8m") as volume:
        wh, ap = _setup(volume / "wh")
        ap.apply(table_of(ins(1, "a", seq=1), ins(1, "x", seq=1, table=OTHER)), 0)
        filler = fill(volume)
        batch = table_of(upd(1, "b", seq=2), ins(2, "y", seq=2, table=OTHER))
        with pytest.raises(StorageError) as caught:
            ap.apply(batch, 1)
        err = caught.value
        assert err.kind == "full" and "No space left on device" in str(err)
        assert "\n" not in str(err) and str(wh.root) in str(err) and "free space" in str(err)

        # space freed, the same delivery again (Spark replays the failed micro-batch)
        filler.unlink()
        wh2, ap2 = _setup(volume / "wh")
        ap2.apply(batch, 1)
        assert _ids(wh2, ITEMS) == {1: "b"} and _ids(wh2, THINGS) == {1: "x", 2: "y"}
        assert _stops(wh2) == []
        offsets = _system(wh2, "batches")
        assert offsets.num_rows == 2  # each apply completed once
        changelog = _system(wh2, "changelog")
        assert changelog.num_rows == 4  # every event once
        shutil.rmtree(volume / "wh", ignore_errors=True)


# --------------------------------------------------------------------------- messages

# first lines of errors delta-rs 1.x raised on this machine (see the tests above)
TRUNCATED = "Kernel error: Json error: Truncated record whilst reading string\n   0: <unknown>"
FULL = (
    "Failed to parse parquet: External: Generic LocalFileSystem error: Unable to copy data "
    "to file: No space left on device (os error 28)"
)
DENIED = (
    "Failed to parse parquet: External: Generic LocalFileSystem error: Unable to open file "
    "/w/t/part-0.parquet#1: Permission denied (os error 13)"
)


@pytest.mark.parametrize(
    ("text", "kind", "fix"),
    [
        (TRUNCATED, "damaged", "_delta_log) is damaged"),
        (FULL, "full", "free space on the volume"),
        (DENIED, "permission", "read and write access"),
        ("Read-only file system (os error 30)", "read_only", "make /w/t writable"),
        ("something else entirely", "other", "see the log"),
    ],
)
def test_storage_errors_name_the_table_the_path_the_cause_and_the_fix(text, kind, fix):
    err = storage_error(RuntimeError(text), "/w/t", "db.t")
    assert err.kind == kind and err.code == Code.STORAGE_ERROR
    first = text.splitlines()[0].removeprefix("Kernel error: ")
    assert err.message.startswith(f"table db.t (/w/t): {first}. Fix: ")
    assert fix in err.message and "\n" not in err.message


def test_the_causes_object_store_chains_are_folded_into_the_one_line():
    text = (
        "Generic LocalFileSystem error\n          \x1b[31m↳\x1b[0m Unable to copy data to file"
        "\n           \x1b[31m↳\x1b[0m No space left on device (os error 28)\n\n"
    )
    err = storage_error(OSError(text), "/w/_cdcflow/leases/p")
    assert err.kind == "full" and err.target is None
    assert err.cause == (
        "Generic LocalFileSystem error: Unable to copy data to file: "
        "No space left on device (os error 28)"
    )


def test_an_unreadable_folder_without_an_os_error_is_named_a_permission_fault(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    with _as_user_without_rights_to(str(folder)):
        err = storage_error(OSError("Kernel error -> Generic LocalFileSystem error"), str(folder))
    assert err.kind == "permission"


def test_a_fence_that_fails_before_the_completion_leaves_the_apply_pending(tmp_path):
    """`cdcflow run` fences each apply on its lease: a run that lost it stops before the
    completion commit, and the apply is finished by whoever holds the lease next."""
    from cdcflow.errors import LeaseLost

    calls = {"n": 0}

    def fence() -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the apply's first check passes, the one before completion not
            raise LeaseLost("taken over")

    wh, ap = _setup(tmp_path / "wh", fence=fence)
    batch = table_of(ins(1, "a", seq=1))
    with pytest.raises(LeaseLost):
        ap.apply(batch, 0)
    assert wh.open(wh.system_path("batches")) is None  # not completed
    assert ap.ledger.pending() is not None
    wh2, ap2 = _setup(tmp_path / "wh")
    ap2.apply(batch, 0)
    assert _ids(wh2, ITEMS) == {1: "a"}
    assert ap2.ledger.pending() is None

"""``BatchApplier``, the script of one apply's ordered writes: the offsets record first,
then the per-table applies, then the bookkeeping (dead letters, progress, the completion).
Real delta-rs tables in a temp folder, read back with ``deltalake``."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from tests.apply.helpers import dele, ev, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.decode.batches import flatten
from cdcflow.errors import Code
from cdcflow.formats.base import DecodeResult, Skipped
from cdcflow.model import DeadLetter, Op, Origin, SourceTable
from cdcflow.sinks.mirror import Mirrors
from cdcflow.sinks.system_tables import DEAD_LETTER_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

OTHER = SourceTable("test", "db", "", "other")


class RecordingWarehouse(DeltaWarehouse):
    """A real warehouse that notes the order of the apply's writes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[str] = []

    def append(self, path, data, commit):
        written = super().append(path, data, commit)
        if written:
            self.writes.append(path.rsplit("/", 1)[-1])
        return written


class RecordingMirrors(Mirrors):
    """The mirrors of a :class:`RecordingWarehouse`, noting each mirror's apply."""

    def apply(self, target, *args, **kwargs):
        result = super().apply(target, *args, **kwargs)
        self.warehouse.writes.append(target)
        return result


def _batch() -> pa.Table:
    """Offsets 0..5 of partition 0: two tables, a value that does not fit a stored column
    (offset 2, after the table exists), a skipped record and a decode dead letter."""
    result = DecodeResult(
        events=[
            ins(1, "a", seq=1, offset=0),
            ins(7, "x", seq=1, table=OTHER, offset=1),
            ev(Op.UPDATE, 5, after={"id": 5, "name": "e", "qty": "NaN?"}, seq=2, offset=2),
            upd(1, "b", seq=3, offset=3),
        ],
        skipped=[Skipped("TOMBSTONE", Origin("t", 0, 4))],
        dead_letters=[
            DeadLetter("BAD_JSON", "not JSON", "test", Origin("t", 0, 5), b"{oops", b"k")
        ],
    )
    return pa.Table.from_batches([flatten(result)])


def _rows(wh, target):
    return mirror_by_key(wh.read(target), column="name")


def test_the_offsets_record_comes_first_then_the_tables_then_the_bookkeeping(tmp_path):
    wh = RecordingWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh)
    ap.table_applier.mirrors = RecordingMirrors(wh)
    ap.apply(table_of(ins(5, "seed", seq=0, offset=100, partition=1)), delivery_id=0)
    wh.writes.clear()
    report = ap.apply(_batch(), delivery_id=1)
    # the two tables are applied at once (apply.parallel_tables), in either order
    assert wh.writes[:2] == ["offsets", "changelog"]
    assert sorted(wh.writes[2:4]) == ["db.items", "db.other"]
    assert wh.writes[4:] == ["dead_letters", "progress", "batches"]
    assert report.batch_id == 1 and report.records == 6 and report.events == 4
    assert report.skipped == {"TOMBSTONE": 1}
    assert report.dead_letters == {"BAD_JSON": 1, Code.TYPE_CONFLICT: 1}
    assert _rows(wh, "db.items") == {1: "b", 5: "seed"} and _rows(wh, "db.other") == {7: "x"}
    # every table the apply wrote carries its application transaction and offset ranges
    root = tmp_path / "wh"
    for path in ("_cdcflow/offsets", "_cdcflow/changelog", "db.items", "db.other"):
        table = DeltaTable(str(root / path))
        assert table.transaction_version("cdcflow-test") == 1, path
    last = DeltaTable(str(root / "db.items")).history(1)[0]
    assert last["cdcflow.apply_id"] == "1" and last["cdcflow.offsets"] == "t#0:0-5"
    # the completion carries the next offset of each partition
    batches = DeltaTable(str(root / "_cdcflow/batches"))
    assert batches.transaction_version("cdcflow-test") == 1
    assert batches.transaction_version("cdcflow-test@t#0") == 6
    assert batches.transaction_version("cdcflow-test@t#1") == 101
    rows = [r for r in batches.to_pyarrow_table().to_pylist() if r["batch_id"] == 1]
    assert [
        (r["first_offset"], r["last_offset"], r["records"], r["skipped"], r["dead_letters"])
        for r in rows
    ] == [(0, 5, 6, 1, 1)]
    assert rows[0]["delivery_id"] == 1 and rows[0]["source"] == "test"


def test_decode_and_apply_dead_letters_are_built_alike_and_written_once(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(5, "seed", seq=0, offset=100, partition=1)))
    ap.apply(_batch())
    dead = DeltaTable(str(tmp_path / "wh" / "_cdcflow" / "dead_letters")).to_pyarrow_table()
    assert pa.schema(dead.schema).names == DEAD_LETTER_SCHEMA.names
    by_stage = {r["stage"]: r for r in dead.to_pylist()}
    decode, apply = by_stage["decode"], by_stage["apply"]
    assert (decode["code"], decode["offset"], decode["raw_value"], decode["raw_key"]) == (
        "BAD_JSON",
        5,
        b"{oops",
        b"k",
    )
    assert decode["target_table"] is None and decode["message"] == "not JSON"
    assert (apply["code"], apply["offset"], apply["target_table"]) == (
        Code.TYPE_CONFLICT,
        2,
        "db.items",
    )
    assert apply["raw_key"] is None and "qty" in apply["message"]
    event = orjson.loads(apply["raw_value"])
    assert event["op"] == "update" and orjson.loads(event["after"])["qty"] == "NaN?"


def test_a_failed_table_is_dead_lettered_whole_and_the_others_go_on(tmp_path, monkeypatch):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh)
    real = Mirrors.apply

    def refuse_items(self, target, *args, **kwargs):
        if target == "db.items":
            raise PermissionError(13, "Permission denied")
        return real(self, target, *args, **kwargs)

    monkeypatch.setattr(Mirrors, "apply", refuse_items)
    report = ap.apply(table_of(ins(1, "a", seq=1), ins(7, "x", seq=1, table=OTHER)))
    assert report.dead_letters == {Code.TABLE_FAULT: 1}
    assert _rows(wh, "db.other") == {7: "x"}
    stops = wh.read("schema_changes", system=True).to_pylist()
    assert [(r["target_table"], r["change"], r["applied"]) for r in stops] == [
        ("db.items", "stop", False)
    ]
    monkeypatch.setattr(Mirrors, "apply", real)
    report = ap.apply(table_of(ins(2, "b", seq=2)))
    assert report.dead_letters == {Code.TABLE_STOPPED: 1}
    wh.resume_table("db.items", by="test")
    ap.apply(table_of(ins(3, "c", seq=3)))
    assert _rows(wh, "db.items") == {3: "c"}


def test_a_replayed_delivery_writes_nothing_again(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    events = _batch()
    BatchApplier(wh).apply(events, delivery_id=0)
    root = tmp_path / "wh"
    paths = [root / "db.items", root / "db.other", *sorted((root / "_cdcflow").iterdir())]
    versions = {p.name: DeltaTable(str(p)).version() for p in paths}
    again = BatchApplier(DeltaWarehouse(str(root), pipeline_id="test")).apply(events, 5)
    assert again.replayed == 6 and again.records == 0 and again.batch_id == 0
    assert {p.name: DeltaTable(str(p)).version() for p in paths} == versions


def test_an_apply_cut_after_its_tables_is_finished_under_its_own_id(tmp_path, monkeypatch):
    """A crash after the tables, before the completion: the next run applies the same
    records as the same apply; the tables skip it, the bookkeeping is written once."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    events = table_of(ins(1, "a", seq=1, offset=0), ins(7, "x", seq=1, table=OTHER, offset=1))

    class Crash(Exception):
        pass

    real = DeltaWarehouse.append

    def crash_at_progress(self, path, data, commit):
        if path.endswith("/progress"):
            raise Crash
        return real(self, path, data, commit)

    monkeypatch.setattr(DeltaWarehouse, "append", crash_at_progress)
    with pytest.raises(Crash):
        BatchApplier(wh).apply(events, delivery_id=0)
    monkeypatch.setattr(DeltaWarehouse, "append", real)
    wh2 = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh2)
    assert ap.ledger.pending() is not None and ap.ledger.completed_id() == -1
    report = ap.apply(events, delivery_id=1)
    assert report.batch_id == 0
    assert all(m.skipped_replay for m in report.mirrors)
    changelog = wh2.read("changelog", system=True)
    assert sorted(changelog["offset"].to_pylist()) == [0, 1]  # each event once
    assert wh2.read("batches", system=True).num_rows == 1
    assert ap.ledger.pending() is None and ap.ledger.completed_id() == 0


def _name_b(seq: int):
    """A partial update of key 1 that sets only ``name`` (SharePlex, Qlik ``columnMask``)."""
    return ev(Op.UPDATE, 1, after={"id": 1, "name": "B"}, seq=seq, offset=90 + seq)


#: (stored before, the changes, the mirror every cut of the changes gives)
_LATE_BEFORE_A_PARTIAL = {
    # the late full update at seq 3 is older than the stored row (seq 10): ignored alone
    "late-full-image": (
        [ins(1, "A", qty=5, seq=10, offset=0)],
        [upd(1, "X", qty=3, seq=3, offset=1), _name_b(12)],
        {1: {"id": 1, "name": "B", "qty": 5}},
    ),
    # the late delete at seq 3 removes nothing alone, so it NULLs no column either
    "late-delete": (
        [ins(1, "A", qty=5, seq=10, offset=0)],
        [dele(1, seq=3, offset=1), _name_b(12)],
        {1: {"id": 1, "name": "B", "qty": 5}},
    ),
    # a late change between the stored row and the partial one counts, in any cut
    "newer-than-stored": (
        [ins(1, "A", qty=5, seq=10, offset=0)],
        [upd(1, "X", qty=3, seq=11, offset=1), _name_b(12)],
        {1: {"id": 1, "name": "B", "qty": 3}},
    ),
    # key 1 deleted at seq 10: the late update (or insert) at seq 3 is dropped by the
    # tombstone alone, so the partial update finds no row to complete, in any cut: a
    # MISSING_OLD_ROW dead letter (once qty 3, or NULL, in one batch)
    "behind-a-tombstone": (
        [ins(1, "A", qty=5, seq=1, offset=0), dele(1, seq=10, offset=2)],
        [upd(1, "X", qty=3, seq=3, offset=3), _name_b(12)],
        {},
    ),
    "insert-behind-a-tombstone": (
        [ins(1, "A", qty=5, seq=1, offset=0), dele(1, seq=10, offset=2)],
        [ins(1, "X", qty=3, seq=3, offset=3), _name_b(12)],
        {},
    ),
}


@pytest.mark.parametrize("engine", ["arrow", "delta-rs"])
@pytest.mark.parametrize("case", sorted(_LATE_BEFORE_A_PARTIAL))
def test_a_late_image_in_the_batch_of_a_partial_update_changes_nothing(tmp_path, case, engine):
    """Stored: key 1 at seq 10 (qty 5). A late full update at seq 3 (qty 3, older than
    the stored row: ignored on its own) and a partial update at seq 12 that sets only
    ``name``: the source's row is name B, qty 5, applied in two batches or in one (the
    late image once gave qty 3 in one batch). Likewise a late delete, and the tombstone's
    guard; a change newer than the stored row counts in every cut. Both merge engines."""
    stored, changes, expected = _LATE_BEFORE_A_PARTIAL[case]
    mirrors = []
    for cut in ([1, 2], [2]):  # the two changes in two batches, then in one
        wh = DeltaWarehouse(str(tmp_path / f"wh{len(cut)}"), pipeline_id="t", merge_engine=engine)
        ap = BatchApplier(wh)
        for i, event in enumerate(stored):
            ap.apply(table_of(event), i)
        start = len(stored)
        if len(cut) == 2:
            ap.apply(table_of(changes[0]), start)
            ap.apply(table_of(changes[1]), start + 1)
        else:
            ap.apply(table_of(*changes), start)
        mirrors.append(mirror_by_key(wh.read("db.items")))
    assert mirrors[0] == expected  # two batches
    assert mirrors[1] == mirrors[0]  # one batch


def _move(old: int, new: int, seq: int, **kw):
    """SharePlex ``UPDATE ... SET id = new WHERE id = old``: only the key column, before
    and after (the message carries the changed columns alone)."""
    return ev(Op.UPDATE, new, before={"id": old}, after={"id": new}, seq=seq, **kw)


def test_a_partial_change_after_a_partial_key_move_in_its_batch_keeps_the_old_rows_columns(
    tmp_path,
):
    """Stored: key 2 (name a, qty 7). One batch: key 2 moved to 4 (only ``id``), then key
    4's name set to b (only ``name``): row 4 is (b, 7), its qty from the old row."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(2, "a", qty=7, seq=1)), 0)
    name_b = ev(Op.UPDATE, 4, after={"id": 4, "name": "b"}, seq=3)
    assert not ap.apply(table_of(_move(2, 4, seq=2), name_b), 1).dead_letters
    assert mirror_by_key(wh.read("db.items")) == {4: {"id": 4, "name": "b", "qty": 7}}


def test_a_partial_key_move_before_its_old_row_arrives_is_a_dead_letter_not_a_wrong_row(
    tmp_path,
):
    """SharePlex ``UPDATE SET id = 4 WHERE id = 2`` carries only ``id``. Its message (keyed
    by the new key, another partition) comes before ``INSERT 2`` (seq 1): the mirror does
    not hold row 2, so the moved row's name and qty are unknown. The move is a
    ``MISSING_OLD_ROW`` dead letter (once a row 4 with NULL name and qty), its delete of
    key 2 stands (the late insert is dropped), and a later partial change of 4 is a dead
    letter too; a copy of the move delivered again is dropped, no new dead letter."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(9, "other", seq=0, offset=0)), 0)
    report = ap.apply(table_of(_move(2, 4, seq=2, offset=10)), 1)
    assert dict(report.dead_letters) == {Code.MISSING_OLD_ROW: 1}
    letters = wh.read("dead_letters", system=True).to_pylist()
    assert [(d["stage"], d["code"], d["target_table"]) for d in letters] == [
        ("apply", Code.MISSING_OLD_ROW, "db.items")
    ]
    assert orjson.loads(letters[0]["raw_value"])["key"] == '{"id":4}'
    assert 'key {"id":2}' in letters[0]["message"]
    late_insert = ins(2, "a", qty=7, seq=1, partition=1, offset=0)
    assert ap.apply(table_of(late_insert), 2).dead_letters == {}
    name_b = ev(Op.UPDATE, 4, after={"id": 4, "name": "b"}, seq=3, offset=11)
    assert dict(ap.apply(table_of(name_b), 3).dead_letters) == {Code.MISSING_OLD_ROW: 1}
    copy = _move(2, 4, seq=2, offset=12)  # the producer published it twice
    assert ap.apply(table_of(copy), 4).dead_letters == {}
    assert set(mirror_by_key(wh.read("db.items"))) == {9}  # no row 2, no wrong row 4


def test_a_partial_image_of_a_deleted_key_is_merged_over_its_row_once_it_is_back(tmp_path):
    """Key 1 deleted (a tombstone), inserted again, then a partial change: merged over the
    stored row (its qty kept), no dead letter."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(1, "a", qty=7, seq=1, offset=0), dele(1, seq=2, offset=1)), 0)
    ap.apply(table_of(ins(1, "c", qty=8, seq=3, offset=2)), 1)
    name_b = ev(Op.UPDATE, 1, after={"id": 1, "name": "b"}, seq=4, offset=3)
    assert not ap.apply(table_of(name_b), 2).dead_letters
    assert mirror_by_key(wh.read("db.items")) == {1: {"id": 1, "name": "b", "qty": 8}}

"""The Delta apply: real Delta tables in a temp folder, read back with deltalake. The
tests of the mirror merge run with both sinks: delta-rs on the driver, and Delta Lake's
Spark commands (``sink: delta-spark``) on the shared local Spark session."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from tests.apply.helpers import dele, ev, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.decode.batches import flatten
from cdcflow.formats.base import DecodeResult, Skipped
from cdcflow.model import ChangeEvent, DeadLetter, Op, Origin, SourceTable
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

TARGET = "db.items"


def _wh(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    return wh, BatchApplier(wh)


@pytest.fixture
def make_wh(warehouse_factory):
    """``make_wh(tmp_path) -> (warehouse, applier)`` for each sink."""

    def make(tmp_path):
        wh = warehouse_factory(tmp_path / "wh")
        return wh, BatchApplier(wh)

    return make


def _state(wh, target=TARGET):
    return mirror_by_key(wh.read(target))


def test_insert_update_delete_mirror_the_source(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=2), ins(3, "c", seq=3)), 0)
    ap.apply(table_of(upd(1, "a2", qty=5, seq=4), dele(2, seq=5)), 1)
    assert _state(wh) == {1: {"id": 1, "name": "a2", "qty": 5}, 3: {"id": 3, "name": "c", "qty": 1}}
    schema = DeltaTable(wh.table_path(TARGET)).schema().to_arrow()
    assert schema.field("id").type == pa.int64() and not schema.field("id").nullable


def test_replayed_batch_changes_nothing(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    batch = table_of(ins(1, "a", seq=1))
    ap.apply(batch, 0)
    ap.apply(table_of(upd(1, "b", seq=2)), 1)
    versions = {
        p: DeltaTable(p).version() for p in (wh.table_path(TARGET), wh.system_path("changelog"))
    }
    report = ap.apply(batch, 0)  # the crash-replay of batch 0 after batch 1 committed
    assert report.replayed == 1 and report.records == 0 and not report.mirrors
    assert {p: DeltaTable(p).version() for p in versions} == versions
    again = ap.apply(batch, 7)  # the same records under another micro-batch id (a lost checkpoint)
    assert again.replayed == 1 and again.records == 0
    assert _state(wh)[1]["name"] == "b"
    assert wh.read("changelog", system=True).num_rows == 2


def test_an_older_event_in_a_later_batch_never_overwrites(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    ap.apply(table_of(ins(1, "new", seq=10)), 0)
    ap.apply(table_of(upd(1, "old", seq=5)), 1)
    assert _state(wh)[1]["name"] == "new"


def test_a_replayed_delete_never_lets_the_row_come_back(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    ap.apply(table_of(dele(1, seq=2)), 1)
    # at-least-once delivery replays the insert (and the delete) later
    report = ap.apply(table_of(ins(1, "a", seq=1), dele(1, seq=2)), 2)
    ap.apply(table_of(ins(1, "a", seq=1)), 3)
    assert _state(wh) == {}
    assert report.mirrors[0].dropped_by_guard == 0  # the delete itself passes; nothing to delete
    # a genuinely newer insert does bring it back
    ap.apply(table_of(ins(1, "again", seq=3)), 4)
    assert _state(wh)[1]["name"] == "again"


def test_truncate_removes_only_what_was_there_before_it(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=2)), 0)
    ap.apply(table_of(ev(Op.TRUNCATE, seq=3), ins(3, "c", seq=4)), 1)
    assert set(_state(wh)) == {3}
    ap.apply(table_of(ins(4, "late, before the truncate", seq=2)), 2)
    assert set(_state(wh)) == {3}


def test_new_columns_are_added_and_guarded_rows_keep_null(tmp_path, make_wh):
    """Regression: delta-rs merge_schema=True + a delete clause leaks new-column values into
    rows the guard refused to update. cdcflow adds columns first, then merges."""
    wh, ap = make_wh(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=10), ins(2, "b", seq=10)), 0)
    cols = {"id": "int64", "name": "string", "qty": "int64", "price": "decimal(10,2)"}
    stale = ev(
        Op.UPDATE,
        1,
        after={"id": 1, "name": "stale", "qty": 1, "price": "9.99"},
        seq=5,
        columns=cols,
    )
    fresh = ev(
        Op.INSERT, 3, after={"id": 3, "name": "c", "qty": 1, "price": "1.50"}, seq=11, columns=cols
    )
    ap.apply(table_of(stale, dele(2, seq=11), fresh), 1)
    state = _state(wh)
    assert state[1] == {"id": 1, "name": "a", "qty": 1, "price": None}
    assert 2 not in state
    assert str(state[3]["price"]) == "1.50"


def test_partial_update_keeps_the_stored_value_of_absent_columns(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    ap.apply(table_of(ins(1, "a", qty=1, seq=1)), 0)
    ap.apply(table_of(ev(Op.UPDATE, 1, after={"id": 1, "qty": 7}, seq=2)), 1)
    assert _state(wh)[1] == {"id": 1, "name": "a", "qty": 7}


def test_a_value_that_does_not_fit_dead_letters_its_key_and_the_rest_goes_on(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    other = SourceTable("test", "db", "", "other")
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    bad = ev(Op.UPDATE, 1, after={"id": 1, "name": "a", "qty": "not a number"}, seq=2)
    same_table = ins(2, "fine", seq=3)
    too_big = ev(Op.INSERT, 3, after={"id": 3, "name": "c", "qty": 2**63}, seq=4)
    good = ev(Op.INSERT, 7, after={"id": 7, "name": "x", "qty": 1}, seq=3, table=other)
    report = ap.apply(table_of(bad, same_table, too_big, good), 1)
    assert report.dead_letters == {"TYPE_CONFLICT": 2}
    assert _state(wh, "db.other") == {7: {"id": 7, "name": "x", "qty": 1}}
    # the stored row keeps its last good state; the key whose value fits is applied
    assert _state(wh) == {
        1: {"id": 1, "name": "a", "qty": 1},
        2: {"id": 2, "name": "fine", "qty": 1},
    }
    dead = sorted(wh.read("dead_letters", system=True).to_pylist(), key=lambda d: d["offset"])
    assert [(d["code"], d["stage"], d["target_table"]) for d in dead] == [
        ("TYPE_CONFLICT", "apply", TARGET)
    ] * 2
    assert b"not a number" in dead[0]["raw_value"] and "qty" in dead[0]["message"]


def test_every_record_is_accounted_for(tmp_path):
    wh, ap = _wh(tmp_path)
    events = [ins(1, "a", seq=1, offset=0), ins(2, "b", seq=2, offset=1)]
    result = DecodeResult(
        events=events,
        skipped=[Skipped("TOMBSTONE", Origin("t", 0, 2))],
        dead_letters=[
            DeadLetter("BAD_JSON", "not JSON", "test", Origin("t", 0, 3), b"{oops", b"k")
        ],
    )
    report = ap.apply(pa.Table.from_batches([flatten(result)]), 0)
    assert report.records == 4 and report.events == 2
    acc = wh.read("batches", system=True).to_pylist()
    assert [
        (
            a["first_offset"],
            a["last_offset"],
            a["records"],
            a["events"],
            a["skipped"],
            a["dead_letters"],
        )
        for a in acc
    ] == [(0, 3, 4, 2, 1, 1)]
    dead = wh.read("dead_letters", system=True).to_pylist()
    assert (
        dead[0]["raw_value"] == b"{oops" and dead[0]["raw_key"] == b"k" and dead[0]["offset"] == 3
    )


def test_composite_and_odd_column_names(tmp_path, make_wh):
    wh, ap = make_wh(tmp_path)
    table = SourceTable("test", "db", "", "no_pk")
    cols = {"#alibaba_rds_row_id#": "int64", "name": "string"}

    def e(op, rid, name, seq):
        img = {"#alibaba_rds_row_id#": rid, "name": name}
        return ChangeEvent(
            op=op,
            source=table,
            key={"#alibaba_rds_row_id#": rid},
            after=None if op is Op.DELETE else img,
            before=img if op is Op.DELETE else None,
            columns=cols,
            seq=(seq,),
            origin=Origin("t", 0, seq),
        )

    ap.apply(table_of(e(Op.INSERT, 15, "a", 1), e(Op.INSERT, 16, "b", 2)), 0)
    ap.apply(table_of(e(Op.UPDATE, 15, "a2", 3), e(Op.DELETE, 16, "b", 4)), 1)
    rows = wh.read("db.no_pk").to_pylist()
    assert [(r["#alibaba_rds_row_id#"], r["name"]) for r in rows] == [(15, "a2")]


def test_a_record_joined_into_another_records_event_is_accounted_for(tmp_path):
    wh, ap = _wh(tmp_path)
    joined = upd(1, "b", seq=2, offset=6)  # carries the change of records 5 (before half) and 6
    result = DecodeResult(
        events=[ins(1, "a", seq=1, offset=4), joined],
        decoded_origins=[Origin("t", 0, 4), Origin("t", 0, 5), Origin("t", 0, 6)],
    )
    report = ap.apply(pa.Table.from_batches([flatten(result)]), 0)
    assert report.records == 3
    acc = wh.read("batches", system=True).to_pylist()
    assert [(a["records"], a["events"], a["joined"]) for a in acc] == [(3, 2, 1)]


def test_heartbeats_and_markers_are_skipped_on_purpose_but_kept_in_the_changelog(tmp_path):
    wh, ap = _wh(tmp_path)
    beat = ChangeEvent(
        op=Op.HEARTBEAT, source=SourceTable("test"), ts_ms=5, origin=Origin("t", 0, 1)
    )
    report = ap.apply(table_of(ins(1, "a", seq=1, offset=0), beat), 0)
    assert report.skipped == {"HEARTBEAT": 1}
    acc = wh.read("batches", system=True).to_pylist()
    assert [(a["records"], a["skipped"]) for a in acc] == [(2, 1)]
    assert sorted(wh.read("changelog", system=True)["op"].to_pylist()) == ["heartbeat", "insert"]


def test_progress_follows_the_source_and_heartbeats_advance_it(tmp_path):
    wh, ap = _wh(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=2)), 0)
    beat = ChangeEvent(
        op=Op.HEARTBEAT, source=SourceTable("test"), ts_ms=9_999, origin=Origin("t", 9, 50)
    )
    ap.apply(table_of(beat), 1)
    rows = sorted(wh.read("progress", system=True).to_pylist(), key=lambda r: r["batch_id"])
    assert [
        (r["batch_id"], r["events"], r["rows_changed"], r["last_source_ts_ms"]) for r in rows
    ] == [(0, 2, 2, 1002), (1, 1, 0, 9_999)]
    assert rows[0]["last_seq"] == table_of(ins(2, "b", seq=2))["seq"][0].as_py()
    assert all(r["lag_ms"] == r["committed_at_ms"] - r["last_source_ts_ms"] for r in rows)


def test_system_tables_of_an_older_warehouse_gain_new_columns(tmp_path):
    """An upgrade must not stop the stream: a progress/tombstones table written before a
    column was added takes the new rows (older rows read NULL there)."""
    from deltalake import write_deltalake

    from cdcflow.sinks.system_tables import PROGRESS_SCHEMA, TOMBSTONE_SCHEMA

    wh, ap = _wh(tmp_path)
    old_progress = pa.schema([f for f in PROGRESS_SCHEMA if not f.name.startswith("txn_")])
    write_deltalake(wh.system_path("progress"), old_progress.empty_table(), mode="overwrite")
    old_tombs = pa.schema([f for f in TOMBSTONE_SCHEMA if f.name != "deleted_at_ms"])
    write_deltalake(wh.system_path("tombstones"), old_tombs.empty_table(), mode="overwrite")
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    ap.apply(table_of(dele(1, seq=2)), 1)
    assert wh.read("progress", system=True).num_rows == 2
    assert wh.read("tombstones", system=True)["deleted_at_ms"][0].as_py() > 0

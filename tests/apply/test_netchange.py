from __future__ import annotations

import orjson
from tests.apply.helpers import COLUMNS, dele, ev, ins, table_of, upd

from cdcflow.apply.netchange import net_change
from cdcflow.model import Op


def _rows(net):
    return {
        orjson.loads(k)["id"]: (d, None if a is None else orjson.loads(a), s)
        for k, d, a, s in zip(
            net.rows["key"].to_pylist(),
            net.rows["is_delete"].to_pylist(),
            net.rows["after"].to_pylist(),
            net.rows["seq"].to_pylist(),
            strict=True,
        )
    }


def test_last_change_per_key_by_source_sequence_not_arrival():
    # arrival order: seq 3 before seq 2 for key 1; the seq-3 update must win
    net = net_change(
        table_of(ins(1, "a", seq=1), upd(1, "c", seq=3), upd(1, "b", seq=2), ins(2, "x", seq=4))
    )
    rows = _rows(net)
    assert rows[1][1]["name"] == "c" and rows[2][1]["name"] == "x"
    assert net.events_in == 4 and net.superseded == 2


def test_delete_wins_when_it_is_last_and_reinsert_wins_when_it_is_last():
    rows = _rows(
        net_change(
            table_of(
                ins(1, "a", seq=1),
                dele(1, seq=2),
                ins(2, "b", seq=3),
                dele(2, seq=4),
                ins(2, "c", seq=5),
            )
        )
    )
    assert rows[1][0] is True
    assert rows[2][0] is False and rows[2][1]["name"] == "c"


def test_truncate_drops_everything_ordered_before_it():
    net = net_change(
        table_of(
            ins(1, "a", seq=1), ev(Op.TRUNCATE, seq=5), ins(2, "b", seq=6), ins(3, "late", seq=4)
        )
    )
    assert set(_rows(net)) == {2}
    assert net.truncate_seq is not None


def test_key_change_deletes_the_old_key():
    moved = ev(
        Op.UPDATE,
        2,
        before={"id": 1, "name": "a", "qty": 1},
        after={"id": 2, "name": "a", "qty": 1},
        seq=2,
    )
    rows = _rows(net_change(table_of(ins(1, "a", seq=1), moved)))
    assert rows[1][0] is True and rows[2][0] is False


def test_before_half_alone_deletes_and_after_half_restores():
    before_half = ev(Op.UPDATE, 1, before={"id": 1, "name": "a", "qty": 1}, after=None, seq=2)
    assert _rows(net_change(table_of(before_half)))[1][0] is True
    after_half = ev(Op.UPDATE, 1, after={"id": 1, "name": "b", "qty": 1}, seq=3)
    rows = _rows(net_change(table_of(before_half, after_half)))
    assert rows[1][0] is False and rows[1][1]["name"] == "b"


def test_partial_updates_fold_over_earlier_images_in_the_batch():
    partial = ev(Op.UPDATE, 1, after={"id": 1, "qty": 9}, seq=2)
    net = net_change(table_of(ins(1, "a", qty=1, seq=1), partial))
    ((is_delete, after, _),) = _rows(net).values()
    assert after == {"id": 1, "name": "a", "qty": 9}
    assert net.rows["partial"].to_pylist() == [False]
    # without an earlier image the update stays partial: the sink keeps stored columns
    net = net_change(table_of(partial))
    assert net.rows["partial"].to_pylist() == [True]
    assert _rows(net)[1][1] == {"id": 1, "qty": 9}


def test_events_without_sequence_keep_arrival_order():
    rows = _rows(net_change(table_of(ins(1, "a", offset=10), upd(1, "b", offset=11))))
    assert rows[1][1]["name"] == "b"


def test_columns_declared_travel_once_per_declaration():
    t = table_of(ins(1, "a", seq=1), ins(2, "b", seq=2))
    assert orjson.loads(t["columns"][0].as_py()) == COLUMNS
    assert t["columns"][1].as_py() is None


def test_an_event_that_cannot_be_stored_dead_letters_its_record_with_raw_bytes():
    from tests.apply.helpers import ins as insert

    from cdcflow.decode.batches import flatten
    from cdcflow.formats.base import DecodeResult, Record
    from cdcflow.model import Origin

    deep: list = []
    for _ in range(300):  # orjson writes at most 254 levels
        deep = [deep]
    bad = insert(2, "b", seq=2, offset=8)
    bad.meta = {"nested": deep}
    late = insert(3, "c", seq=3, offset=9)
    late.ts_ms = 2**63  # beyond int64
    good = insert(1, "a", seq=1, offset=7)
    records = [Record(value=b"raw-8", key=b"k8", origin=Origin("t", 0, 8))]
    rows = flatten(DecodeResult(events=[good, bad, late]), None, records).to_pylist()
    assert [(r["kind"], r["offset"]) for r in rows] == [("event", 7), ("dead", 8), ("dead", 9)]
    dead = {r["offset"]: r for r in rows if r["kind"] == "dead"}
    assert dead[8]["reason"] == dead[9]["reason"] == "BAD_VALUE"
    assert (dead[8]["raw_value"], dead[8]["raw_key"]) == (b"raw-8", b"k8")
    assert "64-bit" in dead[9]["error"]

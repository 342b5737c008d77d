"""SCD type 2 history tables: real delta-rs tables in a temp folder, read back with deltalake."""

from __future__ import annotations

import os
import tempfile

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.apply.helpers import COLUMNS, dele, ev, ins, table_of, upd

from cdcflow.errors import Code
from cdcflow.model import Op, seq_key
from cdcflow.sinks import history
from cdcflow.sinks.history import apply_history, log_path
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

TARGET = "db.items"


def _wh(root) -> DeltaWarehouse:
    return DeltaWarehouse(str(root), pipeline_id="test")


def _apply(wh, batch_id, *events, track=None, columns=COLUMNS):
    commit = wh.commit_context(batch_id)
    return apply_history(wh, TARGET, table_of(*events), columns, ["id"], commit, track)


def _s(n: int | None) -> str | None:
    return None if n is None else seq_key((n,))


def _history(wh, *extra):
    """(id, name, qty, *extra, start, end, is_current, _cdc_seq) per version, sorted."""
    rows = DeltaTable(wh.table_path(TARGET)).to_pyarrow_table().to_pylist()
    return sorted(
        (
            (
                r["id"],
                r["name"],
                r["qty"],
                *(r[c] for c in extra),
                r["__start_at"],
                r["__end_at"],
                r["__is_current"],
                r["_cdc_seq"],
            )
            for r in rows
        ),
        key=lambda v: (v[0], v[-4]),
    )


def _v(key, name, qty, start, end=None, seq=None):
    """An expected version; ``seq`` (last change applied) defaults to ``start``."""
    return (key, name, qty, _s(start), _s(end), end is None, _s(seq or start))


def test_insert_update_delete_open_and_close_versions(tmp_path):
    wh = _wh(tmp_path)
    first = _apply(wh, 0, ins(1, "a", seq=1), ins(2, "b", seq=2), upd(1, "a2", qty=5, seq=3))
    assert (first.versions_opened, first.versions_closed) == (3, 1)
    second = _apply(wh, 1, dele(2, seq=4), upd(1, "a3", seq=5))
    assert (second.versions_opened, second.versions_closed) == (1, 2)
    assert _history(wh) == [
        _v(1, "a", 1, 1, 3),
        _v(1, "a2", 5, 3, 5),
        _v(1, "a3", 1, 5),
        _v(2, "b", 1, 2, 4),
    ]
    table = DeltaTable(wh.table_path(TARGET))
    rows = mirror_by_key(table.to_pyarrow_table(), ("id", "__start_at"))
    # source times of the changes that opened and closed each version
    assert rows[(1, _s(3))]["__start_ts_ms"] == 1003 and rows[(1, _s(3))]["__end_ts_ms"] == 1005
    assert not table.schema().to_arrow().field("id").nullable


def test_a_late_event_is_put_into_its_place_in_the_chain(tmp_path):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(1, "a", seq=1), upd(1, "c", seq=5))
    result = _apply(wh, 1, upd(1, "b", seq=3))
    assert (result.versions_opened, result.versions_closed) == (1, 1)
    assert _history(wh) == [_v(1, "a", 1, 1, 3), _v(1, "b", 1, 3, 5), _v(1, "c", 1, 5)]


def test_a_delete_that_arrives_before_its_insert_still_closes_it(tmp_path):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(2, "other", seq=1), dele(1, seq=5))  # closes nothing yet
    _apply(wh, 1, ins(1, "a", seq=3))
    assert _history(wh) == [_v(1, "a", 1, 3, 5), _v(2, "other", 1, 1)]
    # a late update between the insert and the delete is closed by that delete too
    _apply(wh, 2, upd(1, "b", seq=4))
    assert _history(wh) == [_v(1, "a", 1, 3, 4), _v(1, "b", 1, 4, 5), _v(2, "other", 1, 1)]


def test_a_truncate_closes_what_was_open_before_it_also_when_late(tmp_path):
    wh = _wh(tmp_path)
    _apply(
        wh, 0, ins(1, "a", seq=1), ins(2, "b", seq=2), ev(Op.TRUNCATE, seq=3), ins(3, "c", seq=4)
    )
    assert _history(wh) == [_v(1, "a", 1, 1, 3), _v(2, "b", 1, 2, 3), _v(3, "c", 1, 4)]
    # an insert from before the truncate, arriving later, is closed by it
    _apply(wh, 1, ins(4, "late", seq=2))
    assert _v(4, "late", 1, 2, 3) in _history(wh)
    # a truncate arriving after newer changes closes only what was open at its sequence
    _apply(wh, 2, upd(3, "c2", seq=6), ins(5, "e", seq=7))
    _apply(wh, 3, ev(Op.TRUNCATE, seq=5))
    assert [v for v in _history(wh) if v[0] in (3, 5)] == [
        _v(3, "c", 1, 4, 5),
        _v(3, "c2", 1, 6),  # the update at 6 comes after the truncate: a row again
        _v(5, "e", 1, 7),
    ]


def test_a_key_move_closes_the_old_key_and_opens_the_new_one(tmp_path):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(1, "a", seq=1))
    moved = ev(
        Op.UPDATE,
        2,
        before={"id": 1, "name": "a", "qty": 1},
        after={"id": 2, "name": "a", "qty": 1},
        seq=2,
    )
    _apply(wh, 1, moved)
    assert _history(wh) == [_v(1, "a", 1, 1, 2), _v(2, "a", 1, 2)]


def test_a_partial_image_takes_missing_columns_from_the_version_before_it(tmp_path):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(1, "a", qty=1, seq=1), ev(Op.UPDATE, 1, after={"id": 1, "qty": 7}, seq=3))
    assert _history(wh) == [_v(1, "a", 1, 1, 3), _v(1, "a", 7, 3)]
    # a late full image before the partial one: the partial now completes from it
    _apply(wh, 1, upd(1, "b", qty=2, seq=2))
    assert _history(wh) == [_v(1, "a", 1, 1, 2), _v(1, "b", 2, 2, 3), _v(1, "b", 7, 3)]
    # a late partial image inside the current version (itself opened by a partial image)
    _apply(wh, 2, ev(Op.UPDATE, 1, after={"id": 1, "qty": 9}, seq=4))
    assert _history(wh)[2:] == [_v(1, "b", 7, 3, 4), _v(1, "b", 9, 4)]


def test_track_history_updates_untracked_columns_in_place(tmp_path):
    wh = _wh(tmp_path)
    track = ["name"]
    _apply(wh, 0, ins(1, "a", qty=1, seq=1), upd(1, "a", qty=5, seq=4), track=track)
    assert _history(wh) == [_v(1, "a", 5, 1, seq=4)]
    # an older untracked change arriving later does not undo the newer value
    late = _apply(wh, 1, upd(1, "a", qty=3, seq=2), track=track)
    assert _history(wh) == [_v(1, "a", 5, 1, seq=4)]
    assert late.updated_in_place == 0 and late.versions_opened == 0
    newer = _apply(wh, 2, upd(1, "a", qty=6, seq=6), upd(1, "b", qty=6, seq=7), track=track)
    assert (newer.updated_in_place, newer.versions_opened) == (1, 1)
    assert _history(wh) == [_v(1, "a", 6, 1, 7, seq=6), _v(1, "b", 6, 7)]


def test_a_repeat_with_the_same_values_opens_no_version(tmp_path):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(1, "a", seq=1))
    again = ev(Op.SNAPSHOT, 1, after={"id": 1, "name": "a", "qty": 1}, seq=2)  # a re-snapshot
    _apply(wh, 1, again)
    assert _history(wh) == [_v(1, "a", 1, 1, seq=2)]


def test_duplicates_and_replayed_batches_change_nothing(tmp_path):
    wh = _wh(tmp_path)
    batch = [ins(1, "a", seq=1), upd(1, "b", seq=2), dele(1, seq=3), ev(Op.TRUNCATE, seq=4)]
    _apply(wh, 0, *batch)
    table, log = DeltaTable(wh.table_path(TARGET)), DeltaTable(log_path(wh, TARGET))
    versions = (table.version(), log.version())
    before = _history(wh)
    assert _apply(wh, 0, *batch).skipped_replay  # the same batch id again
    redelivered = _apply(wh, 1, *batch, ins(1, "a", seq=1))  # the same events, new batch id
    assert redelivered.duplicates == 4 and redelivered.versions_opened == 0
    table.update_incremental()
    log.update_incremental()
    assert (table.version(), log.version()) == versions
    assert _history(wh) == before == [_v(1, "a", 1, 1, 2), _v(1, "b", 1, 2, 3)]
    assert log.to_pyarrow_table().num_rows == 4  # each change logged once


def test_a_batch_replayed_after_a_crash_between_log_and_merge_catches_up(tmp_path, monkeypatch):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(1, "a", seq=1))

    def crash(*args, **kwargs):
        raise OSError("the driver died before the merge committed")

    monkeypatch.setattr(history, "_merge", crash)
    with pytest.raises(OSError):
        _apply(wh, 1, upd(1, "b", seq=2))
    assert _history(wh) == [_v(1, "a", 1, 1)]  # the change is logged, not merged
    monkeypatch.undo()
    result = _apply(wh, 1, upd(1, "b", seq=2))
    assert result.duplicates == 0 and result.versions_opened == 1
    assert _history(wh) == [_v(1, "a", 1, 1, 2), _v(1, "b", 1, 2)]
    assert DeltaTable(log_path(wh, TARGET)).to_pyarrow_table().num_rows == 2


def test_a_new_column_mid_stream_is_added_and_older_versions_keep_null(tmp_path):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(1, "a", seq=1))
    cols = {**COLUMNS, "price": "decimal(10,2)"}
    priced = ev(
        Op.UPDATE, 1, after={"id": 1, "name": "a", "qty": 1, "price": "1.50"}, seq=2, columns=cols
    )
    _apply(wh, 1, priced, columns=cols)
    got = [(v[3], v[4]) for v in _history(wh, "price")]
    assert [(None if p is None else str(p), start) for p, start in got] == [
        (None, _s(1)),
        ("1.50", _s(2)),
    ]


def test_values_that_do_not_fit_and_events_without_sequence_are_rejected(tmp_path):
    wh = _wh(tmp_path)
    _apply(wh, 0, ins(1, "a", seq=1))
    bad = ev(Op.UPDATE, 1, after={"id": 1, "name": "a", "qty": "not a number"}, seq=2)
    result = _apply(wh, 1, bad, ins(2, "fine", seq=3), ins(3, "no sequence"))
    assert sorted((k, code) for k, code, _ in result.rejected) == [
        ('{"id":1}', "TYPE_CONFLICT"),
        ('{"id":3}', Code.MISSING_SEQ),
    ]
    assert _history(wh) == [_v(1, "a", 1, 1), _v(2, "fine", 1, 3)]
    assert (result.versions_opened, result.versions_closed) == (1, 0)
    # the rejected change was not logged: a later good one for the key applies normally
    _apply(wh, 2, upd(1, "b", seq=2))
    assert _history(wh)[:2] == [_v(1, "a", 1, 1, 2), _v(1, "b", 1, 2)]


# --------------------------------------------------------------------------- property

KEYS = (1, 2, 3)


@st.composite
def workloads(draw):
    """Abstract events with distinct sequences 1..n (a few sent twice)."""
    n = draw(st.integers(1, 9))
    out = []
    for s in range(1, n + 1):
        kind = draw(st.sampled_from(["insert", "update", "partial", "delete", "move", "truncate"]))
        key = draw(st.sampled_from(KEYS))
        name = draw(st.sampled_from(["a", "b"]))
        qty = draw(st.integers(1, 2))
        other = draw(st.sampled_from([k for k in KEYS if k != key]))
        out.append((kind, key, s, name, qty, other))
    out += draw(st.lists(st.sampled_from(out), max_size=2))  # redelivered copies
    order = draw(st.permutations(out))
    cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=3)))
    track = draw(st.sampled_from([None, ["name"]]))
    return out, order, cuts, track


def _event(kind, key, s, name, qty, other):
    if kind == "truncate":
        return ev(Op.TRUNCATE, seq=s)
    if kind == "delete":
        return dele(key, seq=s)
    if kind == "partial":
        return ev(Op.UPDATE, key, after={"id": key, "qty": qty}, seq=s)
    if kind == "move":  # other -> key
        image = {"id": key, "name": name, "qty": qty}
        return ev(Op.UPDATE, key, before={**image, "id": other}, after=image, seq=s)
    return (ins if kind == "insert" else upd)(key, name, qty, seq=s)


def reference(workload, track):
    """The history by the rules, one event at a time in sequence order."""
    versions, current, image = [], {}, {}

    def close(key, s):
        if key in current:
            current.pop(key)["end"] = s
        image.pop(key, None)

    for kind, key, s, name, qty, other in sorted(set(workload), key=lambda e: e[2]):
        if kind == "truncate":
            for k in list(current):
                close(k, s)
            image.clear()
            continue
        if kind == "delete":
            close(key, s)
            continue
        if kind == "move":
            close(other, s)
        row = {"name": name, "qty": qty}
        if kind == "partial":
            row = {"name": image.get(key, {}).get("name"), "qty": qty}
        v = current.get(key)
        tracked = track or ["name", "qty"]
        if v is not None and all(v[c] == row[c] for c in tracked):
            v.update(row, seq=s)
        else:
            if v is not None:
                v["end"] = s
            v = current[key] = {"id": key, **row, "start": s, "end": None, "seq": s}
            versions.append(v)
        image[key] = row
    return sorted(
        (_v(v["id"], v["name"], v["qty"], v["start"], v["end"], v["seq"]) for v in versions),
        key=lambda v: (v[0], v[-4]),
    )


_PARTIAL_AFTER_A_LATE_DELETE = (
    # found by CI's random run: the partial image at 5 was first filled from the version
    # before it; the late delete at 4 must leave its absent columns NULL
    [
        ("insert", 1, 1, "a", 1, 2),
        ("insert", 1, 2, "a", 1, 2),
        ("insert", 1, 3, "a", 1, 2),
        ("delete", 1, 4, "a", 1, 2),
        ("partial", 1, 5, "a", 2, 2),
        ("insert", 1, 1, "a", 1, 2),
        ("insert", 1, 1, "a", 1, 2),
    ],
    [
        ("insert", 1, 1, "a", 1, 2),
        ("insert", 1, 2, "a", 1, 2),
        ("partial", 1, 5, "a", 2, 2),
        ("delete", 1, 4, "a", 1, 2),
        ("insert", 1, 3, "a", 1, 2),
        ("insert", 1, 1, "a", 1, 2),
        ("insert", 1, 1, "a", 1, 2),
    ],
    [3],
    None,
)


@settings(
    max_examples=int(os.environ.get("CDCFLOW_HISTORY_EXAMPLES", "30")),
    deadline=None,
    derandomize=True,  # the same cases on every run (CI); raise the count to search more
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(workloads())
@example(_PARTIAL_AFTER_A_LATE_DELETE)
def test_the_history_is_the_same_whatever_the_batches_and_their_order(case):
    workload, order, cuts, track = case
    bounds = [0, *cuts, len(order)]
    batches = [order[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    with tempfile.TemporaryDirectory() as root:
        wh = _wh(root)
        for batch_id, batch in enumerate(batches):
            _apply(wh, batch_id, *(_event(*e) for e in batch), track=track)
        _apply(wh, 0, *(_event(*e) for e in batches[0]), track=track)  # a replay: no-op
        expected = reference(workload, track)
        path = wh.table_path(TARGET)
        got = _history(wh) if DeltaTable.is_deltatable(path) else []
        assert got == expected

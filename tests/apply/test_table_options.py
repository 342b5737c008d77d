"""Per-table apply options on real Delta tables: sequence_by, soft delete,
ignore_null_updates, schema-change policies, type widening, drops, tombstone retention,
partition_by."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from tests.apply.helpers import dele, ev, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.apply.options import TableOptions, TableRules
from cdcflow.apply.prepare import tie_break_part
from cdcflow.cli import main
from cdcflow.errors import Code
from cdcflow.model import Op, SourceTable, seq_key
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

TARGET = "db.items"


def _setup(tmp_path, factory=None, **options):
    root = tmp_path / "wh"
    wh = factory(root) if factory else DeltaWarehouse(str(root), pipeline_id="test")
    rules = TableRules.of([("db.*", options)]) if options else None
    return wh, BatchApplier(wh, tables=rules)


def _rows(wh, target=TARGET):
    out = {}
    for r in wh.read(target).to_pylist():
        out[r["id"]] = {k: v for k, v in r.items() if not k.startswith("_cdc_")}
    return out


def _system(wh, name):
    return wh.read(name, system=True)


# ---------------------------------------------------------------- rules


def test_rules_apply_in_file_order_and_later_matches_override():
    rules = TableRules.of(
        [
            ("*", {"soft_delete": True}),
            ("shop.*", {"mode": "history"}),
            ("shop.a", {"soft_delete": False}),
        ]
    )
    assert rules("other.x") == TableOptions(soft_delete=True)
    assert rules("shop.b") == TableOptions(soft_delete=True, mode="history")
    assert rules("shop.a") == TableOptions(soft_delete=False, mode="history")
    with pytest.raises(KeyError, match="soft_delet"):
        TableRules.of([("*", {"soft_delet": True})])


# ---------------------------------------------------------------- sequence_by

COLS_V = {"id": "int64", "name": "string", "version": "int64"}


def _v(op, k, name, version, seq, **kw):
    return ev(
        op, k, after={"id": k, "name": name, "version": version}, seq=seq, columns=COLS_V, **kw
    )


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_sequence_by_breaks_ties_between_equal_source_sequences(tmp_path, order):
    wh, ap = _setup(tmp_path, sequence_by=("version",))
    events = [
        _v(Op.INSERT, 1, "v1", 1, seq=5, partition=0),
        _v(Op.UPDATE, 1, "v3", 3, seq=5, partition=1),
        _v(Op.UPDATE, 1, "v2", 2, seq=5, partition=2),
    ]
    # every event in a batch of its own, in the given arrival order (from three partitions:
    # one partition's records arrive in offset order)
    for batch_id, i in enumerate(order):
        ap.apply(table_of(events[i]), batch_id)
    assert _rows(wh)[1]["name"] == "v3"


def test_without_sequence_by_the_kafka_position_decides_ties(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(
        table_of(
            _v(Op.INSERT, 1, "v3", 3, seq=5, offset=1), _v(Op.UPDATE, 1, "v1", 1, seq=5, offset=2)
        ),
        0,
    )
    assert _rows(wh)[1]["name"] == "v1"


def test_source_sequence_still_comes_before_the_tie_break(tmp_path):
    wh, ap = _setup(tmp_path, sequence_by=("version",))
    ap.apply(table_of(_v(Op.INSERT, 1, "newer", 1, seq=9)), 0)
    ap.apply(table_of(_v(Op.UPDATE, 1, "older", 99, seq=8)), 1)
    assert _rows(wh)[1]["name"] == "newer"


@pytest.mark.parametrize(
    ("values", "logical"),
    [
        ([-(10**12), -3, 0, 7, 10**15], "int64"),
        (["-12.50", "-1.00", "0.00", "0.01", "99999.99"], "decimal(10,2)"),
        ([-1.5e10, -0.25, 0.0, 1e-9, 3.5, 2.5e15], "float64"),
        (
            [
                "1969-12-31T23:59:59+00:00",
                "2020-01-01T01:59:59+02:00",
                "2020-01-01T00:00:00+00:00",
                "2020-01-01T00:00:00.000001+00:00",
            ],
            "timestamptz",
        ),
    ],
)
def test_tie_break_parts_sort_like_their_values(values, logical):
    parts = [tie_break_part(v, logical) for v in values]
    assert parts == sorted(parts)
    assert tie_break_part(None, logical) < min(parts)  # NULL first


def test_tie_break_keeps_a_sequence_before_its_extensions():
    from cdcflow.apply.prepare import TIE_BREAK_SEPARATOR as SEP

    assert seq_key((5,)) + SEP + tie_break_part(10**9, "int64") < seq_key((5, 0))
    assert seq_key((5,)) + SEP + tie_break_part(-1, "int64") > seq_key((4, 99))


# ---------------------------------------------------------------- soft delete


def test_soft_delete_flags_the_row_and_a_newer_insert_clears_it(tmp_path, warehouse_factory):
    wh, ap = _setup(tmp_path, warehouse_factory, soft_delete=True)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=2)), 0)
    ap.apply(table_of(dele(1, seq=3)), 1)
    rows = mirror_by_key(wh.read(TARGET))
    flags = {k: (r["_deleted"], r["name"]) for k, r in rows.items()}
    assert flags == {1: (True, "a"), 2: (False, "b")}  # values kept, flag set
    ap.apply(table_of(ins(1, "late, older than the delete", seq=2)), 2)
    assert mirror_by_key(wh.read(TARGET), column="_deleted")[1] is True
    ap.apply(table_of(ins(1, "back", seq=4)), 3)
    again = mirror_by_key(wh.read(TARGET))
    assert (again[1]["_deleted"], again[1]["name"]) == (False, "back")


def test_soft_delete_truncate_flags_only_rows_before_it(tmp_path, warehouse_factory):
    wh, ap = _setup(tmp_path, warehouse_factory, soft_delete=True)
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    ap.apply(table_of(ev(Op.TRUNCATE, seq=2), ins(2, "b", seq=3)), 1)
    assert mirror_by_key(wh.read(TARGET), column="_deleted") == {1: True, 2: False}


# ---------------------------------------------------------------- ignore_null_updates


def test_ignore_null_updates_keeps_stored_values(tmp_path, warehouse_factory):
    wh, ap = _setup(tmp_path, warehouse_factory, ignore_null_updates=True)
    ap.apply(table_of(ins(1, "a", qty=5, seq=1)), 0)
    ap.apply(table_of(ev(Op.UPDATE, 1, after={"id": 1, "name": None, "qty": 6}, seq=2)), 1)
    assert _rows(wh)[1] == {"id": 1, "name": "a", "qty": 6}


def test_without_ignore_null_updates_null_is_written(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(ins(1, "a", qty=5, seq=1)), 0)
    ap.apply(table_of(ev(Op.UPDATE, 1, after={"id": 1, "name": None, "qty": 6}, seq=2)), 1)
    assert _rows(wh)[1] == {"id": 1, "name": None, "qty": 6}


def test_ignore_null_updates_never_touches_inserts(tmp_path):
    wh, ap = _setup(tmp_path, ignore_null_updates=True)
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    ap.apply(
        table_of(dele(1, seq=2), ev(Op.INSERT, 1, after={"id": 1, "name": None, "qty": 1}, seq=3)),
        1,
    )
    assert _rows(wh)[1]["name"] is None


# ---------------------------------------------------------------- schema changes

NARROW = {"id": "int64", "name": "string", "qty": "int32", "price": "decimal(6,2)"}
WIDE = {"id": "int64", "name": "string", "qty": "int64", "price": "decimal(12,3)"}


def _typed(k, qty, price, seq, cols):
    return ev(
        Op.INSERT,
        k,
        after={"id": k, "name": "n", "qty": qty, "price": price},
        seq=seq,
        columns=cols,
    )


def test_evolve_widens_stored_columns_without_losing_values(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(_typed(1, 7, "1234.56", 1, NARROW)), 0)
    ap.apply(table_of(_typed(2, 2**40, "123456789.125", 2, WIDE)), 1)
    schema = {f.name: f.type for f in wh.read(TARGET).schema}
    assert schema["qty"] == pa.int64() and schema["price"] == pa.decimal128(12, 3)
    rows = _rows(wh)
    assert rows[1]["qty"] == 7 and str(rows[1]["price"]) == "1234.560"
    assert rows[2]["qty"] == 2**40 and str(rows[2]["price"]) == "123456789.125"
    log = _system(wh, "schema_changes").to_pylist()
    widened = {(r["column"], r["old_type"], r["new_type"]) for r in log if r["change"] == "widen"}
    assert widened == {("qty", "int32", "int64"), ("price", "decimal(6,2)", "decimal(12,3)")}
    assert all(r["applied"] and r["topic"] == "t" for r in log)


def test_evolve_records_added_and_dropped_columns(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(ins(1, "a", qty=3, seq=1)), 0)
    two = {"id": "int64", "name": "string", "color": "string"}
    ap.apply(
        table_of(
            ev(Op.UPDATE, 1, after={"id": 1, "name": "b", "color": "red"}, seq=2, columns=two)
        ),
        1,
    )
    assert _rows(wh)[1] == {"id": 1, "name": "b", "qty": None, "color": "red"}  # NULL from then on
    ap.apply(
        table_of(ev(Op.INSERT, 2, after={"id": 2, "name": "c", "color": None}, seq=3, columns=two)),
        2,
    )
    log = _system(wh, "schema_changes").to_pylist()
    changes = [(r["batch_id"], r["change"], r["column"]) for r in log]
    assert sorted(changes) == [(1, "add", "color"), (1, "drop", "qty")]  # recorded once
    ap.apply(table_of(ins(3, "d", qty=9, seq=4)), 3)  # qty is back
    log = _system(wh, "schema_changes").to_pylist()
    assert (3, "restore", "qty") in [(r["batch_id"], r["change"], r["column"]) for r in log]


def test_a_null_value_is_not_a_dropped_column(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(ins(1, "a", qty=3, seq=1)), 0)
    # schemaless formats declare no type for a NULL value, but the image still holds it
    ap.apply(
        table_of(
            ev(
                Op.UPDATE,
                1,
                after={"id": 1, "name": "b", "qty": None},
                seq=2,
                columns={"id": "int64", "name": "string"},
            )
        ),
        1,
    )
    assert wh.open(wh.system_path("schema_changes")) is None


def test_fail_policy_stops_only_that_table_with_the_offending_event(tmp_path):
    wh, ap = _setup(tmp_path, schema_changes="fail")
    other = SourceTable("test", "other", "", "things")
    ap.apply(table_of(ins(1, "a", seq=1), ins(1, "x", seq=1, table=other)), 0)
    new_cols = {**TABLE_COLS, "color": "string"}
    bad = ev(
        Op.INSERT,
        2,
        after={"id": 2, "name": "b", "qty": 1, "color": "red"},
        seq=2,
        columns=new_cols,
        partition=7,
        offset=77,
    )
    report = ap.apply(table_of(ins(3, "c", seq=2), bad, ins(2, "y", seq=2, table=other)), 1)
    assert report.dead_letters[Code.SCHEMA_CHANGE] == 2
    assert set(_rows(wh)) == {1}  # nothing of the batch applied to the stopped table
    assert set(_rows(wh, "other.things")) == {1, 2}  # the other table went on
    stop = [r for r in _system(wh, "schema_changes").to_pylist() if r["change"] == "stop"]
    assert len(stop) == 1 and stop[0]["offset"] == 77 and "color" in stop[0]["message"]
    # later batches of the stopped table are dead letters too, with raw events kept
    report = ap.apply(table_of(ins(4, "d", seq=3), ins(3, "z", seq=3, table=other)), 2)
    assert report.dead_letters[Code.TABLE_STOPPED] == 1
    assert set(_rows(wh)) == {1} and set(_rows(wh, "other.things")) == {1, 2, 3}
    dead = _system(wh, "dead_letters")
    stopped = dead.filter(pc.equal(dead["code"], Code.TABLE_STOPPED)).to_pylist()
    assert stopped[0]["target_table"] == TARGET
    assert orjson.loads(orjson.loads(stopped[0]["raw_value"])["after"])["name"] == "d"


TABLE_COLS = {"id": "int64", "name": "string", "qty": "int64"}


def test_ignore_policy_keeps_the_schema_and_records_what_it_ignored(tmp_path):
    wh, ap = _setup(tmp_path, schema_changes="ignore")
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    cols = {**TABLE_COLS, "color": "string"}
    ap.apply(
        table_of(
            ev(
                Op.INSERT,
                2,
                after={"id": 2, "name": "b", "qty": 1, "color": "red"},
                seq=2,
                columns=cols,
            )
        ),
        1,
    )
    assert _rows(wh)[2] == {"id": 2, "name": "b", "qty": 1}
    log = _system(wh, "schema_changes").to_pylist()
    assert [(r["change"], r["column"], r["applied"]) for r in log] == [("add", "color", False)]


def test_evolve_stops_a_table_on_a_type_it_cannot_hold(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(ins(1, "a", qty=1, seq=1)), 0)
    cols = {**TABLE_COLS, "qty": "string"}
    report = ap.apply(
        table_of(
            ev(Op.UPDATE, 1, after={"id": 1, "name": "a", "qty": "many"}, seq=2, columns=cols)
        ),
        1,
    )
    assert report.dead_letters[Code.SCHEMA_CHANGE] == 1
    assert _rows(wh)[1]["qty"] == 1
    stop = [r for r in _system(wh, "schema_changes").to_pylist() if r["change"] == "stop"][0]
    assert "int64" in stop["message"] and "string" in stop["message"]


def test_resume_lets_a_stopped_table_go_on(tmp_path):
    wh, ap = _setup(tmp_path, schema_changes="fail")
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    cols = {**TABLE_COLS, "color": "string"}
    ap.apply(
        table_of(
            ev(
                Op.INSERT,
                2,
                after={"id": 2, "name": "b", "qty": 1, "color": "r"},
                seq=2,
                columns=cols,
            )
        ),
        1,
    )
    ap.apply(table_of(ev(Op.INSERT, 3, after={"id": 3, "name": "c", "qty": 1}, seq=3)), 2)
    assert 3 not in _rows(wh)  # still stopped
    assert main(["resume", "--warehouse", str(tmp_path / "wh"), TARGET]) == 0
    ap2 = BatchApplier(wh, tables=TableRules.of([("*", {"schema_changes": "evolve"})]))
    ap2.apply(
        table_of(
            ev(
                Op.INSERT,
                3,
                after={"id": 3, "name": "c", "qty": 1, "color": "g"},
                seq=3,
                columns=cols,
            )
        ),
        3,
    )
    assert _rows(wh)[3]["color"] == "g"


# ---------------------------------------------------------------- partition_by


def _partition_folders(wh, target=TARGET):
    paths = pa.table(DeltaTable(wh.table_path(target)).get_add_actions())["path"]
    return sorted({p.split("/")[0] for p in paths.to_pylist()})


def test_partition_by_creates_a_partitioned_mirror_and_applies_every_change(
    tmp_path, warehouse_factory
):
    wh, ap = _setup(tmp_path, warehouse_factory, partition_by=("qty",))
    ap.apply(table_of(*(ins(k, f"n{k}", qty=k % 3, seq=k) for k in range(1, 7))), 0)
    assert DeltaTable(wh.table_path(TARGET)).metadata().partition_columns == ["qty"]
    # an update that moves its row to another partition, a delete, a plain update
    ap.apply(table_of(upd(1, "moved", qty=2, seq=10), dele(2, seq=11), upd(3, "c", 0, seq=12)), 1)
    assert _rows(wh) == {
        1: {"id": 1, "name": "moved", "qty": 2},
        3: {"id": 3, "name": "c", "qty": 0},
        4: {"id": 4, "name": "n4", "qty": 1},
        5: {"id": 5, "name": "n5", "qty": 2},
        6: {"id": 6, "name": "n6", "qty": 0},
    }
    assert _partition_folders(wh) == ["qty=0", "qty=1", "qty=2"]
    # a truncate, then new rows; an older change of a truncated key is not applied
    ap.apply(table_of(ev(Op.TRUNCATE, seq=20), ins(7, "after", qty=5, seq=21)), 2)
    ap.apply(table_of(upd(4, "older than the truncate", qty=1, seq=13)), 3)
    assert _rows(wh) == {7: {"id": 7, "name": "after", "qty": 5}}


def test_a_merge_into_a_table_partitioned_by_its_key_reads_only_the_partitions_it_changes(
    tmp_path,
):
    wh, ap = _setup(tmp_path, partition_by=("id",))
    ap.apply(table_of(*(ins(k, f"n{k}", seq=k) for k in range(1, 9))), 0)
    report = ap.apply(table_of(upd(3, "three", seq=20), upd(5, "five", seq=21)), 1)
    (mirror,) = report.mirrors
    # delta-rs prunes by the key's partition values: 2 of the 8 files are read
    assert mirror.metrics["num_target_files_scanned"] == 2
    assert mirror.metrics["num_target_files_skipped_during_scan"] == 6
    assert _rows(wh)[3]["name"] == "three" and _rows(wh)[8]["name"] == "n8"


def test_a_history_table_is_partitioned_too(tmp_path):
    wh, ap = _setup(tmp_path, mode="history", partition_by=("qty",))
    ap.apply(table_of(ins(1, "a", qty=1, seq=1), ins(2, "b", qty=1, seq=2)), 0)
    ap.apply(table_of(upd(1, "a2", qty=2, seq=3)), 1)
    table = DeltaTable(wh.table_path(TARGET))
    assert table.metadata().partition_columns == ["qty"]
    versions = sorted((r["id"], r["qty"], r["__is_current"]) for r in wh.read(TARGET).to_pylist())
    assert versions == [(1, 1, False), (1, 2, True), (2, 1, True)]


def test_a_partition_column_the_table_lacks_stops_the_table_and_names_the_option(tmp_path):
    wh, ap = _setup(tmp_path, partition_by=("region",))
    report = ap.apply(table_of(ins(1, "a", seq=1)), 0)
    assert report.dead_letters[Code.TABLE_FAULT] == 1
    assert wh.open(wh.table_path(TARGET)) is None  # nothing created in the wrong layout
    stop = [r for r in _system(wh, "schema_changes").to_pylist() if r["change"] == "stop"]
    assert "partition_by names ['region']" in stop[0]["message"]
    assert "cdcflow resume" in stop[0]["message"]


def test_partition_by_is_checked_when_the_rules_are_loaded():
    assert TableRules.of([("db.*", {"partition_by": ["day", "region"]})])(TARGET).partition_by == (
        "day",
        "region",
    )
    with pytest.raises(ValueError, match="names a column twice"):
        TableRules.of([("db.*", {"partition_by": ["day", "day"]})])


# ---------------------------------------------------------------- tombstone retention


def test_tombstones_past_retention_are_purged_but_truncate_watermarks_stay(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=1)), 0)
    ap.apply(table_of(ev(Op.TRUNCATE, seq=2), ins(2, "b", seq=3), dele(2, seq=4)), 1)
    tombs = DeltaTable(wh.system_path("tombstones")).to_pyarrow_table()
    assert tombs.num_rows == 2
    latest = max(tombs["deleted_at_ms"].to_pylist())
    assert wh.tombstones.purge(1.0, now_ms=latest + 3_599_000) == 0  # within retention
    assert wh.tombstones.purge(1.0, now_ms=latest + 3_601_000) == 1
    left = DeltaTable(wh.system_path("tombstones")).to_pyarrow_table().to_pylist()
    assert [r["key"] for r in left] == [None]
    assert wh.tombstones.purge(0, now_ms=latest + 10**12) == 0  # 0 keeps forever


def test_applier_purges_on_its_first_batch(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    BatchApplier(wh).apply(table_of(ins(1, "a", seq=1)), 0)
    BatchApplier(wh).apply(table_of(dele(1, seq=2)), 1)
    tiny = BatchApplier(wh, tombstone_retention_hours=1e-9)
    tiny.apply(table_of(upd(2, "x", seq=3)), 2)
    assert DeltaTable(wh.system_path("tombstones")).to_pyarrow_table().num_rows == 0


# ---------------------------------------------------------------- renames from DDL


def _with_ddl(text, seq):
    from dataclasses import replace

    return replace(ev(Op.DDL, None, seq=seq, columns=None), ddl=text)


RENAMED = {"id": "int64", "title": "string", "qty": "int64"}


def test_a_rename_stated_by_ddl_moves_the_values(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=2)), 0)
    ren = _with_ddl("ALTER TABLE `db`.`items` RENAME COLUMN `name` TO `title`", 3)
    after = ev(Op.UPDATE, 2, after={"id": 2, "title": "B", "qty": 5}, seq=4, columns=RENAMED)
    ap.apply(table_of(ren, after), 1)
    rows = _rows(wh)
    assert rows[1] == {"id": 1, "name": None, "title": "a", "qty": 1}  # untouched row moved
    assert rows[2] == {"id": 2, "name": None, "title": "B", "qty": 5}
    log = [
        (r["change"], r["column"], r["message"]) for r in _system(wh, "schema_changes").to_pylist()
    ]
    assert ("rename", "name", "name -> title") in log and ("drop", "name", None) in log
    assert not any(c == "add" for c, *_ in log)  # a rename, not an unrelated new column


def test_without_the_ddl_a_rename_is_a_drop_and_an_add(tmp_path):
    wh, ap = _setup(tmp_path)
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    ap.apply(
        table_of(ev(Op.UPDATE, 1, after={"id": 1, "title": "A", "qty": 1}, seq=2, columns=RENAMED)),
        1,
    )
    assert _rows(wh)[1] == {"id": 1, "name": None, "title": "A", "qty": 1}
    log = sorted((r["change"], r["column"]) for r in _system(wh, "schema_changes").to_pylist())
    assert log == [("add", "title"), ("drop", "name")]


def test_fail_policy_stops_on_a_rename(tmp_path):
    wh, ap = _setup(tmp_path, schema_changes="fail")
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    report = ap.apply(table_of(_with_ddl("ALTER TABLE items RENAME COLUMN name TO title", 2)), 1)
    assert report.dead_letters[Code.SCHEMA_CHANGE] == 1
    stop = [r for r in _system(wh, "schema_changes").to_pylist() if r["change"] == "stop"]
    assert "renamed" in stop[0]["message"] and stop[0]["seq"] == seq_key((2,))


# ---------------------------------------------------------------- transactions


def _in_txn(event, txn_id, order, last):
    from dataclasses import replace

    from cdcflow.model import Txn

    return replace(event, txn=Txn(txn_id, order, last))


def test_consistent_transactions_apply_only_whole_transactions(tmp_path):
    from cdcflow.apply.transactions import TransactionPolicy

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh, transactions=TransactionPolicy(max_wait_ms=3_600_000))
    first = table_of(
        _in_txn(ins(1, "a", seq=1), "77", 1, False),
        _in_txn(ins(2, "b", seq=2), "77", 2, False),
        ins(9, "no transaction", seq=3),
    )
    r0 = ap.apply(first, 0)
    assert set(_rows(wh)) == {9}  # transaction 77 is open: none of it is applied
    assert r0.transactions["held"] == 1 and r0.transactions["held_events"] == 2
    assert r0.events == 3  # the held events are still this batch's records
    second = table_of(_in_txn(upd(1, "a2", seq=4), "77", 3, True))
    r1 = ap.apply(second, 1)
    assert _rows(wh) == {
        1: {"id": 1, "name": "a2", "qty": 1},
        2: {"id": 2, "name": "b", "qty": 1},
        9: {"id": 9, "name": "no transaction", "qty": 1},
    }
    assert r1.transactions["complete"] == 1 and r1.transactions["held"] == 0
    changelog = _system(wh, "changelog")
    by_batch = sorted(
        zip(changelog["batch_id"].to_pylist(), changelog["seq"].to_pylist(), strict=True)
    )
    assert by_batch == [
        (0, seq_key((3,))),
        (1, seq_key((1,))),
        (1, seq_key((2,))),
        (1, seq_key((4,))),
    ]
    progress = _system(wh, "progress").sort_by("batch_id").to_pylist()
    assert [p["txn_held"] for p in progress] == [1, 0]
    assert progress[1]["txn_max_wait_ms"] >= 0 and progress[1]["txn_complete"] == 1
    batches = _system(wh, "batches").to_pylist()
    assert sum(b["records"] for b in batches) == 4 and sum(b["events"] for b in batches) == 4
    # a replay of batch 1 after a crash changes nothing
    ap.apply(second, 1)
    assert _system(wh, "changelog").num_rows == 4


def test_an_open_transaction_is_released_after_max_wait(tmp_path):
    from cdcflow.apply.transactions import TransactionPolicy

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh, transactions=TransactionPolicy(max_wait_ms=0))
    r = ap.apply(table_of(_in_txn(ins(1, "a", seq=1), "5", 1, False)), 0)
    assert set(_rows(wh)) == {1} and r.transactions["released_open"] == 1


# ---------------------------------------------------------------- history (SCD type 2)


def _versions(wh, target=TARGET):
    rows = wh.read(target).to_pylist()
    return sorted(
        (r["id"], r["name"], r["__start_at"], r["__end_at"], r["__is_current"]) for r in rows
    )


def test_history_mode_keeps_versions_and_places_late_events(tmp_path):
    wh, ap = _setup(tmp_path, mode="history")
    other = SourceTable("test", "other", "", "things")
    ap.apply(
        table_of(ins(1, "a", seq=1), upd(1, "c", seq=5), ins(1, "mirror", seq=1, table=other)), 0
    )
    ap.apply(table_of(upd(1, "b", seq=3)), 1)  # late: between the two versions
    ap.apply(table_of(dele(1, seq=7)), 2)
    s = seq_key
    assert _versions(wh) == [
        (1, "a", s((1,)), s((3,)), False),
        (1, "b", s((3,)), s((5,)), False),
        (1, "c", s((5,)), s((7,)), False),
    ]
    # the other table is a plain mirror: rules pick the mode per table
    assert "__start_at" not in wh.read("other.things").column_names


def test_history_mode_with_track_history_updates_untracked_columns_in_place(tmp_path):
    wh, ap = _setup(tmp_path, mode="history", track_history=("name",))
    ap.apply(table_of(ins(1, "a", qty=1, seq=1)), 0)
    report = ap.apply(table_of(upd(1, "a", qty=5, seq=2)), 1)
    rows = wh.read(TARGET).to_pylist()
    assert [(r["name"], r["qty"], r["__is_current"]) for r in rows] == [("a", 5, True)]
    assert report.mirrors[0].metrics["updated_in_place"] == 1


def test_history_mode_dead_letters_events_without_a_sequence(tmp_path):
    wh, ap = _setup(tmp_path, mode="history")
    report = ap.apply(table_of(ins(1, "a", seq=1), ins(2, "no sequence")), 0)
    assert dict(report.dead_letters) == {Code.MISSING_SEQ: 1}
    assert [r["id"] for r in wh.read(TARGET).to_pylist()] == [1]
    dead = _system(wh, "dead_letters").to_pylist()
    assert dead[0]["code"] == Code.MISSING_SEQ and dead[0]["target_table"] == TARGET


def test_history_mode_dead_letters_a_row_change_without_a_key(tmp_path):
    wh, ap = _setup(tmp_path, mode="history")
    keyless = ev(Op.INSERT, None, after={"id": 2, "name": "b", "qty": 1}, seq=2)
    report = ap.apply(table_of(ins(1, "a", seq=1), keyless), 0)
    assert dict(report.dead_letters) == {Code.MISSING_KEY: 1}
    dead = _system(wh, "dead_letters").to_pylist()
    assert dead[0]["code"] == Code.MISSING_KEY and dead[0]["offset"] is not None

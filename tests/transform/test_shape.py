"""Shaping a target on real Delta tables read back with deltalake: computed columns,
metadata columns, type overrides, column include/exclude and row filters."""

from __future__ import annotations

import datetime as dt
import decimal

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pydantic import ValidationError
from tests.apply.helpers import dele, ev, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.apply.options import TableOptions, TableRules
from cdcflow.apply.transactions import TransactionPolicy
from cdcflow.errors import Code, SkipReason
from cdcflow.model import Op, SourceTable
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.transform.router import Router, Routing
from cdcflow.transform.shape import shape
from cdcflow.transform.shaping import parse_override
from cdcflow_testkit.workload import mirror_by_key

ORDERS = SourceTable("test", "shop", "", "orders")
COLS = {
    "id": "int64",
    "status": "string",
    "amount": "decimal(10,2)",
    "created_at": "timestamp",
    "card": "string",
}


def _order(op, k, status="new", amount="12.50", created="2024-03-05T10:30:00", seq=None, **kw):
    after = {"id": k, "status": status, "amount": amount, "created_at": created, "card": "4111"}
    return ev(op, k, after=after, seq=seq, columns=COLS, table=ORDERS, **kw)


def _apply(tmp_path, events, **options):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    applier = BatchApplier(wh, tables=TableRules.of([("shop.*", options)]))
    reports = [applier.apply(table_of(*batch)) for batch in events]
    return wh, reports


def _rows(wh, target="shop.orders"):
    return mirror_by_key(DeltaTable(wh.table_path(target)).to_pyarrow_table())


def _schema(wh, target="shop.orders"):
    return pa.schema(DeltaTable(wh.table_path(target)).schema().to_arrow())


# ---------------------------------------------------------------- metadata columns


def test_metadata_columns_come_from_the_event(tmp_path):
    wh, _ = _apply(
        tmp_path,
        [[_order(Op.INSERT, 1, seq=7, partition=2, offset=41)]],
        metadata_columns={
            "src": "source_table",
            "op_kind": "op",
            "src_ts_ms": "ts_ms",
            "kafka_topic": "topic",
            "kafka_partition": "partition",
            "kafka_offset": "offset",
        },
    )
    row = _rows(wh)[1]
    assert row["src"] == "shop.orders"
    assert row["op_kind"] == "insert"
    assert row["src_ts_ms"] == 1007
    assert (row["kafka_topic"], row["kafka_partition"], row["kafka_offset"]) == ("t", 2, 41)
    schema = _schema(wh)
    assert schema.field("kafka_partition").type == pa.int32()
    assert schema.field("src_ts_ms").type == pa.int64()


def test_a_list_names_each_metadata_column_after_its_field(tmp_path):
    wh, _ = _apply(tmp_path, [[_order(Op.INSERT, 1, seq=1)]], metadata_columns=["table", "txn_id"])
    row = _rows(wh)[1]
    assert row["table"] == "orders" and row["txn_id"] is None


# ---------------------------------------------------------------- columns


def test_an_excluded_column_never_lands_not_even_in_the_changelog(tmp_path):
    wh, _ = _apply(
        tmp_path,
        [[_order(Op.INSERT, 1, seq=1)], [_order(Op.UPDATE, 1, status="paid", seq=2)]],
        columns={"exclude": ["card"]},
    )
    assert "card" not in _schema(wh).names
    assert _rows(wh)[1]["status"] == "paid"
    changelog = wh.read("changelog", system=True)
    assert all("card" not in (a or "") for a in changelog["after"].to_pylist())
    assert all("card" not in (c or "") for c in changelog["columns"].to_pylist())


def test_include_keeps_the_key_columns_always(tmp_path):
    wh, _ = _apply(tmp_path, [[_order(Op.INSERT, 1, seq=1)]], columns={"include": ["status"]})
    assert {n for n in _schema(wh).names if not n.startswith("_cdc")} == {"id", "status"}


def test_columns_take_include_or_exclude_not_both():
    with pytest.raises(ValidationError, match="not both"):
        TableOptions(columns={"include": ["a"], "exclude": ["b"]})


# ---------------------------------------------------------------- type overrides


def test_type_overrides_store_the_column_as_asked(tmp_path):
    wh, _ = _apply(
        tmp_path,
        [[_order(Op.INSERT, 1, seq=1), _order(Op.INSERT, 2, amount="3.10", seq=2)]],
        type_overrides={
            "amount": "decimal(38,10)",
            "id": "string",
            "created_at": "timestamptz(Asia/Shanghai)",
        },
    )
    schema = _schema(wh)
    assert schema.field("amount").type == pa.decimal128(38, 10)
    assert schema.field("id").type == pa.string()
    assert schema.field("created_at").type == pa.timestamp("us", tz="UTC")
    rows = _rows(wh)
    assert rows["1"]["amount"] == decimal.Decimal("12.5000000000")
    # 10:30 wall clock in Shanghai (UTC+8) is 02:30 UTC
    assert rows["2"]["created_at"] == dt.datetime(2024, 3, 5, 2, 30, tzinfo=dt.UTC)


def test_an_instant_overridden_to_a_zone_s_wall_clock():
    part = table_of(
        ev(
            Op.INSERT,
            1,
            after={"id": 1, "at": "2024-03-05T02:30:00+00:00"},
            columns={"id": "int64", "at": "timestamptz"},
        )
    )
    out = shape(part, TableOptions(type_overrides={"at": "timestamp(Asia/Shanghai)"}).shaping)
    assert orjson.loads(out.rows["after"][0].as_py())["at"] == "2024-03-05T10:30:00"
    assert orjson.loads(out.rows["columns"][0].as_py())["at"] == "timestamp"


def test_a_value_the_override_cannot_hold_is_a_dead_letter_naming_the_column(tmp_path):
    wh, (report,) = _apply(
        tmp_path,
        [[_order(Op.INSERT, 1, status="12", seq=1), _order(Op.INSERT, 2, status="twelve", seq=2)]],
        type_overrides={"status": "int64"},
    )
    assert report.dead_letters[Code.EXPRESSION_FAILED] == 1
    assert _rows(wh)[1]["status"] == 12 and 2 not in _rows(wh)
    letter = wh.read("dead_letters", system=True).to_pylist()[0]
    assert letter["code"] == Code.EXPRESSION_FAILED and letter["offset"] is not None
    assert "type_overrides.status" in letter["message"] and "twelve" in letter["message"]


def test_overrides_are_checked_when_loaded():
    assert parse_override("decimal(38,10)").logical == "decimal(38,10)"
    assert parse_override("timestamptz(Europe/Paris)").zone == "Europe/Paris"
    with pytest.raises(ValueError, match="not a time zone"):
        parse_override("timestamptz(Mars/Olympus)")
    with pytest.raises(
        ValidationError, match=r"type_overrides\.a: 'decimal\(x\)' is not a logical"
    ):
        TableOptions(type_overrides={"a": "decimal(x)"})
    with pytest.raises(ValidationError, match="unknown metadata 'tabel'"):
        TableOptions(metadata_columns=["tabel"])


# ---------------------------------------------------------------- computed columns


def test_computed_columns_are_evaluated_in_arrow_in_order(tmp_path):
    wh, _ = _apply(
        tmp_path,
        [
            [
                _order(Op.INSERT, 1, seq=1),
                _order(Op.INSERT, 2, created="2023-12-31T23:59:59", seq=2),
            ],
            [_order(Op.UPDATE, 1, status="paid", created="2024-04-01T00:00:00", seq=3)],
        ],
        computed_columns={
            "order_date": "date(created_at)",
            "order_year": "year(order_date)",
            "label": "concat(upper(status), '-', cast(id AS string))",
            "bucket": "bucket(id, 16)",
        },
        partition_by=["order_year"],
    )
    rows = _rows(wh)
    assert rows[1]["order_date"] == dt.date(2024, 4, 1) and rows[1]["label"] == "PAID-1"
    assert rows[2]["order_date"] == dt.date(2023, 12, 31) and rows[2]["order_year"] == 2023
    assert all(0 <= r["bucket"] < 16 for r in rows.values())
    assert _schema(wh).field("order_date").type == pa.date32()
    assert DeltaTable(wh.table_path("shop.orders")).metadata().partition_columns == ["order_year"]


def test_a_computed_column_that_fails_for_a_row_is_its_dead_letter(tmp_path):
    wh, (report,) = _apply(
        tmp_path,
        [[_order(Op.INSERT, 1, status="7", seq=1), _order(Op.INSERT, 2, status="x", seq=2)]],
        computed_columns={"status_no": "cast(status AS int64)"},
    )
    assert report.dead_letters[Code.EXPRESSION_FAILED] == 1
    assert _rows(wh)[1]["status_no"] == 7 and 2 not in _rows(wh)
    message = wh.read("dead_letters", system=True)["message"][0].as_py()
    assert "computed column 'status_no'" in message


def test_a_partial_image_without_the_input_keeps_the_stored_computed_value(tmp_path):
    insert = _order(Op.INSERT, 1, seq=1)  # (offsets in creation order)
    partial = ev(Op.UPDATE, 1, after={"id": 1, "status": "paid"}, columns=COLS, table=ORDERS, seq=2)
    wh, _ = _apply(
        tmp_path,
        [[insert], [partial]],
        computed_columns={"order_date": "date(created_at)"},
    )
    row = _rows(wh)[1]
    assert row["status"] == "paid" and row["order_date"] == dt.date(2024, 3, 5)


def test_expressions_are_checked_when_loaded():
    with pytest.raises(ValidationError, match=r"computed_columns\.d: "):
        TableOptions(computed_columns={"d": "date(created_at"})
    with pytest.raises(ValidationError, match=r"filter: "):
        TableOptions(filter="amount >")


# ---------------------------------------------------------------- row filters


def test_a_row_filter_keeps_the_mirror_equal_to_the_filtered_source(tmp_path):
    batches = [
        [
            _order(Op.INSERT, 1, status="new", seq=1),
            _order(Op.INSERT, 2, status="test", seq=2),  # never in
            _order(Op.INSERT, 3, status="new", seq=3),
        ],
        [
            _order(Op.UPDATE, 1, status="test", seq=4),  # leaves the set: deleted
            _order(Op.UPDATE, 2, status="new", seq=5),  # enters it: inserted
            dele(3, seq=6, table=ORDERS),
        ],
    ]
    wh, reports = _apply(tmp_path, batches, filter="status <> 'test'")
    assert reports[0].skipped[SkipReason.ROW_FILTERED] == 1
    assert set(_rows(wh)) == {2}
    assert _rows(wh)[2]["status"] == "new"
    assert not any(r.dead_letters for r in reports)


def test_a_batch_whose_first_event_the_filter_skips_makes_its_table_with_the_declared_types(
    tmp_path,
):
    # the batch states the declaration on its first event only: it must outlive that event
    wh, (report,) = _apply(
        tmp_path,
        [[_order(Op.INSERT, 1, status="test", seq=1), _order(Op.INSERT, 2, seq=2)]],
        filter="status <> 'test'",
    )
    assert not report.dead_letters
    assert report.skipped[SkipReason.ROW_FILTERED] == 1
    assert set(_rows(wh)) == {2}
    assert _schema(wh).field("amount").type == pa.decimal128(10, 2)


@pytest.mark.parametrize(
    ("first", "second", "row_filter", "code"),
    [
        ("test", "new", "status <> 'test'", None),  # left out on purpose
        ("x", "7", "cast(status AS int64) > 0", Code.EXPRESSION_FAILED),  # refused
    ],
)
def test_a_batch_whose_first_event_of_a_table_leaves_keeps_the_table_s_types(
    tmp_path, first, second, row_filter, code
):
    """A batch states a table's columns once, on its first event; when the filter leaves
    that event out or refuses it, the events that stay still carry the declaration (found
    by tests/commands/test_replay_kills.py: the table was merged without its columns and
    stopped, TABLE_FAULT)."""
    wh, (report,) = _apply(
        tmp_path,
        [[_order(Op.INSERT, 2, status=first, seq=1), _order(Op.INSERT, 1, status=second, seq=2)]],
        filter=row_filter,
    )
    assert dict(report.dead_letters) == ({code: 1} if code else {})
    assert _rows(wh) == {
        1: {
            "id": 1,
            "status": second,
            "amount": decimal.Decimal("12.50"),
            "created_at": dt.datetime(2024, 3, 5, 10, 30),
            "card": "4111",
        }
    }


def test_an_update_whose_before_image_was_filtered_out_too_is_skipped():
    before = {"id": 1, "status": "test", "amount": "1.00", "created_at": None, "card": None}
    after = {**before, "amount": "2.00"}
    part = table_of(
        ev(Op.UPDATE, 1, before=before, after=after, columns=COLS, table=ORDERS, seq=1),
        ev(Op.DELETE, 2, before={**before, "id": 2}, columns=COLS, table=ORDERS, seq=2),
    )
    out = shape(part, TableOptions(filter="status <> 'test'").shaping)
    assert out.filtered.num_rows == 2 and out.rows.num_rows == 0


def test_a_filtered_update_without_a_before_image_becomes_a_delete():
    part = table_of(_order(Op.UPDATE, 1, status="test", seq=1))
    out = shape(part, TableOptions(filter="status <> 'test'").shaping)
    assert out.rows["op"].to_pylist() == ["delete"] and out.rows["after"][0].as_py() is None


def test_filter_and_selection_together_on_the_changelog(tmp_path):
    wh, (report,) = _apply(
        tmp_path,
        [[_order(Op.INSERT, 1, status="new", seq=1), _order(Op.INSERT, 2, status="test", seq=2)]],
        filter="status = 'new'",
        columns={"exclude": ["card"]},
    )
    assert report.skipped[SkipReason.ROW_FILTERED] == 1
    changelog = wh.read("changelog", system=True)
    assert changelog["offset"].to_pylist() == [changelog["offset"][0].as_py()]
    assert wh.read("batches", system=True)["records"].to_pylist() == [2]


def test_metadata_columns_follow_each_change(tmp_path):
    wh, _ = _apply(
        tmp_path,
        [[ins(1, "a", table=ORDERS, seq=1)], [upd(1, "b", table=ORDERS, seq=2)]],
        metadata_columns={"op_kind": "op"},
    )
    assert _rows(wh)[1]["op_kind"] == "update"


def test_the_changelog_keeps_the_batch_order_across_shaped_and_plain_targets(tmp_path):
    """Parts of several targets, shaped and not, interleaved with a heartbeat: the
    changelog holds the batch's events in the batch's order, less the rows filtered out."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    applier = BatchApplier(
        wh, tables=TableRules.of([("shop.orders", {"filter": "status <> 'test'"})])
    )
    beat = ev(Op.HEARTBEAT, table=SourceTable("test"), columns=None, offset=102)
    events = [
        _order(Op.INSERT, 1, seq=1, offset=100),
        ins(7, "x", seq=1, offset=101),  # db.items: not shaped
        beat,
        _order(Op.INSERT, 2, status="test", seq=2, offset=103),  # filtered out
        upd(7, "y", seq=2, offset=104),
        _order(Op.UPDATE, 1, status="paid", seq=3, offset=105),
    ]
    report = applier.apply(table_of(*events))
    assert report.skipped[SkipReason.ROW_FILTERED] == 1
    changelog = wh.read("changelog", system=True)
    assert changelog["offset"].to_pylist() == [100, 101, 102, 104, 105]
    assert changelog["op"].to_pylist() == ["insert", "insert", "heartbeat", "update", "update"]
    assert set(_rows(wh)) == {1} and _rows(wh)[1]["status"] == "paid"
    assert set(_rows(wh, "db.items")) == {7}


def test_a_batch_resolves_each_target_s_options_once(tmp_path):
    rules = TableRules.of([("shop.*", {"filter": "status <> 'test'"})])
    asked: list[str] = []

    def tables(target: str) -> TableOptions:
        asked.append(target)
        return rules(target)

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    events = [_order(Op.INSERT, 1, seq=1), ins(7, "x", seq=1), _order(Op.UPDATE, 1, seq=2)]
    BatchApplier(wh, tables=tables).apply(table_of(*events))
    assert sorted(asked) == ["db.items", "shop.orders"]


def test_the_rules_compile_their_shaping_once_at_load():
    rules = TableRules.of(
        [
            ("shop.*", {"filter": "amount > 1", "computed_columns": {"d": "date(created_at)"}}),
            ("shop.orders", {"filter": "amount > 2", "type_overrides": {"amount": "string"}}),
        ]
    )
    first, again, other = rules("shop.orders"), rules("shop.orders"), rules("shop.items")
    assert first.shaping.filter is again.shaping.filter  # kept, not parsed again
    assert first.shaping.filter.text == "amount > 2" and other.shaping.filter.text == "amount > 1"
    assert first.shaping.computed["d"] is other.shaping.computed["d"]
    assert first.shaping.overrides["amount"] == parse_override("string")
    assert not rules("crm.people").shaping.shapes
    assert TableOptions(filter="a = 1").shaping.filter.columns == ("a",)


def test_records_shaping_skips_are_skipped_in_the_batches_ledger(tmp_path):
    """Every record is in the ledger as changed, joined, skipped or a dead letter: one
    order kept, one filtered out; the ledger must say 1 changed and 1 skipped."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    applier = BatchApplier(
        wh, tables=TableRules.of([("shop.orders", {"filter": "status <> 'test'"})])
    )
    events = [
        _order(Op.INSERT, 1, seq=1, offset=0),
        _order(Op.INSERT, 2, status="test", seq=2, offset=1),  # filtered out
    ]
    report = applier.apply(table_of(*events))
    assert report.skipped[SkipReason.ROW_FILTERED] == 1
    (batch,) = wh.read("batches", system=True).to_pylist()
    changelog = wh.read("changelog", system=True)
    assert (batch["records"], batch["skipped"]) == (2, 1)
    assert batch["events"] == changelog.num_rows == 1


def _in_transaction(events: pa.Table, txn_id: str, last: list[bool | None]) -> pa.Table:
    """``events`` as rows of transaction ``txn_id`` that ends where ``last`` is true
    (``None``: the row is in no transaction)."""
    ids = [None if flag is None else txn_id for flag in last]
    events = events.set_column(
        events.schema.get_field_index("txn_id"), "txn_id", pa.array(ids, pa.string())
    )
    return events.set_column(
        events.schema.get_field_index("txn_last"), "txn_last", pa.array(last, pa.bool_())
    )


def test_records_held_for_their_transaction_are_accounted_as_their_shaping_takes_them(tmp_path):
    """A transaction open at the end of batch 1 holds two records, one of which the
    filter leaves out when batch 2 releases them: batch 1's ledger row (whose offsets
    they are) counts it skipped and the other as an event; batch 2's counts only its own
    record, though its report counts the skip."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    applier = BatchApplier(
        wh,
        tables=TableRules.of([("shop.orders", {"filter": "status <> 'test'"})]),
        transactions=TransactionPolicy(),
    )
    first = table_of(
        _order(Op.INSERT, 1, status="test", seq=1, offset=0),  # held, then filtered out
        _order(Op.INSERT, 2, seq=2, offset=1),  # held, then applied
        _order(Op.INSERT, 3, seq=3, offset=2),  # in no transaction: applied at once
    )
    second = table_of(_order(Op.INSERT, 4, seq=4, offset=3))  # ends the transaction
    r1 = applier.apply(_in_transaction(first, "a", [False, False, None]))
    r2 = applier.apply(_in_transaction(second, "a", [True]))
    assert (r1.skipped[SkipReason.ROW_FILTERED], r2.skipped[SkipReason.ROW_FILTERED]) == (0, 1)
    assert set(_rows(wh)) == {2, 3, 4}
    batches = sorted(wh.read("batches", system=True).to_pylist(), key=lambda b: b["batch_id"])
    counts = [(b["first_offset"], b["records"], b["events"], b["skipped"]) for b in batches]
    assert counts == [(0, 3, 2, 1), (3, 1, 1, 0)]
    assert wh.read("changelog", system=True).num_rows == sum(b["events"] for b in batches)


def test_records_left_out_or_refused_by_shaping_are_skipped_or_dead_in_the_ledger(tmp_path):
    """A left-out table's record is skipped, a record whose computed column fails is a
    dead letter, and a record with one event kept is changed: records = changed +
    skipped + dead letters, and the events are the changelog's."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    router = Router(routing=Routing(exclude=[r"db\.items"]))
    applier = BatchApplier(
        wh,
        router=router,
        tables=TableRules.of(
            [("shop.orders", {"computed_columns": {"n": "cast(status AS int64)"}})]
        ),
    )
    report = applier.apply(
        table_of(
            _order(Op.INSERT, 1, status="7", seq=1, offset=0),
            _order(Op.INSERT, 2, status="x", seq=2, offset=1),  # refused: not a number
            ins(7, "a", seq=3, offset=2),  # db.items: left out
        )
    )
    assert report.dead_letters[Code.EXPRESSION_FAILED] == 1
    assert report.skipped[SkipReason.TABLE_EXCLUDED] == 1
    (batch,) = wh.read("batches", system=True).to_pylist()
    assert (batch["records"], batch["events"], batch["skipped"], batch["dead_letters"]) == (
        3,
        1,
        1,
        1,
    )
    assert wh.read("changelog", system=True)["offset"].to_pylist() == [0]

"""Which target table each event goes to, and a batch's events grouped per target."""

from __future__ import annotations

import pyarrow as pa
from tests.apply.helpers import ins, table_of, upd

from cdcflow.model import ChangeEvent, Op, Origin, SourceTable
from cdcflow.transform.router import Router, by_target, declarations_on_every_row


def test_the_template_drops_empty_parts_and_their_dots():
    router = Router()
    assert router.target("debezium-json", "inventory", "public", "customers") == (
        "inventory.public.customers"
    )
    assert router.target("maxwell-json", "inventory", "", "customers") == "inventory.customers"
    assert Router("{format}.{table}").target("canal-json", "db", None, "t") == "canal-json.t"


def test_a_batch_is_split_per_target_in_target_order_and_markers_go_nowhere():
    other = SourceTable("test", "a_db", "", "things")
    beat = ChangeEvent(op=Op.HEARTBEAT, source=SourceTable("test"), origin=Origin("t", 0, 99))
    rows = table_of(ins(1, "a", seq=1), ins(7, "x", seq=1, table=other), beat, upd(1, "b", seq=2))
    parts = list(by_target(rows, Router()))
    assert [t for t, _ in parts] == ["a_db.things", "db.items"]
    assert [p.num_rows for _, p in parts] == [1, 2]
    assert parts[1][1]["op"].to_pylist() == ["insert", "update"]  # batch order kept
    assert list(by_target(table_of(beat), Router())) == []


def test_declarations_are_filled_forward_per_source_table():
    rows = table_of(ins(1, "a", seq=1), ins(2, "b", seq=2))
    assert rows["columns"].null_count == 1  # a batch states each declaration once
    filled = declarations_on_every_row(rows)
    assert filled["columns"].null_count == 0
    assert len(set(filled["columns"].to_pylist())) == 1
    assert declarations_on_every_row(rows.slice(0, 0)).num_rows == 0
    assert isinstance(filled, pa.Table)

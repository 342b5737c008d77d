"""Which target table each event goes to, and a batch's events grouped per target."""

from __future__ import annotations

import orjson
import pyarrow as pa
from tests.apply.helpers import COLUMNS, ins, table_of, upd

from cdcflow.model import ChangeEvent, Op, Origin, SourceTable
from cdcflow.transform.router import (
    Router,
    Routing,
    by_target,
    declarations_on_every_row,
    filter_declared,
    parts_by_target,
)


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


def test_a_declaration_on_a_row_that_leaves_moves_to_its_source_table_s_next_kept_row():
    a, b = SourceTable("test", "db", "", "a"), SourceTable("test", "db", "", "b")
    wider = {**COLUMNS, "note": "string"}
    rows = table_of(
        ins(1, "x", table=a), ins(7, "x", table=b), ins(2, "x", table=a),
        ins(3, "x", table=a, columns=wider), ins(8, "x", table=b), ins(4, "x", table=a),
    )  # fmt: skip
    narrow, wide = (orjson.dumps(c).decode() for c in (COLUMNS, wider))
    assert rows["columns"].to_pylist() == [narrow, narrow, None, wide, None, None]

    def kept(*keep: bool) -> list[tuple[int, str | None]]:
        out = filter_declared(rows, pa.array(keep))
        return list(zip(out["key"].to_pylist(), out["columns"].to_pylist(), strict=True))

    # each kept row under the declaration it was under: the first kept row of a source
    # takes the declaration its dropped rows made, a row that declares keeps its own
    assert kept(False, False, True, False, True, True) == [
        ('{"id":2}', narrow), ('{"id":8}', narrow), ('{"id":4}', wide),
    ]  # fmt: skip
    assert kept(False, True, True, True, True, True) == [
        ('{"id":7}', narrow), ('{"id":2}', narrow), ('{"id":3}', wide),
        ('{"id":8}', None), ('{"id":4}', None),
    ]  # fmt: skip
    # nothing declaring leaves: the filter alone
    assert kept(True, True, False, True, True, False) == [
        ('{"id":1}', narrow), ('{"id":7}', narrow), ('{"id":3}', wide), ('{"id":8}', None),
    ]  # fmt: skip
    assert kept(False, False, False, False, False, False) == []


def test_parts_carry_their_row_numbers_in_the_batch():
    other = SourceTable("test", "a_db", "", "things")
    beat = ChangeEvent(op=Op.HEARTBEAT, source=SourceTable("test"), origin=Origin("t", 0, 99))
    rows = table_of(
        ins(1, "a", seq=1), beat, ins(7, "x", seq=1, table=other), upd(1, "b", seq=2),
        upd(7, "y", seq=2, table=other), beat,
    )  # fmt: skip
    parts = parts_by_target(rows, Router())
    assert [(p.target, p.positions.tolist()) for p in parts] == [
        ("a_db.things", [2, 4]),
        ("db.items", [0, 3]),
    ]
    for p in parts:
        assert p.rows.equals(rows.take(pa.array(p.positions)))
    left_out = Router(routing=Routing(exclude=(r"a_db\..*",)))
    assert [(p.target, p.positions.tolist()) for p in parts_by_target(rows, left_out)] == [
        ("db.items", [0, 3])
    ]
    assert parts_by_target(rows.slice(0, 0), Router()) == []

"""The schema policy decides without Delta: a stored Arrow schema, one batch's events for
the table and its ``schema_changes`` policy in, a decision (or a stop) out."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from tests.apply.helpers import COLUMNS, ev, ins, table_of

from cdcflow.apply.schema_policy import SchemaStop, decide_schema, stored_types
from cdcflow.errors import Code
from cdcflow.model import Op, seq_key

#: a mirror of ``db.items`` as Delta stores it: data columns, then bookkeeping
STORED = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("qty", pa.int32()),
        ("_cdc_seq", pa.string()),
        ("_cdc_ts_ms", pa.int64()),
    ]
)
WITH_COLOR = {**COLUMNS, "color": "string"}


def _with_color(seq=2, offset=None):
    after = {"id": 2, "name": "b", "qty": 1, "color": "red"}
    return ev(Op.INSERT, 2, after=after, seq=seq, columns=WITH_COLOR, offset=offset)


def _changes(decision):
    return [(c.change, c.column, c.old_type, c.new_type, c.applied) for c in decision.changes]


def test_the_stored_data_columns_leave_bookkeeping_out():
    assert stored_types(STORED) == {"id": "int64", "name": "string", "qty": "int32"}
    assert stored_types(None) == {}


def test_a_new_table_takes_the_declared_columns_and_records_nothing():
    decision = decide_schema(None, table_of(ins(1, "a", seq=1)), policy="fail")
    assert decision.types == COLUMNS
    assert decision.changes == [] and decision.widen == {} and decision.copies == []


def test_evolve_adds_a_new_column_and_widens_a_stored_one():
    part = table_of(ins(1, "a", seq=1), _with_color())
    decision = decide_schema(STORED, part, policy="evolve", key_columns=["id"])
    assert decision.types == {"id": "int64", "name": "string", "qty": "int64", "color": "string"}
    assert sorted(_changes(decision)) == [
        ("add", "color", None, "string", True),
        ("widen", "qty", "int32", "int64", True),
    ]
    assert decision.widen == {"qty": "int64"}
    add = next(c for c in decision.changes if c.change == "add")
    assert add.origin["seq"] == seq_key((2,))  # the first event that declared the column


def test_ignore_records_the_changes_but_keeps_the_stored_schema():
    part = table_of(ins(1, "a", seq=1), _with_color())
    decision = decide_schema(STORED, part, policy="ignore", key_columns=["id"])
    assert decision.types == {"id": "int64", "name": "string", "qty": "int32"}
    assert sorted(_changes(decision)) == [
        ("add", "color", None, "string", False),
        ("widen", "qty", "int32", "int64", False),
    ]
    assert decision.widen == {}


def test_fail_stops_the_table_naming_the_offending_event():
    stored = STORED.set(2, pa.field("qty", pa.int64()))
    part = table_of(ins(1, "a", seq=1), _with_color(seq=2, offset=77))
    with pytest.raises(SchemaStop) as stop:
        decide_schema(stored, part, policy="fail", key_columns=["id"], target="db.items")
    assert stop.value.code == Code.SCHEMA_CHANGE
    assert "color" in stop.value.message and "cdcflow resume db.items" in stop.value.message
    assert stop.value.first["offset"] == 77


def test_a_type_that_cannot_hold_the_stored_values_stops_even_under_evolve():
    cols = {**COLUMNS, "qty": "string"}
    part = table_of(ev(Op.INSERT, 1, after={"id": 1, "name": "a", "qty": "x"}, seq=1, columns=cols))
    with pytest.raises(SchemaStop, match="cannot hold without loss"):
        decide_schema(STORED, part, policy="evolve", key_columns=["id"])


def test_a_column_absent_from_every_full_image_is_dropped_and_declared_again_restored():
    cols = {"id": "int64", "qty": "int32"}
    part = table_of(ev(Op.INSERT, 1, after={"id": 1, "qty": 1}, seq=1, columns=cols))
    decision = decide_schema(STORED, part, policy="evolve", key_columns=["id"])
    assert _changes(decision) == [("drop", "name", "string", None, True)]
    assert "name" in decision.types  # kept in the table, NULL from then on
    again = decide_schema(
        STORED, table_of(ins(1, "a", seq=2)), key_columns=["id"], dropped_before={"name"}
    )
    assert [(c.change, c.column) for c in again.changes if c.change == "restore"] == [
        ("restore", "name")
    ]


def test_a_rename_stated_by_ddl_moves_the_values_under_evolve_only():
    ddl = replace(
        ev(Op.DDL, None, seq=3, columns=None),
        ddl="ALTER TABLE `db`.`items` RENAME COLUMN `name` TO `title`",
    )
    renamed = {"id": "int64", "title": "string", "qty": "int32"}
    after = ev(Op.UPDATE, 2, after={"id": 2, "title": "B", "qty": 5}, seq=4, columns=renamed)
    part = table_of(ddl, after)
    decision = decide_schema(STORED, part, policy="evolve", key_columns=["id"])
    assert decision.copies == [("name", "title")]
    assert decision.types["title"] == "string"
    assert [(c.change, c.column, c.message) for c in decision.changes] == [
        ("rename", "name", "name -> title"),
        ("drop", "name", None),
    ]
    ignored = decide_schema(STORED, part, policy="ignore", key_columns=["id"])
    assert ignored.copies == [] and "title" not in ignored.types
    with pytest.raises(SchemaStop, match="renamed"):
        decide_schema(STORED, part, policy="fail", key_columns=["id"])

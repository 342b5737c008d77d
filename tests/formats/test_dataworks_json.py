"""Unit tests for ``dataworks-json`` (Alibaba Cloud DataWorks sync-to-Kafka JSON)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import pickle
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.dataworks_json import DataWorksJsonDecoder, DataWorksJsonOptions
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for
from cdcflow_testkit.encoders.dataworks_json import DataWorksJsonEncoder

CORPUS = Path(__file__).parent / "corpus" / "aliyun"
CASES = Path(__file__).parent / "cases" / "dataworks-json"
UTC = dt.UTC
ROW_ID = "#alibaba_rds_row_id#"

COLUMNS = [
    {"name": "id", "type": "LONG"},
    {"name": "name", "type": "STRING"},
    {"name": "price", "type": "DOUBLE"},
    {"name": "active", "type": "BOOLEAN"},
    {"name": "ts", "type": "DATE"},
    {"name": "blob", "type": "BYTES"},
]
ROW = {
    "id": 7,
    "name": "scooter",
    "price": "12.500000",
    "active": True,
    "ts": 1590315269123,
    "blob": base64.b64encode(b"\x00\x01\xff").decode(),
}
TYPED = {
    "id": 7,
    "name": "scooter",
    "price": 12.5,
    "active": True,
    "ts": dt.datetime(2020, 5, 24, 10, 14, 29, 123000, tzinfo=UTC),
    "blob": b"\x00\x01\xff",
}


def _msg(
    op: str = "INSERT",
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    *,
    columns: Any = COLUMNS,
    pk: Any = ("id",),
    table: str = "items",
    sequence_id: Any = "1620457642589000007",
    event_time: Any = 1_620_457_896_000,
    **payload: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "before": None if before is None else {"dataColumn": dict(before)},
        "after": None if after is None else {"dataColumn": dict(after)},
        "sequenceId": sequence_id,
        "timestamp": {
            "eventTime": event_time,
            "systemTime": 1_620_457_896_977,
            "checkpointTime": event_time,
        },
        "op": op,
        "ddl": None,
    }
    body.update(payload)
    return {
        "schema": {
            "dataColumn": columns,
            "primaryKey": None if pk is None else list(pk),
            "source": {"dbType": "MySQL", "dbName": "shop", "tableName": table},
        },
        "payload": body,
        "version": "0.0.1",
    }


def _records(*msgs: Any) -> list[Record]:
    return [
        Record(
            value=m if isinstance(m, bytes) else orjson.dumps(m),
            origin=Origin("t", 0, i),
        )
        for i, m in enumerate(msgs)
    ]


def _batch(*msgs: Any, **options: Any):
    return decoder_for("dataworks-json", options or None).decode_batch(_records(*msgs))


def _events(*msgs: Any, **options: Any):
    result = _batch(*msgs, **options)
    assert result.dead_letters == [], result.dead_letters
    return result.events


def _dead(msg: Any, **options: Any) -> str:
    result = _batch(msg, **options)
    assert result.events == [], result.events
    assert len(result.dead_letters) == 1
    assert result.dead_letters[0].message
    return result.dead_letters[0].code


# --------------------------------------------------------------------------- row ops


def test_insert_types_every_column_and_fills_columns():
    (e,) = _events(_msg("INSERT", after=ROW))
    assert e.op is Op.INSERT and e.before is None
    assert e.after == TYPED
    assert e.key == {"id": 7}
    assert e.columns == {
        "id": "int64",
        "name": "string",
        "price": "float64",
        "active": "boolean",
        "ts": "timestamptz",
        "blob": "binary",
    }
    assert e.source == SourceTable("dataworks-json", "shop", "", "items")
    assert e.seq == (1620457642589000007, 1)
    assert e.ts_ms == 1_620_457_896_000
    assert e.meta is None and e.ddl is None and e.txn is None
    assert e.origin == Origin("t", 0, 0)


def test_delete_uses_the_before_image():
    (e,) = _events(_msg("DELETE", before=ROW))
    assert e.op is Op.DELETE and e.after is None and e.before == TYPED and e.key == {"id": 7}


def test_one_record_update_mode_gives_one_update_with_both_images():
    after = {**ROW, "id": 8, "name": "bike"}
    (e,) = _events(_msg("UPDATE_AFTER", before=ROW, after=after))
    assert e.op is Op.UPDATE and e.meta is None
    assert e.before == TYPED and e.after == {**TYPED, "id": 8, "name": "bike"}
    assert e.key == {"id": 8}  # the key of the after image
    assert e.seq == (1620457642589000007, 1)


def test_update_pair_is_joined_into_one_update():
    before = _msg("UPDATE_BEFOR", before=ROW)
    after = _msg("UPDATE_AFTER", after={**ROW, "name": "bike"})
    (e,) = _events(before, after)
    assert e.op is Op.UPDATE and e.meta is None
    assert e.before == TYPED and e.after == {**TYPED, "name": "bike"}
    assert e.key == {"id": 7}
    assert e.seq == (1620457642589000007, 1)
    assert e.origin == Origin("t", 0, 1)  # the after half's record


def test_update_pair_is_joined_in_reverse_order_and_across_other_events():
    other = _msg("INSERT", after={**ROW, "id": 99}, table="other", sequence_id="5")
    before = _msg("UPDATE_BEFOR", before=ROW)
    after = _msg("UPDATE_AFTER", after={**ROW, "name": "bike"})
    events = _events(after, other, before)
    assert [e.op for e in events] == [Op.UPDATE, Op.INSERT]
    assert events[0].before == TYPED and events[0].after["name"] == "bike"
    events = _events(before, other, after)
    assert [e.op for e in events] == [Op.UPDATE, Op.INSERT]
    assert events[0].meta is None


def test_lone_halves_stay_halves():
    (b,) = _events(_msg("UPDATE_BEFOR", before=ROW))
    assert b.op is Op.UPDATE and b.before == TYPED and b.after is None
    assert b.meta == {"half": "before"} and b.key == {"id": 7}
    assert b.seq == (1620457642589000007, 0)
    (a,) = _events(_msg("UPDATE_AFTER", after=ROW))
    assert a.op is Op.UPDATE and a.before is None and a.after == TYPED
    assert a.meta == {"half": "after"}
    assert seq_key(b.seq) < seq_key(a.seq)  # a before half sorts before its after half


def test_halves_with_different_sequence_ids_or_tables_are_not_joined():
    b = _msg("UPDATE_BEFOR", before=ROW, sequence_id="10")
    a = _msg("UPDATE_AFTER", after=ROW, sequence_id="11")
    assert [e.meta for e in _events(b, a)] == [{"half": "before"}, {"half": "after"}]
    a_other = _msg("UPDATE_AFTER", after=ROW, sequence_id="10", table="other")
    assert [e.meta for e in _events(b, a_other)] == [{"half": "before"}, {"half": "after"}]


def test_a_duplicated_half_pairs_once():
    b = _msg("UPDATE_BEFOR", before=ROW)
    a = _msg("UPDATE_AFTER", after=ROW)
    events = _events(b, b, a)
    assert [e.meta for e in events] == [None, {"half": "before"}]


def test_halves_in_different_batches_stay_halves():
    decoder = DataWorksJsonDecoder()
    r1 = decoder.decode_batch(_records(_msg("UPDATE_BEFOR", before=ROW)))
    r2 = decoder.decode_batch(_records(_msg("UPDATE_AFTER", after=ROW)))
    assert r1.events[0].meta == {"half": "before"}
    assert r2.events[0].meta == {"half": "after"}


def test_pairing_can_be_switched_off():
    b = _msg("UPDATE_BEFOR", before=ROW)
    a = _msg("UPDATE_AFTER", after=ROW)
    events = _events(b, a, pair_updates=False)
    assert [e.meta for e in events] == [{"half": "before"}, {"half": "after"}]


def test_halves_without_sequence_id_are_not_joined():
    b = _msg("UPDATE_BEFOR", before=ROW, sequence_id=None)
    a = _msg("UPDATE_AFTER", after=ROW, sequence_id=None)
    events = _events(b, a)
    assert [e.seq for e in events] == [None, None]
    assert [e.meta for e in events] == [{"half": "before"}, {"half": "after"}]


# --------------------------------------------------------------------------- other ops


def _control(op: str, **payload: Any) -> dict[str, Any]:
    msg = _msg(op, **payload)
    msg["schema"] = {"dataColumn": None, "primaryKey": None, "source": None}
    return msg


def test_heartbeat():
    (e,) = _events(_control("MHEARTBEAT", sequence_id=None))
    assert e.op is Op.HEARTBEAT and e.key is None and e.seq is None
    assert e.source == SourceTable("dataworks-json")
    assert e.ts_ms == 1_620_457_896_000 and e.meta == {"op": "MHEARTBEAT"}


@pytest.mark.parametrize(
    ("op", "want"),
    [
        ("TRANSACTION_BEGIN", Op.BEGIN),
        ("TRANSACTION_END", Op.COMMIT),
        ("XACOMMIT", Op.COMMIT),
        ("XAROLLBACK", Op.MESSAGE),
        ("GTID", Op.MESSAGE),
    ],
)
def test_transaction_and_marker_ops(op, want):
    (e,) = _events(_control(op, sequence_id="42"))
    assert e.op is want and e.meta == {"op": op} and e.key is None
    assert e.seq == (42, 1) and e.ddl is None


def test_marker_text_goes_to_meta():
    (e,) = _events(_control("GTID", ddl={"text": "SET GTID_NEXT='3E11FA47:23'"}))
    assert e.op is Op.MESSAGE and e.ddl is None
    assert e.meta == {"op": "GTID", "text": "SET GTID_NEXT='3E11FA47:23'"}


@pytest.mark.parametrize("op", ["CREATE", "ALTER", "ERASE", "QUERY", "RENAME", "CINDEX", "DINDEX"])
def test_ddl_ops(op):
    msg = _msg(op, ddl={"text": "ALTER TABLE items ADD COLUMN c INT", "ddlMeta": "AAAA"})
    (e,) = _events(msg)
    assert e.op is Op.DDL and e.ddl == "ALTER TABLE items ADD COLUMN c INT"
    assert e.meta == {"op": op} and e.key is None and e.before is None and e.after is None
    assert e.source.table == "items"
    assert e.columns is not None and e.columns["id"] == "int64"


def test_ddl_without_text_or_schema():
    (e,) = _events(_control("ALTER"))
    assert e.op is Op.DDL and e.ddl is None and e.columns is None


def test_truncate():
    (e,) = _events(_msg("TRUNCATE", ddl={"text": "TRUNCATE TABLE items"}))
    assert e.op is Op.TRUNCATE and e.ddl == "TRUNCATE TABLE items"
    assert e.source.table == "items" and e.key is None and e.meta == {"op": "TRUNCATE"}
    (e,) = _events(_msg("TRUNCATE"))
    assert e.op is Op.TRUNCATE and e.ddl is None


@pytest.mark.parametrize(
    "op", ["insert", "UPDATE_BEFORE", "Delete", "UPDATE", "READ", "", "MHEARTBEAT "]
)
def test_unknown_ops_are_never_guessed(op):
    # UPDATE_BEFORE is what some readers expect; DataWorks writes UPDATE_BEFOR
    assert _dead(_msg(op, before=ROW, after=ROW)) == Code.UNKNOWN_OP


def test_op_missing_or_not_a_string():
    msg = _msg()
    del msg["payload"]["op"]
    assert _dead(msg) == Code.MISSING_FIELD
    assert _dead(_msg(op=["INSERT"], after=ROW)) == Code.BAD_FIELD  # type: ignore[arg-type]
    assert _dead(_msg(op=1, after=ROW)) == Code.BAD_FIELD  # type: ignore[arg-type]


# --------------------------------------------------------------------------- values


def _one_column(type_: str, value: Any) -> Any:
    cols = [{"name": "id", "type": "LONG"}, {"name": "v", "type": type_}]
    return _msg(after={"id": 1, "v": value}, columns=cols)


@pytest.mark.parametrize(
    ("type_", "value", "want"),
    [
        ("BOOLEAN", True, True),
        ("BOOLEAN", False, False),
        ("DOUBLE", 1.25, 1.25),
        ("DOUBLE", 3, 3.0),
        ("DOUBLE", "1.100000", 1.1),
        ("DOUBLE", "-2.5E3", -2500.0),
        ("DATE", 1731661114000, dt.datetime(2024, 11, 15, 8, 58, 34, tzinfo=UTC)),
        ("DATE", "1731661114001", dt.datetime(2024, 11, 15, 8, 58, 34, 1000, tzinfo=UTC)),
        ("DATE", -1000, dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)),
        ("BYTES", base64.b64encode("héllo".encode()).decode(), "héllo".encode()),
        ("BYTES", "", b""),
        ("LONG", 9223372036854775807, 9223372036854775807),
        ("LONG", -9223372036854775808, -9223372036854775808),
        ("LONG", "-42", -42),
        ("LONG", "+7", 7),
        ("LONG", "-9223372036854775808", -9223372036854775808),
        ("STRING", "", ""),
        ("STRING", "多字节", "多字节"),
    ],
)
def test_values_are_typed(type_, value, want):
    (e,) = _events(_one_column(type_, value))
    got = e.after["v"]
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("type_", ["BOOLEAN", "DOUBLE", "DATE", "BYTES", "LONG", "STRING"])
def test_null_is_null_for_every_type(type_):
    (e,) = _events(_one_column(type_, None))
    assert "v" in e.after and e.after["v"] is None


def test_double_nan_text():
    (e,) = _events(_one_column("DOUBLE", "NaN"))
    assert math.isnan(e.after["v"])


@pytest.mark.parametrize(
    ("type_", "value"),
    [
        ("STRING", 5),
        ("STRING", True),
        ("STRING", {"a": 1}),
        ("LONG", "abc"),
        ("LONG", 1.5),
        ("LONG", True),
        ("LONG", [1]),
        ("DOUBLE", "x"),
        ("DOUBLE", True),
        ("BOOLEAN", "maybe"),
        ("BOOLEAN", 2),
        ("DATE", "yesterday"),
        ("DATE", 10**18),
        ("DATE", 1.5),
        ("BYTES", "!!not base64!!"),
        ("BYTES", 12),
    ],
)
def test_bad_values_dead_letter(type_, value):
    assert _dead(_one_column(type_, value)) == Code.BAD_VALUE


@pytest.mark.parametrize(
    "raw",
    [
        b"9223372036854775808",  # 2**63: orjson reads it exactly (up to 2**64 - 1)
        b"18446744073709551615",
        b'"18446744073709551615"',  # integer text of any size
        b'"-9223372036854775809"',
    ],
)
def test_long_outside_int64_is_bad_value_naming_the_column_and_range(raw):
    """A LONG (Java long) column is int64: a value beyond it would not fit the table."""
    value = orjson.dumps(_one_column("LONG", 0)).replace(b'"v":0', b'"v":' + raw)
    result = _batch(value)
    assert result.events == []
    (dead,) = result.dead_letters
    assert dead.code == Code.BAD_VALUE
    assert "'v'" in dead.message and "int64" in dead.message
    assert "-9223372036854775808..9223372036854775807" in dead.message


@pytest.mark.parametrize("raw", [b'" 42"', b'"4_2"', b'"\u0664\u0662"', b'"42.0"'])
def test_long_text_is_a_sign_and_ascii_digits_only(raw):
    value = orjson.dumps(_one_column("LONG", 0)).replace(b'"v":0', b'"v":' + raw)
    assert _dead(value) == Code.BAD_VALUE


def test_long_beyond_64_bits_is_refused_not_rounded():
    raw = orjson.dumps(_one_column("LONG", 0)).replace(b'"v":0', b'"v":18446744073709551616')
    assert _dead(raw) == Code.BAD_VALUE  # orjson reads it as a float: digits already lost


def test_undeclared_column_or_unknown_type():
    assert _dead(_msg(after={**ROW, "extra": 1})) == Code.BAD_FIELD
    assert _dead(_msg(after={**ROW, "extra": None})) == Code.BAD_FIELD
    cols = [*COLUMNS, {"name": "c", "type": "DECIMAL"}]
    assert _dead(_msg(after=ROW, columns=cols)) == Code.BAD_FIELD
    cols = [*COLUMNS, {"type": "LONG"}]
    assert _dead(_msg(after=ROW, columns=cols)) == Code.BAD_FIELD
    assert _dead(_msg(after=ROW, columns=[*COLUMNS, "c"])) == Code.BAD_FIELD


def test_a_declared_column_absent_from_the_image_is_absent():
    row = {k: v for k, v in ROW.items() if k != "blob"}
    (e,) = _events(_msg(after=row))
    assert "blob" not in e.after and e.columns["blob"] == "binary"


# --------------------------------------------------------------------------- keys


def test_composite_primary_key():
    (e,) = _events(_msg(after=ROW, pk=("id", "name")))
    assert e.key == {"id": 7, "name": "scooter"}


def test_row_id_column_is_the_key_without_a_primary_key():
    cols = [*COLUMNS, {"name": ROW_ID, "type": "LONG"}]
    (e,) = _events(_msg(after={**ROW, ROW_ID: 15}, columns=cols, pk=None))
    assert e.key == {ROW_ID: 15}
    (e,) = _events(_msg(after={**ROW, ROW_ID: 15}, columns=cols, pk=()))
    assert e.key == {ROW_ID: 15}


def test_configured_primary_keys_without_key_or_row_id():
    (e,) = _events(_msg(after=ROW, pk=None), primary_keys={"shop.items": ["name"]})
    assert e.key == {"name": "scooter"}
    assert _dead(_msg(after=ROW, pk=None)) == Code.MISSING_KEY


def test_row_id_column_option():
    cols = [*COLUMNS, {"name": "rid", "type": "LONG"}]
    (e,) = _events(_msg(after={**ROW, "rid": 3}, columns=cols, pk=None), row_id_column="rid")
    assert e.key == {"rid": 3}


def test_key_column_missing_from_the_image():
    row = {k: v for k, v in ROW.items() if k != "id"}
    assert _dead(_msg(after=row)) == Code.MISSING_KEY
    assert _dead(_msg(after=row, pk=("name", "id"))) == Code.MISSING_KEY


def test_oracle_rowid_stays_a_column_and_scn_goes_to_meta_and_seq():
    cols = [*COLUMNS, {"name": "rowid", "type": "STRING"}]
    row = {**ROW, "rowid": "AAIUMPAAFAACxExAAE"}
    (e,) = _events(_msg(after=row, columns=cols, scn="2000000001"))
    assert e.after["rowid"] == "AAIUMPAAFAACxExAAE" and e.key == {"id": 7}
    assert e.meta == {"scn": 2000000001}
    assert e.seq == (1620457642589000007, 1, 2000000001)
    b = _msg("UPDATE_BEFOR", before=row, columns=cols, scn="2000000001")
    a = _msg("UPDATE_AFTER", after=row, columns=cols, scn="2000000001")
    (joined,) = _events(b, a)
    assert joined.meta == {"scn": 2000000001} and joined.seq == e.seq
    assert _dead(_msg(after=row, columns=cols, scn="xxxx")) == Code.BAD_FIELD


# --------------------------------------------------------------------------- seq and time


def test_sequence_forms():
    (e,) = _events(_msg(after=ROW, sequence_id=123))
    assert e.seq == (123, 1)
    (e,) = _events(_msg(after=ROW, sequence_id=None))
    assert e.seq is None  # no order is invented
    msg = _msg(after=ROW)
    del msg["payload"]["sequenceId"]
    (e,) = _events(msg)
    assert e.seq is None
    for bad in ("XXX", "", True, 1.5, [1]):
        assert _dead(_msg(after=ROW, sequence_id=bad)) == Code.BAD_FIELD


def test_full_load_rows_sort_first_and_have_no_time():
    (full,) = _events(_msg(after=ROW, sequence_id="-1", event_time=-1))
    (incr,) = _events(_msg(after=ROW, sequence_id="1"))
    assert full.seq == (-1, 1) and full.ts_ms is None
    assert seq_key(full.seq) < seq_key(incr.seq)


def test_sequence_order_is_numeric():
    events = [
        _events(_msg(after=ROW, sequence_id=s))[0] for s in ("9", "10", "1620457642589000001")
    ]
    keys = [seq_key(e.seq) for e in events]
    assert keys == sorted(keys)


def test_event_time_forms():
    (e,) = _events(_msg(after=ROW, event_time="1620457896000"))
    assert e.ts_ms == 1620457896000
    (e,) = _events(_msg(after=ROW, event_time=None))
    assert e.ts_ms is None
    (e,) = _events(_msg(after=ROW, timestamp=None))
    assert e.ts_ms is None
    assert _dead(_msg(after=ROW, event_time="soon")) == Code.BAD_FIELD
    assert _dead(_msg(after=ROW, timestamp=[1])) == Code.BAD_FIELD


@pytest.mark.parametrize("event_time", [2**63, "9223372036854775808", 2**64 - 1])
def test_event_time_beyond_int64_is_bad_field_naming_the_range(event_time):
    """ts_ms is a 64-bit integer: the hot path (a JSON integer) and the text path say so."""
    result = _batch(_msg(after=ROW, event_time=event_time))
    assert result.events == []
    (dead,) = result.dead_letters
    assert dead.code == Code.BAD_FIELD
    assert "payload.timestamp.eventTime" in dead.message
    assert "0..9223372036854775807" in dead.message


def test_event_time_at_the_int64_limit_is_kept():
    (e,) = _events(_msg(after=ROW, event_time=2**63 - 1))
    assert e.ts_ms == 2**63 - 1


# --------------------------------------------------------------------------- envelope


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (b"not json", Code.BAD_JSON),
        (b"[]", Code.NOT_AN_OBJECT),
        (b"null", Code.NOT_AN_OBJECT),
        (b"{}", Code.MISSING_FIELD),
        (b'{"payload": []}', Code.BAD_FIELD),
        (b'{"payload": {"op": "INSERT"}}', Code.MISSING_FIELD),
        (b'{"schema": 1, "payload": {"op": "INSERT"}}', Code.BAD_FIELD),
    ],
)
def test_wrong_envelopes(value, code):
    assert _dead(value) == code


def test_missing_parts_of_a_row_change():
    assert _dead(_msg("INSERT", after=None)) == Code.MISSING_FIELD
    assert _dead(_msg("DELETE", after=ROW)) == Code.MISSING_FIELD
    assert _dead(_msg("UPDATE_BEFOR", after=ROW)) == Code.MISSING_FIELD
    assert _dead(_msg("INSERT", after=ROW, columns=None)) == Code.MISSING_FIELD
    assert _dead(_msg("INSERT", after=ROW, columns={"id": "LONG"})) == Code.BAD_FIELD
    msg = _msg("INSERT", after=ROW)
    msg["payload"]["after"] = {"columns": ROW}
    assert _dead(msg) == Code.MISSING_FIELD
    msg["payload"]["after"] = "row"
    assert _dead(msg) == Code.BAD_FIELD
    msg["payload"]["after"] = {"dataColumn": [1, 2]}
    assert _dead(msg) == Code.BAD_FIELD
    msg = _msg("INSERT", after=ROW)
    msg["schema"]["source"] = None
    assert _dead(msg) == Code.MISSING_FIELD
    msg["schema"]["source"] = {"dbName": "shop"}
    assert _dead(msg) == Code.MISSING_FIELD
    msg["schema"]["source"] = {"dbName": 1, "tableName": "t"}
    assert _dead(msg) == Code.BAD_FIELD
    msg["schema"]["source"] = {"dbName": ["x"], "tableName": "t"}
    assert _dead(msg) == Code.BAD_FIELD
    msg["schema"]["source"] = "shop.items"
    assert _dead(msg) == Code.BAD_FIELD
    msg = _msg("INSERT", after=ROW)
    for pk in ("id", [1], {"id": 1}, [["id"]]):
        msg["schema"]["primaryKey"] = pk
        assert _dead(msg) == Code.BAD_FIELD, pk


def test_schema_name_is_the_schema_level():
    msg = _msg(after=ROW)
    msg["schema"]["source"] = {"dbName": "db", "schemaName": "public", "tableName": "t"}
    (e,) = _events(msg)
    assert e.source == SourceTable("dataworks-json", "db", "public", "t")
    assert e.source.qualified_name == "db.public.t"


# --------------------------------------------------------------------------- fast path


def _full_path_variant(raw: bytes) -> bytes:
    return b" " + raw  # a leading space: same JSON, never the byte-prefix fast path


def test_fast_path_equals_the_full_parse():
    msgs = [
        _msg("INSERT", after=ROW),
        _msg("UPDATE_BEFOR", before=ROW, sequence_id="8"),
        _msg("UPDATE_AFTER", after={**ROW, "price": 1}, sequence_id="8"),
        _msg("DELETE", before=ROW, sequence_id="9", scn="77"),
        _control("MHEARTBEAT"),
        _msg("INSERT", after=ROW, table="other"),  # same columns, another table
        _msg("INSERT", after=ROW),
    ]
    raws = [orjson.dumps(m) for m in msgs]
    fast = DataWorksJsonDecoder().decode_batch(_records(*raws))
    full = DataWorksJsonDecoder().decode_batch(_records(*map(_full_path_variant, raws)))
    assert fast.dead_letters == [] and full.dead_letters == []
    assert fast.events == full.events
    assert [e.source.table for e in fast.events if e.op is Op.INSERT] == [
        "items",
        "other",
        "items",
    ]


def test_fast_path_rejects_what_the_full_parse_rejects():
    good = orjson.dumps(_msg("INSERT", after=ROW))
    decoder = DataWorksJsonDecoder()
    assert decoder.decode_batch(_records(good)).events  # the prefix is now known
    broken = [
        good[:-1],  # truncated
        good[:-3] + b"}",  # version damaged (unterminated string)
        good + b"x",  # trailing garbage
        good.replace(b'"payload":{', b'"payload":{,'),
        good.replace(b'"version":"0.0.1"', b'"version":0.0.1'),
    ]
    for raw in broken:
        result = decoder.decode_batch(_records(raw))
        assert [d.code for d in result.dead_letters] == [Code.BAD_JSON], raw


def test_fast_path_keeps_duplicate_key_semantics():
    good = orjson.dumps(_msg("INSERT", after=ROW))
    other_schema = orjson.dumps(_msg("INSERT", after=ROW, table="other")["schema"])
    raw = good[:-1] + b',"schema":' + other_schema + b"}"  # the last "schema" wins
    decoder = DataWorksJsonDecoder()
    decoder.decode_batch(_records(good))
    (e,) = decoder.decode_batch(_records(raw)).events
    assert e.source.table == "other"


def test_fast_path_with_other_layouts():
    msg = _msg("INSERT", after=ROW)
    reordered = {"payload": msg["payload"], "schema": msg["schema"], "version": "0.0.1"}
    spaced = json.dumps(msg, indent=2).encode()
    no_version = {"schema": msg["schema"], "payload": msg["payload"]}
    extra = {**msg, "extra": 1}
    events = _events(msg, reordered, spaced, no_version, extra, msg)
    assert len({(e.seq, e.source, str(e.after)) for e in events}) == 1


# --------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash(value):
    result = _batch(value)
    assert len(result.events) + len(result.dead_letters) + len(result.skipped) >= 1
    assert all(d.code in set(Code) for d in result.dead_letters)


_GOOD = orjson.dumps(_msg("UPDATE_AFTER", before=ROW, after=ROW))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(_GOOD) - 1), st.integers(0, 255), st.integers(0, len(_GOOD)))
def test_damaged_messages_decode_like_the_full_parse(pos, byte, cut):
    decoder = DataWorksJsonDecoder()
    decoder.decode_batch(_records(_GOOD))  # warm the fast path caches
    damaged = (_GOOD[:pos] + bytes([byte]) + _GOOD[pos + 1 :])[:cut]
    fast = decoder.decode_batch(_records(damaged))
    full = DataWorksJsonDecoder().decode_batch(_records(_full_path_variant(damaged)))
    assert fast.events == full.events
    assert [d.code for d in fast.dead_letters] == [d.code for d in full.dead_letters]


# --------------------------------------------------------------------------- decoder object


def test_options_and_pickling():
    decoder = decoder_for("dataworks-json", {"row_id_column": "rid", "pair_updates": False})
    assert isinstance(decoder.options, DataWorksJsonOptions)
    assert decoder.options.row_id_column == "rid" and decoder.options.pair_updates is False
    with pytest.raises(ConfigError, match="row_id_column"):
        decoder_for("dataworks-json", {"row_id_col": "x"})
    decoder = DataWorksJsonDecoder()
    decoder.decode_batch(_records(_msg(after=ROW)))
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone.options == decoder.options
    assert clone.decode_batch(_records(_msg(after=ROW))).events[0].after == TYPED


def test_events_do_not_share_mutable_state():
    a, b = _events(_msg(after=ROW), _msg(after=ROW))
    assert a.columns is not b.columns and a.after is not b.after
    a.columns["id"] = "string"
    assert b.columns["id"] == "int64"


# --------------------------------------------------------------------------- corpus


def test_paimon_corpus_matches_the_upstream_expectations():
    expected = json.loads((CORPUS / "paimon-aliyun_event.expected.json").read_text())
    kinds = {"INSERT": Op.INSERT, "UPDATE_AFTER": Op.UPDATE, "DELETE": Op.DELETE}
    for name, want in expected["expected"].items():
        (e,) = _events((CORPUS / name).read_bytes())
        assert e.op is kinds[want["kind"]]
        assert (e.source.database, e.source.table) == ("bigdata_test", "sync_test_table")
        assert list(e.key) == ["id"]
        row = e.after if e.after is not None else e.before
        assert row["id"] == int(want["row"]["id"])
        assert row["val"] == float(want["row"]["val"])
        assert row["name"] == want["row"]["name"]
        ms = want["row"]["create_time"]
        assert row["create_time"] == dt.datetime.fromtimestamp(ms / 1000, UTC)


def test_paimon_corpus_applied_in_order_gives_the_expected_table():
    expected = json.loads((CORPUS / "paimon-aliyun_event.expected.json").read_text())
    names = ["insert", "update-in-one", "delete"]
    events = _events(*[(CORPUS / f"paimon-aliyun_event_event-{n}.txt").read_bytes() for n in names])
    table: dict[Any, dict[str, Any]] = {}
    for e in events:
        if e.op is Op.DELETE:
            table.pop(tuple(e.key.values()), None)
        else:
            table[tuple(e.key.values())] = e.after
    (want,) = expected["expected_final_table_if_applied_in_order_insert_update_delete"]
    (row,) = table.values()
    assert row == {
        **want,
        "create_time": dt.datetime.fromtimestamp(want["create_time"] / 1000, UTC),
    }


def test_the_document_template_dead_letters_and_its_correction_decodes():
    raw = base64.b64decode((CASES / "doc-template-verbatim.input.b64").read_text())
    assert raw.startswith(b"{\n") and b"// The metadata change information" in raw
    assert _dead(raw) == Code.BAD_JSON
    (e,) = _events((CASES / "doc-template-corrected.input.jsonl").read_bytes().strip())
    assert e.op is Op.UPDATE and e.key == {"id": 222}
    assert e.before["binData"] == b"hello" and e.after["rowid"] == "AAIUMPAAFAACxExAAE"
    assert e.meta == {"scn": 2000000001} and e.ts_ms == 1


# --------------------------------------------------------------------------- encoder

TABLE = SourceTable("", "shop", "", "items")
EXACT_COLUMNS = {
    "id": "int64",
    "name": "string",
    "price": "float64",
    "active": "boolean",
    "ts": "timestamptz",
    "blob": "binary",
}


def _change(op: Op, before, after, seq: int = 5, key_columns=("id",)) -> SourceChange:
    return SourceChange(
        op=op,
        table=TABLE,
        columns=EXACT_COLUMNS,
        key_columns=key_columns,
        before=before,
        after=after,
        seq=seq,
        ts_ms=1_700_000_000_000,
    )


def test_encoder_update_is_two_records_by_default():
    encoder = encoder_for("dataworks-json")
    assert isinstance(encoder, DataWorksJsonEncoder)
    messages = encoder.encode(_change(Op.UPDATE, TYPED, {**TYPED, "name": "bike"}))
    values = [orjson.loads(m.value) for m in messages]
    assert [v["payload"]["op"] for v in values] == ["UPDATE_BEFOR", "UPDATE_AFTER"]
    assert {v["payload"]["sequenceId"] for v in values} == {"5"}
    assert values[0]["payload"]["after"] is None and values[1]["payload"]["before"] is None
    assert values[0]["schema"]["primaryKey"] == ["id"]
    assert values[0]["schema"]["dataColumn"] == [
        {"name": "id", "type": "LONG"},
        {"name": "name", "type": "STRING"},
        {"name": "price", "type": "DOUBLE"},
        {"name": "active", "type": "BOOLEAN"},
        {"name": "ts", "type": "DATE"},
        {"name": "blob", "type": "BYTES"},
    ]
    assert values[1]["payload"]["after"]["dataColumn"]["ts"] == 1590315269123
    assert values[1]["payload"]["after"]["dataColumn"]["blob"] == "AAH/"
    (e,) = _events(*[m.value for m in messages])
    assert e.before == TYPED and e.after == {**TYPED, "name": "bike"} and e.meta is None


def test_encoder_one_record_mode():
    encoder = DataWorksJsonEncoder(update_in_one_record=True)
    (m,) = encoder.encode(_change(Op.UPDATE, TYPED, {**TYPED, "price": 2.0}))
    value = orjson.loads(m.value)
    assert value["payload"]["op"] == "UPDATE_AFTER"
    (e,) = _events(m.value)
    assert e.before == TYPED and e.after["price"] == 2.0


def test_encoder_round_trip_of_every_exact_type_and_special_floats():
    encoder = DataWorksJsonEncoder()
    rows = [
        TYPED,
        {k: None for k in TYPED} | {"id": 2},
        {**TYPED, "id": 3, "price": float("nan")},
        {**TYPED, "id": 4, "price": float("inf"), "ts": dt.datetime(1960, 1, 1, tzinfo=UTC)},
        {**TYPED, "id": 5, "price": float("-inf"), "name": "\u0000\"'\\ ✓"},
    ]
    for i, row in enumerate(rows):
        (m,) = encoder.encode(_change(Op.INSERT, None, row, seq=i))
        (e,) = _events(m.value)
        for column, value in row.items():
            got = e.after[column]
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(got)
            else:
                assert got == value and type(got) is type(value), column


def test_encoder_snapshot_delete_truncate_and_keyless_tables():
    encoder = DataWorksJsonEncoder()
    (m,) = encoder.encode(_change(Op.SNAPSHOT, None, TYPED))
    assert orjson.loads(m.value)["payload"]["op"] == "INSERT"
    (m,) = encoder.encode(_change(Op.DELETE, TYPED, None))
    (e,) = _events(m.value)
    assert e.op is Op.DELETE and e.before == TYPED
    (m,) = encoder.encode(_change(Op.TRUNCATE, None, None))
    (e,) = _events(m.value)
    assert e.op is Op.TRUNCATE and e.source.table == "items"
    (m,) = encoder.encode(_change(Op.INSERT, None, TYPED, key_columns=()))
    assert orjson.loads(m.value)["schema"]["primaryKey"] is None
    assert _dead(m.value) == Code.MISSING_KEY
    (e,) = _events(m.value, primary_keys={"items": ["id"]})
    assert e.key == {"id": 7}


def test_encoder_inexact_types_and_refusals():
    encoder = DataWorksJsonEncoder()
    change = SourceChange(
        op=Op.INSERT,
        table=TABLE,
        columns={"id": "int64", "amount": "decimal(10,2)", "day": "date"},
        key_columns=("id",),
        before=None,
        after={"id": 1, "amount": decimal.Decimal("12.50"), "day": dt.date(2020, 2, 29)},
        seq=1,
        ts_ms=1,
    )
    (m,) = encoder.encode(change)
    data = orjson.loads(m.value)["payload"]["after"]["dataColumn"]
    assert data == {"id": 1, "amount": "12.50", "day": 1582934400000}
    with pytest.raises(ValueError, match="row changes"):
        encoder.encode(_change(Op.DDL, None, None))
    bad = SourceChange(Op.INSERT, TABLE, {"id": "uuid"}, ("id",), None, {"id": 1}, 1, 1)
    with pytest.raises(ValueError, match="uuid"):
        encoder.encode(bad)
    assert "date" not in encoder.exact_types
    assert not any(t.startswith("decimal") for t in encoder.exact_types)

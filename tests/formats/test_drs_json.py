"""Unit tests of the DRS JSON and JSON-C formats (``drs-json``, ``drs-json-c``)."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.drs_json import DrsJsonCDecoder, DrsJsonDecoder, DrsJsonOptions, mysql_column
from cdcflow.model import Op, SourceTable
from cdcflow_testkit.encoders import SourceChange, encoder_for
from cdcflow_testkit.encoders.drs_json import java_bytes, java_double

CASES = Path(__file__).parent / "cases"
DOC_EXAMPLE = (CASES / "drs-json" / "doc-update.input.jsonl").read_bytes().strip()
UTC = dt.UTC

MT = {"id": "bigint", "name": "varchar", "amount": "decimal(12,2)", "paid_at": "timestamp"}
ST = {"id": -5, "name": 12, "amount": 3, "paid_at": 93}
ROW = {"id": "1", "name": "ACME", "amount": "12.50", "paid_at": "1700000000.123"}


def message(typ="INSERT", data=(ROW,), old=None, **extra):
    msg = {
        "mysqlType": MT,
        "id": 42,
        "es": 1700000000000,
        "ts": 1700000000100,
        "database": "shop",
        "table": "orders",
        "type": typ,
        "isDdl": False,
        "sql": "",
        "sqlType": ST,
        "data": None if data is None else list(data),
        "old": None if old is None else list(old),
        "pkNames": ["id"],
    }
    msg.update(extra)
    return orjson.dumps(msg)


def decode(value: bytes, fmt: str = "drs-json", **options):
    return decoder_for(fmt, options or None).decode(Record(value=value))


def dead_code(value: bytes, fmt: str = "drs-json", **options) -> str:
    with pytest.raises(DecodeError) as info:
        decode(value, fmt, **options)
    return info.value.code


# --------------------------------------------------------------------------- the document


def test_document_example_decodes_to_one_update_with_typed_values():
    (event,) = decode(DOC_EXAMPLE)
    assert event.op is Op.UPDATE
    assert event.source == SourceTable("drs-json", "test01", "", "test")  # "test " stripped
    assert event.key == {"id": 104}
    assert event.before["id"] == 103 and event.meta == {"old_key": {"id": 103}}
    assert event.seq == (27677, 0) and event.ts_ms == 1624614713000
    after = event.after
    assert after["c5"] == dt.datetime(2021, 6, 25, 9, 51, 53, 201000, tzinfo=UTC)
    assert after["c4"] == dt.datetime(2021, 6, 25, 17, 51, 53)  # datetime: wall clock
    assert after["c8"] == 12510357.0 and after["c7"] == 10357.0
    assert after["c9"] == decimal.Decimal("9874510357")
    assert after["c12"].startswith(b"jgojgoidsjgojosog934") and after["c2"] == b""
    assert after["c13"].endswith("9u90weurtg103") and after["c3"] == 103
    assert event.columns["c5"] == "timestamptz" and event.columns["c4"] == "timestamp"
    assert event.columns["c12"] == "binary" and event.columns["c14"] == "binary"
    assert event.columns["c7"] == "float32" and event.columns["c8"] == "float64"
    assert "c9" not in event.columns  # "decimal" without precision: not declared


def test_json_c_reads_the_delete_row_from_data_and_json_from_old():
    json_delete = message("DELETE", data=None, old=[ROW])
    json_c_delete = message("DELETE", data=[ROW], old=None)
    assert decode(json_delete)[0].before["id"] == 1
    assert decode(json_c_delete, "drs-json-c")[0].before["id"] == 1
    assert dead_code(json_c_delete) == Code.MISSING_FIELD
    assert dead_code(json_delete, "drs-json-c") == Code.MISSING_FIELD


def test_delete_and_insert_images():
    (ins,) = decode(message("INSERT"))
    (dele,) = decode(message("DELETE", data=None, old=[ROW]))
    assert ins.before is None and ins.after["amount"] == decimal.Decimal("12.50")
    assert dele.after is None and dele.key == {"id": 1}


def test_update_keeps_old_key_only_when_it_changed():
    same = decode(message("UPDATE", data=[{**ROW, "name": "B"}], old=[ROW]))[0]
    moved = decode(message("UPDATE", data=[{**ROW, "id": "2"}], old=[ROW]))[0]
    partial = decode(message("UPDATE", data=[{**ROW, "id": "2"}], old=[{"name": "A"}]))[0]
    assert same.meta is None and same.key == {"id": 1}
    assert moved.key == {"id": 2} and moved.meta == {"old_key": {"id": 1}}
    assert partial.meta is None and partial.before == {"name": "A"}  # absent = not present


def test_rows_of_one_message_get_increasing_sequences():
    events = decode(message("INSERT", data=[ROW, {**ROW, "id": "2"}, {**ROW, "id": "3"}]))
    assert [e.seq for e in events] == [(42, 0), (42, 1), (42, 2)]
    assert [e.key["id"] for e in events] == [1, 2, 3]


# --------------------------------------------------------------------------- values


@given(st.integers(1, 2**33), st.text("0123456789", min_size=0, max_size=6))
def test_epoch_seconds_text_is_exact_to_the_microsecond(seconds, frac):
    text = f"{seconds}.{frac}" if frac else str(seconds)
    (event,) = decode(message(data=[{**ROW, "paid_at": text}]))
    micros = int(frac.ljust(6, "0")) if frac else 0
    want = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds, microseconds=micros)
    assert event.after["paid_at"] == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("[]", b""),
        ("[106, 103]", b"jg"),
        ("[0, -1, 127, -128]", b"\x00\xff\x7f\x80"),
        ("[255,1]", b"\xff\x01"),
    ],
)
def test_byte_list_text(text, want):
    mt = {"id": "int", "b": "varbinary"}
    (event,) = decode(message(data=[{"id": "1", "b": text}], mysqlType=mt, sqlType=None))
    assert event.after["b"] == want


@pytest.mark.parametrize(
    "text", ["[256]", "[-129]", "[1, x]", "106, 103", "[1,,2]", "AAEC", "[1.0]", '["a"]', "[[1]]"]
)
def test_bad_byte_list_is_a_bad_value(text):
    mt = {"id": "int", "b": "blob"}
    assert dead_code(message(data=[{"id": "1", "b": text}], mysqlType=mt)) == Code.BAD_VALUE


def test_java_text_round_trips():
    for x in (1.2510357e7, 10357.0, 1e-4, -0.0, 0.001, 123456.789, 1e300, -2.5e-10):
        assert float(java_double(x)) == x
    assert java_double(1.2510357e7) == "1.2510357E7" and java_double(10357.0) == "10357.0"
    assert java_double(1e-4) == "1.0E-4" and java_double(float("nan")) == "NaN"
    assert java_bytes(b"\x00\xff\x7f\x80") == "[0, -1, 127, -128]"


def test_zero_dates_are_null_and_other_bad_texts_dead_letter():
    mt = {"id": "int", "d": "date", "dt": "datetime", "ts": "timestamp"}
    row = {"id": "1", "d": "0000-00-00", "dt": "0000-00-00 00:00:00", "ts": "0"}
    (event,) = decode(message(data=[row], mysqlType=mt, sqlType=None))
    assert event.after == {"id": 1, "d": None, "dt": None, "ts": None}
    for col, bad in (("d", "2024-13-01"), ("dt", "yesterday"), ("ts", "1.2.3")):
        value = message(data=[{**row, col: bad}], mysqlType=mt, sqlType=None)
        assert dead_code(value) == Code.BAD_VALUE


@pytest.mark.parametrize(
    ("type_name", "jdbc", "logical"),
    [
        ("decimal(10,2)", 3, "decimal(10,2)"),
        ("DECIMAL(5)", None, "decimal(5,0)"),
        ("decimal", 3, None),
        ("int unsigned", 4, "int64"),
        ("bigint(20) unsigned", -5, "decimal(20,0)"),
        ("varchar(255)", 12, "string"),
        ("datetime(6)", 94, "timestamp"),
        ("timestamp(3)", 93, "timestamptz"),
        (None, 94, "timestamp"),
        (None, 93, "timestamptz"),
        ("geometry", -2, "binary"),
        ("geometry", None, None),
        ("json", 12, "json"),
        ("tinyint(1)", -7, "boolean"),
        ("tinyint", -6, "int32"),
        ("year", 91, "int32"),
    ],
)
def test_type_mapping(type_name, jdbc, logical):
    assert mysql_column(type_name, jdbc, UTC)[0] == logical


@pytest.mark.parametrize("fmt", ["drs-json", "drs-json-c"])
@pytest.mark.parametrize(
    ("type_name", "text", "logical"),
    [
        ("int", "2147483648", "int32"),
        ("tinyint", "-2147483649", "int32"),
        ("year", "99999999999", "int32"),
        ("int unsigned", "9223372036854775808", "int64"),
        ("bigint", "9223372036854775808", "int64"),
        ("bigint", "-9223372036854775809", "int64"),
    ],
)
def test_an_integer_outside_its_columns_range_is_bad_value_naming_column_and_range(
    fmt, type_name, text, logical
):
    row = {"id": "1", "c": text}
    with pytest.raises(DecodeError) as info:
        decode(message(data=[row], mysqlType={"id": "int", "c": type_name}, sqlType=None), fmt)
    assert info.value.code == Code.BAD_VALUE
    lo, hi = (-(2**31), 2**31 - 1) if logical == "int32" else (-(2**63), 2**63 - 1)
    assert "'c'" in info.value.message and f"{logical} range {lo}..{hi}" in info.value.message


def test_integers_at_the_limits_of_their_range_are_kept_in_data_and_old():
    mt = {"id": "bigint", "i": "int"}
    row = {"id": "9223372036854775807", "i": "-2147483648"}
    old = {"id": "-9223372036854775808", "i": "2147483647"}
    (event,) = decode(message("UPDATE", data=[row], old=[old], mysqlType=mt, sqlType=None))
    assert event.after == {"id": 2**63 - 1, "i": -(2**31)}
    assert event.before == {"id": -(2**63), "i": 2**31 - 1}
    too_big = message("UPDATE", data=[row], old=[{**old, "i": "2147483648"}], mysqlType=mt)
    assert dead_code(too_big) == Code.BAD_VALUE


@pytest.mark.parametrize("fmt", ["drs-json", "drs-json-c"])
@pytest.mark.parametrize("typ", ["INSERT", "DDL"])
def test_es_beyond_int64_is_bad_field_naming_the_range(fmt, typ):
    with pytest.raises(DecodeError) as info:
        decode(message(typ, es=2**63, isDdl=typ == "DDL", sql="alter table t"), fmt)
    assert info.value.code == Code.BAD_FIELD
    assert "'es'" in info.value.message
    assert "-9223372036854775808..9223372036854775807" in info.value.message
    (event,) = decode(message(typ, es=2**63 - 1, isDdl=typ == "DDL", sql="alter table t"), fmt)
    assert event.ts_ms == 2**63 - 1


@pytest.mark.parametrize("fmt", ["drs-json", "drs-json-c"])
def test_an_object_or_array_in_an_undeclared_column_is_json_text_declared_json(fmt):
    row = {**ROW, "doc": {"a": [1, None]}, "tags": ["x"], "n": 5}
    old = {**ROW, "doc": [2]}
    decoder = decoder_for(fmt)
    (event,) = decoder.decode(Record(value=message("UPDATE", data=[row], old=[old])))
    assert event.after["doc"] == '{"a":[1,null]}' and event.after["tags"] == '["x"]'
    assert event.before["doc"] == "[2]"
    assert event.after["n"] == 5 and "n" not in event.columns  # a scalar is kept as it is
    assert event.columns == {
        "id": "int64",
        "name": "string",
        "amount": "decimal(12,2)",
        "paid_at": "timestamptz",
        "doc": "json",
        "tags": "json",
    }
    # the table's shared declaration is left alone
    (plain,) = decoder.decode(Record(value=message()))
    assert "doc" not in plain.columns


def test_a_value_of_an_unknown_type_nested_deeper_than_254_levels_is_bad_value():
    deep = b"[" * 300 + b"]" * 300  # orjson reads 1024 levels, writes 254
    value = message(data=[{**ROW, "g": "DEEP"}]).replace(b'"DEEP"', deep)
    with pytest.raises(DecodeError) as info:
        decode(value)
    assert info.value.code == Code.BAD_VALUE
    assert "'g'" in info.value.message and "nested deeper than 254 levels" in info.value.message


def test_a_new_type_map_for_the_same_table_replans():
    decoder = DrsJsonDecoder()
    decoder.decode(Record(value=message()))
    mt = {**MT, "amount": "double"}
    (event,) = decoder.decode(Record(value=message(mysqlType=mt, sqlType={**ST, "amount": 8})))
    assert event.after["amount"] == 12.5 and event.columns["amount"] == "float64"


# --------------------------------------------------------------------------- JSON-C zone


def test_json_c_timestamp_text_is_read_in_the_configured_zone():
    row = {**ROW, "paid_at": "2023-11-15 06:13:20"}
    utc = decode(message(data=[row]), "drs-json-c")[0].after["paid_at"]
    cn = decode(message(data=[row]), "drs-json-c", timestamp_zone="Asia/Shanghai")[0]
    plus8 = decode(message(data=[row]), "drs-json-c", timestamp_zone="+08:00")[0]
    assert utc == dt.datetime(2023, 11, 15, 6, 13, 20, tzinfo=UTC)
    assert cn.after["paid_at"] == plus8.after["paid_at"] == utc - dt.timedelta(hours=8)


def test_unknown_zone_is_a_config_error_naming_the_option():
    with pytest.raises(ConfigError, match="timestamp_zone"):
        DrsJsonCDecoder(DrsJsonOptions(timestamp_zone="Mars/Olympus"))


# --------------------------------------------------------------------------- ops


def test_ddl_truncate_and_unknown_ops():
    ddl = message("DDL", data=None, isDdl=True, sql="ALTER TABLE t ADD c int", pkNames=None)
    trunc = message("DDL", data=None, isDdl=True, sql="  truncate table `t`", pkNames=None)
    canal_like = message("ALTER", data=None, isDdl=True, sql="ALTER TABLE t DROP c")
    (d,) = decode(ddl)
    (t,) = decode(trunc)
    (a,) = decode(canal_like)
    assert d.op is Op.DDL and d.ddl == "ALTER TABLE t ADD c int" and d.key is None
    assert t.op is Op.TRUNCATE and t.seq == (42, 0)
    assert a.op is Op.DDL and a.meta == {"type": "ALTER"}
    assert dead_code(message("MERGE")) == Code.UNKNOWN_OP
    assert dead_code(message("INIT", isDdl=True)) == Code.BAD_FIELD


def test_init_rows_are_snapshots():
    (event,) = decode(message("INIT"))
    assert event.op is Op.SNAPSHOT and event.after["id"] == 1


def test_table_without_key_needs_the_primary_keys_option():
    value = message(pkNames=None)
    assert dead_code(value) == Code.MISSING_KEY
    (event,) = decode(value, primary_keys={"shop.orders": ["name"]})
    assert event.key == {"name": "ACME"}


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (b"not json", Code.BAD_JSON),
        (b'["INSERT"]', Code.NOT_AN_OBJECT),
        (orjson.dumps({"id": 1, "database": "d", "table": "t"}), Code.MISSING_FIELD),
        (message(id=None), Code.MISSING_FIELD),
        (message(id="42"), Code.BAD_FIELD),
        (message(es="1700000000000"), Code.BAD_FIELD),
        (message(type=7), Code.BAD_FIELD),
        (message(table=["t"]), Code.BAD_FIELD),
        (message(table=""), Code.MISSING_FIELD),
        (message(data=None), Code.MISSING_FIELD),
        (message(data={"id": "1"}), Code.BAD_FIELD),
        (message(data=[["1"]]), Code.BAD_FIELD),
        (message(pkNames="id"), Code.BAD_FIELD),
        (message(pkNames=["nope"]), Code.MISSING_KEY),
        (message("UPDATE", data=[ROW], old=[ROW, ROW]), Code.BAD_FIELD),
        (message("UPDATE", data=[ROW], old=["x"]), Code.BAD_FIELD),
        (message(data=[{**ROW, "id": "one"}]), Code.BAD_VALUE),
        (message(data=[{**ROW, "amount": "NaN"}]), Code.BAD_VALUE),
        (message(data=[{**ROW, "amount": 12.5}]), Code.BAD_VALUE),
        (message(data=[{**ROW, "name": {"x": 1}}]), Code.BAD_VALUE),
        (message(data=[{**ROW, "paid_at": "1700000000.1234567"}]), Code.BAD_VALUE),
        (message()[:-10], Code.BAD_JSON),
    ],
)
def test_malformed_messages_dead_letter_with_stable_codes(value, code):
    assert dead_code(value) == code


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_decode_errors(value):
    for decoder in (DrsJsonDecoder(), DrsJsonCDecoder()):
        try:
            decoder.decode(Record(value=value))
        except DecodeError as exc:
            assert exc.code in set(Code)


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["id", "name", "amount", "paid_at", "x"]),
        st.one_of(
            st.none(),
            st.text(max_size=8),
            st.integers(-(2**63), 2**63 - 1),
            st.floats(),
            st.booleans(),
        ),
        max_size=5,
    )
)
def test_arbitrary_rows_decode_or_dead_letter(row):
    try:
        decode(message(data=[row]))
    except DecodeError as exc:
        assert exc.code in (Code.BAD_VALUE, Code.MISSING_KEY)


# --------------------------------------------------------------------------- encoder


def _change(op, before, after, columns=None):
    columns = columns or {"id": "int64", "note": "string", "when": "timestamptz"}
    return SourceChange(
        op, SourceTable("", "shop", "", "t"), columns, ("id",), before, after, 7, 1700000000000
    )


@pytest.mark.parametrize("fmt", ["drs-json", "drs-json-c"])
def test_encoder_writes_the_documented_shape(fmt):
    when = dt.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    row = {"id": 1, "note": "a<b & c='d'", "when": when}
    (msg,) = encoder_for(fmt).encode(_change(Op.DELETE, row, None))
    assert b"\\u003c" in msg.value and b"\\u0026" in msg.value and b"<" not in msg.value
    body = orjson.loads(msg.value)
    assert body["type"] == "DELETE" and body["pkNames"] == ["id"] and body["id"] == 7
    assert body["mysqlType"] == {"id": "bigint", "note": "varchar", "when": "timestamp"}
    where, empty = ("data", "old") if fmt == "drs-json-c" else ("old", "data")
    assert body[empty] is None
    text = body[where][0]["when"]
    assert text == ("2024-01-02 03:04:05" if fmt == "drs-json-c" else "1704164645.678")
    (event,) = decoder_for(fmt).decode(Record(value=msg.value))
    assert event.before["note"] == "a<b & c='d'"


def test_encoder_truncate_and_snapshot_round_trip():
    enc, dec = encoder_for("drs-json"), decoder_for("drs-json")
    (t,) = dec.decode(Record(value=enc.encode(_change(Op.TRUNCATE, None, None))[0].value))
    row = {"id": 3, "note": None, "when": None}
    (s,) = dec.decode(Record(value=enc.encode(_change(Op.SNAPSHOT, None, row))[0].value))
    assert t.op is Op.TRUNCATE and s.op is Op.SNAPSHOT and s.after == row


def test_decoder_pickles_after_use():
    decoder = DrsJsonCDecoder(DrsJsonOptions(timestamp_zone="Asia/Shanghai"))
    first = decoder.decode(Record(value=message()))
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone.decode(Record(value=message())) == first


@given(st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1)))
def test_encoded_timestamps_decode_exactly(naive):
    when = naive.replace(tzinfo=UTC)
    if when == dt.datetime(1970, 1, 1, tzinfo=UTC):
        return  # epoch 0 is MySQL's zero timestamp: NULL
    row = {"id": 1, "note": "x", "when": when}
    (msg,) = encoder_for("drs-json").encode(_change(Op.INSERT, None, row))
    (event,) = decoder_for("drs-json").decode(Record(value=msg.value))
    assert event.after == row

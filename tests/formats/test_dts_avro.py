"""Unit tests for the DTS Avro decoder and encoder (``cdcflow.formats.dts_avro``).

Records are built with fastavro against the packaged schema, as DTS frames them
(schemaless, no header); see tests/formats/cases/dts-avro/SOURCES.md for why no captured
record exists.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import pickle
import re

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.dts_avro import OPERATIONS, record_schema
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for

NS = "com.alibaba.dts.formats.avro."
UTC = dt.UTC


def rec(
    operation="INSERT",
    *,
    id=1,
    object_name="db.t",
    fields=None,
    before=None,
    after=None,
    tags=None,
    source_type="MySQL",
    ts=1_700_000_000,
    txid="",
):
    return {
        "version": 1,
        "id": id,
        "sourceTimestamp": ts,
        "sourcePosition": "9@1",
        "safeSourcePosition": "",
        "sourceTxid": txid,
        "source": {"sourceType": source_type, "version": "8.0"},
        "operation": operation,
        "objectName": object_name,
        "processTimestamps": None,
        "tags": {"pk_uk_info": '{"PRIMARY":["id"]}'} if tags is None else tags,
        "fields": fields,
        "beforeImages": before,
        "afterImages": after,
        "bornTimestamp": 0,
    }


def raw(r) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, record_schema(), r)
    return buf.getvalue()


def integer(text):
    return (NS + "Integer", {"precision": 19, "value": text})


def char(text, charset="utf8mb4", codec="utf-8"):
    return (NS + "Character", {"charset": charset, "value": text.encode(codec)})


def datetime_parts(**parts):
    base = dict.fromkeys(("year", "month", "day", "hour", "minute", "second", "millis"))
    return (NS + "DateTime", {**base, **parts})


def one_column(item, type_code=253, source_type="MySQL"):
    """Decode an INSERT of (id, c) with c = item; return (value or 'ABSENT', columns)."""
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": type_code}]
    event = decode(rec(fields=fields, after=[integer("1"), item], source_type=source_type))[0]
    return event.after.get("c", "ABSENT"), event.columns


def decode(r, options=None):
    value = raw(r) if isinstance(r, dict) else r
    return decoder_for("dts-avro", options).decode(Record(value=value, origin=Origin("t", 2, 5)))


def dead(r, options=None) -> str:
    value = raw(r) if isinstance(r, dict) else r
    result = decoder_for("dts-avro", options).decode_batch([Record(value=value)])
    assert not result.events, result.events
    assert len(result.dead_letters) == 1, result
    return result.dead_letters[0].code


# --------------------------------------------------------------------------- envelope


def test_envelope_fields_map_to_seq_time_txn_source_and_origin():
    fields = [{"name": "id", "dataTypeNumber": 8}]
    event = decode(
        rec(
            id=42,
            ts=1_718_000_000,
            txid="tx-9",
            object_name="shop.orders",
            fields=fields,
            after=[integer("3")],
        )
    )[0]
    assert event.op is Op.INSERT
    assert event.source == SourceTable("dts-avro", "shop", "", "orders")
    assert event.seq == (42,) and event.ts_ms == 1_718_000_000_000
    assert event.txn is not None and event.txn.id == "tx-9"
    assert event.origin == Origin("t", 2, 5)
    assert event.key == {"id": 3} and event.after == {"id": 3}
    assert event.meta["source_position"] == "9@1" and event.meta["operation"] == "INSERT"


@pytest.mark.parametrize("ts", [9223372036854776, -9223372036854776, 2**62])
def test_source_timestamp_whose_ms_would_leave_int64_is_bad_field_naming_the_range(ts):
    """sourceTimestamp is epoch seconds (any Avro long); ts_ms = x 1000 must fit 64 bits."""
    fields = [{"name": "id", "dataTypeNumber": 8}]
    value = raw(rec(ts=ts, fields=fields, after=[integer("3")]))
    result = decoder_for("dts-avro").decode_batch([Record(value=value)])
    (dead_letter,) = result.dead_letters
    assert dead_letter.code == Code.BAD_FIELD
    assert "sourceTimestamp" in dead_letter.message
    assert "-9223372036854775..9223372036854775" in dead_letter.message


def test_source_timestamp_at_the_limit_is_kept():
    fields = [{"name": "id", "dataTypeNumber": 8}]
    event = decode(rec(ts=-9223372036854775, fields=fields, after=[integer("3")]))[0]
    assert event.ts_ms == -9223372036854775000


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("shop", ("shop", "", "")),
        ("shop.orders", ("shop", "", "orders")),
        ("sales.public.orders", ("sales", "public", "orders")),
        ("sales.public.order\\u002Eitems", ("sales", "public", "order.items")),
    ],
)
def test_object_name_levels_and_escaped_dots(name, expected):
    event = decode(rec("DDL", object_name=name, after="CREATE TABLE x (a int)"))[0]
    src = event.source
    assert (src.database, src.schema, src.table) == expected


def test_object_name_with_four_parts_is_a_bad_field():
    assert dead(rec("DDL", object_name="a.b.c.d", after="x")) == Code.BAD_FIELD


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_every_mapped_operation_decodes(operation):
    fields = [{"name": "id", "dataTypeNumber": 8}]
    images = {"before": [integer("1")], "after": [integer("1")]}
    if OPERATIONS[operation] is Op.DDL:
        images = {"after": "ALTER TABLE t ADD c int"}
    [event] = decode(rec(operation, fields=fields, **images))
    assert event.op is OPERATIONS[operation]
    assert event.meta["operation"] == operation


@pytest.mark.parametrize(
    "operation", ["ROLLBACK", "ABORT", "COMMAND", "FILL", "FINISH", "CONTROL", "RDB"]
)
def test_operations_without_a_safe_meaning_are_unknown_op(operation):
    assert dead(rec(operation)) == Code.UNKNOWN_OP


def test_noop_is_skipped_with_a_reason():
    result = decoder_for("dts-avro").decode_batch([Record(value=raw(rec("NOOP")))])
    assert [s.reason for s in result.skipped] == ["DTS_NOOP"] and not result.dead_letters


def test_ddl_text_and_truncate():
    [alter] = decode(rec("DDL", after="ALTER TABLE t ADD c int"))
    assert alter.op is Op.DDL and alter.ddl == "ALTER TABLE t ADD c int" and alter.key is None
    [trunc] = decode(rec("DDL", after="  TRUNCATE TABLE t"))
    assert trunc.op is Op.TRUNCATE and trunc.ddl == "  TRUNCATE TABLE t"
    [named] = decode(rec("DDL", after="truncated_log_cleanup()"))
    assert named.op is Op.DDL  # a word boundary is required
    assert dead(rec("DDL")) == Code.MISSING_FIELD


# --------------------------------------------------------------------------- bytes


def test_every_truncation_of_a_record_is_bad_avro():
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 253}]
    value = raw(rec(fields=fields, after=[integer("1"), char("hello")]))
    decoder = decoder_for("dts-avro")
    result = decoder.decode_batch([Record(value=value[:n]) for n in range(len(value))])
    assert not result.events
    assert {d.code for d in result.dead_letters} == {Code.BAD_AVRO}
    assert len(result.dead_letters) == len(value)


def test_trailing_bytes_are_bad_avro():
    value = raw(rec("HEARTBEAT", object_name=None))
    assert dead(value + b"\x00") == Code.BAD_AVRO


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(value):
    result = decoder_for("dts-avro").decode_batch([Record(value=value)])
    assert result.records == result.decoded_records + len(result.skipped) + len(result.dead_letters)
    for letter in result.dead_letters:
        assert not re.match(r"^\w+(Error|Exception): ", letter.message), letter.message
        assert letter.code in {
            Code.BAD_AVRO,
            Code.UNKNOWN_OP,
            Code.MISSING_FIELD,
            Code.BAD_FIELD,
            Code.BAD_VALUE,
            Code.MISSING_KEY,
        }


# --------------------------------------------------------------------------- values


def test_null_vs_none_vs_avro_null():
    assert one_column((NS + "EmptyObject", "NULL"))[0] is None
    assert one_column(None)[0] is None
    value, columns = one_column((NS + "EmptyObject", "NONE"))
    assert value == "ABSENT" and "c" not in columns


def test_timestamp_millis_field_is_microseconds():
    value, columns = one_column((NS + "Timestamp", {"timestamp": 1_627_553_369, "millis": 8}), 17)
    assert value == dt.datetime(2021, 7, 29, 10, 9, 29, 8, tzinfo=UTC)
    assert columns["c"] == "timestamptz"
    with pytest.raises(Exception) as info:
        one_column((NS + "Timestamp", {"timestamp": 0, "millis": 1_000_000}), 17)
    assert getattr(info.value, "code", None) == Code.BAD_VALUE


@pytest.mark.parametrize(
    ("parts", "type_code", "expected", "logical"),
    [
        (dict(year=2020, month=2, day=29), 10, dt.date(2020, 2, 29), "date"),
        (
            dict(year=2024, month=5, day=6, hour=7, minute=8, second=9, millis=123),
            12,
            dt.datetime(2024, 5, 6, 7, 8, 9, 123),
            "timestamp",
        ),
        (dict(hour=23, minute=59, second=58, millis=1), 11, dt.time(23, 59, 58, 1), "time"),
        (dict(year=1999), 13, 1999, "int32"),
        (dict(year=0, month=0, day=0), 10, None, "date"),
        # MySQL DATE delivered with a midnight time part is still a date
        (
            dict(year=2024, month=1, day=2, hour=0, minute=0, second=0, millis=0),
            10,
            dt.date(2024, 1, 2),
            "date",
        ),
        # MySQL DATETIME delivered without time parts is still a timestamp
        (dict(year=2024, month=1, day=2), 12, dt.datetime(2024, 1, 2), "timestamp"),
    ],
)
def test_datetime_parts(parts, type_code, expected, logical):
    value, columns = one_column(datetime_parts(**parts), type_code)
    assert value == expected and type(value) is type(expected)
    assert columns["c"] == logical


@pytest.mark.parametrize(
    "parts",
    [
        dict(year=2023, month=2, day=30),
        dict(hour=25, minute=0, second=0),
        dict(hour=-1, minute=0, second=0),
        dict(month=3),
        dict(),
    ],
)
def test_impossible_datetimes_are_bad_values(parts):
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 12}]
    assert dead(rec(fields=fields, after=[integer("1"), datetime_parts(**parts)])) == Code.BAD_VALUE


@pytest.mark.parametrize(
    ("zone", "expected_utc"),
    [
        ("+08:00", dt.datetime(2024, 1, 1, 0, 0, tzinfo=UTC)),
        ("GMT+8:00", dt.datetime(2024, 1, 1, 0, 0, tzinfo=UTC)),
        ("-05:30", dt.datetime(2024, 1, 1, 13, 30, tzinfo=UTC)),
        ("UTC", dt.datetime(2024, 1, 1, 8, 0, tzinfo=UTC)),
        ("Asia/Shanghai", dt.datetime(2024, 1, 1, 0, 0, tzinfo=UTC)),
    ],
)
def test_timestamp_with_time_zone_is_converted_to_utc(zone, expected_utc):
    local = datetime_parts(year=2024, month=1, day=1, hour=8, minute=0, second=0, millis=0)[1]
    value, columns = one_column((NS + "TimestampWithTimeZone", {"value": local, "timezone": zone}))
    assert value == expected_utc and value.utcoffset() == dt.timedelta(0)
    assert columns["c"] == "timestamptz"


def test_unknown_time_zone_is_a_bad_value():
    local = datetime_parts(year=2024, month=1, day=1, hour=8, minute=0, second=0)[1]
    item = (NS + "TimestampWithTimeZone", {"value": local, "timezone": "Mars/Olympus"})
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 12}]
    assert dead(rec(fields=fields, after=[integer("1"), item])) == Code.BAD_VALUE


def test_decimals_are_exact_and_scaled():
    def d(text, p, s):
        return one_column((NS + "Decimal", {"value": text, "precision": p, "scale": s}), 246)

    value, columns = d("12.5", 10, 2)
    assert value == decimal.Decimal("12.50") and str(value) == "12.50"
    assert columns["c"] == "decimal(10,2)"
    value, columns = d("0.1000000000000000055511151231257827", 40, 34)
    assert value == decimal.Decimal("0.1000000000000000055511151231257827")
    value, columns = d("123.4500", 0, 0)  # no usable precision: typed from the value
    assert value == decimal.Decimal("123.4500") and columns["c"] == "decimal(7,4)"
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 246}]
    for text in ("1.234", "NaN", "1,5", ""):
        item = (NS + "Decimal", {"value": text, "precision": 10, "scale": 2})
        assert dead(rec(fields=fields, after=[integer("1"), item])) == Code.BAD_VALUE, text


def test_integers_beyond_int64_stay_exact():
    value, columns = one_column(integer("18446744073709551615"), 8)
    assert value == decimal.Decimal(18446744073709551615) and columns["c"] == "decimal(20,0)"
    value, columns = one_column(integer("-9223372036854775808"), 8)
    assert value == -(2**63) and columns["c"] == "int64"
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 8}]
    for text in ("1_000", "1.0", "x"):
        assert dead(rec(fields=fields, after=[integer("1"), integer(text)])) == Code.BAD_VALUE


def test_character_sets():
    assert one_column(char("中文", "gbk", "gbk"))[0] == "中文"
    assert one_column(char("€", "latin1", "cp1252"))[0] == "€"
    assert one_column(char("x", "UTF-8"))[0] == "x"
    value, columns = one_column((NS + "Character", {"charset": "binary", "value": b"\x00\xff"}))
    assert value == b"\x00\xff" and columns["c"] == "binary"
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 253}]
    bad_bytes = (NS + "Character", {"charset": "utf8mb4", "value": b"\xff\xfe"})
    assert dead(rec(fields=fields, after=[integer("1"), bad_bytes])) == Code.BAD_VALUE
    unknown = (NS + "Character", {"charset": "no-such-charset", "value": b"x"})
    assert dead(rec(fields=fields, after=[integer("1"), unknown])) == Code.BAD_VALUE


def test_objects_geometries_and_floats():
    assert one_column((NS + "TextObject", {"type": "json", "value": "[1]"})) == (
        "[1]",
        {"id": "int64", "c": "json"},
    )
    assert one_column((NS + "TextObject", {"type": "SET", "value": "a,b"}))[1]["c"] == "string"
    assert one_column((NS + "BinaryObject", {"type": "BLOB", "value": b"\x01"})) == (
        b"\x01",
        {"id": "int64", "c": "binary"},
    )
    assert one_column((NS + "BinaryGeometry", {"type": "POINT", "value": b"\x02"}))[0] == b"\x02"
    assert one_column((NS + "TextGeometry", {"type": "POINT", "value": "POINT(1 2)"}))[0] == (
        "POINT(1 2)"
    )
    value, columns = one_column((NS + "Float", {"value": 0.1, "precision": 0, "scale": 0}), 5)
    assert value == 0.1 and columns["c"] == "float64"


def test_null_columns_are_typed_from_mysql_type_numbers_only():
    _, columns = one_column(None, 12)
    assert columns["c"] == "timestamp"
    _, columns = one_column(None, 253)  # VARCHAR could be text or binary: not declared
    assert "c" not in columns
    _, columns = one_column(None, 12, source_type="Oracle")  # Oracle numbering is not used
    assert "c" not in columns


# --------------------------------------------------------------------------- images, keys


def test_images_must_align_with_fields():
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 253}]
    assert dead(rec(fields=fields, after=[integer("1")])) == Code.BAD_FIELD
    assert dead(rec(fields=fields, after="text")) == Code.BAD_FIELD
    assert dead(rec(fields=None, after=[integer("1")])) == Code.MISSING_FIELD
    assert dead(rec("UPDATE", fields=fields, after=[integer("1"), char("x")])) == (
        Code.MISSING_FIELD
    )  # no before image
    assert dead(rec(object_name=None, fields=fields, after=[integer("1"), char("x")])) == (
        Code.MISSING_FIELD
    )


def test_delete_has_no_after_image_even_if_one_is_sent():
    fields = [{"name": "id", "dataTypeNumber": 8}]
    [event] = decode(rec("DELETE", fields=fields, before=[integer("4")], after=[integer("5")]))
    assert event.before == {"id": 4} and event.after is None and event.key == {"id": 4}


def test_key_sources_in_order():
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "email", "dataTypeNumber": 253}]
    after = [integer("1"), char("a@x")]
    both = {"pk_uk_info": '{"uk_mail":["email"],"PRIMARY":["id"]}'}
    assert decode(rec(fields=fields, after=after, tags=both))[0].key == {"id": 1}
    unique_only = {"pk_uk_info": '{"uk_mail":["email"]}'}
    assert decode(rec(fields=fields, after=after, tags=unique_only))[0].key == {"email": "a@x"}
    configured = {"primary_keys": {"db.t": ["id"]}}
    assert decode(rec(fields=fields, after=after, tags=unique_only), configured)[0].key == {"id": 1}
    # the tag's primary key wins over the options
    assert decode(rec(fields=fields, after=after, tags=both), {"primary_keys": {"t": ["email"]}})[
        0
    ].key == {"id": 1}
    assert (
        dead(rec(fields=fields, after=after, tags=unique_only), {"use_unique_key": False})
        == Code.MISSING_KEY
    )
    assert dead(rec(fields=fields, after=after, tags={})) == Code.MISSING_KEY
    assert dead(rec(fields=fields, after=after, tags={"pk_uk_info": '["id"]'})) == Code.BAD_FIELD


def test_update_takes_an_unchanged_key_from_the_before_image():
    fields = [{"name": "id", "dataTypeNumber": 8}, {"name": "c", "dataTypeNumber": 253}]
    none = (NS + "EmptyObject", "NONE")
    [event] = decode(
        rec("UPDATE", fields=fields, before=[integer("9"), char("a")], after=[none, char("b")])
    )
    assert event.key == {"id": 9} and event.after == {"c": "b"}
    assert (
        dead(rec("UPDATE", fields=fields, before=[none, char("a")], after=[none, char("b")]))
        == Code.MISSING_KEY
    )


def test_decoder_pickles():
    decoder = decoder_for("dts-avro", {"primary_keys": {"t": ["id"]}})
    clone = pickle.loads(pickle.dumps(decoder))
    fields = [{"name": "id", "dataTypeNumber": 8}]
    value = raw(rec(fields=fields, after=[integer("1")], tags={}))
    assert clone.decode(Record(value=value))[0].key == {"id": 1}


# --------------------------------------------------------------------------- encoder

COLUMNS = {
    "id": "int64",
    "small": "int32",
    "name": "string",
    "doc": "json",
    "price": "decimal(12,3)",
    "ratio": "float64",
    "blob": "binary",
    "born": "date",
    "at": "time",
    "local": "timestamp",
    "instant": "timestamptz",
}
ROW = {
    "id": 1,
    "small": -5,
    "name": "naïve",
    "doc": '{"k": 1}',
    "price": decimal.Decimal("-1.250"),
    "ratio": 1e-300,
    "blob": b"\x00\x01",
    "born": dt.date(1, 1, 1),
    "at": dt.time(23, 59, 59, 999999),
    "local": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    "instant": dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC),
}


def change(op, before, after, seq, schema=""):
    return SourceChange(
        op=op,
        table=SourceTable("", "shop", schema, "items"),
        columns=COLUMNS,
        key_columns=("id",),
        before=before,
        after=after,
        seq=seq,
        ts_ms=1_700_000_000_123 + seq,
    )


@pytest.mark.parametrize("schema", ["", "public"])
def test_encoder_round_trips_every_exact_type(schema):
    encoder, decoder = encoder_for("dts-avro"), decoder_for("dts-avro")
    assert {parse.split("(")[0] for parse in COLUMNS.values()} <= encoder.exact_types
    partial = {"id": 1, "name": None}  # columns not carried are EmptyObject.NONE
    changes = [
        change(Op.INSERT, None, ROW, 1, schema),
        change(Op.UPDATE, ROW, partial, 2, schema),
        change(Op.DELETE, partial, None, 3, schema),
        change(Op.TRUNCATE, None, None, 4, schema),
    ]
    records = [Record(value=m.value) for c in changes for m in encoder.encode(c)]
    result = decoder.decode_batch(records)
    assert not result.dead_letters
    ins, upd, dele, trunc = result.events
    assert ins.after == ROW and ins.key == {"id": 1}
    # every Integer is declared int64 (the record does not say the column's width)
    assert ins.columns == {**COLUMNS, "small": "int64"}
    assert upd.before == ROW and upd.after == partial
    assert dele.before == partial and dele.after is None
    assert trunc.op is Op.TRUNCATE and trunc.source.table == "items"
    assert (ins.source.schema, ins.meta["source_type"]) == (
        (schema, "PostgreSQL") if schema else ("", "MySQL")
    )
    keys = [seq_key(e.seq) for e in result.events]
    assert keys == sorted(keys) and ins.ts_ms == 1_700_000_000_000

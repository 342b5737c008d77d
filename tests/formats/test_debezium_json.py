"""Unit tests for the tricky parts of ``debezium-json`` (see docs/formats/debezium-json.md)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import pickle
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.debezium.json_decoder import DebeziumJsonDecoder, DebeziumJsonOptions
from cdcflow.model import Op, Origin, SourceTable, dumps, event_to_json_dict, seq_key
from cdcflow_testkit.encoders import SourceChange
from cdcflow_testkit.encoders.debezium_json import DebeziumJsonEncoder
from cdcflow_testkit.golden import load_case

D = decimal.Decimal
UTC = dt.UTC
CASES = Path(__file__).parent / "cases" / "debezium-json"

PG_SOURCE = {
    "version": "2.7.0.Final",
    "connector": "postgresql",
    "name": "srv",
    "ts_ms": 1700000000000,
    "snapshot": "false",
    "db": "shop",
    "sequence": '["100","120"]',
    "schema": "public",
    "table": "items",
    "txId": 42,
    "lsn": 120,
    "xmin": None,
}


def _dumps(obj) -> bytes:
    return orjson.dumps(obj, default=str)


def payload(op="c", before=None, after=None, source=None, **extra):
    out = {
        "before": before,
        "after": after,
        "source": source or PG_SOURCE,
        "op": op,
        "ts_ms": 1700000000999,
    }
    out.update(extra)
    return out


def decode_one(value, key=None, headers=(), **options):
    dec = DebeziumJsonDecoder(DebeziumJsonOptions(**options))
    raw = value if isinstance(value, bytes) else _dumps(value)
    rawkey = key if key is None or isinstance(key, bytes) else _dumps(key)
    events = dec.decode(Record(value=raw, key=rawkey, headers=tuple(headers)))
    assert len(events) == 1
    return events[0]


def decode_error(value, key=None, **options) -> DecodeError:
    dec = DebeziumJsonDecoder(DebeziumJsonOptions(**options))
    raw = value if isinstance(value, bytes) else _dumps(value)
    rawkey = key if key is None or isinstance(key, bytes) else _dumps(key)
    with pytest.raises(DecodeError) as info:
        dec.decode(Record(value=raw, key=rawkey))
    return info.value


def with_schema(fields, after, op="c", before=None, source=None):
    row = {"type": "struct", "fields": fields, "optional": True, "name": "srv.public.items.Value"}
    schema = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "fields": [], "field": "source"},
            {"type": "string", "field": "op"},
        ],
        "name": "srv.public.items.Envelope",
    }
    return {"schema": schema, "payload": payload(op, before, after, source)}


def field(name, ftype, logical=None, params=None):
    f = {"type": ftype, "optional": True, "field": name}
    if logical:
        f["name"] = logical
    if params:
        f["parameters"] = params
    return f


def dec_field(name, scale, precision=None):
    params = {"scale": str(scale)}
    if precision is not None:
        params["connect.decimal.precision"] = str(precision)
    return field(name, "bytes", "org.apache.kafka.connect.data.Decimal", params)


def unscaled_b64(n: int) -> str:
    size = (n if n >= 0 else ~n).bit_length() // 8 + 1
    return base64.b64encode(n.to_bytes(size, "big", signed=True)).decode()


KEY_ID = {"id": 1}

# --------------------------------------------------------------------------- decimals


@pytest.mark.parametrize(
    ("unscaled", "scale", "want"),
    [
        (-1, 2, D("-0.01")),
        (-128, 2, D("-1.28")),
        (-129, 0, D("-129")),
        (128, 1, D("12.8")),
        (0, 3, D("0.000")),
        (-(10**37) + 1, 10, D("-999999999999999999999999999.9999999999")),
    ],
)
def test_connect_decimal_bytes_are_twos_complement_big_endian(unscaled, scale, want):
    fields = [field("id", "int32"), dec_field("price", scale, 38)]
    event = decode_one(with_schema(fields, {"id": 1, "price": unscaled_b64(unscaled)}), KEY_ID)
    got = event.after["price"]
    assert got == want and got.as_tuple().exponent == -scale
    assert event.columns["price"] == f"decimal(38,{scale})"


def test_connect_decimal_known_wire_bytes():
    # 0xFF80 would be a non-minimal encoding of -128; 0x80 is what Java's BigInteger writes.
    fields = [field("id", "int32"), dec_field("d", 2)]
    event = decode_one(with_schema(fields, {"id": 1, "d": "gA=="}), KEY_ID)
    assert event.after["d"] == D("-1.28")
    assert event.columns["d"] == "decimal(38,2)"  # no connect.decimal.precision: the default


def test_decimal_precision_default_is_an_option():
    fields = [field("id", "int32"), dec_field("d", 2)]
    event = decode_one(with_schema(fields, {"id": 1, "d": "AQ=="}), KEY_ID, decimal_precision=20)
    assert event.columns["d"] == "decimal(20,2)"


def test_decimal_as_json_number_is_exact():
    # decimal.format=NUMERIC: a float64 would lose the last digits of both values.
    row = (
        b'"fields": [{"type": "int32", "field": "id"},'
        b'{"type": "bytes", "field": "d", "name": "org.apache.kafka.connect.data.Decimal",'
        b' "parameters": {"scale": "3", "connect.decimal.precision": "40"}},'
        b'{"type": "double", "field": "f"}]'
    )
    raw = (
        b'{"schema": {"type": "struct", "fields": ['
        b'{"type": "struct", "field": "before", ' + row + b"},"
        b'{"type": "struct", "field": "after", ' + row + b"},"
        b'{"type": "struct", "field": "source", "fields": []},'
        b'{"type": "string", "field": "op"}]},'
        b' "payload": {"op": "c", "before": null, "after": {"id": 1,'
        b' "d": 123456789876543212345678987654321.110, "f": 0.1},'
        b' "source": {"connector": "mysql", "db": "x", "table": "t", "file": "b.000001", "pos": 4, "row": 0}}}'
    )
    event = decode_one(raw, KEY_ID)
    assert event.after["d"] == D("123456789876543212345678987654321.110")
    assert str(event.after["d"]) == "123456789876543212345678987654321.110"
    assert event.after["f"] == 0.1 and type(event.after["f"]) is float
    assert event.columns == {"id": "int32", "d": "decimal(40,3)", "f": "float64"}


def test_decimal_with_more_digits_than_its_scale_is_bad_value():
    fields = [field("id", "int32"), dec_field("d", 1)]
    err = decode_error(with_schema(fields, {"id": 1, "d": 1.25}), KEY_ID)
    assert err.code == Code.BAD_VALUE and "'d'" in err.message


def test_decimal_that_is_not_base64_is_bad_value():
    fields = [field("id", "int32"), dec_field("d", 1)]
    assert decode_error(with_schema(fields, {"id": 1, "d": "12.5"}), KEY_ID).code == Code.BAD_VALUE


def test_variable_scale_decimal():
    fields = [
        field("id", "int32"),
        {
            "type": "struct",
            "name": "io.debezium.data.VariableScaleDecimal",
            "field": "n",
            "fields": [{"type": "int32", "field": "scale"}, {"type": "bytes", "field": "value"}],
        },
    ]
    value = {"id": 1, "n": {"scale": 3, "value": unscaled_b64(-12345)}}
    event = decode_one(with_schema(fields, value), KEY_ID)
    assert event.after["n"] == D("-12.345") and str(event.after["n"]) == "-12.345"
    assert event.columns["n"] == "decimal(38,18)"
    event = decode_one(
        with_schema(fields, value), KEY_ID, variable_scale_decimal_type="decimal(30,5)"
    )
    assert event.columns["n"] == "decimal(30,5)"
    bad = with_schema(fields, {"id": 1, "n": {"scale": "x", "value": "AQ=="}})
    assert decode_error(bad, KEY_ID).code == Code.BAD_VALUE


def test_decimal_text_with_propagated_source_type():
    # decimal.handling.mode=string + column.propagate.source.type
    f = field(
        "pt",
        "string",
        None,
        {
            "__debezium.source.column.type": "DECIMAL UNSIGNED",
            "__debezium.source.column.length": "10",
            "__debezium.source.column.scale": "2",
        },
    )
    event = decode_one(with_schema([field("id", "int32"), f], {"id": 1, "pt": "12.5"}), KEY_ID)
    assert event.after["pt"] == D("12.50") and event.columns["pt"] == "decimal(10,2)"


# --------------------------------------------------------------------------- time types

TIME_CASES = [
    ("int32", "org.apache.kafka.connect.data.Date", 19439, "date", dt.date(2023, 3, 23)),
    ("int32", "io.debezium.time.Date", -1, "date", dt.date(1969, 12, 31)),
    ("int32", "org.apache.kafka.connect.data.Time", 36803123, "time", dt.time(10, 13, 23, 123000)),
    ("int32", "io.debezium.time.Time", 36803123, "time", dt.time(10, 13, 23, 123000)),
    ("int64", "io.debezium.time.MicroTime", 36803123456, "time", dt.time(10, 13, 23, 123456)),
    # nanoseconds are truncated to the model's microseconds
    ("int64", "io.debezium.time.NanoTime", 36803123456789, "time", dt.time(10, 13, 23, 123456)),
    (
        "int64",
        "org.apache.kafka.connect.data.Timestamp",
        1679581805123,
        "timestamp",
        dt.datetime(2023, 3, 23, 14, 30, 5, 123000),
    ),
    (
        "int64",
        "io.debezium.time.Timestamp",
        1679581805123,
        "timestamp",
        dt.datetime(2023, 3, 23, 14, 30, 5, 123000),
    ),
    (
        "int64",
        "io.debezium.time.MicroTimestamp",
        1679581805123456,
        "timestamp",
        dt.datetime(2023, 3, 23, 14, 30, 5, 123456),
    ),
    (
        "int64",
        "io.debezium.time.NanoTimestamp",
        1734382927000000999,
        "timestamp",
        dt.datetime(2024, 12, 16, 21, 2, 7),
    ),
    (
        "int64",
        "io.debezium.time.MicroTimestamp",
        -1,
        "timestamp",
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    ),
    (
        "string",
        "io.debezium.time.ZonedTimestamp",
        "2023-03-23T22:00:10.123456+08:00",
        "timestamptz",
        dt.datetime(2023, 3, 23, 14, 0, 10, 123456, tzinfo=UTC),
    ),
    (
        "string",
        "io.debezium.time.ZonedTimestamp",
        "2024-12-17T15:23:38.79Z",
        "timestamptz",
        dt.datetime(2024, 12, 17, 15, 23, 38, 790000, tzinfo=UTC),
    ),
    ("string", "io.debezium.time.ZonedTime", "09:00:00+08:00", "string", "09:00:00+08:00"),
    ("int32", "io.debezium.time.Year", 2023, "int32", 2023),
    ("string", "io.debezium.data.Json", '{"a": 1}', "json", '{"a": 1}'),
    (
        "string",
        "io.debezium.data.Uuid",
        "0e4d5dcd-a33b-11ea-80f1-02010a22a99e",
        "string",
        "0e4d5dcd-a33b-11ea-80f1-02010a22a99e",
    ),
    ("bytes", "io.debezium.data.Bits", "xwc=", "binary", b"\xc7\x07"),
    ("string", "io.debezium.data.EnumSet", "a,b", "string", "a,b"),
]


@pytest.mark.parametrize(
    ("ftype", "logical", "wire", "want_type", "want"),
    TIME_CASES,
    ids=[f"{c[1].rsplit('.', 1)[-1]}-{c[2]}" for c in TIME_CASES],
)
def test_logical_types(ftype, logical, wire, want_type, want):
    fields = [field("id", "int32"), field("v", ftype, logical)]
    event = decode_one(with_schema(fields, {"id": 1, "v": wire}), KEY_ID)
    assert event.after["v"] == want and type(event.after["v"]) is type(want)
    assert event.columns["v"] == want_type


@pytest.mark.parametrize(
    ("logical", "wire"),
    [
        ("io.debezium.time.MicroTime", 86_400_000_000),
        ("io.debezium.time.MicroTime", -1),
        ("io.debezium.time.ZonedTimestamp", "yesterday"),
        ("io.debezium.time.Date", "2020-01-01"),
    ],
)
def test_bad_time_values_are_bad_value(logical, wire):
    ftype = "string" if "Zoned" in logical else "int64"
    fields = [field("id", "int32"), field("v", ftype, logical)]
    assert decode_error(with_schema(fields, {"id": 1, "v": wire}), KEY_ID).code == Code.BAD_VALUE


def test_geometry_is_kept_as_the_json_text_of_its_struct():
    geo = {
        "type": "struct",
        "name": "io.debezium.data.geometry.Geometry",
        "field": "g",
        "fields": [{"type": "bytes", "field": "wkb"}, {"type": "int32", "field": "srid"}],
    }
    event = decode_one(
        with_schema([field("id", "int32"), geo], {"id": 1, "g": {"wkb": "AQEAAAA=", "srid": 4326}}),
        KEY_ID,
    )
    assert event.after["g"] == '{"wkb":"AQEAAAA=","srid":4326}' and event.columns["g"] == "json"


def test_int_values_out_of_range_are_bad_value():
    fields = [field("id", "int32"), field("small", "int16")]
    assert (
        decode_error(with_schema(fields, {"id": 1, "small": 2**31}), KEY_ID).code == Code.BAD_VALUE
    )
    fields = [field("id", "int32"), field("big", "int64")]
    raw = _dumps(with_schema(fields, {"id": 1, "big": 0})).replace(
        b'"big":0', b'"big":18446744073709551616'
    )
    assert decode_error(raw, KEY_ID).code == Code.BAD_VALUE  # orjson reads it as a float
    raw = raw.replace(b'"big":18446744073709551616', b'"big":9223372036854775807')
    assert decode_one(raw, KEY_ID).after["big"] == 2**63 - 1
    assert decode_error(with_schema(fields, {"id": 1, "big": "7"}), KEY_ID).code == Code.BAD_VALUE


# --------------------------------------------------------------------------- schemaless values


def test_schemaless_types_are_inferred():
    event = decode_one(
        payload(after={"id": 1, "s": "x", "f": 1.5, "b": True, "n": None, "o": {"k": [1, 2.5]}}),
        KEY_ID,
    )
    assert event.columns == {
        "id": "int64",
        "s": "string",
        "f": "float64",
        "b": "boolean",
        "o": "json",
    }
    assert event.after == {"id": 1, "s": "x", "f": 1.5, "b": True, "n": None, "o": '{"k":[1,2.5]}'}


def test_schemaless_integers_beyond_64_bits_stay_exact():
    raw = _dumps(payload(after={"id": 1, "u": 0})).replace(b'"u":0', b'"u":18446744073709551616')
    event = decode_one(raw, KEY_ID)
    assert event.after["u"] == 18446744073709551616 and event.columns["u"] == "decimal(20,0)"


def test_float_as_decimal():
    raw = _dumps(payload(after={"id": 1, "d": 0})).replace(
        b'"d":0', b'"d":12345678901234567890.123'
    )
    event = decode_one(raw, KEY_ID, float_as_decimal=True)
    assert (
        event.after["d"] == D("12345678901234567890.123") and event.columns["d"] == "decimal(23,3)"
    )
    plain = decode_one(raw, KEY_ID)
    assert plain.after["d"] == 12345678901234567890.123 and plain.columns["d"] == "float64"


# --------------------------------------------------------------------------- unavailable values


def test_unavailable_toast_value_is_left_out_of_the_image():
    ph = "__debezium_unavailable_value"
    value = payload("u", before=None, after={"id": 1, "doc": ph, "tags": [ph], "n": 2})
    event = decode_one(value, KEY_ID)
    assert event.after == {"id": 1, "n": 2}
    assert "doc" not in event.columns and event.before is None
    # nothing declares the left-out columns without a schema: the event says it is
    # partial, so the stored values are kept (found with real Debezium on PostgreSQL:
    # an update leaving a TOASTed text unchanged nulled it in the mirror)
    assert event.partial is True
    whole = decode_one(payload("u", before=None, after={"id": 1, "n": 2}), KEY_ID)
    assert whole.partial is None


def test_unavailable_bytes_value_with_schema():
    ph_b64 = base64.b64encode(b"__debezium_unavailable_value").decode()
    fields = [field("id", "int32"), field("blob", "bytes"), field("txt", "string")]
    event = decode_one(
        with_schema(
            fields, {"id": 1, "blob": ph_b64, "txt": "__debezium_unavailable_value"}, op="u"
        ),
        KEY_ID,
    )
    assert event.after == {"id": 1}
    assert event.columns == {"id": "int32", "blob": "binary", "txt": "string"}  # declared


def test_custom_placeholder():
    event = decode_one(
        payload("u", after={"id": 1, "doc": "<toast>"}),
        KEY_ID,
        unavailable_value_placeholder="<toast>",
    )
    assert event.after == {"id": 1}


# --------------------------------------------------------------------------- keys


def test_key_from_the_kafka_key_plain_and_with_schema():
    after = {"id": 7, "sku": "a", "name": "x"}
    assert decode_one(payload(after=after), {"sku": "a", "id": 7}).key == {"sku": "a", "id": 7}
    key = {
        "schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]},
        "payload": {"id": 7},
    }
    assert decode_one(payload(after=after), key).key == {"id": 7}


def test_key_from_options_when_the_record_has_no_key():
    event = decode_one(payload(after={"id": 3, "x": 1}), primary_keys={"public.items": ("id",)})
    assert event.key == {"id": 3}


def test_key_missing_everywhere_is_missing_key():
    err = decode_error(payload(after={"id": 3}))
    assert err.code == Code.MISSING_KEY and "primary_keys" in err.message
    assert (
        decode_error(payload(after={"x": 3}), primary_keys={"*": ("id",)}).code == Code.MISSING_KEY
    )


def test_non_json_kafka_key_falls_back_to_the_options():
    event = decode_one(payload(after={"id": 3}), b"not json", primary_keys={"*": ("id",)})
    assert event.key == {"id": 3}


def test_delete_without_before_image_takes_the_key_from_the_kafka_key():
    # REPLICA IDENTITY NOTHING: before is null; the key message still names the row.
    key = {
        "schema": {
            "type": "struct",
            "fields": [field("id", "int64"), field("at", "int32", "io.debezium.time.Date")],
        },
        "payload": {"id": 9, "at": 19439},
    }
    event = decode_one(payload("d", before=None, after=None), key)
    assert event.op is Op.DELETE and event.before is None and event.after is None
    assert event.key == {"id": 9, "at": dt.date(2023, 3, 23)}


# --------------------------------------------------------------------------- ops and envelopes


def test_ops():
    after = {"id": 1}
    assert decode_one(payload("c", after=after), KEY_ID).op is Op.INSERT
    assert decode_one(payload("r", after=after), KEY_ID).op is Op.SNAPSHOT
    up = decode_one(payload("u", before=None, after=after), KEY_ID)  # REPLICA IDENTITY DEFAULT
    assert up.op is Op.UPDATE and up.before is None
    assert decode_one(payload("d", before=after), KEY_ID).op is Op.DELETE
    trunc = decode_one(payload("t"), KEY_ID)
    assert trunc.op is Op.TRUNCATE and trunc.key is None and trunc.source.table == "items"
    msg = decode_one(
        {
            "op": "m",
            "source": {**PG_SOURCE, "schema": "", "table": ""},
            "message": {"prefix": "foo", "content": "Ymfy"},
        }
    )
    assert msg.op is Op.MESSAGE and msg.meta == {"prefix": "foo", "content": "Ymfy"}


def test_unknown_op_is_never_guessed():
    assert decode_error(payload("x", after={"id": 1}), KEY_ID).code == Code.UNKNOWN_OP
    assert decode_error(payload("C", after={"id": 1}), KEY_ID).code == Code.UNKNOWN_OP
    assert decode_error(payload(["c"], after={"id": 1}), KEY_ID).code == Code.BAD_FIELD


def test_wrong_envelopes():
    assert decode_error(b"[1]").code == Code.NOT_AN_OBJECT
    assert decode_error(b'{"schema": null, "payload": [1]}').code == Code.NOT_AN_OBJECT
    assert decode_error(payload("c", after=None), KEY_ID).code == Code.MISSING_FIELD
    assert decode_error(payload("c", after=[1]), KEY_ID).code == Code.BAD_FIELD
    assert decode_error({"op": "c", "after": {"id": 1}}, KEY_ID).code == Code.MISSING_FIELD
    no_table = payload("c", after={"id": 1}, source={"connector": "postgresql", "lsn": 1})
    assert decode_error(no_table, KEY_ID).code == Code.MISSING_FIELD
    mongo = payload(
        "c", after='{"_id": 1}', source={"connector": "mongodb", "db": "d", "collection": "c"}
    )
    err = decode_error(mongo, KEY_ID)
    assert err.code == Code.BAD_FIELD and "MongoDB" in err.message


def test_schema_include_option():
    wrapped = {"schema": None, "payload": payload(after={"id": 1})}
    assert decode_one(wrapped, KEY_ID).after == {"id": 1}
    assert decode_one(wrapped, KEY_ID, schema_include=True).after == {"id": 1}
    assert (
        decode_error(payload(after={"id": 1}), KEY_ID, schema_include=True).code
        == Code.MISSING_FIELD
    )
    assert decode_error(wrapped, KEY_ID, schema_include=False).code == Code.MISSING_FIELD


def test_null_payload_is_a_tombstone():
    dec = DebeziumJsonDecoder()
    result = dec.decode_batch([Record(b'{"schema": {"type": "struct"}, "payload": null}')])
    assert [s.reason for s in result.skipped] == ["TOMBSTONE"]


def test_transaction_metadata_events():
    begin = decode_one(
        {
            "status": "BEGIN",
            "id": "571:53195829",
            "ts_ms": 1486500577125,
            "event_count": None,
            "data_collections": None,
        }
    )
    assert begin.op is Op.BEGIN and begin.txn.id == "571:53195829" and begin.ts_ms == 1486500577125
    end = decode_one(
        {
            "status": "END",
            "id": "571:53195829",
            "ts_ms": 1486500577691,
            "event_count": 2,
            "data_collections": [{"data_collection": "s1.a", "event_count": "2"}],
        }
    )
    assert end.op is Op.COMMIT and end.key is None
    assert end.meta == {
        "event_count": 2,
        "data_collections": [{"data_collection": "s1.a", "event_count": 2}],
    }
    assert decode_error({"status": "ROLLBACK", "id": "1"}).code == Code.UNKNOWN_OP


def test_transaction_block_and_txid():
    block = {"id": "571:53195832", "total_order": "3", "data_collection_order": "1"}
    event = decode_one(payload(after={"id": 1}, transaction=block), KEY_ID)
    assert (event.txn.id, event.txn.order) == ("571:53195832", 3)
    assert event.meta == {"data_collection_order": 1}
    assert decode_one(payload(after={"id": 1}), KEY_ID).txn.id == "42"  # source.txId


def test_heartbeat_and_schema_change():
    assert decode_one({"ts_ms": 1700000000000}).op is Op.HEARTBEAT
    ddl = decode_one(
        {
            "source": {
                "connector": "mysql",
                "db": "inv",
                "table": "t",
                "file": "b.000002",
                "pos": 9,
                "row": 0,
                "ts_ms": 5,
            },
            "databaseName": "inv",
            "ddl": "DROP TABLE t",
            "tableChanges": [],
        }
    )
    assert (ddl.op, ddl.ddl, ddl.seq, ddl.meta) == (
        Op.DDL,
        "DROP TABLE t",
        (2, 9, 0),
        {"table_changes": []},
    )


def test_ts_ms_is_the_source_commit_time():
    assert decode_one(payload(after={"id": 1}), KEY_ID).ts_ms == 1700000000000
    zero = payload(after={"id": 1}, source={**PG_SOURCE, "ts_ms": 0})
    assert decode_one(zero, KEY_ID).ts_ms == 1700000000999  # snapshot rows of old MySQL


# --------------------------------------------------------------------------- sequences


def _seq(source):
    return decode_one(
        payload(after={"id": 1}, source={"db": "d", "table": "t", **source}), KEY_ID
    ).seq


def test_seq_per_connector():
    assert _seq({"connector": "postgresql", "lsn": 120, "sequence": '["100","120"]'}) == (100, 120)
    assert _seq({"connector": "postgresql", "lsn": 120, "sequence": '[null,"120"]'}) == (0, 120)
    assert _seq({"connector": "postgresql", "lsn": 120}) == (0, 120)
    assert _seq({"connector": "mysql", "file": "mysql-bin.000003", "pos": 154, "row": 2}) == (
        3,
        154,
        2,
    )
    assert _seq({"connector": "mariadb", "file": "", "pos": 0, "row": 0}) == (0, 0, 0)
    assert _seq({"connector": "oracle", "scn": "2122185", "commit_scn": "2122190"}) == (
        2122190,
        2122185,
    )
    assert _seq({"connector": "oracle", "scn": "2122185", "commit_scn": None}) == (0, 2122185)
    ss = _seq(
        {
            "connector": "sqlserver",
            "commit_lsn": "00000027:00000758:0005",
            "change_lsn": "00000027:00000758:0003",
            "event_serial_no": "1",
        }
    )
    assert ss == (0x00000027000007580005, 0x00000027000007580003, 1)
    assert _seq({"connector": "mongodb", "ts_ms": 1739321992000, "ord": 28}) == (1739321992000, 28)
    assert _seq({"connector": "vitess", "ts_ms": 77}) == (77,)
    # no connector name: detected from the fields
    assert _seq({"file": "{context}-bin.000007", "pos": 5, "row": 0}) == (7, 5, 0)
    assert _seq({"scn": "12"}) == (0, 12)


def test_seq_orders_like_the_source_log():
    def key(source):
        return seq_key(_seq(source))

    # PostgreSQL: commit order first, so a transaction that committed later sorts later
    # even when its changes have lower LSNs (interleaved transactions).
    assert key({"connector": "postgresql", "lsn": 500, "sequence": '["400","500"]'}) < key(
        {"connector": "postgresql", "lsn": 300, "sequence": '["600","300"]'}
    )
    # MySQL: binlog rollover 000009 -> 000010 and growing positions.
    assert key({"connector": "mysql", "file": "mysql-bin.000009", "pos": 99999, "row": 0}) < key(
        {"connector": "mysql", "file": "mysql-bin.000010", "pos": 4, "row": 0}
    )
    assert key({"connector": "mysql", "file": "mysql-bin.000010", "pos": 4, "row": 1}) < key(
        {"connector": "mysql", "file": "mysql-bin.000010", "pos": 4, "row": 2}
    )
    # SQL Server: hex LSNs compare as numbers, not as text.
    assert key({"connector": "sqlserver", "commit_lsn": "0000000a:00000000:0000"}) > key(
        {"connector": "sqlserver", "commit_lsn": "00000009:ffffffff:ffff"}
    )
    # Oracle: a streamed change sorts after the snapshot rows.
    assert key({"connector": "oracle", "scn": "900"}) < key(
        {"connector": "oracle", "scn": "800", "commit_scn": "1000"}
    )


def test_seq_fields_that_are_not_numbers_are_bad_field():
    for source in (
        {"connector": "postgresql", "lsn": "abc"},
        {"connector": "mysql", "file": "binlog", "pos": 1, "row": 0},
        {"connector": "sqlserver", "commit_lsn": "zz:00"},
    ):
        err = decode_error(
            payload(after={"id": 1}, source={"db": "d", "table": "t", **source}), KEY_ID
        )
        assert err.code == Code.BAD_FIELD


# --------------------------------------------------------------------------- headers


def test_primary_key_change_headers():
    old = orjson.dumps({"schema": {"type": "struct"}, "payload": {"id": 1}})
    create = decode_one(
        payload("c", after={"id": 2}), {"id": 2}, headers=[("__debezium.oldkey", old)]
    )
    assert create.meta == {"oldkey": {"id": 1}}
    delete = decode_one(
        payload("d", before={"id": 1}), {"id": 1}, headers=[("__debezium.newkey", b'{"id": 2}')]
    )
    assert delete.meta == {"newkey": {"id": 2}}
    text = decode_one(
        payload("d", before={"id": 1}), {"id": 1}, headers=[("__debezium.newkey", b"Struct{id=2}")]
    )
    assert text.meta == {"newkey": "Struct{id=2}"}


# --------------------------------------------------------------------------- the decoder object


def test_fast_path_gives_the_same_events_as_the_general_path():
    checked = 0
    for expected in sorted(CASES.glob("*.expected.jsonl")):
        case = load_case(expected)
        fast = decoder_for("debezium-json", case.options)
        general = decoder_for("debezium-json", case.options)
        general._fast_ok = False
        for record in case.records:
            try:
                a = fast.decode(record)
            except Exception as exc:  # noqa: BLE001
                a = type(exc).__name__
            try:
                b = general.decode(record)
            except Exception as exc:  # noqa: BLE001
                b = type(exc).__name__
            assert a == b, (expected.name, record.origin.offset)
            checked += 1
    assert checked > 40


def test_decoder_pickles_after_use():
    dec = DebeziumJsonDecoder(DebeziumJsonOptions(primary_keys={"*": ("id",)}))
    fields = [field("id", "int32"), dec_field("d", 1)]
    raw = _dumps(with_schema(fields, {"id": 1, "d": "AQ=="}))
    first = dec.decode(Record(raw))
    clone = pickle.loads(pickle.dumps(dec))
    assert clone.decode(Record(raw)) == first and clone.options == dec.options


def test_options_are_validated():
    with pytest.raises(ConfigError, match="valid options"):
        decoder_for("debezium-json", {"schema-include": True})
    with pytest.raises(ConfigError):
        decoder_for("debezium-json", {"variable_scale_decimal_type": "string"})
    dec = decoder_for("debezium-json", {"schema_include": False, "primary_keys": {"t": ["id"]}})
    assert dec.options.schema_include is False and dec.options.primary_keys == {"t": ("id",)}


def test_decode_batch_accounts_for_every_record():
    good = _dumps(payload(after={"id": 1}))
    records = [Record(good, b'{"id":1}'), Record(None), Record(b"{"), Record(_dumps(payload("q")))]
    result = DebeziumJsonDecoder().decode_batch(records)
    assert len(result.events) == 1 and [s.reason for s in result.skipped] == ["TOMBSTONE"]
    assert [d.code for d in result.dead_letters] == [Code.BAD_JSON, Code.UNKNOWN_OP]


# --------------------------------------------------------------------------- encoder

ALL_COLUMNS = {
    "id": "int64",
    "small": "int32",
    "name": "string",
    "doc": "json",
    "price": "decimal(10,2)",
    "neg": "decimal(5,0)",
    "ratio": "float32",
    "score": "float64",
    "ok": "boolean",
    "blob": "binary",
    "born": "date",
    "at": "time",
    "local": "timestamp",
    "utc": "timestamptz",
}
ALL_ROW = {
    "id": 1,
    "small": -5,
    "name": "é ☃",
    "doc": '{"a": [1, 2]}',
    "price": D("-12.50"),
    "neg": D("-128"),
    "ratio": 0.5,
    "score": 1e-300,
    "ok": False,
    "blob": b"\x00\xff",
    "born": dt.date(1, 1, 1),
    "at": dt.time(23, 59, 59, 999999),
    "local": dt.datetime(1969, 7, 20, 20, 17, 40, 1),
    "utc": dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC),
}


def _change(op, before, after, seq=7, columns=ALL_COLUMNS, key=("id",)):
    return SourceChange(
        op=op,
        table=SourceTable("", "shop", "public", "items"),
        columns=columns,
        key_columns=key,
        before=before,
        after=after,
        seq=seq,
        ts_ms=1_700_000_000_000,
        txn_id="555",
    )


def test_encoder_round_trips_every_exact_type():
    enc, dec = DebeziumJsonEncoder(), DebeziumJsonDecoder()
    assert {t.split("(")[0] for t in ALL_COLUMNS.values()} <= enc.exact_types
    for op, before, after in [
        (Op.INSERT, None, ALL_ROW),
        (Op.SNAPSHOT, None, ALL_ROW),
        (Op.UPDATE, ALL_ROW, {**ALL_ROW, "name": None}),
        (Op.DELETE, ALL_ROW, None),
    ]:
        (msg,) = enc.encode(_change(op, before, after))
        event = dec.decode(Record(msg.value, msg.key))[0]
        assert event.op is op and event.key == {"id": 1}
        assert event.after == after and event.before == before
        assert event.columns == ALL_COLUMNS
        assert event.seq == (0, 7) and event.txn.id == "555" and event.ts_ms == 1_700_000_000_000


def test_encoder_writes_debezium_shapes():
    (msg,) = DebeziumJsonEncoder().encode(_change(Op.INSERT, None, ALL_ROW))
    value = orjson.loads(msg.value)
    after = value["payload"]["after"]
    assert after["price"] == "+x4=" and after["neg"] == "gA=="  # -1250 and -128, minimal bytes
    assert after["utc"] == "2024-02-29T23:59:59.123456Z" and after["born"] == -719162
    src = value["payload"]["source"]
    assert (src["connector"], src["lsn"], src["txId"], value["payload"]["op"]) == (
        "postgresql",
        7,
        555,
        "c",
    )
    assert orjson.loads(msg.key) == {
        "schema": {
            "type": "struct",
            "fields": [{"type": "int64", "optional": False, "field": "id"}],
            "optional": False,
            "name": "cdcflow.public.items.Key",
        },
        "payload": {"id": 1},
    }


def test_encoder_truncate_and_keyless_table():
    enc, dec = (
        DebeziumJsonEncoder(),
        DebeziumJsonDecoder(DebeziumJsonOptions(primary_keys={"*": ("id",)})),
    )
    (trunc,) = enc.encode(_change(Op.TRUNCATE, None, None))
    assert trunc.key is None and dec.decode(Record(trunc.value))[0].op is Op.TRUNCATE
    (keyless,) = enc.encode(_change(Op.INSERT, None, ALL_ROW, key=()))
    assert keyless.key is None
    assert dec.decode(Record(keyless.value, origin=Origin("t", 0, 1)))[0].key == {"id": 1}


# --------------------------------------------------------------------------- properties

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(
        [
            "c",
            "u",
            "d",
            "r",
            "t",
            "m",
            "mysql",
            "postgresql",
            '["1","2"]',
            '[null,"3"]',
            "mysql-bin.000002",
            "__debezium_unavailable_value",
        ]
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
BASES = [
    payload("u", before={"id": 1, "v": "a"}, after={"id": 1, "v": "b", "w": 1.5}),
    payload(
        "c",
        after={"id": 2, "x": True},
        source={
            "connector": "mysql",
            "db": "d",
            "table": "t",
            "file": "mysql-bin.000002",
            "pos": 10,
            "row": 0,
            "ts_ms": 5,
        },
    ),
    payload("d", before={"id": 3}, source={**PG_SOURCE, "sequence": '[null,"120"]', "txId": None}),
]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))


def _set(obj, path, value):
    if not path:
        return value
    obj = orjson.loads(orjson.dumps(obj))
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return obj


def _outcome(dec, record):
    try:
        return dec.decode(record)
    except DecodeError as exc:
        return exc.code


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(BASES), data=st.data(), key=st.sampled_from([None, b'{"id": 1}', b"[]"])
)
def test_any_field_value_decodes_or_dead_letters_and_both_paths_agree(base, data, key):
    path = data.draw(st.sampled_from(list(_paths(base))))
    value = data.draw(JSON_VALUES)
    try:
        raw = orjson.dumps(_set(base, path, value))
    except TypeError:  # an integer orjson cannot write: write it with the standard library
        raw = json.dumps(_set(base, path, value)).encode()
    record = Record(raw, key)
    options = DebeziumJsonOptions(primary_keys={"*": ("id",)})
    fast, general = DebeziumJsonDecoder(options), DebeziumJsonDecoder(options)
    general._fast_ok = False
    _outcome(fast, record)  # warm the caches the fast path relies on
    got = _outcome(fast, record)
    assert got == _outcome(general, record)
    if isinstance(got, list):
        for event in got:
            dumps(event_to_json_dict(event))  # JSON-able, as the golden form needs


# --------------------------------------------------------------------------- the schema part
# Real messages: the seed document's create and update (corrected as SOURCES.md says) and
# the Debezium MySQL documentation's update and delete, each altered in one place.


def _case_values(name: str) -> list[dict]:
    return [json.loads(line) for line in (CASES / f"{name}.input.jsonl").read_text().splitlines()]


def _case_keys(name: str) -> list[bytes | None]:
    path = CASES / f"{name}.keys.jsonl"
    if not path.exists():
        return []
    return [None if k == "null" else k.encode() for k in path.read_text().splitlines()]


_SEED_OPTIONS = {"primary_keys": {"public.customers": ("id",)}}


def _batch(values: list, keys: list | None = None, **options) -> list:
    """decode_batch of ``values`` (objects or bytes) with offsets 0, 1, ..."""
    keys = keys or [None] * len(values)
    records = [
        Record(value=v if isinstance(v, bytes) else _dumps(v), key=k, origin=Origin("t", 0, i))
        for i, (v, k) in enumerate(zip(values, keys, strict=True))
    ]
    return DebeziumJsonDecoder(DebeziumJsonOptions(**options)).decode_batch(records)


def test_a_row_column_the_schema_does_not_declare_is_a_dead_letter():
    (create,) = _case_values("seed-3-create-corrected")
    altered = json.loads(json.dumps(create))
    altered["payload"]["after"]["nickname"] = "annie"
    result = _batch([create, altered, create], **_SEED_OPTIONS)
    assert [e.after["id"] for e in result.events] == [1, 1]
    (dead,) = result.dead_letters
    assert dead.code == Code.UNDECLARED_COLUMN and dead.origin == Origin("t", 0, 1)
    assert dead.value == _dumps(altered)
    assert "'nickname' of the after image" in dead.message
    assert "undeclared_columns: keep" in dead.message
    assert "sources[].options.undeclared_columns" in dead.message


def test_an_undeclared_null_column_and_one_in_the_before_image_are_dead_letters_too():
    (update,) = _case_values("seed-4-update-corrected")
    null_after = json.loads(json.dumps(update))
    null_after["payload"]["after"]["nickname"] = None
    in_before = json.loads(json.dumps(update))
    in_before["payload"]["before"]["nickname"] = "annie"
    result = _batch([null_after, in_before, update], **_SEED_OPTIONS)
    assert [(d.code, d.origin.offset) for d in result.dead_letters] == [
        (Code.UNDECLARED_COLUMN, 0),
        (Code.UNDECLARED_COLUMN, 1),
    ]
    assert "of the before image" in result.dead_letters[1].message
    assert [e.op for e in result.events] == [Op.UPDATE]


def test_undeclared_columns_keep_infers_their_type_as_before():
    (create,) = _case_values("seed-3-create-corrected")
    create["payload"]["after"].update({"nickname": "annie", "visits": 3, "gone": None})
    event = decode_one(create, undeclared_columns="keep", **_SEED_OPTIONS)
    assert event.after["nickname"] == "annie" and event.after["visits"] == 3
    assert event.after["gone"] is None
    assert event.columns == {
        "id": "int32",
        "first_name": "string",
        "last_name": "string",
        "email": "string",
        "nickname": "string",
        "visits": "int64",
    }


def test_undeclared_columns_is_checked_at_configuration():
    with pytest.raises(ConfigError, match=r"undeclared_columns must be one of \['dead_letter'"):
        decoder_for("debezium-json", {"undeclared_columns": "drop"})
    assert decoder_for("debezium-json").options.undeclared_columns == "dead_letter"


def test_the_documentation_update_and_delete_with_their_schema_decode_unchanged():
    """Every column of a real Debezium message is declared: nothing is refused."""
    name = "docs-mysql-changes"
    result = _batch(_case_values(name), _case_keys(name))
    assert result.dead_letters == []
    assert [e.op for e in result.events] == [Op.UPDATE, Op.DELETE, Op.TRUNCATE]


def _row_schema(create: dict) -> dict:
    return next(f for f in create["schema"]["fields"] if f["field"] == "after")


@pytest.mark.parametrize(
    ("make_schema", "shape"),
    [
        (lambda c: {}, "its type is None"),
        (lambda c: {"type": "string"}, "its type is 'string'"),
        (lambda c: {"type": "struct", "fields": []}, "it declares no fields"),
        # ExtractNewRecordState: the schema describes the row itself
        (
            lambda c: {k: v for k, v in _row_schema(c).items() if k != "field"},
            "its fields are id, first_name, last_name, email (no before, after, source, op)",
        ),
        # an Envelope without its source field
        (
            lambda c: {
                **c["schema"],
                "fields": [f for f in c["schema"]["fields"] if f["field"] != "source"],
            },
            "(no source)",
        ),
    ],
    ids=["empty", "not-a-struct", "no-fields", "row-schema", "no-source"],
)
def test_a_schema_that_is_not_an_envelope_is_a_dead_letter(make_schema, shape):
    (create,) = _case_values("seed-3-create-corrected")
    altered = {"schema": make_schema(create), "payload": create["payload"]}
    result = _batch([altered, create], **_SEED_OPTIONS)
    (dead,) = result.dead_letters
    assert dead.code == Code.BAD_FIELD and dead.origin == Origin("t", 0, 0)
    assert "not a Debezium change event Envelope" in dead.message and shape in dead.message
    assert "ExtractNewRecordState" in dead.message
    assert len(result.events) == 1  # the real message beside it decodes


def test_a_truncate_whose_schema_is_not_an_envelope_is_a_dead_letter():
    (truncate,) = _case_values("seed-5-truncate-corrected")
    altered = {"schema": {"type": "struct", "fields": []}, "payload": truncate["payload"]}
    result = _batch([truncate, altered])
    assert [e.op for e in result.events] == [Op.TRUNCATE]
    assert [(d.code, d.origin.offset) for d in result.dead_letters] == [(Code.BAD_FIELD, 1)]


def test_records_that_are_not_change_events_keep_their_own_schemas():
    """Heartbeats, transaction metadata, schema changes and logical messages carry schemas
    of their own (``Heartbeat``, ``TransactionMetadataValue``, ``SchemaChangeValue``,
    ``MessageValue``): they are not Envelopes and decode as before."""

    def struct(name, *names):
        return {"type": "struct", "name": name, "fields": [{"field": n} for n in names]}

    (message,) = _case_values("seed-7-message-nontransactional-corrected")
    message["schema"] = struct(
        "io.debezium.connector.postgresql.MessageValue", "op", "ts_ms", "source", "message"
    )
    values = [
        {
            "schema": struct("io.debezium.connector.common.Heartbeat", "ts_ms"),
            "payload": {"ts_ms": 1700000000000},
        },
        {
            "schema": struct(
                "io.debezium.connector.common.TransactionMetadataValue", "status", "id"
            ),
            "payload": {"status": "BEGIN", "id": "571", "ts_ms": 1},
        },
        *_case_values("docs-mysql-schema-change"),  # "schema": {} as the docs print it
        message,
    ]
    result = _batch(values)
    assert result.dead_letters == []
    assert [e.op for e in result.events] == [Op.HEARTBEAT, Op.BEGIN, Op.DDL, Op.MESSAGE]


def test_an_unwrapped_record_is_still_missing_its_op():
    """ExtractNewRecordState output (the row as the value) stays unsupported, as before."""
    (create,) = _case_values("seed-3-create-corrected")
    unwrapped = {
        "schema": {k: v for k, v in _row_schema(create).items() if k != "field"},
        "payload": create["payload"]["after"],
    }
    result = _batch([unwrapped])
    assert [d.code for d in result.dead_letters] == [Code.MISSING_FIELD]

"""Unit tests for ``canal-json`` (Canal flat messages, Alibaba DTS Canal Json)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
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
from cdcflow.formats.canal_json import CanalJsonDecoder, CanalJsonOptions
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for

CORPUS = Path(__file__).parent / "corpus" / "canal"
D = decimal.Decimal


def _msg(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "data": [{"id": "1", "v": "a"}],
        "database": "db",
        "es": 1_700_000_000_000,
        "id": 7,
        "isDdl": False,
        "mysqlType": {"id": "int", "v": "varchar(10)"},
        "old": None,
        "pkNames": ["id"],
        "sql": "",
        "sqlType": {"id": 4, "v": 12},
        "table": "t",
        "ts": 1_700_000_000_123,
        "type": "INSERT",
    }
    base.update(fields)
    return base


def _decode(msg: Any, offset: int = 0, **options: Any):
    value = msg if isinstance(msg, bytes) else orjson.dumps(msg)
    return decoder_for("canal-json", options or None).decode_batch(
        [Record(value=value, origin=Origin("t", 0, offset))]
    )


def _events(msg: Any, **options: Any):
    result = _decode(msg, **options)
    assert result.dead_letters == [], result.dead_letters
    return result.events


def _dead(msg: Any, **options: Any) -> str:
    result = _decode(msg, **options)
    assert result.events == [] and len(result.dead_letters) == 1, result
    return result.dead_letters[0].code


def _value(mysql_type: str, text: Any, **options: Any) -> tuple[Any, str]:
    (event,) = _events(
        _msg(data=[{"id": "1", "c": text}], mysqlType={"id": "int", "c": mysql_type}, sqlType=None),
        **options,
    )
    return event.after["c"], event.columns["c"]


# --------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    ("mysql_type", "text", "want", "logical"),
    [
        ("INT", "-5", -5, "int32"),
        ("int(11) unsigned", "4294967295", 4294967295, "int64"),
        ("TINYINT(2) unsigned zerofill", "003", 3, "int32"),
        ("MEDIUMINT(8) UNSIGNED ZEROFILL", "300000", 300000, "int32"),
        ("bigint(20)", "-9223372036854775808", -9223372036854775808, "int64"),
        ("BIGINT unsigned", "18446744073709551615", D("18446744073709551615"), "decimal(20,0)"),
        ("SERIAL", "40000000000", D("40000000000"), "decimal(20,0)"),
        ("tinyint(1)", "1", True, "boolean"),
        ("BOOL", "0", False, "boolean"),
        ("bit(1)", "1", True, "boolean"),
        ("bit(5)", "21", 21, "int64"),
        ("bit(64)", "18446744073709551615", D("18446744073709551615"), "decimal(20,0)"),
        ("FLOAT", "9.899999618530273", 9.899999618530273, "float32"),
        ("float(30)", "1.5", 1.5, "float64"),
        ("DOUBLE PRECISION(10,7) unsigned zerofill", "3.000333", 3.000333, "float64"),
        ("REAL", "1.000001", 1.000001, "float64"),
        ("NUMERIC(8,3)", "12345.110", D("12345.110"), "decimal(8,3)"),
        ("DECIMAL(8, 0) unsigned", "11111", D("11111"), "decimal(8,0)"),
        ("decimal", "12", D("12"), "decimal(10,0)"),
        (
            "FIXED(40,3)",
            "123456789876543212345678987654321.110",
            D("123456789876543212345678987654321.110"),
            "decimal(40,3)",
        ),
        ("DATE", "2023-03-23", dt.date(2023, 3, 23), "date"),
        (
            "DATETIME(2)",
            "2023-03-24 14:30:05.12",
            dt.datetime(2023, 3, 24, 14, 30, 5, 120000),
            "timestamp",
        ),
        (
            "datetime(6)",
            "2023-03-23 14:30:05.123456",
            dt.datetime(2023, 3, 23, 14, 30, 5, 123456),
            "timestamp",
        ),
        (
            "TIMESTAMP(6)",
            "2023-03-23 15:00:10.123456",
            dt.datetime(2023, 3, 23, 15, 0, 10, 123456),
            "timestamp",
        ),
        ("TIME", "10:13:23", dt.time(10, 13, 23), "time"),
        ("time(3)", "23:59:59.5", dt.time(23, 59, 59, 500000), "time"),
        ("YEAR", "2023", 2023, "int32"),
        ("VARCHAR(20)", "Apache Paimon", "Apache Paimon", "string"),
        ("LONGTEXT", "x", "x", "string"),
        ("JSON", '{"a": "b"}', '{"a": "b"}', "json"),
        ("BINARY(10)", "bytes", b"bytes", "binary"),
        ("varbinary(20)", "\u00ff\u0000\u0080", b"\xff\x00\x80", "binary"),
        ("LONGBLOB", "", b"", "binary"),
        ("POINT", "\u0000\u0000\u0000\u0000\u0001\u0001", b"\0\0\0\0\x01\x01", "binary"),
        ("ENUM('value1','value2','value3')", "2", "value2", "string"),
        ("enum('a','b')", "0", "", "string"),
        ("enum('it''s','x')", "1", "it's", "string"),
        ("enum('a','b')", "b", "b", "string"),
        ("SET('a','b','c','d')", "3", "a,b", "string"),
        ("set('a','b','c','d')", "12", "c,d", "string"),
        ("set('a','b')", "0", "", "string"),
        ("GEOGRAPHY_OF_THE_FUTURE(3)", "kept as text", "kept as text", "string"),
    ],
)
def test_values_are_parsed_by_mysql_type(mysql_type, text, want, logical):
    value, declared = _value(mysql_type, text)
    assert value == want and type(value) is type(want)
    assert declared == logical


@pytest.mark.parametrize("zero", ["0000-00-00", "0000-00-00 00:00:00", "2020-00-00 10:00:00"])
def test_mysql_zero_dates_become_null(zero):
    kind = "DATE" if len(zero) == 10 else "DATETIME"
    assert _value(kind, zero)[0] is None


@pytest.mark.parametrize(
    ("mysql_type", "text"),
    [
        ("INT", "abc"),
        ("INT", "1.5"),
        ("DECIMAL(5,2)", "NaN"),
        ("DECIMAL(5,2)", "x"),
        ("DATE", "2023-13-01"),
        ("DATETIME", "yesterday"),
        ("TIME", "25:00:00"),
        ("TIME", "-01:00:00"),
        ("TINYINT(1)", "2"),
        ("BLOB", "\u20ac"),
        ("FLOAT", "fast"),
        ("ENUM('a')", "5"),
        ("SET('a','b')", "4"),
    ],
)
def test_a_value_that_does_not_fit_its_type_is_bad_value(mysql_type, text):
    assert (
        _dead(_msg(data=[{"id": "1", "c": text}], mysqlType={"id": "int", "c": mysql_type}))
        == Code.BAD_VALUE
    )


def test_bad_value_message_names_the_column_and_the_fix():
    result = _decode(
        _msg(data=[{"id": "1", "flag": "2"}], mysqlType={"id": "int", "flag": "tinyint(1)"})
    )
    assert "'flag'" in result.dead_letters[0].message
    assert "tinyint1_as_boolean" in result.dead_letters[0].message


def test_values_written_as_json_numbers_are_accepted():
    """Flink's canal-json writer emits typed JSON, not text."""
    (e,) = _events(
        _msg(
            data=[
                {
                    "id": 1,
                    "big": 18446744073709551615,
                    "d": 1.25,
                    "f": 0.5,
                    "b": True,
                    "s": 12,
                    "j": {"a": [1]},
                }
            ],
            mysqlType={
                "id": "int",
                "big": "bigint unsigned",
                "d": "decimal(5,2)",
                "f": "double",
                "b": "boolean",
                "s": "varchar(5)",
                "j": "json",
            },
        )
    )
    assert e.after == {
        "id": 1,
        "big": D("18446744073709551615"),
        "d": D("1.25"),
        "f": 0.5,
        "b": True,
        "s": "12",
        "j": '{"a":[1]}',
    }
    assert type(e.after["d"]) is D


def test_a_float_in_an_int_column_is_not_truncated():
    assert _dead(_msg(data=[{"id": 1.5}])) == Code.BAD_VALUE


@pytest.mark.parametrize(
    ("mysql_type", "text", "logical"),
    [
        ("INT", "2147483648", "int32"),
        ("INT", "-2147483649", "int32"),
        ("SMALLINT UNSIGNED", "99999999999", "int32"),
        ("YEAR", "4294967296", "int32"),
        ("INT UNSIGNED", "9223372036854775808", "int64"),
        ("BIGINT", "9223372036854775808", "int64"),
        ("BIGINT", "-9223372036854775809", "int64"),
        ("BIT(63)", "99999999999999999999", "int64"),
    ],
)
def test_an_integer_outside_its_columns_range_is_bad_value_naming_column_and_range(
    mysql_type, text, logical
):
    result = _decode(_msg(data=[{"id": "1", "c": text}], mysqlType={"id": "int", "c": mysql_type}))
    assert result.events == []
    (dead,) = result.dead_letters
    assert dead.code == Code.BAD_VALUE
    assert "'c'" in dead.message and logical in dead.message
    lo, hi = (-(2**31), 2**31 - 1) if logical == "int32" else (-(2**63), 2**63 - 1)
    assert f"{lo}..{hi}" in dead.message


@pytest.mark.parametrize(
    ("mysql_type", "text", "want", "logical"),
    [
        ("INT", "2147483647", 2**31 - 1, "int32"),
        ("INT", "-2147483648", -(2**31), "int32"),
        ("BIGINT", "9223372036854775807", 2**63 - 1, "int64"),
        ("BIGINT", "-9223372036854775808", -(2**63), "int64"),
        ("INT UNSIGNED", "4294967295", 2**32 - 1, "int64"),
    ],
)
def test_integers_at_the_limits_of_their_range_are_kept(mysql_type, text, want, logical):
    assert _value(mysql_type, text) == (want, logical)


def test_range_is_checked_on_the_careful_path_and_in_old_images_too():
    # a JSON number (Flink's writer) takes the careful path; 'old' is typed there as well
    assert _dead(_msg(data=[{"id": 2147483648}])) == Code.BAD_VALUE
    result = _decode(_msg(type="UPDATE", data=[{"id": "1", "v": "b"}], old=[{"id": "2147483648"}]))
    assert [d.code for d in result.dead_letters] == [Code.BAD_VALUE]
    assert "'id'" in result.dead_letters[0].message


@pytest.mark.parametrize("es", [2**63, 2**64 - 1])
def test_es_beyond_int64_is_bad_field_naming_the_range(es):
    for msg in (_msg(es=es), _msg(type="TRUNCATE", isDdl=True, data=None, es=es)):
        result = _decode(msg)
        assert result.events == []
        (dead,) = result.dead_letters
        assert dead.code == Code.BAD_FIELD
        assert "'es'" in dead.message
        assert "-9223372036854775808..9223372036854775807" in dead.message


def test_es_at_the_int64_limit_is_kept():
    (e,) = _events(_msg(es=2**63 - 1))
    assert e.ts_ms == 2**63 - 1


def test_an_object_or_array_in_an_undeclared_column_is_json_text_declared_json():
    msg = _msg(data=[{"id": "1", "v": "a", "doc": {"a": [1, {"b": None}]}, "tags": [1, "x"]}])
    (e,) = _events(msg)
    assert e.after["doc"] == '{"a":[1,{"b":null}]}' and e.after["tags"] == '[1,"x"]'
    assert e.columns == {"id": "int32", "v": "string", "doc": "json", "tags": "json"}
    # the table's cached declaration is not changed: the next row has no such columns
    decoder = decoder_for("canal-json")
    first, second = (decoder.decode(Record(value=orjson.dumps(m)))[0] for m in (msg, _msg()))
    assert "doc" in first.columns and second.columns == {"id": "int32", "v": "string"}


def test_an_undeclared_scalar_keeps_its_json_value():
    (e,) = _events(_msg(data=[{"id": "1", "n": 5, "f": 0.5, "t": "x"}]))
    assert (e.after["n"], e.after["f"], e.after["t"]) == (5, 0.5, "x")
    assert "n" not in e.columns and "f" not in e.columns and "t" not in e.columns


def test_an_undeclared_object_in_old_is_json_text_too():
    (e,) = _events(
        _msg(type="UPDATE", data=[{"id": "1", "v": "b", "doc": "[2]"}], old=[{"doc": [1]}])
    )
    assert e.before["doc"] == "[1]" and e.columns["doc"] == "json"


def test_a_value_nested_deeper_than_254_levels_is_bad_value_naming_the_column():
    deep = b"[" * 300 + b"]" * 300  # orjson reads 1024 levels, writes 254
    for column, mysql_type in (("v", "varchar(10)"), ("j", "json"), ("x", None)):
        types = {"id": "int", column: mysql_type} if mysql_type else {"id": "int"}
        msg = _msg(data=[{"id": "1", column: "DEEP"}], mysqlType=types, sqlType=None)
        result = _decode(orjson.dumps(msg).replace(b'"DEEP"', deep))
        (dead,) = result.dead_letters
        assert dead.code == Code.BAD_VALUE
        assert f"'{column}'" in dead.message and "nested deeper than 254 levels" in dead.message


def test_type_options():
    assert _value("tinyint(1)", "2", tinyint1_as_boolean=False) == (2, "int32")
    assert _value("TIME", "838:59:59", time_as_string=True) == ("838:59:59", "string")
    assert _value("varbinary(4)", "00ff", binary_encoding="hex") == (b"\x00\xff", "binary")
    assert _value("blob", "AP8=", binary_encoding="base64") == (b"\x00\xff", "binary")
    assert _value("enum('1','2')", "2", enum_values="label") == ("2", "string")
    assert _value("set('a','b')", "a,b", enum_values="label") == ("a,b", "string")
    # DATETIME is wall clock whatever the zone; TIMESTAMP is read in the zone given
    assert _value("DATETIME", "2024-01-01 08:00:00", timestamp_zone="Asia/Shanghai")[
        0
    ] == dt.datetime(2024, 1, 1, 8)
    assert _value("TIMESTAMP(3)", "2024-01-01 08:00:00.5", timestamp_zone="Asia/Shanghai") == (
        dt.datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=dt.UTC),
        "timestamptz",
    )
    assert _value("timestamp", "2024-01-01 08:00:00", timestamp_zone="-02:30")[0] == dt.datetime(
        2024, 1, 1, 10, 30, tzinfo=dt.UTC
    )


@pytest.mark.parametrize(
    "options",
    [
        {"binary_encoding": "utf8"},
        {"enum_values": "name"},
        {"timestamp_zone": "Mars/Base"},
        {"no_such_option": 1},
    ],
)
def test_bad_options_are_config_errors(options):
    with pytest.raises(ConfigError):
        decoder_for("canal-json", options)


def test_plain_decoder_options_are_accepted():
    from cdcflow.formats.base import DecoderOptions

    decoder = CanalJsonDecoder(DecoderOptions(primary_keys={"t": ("v",)}))
    assert isinstance(decoder.options, CanalJsonOptions)
    assert decoder.options.primary_keys == {"t": ("v",)}


def test_sql_type_is_the_fallback_for_a_column_without_mysql_type():
    (e,) = _events(
        _msg(
            data=[
                {
                    "id": "1",
                    "n": "42",
                    "when": "2024-01-02 03:04:05",
                    "blob_or_text": "x",
                    "free": "y",
                }
            ],
            mysqlType={"id": "int"},
            sqlType={"id": 4, "n": -5, "when": 93, "blob_or_text": -4},
        )
    )
    assert e.after == {
        "id": 1,
        "n": 42,
        "when": dt.datetime(2024, 1, 2, 3, 4, 5),
        "blob_or_text": "x",
        "free": "y",
    }
    assert e.columns == {"id": "int32", "n": "int64", "when": "timestamp"}


def test_a_changed_mysql_type_for_the_same_table_is_not_served_from_the_cache():
    decoder = decoder_for("canal-json")
    first = orjson.dumps(_msg(data=[{"id": "1", "v": "10"}], mysqlType={"id": "int", "v": "int"}))
    second = orjson.dumps(
        _msg(data=[{"id": "1", "v": "10"}], mysqlType={"id": "int", "v": "varchar(5)"})
    )
    third = orjson.dumps(
        _msg(data=[{"id": "1", "v": "10"}], mysqlType={"id": "int", "v": "int"}, pkNames=["v"])
    )
    r = decoder.decode_batch([Record(first), Record(second), Record(third)])
    assert [e.after["v"] for e in r.events] == [10, "10", 10]
    assert [e.columns["v"] for e in r.events] == ["int32", "string", "int32"]
    assert [e.key for e in r.events] == [{"id": 1}, {"id": 1}, {"v": 10}]


# --------------------------------------------------------------------------- row events


def test_several_rows_become_events_in_order_with_increasing_seq():
    events = _events(_msg(data=[{"id": str(i), "v": "x"} for i in (3, 1, 2)]), offset=40)
    assert [e.key["id"] for e in events] == [3, 1, 2]
    assert [e.seq for e in events] == [(1_700_000_000_000, 7, 40, i) for i in range(3)]
    assert all(e.ts_ms == 1_700_000_000_000 for e in events)
    assert all(e.op is Op.INSERT and e.before is None for e in events)


def test_update_before_image_is_after_overlaid_with_old_including_explicit_nulls():
    (e,) = _events(
        _msg(
            type="UPDATE",
            data=[{"id": "1", "v": "new", "w": None, "z": "same"}],
            old=[{"v": None, "w": "was"}],
            mysqlType={"id": "int", "v": "varchar(5)", "w": "varchar(5)", "z": "varchar(5)"},
        )
    )
    assert e.op is Op.UPDATE
    assert e.after == {"id": 1, "v": "new", "w": None, "z": "same"}
    assert e.before == {"id": 1, "v": None, "w": "was", "z": "same"}
    assert e.changed == ("v", "w")


def test_update_old_values_are_typed_and_aligned_by_index():
    events = _events(
        _msg(
            type="UPDATE",
            data=[{"id": "1", "n": "5"}, {"id": "2", "n": "6"}],
            old=[{"n": "4"}, {"id": "9"}],
            mysqlType={"id": "int", "n": "bigint"},
        )
    )
    assert [e.before for e in events] == [{"id": 1, "n": 4}, {"id": 9, "n": 6}]
    assert [e.key for e in events] == [{"id": 1}, {"id": 2}]  # key of the after image


def test_update_without_old_has_no_before_image():
    (e,) = _events(_msg(type="UPDATE", old=None))
    assert e.op is Op.UPDATE and e.before is None and e.changed is None


def test_insert_with_old_null_and_without_old():
    msg = _msg()
    del msg["old"]
    assert _events(msg)[0].after == _events(_msg(old=None))[0].after == {"id": 1, "v": "a"}


@pytest.mark.parametrize(
    ("data", "old"),
    [
        ([{"id": "5", "v": "gone"}], None),  # Canal, DTS from 2022-03-20
        (None, [{"id": "5", "v": "gone"}]),  # DTS before 2022-03-20: data null
        ([], [{"id": "5", "v": "gone"}]),
    ],
    ids=["row-in-data", "row-in-old-data-null", "row-in-old-data-empty"],
)
def test_both_delete_conventions(data, old):
    msg = _msg(type="DELETE", data=data, old=old)
    if data is None:
        del msg["data"]
    (e,) = _events(msg)
    assert e.op is Op.DELETE and e.after is None
    assert e.before == {"id": 5, "v": "gone"} and e.key == {"id": 5}


def test_init_rows_are_snapshot_events():
    (e,) = _events(_msg(type="INIT"))
    assert e.op is Op.SNAPSHOT and e.after == {"id": 1, "v": "a"} and e.key == {"id": 1}


def test_a_column_absent_from_data_is_absent_from_the_image():
    (e,) = _events(_msg(mysqlType={"id": "int", "v": "varchar(1)", "later": "int"}))
    assert "later" not in e.after and e.columns["later"] == "int32"


def test_empty_data_is_skipped_on_purpose():
    result = _decode(_msg(data=[]))
    assert result.events == [] and result.dead_letters == []
    assert [s.reason for s in result.skipped] == ["NO_EVENTS"]


def test_gtid_becomes_the_transaction_id():
    (e,) = _events(_msg(gtid="3E11FA47-71CA-11E1-9E33-C80AA9429562:23"))
    assert e.txn is not None and e.txn.id == "3E11FA47-71CA-11E1-9E33-C80AA9429562:23"
    assert _events(_msg())[0].txn is None


def test_dts_operation_ids_give_a_copy_at_any_offset_or_partition_the_same_seq():
    """``id_semantics="operation"`` (decision 62): DTS's ``id`` names one operation, so
    ``seq`` is ``(es, id, row_index)`` without the Kafka offset; the default ("batch",
    Canal's shared batch id) keeps the offset, so the same message at two offsets has two."""
    msg = orjson.dumps(_msg(data=[{"id": "1", "v": "a"}, {"id": "2", "v": "b"}]))
    ddl = orjson.dumps(
        _msg(type="ALTER", isDdl=True, data=None, mysqlType=None, sqlType=None, sql="ALTER")
    )
    at = [Origin("t", 0, 5), Origin("t", 1, 90), Origin("u", 0, 5)]

    def seqs(**options: Any) -> list[list[Any]]:
        decoder = decoder_for("canal-json", options or None)
        decoder = pickle.loads(pickle.dumps(decoder))  # as shipped to an executor
        return [
            [e.seq for e in decoder.decode_batch([Record(value=v, origin=o)]).events]
            for o in at
            for v in (msg, ddl)
        ]

    es = 1_700_000_000_000
    once = [[(es, 7, 0), (es, 7, 1)], [(es, 7, 0)]]
    assert seqs(id_semantics="operation") == once * len(at)
    batch = seqs()
    assert batch[0] == [(es, 7, 5, 0), (es, 7, 5, 1)] and batch[1] == [(es, 7, 5, 0)]
    assert batch[2] == [(es, 7, 90, 0), (es, 7, 90, 1)]


def test_id_semantics_is_checked():
    assert CanalJsonOptions().id_semantics == "batch"
    with pytest.raises(ConfigError, match="id_semantics must be one of"):
        CanalJsonOptions(id_semantics="dts")


def test_without_es_there_is_no_sequence_or_time():
    msg = _msg()
    del msg["es"], msg["id"]
    (e,) = _events(msg)
    assert e.seq is None and e.ts_ms is None


# --------------------------------------------------------------------------- keys


def test_empty_pk_names_take_keys_from_options_else_missing_key():
    msg = _msg(pkNames=[])
    assert _dead(msg) == Code.MISSING_KEY
    (e,) = _events(msg, primary_keys={"db.t": ["v"]})
    assert e.key == {"v": "a"}
    (e,) = _events(_msg(pkNames=None), primary_keys={"*": ["id", "v"]})
    assert e.key == {"id": 1, "v": "a"}


def test_declared_keys_win_over_options():
    (e,) = _events(_msg(), primary_keys={"t": ["v"]})
    assert e.key == {"id": 1}


def test_a_key_column_missing_from_the_row_is_missing_key():
    result = _decode(_msg(pkNames=["id", "nope"]))
    assert [d.code for d in result.dead_letters] == [Code.MISSING_KEY]
    assert "nope" in result.dead_letters[0].message


# --------------------------------------------------------------------------- statements


def test_ddl_truncate_and_query_messages():
    ddl = _msg(
        type="ALTER",
        isDdl=True,
        data=None,
        mysqlType=None,
        sqlType=None,
        pkNames=None,
        sql="ALTER TABLE t ADD COLUMN c INT",
    )
    (e,) = _events(ddl, offset=3)
    assert e.op is Op.DDL and e.ddl == "ALTER TABLE t ADD COLUMN c INT" and e.key is None
    assert e.seq == (1_700_000_000_000, 7, 3, 0) and e.meta == {
        "type": "ALTER",
        "ts": 1_700_000_000_123,
    }
    (t,) = _events({**ddl, "type": "TRUNCATE", "sql": "TRUNCATE TABLE t"})
    assert t.op is Op.TRUNCATE and t.ddl == "TRUNCATE TABLE t" and t.source.table == "t"
    (q,) = _events({**ddl, "type": "QUERY", "table": "", "sql": "CREATE DATABASE x"})
    assert q.op is Op.DDL and q.source.table == "" and q.source.database == "db"
    assert (
        _dead({**ddl, "type": "QUERY", "isDdl": False, "sql": "INSERT INTO t VALUES (1)"})
        == Code.UNKNOWN_OP
    )
    assert _dead({**ddl, "sql": None}) == Code.MISSING_FIELD


@pytest.mark.parametrize("typ", ["ROW", "insert", "MHEARTBEAT", "XACOMMIT", ""])
def test_unknown_types_are_never_guessed(typ):
    assert _dead(_msg(type=typ)) == Code.UNKNOWN_OP


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"type": None}, Code.MISSING_FIELD),
        ({"type": 1}, Code.BAD_FIELD),
        ({"data": None}, Code.MISSING_FIELD),
        ({"data": {"id": "1"}}, Code.BAD_FIELD),
        ({"data": ["id"]}, Code.BAD_FIELD),
        ({"old": {"v": "x"}}, Code.BAD_FIELD),
        ({"type": "UPDATE", "old": [{"v": "x"}, {"v": "y"}]}, Code.BAD_FIELD),
        ({"type": "UPDATE", "old": ["x"]}, Code.BAD_FIELD),
        ({"es": "1700000000000"}, Code.BAD_FIELD),
        ({"es": 1.5}, Code.BAD_FIELD),
        ({"id": "7"}, Code.BAD_FIELD),
        ({"isDdl": "false"}, Code.BAD_FIELD),
        ({"isDdl": True}, Code.BAD_FIELD),
        ({"database": None}, Code.MISSING_FIELD),
        ({"table": 5}, Code.BAD_FIELD),
        ({"table": ["t"]}, Code.BAD_FIELD),
        ({"mysqlType": ["int"]}, Code.BAD_FIELD),
        ({"mysqlType": {"id": 4}}, Code.BAD_FIELD),
        ({"sqlType": "4"}, Code.BAD_FIELD),
        ({"pkNames": "id"}, Code.BAD_FIELD),
        ({"pkNames": [1]}, Code.BAD_FIELD),
    ],
)
def test_malformed_envelopes_dead_letter_with_stable_codes(change, code):
    msg = _msg(**change)
    for k, v in change.items():
        if v is None and k in ("type", "database"):
            del msg[k]
    assert _dead(msg) == code


@pytest.mark.parametrize("cut", [1, 10, 50, 120, 200])
def test_truncated_messages_are_bad_json(cut):
    value = (CORPUS / "paimon-canal_event_event-update.txt").read_bytes().strip()
    assert _dead(value[:cut]) == Code.BAD_JSON


def test_non_objects_are_not_an_object():
    assert _dead(b"[]") == Code.NOT_AN_OBJECT
    assert _dead(b"null") == Code.NOT_AN_OBJECT


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(
            [
                "data",
                "old",
                "type",
                "es",
                "id",
                "isDdl",
                "database",
                "table",
                "mysqlType",
                "sqlType",
                "pkNames",
                "sql",
                "gtid",
            ]
        ),
        _json_values
        | st.sampled_from(["INSERT", "UPDATE", "DELETE", "INIT", "ALTER", "TRUNCATE", "QUERY"]),
    ),
)
def test_arbitrary_messages_decode_or_dead_letter_never_crash(fields):
    msg = _msg(**fields)
    result = decoder_for("canal-json").decode_batch([Record(value=orjson.dumps(msg))])
    assert result.records == result.decoded_records + len(result.skipped) + len(result.dead_letters)
    assert all(
        d.code != Code.BAD_FIELD or "Error:" not in d.message for d in result.dead_letters
    ), result.dead_letters  # no decoder bug leaked


def test_decoder_pickles():
    decoder = decoder_for("canal-json", {"timestamp_zone": "+08:00"})
    decoder.decode_batch([Record(value=orjson.dumps(_msg()))])  # fill the caches
    clone = pickle.loads(pickle.dumps(decoder))
    msg = _msg(
        data=[{"id": "1", "v": "2024-01-01 08:00:00"}], mysqlType={"id": "int", "v": "timestamp"}
    )
    (e,) = clone.decode(Record(value=orjson.dumps(msg)))
    assert e.after["v"] == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


# --------------------------------------------------------------------------- corpus


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return list(v)
    if isinstance(v, D):
        return str(v)
    return v


def _apply(table: dict[tuple, dict], events, key_columns: tuple[str, ...]) -> None:
    """A tiny model of applying events keyed by ``key_columns`` (Paimon's override)."""
    for e in events:
        if e.op in (Op.INSERT, Op.SNAPSHOT, Op.UPDATE):
            if e.before is not None:
                table.pop(tuple(e.before[c] for c in key_columns), None)
            key = tuple(e.after[c] for c in key_columns)
            table[key] = {**table.get(key, {}), **e.after}
        elif e.op is Op.DELETE:
            table.pop(tuple(e.before[c] for c in key_columns), None)


def _corpus_events(name: str):
    lines = [x for x in (CORPUS / name).read_bytes().splitlines() if x.strip()]
    result = decoder_for("canal-json").decode_batch(
        [Record(value=x, origin=Origin(name, 0, i)) for i, x in enumerate(lines)]
    )
    assert result.dead_letters == [] and result.skipped == []
    return result.events


def test_schemaevolution_corpus_reaches_paimons_final_tables():
    expected = json.loads((CORPUS / "paimon-canal_schemaevolution.expected.json").read_text())
    key_columns = tuple(expected["primary_key"])
    table: dict[tuple, dict] = {}
    for stage in expected["stages"]:
        _apply(table, _corpus_events(stage["file"]), key_columns)
        got = sorted(
            ({c: _jsonable(row.get(c)) for c in stage["columns"]} for row in table.values()),
            key=lambda r: (r["pt"], r["_id"]),
        )
        want = sorted(stage["final_table"], key=lambda r: (r["pt"], r["_id"]))
        assert got == want, stage["file"]


def test_schemaevolution_types_follow_the_alter_statements():
    events = [
        e
        for e in _corpus_events("paimon-canal_schemaevolution_canal-data-5.txt")
        if e.op is Op.UPDATE
    ]
    assert events[0].columns == {
        "pt": "int32",
        "_id": "int32",
        "v1": "string",
        "v2": "int64",
        "v3": "decimal(8,3)",
        "v4": "binary",
        "v5": "float64",
    }


def test_seatunnel_corpus_reaches_the_expected_final_table():
    expected = json.loads((CORPUS / "seatunnel-e2e-canal_data.expected.json").read_text())
    events = _corpus_events("seatunnel-e2e-canal_data.txt")
    rows = [e for e in events if e.op in (Op.INSERT, Op.UPDATE, Op.DELETE)]
    changelog = []
    for e in rows:
        if e.op is Op.UPDATE:
            changelog += [("-U", e.before), ("+U", e.after)]
        else:
            changelog.append(("+I", e.after) if e.op is Op.INSERT else ("-D", e.before))
    assert changelog == [(x["kind"], x["row"]) for x in expected["expected_changelog"]]
    # one Canal batch: every DML message shares id and es; the offset keeps them in order
    assert len({(e.seq[0], e.seq[1]) for e in rows}) == 1
    assert [seq_key(e.seq) for e in rows] == sorted(seq_key(e.seq) for e in rows)
    table: dict[tuple, dict] = {}
    _apply(table, sorted(events, key=lambda e: seq_key(e.seq)), ("id",))
    assert sorted(table.values(), key=lambda r: r["id"]) == expected["expected_final_table"]


def test_alltype_corpus_declares_the_paimon_types():
    (first, second) = _corpus_events("paimon-canal_alltype_canal-data.txt")
    cols = first.columns
    assert (
        cols["_tinyint1"],
        cols["_bigint_unsigned"],
        cols["_serial"],
        cols["_fixed"],
        cols["_float"],
        cols["_real"],
        cols["_datetime3"],
        cols["_timestamp"],
        cols["_set"],
        cols["_geometry"],
    ) == (
        "boolean",
        "decimal(20,0)",
        "decimal(20,0)",
        "decimal(40,3)",
        "float32",
        "float64",
        "timestamp",
        "timestamp",
        "string",
        "binary",
    )
    assert second.after["_serial"] == D("50000000000")
    assert sum(v is None for v in second.after.values()) == len(second.after) - 3


# --------------------------------------------------------------------------- encoder


def test_encoder_round_trips_every_exact_type():
    encoder = encoder_for("canal-json")
    columns = {
        "id": "int64",
        "i": "int32",
        "b": "boolean",
        "f32": "float32",
        "f": "float64",
        "d": "decimal(38,10)",
        "s": "string",
        "j": "json",
        "bin": "binary",
        "day": "date",
        "t": "time",
        "ts": "timestamp",
    }
    assert {t.split("(")[0] for t in columns.values()} <= encoder.exact_types
    row = {
        "id": 2**62,
        "i": -7,
        "b": False,
        "f32": 0.1,
        "f": -1e300,
        "d": D("-1234567890123456789012345678.0123456789"),
        "s": 'é\n"x"',
        "j": '{"k":1}',
        "bin": bytes(range(256)),
        "day": dt.date(1, 1, 1),
        "t": dt.time(23, 59, 59, 999999),
        "ts": dt.datetime(9999, 12, 31, 23, 59, 59, 1),
    }
    table = SourceTable("", "shop", "", "items")
    changes = [
        SourceChange(Op.SNAPSHOT, table, columns, ("id",), None, row, 1, 1000),
        SourceChange(Op.UPDATE, table, columns, ("id",), row, {**row, "s": None}, 2, 1001),
        SourceChange(Op.DELETE, table, columns, ("id",), {**row, "s": None}, None, 3, 1002),
        SourceChange(Op.TRUNCATE, table, columns, ("id",), None, None, 4, 1003),
    ]
    messages = [m for c in changes for m in encoder.encode(c)]
    assert orjson.loads(messages[1].value)["old"] == [{"s": 'é\n"x"'}]
    result = decoder_for("canal-json").decode_batch(
        [Record(value=m.value, origin=Origin("t", 0, i)) for i, m in enumerate(messages)]
    )
    assert result.dead_letters == []
    snap, upd, dele, trunc = result.events
    assert snap.op is Op.SNAPSHOT and snap.after == row
    assert upd.before == row and upd.after == {**row, "s": None} and upd.changed == ("s",)
    assert dele.before == {**row, "s": None} and dele.key == {"id": 2**62}
    assert trunc.op is Op.TRUNCATE and trunc.source.table == "items"
    assert snap.columns == columns
    assert [e.seq for e in result.events] == [(1000 + i, 1 + i, i, 0) for i in range(4)]


def test_encoded_timestamptz_is_utc_text():
    encoder = encoder_for("canal-json")
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC)
    (m,) = encoder.encode(
        SourceChange(
            Op.INSERT,
            SourceTable("", "d", "", "t"),
            {"id": "int64", "at": "timestamptz"},
            ("id",),
            None,
            {"id": 1, "at": when},
            1,
            1,
        )
    )
    assert orjson.loads(m.value)["data"] == [{"id": "1", "at": "2024-05-06 07:08:09.123000"}]
    (e,) = decoder_for("canal-json", {"timestamp_zone": "UTC"}).decode(Record(value=m.value))
    assert e.after["at"] == when

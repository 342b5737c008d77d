"""Unit tests of the DRS Avro format (``drs-avro``) with the stand-in schema."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import pickle
from pathlib import Path

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.drs_avro import (
    STANDIN_SCHEMA,
    DrsAvroDecoder,
    DrsAvroOptions,
    split_table_name,
)
from cdcflow.model import Op, SourceTable
from cdcflow_testkit.encoders import SourceChange, encoder_for

STANDIN_FILE = Path(__file__).parent / "cases" / "drs-avro" / "standin-record.avsc"
UTC = dt.UTC
COLUMNS = {
    "id": "int64",
    "name": "string",
    "price": "decimal(10,2)",
    "at": "timestamptz",
    "blob": "binary",
}
ROW = {
    "id": 1,
    "name": "x",
    "price": decimal.Decimal("9.90"),
    "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
    "blob": b"\x00\xfe",
}


def _change(op, before, after, seq=5):
    return SourceChange(
        op,
        SourceTable("", "shop", "", "items"),
        COLUMNS,
        ("id",),
        before,
        after,
        seq,
        1_700_000_000_000,
    )


def _encode(op, before, after) -> bytes:
    (msg,) = encoder_for("drs-avro").encode(_change(op, before, after))
    return msg.value


def _record(**fields) -> dict:
    rec = {
        "version": "1.0",
        "seqno": 9,
        "shardId": None,
        "eventid": "e9",
        "updateTimestamp": 1_700_000_000_000,
        "tableName": '"shop"."items"',
        "operation": "INSERT",
        "columnCount": 2,
        "fields": [{"name": "id", "type": "int"}, {"name": "name", "type": "varchar"}],
        "beforeImages": None,
        "afterImages": [{"value": "1"}, {"value": "a"}],
        "pkNames": ["id"],
    }
    rec.update(fields)
    return rec


def _raw(rec: dict, schema=STANDIN_SCHEMA) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), rec)
    return out.getvalue()


def _code(decoder, value: bytes) -> str:
    with pytest.raises(DecodeError) as info:
        decoder.decode(Record(value=value))
    return info.value.code


# --------------------------------------------------------------------------- options


def test_the_stand_in_file_is_the_bundled_stand_in_schema():
    assert json.loads(STANDIN_FILE.read_text()) == STANDIN_SCHEMA
    assert "NOT Huawei" in STANDIN_SCHEMA["doc"]


def test_configuration_requires_schema_path():
    with pytest.raises(ConfigError, match="schema_path"):
        decoder_for("drs-avro", {})
    with pytest.raises(ConfigError, match="schema_path"):
        decoder_for("drs-avro", {"op_field": "op"})


def test_bad_schema_path_and_framing_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="schema_path"):
        decoder_for("drs-avro", {"schema_path": str(tmp_path / "missing.avsc")})
    (tmp_path / "bad.avsc").write_text('{"type": "record"}')
    with pytest.raises(ConfigError, match="schema_path"):
        decoder_for("drs-avro", {"schema_path": str(tmp_path / "bad.avsc")})
    with pytest.raises(ConfigError, match="framing"):
        DrsAvroDecoder(DrsAvroOptions(framing="confluent"))


def test_schema_path_decodes_what_the_encoder_wrote():
    decoder = decoder_for("drs-avro", {"schema_path": str(STANDIN_FILE)})
    (event,) = decoder.decode(Record(value=_encode(Op.INSERT, None, ROW)))
    assert event.after == ROW and event.key == {"id": 1}
    # the encoder declares "decimal" without precision, as DRS JSON does: not declared
    assert event.columns == {"id": "int64", "name": "string", "at": "timestamptz", "blob": "binary"}


def test_records_of_another_schema_say_to_set_schema_path():
    value = b"\xc3\x01" + b"\x11" * 8 + _raw(_record())
    with pytest.raises(DecodeError, match="schema_path") as info:
        DrsAvroDecoder().decode(Record(value=value))
    assert info.value.code == Code.BAD_AVRO


# --------------------------------------------------------------------------- decoding


def test_round_trip_of_every_op_with_typed_values():
    decoder = DrsAvroDecoder()
    row2 = {**ROW, "id": 2, "blob": None}
    events = [
        decoder.decode(Record(value=_encode(op, b, a)))[0]
        for op, b, a in ((Op.SNAPSHOT, None, ROW), (Op.UPDATE, ROW, row2), (Op.DELETE, row2, None))
    ]
    snap, upd, dele = events
    assert snap.op is Op.SNAPSHOT and snap.after == ROW and snap.before is None
    assert upd.before == ROW and upd.after == row2 and upd.key == {"id": 2}
    assert upd.meta["old_key"] == {"id": 1}
    assert dele.before == row2 and dele.after is None and dele.key == {"id": 2}
    assert snap.seq == (5,) and snap.ts_ms == 1_700_000_000_000
    assert snap.source == SourceTable("drs-avro", "shop", "", "items")
    assert "price" not in snap.columns and snap.after["price"] == decimal.Decimal("9.90")


def test_operation_names_are_case_insensitive_and_unknown_ones_dead_letter():
    decoder = DrsAvroDecoder(DrsAvroOptions(framing="raw"))
    (event,) = decoder.decode(Record(value=_raw(_record(operation="insert"))))
    assert event.op is Op.INSERT and event.after == {"id": 1, "name": "a"}
    assert _code(decoder, _raw(_record(operation="UPSERT"))) == Code.UNKNOWN_OP
    (ddl,) = decoder.decode(Record(value=_raw(_record(operation="DDL", afterImages=None))))
    assert ddl.op is Op.DDL and ddl.key is None and ddl.meta["operation"] == "DDL"


def test_framing_options():
    raw = _raw(_record())
    framed = _encode(Op.INSERT, None, ROW)
    assert DrsAvroDecoder().decode(Record(value=raw))[0].after["id"] == 1  # auto
    assert _code(DrsAvroDecoder(DrsAvroOptions(framing="single-object")), raw) == Code.BAD_AVRO
    assert _code(DrsAvroDecoder(DrsAvroOptions(framing="raw")), framed) == Code.BAD_AVRO


def test_meta_keeps_the_sample_fields():
    (event,) = DrsAvroDecoder().decode(Record(value=_raw(_record(shardId="s1"))))
    assert event.meta == {"version": "1.0", "shardId": "s1", "eventid": "e9"}


def test_a_record_without_key_columns_needs_primary_keys():
    value = _raw(_record(pkNames=None))
    assert _code(DrsAvroDecoder(), value) == Code.MISSING_KEY
    decoder = DrsAvroDecoder(DrsAvroOptions(primary_keys={"shop.items": ("name",)}))
    assert decoder.decode(Record(value=value))[0].key == {"name": "a"}


@pytest.mark.parametrize(
    ("type_name", "text", "logical"),
    [
        ("int", "2147483648", "int32"),
        ("int unsigned", "9223372036854775808", "int64"),
        ("bigint", "-9223372036854775809", "int64"),
    ],
)
def test_an_integer_outside_its_columns_range_is_bad_value(type_name, text, logical):
    """drs-avro shares drs-json's value converters, range checks included."""
    fields = [{"name": "id", "type": type_name}, {"name": "name", "type": "varchar"}]
    rec = _record(fields=fields, afterImages=[{"value": text}, {"value": "a"}])
    with pytest.raises(DecodeError) as info:
        DrsAvroDecoder().decode(Record(value=_raw(rec)))
    assert info.value.code == Code.BAD_VALUE
    assert "'id'" in info.value.message and logical in info.value.message


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"afterImages": None}, Code.MISSING_FIELD),
        ({"operation": "DELETE"}, Code.MISSING_FIELD),
        ({"fields": None}, Code.MISSING_FIELD),
        ({"afterImages": [{"value": "1"}]}, Code.BAD_FIELD),
        ({"afterImages": [{"value": "one"}, {"value": "a"}]}, Code.BAD_VALUE),
        ({"afterImages": [{"value": "1"}, {"value": b"\xff"}]}, Code.BAD_VALUE),
        ({"tableName": " "}, Code.MISSING_FIELD),
        ({"pkNames": ["nope"]}, Code.MISSING_KEY),
    ],
)
def test_malformed_records_dead_letter(fields, code):
    assert _code(DrsAvroDecoder(), _raw(_record(**fields))) == code


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ('"db"."t"', ("db", "", "t")),
        ("db.t", ("db", "", "t")),
        ("t", ("", "", "t")),
        ('"a.b"."t "', ("a.b", "", "t")),
        ('"db"."sch"."t"', ("db", "sch", "t")),
        ('"we""ird"."t"', ('we"ird', "", "t")),
    ],
)
def test_table_names(name, want):
    assert split_table_name(name) == want


def test_custom_field_mapping_reads_another_schema(tmp_path):
    """A schema with other field names and JDBC type numbers, mapped through the options."""
    schema = {
        "type": "record",
        "name": "Other",
        "fields": [
            {"name": "op", "type": "string"},
            {"name": "pos", "type": "string"},
            {"name": "db", "type": "string"},
            {"name": "tbl", "type": "string"},
            {
                "name": "cols",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Col",
                        "fields": [
                            {"name": "n", "type": "string"},
                            {"name": "jdbc", "type": "int"},
                        ],
                    },
                },
            },
            {"name": "img", "type": {"type": "array", "items": ["null", "string"]}},
        ],
    }
    path = tmp_path / "other.avsc"
    path.write_text(json.dumps(schema))
    decoder = decoder_for(
        "drs-avro",
        {
            "schema_path": str(path),
            "framing": "raw",
            "op_field": "op",
            "seq_field": "pos",
            "database_field": "db",
            "table_field": "tbl",
            "fields_field": "cols",
            "field_name_key": "n",
            "field_type_key": "jdbc",
            "after_field": "img",
            "timestamp_field": None,
            "key_field": None,
            "meta_fields": [],
            "primary_keys": {"*": ["k"]},
        },
    )
    rec = {
        "op": "Insert",
        "pos": "1234",
        "db": "inv",
        "tbl": "parts",
        "cols": [{"n": "k", "jdbc": -5}, {"n": "at", "jdbc": 94}, {"n": "v", "jdbc": 8}],
        "img": ["77", "2024-02-29 12:00:00", None],
    }
    (event,) = decoder.decode(Record(value=_raw(rec, schema)))
    assert event.source == SourceTable("drs-avro", "inv", "", "parts")
    assert event.after == {"k": 77, "at": dt.datetime(2024, 2, 29, 12), "v": None}
    assert event.key == {"k": 77} and event.seq == (1234,) and event.ts_ms is None
    assert event.columns == {"k": "int64", "at": "timestamp", "v": "float64"}
    assert event.meta is None


@settings(max_examples=300)
@given(st.binary(max_size=120))
def test_arbitrary_bytes_raise_only_decode_errors(value):
    for framed in (value, b"\xc3\x01" + value):
        try:
            DrsAvroDecoder().decode(Record(value=framed))
        except DecodeError as exc:
            assert exc.code in set(Code)


def test_decoder_pickles():
    decoder = DrsAvroDecoder()
    value = _encode(Op.INSERT, None, ROW)
    first = decoder.decode(Record(value=value))
    assert pickle.loads(pickle.dumps(decoder)).decode(Record(value=value)) == first

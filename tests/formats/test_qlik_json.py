"""Unit tests of the Qlik Replicate JSON format (``qlik-json``): masks, metadata, typing,
lookup modes, sequences, the encoder, and malformed input."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.qlik_json import (
    QlikJsonDecoder,
    QlikJsonOptions,
    _seq,
    metadata_from_event,
    metadata_from_message,
)
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for
from cdcflow_testkit.encoders.qlik_json import QlikJsonEncoder

SID = "schema-v1"


def col(ordinal, qtype, *, precision=0, scale=0, pk=0):
    return {
        "ordinal": ordinal,
        "type": qtype,
        "length": 0,
        "precision": precision,
        "scale": scale,
        "primaryKeyPosition": pk,
        "nullable": pk == 0,
    }


def md_message(columns, *, schema="S", table="T", version=1, sid=SID):
    return {
        "schemaId": sid,
        "lineage": {
            "server": "srv",
            "task": "task",
            "schema": schema,
            "table": table,
            "tableVersion": version,
            "timestamp": "2024-01-02T03:04:05.678",
        },
        "tableStructure": {"tableColumns": columns},
    }


def envelope(kind, message, sid=None):
    return orjson.dumps(
        {
            "magic": "atMSG",
            "type": kind,
            "headers": None,
            "messageSchemaId": sid,
            "messageSchema": None,
            "message": message,
        }
    )


def dt_message(data, before=None, sid=SID, **headers):
    h = {
        "operation": "INSERT",
        "changeSequence": "20240102030405000000000000000000001",
        "timestamp": "2024-01-02T03:04:05.000",
        "streamPosition": "pos",
        "transactionId": "00000000000000000000000000000A0B",
        "changeMask": "",
        "columnMask": "",
        "transactionEventCounter": 1,
        "transactionLastEvent": True,
    }
    h.update(headers)
    return envelope("DT", {"data": data, "beforeData": before, "headers": h}, sid)


def decode(values, decoder=None, topic="topic", keys=None, **options):
    decoder = decoder or QlikJsonDecoder(QlikJsonOptions(**options))
    keys = keys or [None] * len(values)
    records = [
        Record(value=v, key=k, origin=Origin(topic, 0, i))
        for i, (v, k) in enumerate(zip(values, keys, strict=True))
    ]
    return decoder.decode_batch(records)


def codes(result):
    return [d.code for d in result.dead_letters]


TEN = {  # 10 columns, so masks take two bytes
    "ID": col(1, "INT4", pk=1),
    "C2": col(2, "STRING"),
    "C3": col(3, "STRING"),
    "C4": col(4, "STRING"),
    "C5": col(5, "STRING"),
    "C6": col(6, "STRING"),
    "C7": col(7, "STRING"),
    "DOC": col(8, "CLOB"),
    "C9": col(9, "STRING"),
    "C10": col(10, "STRING"),
}
ROW10 = {"ID": 1, **{f"C{i}": f"v{i}" for i in (2, 3, 4, 5, 6, 7, 9, 10)}, "DOC": "text"}


# --------------------------------------------------------------------------- masks


def test_change_mask_0b_names_ordinals_1_2_and_4_as_the_document_says():
    md = envelope("MD", md_message(TEN))
    upd = dt_message(ROW10, ROW10, operation="UPDATE", changeMask="0B", columnMask="03FF")
    event = decode([md, upd]).events[1]
    assert event.changed == ("ID", "C2", "C4")


def test_mask_bits_past_the_first_byte_are_read_as_one_little_endian_number():
    md = envelope("MD", md_message(TEN))
    upd = dt_message(ROW10, ROW10, operation="UPDATE", changeMask="0201", columnMask="03FF")
    assert decode([md, upd]).events[1].changed == ("ID", "C10")


def test_column_mask_leaves_out_columns_that_were_not_replicated_but_keeps_real_nulls():
    md = envelope("MD", md_message(TEN))
    row = {**ROW10, "C3": None, "C5": None}
    # bit 2 (ordinal 3, C3) clear: not replicated; C5's bit set: a real NULL
    upd = dt_message(row, row, operation="UPDATE", changeMask="0002", columnMask="03FB")
    event = decode([md, upd]).events[1]
    for image in (event.before, event.after):
        assert "C3" not in image
        assert "C5" in image and image["C5"] is None
        assert image["ID"] == 1 and image["DOC"] == "text"


def test_change_mask_is_ignored_for_inserts_and_deletes():
    md = envelope("MD", md_message(TEN))
    ins = dt_message(ROW10, changeMask="037F", columnMask="03FF")
    dele = dt_message(
        ROW10,
        operation="DELETE",
        changeMask="0001",
        columnMask="03FF",
        changeSequence="20240102030405000000000000000000002",
    )
    events = decode([md, ins, dele]).events
    assert [e.changed for e in events[1:]] == [None, None]
    assert events[2].before == ROW10 and events[2].after is None and events[2].key == {"ID": 1}


# --------------------------------------------------------------------------- types

TYPED = {
    "I1": col(1, "INT1"),
    "I2": col(2, "INT2"),
    "I4": col(3, "INT4", pk=2),
    "I8": col(4, "INT8"),
    "U1": col(5, "UINT1"),
    "U2": col(6, "UINT2"),
    "U4": col(7, "UINT4"),
    "U8": col(8, "UINT8"),
    "N": col(9, "NUMERIC", precision=10, scale=2),
    "BIG": col(10, "NUMERIC", precision=38, scale=4),
    "R4": col(11, "REAL4"),
    "R8": col(12, "REAL8"),
    "S": col(13, "STRING", pk=1),
    "W": col(14, "WSTRING"),
    "B": col(15, "BOOLEAN"),
    "D": col(16, "DATE"),
    "T": col(17, "TIME"),
    "DT": col(18, "DATETIME"),
    "BY": col(19, "BYTES"),
    "BL": col(20, "BLOB"),
    "CL": col(21, "CLOB"),
    "NC": col(22, "NCLOB"),
    "X": col(23, "GEOMETRY"),
}
TYPED_ROW = {
    "I1": 1,
    "I2": -2,
    "I4": 3,
    "I8": 9007199254740993,
    "U1": 5,
    "U2": 6,
    "U4": 4294967295,
    "U8": "18446744073709551615",
    "N": "12.5",
    "BIG": "1234567890123456789012345678901234.5678",
    "R4": 1.5,
    "R8": 2.25,
    "S": "s",
    "W": "wide ü",
    "B": True,
    "D": "2024-02-29",
    "T": "23:59:58.123456",
    "DT": "2024-02-29 23:59:58.123456789",
    "BY": "00FF10",
    "BL": "deadbeef",
    "CL": "clob",
    "NC": "nclob",
    "X": "POINT (1 2)",
}


def test_every_replicate_type_decodes_to_its_logical_type_and_value():
    result = decode([envelope("MD", md_message(TYPED)), dt_message(TYPED_ROW)])
    assert result.dead_letters == []
    ddl, row = result.events
    assert ddl.op is Op.DDL and ddl.columns == row.columns
    assert row.columns == {
        "I1": "int32",
        "I2": "int32",
        "I4": "int32",
        "I8": "int64",
        "U1": "int32",
        "U2": "int32",
        "U4": "int64",
        "U8": "decimal(20,0)",
        "N": "decimal(10,2)",
        "BIG": "decimal(38,4)",
        "R4": "float32",
        "R8": "float64",
        "S": "string",
        "W": "string",
        "B": "boolean",
        "D": "date",
        "T": "time",
        "DT": "timestamp",
        "BY": "binary",
        "BL": "binary",
        "CL": "string",
        "NC": "string",
    }  # GEOMETRY is not a Replicate type this format knows: no declared type
    a = row.after
    assert a["I8"] == 9007199254740993 and a["U4"] == 4294967295
    assert a["U8"] == decimal.Decimal("18446744073709551615")
    assert str(a["N"]) == "12.50"  # padded to the declared scale, exactly
    assert str(a["BIG"]) == "1234567890123456789012345678901234.5678"  # > 28 digits, exact
    assert a["R4"] == 1.5 and a["R8"] == 2.25 and a["B"] is True
    assert a["D"] == dt.date(2024, 2, 29)
    assert a["T"] == dt.time(23, 59, 58, 123456)
    assert a["DT"] == dt.datetime(2024, 2, 29, 23, 59, 58, 123456)  # naive; ns cut to us
    assert a["BY"] == b"\x00\xff\x10" and a["BL"] == bytes.fromhex("deadbeef")
    assert a["X"] == "POINT (1 2)"
    assert row.key == {"S": "s", "I4": 3}
    assert list(row.key) == ["S", "I4"]  # primaryKeyPosition order, not ordinal order


@pytest.mark.parametrize(
    "column,value",
    [
        ("I4", "abc"),
        ("I4", True),
        ("I4", 1.5),
        ("N", "12.345"),
        ("N", "NaN"),
        ("N", [1]),
        ("S", 5),
        ("B", "maybe"),
        ("D", "2024-02-30"),
        ("T", "25:00"),
        ("DT", "yesterday"),
        ("BY", "XYZ"),
        ("BY", "ABC"),
        ("R8", "fast"),
    ],
)
def test_a_value_that_does_not_fit_its_declared_type_is_bad_value(column, value):
    row = {**TYPED_ROW, column: value}
    result = decode([envelope("MD", md_message(TYPED)), dt_message(row)])
    assert codes(result) == [Code.BAD_VALUE]
    assert column in result.dead_letters[0].message


def test_numeric_strings_from_number_sources_are_accepted_for_integer_columns():
    result = decode([envelope("MD", md_message(TYPED)), dt_message({**TYPED_ROW, "I4": "42"})])
    assert result.events[1].after["I4"] == 42 and result.events[1].key["I4"] == 42


@pytest.mark.parametrize(
    ("column", "value", "logical"),
    [
        ("I4", 2147483648, "int32"),
        ("I1", -2147483649, "int32"),
        ("U2", "4294967296", "int32"),
        ("I8", 9223372036854775808, "int64"),  # orjson reads up to 2**64 - 1 exactly
        ("U4", "-9223372036854775809", "int64"),
    ],
)
def test_an_integer_outside_its_columns_range_is_bad_value_naming_column_and_range(
    column, value, logical
):
    for image in ("data", "beforeData"):
        row = {**TYPED_ROW, column: value}
        msg = dt_message(row) if image == "data" else dt_message(TYPED_ROW, before=row)
        result = decode([envelope("MD", md_message(TYPED)), msg])
        assert codes(result) == [Code.BAD_VALUE], image
        message = result.dead_letters[0].message
        lo, hi = (-(2**31), 2**31 - 1) if logical == "int32" else (-(2**63), 2**63 - 1)
        assert f"'{column}'" in message and f"{logical} range {lo}..{hi}" in message


def test_integers_at_the_limits_of_their_range_are_kept():
    row = {**TYPED_ROW, "I4": -(2**31), "I2": "2147483647", "I8": 2**63 - 1, "U4": -(2**63)}
    (_, e) = decode([envelope("MD", md_message(TYPED)), dt_message(row)]).events
    assert (e.after["I4"], e.after["I2"], e.after["I8"], e.after["U4"]) == (
        -(2**31),
        2**31 - 1,
        2**63 - 1,
        -(2**63),
    )


@pytest.mark.parametrize("text", [" 42", "42 ", "4_2", "٤٢", "42.0", "0x2a"])
def test_integer_text_is_a_sign_and_ascii_digits_only(text):
    result = decode([envelope("MD", md_message(TYPED)), dt_message({**TYPED_ROW, "I4": text})])
    assert codes(result) == [Code.BAD_VALUE]


def test_an_object_or_array_in_a_column_the_metadata_does_not_declare_is_json_text():
    # GEOMETRY has no logical type here (X); EXTRA is not in the metadata at all
    row = {**TYPED_ROW, "X": {"type": "Point"}, "EXTRA": [1, {"a": None}], "N2": 5}
    before = {**TYPED_ROW, "EXTRA": {"b": [2]}}
    (md, e) = decode(
        [envelope("MD", md_message(TYPED)), dt_message(row, before, operation="UPDATE")]
    ).events
    assert e.after["X"] == '{"type":"Point"}' and e.after["EXTRA"] == '[1,{"a":null}]'
    assert e.before["EXTRA"] == '{"b":[2]}'
    assert e.after["N2"] == 5  # a scalar keeps its JSON value
    assert e.columns == {**md.columns, "X": "json", "EXTRA": "json"}
    assert "EXTRA" not in md.columns  # the table's declaration is not changed


def test_an_object_nested_deeper_than_254_levels_is_bad_value_naming_the_column():
    deep = b"[" * 300 + b"]" * 300  # orjson reads 1024 levels, writes 254
    typed = dt_message({**TYPED_ROW, "EXTRA": "DEEP"}).replace(b'"DEEP"', deep)
    untyped = dt_message({"ID": 1, "EXTRA": "DEEP"}, sid=None).replace(b'"DEEP"', deep)
    for value, options in ((typed, {}), (untyped, {"primary_keys": {"*": ("ID",)}})):
        result = decode([envelope("MD", md_message(TYPED)), value], topic="unknown", **options)
        assert codes(result) == [Code.BAD_VALUE]
        message = result.dead_letters[0].message
        assert "'EXTRA'" in message and "nested deeper than 254 levels" in message


@pytest.mark.parametrize("counter", [2**63, 2**64 - 1])
def test_transaction_event_counter_beyond_int64_is_bad_field_naming_the_range(counter):
    result = decode(
        [envelope("MD", md_message(TEN)), dt_message(ROW10, transactionEventCounter=counter)]
    )
    assert codes(result) == [Code.BAD_FIELD]
    message = result.dead_letters[0].message
    assert "transactionEventCounter" in message
    assert "-9223372036854775808..9223372036854775807" in message


def test_transaction_event_counter_at_the_int64_limit_is_kept():
    result = decode(
        [envelope("MD", md_message(TEN)), dt_message(ROW10, transactionEventCounter=2**63 - 1)]
    )
    assert result.events[1].txn.order == 2**63 - 1


@pytest.mark.parametrize("ordinal", [3, 11, 2**40])
def test_an_ordinal_beyond_the_column_count_is_bad_field(ordinal):
    """A column's ordinal is its position (1..columns); a huge one used to allocate a
    2**ordinal bit mask."""
    columns = {"ID": col(1, "INT4", pk=1), "NAME": col(ordinal, "STRING")}
    result = decode([envelope("MD", md_message(columns))])
    assert codes(result) == [Code.BAD_FIELD]
    message = result.dead_letters[0].message
    assert "tableColumns.NAME.ordinal" in message and "1..2" in message


def test_ordinals_up_to_the_column_count_in_any_order_are_kept():
    columns = {"NAME": col(2, "STRING"), "ID": col(1, "INT4", pk=1)}
    (md,) = decode([envelope("MD", md_message(columns))]).events
    assert md.meta["tableStructure"]["tableColumns"]["NAME"]["ordinal"] == 2


# --------------------------------------------------------------------------- headers


def test_header_fields_fill_seq_ts_txn_and_meta():
    result = decode(
        [
            envelope("MD", md_message(TEN)),
            dt_message(
                ROW10,
                transactionEventCounter=3,
                transactionLastEvent=False,
                externalSchemaId="ext-9",
                timestamp="2024-01-02 03:04:05.250",
            ),
        ]
    )
    e = result.events[1]
    assert e.ts_ms == int(
        dt.datetime(2024, 1, 2, 3, 4, 5, 250000, tzinfo=dt.UTC).timestamp() * 1000
    )
    assert (e.txn.id, e.txn.order, e.txn.last) == ("00000000000000000000000000000A0B", 3, False)
    assert e.meta == {"tableVersion": 1, "streamPosition": "pos", "externalSchemaId": "ext-9"}
    assert e.seq == _seq("20240102030405000000000000000000001")


def test_refresh_rows_have_no_cdc_headers_and_decode_as_snapshots():
    msg = dt_message(
        ROW10,
        operation="REFRESH",
        changeSequence="",
        timestamp="",
        streamPosition="",
        transactionId="",
        transactionEventCounter=None,
        transactionLastEvent=None,
    )
    e = decode([envelope("MD", md_message(TEN)), msg]).events[1]
    assert e.op is Op.SNAPSHOT and e.seq is None and e.ts_ms is None and e.txn is None
    assert e.after == ROW10


DIGITS = st.text("00019", max_size=60)  # zero-heavy: zero padding must not tie


@given(DIGITS, DIGITS, DIGITS)
def test_seq_order_is_the_change_sequence_string_order(prefix, tail_a, tail_b):
    a, b = prefix + tail_a or "0", prefix + tail_b or "0"
    sa, sb = _seq(a), _seq(b)
    assert (sa < sb) == (a < b) and (sa == sb) == (a == b)
    assert (seq_key(sa) < seq_key(sb)) == (a < b)


def test_seq_keeps_replicate_order_across_transactions():
    seqs = [
        "20240102030405000000000000000000009",
        "20240102030405000000000000000000010",
        "20240102030406000000000000000000001",
    ]
    assert [_seq(s) for s in seqs] == sorted(_seq(s) for s in seqs)


# --------------------------------------------------------------------------- metadata lookup


def two_tables():
    return [
        envelope("MD", md_message(TEN, schema="S", table="T", sid="id-T")),
        envelope(
            "MD", md_message({"K": col(1, "STRING", pk=1)}, schema="S", table="U", sid="id-U")
        ),
    ]


def test_schema_id_finds_the_metadata_first():
    d = QlikJsonDecoder()
    decode(two_tables(), decoder=d)
    e = decode([dt_message(ROW10, sid="id-T")], decoder=d, topic="S.U", keys=[b"S.U"]).events[0]
    assert e.source.table == "T" and e.key == {"ID": 1}


def test_external_schema_id_is_a_schema_id_too():
    d = QlikJsonDecoder()
    decode(two_tables(), decoder=d)
    e = decode([dt_message(ROW10, sid=None, externalSchemaId="id-T")], decoder=d).events[0]
    assert e.source.table == "T"


@pytest.mark.parametrize("mode", ["auto", "topic"])
def test_topic_names_the_table(mode):
    d = QlikJsonDecoder(QlikJsonOptions(metadata_lookup=mode))
    decode(two_tables(), decoder=d)
    e = decode([dt_message({"K": "k1"}, sid=None)], decoder=d, topic="S.U").events[0]
    assert e.source.table == "U" and e.key == {"K": "k1"} and e.columns == {"K": "string"}


@pytest.mark.parametrize("mode", ["auto", "key"])
def test_message_key_names_the_table(mode):
    d = QlikJsonDecoder(QlikJsonOptions(metadata_lookup=mode))
    decode(two_tables(), decoder=d)
    for key in (b"S.U", b'"S.U"', b"U"):
        e = decode([dt_message({"K": "k1"}, sid=None)], decoder=d, keys=[key]).events[0]
        assert e.source.table == "U" and e.columns == {"K": "string"}, key


def test_schema_id_mode_ignores_topic_and_key():
    d = QlikJsonDecoder(QlikJsonOptions(metadata_lookup="schema-id", primary_keys={"*": ("K",)}))
    decode(two_tables(), decoder=d)
    e = decode([dt_message({"K": "k1"}, sid=None)], decoder=d, topic="S.U", keys=[b"S.U"]).events[0]
    assert e.columns is None and e.source.schema == "S" and e.source.table == "U"  # untyped


def test_a_bare_table_name_shared_by_two_schemas_finds_nothing():
    d = QlikJsonDecoder(QlikJsonOptions(primary_keys={"*": ("K",)}))
    decode(
        [
            envelope("MD", md_message({"K": col(1, "INT4", pk=1)}, schema="A", table="X", sid="a")),
            envelope(
                "MD", md_message({"K": col(1, "STRING", pk=1)}, schema="B", table="X", sid="b")
            ),
        ],
        decoder=d,
    )
    assert (
        decode([dt_message({"K": "1"}, sid=None)], decoder=d, topic="X").events[0].columns is None
    )
    e = decode([dt_message({"K": "1"}, sid=None)], decoder=d, topic="A.X").events[0]
    assert e.after == {"K": 1}


def test_require_metadata_dead_letters_data_without_metadata():
    result = decode([dt_message(ROW10, sid=None)], require_metadata=True)
    assert codes(result) == [Code.MISSING_FIELD]


def test_newer_table_version_wins_by_name_and_old_schema_ids_still_decode():
    v2 = {**TEN, "NEW": col(11, "INT8")}
    d = QlikJsonDecoder()
    decode(
        [
            envelope("MD", md_message(v2, version=2, sid="v2")),
            envelope("MD", md_message(TEN, version=1, sid="v1")),
        ],
        decoder=d,
    )  # replayed old MD
    by_topic = decode([dt_message({**ROW10, "NEW": 7}, sid=None)], decoder=d, topic="S.T").events[0]
    assert by_topic.meta["tableVersion"] == 2 and by_topic.columns["NEW"] == "int64"
    by_id = decode([dt_message(ROW10, sid="v1")], decoder=d).events[0]
    assert by_id.meta["tableVersion"] == 1 and "NEW" not in by_id.columns


# --------------------------------------------------------------------------- no metadata


def test_without_metadata_values_stay_as_json_gives_them_and_keys_come_from_options():
    row = {"ID": "7", "N": 1.5, "J": {"a": [1]}, "L": [1, 2]}
    result = decode(
        [dt_message(row, sid=None, columnMask="0F", changeMask="0F")],
        topic="S.T",
        primary_keys={"S.T": ("ID",)},
    )
    e = result.events[0]
    assert e.source == SourceTable("qlik-json", "", "S", "T") and e.columns is None
    assert e.after == {"ID": "7", "N": 1.5, "J": '{"a":[1]}', "L": "[1,2]"} and e.key == {"ID": "7"}


def test_without_metadata_a_partial_column_mask_is_a_dead_letter():
    result = decode(
        [dt_message({"A": 1, "B": None}, sid=None, columnMask="01")], primary_keys={"*": ("A",)}
    )
    assert codes(result) == [Code.MISSING_FIELD] and "columnMask" in result.dead_letters[0].message


def test_without_metadata_or_configured_keys_a_row_is_missing_key():
    assert codes(decode([dt_message({"A": 1}, sid=None)])) == [Code.MISSING_KEY]


# --------------------------------------------------------------------------- preloaded metadata


def test_metadata_persisted_from_a_ddl_event_preloads_a_new_decoder():
    ddl = decode([envelope("MD", md_message(TYPED))]).events[0]
    saved = orjson.dumps(metadata_from_event(ddl))  # what a pipeline would store
    d = decoder_for("qlik-json", {"metadata": [saved.decode()]})
    e = decode([dt_message(TYPED_ROW)], decoder=d).events[0]
    assert e.after["N"] == decimal.Decimal("12.50") and e.key == {"S": "s", "I4": 3}


def test_metadata_option_takes_envelopes_bare_messages_and_bytes():
    for item in (
        envelope("MD", md_message(TEN)),
        md_message(TEN),
        orjson.loads(envelope("MD", md_message(TEN))),
    ):
        d = QlikJsonDecoder(QlikJsonOptions(metadata=(item,)))
        assert decode([dt_message(ROW10)], decoder=d).events[0].key == {"ID": 1}
    assert metadata_from_message(md_message(TEN)) == metadata_from_message(
        envelope("MD", md_message(TEN))
    )


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="metadata_lookup"):
        QlikJsonOptions(metadata_lookup="header")
    with pytest.raises(ConfigError, match="metadata"):
        QlikJsonDecoder(QlikJsonOptions(metadata=({"lineage": {}},)))
    with pytest.raises(ConfigError, match="list"):
        QlikJsonOptions(metadata=md_message(TEN))
    with pytest.raises(ConfigError, match="unknown option"):
        decoder_for("qlik-json", {"metdata": []})
    with pytest.raises(ValueError):
        metadata_from_event(
            decode([dt_message({"A": 1}, sid=None)], primary_keys={"*": ("A",)}).events[0]
        )


def test_a_decoder_keeps_what_it_learned_through_pickling():
    d = QlikJsonDecoder()
    decode([envelope("MD", md_message(TYPED))], decoder=d)
    clone = pickle.loads(pickle.dumps(d))
    assert decode([dt_message(TYPED_ROW)], decoder=clone).events[0].after["BY"] == b"\x00\xff\x10"


# --------------------------------------------------------------------------- malformed


VALID = dt_message(ROW10)


@pytest.mark.parametrize(
    "value,code",
    [
        (b'{"magic":"atMSG","type":"DT"}', Code.MISSING_FIELD),
        (b'{"magic":"atMSG","type":"DT","message":[1]}', Code.BAD_FIELD),
        (b'{"magic":"atMSG","type":"DT","message":"{not json"}', Code.BAD_JSON),
        (b'{"magic":"nope","type":"DT","message":{}}', Code.BAD_FIELD),
        (b'{"magic":"atMSG","type":"XX","message":{}}', Code.BAD_FIELD),
        (
            b'{"magic":"atMSG","type":"DT","message":{"data":{"ID":1},"headers":[]}}',
            Code.MISSING_FIELD,
        ),
        (dt_message(ROW10, operation="MERGE"), Code.UNKNOWN_OP),
        (dt_message(ROW10, operation=None), Code.MISSING_FIELD),
        (dt_message(ROW10, changeSequence=None), Code.MISSING_FIELD),
        (dt_message(ROW10, changeSequence=123), Code.BAD_FIELD),
        (dt_message(ROW10, changeSequence="12 34"), Code.BAD_FIELD),
        (dt_message(ROW10, changeSequence="１２"), Code.BAD_FIELD),  # full-width digits
        (dt_message(ROW10, timestamp="03/04/2024"), Code.BAD_FIELD),
        (dt_message(ROW10, timestamp=5), Code.BAD_FIELD),
        (dt_message(ROW10, columnMask="zz"), Code.BAD_FIELD),
        (dt_message(ROW10, changeMask=11), Code.BAD_FIELD),
        (dt_message(ROW10, transactionId=7), Code.BAD_FIELD),
        (dt_message(ROW10, operation=["INSERT"]), Code.BAD_FIELD),
        (dt_message(ROW10, timestamp={"t": 1}), Code.BAD_FIELD),
        (dt_message(ROW10, streamPosition=[1]), Code.BAD_FIELD),
        (dt_message(ROW10, externalSchemaId={"id": 1}), Code.BAD_FIELD),
        (dt_message(ROW10, sid={"id": 1}), Code.MISSING_KEY),  # no metadata found, no keys
        (dt_message(ROW10, transactionLastEvent="true"), Code.BAD_FIELD),
        (dt_message("row"), Code.BAD_FIELD),
        (dt_message(None, operation="DELETE"), Code.MISSING_FIELD),
        (dt_message(ROW10, columnMask="03FE"), Code.MISSING_KEY),
        (envelope("MD", md_message({"A": {"type": "INT4"}})), Code.MISSING_FIELD),
        (envelope("MD", md_message({"A": col(0, "INT4")})), Code.BAD_FIELD),
        (envelope("MD", md_message({"A": {**col(1, "INT4"), "scale": "2"}})), Code.BAD_FIELD),
        (envelope("MD", md_message({})), Code.MISSING_FIELD),
        (envelope("MD", {**md_message(TEN), "lineage": {"schema": "S"}}), Code.BAD_FIELD),
    ],
)
def test_malformed_records_dead_letter_with_a_stable_code(value, code):
    result = decode([envelope("MD", md_message(TEN)), value], topic="unknown")
    assert len(result.events) == 1 and codes(result) == [code], result.dead_letters
    assert "Error:" not in result.dead_letters[0].message  # a DecodeError, not a crash


def test_every_truncation_of_a_valid_message_is_a_dead_letter_never_a_crash():
    d = QlikJsonDecoder(QlikJsonOptions(metadata=(md_message(TEN),)))
    for cut in range(len(VALID)):
        result = decode([VALID[:cut]], decoder=d)
        assert codes(result) == [Code.BAD_JSON], cut


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_decoder(value):
    result = decode([value, b"{" + value + b"}"])
    assert result.records == 2 and len(result.events) + len(result.dead_letters) == 2
    assert not any(d.code == Code.BAD_FIELD and "Error:" in d.message for d in result.dead_letters)


# --------------------------------------------------------------------------- encoder

COLUMNS = {
    "id": "int64",
    "name": "string",
    "price": "decimal(40,3)",
    "t": "time",
    "at": "timestamp",
    "raw": "binary",
    "doc": "json",
}
TABLE = SourceTable("", "db", "sales", "orders")


def change(op, before, after, seq, columns=COLUMNS, txn_id=None):
    return SourceChange(
        op=op,
        table=TABLE,
        columns=columns,
        key_columns=("id",),
        before=before,
        after=after,
        seq=seq,
        ts_ms=1_700_000_000_000 + seq,
        txn_id=txn_id,
    )


ROW = {
    "id": 1,
    "name": "a",
    "price": decimal.Decimal("1234567890123456789012345678901234567.125"),
    "t": dt.time(1, 2, 3, 4),
    "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6),
    "raw": b"\x01\xab",
    "doc": '{"k": 1}',
}


def test_encoder_announces_each_table_once_and_again_when_its_columns_change():
    enc = QlikJsonEncoder()
    first = enc.encode(change(Op.INSERT, None, ROW, 1))
    second = enc.encode(change(Op.UPDATE, ROW, {**ROW, "name": "b"}, 2))
    cols2 = {**COLUMNS, "extra": "int32"}
    third = enc.encode(change(Op.INSERT, None, {**ROW, "id": 2, "extra": 5}, 3, columns=cols2))
    kinds = [[orjson.loads(m.value)["type"] for m in ms] for ms in (first, second, third)]
    assert kinds == [["MD", "DT"], ["DT"], ["MD", "DT"]]
    md1, dt1 = (orjson.loads(m.value) for m in first)
    md2 = orjson.loads(third[0].value)
    assert dt1["messageSchemaId"] == md1["message"]["schemaId"]
    assert md2["message"]["lineage"]["tableVersion"] == 2
    assert md2["message"]["schemaId"] != md1["message"]["schemaId"]
    assert all(m.key == b"sales.orders" for m in first + second + third)
    assert dt1["message"]["data"]["raw"] == "01AB"  # binary as hexadecimal digits


def test_encoder_masks_follow_the_document():
    enc = QlikJsonEncoder()
    enc.encode(change(Op.INSERT, None, ROW, 1))
    after = {**ROW, "name": "b", "doc": '{"k": 2}'}
    upd = orjson.loads(enc.encode(change(Op.UPDATE, ROW, after, 2))[0].value)["message"]
    dele = orjson.loads(enc.encode(change(Op.DELETE, after, None, 3))[0].value)["message"]
    partial = {c: v for c, v in after.items() if c != "price"}
    part = orjson.loads(enc.encode(change(Op.UPDATE, after, partial, 4))[0].value)["message"]
    assert upd["headers"]["changeMask"] == "02"  # name only: the LOB (doc) has no bit
    assert dele["headers"]["changeMask"] == "01" and dele["beforeData"] is None
    assert dele["data"]["id"] == 1
    assert part["headers"]["columnMask"] == "7B" and part["data"]["price"] is None


def test_decode_of_encode_gives_back_every_exact_type_and_absent_columns():
    enc, dec = QlikJsonEncoder(), QlikJsonDecoder()
    partial = {c: v for c, v in ROW.items() if c != "name"}
    msgs = [
        m
        for c in (
            change(Op.SNAPSHOT, None, ROW, 1),
            change(Op.UPDATE, ROW, partial, 2),
            change(Op.DELETE, ROW, None, 3, txn_id="tx-9"),
        )
        for m in enc.encode(c)
    ]
    result = dec.decode_batch(
        [Record(m.value, m.key, origin=Origin("t", 0, i)) for i, m in enumerate(msgs)]
    )
    assert result.dead_letters == []
    ddl, snap, upd, dele = result.events
    assert ddl.op is Op.DDL and snap.op is Op.SNAPSHOT and snap.seq is None
    assert snap.after == ROW and upd.after == partial and "name" not in upd.before
    assert upd.changed == () and dele.before == ROW and dele.txn.id == "tx-9"
    assert dele.txn.order == 1 and seq_key(upd.seq) < seq_key(dele.seq)
    assert snap.columns["doc"] == "string" and snap.columns["price"] == "decimal(40,3)"
    assert "json" not in enc.exact_types and "timestamptz" not in enc.exact_types


def test_encoder_refuses_truncate():
    with pytest.raises(ValueError, match="truncate"):
        encoder_for("qlik-json").encode(change(Op.TRUNCATE, None, None, 1))

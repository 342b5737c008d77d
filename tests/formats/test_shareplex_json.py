"""Unit tests for the SharePlex JSON decoder and encoder (``cdcflow.formats.shareplex_json``)."""

from __future__ import annotations

import datetime as dt
import decimal
import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for

FMT = "shareplex-json"


def msg(op="ins", data=None, key=None, **meta):
    m = {
        "time": "2017-06-16T14:24:34",
        "userid": 84,
        "op": op,
        "scn": "14589063118712",
        "rowid": "AAATGpAAIAAItcIAAA",
        "trans": "7.0.411499",
        "seq": 1,
        "size": 2,
        "table": "CL_BIZ1.MIO_LOG",
        "idx": "1/2",
        "posttime": "2017-06-16T14:33:52",
    }
    m.update(meta)
    m = {k: v for k, v in m.items() if v is not ...}
    doc = {"meta": m}
    if data is not ...:
        doc["data"] = {"ID": "1"} if data is None else data
    if key is not None:
        doc["key"] = key
    return orjson.dumps(doc)


def records(*values, partition=0):
    return [Record(value=v, origin=Origin("t", partition, i)) for i, v in enumerate(values)]


def decode(value, options=None):
    return decoder_for(FMT, options).decode(Record(value=value, origin=Origin("t", 1, 7)))


def dead(value, options=None) -> str:
    result = decoder_for(FMT, options).decode_batch([Record(value=value)])
    assert not result.events and len(result.dead_letters) == 1, result
    return result.dead_letters[0].code


PK = {"primary_keys": {"CL_BIZ1.MIO_LOG": ["ID"]}}


# --------------------------------------------------------------------------- ops


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("ins", Op.INSERT),
        ("INSERT", Op.INSERT),
        ("Insert", Op.INSERT),
        ("upd", Op.UPDATE),
        ("UPDATE", Op.UPDATE),
        ("del", Op.DELETE),
        ("DELETE", Op.DELETE),
        ("TRUNCATE", Op.TRUNCATE),
        ("truncate", Op.TRUNCATE),
        ("DROP COLUMN", Op.DDL),
        ("drop  column", Op.DDL),
        ("UPDATE BEFORE", Op.UPDATE),
        ("UPDATE AFTER", Op.UPDATE),
    ],
)
def test_op_spellings(op, expected):
    [event] = decode(msg(op), PK)
    assert event.op is expected


@pytest.mark.parametrize("op", ["inserted", "merge", "UPDATE_BEFORE", "", "i"])
def test_unknown_ops_are_never_guessed(op):
    assert dead(msg(op)) == Code.UNKNOWN_OP


def test_envelope_to_source_seq_time_txn_origin():
    [event] = decode(msg(seq=2, size=2))
    assert event.source == SourceTable(FMT, "", "CL_BIZ1", "MIO_LOG")
    assert event.seq == (14589063118712, 2)
    assert event.ts_ms == 1497623074000
    assert event.txn is not None and (event.txn.id, event.txn.order, event.txn.last) == (
        "7.0.411499",
        2,
        True,
    )
    assert event.origin == Origin("t", 1, 7)
    assert event.meta["posttime"] == "2017-06-16T14:33:52" and event.meta["userid"] == 84


def test_seq_orders_by_scn_then_operation():
    a = decode(msg(scn="99", seq=10, size=10))[0].seq
    b = decode(msg(scn="100", seq=1, size=10))[0].seq
    c = decode(msg(scn=100, seq=2, size=10))[0].seq  # a JSON number is accepted too
    assert seq_key(a) < seq_key(b) < seq_key(c)
    assert decode(msg(scn=..., seq=...))[0].seq is None
    assert decode(msg(seq=...))[0].seq == (14589063118712,)


@pytest.mark.parametrize(
    "time", ["2017-06-16T14:24:34", "2017-06-16T14:24:34Z", "2017-06-16T16:24:34+02:00"]
)
def test_time_is_utc(time):
    assert decode(msg(time=time))[0].ts_ms == 1497623074000


@pytest.mark.parametrize(
    ("meta", "code"),
    [
        ({"scn": "12a"}, Code.BAD_FIELD),
        ({"seq": "1"}, Code.BAD_FIELD),
        ({"time": "16/06/2017"}, Code.BAD_FIELD),
        ({"time": 1497623074}, Code.BAD_FIELD),
        ({"table": 5}, Code.BAD_FIELD),
        ({"table": ...}, Code.MISSING_FIELD),
        ({"table": ""}, Code.BAD_FIELD),
        ({"op": 1}, Code.BAD_FIELD),
        ({"op": ...}, Code.MISSING_FIELD),
        ({"rowid": 5}, Code.BAD_FIELD),
    ],
)
def test_bad_meta_fields(meta, code):
    assert dead(msg(**meta)) == code


def test_bad_envelopes():
    assert dead(b'{"meta": [1]}') == Code.BAD_FIELD
    assert dead(b'{"data": {}}') == Code.MISSING_FIELD
    assert dead(b"[]") == Code.NOT_AN_OBJECT
    assert dead(b'{"meta": {"op": "ins"') == Code.BAD_JSON
    assert dead(b"\xff") == Code.BAD_JSON
    assert dead(msg(data=...)) == Code.MISSING_FIELD
    assert dead(msg(data=["1"])) == Code.BAD_FIELD
    assert dead(msg("upd", data={"A": "1"}, key=["x"])) == Code.BAD_FIELD


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    ["meta", "data", "key", "op", "table", "scn", "seq", "time", "rowid", "trans"]
                ),
                inner,
                max_size=5,
            )
        ),
        max_leaves=12,
    )
)
def test_arbitrary_json_never_crashes(doc):
    result = decoder_for(FMT).decode_batch([Record(value=orjson.dumps(doc))])
    assert result.records == result.decoded_records + len(result.dead_letters) + len(result.skipped)
    # a decoder bug surfaces as "SomeError: ..." from decode_batch's catch-all
    assert not any(re.match(r"^\w+(Error|Exception): ", d.message) for d in result.dead_letters), (
        result.dead_letters
    )


# --------------------------------------------------------------------------- images


def test_update_uses_key_as_before_and_data_as_changed_values():
    value = msg(
        "upd",
        data={"CNTR_NO": "1171201606"},
        key={"ID": "5", "POL_CODE": None, "CNTR_NO": "1171201606syui26"},
    )
    [event] = decode(value, PK)
    assert event.before == {"ID": "5", "POL_CODE": None, "CNTR_NO": "1171201606syui26"}
    assert event.after == {"ID": "5", "POL_CODE": None, "CNTR_NO": "1171201606"}
    assert event.changed == ("CNTR_NO",) and event.key == {"ID": "5"}


def test_update_without_key_object_has_only_an_after_image():
    [event] = decode(msg("upd", data={"ID": "5", "A": "x"}), PK)
    assert event.before is None and event.after == {"ID": "5", "A": "x"}


def test_values_keep_their_published_form():
    data = {
        "ID": "007",
        "S": "1171201606",
        "N": 42,
        "F": 0.1,
        "BIG": 12345678901234567890,
        "B": True,
        "NUL": None,
        "ARR": [1, {"a": 2}],
    }
    [event] = decode(msg(data=data), PK)
    after = event.after
    assert after["ID"] == "007" and after["S"] == "1171201606"  # numeric strings stay text
    assert after["N"] == 42 and type(after["N"]) is int
    assert after["F"] == decimal.Decimal("0.1") and type(after["F"]) is decimal.Decimal
    assert after["BIG"] == 12345678901234567890
    assert after["B"] is True and after["NUL"] is None
    assert after["ARR"] == '[1,{"a":2}]'
    assert event.columns is None  # SharePlex declares no types


def test_delete_data_is_the_before_image():
    [event] = decode(msg("del", data={"ID": "3", "X": None}), PK)
    assert event.before == {"ID": "3", "X": None} and event.after is None
    assert event.key == {"ID": "3"}


def test_truncate_and_drop_column_carry_no_rows():
    [trunc] = decode(msg("TRUNCATE", data=..., rowid=...))
    assert trunc.op is Op.TRUNCATE and trunc.key is None and trunc.after is None
    [drop] = decode(msg("DROP COLUMN", data={"OLD_COL": None}, rowid=...))
    assert drop.op is Op.DDL and drop.ddl is None and drop.meta["data"] == {"OLD_COL": None}


# --------------------------------------------------------------------------- keys


def test_rowid_is_the_identity_without_configured_keys():
    [ins] = decode(msg(data={"ID": "1"}))
    assert ins.key == {"ROWID": "AAATGpAAIAAItcIAAA"}
    assert ins.after == {"ID": "1", "ROWID": "AAATGpAAIAAItcIAAA"}
    [upd] = decode(msg("upd", data={"A": "2"}, key={"A": "1"}))
    assert upd.before["ROWID"] == upd.after["ROWID"] == "AAATGpAAIAAItcIAAA"
    [named] = decode(msg(data={"ID": "1"}), {"rowid_column": "SRC_ROWID"})
    assert named.key == {"SRC_ROWID": "AAATGpAAIAAItcIAAA"}
    assert dead(msg(data={"ID": "1"}), {"rowid_column": ""}) == Code.MISSING_KEY
    assert dead(msg(data={"ID": "1"}, rowid=...)) == Code.MISSING_KEY


def test_configured_key_wins_over_rowid():
    [event] = decode(msg(data={"ID": "1", "A": "x"}), PK)
    assert event.key == {"ID": "1"} and "ROWID" not in event.after
    assert dead(msg(data={"A": "x"}), PK) == Code.MISSING_KEY


# --------------------------------------------------------------------------- halves


def halves_batch(*values, options=None, partition=0):
    return decoder_for(FMT, options).decode_batch(records(*values, partition=partition))


def test_update_halves_are_joined():
    result = halves_batch(
        msg("UPDATE BEFORE", {"ID": "7", "S": "NEW"}, seq=1, size=3),
        msg("ins", {"ID": "99"}, seq=2, size=3, table="CL_BIZ1.OTHER", rowid="AAAB"),
        msg("UPDATE AFTER", {"ID": "7", "S": "PAID"}, seq=3, size=3),
    )
    # like DataWorks, the joined update stands where the earlier (before) half stood
    assert [e.op for e in result.events] == [Op.UPDATE, Op.INSERT]
    upd = result.events[0]
    assert upd.before == {"ID": "7", "S": "NEW", "ROWID": "AAATGpAAIAAItcIAAA"}
    assert upd.after == {"ID": "7", "S": "PAID", "ROWID": "AAATGpAAIAAItcIAAA"}
    assert upd.seq == (14589063118712, 3) and upd.origin.offset == 2
    assert result.decoded_records == 3


def test_pair_updates_off_keeps_the_halves():
    result = halves_batch(
        msg("UPDATE BEFORE", {"ID": "7"}),
        msg("UPDATE AFTER", {"ID": "7"}),
        options={**PK, "pair_updates": False},
    )
    assert [(e.before, e.after) for e in result.events] == [
        ({"ID": "7"}, None),
        (None, {"ID": "7"}),
    ]


def test_joined_update_keeps_a_primary_key_change():
    result = halves_batch(
        msg("UPDATE BEFORE", {"ID": "7"}), msg("UPDATE AFTER", {"ID": "70"}), options=PK
    )
    [upd] = result.events
    assert upd.before == {"ID": "7"} and upd.after == {"ID": "70"} and upd.key == {"ID": "70"}


def test_halves_of_different_transactions_or_partitions_are_not_joined():
    result = halves_batch(
        msg("UPDATE BEFORE", {"ID": "7"}, trans="1.1.1"),
        msg("UPDATE AFTER", {"ID": "7"}, trans="1.1.2"),
        options=PK,
    )
    assert [(e.before, e.after) for e in result.events] == [
        ({"ID": "7"}, None),
        (None, {"ID": "7"}),
    ]
    decoder = decoder_for(FMT, PK)
    batch = decoder.decode_batch(
        [
            Record(value=msg("UPDATE BEFORE", {"ID": "7"}), origin=Origin("t", 0, 0)),
            Record(value=msg("UPDATE AFTER", {"ID": "7"}), origin=Origin("t", 1, 0)),
        ]
    )
    assert len(batch.events) == 2


def test_lone_halves_are_kept():
    result = halves_batch(
        msg("UPDATE AFTER", {"ID": "8"}), msg("UPDATE BEFORE", {"ID": "9"}), options=PK
    )
    first, second = result.events
    assert first.before is None and first.after == {"ID": "8"}
    assert second.before == {"ID": "9"} and second.after is None and second.key == {"ID": "9"}


def test_after_half_with_key_object_merges_it():
    [event] = decode(msg("UPDATE AFTER", {"S": "PAID"}, key={"ID": "7", "S": "NEW"}), PK)
    assert event.after == {"ID": "7", "S": "PAID"} and event.key == {"ID": "7"}


# --------------------------------------------------------------------------- column types

TYPES = {
    "primary_keys": {"CL_BIZ1.MIO_LOG": ["ID"]},
    "column_types": {
        "MIO_LOG": {
            "ID": "int64",
            "AMT": "decimal(8,2)",
            "R": "float64",
            "T": "timestamp",
            "TZ": "timestamptz",
            "D": "date",
            "H": "time",
            "OK": "boolean",
            "J": "json",
            "S": "string",
        }
    },
}


def test_column_types_convert_declared_columns():
    data = {
        "ID": "0042",
        "AMT": "12.5",
        "R": "1.5E3",
        "T": "2024-01-02 03:04:05.6",
        "TZ": "2024-01-02T03:04:05+01:00",
        "D": "2024-01-02",
        "H": "10:11:12",
        "OK": "1",
        "J": {"a": 1},
        "S": 5,
        "OTHER": "0042",
    }
    [event] = decode(msg(data=data), TYPES)
    assert event.after == {
        "ID": 42,
        "AMT": decimal.Decimal("12.50"),
        "R": 1500.0,
        "T": dt.datetime(2024, 1, 2, 3, 4, 5, 600000),
        "TZ": dt.datetime(2024, 1, 2, 2, 4, 5, tzinfo=dt.UTC),
        "D": dt.date(2024, 1, 2),
        "H": dt.time(10, 11, 12),
        "OK": True,
        "J": '{"a":1}',
        "S": "5",
        "OTHER": "0042",
    }
    assert event.key == {"ID": 42}
    assert event.columns == {k: v for k, v in TYPES["column_types"]["MIO_LOG"].items()}
    assert str(event.after["AMT"]) == "12.50"


@pytest.mark.parametrize(
    ("column", "value"),
    [("ID", "x"), ("AMT", "1.234"), ("D", "2024-02-30"), ("H", "25:00"), ("OK", "maybe")],
)
def test_column_types_reject_bad_values(column, value):
    assert dead(msg(data={"ID": "1", column: value}), TYPES) == Code.BAD_VALUE


def _typed_options(logical: str) -> dict:
    return {**PK, "column_types": {"MIO_LOG": {"ID": "int64", "N": logical}}}


@pytest.mark.parametrize(
    ("logical", "value"),
    [
        ("int32", "2147483648"),
        ("int32", -2147483649),
        ("int64", "9223372036854775808"),
        ("int64", 9223372036854775808),  # orjson reads up to 2**64 - 1 exactly
        ("int64", "-9223372036854775809"),
    ],
)
def test_column_types_reject_an_integer_outside_the_range_naming_column_and_range(logical, value):
    result = decoder_for(FMT, _typed_options(logical)).decode_batch(
        [Record(value=msg(data={"ID": "1", "N": value}))]
    )
    (dead_letter,) = result.dead_letters
    assert dead_letter.code == Code.BAD_VALUE
    lo, hi = (-(2**31), 2**31 - 1) if logical == "int32" else (-(2**63), 2**63 - 1)
    assert "'N'" in dead_letter.message and f"{logical} range {lo}..{hi}" in dead_letter.message


@pytest.mark.parametrize(
    ("logical", "value", "want"),
    [
        ("int32", "-2147483648", -(2**31)),
        ("int32", "+2147483647", 2**31 - 1),
        ("int64", "9223372036854775807", 2**63 - 1),
        ("int64", -(2**63), -(2**63)),
    ],
)
def test_column_types_keep_integers_at_the_limits(logical, value, want):
    [event] = decode(msg(data={"ID": "1", "N": value}), _typed_options(logical))
    assert event.after["N"] == want


@pytest.mark.parametrize("value", [" 42", "42 ", "4_2", "٤٢", "42.0"])
def test_column_types_take_integer_text_as_sign_and_ascii_digits_only(value):
    """The document's integers are plain digit strings ("32539737")."""
    assert dead(msg(data={"ID": "1", "N": value}), _typed_options("int64")) == Code.BAD_VALUE


@pytest.mark.parametrize("seq", [2**63, 2**64 - 1])
def test_meta_seq_beyond_int64_is_bad_field_naming_the_range(seq):
    result = decoder_for(FMT).decode_batch([Record(value=msg(seq=seq))])
    (dead_letter,) = result.dead_letters
    assert dead_letter.code == Code.BAD_FIELD
    assert "meta.seq" in dead_letter.message
    assert "-9223372036854775808..9223372036854775807" in dead_letter.message
    [event] = decode(msg(seq=2**63 - 1, size=2**63 - 1))
    assert event.txn.order == 2**63 - 1 and event.txn.last is True


@pytest.mark.parametrize("options", [None, TYPES])
def test_a_value_nested_deeper_than_254_levels_is_bad_value_naming_the_column(options):
    deep = b"[" * 300 + b"]" * 300  # orjson reads 1024 levels, writes 254
    value = msg(data={"ID": "1", "J": "DEEP"}).replace(b'"DEEP"', deep)
    result = decoder_for(FMT, options).decode_batch([Record(value=value)])
    (dead_letter,) = result.dead_letters
    assert dead_letter.code == Code.BAD_VALUE
    assert "'J'" in dead_letter.message
    assert "nested deeper than 254 levels" in dead_letter.message


@pytest.mark.parametrize("logical", ["binary", "decimal", "varchar", "int"])
def test_unsupported_column_types_are_config_errors(logical):
    with pytest.raises(ConfigError):
        decoder_for(FMT, {"column_types": {"T": {"C": logical}}})


def test_unknown_option_is_a_config_error():
    with pytest.raises(ConfigError):
        decoder_for(FMT, {"rowid": "ROWID"})


# --------------------------------------------------------------------------- encoder


def test_encoder_round_trip_with_configured_keys():
    table = SourceTable("", "", "SALES", "ORDERS")
    columns = {"id": "int64", "name": "string", "n": "int32", "price": "decimal(8,2)"}
    row1 = {"id": 1, "name": "a", "n": 3, "price": decimal.Decimal("1.50")}
    row2 = {**row1, "name": "b"}

    def change(op, before, after, seq):
        return SourceChange(
            op=op,
            table=table,
            columns=columns,
            key_columns=("id",),
            before=before,
            after=after,
            seq=seq,
            ts_ms=1_700_000_000_000 + seq,
        )

    changes = [
        change(Op.INSERT, None, row1, 1),
        change(Op.UPDATE, row1, row2, 2),
        change(Op.DELETE, row2, None, 3),
    ]
    encoder = encoder_for(FMT)
    options = encoder.decoder_options(changes)
    assert options == {"primary_keys": {"SALES.ORDERS": ["id"]}}
    messages = [m for c in changes for m in encoder.encode(c)]
    update_doc = orjson.loads(messages[1].value)
    assert update_doc["meta"]["op"] == "upd"
    assert update_doc["data"] == {"name": "b"} and update_doc["key"] == {"id": 1, "name": "a"}
    result = decoder_for(FMT, options).decode_batch(records(*(m.value for m in messages)))
    ins, upd, dele = result.events
    assert ins.after == {**row1, "price": "1.50"} and ins.key == {"id": 1}
    assert upd.before == {"id": 1, "name": "a"} and upd.after == {"id": 1, "name": "b"}
    assert dele.before == {**row2, "price": "1.50"} and dele.key == {"id": 1}
    keys = [seq_key(e.seq) for e in result.events]
    assert keys == sorted(keys)
    # without configured keys the ROWID identity is stable for the same row
    plain = decoder_for(FMT).decode_batch(records(*(m.value for m in messages))).events
    assert plain[0].key == plain[1].key == plain[2].key

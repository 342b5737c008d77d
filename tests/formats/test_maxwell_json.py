"""Unit tests of the ``maxwell-json`` decoder and encoder (the tricky parts)."""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, DecodeError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.maxwell_json import COMMIT_ROW_XOFFSET
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for

CORPUS = Path(__file__).parent / "corpus" / "maxwell"
FMT = "maxwell-json"


def _msg(**fields):
    base = {
        "database": "shop",
        "table": "items",
        "type": "insert",
        "ts": 1700000000,
        "primary_key_columns": ["id"],
        "data": {"id": 1, "name": "a"},
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def _decode(msg, options=None, key=None):
    value = msg if isinstance(msg, bytes) else orjson.dumps(msg)
    return decoder_for(FMT, options).decode(Record(value=value, key=key, origin=Origin("t", 2, 9)))


def _code(msg, options=None, key=None):
    with pytest.raises(DecodeError) as info:
        _decode(msg, options, key)
    return info.value.code


def _replay(events, rows=None):
    """Apply row events to a dict keyed by the key values (a tiny upsert sink)."""
    rows = {} if rows is None else rows
    for e in events:
        k = tuple(e.key.values())
        if e.op is Op.DELETE:
            rows.pop(k, None)
        else:
            rows[k] = {**rows.get(k, {}), **e.after}
    return rows


def _lines(path):
    return [Record(line) for line in path.read_bytes().splitlines() if line.strip()]


# --------------------------------------------------------------------------- corpus


def test_corpus_replays_to_the_upstream_expected_table():
    """Paimon's schema-evolution files, fed in order, give the table its test expects."""
    expected = json.loads(
        (CORPUS / "paimon-maxwell_schemaevolution_maxwell.expected.json").read_text()
    )
    decoder, rows = decoder_for(FMT), {}
    for stage in expected["stages"]:
        result = decoder.decode_batch(_lines(CORPUS / stage["file"]))
        assert not result.dead_letters
        _replay(result.events, rows)
        got = sorted(
            (
                {c: None if r.get(c) is None else str(r[c]) for c in stage["columns"]}
                for r in rows.values()
            ),
            key=lambda r: int(r["id"]),
        )
        assert got == stage["final_table"]


def test_seatunnel_capture_gives_its_changelog_and_final_table():
    expected = json.loads((CORPUS / "seatunnel-e2e-maxwell_data.expected.json").read_text())
    decoder = decoder_for(FMT, {"primary_keys": {"products": ["id"]}})
    events = decoder.decode_batch(_lines(CORPUS / "seatunnel-e2e-maxwell_data.txt")).events
    changelog = []
    for e in events:
        if e.op is Op.INSERT:
            changelog.append({"kind": "+I", "row": e.after})
        elif e.op is Op.UPDATE:
            changelog += [{"kind": "-U", "row": e.before}, {"kind": "+U", "row": e.after}]
        else:
            changelog.append({"kind": "-D", "row": e.before})
    assert changelog == expected["expected_changelog"]
    assert (
        sorted(_replay(events).values(), key=lambda r: r["id"]) == expected["expected_final_table"]
    )


# --------------------------------------------------------------------------- images


def test_update_before_is_data_overlaid_with_old_and_changed_lists_old():
    [e] = _decode(
        _msg(type="update", data={"id": 1, "name": "b", "qty": 3}, old={"name": "a", "qty": None})
    )
    assert e.op is Op.UPDATE and e.key == {"id": 1}
    assert e.before == {"id": 1, "name": "a", "qty": None}
    assert e.after == {"id": 1, "name": "b", "qty": 3}
    assert e.changed == ("name", "qty")


def test_column_in_old_but_left_out_of_data_became_null():
    # output_nulls=false: Maxwell drops NULLs from data, old still has the old value
    [e] = _decode(_msg(type="update", data={"id": 1}, old={"name": "a"}))
    assert e.after == {"id": 1, "name": None}
    assert e.before == {"id": 1, "name": "a"}


def test_absent_column_is_not_present_rather_than_null_on_insert():
    [e] = _decode(_msg(data={"id": 1}))
    assert e.after == {"id": 1} and "name" not in e.after


def test_json_columns_and_sets_become_json_text():
    [e] = _decode(_msg(data={"id": 1, "j": {"a": [1, 2.5, {"b": None}]}, "s": ["x", "y"], "e": []}))
    assert e.after["j"] == '{"a":[1,2.5,{"b":null}]}'
    assert e.after["s"] == '["x","y"]' and e.after["e"] == "[]"


def test_a_json_column_nested_deeper_than_254_levels_is_bad_value_naming_the_column():
    deep = b"[" * 300 + b"]" * 300  # orjson reads 1024 levels, writes 254
    value = orjson.dumps(_msg(data={"id": 1, "j": "DEEP"})).replace(b'"DEEP"', deep)
    with pytest.raises(DecodeError) as info:
        _decode(value)
    assert info.value.code == Code.BAD_VALUE
    assert "'j'" in info.value.message and "nested deeper than 254 levels" in info.value.message


@pytest.mark.parametrize(
    ("options", "raw", "text"),
    [
        # float_as_decimal: numbers inside a JSON column are written as published
        ({"float_as_decimal": True}, b'{"a":12.50,"b":[0.1]}', '{"a":12.50,"b":[0.1]}'),
        # an exact re-parse (a top-level integer beyond 64 bits): nested ones stay exact
        (None, b'{"a":123456789012345678901234567890}', '{"a":123456789012345678901234567890}'),
    ],
)
def test_json_columns_of_an_exact_parse_keep_their_numbers(options, raw, text):
    """These were BAD_FIELD 'TypeError' dead letters: orjson writes neither Decimal nor
    integers beyond 64 bits."""
    value = (
        b'{"database":"d","table":"t","type":"insert","primary_key_columns":["id"],'
        b'"data":{"id":1,"big":18446744073709551616,"j":' + raw + b"}}"
    )
    [e] = _decode(value, options)
    assert e.after["j"] == text and e.after["big"] == 2**64


@pytest.mark.parametrize(
    "literal, value",
    [
        (b"18446744073709551615", 18446744073709551615),  # BIGINT UNSIGNED max: orjson keeps it
        (b"123456789012345678901234567890", 123456789012345678901234567890),  # DECIMAL(65,0)
        (b"-9223372036854775809", -9223372036854775809),  # below int64
    ],
)
def test_large_integers_stay_exact(literal, value):
    raw = (
        b'{"database":"d","table":"t","type":"insert","primary_key_columns":["id"],'
        b'"data":{"id":1,"big":' + literal + b',"f":0.5}}'
    )
    [e] = _decode(raw)
    assert e.after["big"] == value and type(e.after["big"]) is int
    assert e.after["f"] == 0.5


def test_large_float_with_exponent_stays_a_float():
    raw = (
        b'{"database":"d","table":"t","type":"insert","primary_key_columns":["id"],'
        b'"data":{"id":1,"d":1.0E19}}'
    )
    [e] = _decode(raw)
    assert e.after["d"] == 1e19 and type(e.after["d"]) is float


def test_float_as_decimal_keeps_decimal_digits():
    raw = (
        b'{"database":"d","table":"t","type":"insert","primary_key_columns":["id"],'
        b'"data":{"id":1,"price":12.50,"x":0.1000000000000000055511151231257827}}'
    )
    [e] = _decode(raw, {"float_as_decimal": True})
    assert e.after["price"] == decimal.Decimal("12.50")
    assert str(e.after["price"]) == "12.50"
    assert e.after["x"] == decimal.Decimal("0.1000000000000000055511151231257827")
    [f] = _decode(raw)
    assert f.after["price"] == 12.5 and type(f.after["price"]) is float


# --------------------------------------------------------------------------- keys


def test_key_from_primary_key_columns_wins_over_options():
    [e] = _decode(_msg(primary_key_columns=["name"]), {"primary_keys": {"*": ["id"]}})
    assert e.key == {"name": "a"}


def test_without_key_information_a_row_is_missing_key():
    assert _code(_msg(primary_key_columns=...)) == Code.MISSING_KEY
    assert _code(_msg(primary_key_columns=[])) == Code.MISSING_KEY
    [e] = _decode(_msg(primary_key_columns=...), {"primary_keys": {"shop.items": ["id"]}})
    assert e.key == {"id": 1}


def test_key_columns_from_maxwell_kafka_key_hash_and_array_formats():
    msg = _msg(primary_key_columns=..., data={"ID": 7, "Code": "x", "v": 1})
    hash_key = b'{"database":"shop","table":"items","pk.id":7,"pk.code":"x"}'
    [e] = _decode(msg, key=hash_key)
    assert e.key == {"ID": 7, "Code": "x"}  # lower-cased key names map back to the columns
    [e] = _decode(msg, key=b'["shop","items",[{"id":7},{"code":"x"}]]')
    assert e.key == {"ID": 7, "Code": "x"}
    # a table without a primary key: Maxwell writes a random _uuid
    assert _code(msg, key=b'{"database":"shop","table":"items","_uuid":"abc"}') == Code.MISSING_KEY
    assert _code(msg, {"key_from_kafka_key": False}, key=hash_key) == Code.MISSING_KEY


def test_key_column_missing_from_the_row_is_missing_key():
    assert _code(_msg(primary_key_columns=["nope"])) == Code.MISSING_KEY


# --------------------------------------------------------------------------- order, time, txn


def test_seq_orders_rows_by_binlog_file_offset_and_xoffset():
    rows = [
        _msg(position="mysql-bin.000009:400", xid=5, xoffset=0),
        _msg(position="mysql-bin.000009:400", xid=5, xoffset=1),
        _msg(position="mysql-bin.000009:400", xid=5, commit=True),  # commit row: no xoffset
        _msg(position="mysql-bin.000009:1200", xid=6, commit=True),
        _msg(position="mysql-bin.000010:4", xid=7, xoffset=0),
    ]
    events = [_decode(m)[0] for m in rows]
    assert events[0].seq == (9, 400, 0)
    assert events[2].seq == (9, 400, COMMIT_ROW_XOFFSET)
    keys = [seq_key(e.seq) for e in events]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_without_position_seq_is_none():
    [e] = _decode(_msg(xid=3, xoffset=0))
    assert e.seq is None


def test_txn_from_xid_xoffset_and_commit():
    [a] = _decode(_msg(xid=42, xoffset=2))
    [b] = _decode(_msg(xid=42, commit=True))
    [c] = _decode(_msg())
    assert (a.txn.id, a.txn.order, a.txn.last) == ("42", 3, False)
    assert (b.txn.id, b.txn.order, b.txn.last) == ("42", None, True)
    assert c.txn is None


def test_row_ts_is_seconds_and_ddl_ts_is_milliseconds():
    [row] = _decode(_msg(ts=1477053217))
    [ddl] = _decode(
        {
            "type": "table-drop",
            "database": "shop",
            "table": "items",
            "ts": 1477053308123,
            "sql": "drop table items",
            "position": "master.000006:804398",
        }
    )
    assert row.ts_ms == 1477053217000
    assert ddl.op is Op.DDL and ddl.ts_ms == 1477053308123 and ddl.key is None
    assert ddl.ddl == "drop table items" and ddl.seq == (6, 804398, 0)
    assert ddl.meta == {"type": "table-drop"}


@pytest.mark.parametrize(
    ("fields", "field", "valid"),
    [
        # row ts is epoch seconds: ts * 1000 (ts_ms) must fit 64 bits
        ({"ts": 9223372036854776}, "'ts'", "-9223372036854775..9223372036854775"),
        ({"ts": -9223372036854776}, "'ts'", "-9223372036854775..9223372036854775"),
        # xoffset + 1 is txn.order, and xoffset sorts below the commit row in seq
        ({"xid": 1, "xoffset": COMMIT_ROW_XOFFSET}, "'xoffset'", "0..4294967295"),
        ({"xid": 1, "xoffset": -1}, "'xoffset'", "0..4294967295"),
        ({"xoffset": 2**63 - 1}, "'xoffset'", "0..4294967295"),  # without xid too
    ],
)
def test_ts_and_xoffset_out_of_range_are_bad_field_naming_the_range(fields, field, valid):
    with pytest.raises(DecodeError) as info:
        _decode(_msg(position="mysql-bin.000001:4", **fields))
    assert info.value.code == Code.BAD_FIELD
    assert field in info.value.message and valid in info.value.message


def test_ts_and_xoffset_at_the_limits_are_kept():
    [e] = _decode(_msg(ts=9223372036854775, xid=1, xoffset=COMMIT_ROW_XOFFSET - 1))
    assert e.ts_ms == 9223372036854775000 and e.txn.order == COMMIT_ROW_XOFFSET
    [e] = _decode(_msg(ts=-9223372036854775))
    assert e.ts_ms == -9223372036854775000


@pytest.mark.parametrize("xoffset", ["a", True, 1.5, [1], None])
def test_xoffset_must_be_an_integer_with_or_without_xid(xoffset):
    """Without xid, xoffset still goes into seq, so its type is checked there too."""
    for xid in (..., 7):
        msg = _msg(position="mysql-bin.000001:4", xid=xid, xoffset=xoffset)
        if xoffset is None:
            [e] = _decode(msg)  # null: absent
            assert e.seq == (1, 4, 0)
            continue
        with pytest.raises(DecodeError) as info:
            _decode(msg)
        assert info.value.code == Code.BAD_FIELD and "'xoffset'" in info.value.message


def test_ddl_ts_beyond_int64_is_bad_field():
    ddl = {"type": "table-drop", "database": "shop", "table": "t", "sql": "drop table t"}
    with pytest.raises(DecodeError) as info:
        _decode({**ddl, "ts": 2**63})
    assert info.value.code == Code.BAD_FIELD and "'ts'" in info.value.message
    assert "-9223372036854775808..9223372036854775807" in info.value.message
    [e] = _decode({**ddl, "ts": 2**63 - 1})
    assert e.ts_ms == 2**63 - 1


def test_database_ddl_has_no_table():
    [e] = _decode(
        {
            "type": "database-create",
            "database": "newdb",
            "ts": 1,
            "sql": "create database newdb",
            "def": {"database": "newdb"},
        }
    )
    assert e.source.database == "newdb" and e.source.table == ""
    assert e.meta["def"] == {"database": "newdb"}


def test_bootstrap_rows_are_snapshots_and_markers_are_messages():
    [start] = _decode(_msg(type="bootstrap-start", data={}, primary_key_columns=...))
    [row] = _decode(_msg(type="bootstrap-insert"))
    [done] = _decode(_msg(type="bootstrap-complete", data={}, primary_key_columns=...))
    assert start.op is Op.MESSAGE and start.meta == {"type": "bootstrap-start"}
    assert done.op is Op.MESSAGE and done.meta == {"type": "bootstrap-complete"}
    assert row.op is Op.SNAPSHOT and row.key == {"id": 1} and row.after == {"id": 1, "name": "a"}


def test_extras_go_to_meta_and_origin_is_the_record():
    [e] = _decode(_msg(server_id=23042, thread_id=108, gtid="uuid:12", query="insert ..."))
    assert e.meta == {
        "server_id": 23042,
        "thread_id": 108,
        "gtid": "uuid:12",
        "query": "insert ...",
    }
    assert e.origin == Origin("t", 2, 9)


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    "value, code",
    [
        (b'{"database":"d","table":"t","type":"insert","data":{"id":1}', Code.BAD_JSON),
        (b'\xff\xfe{"a":1}', Code.BAD_JSON),
        (b'[{"database":"d"}]', Code.NOT_AN_OBJECT),
        (orjson.dumps(_msg(type=...)), Code.MISSING_FIELD),
        (orjson.dumps(_msg(type=["insert"])), Code.BAD_FIELD),
        (orjson.dumps(_msg(type="upsert")), Code.UNKNOWN_OP),
        (orjson.dumps(_msg(type="heartbeat")), Code.UNKNOWN_OP),
        (orjson.dumps(_msg(database=...)), Code.MISSING_FIELD),
        (orjson.dumps(_msg(table=...)), Code.MISSING_FIELD),
        (orjson.dumps(_msg(database=5)), Code.BAD_FIELD),
        (orjson.dumps(_msg(data=...)), Code.MISSING_FIELD),
        (orjson.dumps(_msg(data=[1, 2])), Code.BAD_FIELD),
        (orjson.dumps(_msg(type="update", old="x")), Code.BAD_FIELD),
        (orjson.dumps(_msg(ts="1700000000")), Code.BAD_FIELD),
        (orjson.dumps(_msg(xid="12")), Code.BAD_FIELD),
        (orjson.dumps(_msg(xid=12, xoffset=1.5)), Code.BAD_FIELD),
        (orjson.dumps(_msg(position="master-000006")), Code.BAD_FIELD),
        (orjson.dumps(_msg(position=6)), Code.BAD_FIELD),
        (orjson.dumps(_msg(primary_key_columns="id")), Code.BAD_FIELD),
        (orjson.dumps(_msg(primary_key_columns=[1])), Code.BAD_FIELD),
        (orjson.dumps({"type": "table-alter", "database": "d", "sql": 5}), Code.BAD_FIELD),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_malformed_messages_dead_letter_with_stable_codes(value, code):
    result = decoder_for(FMT).decode_batch([Record(value=value, origin=Origin("t", 0, 3))])
    assert result.events == [] and [d.code for d in result.dead_letters] == [code]
    assert result.dead_letters[0].value == value


# --------------------------------------------------------------------------- encoder


def test_encoder_numbers_xoffset_inside_a_transaction_and_decodes_back():
    encoder = encoder_for(FMT)
    table = SourceTable("", "shop", "", "items")
    cols = {"id": "int64", "name": "string"}
    changes = [
        SourceChange(
            Op.INSERT,
            table,
            cols,
            ("id",),
            None,
            {"id": i, "name": "n"},
            seq=100 + i,
            ts_ms=1_700_000_000_000,
            txn_id="77",
        )
        for i in range(3)
    ]
    messages = [m for c in changes for m in encoder.encode(c)]
    raw = [orjson.loads(m.value) for m in messages]
    assert [r["xoffset"] for r in raw] == [0, 1, 2] and {r["xid"] for r in raw} == {77}
    assert orjson.loads(messages[0].key) == {"database": "shop", "table": "items", "pk.id": 0}
    events = decoder_for(FMT).decode_batch([Record(m.value, m.key) for m in messages]).events
    assert [e.txn.order for e in events] == [1, 2, 3]
    assert [e.after for e in events] == [c.after for c in changes]


def test_encoder_writes_decimals_as_json_numbers_and_update_old_with_changed_columns():
    encoder = encoder_for(FMT)
    table = SourceTable("", "shop", "", "items")
    cols = {"id": "int64", "price": "decimal(10,2)", "name": "string"}
    before = {"id": 1, "price": decimal.Decimal("12.50"), "name": "a"}
    after = {**before, "price": decimal.Decimal("13.75")}
    [m] = encoder.encode(SourceChange(Op.UPDATE, table, cols, ("id",), before, after, 5, 1000))
    assert b'"price":13.75' in m.value and b'"old":{"price":12.50}' in m.value
    [e] = decoder_for(FMT, {"float_as_decimal": True}).decode(Record(m.value))
    assert e.after["price"] == decimal.Decimal("13.75") and e.changed == ("price",)


_FUZZ_FIELDS = {
    "database",
    "table",
    "type",
    "ts",
    "xid",
    "xoffset",
    "commit",
    "position",
    "primary_key_columns",
    "data",
    "old",
    "server_id",
}


def _fuzz_base():
    return _msg(
        type="update",
        xid=1,
        xoffset=0,
        position="mysql-bin.000001:4",
        data={"id": 1, "name": "b"},
        old={"name": "a"},
    )


def _fuzz_set(msg, field, value):
    msg[field] = value


# --------------------------------------------------------------------------- fuzz

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(_FUZZ_FIELDS)), value=_JSON)
def test_any_value_in_any_field_decodes_or_dead_letters_with_a_format_code(field, value):
    """No field value makes the decoder fail with a bare Python exception (which
    decode_batch would turn into a BAD_FIELD whose message is the exception text)."""
    msg = _fuzz_base()
    _fuzz_set(msg, field, value)
    raw = json.dumps(msg).encode()  # the standard library: integers beyond 64 bits too
    result = decoder_for(FMT, {"primary_keys": {"*": ["id"]}}).decode_batch([Record(raw)])
    assert len(result.events) + len(result.dead_letters) == 1
    for dead in result.dead_letters:
        assert not dead.message.split(" ")[0].endswith(":"), dead.message  # "TypeError: ..."

"""Unit tests of the ``ogg-json`` decoder and encoder (the tricky parts)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for

CORPUS = Path(__file__).parent / "corpus" / "ogg"
FMT = "ogg-json"


def _msg(**fields):
    base = {
        "table": "HR.EMP",
        "op_type": "I",
        "op_ts": "2020-05-13 15:40:06.123456",
        "current_ts": "2020-05-13T15:40:07.000000",
        "pos": "00000000020000001444",
        "primary_keys": ["ID"],
        "after": {"ID": 1, "NAME": "a"},
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not ...}


def _decode(msg, options=None):
    value = msg if isinstance(msg, bytes) else orjson.dumps(msg)
    return decoder_for(FMT, options).decode(Record(value=value, origin=Origin("t", 1, 4)))


def _code(msg, options=None):
    with pytest.raises(DecodeError) as info:
        _decode(msg, options)
    return info.value.code


def test_corpus_replays_to_the_upstream_expected_table():
    expected = json.loads((CORPUS / "paimon-ogg_schemaevolution_ogg.expected.json").read_text())
    decoder, rows = decoder_for(FMT), {}
    for stage in expected["stages"]:
        lines = [Record(x) for x in (CORPUS / stage["file"]).read_bytes().splitlines() if x.strip()]
        result = decoder.decode_batch(lines)
        assert not result.dead_letters
        for e in result.events:  # in file order, as the upstream test feeds them
            if e.op is Op.DELETE:
                rows.pop(e.key["id"])
            else:
                rows[e.key["id"]] = {**rows.get(e.key["id"], {}), **e.after}
        got = sorted(
            (
                {c: None if r.get(c) is None else str(r[c]) for c in stage["columns"]}
                for r in rows.values()
            ),
            key=lambda r: int(r["id"]),
        )
        assert got == stage["final_table"]


def test_insert_update_delete_images_and_key():
    [i] = _decode(_msg())
    [u] = _decode(_msg(op_type="U", before={"ID": 1, "NAME": "a"}, after={"ID": 1, "NAME": "b"}))
    [d] = _decode(_msg(op_type="D", before={"ID": 1, "NAME": "b"}, after=None))
    assert (i.op, i.before, i.after, i.key) == (Op.INSERT, None, {"ID": 1, "NAME": "a"}, {"ID": 1})
    assert (u.op, u.before, u.after, u.key) == (
        Op.UPDATE,
        {"ID": 1, "NAME": "a"},
        {"ID": 1, "NAME": "b"},
        {"ID": 1},
    )
    assert (d.op, d.before, d.after, d.key) == (Op.DELETE, {"ID": 1, "NAME": "b"}, None, {"ID": 1})
    assert i.origin == Origin("t", 1, 4)


def test_compressed_update_keeps_only_the_logged_columns():
    # without GETUPDATEBEFORES and full supplemental logging: key + changed columns
    [u] = _decode(_msg(op_type="U", after={"ID": 1, "SALARY": 10}))
    assert u.before is None and u.after == {"ID": 1, "SALARY": 10} and "NAME" not in u.after


def test_primary_key_update_keys_the_event_by_the_new_key():
    [u] = _decode(_msg(op_type="U", before={"ID": 1, "NAME": "a"}, after={"ID": 2, "NAME": "a"}))
    assert u.key == {"ID": 2} and u.before["ID"] == 1


def test_truncate_has_no_key_and_no_images():
    [t] = _decode(_msg(op_type="T", after=..., primary_keys=...))
    assert t.op is Op.TRUNCATE and t.key is None and t.before is None and t.after is None
    assert t.source.schema == "HR" and t.source.table == "EMP"


@pytest.mark.parametrize(
    "code, op",
    [
        ("INSERT", Op.INSERT),
        ("UPDATE", Op.UPDATE),
        ("DELETE", Op.DELETE),
        ("TRUNCATE", Op.TRUNCATE),
    ],
)
def test_full_op_names(code, op):
    [e] = _decode(
        _msg(op_type=code, before={"ID": 1}, after=None if op is Op.DELETE else {"ID": 1})
    )
    assert e.op is op


def test_custom_op_codes_option():
    [e] = _decode(_msg(op_type="PUT"), {"op_codes": {"PUT": "insert"}})
    assert e.op is Op.INSERT
    assert _code(_msg(op_type="PUT")) == Code.UNKNOWN_OP
    with pytest.raises(ConfigError):
        decoder_for(FMT, {"op_codes": {"PUT": "upsert"}})


@pytest.mark.parametrize(
    "name, parts",
    [
        ("ORCLPDB.HR.EMP", ("ORCLPDB", "HR", "EMP")),
        ("HR.EMP", ("", "HR", "EMP")),
        ("EMP", ("", "", "EMP")),
    ],
)
def test_table_names(name, parts):
    [e] = _decode(_msg(table=name))
    assert (e.source.database, e.source.schema, e.source.table) == parts


def test_seq_is_the_trail_position_in_numeric_order():
    positions = ["00000000010000009999", "00000000020000000012", "00000000020000000100"]
    events = [_decode(_msg(pos=p))[0] for p in positions]
    assert events[0].seq == (10000009999,)
    keys = [seq_key(e.seq) for e in events]
    assert keys == sorted(keys)
    [no_pos] = _decode(_msg(pos=...))
    assert no_pos.seq is None


def test_op_ts_is_read_in_the_configured_zone():
    [utc] = _decode(_msg(op_ts="2020-05-13 15:40:06.123456"))
    assert utc.ts_ms == 1589384406123
    [iso] = _decode(_msg(op_ts="2020-05-13T15:40:06.1"))
    assert iso.ts_ms == 1589384406100
    [whole] = _decode(_msg(op_ts="2020-05-13 15:40:06"))
    assert whole.ts_ms == 1589384406000
    [paris] = _decode(_msg(), {"timestamp_zone": "Europe/Paris"})  # CEST, UTC+2
    assert paris.ts_ms == 1589384406123 - 2 * 3600 * 1000
    with pytest.raises(ConfigError):
        decoder_for(FMT, {"timestamp_zone": "Mars/Olympus"})


def test_transaction_fields():
    [e] = _decode(_msg(xid="0.5.12.1234", csn="3245678", txind="E"))
    assert (e.txn.id, e.txn.last) == ("0.5.12.1234", True)
    assert e.meta["csn"] == "3245678"
    [m] = _decode(_msg(csn="3245678", txind="M"))
    assert (m.txn.id, m.txn.last) == ("3245678", False)
    [w] = _decode(_msg(xid="9", txind=3))
    assert w.txn.last is True
    [n] = _decode(_msg())
    assert n.txn is None


def test_tokens_and_current_ts_go_to_meta():
    [e] = _decode(_msg(tokens={"TK_HOST": "db1"}))
    assert e.meta == {"current_ts": "2020-05-13T15:40:07.000000", "tokens": {"TK_HOST": "db1"}}


def test_is_missing_fields_option():
    after = {
        "ID": 1,
        "ID_isMissing": False,
        "NAME": None,
        "NAME_isMissing": True,
        "NOTE": None,
        "NOTE_isMissing": False,
    }
    [e] = _decode(_msg(op_type="U", after=dict(after)), {"is_missing_fields": True})
    assert e.after == {"ID": 1, "NOTE": None}
    [raw] = _decode(_msg(op_type="U", after=dict(after)))
    assert raw.after == after


def test_keys_from_options_when_the_message_has_none():
    assert _code(_msg(primary_keys=...)) == Code.MISSING_KEY
    [e] = _decode(_msg(primary_keys=...), {"primary_keys": {"HR.EMP": ["NAME"]}})
    assert e.key == {"NAME": "a"}


def test_a_json_value_nested_deeper_than_254_levels_is_bad_value_naming_the_column():
    deep = b"[" * 300 + b"]" * 300  # orjson reads 1024 levels, writes 254
    raw = orjson.dumps(_msg(after={"ID": 1, "DOC": "DEEP"})).replace(b'"DEEP"', deep)
    with pytest.raises(DecodeError) as info:
        _decode(raw)
    assert info.value.code == Code.BAD_VALUE
    assert "'DOC'" in info.value.message and "nested deeper than 254 levels" in info.value.message


def test_json_numbers_beyond_int64_stay_exact():
    raw = orjson.dumps(_msg()).replace(b'"ID":1,', b'"ID":1,"N":-99999999999999999999999,')
    [e] = _decode(raw)
    assert e.after["N"] == -99999999999999999999999


@pytest.mark.parametrize(
    "msg, code",
    [
        (b'{"table":"HR.EMP","op_type":"I"', Code.BAD_JSON),
        (b'"I"', Code.NOT_AN_OBJECT),
        (_msg(op_type=...), Code.MISSING_FIELD),
        (_msg(op_type=1), Code.BAD_FIELD),
        (_msg(op_type="X"), Code.UNKNOWN_OP),
        (_msg(table=...), Code.MISSING_FIELD),
        (_msg(table=["HR", "EMP"]), Code.BAD_FIELD),
        (_msg(after=...), Code.MISSING_FIELD),
        (_msg(op_type="D", after=...), Code.MISSING_FIELD),
        (_msg(op_type="U", after=None), Code.MISSING_FIELD),
        (_msg(after=[1]), Code.BAD_FIELD),
        (_msg(pos="0000-12"), Code.BAD_FIELD),
        (_msg(pos=-1), Code.BAD_FIELD),
        (_msg(op_ts="13/05/2020 15:40"), Code.BAD_FIELD),
        (_msg(op_ts="2020-05-13 15:40:06,5"), Code.BAD_FIELD),
        (_msg(op_ts=1589384406), Code.BAD_FIELD),
        (_msg(primary_keys="ID"), Code.BAD_FIELD),
        (_msg(primary_keys=["NOPE"]), Code.MISSING_KEY),
    ],
)
def test_malformed_messages_dead_letter_with_stable_codes(msg, code):
    value = msg if isinstance(msg, bytes) else orjson.dumps(msg)
    result = decoder_for(FMT).decode_batch([Record(value=value)])
    assert result.events == [] and [d.code for d in result.dead_letters] == [code]


def test_encoder_writes_fixed_width_positions_and_full_images():
    encoder = encoder_for(FMT)
    table = SourceTable("", "", "HR", "EMP")
    cols = {"ID": "int64", "NAME": "string"}
    before, after = {"ID": 1, "NAME": "a"}, {"ID": 1, "NAME": "b"}
    [m] = encoder.encode(
        SourceChange(
            Op.UPDATE,
            table,
            cols,
            ("ID",),
            before,
            after,
            seq=1444,
            ts_ms=1589384406123,
            txn_id="t1",
        )
    )
    raw = orjson.loads(m.value)
    assert raw["pos"] == "00000000000000001444" and raw["op_ts"] == "2020-05-13 15:40:06.123000"
    assert raw["table"] == "HR.EMP" and raw["before"] == before and raw["after"] == after
    [e] = decoder_for(FMT).decode(Record(m.value))
    assert (e.seq, e.ts_ms, e.txn.id, e.before, e.after) == (
        (1444,),
        1589384406123,
        "t1",
        before,
        after,
    )


_FUZZ_FIELDS = {
    "table",
    "op_type",
    "op_ts",
    "current_ts",
    "pos",
    "primary_keys",
    "before",
    "after",
    "xid",
    "csn",
    "txind",
    "tokens",
}


def _fuzz_base():
    return _msg(
        op_type="U",
        primary_keys=["id"],
        xid="1",
        txind="E",
        before={"id": 1, "name": "a"},
        after={"id": 1, "name": "b"},
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

"""Unit tests of the ``aws-dms-json`` decoder and encoder (the tricky parts)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, DecodeError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for

CORPUS = Path(__file__).parent / "corpus" / "aws_dms"
FMT = "aws-dms-json"
KEYS = {"primary_keys": {"*": ["id"]}}


def _msg(data=..., **metadata):
    md = {
        "timestamp": "2024-07-29T00:58:17.983670Z",
        "record-type": "data",
        "operation": "insert",
        "partition-key-type": "schema-table",
        "schema-name": "public",
        "table-name": "foo",
    }
    md.update(metadata)
    msg = {
        "data": {"id": 1, "name": "a"} if data is ... else data,
        "metadata": {k: v for k, v in md.items() if v is not ...},
    }
    return msg


def _records(*msgs):
    return [
        Record(value=m if isinstance(m, bytes) else orjson.dumps(m), origin=Origin("t", 0, i))
        for i, m in enumerate(msgs)
    ]


def _decode(msg, options=KEYS):
    [record] = _records(msg)
    return decoder_for(FMT, options).decode(record)


def _code(msg, options=KEYS):
    with pytest.raises(DecodeError) as info:
        _decode(msg, options)
    return info.value.code


def test_corpus_replays_to_the_upstream_expected_table():
    expected = json.loads(
        (CORPUS / "paimon-aws-dms_schemaevolution_aws-dms.expected.json").read_text()
    )
    decoder, rows = decoder_for(FMT, KEYS), {}
    for stage in expected["stages"]:
        lines = [Record(x) for x in (CORPUS / stage["file"]).read_bytes().splitlines() if x.strip()]
        result = decoder.decode_batch(lines)
        assert not result.dead_letters
        for e in result.events:
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


def test_load_is_a_snapshot_without_transaction():
    [e] = _decode(_msg(operation="load", **{"partition-key-type": "primary-key"}))
    assert e.op is Op.SNAPSHOT and e.txn is None and e.after == {"id": 1, "name": "a"}
    assert (e.source.schema, e.source.table) == ("public", "foo")


def test_seq_is_the_dms_timestamp_and_ts_ms_the_commit_timestamp():
    [e] = _decode(
        _msg(
            **{
                "commit-timestamp": "2024-07-29T00:58:17.974340Z",
                "transaction-id": 1139,
                "transaction-record-id": 2,
            }
        )
    )
    assert e.seq == (1722214697983670,)
    assert e.ts_ms == 1722214697974
    assert (e.txn.id, e.txn.order, e.txn.last) == ("1139", 2, None)
    [f] = _decode(_msg(timestamp="2024-07-29T00:58:17Z"))
    assert f.seq == (1722214697000000,) and f.ts_ms == 1722214697000


def test_timestamps_order_records_as_dms_wrote_them():
    stamps = [
        "2024-07-29T00:58:17.983670Z",
        "2024-07-29T00:58:17.983671Z",
        "2024-07-29T00:58:18.000001Z",
        "2024-07-29T01:00:00.5Z",
    ]
    keys = [seq_key(_decode(_msg(timestamp=s))[0].seq) for s in stamps]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_bi_columns_are_the_before_image_of_an_update():
    [e] = _decode(_msg(operation="update", data={"id": 5, "name": "b", "BI_id": 5, "BI_name": "a"}))
    assert e.before == {"id": 5, "name": "a"} and e.after == {"id": 5, "name": "b"}
    # a custom prefix, and the rule turned off for tables with real BI_ columns
    [c] = _decode(
        _msg(operation="update", data={"id": 5, "old_id": 4}),
        {**KEYS, "before_image_prefix": "old_"},
    )
    assert c.before == {"id": 4} and c.after == {"id": 5}
    [off] = _decode(
        _msg(operation="update", data={"id": 5, "BI_x": 1}), {**KEYS, "before_image_prefix": ""}
    )
    assert off.before is None and off.after == {"id": 5, "BI_x": 1}


def test_bi_columns_of_inserts_are_not_row_columns():
    [e] = _decode(_msg(data={"id": 5, "name": "b", "BI_id": None, "BI_name": None}))
    assert e.after == {"id": 5, "name": "b"} and e.before is None


def test_before_image_settings_object():
    [e] = _decode(
        {**_msg(operation="update", data={"id": 45, "name": "b"}), "before-image": {"id": 46}}
    )
    assert e.before == {"id": 46} and e.key == {"id": 45}
    [empty] = _decode({**_msg(operation="update"), "before-image": {}})
    assert empty.before is None
    [named] = _decode(
        {**_msg(operation="update"), "bi": {"id": 1, "name": "z"}},
        {**KEYS, "before_image_fields": ["bi"]},
    )
    assert named.before == {"id": 1, "name": "z"}


def test_column_in_before_image_but_left_out_of_data_became_null():
    msg = {**_msg(operation="update", data={"id": 1}), "before-image": {"id": 1, "name": "a"}}
    [e] = _decode(msg)
    assert e.after == {"id": 1, "name": None}
    [kept] = _decode(msg, {**KEYS, "infer_nulls_from_before": False})
    assert kept.after == {"id": 1}


def test_delete_before_image_is_the_data():
    [e] = _decode(_msg(operation="delete", data={"id": 45, "name": None}))
    assert e.op is Op.DELETE and e.before == {"id": 45, "name": None} and e.after is None


def test_create_table_control_record_names_the_key_for_later_rows():
    control = {
        "control": {
            "table-def": {
                "columns": {
                    "id": {"nullable": False, "type": "INT32"},
                    "name": {"nullable": True, "type": "STRING"},
                },
                "primary-key": ["id"],
            }
        },
        "metadata": {
            "timestamp": "2024-07-29T00:30:47.266581Z",
            "record-type": "control",
            "operation": "create-table",
            "partition-key-type": "task-id",
            "schema-name": "public",
            "table-name": "foo",
        },
    }
    result = decoder_for(FMT).decode_batch(_records(control, _msg(), _msg(**{"table-name": "bar"})))
    ddl, row = result.events
    assert ddl.op is Op.DDL and ddl.ddl is None and ddl.key is None
    assert ddl.meta["operation"] == "create-table" and ddl.meta["control"] == control["control"]
    assert ddl.seq == (1722213047266581,)
    assert row.key == {"id": 1}
    assert [d.code for d in result.dead_letters] == [Code.MISSING_KEY]  # other table


def test_control_records_without_details():
    [e] = _decode(
        {
            "metadata": {
                "timestamp": "2024-07-29T00:30:47.258815Z",
                "record-type": "control",
                "operation": "drop-table",
                "schema-name": "public",
                "table-name": "foo",
            }
        }
    )
    assert e.op is Op.DDL and e.meta == {"operation": "drop-table"}


def test_transaction_details_go_to_meta():
    [e] = _decode(
        _msg(
            **{
                "transaction-id": 1140,
                "transaction-record-id": 1,
                "prev-transaction-id": 1139,
                "prev-transaction-record-id": 1,
                "stream-position": "00000002/7C007328.2.00000002/7C007328",
            }
        )
    )
    assert e.meta == {
        "transaction-record-id": 1,
        "prev-transaction-id": 1139,
        "prev-transaction-record-id": 1,
        "stream-position": "00000002/7C007328.2.00000002/7C007328",
    }


@pytest.mark.parametrize("record_id", [2**63, 2**64 - 1])
def test_transaction_record_id_beyond_int64_is_bad_field_naming_the_range(record_id):
    msg = _msg(**{"transaction-id": 1140, "transaction-record-id": 1})
    raw = orjson.dumps(msg).replace(
        b'"transaction-record-id":1', b'"transaction-record-id":%d' % record_id
    )
    with pytest.raises(DecodeError) as info:
        _decode(raw)
    assert info.value.code == Code.BAD_FIELD
    assert "transaction-record-id" in info.value.message
    assert "-9223372036854775808..9223372036854775807" in info.value.message
    [e] = _decode(_msg(**{"transaction-id": 1140, "transaction-record-id": 2**63 - 1}))
    assert e.txn.order == 2**63 - 1


def test_a_json_value_nested_deeper_than_254_levels_is_bad_value_naming_the_column():
    deep = b"[" * 300 + b"]" * 300  # orjson reads 1024 levels, writes 254
    raw = orjson.dumps(_msg(data={"id": 1, "doc": "DEEP"})).replace(b'"DEEP"', deep)
    with pytest.raises(DecodeError) as info:
        _decode(raw)
    assert info.value.code == Code.BAD_VALUE
    assert "'doc'" in info.value.message and "nested deeper than 254 levels" in info.value.message


def test_json_numbers_beyond_int64_stay_exact():
    raw = orjson.dumps(_msg()).replace(b'"id":1,', b'"id":1,"n":123456789012345678901234,')
    [e] = _decode(raw)
    assert e.after["n"] == 123456789012345678901234


@pytest.mark.parametrize(
    "msg, code",
    [
        (b'{"data":{"id":1},"metadata":{"timestamp"', Code.BAD_JSON),
        (b"[]", Code.NOT_AN_OBJECT),
        ({"data": {"id": 1}}, Code.MISSING_FIELD),
        ({"data": {"id": 1}, "metadata": "x"}, Code.BAD_FIELD),
        (_msg(operation=...), Code.MISSING_FIELD),
        (_msg(**{"record-type": ...}), Code.MISSING_FIELD),
        (_msg(operation=["insert"]), Code.BAD_FIELD),
        (_msg(operation="upsert"), Code.UNKNOWN_OP),
        (_msg(**{"record-type": "heartbeat"}), Code.UNKNOWN_OP),
        (_msg(**{"record-type": "control", "operation": "truncate-everything"}), Code.UNKNOWN_OP),
        (_msg(**{"schema-name": ...}), Code.MISSING_FIELD),
        (_msg(**{"table-name": 7}), Code.BAD_FIELD),
        (_msg(timestamp=...), Code.MISSING_FIELD),
        (_msg(timestamp="yesterday"), Code.BAD_FIELD),
        (_msg(timestamp="2024-07-29T00:58:17,5Z"), Code.BAD_FIELD),
        (_msg(**{"commit-timestamp": 17}), Code.BAD_FIELD),
        (_msg(data=None), Code.MISSING_FIELD),
        (_msg(data=[1]), Code.BAD_FIELD),
        ({**_msg(operation="update"), "before-image": [1]}, Code.BAD_FIELD),
        (_msg(data={"name": "no id"}), Code.MISSING_KEY),
    ],
)
def test_malformed_records_dead_letter_with_stable_codes(msg, code):
    result = decoder_for(FMT, KEYS).decode_batch(_records(msg))
    assert result.events == [] and [d.code for d in result.dead_letters] == [code]


def test_encoder_clock_strictly_increases_within_one_millisecond():
    encoder = encoder_for(FMT)
    table = SourceTable("", "shop", "public", "items")
    cols = {"id": "int64", "name": "string"}
    changes = [
        SourceChange(
            Op.INSERT,
            table,
            cols,
            ("id",),
            None,
            {"id": i, "name": "x"},
            seq=i,
            ts_ms=1_700_000_000_000,
            txn_id="9",
        )
        for i in range(3)
    ]
    messages = [m for c in changes for m in encoder.encode(c)]
    assert len(messages) == 4  # the table starts with a create-table control record
    result = decoder_for(FMT).decode_batch(_records(*[m.value for m in messages]))
    rows = [e for e in result.events if e.op is Op.INSERT]
    assert [e.key for e in rows] == [{"id": 0}, {"id": 1}, {"id": 2}]
    assert [e.txn.order for e in rows] == [1, 2, 3]
    seqs = [e.seq for e in result.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    assert {e.ts_ms for e in rows} == {1_700_000_000_000}


_FUZZ_FIELDS = {
    "data",
    "before-image",
    "control",
    "timestamp",
    "record-type",
    "operation",
    "schema-name",
    "table-name",
    "transaction-id",
    "transaction-record-id",
    "commit-timestamp",
    "stream-position",
}


def _fuzz_base():
    return {
        **_msg(
            operation="update",
            data={"id": 1, "name": "b", "BI_name": "a"},
            **{"transaction-id": 1, "commit-timestamp": "2024-07-29T00:58:17.9Z"},
        ),
        "before-image": {"id": 1},
    }


def _fuzz_set(msg, field, value):
    if field in ("data", "before-image", "control"):
        msg[field] = value
    else:
        msg["metadata"][field] = value


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

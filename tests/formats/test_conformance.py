"""One conformance suite, run against every registered format.

Each format must: skip a Kafka tombstone on purpose; dead-letter garbage, truncated and
wrong-shape input with a stable code (never raise); decode deterministically; and decode
what its own encoder produced back into the change it encoded (round trip).
"""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import replace

import pytest

from cdcflow.errors import Code
from cdcflow.formats import decoder_for, embedded_formats
from cdcflow.formats.base import DecoderOptions, Record
from cdcflow.model import Op, Origin, SourceTable, seq_key
from cdcflow_testkit.encoders import SourceChange, encoder_for

FORMATS = embedded_formats()
KNOWN_CODES = set(Code)

COLUMNS = {
    "id": "int64",
    "name": "string",
    "price": "decimal(10,2)",
    "active": "boolean",
    "score": "float64",
    "born": "date",
    "updated_at": "timestamptz",
    "blob": "binary",
}
TABLE = SourceTable(format="", database="shop", schema="public", table="items")
ROW_1 = {
    "id": 1,
    "name": "scooter",
    "price": decimal.Decimal("12.50"),
    "active": True,
    "score": 0.25,
    "born": dt.date(2020, 2, 29),
    "updated_at": dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC),
    "blob": b"\x00\x01\xff",
}
ROW_2 = {**ROW_1, "name": "scooter 2", "price": decimal.Decimal("13.75"), "active": False}


def _records(messages, start=0):
    return [
        Record(value=m.value, key=m.key, headers=m.headers, origin=Origin("t", 0, start + i))
        for i, m in enumerate(messages)
    ]


def _base(logical_type: str) -> str:
    return "decimal" if logical_type.startswith("decimal(") else logical_type


def _restrict(row, exact):
    """Only the columns whose types the format carries exactly."""
    if row is None:
        return None
    return {c: v for c, v in row.items() if _base(COLUMNS[c]) in exact or COLUMNS[c] in exact}


def _change(op, before, after, seq, exact):
    columns = {c: t for c, t in COLUMNS.items() if _base(t) in exact or t in exact}
    return SourceChange(
        op=op,
        table=TABLE,
        columns=columns,
        key_columns=("id",),
        before=_restrict(before, exact),
        after=_restrict(after, exact),
        seq=seq,
        ts_ms=1_700_000_000_000 + seq,
    )


@pytest.fixture(params=FORMATS)
def fmt(request):
    return request.param


def test_tombstone_is_skipped_on_purpose(fmt):
    result = decoder_for(fmt).decode_batch([Record(value=None, origin=Origin("t", 0, 7))])
    assert result.events == [] and result.dead_letters == []
    assert [s.reason for s in result.skipped] == ["TOMBSTONE"]


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\xff\xfe\x00garbage",
        b"{",
        b"[1, 2, 3]",
        b"42",
        b'"text"',
        b"{}",
        b'{"a": {"b": null}}',
    ],
    ids=[
        "empty",
        "binary",
        "truncated",
        "array",
        "number",
        "string",
        "empty-object",
        "wrong-shape",
    ],
)
def test_bad_input_becomes_a_dead_letter_with_a_stable_code(fmt, value):
    result = decoder_for(fmt).decode_batch([Record(value=value, origin=Origin("t", 3, 9))])
    assert result.events == []
    assert len(result.dead_letters) == 1, (result.skipped, result.dead_letters)
    dead = result.dead_letters[0]
    assert dead.code in KNOWN_CODES
    assert dead.value == value and dead.origin == Origin("t", 3, 9) and dead.format == fmt
    assert dead.message


def test_the_options_every_format_takes_can_be_given_as_plain_decoder_options(fmt):
    """``decoder_for(fmt, DecoderOptions(...))``: the common options (here ``max_columns``)
    carry over into the format's own options class, whose own options keep their defaults."""
    decoder = decoder_for(fmt, DecoderOptions(max_columns=3))
    assert type(decoder.options) is decoder.options_class
    assert decoder.options.max_columns == 3
    assert decoder.options == replace(decoder.options_class(), max_columns=3)


def test_round_trip_through_the_formats_own_encoder(fmt):
    encoder = encoder_for(fmt)
    exact = encoder.exact_types
    assert {"int64", "string"} <= exact, "every format must carry integers and text"
    changes = [
        _change(Op.INSERT, None, ROW_1, 10, exact),
        _change(Op.UPDATE, ROW_1, ROW_2, 11, exact),
        _change(Op.DELETE, ROW_2, None, 12, exact),
    ]
    messages = [m for c in changes for m in encoder.encode(c)]
    decoder = decoder_for(fmt, encoder.decoder_options(changes))
    result = decoder.decode_batch(_records(messages))
    assert result.dead_letters == [] and result.skipped == []
    rows = [e for e in result.events if e.op in (Op.INSERT, Op.UPDATE, Op.DELETE)]
    assert [e.op for e in rows] == [Op.INSERT, Op.UPDATE, Op.DELETE]
    assert all(e.key == {"id": 1} for e in rows)
    assert all(
        e.source.table == "items" and e.source.format == getattr(encoder, "event_format", fmt)
        for e in rows
    )
    assert rows[0].after == _restrict(ROW_1, exact)
    assert rows[1].after == _restrict(ROW_2, exact)
    assert rows[2].after is None
    # the source order survives encoding: sequences strictly increase
    keys = [seq_key(e.seq) for e in rows]
    assert None not in keys and keys == sorted(keys) and len(set(keys)) == 3


def test_decoding_is_deterministic(fmt):
    encoder = encoder_for(fmt)
    changes = [_change(Op.INSERT, None, ROW_1, 5, encoder.exact_types)]
    messages = encoder.encode(changes[0])
    options = encoder.decoder_options(changes)
    a = decoder_for(fmt, options).decode_batch(_records(messages))
    b = decoder_for(fmt, options).decode_batch(_records(messages))
    assert a.events == b.events and a.events

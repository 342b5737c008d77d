from __future__ import annotations

import datetime as dt
import decimal

import orjson
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.formats.base import Record, new_record
from cdcflow.model import Origin, dumps, new_origin, seq_key, seq_keys
from cdcflow.types import to_decimal

ints = st.integers(min_value=-(10**30), max_value=10**45)


@given(st.lists(ints, max_size=4), st.lists(ints, max_size=4))
def test_seq_key_orders_like_the_tuples(a, b):
    a, b = tuple(a), tuple(b)
    assert (seq_key(a) < seq_key(b)) == (a < b)
    assert (seq_key(a) == seq_key(b)) == (a == b)


def test_canonical_json_values():
    row = {
        "d": decimal.Decimal("-12.50"),
        "b": b"\x00\xff",
        "day": dt.date(2020, 2, 29),
        "at": dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC),
        "t": dt.time(1, 2, 3, 4),
        "big": 18446744073709551615,
        "huge": 10**30,
        "neg": -(10**25),
    }
    assert orjson.loads(dumps(row)) == {
        "d": "-12.50",
        "b": "AP8=",
        "day": "2020-02-29",
        "at": "2024-05-06T07:08:09.123456+00:00",
        "t": "01:02:03.000004",
        "big": 18446744073709551615,
        "huge": "1000000000000000000000000000000",
        "neg": "-10000000000000000000000000",
    }


def test_wide_decimals_quantize_exactly():
    assert to_decimal("1234567890123456789012345678901234567.123", "c", scale=3) == decimal.Decimal(
        "1234567890123456789012345678901234567.123"
    )


_PART = st.one_of(
    st.integers(min_value=0, max_value=2**63 - 1),
    st.integers(min_value=-(2**70), max_value=2**70),  # negative and beyond int64: one by one
)


@given(
    st.one_of(
        # the batch-wide path: many sequences of one length, non-negative int64 parts
        st.integers(min_value=1, max_value=4).flatmap(
            lambda n: st.lists(
                st.tuples(*[st.integers(min_value=0, max_value=2**63 - 1)] * n),
                min_size=64,
                max_size=200,
            )
        ),
        # anything else: ragged, None, negative, huge, short batches
        st.lists(st.one_of(st.none(), st.lists(_PART, max_size=4).map(tuple)), max_size=120),
    )
)
def test_seq_keys_equals_seq_key_one_by_one(seqs):
    assert seq_keys(seqs) == [seq_key(s) for s in seqs]


def test_seq_keys_takes_the_batch_path_for_uniform_sequences():
    # 10**18 and 9 digits: the two-digit length prefix comes from the Arrow lookup
    seqs = [(i, 10**18 + i, 123456789) for i in range(100)]
    assert seq_keys(seqs)[7] == "017.191000000000000000007.09123456789"
    assert seq_keys(seqs) == [seq_key(s) for s in seqs]


@given(
    st.one_of(st.none(), st.binary(max_size=8)),
    st.one_of(st.none(), st.binary(max_size=8)),
    st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=4)))).map(
        tuple
    ),
    st.text(max_size=8),
    st.integers(min_value=0, max_value=2**31),
    st.integers(min_value=0, max_value=2**63),
    st.one_of(st.none(), st.integers()),
)
def test_fast_builders_give_the_constructors_objects(value, key, headers, topic, part, off, ts):
    origin = new_origin(topic, part, off)
    assert origin == Origin(topic, part, off)
    assert hash(origin) == hash(Origin(topic, part, off))
    record = new_record(value, key, headers, origin, ts)
    want = Record(
        value=value, key=key, headers=headers, origin=Origin(topic, part, off), timestamp_ms=ts
    )
    assert record == want
    assert repr(record) == repr(want)

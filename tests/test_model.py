from __future__ import annotations

import datetime as dt
import decimal

import orjson
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.model import dumps, seq_key
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

"""Unit tests of the value coercions the decoders share (``cdcflow.types``): integer
text, range errors and JSON text of nested values."""

from __future__ import annotations

import decimal

import pytest

from cdcflow.errors import Code, DecodeError
from cdcflow.types import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    field_range_error,
    int_range_error,
    json_text,
    to_int,
)

# --------------------------------------------------------------------------- to_int


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None),
        (42, 42),
        (-(2**70), -(2**70)),  # any size: ranges are the caller's (int32, int64, ...)
        (3.0, 3),
        ("0", 0),
        ("-42", -42),
        ("+7", 7),
        ("007", 7),
        ("18446744073709551615", 2**64 - 1),
    ],
)
def test_to_int_takes_integers_integral_floats_and_sign_plus_ascii_digits(value, want):
    got = to_int(value, "c")
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize(
    "value",
    [
        " 42",  # surrounding spaces: int() strips them
        "42 ",
        "\t42\n",
        "1_000",  # digit separators: int() takes them
        "٤٢",  # Arabic-Indic digits: int() reads any script's decimal digits
        "４２",  # full-width digits
        "42.0",  # decimal text
        "1e3",
        "0x2a",
        "",
        "-",
        "+-1",
        "NaN",
        1.5,
        float("inf"),
        True,
        decimal.Decimal("1"),
        [1],
    ],
)
def test_to_int_refuses_anything_else_as_bad_value_naming_the_column(value):
    with pytest.raises(DecodeError) as info:
        to_int(value, "qty")
    assert info.value.code == Code.BAD_VALUE
    assert "'qty'" in info.value.message and "integer" in info.value.message


# --------------------------------------------------------------------------- range errors


def test_int_range_error_names_column_value_and_range():
    err = int_range_error("qty", INT32_MAX + 1, "int32")
    assert err.code == Code.BAD_VALUE
    assert err.message == (
        f"column 'qty': {INT32_MAX + 1} is outside the int32 range {INT32_MIN}..{INT32_MAX}"
    )
    err = int_range_error("id", 10**100, "int64")
    assert f"int64 range {INT64_MIN}..{INT64_MAX}" in err.message
    assert len(err.message) < 200  # a huge value is shortened


def test_field_range_error_names_field_range_and_meaning():
    err = field_range_error("es", 2**63, INT64_MIN, INT64_MAX, "epoch milliseconds")
    assert err.code == Code.BAD_FIELD
    assert err.message == (
        f"field 'es': {2**63} is outside the valid range {INT64_MIN}..{INT64_MAX} "
        "(epoch milliseconds)"
    )
    assert field_range_error("x", 5, 0, 1, "a flag", Code.BAD_VALUE).code == Code.BAD_VALUE


# --------------------------------------------------------------------------- json_text


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ({"a": [1, None, True, "é"]}, '{"a":[1,null,true,"é"]}'),
        ([], "[]"),
        ([0.5, 1e300], "[0.5,1e+300]"),
        # float_as_decimal parses: Decimal numbers are written as published
        ({"p": decimal.Decimal("12.50")}, '{"p":12.50}'),
        # exact parses: integers beyond 64 bits are written exactly
        ([2**64, {"n": -(2**70)}, 1.5], f'[{2**64},{{"n":{-(2**70)}}},1.5]'),
        ([2**64, decimal.Decimal("0.10"), "x"], f'[{2**64},0.10,"x"]'),
    ],
)
def test_json_text_is_compact_json_with_exact_numbers(value, want):
    assert json_text(value, "c") == want


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_json_text_writes_254_levels_and_refuses_255_naming_the_column():
    assert json_text(_nested(254), "doc") == "[" * 254 + "]" * 254
    with pytest.raises(DecodeError) as info:
        json_text(_nested(255), "doc")
    assert info.value.code == Code.BAD_VALUE
    assert "'doc'" in info.value.message
    assert "nested deeper than 254 levels" in info.value.message

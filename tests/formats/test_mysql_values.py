"""The shared reading of MySQL values printed as text (formats/common/mysql_values.py)."""

from __future__ import annotations

import datetime as dt
import pickle
from decimal import Decimal as D

import pytest

from cdcflow.errors import Code, DecodeError
from cdcflow.formats.common.mysql_values import (
    bit_type,
    boolean_text,
    date_text,
    datetime_text,
    decimal_json,
    decimal_text,
    enum_labels,
    enum_text,
    hex_text,
    integer_type,
    is_zero_date,
    latin1_text,
    set_text,
    time_text,
    timestamp_text,
    unsigned_bigint_text,
    zero_date_parts,
)

UTC = dt.UTC
PLUS8 = dt.timezone(dt.timedelta(hours=8))


def bad(conv, value, *args):
    with pytest.raises(DecodeError) as info:
        conv(value, "c", *args)
    assert info.value.code == Code.BAD_VALUE
    assert "'c'" in str(info.value)
    return str(info.value)


# --------------------------------------------------------------------------- zero dates


@pytest.mark.parametrize(
    "text",
    [
        "0000-00-00",
        "0000-00-00 00:00:00",
        "2020-00-00",
        "2020-01-00",
        "2020-00-15",
        "0000-01-01",
        "2020-00-00 10:00:00.5",
        "2020-01-00T10:00:00",
    ],
)
def test_any_zero_part_is_a_zero_date_and_reads_as_null(text):
    assert is_zero_date(text)
    conv = date_text if len(text) == 10 else datetime_text
    assert conv(text, "c") is None
    assert timestamp_text(UTC)(text, "c") is None


@pytest.mark.parametrize(
    "text", ["2020-01-01", "2020-10-10 00:00:00", "20200000", "2020-0-00", "2020-00-00x", "", None]
)
def test_other_text_is_no_zero_date(text):
    assert not is_zero_date(text)


@pytest.mark.parametrize(
    ("parts", "zero"),
    [((0, 0, 0), True), ((2020, 0, 0), True), ((2020, 1, 0), True), ((2020, 1, 1), False)],
)
def test_zero_date_parts(parts, zero):
    assert zero_date_parts(*parts) is zero


def test_a_date_that_is_no_date_is_bad_value():
    assert "date (yyyy-mm-dd)" in bad(date_text, "2020-13-01")
    bad(date_text, "2020-02-30")
    bad(date_text, 20200101)
    bad(datetime_text, "yesterday")


# --------------------------------------------------------------------------- date-times


def test_datetime_is_the_wall_clock_as_printed():
    assert datetime_text("2024-01-31 10:00:00", "c") == dt.datetime(2024, 1, 31, 10)
    assert datetime_text("2024-01-31 10:00:00.5", "c") == dt.datetime(2024, 1, 31, 10, 0, 0, 500000)


def test_datetime_with_an_offset_is_its_utc_wall_clock():
    assert datetime_text("2024-01-31 10:00:00+08:00", "c") == dt.datetime(2024, 1, 31, 2)
    assert datetime_text("2024-01-31T10:00:00Z", "c") == dt.datetime(2024, 1, 31, 10)
    assert datetime_text("2024-01-01 01:00:00+02:00", "c") == dt.datetime(2023, 12, 31, 23)


def test_fractional_digits_past_the_microsecond_are_cut_not_rounded():
    got = datetime_text("2024-01-31 10:00:00.123456789", "c")
    assert got == dt.datetime(2024, 1, 31, 10, 0, 0, 123456)
    assert time_text("10:00:00.9999999", "c") == dt.time(10, 0, 0, 999999)


def test_timestamp_is_read_in_its_zone_and_an_offset_wins():
    conv = timestamp_text(PLUS8)
    assert conv("2024-01-31 10:00:00", "c") == dt.datetime(2024, 1, 31, 2, tzinfo=UTC)
    assert conv("2024-01-31 10:00:00+00:00", "c") == dt.datetime(2024, 1, 31, 10, tzinfo=UTC)
    assert conv("2024-01-31 10:00:00", "c").tzinfo is UTC
    assert pickle.loads(pickle.dumps(conv))("2024-01-31 10:00:00", "c") == conv(
        "2024-01-31 10:00:00", "c"
    )
    bad(conv, "1.2.3")


def test_time_is_a_time_of_day_and_a_duration_is_bad_value_with_the_hint():
    assert time_text("23:59:59.000001", "c") == dt.time(23, 59, 59, 1)
    message = bad(time_text, "838:59:59", "; see option x")
    assert message.endswith("; see option x")
    bad(time_text, "-01:00:00")


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("value", "want"),
    [("1", True), ("0", False), (1, True), (0, False), (True, True), (False, False)]
    + [("\x01", True), ("\x00", False), ("true", True), ("false", False)],
)
def test_boolean_spellings(value, want):
    assert boolean_text(value, "c") is want


@pytest.mark.parametrize("value", ["2", "-1", 2, "yes", "", 1.0])
def test_a_tinyint1_holding_another_number_is_bad_value(value):
    assert "boolean (0 or 1)" in bad(boolean_text, value)


def test_decimal_is_exact_and_a_json_float_is_refused_where_writers_write_text():
    assert decimal_text("9874510357.10", "c") == D("9874510357.10")
    assert str(decimal_text("1.10", "c")) == "1.10"
    assert decimal_text(7, "c") == D(7)
    for value in ("NaN", "Infinity", "x", ""):
        bad(decimal_text, value)
    assert "JSON float" in bad(decimal_text, 1.25)
    assert decimal_json(1.25, "c") == D("1.25")
    assert decimal_json("1.25", "c") == D("1.25")
    bad(decimal_json, "NaN")


def test_unsigned_bigint_holds_0_to_2_pow_64_minus_1():
    assert unsigned_bigint_text("18446744073709551615", "c") == D(18446744073709551615)
    assert unsigned_bigint_text("0", "c") == D(0)
    for value in ("18446744073709551616", "-1", "1.5"):
        bad(unsigned_bigint_text, value)


@pytest.mark.parametrize(
    ("base", "unsigned", "logical"),
    [
        ("tinyint", True, "int32"),
        ("smallint", True, "int32"),
        ("mediumint", True, "int32"),
        ("int", False, "int32"),
        ("int", True, "int64"),
        ("integer", True, "int64"),
        ("bigint", False, "int64"),
        ("bigint", True, "decimal(20,0)"),
        ("serial", False, "decimal(20,0)"),
    ],
)
def test_integer_types(base, unsigned, logical):
    assert integer_type(base, unsigned)[0] == logical


def test_integer_converters_check_their_range():
    _, conv = integer_type("int", True)
    assert conv("4294967295", "c") == 4294967295
    _, conv = integer_type("int", False)
    bad(conv, "2147483648")


@pytest.mark.parametrize(
    ("width", "logical", "text", "want"),
    [
        (1, "boolean", "1", True),
        (8, "int64", "255", 255),
        (63, "int64", str(2**63 - 1), 2**63 - 1),
        (64, "decimal(20,0)", str(2**64 - 1), D(2**64 - 1)),
    ],
)
def test_bit_by_width(width, logical, text, want):
    got_logical, conv = bit_type(width)
    assert got_logical == logical
    assert conv(text, "c") == want


# --------------------------------------------------------------------------- ENUM, SET, binary


def test_enum_and_set_by_index_and_by_label():
    labels = enum_labels("'a','it''s','C'")
    assert labels == ("a", "it's", "C")
    by_index = enum_text(labels, by_index=True)
    assert [by_index(v, "c") for v in ("1", "2", 3, "0", "a")] == ["a", "it's", "C", "", "a"]
    bad(by_index, "4")
    assert enum_text(labels, by_index=False)("2", "c") == "2"
    members = set_text(labels, by_index=True)
    assert [members(v, "c") for v in ("5", "0", "a,C")] == ["a,C", "", "a,C"]
    bad(members, "8")


def test_binary_text():
    assert latin1_text("\x00\xffj", "c") == b"\x00\xffj"
    bad(latin1_text, "\u20ac")
    assert hex_text("00ff6a", "c") == b"\x00\xffj"
    bad(hex_text, "xyz")

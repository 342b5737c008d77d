"""The expression language of computed columns and row filters (cdcflow.transform.expressions)."""

from __future__ import annotations

import datetime as dt
import pickle
from decimal import Decimal

import pyarrow as pa
import pytest

from cdcflow.transform.expressions import (
    Expression,
    ExpressionError,
    parse_expression,
    parse_filter,
)

UTC = dt.UTC

TABLE = pa.table(
    {
        "id": pa.array([1, 2, 3, None], pa.int32()),
        "big": pa.array([10, -20, 2**40, None], pa.int64()),
        "amount": pa.array([10.5, 200.0, None, -0.5]),
        "price": pa.array(
            [Decimal("14.20"), None, Decimal("-1.25"), Decimal("0.00")], pa.decimal128(9, 2)
        ),
        "status": pa.array(["ok", "test", None, "o'k"]),
        "code": pa.array(["1", "abc", "3", None]),
        "name": pa.array(["  Héllo ", "x", None, ""]),
        "flag": pa.array([True, False, None, True]),
        "d": pa.array([dt.date(2024, 1, 31), dt.date(2017, 11, 16), None, dt.date(1969, 12, 31)]),
        "ts": pa.array(
            [dt.datetime(2024, 1, 31, 23, 30), None, dt.datetime(1969, 12, 31, 23), None],
            pa.timestamp("us"),
        ),
        "tstz": pa.array(
            [dt.datetime(2024, 1, 31, 23, 30, tzinfo=UTC), None, None, None],
            pa.timestamp("us", tz="UTC"),
        ),
        "raw": pa.array([b"\x00\x01\x02\x03", None, b"", b"x"], pa.binary()),
        "odd name": pa.array(["a", "b", "c", "d"]),
    }
)


def values(text: str, table: pa.Table = TABLE) -> list:
    return parse_expression(text).evaluate(table).to_pylist()


def result_type(text: str, table: pa.Table = TABLE) -> pa.DataType:
    return parse_expression(text).evaluate(table).type


# --------------------------------------------------------------------------- parsing


def test_columns_in_first_use_order_without_duplicates():
    expr = parse_expression("concat(status, `odd name`, code, status) || upper(code)")
    assert expr.columns == ("status", "odd name", "code")
    assert expr.text == "concat(status, `odd name`, code, status) || upper(code)"
    assert parse_expression("1 + 2").columns == ()


def test_keywords_and_functions_any_case_columns_case_sensitive():
    table = TABLE.append_column("Flag", pa.array([None, None, True, True]))
    text = "UPPER(status) = 'OK' and NOT Flag is null"
    assert values(text, table) == [False, False, None, False]
    assert parse_expression("Status").columns == ("Status",)
    with pytest.raises(ExpressionError, match="unknown column 'Status'"):
        parse_expression("Status").evaluate(TABLE)


def test_backquoted_names():
    assert values("`odd name` || `id`") == ["a1", "b2", "c3", None]
    table = pa.table({"a`b": [1], "and": [2], "date": [3]})
    assert values("`a``b` + `and` + date", table) == [6]
    assert parse_expression("`a``b`").columns == ("a`b",)


@pytest.mark.parametrize(
    ("text", "position", "what"),
    [
        ("", 1, "expected a value"),
        ("amount >)", 9, "found ')'"),
        ("amount > 1 AND", 15, "found the end of the expression"),
        ("a = b = c", 7, "comparisons do not chain"),
        ("(a + 1", 7, "expected ')'"),
        ("a b", 3, "expected an operator or the end of the expression, found 'b'"),
        ("'abc", 1, "unterminated string literal"),
        ("`abc", 1, "unterminated quoted name"),
        ("a ? b", 3, "unexpected character '?'"),
        ("1.", 2, "unexpected character '.'"),
        ("foo(x)", 1, "unknown function 'foo'"),
        ("upper(a, b)", 1, "upper() takes 1 argument, got 2"),
        ("substring(s)", 1, "substring() takes 2 to 3 arguments, got 1"),
        ("if(a, b)", 1, "if() takes 3 arguments"),
        ("coalesce()", 1, "coalesce() takes 1 or more arguments, got 0"),
        ("cast(x AS int)", 11, "expected a type"),
        ("cast(x AS decimal(40,2))", 11, "1 <= p <= 38"),
        ("cast(x int64)", 8, "expected AS"),
        ("substring(s, 0)", 14, "start must be an integer literal from 1"),
        ("substring(s, 1, n)", 17, "length must be an integer literal"),
        ("date_format(d, fmt)", 16, "format must be a string literal"),
        ("round(x, 1.5)", 10, "digits must be an integer literal"),
        ("bucket(x, 0)", 11, "bucket count must be an integer literal from 1"),
        ("x IN (a)", 7, "an IN list holds literals"),
        ("x IN ()", 7, "expected a value"),
        ("x LIKE y", 8, "expected a string literal"),
        ("x IS 1", 6, "expected NULL"),
        ("x BETWEEN 1 OR 2", 13, "expected AND"),
        ("DATE '2024-02-30'", 6, "expected a DATE literal"),
        ("TIMESTAMP '2024-01-01 25:00'", 11, "expected a TIMESTAMP literal"),
        ("9223372036854775808", 1, "integer out of the int64 range"),
        ("a = AND", 5, "expected a value"),
        ("``", 1, "empty quoted name"),
    ],
)
def test_parse_errors_say_where_and_what(text, position, what):
    with pytest.raises(ValueError) as info:
        parse_expression(text)
    message = str(info.value)
    assert "\n" not in message
    assert f"at character {position}:" in message
    assert what in message
    assert not isinstance(info.value, ExpressionError)


def test_parse_error_message_shape():
    with pytest.raises(ValueError, match=r"^cannot parse 'amount >\)' at character 9: expected"):
        parse_expression("amount >)")


def test_int64_bounds_and_negative_literals():
    assert values("-9223372036854775808", pa.table({"x": [0]})) == [-(2**63)]
    assert values("9223372036854775807", pa.table({"x": [0]})) == [2**63 - 1]
    assert values("- 1.5", pa.table({"x": [0]})) == [-1.5]
    assert values("--2", pa.table({"x": [0]})) == [2]


# --------------------------------------------------------------------------- literals


def test_literals_are_typed_and_repeated_per_row():
    t = pa.table({"x": [1, 2, 3]})
    cases = {
        "42": (pa.int64(), 42),
        "1.5": (pa.float64(), 1.5),
        "'it''s'": (pa.string(), "it's"),
        "TRUE": (pa.bool_(), True),
        "false": (pa.bool_(), False),
        "NULL": (pa.null(), None),
        "DATE '2024-01-31'": (pa.date32(), dt.date(2024, 1, 31)),
        "TIMESTAMP '2024-01-31 10:00:00'": (pa.timestamp("us"), dt.datetime(2024, 1, 31, 10)),
        "timestamp '2024-01-31T10:00:00.5'": (
            pa.timestamp("us"),
            dt.datetime(2024, 1, 31, 10, 0, 0, 500000),
        ),
        "TIMESTAMP '2024-01-31 10:00:00+02:00'": (
            pa.timestamp("us", tz="UTC"),
            dt.datetime(2024, 1, 31, 8, tzinfo=UTC),
        ),
    }
    for text, (typ, value) in cases.items():
        out = parse_expression(text).evaluate(t)
        assert out.type == typ, text
        assert out.to_pylist() == [value] * 3, text
    assert len(parse_expression("1").evaluate(t.slice(0, 0))) == 0


# --------------------------------------------------------------------------- operators


def test_arithmetic():
    assert values("id + 1") == [2, 3, 4, None]
    assert result_type("id + 1") == pa.int64()
    assert values("id - big") == [-9, 22, 3 - 2**40, None]
    assert values("id * 2") == [2, 4, 6, None]
    assert values("amount * 2") == [21.0, 400.0, None, -1.0]
    assert values("-id") == [-1, -2, -3, None]
    assert values("-amount") == [-10.5, -200.0, None, 0.5]
    assert values("price + 1") == [Decimal("15.20"), None, Decimal("-0.25"), Decimal("1.00")]
    assert values("2 + 3 * 4 - 6 / 3") == [12.0] * 4
    assert values("(2 + 3) * 4") == [20] * 4
    assert values("- 2 * 3") == [-6] * 4


def test_decimals_with_floats_are_floats():
    assert values("price + 0.5") == [14.7, None, -0.75, 0.5]
    assert values("price * 2.0")[0] == 28.4
    assert values("-price")[0] == Decimal("-14.20")
    assert result_type("price + 1.5") == pa.float64()


def test_division_is_float_and_division_by_zero_is_an_error():
    assert values("id / 2") == [0.5, 1.0, 1.5, None]
    assert result_type("id / 2") == pa.float64()
    assert values("price / 2") == [7.1, None, -0.625, 0.0]
    with pytest.raises(ExpressionError, match="division|divide by zero"):
        parse_expression("amount / 0").evaluate(TABLE)
    # a NULL dividend is NULL, not an error
    assert values("amount / 0", TABLE.slice(2, 1)) == [None]
    assert values("NULL / 0") == [None] * 4


def test_overflow_is_an_error():
    with pytest.raises(ExpressionError, match="overflow"):
        parse_expression("big * 9223372036854775807").evaluate(TABLE)
    with pytest.raises(ExpressionError, match="overflow"):
        values("-x", pa.table({"x": [-(2**63)]}))


def test_arithmetic_on_text_is_an_error():
    with pytest.raises(ExpressionError, match=r"takes numbers, got string"):
        parse_expression("status + 1").evaluate(TABLE)


def test_concat_operator_casts_to_text():
    assert values("status || '-' || id") == ["ok-1", "test-2", None, "o'k-"][:3] + [None]
    assert values("'d=' || d") == ["d=2024-01-31", "d=2017-11-16", None, "d=1969-12-31"]
    assert values("flag || ''") == ["true", "false", None, "true"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id = 2", [False, True, False, None]),
        ("id <> 2", [True, False, True, None]),
        ("id != 2", [True, False, True, None]),
        ("id < 2", [True, False, False, None]),
        ("id <= 2", [True, True, False, None]),
        ("id > 2", [False, False, True, None]),
        ("id >= 2", [False, True, True, None]),
        ("amount > id", [True, True, None, None]),
        ("price = 14.2", [True, None, False, False]),
        ("price < id", [False, None, True, None]),
        ("status = 'ok'", [True, False, None, False]),
        ("status < 'p'", [True, False, None, True]),
        ("d = DATE '2024-01-31'", [True, False, None, False]),
        ("d >= '2017-11-16'", [True, True, None, False]),
        ("ts > DATE '2024-01-31'", [True, None, False, None]),
        ("ts < '2000-01-01 00:00:00'", [False, None, True, None]),
        ("tstz = TIMESTAMP '2024-01-31 23:30:00'", [True, None, None, None]),
        ("tstz = '2024-02-01 00:30:00+01:00'", [True, None, None, None]),
        ("flag = TRUE", [True, False, None, True]),
        ("id = NULL", [None] * 4),
    ],
)
def test_comparisons(text, expected):
    assert values(text) == expected


def test_comparing_unrelated_types_is_an_error():
    with pytest.raises(ExpressionError, match="cannot compare int32 and string"):
        parse_expression("id = 'x'").evaluate(TABLE)
    with pytest.raises(ExpressionError, match="cannot compare"):
        parse_expression("flag = 1").evaluate(TABLE)


def test_and_or_not_are_three_valued():
    t = pa.table(
        {
            "a": pa.array([True, True, True, False, False, False, None, None, None]),
            "b": pa.array([True, False, None, True, False, None, True, False, None]),
        }
    )
    assert values("a AND b", t) == [True, False, None, False, False, False, None, False, None]
    assert values("a OR b", t) == [True, True, True, True, False, None, True, None, None]
    assert values("NOT a", t) == [False] * 3 + [True] * 3 + [None] * 3
    assert values("FALSE AND NULL", t) == [False] * 9
    assert values("TRUE OR NULL", t) == [True] * 9
    with pytest.raises(ExpressionError, match="AND takes a condition"):
        parse_expression("id AND flag").evaluate(TABLE)


def test_precedence():
    t = pa.table({"a": [True], "b": [False], "c": [False], "x": [1]})
    assert values("a OR b AND c", t) == [True]  # OR < AND
    assert values("NOT b AND c", t) == [False]  # NOT binds tighter than AND
    assert values("NOT x = 2", t) == [True]  # comparison tighter than NOT
    assert values("x + 1 = 2 AND 'a' || 'b' = 'ab'", t) == [True]
    assert values("-x * 2 + 10 / 5", t) == [0.0]


def test_is_null():
    assert values("id IS NULL") == [False, False, False, True]
    assert values("status IS NOT NULL") == [True, True, False, True]
    assert values("NULL IS NULL") == [True] * 4
    assert values("id + NULL IS NULL") == [True] * 4


def test_in():
    assert values("id IN (1, 3)") == [True, False, True, None]
    assert values("id NOT IN (1, 3)") == [False, True, False, None]
    assert values("id IN (1, NULL)") == [True, None, None, None]  # SQL: never FALSE
    assert values("id NOT IN (1, NULL)") == [False, None, None, None]
    assert values("amount IN (10.5, -0.5)") == [True, False, None, True]
    assert values("big IN (-20, 1099511627776)") == [False, True, True, None]
    assert values("status IN ('ok', 'test')") == [True, True, None, False]
    assert values("d IN (DATE '2017-11-16', '1969-12-31')") == [False, True, None, True]
    with pytest.raises(ExpressionError, match="cannot compare int32 with the IN list's string"):
        parse_expression("id IN ('a')").evaluate(TABLE)


def test_like():
    assert values("status LIKE 'o%'") == [True, False, None, True]
    assert values("status LIKE '_k'") == [True, False, None, False]
    assert values("status NOT LIKE '%e%'") == [True, False, None, True]
    assert values("status LIKE 'OK'") == [False, False, None, False]  # case-sensitive
    t = pa.table({"s": ["50%", "500"]})
    assert values(r"s LIKE '50\%'", t) == [True, False]
    with pytest.raises(ExpressionError, match="LIKE takes text"):
        parse_expression("id LIKE '1'").evaluate(TABLE)


def test_between():
    assert values("id BETWEEN 2 AND 3") == [False, True, True, None]
    assert values("id NOT BETWEEN 2 AND 3") == [True, False, False, None]
    assert values("amount BETWEEN 0 AND 100 AND flag") == [True, False, None, False]
    assert values("d BETWEEN '2017-01-01' AND DATE '2018-01-01'") == [False, True, None, False]


# --------------------------------------------------------------------------- functions


def test_date():
    assert values("date(ts)") == [dt.date(2024, 1, 31), None, dt.date(1969, 12, 31), None]
    assert values("date(d)") == TABLE["d"].to_pylist()
    assert result_type("date(ts)") == pa.date32()
    t = pa.table(
        {
            "z": pa.array(
                [dt.datetime(2024, 1, 31, 20, tzinfo=UTC)], pa.timestamp("us", tz="Asia/Shanghai")
            ),
            "s": ["2024-01-31 10:00:00"],
        }
    )
    # a timestamptz's UTC date, whatever zone label it carries (local: 2024-02-01 04:00)
    assert values("date(z)", t) == [dt.date(2024, 1, 31)]
    assert values("date(s)", t) == [dt.date(2024, 1, 31)]
    assert values("date('2024-02-29T00:00')", t) == [dt.date(2024, 2, 29)]
    with pytest.raises(ExpressionError, match="date\\(\\) takes a timestamp, a date or text"):
        parse_expression("date(id)").evaluate(TABLE)


def test_year_month_day_hour():
    assert values("year(d)") == [2024, 2017, None, 1969]
    assert values("month(d)") == [1, 11, None, 12]
    assert values("day(d)") == [31, 16, None, 31]
    assert values("hour(d)") == [0, 0, None, 0]
    assert values("year(ts)") == [2024, None, 1969, None]
    assert values("hour(ts)") == [23, None, 23, None]
    assert values("hour(tstz)") == [23, None, None, None]
    for fn in ("year", "month", "day", "hour"):
        assert result_type(f"{fn}(ts)") == pa.int32()
    t = pa.table(
        {"z": pa.array([dt.datetime(2024, 1, 31, 20, tzinfo=UTC)], pa.timestamp("us", tz="+08:00"))}
    )
    assert values("hour(z)", t) == [20]  # UTC fields
    with pytest.raises(ExpressionError, match="year\\(\\) takes a date or a timestamp, got string"):
        parse_expression("year(status)").evaluate(TABLE)


def test_date_format():
    assert values("date_format(d, '%Y-%m')") == ["2024-01", "2017-11", None, "1969-12"]
    assert values("date_format(ts, '%Y%m%d %H')") == ["20240131 23", None, "19691231 23", None]
    assert values("date_format(tstz, '%H:%M %z')") == ["23:30 +0000", None, None, None]


def test_string_functions():
    assert values("substring(status, 2)") == ["k", "est", None, "'k"]
    assert values("substring(status, 1, 2)") == ["ok", "te", None, "o'"]
    assert values("substring(name, 3, 3)") == ["Hél", "", None, ""]
    assert values("substring(status, 10, 0)") == ["", "", None, ""]
    assert values("upper(name)") == ["  HÉLLO ", "X", None, ""]
    assert values("lower('ÀB')") == ["àb"] * 4
    assert values("trim(name)") == ["Héllo", "x", None, ""]
    assert values("length(name)") == [8, 1, None, 0]
    assert result_type("length(name)") == pa.int32()
    with pytest.raises(ExpressionError, match="upper\\(\\) takes text, got int32"):
        parse_expression("upper(id)").evaluate(TABLE)


def test_cast():
    assert values("cast(id AS string)") == ["1", "2", "3", None]
    assert values("CAST(id AS int64)") == [1, 2, 3, None]
    assert result_type("cast(id AS int64)") == pa.int64()
    assert values("cast(id AS float64)") == [1.0, 2.0, 3.0, None]
    assert result_type("cast(amount AS float32)") == pa.float32()
    assert values("cast(id AS decimal(10,2))") == [
        Decimal("1.00"),
        Decimal("2.00"),
        Decimal("3.00"),
        None,
    ]
    assert values("cast(price AS decimal(5,1))", TABLE.slice(0, 1)) == [Decimal("14.2")]
    assert values("cast('true' AS boolean)") == [True] * 4
    assert values("cast('2024-01-31' AS date)") == [dt.date(2024, 1, 31)] * 4
    assert values("cast(d AS timestamp)")[0] == dt.datetime(2024, 1, 31)
    assert values("cast(ts AS timestamptz)")[0] == dt.datetime(2024, 1, 31, 23, 30, tzinfo=UTC)
    assert values("cast(tstz AS timestamp)")[0] == dt.datetime(2024, 1, 31, 23, 30)
    assert values("cast(tstz AS date)")[0] == dt.date(2024, 1, 31)
    # text without a zone is UTC; with one, it is converted
    assert values("cast('2024-01-31 10:00:00' AS timestamptz)")[0] == dt.datetime(
        2024, 1, 31, 10, tzinfo=UTC
    )
    assert values("cast('2024-01-31 10:00:00+02:00' AS timestamptz)")[0] == dt.datetime(
        2024, 1, 31, 8, tzinfo=UTC
    )
    assert values("cast(status AS binary)")[0] == b"ok"
    assert values("cast(NULL AS int32)") == [None] * 4
    assert result_type("cast(NULL AS int32)") == pa.int32()


@pytest.mark.parametrize(
    "text",
    [
        "cast('abc' AS int64)",
        "cast(big AS int32)",  # 2**40 does not fit
        "cast(amount AS int64)",  # 10.5 would be truncated
        "cast('1.234' AS decimal(10,2))",  # would lose a digit
        "cast('2024-13-01' AS date)",
        "cast(price AS decimal(5,1))",  # -1.25 would lose a digit
        "cast(price AS decimal(3,2))",  # 14.20 does not fit
    ],
)
def test_unsafe_cast_is_an_error(text):
    with pytest.raises(ExpressionError):
        parse_expression(text).evaluate(TABLE)


def test_coalesce_concat_if():
    assert values("coalesce(id, 0)") == [1, 2, 3, 0]
    assert result_type("coalesce(id, 0)") == pa.int64()
    assert values("coalesce(amount, id, -1)") == [10.5, 200.0, 3.0, -0.5]
    assert values("coalesce(NULL, status)") == ["ok", "test", None, "o'k"]
    assert values("coalesce(id)") == [1, 2, 3, None]
    # SQL-standard concat: any NULL argument gives NULL
    assert values("concat(status, '-', id)") == ["ok-1", "test-2", None, None]
    assert values("concat(code)") == ["1", "abc", "3", None]
    # if: a NULL condition takes the else branch (as CASE WHEN)
    assert values("if(amount > 100, 'big', 'small')") == ["small", "big", "small", "small"]
    assert values("if(flag, id, 0)") == [1, 0, 0, None]
    assert result_type("if(flag, id, 0)") == pa.int64()
    assert values("if(flag, price, 1)")[1] == Decimal("1.00")
    with pytest.raises(ExpressionError, match="if\\(\\) branches have different types"):
        parse_expression("if(flag, 1, 'x')").evaluate(TABLE)
    with pytest.raises(ExpressionError, match="if\\(\\) takes a condition"):
        parse_expression("if(id, 1, 2)").evaluate(TABLE)


def test_abs_round():
    assert values("abs(amount)") == [10.5, 200.0, None, 0.5]
    assert values("abs(price)")[2] == Decimal("1.25")
    assert values("abs(-id)") == [1, 2, 3, None]
    assert values("round(amount)") == [11.0, 200.0, None, -1.0]  # half away from zero
    assert values("round(price, 1)") == [Decimal("14.20"), None, Decimal("-1.30"), Decimal("0.00")]
    assert result_type("round(price, 1)") == pa.decimal128(9, 2)
    assert values("round(big, -1)") == [10, -20, 1099511627780, None]
    assert values("round(id)") == [1, 2, 3, None]
    assert values("round(2.345, 2)") == [2.35] * 4


# Iceberg spec, Appendix B: murmur3_x86_32 hashes of the reference values. bucket(x, N) is
# (hash & Integer.MAX_VALUE) % N, so N = 2**31 - 1 shows the hash with the sign bit cleared.
ICEBERG_HASHES = [
    (pa.array([34], pa.int32()), 2017239379),
    (pa.array([34], pa.int64()), 2017239379),
    (pa.array([Decimal("14.20")], pa.decimal128(9, 2)), -500754589),
    (pa.array([dt.date(2017, 11, 16)]), -653330422),
    (pa.array([dt.datetime(2017, 11, 16, 22, 31, 8)], pa.timestamp("us")), -2047944441),
    (
        pa.array([dt.datetime(2017, 11, 16, 22, 31, 8, 1)], pa.timestamp("us")),
        -1207196810,
    ),
    (
        pa.array(
            [dt.datetime(2017, 11, 16, 14, 31, 8, tzinfo=dt.timezone(dt.timedelta(hours=-8)))],
            pa.timestamp("us", tz="UTC"),
        ),
        -2047944441,
    ),
    (pa.array(["iceberg"]), 1210000089),
    (pa.array([b"\x00\x01\x02\x03"], pa.binary()), -188683207),
]


@pytest.mark.parametrize(("column", "spec_hash"), ICEBERG_HASHES)
def test_bucket_matches_iceberg_spec(column, spec_hash):
    t = pa.table({"v": column})
    for n in (2**31 - 1, 100, 16, 1):
        assert values(f"bucket(v, {n})", t) == [(spec_hash & 0x7FFFFFFF) % n]
    assert result_type("bucket(v, 16)", t) == pa.int32()


def test_bucket_published_bucket_values_and_nulls():
    # iceberg-verification's bucket[100] cases: int 34 -> 79, decimal(9,2) 14.20 -> 59;
    # "iceberg" -> 89, 2017-11-16 -> 26 (as in the spec's hashes)
    t = pa.table({"x": [34], "s": ["iceberg"], "d": [dt.date(2017, 11, 16)]})
    assert values("bucket(x, 100)", t) == [79]
    assert values("bucket(s, 100)", t) == [89]
    assert values("bucket(d, 100)", t) == [26]
    assert values("bucket(cast('14.20' AS decimal(9,2)), 100)", t) == [59]
    assert values("bucket(id, 8)")[3] is None
    assert values("bucket(NULL, 8)") == [None] * 4
    # negative decimals hash their two's-complement bytes; stable across evaluations
    assert values("bucket(price, 1000)") == values("bucket(price, 1000)")
    with pytest.raises(ExpressionError, match="bucket\\(\\) takes an integer"):
        parse_expression("bucket(amount, 4)").evaluate(TABLE)


# --------------------------------------------------------------------------- NULLs, types


@pytest.mark.parametrize(
    "text",
    [
        "NULL + 1",
        "-id",
        "NULL || 'a'",
        "date(NULL)",
        "year(NULL)",
        "date_format(NULL, '%Y')",
        "substring(NULL, 1)",
        "upper(NULL)",
        "length(NULL)",
        "cast(NULL AS date)",
        "abs(NULL)",
        "round(NULL, 1)",
        "bucket(NULL, 4)",
        "concat('a', NULL)",
        "NULL = NULL",
        "NULL LIKE 'a'",
        "NOT NULL",
        "NULL IN (1)",
    ],
)
def test_null_in_null_out(text):
    t = pa.table({"id": pa.array([None], pa.int32())})
    assert parse_expression(text).evaluate(t).to_pylist() == [None]


def test_small_and_unsigned_integers_are_widened():
    t = pa.table(
        {
            "i8": pa.array([1], pa.int8()),
            "u16": pa.array([2], pa.uint16()),
            "u64": pa.array([3], pa.uint64()),
        }
    )
    assert result_type("i8", t) == pa.int32()
    assert result_type("u16", t) == pa.int32()
    assert result_type("u64", t) == pa.int64()
    assert result_type("i8 + i8", t) == pa.int32()
    assert values("i8 + u16 + u64", t) == [6]


def test_chunked_and_dictionary_columns():
    chunked = pa.table({"s": pa.chunked_array([["a", "b"], ["c"]])})
    assert values("upper(s)", chunked) == ["A", "B", "C"]
    dictionary = pa.table({"s": pa.array(["x", "y", "x"]).dictionary_encode()})
    assert values("s = 'x'", dictionary) == [True, False, True]


# --------------------------------------------------------------------------- failures


def test_unknown_column_is_an_evaluation_error():
    expr = parse_expression("nope + id")
    with pytest.raises(ExpressionError, match="unknown column 'nope'") as info:
        expr.evaluate(TABLE)
    assert "nope + id" in str(info.value)
    out, messages = expr.evaluate_rows(TABLE)
    assert out.to_pylist() == [None] * 4
    assert messages == ["unknown column 'nope'"] * 4


def test_evaluate_names_the_expression_and_the_failing_part():
    with pytest.raises(ExpressionError) as info:
        parse_expression("concat('n=', cast(code AS int64))").evaluate(TABLE)
    message = str(info.value)
    assert message.startswith("cannot evaluate \"concat('n=', cast(code AS int64))\": ")
    assert "cast(code AS int64): " in message
    assert "'abc'" in message
    assert isinstance(info.value, ValueError)


def test_evaluate_rows_finds_the_failing_rows():
    expr = parse_expression("cast(code AS int64) * 10")
    out, messages = expr.evaluate_rows(TABLE)
    assert out.type == pa.int64()
    assert out.to_pylist() == [10, None, 30, None]
    assert messages[0] is None and messages[2] is None and messages[3] is None
    assert messages[1].startswith("cast('abc' AS int64): ")
    assert "abc" in messages[1]


def test_evaluate_rows_on_a_larger_table_keeps_every_good_row():
    n = 1000
    codes = [str(i) for i in range(n)]
    bad = {7, 500, 999}
    for i in bad:
        codes[i] = f"x{i}"
    t = pa.table({"code": codes, "d": [0.0 if i == 3 else 1.0 for i in range(n)]})
    out, messages = parse_expression("cast(code AS int32) / d").evaluate_rows(t)
    assert len(out) == n and len(messages) == n
    failed = {i for i, m in enumerate(messages) if m is not None}
    assert failed == bad | {3}
    assert messages[3] == "3 / 0.0: divide by zero"
    assert all(out[i].as_py() == (None if i in failed else float(i)) for i in range(n))


def test_evaluate_rows_when_all_rows_fail_or_none_do():
    t = pa.table({"code": ["a", "b"]})
    out, messages = parse_expression("cast(code AS int64)").evaluate_rows(t)
    assert out.type == pa.null() and out.to_pylist() == [None, None]
    assert messages[0].startswith("cast('a' AS int64)")
    assert messages[1].startswith("cast('b' AS int64)")
    out, messages = parse_expression("upper(code)").evaluate_rows(t)
    assert out.to_pylist() == ["A", "B"] and messages == [None, None]
    out, messages = parse_expression("upper(code)").evaluate_rows(t.slice(0, 0))
    assert len(out) == 0 and messages == []


def test_evaluate_rows_type_errors_fail_every_row():
    out, messages = parse_expression("upper(id)").evaluate_rows(TABLE)
    assert out.to_pylist() == [None] * 4
    assert all(m is not None and "upper() takes text, got int32" in m for m in messages)


def test_a_name_two_columns_share_is_an_error():
    t = pa.table([pa.array([1]), pa.array([2])], names=["a", "a"])
    with pytest.raises(ExpressionError, match="2 columns are named 'a'"):
        parse_expression("a + 1").evaluate(t)


def test_evaluate_rows_of_a_non_condition_filter():
    out, messages = parse_filter("status").evaluate_rows(TABLE)
    assert out.to_pylist() == [None] * 4
    assert messages == ["a filter must be a condition (boolean), this is string"] * 4


def test_expression_error_pickles():
    try:
        parse_expression("cast(code AS int64)").evaluate(TABLE)
    except ExpressionError as exc:
        error = exc
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.detail == error.detail
    assert ExpressionError("plain").detail == "plain"


def test_expression_pickles_and_is_reusable():
    expr = parse_expression("if(flag, upper(status), `odd name`)")
    copy = pickle.loads(pickle.dumps(expr))
    assert isinstance(copy, Expression)
    assert copy.text == expr.text and copy.columns == expr.columns
    assert copy.evaluate(TABLE).to_pylist() == expr.evaluate(TABLE).to_pylist()
    assert "if(flag" in repr(expr)


# --------------------------------------------------------------------------- filters


@pytest.mark.parametrize(
    "text",
    [
        "amount > 100 AND status <> 'test'",
        "NOT flag",
        "id IS NULL",
        "id IN (1, 2)",
        "status LIKE 'o%'",
        "id BETWEEN 1 AND 2",
        "TRUE",
        "(amount > 0)",
        "cast(code AS boolean)",
        "if(flag, id > 1, id < 1)",
        "coalesce(flag, FALSE)",
        "flag",  # a column: its type is checked at evaluation
        "NULL",
    ],
)
def test_filters_that_are_conditions(text):
    assert parse_filter(text).text == text


@pytest.mark.parametrize(
    "text", ["amount + 1", "upper(status)", "'yes'", "1", "date(ts)", "coalesce(id, 0)", "-id"]
)
def test_filters_that_are_values_are_refused(text):
    with pytest.raises(ValueError, match="filter must be a condition, e.g. amount > 0") as info:
        parse_filter(text)
    assert "at character 1" in str(info.value)


def test_filter_evaluation():
    keep = parse_filter("amount > 100 OR status LIKE 'o%'").evaluate(TABLE)
    assert keep.type == pa.bool_()
    assert keep.to_pylist() == [True, True, None, True]
    assert parse_filter("NULL").evaluate(TABLE).type == pa.bool_()
    assert parse_filter("flag").evaluate(TABLE).to_pylist() == [True, False, None, True]
    with pytest.raises(ExpressionError, match="a filter must be a condition"):
        parse_filter("status").evaluate(TABLE)
    # the same text as a computed column is a plain value
    assert parse_expression("status").evaluate(TABLE).type == pa.string()

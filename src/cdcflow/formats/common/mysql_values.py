"""MySQL values written as text: one reading for every format that carries them so.

Canal JSON, Huawei DRS JSON/JSON-C/Avro and Qlik Replicate (MySQL sources) print MySQL
column values as MySQL prints them (``"2024-01-31 10:00:00.5"``, ``"0000-00-00"``,
``"1"`` for a ``TINYINT(1)``); Alibaba DTS Avro carries dates as parts. The rules,
decided once (decision 60, ``docs/decisions/0060-mysql-values-one-reading.md``):

* **Zero dates.** With ``NO_ZERO_DATE`` / ``NO_ZERO_IN_DATE`` off, MySQL stores
  ``0000-00-00`` and dates with a zero month or day (``2020-00-00``, ``2020-01-00``);
  none is a calendar day, so any date or date-time whose year, month or day is zero is
  NULL (:func:`is_zero_date`, :func:`zero_date_parts`).
* **Offsets.** MySQL prints DATETIME and TIMESTAMP without an offset. Text that has one
  (a writer other than MySQL added it) names an instant: a ``DATETIME`` column keeps
  its UTC wall clock, a ``TIMESTAMP`` column read in a zone keeps the instant.
* **Fractional seconds.** Up to 6 digits (MySQL's ``fsp``); digits past the
  microsecond (Replicate pads to 9) are cut, never rounded.
* **TIME** is a time of day (``00:00:00``-``23:59:59.999999``); MySQL's durations
  (``-838:59:59``..``838:59:59``) outside it are ``BAD_VALUE``.
* **Booleans** (``BOOL``, ``TINYINT(1)`` read as boolean, ``BIT(1)``): ``0``/``1`` as
  text, number or one byte (``"\\x00"``/``"\\x01"``), or ``true``/``false``.
* **Unsigned** ``INT`` is ``int64``; unsigned ``BIGINT`` and ``BIT(64)`` are
  ``decimal(20,0)`` (beyond int64); ``BIT(n)``, 1 < n < 64, is ``int64``.
* **ENUM / SET** written as numbers are MySQL's 1-based index and bit mask.

Every converter takes ``(value, column)`` (``None`` never reaches it) and raises
``BAD_VALUE`` (:func:`~cdcflow.formats.common.values.bad_value`) for text that does not
fit. Source: MySQL 8.0 Reference Manual, 13.2.2 *The DATE, DATETIME, and TIMESTAMP
Types*, 5.1.11 *Server SQL Modes* (``NO_ZERO_DATE``, ``NO_ZERO_IN_DATE``), 13.1.1
*Numeric Data Type Syntax*, 13.3.5/13.3.6 *ENUM*/*SET*.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable
from typing import Any

from cdcflow.formats.common.values import bad_value, int32_text, int64_text
from cdcflow.types import json_text, to_decimal

__all__ = [
    "BIT_TEXT",
    "DATE_WANT",
    "DATETIME_WANT",
    "TIME_WANT",
    "Converter",
    "bit_type",
    "boolean_text",
    "date_text",
    "datetime_text",
    "decimal_json",
    "decimal_text",
    "enum_labels",
    "enum_text",
    "integer_type",
    "is_zero_date",
    "latin1_text",
    "hex_text",
    "set_text",
    "time_text",
    "timestamp_text",
    "unsigned_bigint_text",
    "zero_date_parts",
]

Converter = Callable[[Any, str], Any]

#: how messages name what a column wants
DATE_WANT = "date (yyyy-mm-dd)"
DATETIME_WANT = "datetime (yyyy-mm-dd hh:mm:ss[.ffffff])"
TIME_WANT = "time of day (hh:mm:ss[.ffffff], 00:00:00 to 23:59:59)"

_Decimal = decimal.Decimal
_UTC = dt.UTC
_fromisoformat_date = dt.date.fromisoformat
_fromisoformat = dt.datetime.fromisoformat


# --------------------------------------------------------------------------- dates


def is_zero_date(text: Any) -> bool:
    """True for MySQL text whose date part has a zero year, month or day:
    ``"0000-00-00"``, ``"2020-00-00 10:00:00"``, ``"2020-01-00"`` (MySQL's zero date
    and zero-in-date values, stored when ``NO_ZERO_DATE``/``NO_ZERO_IN_DATE`` are off)."""
    return (
        type(text) is str
        and len(text) >= 10
        and text[4] == "-"
        and text[7] == "-"
        and text[:4].isdigit()
        and text[5:7].isdigit()
        and text[8:10].isdigit()
        and (text[:4] == "0000" or text[5:7] == "00" or text[8:10] == "00")
        and (len(text) == 10 or text[10] in " T")
    )


def zero_date_parts(year: int | None, month: int | None, day: int | None) -> bool:
    """True when a date given as parts (DTS Avro's ``DateTime``) has a zero year, month
    or day: the parts of a MySQL zero date (see :func:`is_zero_date`)."""
    return year == 0 or month == 0 or day == 0


def date_text(value: Any, column: str) -> dt.date | None:
    """``"2024-01-31"`` -> date; a zero date -> ``None``."""
    try:
        return _fromisoformat_date(value)
    except (ValueError, TypeError):
        if is_zero_date(value):
            return None
        raise bad_value(column, value, DATE_WANT) from None


def _parse_datetime(value: Any, column: str) -> dt.datetime | None:
    try:
        return _fromisoformat(value)
    except (ValueError, TypeError):
        if is_zero_date(value):
            return None
        raise bad_value(column, value, DATETIME_WANT) from None


def datetime_text(value: Any, column: str) -> dt.datetime | None:
    """MySQL ``DATETIME`` text -> naive datetime (the wall clock as printed).

    A zero date is ``None``; text with an offset (``"...+08:00"``, ``"...Z"``) is an
    instant and gives its UTC wall clock; fractional digits past the microsecond are cut.
    """
    r = _parse_datetime(value, column)
    if r is None or r.tzinfo is None:
        return r
    return r.astimezone(_UTC).replace(tzinfo=None)


class timestamp_text:  # noqa: N801 - used like a function: timestamp_text(zone)(value, column)
    """MySQL ``TIMESTAMP`` text printed in ``zone`` -> aware UTC datetime.

    Text with its own offset keeps it (the instant is exact); a zero date is ``None``.
    Picklable (a converter travels to Spark executors inside its decoder's caches).
    """

    __slots__ = ("zone",)

    def __init__(self, zone: dt.tzinfo) -> None:
        self.zone = zone

    def __reduce__(self) -> tuple[Any, ...]:
        return (timestamp_text, (self.zone,))

    def __call__(self, value: Any, column: str) -> dt.datetime | None:
        r = _parse_datetime(value, column)
        if r is None:
            return None
        return (r if r.tzinfo is not None else r.replace(tzinfo=self.zone)).astimezone(_UTC)


def time_text(value: Any, column: str, hint: str = "") -> dt.time:
    """``"10:00:00[.ffffff]"`` -> time of day; a duration outside 00:00:00-23:59:59
    (MySQL's TIME goes from ``-838:59:59`` to ``838:59:59``) is ``BAD_VALUE``, with
    ``hint`` appended (e.g. the format's option that keeps such values as text)."""
    try:
        return dt.time.fromisoformat(value)
    except (ValueError, TypeError):
        raise bad_value(column, value, TIME_WANT, hint) from None


# --------------------------------------------------------------------------- numbers

_TRUE = frozenset({"1", "true", "\x01"})
_FALSE = frozenset({"0", "false", "\x00"})


def boolean_text(value: Any, column: str, hint: str = "") -> bool:
    """``BOOL``, ``TINYINT(1)`` (read as boolean) and ``BIT(1)`` values: ``"1"``/``"0"``,
    1/0, true/false (JSON or text), or one byte ``"\\x01"``/``"\\x00"`` -> bool; anything
    else is ``BAD_VALUE`` with ``hint`` appended."""
    if value is True or value is False:
        return value
    if type(value) is str:
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
    elif type(value) is int and value in (0, 1):
        return value == 1
    raise bad_value(column, value, "boolean (0 or 1)", hint)


def decimal_text(value: Any, column: str) -> decimal.Decimal:
    """``DECIMAL`` text (exact) -> Decimal; a JSON integer is exact too. NaN, infinities,
    text that is no number, and a JSON float (its digits may already be lost: a
    text-only writer never writes one) are ``BAD_VALUE``."""
    if type(value) is str:
        try:
            d = _Decimal(value)
        except decimal.InvalidOperation:
            raise bad_value(column, value, "decimal") from None
        if d.is_finite():
            return d
        raise bad_value(column, value, "decimal")
    if type(value) is float:
        raise bad_value(column, value, "decimal (JSON float: digits may be lost; expected text)")
    result = to_decimal(value, column)
    assert result is not None
    return result


def decimal_json(value: Any, column: str) -> decimal.Decimal:
    """:func:`decimal_text`, but a JSON float is read through its shortest text
    (``1.25`` -> ``Decimal("1.25")``): for formats with writers of typed JSON (Flink's
    canal-json writer)."""
    if type(value) is float:
        result = to_decimal(value, column)
        assert result is not None
        return result
    return decimal_text(value, column)


_UINT64_MAX = 2**64 - 1


def unsigned_bigint_text(value: Any, column: str) -> decimal.Decimal:
    """``BIGINT UNSIGNED`` / ``SERIAL`` / ``BIT(64)`` text -> ``decimal(20,0)``:
    an integer in 0..2**64-1 (``BAD_VALUE`` outside)."""
    d = decimal_text(value, column)
    if d == d.to_integral_value() and 0 <= d <= _UINT64_MAX:
        return d.quantize(_Decimal(1))
    raise bad_value(column, value, "BIGINT UNSIGNED (an integer in 0..18446744073709551615)")


#: the converter of ``BIT(n)``, 1 < n < 64 (Canal and DRS print its number): int64
BIT_TEXT: Converter = int64_text


def integer_type(base: str, unsigned: bool) -> tuple[str, Converter]:
    """The logical type and converter of a MySQL integer type (``base`` as
    :func:`~cdcflow.formats.common.mysql_types.parse_mysql_type` gives it, one of
    ``SMALL_INTS``, ``INTS``, ``BIGINTS``, or ``"serial"``): ``int32`` up to MEDIUMINT
    and for signed INT, ``int64`` for unsigned INT and signed BIGINT, ``decimal(20,0)``
    for unsigned BIGINT and SERIAL."""
    if base == "serial":
        return "decimal(20,0)", unsigned_bigint_text
    if base in ("bigint", "int8"):
        return ("decimal(20,0)", unsigned_bigint_text) if unsigned else ("int64", int64_text)
    if unsigned and base in ("int", "integer", "int4"):
        return "int64", int64_text
    return "int32", int32_text


def bit_type(width: int) -> tuple[str, Converter]:
    """``BIT(width)``: ``boolean`` for 1 bit, ``int64`` below 64, ``decimal(20,0)`` at 64."""
    if width <= 1:
        return "boolean", boolean_text
    return ("int64", BIT_TEXT) if width < 64 else ("decimal(20,0)", unsigned_bigint_text)


# --------------------------------------------------------------------------- ENUM and SET

_LABEL_RE = re.compile(r"'((?:[^']|'')*)'")


def enum_labels(raw_args: str) -> tuple[str, ...]:
    """The labels of ``enum('a','it''s')`` from its argument text: ``("a", "it's")``."""
    return tuple(m.replace("''", "'") for m in _LABEL_RE.findall(raw_args))


def _index(value: Any, column: str) -> int | None:
    if type(value) is int or (type(value) is str and value.isascii() and value.isdigit()):
        i = int(value)
        if i < 0:
            raise bad_value(column, value, "ENUM index or SET bit mask (not negative)")
        return i
    return None


def enum_text(labels: tuple[str, ...], by_index: bool) -> Converter:
    """An ``ENUM`` converter: with ``by_index``, a number is MySQL's 1-based index (0 is
    the empty string MySQL stores for an invalid member; past the labels is
    ``BAD_VALUE``); other text is the label itself."""

    def conv(value: Any, column: str) -> str:
        i = _index(value, column) if by_index else None
        if i is None:
            return value if type(value) is str else json_text(value, column)
        if i == 0:
            return ""
        if i <= len(labels):
            return labels[i - 1]
        raise bad_value(column, value, f"ENUM index (1..{len(labels)})")

    return conv


def set_text(labels: tuple[str, ...], by_index: bool) -> Converter:
    """A ``SET`` converter: with ``by_index``, a number is MySQL's bit mask (bit 0 is
    the first label), giving the members joined by ``,``; other text is kept."""

    def conv(value: Any, column: str) -> str:
        mask = _index(value, column) if by_index else None
        if mask is None:
            return value if type(value) is str else json_text(value, column)
        if mask >> len(labels):
            raise bad_value(column, value, f"SET bit mask ({len(labels)} members)")
        return ",".join(lab for i, lab in enumerate(labels) if mask >> i & 1)

    return conv


# --------------------------------------------------------------------------- binary


def latin1_text(value: Any, column: str) -> bytes:
    """Binary printed one char per byte (ISO-8859-1; Canal, Alibaba DTS) -> bytes."""
    try:
        encoded: bytes = value.encode("latin-1")  # a str (anything else: AttributeError)
    except (UnicodeEncodeError, AttributeError):
        raise bad_value(
            column, value, "binary value (ISO-8859-1 text, one char per byte)"
        ) from None
    return encoded


def hex_text(value: Any, column: str) -> bytes:
    """Binary printed as hexadecimal digits (Tencent DTS, Qlik Replicate) -> bytes."""
    try:
        return bytes.fromhex(value)
    except (ValueError, TypeError):
        raise bad_value(column, value, "binary value (hex text)") from None

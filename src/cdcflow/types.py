"""Logical column types, value coercions shared by decoders, and the Arrow/Delta mapping.

Logical type strings (what :attr:`ChangeEvent.columns` holds):
``boolean``, ``int32``, ``int64``, ``float32``, ``float64``, ``decimal(P,S)``, ``string``,
``json``, ``binary``, ``date``, ``time``, ``timestamp`` (naive wall clock, us),
``timestamptz`` (UTC instant, us).

In Delta: ``decimal(P,S)`` with P > 38 and ``time`` are stored as strings (Delta has no
such types); ``json`` is a string; ``timestamp`` is ``timestamp_ntz``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import re
from functools import lru_cache
from typing import Any

import orjson
import pyarrow as pa

from cdcflow.errors import Code, DecodeError

__all__ = [
    "LOGICAL_TYPES",
    "arrow_type",
    "decimal_type",
    "parse_type",
    "widen",
    "to_bool",
    "to_int",
    "to_float",
    "to_decimal",
    "to_bytes_base64",
    "epoch_ms_to_timestamptz",
    "epoch_us_to_timestamptz",
    "epoch_days_to_date",
    "micros_of_day_to_time",
    "parse_timestamp_text",
    "parse_date_text",
    "infer_type",
    "INT32_MIN",
    "INT32_MAX",
    "INT64_MIN",
    "INT64_MAX",
    "INT_RANGES",
    "JSON_WRITE_DEPTH",
    "int_range_error",
    "field_range_error",
    "json_text",
]

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: ``int32``/``int64`` -> the inclusive range a column of that logical type holds
INT_RANGES = {"int32": (INT32_MIN, INT32_MAX), "int64": (INT64_MIN, INT64_MAX)}
#: The deepest nesting of lists/objects that orjson writes (it reads up to 1024).
JSON_WRITE_DEPTH = 254
#: Wide enough for any source decimal (Oracle NUMBER: 38 digits; MySQL DECIMAL: 65).
_DECIMAL_CONTEXT = decimal.Context(prec=200, Emax=10**6, Emin=-(10**6))
EPOCH_NAIVE = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)

LOGICAL_TYPES = frozenset(
    {
        "boolean",
        "int32",
        "int64",
        "float32",
        "float64",
        "string",
        "json",
        "binary",
        "date",
        "time",
        "timestamp",
        "timestamptz",
    }
)
_DECIMAL_RE = re.compile(r"^decimal\((\d+),(-?\d+)\)$")


def decimal_type(precision: int, scale: int) -> str:
    """``decimal(P,S)``; precision is raised to fit the scale when a source says less."""
    return f"decimal({max(int(precision), int(scale), 1)},{int(scale)})"


@lru_cache(maxsize=1024)
def parse_type(name: str) -> tuple[str, int | None, int | None]:
    """Split a logical type into ``(base, precision, scale)``.

    Raises:
        ValueError: not a logical type.
    """
    m = _DECIMAL_RE.match(name)
    if m:
        return "decimal", int(m.group(1)), int(m.group(2))
    if name in LOGICAL_TYPES:
        return name, None, None
    raise ValueError(f"unknown logical type {name!r}")


@lru_cache(maxsize=1024)
def arrow_type(name: str) -> pa.DataType:
    """The Arrow type a logical type is stored as in Delta."""
    base, p, s = parse_type(name)
    if base == "decimal":
        assert p is not None and s is not None
        if p <= 38 and 0 <= s <= p:
            return pa.decimal128(p, s)
        return pa.string()
    return {
        "boolean": pa.bool_(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float32": pa.float32(),
        "float64": pa.float64(),
        "string": pa.string(),
        "json": pa.string(),
        "binary": pa.binary(),
        "date": pa.date32(),
        "time": pa.string(),
        "timestamp": pa.timestamp("us"),
        "timestamptz": pa.timestamp("us", tz="UTC"),
    }[base]


_WIDER = {
    ("int32", "int64"): "int64",
    ("float32", "float64"): "float64",
    ("int32", "float64"): "float64",
    ("int64", "float64"): "float64",
    ("date", "timestamp"): "timestamp",
}


def widen(old: str, new: str) -> str | None:
    """The type that holds values of both ``old`` and ``new``, or ``None`` if no safe one.

    Integers widen to int64, floats to float64, decimals to the precision/scale that holds
    both; anything may widen to ``string`` from ``string``.
    """
    if old == new:
        return old
    for a, b in ((old, new), (new, old)):
        if (a, b) in _WIDER:
            return _WIDER[(a, b)]
    bo, po, so = parse_type(old)
    bn, pn, sn = parse_type(new)
    if bo == bn == "decimal":
        assert po is not None and so is not None and pn is not None and sn is not None
        scale = max(so, sn)
        return decimal_type(max(po - so, pn - sn) + scale, scale)
    if {bo, bn} <= {"int32", "int64", "decimal"}:
        ints = {"int32": 10, "int64": 19}
        if bo == "decimal":
            assert po is not None and so is not None
            return decimal_type(max(po - so, ints[bn]) + so, so)
        assert pn is not None and sn is not None
        return decimal_type(max(pn - sn, ints[bo]) + sn, sn)
    if {bo, bn} <= {"string", "json"}:
        return "string"
    return None


def infer_type(value: Any) -> str | None:
    """The logical type of a JSON value when a format declares none (``None`` for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int64" if -(2**63) <= value < 2**63 else "decimal(38,0)"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, decimal.Decimal):
        sign, digits, exp = value.as_tuple()
        scale = max(0, -int(exp))
        return decimal_type(max(len(digits), scale), scale)
    if isinstance(value, bytes):
        return "binary"
    if isinstance(value, dt.datetime):
        return "timestamptz" if value.tzinfo is not None else "timestamp"
    if isinstance(value, dt.date):
        return "date"
    if isinstance(value, dt.time):
        return "time"
    if isinstance(value, str):
        return "string"
    return "json"


# --------------------------------------------------------------------------- coercions
# Each raises DecodeError(BAD_VALUE) with the column name, so a bad value dead-letters.


#: An integer as text: optional sign, ASCII digits (``re`` ``\d`` would take any script's).
_INT_TEXT = re.compile(r"[+-]?[0-9]+").fullmatch


def _bad(column: str, value: Any, want: str) -> DecodeError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return DecodeError(f"column {column!r}: {shown} is not a valid {want}", Code.BAD_VALUE)


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def int_range_error(column: str, value: int, logical: str) -> DecodeError:
    """The error for an integer that does not fit its column's declared type.

    Args:
        column: the column's name.
        value: the integer.
        logical: ``"int32"`` or ``"int64"``.

    Returns:
        A ``BAD_VALUE`` :class:`DecodeError` whose message names the column and the range
        (a value that would not fit the table's column is refused at decode time).
    """
    lo, hi = INT_RANGES[logical]
    return DecodeError(
        f"column {column!r}: {_shown(value)} is outside the {logical} range {lo}..{hi}",
        Code.BAD_VALUE,
    )


def field_range_error(
    field: str, value: int, lo: int, hi: int, what: str, code: str = Code.BAD_FIELD
) -> DecodeError:
    """The error for an envelope field whose integer is outside ``lo..hi``.

    Args:
        field: the field's name as the message spells it (``"es"``, ``"meta.seq"``).
        value: the integer.
        lo, hi: the valid range, inclusive.
        what: what the field holds and why the range, e.g. ``"epoch milliseconds; ts_ms
            is a 64-bit integer"``.
        code: ``BAD_FIELD`` unless the format uses another code for bad envelope fields.

    Returns:
        A :class:`DecodeError` whose message names the field, the value and the range.
    """
    return DecodeError(
        f"field {field!r}: {_shown(value)} is outside the valid range {lo}..{hi} ({what})", code
    )


def _number_fragment(value: Any) -> Any:
    """orjson ``default``: an exact ``Decimal`` (``float_as_decimal`` parses) as a JSON
    number written as it is."""
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return orjson.Fragment(str(value))
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _exact_json(value: Any) -> str:
    """JSON text of a parsed value, integers of any size written exactly (orjson stops
    at 64 bits)."""
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{_exact_json(str(k))}:{_exact_json(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list):
        return "[" + ",".join(_exact_json(v) for v in value) + "]"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return orjson.dumps(value, default=_number_fragment).decode()


def json_text(value: Any, column: str) -> str:
    """Compact JSON text of a JSON value (what a ``json`` column holds, and what a format
    keeps for an object or array in a column without a declared type).

    ``Decimal`` numbers (exact parses) are written as they are, and integers beyond 64 bits
    exactly.

    Raises:
        DecodeError: ``BAD_VALUE`` naming ``column`` when ``value`` nests lists/objects
            deeper than :data:`JSON_WRITE_DEPTH` (254) levels, which cannot be written back
            as JSON text.
    """
    try:
        return orjson.dumps(value, default=_number_fragment).decode()
    except TypeError as exc:
        if "Recursion" not in str(exc):  # an integer beyond 64 bits (an exact parse)
            return _exact_json(value)
        raise DecodeError(
            f"column {column!r}: JSON nested deeper than {JSON_WRITE_DEPTH} levels; such a "
            "value is kept as JSON text, which cannot be written that deep (orjson's limit)",
            Code.BAD_VALUE,
        ) from None


def to_bool(value: Any, column: str) -> bool | None:
    """JSON bool, 0/1, or "true"/"false"/"1"/"0" (any case) -> bool."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "1", "t", "yes", "y"):
            return True
        if low in ("false", "0", "f", "no", "n"):
            return False
    raise _bad(column, value, "boolean")


def to_int(value: Any, column: str) -> int | None:
    """JSON integer, integral float, or integer text -> int.

    Text is an optional sign and ASCII digits (``"-42"``, ``"+7"``, ``"007"``), nothing
    else: no surrounding spaces, no ``_`` separators, no other scripts' digits, no
    fraction or exponent (``int()`` would take the first three).

    Raises:
        DecodeError: ``BAD_VALUE`` naming ``column``.
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INT_TEXT(value):
        return int(value)
    raise _bad(column, value, "integer")


def to_float(value: Any, column: str) -> float | None:
    """JSON number or numeric text (``"1.2510357E7"``, ``"NaN"``) -> float."""
    if value is None or isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise _bad(column, value, "floating-point number")


def to_decimal(value: Any, column: str, scale: int | None = None) -> decimal.Decimal | None:
    """Decimal text or JSON number -> exact ``Decimal``.

    A JSON float is converted through its shortest repr (``0.1`` -> ``Decimal("0.1")``),
    never through binary expansion. With ``scale``, the value is quantized to it.
    """
    if value is None:
        return None
    try:
        if isinstance(value, decimal.Decimal):
            d = value
        elif isinstance(value, bool):
            raise TypeError
        elif isinstance(value, int):
            d = decimal.Decimal(value)
        elif isinstance(value, float):
            d = decimal.Decimal(repr(value))
        elif isinstance(value, str):
            d = decimal.Decimal(value.strip())
        else:
            raise TypeError
        if not d.is_finite():
            raise TypeError
        if scale is not None:
            d = d.quantize(decimal.Decimal(1).scaleb(-scale), context=_DECIMAL_CONTEXT)
        return d
    except (TypeError, decimal.InvalidOperation):
        raise _bad(column, value, "decimal") from None


def to_bytes_base64(value: Any, column: str) -> bytes | None:
    """Base64 text -> bytes."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise _bad(column, value, "base64 string")


def epoch_ms_to_timestamptz(ms: Any, column: str) -> dt.datetime | None:
    """Epoch milliseconds -> aware UTC datetime."""
    if ms is None:
        return None
    ms = to_int(ms, column)
    assert ms is not None
    return EPOCH + dt.timedelta(milliseconds=ms)


def epoch_us_to_timestamptz(us: Any, column: str) -> dt.datetime | None:
    """Epoch microseconds -> aware UTC datetime."""
    if us is None:
        return None
    us = to_int(us, column)
    assert us is not None
    return EPOCH + dt.timedelta(microseconds=us)


def epoch_days_to_date(days: Any, column: str) -> dt.date | None:
    """Days since 1970-01-01 -> date."""
    if days is None:
        return None
    days = to_int(days, column)
    assert days is not None
    try:
        return EPOCH_DATE + dt.timedelta(days=days)
    except OverflowError:
        raise _bad(column, days, "day count") from None


def micros_of_day_to_time(us: Any, column: str) -> dt.time | None:
    """Microseconds past midnight -> time."""
    if us is None:
        return None
    us = to_int(us, column)
    assert us is not None
    if not 0 <= us < 86_400_000_000:
        raise _bad(column, us, "time of day in microseconds")
    s, micro = divmod(us, 1_000_000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return dt.time(h, m, s, micro)


def parse_timestamp_text(value: Any, column: str, *, aware: bool) -> dt.datetime | None:
    """ISO-8601 or ``yyyy-mm-dd hh:mm:ss[.f]`` text -> datetime.

    Args:
        aware: return an aware UTC datetime (text without an offset is taken as UTC),
            else a naive wall-clock datetime (an offset, if present, is dropped after
            converting to UTC).
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().replace(" ", "T", 1)
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            parsed = None
        if parsed is not None:
            if aware:
                if parsed.tzinfo is None:
                    return parsed.replace(tzinfo=dt.UTC)
                return parsed.astimezone(dt.UTC)
            if parsed.tzinfo is not None:
                return parsed.astimezone(dt.UTC).replace(tzinfo=None)
            return parsed
    raise _bad(column, value, "timestamp text")


def parse_date_text(value: Any, column: str) -> dt.date | None:
    """``yyyy-mm-dd`` text -> date."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip()[:10])
        except ValueError:
            pass
    raise _bad(column, value, "date text")

"""A source row as the mirror holds it: the images ``cdcflow verify --repair`` writes.

Verify compares a source value with its mirror value through one canonical text
(:mod:`cdcflow.verify.canonical`); a repair goes the other way: the value a database
driver read (psycopg, PyMySQL) becomes the canonical-JSON value of the mirror column's
logical type (:mod:`cdcflow.images`), so that the repair is an ordinary change event
the pipeline's own apply stores, with its types checked as every event's are:

=========================== ============================================================
mirror column               image value
=========================== ============================================================
boolean                     ``true``/``false`` (a number or ``tinyint(1)``: not zero)
integer                     the number; a date as days, a time or timestamp as units of
                            ``unit_us`` microseconds since midnight / the epoch (UTC for
                            a zoned timestamp), as Debezium's schemaless JSON has them
float                       the number
decimal                     its text (exact)
date, timestamp             ISO 8601 text (a zoned one with its offset)
binary                      base64 text
string                      the text: ISO 8601 for a date, time or timestamp, JSON for
                            a JSON value (as ``jsonb::text``) or an array (compact),
                            base64 for bytes, ``a,b`` for a MySQL ``SET``
=========================== ============================================================

A string mirror of a time holds whatever text its format wrote; the repair writes ISO
8601 (``2024-01-02 03:04:05.000006``), which verify reads as the same value. A
column a mirror holds as anything else (a struct, a list) is refused with its name.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pyarrow as pa

from cdcflow.images import logical_from_arrow
from cdcflow.verify.canonical import Column

__all__ = ["UnrepairableColumn", "image_value", "logical_type"]

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class UnrepairableColumn(ValueError):
    """A column whose mirror type has no image value for its source type."""


def logical_type(column: Column, mirror_type: pa.DataType | None) -> str:
    """The logical type an image declares for ``column``: the mirror's (``mirror_type``),
    or, for a column the mirror does not hold (excluded, or read by a computed column),
    the kind's own.

    Raises:
        UnrepairableColumn: the mirror's type is nested, or a time of day.
    """
    if mirror_type is None:
        return (
            "timestamptz" if column.kind == "timestamp" and column.zoned else _NATURAL[column.kind]
        )
    if pa.types.is_nested(mirror_type) or pa.types.is_time(mirror_type):
        raise UnrepairableColumn(
            f"column {column.name}: a {column.source_type} mirrored as {mirror_type} has no "
            "repair image"
        )
    return logical_from_arrow(mirror_type)


_NATURAL = {
    "int": "int64",
    "decimal": "string",
    "float": "float64",
    "bool": "boolean",
    "date": "date",
    "time": "string",
    "timestamp": "timestamp",
    "bytes": "binary",
    "json": "string",
    "text": "string",
}


def image_value(column: Column, mirror_type: pa.DataType | None, value: Any) -> Any:
    """The canonical-JSON value of ``value`` (as the driver read it) for the mirror column
    of ``mirror_type`` (``None``: the mirror has no such column; the kind's own type).

    Raises:
        UnrepairableColumn: the value has no form in that type (see the module table).
    """
    if value is None:
        return None
    if isinstance(value, memoryview | bytearray):
        value = bytes(value)
    t = mirror_type
    if t is None:
        return _as_text_or_number(column, value)
    try:
        if pa.types.is_boolean(t):
            return bool(int(value)) if not isinstance(value, bool) else value
        if pa.types.is_integer(t):
            return _as_integer(column, value)
        if pa.types.is_floating(t):
            return float(value)
        if pa.types.is_decimal(t):
            return str(value)
        if pa.types.is_date(t):
            return (value.date() if isinstance(value, dt.datetime) else value).isoformat()
        if pa.types.is_timestamp(t):
            return _iso(column, value)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return base64.b64encode(_as_bytes(value)).decode()
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return _as_text(column, value)
    except (TypeError, ValueError, AttributeError) as exc:
        raise UnrepairableColumn(
            f"column {column.name}: {value!r} ({column.source_type}) has no {t} image: {exc}"
        ) from None
    raise UnrepairableColumn(
        f"column {column.name}: a {column.source_type} mirrored as {t} has no repair image"
    )


def _as_integer(column: Column, value: Any) -> int:
    if column.kind == "timestamp":
        return _epoch_us(column, value) // column.unit_us
    if column.kind == "date":
        day = value.date() if isinstance(value, dt.datetime) else value
        return (day - _EPOCH.date()).days
    if column.kind == "time":
        return _time_us(value) // column.unit_us
    if isinstance(value, bytes):  # a MySQL BIT
        return int.from_bytes(value, "big")
    return int(value)


def _epoch_us(column: Column, value: dt.datetime) -> int:
    if value.tzinfo is not None:
        return (value - _EPOCH_UTC) // dt.timedelta(microseconds=1)
    return (value - _EPOCH) // dt.timedelta(microseconds=1)  # a wall clock, or MySQL's UTC


def _time_us(value: Any) -> int:
    if isinstance(value, dt.timedelta):  # PyMySQL's TIME
        return value // dt.timedelta(microseconds=1)
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def _iso(column: Column, value: Any) -> str:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(dt.UTC).isoformat()
        return value.isoformat() + ("+00:00" if column.zoned else "")  # MySQL's session: UTC
    return str(value.isoformat() if hasattr(value, "isoformat") else value)


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _as_text(column: Column, value: Any) -> str:
    kind = column.kind
    if kind == "bytes":
        return base64.b64encode(_as_bytes(value)).decode()
    if kind in ("date", "timestamp"):
        return _iso(column, value)
    if kind == "time":
        if isinstance(value, dt.timedelta):
            us = _time_us(value)
            hours, rest = divmod(us, 3_600_000_000)
            minutes, rest = divmod(rest, 60_000_000)
            seconds, micros = divmod(rest, 1_000_000)
            return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{micros:06d}"
        return str(value.isoformat())
    if isinstance(value, dict | list):
        if column.array:  # as the formats' arrays land (orjson): compact
            return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
        return json.dumps(value, ensure_ascii=False, default=str)  # as jsonb::text writes
    if isinstance(value, set):  # PyMySQL may read a SET as a set
        return ",".join(sorted(value))
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, bool) and kind == "bool":
        return "true" if value else "false"
    return str(value)


def _as_text_or_number(column: Column, value: Any) -> Any:
    """A value for a column the mirror does not hold: numbers stay numbers."""
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if column.kind == "bytes":
        return base64.b64encode(_as_bytes(value)).decode()
    if column.kind == "date" and hasattr(value, "isoformat"):
        return value.isoformat()
    return _as_text(column, value)

"""Row images as typed Arrow columns.

Images travel as canonical JSON (see :mod:`cdcflow.decode.batches`); here they become
typed Arrow columns again, using the logical types the messages declared. Conversions
are strict: a value that does not fit its column (a decimal that would lose digits, a
text that is not a timestamp) raises :class:`~cdcflow.errors.ApplyError` with code
``TYPE_CONFLICT`` naming the column, never a silent NULL.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa

from cdcflow.errors import ApplyError, Code
from cdcflow.types import arrow_type, parse_type

__all__ = ["arrow_column", "logical_from_arrow", "rows_to_arrow"]

_CAST_FROM_TEXT = {"date", "timestamp", "timestamptz", "decimal"}


def _to_text(values: Sequence[Any]) -> list[str | None]:
    return [v if v is None or isinstance(v, str) else str(v) for v in values]


def arrow_column(name: str, values: Sequence[Any], logical_type: str) -> pa.Array:
    """An Arrow array of ``logical_type`` from canonical-JSON values.

    Raises:
        ApplyError: ``TYPE_CONFLICT`` when a value does not fit.
    """
    target = arrow_type(logical_type)
    base = parse_type(logical_type)[0]
    try:
        if base == "binary":
            return pa.array(
                [None if v is None else base64.b64decode(v, validate=True) for v in values],
                type=target,
            )
        if base == "json" or (base == "string" and any(isinstance(v, dict | list) for v in values)):
            return pa.array(
                [
                    v if v is None or isinstance(v, str) else orjson.dumps(v).decode()
                    for v in values
                ],
                type=target,
            )
        if base in _CAST_FROM_TEXT or pa.types.is_string(target):
            if pa.types.is_string(target):
                return pa.array(_to_text(values), type=pa.string())
            return pa.array(_to_text(values), type=pa.string()).cast(target)
        if base == "boolean":
            return pa.array(values, type=target)
        if any(isinstance(v, str) for v in values):  # numbers carried as text
            return pa.array(_to_text(values), type=pa.string()).cast(target)
        return pa.array(values, type=target)
    except (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        binascii.Error,
        ValueError,
        TypeError,
        OverflowError,
    ) as exc:
        raise ApplyError(
            f"column {name!r}: values do not fit {logical_type}: {exc}", Code.TYPE_CONFLICT
        ) from exc


def rows_to_arrow(
    rows: Sequence[Mapping[str, Any]], types: Mapping[str, str], columns: Sequence[str]
) -> pa.Table:
    """A typed Arrow table from canonical-JSON row dicts (absent column -> null).

    Raises:
        ApplyError: ``TYPE_CONFLICT`` when a value does not fit its column.
    """
    arrays = [arrow_column(c, [r.get(c) for r in rows], types.get(c, "string")) for c in columns]
    return pa.Table.from_arrays(arrays, names=list(columns))


def logical_from_arrow(t: pa.DataType) -> str:
    """The logical type a stored Arrow/Delta column stands for."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return "int32"
    if pa.types.is_integer(t):
        return "int64"
    if pa.types.is_float32(t):
        return "float32"
    if pa.types.is_floating(t):
        return "float64"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "binary"
    return "string"

"""Values that do not fit their column: one wording for every format.

``column 'price': 'abc' is not a valid decimal(10,2)`` -- the column, the value as
``repr`` (cut to 80 characters) and what the column wants; code ``BAD_VALUE``.
"""

from __future__ import annotations

from typing import Any

from cdcflow.errors import Code, DecodeError
from cdcflow.types import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    INT_RANGES,
    int_range_error,
    to_int,
)

__all__ = ["bad_value", "in_int_range", "int32_text", "int64_text", "int_text", "shown"]


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (``...`` at the end when cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bad_value(column: str, value: Any, want: str, hint: str = "") -> DecodeError:
    """``BAD_VALUE``: ``value`` of ``column`` is not a valid ``want`` (``hint``, when
    given, is appended as it is, e.g. ``" (out of range)"``)."""
    return DecodeError(
        f"column {column!r}: {shown(value)} is not a valid {want}{hint}", Code.BAD_VALUE
    )


# --------------------------------------------------------------------------- integers
# Tools that print every value as text (Canal, DRS) write integers as digits.


def in_int_range(n: int, column: str, logical: str) -> int:
    """``n`` when it fits ``logical`` (``"int32"``, ``"int64"``), else ``BAD_VALUE`` naming
    the range."""
    lo, hi = INT_RANGES[logical]
    if lo <= n <= hi:
        return n
    raise int_range_error(column, n, logical)


def int_text(value: Any, column: str) -> int:
    """A JSON integer, or integer text as ``int()`` reads it; anything else as
    :func:`cdcflow.types.to_int` reads it (``BAD_VALUE`` when it is no integer)."""
    if value.__class__ is str:
        try:
            return int(value)
        except ValueError:
            pass
    n = to_int(value, column)
    assert n is not None
    return n


def int32_text(value: Any, column: str) -> int:
    """:func:`int_text` within the int32 range (else ``BAD_VALUE`` naming the range)."""
    n = int_text(value, column)
    if INT32_MIN <= n <= INT32_MAX:
        return n
    raise int_range_error(column, n, "int32")


def int64_text(value: Any, column: str) -> int:
    """:func:`int_text` within the int64 range (else ``BAD_VALUE`` naming the range)."""
    n = int_text(value, column)
    if INT64_MIN <= n <= INT64_MAX:
        return n
    raise int_range_error(column, n, "int64")

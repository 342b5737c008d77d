"""Values that do not fit their column: one wording for every format.

``column 'price': 'abc' is not a valid decimal(10,2)`` -- the column, the value as
``repr`` (cut to 80 characters) and what the column wants; code ``BAD_VALUE``.
"""

from __future__ import annotations

from typing import Any

from cdcflow.errors import Code, DecodeError

__all__ = ["bad_value", "shown"]


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

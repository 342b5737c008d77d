"""Integer fields of the envelope (``ts_ms``, ``lsn``, ``pos``, orders and counts), and
:class:`NeedExact`, the signal that a float reached a place that needs the exact number
text: the record is then parsed again exactly (see :mod:`.json_decoder`)."""

from __future__ import annotations

import decimal
from typing import Any

from cdcflow.errors import Code, DecodeError

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


U64_MAX = 2**64 - 1


I32_MIN, I32_MAX = -(2**31), 2**31 - 1


class NeedExact(Exception):
    """Internal: a float reached a place that needs the exact number text."""


def int_field(value: Any, name: str, exact: bool) -> int:
    """An integer metadata field (ts_ms, lsn, pos, ...): JSON integer or digit text."""
    if value.__class__ is int:
        return value
    if value.__class__ is str:
        try:
            return int(value.strip())
        except ValueError:
            pass
    elif value.__class__ is float:
        if not exact:
            raise NeedExact
    elif isinstance(value, decimal.Decimal) and value.is_finite() and value == int(value):
        return int(value)
    raise DecodeError(f"field {name!r} must be an integer, got {value!r}", Code.BAD_FIELD)


def int64_field(value: Any, name: str, exact: bool) -> int:
    """An integer field that goes into the event as an int (ts_ms, orders, counts)."""
    n = int_field(value, name, exact)
    if I64_MIN <= n <= I64_MAX:
        return n
    raise DecodeError(f"field {name!r}: {n} is outside the 64-bit integer range", Code.BAD_FIELD)

"""Envelope fields: one way to read a field that must be there with a JSON type.

A field that is absent or ``null`` is ``MISSING_FIELD``; one of another JSON type is
``BAD_FIELD``. Messages: ``missing field 'op' (need a string)`` and ``field 'op' must be a
string, got a JSON number``.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from cdcflow.errors import Code, DecodeError

__all__ = ["field_error", "json_kind", "require"]

_T = TypeVar("_T")

#: JSON type -> how a message names it
_WANTS: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    float: "a number",
}


def json_kind(value: Any) -> str:
    """The JSON kind of a parsed value: object, array, string, boolean, number or null."""
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, int | float | decimal.Decimal) else "null"
    )


def field_error(name: str, value: Any, want: str) -> DecodeError:
    """``MISSING_FIELD`` when ``value`` is ``None``, else ``BAD_FIELD``: field ``name``
    holds ``value`` where ``want`` is needed."""
    if value is None:
        return DecodeError(f"missing field {name!r} (need {want})", Code.MISSING_FIELD)
    return DecodeError(
        f"field {name!r} must be {want}, got a JSON {json_kind(value)}", Code.BAD_FIELD
    )


@overload
def require(obj: Mapping[str, Any], key: str, kind: type[_T], want: str | None = None) -> _T: ...


@overload
def require(
    obj: Mapping[str, Any], key: str, kind: tuple[type, ...], want: str | None = None
) -> Any: ...


def require(
    obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], want: str | None = None
) -> Any:
    """``obj[key]``, which must be of (exactly) type ``kind``.

    Args:
        obj: the message or one of its objects.
        key: the field's name.
        kind: the Python type(s) of the JSON value (``dict``, ``list``, ``str``, ``int``...);
            ``bool`` is not an ``int`` here.
        want: how the message names what is needed; default from ``kind``.

    Raises:
        DecodeError: ``MISSING_FIELD`` (absent or ``null``) or ``BAD_FIELD`` (other type).
    """
    value = obj.get(key)
    if type(value) is kind:  # the common case, without building a tuple
        return value
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if type(value) in kinds:
        return value
    raise field_error(key, value, want or " or ".join(_WANTS.get(k, k.__name__) for k in kinds))

"""A message value that must be one JSON object: parsed with orjson, else ``BAD_JSON``
(not JSON) or ``NOT_AN_OBJECT`` (JSON, but an array, a string, a number...)."""

from __future__ import annotations

from typing import Any

import orjson

from cdcflow.errors import Code, DecodeError
from cdcflow.formats.common.fields import json_kind

__all__ = ["load_object"]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def load_object(value: Any, what: str) -> dict[str, Any]:
    """The JSON object ``value`` holds.

    Args:
        value: the record value (bytes or text).
        what: what the object is, for the error: ``"a Canal message"``.

    Raises:
        DecodeError: ``BAD_JSON`` or ``NOT_AN_OBJECT``.
    """
    try:
        msg = _loads(value)
    except _JSONDecodeError as exc:
        raise DecodeError(f"value is not JSON: {exc}", Code.BAD_JSON) from None
    if msg.__class__ is not dict:
        raise DecodeError(
            f"{what} is a JSON object, got a JSON {json_kind(msg)}", Code.NOT_AN_OBJECT
        )
    return msg

"""JSON whose numbers stay exact.

orjson is fast but turns an integer outside int64/uint64 into a ``float`` and reads every
number with a fraction as ``float``. :func:`loads_exact` parses with the standard library
instead (integers of any size, decimals as ``Decimal`` on request; ``NaN`` and
``Infinity`` are not JSON), and :class:`ExactJsonDecoder` parses with orjson first and
again exactly only when a message needs it.
"""

from __future__ import annotations

import decimal
import json
from typing import Any

import orjson

from cdcflow.errors import Code, DecodeError
from cdcflow.formats.base import Decoder, OptionsT, Record
from cdcflow.model import ChangeEvent
from cdcflow.types import json_text

__all__ = ["ExactJsonDecoder", "InexactNumber", "json_image", "loads_exact"]

_FLOAT_EXACT_LIMIT = float(2**63)


class InexactNumber(Exception):
    """orjson turned an integer outside int64/uint64 into a float: parse again exactly."""


def loads_exact(value: bytes, float_as_decimal: bool) -> Any:
    """Parse JSON keeping every integer exact (and, on request, decimals as ``Decimal``).

    Raises:
        DecodeError: ``BAD_JSON``.
    """
    try:
        return json.loads(
            value,
            parse_float=decimal.Decimal if float_as_decimal else float,
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise DecodeError(f"value is not JSON: {exc}", Code.BAD_JSON) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_PLAIN = frozenset({str, int, bool, type(None)})
_PLAIN_FLOAT = frozenset({str, int, bool, type(None), float})


def json_image(image: dict[str, Any], checked: bool) -> dict[str, Any]:
    """Type the values of an image that declares no types, in place.

    Strings, booleans, integers, floats and ``Decimal`` stay as they are (integers of
    any size are exact ``int``); objects and arrays (JSON columns, MySQL SETs) become
    compact JSON text (:func:`cdcflow.types.json_text`: ``BAD_VALUE`` when nested
    deeper than 254 levels).

    Args:
        image: column -> JSON value.
        checked: the message was parsed exactly; otherwise a float at or beyond 2**63
            (what orjson makes of an integer literal outside int64/uint64) raises
            :class:`InexactNumber`.
    """
    types = {*map(type, image.values())}  # checked at C speed: the common case ends here
    if types <= _PLAIN:
        return image
    if not checked and float in types:
        for v in image.values():
            if type(v) is float and not -_FLOAT_EXACT_LIMIT < v < _FLOAT_EXACT_LIMIT:
                raise InexactNumber(v)
    if types <= _PLAIN_FLOAT:
        return image
    fix = {k: json_text(v, k) for k, v in image.items() if type(v) is dict or type(v) is list}
    if fix:
        image.update(fix)
    return image


class ExactJsonDecoder(Decoder[OptionsT]):
    """A JSON decoder whose numbers stay exact: parse with orjson, and parse again with
    :func:`loads_exact` when the message holds a number orjson would round
    (:class:`InexactNumber`) or when the options ask for decimals (``self._exact``).

    Subclasses implement ``_decode(msg, record, checked) -> ChangeEvent``; ``checked`` is
    ``True`` when ``msg`` came from the exact parse.
    """

    _exact: bool = False

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one message into one event.

        Raises:
            DecodeError: ``BAD_JSON``, ``NOT_AN_OBJECT``, ``MISSING_FIELD``, ``BAD_FIELD``,
                ``UNKNOWN_OP``, ``MISSING_KEY``.
        """
        value: bytes = record.value  # type: ignore[assignment]  # decode() never sees a tombstone (Decoder.decode)
        exact = self._exact
        if exact:
            msg = loads_exact(value, True)
        else:
            try:
                msg = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise DecodeError(f"value is not JSON: {exc}", Code.BAD_JSON) from None
        try:
            return [self._decode(msg, record, exact)]
        except InexactNumber:
            return [self._decode(loads_exact(value, exact), record, True)]

    def _decode(self, msg: Any, record: Record, checked: bool) -> ChangeEvent:
        raise NotImplementedError

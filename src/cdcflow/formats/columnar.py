"""Columnar reading of flat JSON row images, shared by the formats' columnar paths.

A format's columnar path (:meth:`~cdcflow.formats.base.Decoder.decode_columnar`) reads a
window of records as whole columns: its envelope with msgspec, keeping each row image as
the raw slice of the message, and the images of one table with Arrow's JSON reader. Each
image is then *proven* equal to what the exact way gives (``orjson.loads`` of the record,
then ``orjson.dumps`` of the image): its canonical JSON text is rebuilt from the Arrow
columns (:func:`image_texts`) and compared byte for byte with the raw slice
(:func:`same_text`). The rebuilt text is unambiguous, so equal text means the same
members, in the same order, with the same values and types -- the row can be built from
the columns. Anything else declines, and the window goes the exact way (decision 33).

What the rebuilt text refuses to vouch for, so that equality implies the exact way's
reading *and* its canonical text:

* numbers: ``int64`` as Arrow prints them; ``float64`` only where Arrow's shortest form
  is the one orjson writes (no exponent, 1e-4 <= |x| < 1e15, or zero: measured equal on
  369k values of every magnitude; ``1.0`` gets orjson's ``.0``);
* strings without characters orjson escapes (``"``, ``\\``, U+0000-U+001F) and not equal
  to a placeholder the format treats specially;
* member names without those characters;
* ``true``/``false``/``null``; an object or array value declines.

:func:`raw_values_ok` covers what msgspec and orjson read differently in the rest of the
message: invalid UTF-8 (msgspec lets it through in skipped members) and floats beyond
double range (``1e999``: orjson refuses them, msgspec reads infinity).
"""

from __future__ import annotations

import io
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

__all__ = [
    "ImageTexts",
    "binary_array",
    "image_texts",
    "raw_values_ok",
    "read_images",
    "same_text",
]

#: Arrow type of an inferred image column -> the logical type the exact way infers
LOGICAL_TYPES = {
    pa.int64(): "int64",
    pa.float64(): "float64",
    pa.string(): "string",
    pa.bool_(): "boolean",
}

_READ = pj.ReadOptions(use_threads=False, block_size=1 << 30)
_PARSE = pj.ParseOptions(newlines_in_values=False)
#: characters orjson escapes in a string (and JSON forbids unescaped)
_ESCAPED = r'[\x00-\x1f"\\]'
#: a number msgspec reads and orjson refuses: a 3-digit exponent or 300+ digits
_OVERFLOW = r"[0-9.][eE][+-]?[0-9]{3}|[0-9]{300}"
_FLOAT_MIN, _FLOAT_MAX = 1e-4, 1e15


def binary_array(values: Sequence[Any]) -> pa.BinaryArray:
    """An Arrow binary array of bytes-like ``values`` (``bytes``, ``msgspec.Raw``), built
    from one joined buffer instead of one Python object per value."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(values)
    return pa.Array.from_buffers(
        pa.large_binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def raw_values_ok(values: pa.Array) -> bool:
    """Whether every value (binary) is valid UTF-8 and holds no number that msgspec and
    orjson read differently (beyond double range)."""
    try:
        text = values.cast(pa.large_string())  # validates UTF-8
    except pa.ArrowInvalid:
        return False
    return not pc.any(pc.match_substring_regex(text, _OVERFLOW)).as_py()


def read_images(raws: Sequence[Any]) -> pa.Table | None:
    """Arrow's reading of ``raws`` (JSON objects, bytes-like, no line breaks in them: a
    JSON object's own line breaks are whitespace the proof refuses anyway), one row each;
    ``None`` where the reader refuses them or infers a column type other than
    :data:`LOGICAL_TYPES` and null."""
    try:
        table = pj.read_json(io.BytesIO(b"\n".join(raws)), read_options=_READ, parse_options=_PARSE)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return None
    if table.num_rows != len(raws):
        return None
    for f in table.schema:
        if f.type not in LOGICAL_TYPES and f.type != pa.null():
            return None
    return table


@dataclass
class ImageTexts:
    """The canonical JSON text of each row image of a table read by :func:`read_images`.

    Attributes:
        names: the columns, in the images' member order.
        types: logical type per column (``None`` for a column null in every row).
        values: per column, each row's value as canonical JSON text (``"null"`` for null).
        text: each row's whole image as canonical JSON text.
        ok: whether each row's values are ones the text vouches for (module docstring).
    """

    names: list[str]
    types: list[str | None]
    values: list[pa.Array]
    text: pa.Array
    ok: pa.Array

    def valid(self) -> np.ndarray:
        """``(rows, columns)`` booleans: where a value is not null."""
        return (
            np.column_stack(
                [
                    np.asarray(pc.not_equal(v, "null").to_numpy(zero_copy_only=False))
                    for v in self.values
                ]
            )
            if self.values
            else np.zeros((len(self.text), 0), bool)
        )


def image_texts(table: pa.Table, placeholders: Collection[str] = ()) -> ImageTexts | None:
    """Canonical JSON texts of the images :func:`read_images` read; ``None`` where a member
    name needs escaping. Rows whose values the text cannot vouch for are ``False`` in
    ``ok`` (the caller declines them)."""
    n = table.num_rows
    names: list[str] = []
    types: list[str | None] = []
    values: list[Any] = []
    ok = pa.array(np.ones(n, bool))
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pc.match_substring_regex(pa.scalar(name), _ESCAPED).as_py():
            return None
        col = column.combine_chunks()
        t = col.type
        if t == pa.null():
            text = pa.array(["null"] * n, pa.string())
            types.append(None)
        else:
            types.append(LOGICAL_TYPES[t])
            if t == pa.string():
                # A string holding a character orjson escapes was escaped in the raw text
                # too (JSON allows no raw quote, backslash or control character in a
                # string, and the readers refuse them): its rebuilt text lacks the
                # backslash and differs from the raw slice, so no check is needed here.
                if placeholders:
                    good = pc.invert(pc.is_in(col, pa.array(list(placeholders), pa.string())))
                    ok = pc.and_(ok, pc.fill_null(good, True))
                text = pc.binary_join_element_wise('"', col, '"', "")
            elif t == pa.float64():
                digits = pc.cast(col, pa.string())
                magnitude = pc.abs(col)
                good = pc.and_(
                    pc.invert(pc.match_substring(digits, "e")),  # JSON has no inf or nan
                    pc.or_(
                        pc.equal(magnitude, 0.0),
                        pc.and_(
                            pc.greater_equal(magnitude, _FLOAT_MIN), pc.less(magnitude, _FLOAT_MAX)
                        ),
                    ),
                )
                ok = pc.and_(ok, pc.fill_null(good, True))
                text = pc.if_else(
                    pc.match_substring(digits, "."),
                    digits,
                    pc.binary_join_element_wise(digits, ".0", ""),
                )
            else:  # int64, bool: Arrow prints them as JSON does
                text = pc.cast(col, pa.string())
            text = pc.fill_null(text, "null")
        names.append(name)
        values.append(text)
    parts: list[Any] = []
    for i, (name, text) in enumerate(zip(names, values, strict=True)):
        parts.append(("{" if i == 0 else ",") + '"' + name + '":')
        parts.append(text)
    whole = pc.binary_join_element_wise(*parts, "}", "") if parts else pa.array(["{}"] * n)
    return ImageTexts(names, types, values, whole, ok)


def same_text(texts: ImageTexts, raws: pa.Array) -> bool:
    """Whether every image's canonical text equals its raw slice and ``ok`` holds."""
    if not pc.all(texts.ok).as_py():
        return False
    equal = pc.equal(texts.text.cast(pa.large_binary()), raws)
    return bool(pc.all(equal).as_py())

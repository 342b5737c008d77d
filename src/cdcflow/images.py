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
import pyarrow.compute as pc
import pyarrow.json as pa_json

from cdcflow.errors import ApplyError, Code
from cdcflow.types import arrow_type, parse_type

__all__ = ["arrow_column", "logical_from_arrow", "rows_from_json", "rows_to_arrow"]

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
        if pa.types.is_integer(target) and any(type(v) is float for v in values):
            # pa.array truncates a float given for an integer type (1.5 -> 1); a safe cast
            # keeps 1.0 -> 1 and refuses 1.5
            return pa.array(values, type=pa.float64()).cast(target)
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


#: Logical types :func:`rows_from_json` reads; any other column sends a batch the exact way.
_JSON_READER_TYPES = {
    "boolean": pa.bool_(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
}
#: An integer of 16 digits or more may not be exactly a double: the exact way decides.
_LONG_DIGITS = "[0-9]{16}"


def rows_from_json(
    images: pa.Array | pa.ChunkedArray,
    types: Mapping[str, str],
    columns: Sequence[str],
    unexpected: str = "ignore",
) -> pa.Table | None:
    """:func:`rows_to_arrow` of the JSON objects in ``images``, read by Arrow's JSON
    reader in one pass instead of a dict per row -- or ``None`` where this cannot give
    exactly the same table, and the caller must take the exact way.

    Only columns of ``boolean``, ``int64``, ``float64`` and ``string`` are read; a null
    image, a value of another JSON type than its column's (a number in a string column,
    ``1.0`` in an integer one: the exact way converts or refuses those), and an integer
    of 16 or more digits where a ``float64`` column exists (a double may not hold it
    exactly) all give ``None``. What the reader accepts is what the exact way gives:
    the same values, absent members null, members outside ``columns`` ignored.

    Args:
        images: canonical-JSON objects, one per row (``string``).
        types: logical type per column (absent: ``string``).
        columns: the table's columns, in order.
        unexpected: ``"ignore"`` members outside ``columns``, or ``"error"``: an image
            with one gives ``None``.
    """
    fields = []
    for c in columns:
        t = _JSON_READER_TYPES.get(types.get(c, "string"))
        if t is None:
            return None
        fields.append(pa.field(c, t))
    schema = pa.schema(fields)
    n = len(images)
    if n == 0:
        return schema.empty_table()
    if images.null_count:
        return None
    if (
        any(f.type == pa.float64() for f in fields)
        and pc.any(pc.match_substring_regex(images, _LONG_DIGITS)).as_py()
    ):
        return None
    lines = pc.binary_join_element_wise(images, "", "\n")  # each image and a newline
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    _, offsets_buffer, data_buffer = lines.buffers()
    offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, offsets_buffer], offset=lines.offset)
    start, end = offsets[0].as_py(), offsets[n].as_py()
    data = data_buffer[start:end]
    try:
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(
                use_threads=False, block_size=max(1 << 20, end - start)
            ),
            parse_options=pa_json.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior=unexpected
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != n:
        return None
    return table.combine_chunks()


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

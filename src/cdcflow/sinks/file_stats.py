"""Delta file statistics of Arrow data, and the stored ones used to skip files.

A data file's ``add`` action carries ``stats``: ``numRecords``, ``nullCount`` per column
and ``minValues``/``maxValues`` (Delta protocol, "Per-file Statistics",
https://github.com/delta-io/delta/blob/master/PROTOCOL.md#per-file-statistics). Readers
(delta-rs, Spark, DuckDB, Trino) skip a file whose range rules a predicate out, so a
wrong bound loses rows from their answers. :func:`file_stats` therefore writes only
bounds it can make exact or safely wider, for the types where that is plain:

- integers and dates: exact minimum and maximum;
- strings: the minimum, cut to :data:`STRING_PREFIX` characters when longer (a prefix
  sorts before the value: a safe lower bound); the maximum only when it is at most that
  long (delta-rs and Spark write a cut maximum with its last character raised; leaving
  it out is as safe and simpler);
- other types (floats with their NaN, decimals, timestamps whose stored bound is cut to
  milliseconds, nested types): ``nullCount`` only.

:func:`files_in_range` reads the same bounds back from the log (whoever wrote them) and
keeps the files a set of key values can be in.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["STRING_PREFIX", "file_stats", "files_in_range", "prunable"]

#: string bounds longer than this are cut (minimum) or left out (maximum), as delta-rs's
STRING_PREFIX = 64


def prunable(data_type: pa.DataType) -> bool:
    """Whether stored min/max bounds of a column of this type are exact or safely wider
    whoever wrote them (integers, strings, dates), so a file outside them can be
    skipped."""
    return bool(
        pa.types.is_integer(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_date32(data_type)
    )


def _bound(value: Any, is_max: bool) -> Any:
    """The JSON value of a bound; ``None`` to leave it out."""
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) <= STRING_PREFIX:
            return value
        return None if is_max else value[:STRING_PREFIX]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def file_stats(data: pa.Table) -> str:
    """The ``stats`` JSON of a data file holding ``data``.

    Args:
        data: the file's rows (top-level columns; nested ones get ``nullCount`` only).

    Returns:
        ``{"numRecords": n, "minValues": {...}, "maxValues": {...}, "nullCount": {...}}``
        as JSON text (module docstring for which bounds are written).
    """
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(data.column_names, data.columns, strict=True):
        data_type = column.type
        if pa.types.is_nested(data_type):
            continue
        nulls[name] = column.null_count
        if not prunable(data_type) or column.null_count == len(column):
            continue
        bounds = pc.min_max(column)
        low = _bound(bounds["min"].as_py(), is_max=False)
        high = _bound(bounds["max"].as_py(), is_max=True)
        if low is not None:
            minimum[name] = low
        if high is not None:
            maximum[name] = high
    stats = {
        "numRecords": data.num_rows,
        "minValues": minimum,
        "maxValues": maximum,
        "nullCount": nulls,
    }
    return orjson.dumps(stats).decode()


def files_in_range(files: pa.Table, column: str, values: pa.Array) -> pa.Array:
    """Which data files may hold one of ``values`` in ``column``, by their stored bounds.

    Args:
        files: the table's add actions, flattened (``DeltaTable.get_add_actions(
            flatten=True)``: ``min.<column>``/``max.<column>`` per file).
        column: a column of a type :func:`prunable` accepts.
        values: the values looked for (NULLs are ignored: they match nothing).

    Returns:
        A boolean array, one per file: ``True`` where a value falls within the file's
        bounds, or the file has no bound to rule it out.
    """
    n = files.num_rows
    low_name, high_name = f"min.{column}", f"max.{column}"
    if low_name not in files.column_names or high_name not in files.column_names:
        return pa.array(np.ones(n, dtype=bool))
    wanted = pc.unique(pc.drop_null(values))
    if not len(wanted):
        return pa.array(np.zeros(n, dtype=bool))
    low, high = files[low_name].combine_chunks(), files[high_name].combine_chunks()
    if low.type != wanted.type:
        low, high = low.cast(wanted.type), high.cast(wanted.type)
    ordered = pc.sort_indices(wanted)
    sorted_values = wanted.take(ordered).to_numpy(zero_copy_only=False)
    unknown = pc.or_(pc.is_null(low), pc.is_null(high)).to_numpy(zero_copy_only=False)
    lows = low.fill_null(wanted[0]).to_numpy(zero_copy_only=False)
    highs = high.fill_null(wanted[0]).to_numpy(zero_copy_only=False)
    first = np.searchsorted(sorted_values, lows, side="left")
    past = np.searchsorted(sorted_values, highs, side="right")
    return pa.array(unknown | (past > first))

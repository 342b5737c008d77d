"""Target schemas: merge declared column types, and rebuild typed Arrow columns.

Images travel as canonical JSON (see :mod:`cdcflow.apply.events`); here they become
typed Arrow columns again, using the logical types the messages declared. Conversions
are strict: a value that does not fit its column (a decimal that would lose digits, a
text that is not a timestamp) raises :class:`~cdcflow.errors.ApplyError` with code
``TYPE_CONFLICT`` naming the column, never a silent NULL.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.errors import ApplyError, Code
from cdcflow.types import arrow_type, parse_type, widen

__all__ = [
    "SchemaPlan",
    "arrow_column",
    "logical_from_arrow",
    "merge_types",
    "plan_schema",
    "rows_to_arrow",
]

#: Stored-column widenings that keep every stored value exactly (int64 -> float64 does not).
_LOSSLESS = {
    ("int32", "int64"),
    ("float32", "float64"),
    ("int32", "float64"),
    ("date", "timestamp"),
}

_CAST_FROM_TEXT = {"date", "timestamp", "timestamptz", "decimal"}


def merge_types(
    existing: Mapping[str, str], declared: Iterable[Mapping[str, str] | None]
) -> tuple[dict[str, str], list[str]]:
    """Union of column types, widening where two declarations differ.

    Args:
        existing: the table's current columns (logical types), kept in order.
        declared: the ``columns`` of each event, in event order.

    Returns:
        ``(types, conflicts)``: merged column -> logical type (existing columns first, new
        ones in order of appearance), and one message per pair that cannot widen (the
        earlier type is kept).
    """
    types = dict(existing)
    conflicts: list[str] = []
    seen: set[tuple[str, str]] = set()
    for cols in declared:
        if not cols:
            continue
        for name, t in cols.items():
            old = types.get(name)
            if old is None:
                types[name] = t
            elif old != t and (name, t) not in seen:
                seen.add((name, t))
                wider = widen(old, t)
                if wider is None:
                    conflicts.append(f"column {name!r}: {t} does not fit {old}")
                elif name not in existing:
                    types[name] = wider
                elif wider != old:
                    # widening a stored column needs a table rewrite: keep the stored type and
                    # let the strict cast decide value by value (issue: schema evolution).
                    conflicts.append(f"column {name!r}: stored as {old}, now declared {t}")
    return types, conflicts


@dataclass(slots=True)
class SchemaPlan:
    """What a batch's declarations change in a stored table.

    Attributes:
        types: column -> logical type to store under the policy (stored columns first).
        added: new columns, ``{column: type}``.
        widened: stored columns to widen losslessly, ``{column: (stored, wider)}``.
        conflicts: stored columns declared with a type that does not fit and cannot be
            widened without loss, ``{column: (stored, declared)}``.
        dropped: stored columns missing from every full image's declaration.
        restored: columns recorded as dropped that are declared again.
    """

    types: dict[str, str]
    added: dict[str, str] = field(default_factory=dict)
    widened: dict[str, tuple[str, str]] = field(default_factory=dict)
    conflicts: dict[str, tuple[str, str]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.added or self.widened or self.conflicts or self.dropped or self.restored)


def _lossless(old: str, new: str) -> bool:
    if (old, new) in _LOSSLESS:
        return True
    bo, po, so = parse_type(old)
    bn, pn, sn = parse_type(new)
    if bn != "decimal" or pn is None or sn is None:
        return False
    if bo == "decimal":
        assert po is not None and so is not None
        return sn >= so and pn - sn >= po - so
    digits = {"int32": 10, "int64": 19}.get(bo)
    return digits is not None and pn - sn >= digits


def plan_schema(
    stored: Mapping[str, str],
    declared: Iterable[Mapping[str, str] | None],
    full_afters: pa.Array | pa.ChunkedArray | None = None,
    dropped_before: Iterable[str] = (),
    policy: str = "evolve",
    key_columns: Sequence[str] = (),
) -> SchemaPlan:
    """Compare a stored table with a batch's declared columns.

    Args:
        stored: the table's columns (logical types), in order; empty for a new table.
        declared: the ``columns`` of the batch's events, in event order.
        full_afters: the canonical-JSON after images of the batch's events that carry a
            full image; a stored column none of them holds (not even as NULL) counts as
            dropped.
        dropped_before: columns already recorded as dropped.
        policy: ``evolve`` stores added and widened columns; ``ignore`` and ``fail`` keep
            the stored schema (the caller stops a ``fail`` table on any change).
        key_columns: never reported as dropped.

    Returns:
        A :class:`SchemaPlan`.
    """
    merged, _ = merge_types({}, declared)
    plan = SchemaPlan(types=dict(stored))
    for column, t in merged.items():
        old = stored.get(column)
        if old is None:
            plan.added[column] = t
        elif old != t and arrow_type(old) != arrow_type(t):
            # (a logical type Delta stores as another, e.g. time and json as string, is no change)
            wider = widen(old, t)
            if wider == old:
                continue  # the stored type already holds the declared one
            if wider is not None and _lossless(old, wider):
                plan.widened[column] = (old, wider)
            else:
                plan.conflicts[column] = (old, t)
    if stored and full_afters is not None and len(full_afters):
        gone = set(dropped_before)
        for column in stored:
            if column in key_columns:
                continue
            if column in merged:
                present = True  # declared: no need to look at the images
            else:
                pattern = orjson.dumps(column).decode() + ":"
                present = pc.any(pc.match_substring(full_afters, pattern)).as_py() or False
            if not present and column not in gone:
                plan.dropped.append(column)
            elif present and column in gone:
                plan.restored.append(column)
    if not stored or policy == "evolve":
        plan.types.update(plan.added)
        plan.types.update({c: w for c, (_, w) in plan.widened.items()})
    return plan


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

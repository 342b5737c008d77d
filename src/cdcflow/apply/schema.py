"""Target schemas: merge declared column types and plan how a stored table evolves
(typed Arrow columns from images are built by :mod:`cdcflow.images`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.types import arrow_type, parse_type, widen

__all__ = ["SchemaPlan", "merge_types", "plan_schema"]

#: Stored-column widenings that keep every stored value exactly (int64 -> float64 does not).
_LOSSLESS = {
    ("int32", "int64"),
    ("float32", "float64"),
    ("int32", "float64"),
    ("date", "timestamp"),
}


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

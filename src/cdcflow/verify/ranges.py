"""Key ranges, their checksums on two sides, and the bisection down to differing rows.

The algorithm is data-diff's and TiDB sync-diff-inspector's: split the key space into
ranges, let each side compute ``count(*)`` and the sum of its rows' 60-bit hashes per range
(:mod:`cdcflow.verify.canonical`), keep the ranges whose pair differs, split those again at
keys of the side holding more rows, and once a range holds at most ``leaf_rows`` rows on
both sides read its rows from both and compare them key by key. Equal tables cost one
checksum per range; ``k`` differing keys cost about ``k * log_fanout(rows / leaf_rows)``
more checksums and ``k`` leaves of rows.

A range is ``[lo, hi)`` over the primary key's tuple, ``None`` for an open end. Both sides
order keys alike (texts by their bytes), so a range holds the same keys on both; where
the boundaries fall does not matter for correctness, only for cost.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdcflow.verify.canonical import Column, same_value

__all__ = [
    "Difference",
    "KeyRange",
    "RangeStats",
    "Row",
    "Side",
    "bisect",
    "range_predicate",
    "row_differences",
]


@dataclass(frozen=True)
class KeyRange:
    """Keys ``k`` with ``lo <= k < hi`` (tuples over the key columns; ``None``: open)."""

    lo: tuple | None = None
    hi: tuple | None = None

    def cut(self, bounds: Sequence[tuple]) -> list[KeyRange]:
        """This range cut at ``bounds`` (ascending, inside the range)."""
        edges: list[tuple | None] = [self.lo, *bounds, self.hi]
        return [
            KeyRange(a, b) for a, b in zip(edges, edges[1:], strict=False) if a != b or a is None
        ]


@dataclass(frozen=True)
class Row:
    """One row as compared: its key as read (for the report and for reading it again)
    and the canonical texts of the compared columns (in :attr:`Side.columns` order)."""

    key: tuple
    texts: tuple


class Side(Protocol):
    """One side of a comparison (the source table, or the mirror)."""

    def checksum(self, r: KeyRange) -> tuple[int, int]:
        """``(rows, sum of row hashes)`` of the range."""
        ...

    def split(self, r: KeyRange, parts: int, rows: int | None = None) -> list[tuple]:
        """Up to ``parts - 1`` keys inside ``r`` cutting it into ``parts`` ranges of
        about equal rows (ascending; empty when it cannot be cut); ``rows``: the range's
        row count on this side when known (saves counting it again)."""
        ...

    def rows(self, ranges: Sequence[KeyRange]) -> dict[tuple, Row]:
        """Every row in ``ranges``, by the canonical texts of its key."""
        ...


def range_predicate(r: KeyRange, ordered: Sequence[str], marker: str) -> tuple[str, list[Any]]:
    """``(SQL condition, parameters)`` selecting ``r``: ``ordered`` are the key columns
    as the side compares them (quoted, collated), ``marker`` its parameter mark."""
    terms, params = [], []
    row = ordered[0] if len(ordered) == 1 else f"({', '.join(ordered)})"
    marks = marker if len(ordered) == 1 else f"({', '.join([marker] * len(ordered))})"
    if r.lo is not None:
        terms.append(f"{row} >= {marks}")
        params += list(r.lo)
    if r.hi is not None:
        terms.append(f"{row} < {marks}")
        params += list(r.hi)
    return (" AND ".join(terms) or "TRUE"), params


@dataclass
class RangeStats:
    """What one comparison cost: ranges checked (``checksums``), the rows of the
    first-level ranges on each side, ranges whose checksums differed, leaves whose rows
    were read, rows read."""

    checksums: int = 0
    source_rows: int = 0  # rows of the first-level ranges on each side
    mirror_rows: int = 0
    differing: int = 0
    leaves: int = 0
    rows_read: int = 0


@dataclass
class Difference:
    """One key that differs: ``missing`` (in the source, not the mirror), ``extra`` (in
    the mirror only) or ``different`` (both, ``columns`` differ: name -> (source, mirror)
    canonical texts)."""

    kind: str
    key: tuple
    columns: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)


def bisect(
    source: Side,
    mirror: Side,
    ranges: Sequence[KeyRange],
    columns: Sequence[Column],
    leaf_rows: int = 256,
    fanout: int = 16,
    stats: RangeStats | None = None,
) -> tuple[dict[tuple, Difference], dict[tuple, Row]]:
    """The differing keys of ``ranges`` (canonical key -> :class:`Difference`), and the
    source rows read (what a recheck compares the source's next reading with).

    Args:
        columns: the compared columns (the order of :attr:`Row.texts`).
        leaf_rows: a range with at most this many rows on both sides is compared row by row.
        fanout: how many parts a differing range is split into.
    """
    stats = stats if stats is not None else RangeStats()
    pending, leaves, top = list(ranges), [], True
    while pending:
        later = []
        for r in pending:
            s, m = source.checksum(r), mirror.checksum(r)
            stats.checksums += 1
            if top:
                stats.source_rows += s[0]
                stats.mirror_rows += m[0]
            if s == m:
                continue
            stats.differing += 1
            if max(s[0], m[0]) <= leaf_rows:
                leaves.append(r)
                continue
            bigger = source if s[0] >= m[0] else mirror
            bounds = bigger.split(r, fanout, max(s[0], m[0]))
            if bounds:
                later += r.cut(bounds)
            else:
                leaves.append(r)
        pending, top = later, False
    if not leaves:
        return {}, {}
    stats.leaves += len(leaves)
    src, mir = source.rows(leaves), mirror.rows(leaves)
    stats.rows_read += len(src) + len(mir)
    return row_differences(src, mir, columns), src


def row_differences(
    source: dict[tuple, Row], mirror: dict[tuple, Row], columns: Sequence[Column]
) -> dict[tuple, Difference]:
    """Key by key: missing, extra and different rows (:func:`same_value` per column)."""
    out: dict[tuple, Difference] = {}
    for k, row in source.items():
        other = mirror.get(k)
        if other is None:
            out[k] = Difference("missing", row.key)
            continue
        changed = {
            c.name: (a, b)
            for c, a, b in zip(columns, row.texts, other.texts, strict=True)
            if not same_value(c, a, b)
        }
        if changed:
            out[k] = Difference("different", row.key, changed)
    for k, row in mirror.items():
        if k not in source:
            out[k] = Difference("extra", row.key)
    return out


def sample(ranges: Sequence[KeyRange], n: int, seed: int | None = None) -> list[KeyRange]:
    """``n`` of ``ranges`` drawn at random (all of them when there are no more)."""
    if n >= len(ranges):
        return list(ranges)
    return sorted(random.Random(seed).sample(list(ranges), n), key=list(ranges).index)

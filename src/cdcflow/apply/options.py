"""Per-table apply options, chosen by target-name patterns.

A pipeline's ``tables:`` section is a list of rules applied in file order; every rule
whose ``match`` pattern (``fnmatch``, e.g. ``"shop.public.*"``) matches a target table
overrides the options it sets. A target no rule matches gets the defaults below, which
are the behaviour of every earlier cdcflow release (SCD type 1 mirror, hard deletes,
schema evolution on).

Example::

    tables:
      - match: "*"
        schema_changes: evolve
      - match: "shop.public.orders"
        mode: history              # SCD type 2
        track_history: [status, amount]
        sequence_by: [updated_at]
      - match: "shop.audit.*"
        soft_delete: true

See docs/semantics.md for what each option does.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

__all__ = ["SCHEMA_POLICIES", "TableOptions", "TableRules"]

#: What a schema change does to a table (Flink CDC's schema-change behaviours):
#: ``evolve`` applies it (add, widen, record drops and renames); ``ignore`` keeps the
#: table's schema (new columns are not stored, values that do not fit are dead letters);
#: ``fail`` stops the table at the first change, with the offending event recorded.
SCHEMA_POLICIES = ("evolve", "ignore", "fail")


@dataclass(frozen=True, slots=True)
class TableOptions:
    """How changes are applied to one target table.

    Attributes:
        mode: ``"mirror"`` (SCD type 1: one row per key) or ``"history"`` (SCD type 2:
            one row per version, with ``__start_at``/``__end_at``/``__is_current``).
        sequence_by: after-image columns that break ties between changes with the same
            source sequence (AUTO CDC's ``sequence_by``): compared, in order, after the
            source sequence and before the Kafka position.
        soft_delete: a delete sets ``_deleted = true`` on the stored row instead of
            removing it (a later insert of the key sets it back to false).
        ignore_null_updates: in an update, a NULL value means "unchanged" (keep the
            stored value), as AUTO CDC's ``ignore_null_updates``.
        schema_changes: one of :data:`SCHEMA_POLICIES`.
        track_history: ``history`` mode only: the columns whose changes open a new
            version; changes to other columns update the current version in place.
            ``None``: every column is tracked.
    """

    mode: Literal["mirror", "history"] = "mirror"
    sequence_by: tuple[str, ...] = ()
    soft_delete: bool = False
    ignore_null_updates: bool = False
    schema_changes: Literal["evolve", "ignore", "fail"] = "evolve"
    track_history: tuple[str, ...] | None = None


_OPTION_NAMES = tuple(f.name for f in fields(TableOptions))


@dataclass(frozen=True, slots=True)
class TableRules:
    """Ordered ``(pattern, overrides)`` rules; see the module docstring.

    Args:
        rules: ``(fnmatch pattern, {option: value})`` pairs in file order.
    """

    rules: tuple[tuple[str, Mapping[str, Any]], ...] = ()

    def __call__(self, target: str) -> TableOptions:
        """The options of ``target`` (cached per name by the caller if it matters)."""
        options = TableOptions()
        for pattern, overrides in self.rules:
            if fnmatch.fnmatchcase(target, pattern):
                options = replace(options, **overrides)
        return options

    @classmethod
    def of(cls, rules: Sequence[tuple[str, Mapping[str, Any]]]) -> TableRules:
        """Rules from ``(pattern, overrides)`` pairs; unknown option names raise ``KeyError``."""
        for _, overrides in rules:
            unknown = set(overrides) - set(_OPTION_NAMES)
            if unknown:
                raise KeyError(f"unknown table options {sorted(unknown)}; valid: {_OPTION_NAMES}")
        return cls(tuple((p, dict(o)) for p, o in rules))

"""A table's schema policy: what a batch's declarations and DDL do to a stored table.

As dlt's schema contracts or Flink CDC's schema-change behaviours: given the table's
current Arrow schema, one batch's events for it (their declared ``columns``, full after
images and DDL) and the table's ``schema_changes`` policy (``evolve`` | ``ignore`` |
``fail``), :func:`decide_schema` decides, without touching Delta, what to do: add columns,
widen stored ones, move renamed values, ignore the change, or stop the table
(:class:`SchemaStop`, code ``SCHEMA_CHANGE``). The applier then executes the
:class:`SchemaDecision` (records its changes in ``_cdcflow/schema_changes``, widens the
columns, copies renamed values after the merge). See docs/semantics.md#schema-changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.apply.accounting import origin
from cdcflow.apply.ddl import column_renames
from cdcflow.apply.schema import SchemaPlan, plan_schema
from cdcflow.errors import ApplyError, Code
from cdcflow.images import logical_from_arrow
from cdcflow.model import Op
from cdcflow.sinks.history import SYSTEM_COLUMNS as HISTORY_SYSTEM_COLUMNS
from cdcflow.sinks.merge import BOOKKEEPING_COLUMNS
from cdcflow.transform.router import IMAGE_OPS

__all__ = ["SchemaChange", "SchemaDecision", "SchemaStop", "decide_schema", "stored_types"]

#: columns of a mirror or history table that are not source data
_BOOKKEEPING = (*BOOKKEEPING_COLUMNS, *HISTORY_SYSTEM_COLUMNS)


class SchemaStop(ApplyError):
    """A schema change the table's policy refuses: the table stops (others go on)."""

    code = Code.SCHEMA_CHANGE

    def __init__(self, message: str, first: dict[str, Any] | None = None) -> None:
        super().__init__(message, Code.SCHEMA_CHANGE)
        self.first = first or {}


@dataclass(slots=True)
class SchemaChange:
    """One row of ``_cdcflow/schema_changes`` to record (the applier adds the table,
    batch, policy and time).

    Attributes:
        change: ``add`` | ``widen`` | ``drop`` | ``restore`` | ``rename``.
        origin: the first event that carried it (``seq``, ``topic``, ``partition``,
            ``offset``).
    """

    change: str
    column: str | None
    old_type: str | None
    new_type: str | None
    applied: bool
    origin: dict[str, Any]
    message: str | None = None


@dataclass(slots=True)
class SchemaDecision:
    """What to do to a table for one batch, under its policy.

    Attributes:
        types: column -> logical type to store (stored columns first).
        changes: the changes to record, in record order.
        widen: stored columns to widen before the merge, ``{column: wider type}``.
        copies: ``(old, new)`` renames whose values move after the merge.
    """

    types: dict[str, str]
    changes: list[SchemaChange] = field(default_factory=list)
    widen: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[str, str]] = field(default_factory=list)


def stored_types(schema: pa.Schema | None) -> dict[str, str]:
    """The data columns of a stored table's Arrow schema, as logical types (bookkeeping
    columns of mirrors and history tables left out); empty for no table."""
    if schema is None:
        return {}
    return {f.name: logical_from_arrow(f.type) for f in schema if f.name not in _BOOKKEEPING}


def _renames(part: pa.Table, stored: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
    """Column renames the batch's DDL states for stored columns: (old, new, origin)."""
    ddl = pc.equal(part["op"], Op.DDL.value)
    if not stored or not pc.any(ddl).as_py():
        return []
    out = []
    for i in pc.indices_nonzero(ddl).to_pylist():
        for old, new in column_renames(part["ddl"][i].as_py()):
            if old in stored:
                out.append((old, new, origin(part, i)))
    return out


def _refusal(
    plan: SchemaPlan,
    stored: dict[str, str],
    fresh_renames: list[tuple[str, str, dict[str, Any]]],
    policy: str,
    target: str,
    first: Callable[[str, str | None], dict[str, Any]],
) -> SchemaStop | None:
    """The stop of a table whose policy refuses the batch's change (``fail``: any change;
    every policy: a declared type the stored column cannot hold), or ``None``."""
    if policy == "fail" and fresh_renames:
        old_name, new_name, at = fresh_renames[0]
        return SchemaStop(
            f"schema_changes is 'fail' and column {old_name!r} was renamed to {new_name!r}; "
            "the table is stopped, other tables go on. Fix: rename it in the table by hand "
            f"(or set schema_changes: evolve), then `cdcflow resume {target}`",
            at,
        )
    if plan.conflicts or (policy == "fail" and (plan.added or plan.widened or plan.dropped)):
        column, (old, new) = next(
            iter(
                {
                    **plan.conflicts,
                    **plan.widened,
                    **{c: (None, t) for c, t in plan.added.items()},
                    **{c: (stored[c], None) for c in plan.dropped},
                }.items()
            )
        )
        if column in plan.conflicts:
            why = f"column {column!r} is stored as {old} and now declared {new}, which it cannot hold without loss"
        else:
            why = f"schema_changes is 'fail' and column {column!r} changed ({old} -> {new})"
        return SchemaStop(
            f"{why}; the table is stopped, other tables go on. Fix: alter the table by hand "
            f"(or set schema_changes: evolve), then `cdcflow resume {target}`",
            first(column, new),
        )
    return None


def decide_schema(
    schema: pa.Schema | None,
    part: pa.Table,
    policy: str = "evolve",
    key_columns: Sequence[str] = (),
    dropped_before: Iterable[str] = (),
    target: str = "",
) -> SchemaDecision:
    """Decide what one batch's events do to a table's schema under its policy.

    Args:
        schema: the table's current Arrow schema; ``None`` for a table not created yet
            (its columns are the declared ones, nothing is recorded).
        part: the batch's events for the table (EVENT_SCHEMA rows: ``columns``, ``after``,
            ``partial``, DDL ``ddl``, and their coordinates).
        policy: the table's ``schema_changes``: ``evolve`` | ``ignore`` | ``fail``.
        key_columns: the table's key columns (never dropped).
        dropped_before: columns already recorded as dropped.
        target: the table's name, for the stop message.

    Returns:
        The :class:`SchemaDecision` to execute.

    Raises:
        SchemaStop: the policy is ``fail`` and the batch changes the schema, or a
            declared type cannot be stored without loss.
    """
    declared_json = [c for c in pc.unique(part["columns"]).to_pylist() if c]
    declared = [orjson.loads(c) for c in declared_json]
    stored = stored_types(schema)
    full = part.filter(
        pc.and_(
            pc.is_in(part["op"], IMAGE_OPS),
            pc.and_(pc.is_valid(part["after"]), pc.invert(pc.fill_null(part["partial"], False))),
        )
    )["after"]
    plan = plan_schema(
        stored,
        declared,
        full_afters=full if schema is not None else None,
        dropped_before=dropped_before,
        policy=policy,
        key_columns=key_columns,
    )
    renames = _renames(part, stored)
    if schema is None or not (plan.changes or renames):
        return SchemaDecision(types=plan.types)

    def first(column: str, type_: str | None = None) -> dict[str, Any]:
        for text, cols in zip(declared_json, declared, strict=True):
            if column in cols and (type_ is None or cols[column] == type_):
                return origin(part, pc.index(part["columns"], text).as_py())
        return origin(part, 0)

    fresh_renames = [(o, n, at) for o, n, at in renames if n not in stored]
    declared_new: dict[str, str] = {}
    for old, new, _ in renames:
        if new in plan.added:
            declared_new[new] = plan.added.pop(new)
            plan.types.pop(new, None)
        if old in plan.dropped:
            plan.dropped.remove(old)
    refusal = _refusal(plan, stored, fresh_renames, policy, target, first)
    if refusal is not None:
        raise refusal
    applied = policy == "evolve"
    decision = SchemaDecision(types=plan.types)
    changes = decision.changes
    for column, t in plan.added.items():
        changes.append(SchemaChange("add", column, None, t, applied, first(column, t)))
    for column, (old, wider) in plan.widened.items():
        changes.append(SchemaChange("widen", column, old, wider, applied, first(column)))
    for column in plan.dropped:
        changes.append(SchemaChange("drop", column, stored[column], None, applied, origin(part, 0)))
    for column in plan.restored:
        changes.append(
            SchemaChange("restore", column, None, stored[column], applied, first(column))
        )
    for old, new, at in fresh_renames:
        changes.append(
            SchemaChange("rename", old, stored[old], stored[old], applied, at, f"{old} -> {new}")
        )
        changes.append(SchemaChange("drop", old, stored[old], None, applied, at))
        if applied:
            plan.types[new] = declared_new.get(new, stored[old])
    if applied:
        decision.widen = {c: w for c, (_, w) in plan.widened.items()}
        decision.copies = [(o, n) for o, n, _ in renames if o in stored]
    return decision

"""One target table's part of a batch, applied alone: its schema, its merge, its faults.

:class:`TableApplier` applies the events one target got from a batch: the table's
options shape them (``ignore_null_updates``, ``sequence_by``), its schema policy decides
the schema (:func:`~cdcflow.apply.schema_policy.decide_schema`, executed here), then one
merge into the type-1 mirror (with its tombstones) or the SCD type 2 history. A fault of
the table's own Delta table stops that table only (:class:`TableFault`); a volume that
refuses every write stops the run (decision 25, docs/semantics.md#faults-confined-to-one-table).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.apply.accounting import origin
from cdcflow.apply.netchange import net_change
from cdcflow.apply.offsets import IncompleteApply
from cdcflow.apply.options import TableOptions
from cdcflow.apply.prepare import drop_null_updates, with_sequence_by
from cdcflow.apply.schema_log import SchemaLog
from cdcflow.apply.schema_policy import decide_schema
from cdcflow.errors import ApplyError, Code, LeaseHeld
from cdcflow.sinks.faults import GLOBAL_KINDS, storage_error
from cdcflow.sinks.history import apply_history
from cdcflow.sinks.mirror import MirrorResult, Mirrors
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse, arrow_schema

__all__ = ["TableApplier", "TableFault"]

log = logging.getLogger(__name__)


class TableFault(ApplyError):
    """A table's own Delta table failed (damaged log, permission denied, a failed apply):
    the table stops (others go on); the message names the table, its path and the fix."""

    code = Code.TABLE_FAULT

    def __init__(self, message: str, first: dict[str, Any] | None = None) -> None:
        super().__init__(message, Code.TABLE_FAULT)
        self.first = first or {}


def _full_row_identity(part: pa.Table) -> bool:
    """Whether the table's events use the whole row as identity (no primary key)."""
    meta = part.filter(pc.is_valid(part["meta"]))["meta"]
    if not len(meta):
        return False
    return bool(pc.any(pc.match_substring(meta, '"row_identity":"full_row"')).as_py())


class TableApplier:
    """Applies one target's part of a batch.

    Args:
        warehouse: the pipeline's Delta tables.
        schema_log: where schema changes and stops are recorded.
        table_budget_s: a table whose apply of one batch takes longer is stopped after it
            (its changes of that batch are kept); ``0`` for no budget.
    """

    def __init__(
        self, warehouse: DeltaWarehouse, schema_log: SchemaLog, table_budget_s: float = 600.0
    ) -> None:
        self.warehouse = warehouse
        #: the type-1 mirrors, merged by the warehouse's engine
        self.mirrors = Mirrors(warehouse)
        self.schema_log = schema_log
        self.table_budget_s = table_budget_s

    def apply(
        self, target: str, part: pa.Table, commit: CommitContext, options: TableOptions
    ) -> MirrorResult:
        """Apply one table's part, confining its storage faults and slowness to it; every
        commit carries the apply's ``commit`` context (its version is the batch id).

        A fault of the table's own Delta table (damaged log, permission denied, any other
        failure of its apply before its commit) raises :class:`TableFault`: the table
        stops, the rest of the batch goes on. A failure after the table committed the
        batch is raised as is (its events are applied; the batch's replay skips it). A
        volume that refuses every write (disk full, read-only) and faults of ``_cdcflow``
        system tables stop the run instead (``StorageError``). An apply that took longer
        than ``table_budget_s`` is kept, and the table stops after it.

        Raises:
            TableFault: the table's own Delta table failed; nothing of ``part`` applied
                after the failing write.
            StorageError: the fault is not the table's alone.
            ApplyError: from the apply itself (schema stop, ...).
        """
        batch_id = commit.version
        path = self.warehouse.table_path(target)
        started = time.monotonic()
        try:
            mirror = self._apply(target, part, commit, options)
        except (ApplyError, IncompleteApply, LeaseHeld):
            raise
        except Exception as exc:
            self.warehouse.forget(path)
            if self._has_committed(path, batch_id):
                # the table holds this batch: the failure came after its commit, so its
                # events are applied and cannot be dead letters; the batch fails and its
                # replay skips the table
                raise
            fault = storage_error(exc, path, target)
            if fault.kind in GLOBAL_KINDS or fault.target is None:
                raise fault from exc
            if fault.kind == "other":  # not a storage error we know: keep the traceback
                log.error("table %s: apply failed", target, exc_info=exc)
            raise TableFault(
                f"{fault.message}; the table is stopped, other tables go on, and its events "
                f"are dead letters until `cdcflow resume --warehouse {self.warehouse.root} "
                f"{target}`",
                origin(part, 0),
            ) from exc
        took_s = time.monotonic() - started
        if self.table_budget_s and took_s > self.table_budget_s:
            message = (
                f"the apply of batch {batch_id} took {took_s:.0f} s, over "
                f"apply.table_budget_s = {self.table_budget_s:g} s; its changes are applied, "
                "later ones are TABLE_STOPPED dead letters until `cdcflow resume "
                f"--warehouse {self.warehouse.root} {target}`"
            )
            log.error("table %s: stopped: %s", target, message)
            self.schema_log.record(
                target, batch_id, "stop", options.schema_changes, origin(part, 0), message=message
            )
        return mirror

    def _check_partition_columns(
        self, target: str, part: pa.Table, types: Mapping[str, str], partition_by: Sequence[str]
    ) -> None:
        """Before a table is created: every ``partition_by`` column is one of its columns.

        Raises:
            TableFault: one is not; the table stops until the option is fixed.
        """
        missing = [c for c in partition_by if c not in types]
        if missing:
            raise TableFault(
                f"table {target}: tables[].partition_by names {missing}, not columns of the "
                f"table (it has {sorted(types)}); fix partition_by, then `cdcflow resume "
                f"--warehouse {self.warehouse.root} {target}`",
                origin(part, 0),
            )

    def _has_committed(self, path: str, batch_id: int) -> bool:
        """Whether the table at ``path`` holds apply ``batch_id`` (``False`` if unreadable)."""
        try:
            return self.warehouse.committed(path, batch_id)
        except Exception:  # the fault itself may make the table unreadable
            return False

    def _apply(
        self, target: str, part: pa.Table, commit: CommitContext, options: TableOptions
    ) -> MirrorResult:
        wh = self.warehouse
        batch_id = commit.version
        if options.ignore_null_updates:
            part = drop_null_updates(part)
        if options.sequence_by:
            part = with_sequence_by(part, options.sequence_by)
        keys = part.filter(pc.is_valid(part["key"]))["key"]
        key_columns = list(orjson.loads(keys[0].as_py())) if len(keys) else []
        table = wh.open(wh.table_path(target))
        if not key_columns and table is None:
            # only a truncate (or DDL) for a table that does not exist yet: nothing to store,
            # but a truncate's watermark must block its older rows arriving later
            wh.tombstones.stage(target, net_change(part), batch_id)
            return MirrorResult(target=target, path=wh.table_path(target))
        # the schema policy decides (it raises SchemaStop), then its decision is executed
        decision = decide_schema(
            None if table is None else arrow_schema(table),
            part,
            policy=options.schema_changes,
            key_columns=key_columns,
            dropped_before=self.schema_log.dropped(target),
            target=target,
        )
        self.schema_log.record_changes(target, batch_id, options.schema_changes, decision.changes)
        if decision.widen:
            self.mirrors.widen_columns(target, decision.widen)
        types = decision.types
        if table is None and options.partition_by:
            self._check_partition_columns(target, part, types, options.partition_by)
        if options.mode == "history":
            return self._apply_history(target, part, types, key_columns, commit, options)
        full_row = _full_row_identity(part)
        if full_row:
            # the row is its own identity: match every stored column (NULL-safely), so a
            # row whose image left a NULL column out still matches only itself
            key_columns = list(types)
        net = net_change(part)
        result = self.mirrors.apply(
            target,
            net,
            types,
            key_columns,
            commit,
            soft_delete=options.soft_delete,
            full_row_identity=full_row,
            partition_by=options.partition_by,
            change_feed=options.change_feed,
        )
        wh.tombstones.stage(target, net, batch_id)  # committed with the batch's others
        if decision.copies:
            self.mirrors.copy_renamed_columns(target, decision.copies)
        return result

    def _apply_history(
        self,
        target: str,
        part: pa.Table,
        types: dict[str, str],
        key_columns: list[str],
        commit: CommitContext,
        options: TableOptions,
    ) -> MirrorResult:
        """SCD type 2: versions instead of one row per key (see :mod:`cdcflow.sinks.history`)."""
        h = apply_history(
            self.warehouse,
            target,
            part,
            types,
            key_columns,
            commit,
            options.track_history,
            partition_by=options.partition_by,
            change_feed=options.change_feed,
        )
        return MirrorResult(
            target=target,
            path=h.path,
            upserts=h.versions_opened + h.updated_in_place,
            deletes=h.versions_closed,
            skipped_replay=h.skipped_replay,
            metrics={
                "versions_opened": h.versions_opened,
                "versions_closed": h.versions_closed,
                "updated_in_place": h.updated_in_place,
                "versions_removed": h.versions_removed,
                "duplicates": h.duplicates,
                **h.metrics,
            },
            rejected=list(h.rejected),
        )

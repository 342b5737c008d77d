"""``_cdcflow/schema_changes`` as the applier uses it: which tables are stopped, which
columns are dropped, and the records of one batch.

The log is read once a batch (``cdcflow resume`` may have written a ``resume`` record
since) and the batch's records are written once, after the tables, through the
warehouse.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.apply.schema_policy import SchemaChange
from cdcflow.sinks.system_tables import SCHEMA_CHANGES, SCHEMA_CHANGES_SCHEMA
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse

__all__ = ["SchemaLog"]


class SchemaLog:
    """The schema-change records of one warehouse view, for one batch at a time.

    Args:
        warehouse: the warehouse (``_cdcflow/schema_changes``).
    """

    def __init__(self, warehouse: DeltaWarehouse) -> None:
        self.warehouse = warehouse
        self._rows: list[dict[str, Any]] = []
        self._log: pa.Table | None = None

    def start(self) -> None:
        """A new batch: nothing recorded yet, and the log is read again when asked."""
        self._rows = []
        self._log = None

    def record(
        self,
        target: str,
        batch_id: int,
        change: str,
        policy: str,
        origin: dict[str, Any],
        column: str | None = None,
        old_type: str | None = None,
        new_type: str | None = None,
        applied: bool = True,
        message: str | None = None,
    ) -> None:
        """Record one change (``stop`` for a table that stops) of ``target`` (from any
        thread: one list append)."""
        self._rows.append(
            {
                "target_table": target,
                "batch_id": batch_id,
                "change": change,
                "column": column,
                "old_type": old_type,
                "new_type": new_type,
                "policy": policy,
                "applied": applied,
                "message": message,
                "recorded_at_ms": int(time.time() * 1000),
                **origin,
            }
        )

    def record_changes(
        self, target: str, batch_id: int, policy: str, changes: list[SchemaChange]
    ) -> None:
        """Record the changes a :class:`~cdcflow.apply.schema_policy.SchemaDecision` holds."""
        for c in changes:
            self.record(
                target,
                batch_id,
                c.change,
                policy,
                c.origin,
                c.column,
                c.old_type,
                c.new_type,
                c.applied,
                message=c.message,
            )

    def write(self, commit: CommitContext) -> None:
        """Append the batch's records in a commit carrying ``commit`` (idempotent per
        batch)."""
        if self._rows:
            # tables record from their own threads (parallel apply): a stable sort by
            # table keeps each table's records in order and the commit deterministic
            rows = sorted(self._rows, key=lambda r: r["target_table"])
            data = pa.Table.from_pylist(rows, schema=SCHEMA_CHANGES_SCHEMA)
            self.warehouse.append(self.warehouse.system_path(SCHEMA_CHANGES), data, commit)

    def _table(self) -> pa.Table:
        if self._log is None:
            self._log = self.warehouse.read_system(SCHEMA_CHANGES, SCHEMA_CHANGES_SCHEMA)
        return self._log

    def _last_records(
        self, on: str, undo: str, target: str | None = None
    ) -> dict[tuple[str, str | None], str]:
        """The latest ``on``/``undo`` record per target (and column), in record order.

        Returns ``{(target, column): message}`` for the pairs whose latest record is ``on``.
        Records are ordered by ``recorded_at_ms``; on a tie the ``undo`` one is later.
        """
        log_ = self._table()
        mask = pc.is_in(log_["change"], pa.array([on, undo]))
        if target is not None:
            mask = pc.and_(mask, pc.equal(log_["target_table"], target))
        rows = log_.filter(mask).to_pylist()
        rows.sort(key=lambda r: (r["recorded_at_ms"] or 0, r["change"] == undo))
        state: dict[tuple[str, str | None], str | None] = {}
        for r in rows:
            where = (r["target_table"], r["column"])
            state[where] = (r["message"] or on) if r["change"] == on else None
        return {w: m for w, m in state.items() if m is not None}

    def stopped(self) -> dict[str, str]:
        """Target -> reason, for tables whose last stop/resume record is a stop."""
        return {t: m for (t, _), m in self._last_records("stop", "resume").items()}

    def dropped(self, target: str) -> set[str]:
        """Columns of ``target`` whose last drop/restore record is a drop."""
        # a drop record always names its column
        return {c for _, c in self._last_records("drop", "restore", target) if c is not None}

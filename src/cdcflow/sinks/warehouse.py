"""The Delta tables of one pipeline under one folder: paths, handles, commits, appends, reads.

Layout under the warehouse folder::

    <warehouse>/<database>.<schema>.<table>/   one mirror per source table
    <warehouse>/_cdcflow/...                   the system tables (:mod:`cdcflow.sinks.system_tables`)

Exactly once: every commit of an apply carries its :class:`CommitContext`: the
application transaction ``(cdcflow-<pipeline>, apply_id)`` and, in its commit metadata,
the Kafka offset ranges the apply covers; a table whose ``transaction_version`` is
already at the apply is skipped, so an apply finished after a crash changes nothing
twice. The apply ids and the offsets they cover are the warehouse's own
(:mod:`cdcflow.apply.offsets`), not Spark's batch ids.

What a mirror's apply does (guards, schema, merge) is :mod:`cdcflow.sinks.mirror`, who
computes its merge :mod:`cdcflow.sinks.engines`; the warehouse carries the engine its
mirrors are merged with (``merge_engine``). See docs/semantics.md.

Source documents: Delta transaction protocol ("Transaction Identifiers", "Commit
Provenance Information"); docs/decisions.md.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from cdcflow.sinks.app_transactions import AppTransactions
from cdcflow.sinks.arrow_merge import TARGET_FILE_ROWS
from cdcflow.sinks.engines import MergeEngine
from cdcflow.sinks.engines import merge_engine as named_engine
from cdcflow.sinks.faults import storage_error
from cdcflow.sinks.refresh import commit_hooks, current
from cdcflow.sinks.storage import Storage
from cdcflow.sinks.system_tables import (
    SCHEMA_CHANGES,
    SCHEMA_CHANGES_SCHEMA,
    SYSTEM_FOLDER,
)
from cdcflow.sinks.tombstones import TombstoneStore

__all__ = [
    "CommitContext",
    "DeltaWarehouse",
    "arrow_schema",
]

log = logging.getLogger(__name__)

#: how often an append is made in all when a concurrent commit changed the table's
#: metadata or protocol (a shared system table created by two sources at once)
_CREATE_RACE_ATTEMPTS = 3

_UNSAFE = re.compile(r"[^0-9A-Za-z_.\-#$]")


def arrow_schema(table: DeltaTable) -> pa.Schema:
    """The table's schema as a pyarrow schema (delta-rs returns an arro3 one)."""
    return pa.schema(table.schema().to_arrow())


@dataclass(frozen=True, slots=True)
class CommitContext:
    """What every commit of one apply carries; built once per apply and passed down.

    Attributes:
        app_id: the application transaction's id (``cdcflow-<pipeline>`` for an apply,
            :attr:`DeltaWarehouse.app_id`).
        version: the transaction's version: the apply id.
        metadata: the commits' custom metadata (``cdcflow.apply_id``, ``cdcflow.offsets``:
            the Kafka offset ranges the apply covers); empty: none.
        transactions: further application transactions ``{app_id: version}`` the commit
            records besides its own, in their order (the completion's next offsets).
    """

    app_id: str
    version: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    transactions: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "transactions", MappingProxyType(dict(self.transactions)))

    def with_transactions(self, transactions: Mapping[str, int]) -> CommitContext:
        """The same context recording ``transactions`` too (``{app_id: version}``)."""
        return replace(self, transactions={**self.transactions, **transactions})

    @property
    def all_transactions(self) -> dict[str, int]:
        """``{app_id: version}`` of every application transaction the commit records."""
        return {self.app_id: self.version, **self.transactions}

    def properties(self, max_commit_retries: int | None = None) -> CommitProperties:
        """delta-rs's commit properties of this context; ``max_commit_retries=0`` commits
        only on the version read (delta-rs's default retries on newer versions)."""
        others = [Transaction(app, version) for app, version in self.transactions.items()]
        return CommitProperties(
            custom_metadata=dict(self.metadata) or None,
            max_commit_retries=max_commit_retries,
            app_transactions=[Transaction(self.app_id, self.version), *others],
        )


def _created_meanwhile(path: str, storage_options: Mapping[str, str]) -> Any:
    """Whether a failed append is made again: a commit conflict on a table that now
    exists (another writer created or changed it meanwhile)."""

    def check(exc: BaseException) -> bool:
        return isinstance(exc, CommitFailedError) and DeltaTable.is_deltatable(
            path, dict(storage_options) or None
        )

    return check


class DeltaWarehouse:
    """The Delta tables of one pipeline under one folder.

    Args:
        root: warehouse folder (local path; any delta-rs URI with ``storage_options``).
        pipeline_id: names the application transaction that makes commits idempotent.
        storage_options: passed to delta-rs for object stores.
        merge_engine: who computes the mirrors' merges: a name of
            :data:`~cdcflow.sinks.engines.MERGE_ENGINES` or a
            :class:`~cdcflow.sinks.engines.MergeEngine`.
        target_file_rows: most rows per data file the Arrow merge of a named engine writes.

    Raises:
        ValueError: ``merge_engine`` names no engine.
    """

    def __init__(
        self,
        root: str,
        pipeline_id: str = "default",
        storage_options: Mapping[str, str] | None = None,
        merge_engine: str | MergeEngine = "arrow",
        target_file_rows: int = TARGET_FILE_ROWS,
    ) -> None:
        if isinstance(merge_engine, str):
            merge_engine = named_engine(merge_engine, target_file_rows)
        #: the engine the mirrors are merged with (:mod:`cdcflow.sinks.engines`)
        self.engine: MergeEngine = merge_engine
        self.root = str(root).rstrip("/")
        self.pipeline_id = pipeline_id
        self.app_id = f"cdcflow-{pipeline_id}"
        self.storage_options = dict(storage_options or {})
        #: Delta table properties every table this view creates gets (the log retention
        #: of ``maintenance.log_retention_hours``, set by the batch applier)
        self.table_configuration: dict[str, str] = {}
        self._tables: dict[str, DeltaTable] = {}
        #: the application transaction versions, read from the commits since the last ask
        self.app_transactions = AppTransactions(self.storage_options)
        #: the version each cached handle was opened at (:func:`~cdcflow.sinks.refresh.worn`)
        self._opened_at: dict[str, int] = {}
        #: the mirrors' deleted keys and truncates (read once, one commit per batch)
        self.tombstones = TombstoneStore(self)

    # ------------------------------------------------------------------ paths

    def table_path(self, target: str) -> str:
        """Folder of the mirror called ``target`` (unsafe characters become ``_``)."""
        return f"{self.root}/{_UNSAFE.sub('_', target)}"

    def system_path(self, name: str) -> str:
        return f"{self.root}/{SYSTEM_FOLDER}/{name}"

    # ------------------------------------------------------------------ tables

    def open(self, path: str) -> DeltaTable | None:
        """The Delta table at ``path`` (refreshed), or ``None`` if there is none.

        Raises:
            StorageError: the table's log cannot be read (damaged, permission denied);
                one line naming the path and the fix (:mod:`cdcflow.sinks.faults`).
        """
        cached = self._tables.get(path)
        try:
            table, opened_at = current(
                cached, self._opened_at.get(path, 0), path, self.storage_options
            )
        except TableNotFoundError:
            return None
        except (DeltaError, OSError) as exc:
            self._tables.pop(path, None)
            raise storage_error(exc, path, self._target_of(path)) from exc
        self._tables[path], self._opened_at[path] = table, opened_at
        return table

    def held(self, path: str) -> DeltaTable | None:
        """The handle of the table at ``path`` this view holds, as it is (not refreshed;
        ``None``: none held); a caller that refreshed it in the same apply uses it."""
        return self._tables.get(path)

    def forget(self, path: str) -> None:
        """Drop the cached handle of the table at ``path`` (after a failed write), and
        what is known of its application transactions."""
        self._tables.pop(path, None)
        self.app_transactions.forget(path)

    def _target_of(self, path: str) -> str | None:
        """The mirror's folder name of ``path`` (also for its history log); ``None`` for
        a system table shared by every mirror."""
        system = f"{self.root}/{SYSTEM_FOLDER}/"
        if path.startswith(system + "history_log/"):
            return path.rsplit("/", 1)[-1]
        if path.startswith(system):
            return None
        return path.rsplit("/", 1)[-1]

    def committed(
        self, path: str, batch_id: int, app_id: str | None = None, refresh: bool = True
    ) -> bool:
        """``True`` when batch ``batch_id`` was already committed to the table at ``path``
        (under application transaction ``app_id``, default the warehouse view's); with
        ``refresh=False`` a handle this view holds is asked as it is (the caller
        refreshed it in the same apply)."""
        table = (None if refresh else self._tables.get(path)) or self.open(path)
        if table is None:
            return False
        try:
            version = self.app_transactions.version(path, table, app_id or self.app_id)
        except (DeltaError, OSError) as exc:  # the log read lazily: damaged, unreadable
            self._tables.pop(path, None)
            raise storage_error(exc, path, self._target_of(path)) from exc
        return version is not None and version >= batch_id

    def commit_context(
        self, batch_id: int, metadata: Mapping[str, str] | None = None
    ) -> CommitContext:
        """The :class:`CommitContext` of apply ``batch_id`` under this view's application
        transaction, with custom ``metadata``."""
        return CommitContext(self.app_id, batch_id, metadata or {})

    def commit_properties(
        self, commit: CommitContext, max_commit_retries: int | None = None
    ) -> CommitProperties:
        """delta-rs's commit properties of ``commit`` (:meth:`CommitContext.properties`)."""
        return commit.properties(max_commit_retries)

    def made(self, path: str, on_version: int, commit: CommitContext) -> None:
        """Record that ``commit`` was committed to the table at ``path`` through a handle
        at ``on_version``, so the next ask of its transactions reads nothing
        (:meth:`AppTransactions.committed`)."""
        self.app_transactions.committed(path, on_version, commit.all_transactions)

    def mark(self, table: DeltaTable, commit: CommitContext) -> None:
        """An empty commit that only records ``commit`` (its transactions and metadata)."""
        empty = pa.Table.from_batches([], schema=arrow_schema(table))
        on_version = table.version()
        write_deltalake(
            table,
            empty,
            mode="append",
            commit_properties=self.commit_properties(commit),
            post_commithook_properties=commit_hooks(table),
            storage_options=self.storage_options or None,
        )
        self.made(table.table_uri, on_version, commit)

    def append(self, path: str, data: pa.Table, commit: CommitContext) -> bool:
        """Append ``data`` once per apply: the commit carries ``commit``; nothing is
        written when the table already holds ``commit``'s transaction.

        Returns:
            ``False`` if the apply was already there (or ``data`` is empty).

        Raises:
            StorageError: the table cannot be written (:mod:`cdcflow.sinks.faults`).
        """
        if data.num_rows == 0 or self.committed(path, commit.version, commit.app_id):
            return False
        table = self._tables.get(path)  # refreshed by committed()
        on_version = None if table is None else table.version()
        self._append_mapped(path, table, data, commit)
        if on_version is not None:
            self.made(path, on_version, commit)
        return True

    def holds(self, table: DeltaTable, commit: CommitContext) -> bool:
        """Whether ``table``, refreshed to its newest version, holds ``commit``'s
        transaction: a commit that raised may have landed all the same (its response was
        lost, delta-rs's retry of the same PUT met its own commit: "Concurrent transaction
        failed"), and must not be made again (decision 66)."""
        table.update_incremental()
        version = table.transaction_version(commit.app_id)
        return version is not None and version >= commit.version

    def _append_mapped(
        self, path: str, table: DeltaTable | None, data: pa.Table, commit: CommitContext | None
    ) -> None:
        """Append ``data`` (columns a newer cdcflow added are added to the table first);
        a storage failure is raised as ``StorageError`` (:mod:`cdcflow.sinks.faults`)."""
        try:
            self._add_missing_columns(table, data.schema)
            self._write_append(path, table, data, commit)
        except (DeltaError, OSError) as exc:
            self._tables.pop(path, None)
            raise storage_error(exc, path, self._target_of(path)) from exc

    def _write_append(
        self, path: str, table: DeltaTable | None, data: pa.Table, commit: CommitContext | None
    ) -> None:
        """Append ``data`` through the cached handle of the table at ``path`` when there is
        one: delta-rs then commits on the snapshot it holds instead of replaying the log
        again (the handle moves to the new version, and :meth:`open` refreshes it before
        any later read); a new table is created from ``path``.

        Several sources' first applies create a shared system table at the same moment:
        the losers' commits (creations, or appends read before another creation landed)
        fail on its protocol or metadata; nothing of them was committed, so the append is
        made again on the table as it now is (up to :data:`_CREATE_RACE_ATTEMPTS` in all),
        unless the table now holds ``commit``: the failed commit landed (:meth:`holds`).
        """
        properties = self.commit_properties(commit) if commit is not None else None

        def again(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.info("table %s changed under a concurrent commit (%s); appending again", path, exc)

        retrying = Retrying(
            stop=stop_after_attempt(_CREATE_RACE_ATTEMPTS),
            retry=retry_if_exception(_created_meanwhile(path, self.storage_options)),
            before_sleep=again,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    table = DeltaTable(path, storage_options=self.storage_options or None)
                    if commit is not None and self.holds(table, commit):
                        log.warning(
                            "table %s: the store holds apply %d although its commit failed "
                            "(a lost response); not appended again",
                            path,
                            commit.version,
                        )
                        return
                if table is None:
                    write_deltalake(
                        path,
                        data,
                        mode="append",
                        configuration=self.table_configuration or None,
                        commit_properties=properties,
                        storage_options=self.storage_options or None,
                    )
                else:
                    write_deltalake(
                        table,
                        data,
                        mode="append",
                        commit_properties=properties,
                        post_commithook_properties=commit_hooks(table),
                    )

    @staticmethod
    def _add_missing_columns(table: DeltaTable | None, schema: pa.Schema) -> None:
        """Columns a newer cdcflow added to a system table, added to an older warehouse's
        table (as nullable) before appending, so an upgrade never stops the stream."""
        if table is None:
            return
        have = set(arrow_schema(table).names)
        missing = [f for f in schema if f.name not in have]
        if missing:
            table.alter.add_columns(
                [Field.from_arrow(pa.field(f.name, f.type, nullable=True)) for f in missing]
            )

    def read(self, target_or_path: str, system: bool = False) -> pa.Table:
        """Read a mirror (by target name) or a system table (by name) back as Arrow."""
        path = self.system_path(target_or_path) if system else self.table_path(target_or_path)
        table = self.open(path)
        if table is None:
            raise FileNotFoundError(f"no Delta table at {path}")
        return table.to_pyarrow_table()

    def read_table(
        self,
        path: str,
        schema: pa.Schema,
        columns: Sequence[str] | None = None,
        filters: Any = None,
    ) -> pa.Table:
        """The rows of the table at ``path`` (``filters``/``columns`` as delta-rs takes
        them); ``schema``'s empty table when there is no table yet.

        Raises:
            StorageError: the table cannot be read (:mod:`cdcflow.sinks.faults`).
        """
        table = self.open(path)
        if table is None:
            return schema.empty_table()
        try:
            return table.to_pyarrow_table(
                columns=list(columns) if columns is not None else None, filters=filters
            )
        except (DeltaError, OSError) as exc:
            self._tables.pop(path, None)
            raise storage_error(exc, path, self._target_of(path)) from exc

    def read_system(self, name: str, schema: pa.Schema, **read: Any) -> pa.Table:
        """:meth:`read_table` (``columns``, ``filters``) of the system table ``name``
        (:mod:`cdcflow.sinks.system_tables`)."""
        return self.read_table(self.system_path(name), schema, **read)

    def system_version(self, name: str, app_id: str | None = None) -> int | None:
        """The last version of application transaction ``app_id`` (default: the
        warehouse view's) in the system table ``name``; ``None``: none, or no table."""
        app = app_id or self.app_id
        return self.system_versions(name, [app]).get(app)

    def system_versions(self, name: str, app_ids: Sequence[str]) -> dict[str, int]:
        """``{app_id: last version}`` of the application transactions in the system table
        ``name`` (one refresh of the table for all); absent ones are left out."""
        table = self.open(self.system_path(name))
        if table is None:
            return {}
        path = self.system_path(name)
        versions = {app: self.app_transactions.version(path, table, app) for app in app_ids}
        return {app: int(v) for app, v in versions.items() if v is not None}

    @cached_property
    def storage(self) -> Storage:
        """The warehouse's folder or prefix, to list (:mod:`cdcflow.sinks.storage`)."""
        return Storage(self.root, self.storage_options)

    def mirrors(self) -> list[str]:
        """Folders of the mirror tables (everything but the system folder), on local disk
        and on object stores alike.

        Raises:
            StorageError: the warehouse cannot be listed (:mod:`cdcflow.sinks.faults`).
        """
        store = self.storage
        try:
            return [
                name for name in store.folders() if name != SYSTEM_FOLDER and store.is_table(name)
            ]
        except OSError as exc:
            raise storage_error(exc, self.root, None) from exc

    def resume_table(self, target: str, by: str = "") -> None:
        """Let a table stopped by a schema change take changes again.

        Appends a ``resume`` record to ``_cdcflow/schema_changes``; the next micro-batch
        applies the table's changes again. The changes dead-lettered while it was stopped
        stay in ``_cdcflow/dead_letters`` (code ``TABLE_STOPPED``/``SCHEMA_CHANGE``).
        """
        now = int(time.time() * 1000)
        row: dict[str, Any] = {name: None for name in SCHEMA_CHANGES_SCHEMA.names}
        row.update(
            target_table=target,
            batch_id=-1,
            change="resume",
            applied=True,
            message=f"resumed by {by or 'an operator'}",
            recorded_at_ms=now,
        )
        data = pa.Table.from_pylist([row], schema=SCHEMA_CHANGES_SCHEMA)
        self.append_rows(self.system_path(SCHEMA_CHANGES), data)

    def append_rows(self, path: str, data: pa.Table) -> None:
        """Append ``data`` to the table at ``path`` outside any apply: no application
        transaction, so it is never skipped as a repeat (an operator's record, such as a
        resume or a replay's marks).

        Raises:
            StorageError: the table cannot be written.
        """
        self._append_mapped(path, self.open(path), data, None)
        self._tables.pop(path, None)

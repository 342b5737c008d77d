"""Delta Lake tables through delta-rs: mirrors (SCD type 1), changelog, dead letters.

Layout under the warehouse folder::

    <warehouse>/<database>.<schema>.<table>/   one mirror per source table
    <warehouse>/_cdcflow/...                   the system tables (:mod:`cdcflow.sinks.system_tables`)

Exactly once: every commit of an apply carries the application transaction
``(cdcflow-<pipeline>, apply_id)`` and, in its commit metadata, the Kafka offset ranges the
apply covers; a table whose ``transaction_version`` is already at the apply is skipped, so
an apply finished after a crash changes nothing twice. The apply ids and the offsets they
cover are the warehouse's own (:mod:`cdcflow.apply.offsets`), not Spark's batch ids.

Mirror rows carry ``_cdc_seq`` (the source sequence, :func:`cdcflow.model.seq_key`) and
``_cdc_ts_ms``. The merge only overwrites or deletes a stored row when the incoming
sequence is >= the stored one, and an upsert whose sequence is <= a tombstone of its key
(or below the table's last truncate) is dropped, so late and replayed events never undo
newer ones. See docs/semantics.md.

Change data feed (``change_feed`` per table, docs/decisions.md 58): the table is created
with ``delta.enableChangeDataFeed = true`` (an existing one gets the property before its
next merge). Whatever the option says, a table with the property is merged so that the
feed is exact: a batch of new keys alone is appended in Arrow
(:func:`~cdcflow.sinks.arrow_merge.insert_actions`, read as inserts), every other batch
goes through delta-rs's MERGE, whose commit carries the ``cdc`` files of the rows it
changed, with only the source rows that change something
(:func:`~cdcflow.sinks.arrow_merge.effective_rows`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import RemoveAction

from cdcflow.errors import ApplyError, Code
from cdcflow.images import logical_from_arrow, rows_from_json, rows_to_arrow
from cdcflow.model import NetChange, dumps
from cdcflow.sinks.arrow_merge import (
    TARGET_FILE_ROWS,
    effective_rows,
    insert_actions,
    rewrite_actions,
)
from cdcflow.sinks.faults import storage_error
from cdcflow.sinks.merge import (
    BOOKKEEPING_COLUMNS,
    CHANGE_FEED_PROPERTY,
    DELETE_FLAG,
    PRESENT_PREFIX,
    SEQ_COLUMN,
    SOFT_DELETE_COLUMN,
    TS_COLUMN,
    MergeSpec,
    feeds_changes,
    merge_condition,
    merge_expressions,
    quote_column,
)
from cdcflow.sinks.refresh import current
from cdcflow.sinks.system_tables import (
    SCHEMA_CHANGES,
    SCHEMA_CHANGES_SCHEMA,
    SYSTEM_FOLDER,
)
from cdcflow.sinks.tombstones import TombstoneStore
from cdcflow.types import arrow_type

__all__ = [
    "MERGE_ENGINES",
    "REWRITE_MIN_COLUMNS",
    "DeltaWarehouse",
    "MirrorResult",
    "arrow_schema",
    "table_feeds_changes",
]

#: With ``merge_engine="delta-rs"``, from this many data columns a mirror's batch is still
#: merged in Arrow (:meth:`DeltaWarehouse._rewrite_merge`): delta-rs's MERGE builds a
#: DataFusion plan in O(columns²) (docs/decisions.md 22).
REWRITE_MIN_COLUMNS = 200

#: Who computes a mirror's merge: ``arrow`` (:mod:`cdcflow.sinks.arrow_merge`, the
#: default: only the files holding the batch's keys are rewritten) or ``delta-rs`` (its
#: MERGE; docs/decisions.md 44).
MERGE_ENGINES = ("arrow", "delta-rs")

#: merges computed again when a concurrent rewrite removed a file they read
_MERGE_ATTEMPTS = 3

log = logging.getLogger(__name__)

#: how often an append is made again after a concurrent commit changed the table's
#: metadata or protocol (a shared system table created by two sources at once)
_CREATE_RACE_ATTEMPTS = 3

_UNSAFE = re.compile(r"[^0-9A-Za-z_.\-#$]")


def arrow_schema(table: DeltaTable) -> pa.Schema:
    """The table's schema as a pyarrow schema (delta-rs returns an arro3 one)."""
    return pa.schema(table.schema().to_arrow())


def table_feeds_changes(table: DeltaTable) -> bool:
    """Whether the table records a change data feed (``delta.enableChangeDataFeed``)."""
    return feeds_changes(table.metadata().configuration)


def _images_read(
    upserts: pa.Table, deletes: pa.Table, types: Mapping[str, str], columns: Sequence[str]
) -> pa.Table | None:
    """The merge source's typed rows read columnar (:func:`~cdcflow.images.rows_from_json`):
    the upserts' after images with their key columns taken from their key JSON, then the
    deletes' key JSON; ``None`` where the exact way must decide (a type the reader does
    not read, a value it refuses, a key JSON with other members than the key columns or
    without one of them)."""
    keys = upserts["key"]
    if not len(keys):
        key_columns: list[str] = []
    else:
        key_columns = list(orjson.loads(keys[0].as_py()))
    if any(c not in columns for c in key_columns):
        return None
    after = rows_from_json(upserts["after"], types, columns)
    if after is None:
        return None
    if key_columns:
        # members other than the key columns would override the after image too: refused
        key_values = rows_from_json(keys, types, key_columns, unexpected="error")
        if key_values is None or any(key_values[c].null_count for c in key_columns):
            return None
        for c in key_columns:
            after = after.set_column(after.schema.get_field_index(c), c, key_values[c])
    removed = rows_from_json(deletes["key"], types, columns)
    if removed is None:
        return None
    return pa.concat_tables([after, removed]).combine_chunks()


@dataclass(slots=True)
class MirrorResult:
    """What one mirror commit did."""

    target: str
    path: str
    upserts: int = 0
    deletes: int = 0
    dropped_by_guard: int = 0
    truncated: bool = False
    skipped_replay: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    #: (key JSON, code, reason) of changes the table refused; not applied. ``TYPE_CONFLICT``:
    #: values that do not fit; ``MISSING_SEQ`` (history tables; key may be ``None``): no
    #: source sequence
    rejected: list[tuple[str | None, str, str]] = field(default_factory=list)


class DeltaWarehouse:
    """The Delta tables of one pipeline under one folder.

    Args:
        root: warehouse folder (local path; any delta-rs URI with ``storage_options``).
        pipeline_id: names the application transaction that makes commits idempotent.
        storage_options: passed to delta-rs for object stores.
        merge_engine: who computes the mirrors' merges (:data:`MERGE_ENGINES`).
        target_file_rows: most rows per data file the Arrow merge writes.
    """

    def __init__(
        self,
        root: str,
        pipeline_id: str = "default",
        storage_options: Mapping[str, str] | None = None,
        merge_engine: str = "arrow",
        target_file_rows: int = TARGET_FILE_ROWS,
    ) -> None:
        if merge_engine not in MERGE_ENGINES:
            raise ValueError(f"merge_engine must be one of {MERGE_ENGINES}, not {merge_engine!r}")
        self.merge_engine = merge_engine
        self.target_file_rows = target_file_rows
        self.root = str(root).rstrip("/")
        self.pipeline_id = pipeline_id
        self.app_id = f"cdcflow-{pipeline_id}"
        self.storage_options = dict(storage_options or {})
        #: Delta table properties every table this view creates gets (the log retention
        #: of ``maintenance.log_retention_hours``, set by the batch applier)
        self.table_configuration: dict[str, str] = {}
        #: custom metadata every commit of the current apply carries (its offset ranges)
        self.commit_metadata: dict[str, str] = {}
        self._tables: dict[str, DeltaTable] = {}
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

    def forget(self, path: str) -> None:
        """Drop the cached handle of the table at ``path`` (after a failed write)."""
        self._tables.pop(path, None)

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
            version = table.transaction_version(app_id or self.app_id)
        except (DeltaError, OSError) as exc:  # the log read lazily: damaged, unreadable
            self._tables.pop(path, None)
            raise storage_error(exc, path, self._target_of(path)) from exc
        return version is not None and version >= batch_id

    def commit_properties(
        self,
        batch_id: int,
        app_id: str | None = None,
        extra: Mapping[str, int] | None = None,
        max_commit_retries: int | None = None,
    ) -> CommitProperties:
        """Commit properties of the current apply: its application transaction
        ``(app_id or self.app_id, batch_id)``, the ``extra`` application transactions
        (``{app_id: version}``, in their order), and the apply's :attr:`commit_metadata`
        (the Kafka offset ranges it covers); ``max_commit_retries=0`` commits only on the
        version read (delta-rs's default retries on newer versions)."""
        others = [Transaction(app, version) for app, version in (extra or {}).items()]
        return CommitProperties(
            custom_metadata=dict(self.commit_metadata) or None,
            max_commit_retries=max_commit_retries,
            app_transactions=[Transaction(app_id or self.app_id, batch_id), *others],
        )

    def _commit(self, batch_id: int, retries: int | None = None) -> CommitProperties:
        return self.commit_properties(batch_id, max_commit_retries=retries)

    def append(
        self,
        path: str,
        data: pa.Table,
        batch_id: int,
        transactions: Mapping[str, int] | None = None,
        app_id: str | None = None,
    ) -> bool:
        """Append ``data`` once per batch, with the application ``transactions``
        (``{app_id: version}``) besides the batch's own, ``(app_id or self.app_id,
        batch_id)``.

        Returns ``False`` if the batch was already there.
        """
        if data.num_rows == 0 or self.committed(path, batch_id, app_id):
            return False
        table = self._tables.get(path)  # refreshed by committed()
        commit = self.commit_properties(batch_id, app_id=app_id, extra=transactions)
        self._append_mapped(path, table, data, commit)
        return True

    def _append_mapped(
        self, path: str, table: DeltaTable | None, data: pa.Table, commit: CommitProperties | None
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
        self, path: str, table: DeltaTable | None, data: pa.Table, commit: CommitProperties | None
    ) -> None:
        """Append ``data`` through the cached handle of the table at ``path`` when there is
        one: delta-rs then commits on the snapshot it holds instead of replaying the log
        again (the handle moves to the new version, and :meth:`open` refreshes it before
        any later read); a new table is created from ``path``."""
        for attempt in range(_CREATE_RACE_ATTEMPTS):
            try:
                if table is None:
                    write_deltalake(
                        path,
                        data,
                        mode="append",
                        configuration=self.table_configuration or None,
                        commit_properties=commit,
                        storage_options=self.storage_options or None,
                    )
                else:
                    write_deltalake(table, data, mode="append", commit_properties=commit)
                return
            except CommitFailedError as exc:
                # several sources' first applies create a shared system table at the same
                # moment: the losers' commits (creations, or appends read before another
                # creation landed) fail on its protocol or metadata; nothing of them was
                # committed, so the append is made again on the table as it now is
                last = attempt == _CREATE_RACE_ATTEMPTS - 1
                if last or not DeltaTable.is_deltatable(path, self.storage_options or None):
                    raise
                log.info(
                    "table %s changed under a concurrent commit (%s); appending again", path, exc
                )
                table = DeltaTable(path, storage_options=self.storage_options or None)

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
        versions = {app: table.transaction_version(app) for app in app_ids}
        return {app: int(v) for app, v in versions.items() if v is not None}

    def mirrors(self) -> list[str]:
        """Folders of the mirror tables (everything but the system folder)."""
        if "://" in self.root or not os.path.isdir(self.root):
            return []
        return sorted(
            d
            for d in os.listdir(self.root)
            if d != SYSTEM_FOLDER and os.path.isdir(os.path.join(self.root, d, "_delta_log"))
        )

    # ------------------------------------------------------------------ mirror apply

    def apply_mirror(
        self,
        target: str,
        net: NetChange,
        types: Mapping[str, str],
        key_columns: Sequence[str],
        batch_id: int,
        soft_delete: bool = False,
        full_row_identity: bool = False,
        partition_by: Sequence[str] = (),
        change_feed: bool = False,
    ) -> MirrorResult:
        """Apply one batch's net change to the mirror ``target`` (idempotent per batch).

        Args:
            target: target table name (see :meth:`table_path`).
            net: the batch's net change for this table.
            types: column -> logical type for every column to store (the stored ones
                first; a column missing from the table is added).
            key_columns: the table's key columns, in key order.
            batch_id: micro-batch id; the commit carries it.
            soft_delete: a delete (or truncate) sets ``_deleted`` instead of removing rows.
            full_row_identity: the "key" is the whole row (a table without a primary
                key): key columns may be NULL and are matched NULL-safely.
            partition_by: partition columns of the mirror if this creates it (every
                one a column of ``types``); an existing mirror keeps its layout.
            change_feed: the mirror records a change data feed: created with the
                property, or given it before this batch's merge (never turned off).

        Raises:
            ApplyError: ``TYPE_CONFLICT`` when values do not fit the stored columns.
        """
        path = self.table_path(target)
        result = MirrorResult(target=target, path=path)
        if self.committed(path, batch_id, refresh=False):
            result.skipped_replay = True
            return result

        tombs, watermark = self.tombstones.guard(target)
        rows = net.rows
        if net.truncate_seq is not None:
            watermark = max(watermark or "", net.truncate_seq)
        guard_seq = pc.fill_null(rows["seq"], "")
        keep = pa.array([True] * rows.num_rows, pa.bool_())
        if tombs or watermark:
            stored = pa.array([tombs.get(k) for k in rows["key"].to_pylist()], pa.string())
            blocked_by_tomb = pc.fill_null(pc.less_equal(guard_seq, stored), False)
            keep = pc.invert(pc.and_(pc.invert(rows["is_delete"]), blocked_by_tomb))
            if watermark:
                before_truncate = pc.less(guard_seq, watermark)
                keep = pc.and_(keep, pc.invert(before_truncate))
        result.dropped_by_guard = rows.num_rows - (pc.sum(pc.cast(keep, pa.int64())).as_py() or 0)
        rows = rows.filter(keep)

        upserts = rows.filter(pc.invert(rows["is_delete"]))
        deletes = rows.filter(rows["is_delete"])
        result.upserts, result.deletes = upserts.num_rows, deletes.num_rows

        table = self._tables.get(path)  # refreshed by committed() above
        system = [pa.field(SEQ_COLUMN, pa.string()), pa.field(TS_COLUMN, pa.int64())]
        if soft_delete:
            system.append(pa.field(SOFT_DELETE_COLUMN, pa.bool_()))
        version = None if table is None else table.version()
        columns = self.ensure_table(
            path,
            table,
            types,
            () if full_row_identity else key_columns,
            system,
            partition_by,
            change_feed=change_feed,
        )
        if table is None or table.version() != version:
            table = self.open(path)  # created, or columns added
        stored_types = {f.name: logical_from_arrow(f.type) for f in arrow_schema(table)}
        source = None
        if "moved_from" in upserts.column_names and upserts["moved_from"].null_count < len(upserts):
            upserts = self._fill_from_moved_rows(table, upserts, key_columns)
        if rows.num_rows:
            source, result.rejected = self._checked_merge_source(
                upserts, deletes, stored_types, columns, key_columns
            )
            if result.rejected:
                result.upserts = int(pc.sum(pc.invert(source[DELETE_FLAG])).as_py() or 0)
                result.deletes = source.num_rows - result.upserts

        # truncate first: only rows whose sequence is below it
        commit_done = False
        if net.truncate_seq is not None:
            result.truncated = True
            last_commit = source is None or source.num_rows == 0
            self._truncate(table, net.truncate_seq, batch_id if last_commit else None, soft_delete)
            commit_done = last_commit
            table = self.open(path)

        if source is not None and source.num_rows:
            spec = MergeSpec(
                tuple(columns), tuple(key_columns), batch_id, soft_delete, full_row_identity
            )
            result.metrics = self._merge_rows(table, source, spec)
            commit_done = True
        if not commit_done:
            # nothing to change, but the batch must still count as committed here
            self._mark(table, batch_id)
        return result

    @staticmethod
    def _fill_from_moved_rows(
        table: DeltaTable, upserts: pa.Table, key_columns: Sequence[str]
    ) -> pa.Table:
        """Partial images of rows moved to a new key take their absent columns from the old
        key's stored row (a rare path: SharePlex updates of key columns)."""
        moved = upserts["moved_from"].to_pylist()
        wanted = {m for m in moved if m}
        stored: dict[str, dict] = {}
        data = table.to_pyarrow_table()
        for row in data.to_pylist():
            canon = orjson.loads(
                dumps({k: v for k, v in row.items() if k not in BOOKKEEPING_COLUMNS})
            )
            key = orjson.dumps({k: canon.get(k) for k in key_columns}).decode()
            if key in wanted:
                stored[key] = canon
        afters = upserts["after"].to_pylist()
        partial = upserts["partial"].to_pylist()
        for i, old in enumerate(moved):
            if old and old in stored:
                afters[i] = orjson.dumps({**stored[old], **orjson.loads(afters[i])}).decode()
                partial[i] = False
        upserts = upserts.set_column(
            upserts.schema.get_field_index("after"), "after", pa.array(afters, pa.string())
        )
        return upserts.set_column(
            upserts.schema.get_field_index("partial"), "partial", pa.array(partial, pa.bool_())
        )

    def _mark(self, table: DeltaTable, batch_id: int) -> None:
        """An empty commit that only records the batch's application transaction."""
        empty = pa.Table.from_batches([], schema=arrow_schema(table))
        write_deltalake(
            table,
            empty,
            mode="append",
            commit_properties=self._commit(batch_id),
            storage_options=self.storage_options or None,
        )

    def ensure_table(
        self,
        path: str,
        table: DeltaTable | None,
        types: Mapping[str, str],
        key_columns: Sequence[str],
        system_fields: Sequence[pa.Field],
        partition_by: Sequence[str] = (),
        change_feed: bool = False,
    ) -> list[str]:
        """Create a table (data columns, then ``system_fields``, partitioned by the
        columns ``partition_by`` names, each one of ``types``) or add what it lacks.

        With ``change_feed`` the table records a change data feed
        (:data:`~cdcflow.sinks.merge.CHANGE_FEED_PROPERTY`): a new table is created with
        the property, an existing one without it gets it in a commit of its own (delta-rs
        raises the writer protocol to 4), so the feed starts at that version. The
        property is never turned off here.

        ``key_columns`` are created NOT NULL. A missing data or system column is added as
        nullable, *before* any merge, never via ``merge_schema=True``: delta-rs 1.6.6 copies
        the source's new-column values into rows a guarded merge rewrote but did not update
        (docs/decisions.md 4, tests/sinks/test_delta.py).

        Returns:
            The data columns in table order (bookkeeping and system columns left out).
        """
        if table is None:
            fields = [
                pa.field(c, arrow_type(t), nullable=c not in key_columns) for c, t in types.items()
            ]
            configuration = dict(self.table_configuration)
            if change_feed:
                configuration[CHANGE_FEED_PROPERTY] = "true"
            DeltaTable.create(
                path,
                pa.schema([*fields, *system_fields]),
                mode="ignore",
                partition_by=list(partition_by) or None,
                configuration=configuration or None,
                storage_options=self.storage_options or None,
            )
            return list(types)
        if change_feed and not table_feeds_changes(table):
            table.alter.set_table_properties({CHANGE_FEED_PROPERTY: "true"})
        existing = [f.name for f in arrow_schema(table)]
        new = [c for c in types if c not in existing]
        missing = [pa.field(c, arrow_type(types[c])) for c in new]
        missing += [f for f in system_fields if f.name not in existing]
        if missing:
            table.alter.add_columns(
                [Field.from_arrow(pa.field(f.name, f.type, nullable=True)) for f in missing]
            )
        skip = {*BOOKKEEPING_COLUMNS, *(f.name for f in system_fields)}
        return [c for c in existing if c not in skip] + new

    def copy_renamed_columns(self, target: str, renames: Sequence[tuple[str, str]]) -> None:
        """After a rename ``old -> new``: rows that still hold their value under ``old``
        (written before the rename) move it to ``new``; ``old`` becomes NULL.

        Idempotent: rows already moved have ``new`` set and are left alone.
        """
        path = self.table_path(target)
        table = self.open(path)
        if table is None:
            return
        names = set(arrow_schema(table).names)
        for old, new in renames:
            if old not in names or new not in names:
                continue
            table.update(
                updates={quote_column(new): quote_column(old), quote_column(old): "NULL"},
                predicate=f"{quote_column(new)} IS NULL AND {quote_column(old)} IS NOT NULL",
            )
            table = self.open(path)
        self._tables.pop(path, None)

    def widen_columns(self, target: str, widened: Mapping[str, str]) -> None:
        """Rewrite the mirror with wider column types (``{column: new logical type}``).

        delta-rs 1.6 has no type-widening table feature, so the table is read, cast and
        overwritten with the new schema in one commit (readers see the old or the new
        table, never a mix). Casts are lossless by construction (:func:`cdcflow.types.widen`).
        A replay finds the columns already wide and does nothing.
        """
        path = self.table_path(target)
        table = self.open(path)
        if table is None or not widened:
            return
        schema = arrow_schema(table)
        fields = [
            pa.field(f.name, arrow_type(widened[f.name]), nullable=f.nullable)
            if f.name in widened
            else f
            for f in schema
        ]
        new_schema = pa.schema(fields)
        if new_schema == schema:
            return
        data = table.to_pyarrow_table().cast(new_schema)
        write_deltalake(
            table,
            data,
            mode="overwrite",
            schema_mode="overwrite",
            storage_options=self.storage_options or None,
        )
        self._tables.pop(path, None)

    def _checked_merge_source(
        self,
        upserts: pa.Table,
        deletes: pa.Table,
        types: Mapping[str, str],
        columns: Sequence[str],
        key_columns: Sequence[str],
    ) -> tuple[pa.Table, list[tuple[str | None, str, str]]]:
        """The merge source; net changes whose values do not fit are set aside, not applied.

        The fast path converts the whole batch at once; only when that fails is each net
        change converted alone to find the ones at fault (``TYPE_CONFLICT``), so one bad
        value costs its own key's change, not the table's batch.
        """

        def build(up: pa.Table, gone: pa.Table) -> pa.Table:
            return self._merge_source(up, gone, types, columns, key_columns)

        try:
            return build(upserts, deletes), []
        except ApplyError as exc:
            if exc.code != Code.TYPE_CONFLICT:
                raise
        rejected: list[tuple[str | None, str, str]] = []
        keep_up, keep_del = [], []
        empty = upserts.slice(0, 0)
        for table, keep, is_upsert in ((upserts, keep_up, True), (deletes, keep_del, False)):
            for i in range(table.num_rows):
                one = table.slice(i, 1)
                alone = (one, empty) if is_upsert else (empty, one)
                try:
                    build(*alone)
                except ApplyError as exc:
                    rejected.append((one["key"][0].as_py(), exc.code, exc.message))
                    keep.append(False)
                else:
                    keep.append(True)
        source = build(
            upserts.filter(pa.array(keep_up, pa.bool_())),
            deletes.filter(pa.array(keep_del, pa.bool_())),
        )
        return source, rejected

    def _merge_source(
        self,
        upserts: pa.Table,
        deletes: pa.Table,
        types: Mapping[str, str],
        columns: Sequence[str],
        key_columns: Sequence[str],
    ) -> pa.Table:
        n_up, n_del = upserts.num_rows, deletes.num_rows
        partial = upserts["partial"].to_pylist()
        data = None if any(partial) else _images_read(upserts, deletes, types, columns)
        if data is None:  # the exact way: a dict per row
            after_rows = [orjson.loads(a) for a in upserts["after"].to_pylist()]
            key_rows = [orjson.loads(k) for k in deletes["key"].to_pylist()]
            # the key comes from the key JSON (it may differ from the after image's columns)
            for row, key in zip(after_rows, upserts["key"].to_pylist(), strict=True):
                row.update(orjson.loads(key))
            data = rows_to_arrow(after_rows + key_rows, types, columns)
        data = data.append_column(
            SEQ_COLUMN,
            pa.concat_arrays(
                [
                    upserts["seq"].combine_chunks().cast(pa.string()),
                    deletes["seq"].combine_chunks().cast(pa.string()),
                ]
            ),
        )
        data = data.append_column(
            TS_COLUMN,
            pa.concat_arrays(
                [
                    upserts["ts_ms"].combine_chunks().cast(pa.int64()),
                    deletes["ts_ms"].combine_chunks().cast(pa.int64()),
                ]
            ),
        )
        data = data.append_column(
            DELETE_FLAG, pa.array([False] * n_up + [True] * n_del, pa.bool_())
        )
        if any(partial):
            for c in columns:
                if c in key_columns:
                    continue
                present = [
                    (not p) or (c in r) for r, p in zip(after_rows, partial, strict=True)
                ] + [True] * n_del
                if not all(present):
                    data = data.append_column(PRESENT_PREFIX + c, pa.array(present))
        return data

    def _truncate(
        self, table: DeltaTable, truncate_seq: str, batch_id: int | None, soft_delete: bool
    ) -> None:
        """Remove (or, with ``soft_delete``, flag) the rows stored before a truncate at
        ``truncate_seq``; the commit carries the batch's transaction when ``batch_id`` is
        given (the truncate is the batch's last change to the table)."""
        predicate = (
            f"{quote_column(SEQ_COLUMN)} IS NULL OR {quote_column(SEQ_COLUMN)} < '{truncate_seq}'"
        )
        props = self._commit(batch_id) if batch_id is not None else None
        before = table.version()
        if soft_delete:
            table.update(
                updates={
                    quote_column(SOFT_DELETE_COLUMN): "true",
                    quote_column(SEQ_COLUMN): f"'{truncate_seq}'",
                },
                predicate=f"({predicate}) AND NOT {quote_column(SOFT_DELETE_COLUMN)}",
                commit_properties=props,
            )
        else:
            table.delete(predicate, commit_properties=props)
        if batch_id is not None and table.version() == before:
            # delta-rs commits nothing when no row matched: the batch is recorded alone
            self._mark(table, batch_id)

    def _merge_rows(self, table: DeltaTable, source: pa.Table, spec: MergeSpec) -> dict[str, Any]:
        """Merge the checked merge source into the mirror in one commit that carries the
        batch's transaction; the merge's metrics (delta-rs's names, plus ``merge_s``)."""
        partitioned = bool(table.metadata().partition_columns)
        if table_feeds_changes(table):
            # the feed: new keys alone are an append (read as inserts); any other batch
            # is delta-rs's MERGE, which writes the cdc files (docs/decisions.md 58)
            if not partitioned:
                appended = self._append_new_keys(table, source, spec)
                if appended is not None:
                    return appended
            return self._merge(table, source, spec)
        wide = len(spec.columns) >= REWRITE_MIN_COLUMNS
        arrow = self.merge_engine == "arrow" or wide
        if arrow and not partitioned:
            return self._rewrite_merge(table, source, spec)
        # a partitioned mirror: delta-rs writes each row into its partition's folder, and
        # prunes partitions when the key holds the partition columns (decision 50)
        return self._merge(table, source, spec)

    def _merge(self, table: DeltaTable, source: pa.Table, spec: MergeSpec) -> dict[str, Any]:
        """delta-rs's MERGE of the checked merge source, in one commit with the batch's
        transaction (an empty one when nothing changed); its metrics, plus ``merge_s``.

        Into a table with a change data feed only the source rows that change something
        are merged (:meth:`_effective_source`).
        """
        started = time.perf_counter()
        unchanged_rows = 0
        if table_feeds_changes(table):
            source, unchanged_rows = self._effective_source(table, source, spec)
            if not source.num_rows:
                took = round(time.perf_counter() - started, 4)
                return {"num_source_rows_unchanged": unchanged_rows, "merge_s": took}
        partitions = table.metadata().partition_columns
        on = merge_condition(spec, source, partitions, "IS NOT DISTINCT FROM")
        newer, updates, inserts = merge_expressions(source, spec.columns, spec.soft_delete)
        updates = {quote_column(c): v for c, v in updates.items()}
        inserts = {quote_column(c): v for c, v in inserts.items()}
        before = table.version()
        merger = table.merge(
            source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            commit_properties=self._commit(spec.batch_id),
        )
        is_delete = f"s.{quote_column(DELETE_FLAG)} AND {newer}"
        if spec.soft_delete:
            flag = quote_column(SOFT_DELETE_COLUMN)
            merger = merger.when_matched_update(
                updates={
                    flag: "true",
                    quote_column(SEQ_COLUMN): f"s.{quote_column(SEQ_COLUMN)}",
                    quote_column(TS_COLUMN): f"s.{quote_column(TS_COLUMN)}",
                },
                predicate=is_delete,
            )
        else:
            merger = merger.when_matched_delete(predicate=is_delete)
        metrics = (
            merger.when_matched_update(
                updates=updates, predicate=f"NOT s.{quote_column(DELETE_FLAG)} AND {newer}"
            )
            .when_not_matched_insert(
                updates=inserts, predicate=f"NOT s.{quote_column(DELETE_FLAG)}"
            )
            .execute()
        )
        if table.version() == before:
            # delta-rs commits nothing when no row changed: the batch is recorded alone
            self._mark(table, spec.batch_id)
        if unchanged_rows:
            metrics["num_source_rows_unchanged"] = unchanged_rows
        metrics["merge_s"] = round(time.perf_counter() - started, 4)
        return metrics

    def _effective_source(
        self, table: DeltaTable, source: pa.Table, spec: MergeSpec
    ) -> tuple[pa.Table, int]:
        """The source rows of a merge into a table with a change data feed that change
        something (:func:`~cdcflow.sinks.arrow_merge.effective_rows` says what and why),
        and how many were left out; when none is left the batch is recorded by an empty
        commit, so the caller merges nothing."""
        effective = effective_rows(table, source, spec, self.storage_options)
        left_out = int((~effective).sum())
        if left_out:
            source = source.filter(pa.array(effective))
        if not source.num_rows:
            self._mark(table, spec.batch_id)
        return source, left_out

    def _append_new_keys(
        self, table: DeltaTable, source: pa.Table, spec: MergeSpec
    ) -> dict[str, Any] | None:
        """The merge of a batch whose keys no stored file can hold, as a blind append of
        Arrow-written files (:func:`~cdcflow.sinks.arrow_merge.insert_actions`): a commit
        of ``add`` actions alone, which change data feed readers read as inserts (Delta
        protocol, "Change Data Files"); one with the batch's application transaction.

        Returns:
            The merge metrics (delta-rs's names, plus ``merge_s``), or ``None`` when a
            stored file may hold one of the keys (the caller merges with delta-rs).
        """
        started = time.perf_counter()
        planned = insert_actions(table, source, spec, self.storage_options, self.target_file_rows)
        if planned is None:
            return None
        adds, metrics = planned
        if adds:
            table.create_write_transaction(
                list(adds), "append", table.schema(), commit_properties=self._commit(spec.batch_id)
            )
        else:  # deletes of keys the table never held
            self._mark(table, spec.batch_id)
        metrics["merge_s"] = round(time.perf_counter() - started, 4)
        return metrics

    def _rewrite_merge(
        self, table: DeltaTable, source: pa.Table, spec: MergeSpec
    ) -> dict[str, Any]:
        """The merge of :meth:`_merge`, computed in Arrow
        (:func:`~cdcflow.sinks.arrow_merge.rewrite_actions`) and committed as file actions in one
        commit with the batch's application transaction (an empty one when nothing changes).

        Returns:
            Merge metrics named as delta-rs names them, plus ``merge_s`` (seconds).
        """
        started = time.perf_counter()
        for attempt in range(1, _MERGE_ATTEMPTS + 1):
            if attempt > 1:
                table.update_incremental()
            actions, metrics = rewrite_actions(
                table, source, spec, self.storage_options, self.target_file_rows
            )
            if not actions:
                self._mark(table, spec.batch_id)
                break
            # delta-rs checks no read set for a commit of file actions: committed over a
            # concurrent compaction of the files this merge read, the rewrite would keep
            # their rows twice. A rewrite is therefore committed only on the version it
            # read (no retry on a newer one, so no log refresh before it); losing that
            # race, the merge is computed again on the new version. New keys alone are
            # a blind append, which any version takes.
            rewrites = any(isinstance(a, RemoveAction) for a in actions)
            try:
                table.create_write_transaction(
                    actions,
                    "append",
                    table.schema(),
                    commit_properties=self._commit(spec.batch_id, retries=0 if rewrites else None),
                )
            except CommitFailedError:
                if not rewrites:
                    raise
                log.info("table %s: committed to meanwhile; merging again", table.table_uri)
                continue
            if attempt > 1:
                metrics["merge_attempts"] = attempt
            break
        else:
            raise ApplyError(
                f"the merge into {table.table_uri} found its files rewritten by another "
                f"writer {_MERGE_ATTEMPTS} times; cdcflow maintains its mirrors itself "
                "(stop other OPTIMIZE jobs on them)",
                Code.TABLE_FAULT,
            )
        metrics["merge_s"] = round(time.perf_counter() - started, 4)
        return metrics

    def resume_table(self, target: str, by: str = "") -> None:
        """Let a table stopped by a schema change take changes again.

        Appends a ``resume`` record to ``_cdcflow/schema_changes``; the next micro-batch
        applies the table's changes again. The changes dead-lettered while it was stopped
        stay in ``_cdcflow/dead_letters`` (code ``TABLE_STOPPED``/``SCHEMA_CHANGE``).
        """
        now = int(time.time() * 1000)
        row = {name: None for name in SCHEMA_CHANGES_SCHEMA.names}
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

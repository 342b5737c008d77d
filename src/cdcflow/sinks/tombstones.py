"""The mirrors' deleted keys and truncate watermarks (``_cdcflow/tombstones``), read once.

A type-1 mirror drops an upsert whose sequence is <= a tombstone of its key, or below the
table's last truncate, so a late or replayed change never brings back a row a newer delete
removed (docs/semantics.md; Databricks AUTO CDC keeps deleted keys for the same reason).

Cost (issue 18): each mirror used to read the whole tombstone table (filtered by target)
and commit its own tombstones, so a micro-batch over *n* tables made *n* reads of a table
that itself grew by *n* files a batch. Now:

- the table is read **once per process** into an index (target -> key -> highest
  sequence; target -> truncate watermark), shared by every warehouse view of the same
  folder (the sources of one pipeline run in one process);
- a micro-batch stages the tombstones of every mirror it touches and writes them in
  **one commit** after the mirrors, with the apply's application transaction;
- the index follows the commits made through it; a commit by anyone else (another
  process, a purge) is seen at the next :meth:`TombstoneStore.begin` and the table is
  read again.

Exactly once: a mirror commits before the batch's tombstones. After a crash between the
two, the apply's replay skips the mirror (it holds the apply) but stages its tombstones
again from the same events, and the one commit writes them. A tombstone written twice
(an upgrade finishing an apply an older version started) changes nothing: the highest
sequence wins.

Memory: the index holds every tombstone within the retention
(``apply.tombstone_retention_hours``), about 200 bytes each.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.model import NetChange
from cdcflow.sinks.system_tables import TOMBSTONE_SCHEMA, TOMBSTONES

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse

__all__ = ["TombstoneStore", "tombstone_rows"]

log = logging.getLogger(__name__)


def tombstone_rows(target: str, net: NetChange, batch_id: int, now_ms: int) -> pa.Table:
    """The :data:`~cdcflow.sinks.system_tables.TOMBSTONE_SCHEMA` rows of one mirror's net
    change: one per deleted key, one per new key of a partial key move (``moved_from``:
    its row before the move is gone, and a later partial image of it must find the moved
    row stored, docs/decisions/0064-a-partial-image-of-an-unknown-row-is-a-dead-letter.md),
    and one with a NULL key for a truncate (its watermark)."""
    ends = net.rows["is_delete"]
    if "moved_from" in net.rows.column_names:
        ends = pc.or_(ends, pc.is_valid(net.rows["moved_from"]))
    deletes = net.rows.filter(ends)
    keys = deletes["key"].to_pylist()
    seqs = [s or "" for s in deletes["seq"].to_pylist()]
    if net.truncate_seq is not None:
        keys.append(None)
        seqs.append(net.truncate_seq)
    n = len(keys)
    return pa.table(
        {
            "target_table": pa.array([target] * n, pa.string()),
            "key": pa.array(keys, pa.string()),
            "seq": pa.array(seqs, pa.string()),
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "deleted_at_ms": pa.array([now_ms] * n, pa.int64()),
        },
        schema=TOMBSTONE_SCHEMA,
    )


@dataclass
class _Index:
    """The tombstones of one warehouse folder, as of table version :attr:`version`."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    #: the table version the index reflects (``-1``: no table yet); ``None``: not read yet
    version: int | None = None
    #: the table's id (a table deleted and created again at the same path is another)
    table_id: str | None = None
    keyed: dict[str, dict[str, str]] = field(default_factory=dict)
    watermarks: dict[str, str] = field(default_factory=dict)

    def reset(self, version: int | None, table_id: str | None = None) -> None:
        self.version = version
        self.table_id = table_id
        self.keyed = {}
        self.watermarks = {}

    def add(self, rows: pa.Table) -> None:
        """Fold ``rows`` (TOMBSTONE_SCHEMA) in: the highest sequence per key wins."""
        columns = (rows[c].to_pylist() for c in ("target_table", "key", "seq"))
        for target, key, seq in zip(*columns, strict=True):
            seq = seq or ""
            if key is None:
                if seq > self.watermarks.get(target, ""):
                    self.watermarks[target] = seq
                continue
            keys = self.keyed.setdefault(target, {})
            if seq > keys.get(key, ""):
                keys[key] = seq


def _identity(table: DeltaTable | None) -> tuple[str | None, int]:
    """``(table id, version)`` of the tombstone table; ``(None, -1)``: no table yet."""
    if table is None:
        return None, -1
    # str(): the id is the table's UUID string, though deltalake annotates it int
    return str(table.metadata().id), table.version()


#: warehouse tombstone table path -> its index, shared by the process's warehouse views
_INDEXES: dict[str, _Index] = {}
_INDEXES_LOCK = threading.Lock()


def _index_for(path: str) -> _Index:
    with _INDEXES_LOCK:
        return _INDEXES.setdefault(path, _Index())


class TombstoneStore:
    """The tombstones of one warehouse view (one source's application id).

    The apply of a micro-batch calls :meth:`begin`, then, for each mirror, :meth:`guard`
    before its merge and :meth:`stage` after it (from any thread), then :meth:`flush`
    once.

    Args:
        warehouse: the view whose ``_cdcflow/tombstones`` table, storage options and
            application id are used.
    """

    def __init__(self, warehouse: DeltaWarehouse) -> None:
        self.warehouse = warehouse
        self.path = warehouse.system_path(TOMBSTONES)
        self._index = _index_for(self.path)
        self._staged: list[pa.Table] = []
        self._staged_lock = threading.Lock()

    def begin(self) -> None:
        """Start a micro-batch: drop what a failed one staged, and read the table again
        if anyone but this process's views committed to it since it was read.

        Raises:
            StorageError: the table cannot be read (:mod:`cdcflow.sinks.faults`).
        """
        with self._staged_lock:
            self._staged = []
        index = self._index
        with index.lock:
            if index.version is None:
                self._load()
                return
            if _identity(self.warehouse.open(self.path)) != (index.table_id, index.version):
                log.debug("tombstones changed outside this process: read again")
                self._load()

    def guard(self, target: str) -> tuple[dict[str, str], str | None]:
        """``(key JSON -> highest tombstone sequence, truncate watermark or None)`` of the
        mirror ``target``, as committed before this micro-batch (read-only: do not change
        the dict)."""
        index = self._index
        with index.lock:
            if index.version is None:
                self._load()
            return index.keyed.get(target, {}), index.watermarks.get(target)

    def stage(self, target: str, net: NetChange, batch_id: int) -> None:
        """Keep ``target``'s deleted keys and truncate of this micro-batch for
        :meth:`flush` (thread-safe)."""
        rows = tombstone_rows(target, net, batch_id, int(time.time() * 1000))
        if rows.num_rows:
            with self._staged_lock:
                self._staged.append(rows)

    def flush(self, commit: CommitContext) -> int:
        """Commit the staged tombstones of an apply in one commit carrying its ``commit``
        context (nothing if the apply already wrote them).

        Returns:
            The number of tombstones committed.

        Raises:
            StorageError: the table cannot be written (:mod:`cdcflow.sinks.faults`).
        """
        with self._staged_lock:
            staged, self._staged = self._staged, []
        if not staged:
            return 0
        rows = pa.concat_tables(staged)
        index = self._index
        with index.lock:
            before = index.version
            written = self.warehouse.append(self.path, rows, commit)
            table = self.warehouse.open(self.path)
            now = None if table is None else table.version()
            if written and before is not None and now == before + 1:
                index.table_id = _identity(table)[0]
                index.add(rows)  # ours is the only commit since the index was read
                index.version = now
            elif now != before:
                self._load()  # someone else committed as well (or a replayed apply)
        return rows.num_rows if written else 0

    def accept_rewrite(self, before: int, after: int) -> None:
        """The table went from version ``before`` to ``after`` by a commit that changed
        no row (a compaction): the index stays valid if it was at ``before``."""
        index = self._index
        with index.lock:
            if index.version == before and after == before + 1:
                index.version = after

    def purge(self, retention_hours: float, now_ms: int | None = None) -> int:
        """Delete key tombstones committed more than ``retention_hours`` ago.

        Truncate watermarks (``key`` NULL) are kept. After the purge, a change older than a
        purged tombstone that arrives late can bring its row back: the retention must
        exceed the longest delay a late or replayed event can have (as AUTO CDC's tombstone
        GC threshold). ``0`` keeps tombstones forever.

        Returns:
            The number of tombstones deleted.
        """
        if retention_hours <= 0:
            return 0
        wh = self.warehouse
        table = wh.open(self.path)
        if table is None or "deleted_at_ms" not in table.schema().to_arrow().names:
            return 0  # none yet, or only tombstones older than retention (kept)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cutoff = now_ms - int(retention_hours * 3_600_000)
        with self._index.lock:
            metrics = table.delete(f"key IS NOT NULL AND deleted_at_ms < {cutoff}")
            wh.forget(self.path)
            self._index.reset(None)  # read again when next needed
        return int(metrics.get("num_deleted_rows", 0) or 0)

    def _load(self) -> None:
        """Read the whole table into the index (the caller holds the index lock)."""
        table_id, version = _identity(self.warehouse.open(self.path))
        rows = self.warehouse.read_table(
            self.path, TOMBSTONE_SCHEMA, columns=["target_table", "key", "seq"]
        )
        self._index.reset(version, table_id)
        self._index.add(rows)

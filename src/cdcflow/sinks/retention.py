"""Retention of the ``_cdcflow`` bookkeeping rows: what a pipeline streaming for months
keeps, and what it never lets go.

Every micro-batch appends rows to ``_cdcflow/changelog`` (every event), ``batches``,
``offsets`` and ``progress`` (a few rows each) and, when there are some, to
``dead_letters``. Without retention each grows forever. :func:`expire` deletes rows
older than their table's retention (:class:`RetentionPolicy`), by the wall-clock time
the row was committed, never by source time (a snapshot's rows are new rows of old
source time):

=====================  =================  ==================================================
table                  time column        always kept
=====================  =================  ==================================================
``changelog``          ``committed_at_ms``  rows without a time (written before 0.4.0)
``dead_letters``       ``committed_at_ms``  rows without a time (written before 0.4.0)
``batches``            ``committed_at_ms``  each source's last completed apply
``progress``           ``committed_at_ms``  each source's last batch
``offsets``            ``started_at_ms``    each source's last apply (a pending apply's ranges)
=====================  =================  ==================================================

What exactly-once needs is never a row: the next offset of every partition and the last
completed apply are *application transactions* in the Delta log of ``batches``
(:mod:`cdcflow.apply.offsets`), which a delete keeps, and a pending apply's ranges are the
rows of each source's last ``offsets`` apply, which are kept whatever their age. The
tombstones have their own retention (``apply.tombstone_retention_hours``,
:meth:`cdcflow.sinks.tombstones.TombstoneStore.purge`); the schema log (column history and
table stops), the decoder state and the open transactions are kept whole.

A delete rewrites only the files that hold expired rows (delta-rs ``DeltaTable.delete``,
files pruned on the time column's statistics); the files it removes are deleted from
storage by the next vacuum. Retention follows Kafka's ``retention.ms`` and
``retention.bytes`` (a changelog kept by age, by size, or both) and Delta's own history
retention (``delta.logRetentionDuration``, 30 days, the default here for bookkeeping).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.sinks.system_tables import BATCHES, CHANGELOG, DEAD_LETTERS, OFFSETS, PROGRESS

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from cdcflow.sinks.warehouse import DeltaWarehouse

__all__ = ["Expired", "RetentionPolicy", "expire"]

log = logging.getLogger(__name__)

_HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long the ``_cdcflow`` rows are kept (``maintenance.retention:``); ``0`` keeps a
    table's rows forever.

    Attributes:
        changelog_hours: changelog rows committed longer ago than this are deleted.
        changelog_max_rows: the changelog keeps at most about this many rows, the newest
            (whole micro-batches: a batch's rows share one time, so it may keep a few
            more).
        dead_letters_hours: dead letters committed longer ago than this are deleted.
        batches_hours: ``batches`` rows (per apply and partition: offsets and counts).
        progress_hours: ``progress`` rows (per batch and source: last sequence, lag).
        offsets_hours: ``offsets`` rows (per apply: the ranges it was about to write).
    """

    changelog_hours: float = 168.0
    changelog_max_rows: int = 0
    dead_letters_hours: float = 720.0
    batches_hours: float = 720.0
    progress_hours: float = 720.0
    offsets_hours: float = 720.0


@dataclass(frozen=True, slots=True)
class _Rule:
    """Which rows of one system table can expire."""

    table: str
    time_column: str
    #: the id column whose last value per ``source`` is kept (None: none kept)
    last_id_column: str | None
    hours_attr: str


_RULES = (
    _Rule(CHANGELOG, "committed_at_ms", None, "changelog_hours"),
    _Rule(DEAD_LETTERS, "committed_at_ms", None, "dead_letters_hours"),
    _Rule(BATCHES, "committed_at_ms", "batch_id", "batches_hours"),
    _Rule(PROGRESS, "committed_at_ms", "batch_id", "progress_hours"),
    _Rule(OFFSETS, "started_at_ms", "apply_id", "offsets_hours"),
)


@dataclass(slots=True)
class Expired:
    """What :func:`expire` did to one system table."""

    table: str
    rows_deleted: int = 0
    seconds: float = 0.0
    error: str | None = None

    def describe(self) -> str:
        """One line for people: ``_cdcflow/changelog: 12000 rows expired (0.21 s)``."""
        done = f"{self.rows_deleted} rows expired"
        if self.error:
            done = f"expiry failed: {self.error}"
        return f"_cdcflow/{self.table}: {done} ({self.seconds:.2f} s)"


def expire(
    warehouse: DeltaWarehouse, policy: RetentionPolicy, now_ms: int | None = None
) -> list[Expired]:
    """Delete the expired rows of every ``_cdcflow`` bookkeeping table (module docstring).

    Args:
        warehouse: the warehouse whose system tables are expired (all its sources).
        policy: the retention of each table.
        now_ms: the current time, epoch milliseconds (tests pass their own clock).

    Returns:
        One entry per table that had rows to expire, or whose expiry failed. A failure (a
        commit conflict with another writer, a storage fault) is logged and left for the
        next run, never raised: retention is never worth a stopped stream.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    done = []
    for rule in _RULES:
        hours = getattr(policy, rule.hours_attr)
        max_rows = policy.changelog_max_rows if rule.table == CHANGELOG else 0
        if hours <= 0 and max_rows <= 0:
            continue
        started = time.monotonic()
        result = Expired(rule.table)
        path = warehouse.system_path(rule.table)
        try:
            table = warehouse.open(path)
            if table is not None:
                predicate = _expired_predicate(table, rule, hours, max_rows, now_ms)
                if predicate is not None:
                    metrics = table.delete(predicate)
                    warehouse.forget(path)
                    result.rows_deleted = int(metrics.get("num_deleted_rows", 0) or 0)
        except Exception as exc:  # noqa: BLE001 - tried again at the next run
            result.error = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            warehouse.forget(path)
            log.warning("retention of _cdcflow/%s failed (tried again later): %s", rule.table, exc)
        result.seconds = time.monotonic() - started
        if result.rows_deleted or result.error:
            done.append(result)
    return done


def _expired_predicate(
    table: DeltaTable, rule: _Rule, hours: float, max_rows: int, now_ms: int
) -> str | None:
    """The SQL predicate of the rule's expired rows in ``table`` (``None``: nothing
    expires)."""
    names = table.schema().to_arrow().names
    if rule.time_column not in names:
        return None  # a table from before the time column: its rows are kept
    cutoff_ms = now_ms - int(hours * _HOUR_MS) if hours > 0 else None
    columns = [rule.time_column]
    if rule.last_id_column is not None:
        columns += ["source", rule.last_id_column]
    rows = table.to_pyarrow_table(columns=columns)
    times = rows[rule.time_column]
    if max_rows > 0:
        timed = pc.drop_null(times)
        if len(timed) > max_rows:
            # the oldest row kept: rows older than it go (its batch's rows all stay)
            ordered = pc.sort_indices(timed)
            oldest_kept = timed[ordered[len(timed) - max_rows].as_py()].as_py()
            cutoff_ms = oldest_kept if cutoff_ms is None else max(cutoff_ms, oldest_kept)
    if cutoff_ms is None:
        return None
    if not pc.any(pc.less(times, cutoff_ms)).as_py():
        return None
    predicate = f"{rule.time_column} < {cutoff_ms}"
    if rule.last_id_column is not None:
        predicate += _keep_last(rows, rule.last_id_column)
    return predicate


def _keep_last(rows: pa.Table, id_column: str) -> str:
    """`` AND NOT (...)``: the rows of each source's last id are kept."""
    sources = pc.fill_null(rows["source"], "")
    last = (
        pa.table({"source": sources, "id": rows[id_column]})
        .group_by("source")
        .aggregate([("id", "max")])
    )
    kept = [
        f"(coalesce(source, '') = '{_sql_string(s)}' AND {id_column} >= {i})"
        for s, i in zip(last["source"].to_pylist(), last["id_max"].to_pylist(), strict=True)
        if i is not None
    ]
    return f" AND NOT ({' OR '.join(kept)})" if kept else ""


def _sql_string(value: str) -> str:
    return value.replace("'", "''")

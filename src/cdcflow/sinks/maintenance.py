"""Table maintenance: small files compacted, unreferenced files vacuumed, old log files
cleaned up, so a mirror streamed into for months costs what it did on its first day.

Every micro-batch that changes a table adds files: the Arrow merge writes a batch's new
keys as a file of their own, and the bookkeeping tables (``_cdcflow/changelog``,
``batches``, ``progress``, ...) get one file per batch. :class:`Maintainer` runs after
a micro-batch's apply, on the tables it touched, within a time budget
(``maintenance.budget_s``), one **size-tiered** compaction job per table at a time
(:mod:`cdcflow.sinks.compaction`): the oldest files of a size tier that holds
``compact_min_files`` files or more are merged into one, and no job reads more than
the table's target size: ``mirror_file_bytes`` (16 MiB) for a mirror, so an update of
any key rewrites at most that much (delta-rs writes no deletion vectors, so an update
rewrites its whole file), ``target_file_bytes`` (64 MiB) for the append-only
bookkeeping tables. A compaction's cost follows what the batches since the last one
wrote, never the table. ``cdcflow maintain`` bin-packs every table up to
``target_file_bytes`` at once (delta-rs ``optimize.compact``), as do partitioned tables
after a batch. A table not vacuumed for ``vacuum_every_hours`` is vacuumed: files no
version within ``vacuum_retention_hours`` references are deleted, and log files past the
table's log retention are cleaned up. That retention is ``log_retention_hours`` (24):
every table cdcflow creates gets it as ``delta.logRetentionDuration`` (and as
``delta.deletedFileRetentionDuration``, so checkpoints do not carry a week of removed
files), ``cdcflow maintain`` sets it on older tables that have none, and delta-rs drops
the older log files at each checkpoint (every 100 commits). A table's own setting is never changed.
It bounds more than history: on a local or mounted file system delta-rs lists the whole
``_delta_log`` folder at every commit and every refresh (about 8 µs a file here), so a
mirror committed to every second under Delta's 30-day default would hold 2.6M log
files and spend seconds on each commit (decision 52).

Maintenance runs between micro-batches on the apply's own thread, so it never races a
merge of the same pipeline; a compaction that loses a race to another writer fails its
commit and is tried again after a later batch (a merge that loses a race to a compaction
is computed again: :meth:`cdcflow.sinks.engines._rewrite_merge`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.sinks.compaction import compact_once, data_files, plan
from cdcflow.sinks.retention import Expired, RetentionPolicy, expire

if TYPE_CHECKING:
    from cdcflow.sinks.warehouse import DeltaWarehouse

__all__ = [
    "LOG_RETENTION",
    "TOMBSTONE_RETENTION",
    "MaintenancePolicy",
    "Maintainer",
    "TableMaintenance",
    "log_retention_properties",
    "log_retention_value",
    "small_files",
]

log = logging.getLogger(__name__)

#: a compaction job that took longer than this, in seconds, updates the running estimate
#: of how fast jobs read (:attr:`Maintainer.compact_bytes_per_s`); a shorter one is noise
MEASURED_JOB_S = 0.05


@dataclass(frozen=True, slots=True)
class MaintenancePolicy:
    """When and how the tables are maintained (``maintenance:`` in the configuration).

    Attributes:
        enabled: maintain automatically after micro-batches (``cdcflow maintain`` runs
            whatever this says).
        budget_s: after a micro-batch, no new table is started past this many seconds.
        small_file_bytes: a data file smaller than this is small (size tier 0).
        compact_min_files: a size tier with this many files (or more) is compacted; the
            tiers' fanout (:func:`cdcflow.sinks.compaction.tier`).
        mirror_file_bytes: after a batch, a mirror's files are merged up to this size.
        target_file_bytes: after a batch, the bookkeeping tables' files are merged up to
            this size; ``cdcflow maintain`` packs every table up to it.
        vacuum_every_hours: a table is vacuumed at most this often by a running pipeline
            (``0``: only by ``cdcflow maintain``).
        vacuum_retention_hours: files a version of the last this many hours references
            are kept (readers of older versions, time travel); the Delta default, 168.
        retention: how long the ``_cdcflow`` bookkeeping rows are kept
            (:mod:`cdcflow.sinks.retention`).
        retention_every_hours: a running pipeline expires rows at most this often.
        log_retention_hours: ``delta.logRetentionDuration`` (the history a log keeps,
            for time travel and incremental readers) and
            ``delta.deletedFileRetentionDuration`` (how long checkpoints carry a removed
            file's tombstone) of the tables cdcflow creates, and of older ones without
            them when ``cdcflow maintain`` runs; ``None``: not set (Delta's defaults are
            30 and 7 days).
    """

    enabled: bool = True
    budget_s: float = 2.0
    small_file_bytes: int = 1024 * 1024
    compact_min_files: int = 16
    mirror_file_bytes: int = 16 * 1024 * 1024
    target_file_bytes: int = 64 * 1024 * 1024
    vacuum_every_hours: float = 24.0
    vacuum_retention_hours: float = 168.0
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    retention_every_hours: float = 1.0
    log_retention_hours: float | None = 24.0


#: the Delta table properties :attr:`MaintenancePolicy.log_retention_hours` sets: how long
#: log files are kept, and how long a removed file's tombstone stays in checkpoints (past
#: the log's retention no version that could read the file can be rebuilt; a mirror
#: removes a file or two every batch, and a week of tombstones made 68 MiB checkpoints)
LOG_RETENTION = "delta.logRetentionDuration"
TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"


def log_retention_value(hours: float) -> str:
    """A Delta interval for ``hours`` (``"interval 86400 seconds"``; whole seconds, at
    least one)."""
    return f"interval {max(1, round(hours * 3600))} seconds"


def log_retention_properties(hours: float) -> dict[str, str]:
    """The table properties of ``log_retention_hours`` (:data:`LOG_RETENTION`,
    :data:`TOMBSTONE_RETENTION`)."""
    value = log_retention_value(hours)
    return {LOG_RETENTION: value, TOMBSTONE_RETENTION: value}


@dataclass(slots=True)
class TableMaintenance:
    """What maintenance did to one table."""

    path: str
    files_before: int = 0
    files_after: int = 0
    compacted: dict[str, Any] = field(default_factory=dict)
    vacuumed: int = 0
    #: the log retention ``cdcflow maintain`` gave a table that had none, hours
    log_retention_hours: float | None = None
    seconds: float = 0.0
    error: str | None = None

    def describe(self) -> str:
        """One line for people: ``<path>: 40 -> 2 files, 12 vacuumed (0.31 s)``."""
        done = f"{self.files_before} -> {self.files_after} files"
        if self.vacuumed:
            done += f", {self.vacuumed} vacuumed"
        if self.log_retention_hours is not None:
            done += f", log kept {self.log_retention_hours:g} h"
        if self.error:
            done += f", failed: {self.error}"
        return f"{self.path}: {done} ({self.seconds:.2f} s)"


def small_files(table: DeltaTable, small_file_bytes: int) -> tuple[int, int]:
    """``(small data files, all data files)`` of the table's current version."""
    sizes = pa.table(table.get_add_actions())["size_bytes"].to_pylist()
    return sum(1 for s in sizes if s < small_file_bytes), len(sizes)


class ExpiryClock:
    """When the ``_cdcflow`` bookkeeping rows were last expired, shared by the warehouse
    views of one process: the rows of every source are expired by one of them, once per
    ``retention_every_hours``, not by each (the tables are the whole warehouse's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expired_at: float | None = None

    def due(self, every_s: float) -> bool:
        """Whether an expiry is due now (the first call: yes); if so, it is counted as
        done now, so concurrent callers get ``False``."""
        with self._lock:
            now = time.monotonic()
            if self._expired_at is not None and now - self._expired_at < every_s:
                return False
            self._expired_at = now
            return True


class Maintainer:
    """Compacts and vacuums the tables of one warehouse view (module docstring).

    Args:
        warehouse: whose tables (and storage options) are maintained.
        policy: when and how.
        expiry_clock: shared with the maintainers of the other sources of a pipeline
            (default: this maintainer's own).
    """

    def __init__(
        self,
        warehouse: DeltaWarehouse,
        policy: MaintenancePolicy | None = None,
        expiry_clock: ExpiryClock | None = None,
    ):
        self.warehouse = warehouse
        self.policy = policy or MaintenancePolicy()
        self.expiry_clock = expiry_clock or ExpiryClock()
        #: table path -> monotonic time of its last vacuum by this process (or first sight)
        self._vacuumed_at: dict[str, float] = {}
        #: table path -> batches that touched it since it was last looked at
        self._touches: dict[str, int] = {}
        #: how fast compaction jobs read, bytes/s (a running estimate: a job that would not
        #: fit in what is left of a batch's budget waits for the next batch)
        self.compact_bytes_per_s: float = 32 * 1024 * 1024

    def expire_due(self, now_ms: int | None = None) -> list[Expired]:
        """Expire the ``_cdcflow`` bookkeeping rows past their retention
        (:func:`cdcflow.sinks.retention.expire`) if ``retention_every_hours`` have passed
        since the last time, by this maintainer or another one sharing its
        :class:`ExpiryClock` (the first call expires at once); what it did, per table."""
        if not self.policy.enabled:
            return []
        if not self.expiry_clock.due(self.policy.retention_every_hours * 3600):
            return []
        done = expire(self.warehouse, self.policy.retention, now_ms)
        for result in done:
            log.info("retention: %s", result.describe())
        return done

    def policy_for(
        self, path: str, overrides: Mapping[str, Mapping[str, Any]] | None
    ) -> MaintenancePolicy:
        """The policy of the table at ``path``: the pipeline's, with the table's own keys
        (``tables[].maintenance``) over it."""
        own = (overrides or {}).get(path)
        return dataclasses.replace(self.policy, **own) if own else self.policy

    def after_batch(
        self, paths: Sequence[str], overrides: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[TableMaintenance]:
        """Maintain the tables at ``paths`` (those a micro-batch touched) that need it,
        until :attr:`MaintenancePolicy.budget_s` is spent; the rest wait for a later
        batch. A table is looked at only every ``compact_min_files`` batches that touch
        it (a batch adds a file or two), so a batch over 500 tables does not list 500
        tables' files. A table's failure is logged and left for later, never raised.

        Args:
            paths: the tables' folders.
            overrides: ``{path: {policy key: value}}``, tables' own settings
                (:class:`~cdcflow.apply.options.TableMaintenanceOptions`).
        """
        if not self.policy.enabled:
            return []
        started = time.monotonic()
        due = []
        for path in paths:
            policy = self.policy_for(path, overrides)
            if not policy.enabled:
                continue
            every_s = policy.vacuum_every_hours * 3600
            touches = self._touches.get(path, 0) + 1
            self._touches[path] = touches
            # the first sight starts the vacuum clock: a pipeline's start is not a schedule
            first_vacuum = self._vacuumed_at.setdefault(path, started)
            vacuum_due = every_s > 0 and started - first_vacuum >= every_s
            if touches >= policy.compact_min_files or vacuum_due:
                due.append((path, policy))
        done: list[TableMaintenance] = []
        for path, policy in due:
            left_s = self.policy.budget_s - (time.monotonic() - started)
            if left_s <= 0:
                break  # the rest stay due for the next batch
            self._touches[path] = 0
            # the first job of a batch always runs (a big job is never starved); a later
            # one only if it fits in what is left of the budget
            compacted = any(r.compacted for r in done)
            result = self._maintain(path, policy, force=False, left_s=left_s if compacted else None)
            if result is not None:
                done.append(result)
                log.info("maintenance: %s", result.describe())
        return done

    def run_all(
        self, paths: Sequence[str], overrides: Mapping[str, Mapping[str, Any]] | None = None
    ) -> list[TableMaintenance]:
        """``cdcflow maintain``: compact every table at ``paths`` with two small files or
        more, vacuum it and clean up its log, whatever the budget and the schedule (a
        table whose own settings say ``enabled: false`` is left alone)."""
        done = []
        for path in paths:
            if ((overrides or {}).get(path) or {}).get("enabled") is False:
                continue  # the table's own word; the pipeline's enabled is not asked here
            result = self._maintain(path, self.policy_for(path, overrides), force=True)
            if result is not None:
                done.append(result)
        return done

    def settle_log_retention(self, path: str, policy: MaintenancePolicy) -> bool:
        """Give the table at ``path`` the policy's ``log_retention_hours``
        (:func:`log_retention_properties`) where it has no such property (a table made
        before 0.4.0; a value someone set is kept). One metadata commit; ``True`` when
        made. Only for ``cdcflow maintain``, which holds the pipeline's lease: a metadata
        commit conflicts with every concurrent write of the table.

        Raises:
            deltalake exceptions / OSError: the table could not be read or committed to.
        """
        hours = policy.log_retention_hours
        table = self.warehouse.open(path)
        if hours is None or table is None:
            return False
        have = table.metadata().configuration
        missing = {k: v for k, v in log_retention_properties(hours).items() if k not in have}
        if not missing:
            return False
        table.alter.set_table_properties(missing, raise_if_not_exists=False)
        self.warehouse.forget(path)
        log.info("table %s: %s", path, ", ".join(f"{k} = {v}" for k, v in missing.items()))
        return True

    def _maintain(
        self, path: str, policy: MaintenancePolicy, force: bool, left_s: float | None = None
    ) -> TableMaintenance | None:
        """Compact and vacuum one table if due; ``left_s``: a compaction job estimated
        (:attr:`compact_bytes_per_s`) to take longer is left due for the next batch."""
        log_retention_error = None
        log_retention_set = False
        if force:  # before the table is read: a metadata commit conflicts with a rewrite
            try:
                log_retention_set = self.settle_log_retention(path, policy)
            except Exception as exc:  # noqa: BLE001 - reported, the rest still runs
                log_retention_error = str(exc).splitlines()[0][:300]
                self.warehouse.forget(path)
        table = self.warehouse.open(path)
        if table is None:
            return None
        mirror = not path.startswith(self.warehouse.system_path(""))
        target = policy.mirror_file_bytes if mirror else policy.target_file_bytes
        partitioned = bool(table.metadata().partition_columns)
        files = data_files(table)
        total = len(files)
        if force or partitioned:  # delta-rs bin-packs every file under its target
            small = sum(1 for f in files if f.size_bytes < policy.small_file_bytes)
            compact = small >= (2 if force else policy.compact_min_files)
        else:
            job = plan(files, policy.small_file_bytes, target, policy.compact_min_files)
            compact = bool(job)
            job_s = sum(f.size_bytes for f in job) / self.compact_bytes_per_s
            if compact and left_s is not None and job_s > left_s:
                compact = False
                self._touches[path] = policy.compact_min_files  # due at the next batch
        last = self._vacuumed_at.get(path)
        every_s = policy.vacuum_every_hours * 3600
        vacuum = force or (every_s > 0 and last is not None and time.monotonic() - last >= every_s)
        if not compact and not vacuum:
            return None
        result = TableMaintenance(path, files_before=total, files_after=total)
        if log_retention_set:
            result.log_retention_hours = policy.log_retention_hours
        result.error = log_retention_error
        started = time.monotonic()
        try:
            if compact:
                before = table.version()
                if force or partitioned:
                    result.compacted = table.optimize.compact(
                        target_size=policy.target_file_bytes if force else target,
                        max_concurrent_tasks=2,
                    )
                else:
                    job_started = time.monotonic()
                    result.compacted = compact_once(
                        table,
                        policy.small_file_bytes,
                        target,
                        policy.compact_min_files,
                        sort_by_key=mirror,
                        storage_options=self.warehouse.storage_options,
                    )
                    took_s = time.monotonic() - job_started
                    if took_s > MEASURED_JOB_S:  # measured well enough to count
                        rate = result.compacted["bytesRemoved"] / took_s
                        self.compact_bytes_per_s = (self.compact_bytes_per_s + rate) / 2
                    if result.compacted["more"]:  # the next job at the next batch
                        self._touches[path] = policy.compact_min_files
                    table = self.warehouse.open(path) or table  # vacuum needs the new version
                if path == self.warehouse.tombstones.path:  # no data changed: keep its index
                    self.warehouse.tombstones.accept_rewrite(before, table.version())
            if vacuum:
                self._vacuumed_at[path] = time.monotonic()
                removed = table.vacuum(  # whole hours: rounded up, never shorter than asked
                    retention_hours=math.ceil(policy.vacuum_retention_hours),
                    dry_run=False,
                    enforce_retention_duration=False,
                )
                result.vacuumed = len(removed)
                table.cleanup_metadata()
        except Exception as exc:  # noqa: BLE001 - tried again after a later batch
            result.error = str(exc).splitlines()[0][:300]
            log.warning("maintenance of %s failed (tried again later): %s", path, result.error)
            self.warehouse.forget(path)
        refreshed = self.warehouse.open(path)
        if refreshed is not None:
            result.files_after = small_files(refreshed, policy.small_file_bytes)[1]
        result.seconds = time.monotonic() - started
        if (
            not compact
            and not result.vacuumed
            and result.error is None
            and result.log_retention_hours is None
        ):
            return None  # a vacuum that found nothing is not worth a line
        return result

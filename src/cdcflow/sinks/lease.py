"""One run per pipeline: a lease per (pipeline, warehouse), on local disk and object stores.

The lease is a small Delta table of its own, ``<warehouse>/_cdcflow/leases/<pipeline_id>``,
without data files: its table properties (``cdcflow.lease.*``) say who holds it (host, pid,
a random token), since when, when it was last renewed and for how long (TTL). Every
acquire, renewal, takeover and release is one metadata-only commit made on the version just
read, so each is a compare-and-swap:

- the commit writes ``_delta_log/<version + 1>.json`` put-if-absent (a rename that does not
  replace on local disk, ``If-None-Match: *`` on S3 with delta-rs 1.x), and
- delta-rs never rebases the loser onto the winner: ``max_commit_retries=0`` (without it a
  second *create* of the table is committed as version 1, and a blind append always is;
  two property changes also conflict as "Metadata changed since last commit").

The loser of a race reads the table again and sees the winner. docs/decisions.md (21) has
the measurements and what a store needs for this to hold.

A holder renews every ``ttl_s / 3`` seconds from a daemon thread. A lease not renewed for
longer than its TTL can be taken over (a SIGKILLed run does not block the next one
forever), and at once when its holder ran in this process table (same boot and pid
namespace) and that pid is gone. Expiry compares the holder's wall clock with the
contender's: clocks must agree to well under the TTL (NTP does). A holder whose lease was
taken over, released by someone else, or not renewed within its TTL notices on its next
renewal: :attr:`PipelineLease.lost` becomes true and ``on_lost`` is called once.

The holder does not wait for a renewal's answer to know its lease is running out: it
counts its own validity (from the start of its last successful renewal, on the
monotonic clock) and :attr:`PipelineLease.lost` turns true ``ttl_s / 3`` before that
validity ends, whatever the renewal thread is doing (a renewal stuck in a request that
hangs on a store cannot keep it held). That margin is the time a commit checked against
the lease has to land before a contender may take the lease over (decision 69).

Example::

    with PipelineLease("s3://lake/warehouse", "orders", storage_options=opts) as lease:
        ...  # check lease.lost before each commit

This module is storage only: it imports nothing from ``cdcflow.apply`` or ``cdcflow.runtime.pipeline``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from cdcflow.errors import LeaseHeld, LeaseLost
from cdcflow.sinks.faults import storage_error
from cdcflow.sinks.refresh import current
from cdcflow.sinks.system_tables import LEASES, SYSTEM_FOLDER

__all__ = ["DEFAULT_TTL_S", "LeaseOwner", "LeaseState", "PipelineLease"]

log = logging.getLogger(__name__)

#: a holder that stopped renewing is taken over after this many seconds
DEFAULT_TTL_S = 60.0
#: as the warehouse's table folder names (:mod:`cdcflow.sinks.warehouse`)
_UNSAFE = re.compile(r"[^0-9A-Za-z_.\-#$]")
_PREFIX = "cdcflow.lease."
#: a renewal every 20 s is a commit: checkpoint every 100 and drop log files older than an
#: hour (each decision reads the newest version first, so no commit is made on an old one)
_TABLE_SETTINGS = {
    "delta.checkpointInterval": "100",
    "delta.logRetentionDuration": "interval 1 hours",
}
_SCHEMA = pa.schema([("unused", pa.string())])  # a Delta table needs one column; no rows
#: read-decide-commit rounds before giving up on a contended lease
_ATTEMPTS = 5


# --------------------------------------------------------------------------- processes


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _node() -> str:
    """Where a pid means something: boot id and pid namespace (Linux), else the host name.

    Two containers may share a host name but not a pid namespace, and a reboot reuses pids.
    """
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return f"{boot}/{ns}" if boot and ns else f"host:{socket.gethostname()}"


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time in clock ticks since boot)`` of a pid, from /proc (Linux)."""
    text = _read(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _one_line(text: object, limit: int = 300) -> str:
    out = " ".join(str(text).split())
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LeaseOwner:
    """Who holds (or wants) a lease.

    Attributes:
        host: host name, for people.
        pid: process id.
        token: random, unique per run: the lease is ours only while it carries our token.
        node: boot id and pid namespace (see :func:`_node`): where ``pid`` is meaningful.
        started: the process's start time in clock ticks (Linux), against pid reuse.
    """

    host: str
    pid: int
    token: str
    node: str = ""
    started: str = ""

    @classmethod
    def current(cls) -> LeaseOwner:
        """This process, with a fresh token."""
        stat = _proc_stat(os.getpid())
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            token=secrets.token_hex(8),
            node=_node(),
            started=stat[1] if stat else "",
        )

    def local(self) -> bool:
        """Whether this process can see the owner's pid (same boot and pid namespace)."""
        return bool(self.node) and self.node == _node()

    def dead(self) -> bool:
        """``True`` only when known: the owner is local and its pid is gone, a zombie, or
        now a process started at another time. A remote owner is never known dead."""
        if not self.local():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # alive, another user's
        stat = _proc_stat(self.pid)
        if stat is None:
            return False
        state, started = stat
        return state in ("Z", "X") or bool(self.started and started != self.started)


@dataclass(frozen=True)
class LeaseState:
    """The lease as one version of the lease table holds it.

    Attributes:
        owner: the holder.
        pipeline_id: the pipeline it is the lease of.
        acquired_at_ms: when the holder took it (epoch ms, holder's clock).
        renewed_at_ms: the holder's last renewal (epoch ms, holder's clock).
        ttl_ms: after ``renewed_at_ms + ttl_ms`` anyone may take it over.
        released: the holder gave it up; anyone may take it.
        version: the lease table version read (``-1``: not read from a table).
    """

    owner: LeaseOwner
    pipeline_id: str
    acquired_at_ms: int
    renewed_at_ms: int
    ttl_ms: int
    released: bool = False
    version: int = -1

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.renewed_at_ms > self.ttl_ms

    def properties(self) -> dict[str, str]:
        o = self.owner
        values = {
            "host": o.host,
            "pid": str(o.pid),
            "token": o.token,
            "node": o.node,
            "started": o.started,
            "pipeline_id": self.pipeline_id,
            "acquired_at_ms": str(self.acquired_at_ms),
            "renewed_at_ms": str(self.renewed_at_ms),
            "ttl_ms": str(self.ttl_ms),
            "released": "true" if self.released else "false",
        }
        return {_PREFIX + k: v for k, v in values.items()}

    @classmethod
    def from_properties(cls, conf: Mapping[str, str], version: int) -> LeaseState | None:
        """The state in a table's properties, ``None`` if they hold no lease."""
        v = {k[len(_PREFIX) :]: s for k, s in conf.items() if k.startswith(_PREFIX)}
        if "token" not in v:
            return None
        return cls(
            owner=LeaseOwner(
                host=v.get("host", "?"),
                pid=int(v.get("pid") or 0),
                token=v["token"],
                node=v.get("node", ""),
                started=v.get("started", ""),
            ),
            pipeline_id=v.get("pipeline_id", ""),
            acquired_at_ms=int(v.get("acquired_at_ms") or 0),
            renewed_at_ms=int(v.get("renewed_at_ms") or 0),
            ttl_ms=int(v.get("ttl_ms") or 0),
            released=v.get("released") == "true",
            version=version,
        )


# --------------------------------------------------------------------------- the lease


class PipelineLease:
    """The lease that lets one run of ``pipeline_id`` write to the warehouse at ``root``.

    Args:
        root: warehouse folder or delta-rs URI (``s3://...``), as
            :class:`~cdcflow.sinks.warehouse.DeltaWarehouse` takes it.
        pipeline_id: the configuration's ``pipeline_id``.
        storage_options: passed to delta-rs for object stores.
        ttl_s: seconds without renewal after which another run may take the lease over.
        owner: who we are (default: this process, with a fresh token).
        on_lost: called once, from the renewal thread (or the caller of :meth:`renew`),
            with a one-line reason when the lease is lost.
        renew_every_s: seconds between renewals by the daemon thread that :meth:`acquire`
            starts (default ``ttl_s / 3``); ``0``: no thread, the caller calls :meth:`renew`.
        clock: wall clock in epoch seconds (tests shift it to expire a lease).

    Attributes:
        path: the lease table, ``<root>/_cdcflow/leases/<pipeline_id>``.
    """

    def __init__(
        self,
        root: str,
        pipeline_id: str,
        storage_options: Mapping[str, str] | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        owner: LeaseOwner | None = None,
        on_lost: Callable[[str], None] | None = None,
        renew_every_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, not {ttl_s}")
        self.root = str(root).rstrip("/")
        self.pipeline_id = pipeline_id
        self.path = f"{self.root}/{SYSTEM_FOLDER}/{LEASES}/{_UNSAFE.sub('_', pipeline_id)}"
        self.storage_options = dict(storage_options or {})
        self.ttl_ms = int(ttl_s * 1000)
        self.renew_every_s = ttl_s / 3 if renew_every_s is None else renew_every_s
        self.owner = owner or LeaseOwner.current()
        self.on_lost = on_lost
        self._clock = clock
        self._lock = threading.RLock()  # one read-decide-commit at a time in this process
        self._lost_lock = threading.Lock()  # never held across a request to the store
        #: the lease counts as lost this long before its validity ends (module docstring)
        self.margin_s = ttl_s / 3
        self._table: DeltaTable | None = None
        self._opened_at = 0  # the version _table was opened at
        self._state: LeaseState | None = None  # ours, as last committed
        self._valid_until = 0.0  # monotonic: others may take the lease over after this
        self._lost_reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ state

    @property
    def held(self) -> bool:
        """Acquired, not released, not lost (:attr:`lost`)."""
        return self._state is not None and not self.lost

    @property
    def lost(self) -> bool:
        """The lease was taken over, given up by someone else, or not renewed in time:
        its validity ends within :attr:`margin_s` (checked now, not at the next renewal;
        ``on_lost`` is called once, from the caller's thread, when this finds it)."""
        if self._lost_reason is None and self._running_out():
            self._lose(
                f"pipeline {self.pipeline_id!r} stops: its lease {self.path} was not renewed "
                f"for {self.ttl_ms / 1000 - self.margin_s:.0f} s (TTL {self.ttl_ms / 1000:g} s, "
                "the store did not answer), so another run may take it over"
            )
        return self._lost_reason is not None

    def _running_out(self) -> bool:
        """Held, and less than :attr:`margin_s` left of its validity."""
        return self._state is not None and time.monotonic() >= self._valid_until - self.margin_s

    @property
    def lost_reason(self) -> str | None:
        return self._lost_reason

    def fence(self) -> None:
        """Raise :class:`~cdcflow.errors.LeaseLost` (with :attr:`lost_reason`) if the
        lease is lost (:attr:`lost`): the check a writer makes before each commit."""
        if self.lost:
            raise LeaseLost(self._lost_reason or "")

    def read(self) -> LeaseState | None:
        """The lease as stored now (``None``: never taken).

        Raises:
            deltalake.exceptions.DeltaError: the store cannot be read.
        """
        with self._lock:  # the renewal thread uses the same table object
            table = self._refresh()
            if table is None:
                return None
            return LeaseState.from_properties(table.metadata().configuration, table.version())

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _refresh(self) -> DeltaTable | None:
        try:
            self._table, self._opened_at = current(
                self._table, self._opened_at, self.path, self.storage_options
            )
        except TableNotFoundError:
            return None
        return self._table

    def _commit(self, state: LeaseState) -> bool:
        """Commit ``state`` on the version just read. ``False``: another commit came first."""
        assert self._table is not None
        try:
            self._table.alter.set_table_properties(
                state.properties(),
                raise_if_not_exists=False,
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError as exc:
            log.debug("lease %s: commit lost a race: %s", self.path, _one_line(exc))
            return False
        return True

    def _create(self, state: LeaseState) -> bool:
        """Create the lease table holding ``state``. ``False``: another process created it."""
        try:
            DeltaTable.create(
                self.path,
                _SCHEMA,
                mode="error",
                name="cdcflow lease",
                description=f"which run of pipeline {self.pipeline_id!r} may write here",
                configuration={**_TABLE_SETTINGS, **state.properties()},
                storage_options=self.storage_options or None,
                raise_if_key_not_exists=False,
                # without this a create that finds version 0 taken commits as version 1
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except DeltaError as exc:
            self._table = None
            if self._refresh() is None:
                raise  # not a race: the store refused (permissions, credentials, ...)
            log.debug("lease %s: created by another process first: %s", self.path, _one_line(exc))
            return False
        return True

    # ------------------------------------------------------------------ acquire

    def acquire(self) -> PipelineLease:
        """Take the lease, or refuse: it is held by a live run that keeps renewing it.

        A lease that was released, not renewed for longer than its TTL, or held by a pid of
        this process table that no longer runs is taken over. Starts the renewal thread.

        Returns:
            ``self``.

        Raises:
            LeaseHeld: ``PIPELINE_RUNNING``, one line naming the holder and what to do.
            StorageError: the store cannot be read or written (disk full, permissions):
                one line naming the lease's path, the cause and the fix.
        """
        try:
            return self._acquire()
        except (DeltaError, OSError) as exc:
            raise storage_error(exc, self.path) from exc

    def _acquire(self) -> PipelineLease:
        with self._lock:
            if self.held:
                return self
            current: LeaseState | None = None
            for _ in range(_ATTEMPTS):
                started = time.monotonic()
                now = self._now_ms()
                mine = LeaseState(self.owner, self.pipeline_id, now, now, self.ttl_ms)
                current = self.read()
                if current is None:
                    won = self._create(mine)
                elif current.owner.token == self.owner.token and not current.released:
                    won, mine = True, current  # our commit landed though its reply was lost
                elif self._free(current, now):
                    won = self._commit(mine)
                else:
                    raise LeaseHeld(self._held_message(current, now))
                if won:
                    self._start(mine, started)
                    return self
            raise LeaseHeld(
                f"pipeline {self.pipeline_id!r}: the lease {self.path} changed hands "
                f"{_ATTEMPTS} times while this run tried to take it; another run is starting, "
                "check for duplicate supervisors"
            )

    def _free(self, current: LeaseState, now_ms: int) -> bool:
        if current.released:
            return True
        o = current.owner
        if current.expired(now_ms):
            log.warning(
                "pipeline %r: taking over the lease of host %s pid %s, not renewed for %.0f s "
                "(TTL %.0f s)",
                self.pipeline_id,
                o.host,
                o.pid,
                (now_ms - current.renewed_at_ms) / 1000,
                current.ttl_ms / 1000,
            )
            return True
        if o.dead():
            log.warning(
                "pipeline %r: taking over the lease of pid %s on this host, which no longer runs",
                self.pipeline_id,
                o.pid,
            )
            return True
        return False

    def _held_message(self, current: LeaseState, now_ms: int) -> str:
        o = current.owner
        wait_s = max(1, math.ceil((current.renewed_at_ms + current.ttl_ms - now_ms) / 1000))
        if o.local():
            stop = f"stop that process (kill {o.pid})"
        else:
            stop = f"stop that process on {_one_line(o.host, 80)}"
        return (
            f"pipeline {self.pipeline_id!r} is already running on host {_one_line(o.host, 80)} "
            f"(pid {o.pid}) since {_iso(current.acquired_at_ms)} (lease {self.path}, renewed "
            f"{max(0, now_ms - current.renewed_at_ms) / 1000:.0f} s ago); {stop}, or if it "
            f"died without releasing its lease, run again in {wait_s} s"
        )

    def _start(self, mine: LeaseState, started: float) -> None:
        self._state = mine
        self._valid_until = started + self.ttl_ms / 1000
        self._lost_reason = None
        self._stop = threading.Event()
        if self.renew_every_s > 0:
            self._thread = threading.Thread(
                target=self._renew_loop,
                name=f"cdcflow-lease-{self.pipeline_id}",
                daemon=True,
            )
            self._thread.start()

    # ------------------------------------------------------------------ renew

    def renew(self) -> None:
        """Renew the lease now (the thread does this every ``renew_every_s``).

        Raises:
            LeaseLost: ``LEASE_LOST``: another run took the lease over, it was released or
                removed by someone else, or it was not renewed within its TTL. ``on_lost``
                has been called.
            deltalake.exceptions.DeltaError: the store cannot be reached (the lease is still
                ours until its TTL; call again).
        """
        if self._state is None and self._lost_reason is None:
            raise LeaseLost(f"pipeline {self.pipeline_id!r}: the lease {self.path} is not held")
        reason = self._renew()
        if reason is not None:
            self._lose(reason)
            raise LeaseLost(reason)

    def _renew(self) -> str | None:
        """Renew; the reason the lease is lost, or ``None`` when renewed."""
        with self._lock:
            if self._lost_reason is not None or self._state is None:
                return self._lost_reason
            started = time.monotonic()
            for _ in range(_ATTEMPTS):
                current = self.read()
                if current is None or current.owner.token != self.owner.token or current.released:
                    return self._lost_message(current)
                mine = replace(self._state, renewed_at_ms=self._now_ms(), version=-1)
                if self._commit(mine):
                    self._state = mine
                    self._valid_until = started + self.ttl_ms / 1000
                    return None
            return (
                f"pipeline {self.pipeline_id!r} stops: its lease {self.path} kept changing "
                "while it renewed it; another run is competing for it"
            )

    def _lost_message(self, current: LeaseState | None) -> str:
        head = f"pipeline {self.pipeline_id!r} stops: its lease {self.path}"
        if current is None:
            return f"{head} was removed; start the pipeline again"
        o = current.owner
        if current.owner.token == self.owner.token:
            return f"{head} was released by someone else; start the pipeline again"
        return (
            f"{head} was taken over by host {_one_line(o.host, 80)} (pid {o.pid}) at "
            f"{_iso(current.acquired_at_ms)}, which found this run's renewals stopped (TTL "
            f"{self.ttl_ms / 1000:g} s) or its pid gone; that run goes on, this one ends"
        )

    def _lose(self, reason: str) -> None:
        with self._lost_lock:
            if self._lost_reason is not None:
                return  # reported once
            self._lost_reason = reason
            self._stop.set()
        log.error("%s", reason)
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # the callback's failure must not hide the loss
                log.exception("lease %s: on_lost callback failed", self.path)

    def _renew_loop(self) -> None:
        wait = self.renew_every_s
        while not self._stop.wait(wait):
            try:
                reason = self._renew()
            except Exception as exc:  # the store is unreachable: retry until it runs out
                if self._running_out():
                    self._lose(
                        f"pipeline {self.pipeline_id!r} stops: its lease {self.path} could not "
                        f"be renewed for {self.ttl_ms / 1000 - self.margin_s:.0f} s (TTL "
                        f"{self.ttl_ms / 1000:g} s), so another run may take it over "
                        f"({_one_line(exc, 200)})"
                    )
                    return
                log.warning("lease %s: renewal failed, retrying: %s", self.path, _one_line(exc))
                wait = min(self.renew_every_s, 1.0)
                continue
            if reason is not None:
                self._lose(reason)
                return
            wait = self.renew_every_s

    # ------------------------------------------------------------------ release

    def release(self) -> bool:
        """Give the lease up (stops the renewal thread). Never raises for the store: a
        lease that cannot be released expires after its TTL.

        Returns:
            ``True`` when a release was committed; ``False`` when not held (or lost).
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            state, self._state = self._state, None
            if state is None or self._lost_reason is not None:
                return False
            try:
                for _ in range(_ATTEMPTS):
                    current = self.read()
                    if (
                        current is None
                        or current.owner.token != self.owner.token
                        or current.released
                    ):
                        return False
                    done = replace(state, renewed_at_ms=self._now_ms(), released=True, version=-1)
                    if self._commit(done):
                        return True
            except Exception as exc:
                log.warning(
                    "lease %s: not released (%s); it expires in %.0f s",
                    self.path,
                    _one_line(exc),
                    self.ttl_ms / 1000,
                )
            return False

    def __enter__(self) -> PipelineLease:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

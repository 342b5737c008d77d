"""Waiting out a warehouse outage: the pipeline's query restarted within a budget.

An object store that throttles (``503 SlowDown``), fails (5xx) or does not answer for
longer than delta-rs's own retries of each request (``storage: max_retries,
retry_timeout``) fails a micro-batch's apply with a
:class:`~cdcflow.errors.StorageError` of kind ``unavailable`` or ``unreachable``
(:mod:`cdcflow.sinks.faults`). Starting the query again is what a new run would do, and
a new run is safe there: an apply is idempotent on Kafka offsets and one that was
interrupted is finished first, under its own id (:mod:`cdcflow.apply.offsets`;
``tests/e2e/test_faults.py`` kills runs mid-batch to prove it). So
:meth:`~cdcflow.runtime.pipeline.Pipeline.run` does it itself: it stops the failed query,
waits ``1, 2, 4, ...`` seconds (at most 15, jittered) and starts it again from its
checkpoint, until a micro-batch applies or ``apply.store_outage_budget_s`` seconds have
passed since the first failure; then the last error stops the run (exit 74, the fix in
its line). Every restart is one console line and counts in the metrics
(``cdcflow_store_restarts_total{kind}``, ``cdcflow_store_outage_seconds``).

The requests delta-rs retries itself within its budget stay invisible here: deltalake's
Python API reports them only to an OpenTelemetry collector (``deltalake.init_tracing``).

Other storage faults (a full disk, a permission, a damaged log) are not waited out: no
wait mends them. Neither is a lost lease: a store unreachable for longer than the
lease's validity ends the run with ``LEASE_LOST`` (:mod:`cdcflow.sinks.lease`), whatever
is left of this budget.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from cdcflow.errors import StorageError
from cdcflow.source.outage import backoff_s

__all__ = ["BUDGET_KEY", "TRANSIENT_KINDS", "StoreOutage"]

log = logging.getLogger(__name__)

#: the configuration key of the budget, named in the console lines and the error
BUDGET_KEY = "apply.store_outage_budget_s"

#: the kinds of storage error a wait can mend (:mod:`cdcflow.sinks.faults`)
TRANSIENT_KINDS = frozenset({"unavailable", "unreachable"})


class StoreOutage:
    """Restarts of one run's query across a warehouse outage: backoff, console lines and
    the final error.

    An outage begins at a transient failure after a success and ends at the next applied
    micro-batch (:meth:`ok`). Not thread-safe: the run's main thread records failures,
    the apply thread successes, never at the same time (a query is stopped before its
    failure is recorded).

    Args:
        budget_s: seconds an outage may last; ``0``: the first failure stops the run.
        warehouse: the warehouse's URI, named in the lines.
        write: takes one console line (``cdcflow run``'s console).
        first_backoff_s, max_backoff_s: the first and the longest wait between restarts.
        clock: monotonic seconds; default ``time.monotonic``.
        rand: numbers in ``[0, 1)`` for the jitter; default ``random.random``.

    Attributes:
        restarts: restarts in the current outage.
        since: clock time the current outage began (``None``: there is none).
    """

    def __init__(
        self,
        budget_s: float,
        warehouse: str,
        write: Callable[[str], None],
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.budget_s = max(0.0, float(budget_s))
        self.warehouse = warehouse
        self.write = write
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self._clock = clock
        self._rand = rand
        self.restarts = 0
        self.since: float | None = None

    def elapsed_s(self) -> float:
        """Seconds since the current outage began (0 when there is none)."""
        return 0.0 if self.since is None else self._clock() - self.since

    def failed(self, error: StorageError) -> float:
        """Record that the query failed on ``error``; say so on the console.

        Returns:
            Seconds to wait before starting the query again (within the budget).

        Raises:
            StorageError: ``error`` itself when no wait mends it (not
                :data:`TRANSIENT_KINDS`), or a copy whose line adds how long the outage
                lasted and the budget when the budget is spent (``kind`` and ``cause``
                kept).
        """
        if error.kind not in TRANSIENT_KINDS:
            raise error
        now = self._clock()
        if self.since is None:
            self.since = now
        elapsed = now - self.since
        left = self.budget_s - elapsed
        if left <= 0:
            if self.restarts == 0:
                raise error
            raise StorageError(
                f"{error} (the warehouse failed for {elapsed:.0f} s through "
                f"{self.restarts} restart{'s' if self.restarts != 1 else ''}, "
                f"{BUDGET_KEY}={self.budget_s:g}; raise it to wait longer)",
                path=error.path,
                target=error.target,
                kind=error.kind,
                cause=error.cause,
            ) from error
        self.restarts += 1
        delay = min(
            left,
            backoff_s(self.restarts, self.first_backoff_s, self.max_backoff_s, 0.2, self._rand()),
        )
        line = (
            f"warehouse {self.warehouse} {error.kind}: {error.cause}; restarting the query in "
            f"{delay:.1f} s (restart {self.restarts}, {left:.0f} s left of {BUDGET_KEY})"
        )
        log.warning("%s", line)
        self.write(line)
        return delay

    def ok(self) -> None:
        """A micro-batch applied: the outage (if any) is over; one console line if there was one."""
        if self.since is None:
            return
        line = (
            f"warehouse {self.warehouse} answers again after {self.elapsed_s():.0f} s "
            f"({self.restarts} restart{'s' if self.restarts != 1 else ''})"
        )
        log.warning("%s", line)
        self.write(line)
        self.since = None
        self.restarts = 0

"""How long a Kafka client waits out a broker outage: exponential backoff within a budget.

A broker restart, a leader election or a network blip makes Kafka requests fail for
seconds to minutes. :class:`OutageBudget` turns such transient failures into retries:
each failed attempt logs one warning line (what failed, the attempt number, the seconds
left of the budget, the delay before the next attempt) and waits ``1, 2, 4, ...`` seconds,
at most ``max_backoff_s`` (each delay jittered by +-``jitter``), until an attempt succeeds
or the budget -- seconds since the outage began -- is spent. Then it raises
:class:`~cdcflow.errors.SourceError` with code ``SOURCE_UNAVAILABLE`` and a one-line
message: the brokers, how long it tried, the last client error and the fix.

The class knows nothing of Kafka clients: the caller decides which errors are transient
(see :func:`cdcflow.source.kafka.client.is_transient`). Clock, sleep and randomness are
injectable, so the policy is tested without waiting. :meth:`OutageBudget.call` runs its
retry loop with tenacity, the budget deciding the waits and when to stop; the Kafka
reader, whose loop keeps polling through a wait, calls :meth:`~OutageBudget.failed` and
:meth:`~OutageBudget.ok` itself.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import tenacity

from cdcflow.errors import Code, SourceError

__all__ = ["BUDGET_KEY", "OutageBudget", "backoff_s"]

log = logging.getLogger(__name__)

T = TypeVar("T")

BUDGET_KEY = "kafka.outage_budget_s"
"""The configuration key of the budget, named in warnings and errors."""

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 15.0
JITTER = 0.2  # each delay is drawn from [d * 0.8, d * 1.2]


def backoff_s(
    attempt: int,
    first_s: float = FIRST_BACKOFF_S,
    max_s: float = MAX_BACKOFF_S,
    jitter: float = JITTER,
    draw: float = 0.5,
) -> float:
    """The delay after failed attempt ``attempt``: ``first_s * 2 ** (attempt - 1)``, at
    most ``max_s``, scaled by ``1 + jitter * (2 * draw - 1)``.

    Args:
        attempt: the number of the attempt that failed, from 1.
        first_s: delay after the first failure, seconds.
        max_s: longest delay before jitter, seconds.
        jitter: relative spread of the delay, 0 for none.
        draw: a number in ``[0, 1)`` (``random.random()``); 0.5 gives the plain delay.

    Returns:
        Seconds to wait before attempt ``attempt + 1``.
    """
    plain = min(max_s, first_s * 2.0 ** min(attempt - 1, 30))
    return plain * (1.0 + jitter * (2.0 * draw - 1.0))


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


class OutageBudget:
    """Retries of one client across an outage: backoff, warnings and the final error.

    An outage begins at the first failure after a success (or at ``since`` given to
    :meth:`failed`) and ends at the next success (:meth:`ok`). Not thread-safe; one per
    client.

    Args:
        budget_s: seconds an outage may last before :meth:`failed` raises; 0 raises at
            the first failure.
        servers: the bootstrap servers, named in warnings and in the error.
        first_backoff_s: delay after the first failure, seconds.
        max_backoff_s: longest delay between attempts (before jitter), seconds.
        jitter: relative spread of each delay.
        clock: monotonic seconds; default ``time.monotonic``.
        sleep: waits seconds; default ``time.sleep``.
        rand: numbers in ``[0, 1)``; default ``random.random``.

    Attributes:
        attempts: failed attempts in the current outage (0 when there is none).
        since: clock time at which the current outage began, or ``None``.
        last_error: the last error text of the current outage.
    """

    def __init__(
        self,
        budget_s: float,
        servers: str,
        first_backoff_s: float = FIRST_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        jitter: float = JITTER,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        rand: Callable[[], float] | None = None,
        key: str = BUDGET_KEY,
    ) -> None:
        self.budget_s = max(0.0, float(budget_s))
        self.key = key
        self.servers = servers
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.jitter = jitter
        self._clock = clock or time.monotonic
        self._sleep = sleep or time.sleep
        self._rand = rand or random.random
        self.attempts = 0
        self.since: float | None = None
        self.last_error = ""

    @property
    def failing(self) -> bool:
        """Whether an outage is under way (a failure since the last success)."""
        return self.since is not None

    def remaining_s(self) -> float:
        """Seconds left of the budget in the current outage (all of it when there is none)."""
        if self.since is None:
            return self.budget_s
        return max(0.0, self.budget_s - (self._clock() - self.since))

    def attempt_timeout_s(self, request_timeout_s: float) -> float:
        """Timeout for the next request: ``request_timeout_s``, but no longer than the
        budget has left (at least 1 s), so the last attempt ends when the budget does.
        With a budget of 0 (no retries) it is ``request_timeout_s``."""
        if self.budget_s <= 0:
            return request_timeout_s
        return min(request_timeout_s, max(1.0, self.remaining_s()))

    def failed(self, what: str, error: object, since: float | None = None) -> float:
        """Record a failed attempt; log it as one warning line, or raise when the budget
        is spent.

        Args:
            what: what failed, e.g. ``"reading orders[0] at offset 41"``.
            error: the client's error (its text is kept as :attr:`last_error`).
            since: clock time at which the outage began, if it began before this
                failure (e.g. the last record received); only used for the first failure.

        Returns:
            Seconds to wait before the next attempt (ending at the budget's end at most).

        Raises:
            SourceError: code ``SOURCE_UNAVAILABLE``: the outage has lasted the whole
                budget; one line naming the brokers, the duration, ``what``, the last
                error and the fix.
        """
        now = self._clock()
        if self.since is None:
            self.since = now if since is None else min(since, now)
        self.attempts += 1
        self.last_error = _one_line(error)
        elapsed = now - self.since
        left = self.budget_s - elapsed
        if left <= 0:
            raise SourceError(
                f"Kafka brokers {self.servers} unavailable for {elapsed:.0f} s "
                f"({self.attempts} attempt{'s' if self.attempts != 1 else ''}, "
                f"{self.key}={self.budget_s:g}) while {what}; last error: "
                f"{self.last_error}. Fix: bring the brokers back or check "
                "kafka.bootstrap_servers and the network, then run again (it resumes from "
                f"its checkpoint); raise {self.key} to wait longer",
                Code.SOURCE_UNAVAILABLE,
            )
        delay = min(
            left,
            backoff_s(
                self.attempts, self.first_backoff_s, self.max_backoff_s, self.jitter, self._rand()
            ),
        )
        log.warning(
            "Kafka brokers %s unavailable: %s failed (attempt %d): %s; %.0f s left of "
            "the outage budget (%s), next retry in %.1f s",
            self.servers,
            what,
            self.attempts,
            self.last_error,
            left,
            self.key,
            delay,
        )
        return delay

    def ok(self) -> None:
        """Record a success: the outage (if any) is over; logs one line if there was one."""
        if self.since is None:
            return
        log.warning(
            "Kafka brokers %s reachable again after %.0f s (%d failed attempt%s)",
            self.servers,
            self._clock() - self.since,
            self.attempts,
            "s" if self.attempts != 1 else "",
        )
        self.since = None
        self.attempts = 0
        self.last_error = ""

    def call(
        self,
        what: str,
        attempt: Callable[[float], T],
        transient: Callable[[BaseException], str | None],
        request_timeout_s: float,
        on_failure: Callable[[], None] | None = None,
    ) -> T:
        """Run ``attempt`` until it succeeds, retrying transient failures within the budget.

        Args:
            what: what the attempt does, for warnings and the error.
            attempt: called with the request timeout in seconds
                (:meth:`attempt_timeout_s`); returns the result.
            transient: given an exception ``attempt`` raised, its error text if it is
                transient (retry), else ``None`` (it is re-raised at once).
            request_timeout_s: the usual timeout of one request, seconds.
            on_failure: called after each transient failure, before the wait (e.g. to
                drop a client so the next attempt makes a new one).

        Returns:
            What ``attempt`` returned.

        Raises:
            SourceError: code ``SOURCE_UNAVAILABLE`` when the budget is spent (chained to
                the last failure).
            Exception: a non-transient exception of ``attempt``, unchanged.
        """
        failure: dict[str, Any] = {}  # the last transient failure: text, delay or end

        def timed() -> T:
            failure["started"] = self._clock()
            return attempt(self.attempt_timeout_s(request_timeout_s))

        def is_transient(exc: BaseException) -> bool:
            if not isinstance(exc, Exception):
                return False  # KeyboardInterrupt, SystemExit: on their way out at once
            failure["text"] = transient(exc)
            return failure["text"] is not None

        def record(state: tenacity.RetryCallState) -> None:  # after each transient failure
            if on_failure is not None:
                on_failure()
            try:
                # an outage begins when its first failing request was sent
                failure["delay"] = self.failed(what, failure["text"], since=failure["started"])
            except SourceError as spent:
                failure["spent"], failure["delay"] = spent, 0.0  # (tenacity: wait, then stop)

        def give_up(state: tenacity.RetryCallState) -> T:
            assert state.outcome is not None
            raise failure["spent"] from state.outcome.exception()

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_transient),
            after=record,
            stop=lambda state: "spent" in failure,
            wait=lambda state: failure["delay"],
            sleep=self._sleep,
            retry_error_callback=give_up,
            reraise=True,
        )
        result = retrying(timed)
        self.ok()
        return result

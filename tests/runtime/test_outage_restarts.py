"""Restarts across a warehouse outage (``cdcflow.runtime.store_outage``): the policy alone,
on an injected clock. ``tests/e2e/test_store_outage.py`` runs it with Spark, a broker and
a store that fails behind the fault proxy."""

from __future__ import annotations

import pytest

from cdcflow.errors import StorageError
from cdcflow.runtime.store_outage import BUDGET_KEY, StoreOutage


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _error(kind: str = "unavailable") -> StorageError:
    cause = "Server returned non-2xx status code: 503 Service Unavailable"
    return StorageError(
        f"table shop.orders (s3://lake/wh/shop.orders): {cause}. Fix: run again",
        path="s3://lake/wh/shop.orders", target="shop.orders", kind=kind, cause=cause,
    )  # fmt: skip


def _outage(budget_s: float, clock: _Clock, lines: list[str]) -> StoreOutage:
    return StoreOutage(budget_s, "s3://lake/wh", lines.append, clock=clock, rand=lambda: 0.5)


def test_restarts_back_off_and_say_so_until_a_micro_batch_applies():
    clock, lines = _Clock(), []
    outage = _outage(60, clock, lines)
    delays = []
    for _ in range(4):
        delays.append(outage.failed(_error()))
        clock.now += delays[-1] + 2  # the wait, then a query that fails again after 2 s
    assert delays == [1.0, 2.0, 4.0, 8.0]
    assert outage.restarts == 4 and len(lines) == 4
    assert lines[0] == (
        "warehouse s3://lake/wh unavailable: Server returned non-2xx status code: 503 Service "
        f"Unavailable; restarting the query in 1.0 s (restart 1, 60 s left of {BUDGET_KEY})"
    )
    assert "restart 4, 47 s left" in lines[3]
    outage.ok()
    assert lines[-1] == "warehouse s3://lake/wh answers again after 23 s (4 restarts)"
    assert outage.since is None and outage.restarts == 0
    outage.ok()  # no outage: nothing to say
    assert len(lines) == 5
    assert outage.failed(_error("unreachable")) == 1.0  # a new outage starts over


def test_the_budget_spent_raises_the_last_error_with_how_long_it_lasted():
    clock, lines = _Clock(), []
    outage = _outage(10, clock, lines)
    outage.failed(_error())
    clock.now += 6
    assert outage.failed(_error()) == 2.0
    clock.now += 3
    assert outage.failed(_error()) == 1.0  # the wait ends with the budget
    clock.now += 1
    with pytest.raises(StorageError) as raised:
        outage.failed(_error())
    error = raised.value
    assert error.kind == "unavailable" and error.target == "shop.orders"
    assert str(error).endswith(
        f"(the warehouse failed for 10 s through 3 restarts, {BUDGET_KEY}=10; raise it to "
        "wait longer)"
    )
    assert "\n" not in str(error)


@pytest.mark.parametrize("kind", ["full", "permission", "damaged", "missing", "other"])
def test_a_fault_no_wait_mends_is_raised_at_once(kind):
    lines: list[str] = []
    error = _error(kind)
    with pytest.raises(StorageError) as raised:
        _outage(60, _Clock(), lines).failed(error)
    assert raised.value is error and lines == []


def test_a_budget_of_zero_stops_at_the_first_failure_unchanged():
    error = _error()
    with pytest.raises(StorageError) as raised:
        _outage(0, _Clock(), []).failed(error)
    assert raised.value is error


def test_a_signal_ends_the_wait_between_two_queries():
    """SIGTERM during the wait before a restart stops the run as it stops a query
    (``Interrupted``, exit 130, the lease released on the way out)."""
    import os
    import signal
    import threading
    import time

    from cdcflow.runtime.pipeline import Interrupted, _wait

    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    started = time.monotonic()
    with pytest.raises(Interrupted) as raised:
        _wait(30, stop_on_signals=True)
    assert raised.value.signum == signal.SIGTERM
    assert time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGTERM) == before  # put back

"""Applies beside Spark's next micro-batch (decision 32): when an apply says its records
are durable, what the pipeline's :class:`~cdcflow.runtime.pipeline.ApplyLane` lets run meanwhile,
and where a failure surfaces. Real Delta tables; the lane's threads are real threads."""

from __future__ import annotations

import threading

import pytest
from tests.apply.helpers import ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.apply.offsets import OffsetLedger
from cdcflow.runtime.pipeline import ApplyLane
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

ITEMS = "db.items"


def _ids(wh: DeltaWarehouse) -> dict[int, str]:
    return mirror_by_key(wh.read(ITEMS), column="name")


def test_records_are_durable_once_the_intent_is_written_and_before_any_table(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="lane")
    applier = BatchApplier(wh)
    seen: dict[str, object] = {}

    def on_durable() -> None:
        # what a process dying here leaves: a pending apply with exactly these offsets
        pending = OffsetLedger(DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="lane")).pending()
        seen["pending"] = pending
        seen["mirror"] = wh.open(wh.table_path(ITEMS))

    batch = table_of(ins(1, "a", seq=1), ins(2, "b", seq=2))
    applier.apply(batch, 0, on_durable=on_durable)
    pending = seen["pending"]
    assert pending is not None and pending.apply_id == 0
    assert pending.covered_by(batch)
    assert seen["mirror"] is None  # no table written yet
    assert _ids(wh) == {1: "a", 2: "b"}
    assert applier.ledger.pending() is None


def test_a_delivery_applied_before_is_durable_at_once(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="lane")
    applier = BatchApplier(wh)
    batch = table_of(ins(1, "a", seq=1))
    applier.apply(batch, 0)
    calls = []
    report = applier.apply(batch, 1, on_durable=lambda: calls.append(1))
    assert calls == [1]
    assert report.replayed == 1


def test_the_lane_returns_at_durable_and_runs_one_apply_at_a_time():
    lane = ApplyLane("s")
    order: list[str] = []
    release = threading.Event()

    def first(on_durable) -> None:
        order.append("first durable")
        on_durable()
        release.wait(5)
        order.append("first done")

    def second(on_durable) -> None:
        order.append("second starts")
        on_durable()

    lane.start(first)  # returns while `first` still runs
    assert order == ["first durable"]
    threading.Timer(0.2, release.set).start()
    lane.start(second)  # waits for `first` to finish before `second` starts
    lane.wait()
    assert order == ["first durable", "first done", "second starts"]


def test_a_failure_before_durable_is_raised_by_start_itself():
    lane = ApplyLane("s")

    def fails(on_durable) -> None:
        raise OSError("intent could not be written")

    with pytest.raises(OSError, match="intent"):
        lane.start(fails)
    lane.wait()  # nothing left over


def test_a_failure_after_durable_stops_the_next_micro_batch_before_its_apply():
    lane = ApplyLane("s")
    ran = []
    go = threading.Event()

    def fails_late(on_durable) -> None:
        on_durable()
        go.wait(5)  # fails after start() returned (had it failed before, start raises)
        raise OSError("disk full while writing the mirror")

    def next_apply(on_durable) -> None:
        ran.append("next")
        on_durable()

    lane.start(fails_late)
    go.set()
    with pytest.raises(OSError, match="disk full"):
        lane.start(next_apply)
    assert ran == []  # the next micro-batch is not applied (nor committed by Spark)


def test_a_crash_after_durable_is_finished_with_exactly_its_records(tmp_path):
    """The state a SIGKILL between "durable" and the completion leaves -- Spark has
    committed the micro-batch, the warehouse has its intent -- is finished by the next
    apply of the same records (the pipeline re-reads them from Kafka at start-up)."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="lane")
    first = BatchApplier(wh)
    batch = table_of(ins(1, "a", seq=1), upd(1, "b", seq=2), ins(2, "c", seq=3))

    class Crash(BaseException):
        pass

    def die() -> None:
        raise Crash

    with pytest.raises(Crash):
        first.apply(batch, 7, on_durable=die)
    wh2 = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="lane")
    second = BatchApplier(wh2)
    pending = second.ledger.pending()
    assert pending is not None and pending.covered_by(batch)
    second.apply(pending.select(batch))
    assert _ids(wh2) == {1: "b", 2: "c"}
    assert second.ledger.pending() is None
    assert second.apply(batch, 8).replayed == 3


def test_a_failure_after_durable_calls_on_failure_at_once_and_one_before_does_not():
    """An idle topic brings no next micro-batch to raise the error: the pipeline's
    ``on_failure`` stops the query instead (and then raises the error itself)."""
    called = threading.Event()
    lane = ApplyLane("s", on_failure=called.set)

    def fails_early(on_durable) -> None:
        raise OSError("before durable")

    with pytest.raises(OSError):
        lane.start(fails_early)
    assert not called.wait(0.2)

    go = threading.Event()

    def fails_late(on_durable) -> None:
        on_durable()
        go.wait(5)
        raise OSError("after durable")

    lane.start(fails_late)
    go.set()
    assert called.wait(5)
    with pytest.raises(OSError, match="after durable"):
        lane.wait()

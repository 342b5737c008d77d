"""Spark's Python worker late to start (``cdcflow.runtime.late_worker``): the policy alone.
Its message is Spark 4.2's, as a CI run here printed it when three test lanes shared two
cores (``StreamingQueryException: [STREAM_FAILED] ... Python worker failed to connect
back. SQLSTATE: XXKST``)."""

from __future__ import annotations

from cdcflow.runtime.late_worker import RETRIES, SPARK_MESSAGES, LateWorker

SEEN = (
    "[STREAM_FAILED] Query [id = 637a92ab-0b1e-4eb5-b467-3bf14a2c1714, runId = "
    "60cb2167-78e4-4e7c-ada8-aff847c6b8ee] terminated with exception: Python worker failed "
    "to connect back. SQLSTATE: XXKST"
)


def _late_worker(lines: list[str], waits: list[float]) -> LateWorker:
    return LateWorker(lines.append, sleep=waits.append)


def test_a_late_worker_restarts_the_query_a_few_times_in_a_row_then_stops_the_run():
    lines, waits = [], []
    late = _late_worker(lines, waits)
    assert [late.failed(RuntimeError(SEEN)) for _ in range(RETRIES + 1)] == [True] * RETRIES + [
        False
    ]
    assert waits == [1.0, 2.0, 3.0] and late.restarts == RETRIES
    assert lines[0] == (
        "Spark's Python worker did not connect back within Spark's 10 s (a busy host); "
        "restarting the query from its checkpoint (restart 1 of 3)"
    )
    assert len(lines) == RETRIES  # the refused one says nothing: its error stops the run


def test_an_applied_micro_batch_starts_the_count_over():
    late = _late_worker([], [])
    for _ in range(RETRIES):
        assert late.failed(RuntimeError(SEEN))
    late.ok()
    assert late.restarts == 0 and late.failed(RuntimeError(SPARK_MESSAGES[1]))


def test_any_other_failure_is_not_restarted():
    lines, waits = [], []
    late = _late_worker(lines, waits)
    other = "[STREAM_FAILED] ... terminated with exception: Connection refused"
    assert not late.failed(RuntimeError(other))
    assert not late.failed(ValueError("Python worker exited unexpectedly (crashed)"))
    assert lines == [] and waits == [] and late.restarts == 0

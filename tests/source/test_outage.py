"""The outage policy alone: backoff, budget, warnings and the final error, on a fake clock.

Also which librdkafka errors count as transient, the ``outageBudgetMs`` option, and how a
SourceError is recovered from the text of a failed Spark query. No broker, no Spark.
"""

from __future__ import annotations

import logging
import pickle

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdcflow.errors import Code, ConfigError, SourceError
from cdcflow.runtime.pipeline import source_error_of
from cdcflow.source.kafka.client import is_transient
from cdcflow.source.kafka.options import parse_options
from cdcflow.source.outage import OutageBudget, backoff_s

SERVERS = "b1:9092,b2:9092"


class FakeClock:
    """Monotonic seconds that move only when told to (or when the policy sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _budget(clock: FakeClock, budget_s: float = 10.0, draw: float = 0.5) -> OutageBudget:
    return OutageBudget(budget_s, SERVERS, clock=clock, sleep=clock.sleep, rand=lambda: draw)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cdcflow.source.outage"]


# --------------------------------------------------------------------------- backoff


def test_backoff_doubles_from_one_second_up_to_fifteen():
    assert [backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 15, 15, 15]
    assert backoff_s(1000) == 15  # no overflow after days of retries


def test_backoff_jitter_stays_within_twenty_percent():
    assert backoff_s(3, draw=0.0) == pytest.approx(4 * 0.8)
    assert backoff_s(3, draw=0.999999) == pytest.approx(4 * 1.2, rel=1e-5)
    assert backoff_s(3, jitter=0.0, draw=0.0) == 4
    assert backoff_s(1, first_s=0.5, max_s=3, draw=0.5) == 0.5


# --------------------------------------------------------------------------- the budget


def test_each_failed_attempt_is_one_warning_and_the_budget_ends_in_source_unavailable(caplog):
    caplog.set_level(logging.WARNING, logger="cdcflow.source.outage")
    clock = FakeClock()
    outage = _budget(clock, budget_s=10)
    delays = []
    with pytest.raises(SourceError) as info:
        while True:
            delays.append(outage.failed("listing the topics", "_TRANSPORT: Connection refused"))
            clock.sleep(delays[-1])
    # 1 + 2 + 4 = 7 s; the next delay (8 s) is cut to the 3 s left; then the budget is spent
    assert delays == [1, 2, 4, 3]
    assert outage.attempts == 5
    lines = _warnings(caplog)
    assert len(lines) == 4
    assert lines[0] == (
        "Kafka brokers b1:9092,b2:9092 unavailable: listing the topics failed (attempt 1): "
        "_TRANSPORT: Connection refused; 10 s left of the outage budget "
        "(kafka.outage_budget_s), next retry in 1.0 s"
    )
    assert (
        "(attempt 4)" in lines[3] and "3 s left" in lines[3] and "next retry in 3.0 s" in lines[3]
    )

    error = info.value
    assert error.code == Code.SOURCE_UNAVAILABLE == "SOURCE_UNAVAILABLE"
    assert "\n" not in str(error)
    assert str(error) == (
        "[SOURCE_UNAVAILABLE] Kafka brokers b1:9092,b2:9092 unavailable for 10 s (5 attempts, "
        "kafka.outage_budget_s=10) while listing the topics; last error: _TRANSPORT: "
        "Connection refused. Fix: bring the brokers back or check kafka.bootstrap_servers and "
        "the network, then run again (it resumes from its checkpoint); raise "
        "kafka.outage_budget_s to wait longer"
    )
    again = pickle.loads(pickle.dumps(error))  # raised on executors: must pickle
    assert again.code == error.code and again.message == error.message


def test_a_success_ends_the_outage_and_the_next_one_gets_the_whole_budget(caplog):
    caplog.set_level(logging.WARNING, logger="cdcflow.source.outage")
    clock = FakeClock()
    outage = _budget(clock, budget_s=10)
    outage.failed("reading t[0] at offset 5", "down")
    clock.now += 8
    assert outage.failing and outage.remaining_s() == 2
    outage.ok()
    assert not outage.failing and outage.attempts == 0
    assert (
        _warnings(caplog)[-1]
        == "Kafka brokers b1:9092,b2:9092 reachable again after 8 s (1 failed attempt)"
    )
    outage.ok()  # no outage: nothing logged
    assert len(_warnings(caplog)) == 2

    clock.now += 100
    assert outage.failed("reading t[0] at offset 9", "down") == 1  # attempt 1 again
    assert outage.remaining_s() == 10


def test_an_outage_can_begin_before_its_first_reported_failure():
    clock = FakeClock()
    outage = _budget(clock, budget_s=10)
    # no record since 7 s ago, then the first error: 3 s left
    assert outage.failed("reading", "down", since=clock.now - 7) == 1
    assert outage.remaining_s() == 3
    clock.now += 3
    with pytest.raises(SourceError, match="unavailable for 10 s"):
        outage.failed("reading", "down")


def test_a_budget_of_zero_raises_at_the_first_failure():
    outage = _budget(FakeClock(), budget_s=0)
    with pytest.raises(SourceError, match=r"for 0 s \(1 attempt, kafka.outage_budget_s=0\)"):
        outage.failed("listing the topics", "down")
    assert outage.attempt_timeout_s(30) == 30


def test_request_timeouts_end_when_the_budget_does():
    clock = FakeClock()
    outage = _budget(clock, budget_s=300)
    assert outage.attempt_timeout_s(30) == 30
    outage.failed("x", "down")
    clock.now += 290
    assert outage.attempt_timeout_s(30) == 10
    clock.now += 9.8
    assert outage.attempt_timeout_s(30) == 1.0  # at least 1 s
    assert _budget(FakeClock(), budget_s=3).attempt_timeout_s(30) == 3


# --------------------------------------------------------------------------- call


class Down(Exception):
    pass


class Denied(Exception):
    pass


def test_call_retries_transient_failures_until_one_succeeds(caplog):
    caplog.set_level(logging.WARNING, logger="cdcflow.source.outage")
    clock = FakeClock()
    outage = _budget(clock, budget_s=60)
    timeouts, dropped = [], []

    def attempt(timeout_s):
        timeouts.append(timeout_s)
        clock.now += 0.5  # each request takes half a second
        if len(timeouts) < 4:
            raise Down("connection refused")
        return "metadata"

    result = outage.call(
        "listing the topics",
        attempt,
        lambda exc: str(exc) if isinstance(exc, Down) else None,
        30,
        on_failure=lambda: dropped.append(1),
    )
    assert result == "metadata"
    assert clock.slept == [1, 2, 4] and len(dropped) == 3
    assert timeouts == [30, 30, 30, 30]
    lines = _warnings(caplog)
    assert [line.split("(attempt ")[1][0] for line in lines[:3]] == ["1", "2", "3"]
    # four requests of 0.5 s and waits of 1 + 2 + 4 s
    assert lines[-1].endswith("reachable again after 9 s (3 failed attempts)")
    assert not outage.failing


def test_call_counts_the_first_request_and_raises_chained_when_the_budget_is_spent():
    clock = FakeClock()
    outage = _budget(clock, budget_s=3)

    def attempt(timeout_s):
        clock.now += timeout_s  # a request to a broker that is down waits out its timeout
        raise Down("all brokers down")

    with pytest.raises(SourceError) as info:
        outage.call("listing the topics", attempt, str, 30)
    assert info.value.code == Code.SOURCE_UNAVAILABLE
    assert "unavailable for 3 s (1 attempt" in info.value.message
    assert isinstance(info.value.__cause__, Down)
    assert clock.now == 1003.0  # one 3 s request: the budget counts from when it was sent


def test_call_raises_errors_that_are_not_transient_at_once():
    clock = FakeClock()
    outage = _budget(clock, budget_s=300)
    calls = []

    def attempt(timeout_s):
        calls.append(timeout_s)
        raise Denied("SASL authentication failed")

    with pytest.raises(Denied):
        outage.call("listing the topics", attempt, lambda exc: None, 30)
    assert calls == [30] and clock.slept == [] and not outage.failing


def test_call_never_retries_an_interrupt():
    """Ctrl-C (or SIGTERM, which the CLI turns into one) during a request stops at once,
    even with a ``transient`` that would call anything retriable."""
    clock = FakeClock()
    outage = _budget(clock, budget_s=300)

    def attempt(timeout_s):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        outage.call("listing the topics", attempt, str, 30)
    assert clock.slept == [] and not outage.failing


# --------------------------------------------------------------------------- librdkafka errors


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    ],
)
def test_outage_errors_are_transient(code):
    assert is_transient(KafkaError(code))
    assert is_transient(KafkaException(KafkaError(code)))


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._SSL,
        KafkaError._INVALID_ARG,
        KafkaError.OFFSET_OUT_OF_RANGE,
        KafkaError._PARTITION_EOF,
    ],
)
def test_other_errors_are_not_transient(code):
    assert not is_transient(KafkaError(code))


def test_fatal_is_never_transient_and_retriable_always_is():
    assert not is_transient(KafkaError(KafkaError._TRANSPORT, "x", True, False))  # fatal
    assert is_transient(KafkaError(KafkaError.INVALID_REQUEST, "x", False, True))  # retriable
    assert not is_transient(RuntimeError("not a Kafka error"))
    assert not is_transient(None)


# --------------------------------------------------------------------------- the option


def test_outage_budget_option_in_milliseconds():
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    assert parse_options(base).outage_budget_s == 300.0
    assert parse_options({**base, "outageBudgetMs": "2500"}).outage_budget_s == 2.5
    assert parse_options({**base, "OUTAGEBUDGETMS": "0"}).outage_budget_s == 0.0
    for bad in ("-1", "soon", "1.5"):
        with pytest.raises(ConfigError) as info:
            parse_options({**base, "outageBudgetMs": bad})
        assert "\n" not in str(info.value)
        assert "option outageBudgetMs must be a whole number of milliseconds >= 0" in str(
            info.value
        )
        assert "kafka.outage_budget_s" in str(info.value)


# --------------------------------------------------------------------------- back on the driver


def test_the_source_error_is_found_in_a_failed_querys_text():
    text = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data "
        "source perform latestOffset: Traceback (most recent call last):\n"
        '  File "kafka.py", line 1, in latestOffset\n'
        "confluent_kafka.KafkaException: KafkaError{code=_TRANSPORT}\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "cdcflow.errors.SourceError: [SOURCE_UNAVAILABLE] Kafka brokers h:1 unavailable "
        "for 300 s (9 attempts); last error: _TRANSPORT: down. Fix: bring them back\n"
        " SQLSTATE: 38000\n\tat org.apache.spark.sql.errors.QueryExecutionErrors$.x(...)\n"
    )
    error = source_error_of(RuntimeError(text))
    assert isinstance(error, SourceError)
    assert error.code == "SOURCE_UNAVAILABLE"
    assert str(error) == (
        "[SOURCE_UNAVAILABLE] Kafka brokers h:1 unavailable for 300 s (9 attempts); "
        "last error: _TRANSPORT: down. Fix: bring them back"
    )
    assert source_error_of(RuntimeError("ValueError: [BAD] something else")) is None

"""The Kafka source across broker outages: a real broker taken down and brought back on
the same port with its records kept -- tansu on durable (s3) storage, and Apache Kafka,
whose log folder outlives its process. No Spark: the reader's driver methods and the
executor read are called directly.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid

import pytest

from cdcflow.errors import Code, SourceError
from cdcflow.source.kafka.admin import list_partitions
from cdcflow.source.kafka.datasource import KafkaStreamReader
from cdcflow.source.kafka.options import parse_options
from cdcflow.source.kafka.planning import DATA_LOSS, KafkaInputPartition
from cdcflow.source.kafka.reader import read_partition
from cdcflow_testkit.services.apache_kafka import ApacheKafkaBroker
from cdcflow_testkit.services.broker import EmbeddedBroker

pytestmark = [pytest.mark.kafka]

# Small fetches: the consumer holds one record batch at a time, so a read that has
# started still has most of its records to fetch when the broker goes down.
SMALL_FETCHES = {
    "kafka.fetch.max.bytes": "1024",
    "kafka.message.max.bytes": "1000",
    "kafka.max.partition.fetch.bytes": "1024",
    "kafka.queued.min.messages": "1",
}


@pytest.fixture(scope="module", params=["tansu-s3", "apache-kafka"])
def durable_broker(request):
    """A broker of its own (these tests take it down) that keeps its records across a
    restart."""
    broker = EmbeddedBroker(storage="s3") if request.param == "tansu-s3" else ApacheKafkaBroker()
    with broker:
        yield broker


@pytest.fixture(scope="module")
def topic(durable_broker):
    """A one-partition topic of 400 records in 8 record batches (4 produce calls); the
    tests only read it."""
    name = f"outage-{uuid.uuid4().hex[:8]}"
    durable_broker.create_topic(name)
    for i in range(4):
        durable_broker.produce(
            name, [(b"k%d" % n, b"value %d" % n) for n in range(i * 100, (i + 1) * 100)]
        )
    assert durable_broker.end_offsets(name) == {0: 400}
    return name


def _options(broker, topic, **extra):
    return {
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "subscribe": topic,
        **{k: str(v) for k, v in extra.items()},
    }


def _offsets(batches) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def _outage_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cdcflow.source.outage"]


def test_a_read_waits_out_an_outage_and_its_records_arrive_complete_and_in_order(
    durable_broker, topic, caplog
):
    caplog.set_level(logging.WARNING, logger="cdcflow.source.outage")
    opts = parse_options(_options(durable_broker, topic, maxRecordsPerBatch=20, **SMALL_FETCHES))
    reading = read_partition(opts, KafkaInputPartition(topic, 0, 0, 400))
    batches = [next(reading)]
    started = time.monotonic()
    outage = durable_broker.pause_for(5)
    batches.extend(reading)
    took = time.monotonic() - started
    outage.join()
    assert outage.error is None

    offsets = _offsets(batches)
    assert offsets == list(range(400))
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"value %d" % n for n in range(400)]
    lines = _outage_lines(caplog)
    assert lines, "the outage was not noticed"
    assert "(attempt 1)" in lines[0] and f"reading {topic}[0] at offset " in lines[0]
    assert "s left of the outage budget (kafka.outage_budget_s), next retry in" in lines[0]
    assert "reachable again after" in lines[-1]
    assert 4.5 < took < 30, f"read took {took:.1f} s across a 5 s outage"


def test_a_read_that_starts_during_an_outage_reads_everything_once_the_broker_is_back(
    durable_broker, topic
):
    opts = parse_options(_options(durable_broker, topic, maxRecordsPerBatch=64, **SMALL_FETCHES))
    outage = durable_broker.pause_for(3)
    batches = list(read_partition(opts, KafkaInputPartition(topic, 0, 150, 400)))
    outage.join()
    assert _offsets(batches) == list(range(150, 400))


def test_latest_offset_and_partitions_wait_out_an_outage(durable_broker, topic):
    reader = KafkaStreamReader(parse_options(_options(durable_broker, topic)))
    try:
        start = {topic: {"0": 0}}
        assert reader.latestOffset(start, None) == {topic: {"0": 400}}
        started = time.monotonic()
        outage = durable_broker.pause_for(4)
        end = reader.latestOffset(start, None)
        took = time.monotonic() - started
        outage.join()
        assert end == {topic: {"0": 400}}
        assert 3.5 < took < 30
        assert reader.partitions(start, end) == [KafkaInputPartition(topic, 0, 0, 400)]
    finally:
        reader.stop()


def test_a_spent_budget_is_source_unavailable_in_one_line(durable_broker, topic):
    options = _options(durable_broker, topic, outageBudgetMs=3000)
    reader = KafkaStreamReader(parse_options(options))
    start = reader.initialOffset()
    durable_broker.pause()
    try:
        errors = []
        for what, call in [
            ("listing the topics and their offsets", lambda: reader.latestOffset(start, None)),
            (
                f"reading {topic}[0] at offset 0",
                lambda: list(
                    read_partition(parse_options(options), KafkaInputPartition(topic, 0, 0, 400))
                ),
            ),
            ("listing the topics", lambda: list_partitions(options)),
        ]:
            began = time.monotonic()
            with pytest.raises(SourceError) as info:
                call()
            took = time.monotonic() - began
            error = info.value
            errors.append(str(error))
            assert error.code == Code.SOURCE_UNAVAILABLE
            assert 2.5 < took < 8, f"{what}: gave up after {took:.1f} s with a 3 s budget"
            text = str(error)
            assert "\n" not in text
            head = re.match(
                rf"\[SOURCE_UNAVAILABLE\] Kafka brokers {re.escape(durable_broker.bootstrap_servers)}"
                r" unavailable for (\d+) s \(",
                text,
            )
            assert head, text
            # the figure is the outage as the reader measured it, inside this call: at least
            # the budget, at most the call's own duration (a loaded machine makes it 4 s)
            assert 3 <= int(head.group(1)) <= math.ceil(took), (head.group(1), took)
            assert f"kafka.outage_budget_s=3) while {what}; last error: _" in text
            assert "Connection refused" in text or "brokers are down" in text
            assert text.endswith("raise kafka.outage_budget_s to wait longer")
        print(*errors, sep="\n")
    finally:
        reader.stop()
        durable_broker.resume()


def test_errors_that_are_not_transient_are_not_retried(broker):
    """Authentication and data loss are raised at once, whatever the budget."""
    name = f"notransient-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name)
    broker.produce(name, [(None, b"x")] * 5)

    sasl = _options(
        broker,
        name,
        outageBudgetMs=300_000,
        **{
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "u",
            "kafka.sasl.password": "p",
        },
    )
    began = time.monotonic()
    with pytest.raises(SourceError, match=r"_AUTHENTICATION: .*SASL") as info:
        list(read_partition(parse_options(sasl), KafkaInputPartition(name, 0, 0, 5)))
    assert info.value.code == "SOURCE_ERROR"
    assert time.monotonic() - began < 10

    reader = KafkaStreamReader(parse_options(_options(broker, name, outageBudgetMs=300_000)))
    began = time.monotonic()
    with pytest.raises(SourceError) as info:
        reader.latestOffset({name: {"0": 50}}, None)  # beyond the end: re-created topic
    reader.stop()
    assert info.value.code == DATA_LOSS
    assert time.monotonic() - began < 10

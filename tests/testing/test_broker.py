"""The test brokers (tansu and Apache Kafka, ``tests/testing/conftest.py``): start/stop,
topics, produce that leaves nothing invisible."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

import pytest

from cdcflow_testkit.encoders import Message
from cdcflow_testkit.services.broker import BrokerError, EmbeddedBroker

pytestmark = pytest.mark.kafka


def _topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _consume_all(broker: EmbeddedBroker, topic: str) -> list:
    """Every record up to the high watermarks, read with a plain consumer."""
    from confluent_kafka import Consumer, TopicPartition

    ends = broker.end_offsets(topic)
    consumer = Consumer(broker.client_config(**{"group.id": "t", "enable.auto.commit": False}))
    out = []
    try:
        for p, end in ends.items():
            if end == 0:
                continue
            consumer.assign([TopicPartition(topic, p, 0)])
            deadline = time.monotonic() + 20
            got = 0
            while got < end and time.monotonic() < deadline:
                for m in consumer.consume(1000, timeout=1):
                    if m.error() is None and m.offset() < end:
                        out.append(m)
                        got += 1
    finally:
        consumer.close()
    return out


@dataclass(frozen=True)
class _TimedMessage:
    value: bytes | None
    key: bytes | None = None
    headers: tuple = ()
    timestamp_ms: int | None = None


def test_create_topic_and_end_offsets_of_empty_topic(broker):
    topic = _topic("empty")
    broker.create_topic(topic, partitions=3)
    assert broker.partitions(topic) == 3
    assert broker.end_offsets(topic) == {0: 0, 1: 0, 2: 0}
    assert topic in broker.topics()


def test_produce_makes_every_message_visible(broker):
    topic = _topic("visible")
    broker.create_topic(topic, partitions=3)
    messages = [(f"k{i % 50}".encode(), f"v{i}".encode()) for i in range(3000)]
    result = broker.produce(topic, messages)
    ends = broker.end_offsets(topic)
    assert sum(ends.values()) == 3000
    assert result == {p: e for p, e in ends.items() if e}
    records = _consume_all(broker, topic)
    assert sorted(m.value() for m in records) == sorted(v for _, v in messages)
    # Same key, same partition; order kept within a partition.
    partition_of = {}
    for m in records:
        assert partition_of.setdefault(m.key(), m.partition()) == m.partition()
    by_key: dict[bytes, list[int]] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        by_key.setdefault(m.key(), []).append(int(m.value()[1:]))
    assert all(vs == sorted(vs) for vs in by_key.values())


def _produce_raw(broker, topic: str) -> None:
    """100 records in multi-record batches, with a plain producer."""
    from confluent_kafka import Producer

    producer = Producer(broker.client_config(**{"linger.ms": 50}))
    for i in range(100):
        producer.produce(topic, value=b"%d" % i, partition=0)
    producer.flush(10)


def test_raw_multi_record_batches_hide_the_tail_on_tansu(tansu_broker):
    """The tansu quirk produce() works around. If this fails, tansu changed: the
    single-message final batch in EmbeddedBroker.produce may no longer be needed."""
    topic = _topic("quirk")
    tansu_broker.create_topic(topic)
    _produce_raw(tansu_broker, topic)
    assert tansu_broker.end_offsets(topic) == {0: 1}  # base offset of the batch + 1
    tansu_broker.produce(topic, [(None, b"last")])
    assert tansu_broker.end_offsets(topic) == {0: 101}


def test_apache_kafka_reports_the_true_end_of_multi_record_batches(apache_kafka):
    topic = _topic("no-quirk")
    apache_kafka.create_topic(topic)
    _produce_raw(apache_kafka, topic)
    assert apache_kafka.end_offsets(topic) == {0: 100}


def test_message_objects_round_trip_with_headers_tombstones_timestamps(broker):
    topic = _topic("fields")
    broker.create_topic(topic)
    sent = [
        Message(value=b"v0", key=b"k0", headers=(("a", b"1"), ("a", b"2"))),
        Message(value=None, key=b"k1"),  # tombstone
        Message(value=b"v2"),  # no key
        _TimedMessage(value=b"v3", key=b"k3", timestamp_ms=1_600_000_000_123),
    ]
    broker.produce(topic, sent, partition=0)
    got = _consume_all(broker, topic)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [
        (0, b"k0", b"v0"),
        (1, b"k1", None),
        (2, None, b"v2"),
        (3, b"k3", b"v3"),
    ]
    assert got[0].headers() == [("a", b"1"), ("a", b"2")]
    assert got[1].headers() is None
    assert got[3].timestamp() == (1, 1_600_000_000_123)  # CreateTime


def test_produce_to_one_partition_and_errors(broker):
    topic = _topic("onepart")
    broker.create_topic(topic, partitions=2)
    assert broker.produce(topic, [(None, b"x")] * 7, partition=1) == {1: 7}
    assert broker.end_offsets(topic) == {0: 0, 1: 7}
    with pytest.raises(BrokerError, match="partition 5"):
        broker.produce(topic, [(None, b"x")], partition=5)
    with pytest.raises(TypeError, match="Message"):
        broker.produce(topic, [b"just bytes"])


def test_produce_creates_a_missing_topic(broker):
    topic = _topic("auto")
    broker.produce(topic, [(b"k", b"v")])
    assert broker.end_offsets(topic) == {0: 1}


def test_produce_200k_small_messages_takes_seconds(broker):
    topic = _topic("bulk")
    broker.create_topic(topic, partitions=2)
    messages = [(b"%d" % i, b"value-%d" % i) for i in range(200_000)]
    start = time.monotonic()
    broker.produce(topic, messages)
    elapsed = time.monotonic() - start
    assert sum(broker.end_offsets(topic).values()) == 200_000
    assert elapsed < 20, f"200k messages took {elapsed:.1f} s"


def test_broker_is_killed_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"), EmbeddedBroker() as b:
        proc = b._proc
        assert b.running
        raise RuntimeError("boom")
    assert proc.poll() is not None
    assert not b.running
    b.stop()  # idempotent


def test_startup_failure_names_the_log_file(tmp_path):
    fake = tmp_path / "fake-tansu"
    fake.write_text("#!/bin/sh\necho 'cannot bind' >&2\nexit 3\n")
    os.chmod(fake, 0o755)
    broker = EmbeddedBroker(binary=str(fake), startup_timeout_s=5)
    with pytest.raises(BrokerError) as info:
        broker.start()
    message = str(info.value)
    assert "exited with code 3" in message
    assert broker.log_path and broker.log_path in message
    with open(broker.log_path) as log:
        assert "cannot bind" in log.read()
    assert not broker.running


def test_missing_binary_is_a_broker_error(tmp_path):
    with pytest.raises(BrokerError, match="cannot start"):
        EmbeddedBroker(binary=str(tmp_path / "nope")).start()

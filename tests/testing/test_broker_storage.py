"""The embedded broker on durable storage: a restart keeps every record, offset and topic.

tansu's ``s3://`` engine against a local S3 server (:class:`~cdcflow_testkit.services.object_stores.MotoS3`, moto) is the
durable storage this tansu build has (``postgres://`` is not compiled in; see the module
docstring of ``cdcflow_testkit.services.broker``). The memory engine loses everything on restart,
which is what makes the restart test meaningful.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from cdcflow_testkit.encoders import Message
from cdcflow_testkit.services import object_stores as object_stores_module
from cdcflow_testkit.services.broker import BrokerError, EmbeddedBroker, StorageUnavailable
from cdcflow_testkit.services.object_stores import MotoS3

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def s3_broker():
    with EmbeddedBroker(storage="s3") as b:
        yield b


def _topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _records(broker: EmbeddedBroker, topic: str) -> list[tuple]:
    """``(partition, offset, key, value, headers)`` of every record up to the high watermarks."""
    ends = broker.end_offsets(topic)
    consumer = Consumer(broker.client_config(**{"group.id": "t", "enable.auto.commit": False}))
    out = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end])
        deadline = time.monotonic() + 30
        while len(out) < sum(ends.values()) and time.monotonic() < deadline:
            for m in consumer.consume(10_000, timeout=0.2):
                if m.error() is None and m.offset() < ends[m.partition()]:
                    out.append((m.partition(), m.offset(), m.key(), m.value(), m.headers()))
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r[0], r[1]))


def _messages(n: int, tag: str) -> list:
    out: list = [(f"k{i % 97}".encode(), f"{tag}-{i}".encode()) for i in range(n)]
    out.append(Message(value=b"with headers", key=b"k1", headers=(("h", b"1"), ("h", b"2"))))
    out.append(Message(value=None, key=b"k2"))  # tombstone
    return out


def _assert_contiguous(records: list[tuple], ends: dict[int, int]) -> None:
    for p, end in ends.items():
        assert [r[1] for r in records if r[0] == p] == list(range(end)), f"partition {p}"


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_a_restart_keeps_every_record_and_offset_and_producing_goes_on(s3_broker, hard):
    topic = _topic("durable")
    s3_broker.create_topic(topic, partitions=3)
    s3_broker.produce(topic, _messages(3000, "before"))
    before = _records(s3_broker, topic)
    ends_before = s3_broker.end_offsets(topic)
    assert len(before) == sum(ends_before.values()) == 3002
    _assert_contiguous(before, ends_before)

    # Clients made before the restart must carry on after it (librdkafka reconnects).
    consumer = Consumer(s3_broker.client_config(**{"group.id": "t", "enable.auto.commit": False}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    producer = Producer(s3_broker.client_config(**{"linger.ms": 0, "batch.num.messages": 1}))
    pid, address = s3_broker._proc.pid, s3_broker.bootstrap_servers

    s3_broker.restart(hard=hard)

    assert s3_broker._proc.pid != pid and s3_broker.bootstrap_servers == address
    assert s3_broker.partitions(topic) == 3
    assert s3_broker.end_offsets(topic) == ends_before
    assert _records(s3_broker, topic) == before

    seen = []
    deadline = time.monotonic() + 30
    while len(seen) < ends_before[0] and time.monotonic() < deadline:
        seen += [m.offset() for m in consumer.consume(10_000, timeout=0.2) if m.error() is None]
    consumer.close()
    assert seen == list(range(ends_before[0]))
    producer.produce(topic, value=b"old client", partition=1)
    assert producer.flush(30) == 0

    more = s3_broker.produce(topic, _messages(500, "after"))
    after = _records(s3_broker, topic)
    ends_after = s3_broker.end_offsets(topic)
    assert more == {p: e for p, e in ends_after.items() if p in more}
    assert sum(ends_after.values()) == 3002 + 1 + 502
    _assert_contiguous(after, ends_after)
    assert [r for r in after if r[1] < ends_before[r[0]]] == before
    new_values = [r[3] for r in after if r[1] >= ends_before[r[0]]]
    assert sorted(v for v in new_values if v and v.startswith(b"after-")) == sorted(
        f"after-{i}".encode() for i in range(500)
    )
    assert b"old client" in new_values


def test_the_memory_broker_loses_its_topics_on_restart():
    """Why the durable test above means something: memory storage keeps nothing."""
    with EmbeddedBroker() as b:
        topic = _topic("volatile")
        b.create_topic(topic, partitions=2)
        b.produce(topic, [(b"k", b"v")] * 10)
        assert sum(b.end_offsets(topic).values()) == 10
        b.restart()
        assert topic not in b.topics()
        assert b.partitions(topic) == 0


def test_on_s3_the_high_watermark_is_the_first_batch_of_the_latest_second(s3_broker):
    """The tansu quirk produce() waits a second for on s3. If this fails, tansu changed."""
    topic = _topic("quirk")
    s3_broker.create_topic(topic)
    while time.time() % 1 > 0.3:  # both writes inside one second
        time.sleep(0.05)
    producer = Producer(s3_broker.client_config(**{"linger.ms": 50}))
    for i in range(100):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(10) == 0
    producer.produce(topic, value=b"alone", partition=0)
    assert producer.flush(10) == 0
    assert s3_broker.end_offsets(topic) == {0: 1}  # batch at offset 0 wins the tie
    s3_broker.produce(topic, [(None, b"last")])
    assert s3_broker.end_offsets(topic) == {0: 102}


def test_the_local_s3_server_leaves_no_process_and_no_log():
    server = MotoS3().start()
    proc, log_path, port = server._proc, server.log_path, server.port
    assert server.running and log_path
    server.stop()
    assert proc.poll() is not None and not server.running
    assert not os.path.exists(log_path)
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 1):
        pass
    server.stop()  # idempotent


def test_stopping_the_broker_stops_its_storage():
    with EmbeddedBroker(storage="s3") as b:
        storage, broker = b.object_store._proc, b._proc
    assert broker.poll() is not None and storage.poll() is not None
    assert not b.object_store.running


def test_missing_moto_is_a_clear_storage_error(monkeypatch):
    real = object_stores_module.importlib.util.find_spec
    monkeypatch.setattr(
        object_stores_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "moto" else real(name, *a),
    )
    with pytest.raises(StorageUnavailable, match=r"moto is not installed.*pip install") as info:
        EmbeddedBroker(storage="s3").start()
    assert info.value.code == "STORAGE_UNAVAILABLE"


def test_restart_needs_a_started_broker_and_storage_must_be_known():
    with pytest.raises(BrokerError, match="not started"):
        EmbeddedBroker().restart()
    with pytest.raises(ValueError, match="'memory' or 's3'"):
        EmbeddedBroker(storage="postgres")

"""The applied offsets committed to a consumer group for monitoring tools
(``cdcflow.source.group_offsets``): on a real broker the group holds them after
``close``; with no broker a submit never waits and ``close`` gives up within its bound."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from cdcflow.source.group_offsets import GroupOffsets

pytestmark = [pytest.mark.kafka]


def test_the_group_holds_the_newest_offsets_submitted(broker):
    broker.create_topic("monitor.offsets", partitions=2)
    broker.produce("monitor.offsets", [(None, b"a"), (None, b"b"), (None, b"c")], partition=0)
    broker.produce("monitor.offsets", [(None, b"d")], partition=1)
    group = GroupOffsets({"kafka.bootstrap.servers": broker.bootstrap_servers}, "cdcflow-mon")
    group.submit({("monitor.offsets", 0): 2})
    group.submit({("monitor.offsets", 0): 3, ("monitor.offsets", 1): 1})
    group.submit({("monitor.offsets", 0): 1})  # never backwards
    group.close()
    assert group.commits >= 1
    reader = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "cdcflow-mon"})
    try:
        tps = [TopicPartition("monitor.offsets", p) for p in (0, 1)]
        committed = {c.partition: c.offset for c in reader.committed(tps, timeout=10)}
    finally:
        reader.close()
    assert committed == {0: 3, 1: 1}


def test_without_a_broker_submit_never_waits_and_close_is_bounded():
    group = GroupOffsets({"kafka.bootstrap.servers": "127.0.0.1:1"}, "cdcflow-nobody")
    started = time.monotonic()
    group.submit({("t", 0): 5})
    assert time.monotonic() - started < 0.5
    group.close(timeout_s=2.0)
    assert time.monotonic() - started < 10.0
    assert group.commits == 0

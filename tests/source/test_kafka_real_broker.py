"""What only a real Apache Kafka broker shows the Kafka source: transactions (commit
markers leave offset gaps, aborted records, the last stable offset), records deleted
below the low watermark, compaction's gaps, eight partitions, and a broker restart with
its log kept on disk. No Spark: the stream reader's driver methods and the executor read
are called directly, as Spark calls them.
"""

from __future__ import annotations

import time
import uuid

import pytest

from cdcflow.errors import SourceError
from cdcflow.source.kafka.datasource import KafkaStreamReader
from cdcflow.source.kafka.options import parse_options
from cdcflow.source.kafka.planning import DATA_LOSS, KafkaInputPartition
from cdcflow.source.kafka.reader import read_partition

pytestmark = [pytest.mark.kafka]


def _topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _options(broker, **extra) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": broker.bootstrap_servers}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def _transactional(broker):
    from confluent_kafka import Producer

    producer = Producer(
        broker.client_config(**{"transactional.id": f"cdcflow-test-{uuid.uuid4().hex[:8]}"})
    )
    producer.init_transactions(30)
    return producer


def _transaction(producer, topic, values, commit=True):
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, value=v, key=v, partition=0)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # on the broker before the abort (which purges what is queued)
        producer.abort_transaction(30)


def _latest(broker, topic, **extra) -> dict:
    """The stream reader's end offsets of ``topic`` (what a micro-batch would read up to)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = KafkaStreamReader(parse_options(_options(broker, subscribe=topic, **extra)))
    try:
        start = reader.initialOffset()
        return reader.latestOffset(start, ReadAllAvailable())[topic]
    finally:
        reader.stop()


def _read(broker, topic, start, end, partition=0, **extra) -> list[tuple[int, bytes]]:
    opts = parse_options(_options(broker, subscribe=topic, **extra))
    batches = read_partition(opts, KafkaInputPartition(topic, partition, start, end))
    return [
        (o, v)
        for b in batches
        for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist(), strict=True)
    ]


def test_commit_markers_leave_gaps_that_a_read_skips_up_to_the_last_marker(apache_kafka):
    topic = _topic("txn-gaps")
    apache_kafka.create_topic(topic)
    producer = _transactional(apache_kafka)
    for t in range(3):
        _transaction(producer, topic, [b"t%d-%d" % (t, i) for i in range(10)])
    # three transactions of ten records, each followed by its commit marker
    end = _latest(apache_kafka, topic, startingOffsets="earliest")
    assert end == {"0": 33}
    for isolation in ("read_uncommitted", "read_committed"):
        got = _read(apache_kafka, topic, 0, 33, **{"kafka.isolation.level": isolation})
        assert [o for o, _ in got] == [*range(0, 10), *range(11, 21), *range(22, 32)]
        assert [v for _, v in got] == [b"t%d-%d" % (t, i) for t in range(3) for i in range(10)]
    # a range that ends on a marker, and one that holds nothing but a marker
    assert [o for o, _ in _read(apache_kafka, topic, 5, 11)] == list(range(5, 10))
    assert _read(apache_kafka, topic, 10, 11) == []


def test_aborted_records_are_read_only_with_read_uncommitted_as_in_spark(apache_kafka):
    topic = _topic("txn-abort")
    apache_kafka.create_topic(topic)
    producer = _transactional(apache_kafka)
    _transaction(producer, topic, [b"a%d" % i for i in range(5)])
    _transaction(producer, topic, [b"x%d" % i for i in range(5)], commit=False)
    _transaction(producer, topic, [b"b%d" % i for i in range(5)])
    end = int(_latest(apache_kafka, topic, startingOffsets="earliest")["0"])
    assert end == 18  # 15 records and 3 markers
    committed = _read(apache_kafka, topic, 0, end, **{"kafka.isolation.level": "read_committed"})
    assert [v for _, v in committed] == [b"a%d" % i for i in range(5)] + [
        b"b%d" % i for i in range(5)
    ]
    # Spark's default (and so the source's): the aborted records are read too
    everything = _read(apache_kafka, topic, 0, end)
    assert [v for _, v in everything][5:10] == [b"x%d" % i for i in range(5)]


def test_read_committed_plans_up_to_the_last_stable_offset_of_an_open_transaction(
    apache_kafka,
):
    topic = _topic("txn-open")
    apache_kafka.create_topic(topic)
    producer = _transactional(apache_kafka)
    _transaction(producer, topic, [b"c%d" % i for i in range(4)])  # offsets 0-3, marker 4
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, value=b"open%d" % i, partition=0)
    producer.flush(30)  # offsets 5-10 written, not committed
    committed = {"kafka.isolation.level": "read_committed", "startingOffsets": "earliest"}
    # the planned end is the last stable offset, so the executor's read cannot wait on
    # records it may never be allowed to see
    assert _latest(apache_kafka, topic, **committed) == {"0": 5}
    assert [v for _, v in _read(apache_kafka, topic, 0, 5, **committed)] == [
        b"c%d" % i for i in range(4)
    ]
    assert _latest(apache_kafka, topic, startingOffsets="earliest") == {"0": 11}
    producer.commit_transaction(30)
    assert _latest(apache_kafka, topic, **committed) == {"0": 12}
    assert [v for _, v in _read(apache_kafka, topic, 5, 12, **committed)] == [
        b"open%d" % i for i in range(6)
    ]


def test_records_deleted_below_the_low_watermark_are_data_loss_unless_allowed(apache_kafka):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = _topic("deleted")
    apache_kafka.create_topic(topic)
    apache_kafka.produce(topic, [(None, b"v%d" % i) for i in range(20)])
    admin = AdminClient(apache_kafka.client_config())
    for future in admin.delete_records([TopicPartition(topic, 0, 10)]).values():
        future.result(30)
    assert apache_kafka.watermarks(topic) == {0: (10, 20)}
    start = {topic: {"0": 3}}
    strict = KafkaStreamReader(parse_options(_options(apache_kafka, subscribe=topic)))
    try:
        with pytest.raises(SourceError) as info:
            strict.latestOffset(start, None)
        assert info.value.code == DATA_LOSS
        assert "earliest offset still stored is 10" in info.value.message
    finally:
        strict.stop()
    with pytest.raises(SourceError) as info:
        _read(apache_kafka, topic, 3, 20)
    assert info.value.code == DATA_LOSS
    lenient = _options(apache_kafka, subscribe=topic, failOnDataLoss="false")
    reader = KafkaStreamReader(parse_options(lenient))
    try:
        end = reader.latestOffset(start, None)
        assert reader.partitions(start, end) == [KafkaInputPartition(topic, 0, 10, 20)]
    finally:
        reader.stop()
    assert [o for o, _ in _read(apache_kafka, topic, 3, 20, failOnDataLoss="false")] == list(
        range(10, 20)
    )


def test_a_compacted_topic_leaves_gaps_that_a_read_skips(apache_kafka):
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = _topic("compacted")
    admin = AdminClient(apache_kafka.client_config())
    config = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100",
    }
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        future.result(30)
    # ten versions of each of five keys; compaction keeps the last version of each key
    rounds = 10
    for r in range(rounds):
        apache_kafka.produce(topic, [(b"k%d" % k, b"k%d-v%d" % (k, r)) for k in range(5)])
        time.sleep(0.15)  # a segment per round: only closed segments are compacted
    end = rounds * 5
    deadline = time.monotonic() + 60
    got = _read(apache_kafka, topic, 0, end)
    while len(got) == end and time.monotonic() < deadline:
        apache_kafka.produce(topic, [(b"roll", b"x")])  # rolls the active segment
        time.sleep(1)
        got = _read(apache_kafka, topic, 0, end)
    assert len(got) < end, "the log cleaner did not compact the topic within 60 s"
    offsets = [o for o, _ in got]
    assert offsets == sorted(set(offsets)) and offsets[-1] < end
    # every key's last version survives (the tail of the range is never compacted away)
    last = {v.split(b"-")[0]: v for _, v in got}
    assert last == {b"k%d" % k: b"k%d-v%d" % (k, rounds - 1) for k in range(5)}


def test_eight_partitions_are_planned_and_read_completely(apache_kafka):
    topic = _topic("eight")
    apache_kafka.create_topic(topic, partitions=8)
    for p in range(8):
        apache_kafka.produce(topic, [(None, b"p%d-%d" % (p, i)) for i in range(p + 1)], partition=p)
    end = _latest(apache_kafka, topic, startingOffsets="earliest")
    assert end == {str(p): p + 1 for p in range(8)}
    for p in range(8):
        got = _read(apache_kafka, topic, 0, p + 1, partition=p)
        assert [v for _, v in got] == [b"p%d-%d" % (p, i) for i in range(p + 1)]


def test_a_broker_restart_keeps_the_log_and_a_read_goes_on_after_it(apache_kafka):
    topic = _topic("restart")
    apache_kafka.create_topic(topic, partitions=2)
    apache_kafka.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(200)])
    before = apache_kafka.watermarks(topic)
    apache_kafka.restart()  # SIGTERM: a controlled shutdown
    assert apache_kafka.watermarks(topic) == before
    apache_kafka.restart(hard=True)  # SIGKILL: the log is recovered from disk
    assert apache_kafka.watermarks(topic) == before
    got = sorted(v for p, (_, e) in before.items() for _, v in _read(apache_kafka, topic, 0, e, p))
    assert got == sorted(b"v%d" % i for i in range(200))

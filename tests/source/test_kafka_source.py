"""The Python Kafka streaming source ``cdcflow_kafka``, on the embedded tansu broker and
on Apache Kafka (``tests/source/conftest.py`` runs each broker test on both).

Spark tests run real streaming queries (``Trigger.AvailableNow`` into ``foreachBatch``)
on the session SparkSession. Tansu cannot delete records (``DeleteRecords`` is not
implemented), so here the "start offset below the low watermark" case is tested through
:func:`resolve_start_offset` and through the stream reader with the watermark lookup
replaced; ``test_kafka_real_broker.py`` deletes records on Apache Kafka for real. The
"offsets went backwards" case (topic deleted and re-created) runs end to end through Spark.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from cdcflow.errors import ConfigError, SourceError
from cdcflow.source.kafka.datasource import (
    FORMAT,
    KafkaStreamReader,
    jvm_kafka_available,
    read_stream,
)
from cdcflow.source.kafka.options import parse_options
from cdcflow.source.kafka.planning import (
    DATA_LOSS,
    KafkaInputPartition,
    resolve_start_offset,
    split_fairly,
)
from cdcflow.source.kafka.reader import read_partition
from cdcflow.source.kafka.schema import ARROW_SCHEMA, KAFKA_SCHEMA
from cdcflow_testkit.encoders import Message


def _topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class _TimedMessage:
    value: bytes | None
    key: bytes | None = None
    headers: tuple = ()
    timestamp_ms: int | None = None


def _options(broker, **extra) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": broker.bootstrap_servers}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def _run(spark, options, checkpoint, fail_on_batch=None, sink=None, timeout_s=180):
    """Run an AvailableNow query; return ``[(batch_id, rows)]`` of the batches it ran.

    Each row is a dict of the source columns plus ``ts_ms`` (timestamp as epoch ms).
    With ``fail_on_batch=n`` the query fails when batch ``n`` arrives and the
    StreamingQueryException is raised; the batches before it are in ``sink``.
    """
    batches: list[tuple[int, list[dict]]] = [] if sink is None else sink

    def collect(df, batch_id):
        if batch_id == fail_on_batch:
            raise RuntimeError(f"failing batch {batch_id} on purpose")
        rows = df.selectExpr("*", "unix_millis(timestamp) AS ts_ms").collect()
        batches.append((batch_id, [r.asDict(recursive=True) for r in rows]))

    query = (
        read_stream(spark, options)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = query.awaitTermination(timeout_s)
        assert finished, f"query did not finish within {timeout_s} s"
    finally:
        query.stop()
    return batches


def _checkpointed_offsets(checkpoint, batch_id) -> dict:
    """The source offsets Spark wrote to the checkpoint for ``batch_id``."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    return json.loads(lines[-1])


def _coords(batches) -> list[tuple[str, int, int]]:
    return [(r["topic"], r["partition"], r["offset"]) for _, rows in batches for r in rows]


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"subscribe": "t"}, ["kafka.bootstrap.servers"]),
        ({"kafka.bootstrap.servers": " ", "subscribe": "t"}, ["kafka.bootstrap.servers"]),
        ({"kafka.bootstrap.servers": "h:1"}, ["subscribe", "subscribePattern", "none"]),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "subscribePattern": "t.*"},
            ["subscribe and subscribePattern"],
        ),
        ({"kafka.bootstrap.servers": "h:1", "subscribePattern": "(["}, ["subscribePattern"]),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingOffsets": "newest"},
            ["startingOffsets", "earliest"],
        ),
        (
            {
                "kafka.bootstrap.servers": "h:1",
                "subscribe": "t",
                "startingOffsets": '{"t":{"0":-3}}',
            },
            ["startingOffsets", "-2 (earliest)"],
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxOffsetsPerTrigger": "0"},
            ["maxOffsetsPerTrigger", "positive"],
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "failOnDataLoss": "maybe"},
            ["failOnDataLoss"],
        ),
        ({"kafka.bootstrap.servers": "h:1", "subscibe": "t"}, ["subscibe", "valid options"]),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.auto.offset.reset": "x"},
            ["kafka.auto.offset.reset", "startingOffsets"],
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "endingOffsets": "latest"},
            ["endingoffsets"],
        ),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(options, names):
    with pytest.raises(ConfigError) as info:
        parse_options(options)
    for name in names:
        assert name in str(info.value)
    assert info.value.code == "BAD_CONFIG"


def test_options_are_parsed_case_insensitively():
    opts = parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "kafka.security.protocol": "SASL_SSL",
            "SUBSCRIBE": "a, b",
            "startingoffsets": '{"a":{"0":5,"1":-2},"b":{"0":-1}}',
            "maxOffsetsPerTrigger": "100",
            "failOnDataLoss": "FALSE",
            "includeHeaders": "true",
        }
    )
    assert opts.bootstrap_servers == "h:1"
    assert opts.client_config == {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL"}
    assert opts.subscribe == ("a", "b")
    assert opts.starting_offsets == {"a": {0: 5, 1: -2}, "b": {0: -1}}
    assert opts.max_offsets_per_trigger == 100
    assert opts.fail_on_data_loss is False
    assert opts.matches("a") and not opts.matches("c")
    pattern = parse_options({"kafka.bootstrap.servers": "h:1", "subscribePattern": "cdc\\..*"})
    assert pattern.matches("cdc.orders") and not pattern.matches("xcdc.orders")
    assert pattern.starting_offsets == "latest" and pattern.fail_on_data_loss is True


def test_librdkafka_rejects_unknown_kafka_settings_as_config_error(broker):
    opts = parse_options(_options(broker, subscribe="t", **{"kafka.sasl.jaas.config": "x"}))
    with pytest.raises(ConfigError, match="librdkafka"):
        KafkaStreamReader(opts).initialOffset()


# --------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(
    ("backlog", "limit", "expected"),
    [
        ({"a": 100, "b": 100, "c": 100}, 30, {"a": 10, "b": 10, "c": 10}),
        ({"a": 5, "b": 100, "c": 100}, 30, {"a": 5, "b": 12, "c": 13}),
        ({"a": 5, "b": 0}, 30, {"a": 5, "b": 0}),
        ({"a": 10, "b": 20, "c": 30}, 2, {"a": 0, "b": 1, "c": 1}),
        ({"a": 3, "b": 3}, 0, {"a": 0, "b": 0}),
    ],
)
def test_split_fairly(backlog, limit, expected):
    take = split_fairly(backlog, limit)
    assert take == expected
    assert sum(take.values()) == min(limit, sum(backlog.values()))
    assert all(take[k] <= backlog[k] for k in backlog)


def test_resolve_start_offset_inside_the_log():
    assert resolve_start_offset("t", 0, 5, 0, 10, True) == 5
    assert resolve_start_offset("t", 0, 10, 0, 10, True) == 10  # at the end: nothing new
    assert resolve_start_offset("t", 0, 3, 3, 3, True) == 3


def test_start_below_low_watermark_raises_data_loss():
    with pytest.raises(SourceError) as info:
        resolve_start_offset("orders", 2, 17, 40, 90, True)
    err = info.value
    assert err.code == DATA_LOSS
    for fragment in ("'orders'", "partition 2", "17", "40", "checkpoint", "failOnDataLoss=false"):
        assert fragment in err.message
    # Errors raised on executors must pickle.
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert again.code == DATA_LOSS and again.message == err.message


def test_start_beyond_end_raises_data_loss():
    with pytest.raises(SourceError, match="re-created") as info:
        resolve_start_offset("orders", 0, 50, 0, 3, True)
    assert info.value.code == DATA_LOSS


def test_fail_on_data_loss_false_skips_to_low_watermark_with_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="cdcflow.source.kafka"):
        assert resolve_start_offset("orders", 2, 17, 40, 90, False) == 40
        assert resolve_start_offset("orders", 2, 50, 0, 3, False) == 0
    assert len(caplog.records) == 2
    assert "orders" in caplog.records[0].getMessage()
    assert "skipping to offset 40" in caplog.records[0].getMessage()


# --------------------------------------------------------------------------- reader, no Spark


@pytest.mark.kafka
def test_read_partition_stops_exactly_at_the_end_offset(broker):
    topic = _topic("range")
    broker.create_topic(topic)
    broker.produce(topic, [(b"k%d" % i, b"v%d" % i) for i in range(30)])
    opts = parse_options(_options(broker, subscribe=topic, maxRecordsPerBatch=4))
    batches = list(read_partition(opts, KafkaInputPartition(topic, 0, 5, 12)))
    assert all(b.schema.equals(ARROW_SCHEMA) for b in batches)
    assert max(b.num_rows for b in batches) <= 4
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(5, 12))
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert values == [b"v%d" % i for i in range(5, 12)]
    # Up to the last record of the log.
    tail = list(read_partition(opts, KafkaInputPartition(topic, 0, 25, 30)))
    assert [o for b in tail for o in b.column("offset").to_pylist()] == list(range(25, 30))
    assert list(read_partition(opts, KafkaInputPartition(topic, 0, 7, 7))) == []


@pytest.mark.kafka
def test_reader_plans_offsets_partitions_and_admission_control(broker):
    topic = _topic("plan")
    broker.create_topic(topic, partitions=2)
    broker.produce(topic, [(None, b"a")] * 10, partition=0)
    broker.produce(topic, [(None, b"b")] * 4, partition=1)
    reader = KafkaStreamReader(
        parse_options(_options(broker, subscribe=topic, startingOffsets="earliest"))
    )
    try:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        start = reader.initialOffset()
        assert start == {topic: {"0": 0, "1": 0}}
        assert reader.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 10, "1": 4}}
        end = reader.latestOffset(start, ReadMaxRows(6))
        assert end == {topic: {"0": 3, "1": 3}}
        assert reader.partitions(start, end) == [
            KafkaInputPartition(topic, 0, 0, 3),
            KafkaInputPartition(topic, 1, 0, 3),
        ]
        # Trigger.AvailableNow: records produced after prepare are not read in this run.
        reader.prepareForTriggerAvailableNow()
        broker.produce(topic, [(None, b"c")] * 5, partition=1)
        assert reader.latestOffset(end, ReadAllAvailable()) == {topic: {"0": 10, "1": 4}}
        assert reader.reportLatestOffset() == {topic: {"0": 10, "1": 9}}
        done = {topic: {"0": 10, "1": 4}}
        assert reader.latestOffset(done, ReadAllAvailable()) == done
        assert reader.partitions(done, done) == []
    finally:
        reader.stop()


@pytest.mark.kafka
def test_reader_raises_when_start_is_below_the_low_watermark(broker, monkeypatch):
    """Tansu cannot delete records, so the low watermark is faked at 10."""
    topic = _topic("retention")
    broker.create_topic(topic)
    broker.produce(topic, [(None, b"x")] * 20)
    start = {topic: {"0": 3}}

    def fake_watermarks(self, tps):
        return {tp: (10, 20) for tp in tps}

    monkeypatch.setattr(KafkaStreamReader, "_watermarks", fake_watermarks)
    strict = KafkaStreamReader(parse_options(_options(broker, subscribe=topic)))
    with pytest.raises(SourceError) as info:
        strict.latestOffset(start, None)
    assert info.value.code == DATA_LOSS
    assert topic in info.value.message and "failOnDataLoss" in info.value.message
    with pytest.raises(SourceError, match="earliest offset still stored is 10"):
        strict.partitions(start, {topic: {"0": 20}})
    strict.stop()

    lenient = KafkaStreamReader(
        parse_options(_options(broker, subscribe=topic, failOnDataLoss="false"))
    )
    end = lenient.latestOffset(start, None)
    assert end == {topic: {"0": 20}}
    assert lenient.partitions(start, end) == [KafkaInputPartition(topic, 0, 10, 20)]
    lenient.stop()


@pytest.mark.kafka
def test_starting_offsets_json_must_name_every_partition(broker):
    topic = _topic("partial")
    broker.create_topic(topic, partitions=2)
    reader = KafkaStreamReader(
        parse_options(
            _options(broker, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 0}}))
        )
    )
    with pytest.raises(ConfigError, match=rf"startingOffsets.*{topic}\[1\]"):
        reader.initialOffset()
    reader.stop()


# --------------------------------------------------------------------------- Spark


@pytest.mark.spark
@pytest.mark.kafka
def test_registered_and_python_path_chosen(spark):
    from cdcflow.source.kafka.datasource import register

    assert not jvm_kafka_available(spark)  # no Spark Kafka jars here
    register(spark)
    register(spark)  # once per session: no "replaced a previously registered" warning
    assert "cdcflow_kafka" in spark.__dict__["_cdcflow_data_sources"]
    df = (
        spark.readStream.format(FORMAT)
        .options(**{"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "x"})
        .load()
    )
    assert df.isStreaming
    assert df.schema == KAFKA_SCHEMA
    assert [f.name for f in df.schema] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers",
    ]  # fmt: skip


@pytest.mark.spark
@pytest.mark.kafka
def test_all_columns_read_back(spark, broker, tmp_path):
    topic = _topic("columns")
    broker.create_topic(topic)
    sent = [
        _TimedMessage(b"v0", b"k0", (("h1", b"a"), ("h1", b"b"), ("n", None)), 1_700_000_000_001),
        _TimedMessage(None, b"k1", (), 1_700_000_000_002),  # tombstone
        _TimedMessage(b"v2", None, (), 1_700_000_000_003),  # no key
        _TimedMessage(b"", b"", (("e", b""),), 1_700_000_000_004),  # empty, not null
        _TimedMessage(bytes(range(256)), b"\x00\xff", (), 1_700_000_000_005),
    ]
    broker.produce(topic, sent, partition=0)
    batches = _run(spark, _options(broker, subscribe=topic, startingOffsets="earliest"), tmp_path)
    rows = [r for _, b in batches for r in b]
    assert len(rows) == len(sent)
    for offset, (row, msg) in enumerate(
        zip(sorted(rows, key=lambda r: r["offset"]), sent, strict=True)
    ):
        assert row["offset"] == offset
        assert row["topic"] == topic
        assert row["partition"] == 0
        assert row["key"] == msg.key
        assert row["value"] == msg.value
        assert row["ts_ms"] == msg.timestamp_ms
        assert row["timestampType"] == 0  # CreateTime
        expected_headers = [{"key": k, "value": v} for k, v in msg.headers] or None
        assert row["headers"] == expected_headers
    assert rows[1]["value"] is None and rows[2]["key"] is None
    assert rows[3]["value"] == b"" and rows[3]["key"] == b""


@pytest.mark.spark
@pytest.mark.kafka
def test_restart_resumes_exactly_after_the_last_committed_offset(spark, broker, tmp_path):
    from pyspark.errors import StreamingQueryException

    topic = _topic("restart")
    broker.create_topic(topic, partitions=2)
    for p in (0, 1):
        broker.produce(topic, [Message(value=b"a%d" % i, key=b"%d" % i) for i in range(20)], p)
    ends = broker.end_offsets(topic)
    everything = {(topic, p, o) for p, end in ends.items() for o in range(end)}
    options = _options(broker, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger=10)

    # Run 1 fails in batch 1: batch 0 is committed, batch 1 is planned but not committed.
    run1: list = []
    with pytest.raises(StreamingQueryException, match="on purpose"):
        _run(spark, options, tmp_path, fail_on_batch=1, sink=run1)
    assert [b for b, _ in run1] == [0] and len(_coords(run1)) == 10
    assert _checkpointed_offsets(tmp_path, 0) == {topic: {"0": 5, "1": 5}}
    planned = _checkpointed_offsets(tmp_path, 1)

    # Run 2 replays batch 1 with exactly the planned offsets, then reads to the end.
    run2 = _run(spark, options, tmp_path)
    assert run2[0][0] == 1
    assert set(_coords(run2[:1])) == {
        (topic, int(p), o) for p, end in planned[topic].items() for o in range(5, end)
    }
    seen = _coords(run1) + _coords(run2)
    assert len(seen) == 40 and set(seen) == everything  # no duplicate, no loss

    # Run 3 reads only what was produced since.
    broker.produce(topic, [Message(value=b"b%d" % i, key=b"%d" % i) for i in range(7)])
    run3 = _run(spark, options, tmp_path)
    assert len(_coords(run3)) == 7 and not set(_coords(run3)) & everything
    assert {r["value"] for _, rows in run3 for r in rows} == {b"b%d" % i for i in range(7)}

    # Run 4: nothing new, no rows.
    assert _coords(_run(spark, options, tmp_path)) == []


@pytest.mark.spark
@pytest.mark.kafka
def test_max_offsets_per_trigger_splits_into_fair_micro_batches(spark, broker, tmp_path):
    topic = _topic("limit")
    broker.create_topic(topic, partitions=3)
    broker.produce(topic, [(None, b"x")] * 50, partition=0)
    broker.produce(topic, [(None, b"y")] * 30, partition=1)
    broker.produce(topic, [(None, b"z")] * 5, partition=2)
    options = _options(broker, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger=20)
    batches = _run(spark, options, tmp_path)
    sizes = [len(rows) for _, rows in batches]
    assert sizes == [20, 20, 20, 20, 5]
    first = [r["partition"] for r in batches[0][1]]
    assert (first.count(0), first.count(1), first.count(2)) == (8, 7, 5)
    coords = _coords(batches)
    assert len(set(coords)) == 85
    for p, n in ((0, 50), (1, 30), (2, 5)):
        assert sorted(o for _, q, o in coords if q == p) == list(range(n))


@pytest.mark.spark
@pytest.mark.kafka
def test_starting_offsets_latest_reads_only_later_records(spark, broker, tmp_path):
    topic = _topic("latest")
    broker.create_topic(topic)
    broker.produce(topic, [(None, b"old")] * 20)
    options = _options(broker, subscribe=topic, startingOffsets="latest")
    assert _coords(_run(spark, options, tmp_path)) == []  # an empty batch 0 pins offset 20
    broker.produce(topic, [(None, b"new")] * 5)
    batches = _run(spark, options, tmp_path)
    assert _coords(batches) == [(topic, 0, o) for o in range(20, 25)]
    assert {r["value"] for _, rows in batches for r in rows} == {b"new"}


@pytest.mark.spark
@pytest.mark.kafka
def test_starting_offsets_json_per_partition(spark, broker, tmp_path):
    topic = _topic("json")
    broker.create_topic(topic, partitions=3)
    for p in range(3):
        broker.produce(topic, [(None, b"%d" % p)] * 6, partition=p)
    starting = json.dumps({topic: {"0": 4, "1": -2, "2": -1}})
    options = _options(broker, subscribe=topic, startingOffsets=starting)
    coords = sorted(_coords(_run(spark, options, tmp_path)))
    assert coords == [(topic, 0, 4), (topic, 0, 5)] + [(topic, 1, o) for o in range(6)]


@pytest.mark.spark
@pytest.mark.kafka
def test_subscribe_pattern_discovers_new_topics(spark, broker, tmp_path):
    prefix = f"pat{uuid.uuid4().hex[:8]}"
    a, b, other = f"{prefix}.a", f"{prefix}.b", f"x{prefix}.c"
    broker.create_topic(a)
    broker.create_topic(b, partitions=2)
    broker.create_topic(other)
    broker.produce(a, [(b"k", b"a")] * 3)
    broker.produce(b, [(b"k%d" % i, b"b") for i in range(4)])
    broker.produce(other, [(b"k", b"o")] * 2)
    options = _options(broker, subscribePattern=rf"{prefix}\..*", startingOffsets="earliest")
    first = _coords(_run(spark, options, tmp_path))
    assert len(first) == 7 and {t for t, _, _ in first} == {a, b}
    # A topic created later is found at the next micro-batch and read from its start.
    c = f"{prefix}.c"
    broker.create_topic(c)
    broker.produce(c, [(b"k", b"c")] * 2)
    broker.produce(a, [(b"k", b"a2")])
    second = _coords(_run(spark, options, tmp_path))
    assert sorted(second) == sorted([(c, 0, 0), (c, 0, 1), (a, 0, 3)])


@pytest.mark.spark
@pytest.mark.kafka
def test_recreated_topic_is_data_loss_unless_allowed(spark, broker, tmp_path):
    from pyspark.errors import StreamingQueryException

    topic = _topic("recreated")
    broker.create_topic(topic)
    broker.produce(topic, [(None, b"old")] * 10)
    options = _options(broker, subscribe=topic, startingOffsets="earliest")
    assert len(_coords(_run(spark, options, tmp_path))) == 10
    futures = broker._admin.delete_topics([topic], request_timeout=10)
    futures[topic].result(10)
    broker.create_topic(topic)
    broker.produce(topic, [(None, b"new")] * 3)
    with pytest.raises(StreamingQueryException) as info:
        _run(spark, options, tmp_path)
    text = str(info.value)
    assert DATA_LOSS in text and topic in text and "failOnDataLoss=false" in text
    lenient = dict(options, failOnDataLoss="false")
    batches = _run(spark, lenient, tmp_path)
    assert _coords(batches) == [(topic, 0, o) for o in range(3)]
    assert {r["value"] for _, rows in batches for r in rows} == {b"new"}


@pytest.mark.spark
@pytest.mark.kafka
def test_bad_config_errors_through_spark_and_read_stream(spark, broker):
    from cdcflow.source.kafka.datasource import register

    register(spark)
    with pytest.raises(Exception, match="kafka.bootstrap.servers"):
        spark.readStream.format(FORMAT).option("subscribe", "x").load()
    with pytest.raises(ConfigError, match="subscribe and subscribePattern"):
        read_stream(spark, _options(broker, subscribe="a", subscribePattern="b"))
    with pytest.raises(ConfigError, match="none of them"):
        read_stream(spark, _options(broker))
    with pytest.raises(ConfigError, match="engine"):
        read_stream(spark, _options(broker, subscribe="a"), engine="scala")


# --------------------------------------------------------------------------- read loop, fake consumer


class _FakeError:
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def str(self):
        return f"fake error {self._code}"


class _FakeMessage:
    def __init__(self, offset, error=None):
        self._offset, self._error = offset, error

    def error(self):
        return self._error

    def offset(self):
        return self._offset

    def key(self):
        return b"k%d" % self._offset

    def value(self):
        return b"v%d" % self._offset

    def timestamp(self):
        return (1, 1_000 + self._offset)

    def headers(self):
        return None


class _FakeConsumer:
    """Hands out prepared batches, ignoring num_messages (as a broker with gaps may)."""

    def __init__(self, batches, watermarks=(0, 100)):
        self.batches = list(batches)
        self.watermarks = watermarks
        self.assigned = []

    def assign(self, tps):
        self.assigned.append([(tp.topic, tp.partition, tp.offset) for tp in tps])

    def consume(self, num_messages=1, timeout=-1):
        return self.batches.pop(0) if self.batches else []

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        return self.watermarks

    def close(self):
        pass


def _read_with(monkeypatch, consumer, start, end, fail_on_data_loss=True):
    from cdcflow.source.kafka import reader

    monkeypatch.setattr(reader, "make_consumer", lambda opts, role, errors=None: consumer)
    opts = parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "t",
            "failOnDataLoss": str(fail_on_data_loss).lower(),
            "kafkaConsumer.pollTimeoutMs": "1500",
        }
    )
    batches = list(read_partition(opts, KafkaInputPartition("t", 0, start, end)))
    return [o for b in batches for o in b.column("offset").to_pylist()], batches


def test_read_loop_skips_gaps_and_never_emits_outside_the_range(monkeypatch):
    from confluent_kafka import KafkaError

    m, eof = _FakeMessage, lambda o: _FakeMessage(o, _FakeError(KafkaError._PARTITION_EOF))
    consumer = _FakeConsumer(
        [
            [m(3), m(5), m(6)],  # 3 is before the range
            [m(6), m(8), m(9)],  # 6 again (never emitted twice); 7 is a gap (compaction)
            [m(11), m(12), m(13)],  # 12 and 13 are beyond the end
            [m(14), eof(15)],  # never asked for
        ]
    )
    offsets, batches = _read_with(monkeypatch, consumer, 5, 12)
    assert offsets == [5, 6, 8, 9, 11]
    assert consumer.assigned == [[("t", 0, 5)]]
    assert len(consumer.batches) == 1  # stopped at the end, did not consume further
    first = batches[0].to_pylist()[0]
    assert first["key"] == b"k5" and first["timestampType"] == 0 and first["headers"] is None
    assert first["timestamp"] == datetime(1970, 1, 1, 0, 0, 1, 5_000, tzinfo=UTC)

    # The range ends in a gap (e.g. transaction markers): the end of the log stops it.
    consumer = _FakeConsumer([[m(0), m(1), m(2)], [eof(5)]], watermarks=(0, 5))
    assert _read_with(monkeypatch, consumer, 0, 5)[0] == [0, 1, 2]


def test_read_loop_offset_out_of_range_is_data_loss(monkeypatch):
    from confluent_kafka import KafkaError

    reset = _FakeMessage(-1, _FakeError(KafkaError._AUTO_OFFSET_RESET))
    consumer = _FakeConsumer([[reset]], watermarks=(20, 40))
    with pytest.raises(SourceError, match="earliest offset still stored is 20") as info:
        _read_with(monkeypatch, consumer, 10, 30)
    assert info.value.code == DATA_LOSS

    consumer = _FakeConsumer([[reset], [_FakeMessage(20), _FakeMessage(21)]], watermarks=(20, 40))
    offsets, _ = _read_with(monkeypatch, consumer, 10, 22, fail_on_data_loss=False)
    assert offsets == [20, 21]
    assert consumer.assigned == [[("t", 0, 10)], [("t", 0, 20)]]


def test_read_loop_times_out_without_progress(monkeypatch):
    consumer = _FakeConsumer([[_FakeMessage(0)]], watermarks=(0, 10))
    with pytest.raises(SourceError, match="kafkaConsumer.pollTimeoutMs"):
        _read_with(monkeypatch, consumer, 0, 5)


def test_read_loop_raises_other_consumer_errors(monkeypatch):
    """An error that is not transient (here: not authorized) is raised at once."""
    from confluent_kafka import KafkaError

    broken = _FakeMessage(-1, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(SourceError, match="partition 0 at offset 3: TOPIC_AUTHORIZATION") as info:
        _read_with(monkeypatch, _FakeConsumer([[broken]]), 3, 5)
    assert info.value.code == "SOURCE_ERROR"


@pytest.mark.kafka
def test_assign_reads_only_the_named_partitions(broker):
    topic = _topic("assign")
    broker.create_topic(topic, partitions=3)
    for p in range(3):
        broker.produce(topic, [(None, b"x")] * (p + 1), partition=p)
    options = _options(broker, assign=json.dumps({topic: [0, 2]}), startingOffsets="earliest")
    reader = KafkaStreamReader(parse_options(options))
    try:
        start = reader.initialOffset()
        assert start == {topic: {"0": 0, "2": 0}}
        end = reader.latestOffset(start, None)
        assert end == {topic: {"0": 1, "2": 3}}
        # An offset of a partition no longer selected (options changed) is dropped.
        assert reader.latestOffset({**start, "other": {"0": 4}}, None) == end
    finally:
        reader.stop()


def test_records_read_directly_equal_the_records_of_the_arrow_batch():
    """The fused decode source reads records without an Arrow batch in between
    (``_Columns.to_records``); they must equal what the Arrow path gives."""
    from cdcflow.decode.batches import records_from_kafka_batch
    from cdcflow.source.kafka.reader import _Columns

    cols = _Columns()
    cols.keys = [b"k", None, b"k3"]
    cols.values = [b"v", b"v2", None]
    cols.offsets = [7, 9, 12]
    cols.kinds = [1, 0, 2]  # create time, none, log-append time
    cols.stamps = [1_700_000_000_123, -1, 5]
    cols.headers = [None, [("h", b"x"), ("h", None)], []]
    direct = cols.to_records("topic.a", 3)
    via_arrow = records_from_kafka_batch(cols.to_record_batch("topic.a", 3))
    assert direct == via_arrow
    assert [r.timestamp_ms for r in direct] == [1_700_000_000_123, None, 5]

"""Read tasks: the topic-partition ranges of a micro-batch packed into a bounded number of
Spark tasks (``maxPartitions``, :func:`cdcflow.source.kafka.planning.pack_ranges`; decision 54).

With a topic per table (Debezium's layout) a micro-batch over 500 tables was 500 Spark
tasks, each with its own consumer, decoder and decoder-state read. The broker tests run on
tansu and on Apache Kafka (``tests/source/conftest.py``) and read real records back.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from tests.source.test_subscription import CANAL, MAXWELL  # vendor messages (Paimon's tests)

from cdcflow.config import KafkaConfig
from cdcflow.decode.batches import DecodeFunction
from cdcflow.errors import ConfigError
from cdcflow.event_schema import EVENT_SCHEMA
from cdcflow.source.changes import STAGED_SCHEMA, ChangesStreamReader, read_staged
from cdcflow.source.kafka.datasource import KafkaStreamReader
from cdcflow.source.kafka.options import parse_options
from cdcflow.source.kafka.planning import KafkaInputPartition, KafkaReadTask, pack_ranges, ranges_of
from cdcflow.source.subscription import SourceTopics, Subscription


def _ranges(sizes: dict[str, int]) -> list[KafkaInputPartition]:
    return [KafkaInputPartition(t, 0, 100, 100 + n) for t, n in sizes.items()]


def test_few_ranges_stay_a_task_each():
    parts = _ranges({"a": 5, "b": 7})
    assert pack_ranges(parts, 2) == parts
    assert pack_ranges(parts, 8) == parts


def test_many_ranges_are_packed_into_balanced_deterministic_tasks():
    sizes = {f"t{i:03d}": 1 + (i * 37) % 90 for i in range(500)}
    parts = _ranges(sizes)
    tasks = pack_ranges(parts, 4)
    assert len(tasks) == 4 and all(isinstance(t, KafkaReadTask) for t in tasks)
    placed = [r for t in tasks for r in ranges_of(t)]
    assert sorted(placed, key=repr) == sorted(parts, key=repr)  # each range exactly once
    for task in tasks:  # read in topic-partition order
        assert list(task.ranges) == sorted(task.ranges, key=lambda r: (r.topic, r.partition))
    loads = [sum(r.end - r.start for r in t.ranges) for t in tasks]
    assert max(loads) - min(loads) <= 90 + 200  # within one range (records + fixed cost)
    counts = [len(t.ranges) for t in tasks]
    assert max(counts) - min(counts) <= 10
    assert pack_ranges(list(reversed(parts)), 4) == tasks  # the same tasks on a re-run


def test_one_big_range_gets_a_task_of_its_own():
    parts = _ranges({"big": 100_000, **{f"s{i}": 10 for i in range(30)}})
    tasks = pack_ranges(parts, 3)
    assert [r.topic for r in tasks[0].ranges] == ["big"]
    assert sum(len(t.ranges) for t in tasks[1:]) == 30


def test_read_tasks_must_be_positive():
    with pytest.raises(ConfigError, match="maxPartitions"):
        parse_options(
            {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t", "maxPartitions": "0"}
        )
    assert KafkaConfig(bootstrap_servers="b:9", read_tasks=3).read_tasks == 3
    with pytest.raises(ValueError, match="read_tasks"):
        KafkaConfig(bootstrap_servers="b:9", read_tasks=0)


def _topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.mark.kafka
def test_the_reader_plans_and_reads_packed_ranges(broker):
    topics = [_topic(f"pack{i}") for i in range(5)]
    for i, topic in enumerate(topics):
        broker.create_topic(topic)
        broker.produce(topic, [(None, f"{topic}:{n}".encode()) for n in range(i + 1)])
    options = {
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "subscribe": ",".join(topics),
        "startingOffsets": "earliest",
        "maxPartitions": "2",
    }
    reader = KafkaStreamReader(parse_options(options))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        tasks = reader.partitions(start, end)
        assert len(tasks) == 2
        values = []
        for task in tasks:
            for batch in reader.read(task):
                values.extend(v.decode() for v in batch.column("value").to_pylist())
    finally:
        reader.stop()
    # every record once, and each topic's records in offset order
    assert sorted(values) == sorted(f"{t}:{n}" for i, t in enumerate(topics) for n in range(i + 1))
    for topic in topics:
        mine = [v for v in values if v.startswith(f"{topic}:")]
        assert mine == sorted(mine, key=lambda v: int(v.rsplit(":", 1)[1]))


class _CountingDecode(DecodeFunction):
    """Counts the decoder-state reads of a source (the reads themselves are real: no
    state table, so none)."""

    loads = 0

    def load_state(self):
        type(self).loads += 1
        return super().load_state()


@pytest.mark.kafka
def test_a_task_decodes_each_topic_in_its_sources_format_and_stages_one_file(broker, tmp_path):
    maxwell = [_topic("mw") for _ in range(3)]
    canal = [_topic("cn") for _ in range(2)]
    for topic in maxwell:
        broker.create_topic(topic)
        broker.produce(topic, [(None, MAXWELL), (None, MAXWELL)])
    for topic in canal:
        broker.create_topic(topic)
        broker.produce(topic, [(None, CANAL), (None, MAXWELL)])  # the second: a dead letter
    routing = Subscription(
        [
            SourceTopics("mw", tuple(maxwell), None, _CountingDecode("maxwell-json")),
            SourceTopics("cn", tuple(canal), None, _CountingDecode("canal-json")),
        ]
    )
    opts = parse_options(
        {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "subscribe": ",".join(maxwell + canal),
        }
    )
    task = KafkaReadTask(
        sorted((KafkaInputPartition(t, 0, 0, 2) for t in maxwell + canal), key=repr)
    )

    _CountingDecode.loads = 0
    direct = pa.Table.from_batches(
        list(ChangesStreamReader(opts, routing).read(task)), schema=EVENT_SCHEMA
    )
    assert _CountingDecode.loads == 2  # once per source, not once per range
    rows = sorted(
        zip(
            direct["topic"].to_pylist(),
            direct["offset"].to_pylist(),
            direct["kind"].to_pylist(),
            strict=True,
        )
    )
    expected = sorted(
        [(t, o, "event") for t in maxwell for o in (0, 1)]
        + [(t, 0, "event") for t in canal]
        + [(t, 1, "dead") for t in canal]
    )
    assert rows == expected

    staging = tmp_path / "staging"
    staged = ChangesStreamReader(opts, routing, str(staging))
    manifest = pa.Table.from_batches(list(staged.read(task)), schema=STAGED_SCHEMA)
    assert manifest.num_rows == 1 and manifest["rows"].to_pylist() == [10]
    assert (
        read_staged(manifest)
        .sort_by([("topic", "ascending"), ("offset", "ascending")])
        .equals(direct.sort_by([("topic", "ascending"), ("offset", "ascending")]))
    )
    again = pa.Table.from_batches(list(staged.read(task)), schema=STAGED_SCHEMA)
    assert again["staged_path"].to_pylist() == manifest["staged_path"].to_pylist()
    assert [p.name for p in staging.iterdir()] == [Path(manifest["staged_path"][0].as_py()).name]

"""Kafka delivery faults for tests, without a broker.

What a producer and a consumer do to a stream of messages, reproduced over plain lists:

* :func:`produce` spreads messages over the partitions of one topic by a routing key
  (the Kafka default partitioner keyed by primary key keeps each key's order inside its
  partition) and adds the faults of at-least-once delivery: exact duplicates (a producer
  retry without idempotence) and replays of earlier ranges (a connector that restarts
  from an older source position and publishes them again, at new offsets).
* :func:`micro_batches` cuts the partition logs into micro-batches as a streaming
  consumer does: each batch takes the next contiguous offset range of every partition
  (possibly empty), with random sizes, so partitions interleave.
* :func:`kafka_batch` gives a batch the columns of Spark's Kafka source, the input of
  :func:`cdcflow.decode.batches.decode_kafka_batch`.

Every function is deterministic given its ``rng`` (a ``random.Random`` or Hypothesis'
``st.randoms()``).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from cdcflow_testkit.encoders.base import Message

__all__ = ["KafkaRecord", "kafka_batch", "micro_batches", "partition_of", "produce"]


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record of a partition log: its coordinates and the message as produced."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def partition_of(routing_key: bytes, partitions: int) -> int:
    """The partition of a routing key (CRC-32 modulo the partition count)."""
    return zlib.crc32(routing_key) % partitions


def produce(
    messages: Iterable[tuple[bytes, Message]],
    partitions: int,
    rng: random.Random,
    duplicate_rate: float = 0.0,
    replay_rate: float = 0.0,
    max_replay: int = 6,
) -> list[list[KafkaRecord]]:
    """Produce messages to the partitions of one topic, with delivery faults.

    Args:
        messages: ``(routing_key, message)`` in source order; messages with the same
            routing key land in the same partition, in this order.
        partitions: number of partitions (>= 1).
        rng: decides every fault.
        duplicate_rate: probability that a message is written twice in a row.
        replay_rate: probability, after each message, that an earlier range of 1 to
            ``max_replay`` records of that partition is written again.
        max_replay: the longest replayed range, in records.

    Returns:
        One log per partition: records with offsets 0, 1, 2, ...

    Raises:
        ValueError: ``partitions`` < 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    logs: list[list[KafkaRecord]] = [[] for _ in range(partitions)]

    def write(p: int, key: bytes | None, value: bytes | None, headers: tuple) -> None:
        logs[p].append(KafkaRecord(p, len(logs[p]), key, value, headers))

    for routing_key, m in messages:
        p = partition_of(routing_key, partitions)
        write(p, m.key, m.value, m.headers)
        if duplicate_rate and rng.random() < duplicate_rate:
            write(p, m.key, m.value, m.headers)
        if replay_rate and rng.random() < replay_rate:
            log = logs[p]
            start = rng.randrange(len(log))
            for r in log[start : start + rng.randint(1, max_replay)]:
                write(p, r.key, r.value, r.headers)
    return logs


def micro_batches(
    logs: Sequence[Sequence[KafkaRecord]], rng: random.Random, max_per_partition: int = 8
) -> list[list[KafkaRecord]]:
    """Cut partition logs into micro-batches, as a streaming consumer reads them.

    Each batch takes the next 0 to ``max_per_partition`` records of every partition
    (partitions in a random order, records of one partition in offset order); no batch
    is empty, and together the batches hold every record exactly once.

    Returns:
        The batches, in consumption order.
    """
    position = [0] * len(logs)
    batches: list[list[KafkaRecord]] = []
    while any(position[p] < len(log) for p, log in enumerate(logs)):
        order = list(range(len(logs)))
        rng.shuffle(order)
        batch: list[KafkaRecord] = []
        for p in order:
            take = rng.randint(0, max_per_partition)
            batch.extend(logs[p][position[p] : position[p] + take])
            position[p] = min(position[p] + take, len(logs[p]))
        if not batch:  # progress: one record from the first partition with some left
            p = next(p for p in order if position[p] < len(logs[p]))
            batch.append(logs[p][position[p]])
            position[p] += 1
        batches.append(batch)
    return batches


_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def kafka_batch(topic: str, records: Sequence[KafkaRecord]) -> pa.RecordBatch:
    """An Arrow batch with the columns of Spark's Kafka source for ``records``.

    Columns: ``key``, ``value`` (binary), ``topic``, ``partition`` (int32), ``offset``
    (int64), ``headers`` (list of ``{key, value}``).
    """
    return pa.RecordBatch.from_pydict(
        {
            "key": [r.key for r in records],
            "value": [r.value for r in records],
            "topic": [topic] * len(records),
            "partition": [r.partition for r in records],
            "offset": [r.offset for r in records],
            "headers": [[{"key": k, "value": v} for k, v in r.headers] for r in records],
        },
        schema=pa.schema(
            [
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("headers", _HEADERS),
            ]
        ),
    )

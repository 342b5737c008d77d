"""Offset planning of the Kafka source: where a partition's read starts, how a
micro-batch's budget is split over partitions, and which Spark tasks read which ranges.

Pure functions and plain values, no Kafka client: the driver plans with them
(:class:`~cdcflow.source.kafka.datasource.KafkaStreamReader`), executors read the
:class:`KafkaInputPartition` ranges (:mod:`cdcflow.source.kafka.reader`). Offsets are
Kafka's: ``[start, end)``, ``end`` exclusive; a checkpoint's offsets are JSON
``{topic: {partition: next_offset}}`` (:func:`offsets_to_json`).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import InputPartition

from cdcflow.errors import SourceError

__all__ = [
    "DATA_LOSS",
    "KafkaInputPartition",
    "KafkaReadTask",
    "TopicPartitionKey",
    "offsets_from_json",
    "offsets_to_json",
    "pack_ranges",
    "ranges_of",
    "resolve_start_offset",
    "split_fairly",
]

log = logging.getLogger(__name__)


DATA_LOSS = "DATA_LOSS"
"""Error code of a :class:`SourceError` for records that can no longer be read."""


TopicPartitionKey = tuple[str, int]


def resolve_start_offset(
    topic: str,
    partition: int,
    next_offset: int,
    low: int,
    high: int,
    fail_on_data_loss: bool,
) -> int:
    """The offset to read ``topic[partition]`` from, checking that no record was lost.

    Args:
        topic: topic name.
        partition: partition number.
        next_offset: the next offset to read (from the checkpoint or startingOffsets).
        low: the partition's low watermark (first offset still stored).
        high: the partition's high watermark (offset of the next record to be written).
        fail_on_data_loss: raise instead of skipping.

    Returns:
        ``next_offset`` when it lies in ``[low, high]``; otherwise (only with
        ``fail_on_data_loss=False``, after logging a warning) ``low``.

    Raises:
        SourceError: code ``DATA_LOSS``: ``next_offset < low`` (records deleted by
            retention before they were read) or ``next_offset > high`` (the topic was
            deleted and re-created, or the log was truncated).
    """
    if low <= next_offset <= high:
        return next_offset
    where = f"topic {topic!r} partition {partition}"
    if next_offset < low:
        what = (
            f"{where}: the next offset to read is {next_offset} but the earliest offset "
            f"still stored is {low}; records {next_offset}..{low - 1} were deleted "
            "(retention) before this query read them"
        )
    else:
        what = (
            f"{where}: the next offset to read is {next_offset} but the partition ends "
            f"at {high}; the topic was deleted and re-created or its log was truncated, "
            "so records may have been missed"
        )
    if fail_on_data_loss:
        raise SourceError(
            f"{what}. To go on, either reset this query's checkpoint (delete the "
            "checkpoint directory and choose startingOffsets) or set the option "
            f"failOnDataLoss=false to skip to offset {low} (the missing records are lost)",
            DATA_LOSS,
        )
    log.warning("%s; failOnDataLoss=false: skipping to offset %d", what, low)
    return low


def split_fairly(backlog: Mapping[Any, int], max_rows: int) -> dict[Any, int]:
    """Split a budget of ``max_rows`` records fairly over partitions (max-min fairness).

    Each partition with a backlog gets an equal share; what a small partition does not
    need goes to the others; the last few rows that do not divide evenly go to the
    partitions with the largest remaining backlog (ties by key), so no partition
    starves even when ``max_rows`` is smaller than the number of partitions.

    Args:
        backlog: partition -> records available (>= 0).
        max_rows: the budget (>= 0).

    Returns:
        partition -> records to take, each ``<= backlog``, summing to
        ``min(max_rows, sum(backlog))``.
    """
    take = {k: 0 for k in backlog}
    remaining = max(0, int(max_rows))
    active = sorted((k for k, n in backlog.items() if n > 0), key=lambda k: (backlog[k], k))
    for i, k in enumerate(active):
        share = remaining // (len(active) - i)
        take[k] = min(backlog[k], share)
        remaining -= take[k]
    for k in sorted(active, key=lambda k: (take[k] - backlog[k], k)):
        if remaining <= 0:
            break
        if take[k] < backlog[k]:
            take[k] += 1
            remaining -= 1
    return take


def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Canonical checkpoint form: topics sorted, partitions sorted numerically."""
    result: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return result


def offsets_from_json(
    offsets: Mapping[str, Mapping[str, int]] | None,
) -> dict[TopicPartitionKey, int]:
    """``{(topic, partition): offset}`` of a checkpoint's offsets (see
    :func:`offsets_to_json`); ``{}`` for ``None``."""
    if not offsets:
        return {}
    return {
        (topic, int(p)): int(off) for topic, parts in offsets.items() for p, off in parts.items()
    }


class KafkaInputPartition(InputPartition):
    """The records ``[start, end)`` of one Kafka topic-partition: one Spark task.

    Attributes:
        topic: topic name.
        partition: partition number.
        start: first offset to read (inclusive).
        end: offset to stop before (exclusive).
    """

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaInputPartition({self.topic}[{self.partition}] {self.start}..{self.end})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KafkaInputPartition) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition, self.start, self.end))


class KafkaReadTask(InputPartition):
    """The ranges of several topic-partitions, read by one Spark task one after another
    (:func:`pack_ranges`).

    Attributes:
        ranges: the :class:`KafkaInputPartition` ranges, in topic and partition order.
    """

    def __init__(self, ranges: Sequence[KafkaInputPartition]) -> None:
        self.ranges = tuple(ranges)

    def __repr__(self) -> str:
        return f"KafkaReadTask({list(self.ranges)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KafkaReadTask) and self.ranges == other.ranges

    def __hash__(self) -> int:
        return hash(self.ranges)


def ranges_of(part: KafkaInputPartition | KafkaReadTask) -> tuple[KafkaInputPartition, ...]:
    """The topic-partition ranges an input partition reads."""
    return part.ranges if isinstance(part, KafkaReadTask) else (part,)


#: what a range costs a task beside its records, in records: a consumer, a fetch round
#: trip and a decoder (so that many tiny ranges are spread too, not only big ones)
_RANGE_COST_RECORDS = 200


def pack_ranges(
    parts: Sequence[KafkaInputPartition], tasks: int
) -> list[KafkaInputPartition | KafkaReadTask]:
    """The ranges of a micro-batch packed into at most ``tasks`` Spark tasks.

    A Spark task per topic-partition, as Spark's Kafka source plans, costs a task launch,
    a consumer and a decoder per range: with a topic per table (Debezium's layout), a
    micro-batch over 500 tables was 500 tasks and four times slower than the same records
    in one topic (decision 54). Ranges are never split, so each partition's records stay
    in one task, in offset order. They are placed largest first on the least loaded task
    (longest-processing-time packing), a range weighing its records plus a fixed
    ``_RANGE_COST_RECORDS``; the result is deterministic, so a micro-batch run again is
    read by the same tasks.

    Args:
        parts: one range per topic-partition with records.
        tasks: the most tasks (>= 1).

    Returns:
        ``parts`` themselves when there are no more of them than ``tasks``, else
        ``tasks`` :class:`KafkaReadTask`, each with its ranges in topic-partition order.
    """
    if len(parts) <= tasks:
        return list(parts)
    load = [(0, i) for i in range(tasks)]  # a heap of (weight, task index)
    bins: list[list[KafkaInputPartition]] = [[] for _ in range(tasks)]
    for part in sorted(parts, key=lambda p: (p.start - p.end, p.topic, p.partition)):
        weight, i = heapq.heappop(load)
        bins[i].append(part)
        heapq.heappush(load, (weight + part.end - part.start + _RANGE_COST_RECORDS, i))
    return [KafkaReadTask(sorted(b, key=lambda p: (p.topic, p.partition))) for b in bins if b]

"""Kafka calls of the operator commands and the start-up checks, outside a Spark query:
the topic-partitions a source's options select (:func:`list_partitions`), their
watermarks and log ends (:func:`watermarks`, :func:`log_end_offsets`), and a range of
records read in this process (:func:`read_range`).

Each waits for unreachable brokers at most the budget it is given (the pipeline's
``kafka.startup_timeout_s`` at start-up, else the options' ``outageBudgetMs``), then
raises ``SOURCE_UNAVAILABLE``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from cdcflow.source.kafka.datasource import KafkaStreamReader
from cdcflow.source.kafka.options import parse_options
from cdcflow.source.kafka.planning import KafkaInputPartition, TopicPartitionKey
from cdcflow.source.kafka.reader import read_partition
from cdcflow.source.outage import BUDGET_KEY

__all__ = ["list_partitions", "log_end_offsets", "read_range", "watermarks"]


def list_partitions(
    options: Mapping[str, Any], budget_s: float | None = None, budget_key: str = BUDGET_KEY
) -> list[TopicPartitionKey]:
    """The topic-partitions the source options select, as the brokers' metadata says now.

    Args:
        options: Kafka source options (Spark's names, as :func:`parse_options` takes).
        budget_s: how long unreachable brokers are waited for, seconds (``None``: the
            options' ``outageBudgetMs``); ``budget_key`` is the key errors name for it.

    Raises:
        ConfigError: the options are not valid (librdkafka refuses a setting).
        SourceError: ``SOURCE_UNAVAILABLE``: the brokers stayed unreachable for the
            budget; ``SOURCE_ERROR``: another Kafka error (e.g. authentication failed).
    """
    opts = parse_options(options)
    if budget_s is not None:
        opts = dataclasses.replace(opts, outage_budget_s=budget_s, outage_budget_key=budget_key)
    reader = KafkaStreamReader(opts)
    try:
        return reader._discover()
    finally:
        reader.stop()


def watermarks(
    options: Mapping[str, Any], budget_s: float | None = None, budget_key: str = BUDGET_KEY
) -> dict[TopicPartitionKey, tuple[int, int]]:
    """``(log start, log end)`` -- the low and high watermarks -- of every topic-partition
    the source options select, asked of the brokers now.

    Raises:
        ConfigError, SourceError: as :func:`list_partitions`.
        confluent_kafka.KafkaException: a watermark request failed.
    """
    opts = parse_options(options)
    if budget_s is not None:
        opts = dataclasses.replace(opts, outage_budget_s=budget_s, outage_budget_key=budget_key)
    reader = KafkaStreamReader(opts)
    try:
        return reader._watermarks(reader._discover())
    finally:
        reader.stop()


def log_end_offsets(
    options: Mapping[str, Any], budget_s: float | None = None, budget_key: str = BUDGET_KEY
) -> dict[TopicPartitionKey, int]:
    """The log end (high watermark: the offset the next record gets) of every
    topic-partition the source options select (:func:`watermarks`)."""
    return {tp: high for tp, (_, high) in watermarks(options, budget_s, budget_key).items()}


def read_range(
    options: Mapping[str, Any], topic: str, partition: int, first: int, last: int
) -> Iterator[Any]:
    """The records ``first..last`` (inclusive) of one partition as Arrow batches of
    :data:`~cdcflow.source.kafka.schema.ARROW_SCHEMA`, read in this process (no Spark).

    Raises:
        SourceError: ``DATA_LOSS`` when records of the range were deleted meanwhile (and
            failOnDataLoss is true), ``SOURCE_UNAVAILABLE`` when the brokers stay
            unreachable for ``outageBudgetMs`` (see :func:`~cdcflow.source.kafka.reader.read_partition`).
    """
    opts = parse_options(options)
    return read_partition(opts, KafkaInputPartition(topic, partition, first, last + 1))

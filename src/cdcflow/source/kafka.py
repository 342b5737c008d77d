"""Kafka as a Spark streaming source: Spark's JVM ``kafka`` source, or cdcflow's own.

:func:`read_stream` returns a streaming DataFrame with the columns of Spark's Kafka
source (:data:`KAFKA_SCHEMA`). Where Spark's Kafka connector is on the classpath it is
used; otherwise the Python streaming data source ``cdcflow_kafka`` defined here reads
the topics with confluent-kafka (librdkafka).

The Python source (PySpark >= 4.2 ``DataSourceStreamReader``):

* keeps its offsets in Spark's checkpoint as JSON ``{topic: {partition: next_offset}}``
  (partitions as strings, topics and partitions sorted), so a restarted query resumes
  exactly after the last committed micro-batch;
* plans one Spark input partition per Kafka topic-partition offset range
  ``[start, end)``; ``read`` assigns and seeks a consumer to ``start``, yields
  ``pyarrow.RecordBatch``es of up to ``maxRecordsPerBatch`` rows and stops exactly
  before ``end``;
* does admission control (``maxOffsetsPerTrigger``, split fairly across partitions),
  ``Trigger.AvailableNow``, topic discovery by ``subscribePattern`` at every
  micro-batch (new topics and partitions start at their earliest offset);
* never skips records silently: a next offset below a partition's low watermark
  (records deleted by retention) or above its end (topic re-created) raises
  :class:`~cdcflow.errors.SourceError` with code ``DATA_LOSS`` unless
  ``failOnDataLoss=false``, which skips ahead with a warning;
* waits out broker outages: transient client errors (:func:`is_transient`: broker
  down, timeouts, no leader) of the driver's metadata requests and of ``read`` are
  retried with exponential backoff (:mod:`cdcflow.source.outage`), one warning line per
  attempt, until they have lasted ``outageBudgetMs``; then a ``SourceError`` with code
  ``SOURCE_UNAVAILABLE`` stops the query. Other errors (authentication, bad settings,
  data loss) are raised at once. librdkafka's own log lines go to the Python logger
  ``cdcflow.source.librdkafka`` at DEBUG level.

Options (names as in Spark's Kafka source, case-insensitive):

=============================  ===========================================================
``kafka.bootstrap.servers``    required; ``host:port[,host:port...]``
``kafka.<librdkafka key>``     passed to librdkafka (``kafka.security.protocol``,
                               ``kafka.sasl.mechanism``, ``kafka.sasl.username``, ...)
``subscribe``                  comma-separated topics
``subscribePattern``           regular expression matched against whole topic names
``assign``                     JSON ``{"topic": [0, 1]}``
``startingOffsets``            ``earliest`` / ``latest`` (default) / JSON
                               ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)
``maxOffsetsPerTrigger``       maximum records per micro-batch, over all partitions
``failOnDataLoss``             ``true`` (default) / ``false``
``kafkaConsumer.pollTimeoutMs``  how long ``read`` waits without progress, ms (120000)
``maxRecordsPerBatch``         rows per Arrow batch yielded by ``read`` (10000)
``outageBudgetMs``             how long transient broker errors are retried, ms (300000;
                               0: fail at the first one). cdcflow's own option
``maxPartitions``              the most Spark tasks a micro-batch is read with: ranges of
                               many topic-partitions are packed into them (default: a
                               task per topic-partition, as Spark's). cdcflow's own option
=============================  ===========================================================

Exactly one of ``subscribe``, ``subscribePattern`` and ``assign`` must be set.
Reference: Spark "Structured Streaming + Kafka Integration Guide" (options, schema).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from cdcflow.errors import ConfigError, SourceError
from cdcflow.formats.base import Record, new_record
from cdcflow.model import new_origin
from cdcflow.source.outage import BUDGET_KEY, OutageBudget
from cdcflow.source.starting_offsets import EARLIEST, LATEST, parse_starting_offsets

__all__ = [
    "ARROW_SCHEMA",
    "DATA_LOSS",
    "FORBIDDEN_KAFKA_KEYS",
    "FORMAT",
    "KAFKA_SCHEMA",
    "JVM_KAFKA_PROVIDER",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaReadTask",
    "KafkaSourceOptions",
    "KafkaStreamReader",
    "is_transient",
    "jvm_kafka_available",
    "list_partitions",
    "pack_ranges",
    "ranges_of",
    "read_range",
    "parse_options",
    "read_partition",
    "read_stream",
    "register",
    "resolve_start_offset",
    "split_fairly",
]

log = logging.getLogger(__name__)

FORMAT = "cdcflow_kafka"
"""Name of the Python data source (``spark.readStream.format(FORMAT)``)."""

JVM_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
"""Class of Spark's own Kafka connector (``spark-sql-kafka-0-10``)."""

DATA_LOSS = "DATA_LOSS"
"""Error code of a :class:`SourceError` for records that can no longer be read."""


_DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark: spark.network.timeout
_DEFAULT_RECORDS_PER_BATCH = 10_000
_DEFAULT_OUTAGE_BUDGET_MS = 300_000  # see docs/decisions.md: a broker restart or election fits
# A metadata or offsets request waits this long at most. While the brokers are down
# librdkafka waits out the whole timeout, so it is also how soon an outage is reported
# (a slow answer is only retried, within the outage budget).
_REQUEST_TIMEOUT_S = 10.0
_STALL_CHECK_S = 2.0  # a read without records this long asks the broker for the offsets
_PROBE_TIMEOUT_S = 5.0

# Options of Spark's Kafka source accepted and ignored here (they do not change what
# is read): headers are always included; one input partition per Kafka partition.
_IGNORED_OPTIONS = frozenset(
    {
        "includeheaders",
        "minpartitions",
        "groupidprefix",
        "fetchoffset.numretries",
        "fetchoffset.retryintervalms",
        "maxtriggerdelay",
    }
)
# Options of Spark's Kafka source that change what is read and are not implemented.
_UNSUPPORTED_OPTIONS = {
    "endingoffsets": "endingOffsets is for batch queries; this is a streaming source",
    "startingoffsetsbytimestamp": "start from offsets (startingOffsets) instead",
    "startingtimestamp": "start from offsets (startingOffsets) instead",
    "startingoffsetsbytimestampstrategy": "start from offsets (startingOffsets) instead",
    "minoffsetspertrigger": "remove it (only maxOffsetsPerTrigger is supported)",
}
_OWN_OPTIONS = {
    "subscribe": "subscribe",
    "subscribepattern": "subscribePattern",
    "assign": "assign",
    "startingoffsets": "startingOffsets",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss",
    "kafkaconsumer.polltimeoutms": "kafkaConsumer.pollTimeoutMs",
    "maxrecordsperbatch": "maxRecordsPerBatch",
    "outagebudgetms": "outageBudgetMs",
    "maxpartitions": "maxPartitions",
}
# librdkafka settings the source owns (Spark rejects the same ones).
FORBIDDEN_KAFKA_KEYS = {
    "auto.offset.reset": "use the option startingOffsets instead",
    "enable.auto.commit": "offsets are kept in Spark's checkpoint, not committed to Kafka",
    "key.deserializer": "keys are always returned as bytes (cast or decode them in Spark)",
    "value.deserializer": "values are always returned as bytes (decode them in Spark)",
}


# --------------------------------------------------------------------------- schema


def _spark_schema() -> Any:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )


def _arrow_schema() -> Any:
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", pa.list_(pa.field("element", header))),
        ]
    )


KAFKA_SCHEMA = _spark_schema()
"""Columns of Spark's Kafka source: ``key binary, value binary, topic string, partition
int, offset long, timestamp timestamp, timestampType int,
headers array<struct<key:string,value:binary>>``. ``timestampType`` is Kafka's id
(0 CreateTime, 1 LogAppendTime); ``headers`` is null for a record without headers."""

ARROW_SCHEMA = _arrow_schema()
"""The Arrow schema of the batches ``read`` yields (Spark's mapping of KAFKA_SCHEMA)."""
_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type


# --------------------------------------------------------------------------- options


@dataclasses.dataclass(frozen=True)
class KafkaSourceOptions:
    """Validated options of the Python Kafka source (see the module docstring).

    Attributes:
        client_config: librdkafka configuration: every ``kafka.*`` option without its
            prefix, including ``bootstrap.servers``.
        subscribe: topics to read, or ``None``.
        subscribe_pattern: regular expression matched against whole topic names, or ``None``.
        assign: ``{topic: (partition, ...)}`` to read, or ``None``.
        starting_offsets: ``"earliest"``, ``"latest"`` or ``{topic: {partition: offset}}``
            with -2 for earliest and -1 for latest.
        max_offsets_per_trigger: maximum records per micro-batch, or ``None`` (no limit).
        fail_on_data_loss: raise on records lost to retention or topic re-creation.
        poll_timeout_ms: how long ``read`` waits for the next record, ms.
        max_records_per_batch: rows per Arrow record batch.
        outage_budget_s: how long transient broker errors are retried, seconds (0: none).
        max_partitions: the most Spark input partitions (tasks) a micro-batch is read
            with, or ``None``: one per topic-partition with records (:func:`pack_ranges`).
        outage_budget_key: the configuration key of ``outage_budget_s`` that warnings
            and errors name (the start-up check's is ``kafka.startup_timeout_s``).
    """

    client_config: Mapping[str, str]
    subscribe: tuple[str, ...] | None = None
    subscribe_pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] | None = None
    starting_offsets: str | Mapping[str, Mapping[int, int]] = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = _DEFAULT_POLL_TIMEOUT_MS
    max_records_per_batch: int = _DEFAULT_RECORDS_PER_BATCH
    outage_budget_s: float = _DEFAULT_OUTAGE_BUDGET_MS / 1000.0
    max_partitions: int | None = None
    #: the configuration key named in outage warnings and errors
    outage_budget_key: str = BUDGET_KEY

    @property
    def bootstrap_servers(self) -> str:
        """``kafka.bootstrap.servers``."""
        return str(self.client_config["bootstrap.servers"])

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one this source reads."""
        if self.subscribe is not None:
            return topic in self.subscribe
        if self.assign is not None:
            return topic in self.assign
        assert self.subscribe_pattern is not None
        return re.fullmatch(self.subscribe_pattern, topic) is not None


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _outage_budget_ms(raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"option outageBudgetMs must be a whole number of milliseconds >= 0, got {raw!r}; "
            "e.g. 300000 to retry an unreachable broker for 5 minutes, 0 to fail at once "
            "(in the pipeline YAML: kafka.outage_budget_s)"
        )
    return value


def _parse_starting_offsets(raw: str) -> str | dict[str, dict[int, int]]:
    try:
        return parse_starting_offsets(raw)
    except ValueError as exc:
        raise ConfigError(f"option startingOffsets: {exc}") from None


def _parse_assign(raw: str) -> dict[str, tuple[int, ...]]:
    fix = 'use JSON such as {"topicA":[0,1],"topicB":[0]}'
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"option assign={raw!r} is not valid JSON; {fix}") from exc
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"option assign={raw!r} is not valid; {fix}")
    result = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise ConfigError(f"option assign: {topic!r} must map to a list of partitions; {fix}")
        result[topic] = tuple(sorted(set(parts)))
    return result


def parse_options(options: Mapping[str, Any]) -> KafkaSourceOptions:
    """Validate the options of the Kafka source.

    Args:
        options: option name -> value as given to ``DataStreamReader.option``; names
            are case-insensitive.

    Returns:
        The validated options.

    Raises:
        ConfigError: a required option is missing, a value is malformed, the options
            name no or several topic selections, or an option is unknown or not
            supported; the message names the option and the fix.
    """
    opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in options.items()}
    unknown = sorted(
        k
        for k in opts
        if not k.startswith("kafka.")
        and k not in _OWN_OPTIONS
        and k not in _IGNORED_OPTIONS
        and k not in _UNSUPPORTED_OPTIONS
    )
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown} for the Kafka source; valid options: "
            f"{sorted(_OWN_OPTIONS.values())} and kafka.<librdkafka setting>"
        )
    for key in opts:
        if key in _UNSUPPORTED_OPTIONS:
            raise ConfigError(
                f"option {key} is not supported by cdcflow's Kafka source; "
                f"{_UNSUPPORTED_OPTIONS[key]}"
            )

    client: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith("kafka."):
            name = key[len("kafka.") :]
            if name in FORBIDDEN_KAFKA_KEYS:
                raise ConfigError(
                    f"option kafka.{name} is not supported: {FORBIDDEN_KAFKA_KEYS[name]}"
                )
            client[name] = value
    if not client.get("bootstrap.servers", "").strip():
        raise ConfigError(
            "option kafka.bootstrap.servers is required: set it to the broker list, "
            "e.g. .option('kafka.bootstrap.servers', 'host1:9092,host2:9092')"
        )

    chosen = [_OWN_OPTIONS[k] for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(chosen) != 1:
        what = "none of them is set" if not chosen else f"{' and '.join(chosen)} are all set"
        raise ConfigError(
            "set exactly one of the options subscribe (comma-separated topics), "
            f"subscribePattern (regular expression) or assign (JSON); {what}"
        )
    subscribe = pattern = assign = None
    if opts.get("subscribe"):
        subscribe = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise ConfigError("option subscribe names no topic; give comma-separated topics")
    elif opts.get("subscribepattern"):
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"option subscribePattern={pattern!r} is not a valid regular expression: {exc}"
            ) from exc
    else:
        assign = _parse_assign(opts["assign"])

    starting: str | dict[str, dict[int, int]] = "latest"
    if opts.get("startingoffsets"):
        starting = _parse_starting_offsets(opts["startingoffsets"])
    max_per_trigger = None
    if opts.get("maxoffsetspertrigger"):
        max_per_trigger = _positive_int("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"])
    fail = opts.get("failondataloss", "true").strip().lower()
    if fail not in ("true", "false"):
        raise ConfigError(f"option failOnDataLoss must be true or false, got {fail!r}")
    poll_ms = _DEFAULT_POLL_TIMEOUT_MS
    if opts.get("kafkaconsumer.polltimeoutms"):
        poll_ms = _positive_int("kafkaConsumer.pollTimeoutMs", opts["kafkaconsumer.polltimeoutms"])
    per_batch = _DEFAULT_RECORDS_PER_BATCH
    if opts.get("maxrecordsperbatch"):
        per_batch = _positive_int("maxRecordsPerBatch", opts["maxrecordsperbatch"])
    budget_ms = _DEFAULT_OUTAGE_BUDGET_MS
    if opts.get("outagebudgetms", "").strip():
        budget_ms = _outage_budget_ms(opts["outagebudgetms"])
    max_partitions = None
    if opts.get("maxpartitions", "").strip():
        max_partitions = _positive_int("maxPartitions", opts["maxpartitions"])
    return KafkaSourceOptions(
        client_config=client,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=starting,
        max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=fail == "true",
        poll_timeout_ms=poll_ms,
        max_records_per_batch=per_batch,
        outage_budget_s=budget_ms / 1000.0,
        max_partitions=max_partitions,
    )


# --------------------------------------------------------------------------- pure helpers

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


def _to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Canonical checkpoint form: topics sorted, partitions sorted numerically."""
    result: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return result


def _from_json(offsets: Mapping[str, Mapping[str, int]] | None) -> dict[TopicPartitionKey, int]:
    if not offsets:
        return {}
    return {
        (topic, int(p)): int(off) for topic, parts in offsets.items() for p, off in parts.items()
    }


# --------------------------------------------------------------------------- clients

# librdkafka error codes of a broker that is down, restarting, electing a leader or out
# of reach for a while. An unknown topic or partition is here too: the source asks only
# about partitions the metadata just listed, so "unknown" means stale metadata or no
# leader yet (librdkafka answers _UNKNOWN_PARTITION at once while its broker is down).
# _DESTROY_BROKER fails the requests outstanding on a broker connection librdkafka tore
# down; seen here when the broker went away mid-request (tests/e2e/test_broker_outage.py).
_TRANSIENT_CODES = (
    "_TRANSPORT",
    "_DESTROY_BROKER",
    "_ALL_BROKERS_DOWN",
    "_TIMED_OUT",
    "_TIMED_OUT_QUEUE",
    "_RESOLVE",
    "_WAIT_COORD",
    "_UNKNOWN_PARTITION",
    "_UNKNOWN_TOPIC",
    "UNKNOWN_TOPIC_OR_PART",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "REQUEST_TIMED_OUT",
    "BROKER_NOT_AVAILABLE",
    "REPLICA_NOT_AVAILABLE",
    "NETWORK_EXCEPTION",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "NOT_COORDINATOR",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "KAFKA_STORAGE_ERROR",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE",
    "PREFERRED_LEADER_NOT_AVAILABLE",
)
_transient_codes: frozenset[int] | None = None


def is_transient(err: Any) -> bool:
    """Whether a librdkafka error is one a broker outage causes, to be retried.

    Transient: the codes in ``_TRANSIENT_CODES`` (transport failure, all brokers down,
    timeouts, name resolution, no leader, unknown partition, ...) and any error
    librdkafka marks retriable. Never transient: fatal errors, and everything else
    (authentication, authorization, SSL, invalid settings, offsets out of range).

    Args:
        err: a ``confluent_kafka.KafkaError``, or a ``KafkaException`` carrying one;
            anything else is not transient.
    """
    global _transient_codes
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException):
        err = err.args[0] if err.args else None
    if not isinstance(err, KafkaError) or err.fatal():
        return False
    if _transient_codes is None:
        _transient_codes = frozenset(
            getattr(KafkaError, name) for name in _TRANSIENT_CODES if hasattr(KafkaError, name)
        )
    return err.code() in _transient_codes or bool(err.retriable())


def _error_text(err: Any) -> str:
    """One line: ``NAME: description`` of a KafkaError (or the text of anything else)."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if isinstance(err, KafkaError):
        return " ".join(f"{err.name()}: {err.str()}".split())
    return " ".join(str(err).split())


class _ErrorSink:
    """librdkafka's ``error_cb``: keeps the newest client-level error (broker down,
    authentication failed, ...). librdkafka calls it from ``poll``/``consume``.

    A failed request often says only "transport failure" while the client's own error
    events say why (e.g. ``_AUTHENTICATION``, which is not transient); such an error is
    kept apart so that a later "all brokers down" does not hide it."""

    __slots__ = ("last", "permanent")

    def __init__(self) -> None:
        self.last: Any = None  # confluent_kafka.KafkaError
        self.permanent: Any = None  # the newest that is not transient

    def __call__(self, err: Any) -> None:
        self.last = err
        if not is_transient(err):
            self.permanent = err

    def take(self) -> Any:
        """The newest error that is not transient since the last call, else the newest
        error, or ``None``; forgets them."""
        err = self.permanent if self.permanent is not None else self.last
        self.last = self.permanent = None
        return err


class _LibrdkafkaLog:
    """librdkafka's log lines (``logger``) to the Python logger ``cdcflow.source.librdkafka``
    at DEBUG level: during an outage librdkafka logs every reconnect, many per second;
    the source's own warnings (one per retry) say what matters."""

    def __init__(self) -> None:
        self._log = logging.getLogger("cdcflow.source.librdkafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug(msg, *args)


def _client_config(
    opts: KafkaSourceOptions, role: str, errors: _ErrorSink | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "group.id": f"cdcflow-kafka-source-{role}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # Spark's default: read records of open transactions too, up to the high watermark.
        "isolation.level": "read_uncommitted",
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "fetch.wait.max.ms": 100,
        "logger": _LibrdkafkaLog(),
    }
    if errors is not None:
        config["error_cb"] = errors
    config.update(opts.client_config)
    return config


def _make_consumer(opts: KafkaSourceOptions, role: str, errors: _ErrorSink | None = None) -> Any:
    from confluent_kafka import Consumer, KafkaException

    try:
        return Consumer(_client_config(opts, role, errors))
    except (KafkaException, ValueError, TypeError) as exc:
        text = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
        unknown = re.match(r'No such configuration property: "([^"]+)"', text)
        what = (
            f"kafka.options: librdkafka has no setting {unknown.group(1)!r}"
            if unknown
            else f"librdkafka rejected the kafka.* options: {text}"
        )
        raise ConfigError(
            f"{what}; kafka.options are passed to librdkafka, whose setting names can "
            "differ from the Java client's (see "
            "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)"
        ) from None


#: seconds a failed metadata request waits for the client's error event that says why
_ERROR_EVENT_WAIT_S = 0.5
#: the longest single metadata request (:meth:`KafkaStreamReader._metadata`), seconds
_METADATA_SLICE_S = 1.0


#: librdkafka's and Kafka's error names of refused credentials and refused access
_AUTHENTICATION_ERRORS = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL")
_AUTHORIZATION_ERRORS = (
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
)


def refused_access(err: Any) -> str | None:
    """``"authentication"`` when the brokers refused the client's credentials (a failed
    SASL handshake, an SSL failure), ``"authorization"`` when they refused it access (ACLs),
    else ``None``.

    Args:
        err: a ``confluent_kafka.KafkaError``, or a ``KafkaException`` carrying one.
    """
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    if not isinstance(err, KafkaError):
        return None
    if err.name() in _AUTHENTICATION_ERRORS:
        return "authentication"
    if err.name() in _AUTHORIZATION_ERRORS:
        return "authorization"
    return None


def _kafka_error(exc: BaseException, what: str) -> SourceError:
    refused = refused_access(exc)
    if refused is not None:
        error = _refused_error(exc, what, refused)
        error.refused = refused
        return error
    return SourceError(
        f"{what}: {_error_text(exc)}; check kafka.bootstrap.servers, the kafka.* client "
        "settings and that the brokers are up"
    )


def _refused_error(exc: BaseException, what: str, refused: str) -> SourceError:
    if refused == "authentication":
        return SourceError(
            f"{what}: authentication failed, the brokers refused the client's credentials "
            f"({_error_text(exc)}); fix kafka.options: security.protocol, sasl.mechanism, "
            "sasl.username and sasl.password (or the ssl.* settings)"
        )
    if refused == "authorization":
        return SourceError(
            f"{what}: authorization failed, the brokers refused access ({_error_text(exc)}); "
            "the user of kafka.options' sasl.username needs Describe and Read on the topics "
            "(Kafka ACLs)"
        )


# --------------------------------------------------------------------------- partitions


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


def read_partition(opts: KafkaSourceOptions, part: KafkaInputPartition) -> Iterator[Any]:
    """Read the records ``[part.start, part.end)`` of one topic-partition as Arrow batches
    (see :func:`_read_columns` for the reading rules and errors).

    Yields:
        ``pyarrow.RecordBatch`` with :data:`ARROW_SCHEMA`, up to
        ``opts.max_records_per_batch`` rows each, in offset order.
    """
    for cols in _read_columns(opts, part):
        yield cols.to_record_batch(part.topic, part.partition)


def read_records(opts: KafkaSourceOptions, part: KafkaInputPartition) -> Iterator[list[Record]]:
    """Read the records ``[part.start, part.end)`` of one topic-partition as decoder
    :class:`~cdcflow.formats.base.Record` lists, without an Arrow batch in between (the
    fused decode source; same rules and errors as :func:`read_partition`).

    Yields:
        Lists of up to ``opts.max_records_per_batch`` records, in offset order.
    """
    for cols in _read_columns(opts, part):
        yield cols.to_records(part.topic, part.partition)


def _read_columns(opts: KafkaSourceOptions, part: KafkaInputPartition) -> Iterator[_Columns]:
    """Read the records ``[part.start, part.end)`` of one topic-partition, batch by batch.

    The consumer is assigned to the partition at ``part.start`` and stops at the first
    record at or beyond ``part.end`` (or at the end of the log): no record outside the
    range is ever emitted. Gaps inside the range (compaction, transaction markers) are
    normal and skipped.

    A broker outage -- a transient error (:func:`is_transient`) reported by the consumer,
    or no record for ``kafkaConsumer.pollTimeoutMs`` while the partition's offsets cannot
    be fetched -- is waited out: each failed attempt logs one warning and waits its
    backoff while polling, and the next attempt uses a new consumer assigned at the next
    offset to read, until records arrive again or the outage budget is spent.

    Args:
        opts: source options (client configuration, failOnDataLoss, timeouts, budget).
        part: topic, partition and offset range.

    Yields:
        :class:`_Columns` of up to ``opts.max_records_per_batch`` records, in offset order.

    Raises:
        SourceError: code ``DATA_LOSS`` if records of the range were deleted and
            ``failOnDataLoss`` is true; ``SOURCE_UNAVAILABLE`` when the brokers stay
            unreachable for ``outageBudgetMs``; otherwise when no record arrives within
            ``kafkaConsumer.pollTimeoutMs`` although the broker answers, or the consumer
            reports an error that is not transient.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    if part.end <= part.start:
        return
    _worker_logging()
    errors = _ErrorSink()
    outage = OutageBudget(opts.outage_budget_s, opts.bootstrap_servers, key=opts.outage_budget_key)
    topic, partition, end = part.topic, part.partition, part.end
    next_offset = part.start
    consumer = _make_consumer(opts, "executor", errors)
    try:
        consumer.assign([TopicPartition(topic, partition, next_offset)])
        timeout_s = opts.poll_timeout_ms / 1000.0
        stall_s = min(_STALL_CHECK_S, timeout_s)
        last_progress = time.monotonic()  # last record, or the end of an outage
        check_at = last_progress + stall_s  # when a read without records is looked into
        while next_offset < end:
            want = min(opts.max_records_per_batch, end - next_offset)
            try:
                msgs = consumer.consume(num_messages=want, timeout=min(1.0, timeout_s))
            except KafkaException as exc:
                if not is_transient(exc):
                    raise _kafka_error(exc, f"reading {topic}[{partition}]") from exc
                errors.last, msgs = exc.args[0], []
            # (not ``.count(None)``: confluent-kafka's KafkaError cannot be compared with None)
            if msgs and not any([m.error() for m in msgs]):
                # Fast path: no error events and every record inside the range.
                offsets = [m.offset() for m in msgs]
                if offsets[0] >= next_offset and offsets[-1] < end:
                    next_offset = offsets[-1] + 1
                    last_progress = time.monotonic()
                    check_at = last_progress + stall_s
                    errors.take()  # records arrive: earlier errors are stale
                    if outage.failing:
                        outage.ok()
                    yield _Columns.of(msgs, offsets)
                    continue
            # Slow path, record by record: error events, or records outside the range.
            cols = _Columns()
            add_key, add_value, add_offset = (
                cols.keys.append,
                cols.values.append,
                cols.offsets.append,
            )
            add_kind, add_stamp, add_headers = (
                cols.kinds.append,
                cols.stamps.append,
                cols.headers.append,
            )
            done = False
            for m in msgs:
                err = m.error()
                if err is not None:
                    code = err.code()
                    try:
                        if code == KafkaError._PARTITION_EOF:
                            if m.offset() >= end:
                                done = True
                                break
                            next_offset = _check_log_end(opts, consumer, part, next_offset)
                            if next_offset >= end:
                                done = True
                                break
                            continue
                        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            next_offset = _recover_out_of_range(opts, consumer, part, next_offset)
                            if next_offset >= end:
                                done = True
                                break
                            continue
                    except KafkaException as exc:
                        if not is_transient(exc):
                            raise _kafka_error(
                                exc, f"querying the offsets of {topic}[{partition}]"
                            ) from exc
                        errors.last = exc.args[0]
                        break
                    if is_transient(err):
                        errors.last = err
                        continue
                    raise SourceError(
                        f"reading topic {topic!r} partition {partition} at offset "
                        f"{next_offset}: {_error_text(err)}"
                    )
                off = m.offset()
                if off < next_offset:
                    continue  # before the range (or a re-delivery): never emitted twice
                if off >= end:
                    done = True
                    break
                add_key(m.key())
                add_value(m.value())
                add_offset(off)
                kind, ms = m.timestamp()
                add_kind(kind)
                add_stamp(ms)
                add_headers(m.headers())
                next_offset = off + 1
            if cols.offsets:
                last_progress = time.monotonic()
                check_at = last_progress + stall_s
                errors.take()
                if outage.failing:
                    outage.ok()
                yield cols
            if done:
                break
            if cols.offsets:
                continue
            # No record this round. Records of the range are in the log, so a read without
            # records for a while is an outage (an error event, or no offsets from the
            # broker) or a slow broker (pollTimeoutMs); before that, keep polling -- also
            # through the backoff of an outage, so its end is seen at once.
            now = time.monotonic()
            if now < check_at:
                continue
            err = errors.take()
            if err is None:
                try:
                    probe_s = min(_PROBE_TIMEOUT_S, outage.attempt_timeout_s(_REQUEST_TIMEOUT_S))
                    _watermarks_of(consumer, topic, partition, probe_s)
                except KafkaException as exc:
                    if not is_transient(exc):
                        raise _kafka_error(
                            exc, f"querying the offsets of {topic}[{partition}]"
                        ) from exc
                    err = errors.take() or exc.args[0]  # the client's own event says more
                else:
                    if outage.failing:  # reachable again: pollTimeoutMs from now
                        outage.ok()
                        last_progress = now
                    elif now - last_progress > timeout_s:
                        raise SourceError(
                            f"no record of topic {topic!r} partition {partition} arrived for "
                            f"{opts.poll_timeout_ms} ms while reading offsets "
                            f"{next_offset}..{end - 1} although the broker answers; check the "
                            "brokers, or raise the option kafkaConsumer.pollTimeoutMs"
                        )
                    check_at = time.monotonic() + stall_s
                    continue
            if not is_transient(err):
                raise SourceError(
                    f"reading topic {topic!r} partition {partition} at offset "
                    f"{next_offset}: {_error_text(err)}; check kafka.bootstrap.servers and "
                    "the kafka.* client settings"
                )
            delay = outage.failed(
                f"reading {topic}[{partition}] at offset {next_offset}",
                _error_text(err),
                since=last_progress,
            )
            check_at = time.monotonic() + delay
            consumer = _renew_consumer(opts, consumer, errors, topic, partition, next_offset)
    finally:
        consumer.close()


def _renew_consumer(
    opts: KafkaSourceOptions,
    consumer: Any,
    errors: _ErrorSink,
    topic: str,
    partition: int,
    offset: int,
) -> Any:
    """Close ``consumer`` and return a new one assigned to ``topic[partition]`` at ``offset``."""
    from confluent_kafka import TopicPartition

    try:
        consumer.close()
    except Exception:  # noqa: BLE001 - a client of an unreachable broker
        log.debug("closing the Kafka consumer failed", exc_info=True)
    errors.take()
    fresh = _make_consumer(opts, "executor", errors)
    fresh.assign([TopicPartition(topic, partition, offset)])
    return fresh


def _worker_logging() -> None:
    """In a Spark Python worker (no logging configured), show cdcflow's warnings on
    stderr in the driver's format instead of Python's bare last-resort lines."""
    root = logging.getLogger()
    package = logging.getLogger("cdcflow")
    if root.handlers or package.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.WARNING)


def _watermarks_of(
    consumer: Any, topic: str, partition: int, timeout_s: float = _REQUEST_TIMEOUT_S
) -> tuple[int, int]:
    """``(low, high)`` of one partition, asked of the broker (not librdkafka's cache).

    Raises:
        confluent_kafka.KafkaException: the request failed.
    """
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(
        TopicPartition(topic, partition), timeout=timeout_s, cached=False
    )
    return int(low), int(high)


def _recover_out_of_range(
    opts: KafkaSourceOptions, consumer: Any, part: KafkaInputPartition, next_offset: int
) -> int:
    """After "offset out of range": raise DATA_LOSS, or seek to the low watermark."""
    from confluent_kafka import TopicPartition

    low, high = _watermarks_of(consumer, part.topic, part.partition)
    start = resolve_start_offset(
        part.topic, part.partition, next_offset, low, high, opts.fail_on_data_loss
    )
    consumer.assign([TopicPartition(part.topic, part.partition, start)])
    return start


def _check_log_end(
    opts: KafkaSourceOptions, consumer: Any, part: KafkaInputPartition, next_offset: int
) -> int:
    """End of log reached before ``part.end``: was the log truncated?"""
    low, high = _watermarks_of(consumer, part.topic, part.partition)
    if high >= part.end:
        return next_offset  # more records are on their way
    if high <= next_offset:
        # The log ends before the planned range: offsets went backwards.
        if opts.fail_on_data_loss:
            raise SourceError(
                f"topic {part.topic!r} partition {part.partition} now ends at offset {high} "
                f"but offsets up to {part.end - 1} were planned for this micro-batch; the "
                "topic was deleted and re-created or its log was truncated. To go on, reset "
                "this query's checkpoint or set the option failOnDataLoss=false",
                DATA_LOSS,
            )
        log.warning(
            "%s[%d] ends at %d before the planned end %d; failOnDataLoss=false: stopping",
            part.topic,
            part.partition,
            high,
            part.end,
        )
        return part.end
    return next_offset


class _Columns:
    """Column lists of one Arrow batch, filled one Kafka message at a time."""

    __slots__ = ("keys", "values", "offsets", "kinds", "stamps", "headers")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.kinds: list[int] = []  # confluent-kafka TIMESTAMP_* (0 none, 1 create, 2 append)
        self.stamps: list[int] = []  # epoch ms
        self.headers: list[list[tuple[str, bytes | None]] | None] = []

    @classmethod
    def of(cls, msgs: Sequence[Any], offsets: list[int]) -> _Columns:
        """Columns of error-free messages whose offsets are ``offsets``."""
        cols = cls()
        cols.keys = [m.key() for m in msgs]
        cols.values = [m.value() for m in msgs]
        cols.offsets = offsets
        stamps = [m.timestamp() for m in msgs]
        cols.kinds = [t[0] for t in stamps]
        cols.stamps = [t[1] for t in stamps]
        cols.headers = [m.headers() for m in msgs]
        return cols

    def to_records(self, topic: str, partition: int) -> list[Record]:
        """The rows as decoder records (the same values :func:`records_from_kafka_batch`
        gives for :meth:`to_record_batch`'s batch: epoch-ms timestamps, ``None`` where the
        message has none)."""
        return [
            new_record(
                v, k, tuple(hs) if hs else (), new_origin(topic, partition, o), ms if kind else None
            )
            for v, k, o, kind, ms, hs in zip(
                self.values,
                self.keys,
                self.offsets,
                self.kinds,
                self.stamps,
                self.headers,
                strict=True,
            )
        ]

    def to_record_batch(self, topic: str, partition: int) -> Any:
        """The rows as a ``pyarrow.RecordBatch`` with :data:`ARROW_SCHEMA`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.offsets)
        kinds = pa.array(self.kinds, pa.int32())
        # confluent-kafka's 0/1/2 (none/create/log-append) are Kafka's ids -1/0/1 plus one.
        ts_type = pc.subtract(kinds, pa.scalar(1, pa.int32()))
        micros = pc.multiply(pa.array(self.stamps, pa.int64()), pa.scalar(1000, pa.int64()))
        stamps = pc.if_else(pc.equal(kinds, 0), pa.scalar(None, pa.int64()), micros)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([topic] * n, pa.string()),
                pa.array([partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                stamps.cast(pa.timestamp("us", tz="UTC")),
                ts_type,
                pa.array(self.headers, _HEADERS_TYPE),
            ],
            schema=ARROW_SCHEMA,
        )


# --------------------------------------------------------------------------- Spark source


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver-side planning and executor-side reading of the ``cdcflow_kafka`` source.

    Spark keeps one instance per query in a Python worker on the driver and calls
    ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` on it; the
    instance that runs ``read`` on executors is a pickled copy without clients.

    Every metadata lookup (topics, partitions and watermarks, as one unit) is retried
    within the outage budget (:class:`~cdcflow.source.outage.OutageBudget`) with a new
    client each time; the budget is renewed by every success.

    Args:
        options: validated source options.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        _worker_logging()
        self.opts = options
        self._consumer: Any = None  # metadata and watermark queries (driver only)
        self._errors: _ErrorSink | None = None  # the metadata client's error_cb
        self._outage: OutageBudget | None = None
        self._failure: Any = None  # a client error event that made a failure permanent
        self._timeout_s = _REQUEST_TIMEOUT_S  # of the metadata requests of this attempt
        self._initial: dict[str, dict[str, int]] | None = None
        self._target: dict[TopicPartitionKey, int] | None = None  # Trigger.AvailableNow
        self._latest: dict[TopicPartitionKey, int] | None = None
        self._warned_gone: set[TopicPartitionKey] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = state["_errors"] = state["_outage"] = state["_failure"] = None
        return state

    # -------------------------------------------------------------- Kafka metadata

    def _client(self) -> Any:
        if self._consumer is None:
            self._errors = _ErrorSink()
            self._consumer = _make_consumer(self.opts, "driver", self._errors)
        return self._consumer

    def _drop_client(self) -> None:
        """Close the metadata client (after a failure: the next attempt makes a new one)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - a client of an unreachable broker
                log.debug("closing the Kafka metadata client failed", exc_info=True)

    def _transient(self, exc: BaseException) -> str | None:
        """The text of a transient failure of the metadata client, else ``None``.

        librdkafka's own error events (``error_cb``, served by ``poll``) say more than the
        request's error ("Connect to ipv4#10.0.0.7:9092 failed: Connection refused"
        rather than "Failed to get metadata: Local: Broker transport failure"), and a
        transport failure whose event is not transient (a failed SASL handshake is
        ``_AUTHENTICATION``) is not retried: it is kept in ``_failure`` for the error.
        """
        from confluent_kafka import KafkaException

        self._failure = None
        if not isinstance(exc, KafkaException) or not is_transient(exc):
            return None
        detail = None
        if self._consumer is not None and self._errors is not None:
            with contextlib.suppress(Exception):  # only for a better message
                self._consumer.poll(0)
                if self._errors.permanent is None and self._errors.last is None:
                    # the client's own error event (a failed SASL handshake) can come a
                    # moment after the request's failure: wait for it briefly
                    self._consumer.poll(_ERROR_EVENT_WAIT_S)
            detail = self._errors.take()
        if detail is not None and not is_transient(detail):
            self._failure = detail
            return None
        return _error_text(detail if detail is not None else exc)

    def _retry(self, what: str, attempt: Any) -> Any:
        """``attempt()`` retried within the outage budget; other Kafka errors are
        SourceErrors at once.

        Raises:
            SourceError: code ``SOURCE_UNAVAILABLE`` when the budget is spent, or
                ``SOURCE_ERROR`` for a Kafka error that is not transient.
        """
        from confluent_kafka import KafkaException

        if self._outage is None:
            self._outage = OutageBudget(
                self.opts.outage_budget_s,
                self.opts.bootstrap_servers,
                key=self.opts.outage_budget_key,
            )

        def timed(timeout_s: float) -> Any:
            self._timeout_s = timeout_s
            result = attempt()
            if self._consumer is not None and self._errors is not None:
                self._consumer.poll(0)  # serve librdkafka's queued logs and events
                self._errors.take()
            return result

        try:
            return self._outage.call(
                what, timed, self._transient, _REQUEST_TIMEOUT_S, on_failure=self._drop_client
            )
        except KafkaException as exc:
            failure, self._failure = self._failure, None
            raise _kafka_error(failure if failure is not None else exc, what) from exc

    def _discover(self) -> list[TopicPartitionKey]:
        """The topic-partitions this source reads, as the brokers' metadata says now
        (retried within the outage budget)."""
        return self._retry("listing the topics", self._list_partitions)

    def _snapshot(
        self, only: Sequence[TopicPartitionKey] | None = None
    ) -> tuple[list[TopicPartitionKey], dict[TopicPartitionKey, tuple[int, int]]]:
        """The topic-partitions this source reads and the watermarks of those of ``only``
        (default: all), looked up together and retried together within the outage budget
        (a partition that vanished meanwhile is not asked about again)."""

        def attempt() -> tuple[list, dict]:
            tps = self._list_partitions()
            present = set(tps)
            chosen = tps if only is None else [tp for tp in only if tp in present]
            return tps, self._watermarks(chosen)

        return self._retry("listing the topics and their offsets", attempt)

    def _metadata(self, timeout_s: float) -> Any:
        """The cluster's metadata within ``timeout_s``, asked in slices of at most
        :data:`_METADATA_SLICE_S`: librdkafka retries a failed SASL handshake until a
        request's timeout, so a refused login is found between slices (its error event,
        which is not transient) instead of after the whole timeout.

        Raises:
            confluent_kafka.KafkaException: the request failed (the last slice's error).
        """
        from confluent_kafka import KafkaException

        client = self._client()
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                return client.list_topics(timeout=max(0.05, min(_METADATA_SLICE_S, remaining)))
            except KafkaException as exc:
                if not is_transient(exc) or time.monotonic() >= deadline - 0.05:
                    raise
                if self._errors is not None:
                    with contextlib.suppress(Exception):
                        client.poll(0)  # serve the client's error events
                    if self._errors.permanent is not None:
                        raise

    def _list_partitions(self) -> list[TopicPartitionKey]:
        """One metadata request: the topic-partitions this source reads.

        Raises:
            confluent_kafka.KafkaException: the request failed.
        """
        md = self._metadata(self._timeout_s)
        found: list[TopicPartitionKey] = []
        for name, tm in md.topics.items():
            if tm.error is not None or not self.opts.matches(name):
                continue
            if self.opts.subscribe_pattern is not None and name.startswith("__"):
                continue  # internal topics (__consumer_offsets), as Kafka's own pattern subscription
            wanted = self.opts.assign.get(name) if self.opts.assign is not None else None
            for p in tm.partitions:
                if wanted is None or p in wanted:
                    found.append((name, int(p)))
        return sorted(found)

    def _wanted(self, tp: TopicPartitionKey) -> bool:
        """Whether the options select ``tp`` (whatever the metadata says)."""
        if not self.opts.matches(tp[0]):
            return False
        return self.opts.assign is None or tp[1] in self.opts.assign[tp[0]]

    def _watermarks(
        self, tps: Sequence[TopicPartitionKey]
    ) -> dict[TopicPartitionKey, tuple[int, int]]:
        """``{(topic, partition): (low, high)}`` of ``tps``, one request each.

        Raises:
            confluent_kafka.KafkaException: a request failed.
        """
        client = self._client()
        return {tp: _watermarks_of(client, tp[0], tp[1], self._timeout_s) for tp in tps}

    # -------------------------------------------------------------- offsets

    def initialOffset(self) -> dict:
        """Offsets a new query starts from, per ``startingOffsets``.

        Returns:
            ``{topic: {partition: next_offset}}`` for every partition present now.

        Raises:
            ConfigError: startingOffsets JSON does not name exactly the partitions
                the query reads.
        """
        if self._initial is not None:
            return self._initial
        tps, wm = self._snapshot()
        starting = self.opts.starting_offsets
        offsets: dict[TopicPartitionKey, int] = {}
        if starting in ("earliest", "latest"):
            pick = 0 if starting == "earliest" else 1
            offsets = {tp: wm[tp][pick] for tp in tps}
        else:
            assert isinstance(starting, Mapping)
            given = {(t, p): off for t, parts in starting.items() for p, off in parts.items()}
            missing = sorted(set(tps) - set(given))
            extra = sorted(set(given) - set(tps))
            if missing or extra:
                raise ConfigError(
                    "option startingOffsets must give an offset for every partition the "
                    f"query reads (use -2 for earliest, -1 for latest); missing: "
                    f"{[f'{t}[{p}]' for t, p in missing]}, not found in Kafka: "
                    f"{[f'{t}[{p}]' for t, p in extra]}"
                )
            for tp in tps:
                off = given[tp]
                offsets[tp] = wm[tp][0] if off == EARLIEST else wm[tp][1] if off == LATEST else off
        if self.opts.subscribe is not None:
            absent = sorted(set(self.opts.subscribe) - {t for t, _ in tps})
            if absent:
                log.warning(
                    "topics %s do not exist yet; they are read from their earliest "
                    "offset once they appear",
                    absent,
                )
        self._initial = _to_json(offsets)
        return self._initial

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of a ``Trigger.AvailableNow`` run: the current high watermarks."""
        _, wm = self._snapshot()
        self._target = {tp: hw for tp, (_, hw) in wm.items()}

    def getDefaultReadLimit(self) -> Any:
        """``ReadMaxRows(maxOffsetsPerTrigger)``, or ``ReadAllAvailable()`` without it."""
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.opts.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_offsets_per_trigger)

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        """The end offsets of the next micro-batch.

        Discovers topics and partitions (new ones start at their earliest offset),
        checks for data loss, caps at the ``Trigger.AvailableNow`` target and splits a
        ``ReadMaxRows`` budget fairly across partitions.

        Args:
            start: ``{topic: {partition: next_offset}}`` where the batch starts.
            limit: ``ReadAllAvailable`` or ``ReadMaxRows``; ``None`` reads everything.

        Returns:
            ``{topic: {partition: end_offset}}``; equal to ``start`` when there is
            nothing new.

        Raises:
            SourceError: code ``DATA_LOSS`` (see :func:`resolve_start_offset`), or
                ``SOURCE_UNAVAILABLE`` when the brokers stay unreachable for the outage
                budget.
        """
        begin = _from_json(start)
        tps, wm = self._snapshot()
        self._latest = {tp: hw for tp, (_, hw) in wm.items()}
        end: dict[TopicPartitionKey, int] = {}
        backlog: dict[TopicPartitionKey, int] = {}
        for tp in sorted(set(begin) | set(tps)):
            if tp not in wm:
                if not self._wanted(tp):
                    continue  # no longer subscribed (options changed on restart): dropped
                end[tp] = begin[tp]  # gone from the metadata (topic deleted?): keep its offset
                if tp not in self._warned_gone:
                    self._warned_gone.add(tp)
                    log.warning("%s[%d] is no longer in the topic metadata", *tp)
                continue
            low, high = wm[tp]
            if tp not in begin:
                if self._target is not None and tp not in self._target:
                    continue  # appeared after the AvailableNow target was fixed
                first = low  # a new topic or partition: from its earliest offset
            else:
                first = resolve_start_offset(
                    tp[0], tp[1], begin[tp], low, high, self.opts.fail_on_data_loss
                )
            stop = high
            if self._target is not None and tp in self._target:
                stop = min(stop, max(first, self._target[tp]))
            end[tp] = first
            backlog[tp] = max(0, stop - first)
        max_rows = None
        if limit is not None and hasattr(limit, "max_rows"):
            max_rows = int(limit.max_rows)
        take = backlog if max_rows is None else split_fairly(backlog, max_rows)
        for tp, n in take.items():
            end[tp] += n
        return _to_json(end)

    def reportLatestOffset(self) -> dict | None:
        """High watermarks seen by the last ``latestOffset`` call (for query progress)."""
        return _to_json(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> Sequence[Any]:
        """One input partition per topic-partition with records in ``[start, end)``, or
        with ``maxPartitions`` those ranges packed into that many (:func:`pack_ranges`).

        Raises:
            SourceError: code ``DATA_LOSS`` if the start of a range was deleted meanwhile,
                or ``SOURCE_UNAVAILABLE`` (see :meth:`latestOffset`).
        """
        begin, stop = _from_json(start), _from_json(end)
        _, wm = self._snapshot(only=sorted(stop))
        parts = []
        for tp in sorted(stop):
            e = stop[tp]
            s = begin.get(tp)
            if tp in wm:
                low, high = wm[tp]
                s = resolve_start_offset(
                    tp[0], tp[1], low if s is None else s, low, high, self.opts.fail_on_data_loss
                )
            if s is not None and s < e:
                parts.append(KafkaInputPartition(tp[0], tp[1], s, e))
        if self.opts.max_partitions is not None:
            return pack_ranges(parts, self.opts.max_partitions)
        return parts

    def read(self, partition: Any) -> Iterator[Any]:
        """Arrow batches of one input partition's ranges, one range after another (see
        :func:`read_partition`)."""
        for part in ranges_of(partition):
            yield from read_partition(self.opts, part)

    def commit(self, end: dict) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        """Close the metadata client."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None


class KafkaDataSource(DataSource):
    """The PySpark data source ``cdcflow_kafka`` (streaming reads only).

    Options are validated when the DataFrame is created (``load()``); see the module
    docstring for the list.
    """

    @classmethod
    def name(cls) -> str:
        """``cdcflow_kafka``."""
        return FORMAT

    def schema(self) -> Any:
        """:data:`KAFKA_SCHEMA`, after validating the options."""
        parse_options(self.options)
        return KAFKA_SCHEMA

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        """A stream reader for these options."""
        return KafkaStreamReader(parse_options(self.options))


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
    :data:`ARROW_SCHEMA`, read in this process (no Spark).

    Raises:
        SourceError: ``DATA_LOSS`` when records of the range were deleted meanwhile (and
            failOnDataLoss is true), ``SOURCE_UNAVAILABLE`` when the brokers stay
            unreachable for ``outageBudgetMs`` (see :func:`read_partition`).
    """
    opts = parse_options(options)
    return read_partition(opts, KafkaInputPartition(topic, partition, first, last + 1))


def register(spark: Any) -> None:
    """Register the ``cdcflow_kafka`` data source with a SparkSession (once per session).

    Args:
        spark: ``pyspark.sql.SparkSession``.
    """
    register_once(spark, KafkaDataSource)


def register_once(spark: Any, source: type) -> None:
    """Register the Python data source class ``source`` with ``spark`` unless this
    session has it already (a second registration replaces it with a WARN line)."""
    done: set[str] = spark.__dict__.setdefault("_cdcflow_data_sources", set())
    if source.name() not in done:
        spark.dataSource.register(source)
        done.add(source.name())


def jvm_kafka_available(spark: Any) -> bool:
    """Whether Spark's own Kafka connector (:data:`JVM_KAFKA_PROVIDER`) is on the classpath.

    Args:
        spark: ``pyspark.sql.SparkSession``; a Spark Connect session cannot be inspected
            and gives ``False``.
    """
    try:
        jvm = spark.sparkContext._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(JVM_KAFKA_PROVIDER, False, loader)
        return True
    except Exception:  # noqa: BLE001 - ClassNotFoundException, no JVM (Connect), ...
        return False


def read_stream(spark: Any, options: Mapping[str, Any], engine: str = "auto") -> Any:
    """A streaming DataFrame of Kafka records with the columns of :data:`KAFKA_SCHEMA`.

    With ``engine="auto"`` Spark's JVM ``kafka`` source is used when its connector
    (``spark-sql-kafka-0-10``, class :data:`JVM_KAFKA_PROVIDER`) is on the classpath,
    otherwise the Python source ``cdcflow_kafka``. The options are the same for both,
    but ``kafka.*`` settings go to different clients: the Java client for the JVM source,
    librdkafka for the Python one (e.g. SASL is ``kafka.sasl.jaas.config`` for Java but
    ``kafka.sasl.username``/``kafka.sasl.password`` for librdkafka). The JVM source also
    leaves out the ``headers`` column unless ``includeHeaders=true``; this function sets
    it so both give the same columns.

    Both paths are tested: the JVM path with ``spark-sql-kafka-0-10`` 4.2.0 on PySpark
    4.2.0, on a standalone cluster (``tests/cluster``).

    Args:
        spark: ``pyspark.sql.SparkSession``.
        options: source options (see the module docstring), e.g.
            ``{"kafka.bootstrap.servers": "host:9092", "subscribe": "orders"}``.
        engine: ``"auto"``, ``"jvm"`` or ``"python"``.

    Returns:
        A streaming ``pyspark.sql.DataFrame``, one row per Kafka record.

    Raises:
        ConfigError: invalid options (checked here, before Spark sees them), or an
            unknown ``engine``.
    """
    parse_options(options)
    if engine not in ("auto", "jvm", "python"):
        raise ConfigError(f"engine must be 'auto', 'jvm' or 'python', got {engine!r}")
    use_jvm = engine == "jvm" or (engine == "auto" and jvm_kafka_available(spark))
    opts = {str(k): str(v) for k, v in options.items()}
    if use_jvm:
        opts.setdefault("includeHeaders", "true")
        # cdcflow's own options; the Java client retries by its own settings
        own = ("maxrecordsperbatch", "outagebudgetms")
        opts = {k: v for k, v in opts.items() if k.lower() not in own}
        return spark.readStream.format("kafka").options(**opts).load()
    register(spark)
    return spark.readStream.format(FORMAT).options(**opts).load()

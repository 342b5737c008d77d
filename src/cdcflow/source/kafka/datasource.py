"""Kafka as a Spark streaming source: Spark's JVM ``kafka`` source, or cdcflow's own.

:func:`read_stream` returns a streaming DataFrame with the columns of Spark's Kafka
source (:data:`~cdcflow.source.kafka.schema.KAFKA_SCHEMA`). Where Spark's Kafka connector
is on the classpath it is used; otherwise the Python streaming data source
``cdcflow_kafka`` defined here (:class:`KafkaDataSource`) reads the topics with
confluent-kafka (librdkafka). Its options: :mod:`cdcflow.source.kafka.options`.

The Python source (PySpark >= 4.2 ``DataSourceStreamReader``):

* keeps its offsets in Spark's checkpoint as JSON ``{topic: {partition: next_offset}}``
  (partitions as strings, topics and partitions sorted), so a restarted query resumes
  exactly after the last committed micro-batch;
* plans one Spark input partition per Kafka topic-partition offset range
  ``[start, end)``; ``read`` assigns and seeks a consumer to ``start``, yields
  ``pyarrow.RecordBatch``es of up to ``maxRecordsPerBatch`` rows and stops exactly
  before ``end`` (:mod:`cdcflow.source.kafka.reader`);
* does admission control (``maxOffsetsPerTrigger``, split fairly across partitions),
  ``Trigger.AvailableNow``, topic discovery by ``subscribePattern`` at every
  micro-batch (new topics and partitions start at their earliest offset);
* never skips records silently: a next offset below a partition's low watermark
  (records deleted by retention) or above its end (topic re-created) raises
  :class:`~cdcflow.errors.SourceError` with code ``DATA_LOSS`` unless
  ``failOnDataLoss=false``, which skips ahead with a warning;
* waits out broker outages: transient client errors
  (:func:`~cdcflow.source.kafka.client.is_transient`: broker down, timeouts, no leader)
  of the driver's metadata requests and of ``read`` are retried with exponential backoff
  (:mod:`cdcflow.source.outage`), one warning line per attempt, until they have lasted
  ``outageBudgetMs``; then a ``SourceError`` with code ``SOURCE_UNAVAILABLE`` stops the
  query. Other errors (authentication, bad settings, data loss) are raised at once.

Spark pickles the data source and the stream reader to its Python workers by reference,
so the classes here stay module-level names of this module.
Reference: Spark "Structured Streaming + Kafka Integration Guide" (options, schema).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from cdcflow.errors import ConfigError
from cdcflow.source.kafka.client import (
    REQUEST_TIMEOUT_S,
    ErrorSink,
    error_text,
    is_transient,
    kafka_error,
    make_consumer,
    watermarks_of,
)
from cdcflow.source.kafka.options import KafkaSourceOptions, parse_options
from cdcflow.source.kafka.planning import (
    KafkaInputPartition,
    TopicPartitionKey,
    offsets_from_json,
    offsets_to_json,
    pack_ranges,
    ranges_of,
    resolve_start_offset,
    split_fairly,
)
from cdcflow.source.kafka.reader import read_partition, worker_logging
from cdcflow.source.kafka.schema import KAFKA_SCHEMA
from cdcflow.source.outage import OutageBudget
from cdcflow.source.starting_offsets import EARLIEST, LATEST

__all__ = [
    "FORMAT",
    "JVM_KAFKA_PROVIDER",
    "KafkaDataSource",
    "KafkaStreamReader",
    "jvm_kafka_available",
    "read_stream",
    "register",
    "register_once",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

FORMAT = "cdcflow_kafka"
"""Name of the Python data source (``spark.readStream.format(FORMAT)``)."""

JVM_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
"""Class of Spark's own Kafka connector (``spark-sql-kafka-0-10``)."""


#: seconds a failed metadata request waits for the client's error event that says why
_ERROR_EVENT_WAIT_S = 0.5
#: the longest single metadata request (:meth:`KafkaStreamReader._metadata`), seconds
_METADATA_SLICE_S = 1.0


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
        worker_logging()
        self.opts = options
        self._consumer: Any = None  # metadata and watermark queries (driver only)
        self._errors: ErrorSink | None = None  # the metadata client's error_cb
        self._outage: OutageBudget | None = None
        self._failure: Any = None  # a client error event that made a failure permanent
        self._timeout_s = REQUEST_TIMEOUT_S  # of the metadata requests of this attempt
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
            self._errors = ErrorSink()
            self._consumer = make_consumer(self.opts, "driver", self._errors)
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
        return error_text(detail if detail is not None else exc)

    def _retry(self, what: str, attempt: Callable[[], _T]) -> _T:
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

        def timed(timeout_s: float) -> _T:
            self._timeout_s = timeout_s
            result = attempt()
            if self._consumer is not None and self._errors is not None:
                self._consumer.poll(0)  # serve librdkafka's queued logs and events
                self._errors.take()
            return result

        try:
            return self._outage.call(
                what, timed, self._transient, REQUEST_TIMEOUT_S, on_failure=self._drop_client
            )
        except KafkaException as exc:
            failure, self._failure = self._failure, None
            raise kafka_error(failure if failure is not None else exc, what) from exc

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

        def attempt() -> tuple[list[TopicPartitionKey], dict[TopicPartitionKey, tuple[int, int]]]:
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
        return {tp: watermarks_of(client, tp[0], tp[1], self._timeout_s) for tp in tps}

    # -------------------------------------------------------------- offsets

    def initialOffset(self) -> dict[str, dict[str, int]]:
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
        self._initial = offsets_to_json(offsets)
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

    def latestOffset(
        self, start: Mapping[str, Mapping[str, int]], limit: Any = None
    ) -> dict[str, dict[str, int]]:
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
        begin = offsets_from_json(start)
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
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        """High watermarks seen by the last ``latestOffset`` call (for query progress)."""
        return offsets_to_json(self._latest) if self._latest else None

    def partitions(
        self, start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]
    ) -> Sequence[Any]:
        """One input partition per topic-partition with records in ``[start, end)``, or
        with ``maxPartitions`` those ranges packed into that many (:func:`pack_ranges`).

        Raises:
            SourceError: code ``DATA_LOSS`` if the start of a range was deleted meanwhile,
                or ``SOURCE_UNAVAILABLE`` (see :meth:`latestOffset`).
        """
        begin, stop = offsets_from_json(start), offsets_from_json(end)
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

    def commit(self, end: Mapping[str, Mapping[str, int]]) -> None:
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

    Options are validated when the DataFrame is created (``load()``); see
    :mod:`cdcflow.source.kafka.options` for the list.
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


def register(spark: Any) -> None:
    """Register the ``cdcflow_kafka`` data source with a SparkSession (once per session).

    Args:
        spark: ``pyspark.sql.SparkSession``.
    """
    register_once(spark, KafkaDataSource)


def register_once(spark: Any, source: type[DataSource]) -> None:
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
        options: source options (see :mod:`cdcflow.source.kafka.options`), e.g.
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

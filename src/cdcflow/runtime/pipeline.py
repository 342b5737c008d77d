"""The streaming job: Kafka -> decode (Spark) -> apply (Delta, per micro-batch).

One Structured Streaming query reads every configured source's topics (decision 53)::

    kafka source + decode ──► foreachBatch: toArrow ──► split by source ──► BatchApplier.apply
    (Spark executors: each topic     (driver)                              (one per source,
     in its source's format)                                                delta-rs commits)

Exactly once: the warehouse records, per source, the Kafka offsets it applied
(:mod:`cdcflow.apply.offsets`) and skips records below them whatever micro-batch carries
them. Before the query starts, the pipeline checks that the checkpoint belongs to these
sources (:mod:`cdcflow.runtime.checkpoint`), finishes the applies a crash interrupted by
re-reading their exact offset ranges from Kafka, and starts a new (or deleted)
checkpoint at the warehouse's offsets, so losing the checkpoint loses and duplicates
nothing.

A micro-batch's apply runs on a thread of its own (:class:`ApplyLane`), its sources side
by side: once every source's records are covered by the warehouse's intent, Spark decodes
the next micro-batch while the tables are written (decision 32).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cdcflow.apply.accounting import BatchReport
from cdcflow.apply.batch import BatchApplier
from cdcflow.apply.offsets import PendingApply
from cdcflow.config import PipelineConfig, SourceConfig
from cdcflow.decode.batches import DecodeFunction
from cdcflow.errors import CdcflowError, ConfigError, DeadLetterLimit, SourceError, StorageError
from cdcflow.event_schema import EVENT_SCHEMA, spark_event_schema
from cdcflow.model import dumps
from cdcflow.runtime.checkpoint import Checkpoint, Fingerprint
from cdcflow.runtime.hadoop import hadoop_uri, use_checkpoint_store
from cdcflow.runtime.late_worker import LateWorker
from cdcflow.runtime.metrics import Metrics
from cdcflow.runtime.progress import ProgressReporter, attach, detach
from cdcflow.runtime.spark import get_or_create_session, workers_import_cdcflow
from cdcflow.runtime.store_outage import StoreOutage
from cdcflow.sinks.delta_spark import SparkDeltaWarehouse, delta_spark_ready
from cdcflow.sinks.maintenance import ExpiryClock
from cdcflow.sinks.s3a import checkpoint_on_store
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.source.group_offsets import GroupOffsets
from cdcflow.source.starting_offsets import EARLIEST, LATEST
from cdcflow.source.subscription import DecodeByTopic, SourceTopics, Subscription
from cdcflow.transform.router import Router

__all__ = ["ApplyLane", "Interrupted", "Pipeline", "RunSummary", "applier_for", "source_error_of"]

log = logging.getLogger(__name__)

# The last line of a Python traceback that ends in a cdcflow SourceError, as Spark quotes
# it in a failed query's message: "cdcflow.errors.SourceError: [CODE] message".
_SOURCE_ERROR_LINE = re.compile(r"cdcflow\.errors\.SourceError: \[([A-Z][A-Z0-9_]*)\] ([^\r\n]*)")


def source_error_of(exc: BaseException) -> SourceError | None:
    """The :class:`SourceError` a failed streaming query carries, or ``None``.

    The source runs in Spark's Python workers (``latestOffset`` in one beside the driver,
    ``read`` in the executors'); its errors reach the driver as a pyspark
    ``StreamingQueryException`` whose message quotes the worker's traceback. The last
    ``cdcflow.errors.SourceError: [CODE] message`` line in it is the error, rebuilt with
    its code and one-line message.

    Args:
        exc: the exception a query raised (any exception; only its text is read).
    """
    found = _SOURCE_ERROR_LINE.findall(str(exc))
    if not found:
        return None
    code, message = found[-1]
    return SourceError(message.strip(), code)


#: micro-batch reports a :class:`RunSummary` keeps per source (the newest; its totals
#: count every apply): bounds the memory of a long streaming run
RECENT_REPORTS = 1_000

#: micro-batch ids a :class:`RunSummary` remembers to count a micro-batch of several
#: sources once (micro-batches come in order: an id older than these is not seen again)
_RECENT_DELIVERY_IDS = 4_096

_COUNTS = ("batches", "records", "events", "skipped", "dead_letters")


@dataclass
class RunSummary:
    """What a run applied: running totals over every apply, per source and in all, and
    per source the reports of its newest :data:`RECENT_REPORTS` applies (its memory stays
    bounded however long the run streams).

    Attributes:
        reports: source name -> its newest reports (:class:`BatchReport`), oldest first.
        max_reports: reports kept per source.
    """

    reports: dict[str, deque[BatchReport]] = field(default_factory=dict)
    max_reports: int = RECENT_REPORTS
    _by_source: dict[str, dict[str, int]] = field(default_factory=dict, repr=False)
    _batches: int = field(default=0, repr=False)
    _delivery_ids: dict[int, None] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, source: str, report: BatchReport) -> None:
        """Count ``report`` (an apply of ``source``) in the totals and keep it among the
        source's newest reports (safe from the sources' apply threads)."""
        with self._lock:
            kept = self.reports.get(source)
            if kept is None:
                kept = self.reports[source] = deque(maxlen=self.max_reports)
            kept.append(report)
            counts = self._by_source.setdefault(source, dict.fromkeys(_COUNTS, 0))
            counts["batches"] += 1
            counts["records"] += report.records
            counts["events"] += report.events
            counts["skipped"] += sum(report.skipped.values())
            counts["dead_letters"] += sum(report.dead_letters.values())
            # one micro-batch carries several sources' records: counted once; an
            # interrupted apply finished at start-up (no id) counts as one of its own
            if report.delivery_id is None:
                self._batches += 1
            elif report.delivery_id not in self._delivery_ids:
                self._batches += 1
                self._delivery_ids[report.delivery_id] = None
                if len(self._delivery_ids) > _RECENT_DELIVERY_IDS:
                    del self._delivery_ids[next(iter(self._delivery_ids))]

    def totals(self, source: str | None = None) -> dict[str, int]:
        """Sums over every apply of the run (also those whose reports are no longer
        kept): ``batches`` counts the micro-batches applied (one micro-batch carries
        several sources' records; an interrupted apply finished at start-up counts as one
        of its own), then records, events, skipped records and dead letters. With
        ``source``: that source's sums, ``batches`` its applies (zeros for a source that
        applied nothing)."""
        with self._lock:
            if source is not None:
                return dict(self._by_source.get(source, dict.fromkeys(_COUNTS, 0)))
            out = dict.fromkeys(_COUNTS, 0)
            for counts in self._by_source.values():
                for name in _COUNTS[1:]:
                    out[name] += counts[name]
            out["batches"] = self._batches
            return out


def applier_for(
    config: PipelineConfig,
    warehouse: DeltaWarehouse,
    source: SourceConfig,
    fence: Callable[[], None] | None = None,
    expiry_clock: ExpiryClock | None = None,
) -> BatchApplier:
    """The :class:`BatchApplier` of one source's warehouse view, with the source's
    routing and the configuration's tables, apply and maintenance settings (the
    pipeline's, and ``cdcflow dead-letters replay``'s)."""
    return BatchApplier(
        warehouse,
        Router(config.target_template, source.routing()),
        tables=config.tables,
        tombstone_retention_hours=config.apply.tombstone_retention_hours,
        transactions=config.apply.transaction_policy(),
        table_budget_s=config.apply.table_budget_s,
        fence=fence,
        parallel_tables=config.apply.parallel_tables,
        maintenance=config.maintenance.policy(),
        expiry_clock=expiry_clock,
    )


class ApplyLane:
    """The query's applies, one micro-batch at a time, each on a thread of its own, so that Spark
    decodes micro-batch N+1 while micro-batch N is written (decision 32).

    :meth:`start` returns once the apply says its records are durable (the warehouse's
    intent holds their offset ranges: a crash from there on is finished from Kafka at
    the next start), so Spark commits the micro-batch to its checkpoint only then. The
    next :meth:`start` (or :meth:`wait`) first waits for the running apply and raises
    its error, so a failure stops the query one micro-batch later at the latest, with
    that micro-batch not committed.
    """

    def __init__(self, name: str, on_failure: Callable[[], None] | None = None) -> None:
        self.name = name
        #: called (on a thread of its own) when an apply fails after :meth:`start`
        #: returned: the pipeline stops the query, so a failure is not left
        #: waiting for the next micro-batch of an idle topic
        self.on_failure = on_failure
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def wait(self) -> None:
        """Block until the running apply has finished.

        Raises:
            whatever the apply raised.
        """
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def start(self, work: Callable[[Callable[[], None]], None]) -> None:
        """Run ``work(on_durable)`` on a new thread once the previous apply has finished;
        return when ``work`` has called ``on_durable`` or ended.

        Raises:
            the previous apply's error; ``work``'s own when it failed before its records
            were durable (or before this returned).
        """
        self.wait()
        durable = threading.Event()

        def run() -> None:
            try:
                work(durable.set)
            except BaseException as exc:  # noqa: BLE001 - handed to wait(), in the caller
                self._error = exc
                if durable.is_set() and self.on_failure is not None:
                    # not on this thread: stopping the query waits for the micro-batch
                    # that may be waiting for this thread
                    threading.Thread(target=self.on_failure, daemon=True).start()
            finally:
                durable.set()

        thread = threading.Thread(target=run, name=f"cdcflow-apply-{self.name}", daemon=True)
        self._thread = thread
        thread.start()
        durable.wait()
        if not thread.is_alive():
            self.wait()


class Pipeline:
    """Runs the configured sources as streaming queries.

    Args:
        config: the validated configuration.
        spark: a SparkSession; default: :func:`cdcflow.runtime.spark.get_or_create_session`.
        on_batch: called with ``(source_name, report)`` after every applied batch.
        kafka_engine: ``"auto"`` (Spark's JVM Kafka source if present, else the Python
            source with decoding fused into the read), ``"jvm"``, ``"python"`` (fused), or
            ``"python-mapinarrow"`` (raw Python source + ``mapInArrow``, for comparison).
        staging: on local Spark with the Python source, decode tasks hand their events to
            the driver as memory-mapped Arrow files instead of through the JVM (see
            :mod:`cdcflow.source.changes`).
        fence: called before each apply's first commit and before its completion; raises
            when this run may no longer write (``cdcflow run`` checks its lease here).
        config_path: the configuration file, named in error messages' fixes.
        progress: told every micro-batch's applies and Spark's progress of it (the
            console lines of ``cdcflow run``: :mod:`cdcflow.runtime.progress`); ``None``: silent.
    """

    def __init__(
        self,
        config: PipelineConfig,
        spark=None,
        on_batch: Callable[[str, BatchReport], None] | None = None,
        kafka_engine: str = "auto",
        staging: bool = True,
        config_path: str = "CONFIG",
        fence: Callable[[], None] | None = None,
        progress: ProgressReporter | None = None,
    ) -> None:
        self.config = config
        #: the console's lines (none when not given) and the records-behind estimates
        self.progress = progress if progress is not None else ProgressReporter(_silent)
        self.config_path = config_path
        self.kafka_engine = kafka_engine
        self.staging = staging
        if spark is not None:
            workers_import_cdcflow(spark)  # a notebook's session: its workers find cdcflow
        else:
            spark = get_or_create_session(
                app_name=f"cdcflow-{config.pipeline_id}",
                delta_spark=config.sink == "delta-spark",
                ui=config.monitoring.spark_ui,
                checkpoint_on_s3=checkpoint_on_store(config.checkpoint),
            )
        if checkpoint_on_store(config.checkpoint):
            use_checkpoint_store(spark, config.checkpoint, config.storage)
        if config.sink == "delta-spark" and not delta_spark_ready(spark):
            raise ConfigError(
                "sink: delta-spark needs Delta Lake's Spark jars and session extension: "
                "give spark-submit the arguments `python -m cdcflow.runtime.spark` prints, or "
                "set sink: delta-rs"
            )
        self.spark = spark
        self.on_batch = on_batch
        self.fence = fence
        self.summary = RunSummary()
        #: source -> the cdcflow error that failed its query's micro-batch
        self._failures: dict[str, CdcflowError] = {}
        #: the query's applies (one micro-batch at a time, beside Spark's next one)
        self._lane: ApplyLane | None = None
        #: the sources' appliers expire the warehouse's bookkeeping rows one at a time
        self._expiry_clock = ExpiryClock()
        #: Prometheus metrics (``monitoring.prometheus_port``) and the monitoring consumer
        #: group's offsets (``kafka.commit_offsets``), while the query runs
        self._metrics: Metrics | None = None
        self._group: GroupOffsets | None = None
        #: the restarts of the query across a warehouse outage, while :meth:`run` runs
        self._outage: StoreOutage | None = None
        #: the restarts of the query after Spark's Python worker was late to start
        self._late_worker: LateWorker | None = None

    def warehouse_for(self, source: SourceConfig) -> DeltaWarehouse:
        """The warehouse view of one source: its own application-transaction id; its
        mirrors merged by delta-rs or, with ``sink: delta-spark``, by Spark."""
        pipeline_id = f"{self.config.pipeline_id}.{source.name}"
        if self.config.sink == "delta-spark":
            return SparkDeltaWarehouse(
                self.config.warehouse,
                self.spark,
                pipeline_id=pipeline_id,
                storage_options=self.config.storage,
            )
        return DeltaWarehouse(
            self.config.warehouse,
            pipeline_id=pipeline_id,
            storage_options=self.config.storage,
            merge_engine=self.config.apply.merge_engine,
        )

    def _decode_function(self, source: SourceConfig) -> DecodeFunction:
        wh = self.warehouse_for(source)
        return DecodeFunction(
            source.format,
            dict(source.options),
            state_path=wh.system_path("decoder_state"),
            state_key=wh.pipeline_id,
            storage_options=wh.storage_options or None,
        )

    def routing(self) -> Subscription:
        """The sources of the pipeline's query and which one each topic belongs to.

        Raises:
            ConfigError: two sources name the same topic.
        """
        return Subscription(
            [
                SourceTopics(s.name, tuple(s.topics), s.topic_pattern, self._decode_function(s))
                for s in self.config.sources
            ]
        )

    def _decoded_stream(self, routing: Subscription, options: dict[str, str], staging: str | None):
        """Decoded events of every source as one streaming DataFrame of EVENT_SCHEMA rows.

        On the Python Kafka source, decoding is fused into the read (``cdcflow_changes``:
        one JVM round trip fewer); on Spark's JVM Kafka source it is a ``mapInArrow``. Each
        topic is decoded by the format of its source.
        """
        # deferred: pyspark (~1 s); api and replay import this module without Spark
        from cdcflow.source.kafka.datasource import jvm_kafka_available, read_stream

        jvm = self.kafka_engine == "jvm" or (
            self.kafka_engine == "auto" and jvm_kafka_available(self.spark)
        )
        if jvm or self.kafka_engine == "python-mapinarrow":
            raw = read_stream(self.spark, options, engine="jvm" if jvm else "python")
            return raw.mapInArrow(DecodeByTopic(routing), spark_event_schema())
        # deferred: pyspark (~1 s); api and replay import this module without Spark
        from cdcflow.source.changes import FORMAT, STORAGE_OPTION_PREFIX, register

        fused = {
            **options,
            "cdcflow.sources": dumps([r.as_json() for r in routing.routes]).decode(),
            # the decoders read their state from the warehouse: its storage options, each an
            # option of its own so that Spark's redaction (spark.redaction.regex) masks secrets
            **{f"{STORAGE_OPTION_PREFIX}{k}": v for k, v in self.config.storage.items()},
            "maxPartitions": str(self._read_tasks()),
        }
        if staging is not None:
            fused["cdcflow.stagingPath"] = staging
        register(self.spark)
        return self.spark.readStream.format(FORMAT).options(**fused).load()

    def _read_tasks(self) -> int:
        """``kafka.read_tasks``, by default twice Spark's default parallelism: enough tasks
        to keep every core busy while the ranges' sizes differ (decision 54)."""
        if self.config.kafka.read_tasks is not None:
            return self.config.kafka.read_tasks
        return 2 * max(1, self.spark.sparkContext.defaultParallelism)

    def _staging_path(self) -> str | None:
        """Where decode tasks stage event files: only for local Spark on the Python source.

        Local Spark's executors share the driver's file system; on a cluster the events
        travel through Spark instead (no shared staging folder is assumed).
        """
        if self.kafka_engine not in ("auto", "python") or not self.staging:
            return None
        master = self.spark.sparkContext.master
        if not master.startswith("local"):
            return None
        checkpoint = self.checkpoint()
        if not checkpoint.store.local:
            return None  # the staged files are local: they travel through Spark instead
        return os.path.join(checkpoint.path, "staging")

    def _applier(self, source: SourceConfig) -> BatchApplier:
        return applier_for(
            self.config,
            self.warehouse_for(source),
            source,
            fence=self.fence,
            expiry_clock=self._expiry_clock,
        )

    def _start(self, once: bool):
        """Start the pipeline's query: every source's topics, each micro-batch's events
        split by source and applied by each source's own applier (own offsets ledger)."""
        # the format's options were checked when the configuration was validated
        # (SourceConfig), so a bad option never reaches a Spark task
        routing = self.routing()
        options = self.config.kafka.reader_options()
        options.update(routing.subscription())
        appliers = {s.name: self._applier(s) for s in self.config.sources}
        checkpoint = self._prepare(appliers, options, routing)
        staging = self._staging_path()
        decoded = self._decoded_stream(routing, options, staging)
        if staging is not None and os.path.isdir(staging):
            shutil.rmtree(staging)  # no batch is in flight before the query starts
        lane = self._lane = ApplyLane(self.config.pipeline_id)
        self._monitor(options)
        self._follow(routing)

        def apply_batch(df, batch_id: int) -> None:
            manifest = None
            if staging is not None:
                # deferred: pyspark (~1 s); api and replay import this module without Spark
                from cdcflow.source.changes import read_staged

                manifest = df.toArrow()
                events = read_staged(manifest)
            else:
                events = df.toArrow()
            parts = routing.split(events)
            if parts:  # before Spark can record the micro-batch finished
                checkpoint.delivered(batch_id, list(parts))

            def work(on_durable: Callable[[], None]) -> None:
                reports = self._apply_sources(appliers, parts, batch_id, on_durable)
                self._store_answers()
                self.progress.applied(batch_id, reports)
                self._publish(reports)
                if manifest is not None:
                    for path in manifest["staged_path"].to_pylist():
                        os.remove(path)
                self._check_dead_letters(batch_id, reports)

            lane.start(work)

        writer = (
            decoded.writeStream.queryName(f"cdcflow-{self.config.pipeline_id}")
            .foreachBatch(apply_batch)
            .option("checkpointLocation", hadoop_uri(checkpoint.path))
        )
        if once or self.config.trigger.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.config.trigger.processing_time)
        query = writer.start()
        self.progress.started(str(query.id))
        lane.on_failure = lambda: _stop_queries([query])
        return query

    def _publish(self, reports: dict[str, BatchReport]) -> None:
        """A micro-batch's applies, to the Prometheus metrics and the consumer group."""
        if self._metrics is not None:
            self._metrics.observe(reports)
        if self._group is not None:
            ends = {tp: last + 1 for r in reports.values() for tp, (_, last) in r.ranges.items()}
            self._group.submit(ends)  # on its own thread: never waits for Kafka

    def _monitor(self, options: dict[str, str]) -> None:
        """Start what ``monitoring:`` and ``kafka.commit_offsets`` ask for, and say where."""
        monitoring = self.config.monitoring
        if self._metrics is not None or self._group is not None:
            return  # the query was started again (a store outage): they go on
        if monitoring.prometheus_port is not None:
            try:
                metrics = Metrics(monitoring.prometheus_port, monitoring.prometheus_host)
            except OSError as exc:
                raise ConfigError(
                    f"monitoring.prometheus_port: cannot listen on {monitoring.prometheus_host}:"
                    f"{monitoring.prometheus_port} ({exc.strerror or exc}); choose a free port "
                    "or set it to null"
                ) from None
            self._metrics = metrics
            self.progress.write(f"metrics at {metrics.url}")
        if self.config.kafka.commit_offsets:
            self._group = GroupOffsets(options, self.config.group_id)
        if monitoring.spark_ui:
            url = self.spark.sparkContext.uiWebUrl
            self.progress.write(f"Spark UI at {url}" if url else "Spark UI: not started")

    def _unmonitor(self) -> None:
        metrics, self._metrics = self._metrics, None
        if metrics is not None:
            metrics.close()
        group, self._group = self._group, None
        if group is not None:
            group.close()

    def _follow(self, routing: Subscription) -> None:
        """Let :attr:`progress` follow the query: which source each topic is, and Spark's
        progress events (a ``StreamingQueryListener``, removed when the run ends)."""
        progress = self.progress
        progress.source_of = routing.source_of
        progress.trigger_ms = self.config.trigger.interval_ms
        for s in self.config.sources:
            progress.formats[s.name] = s.format
            progress.topics[s.name] = ", ".join(s.topics) or f"/{s.topic_pattern}/"
        self._listener = attach(self.spark, progress)

    def _unfollow(self) -> None:
        listener, self._listener = getattr(self, "_listener", None), None
        if listener is None:
            return
        detach(self.spark, listener)
        self.progress.flush()

    def _apply_sources(
        self,
        appliers: dict[str, BatchApplier],
        parts: dict[str, Any],
        batch_id: int,
        on_durable: Callable[[], None],
    ) -> dict[str, BatchReport]:
        """Apply each source's part of a micro-batch with its own applier, up to
        ``apply.parallel_tables`` sources at once; ``on_durable`` once every part's
        records are durable (each source's offsets intent written).

        Returns:
            Each source's report.

        Raises:
            the first source's error, once every source's apply has ended.
        """
        if not parts:
            on_durable()
            return {}
        if len(parts) == 1:
            [(name, events)] = parts.items()
            return {name: self._apply_source(name, appliers[name], events, batch_id, on_durable)}
        remaining = len(parts)
        lock = threading.Lock()

        def durable() -> None:
            nonlocal remaining
            with lock:
                remaining -= 1
                if remaining == 0:
                    on_durable()

        workers = min(len(parts), self.config.apply.parallel_tables)
        with ThreadPoolExecutor(workers, thread_name_prefix="cdcflow-source") as pool:
            futures = [
                pool.submit(self._apply_source, name, appliers[name], ev, batch_id, durable)
                for name, ev in parts.items()
            ]
        for future in futures:
            exc = future.exception()
            if exc is not None:
                raise exc
        return {name: future.result() for name, future in zip(parts, futures, strict=True)}

    def _apply_source(
        self,
        name: str,
        applier: BatchApplier,
        events: Any,
        batch_id: int,
        on_durable: Callable[[], None],
    ) -> BatchReport:
        def behind(ranges: dict) -> int | None:  # the apply's own ranges: computed once
            return self.progress.records_behind(name, ranges)

        try:
            report = applier.apply(
                events, delivery_id=batch_id, on_durable=on_durable, records_behind=behind
            )
        except CdcflowError as exc:  # raised as itself, not as Spark's wrapper
            self._failures.setdefault(name, exc)
            raise
        self.summary.add(name, report)
        log.debug("source %s micro-batch %s: %s", name, batch_id, report.as_dict())
        if self.on_batch is not None:
            self.on_batch(name, report)
        return report

    def _check_dead_letters(self, batch_id: int, reports: dict[str, BatchReport]) -> None:
        """Raise :class:`DeadLetterLimit` for a source over ``apply.dead_letter_limit``
        (the micro-batch is committed: its dead letters are in the warehouse)."""
        limit = self.config.apply.dead_letter_limit
        if limit is None:
            return
        for name, report in reports.items():
            dead = sum(report.dead_letters.values())
            if report.records and dead > limit * report.records:
                error = DeadLetterLimit(name, batch_id, report.dead_letters, report.records, limit)
                self._failures.setdefault(name, error)
                raise error

    # ------------------------------------------------------------------ start-up

    def fingerprint(self, source: SourceConfig) -> Fingerprint:
        """What the checkpoint must hold of ``source``."""
        return Fingerprint.of(self.config, source)

    def checkpoint(self) -> Checkpoint:
        """The pipeline query's checkpoint (``<checkpoint>/_query``)."""
        return Checkpoint.of(self.config)

    def _prepare(
        self, appliers: dict[str, BatchApplier], options: dict, routing: Subscription
    ) -> Checkpoint:
        """Before the query starts: the checkpoint is this pipeline's, interrupted applies
        are finished, and a new checkpoint starts at the warehouse's offsets.

        A checkpoint whose set of sources is not the configured one (a source added,
        removed or reset) starts over: each partition at the warehouse's offset, else
        where the old checkpoint's last finished micro-batch ended (a source kept), else
        as configured.

        Returns:
            The checkpoint, for the query's micro-batches to record reads in.

        Raises:
            ConfigError: a source of the checkpoint is configured otherwise, or it has read
                records that a warehouse which has applied nothing of the source never got;
                topics of two sources overlap.
            SourceError: Kafka cannot be reached, or an interrupted apply's records are
                gone (DATA_LOSS).
        """
        checkpoint = self.checkpoint()
        expected = [self.fingerprint(s) for s in self.config.sources]
        carried: dict[tuple[str, int], int] = {}
        if not checkpoint.claim(expected, self.config_path):
            had = sorted(checkpoint.fingerprints() or {})
            kept = set(had) & set(appliers)
            carried = {
                tp: at
                for tp, at in checkpoint.committed_end_offsets().items()
                if routing.source_of(tp[0]) in kept
            }
            log.warning(
                "checkpoint %s holds sources %s, the configuration %s: it starts over, each "
                "source at the warehouse's offsets (nothing is lost or applied twice)",
                checkpoint.path,
                had,
                sorted(appliers),
            )
            checkpoint.restart()
            checkpoint.claim(expected, self.config_path)
        if checkpoint.is_new():
            carried = {**self._legacy_positions(appliers, routing), **carried}
        checkpoint.track_reads()
        committed = checkpoint.committed_batches()
        for source in self.config.sources:
            ledger = appliers[source.name].ledger
            # a checkpoint whose micro-batches read nothing of the source (started before
            # the replication tool created or filled its topic, or at "latest" before a
            # new change) agrees with a warehouse that applied nothing of it; so does one
            # whose first apply was interrupted after its intent (finished below: Spark
            # went on once the intent made its records durable, decision 32)
            if (
                committed
                and ledger.completed_id() < 0
                and ledger.pending() is None
                and not checkpoint.read_nothing(source.name)
            ):
                raise self._lost_warehouse(checkpoint, source, len(committed))
        for source in self.config.sources:
            applier = appliers[source.name]
            pending = applier.ledger.pending()
            if pending is not None:
                self._finish_pending(source, applier, pending, options)
        if checkpoint.is_new():
            start = self._warehouse_start(appliers, options, routing, carried)
            if start is not None:
                options["startingOffsets"] = start
        return checkpoint

    def _lost_warehouse(self, checkpoint: Checkpoint, source: SourceConfig, n: int) -> ConfigError:
        return ConfigError(
            f"checkpoint {checkpoint.path} has {n} finished micro-batches, but warehouse "
            f"{self.config.warehouse} has applied nothing of source {source.name!r}, which "
            "they read: the warehouse was deleted or is another one, and the checkpoint "
            f"would skip what it never applied. Fix: `cdcflow reset {self.config_path} "
            f"--source {source.name}` to apply the topics again from kafka.starting_offsets"
        )

    def _legacy_positions(
        self, appliers: dict[str, BatchApplier], routing: Subscription
    ) -> dict[tuple[str, int], int]:
        """Where the per-source checkpoints of cdcflow before 0.4
        (``<checkpoint>/<source>``) ended, for the partitions of their sources.

        Raises:
            ConfigError: such a checkpoint read records of a source the warehouse has
                applied nothing of.
        """
        out: dict[tuple[str, int], int] = {}
        for source in self.config.sources:
            old = Checkpoint.of(self.config, source.name)
            if old.is_new():
                continue
            found = (old.fingerprints() or {}).get(source.name)
            if found is not None and found != self.fingerprint(source):
                log.warning(
                    "source %s: the checkpoint of cdcflow before 0.4 in %s is of another "
                    "stream (%s); not used",
                    source.name,
                    old.path,
                    "; ".join(self.fingerprint(source).differences(found)),
                )
                continue
            committed = old.committed_batches()
            applied_none = appliers[source.name].ledger.completed_id() < 0
            if committed and applied_none and not old.read_nothing():
                raise self._lost_warehouse(old, source, len(committed))
            positions = {
                tp: at
                for tp, at in old.committed_end_offsets().items()
                if routing.source_of(tp[0]) == source.name
            }
            log.info(
                "source %s: positions of the checkpoint of cdcflow before 0.4 in %s are "
                "used where the warehouse has none (the folder can be deleted after this "
                "run)",
                source.name,
                old.path,
            )
            out.update(positions)
        return out

    def _finish_pending(
        self, source: SourceConfig, applier: BatchApplier, pending: PendingApply, options: dict
    ) -> None:
        """Re-read an interrupted apply's exact offset ranges from Kafka and finish it."""
        import pyarrow as pa

        # deferred: pyspark (~1 s); api and replay import this module without Spark
        from cdcflow.source.kafka.admin import read_range

        log.warning(
            "source %s: finishing apply %d that a crash interrupted (%s)",
            source.name,
            pending.apply_id,
            pending.describe(),
        )
        decode = self._decode_function(source)
        batches: list[pa.RecordBatch] = []
        for (topic, partition), (first, last) in sorted(pending.ranges.items()):
            batches.extend(decode(read_range(options, topic, partition, first, last)))
        events = pa.Table.from_batches(batches, schema=EVENT_SCHEMA)
        report = applier.apply(events)
        self.summary.add(source.name, report)
        self.progress.finished(source.name, report)

    @staticmethod
    def _warehouse_start(
        appliers: dict[str, BatchApplier],
        options: dict,
        routing: Subscription,
        carried: dict[tuple[str, int], int] | None = None,
    ) -> str | None:
        """``startingOffsets`` JSON for a new checkpoint: each partition at its source's
        warehouse offset, else at ``carried`` (an old checkpoint's position), else as
        configured. ``None``: neither knows any of these partitions."""
        # deferred: pyspark (~1 s); api and replay import this module without Spark
        from cdcflow.source.kafka.admin import list_partitions

        carried = carried or {}
        tps = list_partitions(options)
        by_source: dict[str, list[tuple[str, int]]] = {}
        for tp in tps:
            name = routing.source_of(tp[0])
            if name is not None:
                by_source.setdefault(name, []).append(tp)
        known: dict[tuple[str, int], int] = {}
        for name, own in by_source.items():
            known.update(appliers[name].ledger.next_offsets(own))
        if not known and not any(tp in carried for tp in tps):
            return None
        configured = options.get("startingOffsets", "earliest")
        given: dict = {}
        if configured.strip().startswith("{"):
            given = json.loads(configured)
        fallback = LATEST if configured.strip().lower() == "latest" else EARLIEST
        start: dict[str, dict[str, int]] = {}
        for topic, partition in tps:
            at = known.get((topic, partition), carried.get((topic, partition)))
            if at is None:
                at = int(given.get(topic, {}).get(str(partition), fallback))
            start.setdefault(topic, {})[str(partition)] = at
        log.info("new checkpoint: starting at the warehouse's offsets %s", start)
        return json.dumps(start)

    def _raise_failure(self, exc: BaseException) -> None:
        """Raise the cdcflow error that failed a query, if one did, instead of Spark's
        ``StreamingQueryException`` wrapping its traceback: the apply's own (kept by the
        micro-batch that raised it), else a source error found in ``exc``."""
        for error in self._failures.values():
            raise error
        _raise_source_error(exc)

    def run(self, once: bool = False, stop_on_signals: bool = False) -> RunSummary:
        """Start the pipeline's query over every source; with ``once``, drain what is
        there and return. A query that fails because the warehouse's store throttles or
        does not answer is started again from its checkpoint, within
        ``apply.store_outage_budget_s`` (:mod:`cdcflow.runtime.store_outage`); so is one
        whose Spark Python worker was late to start, a few times
        (:mod:`cdcflow.runtime.late_worker`).

        Args:
            once: drain what the topics hold now, then return.
            stop_on_signals: SIGINT (Ctrl-C) and SIGTERM stop the query while it runs, and
                the running apply ends, before :class:`Interrupted` is raised (the command
                line's clean stop; a second signal interrupts at once). Only from the main
                thread; the previous handlers are put back when the run ends.

        Raises:
            Interrupted: stopped by a signal (with ``stop_on_signals``), once the last
                micro-batch's apply has ended.
            CdcflowError: a micro-batch's apply failed with one (e.g. ``StorageError``:
                the warehouse cannot be written, or its store failed for longer than
                ``apply.store_outage_budget_s``; ``LeaseLost``).
            SourceError: the query failed on an error of the Kafka source (e.g.
                ``SOURCE_UNAVAILABLE``: the brokers stayed unreachable for
                ``kafka.outage_budget_s``; ``DATA_LOSS``), chained to Spark's exception.
            pyspark StreamingQueryException: the query failed otherwise (its cause is
                logged); the checkpoint keeps the last committed batch, so a restart
                resumes there.
        """
        outage = self._outage = StoreOutage(
            self.config.apply.store_outage_budget_s, self.config.warehouse, self.progress.write
        )
        late_worker = self._late_worker = LateWorker(
            self.progress.write, sleep=lambda s: _wait(s, stop_on_signals)
        )
        try:
            while True:
                try:
                    return self._run_query(once, stop_on_signals)
                except StorageError as exc:
                    delay = outage.failed(exc)  # raises when no wait mends it
                    if self._metrics is not None:
                        self._metrics.store_restarted(exc.kind, outage.elapsed_s())
                    self._failures.clear()
                    _wait(delay, stop_on_signals)
                except CdcflowError:
                    raise
                except Exception as exc:
                    if not late_worker.failed(exc):  # waits before it says yes
                        raise
                    self._failures.clear()
                if self.fence is not None:
                    self.fence()  # a lease lost meanwhile ends the run here
        finally:
            self._unmonitor()

    def _store_answers(self) -> None:
        """A micro-batch applied: a warehouse outage, if one was under way, is over, and
        the late worker's restarts count from zero again."""
        if self._late_worker is not None:
            self._late_worker.ok()
        outage = self._outage
        if outage is not None and outage.since is not None:
            outage.ok()
            if self._metrics is not None:
                self._metrics.store_restarted(None, 0.0)

    def _run_query(self, once: bool, stop_on_signals: bool) -> RunSummary:
        """One query of :meth:`run`, from its start to its end or failure."""
        try:
            query = self._start(once=once)
        except BaseException:
            self._unfollow()
            raise
        restore = _stop_on_signals(query) if stop_on_signals else None
        try:
            try:
                query.awaitTermination()
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM: stop; the running apply ends
                _stop_queries([query])
                self._settle()
                raise
            except Exception as exc:
                _stop_queries([query])
                self._settle()
                self._raise_failure(exc)
                raise
            finally:
                _stop_queries([query])
            assert self._lane is not None  # _start made the lane before it returned
            self._lane.wait()  # the last micro-batch's apply
        finally:
            self._unfollow()  # its line, after the last apply
            if restore is not None:
                signum = restore()
                if signum is not None and query.exception() is None:
                    raise Interrupted(signum)
        failure = query.exception()
        if failure is not None:
            self._raise_failure(failure)
            raise failure
        return self.summary

    def _settle(self) -> None:
        """Let a failed query's running apply finish (it was durable already); its own
        error, if any, is kept in ``_failures`` when it is cdcflow's, and raised by
        :meth:`_raise_failure` before the query's."""
        lane = self._lane
        if lane is None:
            return
        try:
            lane.wait()
        except Exception as exc:  # noqa: BLE001 - the query's failure is raised instead
            log.warning("the running apply failed too: %s", exc)


def _silent(line: str) -> None:
    """The console of a pipeline run without one (the Python API's default)."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal (:meth:`Pipeline.run` with ``stop_on_signals``), after its
    running apply ended; ``signum`` is the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _wait(seconds: float, stop_on_signals: bool) -> None:
    """Sleep between two queries of a run; with ``stop_on_signals`` (from the main thread)
    SIGINT and SIGTERM end the wait with :class:`Interrupted`, as they end a query."""
    import signal

    if not stop_on_signals or threading.current_thread() is not threading.main_thread():
        time.sleep(seconds)
        return

    def stop(signum, frame) -> None:
        raise Interrupted(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        time.sleep(seconds)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_on_signals(query) -> Callable[[], int | None]:
    """Make SIGINT and SIGTERM stop ``query`` from a thread of their own (not inside a py4j
    call of the main thread, which would leave tracebacks of a half-done call and a JVM
    that stops answering). A second signal raises ``KeyboardInterrupt`` at once.

    Returns:
        A function that puts the previous handlers back and returns the signal received
        (``None``: none).
    """
    import signal

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    received: list[int] = []

    def stop(signum, frame) -> None:
        if received:
            raise KeyboardInterrupt(f"signal {signum}")
        received.append(signum)
        threading.Thread(target=_stop_queries, args=([query],), daemon=True).start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> int | None:
        for s, handler in previous.items():
            signal.signal(s, handler)
        return received[0] if received else None

    return restore


def _stop_queries(queries) -> None:
    """Stop the queries still active. On the way out of Ctrl-C or SIGTERM the signal can
    cut a py4j call in half and the gateway then stops answering (``Py4JNetworkError:
    Answer from Java side is empty``); that must not hide the interrupt (exit 130) under a
    traceback (exit 1), so a query that cannot be stopped is logged and left to the JVM's
    own shutdown."""
    for query in queries:
        try:
            if query.isActive:
                query.stop()
        except Exception as exc:  # noqa: BLE001 - the JVM is going away with the process
            log.info("could not stop a streaming query: %s", exc)


def _raise_source_error(exc: BaseException) -> None:
    """Raise the SourceError a failed query carries (see :func:`source_error_of`), if any."""
    error = source_error_of(exc)
    if error is not None:
        raise error from exc

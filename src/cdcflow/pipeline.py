"""The streaming job: Kafka -> decode (Spark, mapInArrow) -> apply (Delta, per micro-batch).

One Structured Streaming query per configured source::

    kafka source ──► mapInArrow(decode) ──► foreachBatch: toArrow ──► BatchApplier.apply
    (Spark)           (executors)            (driver)                (delta-rs commits)

Exactly once: Spark's checkpoint fixes each micro-batch's offsets before it runs; a
batch re-run after a crash gets the same ``batch_id`` and the same records, and every
Delta commit of that batch is skipped where its application transaction is already
recorded (see :mod:`cdcflow.sinks.delta`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from cdcflow.apply.batch import BatchApplier, BatchReport, Router
from cdcflow.apply.events import EVENT_SCHEMA, DecodeFunction
from cdcflow.config import PipelineConfig, SourceConfig
from cdcflow.sinks.delta import DeltaWarehouse

__all__ = ["Pipeline", "RunSummary", "spark_event_schema"]

log = logging.getLogger(__name__)


def spark_event_schema():
    """:data:`EVENT_SCHEMA` as a Spark ``StructType``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(EVENT_SCHEMA)


@dataclass
class RunSummary:
    """Totals over the batches a run applied, per source."""

    reports: dict[str, list[BatchReport]] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        out = {"batches": 0, "records": 0, "events": 0, "skipped": 0, "dead_letters": 0}
        for reports in self.reports.values():
            for r in reports:
                out["batches"] += 1
                out["records"] += r.records
                out["events"] += r.events
                out["skipped"] += sum(r.skipped.values())
                out["dead_letters"] += sum(r.dead_letters.values())
        return out


class Pipeline:
    """Runs the configured sources as streaming queries.

    Args:
        config: the validated configuration.
        spark: a SparkSession; default: :func:`cdcflow.spark.get_or_create_session`.
        on_batch: called with ``(source_name, report)`` after every applied batch.
        kafka_engine: ``"auto"`` (Spark's JVM Kafka source if present, else the Python
            source with decoding fused into the read), ``"jvm"``, ``"python"`` (fused), or
            ``"python-mapinarrow"`` (raw Python source + ``mapInArrow``, for comparison).
        staging: on local Spark with the Python source, decode tasks hand their events to
            the driver as memory-mapped Arrow files instead of through the JVM (see
            :mod:`cdcflow.source.changes`).
    """

    def __init__(
        self,
        config: PipelineConfig,
        spark=None,
        on_batch: Callable[[str, BatchReport], None] | None = None,
        kafka_engine: str = "auto",
        staging: bool = True,
    ) -> None:
        self.config = config
        self.kafka_engine = kafka_engine
        self.staging = staging
        if spark is None:
            from cdcflow.spark import get_or_create_session

            spark = get_or_create_session(app_name=f"cdcflow-{config.pipeline_id}")
        self.spark = spark
        self.on_batch = on_batch
        self.summary = RunSummary()

    def warehouse_for(self, source: SourceConfig) -> DeltaWarehouse:
        """The warehouse view of one source: its own application-transaction id."""
        return DeltaWarehouse(
            self.config.warehouse, pipeline_id=f"{self.config.pipeline_id}.{source.name}"
        )

    def _decode_function(self, source: SourceConfig) -> DecodeFunction:
        wh = self.warehouse_for(source)
        return DecodeFunction(
            source.format,
            dict(source.options),
            state_path=wh.system_path("decoder_state"),
            state_key=wh.pipeline_id,
        )

    def _decoded_stream(self, source: SourceConfig, options: dict[str, str], staging: str | None):
        """Decoded events as a streaming DataFrame of EVENT_SCHEMA rows.

        On the Python Kafka source, decoding is fused into the read (``cdcflow_changes``:
        one JVM round trip fewer); on Spark's JVM Kafka source it is a ``mapInArrow``.
        """
        from cdcflow.source.kafka import jvm_kafka_available, read_stream

        jvm = self.kafka_engine == "jvm" or (
            self.kafka_engine == "auto" and jvm_kafka_available(self.spark)
        )
        if jvm or self.kafka_engine == "python-mapinarrow":
            raw = read_stream(self.spark, options, engine="jvm" if jvm else "python")
            return raw.mapInArrow(self._decode_function(source), spark_event_schema())
        from cdcflow.model import dumps
        from cdcflow.source.changes import FORMAT

        wh = self.warehouse_for(source)
        fused = {
            **options,
            "cdcflow.format": source.format,
            "cdcflow.formatOptions": dumps(dict(source.options)).decode(),
            "cdcflow.statePath": wh.system_path("decoder_state"),
            "cdcflow.stateKey": wh.pipeline_id,
        }
        if staging is not None:
            fused["cdcflow.stagingPath"] = staging
        return self.spark.readStream.format(FORMAT).options(**fused).load()

    def _staging_path(self, source: SourceConfig) -> str | None:
        """Where decode tasks stage event files: only for local Spark on the Python source.

        Local Spark's executors share the driver's file system; on a cluster the events
        travel through Spark instead (no shared staging folder is assumed).
        """
        if self.kafka_engine not in ("auto", "python") or not self.staging:
            return None
        master = self.spark.sparkContext.master
        if not master.startswith("local"):
            return None
        return os.path.join(self.config.checkpoint, source.name, "staging")

    def _start(self, source: SourceConfig, once: bool):
        from cdcflow.formats import decoder_for

        # the format's options are checked here, on the driver, so a bad option is a
        # ConfigError naming the key instead of a failure inside a Spark task
        decoder_for(source.format, dict(source.options) or None)

        options = self.config.kafka.reader_options()
        if source.topics:
            options["subscribe"] = ",".join(source.topics)
        else:
            assert source.topic_pattern is not None
            options["subscribePattern"] = source.topic_pattern
        staging = self._staging_path(source)
        decoded = self._decoded_stream(source, options, staging)
        if staging is not None and os.path.isdir(staging):
            shutil.rmtree(staging)  # no batch is in flight before the query starts
        applier = BatchApplier(
            self.warehouse_for(source),
            Router(self.config.target_template),
            tables=self.config.tables,
            tombstone_retention_hours=self.config.apply.tombstone_retention_hours,
            transactions=self.config.apply.transaction_policy(),
        )
        reports = self.summary.reports.setdefault(source.name, [])
        on_batch = self.on_batch

        def apply_batch(df, batch_id: int) -> None:
            if staging is not None:
                from cdcflow.source.changes import read_staged

                manifest = df.toArrow()
                events = read_staged(manifest)
            else:
                events = df.toArrow()
            report = applier.apply(events, batch_id)
            if staging is not None:
                del events
                for path in manifest["staged_path"].to_pylist():
                    os.remove(path)
            reports.append(report)
            log.info("source %s batch %s: %s", source.name, batch_id, report.as_dict())
            if on_batch is not None:
                on_batch(source.name, report)

        writer = (
            decoded.writeStream.queryName(f"cdcflow-{self.config.pipeline_id}-{source.name}")
            .foreachBatch(apply_batch)
            .option("checkpointLocation", os.path.join(self.config.checkpoint, source.name))
        )
        if once or self.config.trigger == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=self.config.trigger_interval)
        return writer.start()

    def run(self, once: bool = False) -> RunSummary:
        """Start every source; with ``once``, drain what is there and return.

        Raises:
            pyspark StreamingQueryException: a query failed (its cause is logged); the
                checkpoint keeps the last committed batch, so a restart resumes there.
        """
        if once:
            # sources one after another: each drains, then the next starts
            for source in self.config.sources:
                query = self._start(source, once=True)
                query.awaitTermination()
                if query.exception() is not None:
                    raise query.exception()
            return self.summary
        queries = [self._start(s, once=False) for s in self.config.sources]
        try:
            self.spark.streams.awaitAnyTermination()
        finally:
            for q in queries:
                if q.isActive:
                    q.stop()
        return self.summary

"""Running a pipeline the one safe way: under its lease, whoever calls it.

:func:`run` is what ``cdcflow run`` does, as a library call: it takes the pipeline's lease
before Spark starts (a second run of the same ``pipeline_id`` and warehouse is refused at
once), fences every micro-batch's apply on it, stops the streaming queries when the lease
is lost, and releases it on every way out. ``Pipeline(config).run()`` stays the bare
engine under it (tests, the demo's own warehouse). See docs/decisions.md (21).
"""

from __future__ import annotations

import logging
from pathlib import Path

from cdcflow.config import PipelineConfig, load_config
from cdcflow.errors import LeaseLost
from cdcflow.runtime.pipeline import Pipeline, RunSummary
from cdcflow.runtime.preflight import preflight, raise_first_failure
from cdcflow.runtime.progress import ProgressReporter
from cdcflow.sinks.lease import PipelineLease

__all__ = ["run"]

log = logging.getLogger(__name__)


def _stop_streams(spark) -> None:
    """Stop every streaming query of the session (the lease was lost: stop writing)."""
    for query in spark.streams.active:
        try:
            query.stop()
        except Exception:  # stopping the others matters more
            log.exception("could not stop streaming query %s", query.name)


def run(
    config: PipelineConfig | str | Path,
    *,
    once: bool = False,
    progress: ProgressReporter | None = None,
    spark=None,
    stop_on_signals: bool = False,
) -> RunSummary:
    """Run the pipeline of ``config`` (a loaded configuration or a YAML file's path) under
    its lease; with ``once``, drain what the topics hold now and return.

    Args:
        config: the configuration, or its YAML file.
        once: drain what the topics hold now, then return (``Trigger.AvailableNow``).
        progress: told every micro-batch (``cdcflow run``'s console lines).
        spark: the SparkSession to run on (a notebook's, a job's); default: one that
            cdcflow creates (:func:`cdcflow.runtime.spark.get_or_create_session`).
        stop_on_signals: Ctrl-C and SIGTERM stop the run cleanly (from the main thread):
            the running apply ends, the lease is released, then
            :class:`~cdcflow.runtime.pipeline.Interrupted` is raised.

    Returns:
        The run's totals per source.

    Raises:
        ConfigError: the configuration is invalid (a path is loaded first), or librdkafka
            refuses a ``kafka.options`` setting (before Spark starts).
        LeaseHeld: another run holds the pipeline's lease (before Spark starts).
        SourceError: ``SOURCE_UNAVAILABLE``: the brokers did not answer within
            ``kafka.startup_timeout_s`` (before Spark starts).
        StorageError: the warehouse or the checkpoint cannot be written.
        LeaseLost: this run's lease was taken over; its queries were stopped.
        CdcflowError, SourceError: as :meth:`cdcflow.runtime.pipeline.Pipeline.run`.
    """
    config_path = "CONFIG"  # named in the fixes of error messages
    if not isinstance(config, PipelineConfig):
        config_path = str(config)
        config = load_config(config)
    with PipelineLease(
        config.warehouse, config.pipeline_id, storage_options=config.storage
    ) as lease:
        # the brokers, the topics and the folders, in seconds, before Spark's start
        raise_first_failure(preflight(config))

        pipeline = Pipeline(
            config,
            on_batch=lambda source, report: lease.fence(),  # fail the query: no further batch
            spark=spark,
            config_path=config_path,
            fence=lease.fence,  # before an apply's first commit and its completion
            progress=progress,
        )
        lease.on_lost = lambda reason: _stop_streams(pipeline.spark)
        lease.fence()  # lost while Spark started
        try:
            summary = pipeline.run(once=once, stop_on_signals=stop_on_signals)
        except Exception as exc:
            if lease.lost:
                raise LeaseLost(lease.lost_reason or "") from exc
            raise
        lease.fence()
    return summary

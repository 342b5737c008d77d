"""cdcflow in the user's own Spark job or notebook.

::

    import cdcflow

    pipeline = cdcflow.Pipeline("pipeline.yaml", spark=spark)   # or a loaded config
    pipeline.run(once=True)        # under the pipeline's lease, as `cdcflow run --once`
    pipeline.status()              # what `cdcflow status` prints, as data

    changes = cdcflow.read_changes(spark, "pipeline.yaml")   # the decoded change stream
    changes.writeStream.format("console").start()

Both run on the user's SparkSession. Spark starts its Python workers with the session's
interpreter (``PYSPARK_PYTHON``, else ``python3`` on the PATH); on local Spark, when that
interpreter cannot import cdcflow (a virtual environment that is not activated), the
workers are pointed at this interpreter instead
(:func:`cdcflow.runtime.spark.workers_import_cdcflow`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cdcflow.commands.status import status
from cdcflow.config import PipelineConfig, load_config
from cdcflow.runtime.pipeline import Pipeline as Engine
from cdcflow.runtime.pipeline import RunSummary
from cdcflow.runtime.progress import ProgressReporter
from cdcflow.runtime.runner import run

__all__ = ["Pipeline", "read_changes"]


def _config(config: PipelineConfig | str | Path) -> tuple[PipelineConfig, str]:
    if isinstance(config, PipelineConfig):
        return config, "CONFIG"
    return load_config(config), str(config)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _silent(line: str) -> None:
    """No console."""


class Pipeline:
    """A pipeline on the user's SparkSession, run the one safe way: under its lease.

    Args:
        config: the configuration, or its YAML file.
        spark: the SparkSession (default: one cdcflow creates).
        progress: ``True`` prints a line per micro-batch on stderr, as ``cdcflow run``
            does; a callable takes each line; ``False`` (default) is silent.

    Raises:
        ConfigError: the configuration is invalid (one line naming the key).
    """

    def __init__(
        self,
        config: PipelineConfig | str | Path,
        spark: Any = None,
        progress: bool | Callable[[str], None] = False,
    ) -> None:
        self.config, self.config_path = _config(config)
        self.spark = spark
        write: Callable[[str], None] = _silent
        if progress is True:
            write = _stderr
        elif callable(progress):
            write = progress
        #: the console of the last run (its summary: ``self.progress.summary()``)
        self.progress = ProgressReporter(write)

    def run(self, once: bool = False) -> RunSummary:
        """Run under the pipeline's lease (:func:`cdcflow.runtime.runner.run`): with ``once``,
        drain what the topics hold now and return; else run until stopped (Ctrl-C in a
        notebook interrupts it; the lease is released on the way out).

        Raises:
            LeaseHeld: another run of the pipeline holds the lease (before Spark work).
            ConfigError, SourceError, StorageError, LeaseLost: as ``cdcflow run``.
        """

        self.progress = ProgressReporter(self.progress.write)
        return run(self.config, once=once, progress=self.progress, spark=self.spark)

    def status(self) -> Any:
        """The warehouse's view of the pipeline (:class:`cdcflow.commands.status.Status`), without
        asking the brokers."""

        return status(self.config.warehouse, self.config.pipeline_id)


def read_changes(
    spark: Any, config: PipelineConfig | str | Path, sources: Sequence[str] | None = None
) -> Any:
    """The decoded change events of the configuration's sources as a streaming DataFrame.

    Its rows are :data:`cdcflow.event_schema.EVENT_SCHEMA` (``op``, ``database``,
    ``schema``, ``table``, ``key``, ``before``, ``after`` as JSON text, ``seq``,
    ``ts_ms``, Kafka ``topic``/``partition``/``offset``, and ``kind``: event, skip or
    dead letter with its ``reason``). Nothing is applied and no lease is taken: the
    caller's query, with its own checkpoint, decides what happens to them; it starts at
    ``kafka.starting_offsets``.

    Args:
        spark: the SparkSession.
        config: the configuration, or its YAML file.
        sources: the names of the sources to read (default: all).

    Raises:
        ConfigError: the configuration is invalid, or names no such source.
    """

    config, path = _config(config)
    if sources is not None:
        chosen = tuple(config.source_named(s, "read_changes: source") for s in sources)
        config = config.model_copy(update={"sources": chosen})
    engine = Engine(config, spark=spark, config_path=path)
    routing = engine.routing()
    options = config.kafka.reader_options()
    options.update(routing.subscription())
    return engine._decoded_stream(routing, options, staging=None)

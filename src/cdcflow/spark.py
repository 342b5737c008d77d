"""SparkSession set-up for the embedded default (local Spark)."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

__all__ = ["get_or_create_session"]


def get_or_create_session(app_name: str = "cdcflow", master: str | None = None):
    """A SparkSession tuned for a small machine (cdcflow's data sources are registered
    where they are used: :class:`~cdcflow.pipeline.Pipeline`, :func:`cdcflow.source.kafka.read_stream`).

    Args:
        app_name: Spark application name.
        master: Spark master URL; default ``local[2]`` (or ``$CDCFLOW_SPARK_MASTER``).

    Returns:
        ``pyspark.sql.SparkSession``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark 4.3 warns about pandas 3 on import of its pandas helpers; cdcflow uses Arrow.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    master = master or os.environ.get("CDCFLOW_SPARK_MASTER", "local[2]")
    log4j = Path(__file__).with_name("log4j2.properties")
    java_opts = f"-Dlog4j.configurationFile=file:{log4j}"
    session = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.adaptive.enabled", "false"
        )  # not used by streaming; avoids a warning per query
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.driver.memory", os.environ.get("CDCFLOW_DRIVER_MEMORY", "4g"))
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    return session

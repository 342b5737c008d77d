"""SparkSession set-up for the embedded default (local Spark)."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

__all__ = ["get_or_create_session"]

#: dependencies of Delta Lake's Spark jars that Spark's own jars already hold (in newer
#: versions): left out of ``spark.jars.packages``
_PROVIDED_BY_SPARK = (
    "org.slf4j:slf4j-api",
    "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.fasterxml.jackson.core:jackson-annotations",
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common",
    "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures",
    "org.apache.parquet:parquet-jackson",
    "org.xerial.snappy:snappy-java",
    "io.airlift:aircompressor",
    "com.google.code.findbugs:jsr305",
    "org.roaringbitmap:RoaringBitmap",
    "org.locationtech.jts:jts-core",
)


def get_or_create_session(
    app_name: str = "cdcflow", master: str | None = None, delta_spark: bool = False
):
    """A SparkSession tuned for a small machine (cdcflow's data sources are registered
    where they are used: :class:`~cdcflow.pipeline.Pipeline`, :func:`cdcflow.source.kafka.read_stream`).

    Args:
        app_name: Spark application name.
        master: Spark master URL; default ``local[2]`` (or ``$CDCFLOW_SPARK_MASTER``).
        delta_spark: with Delta Lake's Spark jars and session extension (``sink:
            delta-spark``): the jars of the installed ``delta-spark`` are fetched from
            Maven Central by Spark (``spark.jars.packages``, cached in ``~/.ivy2.5.2``)
            when the session starts. Ignored by a session that is already running.

    Returns:
        ``pyspark.sql.SparkSession``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark warns about pandas 3 on import of its pandas helpers; cdcflow uses Arrow.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    master = master or os.environ.get("CDCFLOW_SPARK_MASTER", "local[2]")
    log4j = Path(__file__).with_name("log4j2.properties")
    java_opts = f"-Dlog4j.configurationFile=file:{log4j}"
    builder = (
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
    )
    if delta_spark:
        from delta import configure_spark_with_delta_pip

        from cdcflow.sinks.delta_spark import DELTA_EXTENSION

        builder = configure_spark_with_delta_pip(
            builder.config("spark.sql.extensions", DELTA_EXTENSION)
            .config(
                "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
            )
            # the log of a mirror is small: 50 partitions (the default) to read it cost
            # more than the merge on 2 cores
            .config("spark.databricks.delta.snapshotPartitions", "2")
            # what Spark ships itself (newer) is not fetched again beside Delta's jars
            .config("spark.jars.excludes", ",".join(_PROVIDED_BY_SPARK))
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

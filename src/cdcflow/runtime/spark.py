"""SparkSession set-up for the embedded default (local Spark)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from cdcflow.config import load_config
from cdcflow.runtime.hadoop import HADOOP_AWS_PACKAGE
from cdcflow.secrets import SECRET_KEY_PATTERN
from cdcflow.sinks.s3a import checkpoint_on_store

log = logging.getLogger(__name__)

__all__ = [
    "workers_import_cdcflow",
    "DELTA_PACKAGE",
    "PROVIDED_BY_SPARK",
    "SUBMIT_MAIN",
    "delta_submit_args",
    "get_or_create_session",
]

#: what Spark masks in plans, the UI and logs: the words whose values cdcflow masks
#: (:func:`cdcflow.secrets.is_secret_key`: Spark's default secret|password|token|access.key,
#: and the storage options' account, SAS and service-account keys)
SPARK_REDACTION_REGEX = f"(?i){SECRET_KEY_PATTERN}"
#: the application file for ``spark-submit`` (cdcflow's command line)
SUBMIT_MAIN = Path(__file__).parents[1] / "submit" / "cdcflow_main.py"

#: Delta Lake's Spark jars for ``sink: delta-spark`` (the installed delta-spark's version,
#: built for Spark 4.2)
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"

#: dependencies of Delta Lake's Spark jars that Spark's own jars already hold (in newer
#: versions): left out of ``spark.jars.packages``
PROVIDED_BY_SPARK = (
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
    app_name: str = "cdcflow",
    master: str | None = None,
    delta_spark: bool = False,
    ui: bool = False,
    checkpoint_on_s3: bool = False,
):
    """A SparkSession tuned for a small machine (cdcflow's data sources are registered
    where they are used: :class:`~cdcflow.runtime.pipeline.Pipeline`, :func:`cdcflow.source.kafka.datasource.read_stream`).

    Args:
        app_name: Spark application name.
        master: Spark master URL; default ``$CDCFLOW_SPARK_MASTER``, else the one
            ``spark-submit --master`` gave (when ``spark-submit`` started this process),
            else ``local[2]``.
        delta_spark: with Delta Lake's Spark jars and session extension (``sink:
            delta-spark``): the jars of the installed ``delta-spark`` are fetched from
            Maven Central by Spark (``spark.jars.packages``, cached in ``~/.ivy2.5.2``)
            when the session starts. Ignored by a session that is already running.
        ui: Spark's web UI (``monitoring.spark_ui``); off by default, as it costs memory
            and a port. Ignored by a session that is already running.
        checkpoint_on_s3: with Hadoop's S3A connector (:data:`~cdcflow.runtime.hadoop.HADOOP_AWS_PACKAGE`,
            fetched like Delta's jars), for a checkpoint on S3 (:mod:`cdcflow.runtime.hadoop`).
            Ignored by a session that is already running.

    Returns:
        ``pyspark.sql.SparkSession``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark warns about pandas 3 on import of its pandas helpers; cdcflow uses Arrow.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    # spark-submit starts the JVM first and tells PySpark its port: its --master, --packages
    # and --conf stand, and only an explicit master here overrides them
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    master = master or os.environ.get("CDCFLOW_SPARK_MASTER") or (None if submitted else "local[2]")
    log4j = Path(__file__).parents[1] / "log4j2.properties"
    java_opts = f"-Dlog4j.configurationFile=file:{log4j}"
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    builder = (
        builder.config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.adaptive.enabled", "false"
        )  # not used by streaming; avoids a warning per query
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.driver.memory", os.environ.get("CDCFLOW_DRIVER_MEMORY", "4g"))
        .config("spark.python.worker.reuse", "true")
        .config("spark.redaction.regex", SPARK_REDACTION_REGEX)
    )
    packages = [HADOOP_AWS_PACKAGE] if checkpoint_on_s3 else []
    if packages and not delta_spark:
        builder = builder.config("spark.jars.packages", ",".join(packages))
    if delta_spark:
        from delta import configure_spark_with_delta_pip

        # deferred: deltalake (~0.6 s), only for a session with Delta
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
            .config("spark.jars.excludes", ",".join(PROVIDED_BY_SPARK)),
            extra_packages=packages,
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def delta_submit_args(checkpoint_on_s3: bool = False) -> list[str]:
    """The ``spark-submit`` arguments that give a cdcflow run the ``delta-spark`` sink:
    Delta Lake's jars (without the dependencies Spark already ships, which also spares
    copying them to every executor) and its session extension and catalog; with
    ``checkpoint_on_s3``, Hadoop's S3A connector too (:mod:`cdcflow.runtime.hadoop`)."""
    # deferred: deltalake (~0.6 s), only for a session with Delta
    from cdcflow.sinks.delta_spark import DELTA_EXTENSION

    packages = [DELTA_PACKAGE, *([HADOOP_AWS_PACKAGE] if checkpoint_on_s3 else [])]
    return [
        "--packages",
        ",".join(packages),
        "--exclude-packages",
        ",".join(PROVIDED_BY_SPARK),
        "--conf",
        f"spark.sql.extensions={DELTA_EXTENSION}",
        "--conf",
        "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
    ]


def _main(argv: list[str]) -> str:
    """``python -m cdcflow.runtime.spark [CONFIG]``: the spark-submit arguments of a run
    (of CONFIG's, when given: its checkpoint on S3 adds the S3A connector), then the
    application file, so that ``spark-submit --master URL $(python -m cdcflow.runtime.spark
    pipeline.yaml) run pipeline.yaml`` runs cdcflow."""
    on_s3 = bool(argv) and checkpoint_on_store(load_config(argv[0]).checkpoint)
    return " ".join([*delta_submit_args(on_s3), str(SUBMIT_MAIN)])


if __name__ == "__main__":
    print(_main(sys.argv[1:]))


def workers_import_cdcflow(spark: Any) -> None:
    """Make local Spark's Python workers run an interpreter that imports cdcflow.

    A session built without ``PYSPARK_PYTHON`` starts ``python3`` from the PATH, which in
    a notebook or a job whose virtual environment is not activated lacks cdcflow (the
    data source's worker then fails with ``ModuleNotFoundError: cdcflow``). On a local
    master whose worker interpreter is not this one and cannot import cdcflow, the
    session's worker interpreter becomes ``sys.executable`` (for the Python functions
    registered from now on). A cluster's workers are left alone: install cdcflow there
    (``python -m cdcflow.runtime.spark`` prints spark-submit's arguments).
    """
    sc = spark.sparkContext
    if not sc.master.startswith("local") or sc.pythonExec == sys.executable:
        return
    try:
        probe = subprocess.run(
            [sc.pythonExec, "-c", "import cdcflow"], capture_output=True, timeout=60
        )
        ok = probe.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        log.info(
            "Spark's Python workers (%s) cannot import cdcflow; using %s",
            sc.pythonExec,
            sys.executable,
        )
        sc.pythonExec = sys.executable

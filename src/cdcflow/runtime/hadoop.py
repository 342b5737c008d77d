"""Spark's checkpoint on S3: Hadoop's S3A connector and its settings from ``storage:``.

Spark writes a streaming query's checkpoint through Hadoop's file systems, not delta-rs.
A checkpoint on S3 (``checkpoint: s3://bucket/prefix``, on the warehouse's store) is
written by Hadoop's S3A connector (``hadoop-aws``, the version of the Hadoop client that
PySpark ships, with the AWS SDK bundle it depends on), fetched from Maven Central when
the session starts, as Delta's jars are for ``sink: delta-spark``.

S3A takes the credentials, endpoint and region of the ``storage:`` section
(:data:`cdcflow.sinks.s3a.S3A_KEYS`), set per bucket (``fs.s3a.bucket.<bucket>.*``) on the session's Hadoop
configuration, so a warehouse's and another bucket's settings never mix. With none given,
S3A's default credential chain applies (the ``AWS_*`` variables, the profile, the
instance's role), as delta-rs's does. A key that changes how S3 is reached and has no S3A
setting here (a role to assume, a profile, server-side encryption) is refused at load
(:func:`cdcflow.sinks.s3a.check_checkpoint_options`): set it with ``spark.hadoop.fs.s3a.*`` yourself and
give the key to delta-rs only, or keep the checkpoint in a folder.

Spark's checkpoint manager stays Spark's default (FileContext: write a temporary file,
then rename it, which S3A does as copy and delete): the non-renaming manager of Spark's
``spark-hadoop-cloud`` module is not published for Spark 4.2 (decision 67). A micro-batch
writes two small files (``offsets/<id>``, ``commits/<id>``); the warehouse, not the
checkpoint, holds the applied offsets, so a checkpoint lost or damaged loses nothing.

Source documents: Hadoop's "Hadoop-AWS module: Integration with Amazon Web Services"
(S3A's configuration, per-bucket settings), Spark's "Integration with Cloud
Infrastructures".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from cdcflow.errors import ConfigError
from cdcflow.sinks.s3a import S3A_KEYS

__all__ = [
    "HADOOP_AWS_PACKAGE",
    "hadoop_uri",
    "s3a_settings",
    "use_checkpoint_store",
]

#: Hadoop's S3A connector, the version of the Hadoop client PySpark 4.2 ships
#: (``pyspark/jars/hadoop-client-api-3.5.0.jar``); it brings the AWS SDK v2 bundle
HADOOP_AWS_PACKAGE = "org.apache.hadoop:hadoop-aws:3.5.0"


def hadoop_uri(uri: str) -> str:
    """``uri`` as Hadoop names it: ``s3://`` and ``s3a://`` are S3A's ``s3a://``."""
    scheme, sep, rest = uri.partition("://")
    return f"s3a://{rest}" if sep and scheme.lower() in ("s3", "s3a") else uri


def s3a_settings(uri: str, options: Mapping[str, str]) -> dict[str, str]:
    """The Hadoop settings that let S3A reach ``uri``'s bucket as delta-rs does.

    Args:
        uri: an ``s3://`` or ``s3a://`` URI.
        options: the ``storage:`` options (delta-rs's keys, case-insensitive).

    Returns:
        ``{"fs.s3a.bucket.<bucket>.<setting>": value}``; empty when nothing is given (S3A's
        default credential chain and endpoint).
    """
    bucket = urlsplit(hadoop_uri(uri)).netloc
    low = {k.lower(): v for k, v in options.items()}
    out: dict[str, str] = {}
    for key, value in low.items():
        if key in S3A_KEYS:
            out[S3A_KEYS[key]] = value
    endpoint = out.get("endpoint")
    if endpoint is not None:
        out["connection.ssl.enabled"] = "false" if endpoint.startswith("http://") else "true"
        # object_store addresses a custom endpoint's buckets by path unless told otherwise
        virtual = low.get(
            "aws_virtual_hosted_style_request", low.get("virtual_hosted_style_request")
        )
        out["path.style.access"] = "false" if str(virtual).lower() == "true" else "true"
    if "session.token" in out:
        out["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return {f"fs.s3a.bucket.{bucket}.{k}": v for k, v in out.items()}


def use_checkpoint_store(spark: Any, uri: str, options: Mapping[str, str]) -> None:
    """Give a running session what it needs to keep its checkpoint at ``uri``.

    Sets :func:`s3a_settings` on the session's Hadoop configuration (the driver writes the
    checkpoint; its executors never read it).

    Raises:
        ConfigError: the session has no S3A connector (a session started without
            :data:`HADOOP_AWS_PACKAGE`, e.g. a notebook's): one line with the fix.
    """
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    try:  # Hadoop's own look-up, through the class loader that has Spark's added jars
        spark.sparkContext._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3a", conf)
    except Exception as exc:  # py4j's error of a missing class
        raise ConfigError(
            f"checkpoint: {uri} needs Hadoop's S3A connector in Spark: start the session with "
            f"spark.jars.packages={HADOOP_AWS_PACKAGE} (spark-submit: the arguments "
            "`python -m cdcflow.runtime.spark CONFIG` prints), or give the checkpoint a "
            "local folder"
        ) from exc
    for key, value in s3a_settings(uri, options).items():
        conf.set(key, value)

"""Spark's checkpoint on S3 (cdcflow.runtime.hadoop, cdcflow.runtime.checkpoint): the
storage: options S3A is given, the checkpoint's files read and written on a real S3 server
(moto's, started by the test kit), and the start-up probe of the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdcflow.config import parse_config
from cdcflow.errors import StorageError
from cdcflow.runtime.checkpoint import FINGERPRINT_FILE, Checkpoint, Fingerprint
from cdcflow.runtime.hadoop import HADOOP_AWS_PACKAGE, hadoop_uri, s3a_settings
from cdcflow.runtime.preflight import preflight
from cdcflow.sinks.storage import Storage


def _config(**overrides):
    base = {
        "warehouse": "s3://lake/cdcflow",
        "checkpoint": "/tmp/ck",
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "sources": [{"format": "debezium-json", "topics": ["t"]}],
    }
    return parse_config({**base, **overrides})


def test_a_checkpoint_on_s3_takes_the_warehouses_credentials_endpoint_and_region():
    config = _config(
        checkpoint="s3://lake/ck",
        storage={
            "AWS_ACCESS_KEY_ID": "AKIA1",
            "aws_secret_access_key": "s3cr3t",
            "aws_endpoint_url": "http://127.0.0.1:9000",
            "aws_region": "eu-west-1",
            "aws_allow_http": True,
            "max_retries": 3,
        },
    )
    assert hadoop_uri(config.checkpoint) == "s3a://lake/ck"
    assert s3a_settings(config.checkpoint, config.storage) == {
        "fs.s3a.bucket.lake.access.key": "AKIA1",
        "fs.s3a.bucket.lake.secret.key": "s3cr3t",
        "fs.s3a.bucket.lake.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.bucket.lake.endpoint.region": "eu-west-1",
        "fs.s3a.bucket.lake.connection.ssl.enabled": "false",
        "fs.s3a.bucket.lake.path.style.access": "true",
    }
    # AWS itself: the session's token picks S3A's provider of temporary credentials, and
    # virtual-hosted addressing stays S3A's
    temporary = {"aws_session_token": "t0k", "aws_virtual_hosted_style_request": "true"}
    assert s3a_settings("s3a://lake/ck", {**temporary, "endpoint": "https://s3.example"}) == {
        "fs.s3a.bucket.lake.session.token": "t0k",
        "fs.s3a.bucket.lake.endpoint": "https://s3.example",
        "fs.s3a.bucket.lake.connection.ssl.enabled": "true",
        "fs.s3a.bucket.lake.path.style.access": "false",
        "fs.s3a.bucket.lake.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        ),
    }
    assert s3a_settings("s3://lake/ck", {}) == {}  # S3A's default credential chain


def test_the_s3a_connector_is_the_version_of_pysparks_hadoop_client():
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    [client] = [p.name for p in jars.glob("hadoop-client-api-*.jar")]
    assert HADOOP_AWS_PACKAGE.rsplit(":", 1)[1] == client.removeprefix(
        "hadoop-client-api-"
    ).removesuffix(".jar")


def _spark_wrote(s3, checkpoint: Checkpoint, batches: int) -> None:
    """The objects Spark's checkpoint holds after ``batches`` micro-batches, as S3A writes
    them: with its folders' marker objects (keys ending in ``/``)."""
    client = s3.client()
    prefix = checkpoint.path.split(f"s3://{s3.bucket}/", 1)[1]
    for marker in ("", "offsets/", "commits/"):
        client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{marker}", Body=b"")
    for batch in range(batches):
        offsets = f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{{"0":{10 * (batch + 1)}}}}}\n'
        client.put_object(Bucket=s3.bucket, Key=f"{prefix}/offsets/{batch}", Body=offsets)
        client.put_object(Bucket=s3.bucket, Key=f"{prefix}/commits/{batch}", Body=b"v1\n{}\n")


def _fingerprint(source: str = "pg") -> Fingerprint:
    return Fingerprint("p", source, "debezium-json", ("t",), None, "s3://lake/wh")


def test_a_checkpoint_on_s3_is_claimed_read_tracked_forgotten_and_deleted(moto_s3):
    checkpoint = Checkpoint(moto_s3.warehouse_uri("ck") + "/_query", moto_s3.storage_options())
    assert not checkpoint.exists() and checkpoint.is_new()
    assert checkpoint.fingerprints() is None
    assert checkpoint.claim([_fingerprint("pg"), _fingerprint("my")])
    checkpoint.track_reads()
    _spark_wrote(moto_s3, checkpoint, 3)
    assert checkpoint.planned_batches() == checkpoint.committed_batches() == [0, 1, 2]
    assert checkpoint.committed_end_offsets() == {("t", 0): 30}
    assert checkpoint.read_nothing()  # no micro-batch delivered a record yet
    checkpoint.delivered(1, ["pg"])

    again = Checkpoint(checkpoint.path, moto_s3.storage_options())  # a new run reads it back
    assert not again.read_nothing() and not again.read_nothing("pg") and again.read_nothing("my")
    assert set(again.fingerprints() or {}) == {"pg", "my"}
    assert again.forget(["my"]) == ["my"]
    assert not Checkpoint(checkpoint.path, moto_s3.storage_options()).claim(
        [_fingerprint("pg"), _fingerprint("my")]
    )  # its sources are no longer the configured ones: it starts over
    body = json.loads(again.store.read_bytes(FINGERPRINT_FILE))
    assert [e["source"] for e in body["sources"]] == ["pg"]

    again.restart()
    assert not again.exists() and again.is_new() and again.fingerprints() is None


def test_the_checkpoint_on_s3_is_probed_at_start_up(moto_s3, tmp_path):
    options = moto_s3.storage_options()
    config = _config(
        warehouse=moto_s3.warehouse_uri(), checkpoint=moto_s3.warehouse_uri("ck"), storage=options
    )
    checks = {c.item: c for c in preflight(config, brokers=False)}
    assert checks["checkpoint"].ok, checks["checkpoint"].detail
    assert checks["checkpoint"].detail.endswith(": list, write, read and delete work")
    assert not Storage(config.checkpoint, options).exists()  # the probe left nothing

    missing = _config(
        warehouse=moto_s3.warehouse_uri(), checkpoint="s3://no-such-bucket/ck", storage=options
    )
    checks = {c.item: c for c in preflight(missing, brokers=False)}
    assert checks["warehouse"].ok and not checks["checkpoint"].ok
    assert isinstance(checks["checkpoint"].error, StorageError)
    assert checks["checkpoint"].detail.startswith("checkpoint: the list probe failed: ")
    assert "create the bucket" in checks["checkpoint"].detail
    assert "\n" not in checks["checkpoint"].detail


def test_a_session_without_the_s3a_connector_is_one_line_with_the_fix(spark):
    """A notebook's session started without hadoop-aws (the tests' shared one) cannot
    write a checkpoint on S3: said before any query starts."""
    from cdcflow.errors import ConfigError
    from cdcflow.runtime.pipeline import Pipeline

    config = _config(checkpoint="s3://lake/ck")
    with pytest.raises(ConfigError) as info:
        Pipeline(config, spark=spark)
    assert info.value.message == (
        "checkpoint: s3://lake/ck needs Hadoop's S3A connector in Spark: start the session "
        f"with spark.jars.packages={HADOOP_AWS_PACKAGE} (spark-submit: the arguments "
        "`python -m cdcflow.runtime.spark CONFIG` prints), or give the checkpoint a local folder"
    )


def test_spark_submit_gets_the_s3a_connector_for_a_checkpoint_on_s3(tmp_path):
    from cdcflow.runtime.spark import DELTA_PACKAGE, SUBMIT_MAIN, _main

    config = tmp_path / "p.yaml"
    config.write_text(
        json.dumps(
            {
                "warehouse": "s3://lake/wh",
                "checkpoint": "s3://lake/ck",
                "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
                "sources": [{"format": "debezium-json", "topics": ["t"]}],
            }
        )
    )
    args = _main([str(config)]).split()
    assert args[:2] == ["--packages", f"{DELTA_PACKAGE},{HADOOP_AWS_PACKAGE}"]
    assert args[-1] == str(SUBMIT_MAIN)
    assert HADOOP_AWS_PACKAGE not in _main([])  # a run of a checkpoint in a folder

"""Data files through obstore (``cdcflow.sinks.object_files``): the options delta-rs takes,
given to obstore; a file written and read back on each object-store server (moto and
S3Proxy for S3, Azurite for Azure Blob); the merge's file system on a store is obstore's
where it finds credentials, delta-rs's where it may not."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake.fs import DeltaStorageHandler

from cdcflow.sinks.arrow_merge import table_filesystem
from cdcflow.sinks.object_files import ObjectFiles, _split, object_files


def test_delta_rs_options_become_obstores_config_client_and_retries():
    config, client, retry = _split(
        {
            "aws_endpoint_url": "http://127.0.0.1:9000",
            "AWS_ACCESS_KEY_ID": "key",
            "aws_allow_http": "true",  # a client key behind the provider's prefix
            "timeout": "30s",
            "max_retries": "2",
            "retry_timeout": "10s",
            "aws_conditional_put": "etag",
        }
    )
    assert config == {
        "aws_endpoint_url": "http://127.0.0.1:9000",
        "aws_access_key_id": "key",
        "aws_conditional_put": "etag",
    }
    assert client == {"allow_http": "true", "timeout": "30s"}
    assert retry == {"max_retries": 2, "retry_timeout": timedelta(seconds=10)}
    assert _split({"retry_timeout": "3 minutes"})[2] == {}  # not understood: object_store's own


def test_a_store_without_credentials_it_can_find_keeps_delta_rs_files(monkeypatch):
    """An AWS profile or an instance role is resolved by delta-rs's AWS SDK chain, which
    object_store's may not follow: the merge stays on delta-rs's file system."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/a/key.json")  # another provider's
    options = {"aws_region": "eu-west-1"}
    assert object_files("s3://lake/wh/orders", options) is None
    fs = table_filesystem("s3://lake/wh/orders", options)
    assert isinstance(fs.handler, DeltaStorageHandler)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-the-environment")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-the-environment-too")
    assert isinstance(object_files("s3://lake/wh/orders", options).handler, ObjectFiles)
    # a profile or a role to assume: only delta-rs's SDK chain signs as it says
    assert object_files("s3://lake/wh/orders", {**options, "aws_profile": "lake"}) is None
    assert object_files("s3://lake/wh/orders", {**options, "aws_role_arn": "arn:x"}) is None
    monkeypatch.setenv("AWS_PROFILE", "lake")
    assert object_files("s3://lake/wh/orders", options) is None


@pytest.mark.services
def test_a_file_is_written_and_read_whole_on_each_store(object_store):
    uri = f"{object_store.warehouse_uri()}/orders"
    fs = table_filesystem(uri, object_store.storage_options())
    assert isinstance(fs.handler, ObjectFiles)
    table = pa.table({"id": list(range(1000)), "name": [f"n{i}" for i in range(1000)]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue()
    fs.handler.put("part-0.parquet", data)
    (info,) = fs.get_file_info(["part-0.parquet"])
    assert info.type == pa.fs.FileType.File and info.size == data.size
    assert pq.read_table("part-0.parquet", filesystem=fs).equals(table)
    (missing,) = fs.get_file_info(["part-9.parquet"])
    assert missing.type == pa.fs.FileType.NotFound
    with pytest.raises(FileNotFoundError, match="part-9.parquet"):
        fs.open_input_file("part-9.parquet")
    # delta-rs sees the file where obstore wrote it: the same key under the table
    delta_rs = pa.fs.PyFileSystem(DeltaStorageHandler(uri, object_store.storage_options()))
    assert delta_rs.get_file_info(["part-0.parquet"])[0].size == data.size

"""Where a warehouse lives (cdcflow.sinks.storage): the ``storage:`` section checked at
load, and listing, probing and deleting a warehouse on local disk and on a real S3 server
(moto's, started by the test kit)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdcflow.config import parse_config
from cdcflow.errors import ConfigError, StorageError
from cdcflow.secrets import MASK
from cdcflow.sinks.faults import GLOBAL_KINDS, storage_error
from cdcflow.sinks.storage import Storage, check_storage_options, provider_of
from cdcflow.sinks.warehouse import DeltaWarehouse


def _config(**overrides):
    base = {
        "warehouse": "s3://lake/cdcflow",
        "checkpoint": "/tmp/ck",
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "sources": [{"format": "debezium-json", "topics": ["t"]}],
    }
    return parse_config({**base, **overrides})


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("uri", "provider"),
    [
        ("/data/wh", "local"),
        ("relative/wh", "local"),
        ("file:///data/wh", "local"),
        ("s3://lake/wh", "s3"),
        ("s3a://lake/wh", "s3"),
        ("abfss://c@acct.dfs.core.windows.net/wh", "azure"),
        ("az://c/wh", "azure"),
        ("gs://lake/wh", "gcs"),
    ],
)
def test_each_scheme_names_its_provider(uri, provider):
    assert provider_of(uri) == provider


def test_a_scheme_delta_rs_does_not_store_tables_on_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"warehouse: hdfs:// is not a store .* s3://"):
        provider_of("hdfs://nn/wh")


def test_options_become_strings_and_keys_keep_their_case():
    options = {"AWS_ALLOW_HTTP": True, "aws_region": "eu-west-1", "timeout": 30}
    assert check_storage_options("s3://lake/wh", options) == {
        "AWS_ALLOW_HTTP": "true",
        "aws_region": "eu-west-1",
        "timeout": "30",
    }


@pytest.mark.parametrize(
    ("uri", "options", "message"),
    [
        (
            "s3://lake/wh",
            {"aws_endpoint_ur": "http://x"},
            r"storage\.aws_endpoint_ur: not a storage option of s3 warehouses; "
            r"did you mean 'aws_endpoint_url'\?",
        ),
        ("gs://lake/wh", {"aws_region": "x"}, r"storage\.aws_region: not a storage option of gcs"),
        (
            "abfss://c@a.dfs.core.windows.net/wh",
            {"azure_storage_acount_name": "a"},
            r"did you mean 'azure_storage_account_name'",
        ),
        ("/data/wh", {"aws_region": "x"}, r"storage: the warehouse '/data/wh' is a local folder"),
        ("s3://lake/wh", {"aws_region": ["x"]}, r"storage\.aws_region: give a string, number"),
    ],
)
def test_a_bad_storage_option_is_one_line_naming_the_key(uri, options, message):
    with pytest.raises(ConfigError, match=message):
        check_storage_options(uri, options)


def test_the_configuration_takes_the_storage_section_and_redacts_its_secrets():
    config = _config(
        storage={
            "aws_endpoint_url": "http://127.0.0.1:9000",
            "aws_secret_access_key": "s3cr3t-value",
            "aws_conditional_put": "etag",
        }
    )
    assert config.storage["aws_conditional_put"] == "etag"
    assert config.storage["aws_secret_access_key"] == "s3cr3t-value"  # the client gets it
    assert "s3cr3t-value" not in repr(config) and MASK in repr(config)
    azure = _config(
        warehouse="abfss://c@acct.dfs.core.windows.net/wh",
        storage={"azure_storage_account_key": "azure-k3y", "azure_storage_sas_key": "sas-k3y"},
    )
    assert "azure-k3y" not in repr(azure) and "sas-k3y" not in repr(azure)
    gcs = _config(warehouse="gs://lake/wh", storage={"google_service_account_key": "{json}"})
    assert "{json}" not in repr(gcs)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"storage_options": {}}, r"storage_options: unknown key; .* top-level storage:"),
        ({"warehouse": {"uri": "s3://x/y"}}, r"warehouse: give one folder or URI"),
        ({"storage": "aws_region=x"}, r"storage: give a mapping"),
        ({"checkpoint": "gs://lake/ck"}, r"checkpoint: gs:// is not supported for Spark's "),
        (
            {"checkpoint": "s3://lake/ck", "warehouse": "/tmp/wh"},
            r"checkpoint: an s3:// checkpoint takes the warehouse's storage: options, so the "
            r"warehouse must be on S3 too \(it is '/tmp/wh'\)",
        ),
        (
            {"checkpoint": "s3://lake/ck", "storage": {"aws_role_arn": "arn:aws:iam::1:role/r"}},
            r"storage.aws_role_arn: Spark's checkpoint on S3 \(Hadoop S3A\) is not given this "
            r"option; set the matching spark.hadoop.fs.s3a.\* setting yourself",
        ),
        (
            {"sink": "delta-spark"},
            r"sink: delta-spark writes only to a local .* delta-io/delta#3596",
        ),
    ],
)
def test_other_spellings_and_unsupported_places_are_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(**overrides)


def test_tables_are_applied_16_at_once_on_a_store_unless_set():
    assert _config().apply.parallel_tables == 32
    assert _config(apply={"parallel_tables": 2}).apply.parallel_tables == 2
    assert _config(warehouse="/tmp/wh").apply.parallel_tables == 4


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Generic S3 error: ... 403 Forbidden: <Code>InvalidAccessKeyId</Code>", "permission"),
        ("Generic S3 error: SignatureDoesNotMatch", "permission"),
        ("Error performing list request: ... 404 Not Found: <?xml", "missing"),
        ("<Code>NoSuchBucket</Code>", "missing"),
        ("error sending request for url (http://127.0.0.1:1/x): tcp connect error", "unreachable"),
        ("Connection refused (os error 111)", "unreachable"),
        (
            "Generic S3 error: Error performing PUT http://s3/x in 210ms, after 2 retries, "
            "max_retries: 2, retry_timeout: 10s - Server returned non-2xx status code: "
            "503 Service Unavailable: <Error><Code>SlowDown</Code>",
            "unavailable",
        ),
        ("Failed to parse parquet: External: <Code>InternalError</Code>", "unavailable"),
    ],
)
def test_object_store_failures_have_their_kind_and_an_object_store_fix(text, kind):
    error = storage_error(OSError(text), "s3://lake/wh/_cdcflow/batches")
    assert error.kind == kind
    assert "Fix: " in error.message and "folder" not in error.message.split("Fix: ")[1]
    assert (kind in GLOBAL_KINDS) == (kind in ("missing", "unreachable", "unavailable"))


# --------------------------------------------------------------------------- listing


def _tables(root: str, options: dict[str, str] | None = None) -> None:
    data = pa.table({"id": [1, 2]})
    for name in ("shop.public.orders", "shop.public.items", "_cdcflow/batches"):
        write_deltalake(f"{root}/{name}", data, storage_options=options)


def test_a_local_warehouse_lists_its_tables_and_is_deleted(tmp_path):
    root = str(tmp_path / "wh")
    store = Storage(root)
    assert store.folders() == [] and not store.exists()
    _tables(root)
    assert store.exists() and store.exists("_cdcflow") and not store.exists("nothing-here")
    (tmp_path / "wh" / "not-a-table").mkdir()
    assert store.folders() == ["_cdcflow", "not-a-table", "shop.public.items", "shop.public.orders"]
    assert DeltaWarehouse(root).mirrors() == ["shop.public.items", "shop.public.orders"]
    assert store.is_table("_cdcflow", "batches") and not store.is_table("not-a-table")
    assert Storage(f"file://{root}").folders() == store.folders()
    store.delete()
    assert not (tmp_path / "wh").exists()


def test_a_warehouse_on_an_object_store_lists_probes_and_is_deleted(object_store):
    uri, options = object_store.warehouse_uri(), object_store.storage_options()
    store = Storage(uri, options)
    assert store.folders() == [] and not store.exists()
    assert "put-if-absent commits work" in store.probe()
    assert store.folders() == [] or store.folders() == ["_cdcflow"]  # the probe cleans up
    assert store.folders("_cdcflow", "probes") == []
    _tables(uri, options)
    assert DeltaWarehouse(uri, storage_options=options).mirrors() == [
        "shop.public.items",
        "shop.public.orders",
    ]
    assert store.exists() and store.exists("_cdcflow") and store.is_table("_cdcflow", "batches")
    assert not store.exists("_cdcflow", "nothing-here")
    store.delete()
    assert not store.exists() and store.folders() == []


def test_a_missing_bucket_fails_the_probe_in_one_line_naming_the_fix(s3_store):
    store = Storage("s3://no-such-bucket/wh", s3_store.storage_options())
    with pytest.raises(
        StorageError, match=r"warehouse: the list probe failed: .*create the bucket"
    ):
        store.probe()


def test_an_unreachable_store_fails_the_probe_as_unreachable(s3_store):
    from cdcflow_testkit.services.process import free_port

    options = {**s3_store.storage_options(), "aws_endpoint_url": f"http://127.0.0.1:{free_port()}"}
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        Storage("s3://cdcflow/wh", options).probe()
    assert time.monotonic() - started < 30  # not delta-rs's 10 retries over up to 180 s
    assert info.value.kind == "unreachable"
    assert "check the store's endpoint" in info.value.message


@pytest.mark.services
def test_refused_credentials_fail_the_probe_as_permission(s3proxy):
    """S3Proxy checks signatures (moto takes any key): a wrong secret is one line naming the
    credentials."""
    options = {**s3proxy.storage_options(), "aws_secret_access_key": "not-the-secret"}
    with pytest.raises(StorageError) as info:
        Storage(s3proxy.warehouse_uri(), options).probe()
    assert info.value.kind == "permission"
    assert "403 Forbidden" in info.value.message
    assert "give the storage credentials" in info.value.message
    assert "not-the-secret" not in info.value.message

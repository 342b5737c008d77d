"""What of the ``storage:`` options reaches Spark's checkpoint on S3 (Hadoop's S3A).

The warehouse's options are delta-rs's keys; a checkpoint on S3 is written by Hadoop's
S3A connector (:mod:`cdcflow.runtime.hadoop`), which is given the credentials, endpoint
and region among them (:data:`S3A_KEYS`). Options that only tune delta-rs's own client
are left to it; any other option changes how S3 is reached and has no S3A setting here,
so a checkpoint on S3 with it is refused at load (:func:`check_checkpoint_options`).

Source documents: object_store's ``AmazonS3ConfigKey``; Hadoop's "Hadoop-AWS module:
Integration with Amazon Web Services".
"""

from __future__ import annotations

from collections.abc import Mapping

from cdcflow.errors import ConfigError
from cdcflow.sinks.storage import CLIENT_KEYS

__all__ = ["S3A_KEYS", "check_checkpoint_options", "checkpoint_on_store"]

#: the delta-rs storage option -> the S3A setting it becomes (per bucket)
S3A_KEYS: dict[str, str] = {
    "aws_access_key_id": "access.key",
    "access_key_id": "access.key",
    "aws_secret_access_key": "secret.key",
    "secret_access_key": "secret.key",
    "aws_session_token": "session.token",
    "aws_token": "session.token",
    "session_token": "session.token",
    "aws_endpoint_url": "endpoint",
    "aws_endpoint": "endpoint",
    "endpoint_url": "endpoint",
    "endpoint": "endpoint",
    "aws_region": "endpoint.region",
    "aws_default_region": "endpoint.region",
    "region": "endpoint.region",
    "default_region": "endpoint.region",
}

#: the HTTP client's proxy settings: they change how S3 is reached, and S3A is not given them
_PROXY_KEYS = frozenset({"proxy_url", "proxy_ca_certificate", "proxy_excludes"})

#: options that only tune delta-rs's own client (retries, timeouts, commits; the HTTP
#: client's keys but its proxy): S3A's defaults stand for the checkpoint
_DELTA_RS_ONLY = frozenset(
    {
        "aws_allow_http",  # read from the endpoint's scheme instead
        "allow_http",
        "aws_virtual_hosted_style_request",  # read below
        "virtual_hosted_style_request",
        "aws_conditional_put",
        "conditional_put",
        "aws_copy_if_not_exists",
        "copy_if_not_exists",
        "aws_checksum_algorithm",
        "checksum_algorithm",
        "aws_unsigned_payload",
        "unsigned_payload",
        "aws_disable_tagging",
        "aws_s3_locking_provider",
        "aws_s3_allow_unsafe_rename",
        "aws_s3_pool_idle_timeout_seconds",
        "aws_sts_pool_idle_timeout_seconds",
        "aws_s3_get_internal_server_error_retries",
        "aws_force_credential_load",
        "aws_imdsv1_fallback",
        "aws_ec2_metadata_disabled",
        "aws_ec2_metadata_timeout",
        "aws_bucket",
        "aws_bucket_name",
    }
) | (CLIENT_KEYS - _PROXY_KEYS)


def checkpoint_on_store(checkpoint: str) -> bool:
    """Whether ``checkpoint`` is a URI (an object store) rather than a folder."""
    return "://" in checkpoint and not checkpoint.startswith("file://")


def check_checkpoint_options(checkpoint: str, warehouse: str, options: Mapping[str, str]) -> None:
    """Refuse a checkpoint URI cdcflow cannot give to Spark, before anything runs.

    Args:
        checkpoint: the ``checkpoint`` setting (a URI: :func:`checkpoint_on_store`).
        warehouse: the ``warehouse`` setting; its ``storage:`` options reach the checkpoint.
        options: the checked ``storage:`` section (:func:`cdcflow.sinks.storage.check_storage_options`).

    Raises:
        ConfigError: one line naming the key and the fix: a scheme other than
            ``s3://``/``s3a://``, a warehouse on another kind of store, or a storage
            option S3A is not given here.
    """
    scheme = checkpoint.split("://", 1)[0].lower()
    if scheme not in ("s3", "s3a"):
        raise ConfigError(
            f"checkpoint: {scheme}:// is not supported for Spark's checkpoint (only s3://); "
            "give a local (or mounted) folder: the warehouse holds the applied offsets, so "
            "a lost checkpoint resumes where the warehouse is (decision 67)"
        )
    if warehouse.split("://", 1)[0].lower() not in ("s3", "s3a"):
        raise ConfigError(
            "checkpoint: an s3:// checkpoint takes the warehouse's storage: options, so the "
            f"warehouse must be on S3 too (it is {warehouse!r}); put both on S3 or give "
            "the checkpoint a local folder"
        )
    for key in options:
        low = key.lower()
        if low not in S3A_KEYS and low not in _DELTA_RS_ONLY:
            raise ConfigError(
                f"storage.{key}: Spark's checkpoint on S3 (Hadoop S3A) is not given this "
                "option; set the matching spark.hadoop.fs.s3a.* setting yourself and keep "
                "the key for delta-rs, or give the checkpoint a local folder (decision 67)"
            )

"""Where a warehouse lives: a local folder, or a prefix on S3, ADLS Gen2 / Blob or GCS.

A warehouse is named by a URI (or a local folder) and reached with delta-rs's storage
options, the keys of the Rust ``object_store`` crate that delta-rs and this module share
(https://delta-io.github.io/delta-rs/integrations/object-storage/s3/ and the pages beside
it for Azure and GCS). The configuration's ``storage:`` section holds them
(docs/configuration.md, decision 65); with no options the provider's default credential
chain applies (``AWS_*`` variables, a profile, an instance or pod role; ``AZURE_*``;
``GOOGLE_APPLICATION_CREDENTIALS`` or the metadata server), as in every delta-rs client.

========  =========================================  ================================
provider  warehouse URIs                              its option keys start with
========  =========================================  ================================
s3        ``s3://bucket/prefix`` (``s3a://``)        ``aws_``
azure     ``abfss://container@account.dfs.core.windows.net/prefix``, ``az://``,
          ``abfs://``, ``adl://``, ``azure://``       ``azure_``
gcs       ``gs://bucket/prefix``                      ``google_``
local     a folder, or ``file:///folder``             (none)
========  =========================================  ================================

delta-rs passes a key it does not know to no one, silently; a misspelt endpoint would
send the warehouse's requests to AWS. :func:`check_storage_options` therefore refuses any
key outside the lists below (the ``object_store`` crate's ``AmazonS3ConfigKey``,
``AzureConfigKey``, ``GoogleConfigKey`` and ``ClientConfigKey``, with their aliases, and
delta-rs's own S3 keys), case-insensitively, with the nearest known key.

:class:`Storage` lists folders and tells whether one exists through delta-rs's own
object store (``deltalake.fs.DeltaStorageHandler``, a pyarrow file system), so the
commands that walk a warehouse (status, report, maintain, reset) see the same objects the
writer does, with the same options.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.fs import DeltaStorageHandler

from cdcflow.errors import ConfigError, StorageError, did_you_mean
from cdcflow.sinks.faults import conditional_put_error, storage_error

__all__ = [
    "PROVIDERS",
    "Provider",
    "Storage",
    "CLIENT_KEYS",
    "check_storage_options",
    "provider_of",
    "put_object",
]

Provider = Literal["local", "s3", "azure", "gcs"]

#: URI scheme -> provider (delta-rs 1.x's schemes; ``memory://`` is left out: it is not durable)
PROVIDERS: dict[str, Provider] = {
    "file": "local",
    "s3": "s3",
    "s3a": "s3",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "adl": "azure",
    "azure": "azure",
    "gs": "gcs",
}

#: the HTTP client's keys, for every provider (object_store's ``ClientConfigKey``)
CLIENT_KEYS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_max_frame_size",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "timeout",
        "user_agent",
        # delta-rs's retry settings (deltalake's storage configuration)
        "max_retries",
        "retry_timeout",
        "backoff_config.init_backoff",
        "backoff_config.max_backoff",
        "backoff_config.base",
    }
)

_S3_KEYS = frozenset(
    {
        # object_store's AmazonS3ConfigKey
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "aws_token",
        "aws_region",
        "aws_default_region",
        "aws_bucket",
        "aws_bucket_name",
        "aws_endpoint",
        "aws_endpoint_url",
        "aws_virtual_hosted_style_request",
        "aws_s3_express",
        "aws_imdsv1_fallback",
        "aws_metadata_endpoint",
        "aws_container_credentials_relative_uri",
        "aws_container_credentials_full_uri",
        "aws_container_authorization_token_file",
        "aws_web_identity_token_file",
        "aws_role_arn",
        "aws_role_session_name",
        "aws_sts_endpoint",
        "aws_skip_signature",
        "aws_unsigned_payload",
        "aws_checksum_algorithm",
        "aws_copy_if_not_exists",
        "aws_conditional_put",
        "aws_disable_tagging",
        "aws_request_payer",
        "aws_server_side_encryption",
        "aws_sse_kms_key_id",
        "aws_sse_bucket_key_enabled",
        "aws_sse_customer_key_base64",
        "aws_allow_http",
        "access_key_id",
        "secret_access_key",
        "session_token",
        "region",
        "default_region",
        "endpoint",
        "endpoint_url",
        "virtual_hosted_style_request",
        "conditional_put",
        "copy_if_not_exists",
        "skip_signature",
        "unsigned_payload",
        "checksum_algorithm",
        "request_payer",
        # delta-rs's own S3 keys (its S3 storage backend)
        "aws_profile",
        "aws_s3_locking_provider",
        "delta_dynamo_table_name",
        "aws_s3_allow_unsafe_rename",
        "aws_s3_pool_idle_timeout_seconds",
        "aws_sts_pool_idle_timeout_seconds",
        "aws_s3_get_internal_server_error_retries",
        "aws_force_credential_load",
        "aws_ec2_metadata_disabled",
        "aws_ec2_metadata_timeout",
    }
)

_AZURE_KEYS = frozenset(
    {
        # object_store's AzureConfigKey
        "azure_storage_account_name",
        "azure_storage_account_key",
        "azure_storage_access_key",
        "azure_storage_master_key",
        "azure_storage_client_id",
        "azure_client_id",
        "azure_storage_client_secret",
        "azure_client_secret",
        "azure_storage_tenant_id",
        "azure_tenant_id",
        "azure_storage_authority_id",
        "azure_authority_id",
        "azure_authority_host",
        "azure_storage_sas_key",
        "azure_storage_sas_token",
        "azure_storage_token",
        "azure_storage_use_emulator",
        "azure_use_emulator",
        "azure_storage_endpoint",
        "azure_endpoint",
        "azure_msi_endpoint",
        "azure_identity_endpoint",
        "azure_object_id",
        "azure_msi_resource_id",
        "azure_federated_token_file",
        "azure_use_fabric_endpoint",
        "azure_use_azure_cli",
        "azure_skip_signature",
        "azure_container_name",
        "azure_disable_tagging",
        "azure_fabric_token_service_url",
        "azure_fabric_workload_host",
        "azure_fabric_session_token",
        "azure_fabric_cluster_identifier",
        "account_name",
        "account_key",
        "access_key",
        "client_id",
        "client_secret",
        "tenant_id",
        "authority_id",
        "sas_key",
        "sas_token",
        "bearer_token",
        "use_emulator",
        "msi_endpoint",
        "object_id",
        "msi_resource_id",
        "federated_token_file",
        "use_fabric_endpoint",
        "use_azure_cli",
        "container_name",
    }
)

_GCS_KEYS = frozenset(
    {
        # object_store's GoogleConfigKey
        "google_service_account",
        "google_service_account_path",
        "google_service_account_key",
        "google_bucket",
        "google_bucket_name",
        "google_application_credentials",
        "google_skip_signature",
        "service_account",
        "service_account_path",
        "service_account_key",
        "application_credentials",
        "bucket",
        "bucket_name",
    }
)

_KEYS: dict[Provider, frozenset[str]] = {
    "local": frozenset(),
    "s3": _S3_KEYS | CLIENT_KEYS,
    "azure": _AZURE_KEYS | CLIENT_KEYS,
    "gcs": _GCS_KEYS | CLIENT_KEYS,
}


#: the probe's retries (:meth:`Storage.probe`), delta-rs's keys
PROBE_RETRIES = {"max_retries": "2", "retry_timeout": "10s"}


def provider_of(uri: str, key: str = "warehouse") -> Provider:
    """The provider a warehouse URI or folder is on.

    Raises:
        ConfigError: a scheme delta-rs does not store tables on; the message names ``key``.
    """
    if "://" not in uri:
        return "local"
    scheme = uri.split("://", 1)[0].lower()
    provider = PROVIDERS.get(scheme)
    if provider is None:
        known = ", ".join(f"{s}://" for s in PROVIDERS)
        raise ConfigError(f"{key}: {scheme}:// is not a store for Delta tables; use one of {known}")
    return provider


def check_storage_options(uri: str, options: Mapping[str, object]) -> dict[str, str]:
    """``options`` as delta-rs takes them (every value a string), checked against ``uri``.

    Args:
        uri: the warehouse (a folder or a URI of :data:`PROVIDERS`).
        options: the ``storage:`` section; ``true``/``false`` and numbers become strings.

    Returns:
        The options with string values, their keys as written.

    Raises:
        ConfigError: one line naming ``storage.<key>``: a key the warehouse's provider
            does not take (with the nearest known key), options for a local folder, or a
            value that is not a string, number or boolean.
    """
    provider = provider_of(uri)
    if options and provider == "local":
        raise ConfigError(
            f"storage: the warehouse {uri!r} is a local folder and takes no storage options; "
            "remove the storage section or make the warehouse an s3://, abfss:// or gs:// URI"
        )
    known = _KEYS[provider]
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str) or key.lower() not in known:
            hint = did_you_mean(str(key).lower(), sorted(known))
            raise ConfigError(
                f"storage.{key}: not a storage option of {provider} warehouses; {hint}"
                "see delta-rs's storage options (docs/configuration.md, storage)"
            )
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[key] = str(value)
        else:
            raise ConfigError(
                f"storage.{key}: give a string, number or true/false, not {type(value).__name__}"
            )
    return out


def put_object(handler: DeltaStorageHandler, path: str, data: bytes | pa.Buffer) -> None:
    """Write ``data`` whole to ``path`` of delta-rs's object store ``handler``.

    delta-rs's Python file system hands its Rust writer pyarrow buffers, which it refuses
    (deltalake 1.6: "'Buffer' object is not an instance of 'bytes'"); the Rust handler's
    own stream takes bytes.

    Raises:
        OSError: the store refused the write.
    """
    stream = handler._handler.open_output_stream(path, None)
    stream.write(data.to_pybytes() if isinstance(data, pa.Buffer) else bytes(data))
    stream.close()  # type: ignore[attr-defined]  # the stub lacks it (deltalake 1.6)


@dataclass(frozen=True)
class Storage:
    """A warehouse's root and the options to reach it; lists what lies under it.

    Attributes:
        root: a local folder or a URI of :data:`PROVIDERS` (no trailing ``/``).
        options: delta-rs's storage options (:func:`check_storage_options`).
    """

    root: str
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", str(self.root).rstrip("/"))

    @property
    def provider(self) -> Provider:
        return provider_of(self.root)

    @property
    def local(self) -> bool:
        """Whether the warehouse is a folder of this machine's file system."""
        return self.provider == "local"

    @cached_property
    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow file system and the root's path in it (made once per instance)."""
        if self.local:
            path = urlsplit(self.root).path if self.root.startswith("file://") else self.root
            return pafs.LocalFileSystem(), path
        handler = DeltaStorageHandler(self.root, dict(self.options) or None)
        return pafs.PyFileSystem(handler), ""

    def _at(self, *parts: str) -> tuple[pafs.FileSystem, str]:
        """The file system and the path of ``root/parts...`` in it."""
        fs, base = self._filesystem
        return fs, "/".join(p for p in (base, *parts) if p)

    def folders(self, *parts: str) -> list[str]:
        """Names of the folders right under ``root/parts...`` (sorted; none when absent).

        Raises:
            OSError: the store cannot be listed (unreachable, permission denied).
        """
        fs, where = self._at(*parts)
        selector = pafs.FileSelector(where, recursive=False, allow_not_found=True)
        infos = fs.get_file_info(selector)
        return sorted(info.base_name for info in infos if info.type == pafs.FileType.Directory)

    def is_table(self, *parts: str) -> bool:
        """Whether ``root/parts...`` holds a Delta table: a ``_delta_log`` folder on local
        disk; on a store, a commit or a checkpoint under ``_delta_log/`` (a store has no
        empty folders).

        Raises:
            OSError: the store cannot be listed.
        """
        fs, where = self._at(*parts, "_delta_log")
        if self.local:
            return bool(fs.get_file_info(where).type == pafs.FileType.Directory)
        # two HEADs answer for almost every table; a listing of its log only when a log
        # clean-up removed the first commit and no checkpoint was written yet
        first = [f"{where}/_last_checkpoint", f"{where}/{0:020d}.json"]
        if any(info.is_file for info in fs.get_file_info(first)):
            return True
        selector = pafs.FileSelector(where, recursive=False, allow_not_found=True)
        return any(
            info.base_name.endswith((".json", ".parquet")) for info in fs.get_file_info(selector)
        )

    def exists(self, *parts: str) -> bool:
        """Whether anything lies at or under ``root/parts...``.

        Raises:
            OSError: the store cannot be listed.
        """
        fs, where = self._at(*parts)
        if self.local:
            return bool(fs.get_file_info(where).type != pafs.FileType.NotFound)
        # an object store has no folders: a prefix exists when something is under it
        selector = pafs.FileSelector(where, recursive=False, allow_not_found=True)
        return bool(fs.get_file_info(selector))

    def holds_data(self, *parts: str) -> bool:
        """Whether a non-empty file lies anywhere under ``root/parts...`` (lists it all).

        Raises:
            OSError: the store cannot be listed.
        """
        fs, where = self._at(*parts)
        selector = pafs.FileSelector(where, recursive=True, allow_not_found=True)
        return any(info.is_file and info.size for info in fs.get_file_info(selector))

    def listing(self, *parts: str) -> list[pafs.FileInfo]:
        """What lies right under ``root/parts...`` (pyarrow's file infos: name, type, size,
        modification time; none when absent).

        Raises:
            OSError: the store cannot be listed.
        """
        fs, where = self._at(*parts)
        return list(fs.get_file_info(pafs.FileSelector(where, allow_not_found=True)))

    def names(self, *parts: str) -> list[str]:
        """Names of the files and folders right under ``root/parts...`` (sorted; none when
        absent).

        Raises:
            OSError: the store cannot be listed.
        """
        return sorted({info.base_name for info in self.listing(*parts)} - {""})

    def read_bytes(self, *parts: str) -> bytes:
        """The whole file at ``root/parts...``.

        Raises:
            FileNotFoundError: nothing is there.
            OSError: the store cannot be read.
        """
        fs, where = self._at(*parts)
        with fs.open_input_stream(where) as f:
            return bytes(f.read())

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Write the file at ``root/parts...`` whole: a reader sees the old file or the new
        one, never a part (a folder's file is written beside it and renamed; an object is
        one PUT).

        Raises:
            OSError: the store or the disk refused the write.
        """
        fs, where = self._at(*parts)
        if self.local:
            os.makedirs(os.path.dirname(where) or ".", exist_ok=True)
            tmp = f"{where}.{secrets.token_hex(4)}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, where)
            return
        put_object(DeltaStorageHandler(self.root, dict(self.options) or None), where, data)

    def delete(self, *parts: str) -> None:
        """Delete ``root/parts...`` (the whole warehouse when no parts are given): its
        folder, or every object under its prefix.

        Raises:
            OSError: the store refused a deletion.
        """
        fs, where = self._at(*parts)
        if self.local:
            shutil.rmtree(where, ignore_errors=True)
            return
        # entry by entry: deltalake 1.6's handler lacks delete_root_dir_contents
        selector = pafs.FileSelector(where, recursive=False, allow_not_found=True)
        for info in fs.get_file_info(selector):
            if info.type == pafs.FileType.Directory:
                fs.delete_dir(info.path)
            elif info.base_name:  # not a folder's marker object (S3A writes them)
                fs.delete_file(info.path)

    def remove(self, *parts: str) -> None:
        """Delete the file at ``root/parts...``.

        Raises:
            FileNotFoundError: nothing is there (a folder's file).
            OSError: the store refused the deletion.
        """
        fs, where = self._at(*parts)
        fs.delete_file(where)

    def _quick(self) -> Storage:
        """This storage with the probes' short retries (the user's own settings win)."""
        return self if self.local else Storage(self.root, {**PROBE_RETRIES, **self.options})

    def _probe_failed(self, item: str, step: str, exc: OSError) -> StorageError:
        """One line naming ``item``, the probe ``step`` that failed, and the fix."""
        found = storage_error(exc, self.root)
        return StorageError(
            f"{item}: the {step} probe failed: {found.message}",
            path=self.root,
            target=None,
            kind=found.kind,
            cause=found.cause,
        )

    def probe_files(self, item: str = "checkpoint") -> str:
        """Prove that files can be listed, written, read and deleted under the root (Spark's
        checkpoint needs no more: the lease keeps its writer alone).

        Args:
            item: what the root is, for the message.

        Returns:
            What was proven, one line.

        Raises:
            StorageError: one line naming ``item``, the step that failed and the fix.
        """
        name = f".cdcflow-probe-{secrets.token_hex(8)}"
        quick = self._quick()
        step = "list"
        try:
            quick.names()
            step = "write"
            quick.write_bytes(b"cdcflow", name)
            step = "read"
            quick.read_bytes(name)
            step = "delete"
            quick.remove(name)
        except OSError as exc:  # deltalake's errors are OSErrors
            raise self._probe_failed(item, step, exc) from exc
        return f"{self.root}: list, write, read and delete work"

    def probe(self) -> str:
        """Prove what a pipeline needs of the store: list, write, read, and a commit that
        loses a race being refused (put-if-absent), the one the lease and every exactly-once
        commit rely on. Works in ``_cdcflow/probes/<random>``, deleted again.

        Returns:
            What was proven, one line.

        Raises:
            StorageError: one line naming the step that failed, the warehouse and the fix
                (:mod:`cdcflow.sinks.faults`); ``kind="conditional_put"`` when a second
                commit of one version was accepted (the store overwrote it).
        """
        name = f"_cdcflow/probes/{secrets.token_hex(8)}"
        path = f"{self.root}/{name}"
        # answer in seconds, not after delta-rs's 10 retries over up to 180 s (an
        # unreachable endpoint); the user's own retry settings win
        quick = self._quick()
        options = None if self.local else dict(quick.options)
        step = "list"
        try:
            quick.folders()
            step = "write"
            DeltaTable.create(path, pa.schema([("unused", pa.string())]), storage_options=options)
            step = "read"
            first, second = (DeltaTable(path, storage_options=options) for _ in range(2))
            step = "commit"
            once = CommitProperties(max_commit_retries=0)
            first.alter.set_table_properties(
                {"cdcflow.probe": "1"}, raise_if_not_exists=False, commit_properties=once
            )
            try:  # the same version again, from a handle that has not seen the first
                second.alter.set_table_properties(
                    {"cdcflow.probe": "2"}, raise_if_not_exists=False, commit_properties=once
                )
            except CommitFailedError:
                pass
            else:
                raise conditional_put_error(self.root, self.provider)
        except OSError as exc:  # deltalake's errors are OSErrors
            raise self._probe_failed("warehouse", step, exc) from exc
        finally:
            # a probe left behind is harmless; the next probe uses another name
            with contextlib.suppress(OSError):
                quick._delete_prefix(name)
        return f"{self.root}: list, write, read and put-if-absent commits work"

    def _delete_prefix(self, name: str) -> None:
        fs, where = self._at(name)
        fs.delete_dir(where)

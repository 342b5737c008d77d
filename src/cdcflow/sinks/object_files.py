"""Data files on an object store, read and written without holding the GIL (obstore).

The Arrow merge (:mod:`cdcflow.sinks.arrow_merge`) and compaction read the Parquet files
they rewrite and write the new ones themselves. delta-rs's pyarrow file system
(``deltalake.fs.DeltaStorageHandler``) holds the GIL while it waits on each request: 8
threads reading 8 files through it, 300 ms a request, took 2.8 s, one after another, so
the tables of a micro-batch applied at once (``apply.parallel_tables``) queued on it.
Through obstore, the Python binding of the same Rust ``object_store`` crate delta-rs
uses, the same reads took 0.36 s (decision 70).

:func:`object_files` gives a pyarrow file system over obstore rooted at a table's URI:

- a file is read with one GET of the whole object (delta-rs's reader made a HEAD and two
  ranged GETs); the files the merge rewrites are a mirror's, at most
  ``maintenance.mirror_file_bytes`` (16 MiB) unless a user made them larger;
- a file is written with one PUT (:meth:`ObjectFiles.put`; delta-rs's writer makes a multipart
  upload, three requests, even for a small file), multipart above 10 MiB.

It takes the warehouse's delta-rs storage options (``storage:``): the provider's keys as
they are (both take ``object_store``'s), the HTTP client's keys
(:data:`~cdcflow.sinks.storage.CLIENT_KEYS`, also with their ``aws_``/``azure_``/``google_``
prefix) as client options, ``max_retries`` and ``retry_timeout`` as its retry settings.
It is used only where it finds the credentials the way delta-rs does: in the options or
in the environment's variables (``AWS_ACCESS_KEY_ID``, a web-identity token,
``AZURE_STORAGE_*``, ``GOOGLE_*``), and no AWS profile or role to assume is named (in the
options or ``AWS_PROFILE``); otherwise (an EC2 instance role, a profile, a role: delta-rs's
AWS SDK chain resolves them, ``object_store``'s may not, or may sign with the
environment's keys instead), and when obstore refuses the options, the merge stays on
delta-rs's file system.

Errors are raised as :class:`OSError` (``FileNotFoundError`` for a missing object) with
``object_store``'s message, which :func:`cdcflow.sinks.faults.storage_error` classifies as
it does delta-rs's.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pa_fs

from cdcflow.sinks.storage import CLIENT_KEYS, PROVIDERS

__all__ = ["ObjectFiles", "object_files"]

log = logging.getLogger(__name__)

#: delta-rs's retry keys (its object store client's), obstore's ``retry_config``
_RETRY_KEYS = frozenset({"max_retries", "retry_timeout"})
#: options and variables that carry credentials object_store finds itself
_CREDENTIAL_KEY = re.compile(
    r"access_key|secret|session_token|skip_signature|account_key|sas_key|sas_token|"
    r"use_emulator|bearer_token|client_secret|federated_token|service_account|"
    r"application_credentials|web_identity",
    re.I,
)
#: credentials only delta-rs's AWS SDK chain resolves (a profile, a role to assume): with
#: them object_store could sign as someone else, from the environment's keys
_SDK_ONLY_KEY = re.compile(r"profile|role_arn|role_session_name", re.I)
#: per URI scheme, the environment's variables that carry credentials object_store finds
_CREDENTIAL_VARIABLES = {
    "s3": (
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ),
    "azure": (
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_KEY",
        "AZURE_CLIENT_SECRET",
        "AZURE_FEDERATED_TOKEN_FILE",
    ),
    "gcs": (
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ),
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
#: above this a file is uploaded in parts (obstore's put chunks it)
_MULTIPART_BYTES = 10 * 1024 * 1024

#: (base, options) -> its obstore store, or ``None`` when obstore refused the options
_stores: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_stores_lock = threading.Lock()


def _duration(text: str) -> timedelta | None:
    match = _DURATION.match(str(text))
    if match is None:
        return None
    return timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])


def _split(options: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """delta-rs's storage options as obstore's ``config``, ``client_options`` and
    ``retry_config``."""
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    retry: dict[str, Any] = {}
    for key, value in options.items():
        k = key.lower()
        if k in _RETRY_KEYS:
            if k == "max_retries" and str(value).isdigit():
                retry["max_retries"] = int(value)
            elif k == "retry_timeout" and (timeout := _duration(value)) is not None:
                retry["retry_timeout"] = timeout
            continue
        bare = k
        for prefix in ("aws_", "azure_", "google_"):
            if k.startswith(prefix) and k[len(prefix) :] in CLIENT_KEYS:
                bare = k[len(prefix) :]
        if bare in CLIENT_KEYS:
            client[bare] = str(value)
        else:
            config[k] = str(value)
    return config, client, retry


def _has_credentials(scheme: str, options: Mapping[str, str]) -> bool:
    provider = PROVIDERS.get(scheme.lower())
    if provider not in _CREDENTIAL_VARIABLES:
        return False
    if any(_SDK_ONLY_KEY.search(k) for k in options) or os.environ.get("AWS_PROFILE"):
        return False
    if any(_CREDENTIAL_KEY.search(k) for k in options):
        return True
    return any(os.environ.get(name) for name in _CREDENTIAL_VARIABLES[provider])


def _store(base: str, options: Mapping[str, str]) -> Any:
    """The obstore store of ``base`` (``scheme://bucket``), one per base and options, so
    the tables of a warehouse share its connections; ``None`` when obstore refuses the
    options (asked once: the refusal is kept as well)."""
    key = (base, tuple(sorted((k, str(v)) for k, v in options.items())))
    with _stores_lock:
        if key in _stores:
            return _stores[key]
        from obstore.store import from_url

        config, client, retry = _split(options)
        # plain dicts: from_url's overloads take one TypedDict per provider
        settings: dict[str, Any] = {
            "config": config or None,
            "client_options": client or None,
            "retry_config": retry or None,
        }
        try:
            store = from_url(base, **settings)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # obstore panics on some options (pyo3)
            log.info("data files of %s through delta-rs's file system: %s", base, exc)
            store = None
        _stores[key] = store
        return store


def _os_error(exc: BaseException, path: str) -> OSError:
    """obstore's error as the ``OSError`` delta-rs's file system raises for it."""
    # its message, without the "Debug source:" dump that follows it
    text = " ".join(str(exc).split("Debug source:", 1)[0].split()) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):  # obstore raises the built-in one
        return FileNotFoundError(f"{path}: {text}")
    return OSError(f"{path}: {text}")


class ObjectFiles(pa_fs.FileSystemHandler):  # type: ignore[misc]  # pyarrow has no types
    """A pyarrow file system handler over an obstore store, rooted at ``prefix``.

    Reads and writes whole objects (module docstring); lists and deletes are not needed
    by the merge and raise ``NotImplementedError``.

    Args:
        store: an obstore store (``obstore.store.from_url``).
        prefix: the table's folder in the store (no leading or trailing ``/``).
    """

    def __init__(self, store: Any, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.strip("/")

    def _key(self, path: str) -> str:
        path = path.strip("/")
        return f"{self.prefix}/{path}" if self.prefix else path

    def get_type_name(self) -> str:
        return "cdcflow-obstore"

    def equals(self, other: Any) -> bool:
        return isinstance(other, ObjectFiles) and (self.store, self.prefix) == (
            other.store,
            other.prefix,
        )

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pa_fs.FileInfo]:
        import obstore

        infos = []
        for path in paths:
            try:
                meta = obstore.head(self.store, self._key(path))
            except FileNotFoundError:
                infos.append(pa_fs.FileInfo(path, pa_fs.FileType.NotFound))
                continue
            except Exception as exc:
                raise _os_error(exc, path) from exc
            infos.append(pa_fs.FileInfo(path, pa_fs.FileType.File, size=meta["size"]))
        return infos

    def _read(self, path: str) -> pa.BufferReader:
        import obstore

        try:
            data = obstore.get(self.store, self._key(path)).bytes()
        except Exception as exc:
            raise _os_error(exc, path) from exc
        return pa.BufferReader(pa.py_buffer(data))

    def open_input_file(self, path: str) -> pa.BufferReader:
        return self._read(path)

    def open_input_stream(self, path: str) -> pa.BufferReader:
        return self._read(path)

    def put(self, path: str, data: bytes | pa.Buffer) -> None:
        """Write ``data`` whole as ``path`` (one PUT; parts above 10 MiB).

        Raises:
            OSError: the store refused it (its message).
        """
        import obstore

        payload = data.to_pybytes() if isinstance(data, pa.Buffer) else bytes(data)
        try:
            obstore.put(
                self.store,
                self._key(path),
                payload,
                use_multipart=len(payload) > _MULTIPART_BYTES,
            )
        except Exception as exc:
            raise _os_error(exc, path) from exc

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("cdcflow's object files read and write whole files only")

    get_file_info_selector = _unsupported
    create_dir = _unsupported
    delete_dir = _unsupported
    delete_dir_contents = _unsupported
    delete_root_dir_contents = _unsupported
    delete_file = _unsupported
    move = _unsupported
    copy_file = _unsupported
    open_output_stream = _unsupported
    open_append_stream = _unsupported


def object_files(
    table_uri: str, storage_options: Mapping[str, str] | None
) -> pa_fs.PyFileSystem | None:
    """A pyarrow file system over obstore rooted at ``table_uri`` (an object store's URI),
    or ``None`` where delta-rs's file system must stay (module docstring: no credentials
    object_store finds, or options obstore refuses)."""
    options = dict(storage_options or {})
    parts = urlsplit(table_uri)
    if not parts.netloc or not _has_credentials(parts.scheme, options):
        return None
    store = _store(f"{parts.scheme}://{parts.netloc}", options)
    if store is None:
        return None
    return pa_fs.PyFileSystem(ObjectFiles(store, parts.path))

"""What a failed Delta read or write means, and what the operator should do about it.

delta-rs reports storage failures as ``DeltaError``/``OSError`` whose first line carries
the OS error (``No space left on device (os error 28)``, ``Permission denied (os error
13)``) or the log reader's complaint (``Kernel error: Json error: Truncated record``),
followed by a Rust backtrace. :func:`storage_error` turns one into a
:class:`~cdcflow.errors.StorageError`: one line naming the table, its path, the cause and
the fix, and a ``kind`` that decides its reach (decision 25):

- ``full``, ``read_only``: the volume refuses every write; the run stops (exit 74) and
  the micro-batch is applied again on the next run (nothing was completed);
- ``unreachable`` (an object store that does not answer: connection refused, DNS, time-outs
  after delta-rs's own retries), ``unavailable`` (it answers, but with 5xx errors, such as
  S3's ``503 SlowDown`` throttling, beyond delta-rs's retries), ``missing`` (no such bucket
  or container): no table can escape them; the run stops (exit 74) as for ``full``;
- ``permission``, ``damaged``, ``other``: a fault of that one table; a mirror with such a
  fault is stopped alone (:class:`~cdcflow.apply.batch.BatchApplier`), a ``_cdcflow``
  system table stops the run.
"""

from __future__ import annotations

import os
import re

from cdcflow.errors import StorageError

__all__ = ["GLOBAL_KINDS", "conditional_put_error", "storage_error"]

#: kinds that no table can escape: the run stops instead of stopping tables one by one
GLOBAL_KINDS = frozenset({"full", "read_only", "unreachable", "unavailable", "missing"})

_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("full", re.compile(r"no space left on device|disk quota exceeded|os error (28|122)\b", re.I)),
    ("read_only", re.compile(r"read-only file system|os error 30\b", re.I)),
    (
        "permission",
        re.compile(
            r"permission denied|os error 13\b|operation not permitted|accessdenied|forbidden"
            r"|invalidaccesskeyid|signaturedoesnotmatch|authorizationfailure|authenticationfailed"
            r"|403 forbidden|401 unauthorized",
            re.I,
        ),
    ),
    (
        "missing",
        re.compile(
            r"nosuchbucket|containernotfound|bucket.{0,40}not (exist|found)"
            r"|list request.{0,200}404 not found",
            re.I,
        ),
    ),
    (
        # object_store's "Server returned non-2xx status code: 503 Service Unavailable:
        # <Error><Code>SlowDown</Code>..." once its retries are spent
        "unavailable",
        re.compile(
            r"non-2xx status code: 5\d\d|<code>(slowdown|internalerror|serviceunavailable)</code>",
            re.I,
        ),
    ),
    (
        "unreachable",
        re.compile(
            r"connection refused|error sending request|dns error|failed to lookup address"
            r"|tcp connect error|connection reset|timed out|deadline has elapsed",
            re.I,
        ),
    ),
    (
        "damaged",
        re.compile(
            r"json error|invalid json|truncated|failed to read delta log|invalid table version"
            r"|parquet magic|corrupt|unexpected end|eof while parsing",
            re.I,
        ),
    ),
)

_FIXES = {
    "full": "free space on the volume of {path} (or raise its quota), then run again; "
    "nothing is lost: an unfinished micro-batch is applied again from its Kafka offsets",
    "read_only": "make {path} writable, then run again; nothing is lost: an unfinished "
    "micro-batch is applied again from its Kafka offsets",
    "permission": "give the user running cdcflow read and write access to {path} and "
    "everything under it",
    "damaged": "its Delta log ({path}/_delta_log) is damaged: restore the table from a "
    "backup, or remove a last commit file that a crash left incomplete",
    "missing": "create the folder {path}, or correct the warehouse path",
    "unreachable": "check that {path} is reachable from this machine, then run again",
    "unavailable": "the store failed or throttled requests beyond the retries; run again "
    "when it recovers",
    "other": "see the log above for the full error",
}

#: the fixes that differ for a warehouse on an object store (``s3://``, ``abfss://``, ``gs://``)
_REMOTE_FIXES = {
    "permission": "give the storage credentials (the storage: section, or the provider's "
    "default chain) read, write, list and delete on {path}",
    "missing": "create the bucket (or container) of {path}, or correct the warehouse URI",
    "unavailable": "the store answered with server errors (5xx, such as 503 SlowDown "
    "throttling) beyond delta-rs's retries (storage: max_retries, retry_timeout); run again "
    "when it recovers; nothing is lost: an unfinished micro-batch is applied again from its "
    "Kafka offsets",
    "unreachable": "check the store's endpoint (storage: aws_endpoint_url, "
    "azure_storage_endpoint, ...) and that it is reachable from this machine, then run "
    "again; nothing is lost: an unfinished micro-batch is applied again from its Kafka offsets",
}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(exc: BaseException) -> str:
    """The error's first line with its causes (object_store's ``↳`` lines) folded in;
    the backtrace delta-rs appends is left out."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).strip().splitlines()]
    if not lines or not lines[0]:
        return type(exc).__name__
    parts = [lines[0]]
    for line in lines[1:]:
        if not line.startswith("↳"):
            break
        parts.append(line.removeprefix("↳").strip())
    text = ": ".join(parts).removeprefix("Kernel error: ")
    return text if len(text) <= 300 else text[:297] + "..."


def _accessible(path: str) -> bool:
    """Whether this process (its effective user) may read and write ``path``."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.R_OK | os.W_OK | os.X_OK, effective_ids=effective)


def _kind(exc: BaseException, cause: str, path: str) -> str:
    if isinstance(exc, PermissionError):
        return "permission"
    errno = getattr(exc, "errno", None)
    if errno in (28, 122):
        return "full"
    text = f"{cause}\n{exc}"
    for kind, pattern in _KINDS:
        if pattern.search(text):
            return kind
    if "://" not in path:
        # delta-rs says only "Generic LocalFileSystem error" for an unreadable folder
        try:
            os.stat(path)
        except PermissionError:
            return "permission"
        except OSError:
            return "other"
        if not _accessible(path):
            return "permission"
    return "other"


def storage_error(exc: BaseException, path: str, target: str | None = None) -> StorageError:
    """The :class:`~cdcflow.errors.StorageError` for ``exc`` raised reading or writing the
    Delta table at ``path``.

    Args:
        exc: the error delta-rs (or the OS) raised; a ``StorageError`` is returned as is.
        path: the table's folder or URI.
        target: the mirror's name; ``None`` for a ``_cdcflow`` system table.

    Returns:
        A one-line error: ``table T (PATH): CAUSE. Fix: ...`` (``PATH: CAUSE. Fix: ...``
        for a system table), with ``kind`` one of ``full``, ``read_only``,
        ``unreachable``, ``unavailable``, ``missing``, ``permission``, ``damaged``,
        ``other``.
    """
    if isinstance(exc, StorageError):
        return exc
    cause = _first_line(exc)
    kind = _kind(exc, cause, path)
    where = f"table {target} ({path})" if target else path
    fixes = _REMOTE_FIXES if "://" in path and kind in _REMOTE_FIXES else _FIXES
    message = f"{where}: {cause}. Fix: {fixes[kind].format(path=path)}"
    return StorageError(message, path=path, target=target, kind=kind, cause=cause)


def conditional_put_error(root: str, provider: str) -> StorageError:
    """The store accepted a second commit of one Delta version (it overwrote the first):
    it has no put-if-absent, so neither the lease nor exactly-once commits can hold.

    Returns:
        A one-line :class:`~cdcflow.errors.StorageError` of kind ``conditional_put``,
        with the fix for ``provider`` (``s3``, ``azure``, ``gcs``, ``local``).
    """
    fixes = {
        "s3": "an S3-compatible store must answer If-None-Match: * with 412 (AWS S3 does "
        "since 2024; MinIO and Ceph need a recent release); MinIO's older releases take "
        "storage: {aws_conditional_put: etag} (docs/configuration.md, storage)",
        "azure": "check that the account is ADLS Gen2 or Blob storage and not a proxy "
        "that drops If-None-Match",
        "gcs": "check that no proxy drops the ifGenerationMatch precondition",
        "local": "the file system must support hard links or renames that do not "
        "replace (NFS and some FUSE mounts do not)",
    }
    cause = "a second commit of one table version was accepted"
    return StorageError(
        f"{root}: {cause}. Fix: {fixes.get(provider, fixes['s3'])}",
        path=root,
        target=None,
        kind="conditional_put",
        cause=cause,
    )

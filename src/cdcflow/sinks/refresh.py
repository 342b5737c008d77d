"""Cached delta-rs table handles kept as cheap on the thousandth commit as on the first.

A pipeline keeps one handle per table open for as long as it runs and commits through it
every micro-batch. Two costs of such a handle grow with the log unless they are kept in
check (decision 49):

- **How far behind it is.** ``create_write_transaction`` (the Arrow merge's commit)
  does not move the handle to the version it committed, and a commit through a handle
  N versions behind checks itself against those N commits: measured here, empty commits
  through a handle never refreshed cost 36 ms 100 versions on, 208 ms at 400 and 384 ms
  at 1,000, and 50-70 ms when the handle was opened again every 100 versions. Every
  cached handle is refreshed before use (:func:`refresh`), and :func:`worn` also opens
  it again from the latest checkpoint every :data:`REOPEN_AFTER_VERSIONS`, so what a
  handle carries stays bounded whatever delta-rs keeps in it.
- **Its refresh.** delta-rs (``DeltaTable.update_incremental``) finds newer versions by
  listing ``_delta_log`` from the current one. An object store lists from that offset
  (S3's ``start-after``), but a local folder is listed whole, so on a local warehouse a
  refresh costs what the retained log weighs, and a table committed to every second
  keeps 2.6M commit files over Delta's default 30 days of log retention.
  :func:`refresh` looks for the next commit file first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import unquote, urlparse

from deltalake import DeltaTable, PostCommitHookProperties

__all__ = [
    "CHECKPOINT_INTERVAL",
    "REOPEN_AFTER_VERSIONS",
    "commit_hooks",
    "current",
    "local_path",
    "refresh",
    "worn",
]

#: a handle is opened again once it has moved this many versions past its opening: the
#: checkpoint interval delta-rs writes at (``delta.checkpointInterval``, 100), so the new
#: handle starts from a checkpoint no older than that
REOPEN_AFTER_VERSIONS = 100

#: delta-rs 1.6 writes a checkpoint with each commit of a version ``v`` where
#: ``(v + 1) % CHECKPOINT_INTERVAL == 0`` (``delta.checkpointInterval``, whose default
#: cdcflow keeps): versions 99, 199, ...
CHECKPOINT_INTERVAL = 100


def commit_hooks(table: DeltaTable | None) -> PostCommitHookProperties:
    """delta-rs's post-commit hooks for a commit through ``table`` (``None``: a table
    being created): the log's expired files are cleaned up only by the commit after a
    checkpoint (versions 100, 200, ...).

    delta-rs 1.6 cleans up after every commit, listing the whole ``_delta_log`` each time
    (measured on S3: one more LIST per commit, growing a page per 1,000 files; a table
    committed to every second keeps 86,400 commit files over cdcflow's 24 hours of log
    retention, decision 52). A clean-up removes only files older than the last
    checkpoint, and they expire by the hour, so one per :data:`CHECKPOINT_INTERVAL`
    commits keeps the log as short. A commit that lost a race lands a version later and
    skips this clean-up; the next interval's makes it.
    """
    next_version = 0 if table is None else table.version() + 1
    return PostCommitHookProperties(
        create_checkpoint=True,
        cleanup_expired_logs=next_version % CHECKPOINT_INTERVAL == 0,
    )


def current(
    table: DeltaTable | None,
    opened_version: int,
    path: str,
    storage_options: Mapping[str, str] | None = None,
) -> tuple[DeltaTable, int]:
    """The handle of the table at ``path`` to use now, and the version it was opened at:
    ``table`` (the cached handle, opened at ``opened_version``) refreshed, or a handle
    opened afresh when there is none or it is :func:`worn`.

    Raises:
        deltalake.exceptions.TableNotFoundError: there is no table at ``path``.
        deltalake.exceptions.DeltaError, OSError: its log cannot be read.
    """
    if table is not None:
        refresh(table, path)
        if not worn(table, opened_version):
            return table, opened_version
    table = DeltaTable(path, storage_options=dict(storage_options or {}) or None)
    return table, table.version()


def worn(table: DeltaTable, opened_version: int) -> bool:
    """``True`` when ``table``, opened at ``opened_version``, should be opened again: it
    has moved :data:`REOPEN_AFTER_VERSIONS` versions or more since (by refreshes or
    its own commits)."""
    return table.version() - opened_version >= REOPEN_AFTER_VERSIONS


def local_path(uri: str) -> str | None:
    """The local folder of a table at ``uri`` (a path, or a ``file://`` URL as delta-rs
    gives local tables, percent-encoded); ``None`` for an object store."""
    if uri.startswith("file://"):
        return unquote(urlparse(uri).path)
    return None if "://" in uri else uri


def refresh(table: DeltaTable, path: str) -> None:
    """Bring ``table`` (the handle of the table at ``path``) to the latest version.

    A local table's next commit file is looked for first, and the log is read only when
    there is one: delta-rs finds newer versions by listing ``_delta_log``, and a local
    folder is listed whole whatever the offset, so every refresh would cost what the
    retained log weighs (a table committed to every second for its 30 days of log
    retention holds 2.6M files). Commit files are numbered without gaps and
    each appears whole (written aside, then linked in), so no next file means no newer
    version. When the handle's own commit file has been cleaned up (its version older
    than the log's retention), the log is listed as delta-rs lists it. Object stores are
    asked as delta-rs asks them (listed from an offset).
    """
    local = local_path(path)
    if local is not None:
        log = os.path.join(local, "_delta_log")
        version = table.version()
        newer = os.path.exists(os.path.join(log, f"{version + 1:020d}.json"))
        # the handle's own commit file gone: the log was cleaned up past it, and the
        # versions after it may have been too; delta-rs lists what there is
        if not newer and os.path.exists(os.path.join(log, f"{version:020d}.json")):
            return
    table.update_incremental()

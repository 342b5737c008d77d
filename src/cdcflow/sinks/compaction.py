"""Size-tiered compaction: a table's small files merged a few at a time, so that a
compaction after a micro-batch costs about what the new files weigh, never the table.

Every micro-batch adds a file or two to each table it changes. delta-rs's
``optimize.compact`` bin-packs *every* file under its target size, so on a table
streamed into for long it rewrites the same growing files again and again: in a
10-minute run at 20k changes/s, one compaction of ``_cdcflow/changelog`` read 147 files
(about 300 MB) and held the micro-batch for 6.6 s. Compacting only files under a
"small" size instead left a table of 1 MB files (a mirror growing by 20k new keys a
batch) with hundreds of files nothing ever merged.

The plan here is the size-tiered compaction of LSM stores (Cassandra's STCS, Paimon's
universal compaction; ``compaction.min.file-num`` there is ``compact_min_files`` here):

- a file's **tier** is 0 below ``small_file_bytes`` and ``1 + log_fanout(size /
  small_file_bytes)`` above, with the fanout ``compact_min_files``: 1 MiB and 16 give
  tiers below 1 MiB, 1-16 MiB, 16-256 MiB, ...;
- a file of more than half the table's target size is **done** (no two of them fit in
  one file of the target);
- a tier with ``compact_min_files`` files or more gets **one job**: its oldest files, as
  many as fit in the target size together (at least two). Each byte is rewritten about
  once per tier, a handful of times in all, and no job reads more than the target.

A job reads its files (in age order; a mirror's rows sorted by key, which are its NOT
NULL columns, so merged files stay clustered), writes them as one file with statistics
(:func:`~cdcflow.sinks.arrow_merge.write_data_files`; one file, so a job's output is
never a set of files of the tier it came from, compacted again), and commits the adds and removes
with ``dataChange = false`` (Delta's protocol: a rearrangement of data; streaming
readers skip it) on the version it read, with no retry: a table another writer changed
meanwhile is compacted at a later batch. Partitioned tables are left to delta-rs's
``optimize.compact`` (:mod:`cdcflow.sinks.maintenance`).

Source documents: Delta transaction protocol, "Add File and Remove File" (``dataChange``);
Apache Paimon, "Compaction" (``num-sorted-run.compaction-trigger``); Cassandra,
"Size-tiered compaction strategy".
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from cdcflow.sinks.arrow_merge import table_filesystem, write_data_files

__all__ = ["DataFile", "compact_once", "plan", "tier"]


@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file of a table's current version."""

    path: str
    size_bytes: int
    modification_time_ms: int


def tier(size_bytes: int, small_file_bytes: int, fanout: int) -> int:
    """The size tier of a file: 0 below ``small_file_bytes``, then one tier per factor of
    ``fanout`` (module docstring)."""
    if size_bytes < small_file_bytes:
        return 0
    return 1 + int(math.log(size_bytes / small_file_bytes, max(2, fanout)))


def plan(
    files: Sequence[DataFile], small_file_bytes: int, target_file_bytes: int, min_files: int
) -> list[DataFile]:
    """The next compaction job of a table: files to merge into one (or none).

    Args:
        files: the table's data files.
        small_file_bytes: tier 0 is below this.
        target_file_bytes: no job reads more than this; a file over half of it is done.
        min_files: a tier is compacted from this many files (and the tiers' fanout).

    Returns:
        The job's files, oldest first (at least two), from the lowest tier that is due;
        ``[]`` when no tier is.
    """
    tiers: dict[int, list[DataFile]] = {}
    for f in files:
        if f.size_bytes * 2 <= target_file_bytes:
            tiers.setdefault(tier(f.size_bytes, small_file_bytes, min_files), []).append(f)
    for level in sorted(tiers):
        candidates = tiers[level]
        if len(candidates) < min_files:
            continue
        job, total = [], 0
        for f in sorted(candidates, key=lambda f: (f.modification_time_ms, f.path)):
            if total + f.size_bytes <= target_file_bytes:
                job.append(f)
                total += f.size_bytes
        if len(job) >= 2:
            return job
    return []


def data_files(table: DeltaTable) -> list[DataFile]:
    """The data files of the table's current version."""
    adds = pa.table(table.get_add_actions(flatten=False))
    return [
        DataFile(path, size, mtime)
        for path, size, mtime in zip(
            adds["path"].to_pylist(),
            adds["size_bytes"].to_pylist(),
            adds["modification_time"].to_pylist(),
            strict=True,
        )
    ]


def compact_once(
    table: DeltaTable,
    small_file_bytes: int,
    target_file_bytes: int,
    min_files: int,
    sort_by_key: bool,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run the table's next compaction job (:func:`plan`), if it has one.

    Args:
        table: an unpartitioned Delta table, refreshed.
        small_file_bytes, target_file_bytes, min_files: as :func:`plan` takes them.
        sort_by_key: sort the merged rows by the table's NOT NULL columns (a mirror's key).
        storage_options: the warehouse's, to read and write the table's files.

    Returns:
        Metrics: ``numFilesRemoved``, ``numFilesAdded``, ``bytesRemoved``,
        ``bytesAdded`` (all 0 when no job was due) and ``more`` (another job is due).

    Raises:
        deltalake.exceptions.CommitFailedError: another writer committed since the table
            was read; nothing changed (the written files are left for vacuum).
    """
    files = data_files(table)
    job = plan(files, small_file_bytes, target_file_bytes, min_files)
    metrics: dict[str, Any] = {
        "numFilesRemoved": 0,
        "numFilesAdded": 0,
        "bytesRemoved": 0,
        "bytesAdded": 0,
        "more": False,
    }
    if not job:
        return metrics
    schema = pa.schema(table.schema().to_arrow())
    filesystem = table_filesystem(table.table_uri, storage_options)
    # read on pyarrow's threads; columns a file predates are read as nulls
    rows = pads.FileSystemDataset.from_paths(
        [f.path for f in job], schema, pads.ParquetFileFormat(), filesystem
    ).to_table()
    key = [f.name for f in schema if not f.nullable]
    if sort_by_key and key and rows.num_rows > 1:
        rows = rows.take(pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in key]))
    now_ms = int(time.time() * 1000)
    adds = write_data_files(filesystem, rows, now_ms, single_file=True, data_change=False)
    removes: list[AddAction | RemoveAction] = [
        RemoveAction(f.path, False, now_ms, f.size_bytes) for f in job
    ]
    table.create_write_transaction(
        removes + list(adds),
        "append",
        table.schema(),
        commit_properties=CommitProperties(
            custom_metadata={"cdcflow.operation": "compaction"}, max_commit_retries=0
        ),
    )
    done = {f.path for f in job}
    after = [f for f in files if f.path not in done]
    after += [DataFile(a.path, a.size, now_ms) for a in adds]
    metrics.update(
        more=bool(plan(after, small_file_bytes, target_file_bytes, min_files)),
        numFilesRemoved=len(job),
        numFilesAdded=len(adds),
        bytesRemoved=sum(f.size_bytes for f in job),
        bytesAdded=sum(a.size for a in adds),
    )
    return metrics

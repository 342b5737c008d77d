"""The mirror merge computed in Arrow and committed as file actions: a cost that follows
the change, not the mirror.

:func:`rewrite_actions` finds the data files a micro-batch's keys can be in from the
files' key bounds in the Delta log (:func:`~cdcflow.sinks.file_stats.files_in_range`),
reads the key columns of those alone, and rewrites only the files that hold one of the
keys, each on its own (on up to :data:`FILE_THREADS` threads): its rows and the batch's
changes are merged by an Arrow hash join on the key (stored rows keep their order, an
updated row its place) and written as new files of about :data:`TARGET_FILE_BYTES`,
each with min/max statistics (:func:`~cdcflow.sinks.file_stats.file_stats`). The keys
no file holds are inserted as files of their own, sorted by key. One commit removes the files read and adds
the new ones, so readers see the old or the new rows, never a mix; a concurrent writer
that removed a file read here makes the commit fail (delta-rs's conflict check).

So a batch of new keys (an auto-increment table growing) rewrites nothing, a batch of
recent keys rewrites the last files, and a batch of keys spread over the whole mirror
rewrites every file, as delta-rs's MERGE does (issue 18, bench/merge_scale.py).

The rules are the SQL merge's (:func:`cdcflow.sinks.merge.merge_expressions`,
docs/semantics.md): a stored row is overwritten or deleted only by a row with a sequence
>= its own (or either NULL); a column a partial image lacks keeps its stored value, and so
does one an older change of the batch set when the stored row is newer than it; a
soft-deleting mirror flags ``_deleted``; a keyless table matches NULL-safely.

A mirror with a change data feed (docs/decisions.md 58) takes two things from here:
:func:`insert_actions` (a batch whose keys no stored file can hold is a blind append of
new files, which the feed's readers read as inserts) and :func:`effective_rows` (the
rows of any other batch that change something, which delta-rs's or Spark's MERGE then
applies, writing the feed's ``_change_data`` files). A rewrite committed here has no
``cdc`` actions: the feed's readers would see every row of each rewritten file deleted
and inserted again.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, RemoveAction

from cdcflow.sinks.file_stats import file_stats, files_in_range, prunable
from cdcflow.sinks.merge import (
    DELETE_FLAG,
    FROM_PREFIX,
    PRESENT_PREFIX,
    SEQ_COLUMN,
    SOFT_DELETE_COLUMN,
    MergeSpec,
)
from cdcflow.sinks.object_files import ObjectFiles, object_files
from cdcflow.sinks.refresh import local_path
from cdcflow.sinks.storage import put_object

__all__ = [
    "TARGET_FILE_BYTES",
    "TARGET_FILE_ROWS",
    "effective_rows",
    "insert_actions",
    "rewrite_actions",
    "rows_per_file",
    "table_filesystem",
    "write_data_files",
]

#: most rows per data file the merge writes
TARGET_FILE_ROWS = 1_000_000
#: most Arrow bytes per data file the merge writes (about 8-16 MB of Parquet): a merge
#: rewrites whole files, so smaller files cost less per key changed; compaction
#: (issue 18, part 3) keeps their number bounded
TARGET_FILE_BYTES = 32 * 1024 * 1024

#: a table whose data files hold at most this many bytes is rewritten whole, as one file
SMALL_TABLE_BYTES = 4 * 1024 * 1024

#: a candidate file of at most this many rows is read whole at once (its key columns
#: alone first otherwise)
READ_WHOLE_ROWS = 20_000

#: files of one merge read, merged and written at once (pyarrow releases the GIL)
FILE_THREADS = min(4, os.cpu_count() or 1)

_I, _J = "__cdcflow_stored_row", "__cdcflow_source_row"


def rewrite_actions(
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    storage_options: Mapping[str, str] | None = None,
    target_file_rows: int = TARGET_FILE_ROWS,
) -> tuple[list[AddAction | RemoveAction], dict[str, Any]]:
    """The merge of ``source`` into ``table`` as file actions for one commit.

    Args:
        table: the mirror, refreshed.
        source: the checked merge source, at least one row.
        spec: columns, keys (matched with ``=``, NULL-safely when ``null_safe``), soft delete.
        storage_options: the warehouse's, to read and write the table's files.
        target_file_rows: most rows per data file written.

    Returns:
        ``(actions, metrics)``: no actions when nothing changes; metrics named as
        delta-rs names its merge's, plus ``num_target_files_scanned`` (files whose key
        columns were read) and ``num_target_files_skipped`` (ruled out by their bounds).
    """
    schema = pa.schema(table.schema().to_arrow())
    source = _cast_like(source, schema)
    filesystem = table_filesystem(table.table_uri, storage_options)
    files = pa.table(table.get_add_actions(flatten=True))
    now_ms = int(time.time() * 1000)
    if 0 < (pc.sum(files["size_bytes"]).as_py() or 0) <= SMALL_TABLE_BYTES:
        return _rewrite_small_table(filesystem, files, schema, source, spec, now_ms)
    candidates = _candidate_files(files, source, spec, schema)

    def rewrite(candidate: tuple[str, int | None]) -> _Rewritten | None:
        stored = _read_if_holding(filesystem, schema, candidate, source, spec)
        if stored is None:
            return None
        rows, matched, metrics = merged_rows(stored, source, schema, spec)
        adds = write_data_files(filesystem, rows, now_ms, target_file_rows)
        return _Rewritten(candidate[0], adds, matched, metrics)

    if len(candidates) > 1:  # files are read, merged and written on threads of their own
        with ThreadPoolExecutor(min(FILE_THREADS, len(candidates))) as pool:
            done = list(pool.map(rewrite, candidates))
    else:
        done = [rewrite(c) for c in candidates]
    rewritten = [r for r in done if r is not None]

    sizes = dict(zip(files["path"].to_pylist(), files["size_bytes"].to_pylist(), strict=True))
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(r.path, True, now_ms, sizes.get(r.path)) for r in rewritten
    ]
    matched = np.zeros(source.num_rows, dtype=bool)
    metrics = dict.fromkeys(_COUNTS, 0)
    for r in rewritten:
        actions += r.adds
        matched[r.matched] = True
        for name in _COUNTS:
            metrics[name] += r.metrics[name]
    inserts = _new_rows(source, schema, matched, spec)
    actions += write_data_files(filesystem, inserts, now_ms, target_file_rows)
    metrics["num_source_rows"] = source.num_rows
    metrics["num_target_rows_inserted"] = inserts.num_rows
    metrics["num_target_files_scanned"] = len(candidates)
    metrics["num_target_files_skipped"] = files.num_rows - len(candidates)
    metrics["num_target_files_removed"] = len(rewritten)
    metrics["num_target_files_added"] = len(actions) - len(rewritten)
    return actions, metrics


def insert_actions(
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    storage_options: Mapping[str, str] | None = None,
    target_file_rows: int = TARGET_FILE_ROWS,
) -> tuple[list[AddAction], dict[str, Any]] | None:
    """The merge of ``source`` into ``table`` as add actions alone, when it inserts only:
    no stored file can hold one of the source's keys by the bounds of its first key
    column in the Delta log (no file is read). ``None`` otherwise: some file may hold
    one (or the keys cannot be pruned: a NULL-safe match, a type without bounds).

    Exact: a key outside every file's bounds is in no stored row (a bound is never
    narrower than the data, :mod:`cdcflow.sinks.file_stats`), so each source upsert is
    an insert and each source delete removes nothing. The files are written in the
    table's folder, as :func:`rewrite_actions` writes new keys (sorted by key); the
    small-table path's whole rewrite is not taken.

    Args:
        table: the mirror, refreshed; unpartitioned.
        source: the checked merge source, at least one row.
        spec: columns, keys, soft delete.
        storage_options: the warehouse's, to write the table's files.
        target_file_rows: most rows per data file written.

    Returns:
        ``(adds, metrics)`` (no adds when the source holds deletes only) or ``None``;
        metrics named as :func:`rewrite_actions` names them.
    """
    schema = pa.schema(table.schema().to_arrow())
    source = _cast_like(source, schema)
    files = pa.table(table.get_add_actions(flatten=True))
    if _candidate_files(files, source, spec, schema):
        return None
    inserts = _new_rows(source, schema, np.zeros(source.num_rows, dtype=bool), spec)
    filesystem = table_filesystem(table.table_uri, storage_options)
    adds = write_data_files(filesystem, inserts, int(time.time() * 1000), target_file_rows)
    metrics: dict[str, Any] = {
        **dict.fromkeys(_COUNTS, 0),
        "num_source_rows": source.num_rows,
        "num_target_rows_inserted": inserts.num_rows,
        "num_target_files_scanned": 0,
        "num_target_files_skipped": files.num_rows,
        "num_target_files_removed": 0,
        "num_target_files_added": len(adds),
    }
    return adds, metrics


def effective_rows(
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    storage_options: Mapping[str, str] | None = None,
) -> np.ndarray:
    """Which rows of the checked merge source change the mirror: one bool per row.

    A row changes nothing when it is a delete of a key no stored row has, when its
    sequence is older than the stored row's (the guard), or when what it would write is
    what the row holds (a change delivered twice; a soft delete of a row flagged by the
    same delete). The rules are :func:`merged_rows`'s. The stored rows of the source's
    keys are read from the files the first key column's bounds leave
    (:func:`_candidate_files`), filtered to its values; a partitioned table's through
    delta-rs's dataset (pruned by partition values); a NULL-safe match (a keyless
    table) reads every row.

    A change data feed's merges take only these rows (docs/decisions.md 58), for two
    bugs measured here: delta-rs 1.6.6 with ``delta.enableChangeDataFeed`` fails a MERGE
    that inserts a row while another source row meets no clause ("Invalid data found:
    1 rows failed validation check": the left out row, all NULL, meets the NOT NULL key);
    Delta Spark 4.4's MERGE that changes nothing still rewrites the files of the rows
    it matched, with no ``cdc`` files, so the feed's readers see those rows deleted and
    inserted again.
    """
    schema = pa.schema(table.schema().to_arrow())
    source = _cast_like(source, schema)
    keys = list(spec.key_columns)
    wanted = None
    if not spec.null_safe:
        wanted = pc.field(keys[0]).isin(pc.drop_null(pc.unique(source[keys[0]].combine_chunks())))
    if table.metadata().partition_columns:
        stored = table.to_pyarrow_dataset().to_table(filter=wanted)
    else:
        files = pa.table(table.get_add_actions(flatten=True))
        paths = [path for path, _ in _candidate_files(files, source, spec, schema)]
        filesystem = table_filesystem(table.table_uri, storage_options)
        dataset = pads.FileSystemDataset.from_paths(
            paths, schema, pads.ParquetFileFormat(), filesystem
        )
        stored = dataset.to_table(filter=wanted)
    stored = pa.table({f.name: stored[f.name].cast(f.type) for f in schema}, schema=schema)
    is_delete = _delete_flags(source)
    effective = ~is_delete  # no stored row: an upsert inserts, a delete removes nothing
    i, j = _matches(stored, source, spec.key_columns, spec.null_safe)
    if not len(j):
        return effective
    stored_seq = stored[SEQ_COLUMN].combine_chunks().take(pa.array(i))
    source_seq = source[SEQ_COLUMN].combine_chunks().take(pa.array(j))
    newer = pc.fill_null(pc.greater_equal(source_seq, stored_seq), True).to_numpy(
        zero_copy_only=False
    )
    effective[j] = newer  # a hard delete of a stored row always changes it
    updating = newer & ~is_delete[j]
    flagging = newer & is_delete[j] if spec.soft_delete else np.zeros(len(j), dtype=bool)
    for rows, pairs in (
        (_updated_rows(stored, source, schema, i[updating], j[updating], spec), updating),
        (_soft_deleted_rows(stored, source, schema, i[flagging], j[flagging]), flagging),
    ):
        if rows.num_rows:
            same = _same_rows(rows, stored.take(pa.array(i[pairs], pa.int64())))
            effective[j[pairs][same]] = False
    return effective


def _same_rows(left: pa.Table, right: pa.Table) -> np.ndarray:
    """Row by row, whether two tables of one schema hold equal values in every column
    (NULL equals NULL; a NaN never equals, so such a row counts as changed)."""
    same = np.ones(left.num_rows, dtype=bool)
    for name in left.column_names:
        a, b = left[name].combine_chunks(), right[name].combine_chunks()
        try:
            equal = pc.fill_null(pc.equal(a, b), False)
            both_null = pc.and_(pc.is_null(a), pc.is_null(b))
            column = pc.or_(equal, both_null).to_numpy(zero_copy_only=False)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested types
            column = np.array(
                [x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], dtype=bool
            )
        same &= column
    return same


def _rewrite_small_table(
    filesystem: pa_fs.FileSystem,
    files: pa.Table,
    schema: pa.Schema,
    source: pa.Table,
    spec: MergeSpec,
    now_ms: int,
) -> tuple[list[AddAction | RemoveAction], dict[str, Any]]:
    """A table of at most :data:`SMALL_TABLE_BYTES` is read and written whole, as one
    file sorted by key: a small table stays one file however many batches change it (a
    file for each batch's new keys would make hundreds of small tables slower every
    batch), and it is clustered by key when it outgrows this."""
    paths = files["path"].to_pylist()
    parts = [
        pads.ParquetFileFormat().make_fragment(p, filesystem).to_table(schema=schema) for p in paths
    ]
    stored = pa.concat_tables(parts) if parts else schema.empty_table()
    rows, matched_rows, counts = merged_rows(stored, source, schema, spec)
    matched = np.zeros(source.num_rows, dtype=bool)
    matched[matched_rows] = True
    inserts = _new_rows(source, schema, matched, spec)
    metrics: dict[str, Any] = {
        **counts,
        "num_source_rows": source.num_rows,
        "num_target_rows_inserted": inserts.num_rows,
        "num_target_files_scanned": len(paths),
        "num_target_files_skipped": 0,
        "num_target_files_removed": 0,
        "num_target_files_added": 0,
    }
    changed = counts["num_target_rows_updated"] + counts["num_target_rows_deleted"]
    if not changed and not inserts.num_rows:
        return [], metrics  # every change was older than the stored rows
    rows = pa.concat_tables([rows, inserts])
    if rows.num_rows > 1:
        order = [(k, "ascending") for k in spec.key_columns]
        rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    sizes = files["size_bytes"].to_pylist()
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(p, True, now_ms, size) for p, size in zip(paths, sizes, strict=True)
    ]
    adds = write_data_files(filesystem, rows, now_ms)
    metrics["num_target_files_removed"] = len(paths)
    metrics["num_target_files_added"] = len(adds)
    return actions + adds, metrics


@dataclass(frozen=True, slots=True)
class _Rewritten:
    """One data file rewritten: its path, the files written in its place, which source
    rows matched one of its rows, and its merge counts."""

    path: str
    adds: list[AddAction]
    matched: np.ndarray
    metrics: dict[str, int]


#: the counts :func:`merged_rows` gives per file, summed over the files of a merge
_COUNTS = ("num_target_rows_updated", "num_target_rows_deleted", "num_target_rows_copied")


def _write_parquet(filesystem: pa_fs.FileSystem, path: str, part: pa.Table) -> int:
    """Write ``part`` as the Parquet file ``path``; its size in bytes. On an object
    store the file is made in memory and uploaded whole: asking the store for its size
    cost a LIST and a HEAD per file (delta-rs's file system)."""
    handler = getattr(filesystem, "handler", None)
    if isinstance(handler, (DeltaStorageHandler, ObjectFiles)):
        sink = pa.BufferOutputStream()
        pq.write_table(part, sink, compression="snappy")
        data = sink.getvalue()
        if isinstance(handler, ObjectFiles):
            handler.put(path, data)
        else:
            put_object(handler, path, data)
        return int(data.size)
    pq.write_table(part, path, filesystem=filesystem, compression="snappy")
    return int(filesystem.get_file_info(path).size)


def table_filesystem(
    table_uri: str, storage_options: Mapping[str, str] | None = None
) -> pa_fs.FileSystem:
    """A pyarrow file system rooted at the table's folder: the local one for a local
    table (no Python call per read or write, so parallel applies do not queue on the
    GIL); on an object store obstore's, which waits on the store without the GIL
    (:mod:`cdcflow.sinks.object_files`), else delta-rs's."""
    local = local_path(table_uri)
    if local is not None:
        return pa_fs.SubTreeFileSystem(local, pa_fs.LocalFileSystem())
    files = object_files(table_uri, storage_options)
    if files is not None:
        return files
    return pa_fs.PyFileSystem(DeltaStorageHandler(table_uri, dict(storage_options or {}) or None))


def _candidate_files(
    files: pa.Table, source: pa.Table, spec: MergeSpec, schema: pa.Schema
) -> list[tuple[str, int | None]]:
    """``(path, rows)`` of the files the source's keys can be in, by the bounds of the
    first key column (every file when it has no prunable type, or the match is
    NULL-safe)."""
    if not files.num_rows:
        return []
    first = spec.key_columns[0]
    if not spec.null_safe and prunable(schema.field(first).type):
        files = files.filter(files_in_range(files, first, source[first].combine_chunks()))
    rows = files["num_records"] if "num_records" in files.column_names else None
    return list(
        zip(
            files["path"].to_pylist(),
            rows.to_pylist() if rows is not None else [None] * files.num_rows,
            strict=True,
        )
    )


def _read_if_holding(
    filesystem: pa_fs.FileSystem,
    schema: pa.Schema,
    candidate: tuple[str, int | None],
    source: pa.Table,
    spec: MergeSpec,
) -> pa.Table | None:
    """The rows of the file ``candidate`` (``(path, rows)``) when it holds one of the
    source's keys, else ``None``. A file of more than :data:`READ_WHOLE_ROWS` rows has
    its key columns read first, and is read whole only when it holds a key."""
    path, rows = candidate
    keys = list(spec.key_columns)
    wanted = source.select(keys)
    fragment = pads.ParquetFileFormat().make_fragment(path, filesystem)
    if rows is not None and rows <= READ_WHOLE_ROWS:
        whole = fragment.to_table(schema=schema)
        return whole if _any_match(whole, wanted, keys, spec.null_safe) else None
    stored_keys = fragment.to_table(schema=schema, columns=keys)
    if not _any_match(stored_keys, wanted, keys, spec.null_safe):
        return None
    return fragment.to_table(schema=schema)


def _any_match(stored: pa.Table, wanted: pa.Table, keys: list[str], null_safe: bool) -> bool:
    if not stored.num_rows:
        return False
    if null_safe:
        have = set(_key_tuples(wanted, keys, null_safe=True))
        return any(k in have for k in _key_tuples(stored, keys, null_safe=True))
    if len(keys) == 1:
        values = pc.drop_null(wanted[keys[0]].combine_chunks())
        return bool(pc.any(pc.is_in(stored[keys[0]], value_set=values)).as_py())
    return bool(stored.join(wanted, keys, join_type="left semi").num_rows > 0)


def _key_tuples(
    table: pa.Table, key_columns: Sequence[str], null_safe: bool
) -> list[tuple[Any, ...] | None]:
    """Each row's key values as a tuple; ``None`` for a key that matches nothing (a NULL
    value in it, unless ``null_safe``: SQL ``=`` versus ``IS NOT DISTINCT FROM``)."""
    values = zip(*(table[k].to_pylist() for k in key_columns), strict=True)
    if null_safe:
        return list(values)
    return [None if None in key else key for key in values]


def _cast_like(source: pa.Table, schema: pa.Schema) -> pa.Table:
    """``source`` with the columns ``schema`` also has cast to its types (others kept)."""
    names = set(schema.names)
    return pa.table(
        {
            c: source[c].cast(schema.field(c).type) if c in names else source[c]
            for c in source.column_names
        }
    )


def _matches(
    stored: pa.Table, source: pa.Table, key_columns: Sequence[str], null_safe: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(stored rows, source rows)``: the pairs whose keys are equal (each stored row at
    most once; a source key given twice matches its last row, as a dict would)."""
    if null_safe:
        source_row = {k: j for j, k in enumerate(_key_tuples(source, key_columns, True))}
        pairs = [
            (i, source_row[k])
            for i, k in enumerate(_key_tuples(stored, key_columns, True))
            if k in source_row
        ]
        return (
            np.array([i for i, _ in pairs], dtype=np.int64),
            np.array([j for _, j in pairs], dtype=np.int64),
        )
    keys = list(key_columns)
    left = stored.select(keys).append_column(_I, pa.array(np.arange(stored.num_rows)))
    right = source.select(keys).append_column(_J, pa.array(np.arange(source.num_rows)))
    if pc.count_distinct(right[keys[0]]).as_py() < right.num_rows or len(keys) > 1:
        last = right.group_by(keys, use_threads=False).aggregate([(_J, "max")])
        right = pa.table({**{k: last[k] for k in keys}, _J: last[f"{_J}_max"]})
    pairs = left.join(right, keys, join_type="inner", use_threads=False)
    return (
        pairs[_I].to_numpy().astype(np.int64, copy=False),
        pairs[_J].to_numpy().astype(np.int64, copy=False),
    )


def merged_rows(
    stored: pa.Table, source: pa.Table, schema: pa.Schema, spec: MergeSpec
) -> tuple[pa.Table, np.ndarray, dict[str, int]]:
    """What the guarded MERGE of :func:`~cdcflow.sinks.engines.delta_rs_merge`
    makes of some stored rows (one data file's).

    A stored row whose key a source row has is matched. With ``newer`` (either sequence
    NULL, or the source's >= the stored one), a matched row is deleted (a source delete),
    marked ``_deleted`` with the delete's sequence and time (``soft_delete``), or updated:
    each of :attr:`MergeSpec.written` takes the source's value, except a column with a
    ``_cdc_present__`` flag that is false, which keeps the stored value; other columns
    keep theirs (``_deleted`` becomes false with ``soft_delete``). Matched rows that are
    not newer, and unmatched ones, are kept as they are. The stored rows keep their order
    (a file stays sorted by key): an updated row takes its stored row's place. Source
    upserts that matched no stored row are not here: :func:`_new_rows` inserts them.

    Args:
        stored: the rows of a file to rewrite, in ``schema``.
        source: the merge source, its data columns already in ``schema``'s types.
        schema: the table's schema (the result's).
        spec: the match columns, soft delete and NULL-safe match.

    Returns:
        ``(rows, matched, metrics)``: the rows to write in place of ``stored``, the
        source rows that matched one of them, and counts named as delta-rs's merge
        metrics.
    """
    n_stored = stored.num_rows
    i, j = _matches(stored, source, spec.key_columns, spec.null_safe)
    stored_seq = stored[SEQ_COLUMN].combine_chunks().take(pa.array(i))
    source_seq = source[SEQ_COLUMN].combine_chunks().take(pa.array(j))
    newer = pc.fill_null(pc.greater_equal(source_seq, stored_seq), True).to_numpy(
        zero_copy_only=False
    )
    is_delete = _delete_flags(source)
    deleting = newer & is_delete[j]
    updating = newer & ~is_delete[j]
    flagged = (i[deleting], j[deleting]) if spec.soft_delete else (i[:0], j[:0])
    updated = _updated_rows(stored, source, schema, i[updating], j[updating], spec)
    soft_deleted = _soft_deleted_rows(stored, source, schema, *flagged)
    place = np.arange(n_stored, dtype=np.int64)
    place[i[updating]] = n_stored + np.arange(updated.num_rows)
    place[flagged[0]] = n_stored + updated.num_rows + np.arange(soft_deleted.num_rows)
    keep = np.ones(n_stored, dtype=bool)
    if not spec.soft_delete:
        keep[i[deleting]] = False
    rows = stored
    if updated.num_rows or soft_deleted.num_rows:
        rows = pa.concat_tables([stored, updated, soft_deleted]).take(pa.array(place[keep]))
    elif not keep.all():
        rows = stored.filter(pa.array(keep))
    metrics = {
        "num_target_rows_updated": int(updating.sum()) + len(flagged[0]),
        "num_target_rows_deleted": 0 if spec.soft_delete else int(deleting.sum()),
        "num_target_rows_copied": int(n_stored - newer.sum()),
    }
    return rows, j, metrics


def _delete_flags(source: pa.Table) -> np.ndarray:
    flags: np.ndarray = (
        source[DELETE_FLAG].combine_chunks().to_numpy(zero_copy_only=False).astype(bool)
    )
    return flags


def _new_rows(
    source: pa.Table, schema: pa.Schema, matched: np.ndarray, spec: MergeSpec
) -> pa.Table:
    """The source upserts no stored row matched, as new rows sorted by key."""
    rows = _inserted_rows(source, schema, np.flatnonzero(~matched & ~_delete_flags(source)), spec)
    if rows.num_rows > 1:
        order = [(k, "ascending") for k in spec.key_columns]
        rows = rows.take(pc.sort_indices(rows, sort_keys=order))
    return rows


def _updated_rows(
    stored: pa.Table,
    source: pa.Table,
    schema: pa.Schema,
    old: np.ndarray,
    new: np.ndarray,
    spec: MergeSpec,
) -> pa.Table:
    """Stored rows ``old`` updated by source rows ``new`` (pairwise)."""
    take_old, take_new = pa.array(old, pa.int64()), pa.array(new, pa.int64())
    writes = set(spec.written)
    flags = set(source.column_names)  # a set: Table.column_names builds a new list each call
    arrays = []
    stored_seq = None
    for f in schema:
        value = stored[f.name].take(take_old)
        if f.name in writes:
            given = source[f.name].take(take_new)
            flag = PRESENT_PREFIX + f.name
            if flag in flags:
                given = pc.if_else(source[flag].take(take_new), given, value)
            since = FROM_PREFIX + f.name
            if since in flags:
                # set by an older change of the batch: only over a row not newer than it
                if stored_seq is None:
                    stored_seq = stored[SEQ_COLUMN].take(take_old)
                counts = pc.greater_equal(source[since].take(take_new), stored_seq)
                given = pc.if_else(pc.fill_null(counts, True), given, value)
            value = given
        elif spec.soft_delete and f.name == SOFT_DELETE_COLUMN:
            value = pa.array(np.zeros(len(old), dtype=bool), f.type)
        arrays.append(value)
    return pa.Table.from_arrays(arrays, schema=schema)


def _soft_deleted_rows(
    stored: pa.Table, source: pa.Table, schema: pa.Schema, old: np.ndarray, new: np.ndarray
) -> pa.Table:
    """Stored rows ``old`` marked ``_deleted`` by source deletes ``new``: the delete's
    sequence and time, the other columns unchanged."""
    take_old, take_new = pa.array(old, pa.int64()), pa.array(new, pa.int64())
    arrays = []
    for f in schema:
        if f.name == SOFT_DELETE_COLUMN:
            arrays.append(pa.array(np.ones(len(old), dtype=bool), f.type))
        elif f.name in (SEQ_COLUMN, "_cdc_ts_ms"):
            arrays.append(source[f.name].take(take_new))
        else:
            arrays.append(stored[f.name].take(take_old))
    return pa.Table.from_arrays(arrays, schema=schema)


def _inserted_rows(
    source: pa.Table, schema: pa.Schema, rows: np.ndarray, spec: MergeSpec
) -> pa.Table:
    """Source rows inserted as new rows; table columns the insert does not write are NULL."""
    take = pa.array(rows, pa.int64())
    writes = set(spec.written)
    arrays = []
    for f in schema:
        if f.name in writes:
            arrays.append(source[f.name].take(take))
        elif spec.soft_delete and f.name == SOFT_DELETE_COLUMN:
            arrays.append(pa.array(np.zeros(len(rows), dtype=bool), f.type))
        else:
            arrays.append(pa.nulls(len(rows), f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def rows_per_file(rows: pa.Table, target_file_rows: int = TARGET_FILE_ROWS) -> int:
    """Rows per data file for rows like ``rows``: at most ``target_file_rows``, and about
    :data:`TARGET_FILE_BYTES` of Arrow memory."""
    if not rows.num_rows:
        return max(1, target_file_rows)
    by_bytes: int = TARGET_FILE_BYTES * rows.num_rows // max(1, rows.nbytes)
    return max(1, min(target_file_rows, by_bytes))


def _file_count(rows: pa.Table, target_file_rows: int) -> int:
    """How many files of about equal size ``rows`` are written as: a rewritten file is
    split only past 1.5 times :data:`TARGET_FILE_BYTES` (or ``target_file_rows``), so
    rewriting a file of about the target size does not halve it."""
    by_rows: int = -(-rows.num_rows // max(1, target_file_rows))
    by_bytes: float = rows.nbytes / TARGET_FILE_BYTES
    return max(1, by_rows, round(by_bytes) if by_bytes > 1.5 else 1)


def write_data_files(
    filesystem: pa_fs.FileSystem,
    rows: pa.Table,
    now_ms: int,
    target_file_rows: int = TARGET_FILE_ROWS,
    *,
    single_file: bool = False,
    data_change: bool = True,
) -> list[AddAction]:
    """Write ``rows`` (in the order given) as data files of about equal size, at most
    ``target_file_rows`` rows and about :data:`TARGET_FILE_BYTES` each, in the table
    folder (``filesystem`` is rooted there); as one file with ``single_file`` (a
    compaction's output, :mod:`cdcflow.sinks.compaction`).

    Returns:
        One add action per file, with its statistics (:func:`file_stats`) and
        ``data_change`` (false: the rows were in the table already).
    """
    if not rows.num_rows:
        return []
    files = 1 if single_file else _file_count(rows, target_file_rows)
    per_file = -(-rows.num_rows // files)
    actions = []
    for start in range(0, rows.num_rows, per_file):
        part = rows.slice(start, per_file)
        path = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        size = _write_parquet(filesystem, path, part)
        actions.append(AddAction(path, size, {}, now_ms, data_change, file_stats(part)))
    return actions

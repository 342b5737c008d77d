"""The mirror merge computed in Arrow and committed as file actions: a cost that follows
the change, not the mirror.

:func:`rewrite_actions` finds the data files a micro-batch's keys can be in from the
files' key bounds in the Delta log (:func:`~cdcflow.sinks.file_stats.files_in_range`),
reads the key columns of those alone, and rewrites only the files that hold one of the
keys: their rows and the batch's changes are merged by an Arrow hash join on the key
(stored rows keep their order, an updated row its place; new keys follow, sorted by
key) and written as new files of at most ``target_file_rows`` rows, each with min/max
statistics (:func:`~cdcflow.sinks.file_stats.file_stats`). When no file holds a key,
the inserts are a file of their own. One commit removes the files read and adds
the new ones, so readers see the old or the new rows, never a mix; a concurrent writer
that removed a file read here makes the commit fail (delta-rs's conflict check).

So a batch of new keys (an auto-increment table growing) rewrites nothing, a batch of
recent keys rewrites the last files, and a batch of keys spread over the whole mirror
rewrites every file, as delta-rs's MERGE does (issue 18, bench/merge_cost.py).

The rules are the SQL merge's (:func:`cdcflow.sinks.merge.merge_expressions`,
docs/semantics.md): a stored row is overwritten or deleted only by a row with a sequence
>= its own (or either NULL); a column a partial image lacks keeps its stored value; a
soft-deleting mirror flags ``_deleted``; a keyless table matches NULL-safely.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

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
    PRESENT_PREFIX,
    SEQ_COLUMN,
    SOFT_DELETE_COLUMN,
    MergeSpec,
)

__all__ = ["TARGET_FILE_ROWS", "rewrite_actions", "table_filesystem", "write_data_files"]

#: rows per data file the merge writes (about 30-130 MB of Parquet for 10-50 columns)
TARGET_FILE_ROWS = 1_000_000

#: a candidate file of at most this many rows is read whole at once (its key columns
#: alone first otherwise)
READ_WHOLE_ROWS = 20_000

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
    candidates = _candidate_files(files, source, spec, schema)
    paths, stored = _files_with_keys(filesystem, schema, candidates, source, spec)
    merged, metrics = merged_rows(stored, source, schema, spec)
    now_ms = int(time.time() * 1000)
    sizes = dict(zip(files["path"].to_pylist(), files["size_bytes"].to_pylist(), strict=True))
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(path, True, now_ms, sizes.get(path)) for path in paths
    ]
    if not paths and not metrics["num_target_rows_inserted"]:
        actions = []  # nothing matched, nothing to insert
    else:
        actions += write_data_files(filesystem, merged, now_ms, target_file_rows)
    metrics["num_target_files_scanned"] = len(candidates)
    metrics["num_target_files_skipped"] = files.num_rows - len(candidates)
    metrics["num_target_files_removed"] = len(paths)
    metrics["num_target_files_added"] = len(actions) - len(paths)
    return actions, metrics


def table_filesystem(
    table_uri: str, storage_options: Mapping[str, str] | None = None
) -> pa_fs.FileSystem:
    """A pyarrow file system rooted at the table's folder: the local one for a local
    table (no Python call per read or write, so parallel applies do not queue on the
    GIL), delta-rs's object store otherwise."""
    if table_uri.startswith("file://"):  # delta-rs gives local tables as percent-encoded URLs
        local = unquote(urlparse(table_uri).path)
        return pa_fs.SubTreeFileSystem(local, pa_fs.LocalFileSystem())
    if "://" not in table_uri:
        return pa_fs.SubTreeFileSystem(table_uri, pa_fs.LocalFileSystem())
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


def _files_with_keys(
    filesystem: pa_fs.FileSystem,
    schema: pa.Schema,
    candidates: Sequence[tuple[str, int | None]],
    source: pa.Table,
    spec: MergeSpec,
) -> tuple[list[str], pa.Table]:
    """Of ``candidates`` (``(path, rows)``), the files holding at least one of the
    source's keys, and all the rows of those files. A file of more than
    :data:`READ_WHOLE_ROWS` rows has its key columns read first, and is read whole only
    when it holds a key."""
    keys = list(spec.key_columns)
    wanted = source.select(keys)
    paths, parts = [], []
    for path, rows in candidates:
        fragment = pads.ParquetFileFormat().make_fragment(path, filesystem)
        if rows is not None and rows <= READ_WHOLE_ROWS:
            whole = fragment.to_table(schema=schema)
            if _any_match(whole, wanted, keys, spec.null_safe):
                paths.append(path)
                parts.append(whole)
            continue
        stored_keys = fragment.to_table(schema=schema, columns=keys)
        if _any_match(stored_keys, wanted, keys, spec.null_safe):
            paths.append(path)
            parts.append(fragment.to_table(schema=schema))
    rows = pa.concat_tables(parts) if parts else schema.empty_table()
    return paths, rows


def _any_match(stored: pa.Table, wanted: pa.Table, keys: list[str], null_safe: bool) -> bool:
    if not stored.num_rows:
        return False
    if null_safe:
        have = set(_key_tuples(wanted, keys, null_safe=True))
        return any(k in have for k in _key_tuples(stored, keys, null_safe=True))
    if len(keys) == 1:
        values = pc.drop_null(wanted[keys[0]].combine_chunks())
        return bool(pc.any(pc.is_in(stored[keys[0]], value_set=values)).as_py())
    return stored.join(wanted, keys, join_type="left semi").num_rows > 0


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
) -> tuple[pa.Table, dict[str, int]]:
    """What the guarded MERGE of :meth:`~cdcflow.sinks.delta.DeltaWarehouse._merge`
    makes of some stored rows.

    A stored row whose key a source row has is matched. With ``newer`` (either sequence
    NULL, or the source's >= the stored one), a matched row is deleted (a source delete),
    marked ``_deleted`` with the delete's sequence and time (``soft_delete``), or updated:
    each of :attr:`MergeSpec.written` takes the source's value, except a column with a
    ``_cdc_present__`` flag that is false, which keeps the stored value; other columns
    keep theirs (``_deleted`` becomes false with ``soft_delete``). Matched rows that are
    not newer, and unmatched ones, are kept as they are. A source upsert that matched
    nothing is inserted (columns it lacks are NULL).

    Args:
        stored: the rows of the files to rewrite, in ``schema``.
        source: the merge source, its data columns already in ``schema``'s types.
        schema: the table's schema (the result's).
        spec: the match columns, soft delete and NULL-safe match.

    Returns:
        ``(rows, metrics)``: the rows to write in place of ``stored``, and counts named
        as delta-rs's merge metrics.
    """
    n_stored, n_source = stored.num_rows, source.num_rows
    i, j = _matches(stored, source, spec.key_columns, spec.null_safe)
    stored_seq = stored[SEQ_COLUMN].combine_chunks().take(pa.array(i))
    source_seq = source[SEQ_COLUMN].combine_chunks().take(pa.array(j))
    newer = pc.fill_null(pc.greater_equal(source_seq, stored_seq), True).to_numpy(
        zero_copy_only=False
    )
    is_delete = source[DELETE_FLAG].combine_chunks().to_numpy(zero_copy_only=False).astype(bool)
    deleting = newer & is_delete[j]
    updating = newer & ~is_delete[j]
    matched = np.zeros(n_source, dtype=bool)
    matched[j] = True
    inserted = np.flatnonzero(~matched & ~is_delete)
    flagged = (i[deleting], j[deleting]) if spec.soft_delete else (i[:0], j[:0])
    updated = _updated_rows(stored, source, schema, i[updating], j[updating], spec)
    soft_deleted = _soft_deleted_rows(stored, source, schema, *flagged)
    # the stored rows keep their order (a file stays sorted by key): an updated or
    # soft-deleted row takes its stored row's place, a deleted one leaves it
    place = np.arange(n_stored, dtype=np.int64)
    place[i[updating]] = n_stored + np.arange(updated.num_rows)
    place[flagged[0]] = n_stored + updated.num_rows + np.arange(soft_deleted.num_rows)
    keep = np.ones(n_stored, dtype=bool)
    if not spec.soft_delete:
        keep[i[deleting]] = False
    rewritten = stored
    if updated.num_rows or soft_deleted.num_rows:
        rewritten = pa.concat_tables([stored, updated, soft_deleted]).take(pa.array(place[keep]))
    elif not keep.all():
        rewritten = stored.filter(pa.array(keep))
    new_rows = _inserted_rows(source, schema, inserted, spec)
    order = [(k, "ascending") for k in spec.key_columns]
    if new_rows.num_rows > 1:
        new_rows = new_rows.take(pc.sort_indices(new_rows, sort_keys=order))
    metrics = {
        "num_source_rows": n_source,
        "num_target_rows_inserted": len(inserted),
        "num_target_rows_updated": int(updating.sum()) + len(flagged[0]),
        "num_target_rows_deleted": 0 if spec.soft_delete else int(deleting.sum()),
        "num_target_rows_copied": int(n_stored - newer.sum()),
    }
    return pa.concat_tables([rewritten, new_rows]), metrics


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
    for f in schema:
        value = stored[f.name].take(take_old)
        if f.name in writes:
            given = source[f.name].take(take_new)
            flag = PRESENT_PREFIX + f.name
            if flag in flags:
                given = pc.if_else(source[flag].take(take_new), given, value)
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


def write_data_files(
    filesystem: pa_fs.FileSystem,
    rows: pa.Table,
    now_ms: int,
    target_file_rows: int = TARGET_FILE_ROWS,
) -> list[AddAction]:
    """Write ``rows`` (in the order given) as data files of at most ``target_file_rows``
    rows in the table folder (``filesystem`` is rooted there).

    Returns:
        One add action per file, with its statistics (:func:`file_stats`).
    """
    if not rows.num_rows:
        return []
    actions = []
    for start in range(0, rows.num_rows, max(1, target_file_rows)):
        part = rows.slice(start, target_file_rows)
        path = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        pq.write_table(part, path, filesystem=filesystem, compression="snappy")
        size = filesystem.get_file_info(path).size
        actions.append(AddAction(path, size, {}, now_ms, True, file_stats(part)))
    return actions

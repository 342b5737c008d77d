"""The mirror merge, shared by the sinks: its bookkeeping columns, its SQL expressions,
its specification (:class:`MergeSpec`), and the same merge computed in Arrow for wide
tables (:func:`rewrite_actions`).

The rules (docs/semantics.md): a stored row is overwritten or deleted only by a row with a
sequence >= its own (or either NULL); a column a partial image lacks keeps its stored
value (a ``_cdc_present__<column>`` flag in the source); a soft-deleting mirror flags
``_deleted`` instead of removing rows; a keyless table matches its key columns NULL-safely.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

__all__ = [
    "BOOKKEEPING_COLUMNS",
    "DELETE_FLAG",
    "PRESENT_PREFIX",
    "SEQ_COLUMN",
    "SOFT_DELETE_COLUMN",
    "TS_COLUMN",
    "MergeSpec",
    "key_match",
    "merge_expressions",
    "quote_column",
    "rewrite_actions",
]

SEQ_COLUMN = "_cdc_seq"
TS_COLUMN = "_cdc_ts_ms"
DELETE_FLAG = "_cdc_delete"
#: a source column ``_cdc_present__<c>``: false where a partial image lacks ``c``
PRESENT_PREFIX = "_cdc_present__"

#: Column a soft-deleting mirror keeps: true once the row's key was deleted at the source.
SOFT_DELETE_COLUMN = "_deleted"
#: Mirror columns that are not source data.
BOOKKEEPING_COLUMNS = (SEQ_COLUMN, TS_COLUMN, SOFT_DELETE_COLUMN)


def quote_column(name: str) -> str:
    """Quote a column name for a SQL expression (delta-rs's DataFusion and Spark SQL
    quote alike)."""
    return "`" + name.replace("`", "``") + "`"


def key_match(key_columns: Sequence[str], equals: str = "=") -> str:
    """The merge's match of target ``t`` and source ``s`` on ``key_columns``, each
    comparison parenthesised: delta-rs parses ``a IS NOT DISTINCT FROM b AND c`` as
    ``a IS NOT DISTINCT FROM (b AND c)``."""
    return " AND ".join(f"(t.{quote_column(k)} {equals} s.{quote_column(k)})" for k in key_columns)


def merge_expressions(
    source: pa.Table, columns: Sequence[str], soft_delete: bool
) -> tuple[str, dict[str, str], dict[str, str]]:
    """What a mirror's merge writes, shared by both sinks: the sequence guard (``t``
    target, ``s`` source), and per stored column (unquoted name) the expression of a
    matched update -- a column a partial image lacks keeps the stored value -- and of an
    insert. With ``soft_delete`` both clear ``_deleted``."""
    seq = quote_column(SEQ_COLUMN)
    newer = f"(t.{seq} IS NULL OR s.{seq} IS NULL OR s.{seq} >= t.{seq})"
    present = {
        c[len(PRESENT_PREFIX) :] for c in source.column_names if c.startswith(PRESENT_PREFIX)
    }
    data_cols = [*columns, SEQ_COLUMN, TS_COLUMN]
    updates = {
        c: (
            f"CASE WHEN s.{quote_column(PRESENT_PREFIX + c)} THEN s.{quote_column(c)} ELSE t.{quote_column(c)} END"
            if c in present
            else f"s.{quote_column(c)}"
        )
        for c in data_cols
    }
    inserts = {c: f"s.{quote_column(c)}" for c in data_cols}
    if soft_delete:
        updates[SOFT_DELETE_COLUMN] = inserts[SOFT_DELETE_COLUMN] = "false"
    return newer, updates, inserts


@dataclass(frozen=True, slots=True)
class MergeSpec:
    """How one batch's checked merge source goes into a mirror (one commit).

    Attributes:
        columns: the data columns in table order.
        key_columns: the match columns, in key order.
        batch_id: the commit's application transaction.
        soft_delete: a delete sets ``_deleted`` instead of removing the row.
        null_safe: full-row identity: NULL key values match each other (``IS NOT
            DISTINCT FROM``, Spark's ``<=>``) instead of matching nothing (``=``).
    """

    columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    batch_id: int
    soft_delete: bool = False
    null_safe: bool = False

    @property
    def written(self) -> list[str]:
        """The columns an update or insert writes: data, sequence, source time."""
        return [*self.columns, SEQ_COLUMN, TS_COLUMN]


def rewrite_actions(
    table: DeltaTable, source: pa.Table, spec: MergeSpec
) -> tuple[list[AddAction | RemoveAction], dict[str, Any]]:
    """The merge of ``source`` into ``table`` computed in Arrow (linear in the number of
    columns), as file actions for one commit.

    The data files that hold a source key are read whole, merged with the source by
    :func:`_merged_rows` (same guard, soft delete, partial images and key match as the SQL
    merge), and written as one new data file. Committed as one transaction, the actions
    remove the files read and add the new one, so readers see the old or the new rows,
    never a mix; a concurrent writer that removed a file read here makes the commit fail.
    Files no source key is in are neither read nor rewritten. The new file carries
    ``numRecords`` but no min/max statistics (docs/decisions.md 22).

    Args:
        table: the mirror, refreshed.
        source: the checked merge source, at least one row.
        spec: columns, keys (matched with ``=``, NULL-safely when ``null_safe``), soft delete.

    Returns:
        ``(actions, metrics)``: no actions when nothing changes; metrics named as delta-rs
        names them.
    """
    dataset = table.to_pyarrow_dataset()
    schema = dataset.schema
    source = _cast_like(source, schema)
    files, stored = _files_with_keys(dataset, source, spec.key_columns, spec.null_safe)
    merged, metrics = _merged_rows(stored, source, schema, spec)
    now_ms = int(time.time() * 1000)
    stored_files = table.get_add_actions()
    sizes = dict(
        zip(
            stored_files["path"].to_pylist(),
            stored_files["size_bytes"].to_pylist(),
            strict=True,
        )
    )
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(path, True, now_ms, sizes.get(path)) for path in files
    ]
    if merged.num_rows:
        actions.append(_write_data_file(dataset.filesystem, merged, now_ms))
    metrics["num_target_files_removed"] = len(files)
    metrics["num_target_files_added"] = 1 if merged.num_rows else 0
    return actions, metrics


def _files_with_keys(
    dataset: pads.FileSystemDataset,
    source: pa.Table,
    key_columns: Sequence[str],
    null_safe: bool,
) -> tuple[list[str], pa.Table]:
    """The data files holding at least one of the source's keys, and all their rows.

    Each file's key columns are read first (a file whose statistics rule out every
    value of the first key column is skipped unread); only matching files are read
    whole.

    Returns:
        ``(paths relative to the table, rows of those files in the dataset schema)``.
    """
    wanted = {k for k in _key_tuples(source, key_columns, null_safe) if k is not None}
    first = source[key_columns[0]]
    prune = None if null_safe else pc.field(key_columns[0]).isin(first.combine_chunks())
    paths, parts = [], []
    for fragment in dataset.get_fragments():
        keys = fragment.to_table(schema=dataset.schema, columns=list(key_columns), filter=prune)
        if any(k in wanted for k in _key_tuples(keys, key_columns, null_safe)):
            paths.append(fragment.path)
            parts.append(fragment.to_table(schema=dataset.schema))
    rows = pa.concat_tables(parts) if parts else dataset.schema.empty_table()
    return paths, rows


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


def _merged_rows(
    stored: pa.Table, source: pa.Table, schema: pa.Schema, spec: MergeSpec
) -> tuple[pa.Table, dict[str, int]]:
    """What the guarded MERGE of :meth:`DeltaWarehouse._merge` makes of some stored rows.

    A stored row whose key a source row has is matched. With ``newer`` (either sequence
    NULL, or the source's >= the stored one), a matched row is deleted (a source delete),
    marked ``_deleted`` with the delete's sequence and time (``soft_delete``), or updated:
    each of ``data_columns`` takes the source's value, except a column with a
    ``_cdc_present__`` flag that is false, which keeps the stored value; other columns
    keep theirs (``_deleted`` becomes false with ``soft_delete``). Matched rows that are
    not newer, and unmatched ones, are kept as they are. A source upsert that matched
    nothing is inserted (columns it lacks are NULL).

    Args:
        stored: the rows of the files to rewrite, in ``schema``.
        source: the merge source, its data columns already in ``schema``'s types.
        schema: the table's schema (the result's).
        spec: the match columns, soft delete and NULL-safe match; an update or insert
            writes :attr:`MergeSpec.written` (data, sequence, time).

    Returns:
        ``(rows, metrics)``: the rows to write in place of ``stored``, and counts named
        as delta-rs's merge metrics.
    """
    key_columns, null_safe, soft_delete = spec.key_columns, spec.null_safe, spec.soft_delete
    data_columns = spec.written
    source_row = {
        key: j
        for j, key in enumerate(_key_tuples(source, key_columns, null_safe))
        if key is not None
    }
    is_delete = source[DELETE_FLAG].to_pylist()
    source_seq = source[SEQ_COLUMN].to_pylist()
    stored_seq = stored[SEQ_COLUMN].to_pylist()
    kept: list[int] = []
    updated: list[tuple[int, int]] = []
    flagged: list[tuple[int, int]] = []
    matched: set[int] = set()
    deleted = 0
    for i, key in enumerate(_key_tuples(stored, key_columns, null_safe)):
        j = source_row.get(key) if key is not None else None
        if j is None:
            kept.append(i)
            continue
        matched.add(j)
        newer = stored_seq[i] is None or source_seq[j] is None or source_seq[j] >= stored_seq[i]
        if not newer:
            kept.append(i)
        elif not is_delete[j]:
            updated.append((i, j))
        elif soft_delete:
            flagged.append((i, j))
        else:
            deleted += 1
    inserted = [j for j in range(source.num_rows) if j not in matched and not is_delete[j]]
    parts = [
        stored.take(pa.array(kept, pa.int64())),
        _updated_rows(stored, source, schema, updated, data_columns, soft_delete),
        _soft_deleted_rows(stored, source, schema, flagged),
        _inserted_rows(source, schema, inserted, data_columns, soft_delete),
    ]
    metrics = {
        "num_source_rows": source.num_rows,
        "num_target_rows_inserted": len(inserted),
        "num_target_rows_updated": len(updated) + len(flagged),
        "num_target_rows_deleted": deleted,
        "num_target_rows_copied": len(kept),
    }
    return pa.concat_tables(parts), metrics


def _updated_rows(
    stored: pa.Table,
    source: pa.Table,
    schema: pa.Schema,
    pairs: Sequence[tuple[int, int]],
    data_columns: Sequence[str],
    soft_delete: bool,
) -> pa.Table:
    """Stored rows updated by source rows, ``pairs`` of (stored row, source row)."""
    old = pa.array([i for i, _ in pairs], pa.int64())
    new = pa.array([j for _, j in pairs], pa.int64())
    writes = set(data_columns)
    flags = set(source.column_names)  # a set: Table.column_names builds a new list each call
    arrays = []
    for f in schema:
        value = stored[f.name].take(old)
        if f.name in writes:
            given = source[f.name].take(new)
            flag = PRESENT_PREFIX + f.name
            if flag in flags:
                given = pc.if_else(source[flag].take(new), given, value)
            value = given
        elif soft_delete and f.name == SOFT_DELETE_COLUMN:
            value = pa.array([False] * len(pairs), f.type)
        arrays.append(value)
    return pa.Table.from_arrays(arrays, schema=schema)


def _soft_deleted_rows(
    stored: pa.Table, source: pa.Table, schema: pa.Schema, pairs: Sequence[tuple[int, int]]
) -> pa.Table:
    """Stored rows marked ``_deleted`` by source deletes, ``pairs`` of (stored, source) rows:
    the delete's sequence and time, the other columns unchanged."""
    old = pa.array([i for i, _ in pairs], pa.int64())
    new = pa.array([j for _, j in pairs], pa.int64())
    arrays = []
    for f in schema:
        if f.name == SOFT_DELETE_COLUMN:
            arrays.append(pa.array([True] * len(pairs), f.type))
        elif f.name in (SEQ_COLUMN, TS_COLUMN):
            arrays.append(source[f.name].take(new))
        else:
            arrays.append(stored[f.name].take(old))
    return pa.Table.from_arrays(arrays, schema=schema)


def _inserted_rows(
    source: pa.Table,
    schema: pa.Schema,
    rows: Sequence[int],
    data_columns: Sequence[str],
    soft_delete: bool,
) -> pa.Table:
    """Source rows inserted as new rows; table columns the insert does not write are NULL."""
    take = pa.array(rows, pa.int64())
    writes = set(data_columns)
    arrays = []
    for f in schema:
        if f.name in writes:
            arrays.append(source[f.name].take(take))
        elif soft_delete and f.name == SOFT_DELETE_COLUMN:
            arrays.append(pa.array([False] * len(rows), f.type))
        else:
            arrays.append(pa.nulls(len(rows), f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _write_data_file(filesystem: Any, rows: pa.Table, now_ms: int) -> AddAction:
    """Write ``rows`` as a new Parquet data file in the table folder (``filesystem`` is
    rooted there) and return its add action (statistics: ``numRecords`` only)."""
    path = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(rows, path, filesystem=filesystem, compression="snappy")
    size = filesystem.get_file_info(path).size
    stats = orjson.dumps({"numRecords": rows.num_rows}).decode()
    return AddAction(path, size, {}, now_ms, True, stats)

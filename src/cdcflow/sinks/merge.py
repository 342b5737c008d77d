"""The mirror merge, shared by the sinks: its bookkeeping columns, its SQL expressions and
its specification (:class:`MergeSpec`). The same merge computed in Arrow is
:mod:`cdcflow.sinks.arrow_merge`.

The rules (docs/semantics.md): a stored row is overwritten or deleted only by a row with a
sequence >= its own (or either NULL); a column a partial image lacks keeps its stored
value (a ``_cdc_present__<column>`` flag in the source), and so does a column an older
change of the batch set, when the stored row is newer than that change (its sequence in
``_cdc_from__<column>``; docs/decisions/0063-a-late-change-sets-no-column-of-a-newer-row.md); a soft-deleting mirror flags
``_deleted`` instead of removing rows; a keyless table matches its key columns NULL-safely.

A table whose Delta property ``delta.enableChangeDataFeed`` is true records what each
commit changed (:data:`CHANGE_FEED_PROPERTY`, :func:`feeds_changes`); its merges write
no row back with the values it holds, so the feed holds no update whose before and
after images are equal (mirrors: :func:`cdcflow.sinks.arrow_merge.effective_rows`;
history tables: :func:`unchanged`; docs/decisions.md 58).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = [
    "BOOKKEEPING_COLUMNS",
    "CHANGE_FEED_PROPERTY",
    "DELETE_FLAG",
    "FROM_PREFIX",
    "PRESENT_PREFIX",
    "SEQ_COLUMN",
    "SOFT_DELETE_COLUMN",
    "TS_COLUMN",
    "MergeSpec",
    "column_written",
    "feeds_changes",
    "key_match",
    "merge_condition",
    "merge_expressions",
    "partition_pruning",
    "quote_column",
    "table_feeds_changes",
    "unchanged",
]

SEQ_COLUMN = "_cdc_seq"
TS_COLUMN = "_cdc_ts_ms"
DELETE_FLAG = "_cdc_delete"
#: a source column ``_cdc_present__<c>``: false where a partial image lacks ``c``
PRESENT_PREFIX = "_cdc_present__"
#: a source column ``_cdc_from__<c>`` (string): the sequence of the older change of the
#: batch that set ``c`` in a partial image; ``c`` is written only over a stored row whose
#: sequence is <= it (NULL: the row's own change set it, it counts whatever is stored)
FROM_PREFIX = "_cdc_from__"

#: Column a soft-deleting mirror keeps: true once the row's key was deleted at the source.
SOFT_DELETE_COLUMN = "_deleted"
#: Mirror columns that are not source data.
BOOKKEEPING_COLUMNS = (SEQ_COLUMN, TS_COLUMN, SOFT_DELETE_COLUMN)

#: The Delta table property that makes writers record a change data feed (Delta
#: protocol, "Change Data Files": https://github.com/delta-io/delta/blob/master/PROTOCOL.md#add-cdc-file)
CHANGE_FEED_PROPERTY = "delta.enableChangeDataFeed"


def feeds_changes(configuration: Mapping[str, str | None]) -> bool:
    """Whether a table with these Delta properties records a change data feed (the
    protocol reads the property case-insensitively)."""
    return str(configuration.get(CHANGE_FEED_PROPERTY) or "").strip().lower() == "true"


def table_feeds_changes(table: DeltaTable) -> bool:
    """Whether the Delta table records a change data feed (:func:`feeds_changes` of its
    properties)."""
    return feeds_changes(table.metadata().configuration)


def quote_column(name: str) -> str:
    """Quote a column name for a SQL expression (delta-rs's DataFusion and Spark SQL
    quote alike)."""
    return "`" + name.replace("`", "``") + "`"


def key_match(key_columns: Sequence[str], equals: str = "=") -> str:
    """The merge's match of target ``t`` and source ``s`` on ``key_columns``, each
    comparison parenthesised: delta-rs parses ``a IS NOT DISTINCT FROM b AND c`` as
    ``a IS NOT DISTINCT FROM (b AND c)``."""
    return " AND ".join(f"(t.{quote_column(k)} {equals} s.{quote_column(k)})" for k in key_columns)


def partition_pruning(
    source: pa.Table, partition_columns: Sequence[str], key_columns: Sequence[str]
) -> str | None:
    """A condition on the target ``t`` that keeps a merge to the partitions its source
    rows are in: ``t.`p` IN (...)`` for each partition column, with the source's values.

    Only when every partition column is a key column: a row then never moves between
    partitions (a change of a key column is a delete and an insert), so the rows a
    source row matches are in the partition its own values name. delta-rs 1.6 does not
    infer this from the key match (a merge into a table partitioned by its key scanned
    every file: tests/apply/test_table_options.py). ``None`` when it does not apply, or
    for a column of a type whose SQL literal is not plain (only integers, strings and
    dates are written).
    """
    if not partition_columns or not set(partition_columns) <= set(key_columns):
        return None
    conditions = []
    for name in partition_columns:
        column = source[name]
        if column.null_count:
            return None
        values = column.unique().to_pylist()
        if pa.types.is_integer(column.type):
            literals = [str(int(v)) for v in values]
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            literals = ["'" + v.replace("'", "''") + "'" for v in values]
        elif pa.types.is_date32(column.type):
            literals = [f"DATE '{v.isoformat()}'" for v in values]
        else:
            return None
        conditions.append(f"t.{quote_column(name)} IN ({', '.join(literals)})")
    return " AND ".join(conditions)


def merge_condition(
    spec: MergeSpec, source: pa.Table, partition_columns: Sequence[str], null_safe_equals: str
) -> str:
    """The merge's ``ON`` condition, shared by the sinks: the key match
    (:func:`key_match`, with ``null_safe_equals`` for a keyless table: ``IS NOT DISTINCT
    FROM`` in delta-rs, ``<=>`` in Spark) and, for a table partitioned by key columns,
    the partitions of the source rows (:func:`partition_pruning`)."""
    on = key_match(spec.key_columns, null_safe_equals if spec.null_safe else "=")
    pruning = partition_pruning(
        source, partition_columns, () if spec.null_safe else spec.key_columns
    )
    return f"{on} AND {pruning}" if pruning else on


def merge_expressions(
    source: pa.Table, columns: Sequence[str], soft_delete: bool
) -> tuple[str, dict[str, str], dict[str, str]]:
    """What a mirror's merge writes, shared by both sinks: the sequence guard (``t``
    target, ``s`` source), and per stored column (unquoted name) the expression of a
    matched update -- a column a partial image lacks, or one an older change of the batch
    set over a newer stored row, keeps the stored value (:func:`column_written`) -- and
    of an insert. With ``soft_delete`` both clear ``_deleted``."""
    seq = quote_column(SEQ_COLUMN)
    newer = f"(t.{seq} IS NULL OR s.{seq} IS NULL OR s.{seq} >= t.{seq})"
    names = set(source.column_names)
    data_cols = [*columns, SEQ_COLUMN, TS_COLUMN]
    updates = {}
    for c in data_cols:
        written = column_written(c, names, f"t.{seq}")
        updates[c] = (
            f"CASE WHEN {written} THEN s.{quote_column(c)} ELSE t.{quote_column(c)} END"
            if written
            else f"s.{quote_column(c)}"
        )
    inserts = {c: f"s.{quote_column(c)}" for c in data_cols}
    if soft_delete:
        updates[SOFT_DELETE_COLUMN] = inserts[SOFT_DELETE_COLUMN] = "false"
    return newer, updates, inserts


def column_written(column: str, source_columns: set[str], stored_seq: str) -> str:
    """The SQL condition under which a matched update writes the source's ``column``
    (else the stored value stays): its ``_cdc_present__`` flag, and its ``_cdc_from__``
    sequence not older than ``stored_seq`` (the target's ``_cdc_seq`` expression);
    ``""`` when the source has neither column (always written)."""
    terms = []
    if PRESENT_PREFIX + column in source_columns:
        terms.append(f"s.{quote_column(PRESENT_PREFIX + column)}")
    if FROM_PREFIX + column in source_columns:
        since = f"s.{quote_column(FROM_PREFIX + column)}"
        terms.append(f"({since} IS NULL OR {stored_seq} IS NULL OR {since} >= {stored_seq})")
    return " AND ".join(terms)


def unchanged(assignments: Mapping[str, str], null_safe_equals: str) -> str:
    """A condition, on a matched pair of target ``t`` and source ``s``, that is true when
    every assignment (unquoted column -> expression, as :func:`merge_expressions` gives
    them) would write back the value the column holds: an update that changes nothing.

    A change feed records an update that rewrites a row with its own values as a
    change; a merge into a history table with a feed excludes such rows (a version
    recomputed as it was) from its updates with ``NOT (unchanged)``.
    ``null_safe_equals`` is ``IS NOT DISTINCT FROM`` for delta-rs, ``<=>`` for Spark;
    each comparison is parenthesised (:func:`key_match` says why).
    """
    return " AND ".join(
        f"(t.{quote_column(c)} {null_safe_equals} ({value}))" for c, value in assignments.items()
    )


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

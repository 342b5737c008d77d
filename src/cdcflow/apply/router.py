"""Which target table each event goes to, and a micro-batch's events grouped per target.

A source table is named by ``(format, database, schema, table)``; :class:`Router` turns
that into the target's name (``inventory.public.customers``), and :func:`by_target`
splits a batch's table events (row changes, truncates, DDL) into one part per target,
in target order. Heartbeats, transaction markers and messages go to no table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.model import Op

__all__ = [
    "IMAGE_OPS",
    "ROUTED_OPS",
    "ROW_CHANGE_OPS",
    "TABLE_OPS",
    "Router",
    "by_target",
    "declarations_on_every_row",
    "source_ids",
]

#: ops that change a table: row changes and truncates
TABLE_OPS = pa.array(
    [Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value, Op.SNAPSHOT.value, Op.TRUNCATE.value]
)
#: ops that carry an after image
IMAGE_OPS = pa.array([Op.INSERT.value, Op.UPDATE.value, Op.SNAPSHOT.value])
#: ops that change one row
ROW_CHANGE_OPS = pa.array([*IMAGE_OPS.to_pylist(), Op.DELETE.value])
#: what a target table's part of a batch holds: its row changes, truncates and DDL
ROUTED_OPS = pa.array([*TABLE_OPS.to_pylist(), Op.DDL.value])

_SEP = "\x1f"


class Router:
    """Source table -> target table name.

    Args:
        template: ``str.format`` template over ``database``, ``schema``, ``table``,
            ``format``; empty parts and the dots around them are dropped. Default
            ``"{database}.{schema}.{table}"`` (``inventory.public.customers``; MySQL
            sources without a schema give ``inventory.customers``).
    """

    def __init__(self, template: str = "{database}.{schema}.{table}") -> None:
        self.template = template

    def target(self, fmt: str, database: str, schema: str, table: str) -> str:
        name = self.template.format(
            format=fmt or "", database=database or "", schema=schema or "", table=table or ""
        )
        return ".".join(p for p in name.split(".") if p)


def source_ids(rows: pa.Table) -> pa.ChunkedArray:
    """One string per row naming its source table (format, database, schema, table)."""
    return pc.binary_join_element_wise(
        rows["format"], rows["database"], rows["schema"], rows["table"], _SEP
    )


def by_target(rows: pa.Table, router: Router) -> Iterator[tuple[str, pa.Table]]:
    """``(target, rows)`` per target table, in target order, for the row changes,
    truncates and DDL of ``rows`` (events without a table name go nowhere)."""
    is_table_op = pc.and_(
        pc.is_in(rows["op"], ROUTED_OPS),
        pc.invert(pc.equal(pc.fill_null(rows["table"], ""), "")),
    )
    if not pc.all(is_table_op).as_py():
        rows = rows.filter(is_table_op)
    if rows.num_rows == 0:
        return
    source = source_ids(rows)
    targets: dict[str, list[str]] = {}
    for combo in pc.unique(source).to_pylist():
        target = router.target(*combo.split(_SEP))
        targets.setdefault(target, []).append(combo)
    if len(targets) == 1:
        yield next(iter(targets)), rows
        return
    for target in sorted(targets):
        yield target, rows.filter(pc.is_in(source, pa.array(targets[target], pa.string())))


def declarations_on_every_row(rows: pa.Table) -> pa.Table:
    """``columns`` filled forward per source table (a batch states each declaration once).

    Needed when events are applied in a later batch than the event that declared them.
    """
    columns = rows["columns"].combine_chunks()
    if columns.null_count == 0 or rows.num_rows == 0:
        return rows
    source = source_ids(rows).combine_chunks()
    filled = columns.to_pylist()
    last: dict[str, str] = {}
    for i, (src, cols) in enumerate(zip(source.to_pylist(), filled, strict=True)):
        if cols is not None:
            last[src] = cols
        elif src in last:
            filled[i] = last[src]
    return rows.set_column(
        rows.schema.get_field_index("columns"), "columns", pa.array(filled, pa.string())
    )

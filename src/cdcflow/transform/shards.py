"""Sharded source tables merged into one target: a key two shards hold is refused.

A route may send many source tables (``orders_0`` .. ``orders_15``) to one target and
name a ``shard_column`` that records each row's source table (:mod:`cdcflow.transform.router`).
The shards' keys must not overlap: a row of the target belongs to the shard that wrote
it until that shard deletes it. :func:`refuse_collisions` walks one target's part of a
batch in order, key by key, from the owners the stored table records: a change of a key
another shard owns is refused (a ``SHARD_KEY_COLLISION`` dead letter naming both
shards), so it never overwrites or deletes the other shard's row. A key one shard
deleted may be taken by another (a row that moved between shards).

Only keys more than one shard touches, or whose stored owner differs, are walked one
change at a time; the stored owners are read for the batch's keys only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.images import rows_to_arrow
from cdcflow.model import Op
from cdcflow.sinks.history import END_AT
from cdcflow.sinks.merge import SOFT_DELETE_COLUMN
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.transform.router import ROW_CHANGE_OPS, filter_declared, source_names

__all__ = ["refuse_collisions"]


def _stored_owners(
    warehouse: DeltaWarehouse,
    target: str,
    keys: Sequence[str],
    key_columns: Sequence[str],
    types: Mapping[str, str],
    shard_column: str,
) -> dict[str, str]:
    """Key JSON (as in ``keys``) -> the shard whose live stored row has that key."""
    path = warehouse.table_path(target)
    table = warehouse.open(path)
    if table is None or not keys:
        return {}
    schema = pa.schema(table.schema().to_arrow())
    if shard_column not in schema.names or any(c not in schema.names for c in key_columns):
        return {}
    wanted = rows_to_arrow([orjson.loads(k) for k in keys], types, key_columns)
    first = key_columns[0]
    values = wanted[first].cast(schema.field(first).type).unique()
    liveness = [c for c in (SOFT_DELETE_COLUMN, END_AT) if c in schema.names]
    stored = warehouse.read_table(
        path,
        schema,
        columns=[*key_columns, shard_column, *liveness],
        filters=[(first, "in", values.to_pylist())],
    )
    if END_AT in stored.column_names:  # a history table: its current versions
        stored = stored.filter(pc.is_null(stored[END_AT]))
    if SOFT_DELETE_COLUMN in stored.column_names:
        stored = stored.filter(pc.invert(pc.fill_null(stored[SOFT_DELETE_COLUMN], False)))
    owners = {
        _key_text(row, key_columns): row[shard_column]
        for row in stored.select([*key_columns, shard_column]).to_pylist()
    }
    out = {}
    for text, row in zip(keys, wanted.to_pylist(), strict=True):
        shard = owners.get(_key_text(row, key_columns))
        if shard is not None:
            out[text] = shard
    return out


def _key_text(row: Mapping[str, Any], key_columns: Sequence[str]) -> str:
    """A key's values, comparable across the stored table and the events' typed keys."""
    return orjson.dumps([row[c] for c in key_columns], default=str).decode()


def refuse_collisions(
    warehouse: DeltaWarehouse,
    target: str,
    part: pa.Table,
    shard_column: str,
    types: Mapping[str, str],
) -> tuple[pa.Table, pa.Table, list[str]]:
    """Split one sharded target's part into what may be applied and what is refused.

    Args:
        warehouse: where the target's stored owners are read.
        target: the target table.
        part: its EVENT_SCHEMA rows of the batch, in order.
        shard_column: the column that records each row's source table.
        types: column -> logical type (to read the stored keys typed).

    Returns:
        ``(applied, refused, messages)``: ``refused`` the row changes of keys another
        shard holds, with one message each naming the key and both shards.
    """
    is_change = pc.fill_null(
        pc.and_(pc.is_in(part["op"], ROW_CHANGE_OPS), pc.is_valid(part["key"])), False
    )
    if not pc.any(is_change).as_py():
        return part, part.slice(0, 0), []
    shards = source_names(part)
    keys = part["key"].to_pylist()
    old_keys = part["old_key"].to_pylist()
    ops = part["op"].to_pylist()
    changes = is_change.to_pylist()
    touched: set[str] = set()
    for i, change in enumerate(changes):
        if change:
            touched.add(keys[i])
            if old_keys[i] is not None:
                touched.add(old_keys[i])
    some = next(k for k in keys if k is not None)
    key_columns = list(orjson.loads(some))
    owner: dict[str, str | None] = dict(
        _stored_owners(warehouse, target, sorted(touched), key_columns, types, shard_column)
    )
    refused: list[int] = []
    messages: list[str] = []
    for i, change in enumerate(changes):
        if not change:
            continue
        shard, key = shards[i], keys[i]
        held = [
            k for k in (old_keys[i], key) if k is not None and owner.get(k) not in (None, shard)
        ]
        if held:
            refused.append(i)
            messages.append(
                f"key {held[0]} of {target} belongs to shard {owner[held[0]]}; "
                f"{shard} changes it too ({ops[i]}): the shards' keys overlap, so they cannot "
                f"be merged by key (add the shard to the key, or route the shards apart)"
            )
            continue
        if old_keys[i] is not None:
            owner[old_keys[i]] = None  # moved away from the old key
        owner[key] = None if ops[i] == Op.DELETE.value else shard
    if not refused:
        return part, part.slice(0, 0), []
    mask = [False] * part.num_rows
    for i in refused:
        mask[i] = True
    refused_mask = pa.array(mask)
    applied = filter_declared(part, pc.invert(refused_mask))  # a refused row may declare
    return applied, part.filter(refused_mask), messages

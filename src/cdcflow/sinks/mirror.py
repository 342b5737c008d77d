"""The type-1 mirrors (SCD type 1) of a warehouse: the guard, the DDL, the merge.

:meth:`Mirrors.apply` applies one batch's net change to one mirror: the tombstone and
truncate guards drop what older than a stored delete or truncate, the table gets the
columns it lacks (:func:`ensure_table`), the values are checked into the merge source
(those that do not fit are set aside as ``TYPE_CONFLICT``), then the warehouse's merge
engine (:mod:`cdcflow.sinks.engines`) removes what a truncate removes and merges the
rest, each commit carrying the apply's :class:`~cdcflow.sinks.warehouse.CommitContext`.

Mirror rows carry ``_cdc_seq`` (the source sequence, :func:`cdcflow.model.seq_key`) and
``_cdc_ts_ms``. The merge only overwrites or deletes a stored row when the incoming
sequence is >= the stored one, and an upsert whose sequence is <= a tombstone of its key
(or below the table's last truncate) is dropped, so late and replayed events never undo
newer ones. See docs/semantics.md.

Change data feed (``change_feed`` per table, docs/decisions.md 58): the table is created
with ``delta.enableChangeDataFeed = true`` (an existing one gets the property before its
next merge); how each engine keeps the feed exact is :mod:`cdcflow.sinks.engines`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Field, write_deltalake

from cdcflow.errors import ApplyError, Code
from cdcflow.images import logical_from_arrow, rows_from_json, rows_to_arrow
from cdcflow.model import NetChange, dumps
from cdcflow.sinks.merge import (
    BOOKKEEPING_COLUMNS,
    CHANGE_FEED_PROPERTY,
    DELETE_FLAG,
    FROM_PREFIX,
    PRESENT_PREFIX,
    SEQ_COLUMN,
    SOFT_DELETE_COLUMN,
    TS_COLUMN,
    MergeSpec,
    quote_column,
    table_feeds_changes,
)
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse, arrow_schema
from cdcflow.types import arrow_type

__all__ = ["MirrorResult", "Mirrors", "ensure_table"]


def _images_read(
    upserts: pa.Table, deletes: pa.Table, types: Mapping[str, str], columns: Sequence[str]
) -> pa.Table | None:
    """The merge source's typed rows read columnar (:func:`~cdcflow.images.rows_from_json`):
    the upserts' after images with their key columns taken from their key JSON, then the
    deletes' key JSON; ``None`` where the exact way must decide (a type the reader does
    not read, a value it refuses, a key JSON with other members than the key columns or
    without one of them)."""
    keys = upserts["key"]
    if not len(keys):
        key_columns: list[str] = []
    else:
        key_columns = list(orjson.loads(keys[0].as_py()))
    if any(c not in columns for c in key_columns):
        return None
    after = rows_from_json(upserts["after"], types, columns)
    if after is None:
        return None
    if key_columns:
        # members other than the key columns would override the after image too: refused
        key_values = rows_from_json(keys, types, key_columns, unexpected="error")
        if key_values is None or any(key_values[c].null_count for c in key_columns):
            return None
        for c in key_columns:
            after = after.set_column(after.schema.get_field_index(c), c, key_values[c])
    removed = rows_from_json(deletes["key"], types, columns)
    if removed is None:
        return None
    return pa.concat_tables([after, removed]).combine_chunks()


def _has_column_seqs(rows: pa.Table) -> bool:
    """Whether a net change row took columns from older changes (``column_seqs``)."""
    return "column_seqs" in rows.column_names and rows["column_seqs"].null_count < len(rows)


def _column_seqs(rows: pa.Table) -> list[dict[str, Any] | None]:
    """Each row's ``column_seqs`` (:func:`cdcflow.apply.netchange.net_change`), parsed."""
    if not _has_column_seqs(rows):
        return [None] * rows.num_rows
    return [None if q is None else orjson.loads(q) for q in rows["column_seqs"].to_pylist()]


def _guard_columns(rows: pa.Table, tombs: Mapping[str, str], watermark: str | None) -> pa.Table:
    """The tombstone and truncate guards for the columns older changes of the batch set:
    a column whose change is at or before its key's tombstone (or before the last
    truncate) is taken out of the image, as that change would be dropped alone (a stored
    row is newer than the tombstone, so the merge keeps its value anyway); a full image
    or delete dropped so leaves the row partial again (:func:`_complete_partial_rows`
    then looks for its row)."""
    since = _column_seqs(rows)
    afters = rows["after"].to_pylist()
    partial = rows["partial"].to_pylist()
    changed = False

    def guarded(seq: str, tomb: str | None) -> bool:
        return (tomb is not None and seq <= tomb) or bool(watermark and seq < watermark)

    for i, (key, q) in enumerate(zip(rows["key"].to_pylist(), since, strict=True)):
        if q is None or afters[i] is None:
            continue
        tomb, image = tombs.get(key), orjson.loads(afters[i])
        dropped = [c for c, s in q["columns"].items() if guarded(s, tomb)]
        for c in dropped:
            image.pop(c, None)
            del q["columns"][c]
        if q["rest"] is not None and guarded(q["rest"], tomb):
            # the full image or delete is dropped too: the row is partial again
            q["rest"], partial[i] = None, True
            changed = True
        if dropped:
            afters[i] = orjson.dumps(image).decode()
            changed = True
    if not changed:
        return rows
    rows = rows.set_column(
        rows.schema.get_field_index("after"), "after", pa.array(afters, pa.string())
    )
    rows = rows.set_column(
        rows.schema.get_field_index("partial"), "partial", pa.array(partial, pa.bool_())
    )
    seqs = [None if q is None else orjson.dumps(q).decode() for q in since]
    return rows.set_column(
        rows.schema.get_field_index("column_seqs"), "column_seqs", pa.array(seqs, pa.string())
    )


def _stored_rows(
    table: DeltaTable, keys: set[str], key_columns: Sequence[str], soft_delete: bool
) -> dict[str, dict[str, Any]]:
    """The stored rows of ``keys`` (key JSON -> the row's data columns, as JSON values),
    read through the first key column's values where they filter the table (else the
    whole table is read); a soft-deleted row is not held. A rare path: partial images
    whose row must be found (:func:`_complete_partial_rows`)."""
    data = None
    if key_columns:
        first = key_columns[0]
        values = list({orjson.loads(k).get(first) for k in keys})
        try:
            wanted = pa.array(values, arrow_schema(table).field(first).type)
            data = table.to_pyarrow_dataset().to_table(filter=pc.field(first).isin(wanted))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError):
            data = None  # a value the column's type does not take from JSON as is
    if data is None:
        data = table.to_pyarrow_table()
    stored: dict[str, dict[str, Any]] = {}
    for row in data.to_pylist():
        if soft_delete and row.get(SOFT_DELETE_COLUMN):
            continue
        canon = orjson.loads(dumps({k: v for k, v in row.items() if k not in BOOKKEEPING_COLUMNS}))
        key = orjson.dumps({k: canon.get(k) for k in key_columns}).decode()
        if key in keys:
            stored[key] = canon
    return stored


def _complete_partial_rows(
    table: DeltaTable,
    upserts: pa.Table,
    tombs: Mapping[str, str],
    key_columns: Sequence[str],
    soft_delete: bool,
) -> tuple[pa.Table, list[tuple[str | None, str, str]]]:
    """The partial upserts whose row must be found before they are merged, and those
    whose row is not there (docs/decisions/0064-a-partial-image-of-an-unknown-row-is-a-dead-letter.md).

    * A row a partial image moved to a new key (``moved_from``: SharePlex ``upd`` of a
      key column carries only the changed columns) takes its absent columns from the old
      key's stored row; without one, from the new key's stored row (a copy of the move
      delivered again); without either, the columns it lacks are unknown.
    * A partial image of a key with a tombstone (deleted, moved away, or the new key of
      a partial move: :func:`cdcflow.sinks.tombstones.tombstone_rows`) is merged over
      the key's stored row; without one, the columns it lacks are unknown.

    Returns:
        The upserts to merge, and ``(key JSON, MISSING_OLD_ROW, why)`` for each left out
        (its key's events become dead letters; a move's delete of its old key stands).
    """
    n = upserts.num_rows
    if not n or not pc.any(upserts["partial"]).as_py():
        return upserts, []
    partial = upserts["partial"].to_pylist()
    keys: list[str] = upserts["key"].to_pylist()
    moved: list[str | None] = (
        upserts["moved_from"].to_pylist() if "moved_from" in upserts.column_names else [None] * n
    )
    check = [i for i in range(n) if partial[i] and (moved[i] or keys[i] in tombs)]
    if not check:
        return upserts, []
    wanted = {keys[i] for i in check} | {m for i in check if (m := moved[i])}
    stored = _stored_rows(table, wanted, key_columns, soft_delete)
    afters = upserts["after"].to_pylist()
    keep = [True] * n
    rejected: list[tuple[str | None, str, str]] = []
    for i in check:
        old = moved[i]
        if old and old in stored:
            afters[i] = orjson.dumps({**stored[old], **orjson.loads(afters[i])}).decode()
            partial[i] = False
        elif keys[i] in stored:
            continue  # merged over the key's own row: absent columns keep their values
        elif old:
            keep[i] = False
            rejected.append(
                (
                    keys[i],
                    Code.MISSING_OLD_ROW,
                    f"a partial image moved the row of key {old} here, and the mirror does "
                    "not hold that row (not arrived yet, or never): the columns the image "
                    "lacks are unknown. The old key's delete is applied",
                )
            )
        else:
            keep[i] = False
            rejected.append(
                (
                    keys[i],
                    Code.MISSING_OLD_ROW,
                    f"a partial image of a row the mirror does not hold (deleted or moved "
                    f"away at seq {tombs[keys[i]]}, or a partial move here that was a "
                    "MISSING_OLD_ROW dead letter): the columns it lacks are unknown",
                )
            )
    upserts = upserts.set_column(
        upserts.schema.get_field_index("after"), "after", pa.array(afters, pa.string())
    )
    upserts = upserts.set_column(
        upserts.schema.get_field_index("partial"), "partial", pa.array(partial, pa.bool_())
    )
    return (upserts.filter(pa.array(keep, pa.bool_())) if rejected else upserts), rejected


@dataclass(slots=True)
class MirrorResult:
    """What one mirror commit did."""

    target: str
    path: str
    upserts: int = 0
    deletes: int = 0
    dropped_by_guard: int = 0
    truncated: bool = False
    skipped_replay: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    #: (key JSON, code, reason) of changes the table refused; not applied. ``TYPE_CONFLICT``:
    #: values that do not fit; ``MISSING_SEQ`` (history tables; key may be ``None``): no
    #: source sequence; ``MISSING_OLD_ROW``: a partial image of a row the mirror does not
    #: hold (:func:`_complete_partial_rows`)
    rejected: list[tuple[str | None, str, str]] = field(default_factory=list)


class Mirrors:
    """The mirrors of one warehouse view, merged by its engine
    (:attr:`~cdcflow.sinks.warehouse.DeltaWarehouse.engine`).

    Args:
        warehouse: the pipeline's Delta tables.
    """

    def __init__(self, warehouse: DeltaWarehouse) -> None:
        self.warehouse = warehouse

    def apply(
        self,
        target: str,
        net: NetChange,
        types: Mapping[str, str],
        key_columns: Sequence[str],
        commit: CommitContext,
        soft_delete: bool = False,
        full_row_identity: bool = False,
        partition_by: Sequence[str] = (),
        change_feed: bool = False,
    ) -> MirrorResult:
        """Apply one batch's net change to the mirror ``target`` (idempotent per batch).

        Args:
            target: target table name (see
                :meth:`~cdcflow.sinks.warehouse.DeltaWarehouse.table_path`).
            net: the batch's net change for this table.
            types: column -> logical type for every column to store (the stored ones
                first; a column missing from the table is added).
            key_columns: the table's key columns, in key order.
            commit: the apply's commit context; every commit to the mirror carries it.
            soft_delete: a delete (or truncate) sets ``_deleted`` instead of removing rows.
            full_row_identity: the "key" is the whole row (a table without a primary
                key): key columns may be NULL and are matched NULL-safely.
            partition_by: partition columns of the mirror if this creates it (every
                one a column of ``types``); an existing mirror keeps its layout.
            change_feed: the mirror records a change data feed: created with the
                property, or given it before this batch's merge (never turned off).

        A change the table refuses is in :attr:`MirrorResult.rejected`, not applied:
        ``TYPE_CONFLICT`` (values that do not fit the stored columns), ``MISSING_OLD_ROW``
        (a partial image of a row the mirror does not hold).

        Raises:
            ApplyError: ``TABLE_FAULT`` and the like when the table cannot be written.
        """
        wh = self.warehouse
        path = wh.table_path(target)
        result = MirrorResult(target=target, path=path)
        if wh.committed(path, commit.version, commit.app_id, refresh=False):
            result.skipped_replay = True
            return result

        tombs, watermark = wh.tombstones.guard(target)
        rows = net.rows
        if net.truncate_seq is not None:
            watermark = max(watermark or "", net.truncate_seq)
        guard_seq = pc.fill_null(rows["seq"], "")
        keep = pa.array([True] * rows.num_rows, pa.bool_())
        if tombs or watermark:
            stored = pa.array([tombs.get(k) for k in rows["key"].to_pylist()], pa.string())
            blocked_by_tomb = pc.fill_null(pc.less_equal(guard_seq, stored), False)
            keep = pc.invert(pc.and_(pc.invert(rows["is_delete"]), blocked_by_tomb))
            if watermark:
                before_truncate = pc.less(guard_seq, watermark)
                keep = pc.and_(keep, pc.invert(before_truncate))
        result.dropped_by_guard = rows.num_rows - (pc.sum(pc.cast(keep, pa.int64())).as_py() or 0)
        rows = rows.filter(keep)
        if (tombs or watermark) and _has_column_seqs(rows):
            rows = _guard_columns(rows, tombs, watermark)

        upserts = rows.filter(pc.invert(rows["is_delete"]))
        deletes = rows.filter(rows["is_delete"])
        result.upserts, result.deletes = upserts.num_rows, deletes.num_rows

        table = wh.held(path)  # refreshed by committed() above
        system = [pa.field(SEQ_COLUMN, pa.string()), pa.field(TS_COLUMN, pa.int64())]
        if soft_delete:
            system.append(pa.field(SOFT_DELETE_COLUMN, pa.bool_()))
        version = None if table is None else table.version()
        columns = ensure_table(
            wh,
            path,
            table,
            types,
            () if full_row_identity else key_columns,
            system,
            partition_by,
            change_feed=change_feed,
        )
        if table is None or table.version() != version:
            table = wh.open(path)  # created, or columns added
        assert table is not None, "ensure_table made the table"
        stored_types = {f.name: logical_from_arrow(f.type) for f in arrow_schema(table)}
        source = None
        if not full_row_identity:
            upserts, unknown = _complete_partial_rows(
                table, upserts, tombs, key_columns, soft_delete
            )
            if unknown:
                result.rejected.extend(unknown)
                result.upserts = upserts.num_rows
        if rows.num_rows:
            source, conflicts = self._checked_merge_source(
                upserts, deletes, stored_types, columns, key_columns
            )
            result.rejected.extend(conflicts)
            if conflicts:
                result.upserts = int(pc.sum(pc.invert(source[DELETE_FLAG])).as_py() or 0)
                result.deletes = source.num_rows - result.upserts

        # truncate first: only rows whose sequence is below it
        commit_done = False
        if net.truncate_seq is not None:
            result.truncated = True
            last_commit = source is None or source.num_rows == 0
            last = commit if last_commit else None
            wh.engine.truncate(wh, table, net.truncate_seq, last, soft_delete)
            commit_done = last_commit
            table = wh.open(path)

        if source is not None and source.num_rows:
            spec = MergeSpec(
                tuple(columns), tuple(key_columns), commit.version, soft_delete, full_row_identity
            )
            assert table is not None, "the table made above, or the truncate committed to"
            result.metrics = wh.engine.merge(wh, table, source, spec, commit)
            commit_done = True
        if not commit_done:
            # nothing to change, but the batch must still count as committed here
            assert table is not None, "the table made above (no truncate ran)"
            wh.mark(table, commit)
        return result

    def copy_renamed_columns(self, target: str, renames: Sequence[tuple[str, str]]) -> None:
        """After a rename ``old -> new``: rows that still hold their value under ``old``
        (written before the rename) move it to ``new``; ``old`` becomes NULL.

        Idempotent: rows already moved have ``new`` set and are left alone.
        """
        wh = self.warehouse
        path = wh.table_path(target)
        table = wh.open(path)
        if table is None:
            return
        names = set(arrow_schema(table).names)
        for old, new in renames:
            if old not in names or new not in names:
                continue
            assert table is not None, "the table was just updated"
            table.update(
                updates={quote_column(new): quote_column(old), quote_column(old): "NULL"},
                predicate=f"{quote_column(new)} IS NULL AND {quote_column(old)} IS NOT NULL",
            )
            table = wh.open(path)
        wh.forget(path)

    def widen_columns(self, target: str, widened: Mapping[str, str]) -> None:
        """Rewrite the mirror with wider column types (``{column: new logical type}``).

        delta-rs 1.6 has no type-widening table feature, so the table is read, cast and
        overwritten with the new schema in one commit (readers see the old or the new
        table, never a mix). Casts are lossless by construction (:func:`cdcflow.types.widen`).
        A replay finds the columns already wide and does nothing.
        """
        wh = self.warehouse
        path = wh.table_path(target)
        table = wh.open(path)
        if table is None or not widened:
            return
        schema = arrow_schema(table)
        fields = [
            pa.field(f.name, arrow_type(widened[f.name]), nullable=f.nullable)
            if f.name in widened
            else f
            for f in schema
        ]
        new_schema = pa.schema(fields)
        if new_schema == schema:
            return
        data = table.to_pyarrow_table().cast(new_schema)
        write_deltalake(
            table,
            data,
            mode="overwrite",
            schema_mode="overwrite",
            storage_options=wh.storage_options or None,
        )
        wh.forget(path)

    def _checked_merge_source(
        self,
        upserts: pa.Table,
        deletes: pa.Table,
        types: Mapping[str, str],
        columns: Sequence[str],
        key_columns: Sequence[str],
    ) -> tuple[pa.Table, list[tuple[str | None, str, str]]]:
        """The merge source; net changes whose values do not fit are set aside, not applied.

        The fast path converts the whole batch at once; only when that fails is each net
        change converted alone to find the ones at fault (``TYPE_CONFLICT``), so one bad
        value costs its own key's change, not the table's batch.
        """

        def build(up: pa.Table, gone: pa.Table) -> pa.Table:
            return self._merge_source(up, gone, types, columns, key_columns)

        try:
            return build(upserts, deletes), []
        except ApplyError as exc:
            if exc.code != Code.TYPE_CONFLICT:
                raise
        rejected: list[tuple[str | None, str, str]] = []
        keep_up: list[bool] = []
        keep_del: list[bool] = []
        empty = upserts.slice(0, 0)
        for table, keep, is_upsert in ((upserts, keep_up, True), (deletes, keep_del, False)):
            for i in range(table.num_rows):
                one = table.slice(i, 1)
                alone = (one, empty) if is_upsert else (empty, one)
                try:
                    build(*alone)
                except ApplyError as exc:
                    rejected.append((one["key"][0].as_py(), exc.code, exc.message))
                    keep.append(False)
                else:
                    keep.append(True)
        source = build(
            upserts.filter(pa.array(keep_up, pa.bool_())),
            deletes.filter(pa.array(keep_del, pa.bool_())),
        )
        return source, rejected

    def _merge_source(
        self,
        upserts: pa.Table,
        deletes: pa.Table,
        types: Mapping[str, str],
        columns: Sequence[str],
        key_columns: Sequence[str],
    ) -> pa.Table:
        n_up, n_del = upserts.num_rows, deletes.num_rows
        partial = upserts["partial"].to_pylist()
        since = _column_seqs(upserts)
        by_column = any(partial) or any(since)
        data = None if by_column else _images_read(upserts, deletes, types, columns)
        if data is None:  # the exact way: a dict per row
            after_rows = [orjson.loads(a) for a in upserts["after"].to_pylist()]
            key_rows = [orjson.loads(k) for k in deletes["key"].to_pylist()]
            # the key comes from the key JSON (it may differ from the after image's columns)
            for row, key in zip(after_rows, upserts["key"].to_pylist(), strict=True):
                row.update(orjson.loads(key))
            data = rows_to_arrow(after_rows + key_rows, types, columns)
        data = data.append_column(
            SEQ_COLUMN,
            pa.concat_arrays(
                [
                    upserts["seq"].combine_chunks().cast(pa.string()),
                    deletes["seq"].combine_chunks().cast(pa.string()),
                ]
            ),
        )
        data = data.append_column(
            TS_COLUMN,
            pa.concat_arrays(
                [
                    upserts["ts_ms"].combine_chunks().cast(pa.int64()),
                    deletes["ts_ms"].combine_chunks().cast(pa.int64()),
                ]
            ),
        )
        data = data.append_column(
            DELETE_FLAG, pa.array([False] * n_up + [True] * n_del, pa.bool_())
        )
        if by_column:
            for c in columns:
                if c in key_columns:
                    continue
                present = [
                    (not p) or (c in r) for r, p in zip(after_rows, partial, strict=True)
                ] + [True] * n_del
                if not all(present):
                    data = data.append_column(PRESENT_PREFIX + c, pa.array(present))
                if any(since):
                    # set by an older change of the batch (the rest: by its full image or
                    # delete): written only over a stored row not newer than that change
                    froms = [
                        None if q is None else (q["columns"].get(c) if c in r else q["rest"])
                        for r, q in zip(after_rows, since, strict=True)
                    ] + [None] * n_del
                    if any(f is not None for f in froms):
                        data = data.append_column(FROM_PREFIX + c, pa.array(froms, pa.string()))
        return data


def ensure_table(
    warehouse: DeltaWarehouse,
    path: str,
    table: DeltaTable | None,
    types: Mapping[str, str],
    key_columns: Sequence[str],
    system_fields: Sequence[pa.Field],
    partition_by: Sequence[str] = (),
    change_feed: bool = False,
) -> list[str]:
    """Create the table at ``path`` (``table``: its handle, ``None``: none yet) with the
    data columns of ``types``, then ``system_fields``, partitioned by the columns
    ``partition_by`` names (each one of ``types``); or add what it lacks.

    With ``change_feed`` the table records a change data feed
    (:data:`~cdcflow.sinks.merge.CHANGE_FEED_PROPERTY`): a new table is created with
    the property, an existing one without it gets it in a commit of its own (delta-rs
    raises the writer protocol to 4), so the feed starts at that version. The
    property is never turned off here.

    ``key_columns`` are created NOT NULL. A missing data or system column is added as
    nullable, *before* any merge, never via ``merge_schema=True``: delta-rs 1.6.6 copies
    the source's new-column values into rows a guarded merge rewrote but did not update
    (docs/decisions.md 4, tests/sinks/test_delta.py).

    Returns:
        The data columns in table order (bookkeeping and system columns left out).
    """
    if table is None:
        fields = [
            pa.field(c, arrow_type(t), nullable=c not in key_columns) for c, t in types.items()
        ]
        configuration = dict(warehouse.table_configuration)
        if change_feed:
            configuration[CHANGE_FEED_PROPERTY] = "true"
        DeltaTable.create(
            path,
            pa.schema([*fields, *system_fields]),
            mode="ignore",
            partition_by=list(partition_by) or None,
            configuration=configuration or None,
            storage_options=warehouse.storage_options or None,
        )
        return list(types)
    if change_feed and not table_feeds_changes(table):
        table.alter.set_table_properties({CHANGE_FEED_PROPERTY: "true"})
    existing = [f.name for f in arrow_schema(table)]
    new = [c for c in types if c not in existing]
    missing = [pa.field(c, arrow_type(types[c])) for c in new]
    missing += [f for f in system_fields if f.name not in existing]
    if missing:
        table.alter.add_columns(
            [Field.from_arrow(pa.field(f.name, f.type, nullable=True)) for f in missing]
        )
    skip = {*BOOKKEEPING_COLUMNS, *(f.name for f in system_fields)}
    return [c for c in existing if c not in skip] + new

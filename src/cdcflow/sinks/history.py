"""SCD type 2 history tables: every version of every row, correct with out-of-order events.

A history table keeps one row per *version* of a source row: the data columns, then

* ``__start_at``: the sequence (:func:`cdcflow.model.seq_key`) of the change that opened it;
* ``__end_at``: the sequence of the change that closed it, null while it is current;
* ``__is_current``: ``__end_at IS NULL``;
* ``__start_ts_ms`` / ``__end_ts_ms``: the source time (epoch ms) of those two changes;
* ``_cdc_seq`` / ``_cdc_ts_ms``: sequence and source time of the last change applied to the
  version (after in-place updates later than ``__start_at``).

The version current at sequence ``s`` is the row with ``__start_at <= s`` and
(``__end_at IS NULL`` or ``s < __end_at``); the current state is ``WHERE __is_current``.

Rules (Databricks/Spark AUTO CDC ``STORED AS SCD TYPE 2`` where it has one; see
docs/semantics.md):

* Order is the source's sequence, then Kafka partition, offset and index in the record, never
  arrival. Events without a sequence cannot be placed in a history: they are not applied and
  are reported in :attr:`HistoryResult.rejected` (``MISSING_SEQ``; AUTO CDC rejects NULL
  sequences too).
* An insert, snapshot row or update opens a version at its sequence and closes the key's
  version before it (``__end_at`` = that sequence) -- unless it changes none of the tracked
  columns (``track_history``; all columns when it is ``None``). Then it updates the covering
  version in place: its values and ``_cdc_seq``, not ``__start_at`` (AUTO CDC
  ``TRACK HISTORY ON``; an identical repeat, e.g. a re-snapshot, opens nothing).
* A partial image (``partial``: Qlik ``columnMask``, an unavailable TOAST value) takes the
  columns it lacks from the version before it in sequence order (none after a delete: null).
* A delete closes the key's version; no current row remains. A delete with nothing to close
  is still remembered (see the change log below).
* A truncate closes every version open at its sequence, of every key. (AUTO CDC supports
  ``apply_as_truncates`` for SCD type 1 only; here it is a delete of every key at once.)
* An update that moves a row to another key closes the old key and opens the new one, at the
  same sequence.
* A change whose (key, sequence) was already applied is a duplicate and changes nothing (the
  first one applied wins; inside a batch, the first in order). A replayed batch is a no-op.
* An event older than what is stored (a later batch brings an earlier sequence) goes to its
  place in the key's chain: the versions after it are recomputed (split, re-closed, re-filled
  for partial images, or removed when it makes a later change a no-op), and a late truncate
  or delete closes what was open at its sequence. The final history depends only on the set
  of events, never on how they were split into batches or in which order those came.

Why a change log: the versions alone cannot be recomputed exactly. A delete that closed
nothing (it arrived before the insert it deletes), a truncate for keys that had no row yet,
an in-place update of untracked columns and the columns a partial image lacked leave no
trace in the versions, yet each decides the history once an older event turns up (AUTO CDC
keeps an auxiliary table of tombstones and no-op upserts for the same reason). So each
history table has a change log, ``_cdcflow/history_log/<table>`` (:data:`LOG_SCHEMA`):
every applied change as (canonical key, op, sequence, after image, partial, source time,
Kafka position, batch id).

How a batch is applied: for each key it touches (the keys of its events; for a truncate,
the keys with a version open at it), its earliest change ``since`` bounds what can change:
versions closed before ``since`` stay as they are. The stored versions open at or after
``since`` are read (a filter on the key columns), the fold restarts at the start of the
version open at ``since`` (the *anchor*) with the key's logged changes from there on plus
the batch's new ones, and only versions that differ are written back with ONE merge on
(key columns, ``__start_at``): changed -> update, new -> insert, no longer a version ->
delete. An in-order batch so reads and writes back only each key's current version (and
the new ones).

Exactly once: the merge carries the application transaction ``(pipeline, batch_id)``; a
batch already committed to the table is skipped. The log append (same transaction id, its
own table) comes first; a batch replayed after a crash between the two treats the log's rows
of its own batch id as new again, so the table catches up.

Change data feed (``change_feed``, docs/decisions.md 58): the table is created with
``delta.enableChangeDataFeed`` (or given it before its next merge), and the merge is
delta-rs's, which writes the feed: a version opened is an ``insert``, a version closed
or updated in place an ``update_preimage``/``update_postimage`` pair, a version a late
event made redundant a ``delete``. A version the fold writes back with the values it
holds (a re-filled partial image) is left alone, so the feed holds no update that
changes nothing.

Cost: the log holds every applied change (the size of the table's change stream) and is
read for the touched keys; delta-rs merges rewrite every file holding a touched key.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdcflow.errors import ApplyError, Code
from cdcflow.event_schema import KIND_EVENT
from cdcflow.images import logical_from_arrow, rows_to_arrow
from cdcflow.model import Op, json_default
from cdcflow.sinks.merge import (
    DELETE_FLAG,
    SEQ_COLUMN,
    TS_COLUMN,
    key_match,
    quote_column,
    table_feeds_changes,
    unchanged,
)
from cdcflow.sinks.mirror import ensure_table
from cdcflow.sinks.refresh import commit_hooks
from cdcflow.sinks.system_tables import HISTORY_LOG, HISTORY_LOG_SCHEMA
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse, arrow_schema

__all__ = [
    "HISTORY_COLUMNS",
    "LOG_SCHEMA",
    "SYSTEM_COLUMNS",
    "HistoryResult",
    "apply_history",
    "log_path",
]

START_AT, END_AT, IS_CURRENT = "__start_at", "__end_at", "__is_current"
START_TS, END_TS = "__start_ts_ms", "__end_ts_ms"
HISTORY_COLUMNS = (START_AT, END_AT, IS_CURRENT)
#: Every column a history table has besides the data columns, in table order.
SYSTEM_COLUMNS = (*HISTORY_COLUMNS, START_TS, END_TS, SEQ_COLUMN, TS_COLUMN)
_SYSTEM_FIELDS = [
    pa.field(START_AT, pa.string(), nullable=False),
    pa.field(END_AT, pa.string()),
    pa.field(IS_CURRENT, pa.bool_(), nullable=False),
    pa.field(START_TS, pa.int64()),
    pa.field(END_TS, pa.int64()),
    pa.field(SEQ_COLUMN, pa.string()),
    pa.field(TS_COLUMN, pa.int64()),
]

_UPSERT, _DELETE, _TRUNCATE = "upsert", "delete", "truncate"
_UPSERT_OPS = {Op.INSERT.value, Op.UPDATE.value, Op.SNAPSHOT.value}
_ROW_OPS = pa.array([*_UPSERT_OPS, Op.DELETE.value, Op.TRUNCATE.value])

#: One row per applied change of one history table (``_cdcflow/history_log/<table>``).
LOG_SCHEMA = HISTORY_LOG_SCHEMA
_ORJSON_OPTS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_NON_STR_KEYS
_TOP = "\U0010ffff"  # sorts after every sequence


@dataclass(slots=True)
class HistoryResult:
    """What one history commit did.

    Attributes:
        versions_opened: versions inserted (a late event may open one in the past).
        versions_closed: versions written closed that were open or new before.
        updated_in_place: existing versions whose ``_cdc_seq`` moved (untracked changes).
        versions_removed: stored versions a late event made redundant (deleted rows).
        duplicates: events already applied in an earlier batch (no-ops).
        rejected: ``(key JSON as in the events, code, message)`` of keys whose events of
            this batch were not applied: ``TYPE_CONFLICT`` (a value does not fit its
            column), ``MISSING_SEQ``, ``MISSING_KEY`` (key ``None`` for a truncate).
    """

    target: str
    path: str
    versions_opened: int = 0
    versions_closed: int = 0
    updated_in_place: int = 0
    versions_removed: int = 0
    duplicates: int = 0
    skipped_replay: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    rejected: list[tuple[str | None, str, str]] = field(default_factory=list)


class _Change(NamedTuple):
    """One change of one key (or a truncate).

    The first five fields are the source order, so sorting changes sorts them in source
    order (two changes never share all five: a key move's two halves differ in ``sub``).
    """

    seq: str
    partition: int
    offset: int
    event_index: int
    sub: int
    op: str
    key: str | None
    image: str | None
    partial: bool
    ts_ms: int | None
    batch_id: int


@dataclass(slots=True)
class _Version:
    start: str
    start_ts: int | None
    image: dict[str, Any]
    seq: str
    ts_ms: int | None
    end: str | None = None
    end_ts: int | None = None
    # the last change applied was a partial image: its values depend on what came before
    # it, which a late event may have changed (a delete before it empties them), so the
    # version is rewritten whenever it is recomputed
    filled: bool = False

    def meta(self) -> tuple[Any, ...]:
        return self.start_ts, self.end, self.end_ts, self.seq, self.ts_ms


def log_path(warehouse: DeltaWarehouse, target: str) -> str:
    """Folder of the change log of the history table ``target``."""
    return warehouse.system_path(f"{HISTORY_LOG}/" + warehouse.table_path(target).rsplit("/", 1)[1])


def _canonical(row: Mapping[str, Any]) -> str:
    return orjson.dumps(row, default=json_default, option=_ORJSON_OPTS).decode()


# --------------------------------------------------------------------------- the fold


def _order(c: _Change) -> tuple[str, int, int, int, int]:
    """Source order: sequence, Kafka partition, offset, index in the record, old key first."""
    return c.seq, c.partition, c.offset, c.event_index, c.sub


def _same(old: Mapping[str, Any], new: Mapping[str, Any], tracked: Iterable[str]) -> bool:
    return all(old.get(c) == new.get(c) for c in tracked)  # absent == null


def fold(
    changes: Iterable[_Change],
    track_history: Sequence[str] | None = None,
    key_columns: Sequence[str] = (),
    image: dict[str, Any] | None = None,
) -> list[_Version]:
    """The versions of one key from its changes and the table's truncates, in source order.

    Args:
        changes: the key's changes and the truncates, sorted by :func:`_order`.
        track_history: see :func:`apply_history`.
        key_columns: not compared (the key is the same); their values come from the key.
        image: the key's row just before the first change (no version is open then).
    """
    versions: list[_Version] = []
    current: _Version | None = None
    for c in changes:
        if c.op != _UPSERT:
            if current is not None:
                current.end, current.end_ts = c.seq, c.ts_ms
            current = image = None
            continue
        row = orjson.loads(c.image or "{}")
        new = {**image, **row} if c.partial and image else row
        if current is None:
            same = False
        elif track_history is not None:
            same = _same(current.image, new, track_history)
        elif current.image.keys() == new.keys():  # every column
            same = current.image == new
        else:  # a column came or went: absent is null; key columns are the key's own
            tracked = (current.image.keys() | new.keys()).difference(key_columns)
            same = _same(current.image, new, tracked)
        if current is not None and same:
            current.image, current.seq, current.ts_ms = new, c.seq, c.ts_ms
        else:
            if current is not None:
                current.end, current.end_ts = c.seq, c.ts_ms
            current = _Version(c.seq, c.ts_ms, new, c.seq, c.ts_ms)
            versions.append(current)
        current.filled = c.partial
        image = new
    return versions


def _image_before(changes: Sequence[_Change]) -> dict[str, Any] | None:
    """The row after ``changes`` (sorted), parsing only from the last full image on."""
    base = len(changes)
    while base > 0 and changes[base - 1].op == _UPSERT and changes[base - 1].partial:
        base -= 1
    image: dict[str, Any] | None = None
    if base > 0 and changes[base - 1].op == _UPSERT:
        base -= 1
    for c in changes[base:]:
        if c.op != _UPSERT:
            image = None
            continue
        row = orjson.loads(c.image or "{}")
        image = {**image, **row} if c.partial and image else row
    return image


# --------------------------------------------------------------------------- batch events


def _batch_changes(
    events: pa.Table, batch_id: int, result: HistoryResult
) -> tuple[list[tuple[str, _Change]], list[_Change]]:
    """``(raw key JSON, change)`` per row change, and the truncates, of the batch's events."""
    keep = pc.and_(pc.equal(events["kind"], KIND_EVENT), pc.is_in(events["op"], _ROW_OPS))
    t = events.filter(keep)
    cols = {
        n: t[n].to_pylist()
        for n in (
            "op",
            "key",
            "old_key",
            "after",
            "partial",
            "seq",
            "ts_ms",
            "partition",
            "offset",
            "event_index",
        )
    }
    keyed: list[tuple[str, _Change]] = []
    truncates: list[_Change] = []
    for op, key, old_key, after, partial, seq, ts, part, off, idx in zip(
        *cols.values(), strict=True
    ):
        if seq is None:
            result.rejected.append(
                (key, Code.MISSING_SEQ, f"a {op} without a source sequence cannot enter a history")
            )
            continue
        pos = (seq, -1 if part is None else part, -1 if off is None else off, idx or 0)
        if op == Op.TRUNCATE.value:
            truncates.append(_Change(*pos, 1, _TRUNCATE, None, None, False, ts, batch_id))
            continue
        if key is None:
            result.rejected.append((None, Code.MISSING_KEY, f"a {op} without key columns"))
            continue
        if op == Op.DELETE.value or after is None:
            keyed.append((key, _Change(*pos, 1, _DELETE, None, None, False, ts, batch_id)))
            continue
        partial = bool(partial) and op == Op.UPDATE.value
        keyed.append((key, _Change(*pos, 1, _UPSERT, None, after, partial, ts, batch_id)))
        if old_key is not None:
            keyed.append((old_key, _Change(*pos, 0, _DELETE, None, None, False, ts, batch_id)))
    return keyed, truncates


def _typed_keys(
    raw_keys: Sequence[str], types: Mapping[str, str], key_columns: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """raw key JSON -> typed key dict, and the raw keys whose values do not fit (-> reason)."""
    dicts = [orjson.loads(k) for k in raw_keys]
    try:
        typed = rows_to_arrow(dicts, types, key_columns).to_pylist()
        return dict(zip(raw_keys, typed, strict=True)), {}
    except ApplyError:
        pass
    out, bad = {}, {}
    for raw, d in zip(raw_keys, dicts, strict=True):
        try:
            out[raw] = rows_to_arrow([d], types, key_columns).to_pylist()[0]
        except ApplyError as exc:
            bad[raw] = exc.message
    return out, bad


# --------------------------------------------------------------------------- reads


def _field(name: str, type_: pa.DataType | None = None) -> pc.Expression:
    """A column in a read filter, cast to its logical type.

    Files that delta-rs merges write hold strings as ``string_view``; pyarrow 26 cannot
    compare them with the ``string`` statistics guarantee of a one-value row group
    ("Function 'equal' has no kernel matching input types (string, string_view)"). The cast
    makes every file compare the same type.
    """
    return pc.field(name).cast(type_ or pa.string())


def _read_log(warehouse: DeltaWarehouse, target: str, keys: Iterable[str]) -> pa.Table:
    """The logged changes of ``keys`` and every logged truncate, as Arrow."""
    keys = pa.array(list(keys), pa.string())
    return warehouse.read_table(
        log_path(warehouse, target),
        LOG_SCHEMA,
        filters=_field("key").isin(keys) | _field("key").is_null(),
    )


def _changes(data: pa.Table) -> list[_Change]:
    cols = [data[n].to_pylist() for n in _Change._fields]
    return list(map(_Change._make, zip(*cols, strict=True)))


def _split_log(
    log: pa.Table, anchor: Mapping[str, str]
) -> tuple[list[_Change], pa.Table, list[_Change]]:
    """(changes at or after each key's anchor, the Arrow rows before it, every truncate)."""
    keyed = log.filter(pc.is_valid(log["key"]))
    truncates = _changes(log.filter(pc.is_null(log["key"])))
    if not anchor or keyed.num_rows == 0:
        return [], keyed, truncates
    keys = list(anchor)
    at = pc.index_in(keyed["key"], value_set=pa.array(keys, pa.string()))
    threshold = pc.take(pa.array([anchor[k] for k in keys], pa.string()), at)
    later = pc.greater_equal(keyed["seq"], threshold)
    return _changes(keyed.filter(later)), keyed.filter(pc.invert(later)), truncates


def _key_filter(
    schema: pa.Schema, key_columns: Sequence[str], typed: Iterable[Mapping[str, Any]]
) -> pc.Expression:
    """Rows whose first key column is one of ``typed`` (exact match follows in Python)."""
    first = schema.field(key_columns[0]).type
    values = pa.array(list({k[key_columns[0]] for k in typed}), first)
    return _field(key_columns[0], first).isin(values)


def _stored_keys(data: pa.Table, key_columns: Sequence[str]) -> list[str]:
    return [_canonical(r) for r in data.select(list(key_columns)).to_pylist()]


def _open_at(
    table: DeltaTable,
    key_columns: Sequence[str],
    truncates: Sequence[_Change],
    typed_key: dict[str, dict[str, Any]],
) -> dict[str, str]:
    """Key -> the earliest of ``truncates`` at which the key has a version open."""
    seqs = sorted({c.seq for c in truncates})
    cond = None
    for t in seqs:
        one = (_field(START_AT) < t) & (_field(END_AT).is_null() | (_field(END_AT) > t))
        cond = one if cond is None else cond | one
    hit = table.to_pyarrow_table(columns=[*key_columns, START_AT, END_AT], filters=cond)
    out: dict[str, str] = {}
    for canon, typed, start, end in zip(
        _stored_keys(hit, key_columns),
        hit.select(list(key_columns)).to_pylist(),
        hit[START_AT].to_pylist(),
        hit[END_AT].to_pylist(),
        strict=True,
    ):
        first = next(t for t in seqs if start < t and (end is None or end > t))
        out[canon] = min(first, out.get(canon, first))
        typed_key.setdefault(canon, typed)
    return out


@dataclass(slots=True)
class _Stored:
    """Stored versions that may change: Arrow rows, and (key, start) -> (row, meta)."""

    data: pa.Table
    meta: dict[tuple[str, str], tuple[int, tuple[Any, ...]]]


_META = (START_TS, END_AT, END_TS, SEQ_COLUMN, TS_COLUMN)  # as _Version.meta


def _candidates(
    table: DeltaTable | None,
    key_columns: Sequence[str],
    since: Mapping[str, str],
    typed_key: Mapping[str, Mapping[str, Any]],
) -> _Stored:
    """The stored versions open at or after ``since[key]``, per key."""
    if table is None or not since:
        return _Stored(pa.table({}), {})
    cond = _key_filter(arrow_schema(table), key_columns, [typed_key[k] for k in since]) & (
        _field(END_AT).is_null() | (_field(END_AT) >= min(since.values()))
    )
    data = table.to_pyarrow_table(filters=cond)
    keys, starts = _stored_keys(data, key_columns), data[START_AT].to_pylist()
    keep = []
    for canon, end in zip(keys, data[END_AT].to_pylist(), strict=True):
        first = since.get(canon)
        keep.append(first is not None and (end is None or end >= first))
    data = data.filter(pa.array(keep, pa.bool_()))
    idents = [(k, s) for k, s, kept in zip(keys, starts, keep, strict=True) if kept]
    metas = zip(*(data[c].to_pylist() for c in _META), strict=True)
    meta = {ident: (i, m) for i, (ident, m) in enumerate(zip(idents, metas, strict=True))}
    return _Stored(data, meta)


# --------------------------------------------------------------------------- table


def _ensure_table(
    warehouse: DeltaWarehouse,
    path: str,
    table: DeltaTable | None,
    types: Mapping[str, str],
    key_columns: Sequence[str],
    partition_by: Sequence[str] = (),
    change_feed: bool = False,
) -> DeltaTable:
    """Create the history table or add new data columns, with a change data feed when
    ``change_feed`` (:func:`~cdcflow.sinks.mirror.ensure_table`)."""
    ensure_table(
        warehouse,
        path,
        table,
        types,
        key_columns,
        _SYSTEM_FIELDS,
        partition_by,
        change_feed=change_feed,
    )
    opened = warehouse.open(path)
    assert opened is not None
    return opened


def _versions_table(
    rows: list[tuple[str, _Version]],
    typed_key: Mapping[str, Mapping[str, Any]],
    schema: pa.Schema,
    key_columns: Sequence[str],
) -> pa.Table:
    """Typed history rows in ``schema`` order (raises ApplyError TYPE_CONFLICT)."""
    data_columns = [n for n in schema.names if n not in SYSTEM_COLUMNS]
    value_columns = [c for c in data_columns if c not in key_columns]
    types = {f.name: logical_from_arrow(f.type) for f in schema}
    values = rows_to_arrow([v.image for _, v in rows], types, value_columns)
    arrays: dict[str, Any] = {c: values[c] for c in value_columns}
    for c in key_columns:
        arrays[c] = pa.array([typed_key[k][c] for k, _ in rows], schema.field(c).type)
    ends = [v.end for _, v in rows]
    arrays[START_AT] = [v.start for _, v in rows]
    arrays[END_AT] = ends
    arrays[IS_CURRENT] = [e is None for e in ends]
    arrays[START_TS] = [v.start_ts for _, v in rows]
    arrays[END_TS] = [v.end_ts for _, v in rows]
    arrays[SEQ_COLUMN] = [v.seq for _, v in rows]
    arrays[TS_COLUMN] = [v.ts_ms for _, v in rows]
    return pa.table({n: arrays[n] for n in schema.names}).cast(schema)


# --------------------------------------------------------------------------- apply


def apply_history(
    warehouse: DeltaWarehouse,
    target: str,
    events: pa.Table,
    types: Mapping[str, str],
    key_columns: Sequence[str],
    commit: CommitContext,
    track_history: Sequence[str] | None = None,
    partition_by: Sequence[str] = (),
    change_feed: bool = False,
) -> HistoryResult:
    """Apply one batch of one table's events to its SCD type 2 history table.

    Args:
        warehouse: the pipeline's Delta tables; the history table is at
            ``warehouse.table_path(target)``, its change log at :func:`log_path`.
        target: target table name.
        events: :data:`~cdcflow.decode.batches.EVENT_SCHEMA` rows of this table, any order;
            ops insert, update, delete, snapshot, truncate count (the rest is ignored).
        types: column -> logical type for the data columns (stored types win for stored
            columns; a new one is added to the table first).
        key_columns: the table's key columns, in key order.
        commit: the apply's commit context (its version is the micro-batch id); every
            commit carries it.
        track_history: columns whose change opens a version; a change of other columns
            only updates the covering version in place. ``None``: every column.
        partition_by: partition columns of the history table if this creates it.
        change_feed: the table records a change data feed (created with the property,
            or given it before this batch's merge; never turned off).

    Returns:
        A :class:`HistoryResult`; keys whose values do not fit their columns, and events
        without a sequence, are in ``rejected`` and not applied (the rest is).

    Raises:
        deltalake exceptions / OSError: storage failures; retry the batch.
    """
    started = time.perf_counter()
    batch_id = commit.version
    path = warehouse.table_path(target)
    result = HistoryResult(target=target, path=path)
    if warehouse.committed(path, batch_id, commit.app_id):
        result.skipped_replay = True
        return result

    table = warehouse.open(path)
    stored_schema = arrow_schema(table) if table is not None else None
    all_types = {c: t for c, t in types.items() if c not in SYSTEM_COLUMNS}
    if stored_schema is not None:
        for f in stored_schema:
            if f.name not in SYSTEM_COLUMNS:
                all_types[f.name] = logical_from_arrow(f.type)

    keyed, batch_truncates = _batch_changes(events, batch_id, result)
    typed_of_raw, bad = _typed_keys(sorted({k for k, _ in keyed}), all_types, key_columns)
    for raw, reason in bad.items():
        result.rejected.append((raw, Code.TYPE_CONFLICT, reason))
    raw_of: dict[str, str] = {}
    typed_key: dict[str, dict[str, Any]] = {}
    batch: list[_Change] = []
    for raw, c in keyed:
        if raw in bad:
            continue
        canon = _canonical(typed_of_raw[raw])
        raw_of.setdefault(canon, raw)
        typed_key[canon] = typed_of_raw[raw]
        batch.append(c._replace(key=canon))

    # per touched key: the earliest change of the batch (its versions before it stay as
    # they are), the stored versions from there on, and the anchor the fold restarts at:
    # the start of the version open at that change (or the change itself when none is)
    open_at = {}
    if batch_truncates and table is not None:
        open_at = _open_at(table, key_columns, batch_truncates, typed_key)
    since = dict(open_at)
    for c in batch:
        assert c.key is not None, "the batch's keys are canonical keys (above)"
        if c.seq < since.get(c.key, _TOP):
            since[c.key] = c.seq
    stored = _candidates(table, key_columns, since, typed_key)
    anchor = dict(since)
    for key, start in stored.meta:
        anchor[key] = min(start, anchor[key])

    log = _read_log(warehouse, target, anchor)
    chained, before, truncates = _split_log(log, anchor)
    applied = {(c.key, c.seq): c.batch_id for c in chained + truncates}
    new: list[_Change] = []
    seen: set[tuple[str | None, str]] = set()
    for c in sorted(batch + batch_truncates, key=_order):
        ident = (c.key, c.seq)
        if ident in seen:
            continue  # a duplicate inside the batch: the first in order wins
        seen.add(ident)
        earlier = applied.get(ident)
        if earlier is not None and earlier != batch_id:
            result.duplicates += 1
            continue
        new.append(c)  # logged by this very batch id: a replay after a crash, apply again
    to_log = [c for c in new if (c.key, c.seq) not in applied]
    if not new:
        result.metrics["apply_s"] = round(time.perf_counter() - started, 4)
        return result

    # fold each touched key from its anchor: logged and new changes plus the truncates
    touched = {c.key for c in new if c.key is not None}
    if any(c.key is None for c in new):
        touched.update(open_at)  # keys a new truncate closes
    chains: dict[str, list[_Change]] = defaultdict(list)
    for c in chained + [c for c in to_log if c.key is not None]:
        if c.key is not None and c.key in touched:
            chains[c.key].append(c)
    truncates += [c for c in to_log if c.key is None]
    partial_anchor = {k for k in touched if chains[k] and min(chains[k]).partial}
    prior: dict[str, list[_Change]] = defaultdict(list)
    if partial_anchor:
        rows = before.filter(pc.is_in(before["key"], pa.array(list(partial_anchor))))
        for c in _changes(rows):
            assert c.key is not None, "rows of the keys in partial_anchor"
            prior[c.key].append(c)
    recomputed: dict[tuple[str, str], _Version] = {}
    for key in touched:
        start = anchor[key]
        cut = [t for t in truncates if t.seq >= start]
        image = None
        if key in partial_anchor:
            older = [t for t in truncates if t.seq < start]
            image = _image_before(sorted(prior[key] + older))
        for v in fold(sorted(chains[key] + cut), track_history, key_columns, image):
            if v.end is None or v.end >= since[key]:
                recomputed[(key, v.start)] = v
    write, gone = _plan(recomputed, stored, touched, result)

    if write or gone:
        table = _ensure_table(
            warehouse, path, table, all_types, key_columns, partition_by, change_feed
        )
    source = None
    if table is not None and (write or gone):
        schema = arrow_schema(table)
        upserts, rejected_keys = _checked_rows(write, typed_key, schema, key_columns)
        for canon, reason in rejected_keys.items():
            result.rejected.append((raw_of.get(canon, canon), Code.TYPE_CONFLICT, reason))
        if rejected_keys:  # their stored versions stay as they are
            to_log = [c for c in to_log if c.key not in rejected_keys]
            _, gone = _plan(recomputed, stored, touched.difference(rejected_keys), result)
        source = _merge_source(upserts, stored.data.take(pa.array(gone, pa.int64())), schema)

    if to_log:
        warehouse.append(log_path(warehouse, target), _log_rows(to_log), commit)
    if table is not None and source is not None and source.num_rows:  # source: table is
        result.metrics = _merge(warehouse, table, source, key_columns, commit)
    result.metrics["apply_s"] = round(time.perf_counter() - started, 4)
    return result


def _plan(
    recomputed: Mapping[tuple[str, str], _Version],
    stored: _Stored,
    keys: set[str],
    result: HistoryResult,
) -> tuple[list[tuple[str, _Version]], list[int]]:
    """Versions of ``keys`` to write (new or changed) and stored rows to delete.

    A version whose start, end, last change and their times are as stored holds the same
    values unless its last change was a partial image (whose values depend on what came
    before it).
    Sets the version counts of ``result``.
    """
    write = []
    opened = closed = in_place = 0
    for (key, start), v in sorted(recomputed.items()):
        old = stored.meta.get((key, start))
        if key not in keys or (old is not None and old[1] == v.meta() and not v.filled):
            continue
        write.append((key, v))
        if old is None:
            opened += 1
        elif old[1][3] != v.seq:
            in_place += 1
        if v.end is not None and (old is None or old[1][1] is None):
            closed += 1
    gone = [
        i
        for (key, start), (i, _) in stored.meta.items()
        if key in keys and (key, start) not in recomputed
    ]
    result.versions_opened, result.versions_closed = opened, closed
    result.updated_in_place, result.versions_removed = in_place, len(gone)
    return write, gone


def _checked_rows(
    rows: list[tuple[str, _Version]],
    typed_key: Mapping[str, Mapping[str, Any]],
    schema: pa.Schema,
    key_columns: Sequence[str],
) -> tuple[pa.Table, dict[str, str]]:
    """Typed rows of the versions; keys with a value that does not fit are left out."""
    try:
        return _versions_table(rows, typed_key, schema, key_columns), {}
    except ApplyError as exc:
        if exc.code != Code.TYPE_CONFLICT:
            raise
    by_key: dict[str, list[tuple[str, _Version]]] = defaultdict(list)
    for k, v in rows:
        by_key[k].append((k, v))
    good: list[tuple[str, _Version]] = []
    bad: dict[str, str] = {}
    for k, versions in by_key.items():
        try:
            _versions_table(versions, typed_key, schema, key_columns)
            good.extend(versions)
        except ApplyError as exc:
            bad[k] = exc.message
    return _versions_table(good, typed_key, schema, key_columns), bad


def _merge_source(upserts: pa.Table, gone: pa.Table, schema: pa.Schema) -> pa.Table:
    """Versions to write, then stored versions to delete (``_cdc_delete``), in ``schema``."""
    missing = [f for f in schema if f.name not in gone.column_names]
    for f in missing:  # columns added by this batch
        gone = gone.append_column(f.name, pa.nulls(gone.num_rows, f.type))
    gone = gone.select(schema.names).cast(schema)
    return pa.concat_tables(
        [
            upserts.append_column(DELETE_FLAG, pa.array([False] * upserts.num_rows, pa.bool_())),
            gone.append_column(DELETE_FLAG, pa.array([True] * gone.num_rows, pa.bool_())),
        ]
    )


def _log_rows(changes: Sequence[_Change]) -> pa.Table:
    cols = list(zip(*changes, strict=True))
    return pa.table(
        {
            n: pa.array(values, LOG_SCHEMA.field(n).type)
            for n, values in zip(_Change._fields, cols, strict=True)
        },
        schema=LOG_SCHEMA,
    )


def _merge(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    source: pa.Table,
    key_columns: Sequence[str],
    commit: CommitContext,
) -> dict[str, Any]:
    """One delta-rs MERGE on (key columns, ``__start_at``) carrying ``commit``:
    ``source`` rows flagged ``_cdc_delete`` delete their version, the others update or
    insert it. With a change data feed, a version written back with the values it holds
    is left alone (no update of nothing in the feed); a merge that so changes nothing
    still records the batch (an empty commit)."""
    on = key_match([*key_columns, START_AT])
    written = {n: f"s.{quote_column(n)}" for n in source.column_names if n != DELETE_FLAG}
    columns = {quote_column(n): v for n, v in written.items()}
    update_if = f"NOT s.{quote_column(DELETE_FLAG)}"
    if table_feeds_changes(table):
        update_if += f" AND NOT ({unchanged(written, 'IS NOT DISTINCT FROM')})"
    started = time.perf_counter()
    before = table.version()
    metrics = (
        table.merge(
            source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            commit_properties=warehouse.commit_properties(commit),
            post_commithook_properties=commit_hooks(table),
        )
        .when_matched_delete(predicate=f"s.{quote_column(DELETE_FLAG)}")
        .when_matched_update(updates=columns, predicate=update_if)
        .when_not_matched_insert(updates=columns, predicate=f"NOT s.{quote_column(DELETE_FLAG)}")
        .execute()
    )
    if table.version() == before:
        warehouse.mark(table, commit)  # the batch recorded by an empty commit
    metrics["merge_s"] = round(time.perf_counter() - started, 4)
    return metrics

"""Net change: collapse one micro-batch of one table's events to one change per key.

Rules (see docs/semantics.md):

* Order is the source's own: ``seq`` (:func:`cdcflow.model.seq_key`), then Kafka
  ``partition``/``offset`` and the event's index inside its record as tie-breaks. Arrival
  order only decides between events that carry no sequence.
* A truncate drops every event ordered before it and is applied first (the sink deletes
  stored rows whose sequence is below it).
* An update that moves a row to another key (before-image key != after-image key) is a
  delete of the old key followed by an upsert of the new one, at the same sequence. A
  partial one (SharePlex) starts the new key's row again: its absent columns are the old
  key's, from the old key's images in the batch or its stored row (``moved_from``), also
  under later partial changes of the new key in the batch.
* An update without an after image (a DataWorks ``UPDATE_BEFOR`` half whose partner is in
  another batch) deletes its key; the partner half, ordered after it, upserts again.
* The last change of a key wins. Where it is a *partial* update (some declared columns are
  absent: Qlik ``columnMask``, an unavailable TOAST value), earlier images of the same key
  in the batch are folded in first, so only columns nobody in the batch set stay "not
  present" (the sink keeps the stored value for those). A column an earlier change set
  carries that change's sequence (``column_seqs``; the columns a full image or delete
  before it left NULL: its sequence, ``rest``), because the stored row decides whether it
  counts: a change older than the stored row sets nothing, as when it comes alone, so the
  mirror does not depend on how batches are cut
  (docs/decisions/0063-a-late-change-sets-no-column-of-a-newer-row.md).

Everything is vectorized with Arrow compute; only keys whose last change is partial and
that changed more than once in the batch go through Python.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.model import NetChange, Op

__all__ = ["NetChange", "net_change"]

_DELETE = Op.DELETE.value
_UPDATE = Op.UPDATE.value
_TRUNCATE = Op.TRUNCATE.value
_ROW_OPS = pa.array([Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value, Op.SNAPSHOT.value])


#: Source order inside a batch: sequence, then Kafka position, then index in the record.
_ORDER = [
    ("_seq", "ascending"),
    ("partition", "ascending"),
    ("offset", "ascending"),
    ("event_index", "ascending"),
    ("_sub", "ascending"),
]


#: What the net change keeps of each key's last change (``_seq``: for partial moves).
_LAST_COLUMNS = ["key", "is_delete", "seq", "ts_ms", "after", "partial", "old_key", "_seq"]


def net_change(events: pa.Table) -> NetChange:
    """Collapse one table's :data:`~cdcflow.decode.batches.EVENT_SCHEMA` event rows.

    Args:
        events: rows of ``kind == "event"`` for one target table (any ops; non-row ops
            other than truncate are ignored).

    Returns:
        A :class:`NetChange`.
    """
    seq_filled = pc.fill_null(events["seq"], "")
    t = events.append_column("_seq", seq_filled).append_column(
        "_sub", pa.array([1] * events.num_rows, pa.int8())
    )

    truncate_seq: str | None = None
    truncates = t.filter(pc.equal(t["op"], _TRUNCATE))
    if truncates.num_rows:
        last = truncates.sort_by(_ORDER).slice(truncates.num_rows - 1)
        truncate_seq = last["_seq"][0].as_py()
        cut = (
            last["_seq"][0].as_py(),
            last["partition"][0].as_py(),
            last["offset"][0].as_py(),
            last["event_index"][0].as_py(),
        )
        # keep only events ordered strictly after the truncate
        after_cut = pc.or_(
            pc.greater(t["_seq"], cut[0]),
            pc.and_(
                pc.equal(t["_seq"], cut[0]),
                pc.or_(
                    pc.greater(t["partition"], cut[1]),
                    pc.and_(
                        pc.equal(t["partition"], cut[1]),
                        pc.or_(
                            pc.greater(t["offset"], cut[2]),
                            pc.and_(
                                pc.equal(t["offset"], cut[2]), pc.greater(t["event_index"], cut[3])
                            ),
                        ),
                    ),
                ),
            ),
        )
        t = t.filter(after_cut)

    t = t.filter(pc.is_in(t["op"], _ROW_OPS))
    is_delete = pc.or_(
        pc.equal(t["op"], _DELETE),
        pc.and_(pc.equal(t["op"], _UPDATE), pc.is_null(t["after"])),
    )
    t = t.append_column("is_delete", is_delete)

    moved = t.filter(pc.is_valid(t["old_key"]))
    if moved.num_rows:
        old = moved.set_column(moved.schema.get_field_index("key"), "key", moved["old_key"])
        old = old.set_column(
            old.schema.get_field_index("is_delete"), "is_delete", pa.array([True] * old.num_rows)
        )
        old = old.set_column(
            old.schema.get_field_index("_sub"), "_sub", pa.array([0] * old.num_rows, pa.int8())
        )
        old = old.set_column(
            old.schema.get_field_index("after"), "after", pa.nulls(old.num_rows, pa.string())
        )
        old = old.set_column(
            old.schema.get_field_index("partial"), "partial", pa.array([False] * old.num_rows)
        )
        t = pa.concat_tables([t, old])

    events_in = t.num_rows
    if events_in == 0:
        empty = pa.table(
            {
                "key": pa.array([], pa.string()),
                "is_delete": pa.array([], pa.bool_()),
                "seq": pa.array([], pa.string()),
                "ts_ms": pa.array([], pa.int64()),
                "after": pa.array([], pa.string()),
                "partial": pa.array([], pa.bool_()),
                "moved_from": pa.array([], pa.string()),
                "column_seqs": pa.array([], pa.string()),
            }
        )
        return NetChange(empty, truncate_seq, 0, 0)

    # sorted by key, then source order: the order is computed on the narrow columns, and
    # only the last change of each key is gathered (the images are most of the bytes)
    sort_keys = [("key", "ascending"), *_ORDER]
    order = pc.sort_indices(t.select([k for k, _ in sort_keys]), sort_keys=sort_keys)
    keys = t["key"].take(order).combine_chunks()
    n = t.num_rows
    if n > 1:
        differs = pc.not_equal(keys.slice(0, n - 1), keys.slice(1))
        last_mask = pa.concat_arrays([differs, pa.array([True])])
    else:
        last_mask = pa.array([True])
    last = t.select(_LAST_COLUMNS).take(order.filter(last_mask))

    after = last["after"]
    partial = pc.fill_null(last["partial"], False)
    moved_from = pa.nulls(last.num_rows, pa.string())
    column_seqs = pa.nulls(last.num_rows, pa.string())
    if pc.any(partial).as_py():
        t = t.take(order)  # whole groups: the earlier images of the same key
        after, partial, column_seqs, moves = _fold_partials(t, last, last_mask)
        if any(moves):
            after, partial, moved_from = _fold_moves(t, moves, after, partial)

    rows = pa.table(
        {
            "key": last["key"],
            "is_delete": last["is_delete"],
            "seq": last["seq"],
            "ts_ms": last["ts_ms"],
            "after": after,
            "partial": partial,
            "moved_from": moved_from,
            "column_seqs": column_seqs,
        }
    )
    return NetChange(rows, truncate_seq, events_in, events_in - rows.num_rows)


def _groups(t: pa.Table, last_mask: pa.Array) -> list[tuple[int, int]]:
    """(start, end) row ranges of each key group, in order (t sorted by key)."""
    ends = [i for i, v in enumerate(last_mask.to_pylist()) if v]
    starts = [0] + [e + 1 for e in ends[:-1]]
    return list(zip(starts, ends, strict=True))


#: a key's last move into it in the batch: (old key JSON, the move's ``_seq``)
_Move = tuple[str, str]


#: the columns :func:`_fold` reads, as Python lists of the rows to fold
_FOLD_COLUMNS = ["op", "after", "partial", "is_delete", "seq", "old_key", "_seq"]


def _fold(
    rows: dict[str, list[Any]], start: int, end: int
) -> tuple[str | None, bool, str | None, _Move | None]:
    """Fold one key's images in order; returns (after JSON, still partial, column seqs,
    the move the row still takes its absent columns from).

    Column seqs (JSON or ``None``): ``{"columns": {column: seq}, "rest": seq}`` for the
    columns an earlier change of the batch set (the sequence of the last one that set
    each), ``rest`` the sequence of the last full image or delete (from which the columns
    no image holds are NULL; ``None``: no such change). Only sequences older than the
    last change's are given: a column the last change set, or one set at its sequence,
    counts whatever the stored row (``None`` when that holds for every column).

    A partial image that moved a row here (SharePlex ``upd`` of a key column) starts the
    row again: its absent columns are the old key's (:func:`_fold_moves`), not this
    key's, so the move is returned while no full image or delete came after it.
    """
    span = slice(start, end + 1)
    ops, afters, partials = rows["op"][span], rows["after"][span], rows["partial"][span]
    deletes, seqs = rows["is_delete"][span], rows["seq"][span]
    old_keys, orders = rows["old_key"][span], rows["_seq"][span]
    image: dict[str, Any] | None = None
    set_at: dict[str, str | None] = {}
    rest: str | None = None
    move: _Move | None = None
    full = False
    for i, (op, after, part, dele, seq) in enumerate(
        zip(ops, afters, partials, deletes, seqs, strict=True)
    ):
        if dele:
            image, full = None, True  # after a delete, absent columns are NULL
            set_at, rest, move = {}, seq, None
            continue
        row = orjson.loads(after)
        if op != _UPDATE or not part:
            image, full = row, True
            set_at, rest, move = dict.fromkeys(row, seq), seq, None
        elif old_keys[i] is not None:
            image, full = row, False  # moved here: the rest is the old key's row
            set_at, rest, move = dict.fromkeys(row, seq), None, (old_keys[i], orders[i])
        elif image is None:
            image, full = row, full
            set_at.update(dict.fromkeys(row, seq))
        else:
            image = {**image, **row}
            set_at.update(dict.fromkeys(row, seq))
    last = seqs[-1]
    if last is None:
        older: dict[str, str] = {}  # no sequence: the merge's guard lets it through
    else:
        older = {c: s for c, s in set_at.items() if s is not None and s < last}
        if rest is not None and not rest < last:
            rest = None
    seqs_json = None
    if older or rest is not None:
        seqs_json = orjson.dumps({"columns": older, "rest": rest}).decode()
    after_json = None if image is None else orjson.dumps(image).decode()
    return after_json, not full, seqs_json, (None if full else move)


def _fold_partials(
    t: pa.Table, last: pa.Table, last_mask: pa.Array
) -> tuple[pa.Array, pa.Array, pa.Array, list[_Move | None]]:
    """Fold the groups whose last change is partial; returns (after, partial, column
    seqs) columns and each group's move (:func:`_fold`)."""
    after = last["after"].to_pylist()
    partial = [bool(p) for p in last["partial"].to_pylist()]
    old_keys = last["old_key"].to_pylist()
    orders = last["_seq"].to_pylist()
    seqs: list[str | None] = [None] * len(after)
    moves: list[_Move | None] = [None] * len(after)
    todo: list[tuple[int, int, int]] = []  # (group, start, end) of the groups to fold
    for g, (start, end) in enumerate(_groups(t, last_mask)):
        if not partial[g]:
            continue
        if end > start:
            todo.append((g, start, end))
        elif old_keys[g] is not None:
            moves[g] = (old_keys[g], orders[g])
    if todo:
        # one gather and one conversion for every group to fold (not one per group)
        rows = t.select(_FOLD_COLUMNS).take(
            pa.array([i for _, start, end in todo for i in range(start, end + 1)], pa.int64())
        )
        columns = {c: rows[c].to_pylist() for c in _FOLD_COLUMNS}
        at = 0
        for g, start, end in todo:
            width = end - start + 1
            after[g], partial[g], seqs[g], moves[g] = _fold(columns, at, at + width - 1)
            at += width
    return (
        pa.array(after, pa.string()),
        pa.array(partial, pa.bool_()),
        pa.array(seqs, pa.string()),
        moves,
    )


def _fold_moves(
    t: pa.Table, moves: list[_Move | None], after: pa.Array, partial: pa.Array
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Keys whose row a partial image moved there (SharePlex ``upd`` of a key column
    carries only the changed columns; ``moves``: each key's last move, from
    :func:`_fold`): the old key's images earlier in the batch fill the absent columns;
    what is still absent comes from the old key's stored row in the sink
    (``moved_from``)."""
    after_l = after.to_pylist()
    partial_l = partial.to_pylist()
    moved_from: list[str | None] = [None] * len(moves)
    keys = t["key"].to_pylist()
    for g, move in enumerate(moves):
        if move is None or not partial_l[g]:
            continue
        old_key, seq = move
        # the old key's images before the move (the synthetic delete rows have _sub 0)
        rows = [
            i
            for i, k in enumerate(keys)
            if k == old_key and t["_sub"][i].as_py() == 1 and t["_seq"][i].as_py() <= seq
        ]
        base: dict[str, Any] | None = None
        full = False
        for i in rows:
            if t["is_delete"][i].as_py() and t["old_key"][i].as_py() is None:
                base, full = None, True
                continue
            image = t["after"][i].as_py()
            if image is None:
                continue
            row = orjson.loads(image)
            base = row if base is None or not t["partial"][i].as_py() else {**base, **row}
            full = full or not t["partial"][i].as_py()
        if base is not None:
            merged = {**base, **orjson.loads(after_l[g])}
            after_l[g] = orjson.dumps(merged).decode()
        if full:
            partial_l[g] = False
        else:
            moved_from[g] = old_key
    return (
        pa.array(after_l, pa.string()),
        pa.array(partial_l, pa.bool_()),
        pa.array(moved_from, pa.string()),
    )

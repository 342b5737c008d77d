"""Transaction-consistent micro-batches: apply only whole source transactions.

:func:`split_transactions` splits one micro-batch's events (plus the events held back by
earlier batches) into the rows to apply now and the rows of still-open transactions to
hold for the next batch. It is pure Arrow compute (no per-row Python); the held rows are
persisted between batches with :func:`save_pending` / :func:`load_pending`.

Which events form a transaction
-------------------------------
Events are grouped by ``(format, txn_id)``. A group is *tracked* -- its events may be
held -- only where the format marks where the transaction ends: a row of it has
``txn_last`` set (true or false), or is a BEGIN/COMMIT marker, or (``debezium-json``
only) is a data event with ``txn_order``. It is *complete* when a row has ``txn_last``
true or a COMMIT marker of it has arrived, and, where that COMMIT gives a count
(Debezium END ``event_count``), at least that many of its non-marker rows have arrived.
Per format:

* ``qlik-json``: ``transactionLastEvent`` (``txn_last``) on every data message; ends at
  the one that is true.
* ``maxwell-json``: rows with ``xid`` have ``txn_last`` = ``"commit": true`` (false on
  the others); ends at the commit row.
* ``ogg-json``: ``txind`` (``${txind}``) gives ``txn_last``; ends at ``E``/``W`` (``2``/``3``).
* ``shareplex-json``: ``txn_last`` = ``meta.seq == meta.size``; ends at the last op.
* ``debezium-json``: the transaction topic's BEGIN/END records (``txn_id`` = ``id``) and
  data events with the ``transaction`` block (``txn_order`` = ``total_order``, written
  only when Debezium publishes BEGIN/END); ends when END has arrived and END's
  ``event_count`` data events too (events of every table: consume all of the
  transaction's topics, or every transaction waits ``max_wait_ms``).
* ``dts-avro``: ``BEGIN``/``COMMIT`` records with ``sourceTxid``; ends at ``COMMIT``.

Markers without a transaction id (DataWorks ``TRANSACTION_BEGIN`` / ``TRANSACTION_END`` /
``XACOMMIT``; DTS Avro BEGIN/COMMIT with an empty ``sourceTxid``) *bracket* a
transaction by position: in one Kafka partition, ordered by offset (and event index),
the id-less events from a BEGIN up to and including the next COMMIT are one transaction.
It is complete at that COMMIT, or when the next BEGIN appears in the partition (its END
was lost; nothing of it can follow there). A COMMIT with no open BEGIN before it, and
the events before a partition's first BEGIN, pass through. Brackets need the whole
transaction in one partition (a one-partition topic): DataWorks gives no other way to
tell which rows belong together.

Every other event passes through at once: no ``txn_id`` outside a bracket, or a
transaction whose end the format does not mark (AWS DMS ``transaction-id``, Canal
``gtid``, Debezium ``source.txId`` without transaction metadata, Qlik rows with
``transactionLastEvent`` null, DRS, which has no transaction fields). Marker events
(BEGIN/COMMIT) travel with their transaction.

Bounds
------
An open (tracked, incomplete) transaction is released -- applied as it is -- when

* it has waited ``max_wait_ms`` or longer: ``now_ms - held_since_ms`` of its oldest row,
  where ``held_since_ms`` is the ``now_ms`` of the batch that first held the row; or
* the open transactions together hold more than ``max_events`` events: the oldest (by
  ``held_since_ms``, then source position) are released until at most ``max_events``
  remain held. A single transaction larger than ``max_events`` is therefore never held.

``max_wait_ms=0`` turns holding off (every transaction is released in its own batch).

Events that arrive after their transaction's end
------------------------------------------------
Completion is decided over everything seen so far (this batch plus what is held), in any
order: an END that arrives before some of its data events (another topic or partition)
completes the transaction only when the data events are there too *where the format
gives the count* (Debezium ``event_count``, which counts the events of every table: the
source must consume all of the transaction's topics, or every transaction waits
``max_wait_ms``). Formats that mark only the last event (Qlik, Maxwell, GoldenGate,
SharePlex) give no count: a transaction whose last-flagged event has arrived is
complete, and events of it that arrive in a *later* batch (another partition read
behind) are not recognised as late -- nothing is remembered of released transactions --
so they form an open transaction of their own with no end to come and wait
``max_wait_ms`` (counted in ``released_open``). Late rows of a bracket (its BEGIN already
applied) pass through.

Ordering: ``ready`` holds the released held rows first (in the order they were held),
then the ready rows of this batch in their order; the net change orders by ``seq``
anyway. A transaction is released whole: every row of it seen so far, in one batch.

Persistence
-----------
The held rows are a snapshot per batch in ``_cdcflow/pending_transactions``
(:data:`PENDING_SCHEMA`), written with the batch's application transaction. The caller
must, per batch: ``now = batch_clock_ms(...)``; ``held = load_pending(...)``;
``split_transactions(...)``; :func:`save_pending` *before* committing anything else of
the batch; then apply ``split.ready``. A batch replayed after a crash then reads the
same snapshot, uses the clock recorded with its own snapshot (so it splits exactly as
the first attempt did) and skips the snapshot write.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.event_schema import EVENT_SCHEMA
from cdcflow.model import Op
from cdcflow.sinks.system_tables import HELD_SCHEMA, PENDING_SCHEMA, PENDING_TRANSACTIONS
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse

__all__ = [
    "HELD_SCHEMA",
    "KIND_NO_PENDING",
    "PENDING_SCHEMA",
    "PENDING_TABLE",
    "TransactionPolicy",
    "TransactionSplit",
    "batch_clock_ms",
    "load_pending",
    "save_pending",
    "split_transactions",
]

PENDING_TABLE = PENDING_TRANSACTIONS

#: ``kind`` of the one row that records an empty snapshot (nothing held any more).
KIND_NO_PENDING = "none"

_BEGIN, _COMMIT = Op.BEGIN.value, Op.COMMIT.value
_MARKERS = pa.array([_BEGIN, _COMMIT])
#: formats whose data events carry ``txn_order`` only when BEGIN/END records are published
_ORDER_TRACKS = pa.array(["debezium-json"])
#: Debezium END's ``event_count``: the first key of the marker's ``meta`` JSON
_EVENT_COUNT = r'^\{"event_count":(?P<n>[0-9]+)[,}]'
_BRACKET = "\x1e"  # prefix of keys made for bracketed (id-less) transactions
_SEP = "\x1f"


@dataclass(frozen=True)
class TransactionPolicy:
    """Bounds on holding open transactions.

    Attributes:
        max_wait_ms: an open transaction held this long (wall clock since its first row
            was held) or longer is released incomplete. 0: never hold.
        max_events: when open transactions hold more events than this, the oldest are
            released incomplete until at most this many remain.

    Raises:
        ValueError: a negative bound.
    """

    max_wait_ms: int = 60_000
    max_events: int = 100_000

    def __post_init__(self) -> None:
        if self.max_wait_ms < 0 or self.max_events < 0:
            raise ValueError(
                f"max_wait_ms and max_events must be >= 0, got {self.max_wait_ms}, "
                f"{self.max_events}"
            )


@dataclass(slots=True)
class TransactionSplit:
    """One batch split into what to apply now and what to hold.

    Attributes:
        ready: :data:`~cdcflow.decode.batches.EVENT_SCHEMA` rows to apply now: released
            held rows first, then this batch's, each in source order.
        held: :data:`HELD_SCHEMA` rows to keep for the next batch.
        complete: tracked transactions completed (and released) in this batch.
        released_open: tracked transactions released incomplete because a bound was hit.
        max_wait_ms: longest wait (ms since first held) among the tracked transactions
            released in this batch; 0 if none.
        held_transactions: tracked transactions still held.
    """

    ready: pa.Table
    held: pa.Table
    complete: int
    released_open: int
    max_wait_ms: int
    held_transactions: int


def split_transactions(
    events: pa.Table,
    held_before: pa.Table | None,
    now_ms: int,
    batch_id: int,
    policy: TransactionPolicy,
) -> TransactionSplit:
    """Split a batch's events so that only whole transactions are applied (module doc).

    Args:
        events: this batch's :data:`~cdcflow.decode.batches.EVENT_SCHEMA` rows of kind
            ``event`` (every op).
        held_before: :data:`HELD_SCHEMA` rows held by the previous batch, or ``None``.
        now_ms: wall clock of this batch, epoch milliseconds (see :func:`batch_clock_ms`).
        batch_id: this micro-batch; newly held rows record it in ``held_batch_id``.
        policy: the bounds.

    Returns:
        The split; ``ready`` and ``held`` together hold every row of ``held_before`` and
        ``events`` exactly once.
    """
    n_new = events.num_rows
    new = events.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
    new = new.append_column(HELD_SCHEMA.field("held_since_ms"), _repeat(now_ms, n_new))
    new = new.append_column(HELD_SCHEMA.field("held_batch_id"), _repeat(batch_id, n_new))
    parts = [new]
    if held_before is not None and held_before.num_rows:
        parts.insert(0, held_before.select(HELD_SCHEMA.names).cast(HELD_SCHEMA))
    rows = pa.concat_tables(parts).combine_chunks()

    def col(name: str) -> pa.Array:
        return rows.column(name).combine_chunks()

    key, bracket_closed = _transaction_keys(rows)
    if key.null_count == len(key):  # nothing transactional: everything passes
        return TransactionSplit(
            rows.select(EVENT_SCHEMA.names), HELD_SCHEMA.empty_table(), 0, 0, 0, 0
        )

    op, txn_last = col("op"), col("txn_last")
    is_commit = pc.fill_null(pc.equal(op, _COMMIT), False)
    is_marker = pc.fill_null(pc.is_in(op, _MARKERS), False)
    tracks = pc.or_(
        pc.or_(pc.is_valid(txn_last), is_marker),
        pc.and_(
            pc.fill_null(pc.is_in(col("format"), _ORDER_TRACKS), False),
            pc.is_valid(col("txn_order")),
        ),
    )
    ends = pc.or_(pc.or_(pc.fill_null(txn_last, False), is_commit), bracket_closed)
    commit_meta = pc.if_else(is_commit, col("meta"), pa.scalar(None, pa.string()))
    counted = pc.extract_regex(commit_meta, _EVENT_COUNT)
    expected = pc.cast(pc.struct_field(counted, "n"), pa.int64())
    per_row = pa.table(
        {
            "key": key,
            "tracks": tracks,
            "ends": ends,
            "expected": expected,
            "data": pc.cast(pc.invert(is_marker), pa.int64()),
            "since": col("held_since_ms"),
            "pos": _positions(rows.num_rows),
        }
    ).filter(pc.is_valid(key))
    txns = per_row.group_by("key", use_threads=False).aggregate(
        [
            ("tracks", "any"),
            ("ends", "any"),
            ("expected", "max"),
            ("data", "sum"),
            ("since", "min"),
            ("pos", "min"),
            ("key", "count"),
        ]
    )
    tracked = txns["tracks_any"]
    counted_in = pc.fill_null(pc.greater_equal(txns["data_sum"], txns["expected_max"]), True)
    complete = pc.and_(pc.and_(tracked, txns["ends_any"]), counted_in)
    is_open = pc.and_(tracked, pc.invert(complete))
    wait = pc.max_element_wise(pc.subtract(now_ms, txns["since_min"]), 0)
    timed_out = pc.and_(is_open, pc.greater_equal(wait, policy.max_wait_ms))
    release = pc.or_(pc.invert(is_open), timed_out)
    release = pc.or_(release, _over_size(txns, pc.and_(is_open, pc.invert(timed_out)), policy))

    at = pc.index_in(key, value_set=txns["key"])
    ready_mask = pc.fill_null(pc.take(release, at), True)
    released_tracked = pc.and_(tracked, release)
    longest = pc.max(pc.filter(wait, released_tracked)).as_py()
    return TransactionSplit(
        ready=rows.filter(ready_mask).select(EVENT_SCHEMA.names),
        held=rows.filter(pc.invert(ready_mask)),
        complete=_count(complete),
        released_open=_count(pc.and_(is_open, release)),
        max_wait_ms=int(longest or 0),
        held_transactions=_count(pc.invert(release)),
    )


def _repeat(value: int | None, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.int64()), n)


def _positions(n: int) -> pa.Array:
    """0, 1, ..., n - 1 (int64)."""
    return pc.subtract(pc.cumulative_sum(_repeat(1, n)), 1)


def _count(mask: pa.Array) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _over_size(txns: pa.Table, still_open: pa.Array, policy: TransactionPolicy) -> pa.Array:
    """Mask of the oldest open transactions to release so at most ``max_events`` stay."""
    n = txns["key_count"]
    total = pc.sum(pc.filter(n, still_open)).as_py() or 0
    if total <= policy.max_events:
        return pa.repeat(False, txns.num_rows)
    candidates = (
        pa.table({"i": _positions(txns.num_rows), "since": txns["since_min"]})
        .append_column("pos", txns["pos_min"])
        .append_column("n", n)
        .filter(still_open)
    )
    oldest_first = candidates.sort_by([("since", "ascending"), ("pos", "ascending")])
    sizes = oldest_first["n"].combine_chunks()
    # events held from this transaction on (it and every younger one)
    from_here = pc.add(pc.subtract(total, pc.cumulative_sum(sizes)), sizes)
    release = oldest_first["i"].filter(pc.greater(from_here, policy.max_events))
    return pc.is_in(_positions(txns.num_rows), value_set=release)


def _transaction_keys(rows: pa.Table) -> tuple[pa.Array, pa.Array]:
    """Per row: the transaction key (null: in none) and "this row closes a bracket"."""
    n = rows.num_rows
    txn_id = rows.column("txn_id").combine_chunks()
    fmt = pc.fill_null(rows.column("format").combine_chunks(), "")
    key = pc.binary_join_element_wise(fmt, txn_id, _SEP)
    idless = pc.is_null(txn_id)
    op = rows.column("op").combine_chunks()
    idless_marker = pc.and_(idless, pc.fill_null(pc.is_in(op, _MARKERS), False))
    if not pc.any(idless_marker).as_py():
        return key, pa.repeat(False, n)
    where = rows.select(["topic", "partition", "offset", "event_index", "op"])
    bkey, closed = _brackets(where.filter(idless))
    return (
        pc.coalesce(key, pc.replace_with_mask(pa.nulls(n, pa.string()), idless, bkey)),
        pc.replace_with_mask(pa.repeat(False, n), idless, closed),
    )


def _shift(values: pa.Array, by: int, fill: object) -> pa.Array:
    """``values`` moved ``by`` places (+1: each row sees its predecessor), ``fill`` at the edge."""
    pad = pa.array([fill], values.type)
    if by > 0:
        return pa.concat_arrays([pad, values.slice(0, len(values) - 1)])
    return pa.concat_arrays([values.slice(1), pad])


def _brackets(idless: pa.Table) -> tuple[pa.Array, pa.Array]:
    """Bracket keys and closing flags of id-less rows (given and returned in input order).

    In each (topic, partition) in offset order: a BEGIN opens a bracket, the rows after it
    belong to it, a COMMIT ends it (and belongs to it), the next BEGIN closes it too.
    """
    order = pc.sort_indices(
        idless, [(c, "ascending") for c in ("topic", "partition", "offset", "event_index")]
    )
    s = idless.take(order).combine_chunks()

    def col(name: str) -> pa.Array:
        return s.column(name).combine_chunks()

    topic = pc.fill_null(col("topic"), "")
    part = pc.fill_null(col("partition"), 0)
    n = s.num_rows
    starts = pc.or_(
        pc.not_equal(topic, _shift(topic, 1, None)), pc.not_equal(part, _shift(part, 1, None))
    )
    starts = pc.fill_null(starts, True)  # the first row
    ends = _shift(starts, -1, True)  # last row of its partition
    op = col("op")
    is_begin = pc.fill_null(pc.equal(op, _BEGIN), False)
    is_commit = pc.fill_null(pc.equal(op, _COMMIT), False)
    mark = pc.if_else(is_begin, "B", pc.if_else(is_commit, "C", pa.nulls(n, pa.string())))
    last_mark = pc.fill_null_forward(pc.if_else(pc.and_(starts, pc.is_null(mark)), "N", mark))
    prev_mark = pc.if_else(starts, "N", _shift(last_mark, 1, "N"))
    next_mark = pc.fill_null_backward(pc.if_else(pc.and_(ends, pc.is_null(mark)), "N", mark))
    after_mark = pc.if_else(ends, "N", _shift(next_mark, -1, "N"))
    begin_id = pc.binary_join_element_wise(
        topic,
        pc.cast(part, pa.string()),
        pc.cast(col("offset"), pa.string()),
        pc.cast(pc.fill_null(col("event_index"), 0), pa.string()),
        _SEP,
    )
    opened = pc.fill_null_forward(
        pc.if_else(is_begin, begin_id, pc.if_else(starts, "", pa.nulls(n, pa.string())))
    )
    inside = pc.or_(
        is_begin,
        pc.or_(
            pc.and_(pc.is_null(mark), pc.equal(last_mark, "B")),
            pc.and_(is_commit, pc.equal(prev_mark, "B")),
        ),
    )
    bkey = pc.if_else(inside, pc.binary_join_element_wise(_BRACKET, opened, ""), None)
    closed = pc.and_(is_begin, pc.not_equal(after_mark, "N"))
    back = pc.sort_indices(order)  # sorted position of each input row
    return pc.take(bkey, back), pc.take(closed, back)


# --------------------------------------------------------------------------- persistence


def _read(
    wh: DeltaWarehouse, source_id: str, batch_id: int, columns: list[str] | None = None
) -> pa.Table:
    return wh.read_system(
        PENDING_TRANSACTIONS,
        PENDING_SCHEMA,
        columns=columns,
        filters=[("source", "=", source_id), ("batch_id", "=", batch_id)],
    )


def _previous_batch(wh: DeltaWarehouse, source_id: str, batch_id: int) -> int | None:
    """The batch of the latest snapshot of ``source_id`` written by a batch < ``batch_id``."""
    # the source's snapshots are written through one warehouse view (its application id):
    # the view's last committed batch is the latest snapshot, found without a scan
    latest = wh.system_version(PENDING_TRANSACTIONS)
    if latest is None:
        return None
    if latest < batch_id:
        if _read(wh, source_id, latest, ["batch_id"]).num_rows:
            return latest
    elif latest == batch_id:  # this batch ran before: its snapshot names the one it replaced
        own = _read(wh, source_id, batch_id, ["previous_batch_id"])
        if own.num_rows:
            previous: int | None = own["previous_batch_id"][0].as_py()
            return previous
    # an older batch replayed, or the view wrote other sources' snapshots: look them up
    ids = wh.read_system(
        PENDING_TRANSACTIONS,
        PENDING_SCHEMA,
        columns=["batch_id"],
        filters=[("source", "=", source_id), ("batch_id", "<", batch_id)],
    )["batch_id"]
    return pc.max(ids).as_py() if len(ids) else None


def load_pending(wh: DeltaWarehouse, source_id: str, batch_id: int) -> pa.Table | None:
    """The held rows the latest batch before ``batch_id`` left for it.

    Args:
        wh: the warehouse (``_cdcflow/pending_transactions``).
        source_id: the source (``<pipeline>.<source>``, the warehouse view's pipeline id).
        batch_id: the batch about to be split.

    Returns:
        :data:`HELD_SCHEMA` rows, or ``None`` when nothing is held (no snapshot yet, or
        the latest one is empty). A replay of ``batch_id`` gets the same rows.
    """
    previous = _previous_batch(wh, source_id, batch_id)
    if previous is None:
        return None
    snapshot = _read(wh, source_id, previous)
    held = snapshot.filter(pc.not_equal(snapshot["kind"], KIND_NO_PENDING))
    return held.select(HELD_SCHEMA.names).cast(HELD_SCHEMA) if held.num_rows else None


def save_pending(
    wh: DeltaWarehouse,
    source_id: str,
    held: pa.Table,
    commit: CommitContext,
    now_ms: int | None = None,
) -> bool:
    """Record ``held`` as the snapshot of the batch ``commit`` commits (once per batch: a replay writes nothing).

    An empty ``held`` is recorded (as one row of kind :data:`KIND_NO_PENDING`) only when
    the previous snapshot held rows, so they are not loaded again; otherwise nothing is
    written. Call it before committing anything else of the batch.

    Args:
        wh: the warehouse.
        source_id: the source, as for :func:`load_pending`.
        held: :data:`HELD_SCHEMA` rows (:attr:`TransactionSplit.held`).
        commit: the commit context of the batch that split them (its version is the
            batch id); the snapshot's commit carries it.
        now_ms: the ``now_ms`` the split used; :func:`batch_clock_ms` returns it on replay.

    Returns:
        ``True`` when a snapshot was written.
    """
    batch_id = commit.version
    previous = _previous_batch(wh, source_id, batch_id)
    if held.num_rows == 0:
        if previous is None:
            return False
        before = _read(wh, source_id, previous, ["kind"])["kind"]
        if not pc.any(pc.not_equal(before, KIND_NO_PENDING)).as_py():
            return False  # nothing was held before either
        held = pa.table({f.name: pa.nulls(1, f.type) for f in HELD_SCHEMA}).set_column(
            0, HELD_SCHEMA.field("kind"), pa.array([KIND_NO_PENDING])
        )
    n = held.num_rows
    front = {
        "source": pa.repeat(pa.scalar(source_id, pa.string()), n),
        "batch_id": _repeat(batch_id, n),
        "previous_batch_id": _repeat(previous, n),
        "split_at_ms": _repeat(now_ms, n),
    }
    data = pa.table({**front, **{c: held[c] for c in HELD_SCHEMA.names}}, schema=PENDING_SCHEMA)
    return wh.append(wh.system_path(PENDING_TRANSACTIONS), data, commit)


def batch_clock_ms(wh: DeltaWarehouse, source_id: str, batch_id: int, now_ms: int) -> int:
    """The clock to split ``batch_id`` with: the ``now_ms`` recorded by its first run, if
    it wrote a snapshot, else ``now_ms`` (wall clock, epoch ms).

    A replayed batch must split as its first run did: the snapshot it saved is kept (the
    write is idempotent), so a later clock would release transactions that snapshot still
    holds, and they would be applied twice. (When the first run wrote no snapshot it held
    nothing, and a later clock holds nothing either: the held set only shrinks with time.)
    """
    own = _read(wh, source_id, batch_id, ["split_at_ms"])
    recorded = own["split_at_ms"][0].as_py() if own.num_rows else None
    return now_ms if recorded is None else recorded

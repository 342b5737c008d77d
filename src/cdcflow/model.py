"""The unified change-event model every format decodes into.

A Kafka record of any supported format becomes zero or more :class:`ChangeEvent`s
(or a :class:`DeadLetter`). Everything downstream -- routing, typing, net change,
the Delta apply -- sees only this model.

Values inside ``before``/``after`` images are typed Python values:

=====================  ===========================================================
logical type           Python value
=====================  ===========================================================
``boolean``            ``bool``
``int32``/``int64``    ``int``
``float32/float64``    ``float``
``decimal(p,s)``       ``decimal.Decimal`` (exact; never a float)
``string``/``json``    ``str``
``binary``             ``bytes``
``date``               ``datetime.date``
``time``               ``datetime.time`` (microsecond precision)
``timestamp``          naive ``datetime.datetime`` (wall clock, microseconds)
``timestamptz``        aware ``datetime.datetime`` in UTC (microseconds)
=====================  ===========================================================

An image is a ``dict`` from column name to value. A column *absent* from the dict is
"not present in this image" (Qlik ``columnMask``, Canal ``old``, an unavailable TOAST
value): it must not overwrite what is stored. A column present with ``None`` is NULL.

Sequences (``seq``) are tuples of integers ordered like the source log (LSN, SCN,
binlog file/position/row, changeSequence, sequenceId, ...). :func:`seq_key` turns one
into a string whose lexicographic order equals the tuple order, so Spark, Arrow and
Delta can sort and compare it as a plain string.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa

__all__ = [
    "NetChange",
    "ChangeEvent",
    "DeadLetter",
    "Op",
    "Origin",
    "new_origin",
    "ROW_OPS",
    "SourceTable",
    "Txn",
    "event_to_json_dict",
    "json_default",
    "seq_key",
    "seq_key_columns",
    "seq_keys",
]


class Op(enum.StrEnum):
    """What a change event does. The values are the names printed by ``cdcflow decode``."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    SNAPSHOT = "snapshot"  # a row read by the initial (full) load
    TRUNCATE = "truncate"
    DDL = "ddl"
    HEARTBEAT = "heartbeat"
    BEGIN = "begin"  # transaction start marker
    COMMIT = "commit"  # transaction end marker
    MESSAGE = "message"  # a logical-decoding message (Debezium op m), not a row change


#: Ops that change rows of one table and therefore need a key.
ROW_OPS = frozenset({Op.INSERT, Op.UPDATE, Op.DELETE, Op.SNAPSHOT})


@dataclass(frozen=True, slots=True)
class SourceTable:
    """Identity of a source table. Empty strings where the format has no such level."""

    format: str
    database: str = ""
    schema: str = ""
    table: str = ""

    @property
    def qualified_name(self) -> str:
        """``database.schema.table`` without empty parts, e.g. ``inventory.public.customers``."""
        return ".".join(p for p in (self.database, self.schema, self.table) if p)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a record came from: Kafka coordinates (or file name and line number)."""

    topic: str = ""
    partition: int = 0
    offset: int = 0


_ORIGIN_FIELDS = tuple(Origin.__dict__[f].__set__ for f in ("topic", "partition", "offset"))


def new_origin(topic: str, partition: int, offset: int) -> Origin:
    """``Origin(topic, partition, offset)``, built for the decode stage's per-record loop.

    The same object the constructor gives (equal, hashable, frozen), set through its slot
    descriptors: a frozen dataclass's ``__init__`` goes through ``object.__setattr__``
    once per field, which made building a record's origin 0.46 us (this: 0.29 us).
    """
    origin = object.__new__(Origin)
    set_topic, set_partition, set_offset = _ORIGIN_FIELDS
    set_topic(origin, topic)
    set_partition(origin, partition)
    set_offset(origin, offset)
    return origin


@dataclass(frozen=True, slots=True)
class Txn:
    """Transaction information carried by the format.

    Attributes:
        id: source transaction id (string form, e.g. PostgreSQL ``txId`` or an XID).
        order: position of the event inside its transaction (1-based) where known.
        last: ``True`` when the format says this is the transaction's last event.
    """

    id: str
    order: int | None = None
    last: bool | None = None


@dataclass(slots=True)
class ChangeEvent:
    """One decoded change.

    Attributes:
        op: what happened (:class:`Op`).
        source: the source table identity (format, database, schema, table).
        key: primary-key (or unique-key / row-id) column name -> value; ``None`` for
            ops that do not address a row (truncate, ddl, heartbeat, begin, commit).
        before: before image (column -> value), ``None`` when the format carries none.
        after: after image, ``None`` for deletes.
        columns: declared source types, column -> logical type string (see module doc).
        seq: sortable source position as a tuple of ints; ``None`` if the format has none.
        ts_ms: source commit (or change) time, epoch milliseconds.
        txn: transaction info, if any.
        ddl: DDL statement text for ``Op.DDL`` events (and truncates that carry it).
        changed: columns an update changed, where the format says so.
        origin: provenance (topic, partition, offset).
        partial: ``True`` when the format says the after image holds only some columns
            (SharePlex ``upd``: key and changed columns) though it declares none;
            ``None``: decided from ``columns`` (a declared column absent from the image).
        meta: format-specific extras that are worth keeping (e.g. ``rowid``, ``scn``,
            the raw op code, a logical message's prefix/content). JSON-able values only.
    """

    op: Op
    source: SourceTable
    key: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    columns: dict[str, str] | None = None
    seq: tuple[int, ...] | None = None
    ts_ms: int | None = None
    txn: Txn | None = None
    ddl: str | None = None
    changed: tuple[str, ...] | None = None
    origin: Origin = field(default_factory=Origin)
    meta: dict[str, Any] | None = None
    partial: bool | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be decoded or applied.

    Attributes:
        code: stable error code (see :mod:`cdcflow.errors`), e.g. ``BAD_JSON``.
        message: human-readable reason, saying how to fix it where possible.
        format: the format identifier the record was decoded with.
        origin: Kafka coordinates of the record.
        value: raw value bytes (``None`` for a tombstone).
        key: raw key bytes.
    """

    code: str
    message: str
    format: str
    origin: Origin
    value: bytes | None
    key: bytes | None = None


# --------------------------------------------------------------------------- sequences


def _seq_part(n: int) -> str:
    if n >= 0:
        digits = str(n)
        # Two-digit length prefix: shorter numbers sort first, equal lengths compare
        # digit by digit, so string order == numeric order for non-negative ints.
        return f"{len(digits):02d}{digits}"
    # Negative parts sort before every non-negative one ('!' < '0'); among negatives,
    # a larger magnitude must come first: complement against 10**40.
    return "!" + f"{10**40 + n:041d}"


#: two-digit length prefixes of :func:`seq_key` parts
_LENGTH_PREFIX = {n: f"{n:02d}" for n in range(1, 100)}


def seq_key(seq: tuple[int, ...] | None) -> str | None:
    """Encode a sequence tuple as a string with the same order.

    ``seq_key((1, 20)) < seq_key((1, 3))`` is ``False``, as for the tuples. A prefix
    sorts before its extensions: ``seq_key((5,)) < seq_key((5, 0))``.

    Args:
        seq: tuple of ints (any size; negative values allowed down to -10**40).

    Returns:
        The encoded string, or ``None`` when ``seq`` is ``None``.
    """
    if seq is None:
        return None
    if seq and min(seq) >= 0:
        try:  # the common case: non-negative parts of fewer than 100 digits
            return ".".join([_LENGTH_PREFIX[len(d)] + d for d in map(str, seq)])
        except KeyError:  # a part of 100 digits or more
            pass
    return ".".join(_seq_part(int(n)) for n in seq)


#: ``"00"`` .. ``"20"``: the length prefixes of :func:`seq_keys`' int64 parts
_ARROW_PREFIX: Any = None


def seq_keys(seqs: Sequence[tuple[int, ...] | None]) -> list[str | None]:
    """:func:`seq_key` of every sequence in ``seqs``, in order.

    Where every sequence is a tuple of the same length of non-negative 64-bit integers
    (each format's usual case) the keys are built column by column with Arrow compute:
    0.39 us per 3-part sequence here, against 0.98 us one by one. Anything else is
    encoded one by one by :func:`seq_key`, with the same result.

    Raises:
        what :func:`seq_key` raises for a part that is not an integer.
    """
    import numpy as np

    if len(seqs) < 64:
        return [seq_key(s) for s in seqs]
    try:
        parts = np.array(seqs)
    except (ValueError, TypeError, OverflowError):  # ragged, None among tuples, ...
        return [seq_key(s) for s in seqs]
    if parts.dtype != np.int64 or parts.ndim != 2 or parts.shape[1] == 0 or (parts < 0).any():
        return [seq_key(s) for s in seqs]
    import pyarrow as pa

    keys: list[str | None] = seq_key_columns(
        [pa.array(parts[:, j]) for j in range(parts.shape[1])]
    ).to_pylist()
    return keys


def seq_key_columns(parts: Sequence[pa.Array]) -> pa.Array:
    """:func:`seq_key` of sequences given as columns: ``parts[j][i]`` is part ``j`` of
    sequence ``i``; every part a non-negative ``int64`` (not checked), none null.

    Returns:
        A ``pyarrow`` string array, one key per sequence.
    """
    global _ARROW_PREFIX
    import pyarrow as pa
    import pyarrow.compute as pc

    if _ARROW_PREFIX is None:
        _ARROW_PREFIX = pa.array([f"{n:02d}" for n in range(21)])
    encoded = []
    for part in parts:
        digits = part.cast(pa.string())
        prefix = _ARROW_PREFIX.take(pc.binary_length(digits))
        encoded.append(pc.binary_join_element_wise(prefix, digits, ""))
    if len(encoded) == 1:
        return encoded[0]
    return pc.binary_join_element_wise(*encoded, ".")


# --------------------------------------------------------------------------- JSON form


def json_default(value: Any) -> Any:
    """``orjson`` default hook: decimals as strings, bytes as base64, times as ISO-8601.

    Raises:
        TypeError: for a value with no canonical JSON form.
    """
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.time | dt.date):  # dt.datetime is a dt.date
        return value.isoformat()
    raise TypeError(f"no JSON form for {type(value).__name__}")


#: orjson 3.13 writes ``datetime.time`` with 10000-99999 microseconds without the leading
#: zero of the fraction (``08:15:41.68916`` for 068916): times, dates and datetimes go
#: through :func:`json_default` (``isoformat``, the same text orjson writes when right).
#: Found by the source oracle (tests/oracle).
EXACT_TIME_OPTS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
)
_ORJSON_OPTS = EXACT_TIME_OPTS


def event_to_json_dict(event: ChangeEvent) -> dict[str, Any]:
    """The ``cdcflow decode`` form of an event (before JSON encoding).

    Returns:
        ``{"op", "source": {format, database, schema, table}, "key", "before", "after",
        "seq", "ts_ms", "txn"}`` plus ``ddl``, ``changed``, ``meta`` when set.
        ``seq`` is the encoded :func:`seq_key` string; ``txn`` is
        ``{"id", "order", "last"}`` or ``None``.
    """
    src = event.source
    out: dict[str, Any] = {
        "op": event.op.value,
        "source": {
            "format": src.format,
            "database": src.database,
            "schema": src.schema,
            "table": src.table,
        },
        "key": event.key,
        "before": event.before,
        "after": event.after,
        "seq": seq_key(event.seq),
        "ts_ms": event.ts_ms,
        "txn": (
            None
            if event.txn is None
            else {"id": event.txn.id, "order": event.txn.order, "last": event.txn.last}
        ),
    }
    if event.ddl is not None:
        out["ddl"] = event.ddl
    if event.changed is not None:
        out["changed"] = list(event.changed)
    if event.meta:
        out["meta"] = event.meta
    return out


def _exact_big_ints(obj: Any) -> Any:
    """Integers beyond 64 bits as decimal strings (orjson refuses them, never calling default)."""
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, int):
        return obj if -(2**63) <= obj < 2**64 else str(obj)
    if isinstance(obj, dict):
        return {k: _exact_big_ints(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_exact_big_ints(v) for v in obj]
    return obj


def dumps(obj: Any) -> bytes:
    """Canonical JSON bytes (see :func:`json_default`); keys keep insertion order.

    Integers beyond the 64-bit range are written as decimal strings, so they stay exact.
    """
    try:
        return orjson.dumps(obj, default=json_default, option=_ORJSON_OPTS)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
        return orjson.dumps(_exact_big_ints(obj), default=json_default, option=_ORJSON_OPTS)


@dataclass(slots=True)
class NetChange:
    """The net effect of one batch on one table.

    Attributes:
        rows: one row per key: ``key`` (JSON), ``is_delete``, ``seq``, ``ts_ms``, ``after``
            (JSON or null), ``partial``; ``moved_from`` (the old key's JSON when a
            partial image moved the row there and no full image or delete of the key
            came after it in the batch, else null: the sink fills the absent columns from
            the old key's stored row); ``column_seqs`` (JSON or null: where a partial last
            change took columns from older changes of the batch,
            ``{"columns": {column: seq}, "rest": seq}``, the sequence of the change that
            set each such column and of the last full image or delete before it; the
            sink writes such a column only over a stored row not newer than it) -- sorted
            by key.
        truncate_seq: the sequence of the batch's last truncate (``""`` if it had none),
            ``None`` when there was no truncate.
        events_in: row events considered (after the truncate cut).
        superseded: row events replaced by a later change of the same key in the batch.
    """

    rows: pa.Table
    truncate_seq: str | None
    events_in: int
    superseded: int

"""Debezium JSON a window at a time: the columnar path of
:class:`~cdcflow.formats.debezium.json_decoder.DebeziumJsonDecoder` (decision 33).

It answers for windows whose every record is what the record-by-record fast path
(``_fast_parts``) answers for, in its most common form -- a schemaless c/u/d/r event of
the PostgreSQL, MySQL or MariaDB connector (one of them per window) with flat scalar
images, a flat JSON key (or configured key columns), no transaction block, no headers --
and gives the same rows. The envelope is
read by msgspec with the images kept as raw slices; each table's images are read by
Arrow's JSON reader and proven equal to the exact reading by their canonical text
(:mod:`cdcflow.formats.columnar`). Any record outside that shape declines the whole
window, before any effect; the decode stage then decodes it record by record.

Source document: Debezium's PostgreSQL connector event format
(https://debezium.io/documentation/reference/stable/connectors/postgresql.html, Debezium connector documentation, "Data change events").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.errors import DecodeError
from cdcflow.formats.base import ColumnarEvents, Record
from cdcflow.formats.columnar import (
    ImageTexts,
    binary_array,
    image_texts,
    raw_values_ok,
    read_images,
    same_text,
)
from cdcflow.model import Op, SourceTable, seq_key_columns

if TYPE_CHECKING:
    from cdcflow.formats.debezium.json_decoder import DebeziumJsonDecoder

__all__ = ["decode_columnar"]

_NULL = msgspec.Raw(b"null")
_ABSENT = msgspec.Raw(b"")
_CONNECTORS = ("postgresql", "mysql", "mariadb")
_OP_CODES = pa.array(["c", "u", "d", "r"], pa.string())
_OP_VALUES = pa.array(
    [Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value, Op.SNAPSHOT.value], pa.string()
)
#: the first LSN of Debezium's PostgreSQL ``sequence`` (``["last commit LSN","LSN"]``)
_LAST_LSN = r'^\["(?P<last>[0-9]{1,20})"'


class _Source(msgspec.Struct):
    """The ``source`` members the fast path reads (others are skipped)."""

    connector: str | None = None
    db: str | None = None
    schema: str | None = None
    table: str | None = None
    ts_ms: int | None = None
    lsn: int | None = None
    sequence: str | None = None
    txId: int | None = None  # noqa: N815 - Debezium's member name
    file: str | None = None  # MySQL/MariaDB binlog position
    pos: int | None = None
    row: int | None = None


class _Envelope(msgspec.Struct):
    """The envelope members the fast path reads; images stay raw slices."""

    op: str | None = None
    before: msgspec.Raw = _NULL
    after: msgspec.Raw = _NULL
    source: _Source | None = None
    ts_ms: int | None = None
    transaction: msgspec.Raw = _NULL
    payload: msgspec.Raw = _ABSENT


_decode_envelope = msgspec.json.Decoder(_Envelope).decode


_T = TypeVar("_T")


def _none_free(items: list[_T | None]) -> TypeGuard[list[_T]]:
    """Whether no item is ``None``."""
    return None not in items


def _all_truthy(items: list[_T | None]) -> TypeGuard[list[_T]]:
    """Whether every item is truthy (so none is ``None``)."""
    return all(items)


class _Declined(Exception):
    """The window is not all of the shape this path answers for."""


def decode_columnar(dec: DebeziumJsonDecoder, records: Sequence[Record]) -> ColumnarEvents | None:
    """The window's events as :class:`~cdcflow.formats.base.ColumnarEvents`, or ``None``
    (see the module docstring). Never raises."""
    if not dec.fast_path or not records:
        return None
    try:
        return _decode(dec, records)
    except _Declined:
        return None
    except (msgspec.DecodeError, orjson.JSONDecodeError, OverflowError, ValueError, TypeError):
        return None
    except DecodeError:  # the table's names are not strings
        return None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _decode(dec: DebeziumJsonDecoder, records: Sequence[Record]) -> ColumnarEvents:
    n = len(records)
    values = [r.value for r in records]
    if not _none_free(values) or any(r.headers for r in records):
        raise _Declined
    if max(map(len, values)) > dec.options.max_record_bytes:
        raise _Declined
    if not raw_values_ok(binary_array(values)):
        raise _Declined
    envelopes = [_decode_envelope(v) for v in values]  # msgspec.DecodeError: declined
    sources = [e.source for e in envelopes]
    if not _none_free(sources) or any(len(e.payload) for e in envelopes):
        raise _Declined
    if not all(t is _NULL or t == _NULL for t in [e.transaction for e in envelopes]):
        raise _Declined
    connectors = [s.connector for s in sources]
    connector = connectors[0]
    if connector not in _CONNECTORS or connectors.count(connector) != n:
        raise _Declined

    # one table per window: Debezium writes one topic per table, so the records of one
    # partition are one table; a topic shared by several tables goes record by record
    first = sources[0]
    name = (first.db, first.schema, first.table)
    if not first.table:
        raise _Declined
    table = dec.source_table({"db": first.db, "schema": first.schema, "table": first.table}, True)
    for values_of, want in zip(
        ([s.db for s in sources], [s.schema for s in sources], [s.table for s in sources]),
        name,
        strict=True,
    ):
        if values_of.count(want) != n:
            raise _Declined

    codes = [e.op for e in envelopes]
    ops = pa.array(codes, pa.string())
    if not pc.all(pc.fill_null(pc.is_in(ops, _OP_CODES), False)).as_py():
        raise _Declined
    afters = binary_array([e.after for e in envelopes])
    befores = binary_array([e.before for e in envelopes])
    has_after = _starts_object(afters)
    has_before = _starts_object(befores)
    after_null = _is_null(afters)
    before_null = _is_null(befores)
    deletes = np.asarray(pc.equal(ops, "d").to_numpy(zero_copy_only=False))
    shape_ok = (has_after & (before_null | has_before)) | (after_null & deletes & has_before)
    if not shape_ok.all():
        raise _Declined
    after_raws = [e.after for e, yes in zip(envelopes, has_after, strict=True) if yes]
    before_raws = [e.before for e, yes in zip(envelopes, has_before, strict=True) if yes]

    names = _key_names(dec, records, table)
    seq = _sequences(sources) if connector == "postgresql" else _binlog_positions(dec, sources)
    source_ts = pa.array([s.ts_ms for s in sources], pa.int64())
    envelope_ts = pa.array([e.ts_ms for e in envelopes], pa.int64())
    # the exact way's `source.ts_ms or ts_ms`: the envelope's where the source's is 0/null
    ts_ms = pc.if_else(pc.fill_null(pc.not_equal(source_ts, 0), False), source_ts, envelope_ts)
    txn_id = pa.array([s.txId for s in sources], pa.int64()).cast(pa.string())

    after_all = _images(dec, after_raws, afters.filter(has_after)) if after_raws else None
    before_all = _images(dec, before_raws, befores.filter(has_before)) if before_raws else None
    columns = _Columns(n, has_after, has_before)
    after_text = columns.scatter(after_all.text, has_after) if after_all is not None else _nulls(n)
    before_text = (
        columns.scatter(before_all.text, has_before) if before_all is not None else _nulls(n)
    )
    key_text, decl = columns.keys_and_declarations(after_all, before_all, names)
    old_key = columns.old_keys(after_all, before_all, names, key_text)
    return ColumnarEvents(
        op=_OP_VALUES.take(pc.index_in(ops, _OP_CODES)),
        tables=[table],
        table_index=np.zeros(n, np.int64),
        key=key_text,
        old_key=old_key,
        before=before_text,
        after=after_text,
        columns=decl,
        seq=seq,
        ts_ms=ts_ms,
        txn_id=txn_id,
    )


def _starts_object(raws: pa.Array) -> np.ndarray:
    first = pc.binary_slice(raws, 0, 1)
    return np.asarray(pc.equal(first, pa.scalar(b"{", raws.type)).to_numpy(zero_copy_only=False))


def _is_null(raws: pa.Array) -> np.ndarray:
    return np.asarray(pc.equal(raws, pa.scalar(b"null", raws.type)).to_numpy(zero_copy_only=False))


def _key_names(
    dec: DebeziumJsonDecoder, records: Sequence[Record], table: SourceTable
) -> tuple[str, ...]:
    """The key columns of the window's records: the members of their Kafka keys (JSON
    objects with the same members in the same order in every record, read as the exact
    way reads them), or the table's configured key columns where no record has a key."""
    keys = [r.key for r in records]
    if not any(keys):
        names = dec.configured_key(table)
        if names is None:
            raise _Declined
        return names
    if not _all_truthy(keys):
        raise _Declined
    loads = orjson.loads
    objects = [loads(k) for k in keys]  # orjson.JSONDecodeError: declined
    first = objects[0]
    if first.__class__ is not dict or not first or "payload" in first:
        raise _Declined
    names = tuple(first)
    width = len(names)
    for obj in objects:
        if obj.__class__ is not dict or len(obj) != width or tuple(obj) != names:
            raise _Declined
    return names


def _sequences(sources: list[_Source]) -> pa.Array:
    """:func:`~cdcflow.model.seq_key` of each record's ``(last LSN of sequence, lsn)``,
    as the exact way reads them (``sequence`` null or ``[null, ...]``: 0)."""
    lsn = pa.array([s.lsn for s in sources], pa.int64())
    text = pa.array([s.sequence for s in sources], pa.string())
    last = pc.struct_field(pc.extract_regex(text, _LAST_LSN), [0])
    unset = pc.or_(pc.is_null(text), pc.fill_null(pc.starts_with(text, "[null,"), False))
    if lsn.null_count or not pc.all(pc.or_(pc.is_valid(last), unset)).as_py():
        raise _Declined
    last = pc.if_else(unset, pa.scalar(0, pa.int64()), pc.cast(last, pa.int64()))
    return seq_key_columns([_non_negative(last), _non_negative(lsn)])


def _binlog_positions(dec: DebeziumJsonDecoder, sources: list[_Source]) -> pa.Array:
    """:func:`~cdcflow.model.seq_key` of each record's ``(binlog file number, pos, row)``
    (MySQL, MariaDB), the file numbers as the exact way reads them (``SourceSequence``:
    ``mysql-bin.000003`` is 3; a name without a number declines)."""
    files = [s.file for s in sources]
    if not _none_free(files):
        raise _Declined
    # DecodeError: declined (binlog_number only caches what it reads)
    numbers = {name: dec.sequence.binlog_number(name) for name in set(files)}
    number = pa.array([numbers[f] for f in files], pa.int64())
    pos = pa.array([s.pos for s in sources], pa.int64())
    row = pa.array([s.row for s in sources], pa.int64())
    return seq_key_columns([_non_negative(number), _non_negative(pos), _non_negative(row)])


def _non_negative(values: pa.Array) -> pa.Array:
    if values.null_count or (len(values) and pc.min(values).as_py() < 0):
        raise _Declined
    return values


def _images(dec: DebeziumJsonDecoder, raws: list[Any], raw_array: pa.Array) -> ImageTexts:
    """The images ``raws`` read and proven against their raw slices (``raw_array``: the
    same bytes as an Arrow array), or declined."""
    table = read_images(raws)
    if table is None or table.num_columns > dec.options.max_columns:
        raise _Declined
    texts = image_texts(table, dec.unavailable_values)
    if texts is None or not same_text(texts, raw_array):
        raise _Declined
    return texts


def _nulls(n: int) -> pa.Array:
    return pa.nulls(n, pa.string())


class _Columns:
    """Per-record columns of one table's window from its images' texts: the after
    images are those of the records with ``has_after``, the before images those with
    ``has_before`` (in record order)."""

    def __init__(self, n: int, has_after: np.ndarray, has_before: np.ndarray) -> None:
        self.n = n
        self.has_after = has_after
        self.has_before = has_before

    def scatter(self, values: pa.Array, mask: np.ndarray) -> pa.Array:
        """``values`` (one per ``True`` of ``mask``) at their records; null elsewhere."""
        if mask.all():
            return values
        at = np.full(self.n, len(values), np.int64)
        at[mask] = np.arange(len(values))
        return pa.concat_arrays([values, pa.nulls(1, values.type)]).take(pa.array(at))

    @staticmethod
    def gather(values: pa.Array, have: np.ndarray, want: np.ndarray) -> pa.Array:
        """The elements of ``values`` (one per ``True`` of ``have``) of the records of
        ``want`` (a subset of ``have``)."""
        positions = np.cumsum(have) - 1
        return values.take(pa.array(positions[want]))

    @staticmethod
    def key_texts(texts: ImageTexts, names: tuple[str, ...]) -> pa.Array:
        """Canonical JSON of each image's key columns, in key order."""
        at = {name: i for i, name in enumerate(texts.names)}
        parts: list[Any] = []
        for j, name in enumerate(names):
            i = at.get(name)
            if i is None:
                raise _Declined  # the image lacks a key column: the exact way decides
            parts.append(("{" if j == 0 else ",") + orjson.dumps(name).decode() + ":")
            parts.append(texts.values[i])
        return pc.binary_join_element_wise(*parts, "}", "")

    @staticmethod
    def declarations(texts: ImageTexts) -> pa.Array:
        """Each image's declared types as ``flatten`` writes them: the type of every
        non-null value, in the image's member order (null when all values are null)."""
        valid = texts.valid()
        rows, width = valid.shape
        if width == 0:
            return _nulls(rows)
        if width <= 62:  # one integer per image: which of its values are not null
            weights = np.int64(1) << np.arange(width, dtype=np.int64)
            codes, inverse = np.unique(valid @ weights, return_inverse=True)
            present = [(int(code) >> np.arange(width)) & 1 for code in codes]
        else:
            packed, inverse = np.unique(np.packbits(valid, axis=1), axis=0, return_inverse=True)
            present = list(np.unpackbits(packed, axis=1)[:, :width])
        decls: list[str | None] = []
        for pattern in present:
            declared = {texts.names[j]: texts.types[j] for j in np.flatnonzero(pattern)}
            decls.append(orjson.dumps(declared).decode() if declared else None)
        return pa.array(decls, pa.string()).take(pa.array(np.asarray(inverse).reshape(-1)))

    def keys_and_declarations(
        self, after: ImageTexts | None, before: ImageTexts | None, names: tuple[str, ...]
    ) -> tuple[pa.Array, pa.Array]:
        """The key text and declaration of each record, from its after image, or from
        its before image where it has no after image (a delete)."""
        if after is not None:
            key = self.scatter(self.key_texts(after, names), self.has_after)
            decl = self.scatter(self.declarations(after), self.has_after)
        else:
            key = decl = _nulls(self.n)
        deletes = ~self.has_after
        if deletes.any():
            assert before is not None  # a record without an after image has a before image
            from_before = self.gather(self.key_texts(before, names), self.has_before, deletes)
            decl_before = self.gather(self.declarations(before), self.has_before, deletes)
            key = pc.if_else(pa.array(deletes), self.scatter(from_before, deletes), key)
            decl = pc.if_else(pa.array(deletes), self.scatter(decl_before, deletes), decl)
        return key, decl

    def old_keys(
        self,
        after: ImageTexts | None,
        before: ImageTexts | None,
        names: tuple[str, ...],
        key: pa.Array,
    ) -> pa.Array:
        """The before image's key where an update moved the row (``_moved_from``)."""
        both = self.has_after & self.has_before
        if before is None or after is None or not both.any():
            return _nulls(self.n)
        if any(name not in before.names for name in names):
            return _nulls(self.n)  # the before image lacks a key column: not a move
        for name in names:
            a = after.types[after.names.index(name)]
            b = before.types[before.names.index(name)]
            # text equality is value equality only for one type (5 == 5.0 in Python)
            if "float64" in (a, b) or (a != b and a is not None and b is not None):
                raise _Declined
        old = self.gather(self.key_texts(before, names), self.has_before, both)
        new = self.gather(key, np.ones(self.n, bool), both)
        moved = pc.if_else(pc.equal(old, new), pa.scalar(None, pa.string()), old)
        return self.scatter(moved, both)

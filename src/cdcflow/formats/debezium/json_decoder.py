"""The ``debezium-json`` decoder: one Kafka record -> one event (see the package
docstring, :mod:`cdcflow.formats.debezium`, for the rules)."""

from __future__ import annotations

import base64
import dataclasses
import decimal
from collections.abc import Sequence
from typing import Any

import orjson

from cdcflow import types as T
from cdcflow.errors import Code, DecodeError, SkipReason
from cdcflow.formats.base import (
    ColumnarEvents,
    Decoder,
    DecoderOptions,
    FlatEvent,
    Record,
    SkipRecord,
    key_columns_for,
)
from cdcflow.formats.common.exact_json import loads_exact
from cdcflow.formats.common.fields import field_error, json_kind, require
from cdcflow.formats.debezium.columnar import decode_columnar
from cdcflow.formats.debezium.connect_types import (
    Struct,
    as_floats,
    json_text,
    plain_json,
    undeclared_error,
)
from cdcflow.formats.debezium.envelope import (
    HEADER_NEWKEY,
    HEADER_OLDKEY,
    OP_MESSAGE,
    OP_TRUNCATE,
    ROW_OPS,
    STATUS_BEGIN,
    STATUS_END,
    envelope_row,
)
from cdcflow.formats.debezium.numbers import I64_MAX, I64_MIN, NeedExact, int64_field
from cdcflow.formats.debezium.options import IDENTIFIER, UNDECLARED_KEEP, DebeziumJsonOptions
from cdcflow.formats.debezium.sequence import SourceSequence
from cdcflow.model import ChangeEvent, Op, SourceTable, Txn

__all__ = [
    "IDENTIFIER",
    "DebeziumJsonDecoder",
    "DebeziumJsonOptions",
]


_loads = orjson.loads


_JSONDecodeError = orjson.JSONDecodeError


_NONE_TYPE = type(None)


# Enum member access costs ~170 ns on Python 3.11; the hot path uses these names.
_DELETE = Op.DELETE


_EVENT_FIELDS = (
    "op",
    "source",
    "key",
    "before",
    "after",
    "columns",
    "seq",
    "ts_ms",
    "txn",
    "ddl",
    "changed",
    "origin",
    "meta",
    "partial",
)


_object_new = object.__new__


def _row_change(
    op: Op,
    source: SourceTable,
    before: Any,
    after: Any,
    columns: Any,
    seq: Any,
    ts_ms: Any,
    txn: Any,
    origin: Any,
) -> ChangeEvent:
    """``ChangeEvent(...)`` for the hot path: setting the slots directly is about twice
    as fast as the generated ``__init__``. Used only while the dataclass has exactly
    the fields below (checked at import, see ``_new_row_change``)."""
    e = _object_new(ChangeEvent)
    e.op = op
    e.source = source
    e.key = None
    e.before = before
    e.after = after
    e.columns = columns
    e.seq = seq
    e.ts_ms = ts_ms
    e.txn = txn
    e.ddl = None
    e.changed = None
    e.origin = origin
    e.meta = None
    e.partial = None
    return e


def _row_change_init(
    op: Op,
    source: SourceTable,
    before: Any,
    after: Any,
    columns: Any,
    seq: Any,
    ts_ms: Any,
    txn: Any,
    origin: Any,
) -> ChangeEvent:
    return ChangeEvent(
        op=op,
        source=source,
        before=before,
        after=after,
        columns=columns,
        seq=seq,
        ts_ms=ts_ms,
        txn=txn,
        origin=origin,
    )


_new_row_change = (
    _row_change
    if tuple(f.name for f in dataclasses.fields(ChangeEvent)) == _EVENT_FIELDS
    else _row_change_init
)


class DebeziumJsonDecoder(Decoder[DebeziumJsonOptions]):
    """Decodes Debezium JSON change events (see the module docstring).

    Instances hold only caches (source tables, compiled schemas, binlog file numbers);
    they pickle without them.
    """

    identifier = IDENTIFIER
    options_class = DebeziumJsonOptions
    options: DebeziumJsonOptions

    def __init__(self, options: DecoderOptions | None = None) -> None:
        if options is not None:
            options = DebeziumJsonOptions.from_options(options)
        super().__init__(options)
        self._setup()

    def _setup(self) -> None:
        o = self.options
        self._schema_include = o.schema_include
        self._always_exact = o.float_as_decimal
        self._fast_ok = o.schema_include is not True
        self._keep_undeclared = o.undeclared_columns == UNDECLARED_KEEP
        ph = o.unavailable_value_placeholder
        ph_b64 = base64.b64encode(ph.encode()).decode()
        ph_hex = ph.encode().hex()
        self.unavailable_values = frozenset({ph, ph_b64, ph_hex})
        self._tables: dict[tuple[Any, Any, Any], SourceTable] = {}
        self._structs: dict[bytes, Struct] = {}
        self.sequence = SourceSequence()
        self._pk_cache: dict[SourceTable, tuple[str, ...] | None] = {}
        self._last_source: tuple[Any, Any, Any] = (None, None, None)
        self._last_table: SourceTable | None = None
        self._last_txid: Any = None
        self._last_txn: Txn | None = None

    @property
    def fast_path(self) -> bool:
        """Whether records of the common shape may take the fast paths (record by record,
        :meth:`decode_flat`, and a window at a time, :meth:`decode_columnar`): not when
        every message must carry its schema or every number must be read exactly."""
        return self._fast_ok and not self._always_exact

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._setup()

    # ------------------------------------------------------------------ entry

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one Debezium JSON record.

        Args:
            record: the Kafka record; its key (a Debezium key message) names the key
                columns, its headers may carry ``__debezium.oldkey``/``newkey``.

        Returns:
            One event (see the module docstring for which op).

        Raises:
            DecodeError: BAD_JSON, NOT_AN_OBJECT, MISSING_FIELD, BAD_FIELD, UNKNOWN_OP,
                MISSING_KEY or BAD_VALUE.
            SkipRecord: ``TOMBSTONE`` for a ``{"schema": ..., "payload": null}`` value.
        """
        value = record.value
        if value is None:
            raise SkipRecord(SkipReason.TOMBSTONE)
        if self._always_exact:
            return self._decode(loads_exact(value, True), record, True)
        try:
            obj = _loads(value)
        except _JSONDecodeError as exc:
            raise DecodeError(f"value is not valid JSON: {exc}", Code.BAD_JSON) from exc
        try:
            if self._fast_ok and obj.__class__ is dict and "payload" not in obj:
                event = self._fast_row(obj, record)
                if event is not None:
                    return [event]
            return self._decode(obj, record, False)
        except NeedExact:
            return self._decode(loads_exact(value, True), record, True)

    def decode_flat(self, record: Record) -> FlatEvent | None:
        """The record's one event as a :data:`~cdcflow.formats.base.FlatEvent`, when it
        has the common shape :meth:`_fast_parts` reads; ``None`` sends it the general way
        (:meth:`decode_batch`), which gives the same event. See
        :meth:`Decoder.decode_flat`."""
        value = record.value
        if value is None or self._always_exact or not self._fast_ok:
            return None
        try:
            obj = _loads(value)
        except _JSONDecodeError:
            return None
        if obj.__class__ is not dict or "payload" in obj:
            return None
        return self._fast_parts(obj, record)

    def decode_columnar(self, records: Sequence[Record]) -> ColumnarEvents | None:
        """The window's events as columns when every record has the common shape
        (:mod:`cdcflow.formats.debezium.columnar`); ``None`` sends it record by record.
        See :meth:`Decoder.decode_columnar`."""
        return decode_columnar(self, records)

    def _fast_row(self, payload: dict[str, Any], record: Record) -> ChangeEvent | None:
        """The event of :meth:`_fast_parts`, or ``None``."""
        parts = self._fast_parts(payload, record)
        if parts is None:
            return None
        op, table, key, before, after, columns, seq, ts_ms, txn = parts
        event = _new_row_change(op, table, before, after, columns, seq, ts_ms, txn, record.origin)
        event.key = key
        return event

    def _fast_parts(self, payload: dict[str, Any], record: Record) -> FlatEvent | None:
        """The common case -- a schemaless c/u/d/r event with flat scalar images, an
        integer ``ts_ms``, a PostgreSQL or MySQL source, a flat JSON key (or configured
        key columns), no transaction block and no headers -- decoded with as few
        Python operations as possible. Anything else returns ``None`` *before any
        effect* and goes the general way (:meth:`_decode`), which gives the same
        result for the common case (tests check that). Each check may be stricter
        than the general path needs: a record it refuses only costs the general path."""
        get = payload.get
        code = get("op")
        if code.__class__ is not str:
            return None
        op = ROW_OPS.get(code)
        source = get("source")
        if op is None or source.__class__ is not dict or record.headers:
            return None
        if get("transaction") is not None:
            return None
        after = get("after")
        before = get("before")
        if after.__class__ is dict:
            columns = self._flat_types(after)
            if columns is None:
                return None
            if before is not None and (
                before.__class__ is not dict or not self._flat_values(before)
            ):
                return None
            image = after
        elif after is None and op is _DELETE and before.__class__ is dict:
            columns = self._flat_types(before)
            if columns is None:
                return None
            image = before
        else:
            return None

        sget = source.get
        ts_ms = sget("ts_ms") or get("ts_ms")
        if ts_ms.__class__ is not int:
            if ts_ms is not None:
                return None
        elif ts_ms > I64_MAX:  # orjson reads integers up to 2**64 - 1
            return None
        connector = sget("connector")
        if connector == "postgresql":
            lsn = sget("lsn")
            text = sget("sequence")
            if lsn.__class__ is not int:
                return None
            if text.__class__ is str and text.startswith('["'):
                first = text[2 : text.find('"', 2)]
                # isdecimal, not isdigit: int() refuses digits such as '²' (and more
                # than 4,300 of them): the general path reports those
                if len(first) > 20 or not first.isdecimal():
                    return None
                seq: tuple[int, ...] = (int(first), lsn)
            elif text is None or (text.__class__ is str and text.startswith("[null,")):
                seq = (0, lsn)
            else:
                return None
        elif connector == "mysql" or connector == "mariadb":
            binlog = sget("file")
            fileno = self.sequence.known_binlog_number(binlog)
            pos = sget("pos")
            row = sget("row")
            if fileno is None or pos.__class__ is not int or row.__class__ is not int:
                return None
            seq = (fileno, pos, row)
        else:
            return None

        # One Debezium topic per table: compare with the last table before hashing.
        db, schema, name = sget("db"), sget("schema"), sget("table")
        last = self._last_source
        if not name:
            return None
        table = self._last_table  # None until a first table is found
        if table is None or not (name == last[2] and schema == last[1] and db == last[0]):
            try:
                table = self._tables.get((db, schema, name))
            except TypeError:  # an object or array where a name belongs
                return None
            if table is None:
                return None
            self._last_source, self._last_table = (db, schema, name), table
        tid = sget("txId")
        new_txn = False
        if tid is None:
            txn = None
        elif tid == self._last_txid and tid.__class__ is self._last_txid.__class__:
            txn = self._last_txn
        elif tid.__class__ is int or tid.__class__ is str:  # as _txn: Txn(str(tid))
            txn = Txn(str(tid))
            new_txn = True
        else:
            return None

        raw_key = record.key
        if raw_key:
            try:
                key_obj = _loads(raw_key)
            except _JSONDecodeError:
                return None
            if key_obj.__class__ is not dict or not key_obj or "payload" in key_obj:
                return None
            names: Any = key_obj
        else:
            names = self._pk_cache.get(table)
            if names is None:
                return None
        try:
            if len(names) == 1:  # no comprehension frame for the common one-column key
                (col,) = names
                key = {col: image[col]}
            else:
                key = {c: image[c] for c in names}
        except KeyError:
            return None

        if new_txn:
            self._last_txid, self._last_txn = tid, txn
        return op, table, key, before, after, columns, seq, ts_ms, txn

    def _flat_types(self, image: dict[str, Any]) -> dict[str, str] | None:
        """Inferred column types of an image of plain scalars, or ``None`` when the
        image needs the general path (nested value, placeholder, number near or beyond
        64 bits)."""
        columns = {}
        placeholders = self.unavailable_values
        for k, v in image.items():
            c = v.__class__
            if c is str:
                if v in placeholders:
                    return None
                columns[k] = "string"
            elif c is int:
                if v > I64_MAX:  # orjson reads a smaller integer than -2**63 as a float
                    return None
                columns[k] = "int64"
            elif c is float:
                if v >= 9.2e18 or v <= -9.2e18:
                    return None
                columns[k] = "float64"
            elif c is bool:
                columns[k] = "boolean"
            elif v is not None:
                return None
        return columns

    def _flat_values(self, image: dict[str, Any]) -> bool:
        """Whether :meth:`_flat_types` of ``image`` is not ``None`` (the before image of
        an update: its types are not declared, only checked)."""
        placeholders = self.unavailable_values
        for v in image.values():
            c = v.__class__
            if c is str:
                if v in placeholders:
                    return False
            elif c is int:
                if v > I64_MAX:
                    return False
            elif c is float:
                if v >= 9.2e18 or v <= -9.2e18:
                    return False
            elif c is not bool and v is not None:
                return False
        return True

    def _decode(self, obj: Any, record: Record, exact: bool) -> list[ChangeEvent]:
        if obj.__class__ is not dict:
            raise DecodeError(
                f"value is a JSON {json_kind(obj)}, not a Debezium event object", Code.NOT_AN_OBJECT
            )
        schema = None
        wrapped = self._schema_include
        if wrapped is None:
            wrapped = "payload" in obj and "schema" in obj
        if wrapped:
            if "payload" not in obj:
                raise DecodeError(
                    'schema_include is true but the value has no "payload" field; set '
                    "schema_include to false (or null to detect) for schemaless messages",
                    Code.MISSING_FIELD,
                )
            payload = obj["payload"]
            schema = obj.get("schema")
            if payload is None:
                raise SkipRecord(SkipReason.TOMBSTONE)
            if payload.__class__ is not dict:
                raise DecodeError(
                    f'"payload" is a JSON {json_kind(payload)}, not an event object',
                    Code.NOT_AN_OBJECT,
                )
            if schema is not None and schema.__class__ is not dict:
                raise field_error("schema", schema, "an object")
        else:
            payload = obj
        op = payload.get("op")
        if op.__class__ is str:
            row_op = ROW_OPS.get(op)
            if row_op is not None:
                return [self._row_event(row_op, payload, schema, record, exact)]
            if op == OP_TRUNCATE:
                if schema is not None:
                    envelope_row(schema)  # a table's truncate carries its Envelope schema
                return [self._truncate(payload, record, exact)]
            if op == OP_MESSAGE:
                return [self._message(payload, record, exact)]
            raise DecodeError(
                f"unknown Debezium op {op!r}; known: c (create), u (update), d (delete), "
                "r (snapshot read), t (truncate), m (message)",
                Code.UNKNOWN_OP,
            )
        if op is not None:
            raise field_error("op", op, "a string")
        return [self._non_change(payload, record, exact)]

    # ------------------------------------------------------------------ row events

    def _row_event(
        self,
        op: Op,
        payload: dict[str, Any],
        schema: dict[str, Any] | None,
        record: Record,
        exact: bool,
    ) -> ChangeEvent:
        # The hot path: keep calls and attribute lookups few (see the throughput note
        # in docs/formats/debezium-json.md).
        source = require(payload, "source", dict)
        before = payload.get("before")
        after = payload.get("after")
        if before is not None and before.__class__ is not dict:
            raise self._image_error("before", before)
        if after is None:
            if op is not _DELETE:
                raise DecodeError(f"a {op.value} event needs an 'after' image", Code.MISSING_FIELD)
        elif after.__class__ is not dict:
            raise self._image_error("after", after)

        columns: dict[str, str] | None = None
        partial = None
        struct = None if schema is None else self._compile(envelope_row(schema))
        if struct is None:
            if after is not None:
                width = len(after)
                after, columns = self._infer(after, exact)
                if len(after) < width:
                    # a column left out for its unavailable-value placeholder (an
                    # unchanged TOASTed value): without a schema nothing declares it, so
                    # the event says it is partial, and the stored value is kept
                    partial = True
                if before is not None:
                    before = self._infer(before, exact)[0]
            elif before is not None:
                before, columns = self._infer(before, exact)
        else:
            columns = dict(struct.columns)
            if after is not None:
                after = self._typed(struct, after, columns, exact, "after")
            if before is not None:
                before = self._typed(struct, before, columns, exact, "before")

        ts_ms = source.get("ts_ms")
        if not ts_ms:  # missing, null or 0: the connector's processing time
            ts_ms = payload.get("ts_ms")
        if ts_ms is not None and (ts_ms.__class__ is not int or not I64_MIN <= ts_ms <= I64_MAX):
            ts_ms = int64_field(ts_ms, "ts_ms", exact)

        seq = self.sequence(source, ts_ms, exact)
        table = self.source_table(source, required=True)

        block = payload.get("transaction")
        if block is None:
            tid = source.get("txId")
            if tid is None:
                txn = None
            elif tid == self._last_txid and tid.__class__ is self._last_txid.__class__:
                txn = self._last_txn
            else:
                txn = self._txn(payload, source, exact)
        else:
            txn = self._txn(payload, source, exact)

        event = _new_row_change(op, table, before, after, columns, seq, ts_ms, txn, record.origin)
        if partial:
            event.partial = True
        if block is not None:
            order = block.get("data_collection_order")
            if order is not None:
                event.meta = {
                    "data_collection_order": int64_field(
                        order, "transaction.data_collection_order", exact
                    )
                }
        if record.key:
            self._key(event, record, exact)
        else:
            self._key_from_options(event)
        if record.headers:
            self._pk_change_headers(event, record)
        return event

    @staticmethod
    def _image_error(name: str, image: Any) -> DecodeError:
        if image.__class__ is str:
            return DecodeError(
                f"'{name}' is a JSON string (the MongoDB connector's document form), not a "
                "row object; MongoDB change events are not supported by debezium-json",
                Code.BAD_FIELD,
            )
        return field_error(name, image, "an object (the row image) or null")

    def _unavailable(self, value: Any) -> bool:
        """Whether ``value`` is the unavailable-value placeholder (as text, as the
        base64 or hex form of its bytes, or as a one-element array of it)."""
        c = value.__class__
        if c is str:
            return value in self.unavailable_values
        if c is list and len(value) == 1 and value[0].__class__ is str:
            return value[0] in self.unavailable_values
        return False

    def _infer(self, image: dict[str, Any], exact: bool) -> tuple[dict[str, Any], dict[str, str]]:
        """Schemaless image: logical types from the JSON values (as ``types.infer_type``);
        nested objects/arrays become their JSON text (logical type ``json``); columns
        holding the unavailable-value placeholder are left out."""
        columns: dict[str, str] = {}
        rewrite = False
        placeholders = self.unavailable_values
        for k, v in image.items():
            c = v.__class__
            if c is str:
                columns[k] = "string"
                if v in placeholders:
                    rewrite = True
            elif c is int:
                if I64_MIN <= v <= I64_MAX:
                    columns[k] = "int64"
                else:
                    rewrite = True  # beyond int64: an exact decimal
            elif c is float:
                if not exact and (v >= 9.2e18 or v <= -9.2e18):
                    raise NeedExact  # maybe an integer beyond 64 bits
                columns[k] = "float64"
            elif c is bool:
                columns[k] = "boolean"
            elif c is not _NONE_TYPE:
                rewrite = True
        if not rewrite:
            return image, columns
        out: dict[str, Any] = {}
        as_decimal = self._always_exact
        for k, v in image.items():
            if self._unavailable(v):
                columns.pop(k, None)
                continue
            if isinstance(v, dict | list):
                v = json_text(v, exact, as_decimal)
                columns[k] = "json"
            elif v.__class__ is int and not I64_MIN <= v <= I64_MAX:
                v = decimal.Decimal(v)
                columns[k] = T.decimal_type(len(v.as_tuple().digits), 0)
            elif isinstance(v, decimal.Decimal):
                if as_decimal and v.is_finite():
                    columns[k] = T.infer_type(v) or "float64"
                else:
                    v = float(v)
                    columns[k] = "float64"
            out[k] = v
        return out, columns

    def _compile(self, struct_schema: dict[str, Any]) -> Struct:
        try:
            cache_key = orjson.dumps(struct_schema, default=str)  # str: Decimal defaults
        except TypeError:  # an integer beyond 64 bits somewhere in the schema
            cache_key = plain_json(struct_schema).encode()
        found = self._structs.get(cache_key)
        if found is None:
            if struct_schema.get("type") != "struct":
                raise DecodeError("the row image schema is not a struct", Code.BAD_FIELD)
            found = Struct(struct_schema.get("fields"), self.options)
            if len(self._structs) >= 256:
                self._structs.clear()
            self._structs[cache_key] = found
        return found

    def _typed(
        self,
        struct: Struct,
        image: dict[str, Any],
        columns: dict[str, str],
        exact: bool,
        which: str,
    ) -> dict[str, Any]:
        """The ``which`` (before/after) image typed by the row schema ``struct``.

        Raises:
            DecodeError: ``UNDECLARED_COLUMN`` for a column the schema does not declare
                (unless ``undeclared_columns: keep``), ``BAD_VALUE`` for a value that does
                not fit its declared type.
        """
        convs = struct.convs
        out: dict[str, Any] = {}
        for k, v in image.items():
            conv = convs.get(k)
            if conv is None:  # a column the schema does not declare
                if not self._keep_undeclared:
                    raise undeclared_error(k, which, struct)
                if v is None:
                    out[k] = None
                elif not self._unavailable(v):
                    one, cols = self._infer({k: v}, exact)
                    out[k] = one[k]
                    columns.setdefault(k, cols.get(k, "string"))
            elif v is None:
                out[k] = None
            elif not self._unavailable(v):
                out[k] = conv[1](v, k, exact)
        return out

    # ------------------------------------------------------------------ metadata

    def source_table(self, source: dict[str, Any], required: bool = False) -> SourceTable:
        """The source table of ``source`` (``db``/``schema``/``table``, MongoDB
        ``collection``). ``required``: a row change or truncate must name its table."""
        if required and not source.get("table") and not source.get("collection"):
            raise DecodeError(
                "source.table is missing: a row change must name its table (db/schema/table "
                "in the source block)",
                Code.MISSING_FIELD,
            )
        db = source.get("db")
        schema = source.get("schema")
        table = source.get("table")
        if table is None:
            table = source.get("collection")
        key = (db, schema, table)
        try:
            return self._tables[key]
        except KeyError:
            pass
        except TypeError:
            raise DecodeError("source db/schema/table must be strings", Code.BAD_FIELD) from None
        for name, v in (("db", db), ("schema", schema), ("table", table)):
            if v is not None and v.__class__ is not str:
                raise field_error(f"source.{name}", v, "a string")
        found = SourceTable(IDENTIFIER, db or "", schema or "", table or "")
        if len(self._tables) >= 4096:
            self._tables.clear()
        self._tables[key] = found
        return found

    @staticmethod
    def _ts_ms(source: dict[str, Any] | None, payload: dict[str, Any], exact: bool) -> int | None:
        """Source commit time ``source.ts_ms``; when missing, null or 0 (snapshot rows of
        some connectors), the connector's processing time ``payload.ts_ms``."""
        ts = source.get("ts_ms") if source is not None else None
        if not ts:
            ts = payload.get("ts_ms")
            if ts is None:
                return None
        if ts.__class__ is int and I64_MIN <= ts <= I64_MAX:
            return ts
        return int64_field(ts, "ts_ms", exact)

    def _txn(
        self, payload: dict[str, Any], source: dict[str, Any] | None, exact: bool
    ) -> Txn | None:
        """The ``transaction`` block, else the source's ``txId`` (PostgreSQL, Oracle)."""
        block = payload.get("transaction")
        if block is not None:
            if block.__class__ is not dict:
                raise field_error("transaction", block, "an object or null")
            tid = block.get("id")
            if tid is None:
                raise field_error("transaction.id", tid, "a string")
            order = block.get("total_order")
            return Txn(
                str(tid),
                order=None
                if order is None
                else int64_field(order, "transaction.total_order", exact),
            )
        tid = source.get("txId") if source is not None else None
        if tid is None:
            return None
        if tid == self._last_txid and tid.__class__ is self._last_txid.__class__:
            return self._last_txn
        txn = Txn(str(tid))
        self._last_txid, self._last_txn = tid, txn
        return txn

    # ------------------------------------------------------------------ keys

    def _key(self, event: ChangeEvent, record: Record, exact: bool) -> None:
        """Key columns from the Kafka key (a Debezium key message: its payload field
        names), else from ``options.primary_keys``, else MISSING_KEY."""
        payload = key_schema = None
        raw = record.key
        assert raw is not None
        try:
            obj = loads_exact(raw, True) if exact else _loads(raw)
        except (_JSONDecodeError, DecodeError):
            obj = None  # not a Debezium key: fall back to the options
        if obj.__class__ is dict:
            payload = obj
            if "payload" in obj and "schema" in obj:
                payload = obj["payload"]
                ks = obj["schema"]
                if ks.__class__ is dict and ks.get("fields"):
                    key_schema = ks
        self._key_from(event, payload, key_schema, exact)

    def _key_from(
        self, event: ChangeEvent, payload: Any, key_schema: dict[str, Any] | None, exact: bool
    ) -> None:
        """Key columns from a decoded key message (``payload``: column -> value, typed by
        the Connect struct schema ``key_schema`` when there is one), else from
        ``options.primary_keys``."""
        if payload.__class__ is not dict or not payload:
            self._key_from_options(event)
            return
        assert payload is not None
        image = event.after if event.after is not None else event.before
        if image is not None:
            try:
                event.key = {col: image[col] for col in payload}
                return
            except KeyError:
                pass
        event.key = {
            col: image[col]
            if image is not None and col in image
            else self._key_value(col, kv, key_schema, exact)
            for col, kv in payload.items()
        }

    def configured_key(self, table: SourceTable) -> tuple[str, ...] | None:
        """The key columns ``options.primary_keys`` gives ``table`` (cached per table)."""
        try:
            return self._pk_cache[table]
        except KeyError:
            cols = key_columns_for(self.options.primary_keys, table)
            if len(self._pk_cache) >= 4096:
                self._pk_cache.clear()
            self._pk_cache[table] = cols
            return cols

    def _key_from_options(self, event: ChangeEvent) -> None:
        """Key columns from ``options.primary_keys`` (cached per table)."""
        table = event.source
        cols = self.configured_key(table)
        if cols is None:
            self.require_key(event, None)  # raises MISSING_KEY with the fix
            return
        image = event.after if event.after is not None else event.before
        if image is None:
            raise DecodeError(
                f"{event.op.value} on {table.qualified_name!r} has no row image and the "
                "record has no key",
                Code.MISSING_KEY,
            )
        try:
            event.key = {c: image[c] for c in cols}
        except KeyError as exc:
            raise DecodeError(
                f"key column {exc.args[0]!r} is missing from the row image of "
                f"{table.qualified_name!r}; key columns are {list(cols)}",
                Code.MISSING_KEY,
            ) from exc

    def _key_value(
        self, col: str, value: Any, key_schema: dict[str, Any] | None, exact: bool
    ) -> Any:
        """A key column missing from the row image (delete without before image): the
        value from the key message, typed by the key schema when it has one."""
        if value is None:
            return None
        if key_schema is not None:
            try:
                struct = self._compile(key_schema)
            except DecodeError:
                struct = None
            if struct is not None and col in struct.convs:
                return struct.convs[col][1](value, col, exact)
        one, _ = self._infer({col: value}, exact)
        return one[col]

    @staticmethod
    def _pk_change_headers(event: ChangeEvent, record: Record) -> None:
        for header, name in ((HEADER_OLDKEY, "oldkey"), (HEADER_NEWKEY, "newkey")):
            raw = record.header(header)
            if raw is None:
                continue
            try:
                value: Any = _loads(raw)
                if value.__class__ is dict and "payload" in value and "schema" in value:
                    value = value["payload"]
            except _JSONDecodeError:
                value = raw.decode("utf-8", "replace")
            event.meta = {**(event.meta or {}), name: value}

    # ------------------------------------------------------------------ other ops

    def _source_of(self, payload: dict[str, Any]) -> dict[str, Any]:
        source = require(payload, "source", dict)
        return source

    def _truncate(self, payload: dict[str, Any], record: Record, exact: bool) -> ChangeEvent:
        source = self._source_of(payload)
        ts_ms = self._ts_ms(source, payload, exact)
        return ChangeEvent(
            op=Op.TRUNCATE,
            source=self.source_table(source, required=True),
            seq=self.sequence(source, ts_ms, exact),
            ts_ms=ts_ms,
            txn=self._txn(payload, source, exact),
            origin=record.origin,
        )

    def _message(self, payload: dict[str, Any], record: Record, exact: bool) -> ChangeEvent:
        source = self._source_of(payload)
        message = require(payload, "message", dict, 'an object {"prefix", "content"}')
        prefix, content = message.get("prefix"), message.get("content")
        if prefix is not None and prefix.__class__ is not str:
            raise field_error("message.prefix", prefix, "a string")
        if content is not None and content.__class__ is not str:
            raise field_error("message.content", content, "encoded bytes as a string")
        ts_ms = self._ts_ms(source, payload, exact)
        return ChangeEvent(
            op=Op.MESSAGE,
            source=self.source_table(source),
            seq=self.sequence(source, ts_ms, exact),
            ts_ms=ts_ms,
            txn=self._txn(payload, source, exact),
            origin=record.origin,
            # content as published: bytes encoded per binary.handling.mode (base64 default)
            meta={"prefix": prefix, "content": content},
        )

    def _non_change(self, payload: dict[str, Any], record: Record, exact: bool) -> ChangeEvent:
        """A payload without ``op``: transaction metadata, schema change or heartbeat."""
        status = payload.get("status")
        if status is not None:
            return self._txn_marker(status, payload, record, exact)
        if "ddl" in payload or "tableChanges" in payload:
            return self._schema_change(payload, record, exact)
        if len(payload) == 1 and "ts_ms" in payload:
            return ChangeEvent(
                op=Op.HEARTBEAT,
                source=SourceTable(IDENTIFIER),
                ts_ms=self._ts_ms(None, payload, exact),
                origin=record.origin,
            )
        raise DecodeError(
            "no 'op' field: not a Debezium change event (nor transaction metadata, a "
            "schema change or a heartbeat); check the topic and the format",
            Code.MISSING_FIELD,
        )

    def _txn_marker(
        self, status: Any, payload: dict[str, Any], record: Record, exact: bool
    ) -> ChangeEvent:
        if status == STATUS_BEGIN:
            op = Op.BEGIN
        elif status == STATUS_END:
            op = Op.COMMIT
        else:
            raise DecodeError(
                f"unknown transaction status {status!r}; known: BEGIN, END", Code.UNKNOWN_OP
            )
        tid = payload.get("id")
        if tid is None or tid.__class__ is not str:
            raise field_error("id", tid, "the transaction id string")
        meta: dict[str, Any] = {}
        count = payload.get("event_count")
        if count is not None:
            meta["event_count"] = int64_field(count, "event_count", exact)
        collections = payload.get("data_collections")
        if collections is not None:
            if collections.__class__ is not list:
                raise field_error("data_collections", collections, "an array")
            meta["data_collections"] = [
                {
                    "data_collection": as_floats(c.get("data_collection")),
                    "event_count": int64_field(
                        c.get("event_count"), "data_collections.event_count", exact
                    ),
                }
                if c.__class__ is dict
                else as_floats(c)
                for c in collections
            ]
        return ChangeEvent(
            op=op,
            source=SourceTable(IDENTIFIER),
            ts_ms=self._ts_ms(None, payload, exact),
            txn=Txn(tid),
            origin=record.origin,
            meta=meta or None,
        )

    def _schema_change(self, payload: dict[str, Any], record: Record, exact: bool) -> ChangeEvent:
        source = payload.get("source")
        if source is not None and source.__class__ is not dict:
            raise field_error("source", source, "an object")
        src = source or {}
        ddl = payload.get("ddl")
        if ddl is not None and ddl.__class__ is not str:
            raise field_error("ddl", ddl, "a string")
        db = payload.get("databaseName") or src.get("db")
        schema = payload.get("schemaName") or src.get("schema")
        table = self.source_table({"db": db, "schema": schema, "table": src.get("table")})
        ts_ms = self._ts_ms(source, payload, exact)
        changes = payload.get("tableChanges")
        if changes is not None and exact:
            changes = as_floats(changes)  # JSON-able again
        return ChangeEvent(
            op=Op.DDL,
            source=table,
            seq=self.sequence(source, ts_ms, exact) if source else None,
            ts_ms=ts_ms,
            txn=self._txn(payload, source, exact),
            ddl=ddl,
            origin=record.origin,
            meta={"table_changes": changes} if changes is not None else None,
        )

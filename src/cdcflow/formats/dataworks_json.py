"""Alibaba Cloud DataWorks "sync to Kafka" JSON (``dataworks-json``).

Source document: *Formats of messages written to Kafka* (DataWorks data integration,
``https://www.alibabacloud.com/help/en/doc-detail/252741.htm``); Apache Paimon reads the same
messages as ``aliyun-json``. A message is ``{"schema": {...}, "payload": {...},
"version"}``:

* ``schema.dataColumn`` -- ``[{"name", "type"}]`` with ``type`` one of BOOLEAN, DOUBLE,
  DATE, BYTES, LONG, STRING; ``schema.primaryKey`` -- key column names or ``null``;
  ``schema.source`` -- ``{dbType, dbVersion, dbName, schemaName, tableName}``.
* ``payload.before`` / ``payload.after`` -- ``{"dataColumn": {column: value}}`` or null;
  ``payload.sequenceId`` (string), ``payload.scn`` (Oracle), ``payload.op``,
  ``payload.timestamp.eventTime`` (epoch ms), ``payload.ddl.text``.

Decoding rules (see ``docs/formats/dataworks-json.md`` for the full table):

* ``seq`` is ``(int(sequenceId), half)`` where ``half`` is 0 for ``UPDATE_BEFOR`` and 1
  for every other op, so a before half sorts just before its after half; for Oracle
  sources the SCN is appended as a third element (information only: ``sequenceId`` is
  unique per record, so the SCN never decides the order). A record without a
  ``sequenceId`` gets ``seq=None``: no order is invented from ``eventTime``, whose scale
  and resolution differ (seconds, shared by many rows) -- the consumer falls back to
  the Kafka offset order, which is the order DataWorks wrote.
* ``ts_ms`` is ``timestamp.eventTime``; the ``-1`` DataWorks writes for rows of the full
  (initial) load is not a time and becomes ``None`` (as does any negative value).
* The two update records (``UPDATE_BEFOR`` + ``UPDATE_AFTER``, same ``sequenceId``) are
  joined by :meth:`DataWorksJsonDecoder.combine` into one update. A half whose partner
  is not in the same batch stays a half: ``Op.UPDATE`` with only ``before`` (or only
  ``after``) and ``meta["half"] = "before"`` (or ``"after"``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar

import orjson

from cdcflow.errors import Code, DecodeError
from cdcflow.formats.base import (
    Decoder,
    DecoderOptions,
    Record,
)
from cdcflow.formats.common.json_object import load_object
from cdcflow.formats.common.values import bad_value
from cdcflow.model import ChangeEvent, Op, SourceTable
from cdcflow.types import (
    INT64_MAX,
    INT64_MIN,
    field_range_error,
    int_range_error,
    to_bool,
    to_bytes_base64,
    to_float,
    to_int,
)

__all__ = ["DataWorksJsonDecoder", "DataWorksJsonOptions"]

IDENTIFIER = "dataworks-json"

# --------------------------------------------------------------------------- op codes
# Case-sensitive, exactly as DataWorks writes them.

OP_INSERT = "INSERT"  # row inserted (also every row of the full load, sequenceId "-1")
OP_UPDATE_BEFORE = "UPDATE_BEFOR"  # [sic] before half of an update (DataWorks' spelling)
OP_UPDATE_AFTER = "UPDATE_AFTER"  # after half of an update; both images in one-record mode
OP_DELETE = "DELETE"  # row deleted
OP_TRANSACTION_BEGIN = "TRANSACTION_BEGIN"  # transaction starts
OP_TRANSACTION_END = "TRANSACTION_END"  # transaction ends
OP_CREATE = "CREATE"  # DDL: table created
OP_ALTER = "ALTER"  # DDL: table altered
OP_ERASE = "ERASE"  # DDL: table dropped (binlog parsers' name for DROP TABLE)
OP_QUERY = "QUERY"  # a SQL statement replicated as text (treated as DDL)
OP_TRUNCATE = "TRUNCATE"  # all rows of a table removed
OP_RENAME = "RENAME"  # DDL: table renamed
OP_CREATE_INDEX = "CINDEX"  # DDL: index created
OP_DROP_INDEX = "DINDEX"  # DDL: index dropped
OP_GTID = "GTID"  # MySQL global transaction id marker (not a row change)
OP_XA_COMMIT = "XACOMMIT"  # XA (two-phase) transaction committed
OP_XA_ROLLBACK = "XAROLLBACK"  # XA (two-phase) transaction rolled back
OP_HEARTBEAT = "MHEARTBEAT"  # heartbeat of the sync node, no table

# row op codes (small ints for the hot path)
_INSERT, _UPDATE_BEFORE, _UPDATE_AFTER, _DELETE = 1, 2, 3, 4
_ROW_OPS: dict[str, int] = {
    OP_INSERT: _INSERT,
    OP_UPDATE_BEFORE: _UPDATE_BEFORE,
    OP_UPDATE_AFTER: _UPDATE_AFTER,
    OP_DELETE: _DELETE,
}

#: row op -> the image the event's key (and the single image of the op) comes from
_IMAGE_FIELD = {
    _INSERT: "after",
    _UPDATE_BEFORE: "before",
    _UPDATE_AFTER: "after",
    _DELETE: "before",
}

#: every other op this format defines -> the unified op it becomes
_OTHER_OPS: dict[str, Op] = {
    OP_HEARTBEAT: Op.HEARTBEAT,
    OP_TRANSACTION_BEGIN: Op.BEGIN,
    OP_TRANSACTION_END: Op.COMMIT,
    OP_XA_COMMIT: Op.COMMIT,
    OP_XA_ROLLBACK: Op.MESSAGE,  # a marker; rows already published are not reverted
    OP_GTID: Op.MESSAGE,
    OP_TRUNCATE: Op.TRUNCATE,
    OP_CREATE: Op.DDL,
    OP_ALTER: Op.DDL,
    OP_ERASE: Op.DDL,
    OP_QUERY: Op.DDL,
    OP_RENAME: Op.DDL,
    OP_CREATE_INDEX: Op.DDL,
    OP_DROP_INDEX: Op.DDL,
}

#: the column DataWorks adds to rows of MySQL tables without a primary key
ROW_ID_COLUMN = "#alibaba_rds_row_id#"

# --------------------------------------------------------------------------- types
# DataWorks type -> (logical type, kind code used on the hot path)

_K_STRING, _K_LONG, _K_DOUBLE, _K_BOOLEAN, _K_DATE, _K_BYTES = range(6)
_TYPES: dict[str, tuple[str, int]] = {
    "STRING": ("string", _K_STRING),
    "LONG": ("int64", _K_LONG),
    "DOUBLE": ("float64", _K_DOUBLE),
    "BOOLEAN": ("boolean", _K_BOOLEAN),
    "DATE": ("timestamptz", _K_DATE),  # epoch milliseconds (13 digits)
    "BYTES": ("binary", _K_BYTES),  # base64 text
}

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)
_MAX_EXACT_FLOAT_INT = 2**53  # orjson turns integers beyond 64 bits into floats

_name_type = itemgetter("name", "type")
_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError


def _to_long(value: Any, column: str) -> int:
    if value.__class__ is float and not abs(value) < _MAX_EXACT_FLOAT_INT:
        # orjson reads integers beyond 64 bits as floats: the digits are already lost
        raise bad_value(column, value, "LONG (beyond 64 bits, precision lost)")
    result = to_int(value, column)
    assert result is not None
    return result


def _check_longs(image: dict[str, Any], longs: tuple[str, ...]) -> None:
    """``BAD_VALUE`` for a ``LONG`` value outside int64 (orjson reads integers up to
    2**64 - 1 exactly; integer text has any size)."""
    for name in longs:
        value = image.get(name)
        if value is not None and not INT64_MIN <= value <= INT64_MAX:
            raise int_range_error(name, value, "int64")


def _event_time_error(ms: int) -> DecodeError:
    return field_range_error(
        "payload.timestamp.eventTime",
        ms,
        0,
        INT64_MAX,
        "epoch milliseconds, a negative one (-1 on full-load rows) meaning no time; ts_ms "
        "is a 64-bit integer",
    )


def _to_date(value: Any, column: str) -> dt.datetime:
    ms = value if value.__class__ is int else _to_long(value, column)
    try:
        return _EPOCH + ms * _MS
    except OverflowError:
        raise bad_value(column, value, "DATE (epoch milliseconds)") from None


def _convert(kind: int, value: Any, column: str) -> Any:
    """Slow path of value conversion: anything that is not already the right JSON type."""
    if kind == _K_STRING:
        raise bad_value(column, value, "STRING (a JSON string)")
    if kind == _K_LONG:
        return _to_long(value, column)
    if kind == _K_DOUBLE:
        if value.__class__ is bool:
            raise bad_value(column, value, "DOUBLE")
        return to_float(value, column)
    if kind == _K_BOOLEAN:
        return to_bool(value, column)
    if kind == _K_DATE:
        return _to_date(value, column)
    return to_bytes_base64(value, column)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class DataWorksJsonOptions(DecoderOptions):
    """Options of the ``dataworks-json`` decoder.

    Attributes:
        primary_keys: key columns for tables whose messages name none (``primaryKey``
            null) and whose rows carry no row-id column (see :class:`DecoderOptions`).
        row_id_column: the row identity column DataWorks adds to MySQL tables without a
            primary key; used as the key when ``primaryKey`` is null and the row has it.
            Default ``"#alibaba_rds_row_id#"``.
        pair_updates: join ``UPDATE_BEFOR`` and ``UPDATE_AFTER`` records with the same
            ``sequenceId`` (in one batch) into one update. Default ``True``; with
            ``False`` every half stays a half (``meta["half"]``).
    """

    row_id_column: str = ROW_ID_COLUMN
    pair_updates: bool = True


# --------------------------------------------------------------------------- decoder


class _Schema:
    """What one ``schema`` object means (cached by content; never mutated once built)."""

    __slots__ = ("columns", "kinds", "expect", "dates", "longs", "pk", "pk1")

    def __init__(self, columns: dict[str, str], kinds: dict[str, int], pk: tuple[str, ...]) -> None:
        self.columns = columns  # name -> logical type (copied into each event)
        self.kinds = kinds  # name -> kind code
        # name -> the JSON value class that needs no conversion (None: always convert)
        self.expect: dict[str, type | None] = {n: _NATIVE[k] for n, k in kinds.items()}
        self.dates = tuple(n for n, k in kinds.items() if k == _K_DATE)  # epoch-ms columns
        self.longs = tuple(n for n, k in kinds.items() if k == _K_LONG)  # int64 range checked
        self.pk = pk  # declared key columns, () when primaryKey is null or empty
        self.pk1 = pk[0] if len(pk) == 1 else None


class _PrefixSchema(_Schema):
    """A row schema met as the byte prefix of a message (:meth:`DataWorksJsonDecoder.
    _split`), with the table it names: what the fast path of ``decode`` uses."""

    __slots__ = ("source",)

    def __init__(self, schema: _Schema, source: SourceTable) -> None:
        super().__init__(schema.columns, schema.kinds, schema.pk)
        self.source = source


#: a row op's parts that ``_decode_full`` gives: (parsed schema, source table, payload,
#: row-op kind, op text)
_RowParts = tuple[_Schema, SourceTable, dict[str, Any], int, str]


#: kind -> the class a JSON value of that kind already has (no conversion needed)
_NATIVE: dict[int, type | None] = {
    _K_STRING: str,
    _K_LONG: int,
    _K_DOUBLE: float,
    _K_BOOLEAN: bool,
    _K_DATE: int,  # passes the check; converted by _dates() after it
    _K_BYTES: None,
}

_SCHEMA_OPEN = b'{"schema":'
_PAYLOAD_KEY = b',"payload":'
_INSERT_OP, _UPDATE_OP, _DELETE_OP = Op.INSERT, Op.UPDATE, Op.DELETE


class DataWorksJsonDecoder(Decoder[DataWorksJsonOptions]):
    """Decodes DataWorks Kafka JSON messages (one message -> one event).

    Pure apart from caches keyed by message content (parsed ``schema`` objects, source
    tables, and the exact bytes of the ``{"schema":...,"payload":`` prefix), which only
    save time. Picklable (the caches are not pickled).

    Fast path: DataWorks writes compact JSON in the order ``schema``, ``payload``,
    ``version``, and the ``schema`` bytes repeat for every row of a table. A message
    that starts with a prefix already seen (whose schema part parsed on its own as a
    valid object) only has its ``payload`` and ``version`` parsed; since the three parts
    are each valid JSON, the message is exactly the object the full parse would give.
    Anything else (other key order, whitespace, non-row ops, errors) takes the full
    path, which gives the same events and the same error codes.
    """

    identifier: ClassVar[str] = IDENTIFIER
    options_class = DataWorksJsonOptions
    options: DataWorksJsonOptions

    _CACHE_MAX = 4096

    def __init__(self, options: DataWorksJsonOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._schemas: dict[Any, _Schema] = {}
        self._tables: dict[Any, SourceTable] = {}
        self._prefixes: dict[bytes, _PrefixSchema | None] = {}
        self._last: tuple[bytes, int, _PrefixSchema] | None = None  # most recent prefix hit
        # the ',"version":V}' ending of recent messages (V valid JSON); never matches at first
        self._suffix = b"\x00never"
        self._row_id = self.options.row_id_column

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]  # unpickling re-runs __init__; mypy refuses __init__ on an instance

    # ---------------------------------------------------------------- decode

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one DataWorks message.

        Returns:
            One event: a row change (insert, update, delete, or an update half), or a
            heartbeat / begin / commit / truncate / ddl / message marker.

        Raises:
            DecodeError: ``BAD_JSON`` (not JSON), ``NOT_AN_OBJECT`` (not an object),
                ``MISSING_FIELD`` / ``BAD_FIELD`` (envelope fields absent or of the wrong
                type), ``UNKNOWN_OP``, ``BAD_VALUE`` (a value that does not fit its
                declared type), ``MISSING_KEY`` (no key columns known).
        """
        raw: bytes = record.value  # type: ignore[assignment]  # decode() never sees a tombstone (Decoder.decode)
        last = self._last
        payload: Any = None
        fast: _PrefixSchema | None
        if last is not None and raw.startswith(last[0]):
            cut, fast = last[1], last[2]
        else:
            hit = self._split(raw)
            cut, fast = hit if hit is not None else (0, None)
        kind = None
        if fast is not None:
            suffix = self._suffix
            if raw.endswith(suffix):  # ',"version":V}' seen before: parse P alone
                try:
                    payload = _loads(raw[cut + 11 : len(raw) - len(suffix)])
                except _JSONDecodeError:
                    payload = None
            else:  # '{"payload":P,...}': everything after the schema, as one object
                try:
                    rest = _loads(b"{" + raw[cut + 1 :])
                except _JSONDecodeError:
                    rest = None
                if rest.__class__ is dict and "schema" not in rest:
                    payload = rest.get("payload")
                    if len(rest) == 2 and "version" in rest:
                        self._learn_suffix(raw, rest["version"])
            if payload.__class__ is dict:
                op: Any = payload.get("op")  # JSON: a str when kind is set
                kind = _ROW_OPS.get(op) if op.__class__ is str else None
                parsed: _Schema = fast
                source = fast.source
        if kind is None:  # the full path: every op, every layout, every error
            full = self._decode_full(record)
            if isinstance(full, ChangeEvent):
                return [full]
            parsed, source, payload, kind, op = full

        # ---- one row change (inlined: this is the hot path)
        field = _IMAGE_FIELD[kind]
        try:
            image = payload[field]["dataColumn"]
        except (KeyError, TypeError):
            image = None
        if image.__class__ is not dict:
            image = _image(payload.get(field), field, parsed, op)  # raises: says what is wrong
        expect = parsed.expect
        try:
            for name, value in image.items():
                if value.__class__ is not expect[name]:
                    image[name] = _fix(parsed, name, value)
        except KeyError as exc:  # only expect[name] raises KeyError
            raise _undeclared(exc.args[0]) from None
        for name in parsed.longs:  # _check_longs, inlined (the hot path)
            value = image.get(name)
            if value is not None and not INT64_MIN <= value <= INT64_MAX:
                raise int_range_error(name, value, "int64")
        if parsed.dates:
            _dates(image, parsed.dates)
        before: dict[str, Any] | None
        after: dict[str, Any] | None
        meta: dict[str, Any] | None
        if kind == _INSERT:
            event_op, before, after, meta = _INSERT_OP, None, image, None
        elif kind == _DELETE:
            event_op, before, after, meta = _DELETE_OP, image, None, None
        elif kind == _UPDATE_AFTER:
            event_op, after = _UPDATE_OP, image
            held = payload.get("before")
            if held is None:
                before, meta = None, {"half": "after"}
            else:  # one-record update mode: both images in one UPDATE_AFTER
                before, meta = _image(held, "before", parsed, op), None
        else:
            event_op, before, after, meta = _UPDATE_OP, image, None, {"half": "before"}

        sid = payload.get("sequenceId")
        try:
            if sid.__class__ is not str:
                raise TypeError
            seq: tuple[int, ...] | None = (int(sid), 0 if kind == _UPDATE_BEFORE else 1)
        except (TypeError, ValueError):
            seq = _seq(payload, kind)  # a JSON integer, or None, or raises BAD_FIELD
        ts = payload.get("timestamp")
        if ts.__class__ is dict and (ts_ms := ts.get("eventTime")).__class__ is int:
            if ts_ms < 0:  # -1 marks rows of the full load: not a time
                ts_ms = None
            elif ts_ms > INT64_MAX:
                raise _event_time_error(ts_ms)
        else:
            ts_ms = _ts_ms(ts)
        scn = payload.get("scn")
        if scn is not None:
            scn = _scn(scn)
            meta = {**meta, "scn": scn} if meta else {"scn": scn}
            if seq is not None:
                seq = (*seq, scn)

        event = ChangeEvent(
            event_op,
            source,
            None,
            before,
            after,
            parsed.columns.copy(),
            seq,
            ts_ms,
            None,
            None,
            None,
            record.origin,
            meta,
        )
        col = parsed.pk1
        if col is None:
            if parsed.pk:
                return [self._keyed(event, parsed.pk, image)]
            col = self._row_id
            if col not in image:
                return [self.require_key(event, None)]
        try:
            event.key = {col: image[col]}
        except KeyError as exc:
            raise _missing_key(col, source) from exc
        return [event]

    def _keyed(self, event: ChangeEvent, pk: tuple[str, ...], image: dict[str, Any]) -> ChangeEvent:
        """``event`` with its key from the declared key columns ``pk``."""
        try:
            event.key = {c: image[c] for c in pk}
        except KeyError as exc:
            raise _missing_key(exc.args[0], event.source) from exc
        return event

    def _split(self, raw: bytes) -> tuple[int, _PrefixSchema] | None:
        """Find (and remember) the ``{"schema":S,"payload":`` prefix of ``raw``.

        Returns:
            ``(offset of the comma before "payload", parsed schema with its source)``, or
            ``None`` when ``raw`` does not start that way or ``S`` is no row schema.
        """
        if not raw.startswith(_SCHEMA_OPEN):
            return None
        cut = raw.find(_PAYLOAD_KEY, 10)
        if cut < 0:
            return None
        prefix = raw[: cut + 11]
        try:
            parsed = self._prefixes[prefix]
        except KeyError:
            parsed = None
            try:
                schema = _loads(raw[10:cut])
                if schema.__class__ is dict:
                    parsed = _PrefixSchema(
                        self._schema(schema), self._source(schema.get("source"), required=True)
                    )
            except (_JSONDecodeError, DecodeError):
                parsed = None  # e.g. a heartbeat's null schema: always the full path
            if len(self._prefixes) >= self._CACHE_MAX:
                self._prefixes.clear()
            self._prefixes[prefix] = parsed
        if parsed is None:
            return None
        self._last = (prefix, cut, parsed)
        return cut, parsed

    def _learn_suffix(self, raw: bytes, version: Any) -> None:
        """Remember ``,"version":V}`` when ``raw`` ends with exactly that (valid) text."""
        try:
            suffix = b',"version":' + _dumps(version) + b"}"
        except TypeError:
            return
        if raw.endswith(suffix):
            self._suffix = suffix

    def _decode_full(self, record: Record) -> ChangeEvent | _RowParts:
        """Parse the whole message: a finished event for a non-row op, else the parts
        ``(parsed schema, source, payload, kind, op)`` of a row op."""
        msg = load_object(record.value, "a DataWorks message")
        payload: Any = msg.get("payload")  # checked below: an object
        if payload.__class__ is not dict:
            raise self._object_error("payload", payload)
        op: Any = payload.get("op")  # JSON: a str when kind is set
        kind = _ROW_OPS.get(op) if op.__class__ is str else None
        if kind is None:
            return self._decode_other(msg, payload, op, record)
        schema = msg.get("schema")
        if schema.__class__ is not dict:
            raise self._object_error("schema", schema)
        parsed = self._schema(schema)
        source = self._source(schema.get("source"), required=True)
        return parsed, source, payload, kind, op

    # ---------------------------------------------------------------- combine

    def combine(self, events: list[ChangeEvent]) -> list[ChangeEvent]:
        """Join ``UPDATE_BEFOR`` / ``UPDATE_AFTER`` halves into one update.

        Two halves are partners when they have the same source table and the same
        ``sequenceId`` (``seq[0]``); they need not be adjacent nor in before/after
        order. Partners are matched first come, first paired. The joined event stands at
        the position of the earlier half and takes ``before`` from the before half and
        everything else (key, after, columns, seq, ts_ms, origin, meta without
        ``half``) from the after half. A half with no partner in ``events`` is returned
        unchanged (see the module doc). Nothing is joined when the option
        ``pair_updates`` is off.

        Args:
            events: the decoded events of one batch, in record order.

        Returns:
            The events with every pair joined; the order of the rest is kept.
        """
        if not self.options.pair_updates:
            return events
        out: list[ChangeEvent] = []
        waiting: dict[tuple[SourceTable, int, str], list[int]] = {}
        joined = False
        for event in events:
            meta = event.meta
            half = meta.get("half") if meta is not None and event.op is Op.UPDATE else None
            if half is None or event.seq is None:
                out.append(event)
                continue
            partner_half = "after" if half == "before" else "before"
            slots = waiting.get((event.source, event.seq[0], partner_half))
            if slots:
                i = slots.pop(0)
                partner = out[i]
                out[i] = _join(partner, event) if half == "after" else _join(event, partner)
                joined = True
            else:
                waiting.setdefault((event.source, event.seq[0], half), []).append(len(out))
                out.append(event)
        return out if joined else events

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _object_error(name: str, value: Any) -> DecodeError:
        if value is None:
            return DecodeError(
                f"field {name!r} is missing or null: this is not a DataWorks message "
                '(expected {"schema": {...}, "payload": {...}, "version": ...})',
                Code.MISSING_FIELD,
            )
        return DecodeError(
            f"field {name!r} must be a JSON object, got {type(value).__name__}",
            Code.BAD_FIELD,
        )

    def _schema(self, schema: dict[str, Any]) -> _Schema:
        """The parsed ``schema`` (column types and key), from the cache when seen before."""
        try:
            return self._schemas[_schema_key(schema)]
        except (KeyError, TypeError):  # not seen yet, or malformed: parsing says which
            pass
        columns: dict[str, str] = {}
        kinds: dict[str, int] = {}
        cols: Any = schema.get("dataColumn")  # checked below: a list
        if cols.__class__ is not list:
            if cols is None:
                raise DecodeError(
                    "schema.dataColumn is missing or null: a row change needs its column types",
                    Code.MISSING_FIELD,
                )
            raise DecodeError(
                f"schema.dataColumn must be a list, got {type(cols).__name__}", Code.BAD_FIELD
            )
        for col in cols:
            if col.__class__ is not dict:
                raise DecodeError(
                    f"schema.dataColumn entries must be objects, got {col!r}", Code.BAD_FIELD
                )
            name = col.get("name")
            typ: Any = col.get("type")  # any JSON value: one _TYPES lacks is the error below
            if name.__class__ is not str:
                raise DecodeError(
                    f"schema.dataColumn entry without a name: {col!r}", Code.BAD_FIELD
                )
            try:
                logical, kind = _TYPES[typ]
            except (KeyError, TypeError):
                raise DecodeError(
                    f"column {name!r} has type {typ!r}; DataWorks types are {sorted(_TYPES)}",
                    Code.BAD_FIELD,
                ) from None
            columns[name] = logical
            kinds[name] = kind
        pk_raw = schema.get("primaryKey")
        if pk_raw is None:
            pk: tuple[str, ...] = ()
        elif pk_raw.__class__ is list and all(c.__class__ is str for c in pk_raw):
            pk = tuple(pk_raw)
        else:
            raise DecodeError(
                f"schema.primaryKey must be a list of column names or null, got {pk_raw!r}",
                Code.BAD_FIELD,
            )
        parsed = _Schema(columns, kinds, pk)
        if len(self._schemas) >= self._CACHE_MAX:
            self._schemas.clear()
        self._schemas[_schema_key(schema)] = parsed
        return parsed

    def _source(self, src: Any, *, required: bool) -> SourceTable:
        """The table named by ``schema.source`` (``required``: a row op must name one)."""
        if src.__class__ is dict:
            key = (src.get("dbName"), src.get("schemaName"), src.get("tableName"))
            try:
                found = self._tables[key]
            except KeyError:
                found = None
            except TypeError:  # an unhashable name
                raise DecodeError(
                    f"schema.source names must be strings: {src!r}", Code.BAD_FIELD
                ) from None
            if found is None:
                db, schema, table = key
                for name, value in zip(("dbName", "schemaName", "tableName"), key, strict=True):
                    if value is not None and value.__class__ is not str:
                        raise DecodeError(
                            f"schema.source.{name} must be a string, got {value!r}",
                            Code.BAD_FIELD,
                        )
                found = SourceTable(IDENTIFIER, db or "", schema or "", table or "")
                if len(self._tables) >= self._CACHE_MAX:
                    self._tables.clear()
                self._tables[key] = found
            if required and not found.table:
                raise DecodeError(
                    "schema.source.tableName is missing: a row change must name its table",
                    Code.MISSING_FIELD,
                )
            return found
        if src is None and not required:
            return SourceTable(IDENTIFIER)
        if src is None:
            raise DecodeError(
                "schema.source is missing: a row change must name its table", Code.MISSING_FIELD
            )
        raise DecodeError(
            f"schema.source must be an object, got {type(src).__name__}", Code.BAD_FIELD
        )

    def _decode_other(
        self, msg: dict[str, Any], payload: dict[str, Any], op: Any, record: Record
    ) -> ChangeEvent:
        """Every op that is not a row change: heartbeat, transaction markers, DDL, ..."""
        if op is None:
            raise DecodeError("payload.op is missing", Code.MISSING_FIELD)
        if op.__class__ is not str:
            raise DecodeError(f"payload.op must be a string, got {op!r}", Code.BAD_FIELD)
        event_op = _OTHER_OPS.get(op)
        if event_op is None:
            raise DecodeError(
                f"unknown DataWorks op {op!r} (ops are case-sensitive); known ops: "
                f"{sorted([*_ROW_OPS, *_OTHER_OPS])}",
                Code.UNKNOWN_OP,
            )
        schema = msg.get("schema")
        if schema is not None and schema.__class__ is not dict:
            raise self._object_error("schema", schema)
        source = self._source(schema.get("source") if schema else None, required=False)
        ts_ms = _ts_ms(payload.get("timestamp"))
        seq = _seq(payload, 0)
        meta: dict[str, Any] = {"op": op}
        scn = payload.get("scn")
        if scn is not None:
            meta["scn"] = scn = _scn(scn)
            if seq is not None:
                seq = (*seq, scn)
        ddl = payload.get("ddl")
        text = None
        if ddl is not None:
            if ddl.__class__ is not dict:
                raise self._object_error("payload.ddl", ddl)
            text = ddl.get("text")
            if text is not None and text.__class__ is not str:
                raise DecodeError(
                    f"payload.ddl.text must be a string, got {text!r}", Code.BAD_FIELD
                )
        columns = None
        if event_op is Op.DDL and schema and schema.get("dataColumn") is not None:
            columns = dict(self._schema(schema).columns)
        if text is not None and event_op not in (Op.DDL, Op.TRUNCATE):
            meta["text"] = text
            text = None
        return ChangeEvent(
            event_op,
            source,
            None,
            None,
            None,
            columns,
            seq,
            ts_ms,
            None,
            text,
            None,
            record.origin,
            meta,
        )


def _schema_key(schema: dict[str, Any]) -> Any:
    """A hashable key for the parts of ``schema`` a decoded event depends on.

    Raises:
        KeyError, TypeError: ``schema`` is malformed (the caller then parses it to say how).
    """
    pk = schema.get("primaryKey")
    return (
        tuple(map(_name_type, schema["dataColumn"])),
        tuple(pk) if pk.__class__ is list else pk,
    )


def _image(holder: Any, field: str, parsed: _Schema, op: str) -> dict[str, Any]:
    """The typed row image in ``payload.<field>`` (converted in place)."""
    if holder.__class__ is dict:
        image = holder.get("dataColumn")
        if image.__class__ is not dict:
            if image is None:
                raise DecodeError(f"payload.{field}.dataColumn is missing", Code.MISSING_FIELD)
            raise DecodeError(f"payload.{field}.dataColumn must be an object", Code.BAD_FIELD)
    elif holder is None:
        raise DecodeError(
            f"{op} needs payload.{field}.dataColumn, but payload.{field} is null",
            Code.MISSING_FIELD,
        )
    else:
        raise DecodeError(f"payload.{field} must be an object", Code.BAD_FIELD)
    expect = parsed.expect
    for name, value in image.items():
        if value.__class__ is not expect.get(name):
            image[name] = _fix(parsed, name, value)
    _check_longs(image, parsed.longs)
    if parsed.dates:
        _dates(image, parsed.dates)
    return image


def _dates(image: dict[str, Any], columns: tuple[str, ...]) -> None:
    """Epoch milliseconds (JSON integers) of DATE columns -> aware UTC datetimes."""
    for name in columns:
        value = image.get(name)
        if value.__class__ is int:
            try:
                image[name] = _EPOCH + value * _MS
            except OverflowError:
                raise bad_value(name, value, "DATE (epoch milliseconds)") from None


def _fix(parsed: _Schema, name: str, value: Any) -> Any:
    """A value that is not already of its column's JSON class: convert it, or raise."""
    kind = parsed.kinds.get(name)
    if kind is None:
        raise _undeclared(name)
    if value is None:
        return None
    if kind == _K_DOUBLE:
        cls = value.__class__
        if cls is str:  # DataWorks writes decimals as text: "1.100000"
            try:
                return float(value)
            except ValueError:
                pass
        elif cls is int:
            return float(value)
    return _convert(kind, value, name)


def _undeclared(name: str) -> DecodeError:
    return DecodeError(
        f"column {name!r} is in the row image but not in schema.dataColumn, so its type "
        "is unknown; the message is malformed",
        Code.BAD_FIELD,
    )


def _missing_key(column: str, source: SourceTable) -> DecodeError:
    return DecodeError(
        f"key column {column!r} is missing from the row image of {source.qualified_name!r}",
        Code.MISSING_KEY,
    )


def _int_or_text(value: Any) -> int | None:
    """A JSON integer or integer text (``"42"``), else ``None``."""
    if value.__class__ is int:
        return value
    if value.__class__ is str:
        with contextlib.suppress(ValueError):
            return int(value)
    return None


def _seq(payload: dict[str, Any], kind: int) -> tuple[int, ...] | None:
    """``(int(sequenceId), half)`` or ``None`` without a sequenceId (see the module doc)."""
    sid = payload.get("sequenceId")
    if sid is None:
        return None
    n = _int_or_text(sid)
    if n is None:
        raise DecodeError(
            f"payload.sequenceId must be an integer in a string, got {sid!r}", Code.BAD_FIELD
        )
    return (n, 0) if kind == _UPDATE_BEFORE else (n, 1)


def _ts_ms(ts: Any) -> int | None:
    """``timestamp.eventTime`` in epoch ms; ``None`` when absent or negative (-1: full load)."""
    if ts is None:
        return None
    if ts.__class__ is not dict:
        raise DecodeError(
            f"payload.timestamp must be an object, got {type(ts).__name__}", Code.BAD_FIELD
        )
    raw = ts.get("eventTime")
    if raw is None:
        return None
    ms = _int_or_text(raw)
    if ms is None:
        raise DecodeError(
            f"payload.timestamp.eventTime must be epoch milliseconds, got {raw!r}",
            Code.BAD_FIELD,
        )
    if ms > INT64_MAX:
        raise _event_time_error(ms)
    return ms if ms >= 0 else None


def _scn(scn: Any) -> int:
    """The Oracle SCN as an int."""
    if scn.__class__ is int:
        return scn
    if scn.__class__ is str:
        try:
            return int(scn)
        except ValueError:
            pass
    raise DecodeError(f"payload.scn must be an integer in a string, got {scn!r}", Code.BAD_FIELD)


def _join(before: ChangeEvent, after: ChangeEvent) -> ChangeEvent:
    """One update from its two halves (see :meth:`DataWorksJsonDecoder.combine`)."""
    meta = {k: v for k, v in after.meta.items() if k != "half"} if after.meta else None
    return ChangeEvent(
        Op.UPDATE,
        after.source,
        after.key,
        before.before,
        after.after,
        after.columns,
        after.seq,
        after.ts_ms,
        after.txn,
        None,
        None,
        after.origin,
        meta or None,
    )

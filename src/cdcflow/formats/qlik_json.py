"""Qlik Replicate JSON messages on Kafka (identifier ``qlik-json``).

Source: Qlik Replicate help, "Data messages" of the Kafka / Amazon MSK target endpoint
(``https://help.qlik.com/en-US/replicate/November2024/Content/Replicate/Main/Amazon%20MSK/AmazonMSK_metadata_data_messages.htm``), "Metadata and data messages", "The
Replicate envelope" and the data-type table of the Kafka target ("When using the JSON
message format, binary values are represented as hexadecimal digits").

A record is the Replicate envelope ``{"magic": "atMSG", "type": "DT"|"MD", "headers",
"messageSchemaId", "messageSchema", "message": {...}}``, or its bare ``message`` when the
endpoint does not wrap messages.

* ``MD`` (metadata) message: ``schemaId``, ``lineage`` (server, task, schema, table,
  tableVersion, timestamp) and ``tableStructure.tableColumns`` (name -> ordinal, type,
  length, precision, scale, primaryKeyPosition, nullable). Decodes to one ``Op.DDL`` event
  whose ``meta`` is the normalized metadata and whose ``columns`` are the logical types.
  The decoder remembers it (in memory) to type, key and unmask later data messages.
* ``DT`` (data) message: ``data``, ``beforeData`` and ``headers`` (operation,
  changeSequence, timestamp, streamPosition, transactionId, changeMask, columnMask,
  externalSchemaId, transactionEventCounter, transactionLastEvent). One row event.

Rules (see ``docs/formats/qlik-json.md``):

* ``seq``: ``changeSequence`` (a fixed-width decimal string, 35 digits in Replicate)
  right-padded with zeros to 48 digits, paired with its length: ``(int(padded), len)``.
  Longer strings repeat that per 48-digit group. Tuple order equals string order for any
  digit strings. Full-load rows (REFRESH) carry no changeSequence: their ``seq`` is ``None``.
* masks: hex strings read as one number; bit ``i`` (least significant = 0) is the column of
  ordinal ``i + 1``. A column whose ``columnMask`` bit is clear is left out of both images
  ("not replicated", not NULL). ``changeMask`` names ``changed`` for updates (LOB columns
  never have their bit set).
* ``key``: metadata ``primaryKeyPosition`` order, else ``DecoderOptions.primary_keys``.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import orjson

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats.base import (
    Decoder,
    DecoderOptions,
    Record,
    key_columns_for,
)
from cdcflow.formats.common.json_object import load_object
from cdcflow.formats.common.mysql_values import (
    date_text,
    datetime_text,
    hex_text,
    time_text,
    unsigned_bigint_text,
)
from cdcflow.formats.common.values import bad_value, in_int_range
from cdcflow.model import ChangeEvent, Op, SourceTable, Txn
from cdcflow.types import (
    INT64_MAX,
    INT64_MIN,
    INT_RANGES,
    decimal_type,
    field_range_error,
    int_range_error,
    json_text,
    to_bool,
    to_float,
    to_int,
)

__all__ = [
    "QlikJsonDecoder",
    "QlikJsonOptions",
    "metadata_from_event",
    "metadata_from_message",
]

IDENTIFIER = "qlik-json"
MAGIC = "atMSG"  # constant that marks a Replicate envelope
TYPE_DATA = "DT"  # data message: one row change
TYPE_METADATA = "MD"  # metadata message: a table's structure (a new tableVersion per DDL)

OP_REFRESH = "REFRESH"  # full-load row
OP_INSERT = "INSERT"  # CDC insert
OP_UPDATE = "UPDATE"  # CDC update (beforeData: before image, when published)
OP_DELETE = "DELETE"  # CDC delete (data: the deleted row)
_OPS = {OP_REFRESH: Op.SNAPSHOT, OP_INSERT: Op.INSERT, OP_UPDATE: Op.UPDATE, OP_DELETE: Op.DELETE}
_SNAPSHOT, _UPDATE, _DELETE = Op.SNAPSHOT, Op.UPDATE, Op.DELETE  # no enum lookups per record

LOOKUP_AUTO = "auto"  # messageSchemaId (or externalSchemaId), then topic name, then message key
LOOKUP_SCHEMA_ID = "schema-id"  # only messageSchemaId / externalSchemaId
LOOKUP_TOPIC = "topic"  # the topic is the table ("separate topic per table": "schema.table")
LOOKUP_KEY = "key"  # the message key is the table ("schema and table name": "schema.table")
LOOKUPS = (LOOKUP_AUTO, LOOKUP_SCHEMA_ID, LOOKUP_TOPIC, LOOKUP_KEY)

_EPOCH = dt.datetime(1970, 1, 1)
_MS = dt.timedelta(milliseconds=1)
_DEC_CTX = decimal.Context(prec=1000)
_P10 = [10**i for i in range(49)]


@dataclass(frozen=True)
class QlikJsonOptions(DecoderOptions):
    """Options of the ``qlik-json`` decoder.

    Attributes:
        metadata: preloaded metadata, one item per table version: an MD message (bytes,
            text or parsed, wrapped in the envelope or bare) or the ``meta`` of a decoded
            DDL event (:func:`metadata_from_event`). Default ``()``: learn from MD messages.
        metadata_lookup: how a data message finds its metadata: ``"auto"`` (default:
            ``messageSchemaId``/``externalSchemaId``, then the topic name, then the message
            key), ``"schema-id"``, ``"topic"`` or ``"key"``. Without metadata the table is
            named by the key in ``"key"`` mode, else by the topic.
        require_metadata: dead-letter (``MISSING_FIELD``) a data message whose metadata is
            unknown instead of decoding it untyped. Default ``False``.
    """

    metadata: tuple[Any, ...] = ()
    metadata_lookup: str = LOOKUP_AUTO
    require_metadata: bool = False

    def __post_init__(self) -> None:
        if self.metadata_lookup not in LOOKUPS:
            raise ConfigError(
                f"metadata_lookup {self.metadata_lookup!r} is not valid; valid: {list(LOOKUPS)}"
            )
        if isinstance(self.metadata, Mapping | str | bytes):
            raise ConfigError("metadata must be a list of metadata messages, not one message")
        object.__setattr__(self, "metadata", tuple(self.metadata))


# --------------------------------------------------------------------------- values


def _conv_int32(value: Any, column: str) -> int:
    return in_int_range(to_int(value, column), column, "int32")  # type: ignore[arg-type]  # value is not None (callers convert non-nulls), so to_int gives an int


def _conv_int64(value: Any, column: str) -> int:
    return in_int_range(to_int(value, column), column, "int64")  # type: ignore[arg-type]  # value is not None (callers convert non-nulls), so to_int gives an int


def _conv_str(value: Any, column: str) -> str:
    if type(value) is str:
        return value
    raise bad_value(column, value, "string")


def _conv_numeric(value: Any, column: str, quantum: decimal.Decimal | None) -> decimal.Decimal:
    """NUMERIC text (or JSON number) -> exact Decimal padded to the scale of ``quantum``
    (``Decimal("0.01")`` for scale 2); a value with more digits is BAD_VALUE, never rounded."""
    try:
        if type(value) is str or type(value) is int:
            d = decimal.Decimal(value)
        elif type(value) is float:
            d = decimal.Decimal(repr(value))
        else:
            raise bad_value(column, value, "decimal")
        if not d.is_finite():
            raise bad_value(column, value, "decimal")
        if quantum is None or d.same_quantum(quantum):
            return d
        q = d.quantize(quantum, context=_DEC_CTX)
    except (decimal.InvalidOperation, ValueError):
        raise bad_value(column, value, "decimal") from None
    if q != d:
        exponent = quantum.as_tuple().exponent
        assert isinstance(exponent, int)  # quantum is finite (_quantum)
        raise bad_value(column, value, f"decimal of scale {-exponent}")
    return q


def _quantum(scale: int) -> decimal.Decimal:
    return decimal.Decimal(1).scaleb(-scale)


# DATE, TIME, DATETIME and BYTES text: the reading shared with the other formats that
# print MySQL values (formats/common/mysql_values): a MySQL zero date is NULL, an offset
# gives the UTC wall clock, digits past the microsecond (Replicate writes 9) are cut.
_conv_date, _conv_time, _conv_datetime, _conv_hex = date_text, time_text, datetime_text, hex_text


def _plan(qtype: str, precision: int, scale: int) -> tuple[str | None, Any]:
    """(logical type, converter) for a Replicate data type; ``(None, None)`` if unknown."""
    base = qtype.split("(", 1)[0].strip().upper()
    if base in ("INT1", "INT2", "INT4", "UINT1", "UINT2"):
        return "int32", _conv_int32
    if base in ("INT8", "UINT4"):
        return "int64", _conv_int64
    if base == "UINT8":  # JSON string, Avro DECIMAL(20,0)
        return "decimal(20,0)", unsigned_bigint_text
    if base == "NUMERIC":  # JSON string
        if precision > 0:
            return decimal_type(precision, scale), partial(_conv_numeric, quantum=_quantum(scale))
        return decimal_type(38, scale), partial(_conv_numeric, quantum=None)
    if base == "REAL4":
        return "float32", to_float
    if base == "REAL8":
        return "float64", to_float
    if base in ("STRING", "WSTRING", "CLOB", "NCLOB"):
        return "string", _conv_str
    if base == "BOOLEAN":
        return "boolean", to_bool
    if base == "DATE":
        return "date", _conv_date
    if base == "TIME":
        return "time", _conv_time
    if base in ("DATETIME", "TIMESTAMP"):
        return "timestamp", _conv_datetime
    if base in ("BYTES", "BLOB"):  # hexadecimal digits in JSON
        return "binary", _conv_hex
    return None, None


class _Never:
    """A type no JSON value has: its columns always go through their converter."""


#: logical type -> the JSON value type that is already the typed value
_FAST: dict[str, type] = {
    "int32": int,
    "int64": int,
    "float32": float,
    "float64": float,
    "string": str,
    "boolean": bool,
}

# --------------------------------------------------------------------------- metadata


def _int_field(obj: Mapping[str, Any], name: str, where: str, default: int | None = 0) -> Any:
    value = obj.get(name)
    if value is None:
        return default
    if type(value) is not int:
        raise DecodeError(f"{where}.{name} must be an integer, got {value!r}", Code.BAD_FIELD)
    return value


def _normalize_metadata(obj: Any) -> dict[str, Any]:
    """An MD message (envelope, bare message, or a DDL event's meta) -> normalized metadata.

    Raises:
        DecodeError: not a metadata message (BAD_JSON, NOT_AN_OBJECT, MISSING_FIELD, BAD_FIELD).
    """
    if isinstance(obj, bytes | bytearray | memoryview | str):
        try:
            obj = orjson.loads(obj)
        except orjson.JSONDecodeError as exc:
            raise DecodeError(f"metadata is not JSON: {exc}", Code.BAD_JSON) from exc
    if not isinstance(obj, Mapping):
        raise DecodeError("a metadata message must be a JSON object", Code.NOT_AN_OBJECT)
    if "magic" in obj:
        if obj.get("type") != TYPE_METADATA:
            raise DecodeError(f"envelope type {obj.get('type')!r} is not MD", Code.BAD_FIELD)
        obj = obj.get("message")
        if isinstance(obj, str):
            return _normalize_metadata(obj)
        if not isinstance(obj, Mapping):
            raise DecodeError("MD envelope has no message object", Code.MISSING_FIELD)
    lineage = obj.get("lineage")
    structure = obj.get("tableStructure")
    if not isinstance(lineage, Mapping) or not isinstance(structure, Mapping):
        raise DecodeError("MD message needs lineage and tableStructure objects", Code.MISSING_FIELD)
    table = lineage.get("table")
    if not isinstance(table, str) or not table:
        raise DecodeError("MD message: lineage.table must be a non-empty string", Code.BAD_FIELD)
    cols = structure.get("tableColumns")
    if not isinstance(cols, Mapping) or not cols:
        raise DecodeError(
            "MD message: tableStructure.tableColumns must be an object", Code.MISSING_FIELD
        )
    columns: dict[str, dict[str, Any]] = {}
    seen: set[int] = set()
    for name, col in cols.items():
        where = f"tableColumns.{name}"
        if not isinstance(col, Mapping):
            raise DecodeError(f"{where} must be an object", Code.BAD_FIELD)
        ordinal = _int_field(col, "ordinal", where, None)
        qtype = col.get("type")
        if ordinal is None or not isinstance(qtype, str):
            raise DecodeError(f"{where} needs an integer ordinal and a type", Code.MISSING_FIELD)
        if ordinal < 1 or ordinal > len(cols) or ordinal in seen:
            raise DecodeError(
                f"{where}.ordinal {ordinal} is not a new ordinal in 1..{len(cols)} (the "
                "table's column count): each column has its own position",
                Code.BAD_FIELD,
            )
        seen.add(ordinal)
        nullable = col.get("nullable")
        columns[str(name)] = {
            "ordinal": ordinal,
            "type": qtype,
            "length": _int_field(col, "length", where),
            "precision": _int_field(col, "precision", where),
            "scale": _int_field(col, "scale", where),
            "primaryKeyPosition": _int_field(col, "primaryKeyPosition", where),
            "nullable": nullable if isinstance(nullable, bool) else None,
        }
    schema_id = obj.get("schemaId")
    ts = lineage.get("timestamp")
    return {
        "schemaId": schema_id if isinstance(schema_id, str) and schema_id else None,
        "lineage": {
            "server": lineage.get("server") if isinstance(lineage.get("server"), str) else None,
            "task": lineage.get("task") if isinstance(lineage.get("task"), str) else None,
            "schema": lineage.get("schema") if isinstance(lineage.get("schema"), str) else "",
            "table": table,
            "tableVersion": _int_field(lineage, "tableVersion", "lineage", None),
            "timestamp": ts if isinstance(ts, str) and ts else None,
        },
        "tableStructure": {"tableColumns": columns},
    }


def metadata_from_message(value: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """Normalized metadata of one MD message, for :attr:`QlikJsonOptions.metadata`.

    Raises:
        DecodeError: ``value`` is not a valid metadata message.
    """
    return _normalize_metadata(value)


def metadata_from_event(event: ChangeEvent) -> dict[str, Any]:
    """The metadata a decoded ``qlik-json`` DDL event carries, to persist and preload later.

    Raises:
        ValueError: ``event`` is not a DDL event decoded by this format.
    """
    if event.op is not Op.DDL or event.source.format != IDENTIFIER or not event.meta:
        raise ValueError("not a qlik-json DDL event")
    return _normalize_metadata(event.meta)


class _Table:
    """One table version: the typing, key and mask plan built from its metadata."""

    __slots__ = (
        "meta",
        "source",
        "columns",
        "convs",
        "fast",
        "ints",
        "key",
        "names",
        "all_bits",
        "version",
        "_absent",
        "_changed",
    )

    def __init__(self, meta: dict[str, Any], source: SourceTable) -> None:
        self.meta = meta
        self.source = source
        self.version = meta["lineage"]["tableVersion"]
        cols = meta["tableStructure"]["tableColumns"]
        self.columns: dict[str, str] = {}
        self.convs: dict[str, Any] = {}  # name -> converter (value, name) -> typed value
        self.fast: dict[str, type] = {}  # name -> JSON value type that needs no converter
        self.names: dict[int, str] = {}  # bit -> column name
        pk: list[tuple[int, str]] = []
        for name, c in cols.items():
            logical, conv = _plan(c["type"], c["precision"], c["scale"])
            if logical is not None:
                self.columns[name] = logical
                self.convs[name] = conv
                self.fast[name] = _FAST.get(logical, _Never)
            self.names[c["ordinal"] - 1] = name
            if c["primaryKeyPosition"] > 0:
                pk.append((c["primaryKeyPosition"], name))
        #: (column, min, max) of the int32/int64 columns, whose JSON integers skip the
        #: converter: their range is checked after the image
        self.ints = tuple((n, *INT_RANGES[t]) for n, t in self.columns.items() if t in INT_RANGES)
        self.key = tuple(n for _, n in sorted(pk))
        self.all_bits = sum(1 << b for b in self.names)
        self._absent: dict[int, frozenset[str]] = {}
        self._changed: dict[int, tuple[str, ...]] = {}

    def __reduce__(self) -> Any:
        return (_Table, (self.meta, self.source))

    def absent(self, mask: int) -> frozenset[str]:
        """Columns a columnMask says were not replicated (cached per mask)."""
        got = self._absent.get(mask)
        if got is None:
            got = frozenset(n for b, n in self.names.items() if not mask >> b & 1)
            self._absent[mask] = got
        return got

    def changed(self, mask: int) -> tuple[str, ...]:
        """Column names of a changeMask, in ordinal order (cached per mask)."""
        got = self._changed.get(mask)
        if got is None:
            got = tuple(self.names[b] for b in sorted(self.names) if mask >> b & 1)
            self._changed[mask] = got
        return got


# --------------------------------------------------------------------------- headers


def _seq(text: str) -> tuple[int, ...]:
    """changeSequence -> tuple whose order is the string order (see module doc)."""
    if not (text.isdigit() and text.isascii()):
        raise DecodeError(f"changeSequence {text!r} is not a decimal string", Code.BAD_FIELD)
    n = len(text)
    if n <= 48:  # Replicate's 35 digits
        return (int(text) * _P10[48 - n], n)
    out: list[int] = []
    for i in range(0, n, 48):
        group = text[i : i + 48]
        out += (int(group.ljust(48, "0")), len(group))
    return tuple(out)


_TS_CACHE: dict[str, int] = {}  # the changes of one transaction share their timestamp


def _ts_ms(text: Any, field: str) -> int | None:
    """UTC timestamp text (``2023-09-11T03:23:25.000``) -> epoch ms; ``""``/None -> None."""
    if not text:
        return None
    ms = _TS_CACHE.get(text) if type(text) is str else None
    if ms is not None:
        return ms
    try:
        d = dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise DecodeError(f"{field} {text!r} is not a timestamp", Code.BAD_FIELD) from None
    if d.tzinfo is not None:
        d = d.astimezone(dt.UTC).replace(tzinfo=None)
    ms = (d - _EPOCH) // _MS
    if len(_TS_CACHE) >= 4096:
        _TS_CACHE.clear()
    _TS_CACHE[text] = ms
    return ms


def _lenient_ts_ms(text: Any) -> int | None:
    """lineage.timestamp: informative only, so an unreadable one does not lose the metadata."""
    try:
        return _ts_ms(text, "lineage.timestamp")
    except DecodeError:
        return None


def _version(table: _Table) -> int:
    return -1 if table.version is None else table.version


# --------------------------------------------------------------------------- decoder


class QlikJsonDecoder(Decoder[QlikJsonOptions]):
    """Decodes Qlik Replicate JSON data and metadata messages (module doc for the rules).

    State: the metadata of every table version seen (MD messages and preloaded
    :attr:`QlikJsonOptions.metadata`), by schema id and by ``schema.table``.
    """

    identifier: ClassVar[str] = IDENTIFIER
    options_class = QlikJsonOptions
    options: QlikJsonOptions

    def __init__(self, options: QlikJsonOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._by_id: dict[str, _Table] = {}
        self._by_name: dict[str, _Table] = {}  # "schema.table" -> newest version
        self._by_bare: dict[str, _Table | None] = {}  # "table" -> newest (None: ambiguous)
        self._untyped: dict[str, SourceTable] = {}
        self._keys: dict[SourceTable, tuple[str, ...] | None] = {}
        self._ids_first = self.options.metadata_lookup in (LOOKUP_AUTO, LOOKUP_SCHEMA_ID)
        for item in self.options.metadata:
            try:
                self._learn(_normalize_metadata(item))
            except DecodeError as exc:
                raise ConfigError(f"qlik-json metadata option: {exc.message}") from exc

    # -- metadata ---------------------------------------------------------------

    def state_items(self, event: ChangeEvent) -> list[Any]:
        """A metadata message's normalized metadata, persisted for later micro-batches."""
        if event.op is not Op.DDL or event.source.format != IDENTIFIER or not event.meta:
            return []
        try:
            return [metadata_from_event(event)]
        except (ValueError, DecodeError):
            return []

    def load_state(self, items: Iterable[Any]) -> None:
        """Learn metadata persisted from earlier batches (older versions never win)."""
        for item in items:
            try:
                self._learn(_normalize_metadata(item))
            except DecodeError:
                continue

    def _learn(self, meta: dict[str, Any]) -> _Table:
        lin = meta["lineage"]
        table = _Table(meta, SourceTable(IDENTIFIER, "", lin["schema"], lin["table"]))
        if meta["schemaId"]:
            self._by_id[meta["schemaId"]] = table
        name = f"{lin['schema']}.{lin['table']}" if lin["schema"] else lin["table"]
        old = self._by_name.get(name)
        if old is None or _version(old) <= _version(table):  # a replayed older MD loses
            self._by_name[name] = table
            # a bare table name finds its table only while no other schema has one so named
            prev = self._by_bare.get(lin["table"], table)
            same = prev is not None and prev.source == table.source
            self._by_bare[lin["table"]] = table if same else None
        return table

    def _named(self, name: str | None) -> _Table | None:
        if not name:
            return None
        found = self._by_name.get(name)
        return found if found is not None else self._by_bare.get(name)

    def _find(self, record: Record, schema_id: Any, headers: dict[str, Any]) -> _Table | None:
        mode = self.options.metadata_lookup
        if mode in (LOOKUP_AUTO, LOOKUP_SCHEMA_ID):
            if type(schema_id) is str:
                found = self._by_id.get(schema_id)
                if found is not None:
                    return found
            external = headers.get("externalSchemaId")
            if external and type(external) is str and external in self._by_id:
                return self._by_id[external]
            if mode == LOOKUP_SCHEMA_ID:
                return None
        if mode != LOOKUP_KEY:
            found = self._named(record.origin.topic)
            if found is not None or mode == LOOKUP_TOPIC:
                return found
        return self._named(_key_name(record.key))

    def _untyped_source(self, record: Record) -> SourceTable:
        name = (
            _key_name(record.key)
            if self.options.metadata_lookup == LOOKUP_KEY
            else record.origin.topic
        ) or ""
        src = self._untyped.get(name)
        if src is None:
            schema, _, table = name.rpartition(".")
            src = self._untyped[name] = SourceTable(IDENTIFIER, "", schema, table)
        return src

    # -- decoding ---------------------------------------------------------------

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one Replicate JSON record (envelope or bare message).

        Returns:
            ``[Op.DDL event]`` for an MD message, ``[row event]`` for a DT message.

        Raises:
            DecodeError: BAD_JSON, NOT_AN_OBJECT, MISSING_FIELD, BAD_FIELD, UNKNOWN_OP,
                BAD_VALUE, MISSING_KEY.
        """
        obj = load_object(record.value, "a Replicate message")
        schema_id = None
        if "magic" in obj:
            if obj["magic"] != MAGIC:
                raise DecodeError(f"magic {obj['magic']!r} is not {MAGIC!r}", Code.BAD_FIELD)
            kind = obj.get("type")
            message = obj.get("message")
            if message is None:
                raise DecodeError("envelope has no message", Code.MISSING_FIELD)
            if type(message) is str:  # the envelope's bytes field carried as text
                try:
                    message = orjson.loads(message)
                except orjson.JSONDecodeError as exc:
                    raise DecodeError(
                        f"envelope message is not JSON: {exc}", Code.BAD_JSON
                    ) from exc
            if type(message) is not dict:
                raise DecodeError("envelope message must be a JSON object", Code.BAD_FIELD)
            schema_id = obj.get("messageSchemaId")
        elif "headers" in obj and ("data" in obj or "beforeData" in obj):
            kind, message = TYPE_DATA, obj  # endpoint set not to wrap data messages
        elif "tableStructure" in obj:
            kind, message = TYPE_METADATA, obj
        else:
            raise DecodeError(
                "not a Replicate message: no magic/type/message envelope and no "
                "data/headers or tableStructure fields",
                Code.MISSING_FIELD,
            )
        if kind == TYPE_DATA:
            return [self._data(record, message, schema_id)]
        if kind == TYPE_METADATA:
            return [self._metadata(record, message)]
        raise DecodeError(f"envelope type {kind!r} is neither DT nor MD", Code.BAD_FIELD)

    def _metadata(self, record: Record, message: dict[str, Any]) -> ChangeEvent:
        meta = _normalize_metadata(message)
        count = len(meta["tableStructure"]["tableColumns"])
        if count > self.options.max_columns:  # refused before it is learned (base.py)
            lin = meta["lineage"]
            named = SourceTable(IDENTIFIER, "", lin["schema"], lin["table"])
            raise self.too_many_columns(named, "metadata message", "it declares", count)
        table = self._learn(meta)
        return ChangeEvent(
            op=Op.DDL,
            source=table.source,
            columns=dict(table.columns),
            ts_ms=_lenient_ts_ms(meta["lineage"]["timestamp"]),
            origin=record.origin,
            meta=meta,
        )

    def _data(self, record: Record, message: dict[str, Any], schema_id: Any) -> ChangeEvent:
        headers = message.get("headers")
        if type(headers) is not dict:
            raise DecodeError("data message has no headers object", Code.MISSING_FIELD)
        code = headers.get("operation")
        op = _OPS.get(code) if type(code) is str else None
        if op is None:
            if code is None:
                raise DecodeError("headers.operation is missing", Code.MISSING_FIELD)
            if type(code) is not str:
                raise DecodeError(f"operation {code!r} is not a string", Code.BAD_FIELD)
            raise DecodeError(f"unknown operation {code!r}; known: {sorted(_OPS)}", Code.UNKNOWN_OP)
        table = self._by_id.get(schema_id) if self._ids_first and type(schema_id) is str else None
        if table is None:
            table = self._find(record, schema_id, headers)
        change_seq = headers.get("changeSequence")
        if change_seq:
            if type(change_seq) is not str:
                raise DecodeError(f"changeSequence {change_seq!r} is not a string", Code.BAD_FIELD)
            seq: tuple[int, ...] | None = _seq(change_seq)
        elif op is _SNAPSHOT:
            seq = None
        else:
            raise DecodeError("headers.changeSequence is missing", Code.MISSING_FIELD)
        column_mask = change_mask = None
        try:
            if text := headers.get("columnMask"):
                column_mask = int(text, 16)
            if text := headers.get("changeMask"):
                change_mask = int(text, 16)
        except (TypeError, ValueError):
            raise DecodeError(
                f"mask {text!r} is not a hexadecimal string", Code.BAD_FIELD
            ) from None
        data = message.get("data")
        before = message.get("beforeData")
        if op is _DELETE:  # the deleted row is in data (beforeData accepted as well)
            data, before = None, data if data is not None else before
        if table is None:
            if self.options.require_metadata:
                raise DecodeError(
                    "no metadata message known for this data message; publish metadata "
                    "messages, preload them (metadata option) or check metadata_lookup",
                    Code.MISSING_FIELD,
                )
            source = self._untyped_source(record)
            key_cols = self._config_key(source)
            after_img = None if data is None else _untyped_image(data, column_mask, "data")
            before_img = (
                None if before is None else _untyped_image(before, column_mask, "beforeData")
            )
            # before the key is looked for: the data of a table whose metadata message was
            # refused as too wide is refused for its width, not for its unknown key
            limit = self.options.max_columns
            for name, img in (("data", after_img), ("beforeData", before_img)):
                if img is not None and len(img) > limit:
                    subject = f"{op.value} data message"
                    raise self.too_many_columns(source, subject, f"its {name} has", len(img))
            meta: dict[str, Any] = {}
            changed = columns = None
        else:
            source = table.source
            key_cols = table.key or self._config_key(source)
            nested: list[str] = []
            after_img = (
                None if data is None else _typed_image(table, data, column_mask, "data", nested)
            )
            before_img = (
                None
                if before is None
                else _typed_image(table, before, column_mask, "beforeData", nested)
            )
            meta = {} if table.version is None else {"tableVersion": table.version}
            columns = table.columns
            if nested:  # objects/arrays of columns the metadata does not type: JSON text
                columns = {**columns, **dict.fromkeys(nested, "json")}
            changed = (
                table.changed(change_mask) if op is _UPDATE and change_mask is not None else None
            )
        image = after_img if after_img is not None else before_img
        if image is None:
            raise DecodeError(f"{code} message has neither data nor beforeData", Code.MISSING_FIELD)
        tid = headers.get("transactionId")
        txn = None
        if tid:
            order = headers.get("transactionEventCounter")
            last = headers.get("transactionLastEvent")
            if (
                type(tid) is not str
                or not (order is None or type(order) is int)
                or not (last is None or type(last) is bool)
            ):
                raise DecodeError(
                    "transactionId must be a string, transactionEventCounter an integer and "
                    "transactionLastEvent a boolean",
                    Code.BAD_FIELD,
                )
            if order is not None and not INT64_MIN <= order <= INT64_MAX:
                raise field_range_error(
                    "transactionEventCounter",
                    order,
                    INT64_MIN,
                    INT64_MAX,
                    "the event's position in its transaction; txn.order is a 64-bit integer",
                )
            txn = Txn(tid, order, last)
        ts = headers.get("timestamp")
        ts_ms = _TS_CACHE.get(ts) if ts and type(ts) is str else None
        if ts_ms is None:
            ts_ms = _ts_ms(ts, "timestamp")  # null/"" -> None, not text -> BAD_FIELD
        position = headers.get("streamPosition")
        if position:
            if type(position) is not str:
                raise DecodeError(f"streamPosition {position!r} is not a string", Code.BAD_FIELD)
            meta["streamPosition"] = position
        external = headers.get("externalSchemaId")
        if external:
            if type(external) is not str:
                raise DecodeError(f"externalSchemaId {external!r} is not a string", Code.BAD_FIELD)
            meta["externalSchemaId"] = external
        event = ChangeEvent(
            op=op,
            source=source,
            before=before_img,
            after=after_img,
            columns=columns,
            seq=seq,
            ts_ms=ts_ms,
            txn=txn,
            changed=changed,
            origin=record.origin,
            meta=meta or None,
        )
        key = None
        if key_cols:
            try:
                if len(key_cols) == 1:
                    key = {key_cols[0]: image[key_cols[0]]}
                else:
                    key = {c: image[c] for c in key_cols}
            except KeyError:
                pass
        if key is None:  # MISSING_KEY with the reason, or the full-row identity (keyless)
            return self.require_key(event, key_cols)
        event.key = key
        return event

    def _config_key(self, source: SourceTable) -> tuple[str, ...] | None:
        """Key columns from ``primary_keys`` for a table (cached per table)."""
        try:
            return self._keys[source]
        except KeyError:
            cols = self._keys[source] = key_columns_for(self.options.primary_keys, source)
            return cols


def _typed_image(
    table: _Table, raw: Any, mask: int | None, field: str, nested: list[str]
) -> dict[str, Any] | None:
    """Convert ``raw`` (fresh from JSON, so changed in place) to typed values; drop the
    columns that ``mask`` says were not replicated.

    An object or array in a column the metadata does not type becomes JSON text and its
    name is appended to ``nested`` (the event declares it ``json``).
    """
    if raw is None:
        return None
    if type(raw) is not dict:
        raise DecodeError(f"{field} must be a JSON object", Code.BAD_FIELD)
    fast = table.fast
    convs = table.convs
    for name, value in raw.items():
        if value is not None and type(value) is not fast.get(name):
            conv = convs.get(name)
            if conv is not None:
                raw[name] = conv(value, name)
            elif type(value) is dict or type(value) is list:  # no declared type: JSON text
                raw[name] = json_text(value, name)
                nested.append(name)
    for name, lo, hi in table.ints:  # JSON integers skipped their converter
        value = raw.get(name)
        if value is not None and not lo <= value <= hi:
            raise int_range_error(name, value, table.columns[name])
    if mask is not None and mask & table.all_bits != table.all_bits:
        for name in table.absent(mask):
            raw.pop(name, None)
    return raw


def _untyped_image(raw: Any, mask: int | None, field: str) -> dict[str, Any] | None:
    """An image without metadata: JSON scalars as they are, objects/arrays as JSON text."""
    if raw is None:
        return None
    if type(raw) is not dict:
        raise DecodeError(f"{field} must be a JSON object", Code.BAD_FIELD)
    if mask is not None and mask != (1 << len(raw)) - 1:
        raise DecodeError(
            f"columnMask {mask:X} says some of the {len(raw)} columns were not replicated, "
            "but without the table's metadata message (column ordinals) they cannot be told "
            "apart; publish or preload metadata messages",
            Code.MISSING_FIELD,
        )
    for name, value in raw.items():
        if type(value) is dict or type(value) is list:
            raw[name] = json_text(value, name)
    return raw


def _key_name(key: bytes | None) -> str | None:
    """The table name a message key carries (``schema.table``, plain or a JSON string)."""
    if not key:
        return None
    try:
        text = key.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text or None

"""Alibaba Canal flat-message JSON (``canal-json``), as written by Canal and Alibaba DTS.

Source documents: Alibaba Cloud DTS *Data storage formats in message queues*, part
"Canal Json" (``https://www.alibabacloud.com/help/en/dts/user-guide/data-formats-of-a-kafka-cluster``), and Canal's own
``FlatMessage`` (open-source Canal MQ mode). One message is::

    {"data": [{col: "text", ...}, ...], "old": [{col: "old text"}, ...] | null,
     "database", "table", "pkNames": [...], "isDdl": bool, "sql", "type",
     "mysqlType": {col: "int(11) unsigned"}, "sqlType": {col: java.sql.Types},
     "es": source ms, "ts": writer ms, "id": batch id (Canal) or operation serial
     number (DTS), ["gtid"]}

Decoding rules (details and the type table: ``docs/formats/canal-json.md``):

* One event per element of ``data``, in array order. ``old[i]`` belongs to ``data[i]``
  and holds only the changed columns with their old values (an explicit ``null`` means
  the old value was NULL): the before image of an update is ``data[i]`` overlaid with
  ``old[i]``; ``changed`` is ``old[i]``'s columns.
* DELETE: DTS instances created before 2022-03-20 put the deleted row in ``old`` with
  ``data`` null; later ones (and Canal) put it in ``data``. Detected per message: the
  row comes from ``data`` when it has rows, else from ``old``.
* Values arrive as text and are parsed by ``mysqlType`` (case-insensitive, with
  lengths and ``unsigned``/``zerofill``), falling back to ``sqlType`` for a column that
  ``mysqlType`` does not name.
* ``ts_ms`` is ``es``. ``seq`` depends on what ``id`` means (option ``id_semantics``,
  decision 62): ``"batch"`` (default; open-source Canal, whose ``id`` is the batch id
  every message of one Canal batch shares, as SeaTunnel's and Paimon's captures show):
  ``(es, id, kafka_offset, row_index)``, the Kafka offset ordering the messages of one
  batch; ``"operation"`` (Alibaba DTS, whose ``id`` is "the serial number of the
  operation"): ``(es, id, row_index)``, so a copy or replay of a message at another
  offset or partition has the original's ``seq``. ``es`` first because Canal's batch
  ids start again after a restart. Without ``es`` (e.g. Flink-written canal-json)
  ``seq`` is ``None``.
* Key: ``pkNames``, else ``options.primary_keys``, else ``MISSING_KEY``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats.base import Decoder, DecoderOptions, Record
from cdcflow.formats.common.fields import field_error
from cdcflow.formats.common.json_object import load_object
from cdcflow.formats.common.mysql_types import (
    BIGINTS,
    BINARIES,
    DECIMALS,
    DOUBLES,
    FLOATS,
    GEOMETRIES,
    INTS,
    SMALL_INTS,
    parse_mysql_type,
)
from cdcflow.formats.common.mysql_values import (
    bit_type,
    boolean_text,
    date_text,
    datetime_text,
    decimal_json,
    enum_labels,
    enum_text,
    hex_text,
    integer_type,
    latin1_text,
    set_text,
    time_text,
    timestamp_text,
)
from cdcflow.formats.common.values import int32_text, int64_text
from cdcflow.formats.common.zones import zone_option
from cdcflow.model import ChangeEvent, Op, Origin, SourceTable, Txn
from cdcflow.types import (
    INT64_MAX,
    INT64_MIN,
    INT_RANGES,
    decimal_type,
    field_range_error,
    json_text,
    to_bytes_base64,
    to_float,
)

__all__ = ["CanalJsonDecoder", "CanalJsonOptions"]

IDENTIFIER = "canal-json"

# --------------------------------------------------------------------------- op codes
# ``type`` values (Canal ``EventType`` names plus DTS's INIT and DDL), case-sensitive.
TYPE_INSERT = "INSERT"  # rows inserted (``data``)
TYPE_UPDATE = "UPDATE"  # rows updated (``data`` after, ``old`` changed columns)
TYPE_DELETE = "DELETE"  # rows deleted (``data``; ``old`` on DTS before 2022-03-20)
TYPE_INIT = "INIT"  # DTS full (initial) load row
TYPE_TRUNCATE = "TRUNCATE"  # table truncated (isDdl true)
TYPE_QUERY = "QUERY"  # a statement as text: DDL when isDdl, else statement-based DML
_DDL_TYPES = frozenset(
    {
        "CREATE",  # CREATE TABLE
        "ALTER",  # ALTER TABLE
        "ERASE",  # DROP TABLE
        "RENAME",  # RENAME TABLE
        "CINDEX",  # CREATE INDEX
        "DINDEX",  # DROP INDEX
        "DDL",  # DTS: any DDL
    }
)
_UPDATE, _DELETE = Op.UPDATE, Op.DELETE  # module globals: faster than Op.X lookups
ROW_OPS = {
    TYPE_INSERT: Op.INSERT,
    TYPE_UPDATE: Op.UPDATE,
    TYPE_DELETE: Op.DELETE,
    TYPE_INIT: Op.SNAPSHOT,
}

_BINARY_ENCODINGS = ("latin1", "hex", "base64")
_ENUM_MODES = ("index", "label")
ID_BATCH = "batch"  # open-source Canal: ``id`` is the batch id, shared by a batch's messages
ID_OPERATION = "operation"  # Alibaba DTS: ``id`` is the serial number of one operation
_ID_SEMANTICS = (ID_BATCH, ID_OPERATION)


@dataclass(frozen=True)
class CanalJsonOptions(DecoderOptions):
    """Options of ``canal-json``.

    Attributes:
        tinyint1_as_boolean: ``TINYINT(1)``, ``BOOL`` and ``BOOLEAN`` columns decode as
            ``boolean`` (default ``True``, as Paimon and Flink CDC do); a value other
            than 0/1 is then a ``BAD_VALUE`` dead letter. ``False``: ``int32``.
        timestamp_zone: zone in which MySQL ``TIMESTAMP`` text was written (Canal prints
            it in its server's JVM zone), e.g. ``"Asia/Shanghai"`` or ``"+08:00"``; such
            columns then decode as ``timestamptz`` (UTC). ``None`` (default): they decode
            as naive ``timestamp``, wall clock as printed, like ``DATETIME``.
        binary_encoding: how binary, BLOB and geometry values are written as text:
            ``"latin1"`` (default; Canal and Alibaba DTS: one char per byte, ISO-8859-1),
            ``"hex"`` (Tencent Cloud DTS) or ``"base64"`` (Flink's canal-json writer).
        enum_values: ``"index"`` (default; Canal from the binlog and DTS write the
            1-based ENUM index and the SET bit mask, e.g. ``"1"``/``"3"``) or ``"label"``
            (the text is the value itself). In ``index`` mode a non-numeric value that is
            one of the type's labels is accepted as that label.
        time_as_string: decode ``TIME`` as its text (``string``), for columns holding
            durations outside 00:00:00-23:59:59 (default ``False``: ``time``; an
            out-of-range value is a ``BAD_VALUE`` dead letter).
        id_semantics: what the message's ``id`` identifies (decision 62). ``"batch"``
            (default; open-source Canal: the batch id, shared by every message of one
            Canal batch): ``seq`` is ``(es, id, kafka_offset, row_index)``, so messages
            of one batch are ordered by their Kafka offset. ``"operation"`` (Alibaba
            DTS: "the serial number of the operation", one per change): ``seq`` is
            ``(es, id, row_index)``, so a duplicate or replay of a message, at any
            offset or partition, has the original's ``seq`` and never outranks a newer
            change. Set ``"operation"`` only for a writer that gives every change its
            own ``id``: on Canal batches it gives different changes the same ``seq``.
    """

    tinyint1_as_boolean: bool = True
    timestamp_zone: str | None = None
    binary_encoding: str = "latin1"
    enum_values: str = "index"
    time_as_string: bool = False
    id_semantics: str = ID_BATCH

    def __post_init__(self) -> None:
        if self.id_semantics not in _ID_SEMANTICS:
            raise ConfigError(
                f"id_semantics must be one of {list(_ID_SEMANTICS)}, not {self.id_semantics!r}"
            )
        if self.binary_encoding not in _BINARY_ENCODINGS:
            raise ConfigError(
                f"binary_encoding must be one of {list(_BINARY_ENCODINGS)}, "
                f"not {self.binary_encoding!r}"
            )
        if self.enum_values not in _ENUM_MODES:
            raise ConfigError(
                f"enum_values must be one of {list(_ENUM_MODES)}, not {self.enum_values!r}"
            )
        if self.timestamp_zone is not None:
            zone_option(self.timestamp_zone)


# --------------------------------------------------------------------------- values
# Converters take (value, column) and return the typed value; ``None`` never reaches them.


def _text(v: Any, c: str) -> str:
    return v if type(v) is str else json_text(v, c)


def _float(v: Any, c: str) -> float:
    if type(v) is str:
        try:
            return float(v)
        except ValueError:
            pass
    return to_float(v, c)  # type: ignore[return-value]  # v is not None (callers convert non-nulls), so to_float gives a float


# MySQL values (dates, booleans, unsigned, BIT, ENUM/SET, binary): the shared layer,
# cdcflow.formats.common.mysql_values; canal-json adds its options' hints.
_TINYINT1_HINT = (
    "; for TINYINT(1) columns holding other numbers "
    "set the canal-json option tinyint1_as_boolean to false"
)
_TIME_HINT = "; for durations (negative or over 24h) set the canal-json option time_as_string"
_boolean = partial(boolean_text, hint=_TINYINT1_HINT)
_time = partial(time_text, hint=_TIME_HINT)
_date, _datetime, _decimal = date_text, datetime_text, decimal_json


def _json(v: Any, c: str) -> str:
    return v if type(v) is str else json_text(v, c)


# java.sql.Types fallback for a column without mysqlType (binary codes are ambiguous:
# Canal also gives TEXT columns -4, so those stay text).
_SQL_TYPES: dict[int, tuple[str, Any]] = {
    -6: ("int32", int32_text),
    5: ("int32", int32_text),
    4: ("int32", int32_text),
    -5: ("int64", int64_text),
    7: ("float32", _float),
    6: ("float64", _float),
    8: ("float64", _float),
    16: ("boolean", _boolean),
    91: ("date", _date),
    92: ("time", _time),
    93: ("timestamp", _datetime),
}

Spec = tuple[str, Callable[[Any, str], Any] | None]  # (logical type, converter or None)

# Fast converters: one argument, text only, C builtins where their result is exactly the
# careful converter's; any exception sends the row down the careful path (which also
# handles non-text values, zero dates and the error messages).


def _decimal_fast(v: str) -> decimal.Decimal:
    d = decimal.Decimal(v)
    if d.is_finite():
        return d
    raise ValueError(v)


def _datetime_fast(v: str) -> dt.datetime:
    d = dt.datetime.fromisoformat(v)
    if d.tzinfo is None:
        return d
    raise ValueError(v)


_BOOL_TEXT = {"0": False, "1": True}
_FAST: dict[Any, Callable[[str], Any]] = {
    int32_text: int,  # the range is checked after the row (``ranges`` of the table entry)
    int64_text: int,
    _float: float,
    _boolean: _BOOL_TEXT.__getitem__,
    boolean_text: _BOOL_TEXT.__getitem__,
    _date: dt.date.fromisoformat,
    latin1_text: operator.methodcaller("encode", "latin-1"),
    _decimal: _decimal_fast,
    _datetime: _datetime_fast,
}


def _fast(careful: Callable[[Any, str], Any] | None) -> Callable[[str], Any] | None:
    if careful is None or careful is _json:
        return None  # text kept as it is
    fast = _FAST.get(careful)
    return fast if fast is not None else lambda v: careful(v, "")


class CanalJsonDecoder(Decoder[CanalJsonOptions]):
    """Decodes Canal / DTS Canal JSON flat messages. See the module docstring."""

    identifier: ClassVar[str] = IDENTIFIER
    options_class = CanalJsonOptions
    options: CanalJsonOptions

    def __init__(self, options: DecoderOptions | None = None) -> None:
        super().__init__(options)  # Decoder carries plain DecoderOptions over
        self._init_caches()

    def _init_caches(self) -> None:
        o = self.options
        self._zone = zone_option(o.timestamp_zone) if o.timestamp_zone else None
        self._binary = {"latin1": latin1_text, "hex": hex_text, "base64": to_bytes_base64}[
            o.binary_encoding
        ]
        self._specs: dict[str, Spec] = {}
        self._tables: dict[Any, list[Any]] = {}
        self._by_offset = o.id_semantics == ID_BATCH  # the Kafka offset is part of seq

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}  # caches hold closures: rebuilt after unpickling

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._init_caches()

    # -- types ---------------------------------------------------------------------

    def column_spec(self, mysql_type: str) -> Spec:
        """The logical type and value converter for one ``mysqlType`` string.

        Unknown type names keep their text as ``string`` (lossless, never guessed).
        """
        spec = self._specs.get(mysql_type)
        if spec is None:
            spec = self._specs[mysql_type] = self._build_spec(mysql_type)
        return spec

    def _build_spec(self, mysql_type: str) -> Spec:
        o = self.options
        base, args, unsigned, raw_args = parse_mysql_type(mysql_type)
        if base in ("bool", "boolean") or (base == "tinyint" and args == ("1",)):
            if o.tinyint1_as_boolean:
                return "boolean", _boolean
            return "int32", int32_text
        if base in SMALL_INTS or base in INTS or base in BIGINTS or base == "serial":
            return integer_type(base, unsigned)
        if base in FLOATS:  # FLOAT(p) with p > 24 is a DOUBLE
            single = len(args) == 1 and args[0].isdecimal() and int(args[0]) > 24
            return ("float64" if single else "float32"), _float
        if base in DOUBLES:
            return "float64", _float
        if base in DECIMALS:
            p = int(args[0]) if args and args[0].isdecimal() else 10
            s = int(args[1]) if len(args) > 1 and args[1].isdecimal() else 0
            return decimal_type(p, s), _decimal
        if base == "date":
            return "date", _date
        if base == "datetime":
            return "timestamp", _datetime
        if base == "timestamp":
            zone = self._zone
            if zone is None:
                return "timestamp", _datetime
            return "timestamptz", timestamp_text(zone)
        if base == "time":
            return ("string", None) if o.time_as_string else ("time", _time)
        if base == "year":
            return "int32", int32_text
        if base == "bit":
            return bit_type(int(args[0]) if args and args[0].isdecimal() else 1)
        if base in ("enum", "set"):
            make = enum_text if base == "enum" else set_text
            return "string", make(enum_labels(raw_args), o.enum_values == "index")
        if base in BINARIES or base in GEOMETRIES:
            return "binary", self._binary
        if base == "json":
            return "json", _json
        return "string", None  # char, varchar, *text, and unknown names: keep the text

    def _table(self, database: Any, table: Any, mt: Any, st: Any, pks: Any) -> list[Any]:
        """Per-table state for a row message, cached while its header stays the same:
        ``[mysqlType, sqlType, pkNames, source, columns, converters, fast converters,
        key columns, integer ranges]``; the ranges are ``(column, min, max)`` of the
        ``int32``/``int64`` columns, whose fast converter (``int``) does not check them."""
        source = self._source(database, table, rows=True)
        if mt is not None and type(mt) is not dict:
            raise DecodeError(
                "'mysqlType' must be an object of column -> type text", Code.BAD_FIELD
            )
        if st is not None and type(st) is not dict:
            raise DecodeError(
                "'sqlType' must be an object of column -> java.sql.Types code", Code.BAD_FIELD
            )
        if pks is not None and (type(pks) is not list or any(type(k) is not str for k in pks)):
            raise DecodeError("'pkNames' must be an array of column names", Code.BAD_FIELD)
        columns: dict[str, str] = {}
        convs: dict[str, Any] = {}
        for col, text in (mt or {}).items():
            if type(text) is not str:
                raise DecodeError(
                    f"mysqlType of column {col!r} must be a string, not {type(text).__name__}",
                    Code.BAD_FIELD,
                )
            columns[col], convs[col] = self.column_spec(text)
        for col, code in (st or {}).items():
            if col not in columns and type(code) is int and code in _SQL_TYPES:
                columns[col], convs[col] = _SQL_TYPES[code]
        fast = {col: _fast(conv) for col, conv in convs.items()}
        ranges = tuple((col, *INT_RANGES[t]) for col, t in columns.items() if t in INT_RANGES)
        entry = [mt, st, pks, source, columns, convs, fast, tuple(pks) if pks else None, ranges]
        if len(self._tables) > 4096:
            self._tables.clear()
        self._tables[(database, table)] = entry
        return entry

    # -- decode --------------------------------------------------------------------

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one Canal flat message into one event per row (or one DDL/truncate).

        Raises:
            DecodeError: BAD_JSON, NOT_AN_OBJECT, MISSING_FIELD, BAD_FIELD, UNKNOWN_OP,
                BAD_VALUE, MISSING_KEY.
        """
        msg = load_object(record.value, "a Canal message")
        get = msg.get
        typ = get("type")
        es = get("es")
        batch_id = get("id", 0)
        is_ddl = get("isDdl", False)
        if type(es) is not int or type(batch_id) is not int or type(is_ddl) is not bool:
            if es is not None and type(es) is not int:
                raise DecodeError(f"'es' must be epoch milliseconds, not {es!r}", Code.BAD_FIELD)
            if type(batch_id) is not int:
                raise DecodeError(f"'id' must be an integer, not {batch_id!r}", Code.BAD_FIELD)
            if type(is_ddl) is not bool:
                raise DecodeError(f"'isDdl' must be true or false, not {is_ddl!r}", Code.BAD_FIELD)
        if es is not None and not INT64_MIN <= es <= INT64_MAX:
            raise field_range_error(
                "es", es, INT64_MIN, INT64_MAX, "epoch milliseconds; ts_ms is a 64-bit integer"
            )
        gtid = get("gtid")
        txn = Txn(gtid) if gtid and type(gtid) is str else None
        origin = record.origin
        # seq without its row index: (es, id, offset) for Canal batch ids, (es, id) for
        # DTS operation ids (decision 62)
        head = (
            None
            if es is None
            else (es, batch_id, origin.offset)
            if self._by_offset
            else (es, batch_id)
        )
        op = ROW_OPS.get(typ) if type(typ) is str else None
        if op is None:
            if type(typ) is not str:
                raise field_error("type", msg.get("type"), "the operation name, e.g. INSERT")
            return [self._statement(msg, typ, is_ddl, es, head, txn, origin)]
        if is_ddl:
            raise DecodeError(
                f"type {typ} with isDdl true: a row change cannot be DDL", Code.BAD_FIELD
            )
        database, table = get("database"), get("table")
        mt, st, pk_names = get("mysqlType"), get("sqlType"), get("pkNames")
        try:
            entry = self._tables.get((database, table))
        except TypeError:  # unhashable database/table: _table reports it
            entry = None
        if entry is None or mt != entry[0] or st != entry[1] or pk_names != entry[2]:
            entry = self._table(database, table, mt, st, pk_names)
        _, _, _, source, columns, convs, fast, pks, ranges = entry
        fast_get = fast.get
        pk1 = pks[0] if pks is not None and len(pks) == 1 else None
        rows, olds = get("data"), get("old")
        is_delete, is_update = op is _DELETE, op is _UPDATE
        if type(rows) is not list or (olds is not None and type(olds) is not list):
            if is_delete and not rows and olds and type(olds) is list:
                rows, olds = olds, None  # DTS before 2022-03-20: the deleted row is in 'old'
            elif rows is None:
                raise DecodeError(f"{typ} message without 'data' rows", Code.MISSING_FIELD)
            else:
                raise DecodeError("'data' and 'old' must be arrays of row objects", Code.BAD_FIELD)
        elif is_delete and not rows and olds:
            rows, olds = olds, None
        if is_update and olds is not None and len(olds) != len(rows):
            raise DecodeError(
                f"'old' has {len(olds)} entries for {len(rows)} 'data' rows", Code.BAD_FIELD
            )
        events = []
        for i, row in enumerate(rows):
            if type(row) is not dict:
                raise DecodeError(f"row {i} of the message is not an object", Code.BAD_FIELD)
            image = {}
            cols = columns
            try:  # fast path: every value text (or null) and well formed
                for c, v in row.items():
                    if type(v) is str:
                        f = fast_get(c)
                        if f is not None:
                            v = f(v)
                    elif v is not None:
                        raise TypeError
                    image[c] = v
                for c, lo, hi in ranges:
                    v = image.get(c)
                    if v is not None and not lo <= v <= hi:
                        raise ValueError  # the careful path says which column and range
            except Exception:  # noqa: BLE001 - the careful path raises the real error
                image, cols = _image(row, convs, columns)
            key: dict[str, Any] | None
            try:
                if pk1 is not None:
                    key = {pk1: image[pk1]}
                else:
                    key = {k: image[k] for k in pks} if pks is not None else None
            except KeyError:
                key = None
            after: dict[str, Any] | None = image
            before: dict[str, Any] | None = None
            changed = None
            if is_delete:
                before, after = image, None
            elif is_update and olds is not None and olds[i] is not None:
                prior = olds[i]
                if type(prior) is not dict:
                    raise DecodeError(f"'old' entry {i} is not an object", Code.BAD_FIELD)
                prior, cols = _image(prior, convs, cols)
                before = {**image, **prior}
                changed = tuple(prior)
            seq = None if head is None else head + (i,)
            # positional (faster): op source key before after columns seq ts_ms txn ddl
            # changed origin
            event = ChangeEvent(
                op, source, key, before, after, cols, seq, es, txn, None, changed, origin
            )
            if key is None:
                self.require_key(event, pks)  # options' keys, or raises MISSING_KEY
            events.append(event)
        return events

    def _source(self, database: Any, table: Any, rows: bool) -> SourceTable:
        if not rows:  # a DDL may concern a whole database (CREATE DATABASE): no table
            database = "" if database is None else database
            table = "" if table is None else table
        if type(database) is not str or type(table) is not str:
            name, value = ("database", database) if type(database) is not str else ("table", table)
            raise field_error(name, value, "a string")
        return SourceTable(IDENTIFIER, database, "", table)

    def _statement(
        self,
        msg: dict[str, Any],
        typ: str,
        is_ddl: bool,
        es: int | None,
        head: tuple[int, ...] | None,
        txn: Txn | None,
        origin: Origin,
    ) -> ChangeEvent:
        """A DDL, truncate or statement message: one event without rows or key."""
        source = self._source(msg.get("database"), msg.get("table"), rows=False)
        sql = msg.get("sql")
        if sql is not None and type(sql) is not str:
            raise DecodeError("'sql' must be the statement text", Code.BAD_FIELD)
        if typ == TYPE_TRUNCATE:
            op = Op.TRUNCATE
        elif typ in _DDL_TYPES or (typ == TYPE_QUERY and is_ddl):
            op = Op.DDL
            if sql is None:
                raise DecodeError(f"{typ} message without 'sql'", Code.MISSING_FIELD)
        elif typ == TYPE_QUERY:
            raise DecodeError(
                "QUERY with isDdl false is a statement-based change that "
                "cannot be decoded into rows; set binlog_format=ROW on the "
                "source",
                Code.UNKNOWN_OP,
            )
        else:
            raise DecodeError(
                f"unknown Canal type {typ!r}; known: "
                f"{sorted([*ROW_OPS, TYPE_TRUNCATE, TYPE_QUERY, *_DDL_TYPES])}",
                Code.UNKNOWN_OP,
            )
        meta: dict[str, Any] = {"type": typ}
        if "ts" in msg:
            meta["ts"] = msg["ts"]
        return ChangeEvent(
            op,
            source,
            seq=None if head is None else (*head, 0),
            ts_ms=es,
            txn=txn,
            ddl=sql if op is Op.DDL else (sql or None),
            origin=origin,
            meta=meta,
        )


def _image(
    row: dict[str, Any], convs: dict[str, Any], columns: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Typed row image (the careful path) and the event's declared types.

    A column without a declared type keeps its JSON scalar; an object or array there
    becomes JSON text, declared ``json`` in a copy of ``columns`` (``columns`` itself is
    returned when there is none).
    """
    out = {}
    for c, v in row.items():
        if v is not None:
            f = convs.get(c)
            if f is not None:
                v = f(v, c)
            elif type(v) is not str and c in convs:
                v = _text(v, c)
            elif type(v) is dict or type(v) is list:
                v = json_text(v, c)
                if columns.get(c) != "json":
                    columns = {**columns, c: "json"}
        out[c] = v
    return out, columns

"""Huawei Cloud DRS "synchronize to Kafka" JSON and JSON-C (``drs-json``, ``drs-json-c``).

Source document: *Kafka Message Format* of Huawei Cloud Data Replication Service
(``https://support.huaweicloud.com/intl/en-us/realtimesyn-drs/drs_03_0052.html``, updated 2023-01-05), MySQL to Kafka.
A message is one Canal-like flat object::

    {"mysqlType": {col: "int", ...}, "sqlType": {col: 4, ...}, "id": 27677,
     "es": 1624614713000, "ts": 1625058726990, "database": "test01", "table": "test ",
     "type": "UPDATE", "isDdl": false, "sql": "", "data": [{col: "text"}],
     "old": [{col: "text"}], "pkNames": ["id"]}

Every column value is text (or ``null``). The two variants differ in two points only
(the document's JSON-C section):

* **DELETE** -- JSON puts the deleted row in ``old``; JSON-C puts it in ``data``.
* **timestamp columns** -- JSON writes epoch seconds (``"1624614713.201"``); JSON-C writes
  ``yyyy-mm-dd hh:mm:ss`` text, read in :attr:`DrsJsonOptions.timestamp_zone`.

Decoding rules (the full table is in ``docs/formats/drs-json.md``):

* ``seq`` is ``(id, row)``: ``id`` is DRS's monotonic event sequence number, ``row`` the
  0-based index of the row inside ``data`` (one message may carry several rows).
* ``ts_ms`` is ``es`` (source time, epoch ms). ``ts`` (Kafka write time) is not kept: the
  Kafka record timestamp carries the same information.
* ``table`` (and ``database``) are stripped: the document's example has ``"test "``, and
  MySQL names cannot end with a space.
* The key is ``pkNames`` read from the after image (the before image for deletes); an
  update that changes the key keeps the old key in ``before`` and, when it differs, in
  ``meta["old_key"]``. A table without ``pkNames`` needs ``primary_keys`` in the options,
  else its rows are ``MISSING_KEY`` dead letters.
* ``columns`` of the events of one table is one shared dict: treat it as read-only.
* Column types come from ``mysqlType`` (type names, possibly with ``(p,s)``), falling back
  to ``sqlType`` (JDBC numbers; DRS writes 93 for MySQL ``timestamp`` and 94 for
  ``datetime``). Binary values are a Java byte-array text (``"[106, -3]"``), decimals are
  exact, ``float``/``double`` text such as ``"1.2510357E7"`` is read as a float.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from cdcflow.errors import Code, DecodeError
from cdcflow.formats.base import (
    Decoder,
    DecoderOptions,
    Record,
    is_full_row,
)
from cdcflow.formats.common.json_object import load_object
from cdcflow.formats.common.mysql_types import DECIMALS, TEXTS, parse_mysql_type
from cdcflow.formats.common.mysql_values import (
    bit_type,
    boolean_text,
    date_text,
    datetime_text,
    decimal_text,
    integer_type,
    time_text,
    timestamp_text,
)
from cdcflow.formats.common.values import bad_value, int32_text, int64_text, int_text
from cdcflow.formats.common.zones import zone_option
from cdcflow.model import ChangeEvent, Op, SourceTable
from cdcflow.types import (
    INT64_MAX,
    INT64_MIN,
    INT_RANGES,
    field_range_error,
    int_range_error,
    json_text,
    to_float,
)

__all__ = [
    "DrsJsonCDecoder",
    "DrsJsonDecoder",
    "DrsJsonOptions",
]

IDENTIFIER_JSON = "drs-json"
IDENTIFIER_JSON_C = "drs-json-c"

# --------------------------------------------------------------------------- op codes
# Values of ``type``, case-sensitive as DRS writes them.

OP_INSERT = "INSERT"  # row inserted (incremental synchronization)
OP_UPDATE = "UPDATE"  # row updated: new row in data, old row in old
OP_DELETE = "DELETE"  # row deleted: in old (JSON) or in data (JSON-C)
OP_INIT = "INIT"  # row read by the full (initial) synchronization (later doc versions)
OP_DDL = "DDL"  # schema change; the statement is in sql, isDdl is true
OP_INIT_DDL = "INIT_DDL"  # table definition sent by the full synchronization
OP_TRUNCATE = "TRUNCATE"  # not in the DRS document; Canal's name, which DRS's JSON follows

_INSERT, _UPDATE, _DELETE, _SNAPSHOT = 0, 1, 2, 3
_ROW_OPS: dict[str, int] = {
    OP_INSERT: _INSERT,
    OP_UPDATE: _UPDATE,
    OP_DELETE: _DELETE,
    OP_INIT: _SNAPSHOT,
}
_ROW_OP_ENUM = (Op.INSERT, Op.UPDATE, Op.DELETE, Op.SNAPSHOT)
_DDL_OPS = frozenset({OP_DDL, OP_INIT_DDL})
#: a DDL statement that empties a table is a truncate, not a schema change
_TRUNCATE_SQL = re.compile(r"\s*truncate\s", re.IGNORECASE)

# --------------------------------------------------------------------------- values

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)


def _float(value: Any, column: str) -> float:
    if value.__class__ is str:
        try:
            return float(value)  # "1.2510357E7", "NaN", "Infinity" as Java writes them
        except ValueError:
            pass
    if value.__class__ is bool:
        raise bad_value(column, value, "floating-point number")
    result = to_float(value, column)
    assert result is not None
    return result


def _bytes(value: Any, column: str) -> bytes:
    """Java ``Arrays.toString(byte[])`` text -> bytes: ``"[106, -3]"`` -> ``b"j\\xfd"``."""
    if value.__class__ is str and value[:1] == "[":
        try:
            numbers = orjson.loads(value)  # a JSON array of integers: parsed in C
        except orjson.JSONDecodeError:
            numbers = None
        if numbers.__class__ is list:
            try:
                return bytes(numbers)  # every number in 0..255
            except (ValueError, TypeError):
                if all(n.__class__ is int and -128 <= n <= 255 for n in numbers):
                    return bytes(n & 0xFF for n in numbers)  # Java's signed bytes
    raise bad_value(column, value, "byte list such as [106, 103]")


_decimal, _bool, _date, _time, _datetime = (
    decimal_text,
    boolean_text,
    date_text,
    time_text,
    datetime_text,
)


class _Timestamp:
    """MySQL ``timestamp`` -> aware UTC datetime, exact to the microsecond.

    Epoch-seconds text (``"1624614713.201"``, DRS JSON) is split at the dot and added as
    integers, never through a float. Date-time text (``"2021-06-25 17:51:53"``, DRS JSON-C)
    is a wall clock in ``zone`` (:class:`~cdcflow.formats.common.mysql_values.timestamp_text`:
    an offset in the text is kept, a zero date is NULL). Epoch 0 is MySQL's zero
    timestamp and becomes NULL (1970-01-01 00:00:00 UTC is outside MySQL's range).
    """

    __slots__ = ("text", "zone")

    def __init__(self, zone: dt.tzinfo) -> None:
        self.zone = zone
        self.text = timestamp_text(zone)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Timestamp, (self.zone,))

    def __call__(self, value: Any, column: str) -> dt.datetime | None:
        if value.__class__ is str:
            secs, dot, frac = value.partition(".")
            negative = secs[:1] == "-"
            digits = secs[1:] if negative else secs
            if digits.isdigit() and digits.isascii():
                if not dot or (frac.isdigit() and frac.isascii() and len(frac) <= 9):
                    if frac[6:].strip("0"):
                        raise bad_value(column, value, "timestamp (sub-microsecond digits)")
                    micros = int(digits) * 1_000_000 + (int(frac[:6].ljust(6, "0")) if frac else 0)
                    if micros == 0:
                        return None  # MySQL's zero timestamp
                    try:
                        return _EPOCH + (-micros if negative else micros) * _MICROSECOND
                    except OverflowError:
                        raise bad_value(column, value, "timestamp (epoch seconds)") from None
            else:
                return self.text(value, column)  # zero dates, offsets: mysql_values
        raise bad_value(column, value, "timestamp (epoch seconds or yyyy-mm-dd hh:mm:ss)")


# --------------------------------------------------------------------------- types
# MySQL type name (lower case, without length and attributes) -> (logical type, converter).
# A converter of None means the text is kept as it is (string columns).

Converter = Callable[[Any, str], Any]
_TZ = object()  # placeholder for the zone-dependent timestamp converter

_MYSQL_TYPES: dict[str, tuple[str | None, Any]] = {
    "tinyint": ("int32", int32_text),
    "smallint": ("int32", int32_text),
    "mediumint": ("int32", int32_text),
    "int": ("int32", int32_text),
    "integer": ("int32", int32_text),
    "bigint": ("int64", int64_text),
    "year": ("int32", int32_text),
    # DRS prints type names without lengths (its document: "decimal", "varchar"), so a
    # bare "bit" may be BIT(8): its number, int64; "bit(n)" follows mysql_values.bit_type
    "bit": ("int64", int64_text),
    "bool": ("boolean", _bool),
    "boolean": ("boolean", _bool),
    "float": ("float32", _float),
    "double": ("float64", _float),
    "real": ("float64", _float),
    "double precision": ("float64", _float),
    # precision and scale only when the type name has them
    **dict.fromkeys(DECIMALS, (None, _decimal)),
    **dict.fromkeys(TEXTS, ("string", None)),
    "json": ("json", None),
    "binary": ("binary", _bytes),
    "varbinary": ("binary", _bytes),
    "tinyblob": ("binary", _bytes),
    "blob": ("binary", _bytes),
    "mediumblob": ("binary", _bytes),
    "longblob": ("binary", _bytes),
    "date": ("date", _date),
    "time": ("time", _time),
    "datetime": ("timestamp", _datetime),
    "timestamp": ("timestamptz", _TZ),
}

#: JDBC type number (``sqlType``) -> MySQL type name, used when ``mysqlType`` lacks a
#: column. DRS writes 93 (TIMESTAMP) for MySQL timestamp and 94 for datetime.
# fmt: off
_JDBC_TYPES: dict[int, str] = {
    -7: "bit", -6: "tinyint", 5: "smallint", 4: "int", -5: "bigint", 16: "boolean",
    6: "float", 7: "float", 8: "double", 2: "decimal", 3: "decimal",
    1: "char", 12: "varchar", -1: "text", -15: "char", -9: "varchar", -16: "text",
    2005: "text", 2011: "text", -2: "binary", -3: "varbinary", -4: "blob", 2004: "blob",
    91: "date", 92: "time", 93: "timestamp", 94: "datetime",
}
# fmt: on


def mysql_column(
    type_name: Any, jdbc_type: Any, zone: dt.tzinfo
) -> tuple[str | None, Converter | None]:
    """The logical type and value converter of one DRS column.

    Shared by ``drs-json``, ``drs-json-c`` and ``drs-avro`` (same vendor, same value texts).

    Args:
        type_name: the MySQL type (``"int"``, ``"decimal(10,2)"``, ``"int unsigned"``) or
            ``None``.
        jdbc_type: the JDBC type number, used when ``type_name`` is ``None``.
        zone: the zone of timestamp text without an offset.

    Returns:
        ``(logical type or None, converter or None)``; ``None`` type: not declared (an
        unknown type, or a decimal without precision); ``None`` converter: keep the value.
    """
    base: str | None = None
    args: tuple[str, ...] = ()
    unsigned = False
    if type_name.__class__ is str:
        base, args, unsigned, _ = parse_mysql_type(type_name)
    if base is None or base not in _MYSQL_TYPES:
        if jdbc_type.__class__ is int and jdbc_type in _JDBC_TYPES:
            base, args, unsigned = _JDBC_TYPES[jdbc_type], (), False
        else:
            return None, None
    logical, conv = _MYSQL_TYPES[base]
    if conv is _TZ:
        conv = _Timestamp(zone)
    if conv is _decimal:
        if args and all(p.isdigit() for p in args) and len(args) <= 2:
            scale = int(args[1]) if len(args) == 2 else 0
            logical = f"decimal({max(int(args[0]), scale, 1)},{scale})"
    elif unsigned and base in ("int", "integer", "bigint"):
        logical, conv = integer_type(base, unsigned)
    elif base == "bit" and args and args[0].isdecimal():
        logical, conv = bit_type(int(args[0]))
    elif base == "tinyint" and args == ("1",) and jdbc_type in (-7, 16):
        logical, conv = "boolean", _bool
    return logical, conv


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class DrsJsonOptions(DecoderOptions):
    """Options of the ``drs-json`` and ``drs-json-c`` decoders.

    Attributes:
        primary_keys: key columns for tables whose messages have no ``pkNames`` (see
            :class:`DecoderOptions`); without either, rows are ``MISSING_KEY`` dead letters.
        timestamp_zone: zone of MySQL ``timestamp`` values written as text without an
            offset (always in JSON-C; never in DRS JSON, which writes epoch seconds).
            ``"UTC"`` (default), an offset such as ``"+08:00"``, or an IANA name. DRS
            renders the text in the zone of its task, which the message does not say.
    """

    timestamp_zone: str = "UTC"


# --------------------------------------------------------------------------- decoder

_MISSING = object()
_CACHE_MAX = 4096
_STRING_TYPES = ("string", "json")


class _Table:
    """What the decoder remembers about one ``(database, table)`` of the messages: its
    :class:`SourceTable`, and the column plan built from the last type maps it saw."""

    __slots__ = (
        "columns",
        "convs",
        "ints",
        "mysql_type",
        "pk",
        "source",
        "sql_type",
        "strings",
        "typed",
        "typed_by_mysql",
    )

    def __init__(self, source: SourceTable) -> None:
        self.source = source
        self.mysql_type: Any = _MISSING
        self.sql_type: Any = _MISSING
        self.columns: dict[str, str] = {}
        #: integer columns as (column, min, max), string columns (both converted inline:
        #: the common cases), and (column, converter) for every other typed column
        self.ints: tuple[tuple[str, int, int], ...] = ()
        self.strings: tuple[str, ...] = ()
        self.convs: tuple[tuple[str, Converter], ...] = ()
        #: the columns above: a value of any other column is kept as it is, but for an
        #: object or array, which becomes JSON text (``_json_values``)
        self.typed: frozenset[str] = frozenset()
        self.pk: Any = _MISSING
        #: every column of sqlType is also in mysqlType, so sqlType changes nothing
        self.typed_by_mysql = False


def _typed(row: dict[str, Any], entry: _Table) -> None:
    """Replace the text values of ``row`` by typed values, in place (the hot path)."""
    for col, lo, hi in entry.ints:
        value = row.get(col)
        if value is not None:
            if value.__class__ is str:
                try:
                    n = int(value)
                except ValueError:
                    n = int_text(value, col)
            else:
                n = int_text(value, col)
            if not lo <= n <= hi:
                raise int_range_error(col, n, entry.columns[col])
            row[col] = n
    for col in entry.strings:
        value = row.get(col)
        if value is not None and value.__class__ is not str:
            raise bad_value(col, value, "string")
    for col, conv in entry.convs:
        value = row.get(col)
        if value is not None:
            row[col] = conv(value, col)


def _json_values(
    row: dict[str, Any], typed: frozenset[str], columns: dict[str, str]
) -> dict[str, str]:
    """Turn objects and arrays of columns without a declared type into JSON text, in
    place; return ``columns``, or a copy that declares those columns ``json``."""
    for col, value in row.items():
        if (value.__class__ is dict or value.__class__ is list) and col not in typed:
            row[col] = json_text(value, col)
            if columns.get(col) != "json":
                columns = {**columns, col: "json"}
    return columns


class _DrsJsonDecoderBase(Decoder[DrsJsonOptions]):
    """Shared implementation; ``_json_c`` selects the JSON-C rules."""

    options_class = DrsJsonOptions
    _json_c: ClassVar[bool] = False

    def __init__(self, options: DrsJsonOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._zone = zone_option(getattr(self.options, "timestamp_zone", "UTC"))
        self._tables: dict[tuple[Any, Any], _Table] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tables"] = {}  # a cache: rebuilt on the executor
        return state

    # -- per-table cache ---------------------------------------------------------------

    def _table(self, database: Any, table: Any) -> _Table:
        if database is None:
            database = ""
        if database.__class__ is not str or table.__class__ is not str:
            raise DecodeError(
                f"'database' and 'table' must be strings, got {database!r} and {table!r}",
                Code.BAD_FIELD,
            )
        entry = _Table(SourceTable(self.identifier, database.strip(), "", table.strip()))
        if len(self._tables) >= _CACHE_MAX:
            self._tables.clear()
        self._tables[(database, table)] = entry
        return entry

    def _replan(self, entry: _Table, mysql_type: Any, sql_type: Any) -> None:
        """Build the declared types and converters from the message's type maps."""
        mt = mysql_type if mysql_type.__class__ is dict else {}
        st = sql_type if sql_type.__class__ is dict else {}
        columns: dict[str, str] = {}
        ints: list[tuple[str, int, int]] = []
        strings: list[str] = []
        convs: list[tuple[str, Converter]] = []
        for name in {**st, **mt}:
            logical, conv = mysql_column(mt.get(name), st.get(name), self._zone)
            if logical is not None:
                columns[name] = logical
            if conv is int32_text or conv is int64_text:
                assert logical is not None  # mysql_column gives these with int32 or int64
                lo, hi = INT_RANGES[logical]
                ints.append((name, lo, hi))
            elif conv is not None:
                convs.append((name, conv))
            elif logical in _STRING_TYPES:
                strings.append(name)
        entry.columns, entry.ints, entry.strings = columns, tuple(ints), tuple(strings)
        entry.convs = tuple(convs)
        entry.typed = frozenset([*(c for c, _, _ in ints), *strings, *(c for c, _ in convs)])
        entry.mysql_type, entry.sql_type = mysql_type, sql_type
        entry.typed_by_mysql = bool(mt) and all(name in mt for name in st)

    @staticmethod
    def _check_pk(entry: _Table, pk: Any) -> None:
        if pk is not None and (pk.__class__ is not list or not all(c.__class__ is str for c in pk)):
            raise DecodeError(
                f"'pkNames' must be a list of column names, got {pk!r}", Code.BAD_FIELD
            )
        entry.pk = pk

    # -- decode ------------------------------------------------------------------------

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one DRS JSON (or JSON-C) message into one event per row.

        Raises:
            DecodeError: BAD_JSON, NOT_AN_OBJECT, MISSING_FIELD, BAD_FIELD, UNKNOWN_OP,
                MISSING_KEY or BAD_VALUE (see ``docs/formats/drs-json.md``).
        """
        msg = load_object(record.value, "a DRS message")
        get = msg.get
        typ = get("type")
        seq_id = get("id")
        ts_ms = get("es")
        kind = _ROW_OPS.get(typ) if typ.__class__ is str else None
        if (
            kind is None
            or seq_id.__class__ is not int
            or (ts_ms is not None and (ts_ms.__class__ is not int or ts_ms > INT64_MAX))
            or "table" not in msg
        ):
            return [self._other(msg, record)]
        database, table = get("database"), get("table")
        try:
            entry = self._tables[(database, table)]
        except (KeyError, TypeError):
            entry = self._table(database, table)
        source = entry.source
        if not source.table:
            raise DecodeError(f"{typ} message without a table name", Code.MISSING_FIELD)
        if get("isDdl") is True:
            raise DecodeError(f"'isDdl' is true but 'type' is {typ}", Code.BAD_FIELD)

        olds = None
        if kind == _DELETE:
            field = "data" if self._json_c else "old"
            rows = get(field)
            if not rows and get("old" if self._json_c else "data"):
                raise DecodeError(
                    f"DELETE with no row in {field!r} but one in the other field: that is "
                    f"DRS {'JSON' if self._json_c else 'JSON-C'}; decode this topic with "
                    f"format {IDENTIFIER_JSON if self._json_c else IDENTIFIER_JSON_C}",
                    Code.MISSING_FIELD,
                )
        else:
            field = "data"
            rows = get("data")
        if rows.__class__ is not list:
            if rows is None:
                raise DecodeError(f"{typ} message has no {field!r} rows", Code.MISSING_FIELD)
            raise DecodeError(f"{field!r} must be a JSON array of rows", Code.BAD_FIELD)
        if kind == _UPDATE:
            olds = get("old")
            if olds is not None and (olds.__class__ is not list or len(olds) != len(rows)):
                raise DecodeError(
                    "'old' must be an array with one row per row of 'data'", Code.BAD_FIELD
                )

        mysql_type = get("mysqlType")
        if entry.mysql_type != mysql_type or not entry.typed_by_mysql:
            sql_type = get("sqlType")
            if entry.mysql_type != mysql_type or entry.sql_type != sql_type:
                self._replan(entry, mysql_type, sql_type)
        pk = get("pkNames")
        if pk != entry.pk:
            self._check_pk(entry, pk)
        columns = entry.columns
        typed = entry.typed
        op = _ROW_OP_ENUM[kind]
        origin = record.origin
        events = []
        for i, row in enumerate(rows):
            if row.__class__ is not dict:
                raise DecodeError(f"row {i} of {field!r} is not a JSON object", Code.BAD_FIELD)
            _typed(row, entry)
            cols = columns if typed.issuperset(row) else _json_values(row, typed, columns)
            if kind == _DELETE:
                before, after = row, None
            else:
                before, after = None, row
                if olds is not None:
                    before = olds[i]
                    if before is not None:
                        if before.__class__ is not dict:
                            raise DecodeError(
                                f"row {i} of 'old' is not a JSON object", Code.BAD_FIELD
                            )
                        _typed(before, entry)
                        if not typed.issuperset(before):
                            cols = _json_values(before, typed, cols)
            # positional arguments (hot path); ``columns`` is shared by the table's events
            event = ChangeEvent(
                op,
                source,
                None,
                before,
                after,
                cols,
                (seq_id, i),
                ts_ms,
                None,
                None,
                None,
                origin,
                None,
            )
            if pk:
                try:
                    event.key = {pk[0]: row[pk[0]]} if len(pk) == 1 else {c: row[c] for c in pk}
                except KeyError as exc:
                    raise DecodeError(
                        f"key column {exc.args[0]!r} (pkNames) is missing from row {i} of "
                        f"{source.qualified_name!r}",
                        Code.MISSING_KEY,
                    ) from None
            else:
                self.require_key(event, None)
            if before is not None and after is not None and not is_full_row(event):
                self._old_key(event, before)
            events.append(event)
        return events

    @staticmethod
    def _old_key(event: ChangeEvent, before: dict[str, Any]) -> None:
        """``meta["old_key"]``: the before image's key, when an update changed the key."""
        key = event.key
        assert key is not None
        old_key = {}
        for c in key:
            v = before.get(c, _MISSING)
            if v is _MISSING:
                return  # the before image does not say: the key did not change
            old_key[c] = v
        if old_key != key:
            event.meta = {"old_key": old_key}

    def _other(self, msg: dict[str, Any], record: Record) -> ChangeEvent:
        """Everything but a well-formed row message: DDL, truncate, or the error."""
        typ = msg.get("type", _MISSING)
        if typ is _MISSING or typ is None:
            raise DecodeError("no 'type' field: not a DRS JSON message", Code.MISSING_FIELD)
        if typ.__class__ is not str:
            raise DecodeError(f"'type' must be a string, got {typ!r}", Code.BAD_FIELD)
        seq_id = msg.get("id")
        if seq_id.__class__ is not int:
            if seq_id is None:
                raise DecodeError("no 'id' (DRS event sequence number)", Code.MISSING_FIELD)
            raise DecodeError(f"'id' must be an integer, got {seq_id!r}", Code.BAD_FIELD)
        ts_ms = msg.get("es")
        if ts_ms is not None and ts_ms.__class__ is not int:
            raise DecodeError(f"'es' must be epoch milliseconds, got {ts_ms!r}", Code.BAD_FIELD)
        if ts_ms is not None and not INT64_MIN <= ts_ms <= INT64_MAX:
            raise field_range_error(
                "es", ts_ms, INT64_MIN, INT64_MAX, "epoch milliseconds; ts_ms is a 64-bit integer"
            )
        if "table" not in msg:
            raise DecodeError("no 'table' field", Code.MISSING_FIELD)
        if typ in _ROW_OPS:  # pragma: no cover - a row message never gets here
            raise AssertionError(typ)
        if not (typ in _DDL_OPS or typ == OP_TRUNCATE or msg.get("isDdl") is True):
            raise DecodeError(
                f"unknown DRS operation type {typ!r}; known: "
                f"{sorted([*_ROW_OPS, *_DDL_OPS, OP_TRUNCATE])}",
                Code.UNKNOWN_OP,
            )
        table = msg.get("table")
        database = msg.get("database")
        try:
            source = self._tables[(database, table)].source
        except (KeyError, TypeError):
            source = self._table(database, "" if table is None else table).source
        sql = msg.get("sql")
        if sql is not None and sql.__class__ is not str:
            raise DecodeError("'sql' must be a string", Code.BAD_FIELD)
        op = Op.DDL
        if typ == OP_TRUNCATE or (sql and _TRUNCATE_SQL.match(sql)):
            op = Op.TRUNCATE
        meta = None if typ == OP_DDL else {"type": typ}
        return ChangeEvent(
            op=op,
            source=source,
            seq=(seq_id, 0),
            ts_ms=ts_ms,
            ddl=sql or None,
            origin=record.origin,
            meta=meta,
        )


class DrsJsonDecoder(_DrsJsonDecoderBase):
    """Decoder of DRS JSON (``drs-json``): a DELETE's row is in ``old``."""

    identifier: ClassVar[str] = IDENTIFIER_JSON
    _json_c: ClassVar[bool] = False


class DrsJsonCDecoder(_DrsJsonDecoderBase):
    """Decoder of DRS JSON-C (``drs-json-c``): a DELETE's row is in ``data``; timestamps
    are ``yyyy-mm-dd hh:mm:ss`` text in ``timestamp_zone``."""

    identifier: ClassVar[str] = IDENTIFIER_JSON_C
    _json_c: ClassVar[bool] = True

"""Alibaba Cloud DTS Avro (``dts-avro``): the default format DTS writes to Kafka.

Each Kafka value is one *schemaless* Avro datum of ``com.alibaba.dts.formats.avro.Record``
(no object-container header, no schema-registry prefix). The schema ships with this
package (``dts_avro_schema/*.avsc``, verbatim from ``aliyun/aliyun-dts-subscribe-demo``
``python/dts_record_avsc``) and is parsed once per process.

Sources: the DTS document "Data formats of a Kafka cluster" ("DDL statements are of the
String type"), the Record schema and its doc strings, and the reference reader in
``aliyun/aliyun-dts-subscribe-sdk-java`` (``AvroRecordParser``,
``DefaultValueDeserializer``, ``UnixTimestamp``, ``ObjectNameUtils``). See
``docs/formats/dts-avro.md`` for the full mapping and what is not supported.

Rules in short:

* ``operation`` -> :class:`~cdcflow.model.Op` through :data:`OPERATIONS`; ``ROLLBACK``,
  ``ABORT`` and the operations whose meaning is not published are ``UNKNOWN_OP``.
* ``objectName`` ``db.table`` or ``db.schema.table`` (a ``.`` inside a name is escaped as
  ``\\u002E``) -> ``source``.
* ``fields[i]`` names the column of ``beforeImages[i]`` / ``afterImages[i]``. Avro ``null``
  and ``EmptyObject.NULL`` are SQL NULL; ``EmptyObject.NONE`` ("placeholder without
  meaning" in the SDK) means the value is not carried: the column is left out of the image.
* ``seq`` is ``(id,)``; ``ts_ms`` is ``sourceTimestamp`` (seconds) x 1000; ``txn`` is
  ``sourceTxid``; keys come from the ``pk_uk_info`` tag, else the options.
"""

from __future__ import annotations

import codecs
import datetime as dt
import decimal
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any, ClassVar

import fastavro
import orjson

from cdcflow.errors import Code, DecodeError, SkipReason
from cdcflow.formats.base import (
    Decoder,
    DecoderOptions,
    Record,
    SkipRecord,
    key_columns_for,
)
from cdcflow.formats.common.mysql_values import zero_date_parts
from cdcflow.formats.common.values import bad_value
from cdcflow.formats.common.zones import parse_zone
from cdcflow.model import ROW_OPS, ChangeEvent, Op, SourceTable, Txn
from cdcflow.types import EPOCH, decimal_type, field_range_error, infer_type

__all__ = ["DtsAvroDecoder", "DtsAvroOptions", "OPERATIONS", "record_schema"]

IDENTIFIER = "dts-avro"
NAMESPACE = "com.alibaba.dts.formats.avro."

# --------------------------------------------------------------------------- operations
# Record.operation (enum Operation) -> what cdcflow makes of it.
OPERATIONS: dict[str, Op] = {
    "INSERT": Op.INSERT,
    "UPDATE": Op.UPDATE,
    "DELETE": Op.DELETE,
    "DDL": Op.DDL,  # the statement is the string in afterImages
    "BEGIN": Op.BEGIN,  # transaction start marker
    "COMMIT": Op.COMMIT,  # transaction end marker
    "HEARTBEAT": Op.HEARTBEAT,  # liveness record carrying a source time and position
    "CHECKPOINT": Op.HEARTBEAT,  # a position marker without a change: progress only
    # Canal JSON from DTS uses INIT for rows of the full (initial) load; a DTS Avro record
    # with INIT and an after image is read the same way (documented inference).
    "INIT": Op.SNAPSHOT,
}
#: Operations that are deliberately not applied: the record is skipped with this reason.
SKIPPED_OPERATIONS: dict[str, SkipReason] = {
    "NOOP": SkipReason.DTS_NOOP,  # explicitly a no-operation record
}
# Every other symbol of the enum -- ROLLBACK and ABORT (cdcflow cannot undo rows already
# applied), COMMAND and RDB (Redis/MongoDB records, not rows), FILL, FINISH, CONTROL (no
# published meaning) -- is dead-lettered as UNKNOWN_OP, never guessed.

# --------------------------------------------------------------------------- schema

_SCHEMA_FOLDER = "dts_avro_schema"  # package data beside this module
#: The .avsc files, named types before the types that reference them, Record last.
_SCHEMA_TYPES = (
    "Integer",
    "Character",
    "Decimal",
    "Float",
    "Timestamp",
    "DateTime",
    "TimestampWithTimeZone",
    "BinaryGeometry",
    "TextGeometry",
    "BinaryObject",
    "TextObject",
    "EmptyObject",
    "Field",
    "Record",
)


@cache
def record_schema() -> Any:
    """The parsed ``com.alibaba.dts.formats.avro.Record`` schema (parsed once, cached).

    Raises:
        FileNotFoundError: the package was installed without its ``.avsc`` data files.
    """
    folder = resources.files("cdcflow.formats").joinpath(_SCHEMA_FOLDER)
    named: dict[str, Any] = {}
    parsed: Any = None
    for name in _SCHEMA_TYPES:
        text = folder.joinpath(f"{NAMESPACE}{name}.avsc").read_text(encoding="utf-8")
        parsed = fastavro.parse_schema(orjson.loads(text), named_schemas=named)
    return parsed


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class DtsAvroOptions(DecoderOptions):
    """Options of the ``dts-avro`` decoder.

    Attributes:
        primary_keys: key columns for tables whose records carry no ``pk_uk_info`` tag
            (see :class:`~cdcflow.formats.base.DecoderOptions`). A primary key named by
            the tag always wins.
        use_unique_key: when a record names no primary key and ``primary_keys`` has none
            for the table, use the first unique key of ``pk_uk_info`` as the row
            identity (default ``True``).
    """

    use_unique_key: bool = True


# --------------------------------------------------------------------------- helpers


def _bad_field(message: str) -> DecodeError:
    return DecodeError(message, Code.BAD_FIELD)


#: ``sourceTimestamp`` is epoch seconds (an Avro long): ``ts_ms`` (x 1000) must fit 64 bits
_TS_S_MIN, _TS_S_MAX = -(2**63 // 1000), (2**63 - 1) // 1000


#: MySQL / Oracle charset names -> Python codec names (from the SDK's JDKCharsetMapper
#: plus the Oracle names); anything else goes through :func:`codecs.lookup`.
_CHARSETS = {
    "utf8": "utf-8",
    "utf8mb3": "utf-8",
    "utf8mb4": "utf-8",
    "al32utf8": "utf-8",
    "ascii": "ascii",
    "us7ascii": "ascii",
    "latin1": "cp1252",
    "latin2": "iso8859-2",
    "latin5": "iso8859-9",
    "latin7": "iso8859-13",
    "greek": "iso8859-7",
    "hebrew": "iso8859-8",
    "gbk": "gbk",
    "zhs16gbk": "gbk",
    "gb2312": "gb2312",
    "gb18030": "gb18030",
    "big5": "big5",
    "sjis": "shift_jis",
    "cp932": "cp932",
    "ujis": "euc_jp",
    "eucjpms": "euc_jp",
    "euckr": "euc_kr",
    "koi8r": "koi8-r",
    "koi8u": "koi8-u",
    "cp1250": "cp1250",
    "cp1251": "cp1251",
    "cp1256": "cp1256",
    "cp1257": "cp1257",
    "cp850": "cp850",
    "cp852": "cp852",
    "cp866": "cp866",
    "tis620": "tis-620",
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "al16utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
    "we8iso8859p1": "latin-1",
    "we8mswin1252": "cp1252",
    "": "utf-8",
}


@lru_cache(maxsize=256)
def _codec(charset: str) -> str | None:
    """Python codec for a source charset name, ``None`` when unknown."""
    name = _CHARSETS.get(charset.lower())
    if name is not None:
        return name
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return None


def _split_object_name(name: str) -> tuple[str, str, str]:
    """``db.table`` -> (db, "", table); ``db.schema.table`` -> (db, schema, table)."""
    parts = [p.replace("\\u002E", ".") for p in name.split(".")]
    if len(parts) == 1:
        return parts[0], "", ""
    if len(parts) == 2:
        return parts[0], "", parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    raise _bad_field(f"objectName {name!r} has more than three dot-separated parts")


@lru_cache(maxsize=4096)
def _key_info(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``pk_uk_info`` tag -> (primary key columns, first unique key columns)."""
    try:
        info = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise _bad_field(f"tag pk_uk_info is not JSON: {text[:80]!r}") from exc
    if not isinstance(info, dict):
        raise _bad_field(f"tag pk_uk_info is not a JSON object: {text[:80]!r}")
    primary: tuple[str, ...] = ()
    unique: tuple[str, ...] = ()
    for name, cols in info.items():
        if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols):
            raise _bad_field(f"tag pk_uk_info: index {name!r} is not a list of column names")
        if name == "PRIMARY":
            primary = tuple(cols)
        elif not unique and cols:
            unique = tuple(cols)
    return primary, unique


# MySQL binlog column type codes (dataTypeNumber for MySQL-family sources) whose logical
# type is certain; used only to type a column whose value is NULL in this record.
_MYSQL_NULL_TYPES = {
    1: "int64",  # TINY       (all integers arrive as Integer records -> int64)
    2: "int64",  # SHORT
    3: "int64",  # LONG
    8: "int64",  # LONGLONG
    9: "int64",  # INT24
    4: "float64",  # FLOAT    (Float record)
    5: "float64",  # DOUBLE
    7: "timestamptz",  # TIMESTAMP (Timestamp record)
    17: "timestamptz",  # TIMESTAMP2
    10: "date",  # DATE
    14: "date",  # NEWDATE
    11: "time",  # TIME
    19: "time",  # TIME2
    12: "timestamp",  # DATETIME
    18: "timestamp",  # DATETIME2
    13: "int32",  # YEAR
    245: "json",  # JSON
}
_MYSQL_DATE_CODES = frozenset({10, 14})
_MYSQL_DATETIME_CODES = frozenset({12, 18})
_MYSQL_FAMILY = frozenset({"MySQL", "DRDS"})


# --------------------------------------------------------------------------- values
# Each converter takes the union branch's fields and the column name and returns
# (python value, logical type or None).


def _integer(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    text = v["value"]
    try:
        if "_" in text:
            raise ValueError
        n = int(text)
    except ValueError:
        raise bad_value(col, text, "integer") from None
    if -(2**63) <= n < 2**63:
        return n, "int64"
    d = decimal.Decimal(n)
    return d, decimal_type(max(len(str(abs(n))), 20), 0)


def _character(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    charset = v["charset"]
    raw = v["value"]
    if charset.lower() == "binary":
        return raw, "binary"
    name = _codec(charset)
    if name is None:
        raise DecodeError(
            f"column {col!r}: unknown charset {charset!r}; cdcflow cannot decode its text",
            Code.BAD_VALUE,
        )
    try:
        return raw.decode(name), "string"
    except UnicodeDecodeError:
        raise bad_value(col, raw, f"{charset} text") from None


def _decimal(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    text = v["value"]
    try:
        d = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        raise bad_value(col, text, "decimal") from None
    if not d.is_finite():
        raise bad_value(col, text, "finite decimal")
    p, s = v["precision"], v["scale"]
    if p > 0 and 0 <= s <= p:
        exp = d.as_tuple().exponent
        assert isinstance(exp, int)
        if -exp > s:
            raise bad_value(col, text, f"decimal({p},{s}) (too many fractional digits)")
        if -exp < s:
            d = d.quantize(decimal.Decimal(1).scaleb(-s))
        return d, decimal_type(p, s)
    # No usable precision/scale (e.g. Oracle NUMBER without them): type from the value.
    return d, infer_type(d)


def _float(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    return float(v["value"]), "float64"


def _timestamp(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    # Record field "millis" holds MICROseconds: the SDK's DefaultValueDeserializer copies it
    # to UnixTimestamp.micro, whose toJdbcTimestamp sets nanos = micro * 1000.
    sec, micro = v["timestamp"], v["millis"]
    if not 0 <= micro < 1_000_000:
        raise bad_value(col, micro, "microsecond fraction (0..999999)")
    try:
        return EPOCH + dt.timedelta(seconds=sec, microseconds=micro), "timestamptz"
    except OverflowError:
        raise bad_value(col, sec, "epoch second") from None


def _datetime_parts(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    """DateTime -> date / timestamp / time / YEAR int, by the parts that are present.

    ``millis`` holds microseconds (the SDK sets nanos = millis * 1000). MySQL zero dates
    (a zero year, month or day: ``0000-00-00``, ``2020-00-00``) are NULL, as in the
    formats that print them as text (:func:`~cdcflow.formats.common.mysql_values.zero_date_parts`).
    """
    year, month, day, hour = v["year"], v["month"], v["day"], v["hour"]
    minute, second, micro = v["minute"] or 0, v["second"] or 0, v["millis"] or 0
    try:
        if year is not None and month is not None and day is not None:
            if zero_date_parts(year, month, day):
                return None, "timestamp" if hour is not None else "date"
            if hour is None:
                return dt.date(year, month, day), "date"
            return dt.datetime(year, month, day, hour, minute, second, micro), "timestamp"
        if year is None and month is None and day is None and hour is not None:
            return dt.time(hour, minute, second, micro), "time"
        if year is not None and month is None and day is None and hour is None:
            return year, "int32"  # MySQL YEAR
    except (ValueError, OverflowError):
        raise bad_value(col, v, "date/time (out of range)") from None
    raise bad_value(col, v, "DateTime (unsupported combination of parts)")


_TRUNCATE_RE = re.compile(r"\s*TRUNCATE\b", re.IGNORECASE)


def _timestamp_tz(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    local, _ = _datetime_parts(v["value"], col)
    if local is None:
        return None, "timestamptz"
    if not isinstance(local, dt.datetime):
        raise bad_value(col, v, "timestamp with time zone (needs date and time parts)")
    tz = parse_zone(v["timezone"])
    if tz is None:
        raise bad_value(col, v["timezone"], "time zone")
    return local.replace(tzinfo=tz).astimezone(dt.UTC), "timestamptz"


def _binary(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    return v["value"], "binary"  # BinaryObject (BLOB, RAW, BYTEA, ...) and WKB geometry


def _text(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    return v["value"], "string"  # WKT geometry


def _text_object(v: dict[str, Any], col: str) -> tuple[Any, str | None]:
    return v["value"], "json" if v["type"].upper() == "JSON" else "string"


_CONVERTERS = {
    NAMESPACE + "Integer": _integer,
    NAMESPACE + "Character": _character,
    NAMESPACE + "Decimal": _decimal,
    NAMESPACE + "Float": _float,
    NAMESPACE + "Timestamp": _timestamp,
    NAMESPACE + "DateTime": _datetime_parts,
    NAMESPACE + "TimestampWithTimeZone": _timestamp_tz,
    NAMESPACE + "BinaryGeometry": _binary,
    NAMESPACE + "TextGeometry": _text,
    NAMESPACE + "BinaryObject": _binary,
    NAMESPACE + "TextObject": _text_object,
}
EMPTY_OBJECT = NAMESPACE + "EmptyObject"
_ABSENT = object()  # EmptyObject.NONE: the value is not carried


def _convert(item: Any, col: str) -> tuple[Any, str | None]:
    if item is None:
        return None, None
    name, v = item
    if name == EMPTY_OBJECT:
        return (None, None) if v == "NULL" else (_ABSENT, None)
    return _CONVERTERS[name](v, col)


# --------------------------------------------------------------------------- decoder


class DtsAvroDecoder(Decoder[DtsAvroOptions]):
    """Decodes DTS Avro records (see the module doc and ``docs/formats/dts-avro.md``)."""

    identifier: ClassVar[str] = IDENTIFIER
    options_class = DtsAvroOptions
    binary_values: ClassVar[bool] = True

    def __init__(self, options: DtsAvroOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._schema = record_schema()
        self._tables: dict[str | None, SourceTable] = {}

    def __getstate__(self) -> dict[str, Any]:  # the parsed schema is rebuilt, not pickled
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]  # unpickling re-runs __init__; mypy refuses __init__ on an instance

    # -- reading ---------------------------------------------------------------

    def _read(self, value: bytes) -> dict[str, Any]:
        buf = io.BytesIO(value)
        try:
            rec = fastavro.schemaless_reader(buf, self._schema, None, return_record_name=True)
        except Exception as exc:  # noqa: BLE001 - any reader failure means "not this schema"
            raise DecodeError(
                f"not a DTS Avro Record ({type(exc).__name__}: {exc}); the topic must carry "
                "DTS Avro (schemaless com.alibaba.dts.formats.avro.Record)",
                Code.BAD_AVRO,
            ) from exc
        if buf.tell() != len(value):
            raise DecodeError(
                f"{len(value) - buf.tell()} trailing bytes after the DTS Avro Record",
                Code.BAD_AVRO,
            )
        return rec  # type: ignore[return-value]  # fastavro types any Avro datum; a DTS Record is a record: a dict

    def _source(self, object_name: str | None) -> SourceTable:
        table = self._tables.get(object_name)
        if table is None:
            if object_name:
                db, schema, name = _split_object_name(object_name)
                table = SourceTable(IDENTIFIER, db, schema, name)
            else:
                table = SourceTable(IDENTIFIER)
            if len(self._tables) < 10_000:
                self._tables[object_name] = table
        return table

    # -- decoding --------------------------------------------------------------

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one DTS Avro record into at most one event.

        Raises:
            DecodeError: BAD_AVRO (not a Record datum), UNKNOWN_OP, MISSING_FIELD /
                BAD_FIELD (images missing or not aligned with ``fields``), BAD_VALUE,
                MISSING_KEY.
            SkipRecord: ``NOOP`` records (reason ``DTS_NOOP``).
        """
        assert record.value is not None
        rec = self._read(record.value)
        op_name: str = rec["operation"]
        op = OPERATIONS.get(op_name)
        if op is None:
            if op_name in SKIPPED_OPERATIONS:
                raise SkipRecord(SKIPPED_OPERATIONS[op_name])
            raise DecodeError(
                f"DTS operation {op_name!r} is not supported: cdcflow applies INSERT, UPDATE, "
                "DELETE, INIT, DDL and reads BEGIN/COMMIT/HEARTBEAT/CHECKPOINT markers",
                Code.UNKNOWN_OP,
            )
        source_type = rec["source"]["sourceType"]
        object_name = rec["objectName"]
        source = self._source(object_name)
        meta: dict[str, Any] = {
            "operation": op_name,
            "source_type": source_type,
            "source_position": rec["sourcePosition"],
        }
        if rec["safeSourcePosition"]:
            meta["safe_source_position"] = rec["safeSourcePosition"]
        tags: dict[str, str] = rec["tags"]
        if tags:
            meta["tags"] = tags
        if rec["bornTimestamp"]:
            meta["born_ts_ms"] = rec["bornTimestamp"]
        seconds = rec["sourceTimestamp"]
        if not _TS_S_MIN <= seconds <= _TS_S_MAX:
            raise field_range_error(
                "sourceTimestamp",
                seconds,
                _TS_S_MIN,
                _TS_S_MAX,
                "epoch seconds; ts_ms = sourceTimestamp * 1000 is a 64-bit integer",
            )
        event = ChangeEvent(
            op=op,
            source=source,
            seq=(rec["id"],),
            ts_ms=seconds * 1000,
            txn=Txn(rec["sourceTxid"]) if rec["sourceTxid"] else None,
            origin=record.origin,
            meta=meta,
        )
        if op is Op.DDL:
            event.ddl = self._ddl_text(rec)
            if _TRUNCATE_RE.match(event.ddl):
                event.op = Op.TRUNCATE
            return [event]
        if op not in ROW_OPS:
            return [event]
        if not object_name:
            raise DecodeError(f"{op_name} record without objectName", Code.MISSING_FIELD)
        self._row(rec, event, op_name, source_type)
        return [self._keyed(event, self._declared_key(tags, source))]

    def _keyed(self, event: ChangeEvent, declared: tuple[str, ...]) -> ChangeEvent:
        """Like :meth:`require_key`, but an update whose after image does not carry a key
        column (``EmptyObject.NONE``: unchanged, e.g. MySQL ``binlog_row_image=minimal``)
        takes that column's value from the before image."""
        before, after = event.before, event.after
        if event.op is not Op.UPDATE or before is None or after is None:
            return self.require_key(event, declared)
        cols = declared or key_columns_for(self.options.primary_keys, event.source)
        if not cols:  # MISSING_KEY, or the full-row identity (keyless: full_row)
            return self.require_key(event, None)
        if not all(c in after or c in before for c in cols):
            event.before, event.after = None, {**before, **after}
            try:
                self.require_key(event, cols)  # raises MISSING_KEY with the usual message
            finally:
                event.before, event.after = before, after
        event.key = {c: after[c] if c in after else before[c] for c in cols}
        return event

    def _ddl_text(self, rec: dict[str, Any]) -> str:
        for images in (rec["afterImages"], rec["beforeImages"]):
            if isinstance(images, str):
                return images
            if isinstance(images, list) and len(images) == 1:
                value, _ = _convert(images[0], "ddl")
                if isinstance(value, str):
                    return value
        raise DecodeError(
            "DDL record without the statement text (a string in afterImages)",
            Code.MISSING_FIELD,
        )

    def _row(self, rec: dict[str, Any], event: ChangeEvent, op_name: str, source_type: str) -> None:
        fields = rec["fields"]
        if not isinstance(fields, list):
            code = Code.MISSING_FIELD if fields is None else Code.BAD_FIELD
            raise DecodeError(f"{op_name} record without a fields array", code)
        names = [f["name"] for f in fields]
        op = event.op
        want_before = op in (Op.UPDATE, Op.DELETE)
        want_after = op in (Op.INSERT, Op.UPDATE, Op.SNAPSHOT)
        mysql = source_type in _MYSQL_FAMILY
        columns: dict[str, str] = {}
        for attr, wanted in (("beforeImages", want_before), ("afterImages", want_after)):
            if not wanted:  # e.g. a DELETE's after image: a delete has none
                continue
            images = rec[attr]
            if images is None:
                raise DecodeError(f"{op_name} record without {attr}", Code.MISSING_FIELD)
            if not isinstance(images, list):
                raise _bad_field(f"{attr} of a {op_name} record must be an array")
            if len(images) != len(names):
                raise _bad_field(
                    f"{attr} has {len(images)} values for {len(names)} fields; they must align"
                )
            image: dict[str, Any] = {}
            for field, item in zip(fields, images, strict=True):
                col = field["name"]
                value, logical = _convert(item, col)
                if value is _ABSENT:
                    continue
                if mysql and logical in ("date", "timestamp"):
                    value, logical = _mysql_temporal(value, logical, field["dataTypeNumber"])
                elif mysql and value == EPOCH and logical == "timestamptz":
                    value = None  # MySQL's zero TIMESTAMP (its range starts 1 s later)
                image[col] = value
                if logical is not None:
                    columns[col] = logical
            if attr == "beforeImages":
                event.before = image
            else:
                event.after = image
        if mysql:
            for field in fields:
                col = field["name"]
                if col not in columns:
                    logical = _MYSQL_NULL_TYPES.get(field["dataTypeNumber"])
                    if logical is not None:
                        columns[col] = logical
        event.columns = {n: columns[n] for n in names if n in columns}

    def _declared_key(self, tags: Mapping[str, str], source: SourceTable) -> tuple[str, ...]:
        info = tags.get("pk_uk_info")
        if not info:
            return ()
        primary, unique = _key_info(info)
        if primary:
            return primary
        opts = self.options
        if (
            unique
            and getattr(opts, "use_unique_key", True)
            and key_columns_for(opts.primary_keys, source) is None
        ):
            return unique
        return ()


def _mysql_temporal(value: Any, logical: str, type_code: int) -> tuple[Any, str]:
    """Align a DateTime value with the MySQL column type (DATE vs DATETIME)."""
    if type_code in _MYSQL_DATE_CODES and logical == "timestamp":
        if value is None:
            return None, "date"
        if value.time() == dt.time(0):
            return value.date(), "date"
    elif type_code in _MYSQL_DATETIME_CODES and logical == "date":
        if value is None:
            return None, "timestamp"
        return dt.datetime(value.year, value.month, value.day), "timestamp"
    return value, logical

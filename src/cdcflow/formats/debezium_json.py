"""Debezium JSON change events (format identifier ``debezium-json``).

Implements the message format of Debezium's relational connectors (PostgreSQL, MySQL and
MariaDB, Oracle, SQL Server, Db2) as serialized by Kafka Connect's ``JsonConverter``,
with (``schemas.enable=true``) or without the ``{"schema": ..., "payload": ...}`` wrapper.

Source documents: Tencent Cloud TDMQ for CKafka, "PostgreSQL Data Subscription"
(``https://www.tencentcloud.com/document/product/597/64333``) and the Debezium
reference documentation (``connectors/postgresql.adoc``, ``mysql.adoc``, ``oracle.adoc``,
``sqlserver.adoc``: "Data change events", "Transaction metadata", "Data type mappings").
``docs/formats/debezium-json.md`` lists what is and is not supported.

One Kafka record decodes to exactly one event:

* a change event (``op`` ``c``/``u``/``d``/``r``) -> INSERT / UPDATE / DELETE / SNAPSHOT;
* ``op`` ``t`` -> TRUNCATE (no key), ``op`` ``m`` -> MESSAGE (prefix/content in ``meta``);
* a transaction metadata record (``status`` BEGIN/END) -> BEGIN / COMMIT;
* a schema change record (``ddl``/``tableChanges``) -> DDL;
* a heartbeat record (only ``ts_ms``) -> HEARTBEAT.

Sequence rule (``ChangeEvent.seq``), chosen per connector from ``source.connector`` or,
when that is missing or unknown, from the fields ``source`` carries:

=================  ====================================================================
connector          ``seq``
=================  ====================================================================
postgresql         ``(last_commit_lsn, lsn)``; ``last_commit_lsn`` is the first element
                   of ``source.sequence`` (0 when absent or null). Events arrive in
                   commit order; ``lsn`` alone is not monotonic across transactions.
mysql, mariadb     ``(binlog file number, pos, row)``; ``mysql-bin.000003`` -> 3.
oracle             ``(commit_scn, scn)``; a missing commit SCN (snapshot) is 0.
sqlserver, db2     ``(commit_lsn, change_lsn, event_serial_no)``; an LSN
                   ``00000027:00000758:0005`` is read as one hex number; null is 0.
mongodb            ``(source.ts_ms, ord)`` (oplog seconds and increment).
anything else      ``(ts_ms,)`` -- commit time only; ties keep Kafka order.
=================  ====================================================================

Exact numbers: values are parsed with orjson, which reads every JSON number with a
fraction (and every integer beyond 64 bits) as a float. Whenever such a float lands
somewhere exactness matters -- a decimal column, an integer column, a sequence field,
an out-of-int64 integer in a schemaless image -- the record is parsed again with the
standard library (``parse_float=Decimal``) and decoded from the exact number text.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import decimal
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from cdcflow import types as T
from cdcflow.errors import Code, ConfigError, DecodeError, SkipReason
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
from cdcflow.formats.common.values import bad_value
from cdcflow.model import ChangeEvent, Op, SourceTable, Txn

__all__ = [
    "IDENTIFIER",
    "DebeziumJsonDecoder",
    "DebeziumJsonOptions",
]

IDENTIFIER = "debezium-json"

# Debezium ``Envelope.Operation`` codes (payload field ``op``).
OP_CREATE = "c"  # insert
OP_UPDATE = "u"  # update
OP_DELETE = "d"  # delete
OP_READ = "r"  # snapshot read: a row of the initial (or incremental) snapshot
OP_TRUNCATE = "t"  # truncate table
OP_MESSAGE = "m"  # logical decoding message (PostgreSQL pg_logical_emit_message)

ROW_OPS: dict[str, Op] = {
    OP_CREATE: Op.INSERT,
    OP_UPDATE: Op.UPDATE,
    OP_DELETE: Op.DELETE,
    OP_READ: Op.SNAPSHOT,
}

# Transaction metadata topic (``provide.transaction.metadata=true``), field ``status``.
STATUS_BEGIN = "BEGIN"  # transaction start
STATUS_END = "END"  # transaction end, with event_count and data_collections

# ``DebeziumJsonOptions.undeclared_columns``: a row image column the schema does not declare
UNDECLARED_DEAD_LETTER = "dead_letter"  # the record is an UNDECLARED_COLUMN dead letter
UNDECLARED_KEEP = "keep"  # the column is kept, its type inferred from its value
UNDECLARED_MODES = (UNDECLARED_DEAD_LETTER, UNDECLARED_KEEP)

# The fields of every Debezium change event value schema (``Envelope``): the row schema
# twice, the connector's source block and the op code (ts_ms and transaction may follow).
ENVELOPE_FIELDS = ("before", "after", "source", "op")

# Record headers Debezium adds when an update changes the primary key (it then emits
# a delete under the old key and a create under the new one).
HEADER_OLDKEY = "__debezium.oldkey"  # on the create: the row's previous key
HEADER_NEWKEY = "__debezium.newkey"  # on the delete: the row's new key

_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_EPOCH_DATE = dt.date(1970, 1, 1)
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_MAX = 2**64 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
# Exact decimal arithmetic: no rounding to the default 28 digits, inexact is an error.
_DEC_CTX = decimal.Context(prec=1000, traps=[decimal.InvalidOperation, decimal.Inexact])

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


class _NeedExact(Exception):
    """Internal: a float reached a place that needs the exact number text."""


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class DebeziumJsonOptions(DecoderOptions):
    """Options of the ``debezium-json`` decoder.

    Attributes:
        schema_include: ``None`` (default) detects per message whether the value is the
            ``{"schema", "payload"}`` wrapper of ``JsonConverter`` with
            ``schemas.enable=true``; ``True`` requires the wrapper; ``False`` takes the
            value as the bare payload.
        decimal_precision: precision declared for an
            ``org.apache.kafka.connect.data.Decimal`` column whose schema has no
            ``connect.decimal.precision`` parameter (default 38).
        variable_scale_decimal_type: logical type declared for
            ``io.debezium.data.VariableScaleDecimal`` columns (NUMERIC/NUMBER without a
            fixed scale); the values keep their own exact scale. Default
            ``decimal(38,18)``.
        float_as_decimal: schemaless messages only: read JSON numbers with a fraction as
            exact ``Decimal`` (``decimal(P,S)``) instead of ``float64``. Use it when the
            connector writes decimals as JSON numbers (``decimal.format=NUMERIC``) and
            the schema is not included. Slower (standard-library JSON parser).
        unavailable_value_placeholder: Debezium's ``unavailable.value.placeholder``; a
            column holding it (text, its base64 or hex bytes, or a one-element array of
            it) was not captured (unchanged TOASTed value) and is left out of the image.
        undeclared_columns: what a row image column that the message's schema does not
            declare makes of its record (messages with a schema only).
            ``"dead_letter"`` (default): an ``UNDECLARED_COLUMN`` dead letter -- Kafka
            Connect's ``JsonConverter`` writes exactly the fields of the schema, so such a
            message was altered or made by another producer. ``"keep"``: the column is
            kept with a type inferred from its value, as without a schema
            (docs/decisions.md, 24).
    """

    schema_include: bool | None = None
    decimal_precision: int = 38
    variable_scale_decimal_type: str = "decimal(38,18)"
    float_as_decimal: bool = False
    unavailable_value_placeholder: str = "__debezium_unavailable_value"
    undeclared_columns: str = UNDECLARED_DEAD_LETTER

    def __post_init__(self) -> None:
        if self.undeclared_columns not in UNDECLARED_MODES:
            raise ConfigError(
                f"undeclared_columns must be one of {list(UNDECLARED_MODES)} (YAML: "
                f"sources[].options.undeclared_columns), not {self.undeclared_columns!r}"
            )
        if self.schema_include not in (None, True, False):
            raise ConfigError("schema_include must be true, false or null (detect per message)")
        if not isinstance(self.decimal_precision, int) or self.decimal_precision < 1:
            raise ConfigError("decimal_precision must be a positive integer, e.g. 38")
        try:
            base = T.parse_type(self.variable_scale_decimal_type)[0]
        except (ValueError, TypeError):
            base = None
        if base != "decimal":
            raise ConfigError(
                "variable_scale_decimal_type must be a decimal type such as 'decimal(38,18)', "
                f"not {self.variable_scale_decimal_type!r}"
            )
        if not isinstance(self.unavailable_value_placeholder, str) or not (
            self.unavailable_value_placeholder
        ):
            raise ConfigError("unavailable_value_placeholder must be a non-empty string")


# --------------------------------------------------------------------------- helpers


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "number" if isinstance(value, int | float | decimal.Decimal) else "null"
    )


def _field_error(name: str, value: Any, want: str) -> DecodeError:
    if value is None:
        return DecodeError(f"field {name!r} is missing (need {want})", Code.MISSING_FIELD)
    return DecodeError(f"field {name!r} is a JSON {_kind(value)}, need {want}", Code.BAD_FIELD)


def _int_field(value: Any, name: str, exact: bool) -> int:
    """An integer metadata field (ts_ms, lsn, pos, ...): JSON integer or digit text."""
    if value.__class__ is int:
        return value
    if value.__class__ is str:
        try:
            return int(value.strip())
        except ValueError:
            pass
    elif value.__class__ is float:
        if not exact:
            raise _NeedExact
    elif isinstance(value, decimal.Decimal) and value.is_finite() and value == int(value):
        return int(value)
    raise DecodeError(f"field {name!r} must be an integer, got {value!r}", Code.BAD_FIELD)


def _int64_field(value: Any, name: str, exact: bool) -> int:
    """An integer field that goes into the event as an int (ts_ms, orders, counts)."""
    n = _int_field(value, name, exact)
    if _I64_MIN <= n <= _I64_MAX:
        return n
    raise DecodeError(f"field {name!r}: {n} is outside the 64-bit integer range", Code.BAD_FIELD)


def _hex_lsn(value: Any, name: str, exact: bool) -> int:
    """SQL Server / Db2 LSN text ``00000027:00000758:0005`` (fixed-width hex) -> int."""
    if value is None:
        return 0
    if value.__class__ is str:
        try:
            return int(value.replace(":", ""), 16) if value else 0
        except ValueError:
            raise DecodeError(
                f"field {name!r}: {value!r} is not a hexadecimal LSN like 00000027:00000758:0005",
                Code.BAD_FIELD,
            ) from None
    return _int_field(value, name, exact)


def _floats(value: Any) -> Any:
    """A nested value parsed exactly, with its fractional numbers as floats again and
    integers beyond 64 bits as their text (orjson cannot write them)."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if value.__class__ is int and not _I64_MIN <= value <= _U64_MAX:
        return str(value)
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return value


def _plain_json(value: Any) -> str:
    """JSON text of a nested value parsed exactly, numbers as written in the message."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{_plain_json(str(k))}:{_plain_json(v)}" for k, v in value.items())
            + "}"
        )
    return "[" + ",".join(_plain_json(v) for v in value) + "]"


def _json_text(value: Any, exact: bool, keep_number_text: bool = False) -> str:
    """Compact JSON text of a nested value (what a ``json`` column holds). Numbers
    print as orjson prints floats, whichever parser read the message, unless
    ``keep_number_text`` (``float_as_decimal``) keeps them as written."""
    if exact:
        if keep_number_text:
            return _plain_json(value)
        value = _floats(value)
    try:
        return orjson.dumps(value, default=_bytes_as_base64).decode()
    except TypeError:  # an integer beyond 64 bits (exact parse only)
        return _plain_json(value)


def _bytes_as_base64(value: Any) -> str:
    """Bytes inside a nested Avro value (debezium-avro: a geometry's ``wkb``) as the
    base64 text ``JsonConverter`` writes for them, so both formats store the same JSON."""
    if value.__class__ is bytes:
        return base64.b64encode(value).decode()
    raise TypeError


def _exact_decimal(d: decimal.Decimal, scale: int, column: str) -> decimal.Decimal:
    """``d`` at exactly ``scale`` digits after the point; more digits is BAD_VALUE."""
    if not d.is_finite():
        raise bad_value(column, d, "decimal")
    try:
        return d.quantize(decimal.Decimal(1).scaleb(-scale), context=_DEC_CTX)
    except decimal.DecimalException:
        raise bad_value(column, d, f"decimal with scale {scale}") from None


def _unscaled_to_decimal(raw: bytes, scale: int) -> decimal.Decimal:
    unscaled = int.from_bytes(raw, "big", signed=True)
    return decimal.Decimal(f"{unscaled}E{-scale}")


def _b64(value: Any, column: str) -> bytes:
    """A bytes value: base64 text in JSON, the bytes themselves in Avro (debezium-avro)."""
    if value.__class__ is bytes:
        return value
    if value.__class__ is str:
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise bad_value(column, value, "base64 string")


# --------------------------------------------------------------------------- value converters
# A converter is ``fn(value, column, exact) -> python value`` for a non-null JSON value.

Conv = Callable[[Any, str, bool], Any]


def _int_checked(value: Any, column: str, exact: bool, lo: int, hi: int, want: str) -> int:
    if value.__class__ is int:
        if lo <= value <= hi:
            return value
    elif value.__class__ is float:
        if not exact:
            raise _NeedExact
    elif isinstance(value, decimal.Decimal) and value.is_finite() and value == int(value):
        return _int_checked(int(value), column, exact, lo, hi, want)
    raise bad_value(column, value, want)


def _c_int32(value: Any, column: str, exact: bool) -> int:
    if value.__class__ is int and _I32_MIN <= value <= _I32_MAX:
        return value
    return _int_checked(value, column, exact, _I32_MIN, _I32_MAX, "int32")


def _c_int64(value: Any, column: str, exact: bool) -> int:
    if value.__class__ is int and _I64_MIN <= value <= _I64_MAX:
        return value
    return _int_checked(value, column, exact, _I64_MIN, _I64_MAX, "int64")


_FLOAT_WORDS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _c_float(value: Any, column: str, exact: bool) -> float:
    c = value.__class__
    if c is float:
        return value
    if c is int or isinstance(value, decimal.Decimal):
        return float(value)
    if c is str and value in _FLOAT_WORDS:  # Jackson writes non-finite doubles as text
        return _FLOAT_WORDS[value]
    raise bad_value(column, value, "floating-point number")


def _c_bool(value: Any, column: str, exact: bool) -> bool:
    if value is True or value is False:
        return value
    if value.__class__ is int and value in (0, 1):
        return bool(value)
    raise bad_value(column, value, "boolean")


def _c_str(value: Any, column: str, exact: bool) -> str:
    if value.__class__ is str:
        return value
    raise bad_value(column, value, "string")


def _c_bytes(value: Any, column: str, exact: bool) -> bytes:
    return _b64(value, column)


def _c_json_text(value: Any, column: str, exact: bool) -> str:
    """Arrays, maps, structs without a known logical name, geometry: their JSON text."""
    return _json_text(value, exact)


def _c_date_days(value: Any, column: str, exact: bool) -> dt.date:
    days = _c_int32(value, column, exact)
    try:
        return _EPOCH_DATE + dt.timedelta(days=days)
    except OverflowError:
        raise bad_value(column, value, "date (days since 1970-01-01)") from None


def _time_of_day_us(us: int, column: str, raw: Any) -> dt.time:
    if not 0 <= us < 86_400_000_000:
        raise bad_value(column, raw, "time of day (00:00 to 24:00 exclusive)")
    s, micro = divmod(us, 1_000_000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return dt.time(h, m, s, micro)


def _c_time_ms(value: Any, column: str, exact: bool) -> dt.time:
    return _time_of_day_us(_c_int64(value, column, exact) * 1000, column, value)


def _c_time_us(value: Any, column: str, exact: bool) -> dt.time:
    return _time_of_day_us(_c_int64(value, column, exact), column, value)


def _c_time_ns(value: Any, column: str, exact: bool) -> dt.time:
    return _time_of_day_us(_c_int64(value, column, exact) // 1000, column, value)


def _naive_us(us: int, column: str, raw: Any) -> dt.datetime:
    try:
        return _EPOCH_NAIVE + dt.timedelta(microseconds=us)
    except OverflowError:
        raise bad_value(column, raw, "timestamp") from None


def _c_ts_ms(value: Any, column: str, exact: bool) -> dt.datetime:
    return _naive_us(_c_int64(value, column, exact) * 1000, column, value)


def _c_ts_us(value: Any, column: str, exact: bool) -> dt.datetime:
    return _naive_us(_c_int64(value, column, exact), column, value)


def _c_ts_ns(value: Any, column: str, exact: bool) -> dt.datetime:
    return _naive_us(_c_int64(value, column, exact) // 1000, column, value)


def _c_zoned_ts(value: Any, column: str, exact: bool) -> dt.datetime:
    if value.__class__ is not str:
        raise bad_value(column, value, "ISO-8601 timestamp text")
    parsed = T.parse_timestamp_text(value, column, aware=True)
    assert parsed is not None
    return parsed


def _c_json_str(value: Any, column: str, exact: bool) -> str:
    """``io.debezium.data.Json``: already JSON text."""
    return _c_str(value, column, exact)


def _c_var_decimal(value: Any, column: str, exact: bool) -> decimal.Decimal:
    """``io.debezium.data.VariableScaleDecimal``: ``{"scale": s, "value": base64}``."""
    if value.__class__ is dict:
        scale, raw = value.get("scale"), value.get("value")
        if scale.__class__ is int and raw.__class__ in (str, bytes):
            return _unscaled_to_decimal(_b64(raw, column), scale)
    raise bad_value(column, value, 'VariableScaleDecimal {"scale": int, "value": base64}')


def _decimal_conv(scale: int) -> Conv:
    """``org.apache.kafka.connect.data.Decimal``: base64 two's-complement big-endian
    unscaled value (``decimal.format=BASE64``) or a JSON number (``NUMERIC``)."""

    def conv(value: Any, column: str, exact: bool) -> decimal.Decimal:
        c = value.__class__
        if c is str:
            return _unscaled_to_decimal(_b64(value, column), scale)
        if c is bytes:  # Avro's bytes (debezium-avro)
            return _unscaled_to_decimal(value, scale)
        if c is int:
            return _exact_decimal(decimal.Decimal(value), scale, column)
        if c is float:
            if not exact:
                raise _NeedExact
        elif isinstance(value, decimal.Decimal):
            return _exact_decimal(value, scale, column)
        raise bad_value(column, value, "decimal")

    return conv


def _decimal_text_conv(scale: int) -> Conv:
    """A string column whose propagated source type is DECIMAL/NUMERIC
    (``decimal.handling.mode=string`` with ``column.propagate.source.type``)."""

    def conv(value: Any, column: str, exact: bool) -> decimal.Decimal:
        if value.__class__ is str:
            try:
                d = decimal.Decimal(value.strip())
            except decimal.InvalidOperation:
                raise bad_value(column, value, "decimal text") from None
            return _exact_decimal(d, scale, column)
        return _decimal_conv(scale)(value, column, exact)

    return conv


def _param_int(params: Mapping[str, Any], name: str, column: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DecodeError(
            f"column {column!r}: schema parameter {name!r}={value!r} is not an integer",
            Code.BAD_FIELD,
        ) from None


_BASE_TYPES: dict[str, tuple[str, Conv]] = {
    "int8": ("int32", _c_int32),
    "int16": ("int32", _c_int32),
    "int32": ("int32", _c_int32),
    "int64": ("int64", _c_int64),
    "float": ("float32", _c_float),
    "float32": ("float32", _c_float),
    "double": ("float64", _c_float),
    "float64": ("float64", _c_float),
    "boolean": ("boolean", _c_bool),
    "string": ("string", _c_str),
    "bytes": ("binary", _c_bytes),
    "array": ("json", _c_json_text),
    "map": ("json", _c_json_text),
    "struct": ("json", _c_json_text),
}

# Connect / Debezium logical names with a fixed mapping: name -> (logical type, converter).
_LOGICAL: dict[str, tuple[str, Conv]] = {
    "org.apache.kafka.connect.data.Date": ("date", _c_date_days),
    "org.apache.kafka.connect.data.Time": ("time", _c_time_ms),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", _c_ts_ms),
    "io.debezium.time.Date": ("date", _c_date_days),
    "io.debezium.time.Time": ("time", _c_time_ms),
    "io.debezium.time.MicroTime": ("time", _c_time_us),
    "io.debezium.time.NanoTime": ("time", _c_time_ns),
    "io.debezium.time.Timestamp": ("timestamp", _c_ts_ms),
    "io.debezium.time.MicroTimestamp": ("timestamp", _c_ts_us),
    "io.debezium.time.NanoTimestamp": ("timestamp", _c_ts_ns),
    "io.debezium.time.ZonedTimestamp": ("timestamptz", _c_zoned_ts),
    "io.debezium.time.ZonedTime": ("string", _c_str),  # text with its offset, kept as is
    "io.debezium.time.Year": ("int32", _c_int32),
    "io.debezium.time.MicroDuration": ("int64", _c_int64),  # microseconds
    "io.debezium.time.Interval": ("string", _c_str),  # ISO-8601 duration text
    "io.debezium.data.Json": ("json", _c_json_str),
    "io.debezium.data.Uuid": ("string", _c_str),
    "io.debezium.data.Xml": ("string", _c_str),
    "io.debezium.data.Enum": ("string", _c_str),
    "io.debezium.data.EnumSet": ("string", _c_str),  # comma-separated members
    "io.debezium.data.Ltree": ("string", _c_str),
    "io.debezium.data.Bits": ("binary", _c_bytes),  # Debezium's byte order (little-endian)
    "io.debezium.data.geometry.Geometry": ("json", _c_json_text),  # {"wkb", "srid"}
    "io.debezium.data.geometry.Geography": ("json", _c_json_text),
    "io.debezium.data.geometry.Point": ("json", _c_json_text),  # {"x", "y", "wkb", "srid"}
}

_DECIMAL_SOURCE_TYPES = frozenset(
    {"DECIMAL", "NUMERIC", "FIXED", "DEC", "NUMBER", "MONEY", "SMALLMONEY"}
)


def _field_conv(field: Mapping[str, Any], options: DebeziumJsonOptions) -> tuple[str, Conv]:
    column = str(field.get("field"))
    ftype = field.get("type")
    name = field.get("name")
    if name is not None and name.__class__ is not str:
        raise DecodeError(f"column {column!r}: schema 'name' is not a string", Code.BAD_FIELD)
    params = field.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise DecodeError(
            f"column {column!r}: schema 'parameters' is not an object", Code.BAD_FIELD
        )
    if name is not None:
        if name == "org.apache.kafka.connect.data.Decimal":
            scale = _param_int(params, "scale", column) or 0
            precision = _param_int(params, "connect.decimal.precision", column)
            ltype = T.decimal_type(precision or options.decimal_precision, scale)
            return ltype, _decimal_conv(scale)
        if name == "io.debezium.data.VariableScaleDecimal":
            return options.variable_scale_decimal_type, _c_var_decimal
        fixed = _LOGICAL.get(name)
        if fixed is not None:
            return fixed
    if ftype == "string":
        source_type = params.get("__debezium.source.column.type")
        if (
            isinstance(source_type, str)
            and source_type.split(" ")[0].upper() in _DECIMAL_SOURCE_TYPES
        ):
            length = _param_int(params, "__debezium.source.column.length", column)
            scale = _param_int(params, "__debezium.source.column.scale", column)
            if length is not None and scale is not None and scale >= 0:
                return T.decimal_type(length, scale), _decimal_text_conv(scale)
    base = _BASE_TYPES.get(ftype) if isinstance(ftype, str) else None
    if base is None:
        raise DecodeError(
            f"column {column!r}: unknown Kafka Connect schema type {ftype!r}", Code.BAD_FIELD
        )
    return base


class _Struct:
    """A compiled Connect struct schema: column -> (logical type, converter)."""

    __slots__ = ("columns", "convs")

    def __init__(self, fields: Any, options: DebeziumJsonOptions) -> None:
        if not isinstance(fields, list):
            raise DecodeError("schema 'fields' is not an array", Code.BAD_FIELD)
        self.convs: dict[str, tuple[str, Conv]] = {}
        for f in fields:
            if not isinstance(f, dict) or not isinstance(f.get("field"), str):
                raise DecodeError("schema field without a 'field' name", Code.BAD_FIELD)
            self.convs[f["field"]] = _field_conv(f, options)
        self.columns = {c: t for c, (t, _) in self.convs.items()}


def _envelope_row(schema: dict[str, Any]) -> dict[str, Any]:
    """The row struct schema (its ``after`` field) of a change event's value schema.

    Debezium gives every change event of a table (c/u/d/r and t) the table's ``Envelope``
    schema: a struct with the fields ``before`` and ``after`` (the row schema), ``source``
    and ``op``. A schema of another shape does not describe the payload.

    Raises:
        DecodeError: ``BAD_FIELD`` when ``schema`` is not such a struct.
    """
    fields = schema.get("fields")
    if fields.__class__ is list and schema.get("type") == "struct":
        # one pass, no allocation: this runs for every record with a schema
        row = None
        seen = 0
        for f in fields:
            if f.__class__ is dict:
                name = f.get("field")
                if name == "after":
                    row = f
                    seen |= 1
                elif name == "before":
                    seen |= 2
                elif name == "source":
                    seen |= 4
                elif name == "op":
                    seen |= 8
        if seen == 15:
            return row  # type: ignore[return-value]
    raise _not_an_envelope(schema)


def _not_an_envelope(schema: dict[str, Any]) -> DecodeError:
    fields = schema.get("fields")
    names = (
        [f.get("field") for f in fields if f.__class__ is dict] if fields.__class__ is list else []
    )
    if schema.get("type") != "struct":
        shape = f"its type is {schema.get('type')!r}"
    elif not names:
        shape = "it declares no fields"
    else:
        shown = ", ".join(str(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        missing = ", ".join(f for f in ENVELOPE_FIELDS if f not in names)
        shape = f"its fields are {shown} (no {missing})"
    return DecodeError(
        f"the value schema is not a Debezium change event Envelope (a struct with the "
        f"fields before, after, source and op): {shape}. A schema that describes the row "
        "itself comes from the ExtractNewRecordState transform, which debezium-json does "
        'not read: remove it from the connector, or publish "schema": null',
        Code.BAD_FIELD,
    )


def _undeclared(column: str, which: str, struct: _Struct) -> DecodeError:
    return DecodeError(
        f"column {column!r} of the {which} image is not declared by the message's schema "
        f"(its row struct declares {len(struct.columns)} columns); Kafka Connect's "
        "JsonConverter writes exactly the fields of the schema, so the message was altered "
        "or made by another producer. Fix the producer, or set undeclared_columns: keep in "
        "the debezium-json options (YAML: sources[].options.undeclared_columns) to keep the "
        "column with a type inferred from its value",
        Code.UNDECLARED_COLUMN,
    )


# --------------------------------------------------------------------------- decoder

_INT_TEXT = re.compile(r"(\d+)$")


class DebeziumJsonDecoder(Decoder):
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
        self._ph_values = frozenset({ph, ph_b64, ph_hex})
        self._tables: dict[tuple[Any, Any, Any], SourceTable] = {}
        self._structs: dict[bytes, _Struct] = {}
        self._files: dict[str, int] = {}
        self._pk_cache: dict[SourceTable, tuple[str, ...] | None] = {}
        self._last_source: tuple[Any, Any, Any] = (None, None, None)
        self._last_table: SourceTable | None = None
        self._last_txid: Any = None
        self._last_txn: Txn | None = None

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
        except _NeedExact:
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
        (:mod:`cdcflow.formats.debezium_columnar`); ``None`` sends it record by record.
        See :meth:`Decoder.decode_columnar`."""
        from cdcflow.formats.debezium_columnar import decode_columnar

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
        elif ts_ms > _I64_MAX:  # orjson reads integers up to 2**64 - 1
            return None
        connector = sget("connector")
        if connector == "postgresql":
            lsn = sget("lsn")
            text = sget("sequence")
            if lsn.__class__ is not int:
                return None
            if text.__class__ is str and text.startswith('["'):
                last = text[2 : text.find('"', 2)]
                # isdecimal, not isdigit: int() refuses digits such as '²' (and more
                # than 4,300 of them): the general path reports those
                if len(last) > 20 or not last.isdecimal():
                    return None
                seq: tuple[int, ...] = (int(last), lsn)
            elif text is None or (text.__class__ is str and text.startswith("[null,")):
                seq = (0, lsn)
            else:
                return None
        elif connector == "mysql" or connector == "mariadb":
            binlog = sget("file")
            fileno = self._files.get(binlog) if binlog.__class__ is str else None
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
        if name == last[2] and schema == last[1] and db == last[0]:
            table = self._last_table
        else:
            try:
                table = self._tables.get((db, schema, name))  # type: ignore[arg-type]
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
        placeholders = self._ph_values
        for k, v in image.items():
            c = v.__class__
            if c is str:
                if v in placeholders:
                    return None
                columns[k] = "string"
            elif c is int:
                if v > _I64_MAX:  # orjson reads a smaller integer than -2**63 as a float
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
        placeholders = self._ph_values
        for v in image.values():
            c = v.__class__
            if c is str:
                if v in placeholders:
                    return False
            elif c is int:
                if v > _I64_MAX:
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
                f"value is a JSON {_kind(obj)}, not a Debezium event object", Code.NOT_AN_OBJECT
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
                    f'"payload" is a JSON {_kind(payload)}, not an event object',
                    Code.NOT_AN_OBJECT,
                )
            if schema is not None and schema.__class__ is not dict:
                raise _field_error("schema", schema, "an object")
        else:
            payload = obj
        op = payload.get("op")
        if op.__class__ is str:
            row_op = ROW_OPS.get(op)
            if row_op is not None:
                return [self._row_event(row_op, payload, schema, record, exact)]
            if op == OP_TRUNCATE:
                if schema is not None:
                    _envelope_row(schema)  # a table's truncate carries its Envelope schema
                return [self._truncate(payload, record, exact)]
            if op == OP_MESSAGE:
                return [self._message(payload, record, exact)]
            raise DecodeError(
                f"unknown Debezium op {op!r}; known: c (create), u (update), d (delete), "
                "r (snapshot read), t (truncate), m (message)",
                Code.UNKNOWN_OP,
            )
        if op is not None:
            raise _field_error("op", op, "a string")
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
        source = payload.get("source")
        if source.__class__ is not dict:
            raise _field_error("source", source, "an object")
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
        struct = None if schema is None else self._compile(_envelope_row(schema))
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
        if ts_ms is not None and (ts_ms.__class__ is not int or not _I64_MIN <= ts_ms <= _I64_MAX):
            ts_ms = _int64_field(ts_ms, "ts_ms", exact)

        seq = self._seq(source, ts_ms, exact)
        table = self._table(source, required=True)

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
                    "data_collection_order": _int64_field(
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
        return _field_error(name, image, "an object (the row image) or null")

    def _unavailable(self, value: Any) -> bool:
        """Whether ``value`` is the unavailable-value placeholder (as text, as the
        base64 or hex form of its bytes, or as a one-element array of it)."""
        c = value.__class__
        if c is str:
            return value in self._ph_values
        if c is list and len(value) == 1 and value[0].__class__ is str:
            return value[0] in self._ph_values
        return False

    def _infer(self, image: dict[str, Any], exact: bool) -> tuple[dict[str, Any], dict[str, str]]:
        """Schemaless image: logical types from the JSON values (as ``types.infer_type``);
        nested objects/arrays become their JSON text (logical type ``json``); columns
        holding the unavailable-value placeholder are left out."""
        columns: dict[str, str] = {}
        rewrite = False
        placeholders = self._ph_values
        for k, v in image.items():
            c = v.__class__
            if c is str:
                columns[k] = "string"
                if v in placeholders:
                    rewrite = True
            elif c is int:
                if _I64_MIN <= v <= _I64_MAX:
                    columns[k] = "int64"
                else:
                    rewrite = True  # beyond int64: an exact decimal
            elif c is float:
                if not exact and (v >= 9.2e18 or v <= -9.2e18):
                    raise _NeedExact  # maybe an integer beyond 64 bits
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
                v = _json_text(v, exact, as_decimal)
                columns[k] = "json"
            elif v.__class__ is int and not _I64_MIN <= v <= _I64_MAX:
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

    def _compile(self, struct_schema: dict[str, Any]) -> _Struct:
        try:
            cache_key = orjson.dumps(struct_schema, default=str)  # str: Decimal defaults
        except TypeError:  # an integer beyond 64 bits somewhere in the schema
            cache_key = _plain_json(struct_schema).encode()
        found = self._structs.get(cache_key)
        if found is None:
            if struct_schema.get("type") != "struct":
                raise DecodeError("the row image schema is not a struct", Code.BAD_FIELD)
            found = _Struct(struct_schema.get("fields"), self.options)
            if len(self._structs) >= 256:
                self._structs.clear()
            self._structs[cache_key] = found
        return found

    def _typed(
        self,
        struct: _Struct,
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
                    raise _undeclared(k, which, struct)
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

    def _table(self, source: dict[str, Any], required: bool = False) -> SourceTable:
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
                raise _field_error(f"source.{name}", v, "a string")
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
        if ts.__class__ is int and _I64_MIN <= ts <= _I64_MAX:
            return ts
        return _int64_field(ts, "ts_ms", exact)

    def _seq(
        self, source: dict[str, Any], ts_ms: int | None, exact: bool
    ) -> tuple[int, ...] | None:
        connector = source.get("connector")
        rule = _SEQ_RULES.get(connector) if connector.__class__ is str else None
        if rule is None:
            rule = _detect_seq_rule(source)
        if rule is None:
            return None if ts_ms is None else (ts_ms,)
        return rule(self, source, exact)

    def _seq_postgres(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        lsn = source.get("lsn")
        lsn = (
            0
            if lsn is None
            else (lsn if lsn.__class__ is int else _int_field(lsn, "source.lsn", exact))
        )
        commit = 0
        text = source.get("sequence")
        if text is not None:
            commit = self._pg_last_commit(text, exact)
        return (commit, lsn)

    @staticmethod
    def _pg_last_commit(text: Any, exact: bool) -> int:
        """First element of ``source.sequence`` (``'["24023119","24023128"]'``)."""
        if text.__class__ is str:
            if text.startswith('["'):
                end = text.find('"', 2)
                try:
                    return int(text[2:end])
                except ValueError:
                    pass
            elif text.startswith("[null"):
                return 0
            try:
                items = _loads(text)
            except _JSONDecodeError:
                items = None
            if items.__class__ is list and items:
                first = items[0]
                return 0 if first is None else _int_field(first, "source.sequence", exact)
        raise DecodeError(
            f'source.sequence {text!r} is not a JSON array text like \'["1","2"]\'',
            Code.BAD_FIELD,
        )

    def _seq_mysql(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        name = source.get("file")
        fileno = self._files.get(name) if name.__class__ is str else None
        if fileno is None:
            if not name:
                fileno = 0  # snapshot rows of some versions carry "" (or null)
            else:
                m = _INT_TEXT.search(name) if name.__class__ is str else None
                if m is None:
                    raise DecodeError(
                        f"source.file {name!r} is not a binlog file name like mysql-bin.000003",
                        Code.BAD_FIELD,
                    )
                fileno = int(m.group(1))
            if name.__class__ is str:
                if len(self._files) >= 4096:
                    self._files.clear()
                self._files[name] = fileno
        pos = source.get("pos")
        row = source.get("row")
        return (
            fileno,
            0 if pos is None else _int_field(pos, "source.pos", exact),
            0 if row is None else _int_field(row, "source.row", exact),
        )

    def _seq_oracle(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        commit = source.get("commit_scn")
        scn = source.get("scn")
        return (
            0 if commit is None else _int_field(commit, "source.commit_scn", exact),
            0 if scn is None else _int_field(scn, "source.scn", exact),
        )

    def _seq_sqlserver(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        serial = source.get("event_serial_no")
        return (
            _hex_lsn(source.get("commit_lsn"), "source.commit_lsn", exact),
            _hex_lsn(source.get("change_lsn"), "source.change_lsn", exact),
            0 if serial is None else _int_field(serial, "source.event_serial_no", exact),
        )

    def _seq_mongodb(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        ts = source.get("ts_ms")
        ordinal = source.get("ord")
        return (
            0 if ts is None else _int_field(ts, "source.ts_ms", exact),
            0 if ordinal is None else _int_field(ordinal, "source.ord", exact),
        )

    def _txn(
        self, payload: dict[str, Any], source: dict[str, Any] | None, exact: bool
    ) -> Txn | None:
        """The ``transaction`` block, else the source's ``txId`` (PostgreSQL, Oracle)."""
        block = payload.get("transaction")
        if block is not None:
            if block.__class__ is not dict:
                raise _field_error("transaction", block, "an object or null")
            tid = block.get("id")
            if tid is None:
                raise _field_error("transaction.id", tid, "a string")
            order = block.get("total_order")
            return Txn(
                str(tid),
                order=None
                if order is None
                else _int64_field(order, "transaction.total_order", exact),
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

    def _key_from_options(self, event: ChangeEvent) -> None:
        """Key columns from ``options.primary_keys`` (cached per table)."""
        table = event.source
        try:
            cols = self._pk_cache[table]
        except KeyError:
            cols = key_columns_for(self.options.primary_keys, table)
            if len(self._pk_cache) >= 4096:
                self._pk_cache.clear()
            self._pk_cache[table] = cols
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
        source = payload.get("source")
        if source.__class__ is not dict:
            raise _field_error("source", source, "an object")
        return source

    def _truncate(self, payload: dict[str, Any], record: Record, exact: bool) -> ChangeEvent:
        source = self._source_of(payload)
        ts_ms = self._ts_ms(source, payload, exact)
        return ChangeEvent(
            op=Op.TRUNCATE,
            source=self._table(source, required=True),
            seq=self._seq(source, ts_ms, exact),
            ts_ms=ts_ms,
            txn=self._txn(payload, source, exact),
            origin=record.origin,
        )

    def _message(self, payload: dict[str, Any], record: Record, exact: bool) -> ChangeEvent:
        source = self._source_of(payload)
        message = payload.get("message")
        if message.__class__ is not dict:
            raise _field_error("message", message, 'an object {"prefix", "content"}')
        prefix, content = message.get("prefix"), message.get("content")
        if prefix is not None and prefix.__class__ is not str:
            raise _field_error("message.prefix", prefix, "a string")
        if content is not None and content.__class__ is not str:
            raise _field_error("message.content", content, "encoded bytes as a string")
        ts_ms = self._ts_ms(source, payload, exact)
        return ChangeEvent(
            op=Op.MESSAGE,
            source=self._table(source),
            seq=self._seq(source, ts_ms, exact),
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
            raise _field_error("id", tid, "the transaction id string")
        meta: dict[str, Any] = {}
        count = payload.get("event_count")
        if count is not None:
            meta["event_count"] = _int64_field(count, "event_count", exact)
        collections = payload.get("data_collections")
        if collections is not None:
            if collections.__class__ is not list:
                raise _field_error("data_collections", collections, "an array")
            meta["data_collections"] = [
                {
                    "data_collection": _floats(c.get("data_collection")),
                    "event_count": _int64_field(
                        c.get("event_count"), "data_collections.event_count", exact
                    ),
                }
                if c.__class__ is dict
                else _floats(c)
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
            raise _field_error("source", source, "an object")
        src = source or {}
        ddl = payload.get("ddl")
        if ddl is not None and ddl.__class__ is not str:
            raise _field_error("ddl", ddl, "a string")
        db = payload.get("databaseName") or src.get("db")
        schema = payload.get("schemaName") or src.get("schema")
        table = self._table({"db": db, "schema": schema, "table": src.get("table")})
        ts_ms = self._ts_ms(source, payload, exact)
        changes = payload.get("tableChanges")
        if changes is not None and exact:
            changes = _floats(changes)  # JSON-able again
        return ChangeEvent(
            op=Op.DDL,
            source=table,
            seq=self._seq(source, ts_ms, exact) if source else None,
            ts_ms=ts_ms,
            txn=self._txn(payload, source, exact),
            ddl=ddl,
            origin=record.origin,
            meta={"table_changes": changes} if changes is not None else None,
        )


_SEQ_RULES: dict[str, Callable[[DebeziumJsonDecoder, dict[str, Any], bool], tuple[int, ...]]] = {
    "postgresql": DebeziumJsonDecoder._seq_postgres,
    "mysql": DebeziumJsonDecoder._seq_mysql,
    "mariadb": DebeziumJsonDecoder._seq_mysql,
    "oracle": DebeziumJsonDecoder._seq_oracle,
    "sqlserver": DebeziumJsonDecoder._seq_sqlserver,
    "db2": DebeziumJsonDecoder._seq_sqlserver,
    "mongodb": DebeziumJsonDecoder._seq_mongodb,
}


def _detect_seq_rule(
    source: dict[str, Any],
) -> Callable[[DebeziumJsonDecoder, dict[str, Any], bool], tuple[int, ...]] | None:
    """The rule for a source block whose ``connector`` is missing or unknown."""
    if "lsn" in source:
        return DebeziumJsonDecoder._seq_postgres
    if "scn" in source:
        return DebeziumJsonDecoder._seq_oracle
    if "commit_lsn" in source or "change_lsn" in source:
        return DebeziumJsonDecoder._seq_sqlserver
    if "file" in source and "pos" in source:
        return DebeziumJsonDecoder._seq_mysql
    if "ord" in source:
        return DebeziumJsonDecoder._seq_mongodb
    return None


# --------------------------------------------------------------------------- encoder

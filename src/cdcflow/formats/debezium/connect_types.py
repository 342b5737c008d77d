"""Kafka Connect schemas and logical types: a Connect field schema -> (logical type,
value converter), and the converters of JSON (and Avro) values of each Connect type
(``int32``, ``bytes``, ``org.apache.kafka.connect.data.Decimal``,
``io.debezium.time.MicroTimestamp``, ...). A converter is ``fn(value, column, exact)``.
The table: ``docs/formats/debezium-json.md``."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from cdcflow import types as T
from cdcflow.errors import Code, DecodeError
from cdcflow.formats.common.values import bad_value
from cdcflow.formats.debezium.numbers import I32_MAX, I32_MIN, I64_MAX, I64_MIN, U64_MAX, NeedExact
from cdcflow.formats.debezium.options import DebeziumJsonOptions

_EPOCH_NAIVE = dt.datetime(1970, 1, 1)


_EPOCH_DATE = dt.date(1970, 1, 1)


# Exact decimal arithmetic: no rounding to the default 28 digits, inexact is an error.
_DEC_CTX = decimal.Context(prec=1000, traps=[decimal.InvalidOperation, decimal.Inexact])


def as_floats(value: Any) -> Any:
    """A nested value parsed exactly, with its fractional numbers as floats again and
    integers beyond 64 bits as their text (orjson cannot write them)."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if value.__class__ is int and not I64_MIN <= value <= U64_MAX:
        return str(value)
    if isinstance(value, dict):
        return {k: as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_floats(v) for v in value]
    return value


def plain_json(value: Any) -> str:
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
            "{" + ",".join(f"{plain_json(str(k))}:{plain_json(v)}" for k, v in value.items()) + "}"
        )
    return "[" + ",".join(plain_json(v) for v in value) + "]"


def json_text(value: Any, exact: bool, keep_number_text: bool = False) -> str:
    """Compact JSON text of a nested value (what a ``json`` column holds). Numbers
    print as orjson prints floats, whichever parser read the message, unless
    ``keep_number_text`` (``float_as_decimal``) keeps them as written."""
    if exact:
        if keep_number_text:
            return plain_json(value)
        value = as_floats(value)
    try:
        return orjson.dumps(value, default=_bytes_as_base64).decode()
    except TypeError:  # an integer beyond 64 bits (exact parse only)
        return plain_json(value)


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


# A converter is ``fn(value, column, exact) -> python value`` for a non-null JSON value.

Conv = Callable[[Any, str, bool], Any]
#: a converter to an exact decimal
DecimalConv = Callable[[Any, str, bool], decimal.Decimal]


def _int_checked(value: Any, column: str, exact: bool, lo: int, hi: int, want: str) -> int:
    if value.__class__ is int:
        if lo <= value <= hi:
            return value
    elif value.__class__ is float:
        if not exact:
            raise NeedExact
    elif isinstance(value, decimal.Decimal) and value.is_finite() and value == int(value):
        return _int_checked(int(value), column, exact, lo, hi, want)
    raise bad_value(column, value, want)


def _c_int32(value: Any, column: str, exact: bool) -> int:
    if value.__class__ is int and I32_MIN <= value <= I32_MAX:
        return value
    return _int_checked(value, column, exact, I32_MIN, I32_MAX, "int32")


def _c_int64(value: Any, column: str, exact: bool) -> int:
    if value.__class__ is int and I64_MIN <= value <= I64_MAX:
        return value
    return _int_checked(value, column, exact, I64_MIN, I64_MAX, "int64")


_FLOAT_WORDS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _c_float(value: Any, column: str, exact: bool) -> float:
    if value.__class__ is float:
        return value
    c = value.__class__
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
    return json_text(value, exact)


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


def _decimal_conv(scale: int) -> DecimalConv:
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
                raise NeedExact
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
            source_scale = _param_int(params, "__debezium.source.column.scale", column)
            if length is not None and source_scale is not None and source_scale >= 0:
                return T.decimal_type(length, source_scale), _decimal_text_conv(source_scale)
    base = _BASE_TYPES.get(ftype) if isinstance(ftype, str) else None
    if base is None:
        raise DecodeError(
            f"column {column!r}: unknown Kafka Connect schema type {ftype!r}", Code.BAD_FIELD
        )
    return base


class Struct:
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


def undeclared_error(column: str, which: str, struct: Struct) -> DecodeError:
    return DecodeError(
        f"column {column!r} of the {which} image is not declared by the message's schema "
        f"(its row struct declares {len(struct.columns)} columns); Kafka Connect's "
        "JsonConverter writes exactly the fields of the schema, so the message was altered "
        "or made by another producer. Fix the producer, or set undeclared_columns: keep in "
        "the debezium-json options (YAML: sources[].options.undeclared_columns) to keep the "
        "column with a type inferred from its value",
        Code.UNDECLARED_COLUMN,
    )

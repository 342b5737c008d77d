"""One canonical text per value, computed alike by the source database and by the mirror.

``cdcflow verify`` compares a source table with its mirror without moving the rows: each
side turns every row into the same text, hashes it, and sums the hashes per key range
(:mod:`cdcflow.verify.ranges`). That works only if a value has the same text whichever
engine computes it -- PostgreSQL's or MySQL's SQL on the source, DuckDB's SQL over the
mirror's Arrow data -- and whichever way the format mapped the source type into the mirror
(Debezium's schemas give a ``timestamp``, its schemaless JSON an ``int64`` of
microseconds, Maxwell a string). So a column's *kind* comes from the source type, and each
side has an expression from (kind, its own type) to the kind's text:

========== ================================================ ===============================
kind       canonical text                                   source types
========== ================================================ ===============================
int        decimal digits                                   smallint..bigint, unsigned,
                                                            ``tinyint(1)``, bit, year
decimal    digits without trailing fractional zeros         numeric, decimal
float      ``<mantissa>e<exponent>``, 15 significant        double precision, real
           digits (6 for ``real``/``FLOAT``); ``0``,        (float8/float4, DOUBLE/FLOAT)
           ``nan``, ``inf``, ``-inf``
bool       ``1`` / ``0``                                    boolean
date       days since 1970-01-01                            date
time       microseconds since midnight                      time
timestamp  microseconds since 1970-01-01 (UTC for           timestamp, timestamptz,
           zoned types)                                     datetime, MySQL timestamp
bytes      lower-case hex                                   bytea, binary, varbinary, blob
json       the database's own text of it (see below)        json, jsonb
text       the text                                         everything else (varchar, enum,
                                                            uuid, arrays as JSON, ...)
========== ================================================ ===============================

Floats are compared to the stated significant digits, rounded the same way on both sides
(``floor(x / 10^e + 0.5)``); a value on a rounding edge may still hash differently, and the
row comparison (:func:`same_value`) then accepts a difference of one in the last digit.
JSON is hashed as the database writes it (``jsonb::text``: keys sorted, ``", "``); a
format that re-serialises it (spaces, key order) makes the range differ, and the row
comparison parses both sides before calling them different, so formatting costs time,
never a false mismatch. Rows are joined with the unit separator (``chr(31)``) and a NULL
is the record separator (``chr(30)``).

The hash of a row is data-diff's: the low 60 bits of the MD5 of its text as an integer
(https://github.com/datafold/data-diff, ``sqeleton/abcs/database_types.py``), summed per
range with the row count.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from cdcflow.errors import ConfigError

__all__ = [
    "KINDS",
    "Column",
    "Dialect",
    "duckdb_text",
    "duckdb_row_hash",
    "readable",
    "same_value",
    "sql_row_hash",
    "sql_text",
]

Dialect = Literal["postgresql", "mysql"]
Kind = Literal[
    "int", "decimal", "float", "bool", "date", "time", "timestamp", "bytes", "json", "text"
]
KINDS: tuple[str, ...] = (
    "int",
    "decimal",
    "float",
    "bool",
    "date",
    "time",
    "timestamp",
    "bytes",
    "json",
    "text",
)

#: joins a row's texts; stands for a NULL
SEPARATOR, NULL_MARK = 31, 30


@dataclass(frozen=True)
class Column:
    """One source column as verify compares it.

    Attributes:
        name: the column's name (the mirror's column of the same name).
        kind: one of :data:`KINDS`.
        source_type: the type as the database names it (``int8``, ``decimal(12,2)``).
        digits: significant digits compared (floats: 15, or 6 for single precision).
        unit_us: microseconds per unit of an integer mirror column holding this time
            (Debezium's schemaless timestamps: 1 000 for ``io.debezium.time.Timestamp``,
            1 for ``MicroTimestamp``).
        array: a PostgreSQL array (its JSON text).
        members: a MySQL ``SET`` (its text ``a,b``; a mirror's JSON array of the members,
            as Maxwell writes it, is joined the same way).
        zoned: a timestamp of an instant (PostgreSQL's ``timestamptz``, MySQL's
            ``TIMESTAMP``), not a wall-clock time.
    """

    name: str
    kind: Kind
    source_type: str
    digits: int = 15
    unit_us: int = 1
    array: bool = False
    members: bool = False
    zoned: bool = False


# --------------------------------------------------------------------------- the kinds


def postgres_kind(udt: str, data_type: str, datetime_precision: int | None) -> Column:
    """The column of a PostgreSQL type (``information_schema.columns``: ``udt_name``,
    ``data_type``, ``datetime_precision``); name filled in by the caller."""
    if udt.startswith("_"):
        return Column("", "text", udt, array=True)
    kinds: dict[str, Kind] = {
        "int2": "int",
        "int4": "int",
        "int8": "int",
        "oid": "int",
        "numeric": "decimal",
        "float4": "float",
        "float8": "float",
        "bool": "bool",
        "date": "date",
        "time": "time",
        "timestamp": "timestamp",
        "timestamptz": "timestamp",
        "bytea": "bytes",
        "json": "json",
        "jsonb": "json",
    }
    kind = kinds.get(udt, "text")
    return Column(
        "",
        kind,
        udt,
        digits=6 if udt == "float4" else 15,
        unit_us=_unit(datetime_precision),
        zoned=udt == "timestamptz",
    )


def mysql_kind(data_type: str, column_type: str, datetime_precision: int | None) -> Column:
    """The column of a MySQL/MariaDB type (``information_schema.COLUMNS``: ``DATA_TYPE``,
    ``COLUMN_TYPE``, ``DATETIME_PRECISION``)."""
    dtype = data_type.lower()
    kinds: dict[str, Kind] = {
        "tinyint": "int",
        "smallint": "int",
        "mediumint": "int",
        "int": "int",
        "integer": "int",
        "bigint": "int",
        "year": "int",
        "bit": "int",
        "decimal": "decimal",
        "numeric": "decimal",
        "float": "float",
        "double": "float",
        "real": "float",
        "date": "date",
        "time": "time",
        "datetime": "timestamp",
        "timestamp": "timestamp",
        "binary": "bytes",
        "varbinary": "bytes",
        "tinyblob": "bytes",
        "blob": "bytes",
        "mediumblob": "bytes",
        "longblob": "bytes",
        "json": "json",
    }
    kind = kinds.get(dtype, "text")
    return Column(
        "",
        kind,
        column_type,
        digits=6 if dtype == "float" else 15,
        unit_us=_unit(datetime_precision),
        members=dtype == "set",
        zoned=dtype == "timestamp",
    )


def _unit(precision: int | None) -> int:
    """Debezium's rule for a temporal value sent as a number without a schema: precision
    up to 3 in milliseconds, else microseconds (debezium.io, "Temporal types",
    ``time.precision.mode=adaptive``)."""
    return 1000 if precision is not None and precision <= 3 else 1


# --------------------------------------------------------------------------- source SQL


def _float_sql(x: str, digits: int, dialect: Dialect) -> str:
    """``<mantissa>e<exponent>`` of ``x`` (a double) to ``digits`` significant digits."""
    log10 = "log" if dialect == "postgresql" else "LOG10"
    cast_int = "::bigint" if dialect == "postgresql" else ""
    exp = f"(floor({log10}(abs({x}))) - {digits - 1})"
    scaled = f"(CASE WHEN {exp} >= 0 THEN {x} / power(10, {exp}) ELSE {x} * power(10, -{exp}) END)"
    mantissa = f"floor({scaled} + 0.5){cast_int}"
    text = "::text" if dialect == "postgresql" else ""
    if dialect == "postgresql":
        body = f"({mantissa}){text} || 'e' || ({exp})::int::text"
        return (
            f"CASE WHEN {x} = 0 THEN '0' WHEN {x} = 'NaN' THEN 'nan' "
            f"WHEN {x} = 'Infinity' THEN 'inf' WHEN {x} = '-Infinity' THEN '-inf' "
            f"ELSE {body} END"
        )
    body = f"CONCAT(CAST({mantissa} AS SIGNED), 'e', CAST({exp} AS SIGNED))"
    return f"CASE WHEN {x} = 0 THEN '0' ELSE {body} END"


def sql_text(column: Column, dialect: Dialect, quote: str) -> str:
    """The SQL expression giving ``column``'s canonical text (NULL for NULL);
    ``quote``: the column's quoted name."""
    c, k = quote, column.kind
    if dialect == "postgresql":
        if column.array:
            return f"array_to_json({c})::text"
        return {
            "int": f"{c}::text",
            "decimal": f"trim_scale({c})::text",
            "float": _float_sql(f"{c}::float8", column.digits, dialect),
            "bool": f"CASE WHEN {c} THEN '1' ELSE '0' END",
            "date": f"({c} - DATE '1970-01-01')::text",
            "time": f"(extract(epoch FROM {c}) * 1000000)::bigint::text",
            "timestamp": f"(extract(epoch FROM {c}) * 1000000)::bigint::text",
            "bytes": f"encode({c}, 'hex')",
            "json": f"{c}::jsonb::text",
            "text": f"{c}::text",
        }[k]
    if k == "int":
        return (
            f"CAST({c} + 0 AS CHAR)"
            if column.source_type.startswith("bit")
            else f"CAST({c} AS CHAR)"
        )
    if k == "decimal":
        if re.search(r",\s*[1-9][0-9]*\)", column.source_type):  # a scale above 0
            return f"TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM CAST({c} AS CHAR)))"
        return f"CAST({c} AS CHAR)"
    return {
        "float": _float_sql(f"CAST({c} AS DOUBLE)", column.digits, dialect),
        "bool": f"CAST({c} AS CHAR)",
        "date": f"CAST(DATEDIFF({c}, '1970-01-01') AS CHAR)",
        # TIME_TO_SEC keeps the fraction on MariaDB, drops it on MySQL: parts instead
        "time": f"CAST((HOUR({c}) * 3600 + MINUTE({c}) * 60 + SECOND({c})) * 1000000 "
        f"+ MICROSECOND({c}) AS CHAR)",
        "timestamp": f"CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {c}) AS CHAR)",
        "bytes": f"LOWER(HEX({c}))",
        "json": f"CONVERT(CAST({c} AS CHAR) USING utf8mb4)",
        "text": f"CONVERT({c} USING utf8mb4)",
    }[k]


def sql_row_hash(texts: list[str], dialect: Dialect) -> str:
    """The SQL expression of a row's 60-bit hash from its columns' text expressions."""
    if dialect == "postgresql":
        row = f"concat_ws(chr({SEPARATOR}), {', '.join(f'coalesce({t}, chr({NULL_MARK}))' for t in texts)})"
        return f"('x' || substr(md5({row}), 18))::bit(60)::bigint"
    row = f"CONCAT_WS(CHAR({SEPARATOR}), {', '.join(f'COALESCE({t}, CHAR({NULL_MARK}))' for t in texts)})"
    return f"CAST(CONV(SUBSTRING(MD5({row}), 18), 16, 10) AS UNSIGNED)"


# --------------------------------------------------------------------------- mirror SQL


def _float_duckdb(x: str, digits: int) -> str:
    exp = f"(floor(log10(abs({x}))) - {digits - 1})"
    scaled = f"(CASE WHEN {exp} >= 0 THEN {x} / pow(10, {exp}) ELSE {x} * pow(10, -{exp}) END)"
    return (
        f"CASE WHEN {x} = 0 THEN '0' WHEN isnan({x}) THEN 'nan' "
        f"WHEN isinf({x}) AND {x} > 0 THEN 'inf' WHEN isinf({x}) THEN '-inf' "
        f"ELSE CAST(CAST(floor({scaled} + 0.5) AS BIGINT) AS VARCHAR) || 'e' "
        f"|| CAST(CAST({exp} AS INTEGER) AS VARCHAR) END"
    )


_TRIM_ZEROS = r"regexp_replace(regexp_replace({}, '(\.[0-9]*?)0+$', '\1'), '\.$', '')"


def duckdb_text(column: Column, mirror_type: pa.DataType, quote: str) -> str:
    """The DuckDB expression giving ``column``'s canonical text from the mirror's column
    of type ``mirror_type``.

    Raises:
        ConfigError: the mirror's type cannot hold the kind (a text mirror of a
            ``bytea`` is base64, an integer mirror of a date is days: both understood;
            a struct of a number is not).
    """
    c, k, t = quote, column.kind, mirror_type
    string = pa.types.is_string(t) or pa.types.is_large_string(t)
    integer = pa.types.is_integer(t)
    floating = pa.types.is_floating(t)
    if k == "float" or (k == "decimal" and floating):
        if integer or floating or pa.types.is_decimal(t) or string:
            return _float_duckdb(f"CAST({c} AS DOUBLE)", column.digits)
    elif k == "int":
        if pa.types.is_boolean(t):
            return f"CASE WHEN {c} THEN '1' ELSE '0' END"
        if integer or pa.types.is_decimal(t) or string:
            return f"CAST({c} AS VARCHAR)"
    elif k == "decimal":
        if pa.types.is_decimal(t) or integer or string:
            return _TRIM_ZEROS.format(f"CAST({c} AS VARCHAR)")
    elif k == "bool":
        if pa.types.is_boolean(t):
            return f"CASE WHEN {c} THEN '1' ELSE '0' END"
        if integer:
            return f"CAST({c} AS VARCHAR)"
    elif k == "date":
        if pa.types.is_date(t) or pa.types.is_timestamp(t) or string:
            return f"CAST(date_diff('day', DATE '1970-01-01', CAST({c} AS DATE)) AS VARCHAR)"
        if integer:
            return f"CAST({c} AS VARCHAR)"
    elif k == "time":
        if string or pa.types.is_time(t):
            return f"CAST(epoch_us(CAST({c} AS TIME)) AS VARCHAR)"
        if integer:
            return f"CAST({c} * {column.unit_us} AS VARCHAR)"
    elif k == "timestamp":
        if pa.types.is_timestamp(t):
            return f"CAST(epoch_us({c}) AS VARCHAR)"
        if string:
            zoned = "TIMESTAMPTZ" if column.zoned else "TIMESTAMP"
            return f"CAST(epoch_us(CAST({c} AS {zoned})) AS VARCHAR)"
        if integer:
            return f"CAST({c} * {column.unit_us} AS VARCHAR)"
    elif k == "bytes":
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return f"lower(hex({c}))"
        if string:
            return f"lower(hex(from_base64({c})))"
    elif string and column.members:
        joined = f"array_to_string(CAST(from_json({c}, '[\"VARCHAR\"]') AS VARCHAR[]), ',')"
        return f"CASE WHEN starts_with({c}, '[') THEN {joined} ELSE {c} END"
    elif string:
        return c
    elif k in ("text", "json") and not pa.types.is_nested(t):
        return f"CAST({c} AS VARCHAR)"
    raise ConfigError(
        f"column {column.name}: a {column.source_type} mirrored as {t} cannot be compared; "
        "leave it out with --columns-except"
    )


def duckdb_row_hash(texts: list[str]) -> str:
    """The DuckDB expression of a row's 60-bit hash (as :func:`sql_row_hash`)."""
    row = f"concat_ws(chr({SEPARATOR}), {', '.join(f'coalesce({t}, chr({NULL_MARK}))' for t in texts)})"
    return f"CAST('0x' || substr(md5({row}), 18) AS UBIGINT)"


# --------------------------------------------------------------------------- row compare


def same_value(column: Column, source: str | None, mirror: str | None) -> bool:
    """Whether two canonical texts of ``column`` stand for the same value: equal texts;
    floats one apart in the last compared digit (a rounding edge); JSON equal once parsed.
    """
    if source == mirror:
        return True
    if source is None or mirror is None:
        return False
    if column.kind == "float":
        return _close_floats(source, mirror)
    if column.kind == "json" or column.array:
        try:
            return bool(json.loads(source) == json.loads(mirror))
        except ValueError:
            return False
    return False


def _close_floats(a: str, b: str) -> bool:
    try:
        (ma, _, ea), (mb, _, eb) = a.partition("e"), b.partition("e")
        va, vb = int(ma) * 10.0 ** int(ea or 0), int(mb) * 10.0 ** int(eb or 0)
        unit = 10.0 ** min(int(ea or 0), int(eb or 0))
    except ValueError:
        return False
    return math.isclose(va, vb, rel_tol=0, abs_tol=unit * 1.000001)


def readable(column: Column, text: str | None) -> str | None:
    """A canonical text as a person reads the value: a timestamp in ISO 8601 (UTC for a
    zoned type), a date and a time of day in ISO, a float as a number; others as they are.
    For reports only (the comparison uses the canonical text)."""
    if text is None:
        return None
    try:
        if column.kind == "timestamp":
            moment = _EPOCH + dt.timedelta(microseconds=int(text))
            return moment.isoformat() + ("Z" if column.zoned else "")
        if column.kind == "date":
            return (_EPOCH.date() + dt.timedelta(days=int(text))).isoformat()
        if column.kind == "time":
            return (_EPOCH + dt.timedelta(microseconds=int(text))).time().isoformat()
        if column.kind == "float" and "e" in text:
            mantissa, _, exponent = text.partition("e")
            return repr(float(f"{mantissa}e{exponent}"))
    except (ValueError, OverflowError):
        return text
    return text


_EPOCH = dt.datetime(1970, 1, 1)

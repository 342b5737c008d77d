"""The drs-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.drs_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any, ClassVar

import orjson

from cdcflow.formats.drs_json import (
    IDENTIFIER_JSON,
    IDENTIFIER_JSON_C,
    OP_DDL,
    OP_DELETE,
    OP_INIT,
    OP_INSERT,
    OP_UPDATE,
)
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import (
    ENCODABLE_TYPES,
    EPOCH,
    MICROSECOND,
    Encoder,
    Message,
    SourceChange,
)

#: characters DRS writes as \u escapes (the document's "Common Escape Characters" table;
#: it prints \u003d for "<", a typo for \u003c)
ESCAPES = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    (b"=", b"\\u003d"),
    (b"'", b"\\u0027"),
)


#: logical type -> (mysqlType, sqlType) the encoder declares, as DRS does for MySQL
ENCODE_TYPES: dict[str, tuple[str, int]] = {
    "boolean": ("tinyint", -6),
    "int32": ("int", 4),
    "int64": ("bigint", -5),
    "float32": ("float", 6),
    "float64": ("double", 8),
    "decimal": ("decimal", 3),
    "string": ("varchar", 12),
    "json": ("json", 12),
    "binary": ("varbinary", -3),
    "date": ("date", 91),
    "time": ("time", 92),
    "timestamp": ("datetime", 94),
    "timestamptz": ("timestamp", 93),
}


def java_double(x: float) -> str:
    """Java ``Double.toString``: ``1.2510357E7``, ``10357.0``, ``1.0E-4``, ``NaN``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    if 1e-3 <= abs(x) < 1e7:
        return repr(x)
    _, digits, exp = decimal.Decimal(repr(abs(x))).normalize().as_tuple()
    mantissa = f"{digits[0]}." + ("".join(map(str, digits[1:])) or "0")
    return ("-" if x < 0 else "") + f"{mantissa}E{len(digits) - 1 + int(exp)}"


def java_bytes(value: bytes) -> str:
    """Java ``Arrays.toString(byte[])`` (signed bytes): ``b"j\\xfd"`` -> ``"[106, -3]"``."""
    return "[" + ", ".join(str(b - 256 if b > 127 else b) for b in value) + "]"


def _epoch_seconds_text(value: dt.datetime) -> str:
    micros = (value.astimezone(dt.UTC) - EPOCH) // MICROSECOND
    sign = "-" if micros < 0 else ""
    seconds, micros = divmod(abs(micros), 1_000_000)
    if micros % 1000 == 0:
        return f"{sign}{seconds}.{micros // 1000:03d}"
    return f"{sign}{seconds}.{micros:06d}"


def encode_text(logical: str, value: Any, json_c: bool) -> str | None:
    """One typed value as the text DRS writes for it (``None`` stays ``None``)."""
    if value is None:
        return None
    base = "decimal" if logical.startswith("decimal") else logical
    if base in ("string", "json"):
        return value
    if base == "boolean":
        return "1" if value else "0"
    if base in ("int32", "int64"):
        return str(int(value))
    if base in ("float32", "float64"):
        return java_double(float(value))
    if base == "decimal":
        return format(value, "f")
    if base == "binary":
        return java_bytes(bytes(value))
    if base in ("date", "time"):
        return value.isoformat()
    if base == "timestamp":
        return value.isoformat(sep=" ")
    if base == "timestamptz":
        if json_c:
            return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        return _epoch_seconds_text(value)
    return str(value)


class _DrsJsonEncoderBase(Encoder):
    """Shared implementation; ``_json_c`` selects the JSON-C rules."""

    _json_c: ClassVar[bool] = False

    def encode(self, change: SourceChange) -> list[Message]:
        """One DRS message per change, with ``id = change.seq`` and ``es = change.ts_ms``.

        The Kafka key is ``database.table`` (DRS's "by table" partitioning). A truncate is
        a DDL message with a ``TRUNCATE TABLE`` statement.
        """
        table = change.table
        database = table.database or table.schema
        json_c = self._json_c
        mysql_type = {}
        sql_type = {}
        for col, logical in change.columns.items():
            base = "decimal" if logical.startswith("decimal") else logical
            mysql_type[col], sql_type[col] = ENCODE_TYPES.get(base, ("varchar", 12))

        def image(row: Any) -> list[dict[str, Any]] | None:
            if row is None:
                return None
            cols = change.columns
            return [{c: encode_text(cols.get(c, "string"), v, json_c) for c, v in row.items()}]

        msg: dict[str, Any] = {
            "mysqlType": mysql_type,
            "id": change.seq,
            "es": change.ts_ms,
            "ts": change.ts_ms,
            "database": database,
            "table": table.table,
            "type": None,
            "isDdl": False,
            "sql": "",
            "sqlType": sql_type,
            "data": None,
            "old": None,
            "pkNames": list(change.key_columns) or None,
        }
        op = change.op
        if op is Op.INSERT or op is Op.SNAPSHOT:
            msg["type"] = OP_INSERT if op is Op.INSERT else OP_INIT
            msg["data"] = image(change.after)
        elif op is Op.UPDATE:
            msg["type"] = OP_UPDATE
            msg["data"] = image(change.after)
            msg["old"] = image(change.before)
        elif op is Op.DELETE:
            msg["type"] = OP_DELETE
            msg["data" if json_c else "old"] = image(change.before)
        elif op is Op.TRUNCATE:
            msg.update(
                type=OP_DDL,
                isDdl=True,
                mysqlType=None,
                sqlType=None,
                pkNames=None,
                sql=f"TRUNCATE TABLE `{database}`.`{table.table}`",
            )
        else:
            raise ValueError(f"DRS JSON has no message for {op}")
        value = orjson.dumps(msg)
        for raw, escaped in ESCAPES:
            value = value.replace(raw, escaped)
        return [Message(value=value, key=f"{database}.{table.table}".encode())]


class DrsJsonEncoder(_DrsJsonEncoderBase):
    """Encoder of DRS JSON (``drs-json``)."""

    identifier: ClassVar[str] = IDENTIFIER_JSON
    _json_c: ClassVar[bool] = False
    exact_types: ClassVar[frozenset[str]] = ENCODABLE_TYPES - {"boolean", "float32"}


class DrsJsonCEncoder(_DrsJsonEncoderBase):
    """Encoder of DRS JSON-C (``drs-json-c``): timestamps lose their fraction of a second,
    as the document's ``yyyy-mm-dd hh:mm:ss`` says, so ``timestamptz`` is not exact."""

    identifier: ClassVar[str] = IDENTIFIER_JSON_C
    _json_c: ClassVar[bool] = True
    exact_types: ClassVar[frozenset[str]] = ENCODABLE_TYPES - {"boolean", "float32", "timestamptz"}

"""The dts-avro encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.dts_avro` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, ClassVar

import fastavro
import orjson

from cdcflow.formats.dts_avro import (
    EMPTY_OBJECT,
    IDENTIFIER,
    NAMESPACE,
    record_schema,
)
from cdcflow.model import Op
from cdcflow.types import EPOCH, parse_type
from cdcflow_testkit.encoders.base import ENCODABLE_TYPES, Encoder, Message, SourceChange

DTS_OPS = {
    Op.INSERT: "INSERT",
    Op.SNAPSHOT: "INIT",
    Op.UPDATE: "UPDATE",
    Op.DELETE: "DELETE",
}


# logical type -> (MySQL binlog type code, PostgreSQL type OID) for Field.dataTypeNumber.
# The MySQL codes are the binlog column types; that DTS uses OIDs for PostgreSQL is an
# assumption of this encoder (the decoder never relies on it).
TYPE_NUMBERS = {
    "boolean": (1, 16),
    "int32": (3, 23),
    "int64": (8, 20),
    "float32": (4, 700),
    "float64": (5, 701),
    "decimal": (246, 1700),
    "string": (253, 1043),
    "json": (245, 114),
    "binary": (252, 17),
    "date": (10, 1082),
    "time": (19, 1083),
    "timestamp": (18, 1114),
    "timestamptz": (17, 1184),
}


def _encode_value(value: Any, logical: str) -> Any:
    """A typed value -> the DTS union branch (name, fields) fastavro writes."""
    if value is None:
        return None
    base, p, s = parse_type(logical)
    if base in ("int32", "int64", "boolean"):
        digits = 10 if base == "int32" else 19
        return (NAMESPACE + "Integer", {"precision": digits, "value": str(int(value))})
    if base == "decimal":
        return (NAMESPACE + "Decimal", {"value": str(value), "precision": p, "scale": s})
    if base in ("float32", "float64"):
        return (NAMESPACE + "Float", {"value": float(value), "precision": 0, "scale": 0})
    if base == "string":
        return (NAMESPACE + "Character", {"charset": "utf8mb4", "value": value.encode("utf-8")})
    if base == "json":
        return (NAMESPACE + "TextObject", {"type": "JSON", "value": value})
    if base == "binary":
        return (NAMESPACE + "BinaryObject", {"type": "BLOB", "value": bytes(value)})
    none = {
        "year": None,
        "month": None,
        "day": None,
        "hour": None,
        "minute": None,
        "second": None,
        "millis": None,
    }
    if base == "date":
        return (
            NAMESPACE + "DateTime",
            {**none, "year": value.year, "month": value.month, "day": value.day},
        )
    if base == "time":
        return (
            NAMESPACE + "DateTime",
            {
                **none,
                "hour": value.hour,
                "minute": value.minute,
                "second": value.second,
                "millis": value.microsecond,
            },
        )
    if base == "timestamp":
        return (
            NAMESPACE + "DateTime",
            {
                "year": value.year,
                "month": value.month,
                "day": value.day,
                "hour": value.hour,
                "minute": value.minute,
                "second": value.second,
                "millis": value.microsecond,
            },
        )
    if base == "timestamptz":
        delta = value - EPOCH
        return (
            NAMESPACE + "Timestamp",
            {"timestamp": delta.days * 86_400 + delta.seconds, "millis": delta.microseconds},
        )
    raise ValueError(f"dts-avro cannot encode logical type {logical!r}")


class DtsAvroEncoder(Encoder):
    """Encodes workload changes as DTS would publish them (schemaless Avro Records).

    A table without a schema is published as a MySQL source (``objectName`` ``db.table``,
    MySQL binlog type codes); one with a schema as PostgreSQL (``db.schema.table``).
    ``id`` is the change's ``seq``, ``sourceTimestamp`` its ``ts_ms`` in seconds,
    ``sourcePosition`` the ``seq`` as text (a placeholder: DTS does not document its
    layout), and the primary key is named in the ``pk_uk_info`` tag. Columns a change
    does not carry are written as ``EmptyObject.NONE``.
    """

    identifier: ClassVar[str] = IDENTIFIER
    exact_types: ClassVar[frozenset[str]] = ENCODABLE_TYPES - {"boolean", "float32"}

    def encode(self, change: SourceChange) -> list[Message]:
        table = change.table
        pg = bool(table.schema)
        parts = [table.database, table.schema, table.table] if pg else [table.database, table.table]
        object_name = ".".join(p.replace(".", "\\u002E") for p in parts)
        names = list(change.columns)
        fields = [
            {"name": c, "dataTypeNumber": TYPE_NUMBERS[parse_type(t)[0]][1 if pg else 0]}
            for c, t in change.columns.items()
        ]

        def image(row: Mapping[str, Any] | None) -> list[Any] | None:
            if row is None:
                return None
            return [
                _encode_value(row[c], change.columns[c]) if c in row else (EMPTY_OBJECT, "NONE")
                for c in names
            ]

        tags = {}
        if change.key_columns:
            tags["pk_uk_info"] = orjson.dumps({"PRIMARY": list(change.key_columns)}).decode()
        if change.op is Op.TRUNCATE:
            operation, before, after = "DDL", None, f"TRUNCATE TABLE {object_name}"
            fields_value: Any = None
        else:
            operation = DTS_OPS[change.op]
            before = image(change.before) if change.op in (Op.UPDATE, Op.DELETE) else None
            after = image(change.after) if change.op is not Op.DELETE else None
            fields_value = fields
        rec = {
            "version": 0,
            "id": change.seq,
            "sourceTimestamp": change.ts_ms // 1000,
            "sourcePosition": str(change.seq),
            "safeSourcePosition": "",
            "sourceTxid": change.txn_id or "",
            "source": {"sourceType": "PostgreSQL" if pg else "MySQL", "version": ""},
            "operation": operation,
            "objectName": object_name,
            "processTimestamps": None,
            "tags": tags,
            "fields": fields_value,
            "beforeImages": before,
            "afterImages": after,
            "bornTimestamp": change.ts_ms,
        }
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, record_schema(), rec)
        return [Message(value=buf.getvalue(), key=object_name.encode())]

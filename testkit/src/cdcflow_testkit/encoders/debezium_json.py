"""The debezium-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.debezium.json_decoder` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Mapping
from typing import Any

import orjson

from cdcflow import types as T
from cdcflow.formats.debezium.envelope import OP_TRUNCATE, ROW_OPS
from cdcflow.formats.debezium.options import IDENTIFIER
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import (
    ENCODABLE_TYPES,
    EPOCH_DATE,
    EPOCH_NAIVE,
    Encoder,
    Message,
    SourceChange,
)

#: exact decimal arithmetic: no rounding to 28 digits, inexact is an error
DEC_CTX = decimal.Context(prec=1000, traps=[decimal.InvalidOperation, decimal.Inexact])


OP_CODES: dict[Op, str] = {v: k for k, v in ROW_OPS.items()} | {Op.TRUNCATE: OP_TRUNCATE}


TXN_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


PG_SOURCE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": "true,last,false,incremental"},
            "default": "false",
            "field": "snapshot",
        },
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "int64", "optional": True, "field": "xmin"},
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "field": "source",
}


ENCODE_SCHEMA: dict[str, dict[str, Any]] = {
    "boolean": {"type": "boolean"},
    "int32": {"type": "int32"},
    "int64": {"type": "int64"},
    "float32": {"type": "float"},
    "float64": {"type": "double"},
    "string": {"type": "string"},
    "json": {"type": "string", "name": "io.debezium.data.Json", "version": 1},
    "binary": {"type": "bytes"},
    "date": {"type": "int32", "name": "io.debezium.time.Date", "version": 1},
    "time": {"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1},
    "timestamp": {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1},
    "timestamptz": {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1},
}


def _connect_field(name: str, logical: str) -> dict[str, Any]:
    base, precision, scale = T.parse_type(logical)
    f: dict[str, Any]
    if base == "decimal":
        f = {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
        }
    else:
        f = dict(ENCODE_SCHEMA[base])
    f["optional"] = True
    f["field"] = name
    return f


def _encode_value(value: Any, logical: str) -> Any:
    if value is None:
        return None
    base, _, scale = T.parse_type(logical)
    if base == "decimal":
        assert scale is not None
        q = decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-scale), context=DEC_CTX)
        sign, digits, _ = q.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
        return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()
    if base == "binary":
        return base64.b64encode(bytes(value)).decode()
    if base == "date":
        return (value - EPOCH_DATE).days
    if base == "time":
        return (
            (value.hour * 60 + value.minute) * 60 + value.second
        ) * 1_000_000 + value.microsecond
    if base == "timestamp":
        return (value.replace(tzinfo=None) - EPOCH_NAIVE) // dt.timedelta(microseconds=1)
    if base == "timestamptz":
        utc = value.astimezone(dt.UTC).replace(tzinfo=None)
        return utc.isoformat() + "Z"
    return value


class DebeziumJsonEncoder(Encoder):
    """Encodes workload changes as Debezium's PostgreSQL connector publishes them with
    ``JsonConverter`` ``schemas.enable=true`` (key and value carry their schema, so
    decimals, dates and timestamps keep their types), ``tombstones.on.delete=false``.

    The value is ``{"schema": Envelope, "payload": {before, after, source, op, ts_ms,
    transaction}}``; ``source`` is a PostgreSQL source block with ``lsn`` = the change's
    ``seq`` and ``txId`` = its ``txn_id``. The key is ``{"schema": Key, "payload":
    {key columns}}``, or no key for a table without key columns.
    """

    identifier = IDENTIFIER
    exact_types = ENCODABLE_TYPES

    def __init__(self) -> None:
        self._schemas: dict[Any, tuple[dict[str, Any], dict[str, Any] | None]] = {}

    def _schemas_for(self, change: SourceChange) -> tuple[dict[str, Any], dict[str, Any] | None]:
        t = change.table
        cache_key = (
            t.database,
            t.schema,
            t.table,
            tuple(change.columns.items()),
            change.key_columns,
        )
        found = self._schemas.get(cache_key)
        if found is not None:
            return found
        prefix = f"cdcflow.{t.schema or t.database}.{t.table}"
        row = [_connect_field(c, lt) for c, lt in change.columns.items()]
        value_row = {"type": "struct", "fields": row, "optional": True, "name": f"{prefix}.Value"}
        envelope = {
            "type": "struct",
            "fields": [
                {**value_row, "field": "before"},
                {**value_row, "field": "after"},
                PG_SOURCE_SCHEMA,
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                TXN_SCHEMA,
            ],
            "optional": False,
            "name": f"{prefix}.Envelope",
            "version": 1,
        }
        key_schema = None
        if change.key_columns:
            key_schema = {
                "type": "struct",
                "fields": [
                    {**_connect_field(c, change.columns[c]), "optional": False}
                    for c in change.key_columns
                ],
                "optional": False,
                "name": f"{prefix}.Key",
            }
        found = (envelope, key_schema)
        self._schemas[cache_key] = found
        return found

    def encode(self, change: SourceChange) -> list[Message]:
        """One Debezium message for ``change`` (INSERT -> c, UPDATE -> u, DELETE -> d,
        SNAPSHOT -> r, TRUNCATE -> t)."""
        code = OP_CODES.get(change.op)
        if code is None:
            raise ValueError(f"debezium-json cannot encode op {change.op}")
        envelope, key_schema = self._schemas_for(change)
        cols = change.columns

        def image(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
            if row is None:
                return None
            return {c: _encode_value(row[c], cols[c]) for c in cols if c in row}

        txid: Any = change.txn_id
        if isinstance(txid, str) and txid.isdigit():
            txid = int(txid)
        source = {
            "version": "2.7.0.Final",
            "connector": "postgresql",
            "name": "cdcflow",
            "ts_ms": change.ts_ms,
            "snapshot": "true" if change.op is Op.SNAPSHOT else "false",
            "db": change.table.database,
            "sequence": orjson.dumps([None, str(change.seq)]).decode(),
            "schema": change.table.schema,
            "table": change.table.table,
            "txId": txid,
            "lsn": change.seq,
            "xmin": None,
        }
        payload: dict[str, Any] = {"before": None, "after": None}
        if change.op is not Op.TRUNCATE:
            payload["before"] = (
                image(change.before) if change.op in (Op.UPDATE, Op.DELETE) else None
            )
            payload["after"] = image(change.after) if change.op is not Op.DELETE else None
        payload.update(source=source, op=code, ts_ms=change.ts_ms, transaction=None)
        value = orjson.dumps({"schema": envelope, "payload": payload})
        key = None
        if key_schema is not None and change.op is not Op.TRUNCATE:
            row = change.after if change.after is not None else change.before
            if row is not None:
                key = orjson.dumps(
                    {
                        "schema": key_schema,
                        "payload": {c: _encode_value(row[c], cols[c]) for c in change.key_columns},
                    }
                )
        return [Message(value=value, key=key)]

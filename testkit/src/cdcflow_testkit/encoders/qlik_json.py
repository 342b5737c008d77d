"""The qlik-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.qlik_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
from typing import Any, ClassVar

import orjson

from cdcflow.formats.qlik_json import (
    IDENTIFIER,
    MAGIC,
    OP_DELETE,
    OP_INSERT,
    OP_REFRESH,
    OP_UPDATE,
    TYPE_DATA,
    TYPE_METADATA,
)
from cdcflow.model import Op
from cdcflow.types import (
    parse_type,
)
from cdcflow_testkit.encoders.base import (
    ENCODABLE_TYPES,
    EPOCH_NAIVE,
    Encoder,
    Message,
    SourceChange,
)

QLIK_TYPES = {  # logical type -> (Replicate type, length)
    "boolean": ("BOOLEAN", 1),
    "int32": ("INT4", 4),
    "int64": ("INT8", 8),
    "float32": ("REAL4", 4),
    "float64": ("REAL8", 8),
    "string": ("WSTRING", 4000),
    "json": ("NCLOB", 0),
    "binary": ("BYTES", 8000),
    "date": ("DATE", 4),
    "time": ("TIME", 4),
    "timestamp": ("DATETIME", 8),
    "timestamptz": ("DATETIME", 8),
}


def _json_value(value: Any) -> Any:
    """A typed value in Replicate's JSON form (the data-type table of the Kafka target)."""
    if value is None:
        return None
    if isinstance(value, decimal.Decimal):
        return str(value)  # NUMERIC -> JSON string
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex().upper()  # binary -> hexadecimal digits
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return value


class QlikJsonEncoder(Encoder):
    """Publishes changes as Replicate would with the envelope on, metadata messages on,
    and message key "schema and table name": an MD message before the first data message
    of a table (and again when its columns change), data messages with ``messageSchemaId``
    set to that MD message's ``schemaId``. Truncates are not published by Replicate and
    raise ``ValueError``.
    """

    identifier: ClassVar[str] = IDENTIFIER
    exact_types: ClassVar[frozenset[str]] = ENCODABLE_TYPES - {"json", "timestamptz"}

    def __init__(self) -> None:
        self._tables: dict[str, tuple[Any, str, int]] = {}  # name -> (signature, schemaId, version)
        self._txn_counters: dict[str, int] = {}

    def encode(self, change: SourceChange) -> list[Message]:
        """``[MD, DT]`` for a table's first change (or a changed structure), else ``[DT]``."""
        if change.op not in (Op.INSERT, Op.UPDATE, Op.DELETE, Op.SNAPSHOT):
            raise ValueError(f"Qlik Replicate publishes no data message for {change.op.value}")
        t = change.table
        schema = t.schema or t.database
        name = f"{schema}.{t.table}"
        key = name.encode()
        out: list[Message] = []
        signature = (tuple(change.columns.items()), tuple(change.key_columns))
        known = self._tables.get(name)
        if known is None or known[0] != signature:
            version = 1 if known is None else known[2] + 1
            md, schema_id = self._metadata(change, schema, version)
            self._tables[name] = (signature, schema_id, version)
            out.append(Message(value=md, key=key))
        schema_id = self._tables[name][1]
        out.append(Message(value=self._data(change, schema_id), key=key))
        return out

    def _metadata(self, change: SourceChange, schema: str, version: int) -> tuple[bytes, str]:
        columns = {}
        for ordinal, (col, logical) in enumerate(change.columns.items(), start=1):
            base, p, s = parse_type(logical)
            qtype, length = ("NUMERIC", 0) if base == "decimal" else QLIK_TYPES[base]
            pk = change.key_columns.index(col) + 1 if col in change.key_columns else 0
            columns[col] = {
                "ordinal": ordinal,
                "type": qtype,
                "length": length,
                "precision": p or 0,
                "scale": s or 0,
                "primaryKeyPosition": pk,
                "nullable": pk == 0,
            }
        lineage = {
            "server": "cdcflow",
            "task": "cdcflow-workload",
            "schema": schema,
            "table": change.table.table,
            "tableVersion": version,
            "timestamp": _utc_text(change.ts_ms),
        }
        schema_id = hashlib.sha1(
            orjson.dumps([lineage["schema"], lineage["table"], version, columns])
        ).hexdigest()[:32]
        message = {
            "schemaId": schema_id,
            "lineage": lineage,
            "tableStructure": {"tableColumns": columns},
        }
        return _envelope(TYPE_METADATA, None, message), schema_id

    def _data(self, change: SourceChange, schema_id: str) -> bytes:
        cols = list(change.columns)
        lob = {c for c, t in change.columns.items() if t == "json"}
        img = change.before if change.op is Op.DELETE else change.after  # the row's image
        row = img or {}

        def mask(names: Any) -> str:
            bits = sum(1 << i for i, c in enumerate(cols) if c in names)
            width = max(2, -(-len(cols) // 8) * 2)
            return f"{bits:0{width}X}"

        def image(img: Any) -> dict[str, Any] | None:
            if img is None:
                return None
            return {c: _json_value(img.get(c)) for c in cols}

        if change.op is Op.UPDATE:
            before = change.before or {}
            changed = [
                c
                for c in cols
                if c not in lob and c in row and (c not in before or before[c] != row[c])
            ]
        elif change.op is Op.DELETE:
            changed = list(change.key_columns)
        else:
            changed = [c for c in cols if c in row and c not in lob]
        cdc = change.op is not Op.SNAPSHOT
        if change.txn_id is None:
            tid, order, last = f"{change.seq:032X}", 1, True
        else:
            order = self._txn_counters.get(change.txn_id, 0) + 1
            self._txn_counters[change.txn_id] = order
            tid, last = change.txn_id, None
        headers = {
            "operation": {
                Op.SNAPSHOT: OP_REFRESH,
                Op.INSERT: OP_INSERT,
                Op.UPDATE: OP_UPDATE,
                Op.DELETE: OP_DELETE,
            }[change.op],
            "changeSequence": f"{change.seq:035d}" if cdc else "",
            "timestamp": _utc_text(change.ts_ms) if cdc else "",
            "streamPosition": f"{change.seq:016x}" if cdc else "",
            "transactionId": tid if cdc else "",
            "changeMask": mask(changed),
            "columnMask": mask([c for c in cols if c in row]),
            "transactionEventCounter": order if cdc else None,
            "transactionLastEvent": last if cdc else None,
        }
        message = {
            "data": image(img),
            "beforeData": image(change.before) if change.op is Op.UPDATE else None,
            "headers": headers,
        }
        return _envelope(TYPE_DATA, schema_id, message)


def _utc_text(ts_ms: int) -> str:
    return (EPOCH_NAIVE + dt.timedelta(milliseconds=ts_ms)).isoformat(timespec="milliseconds")


def _envelope(kind: str, schema_id: str | None, message: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "magic": MAGIC,
            "type": kind,
            "headers": None,
            "messageSchemaId": schema_id,
            "messageSchema": None,
            "message": message,
        }
    )

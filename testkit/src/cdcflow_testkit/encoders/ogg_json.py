"""The ogg-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.ogg_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from typing import Any, ClassVar

import orjson

from cdcflow.formats.ogg_json import (
    IDENTIFIER,
)
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import EPOCH, Encoder, Message, SourceChange


def _json_value(v: Any, logical: str | None) -> Any:
    """A typed value as the JSON formatter prints it."""
    if v is None:
        return None
    if logical == "json":
        return v
    if isinstance(v, decimal.Decimal):
        return orjson.Fragment(str(v).encode())  # NUMBER as a JSON number
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(bytes(v)).decode()  # RAW/BLOB as base64
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return v.isoformat(sep=" ", timespec="microseconds")
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    return v


def _ts_text(ms: int) -> str:
    return (
        (EPOCH + dt.timedelta(milliseconds=ms))
        .replace(tzinfo=None)
        .isoformat(sep=" ", timespec="microseconds")
    )


class OggJsonEncoder(Encoder):
    """Writes workload changes as the GoldenGate JSON formatter does, with
    ``metaColumnsTemplate`` ``table, op_type, op_ts, current_ts, pos, primary_keys`` and
    ``${xid}``/``${txind}`` when the change has a transaction id.

    ``pos`` is ``seq`` printed as 20 zero-padded digits; ``op_ts`` is ``ts_ms`` in UTC;
    updates carry full before and after images (``GETUPDATEBEFORES``, full logging).
    """

    identifier: ClassVar[str] = IDENTIFIER
    # dates, timestamps and binary arrive as strings, NUMBER as floats, so only these
    exact_types: ClassVar[frozenset[str]] = frozenset(
        {"int32", "int64", "float64", "string", "boolean"}
    )

    def encode(self, change: SourceChange) -> list[Message]:
        op_type = {
            Op.INSERT: "I",
            Op.SNAPSHOT: "I",
            Op.UPDATE: "U",
            Op.DELETE: "D",
            Op.TRUNCATE: "T",
        }[change.op]
        table = change.table
        types = change.columns
        msg: dict[str, Any] = {
            "table": ".".join(p for p in (table.schema or table.database, table.table) if p),
            "op_type": op_type,
            "op_ts": _ts_text(change.ts_ms),
            "current_ts": _ts_text(change.ts_ms).replace(" ", "T"),
            "pos": f"{change.seq:020d}",
            "primary_keys": list(change.key_columns),
        }
        if change.txn_id is not None:
            msg["xid"] = change.txn_id
        if change.op in (Op.UPDATE, Op.DELETE) and change.before is not None:
            msg["before"] = {c: _json_value(v, types.get(c)) for c, v in change.before.items()}
        if change.op in (Op.INSERT, Op.SNAPSHOT, Op.UPDATE) and change.after is not None:
            msg["after"] = {c: _json_value(v, types.get(c)) for c, v in change.after.items()}
        row = change.after if change.after is not None else change.before or {}
        key = "_".join(str(row.get(c)) for c in change.key_columns)
        return [Message(value=orjson.dumps(msg), key=key.encode())]

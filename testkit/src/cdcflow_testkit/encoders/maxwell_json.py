"""The maxwell-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.maxwell_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import zlib
from typing import Any, ClassVar

import orjson

from cdcflow.formats.maxwell_json import (
    IDENTIFIER,
    TYPE_BOOTSTRAP_INSERT,
    TYPE_DELETE,
    TYPE_INSERT,
    TYPE_UPDATE,
)
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import Encoder, Message, SourceChange


def _json_value(v: Any, logical: str | None) -> Any:
    """A typed value as Maxwell prints it."""
    if v is None or isinstance(v, bool | int | float | str) and logical != "json":
        if isinstance(v, bool):
            return int(v)  # MySQL BOOL is TINYINT(1)
        return v
    if logical == "json":
        return orjson.Fragment(v.encode() if isinstance(v, str) else orjson.dumps(v))
    if isinstance(v, decimal.Decimal):
        return orjson.Fragment(str(v).encode())  # BigDecimal as a JSON number
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(bytes(v)).decode()  # BLOB/BINARY as base64
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:  # TIMESTAMP: Maxwell prints UTC
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return v.isoformat(sep=" ", timespec="microseconds" if v.microsecond else "seconds")
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    return str(v)


class MaxwellJsonEncoder(Encoder):
    """Writes workload changes as Maxwell does with ``output_binlog_position``,
    ``output_commit_info``, ``output_xoffset`` and ``output_primary_key_columns`` on.

    ``position`` is ``mysql-bin.000001:<seq>``; ``ts`` is ``ts_ms // 1000``. A change
    without ``txn_id`` is its own (autocommit) transaction: ``xid`` = ``seq`` and
    ``commit: true``. Changes with a ``txn_id`` share an ``xid`` and count ``xoffset``;
    the encoder cannot know which is last, so it never prints ``commit`` for them.
    """

    identifier: ClassVar[str] = IDENTIFIER
    # dates, times and binary arrive as strings, decimals as floats, booleans as 0/1
    exact_types: ClassVar[frozenset[str]] = frozenset({"int32", "int64", "float64", "string"})

    def __init__(self) -> None:
        self._txn: tuple[str, int] | None = None

    def encode(self, change: SourceChange) -> list[Message]:
        types = change.columns
        if change.op is Op.TRUNCATE:  # Maxwell publishes nothing for TRUNCATE TABLE
            return []
        typ = {
            Op.INSERT: TYPE_INSERT,
            Op.UPDATE: TYPE_UPDATE,
            Op.DELETE: TYPE_DELETE,
            Op.SNAPSHOT: TYPE_BOOTSTRAP_INSERT,
        }[change.op]
        row = change.before if change.op is Op.DELETE else change.after
        assert row is not None
        msg: dict[str, Any] = {
            "database": change.table.database or change.table.schema,
            "table": change.table.table,
            "type": typ,
            "ts": change.ts_ms // 1000,
        }
        if change.txn_id is None:
            msg["xid"] = change.seq
            msg["commit"] = True
        else:
            if self._txn is None or self._txn[0] != change.txn_id:
                self._txn = (change.txn_id, 0)
            else:
                self._txn = (change.txn_id, self._txn[1] + 1)
            tid = change.txn_id
            msg["xid"] = int(tid) if tid.isdigit() else zlib.crc32(tid.encode())
            msg["xoffset"] = self._txn[1]
        msg["position"] = f"mysql-bin.000001:{change.seq}"
        msg["primary_key_columns"] = list(change.key_columns)
        msg["data"] = {c: _json_value(v, types.get(c)) for c, v in row.items()}
        if change.op is Op.UPDATE and change.before is not None:
            msg["old"] = {
                c: _json_value(v, types.get(c))
                for c, v in change.before.items()
                if c not in row or row[c] != v
            }
        key = {"database": msg["database"], "table": msg["table"]}
        for c in change.key_columns:
            key["pk." + c.lower()] = msg["data"].get(c)
        return [Message(value=orjson.dumps(msg), key=orjson.dumps(key))]

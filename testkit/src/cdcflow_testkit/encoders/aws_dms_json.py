"""The aws-dms-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.aws_dms_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Iterable
from typing import Any, ClassVar

import orjson

from cdcflow.formats.aws_dms_json import (
    IDENTIFIER,
)
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import EPOCH, Encoder, Message, SourceChange

#: logical type -> DMS data type in ``table-def``
DMS_TYPES = {
    "boolean": "BOOLEAN",
    "int32": "INT32",
    "int64": "INT64",
    "float32": "REAL4",
    "float64": "REAL8",
    "string": "STRING",
    "json": "STRING",
    "binary": "BLOB",
    "date": "DATE",
    "time": "TIME",
    "timestamp": "DATETIME",
    "timestamptz": "DATETIME",
}


def _json_value(v: Any, logical: str | None) -> Any:
    """A typed value as DMS writes it."""
    if v is None or logical == "json":
        return v
    if isinstance(v, decimal.Decimal):
        return str(v)  # NUMERIC as text keeps its digits
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return v.isoformat(timespec="microseconds") + "Z"
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    return v


def _stamp(us: int) -> str:
    text = (EPOCH + dt.timedelta(microseconds=us)).replace(tzinfo=None)
    return text.isoformat(timespec="microseconds") + "Z"


class AwsDmsJsonEncoder(Encoder):
    """Writes workload changes as a DMS task with ``IncludeTransactionDetails`` and
    ``BeforeImageSettings`` (``FieldName`` ``before-image``, ``ColumnFilter`` ``all``).

    ``timestamp`` is DMS's write clock: ``ts_ms`` in microseconds, moved forward by 1 us
    where needed so that it strictly increases, as DMS writes records one after another.
    ``commit-timestamp`` is ``ts_ms``. Snapshot rows are ``load`` records.
    """

    identifier: ClassVar[str] = IDENTIFIER
    # dates, timestamps, decimals and binary arrive as strings
    exact_types: ClassVar[frozenset[str]] = frozenset(
        {"int32", "int64", "float64", "string", "boolean"}
    )

    def __init__(self) -> None:
        self._clock_us = 0
        self._txn: tuple[str, int] | None = None
        self._started: set[tuple[str, str]] = set()

    def encode(self, change: SourceChange) -> list[Message]:
        if change.op is Op.TRUNCATE:  # DMS publishes no truncate to Kafka
            return []
        table = change.table
        schema = table.schema or table.database
        types = change.columns
        out = []
        if (schema, table.table) not in self._started:  # DMS starts each table with one
            self._started.add((schema, table.table))
            self._clock_us = max(change.ts_ms * 1000, self._clock_us + 1)
            out.append(self._create_table(change, schema, _stamp(self._clock_us)))
        self._clock_us = max(change.ts_ms * 1000, self._clock_us + 1)
        md: dict[str, Any] = {"timestamp": _stamp(self._clock_us), "record-type": "data"}
        md["operation"] = {
            Op.SNAPSHOT: "load",
            Op.INSERT: "insert",
            Op.UPDATE: "update",
            Op.DELETE: "delete",
        }[change.op]
        md["partition-key-type"] = "schema-table"
        md["schema-name"] = schema
        md["table-name"] = table.table
        if change.op is not Op.SNAPSHOT:
            tid = change.txn_id if change.txn_id is not None else str(change.seq)
            if self._txn is None or self._txn[0] != tid:
                self._txn = (tid, 1)
            else:
                self._txn = (tid, self._txn[1] + 1)
            md["transaction-id"] = int(tid) if tid.isdigit() else tid
            md["transaction-record-id"] = self._txn[1]
            md["commit-timestamp"] = _stamp(change.ts_ms * 1000)
        row = change.before if change.op is Op.DELETE else change.after
        msg: dict[str, Any] = {
            "data": {c: _json_value(v, types.get(c)) for c, v in (row or {}).items()}
        }
        if change.op is Op.UPDATE and change.before is not None:
            msg["before-image"] = {
                c: _json_value(v, types.get(c)) for c, v in change.before.items()
            }
        msg["metadata"] = md
        out.append(Message(value=orjson.dumps(msg), key=f"{schema}.{table.table}".encode()))
        return out

    def decoder_options(self, changes: Iterable[SourceChange]) -> dict[str, Any]:
        """``primary_keys`` for the workload's tables, as a DMS consumer configures them.

        The ``create-table`` control records name the keys too, but DMS partitions them by
        task id, so a decoder reading another partition (or a later micro-batch) has not
        seen them; configured keys always apply.
        """
        keys: dict[str, list[str]] = {}
        for change in changes:
            schema = change.table.schema or change.table.database
            if change.key_columns:
                keys[f"{schema}.{change.table.table}"] = list(change.key_columns)
        return {"primary_keys": keys}

    def _create_table(self, change: SourceChange, schema: str, stamp: str) -> Message:
        """The ``create-table`` control record (``IncludeControlDetails``)."""
        columns = {}
        for c, logical in change.columns.items():
            column: dict[str, Any] = {"nullable": c not in change.key_columns}
            if logical.startswith("decimal("):
                p, s = logical[8:-1].split(",")
                column.update(type="NUMERIC", precision=int(p), scale=int(s))
            else:
                column["type"] = DMS_TYPES.get(logical, "STRING")
            columns[c] = column
        table_def: dict[str, Any] = {"columns": columns}
        if change.key_columns:
            table_def["primary-key"] = list(change.key_columns)
        msg = {
            "control": {"table-def": table_def},
            "metadata": {
                "timestamp": stamp,
                "record-type": "control",
                "operation": "create-table",
                "partition-key-type": "task-id",
                "schema-name": schema,
                "table-name": change.table.table,
            },
        }
        return Message(value=orjson.dumps(msg), key=b"cdcflow-task")

"""The dataworks-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.dataworks_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from cdcflow.formats.dataworks_json import (
    IDENTIFIER,
    OP_DELETE,
    OP_INSERT,
    OP_TRUNCATE,
    OP_UPDATE_AFTER,
    OP_UPDATE_BEFORE,
)
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import EPOCH, MILLISECOND, Encoder, Message, SourceChange

# logical type -> DataWorks type
DW_TYPES = {
    "boolean": "BOOLEAN",
    "int32": "LONG",
    "int64": "LONG",
    "float32": "DOUBLE",
    "float64": "DOUBLE",
    "string": "STRING",
    "json": "STRING",
    "binary": "BYTES",
    "timestamptz": "DATE",
    "timestamp": "DATE",  # wall clock written as if UTC (not exact: comes back aware)
    "date": "DATE",  # midnight UTC (not exact: comes back as a timestamp)
    "time": "STRING",  # ISO text (not exact)
}


def _dw_type(logical: str) -> str:
    if logical.startswith("decimal("):
        return "DOUBLE"  # DataWorks writes decimals as DOUBLE with the digits as text
    try:
        return DW_TYPES[logical]
    except KeyError:
        raise ValueError(f"dataworks-json cannot carry logical type {logical!r}") from None


def _dw_value(value: Any) -> Any:
    if value is None or value.__class__ in (str, int, bool):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return (value - EPOCH) // MILLISECOND
    if isinstance(value, dt.date):
        return (
            dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC) - EPOCH
        ) // MILLISECOND
    if isinstance(value, dt.time):
        return value.isoformat()
    return str(value)  # Decimal: its exact digits, as DataWorks writes DOUBLE text


class DataWorksJsonEncoder(Encoder):
    """Writes workload changes as DataWorks would publish them to Kafka.

    Args:
        update_in_one_record: ``False`` (default): an update is two messages,
            ``UPDATE_BEFOR`` then ``UPDATE_AFTER``, with the same ``sequenceId``.
            ``True``: one ``UPDATE_AFTER`` message with both images (DataWorks' "When
            one record in the source is updated, one Kafka record is generated").
        db_type: the ``schema.source.dbType`` written (default ``"MySQL"``).

    ``sequenceId`` is the change's ``seq`` (real DataWorks writes ``"-1"`` for rows of
    the full load; the encoder keeps the workload's order instead); ``eventTime`` is its
    ``ts_ms``. Messages have no Kafka key. Non-finite floats are written as the strings
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (DOUBLE values may be numeric text).
    """

    identifier: ClassVar[str] = IDENTIFIER
    #: DATE carries epoch milliseconds: timestamptz values must be whole milliseconds.
    exact_types: ClassVar[frozenset[str]] = frozenset(
        {"boolean", "int64", "float64", "string", "binary", "timestamptz"}
    )

    def __init__(self, update_in_one_record: bool = False, db_type: str = "MySQL") -> None:
        self.update_in_one_record = update_in_one_record
        self.db_type = db_type

    def encode(self, change: SourceChange) -> list[Message]:
        """The DataWorks messages for ``change``.

        Raises:
            ValueError: an op or a column type this format cannot carry.
        """
        table = change.table
        source: dict[str, Any] = {"dbType": self.db_type, "dbName": table.database}
        if table.schema:
            source["schemaName"] = table.schema
        source["tableName"] = table.table
        schema = {
            "dataColumn": [{"name": c, "type": _dw_type(t)} for c, t in change.columns.items()],
            "primaryKey": list(change.key_columns) if change.key_columns else None,
            "source": source,
        }
        ts = {"eventTime": change.ts_ms, "systemTime": change.ts_ms, "checkpointTime": change.ts_ms}

        def message(
            op: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
        ) -> Message:
            payload = {
                "before": _dw_image(before),
                "after": _dw_image(after),
                "sequenceId": str(change.seq),
                "timestamp": ts,
                "op": op,
                "ddl": None,
            }
            value = {"schema": schema, "payload": payload, "version": "0.0.1"}
            return Message(value=orjson.dumps(value))

        if change.op in (Op.INSERT, Op.SNAPSHOT):
            return [message(OP_INSERT, None, change.after)]
        if change.op is Op.DELETE:
            return [message(OP_DELETE, change.before, None)]
        if change.op is Op.UPDATE:
            if self.update_in_one_record:
                return [message(OP_UPDATE_AFTER, change.before, change.after)]
            return [
                message(OP_UPDATE_BEFORE, change.before, None),
                message(OP_UPDATE_AFTER, None, change.after),
            ]
        if change.op is Op.TRUNCATE:
            return [message(OP_TRUNCATE, None, None)]
        raise ValueError(f"dataworks-json encodes row changes and truncates, not {change.op}")


def _dw_image(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"dataColumn": {c: _dw_value(v) for c, v in row.items()}}

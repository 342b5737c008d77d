"""The canal-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.canal_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterable
from typing import Any, ClassVar

import orjson

from cdcflow.formats.canal_json import (
    ID_OPERATION,
    IDENTIFIER,
    ROW_OPS,
    TYPE_TRUNCATE,
)
from cdcflow.model import Op
from cdcflow.types import (
    parse_type,
)
from cdcflow_testkit.encoders.base import Encoder, Message, SourceChange

TYPE_OF_OP = {op: typ for typ, op in ROW_OPS.items()}


# logical type -> (mysqlType, java.sql.Types code) written by the encoder
ENCODE_TYPES: dict[str, tuple[str, int]] = {
    "boolean": ("tinyint(1)", -6),
    "int32": ("int(11)", 4),
    "int64": ("bigint(20)", -5),
    "float32": ("float", 7),
    "float64": ("double", 8),
    "string": ("longtext", -4),
    "json": ("json", 12),
    "binary": ("longblob", 2004),
    "date": ("date", 91),
    "time": ("time(6)", 92),
    "timestamp": ("datetime(6)", 93),
    "timestamptz": ("timestamp(6)", 93),
}


def _encode_value(v: Any) -> Any:
    if v is None or type(v) is str:
        return v
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).decode("latin-1")
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:  # MySQL TIMESTAMP: written as UTC wall clock
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return v.isoformat(sep=" ")
    if isinstance(v, dt.date | dt.time):
        return v.isoformat()
    return orjson.dumps(v).decode()


class CanalJsonEncoder(Encoder):
    """Encodes workload changes as Alibaba DTS's Canal Json (one row per message).

    ``es``/``ts`` are the change's ``ts_ms`` and ``id`` its ``seq``: DTS's "serial number
    of the operation", one per change (:meth:`decoder_options` says so to the decoder:
    ``id_semantics="operation"``). Changes given one ``seq`` model one open-source Canal
    batch (its batch id), which a consumer reads with the default ``id_semantics="batch"``.
    Deletes carry the row in ``data`` (Canal and DTS after 2022-03-20); snapshots are DTS
    ``INIT`` rows; updates carry the changed columns' old values in ``old``.
    ``timestamptz`` values are written as UTC text, which decodes exactly only with
    ``timestamp_zone="UTC"``.
    """

    identifier: ClassVar[str] = IDENTIFIER
    # every type it writes, but timestamptz (its zone is the decoder's timestamp_zone)
    exact_types: ClassVar[frozenset[str]] = frozenset({*ENCODE_TYPES, "decimal"} - {"timestamptz"})

    def decoder_options(self, changes: Iterable[SourceChange]) -> dict[str, Any]:
        """``{"id_semantics": "operation"}``: every change has its own ``id`` (as DTS
        writes it), so a copy or replay of a message keeps the original's ``seq``."""
        return {"id_semantics": ID_OPERATION}

    def encode(self, change: SourceChange) -> list[Message]:
        table = change.table
        msg: dict[str, Any] = {
            "data": None,
            "database": table.database or table.schema,
            "es": change.ts_ms,
            "id": change.seq,
            "isDdl": False,
            "mysqlType": None,
            "old": None,
            "pkNames": None,
            "sql": "",
            "sqlType": None,
            "table": table.table,
            "ts": change.ts_ms,
            "type": "",
        }
        if change.op is Op.TRUNCATE:
            msg.update(isDdl=True, type=TYPE_TRUNCATE, sql=f"TRUNCATE TABLE `{table.table}`")
            return [Message(value=orjson.dumps(msg))]
        mysql_types, sql_types = {}, {}
        for col, logical in change.columns.items():
            base = parse_type(logical)[0]
            if base == "decimal":
                mysql_types[col], sql_types[col] = f"decimal{logical[7:]}", 3
            else:
                mysql_types[col], sql_types[col] = ENCODE_TYPES[base]
        typ = TYPE_OF_OP.get(change.op)
        if typ is None:
            raise ValueError(f"canal-json cannot encode {change.op}")
        row = (change.before if change.op is Op.DELETE else change.after) or {}
        msg.update(
            data=[{c: _encode_value(v) for c, v in row.items()}],
            mysqlType=mysql_types,
            sqlType=sql_types,
            pkNames=list(change.key_columns),
            type=typ,
        )
        if change.op is Op.UPDATE and change.before is not None:
            after = change.after or {}
            msg["old"] = [
                {
                    c: _encode_value(v)
                    for c, v in change.before.items()
                    if c not in after or after[c] != v
                }
            ]
        return [Message(value=orjson.dumps(msg))]

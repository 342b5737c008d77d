"""The drs-avro encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.drs_avro` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, ClassVar

import fastavro
from fastavro.schema import parse_schema

from cdcflow.formats.drs_avro import (
    IDENTIFIER,
    OP_DELETE,
    OP_INIT,
    OP_INSERT,
    OP_TRUNCATE,
    OP_UPDATE,
    SINGLE_OBJECT_MAGIC,
    STANDIN_SCHEMA,
    schema_fingerprint,
)
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import ENCODABLE_TYPES, Encoder, Message, SourceChange
from cdcflow_testkit.encoders.drs_json import ENCODE_TYPES, encode_text


class DrsAvroEncoder(Encoder):
    """Encodes changes as records of the bundled :data:`STANDIN_SCHEMA` (not Huawei's),
    in Avro single-object encoding, with values as the text DRS JSON writes (binary as
    Avro bytes)."""

    identifier: ClassVar[str] = IDENTIFIER
    exact_types: ClassVar[frozenset[str]] = ENCODABLE_TYPES - {"boolean", "float32"}

    def __init__(self) -> None:
        self._schema = parse_schema(STANDIN_SCHEMA)
        self._header = SINGLE_OBJECT_MAGIC + schema_fingerprint(STANDIN_SCHEMA)

    def encode(self, change: SourceChange) -> list[Message]:
        """One record per change; ``seqno = change.seq``, ``updateTimestamp = ts_ms``."""
        table = change.table
        database = table.database or table.schema
        cols = list(change.columns.items())

        def image(row: Mapping[str, Any] | None) -> list[Any] | None:
            if row is None:
                return None
            items: list[Any] = []
            for name, logical in cols:
                value = row.get(name)
                if value is None:
                    items.append(None)
                elif logical == "binary":
                    items.append({"value": bytes(value)})
                else:
                    items.append({"value": encode_text(logical, value, False)})
            return items

        op = {
            Op.INSERT: OP_INSERT,
            Op.UPDATE: OP_UPDATE,
            Op.DELETE: OP_DELETE,
            Op.SNAPSHOT: OP_INIT,
            Op.TRUNCATE: OP_TRUNCATE,
        }.get(change.op)
        if op is None:
            raise ValueError(f"DRS Avro has no record for {change.op}")
        rec = {
            "version": "1.0",
            "seqno": change.seq,
            "shardId": None,
            "eventid": str(change.seq),
            "updateTimestamp": change.ts_ms,
            "tableName": f'"{database}"."{table.table}"',
            "operation": op,
            "columnCount": len(cols),
            "fields": [
                {
                    "name": n,
                    "type": ENCODE_TYPES.get(
                        "decimal" if t.startswith("decimal") else t, ("varchar", 12)
                    )[0],
                }
                for n, t in cols
            ]
            if change.op is not Op.TRUNCATE
            else None,
            "beforeImages": image(change.before) if change.op in (Op.UPDATE, Op.DELETE) else None,
            "afterImages": image(change.after) if change.op is not Op.DELETE else None,
            "pkNames": list(change.key_columns) or None,
        }
        out = io.BytesIO()
        out.write(self._header)
        fastavro.schemaless_writer(out, self._schema, rec)
        return [Message(value=out.getvalue(), key=f"{database}.{table.table}".encode())]

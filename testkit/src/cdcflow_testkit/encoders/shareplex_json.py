"""The shareplex-json encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.shareplex_json` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, ClassVar

import orjson

from cdcflow.formats.shareplex_json import (
    IDENTIFIER,
    OP_DEL,
    OP_INS,
    OP_UPD,
)
from cdcflow.model import Op
from cdcflow_testkit.encoders.base import Encoder, Message, SourceChange


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex().upper()
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _fake_rowid(seq_key: str) -> str:
    """An 18-character Oracle-style ROWID made from the row's key (stable per row)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    n = int.from_bytes(seq_key.encode()[:16].ljust(16, b"\0"), "big")
    digits = []
    for _ in range(18):
        n, r = divmod(n, 64)
        digits.append(alphabet[r])
    return "".join(reversed(digits))


class SharePlexJsonEncoder(Encoder):
    """Encodes workload changes as SharePlex JSON, as in the DTS document's examples.

    Inserts carry every column in ``data``; updates carry the changed columns' new values
    in ``data`` and the before values of the key and changed columns in ``key``; deletes
    carry the before image in ``data``. ``scn`` is the change's ``seq``, each change is its
    own one-operation transaction unless ``txn_id`` is given, and ``rowid`` is an
    Oracle-style ROWID derived from the key values. Integers are JSON numbers and every
    other value is text (decimals as plain digits, times in ISO-8601, binary in hex), so
    only integers and strings come back exactly without ``column_types``.
    """

    identifier: ClassVar[str] = IDENTIFIER
    exact_types: ClassVar[frozenset[str]] = frozenset({"int32", "int64", "string"})

    def encode(self, change: SourceChange) -> list[Message]:
        table = change.table
        owner = table.schema or table.database
        image = change.after if change.after is not None else change.before
        key_cols = change.key_columns or tuple(change.columns)
        key_text = "|".join(str((image or {}).get(c)) for c in key_cols)
        time = dt.datetime.fromtimestamp(change.ts_ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
        meta = {
            "time": time,
            "userid": 0,
            "op": {
                Op.INSERT: OP_INS,
                Op.SNAPSHOT: OP_INS,
                Op.UPDATE: OP_UPD,
                Op.DELETE: OP_DEL,
                Op.TRUNCATE: "TRUNCATE",
            }[change.op],
            "scn": str(change.seq),
            "rowid": _fake_rowid(key_text),
            "trans": change.txn_id or f"0.0.{change.seq}",
            "seq": 1,
            "size": 1,
            "table": f"{owner}.{table.table}" if owner else table.table,
            "idx": "1/1",
            "posttime": time,
        }
        doc: dict[str, Any] = {"meta": meta}
        if change.op is Op.TRUNCATE:
            del meta["rowid"]
        elif change.op is Op.UPDATE:
            before, after = change.before or {}, change.after or {}
            changed = [c for c in after if c not in before or before[c] != after[c]]
            doc["data"] = {c: _encode_value(after[c]) for c in changed}
            doc["key"] = {
                c: _encode_value(before.get(c))
                for c in dict.fromkeys((*change.key_columns, *changed))
                if c in before
            }
        else:
            doc["data"] = {c: _encode_value(v) for c, v in (image or {}).items()}
        return [Message(value=orjson.dumps(doc), key=key_text.encode())]

    def decoder_options(self, changes: list[SourceChange]) -> dict[str, Any]:
        """Decoder options needed to read ``changes`` back with their own keys.

        SharePlex JSON names no key columns, so a consumer configures ``primary_keys``;
        this gives that configuration for a workload (``{"OWNER.TABLE": [key columns]}``).
        """
        keys: dict[str, list[str]] = {}
        for change in changes:
            owner = change.table.schema or change.table.database
            name = f"{owner}.{change.table.table}" if owner else change.table.table
            if change.key_columns:
                keys[name] = list(change.key_columns)
        return {"primary_keys": keys}

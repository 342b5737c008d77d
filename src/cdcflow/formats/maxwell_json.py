"""Maxwell's daemon JSON (``maxwell-json``), as Maxwell publishes it to Kafka.

Source documents: Maxwell's *Data format* page (``docs/docs/dataformat.md``) and its
``RowMap``/``DDLMap``/``RowIdentity`` serializers (zendesk/maxwell); corpus files under
``tests/formats/corpus/maxwell/``. One row message is::

    {"database", "table", "type": "insert"|"update"|"delete"|"bootstrap-*",
     "ts": commit seconds, ["xid", "xoffset" | "commit": true], ["position": "file:off"],
     ["gtid", "server_id", "thread_id", "schema_id", "query"],
     ["primary_key": [values], "primary_key_columns": [names]],
     "data": {col: value}, ["old": {changed col: previous value}]}

A DDL message (``output_ddl``) is ``{"type": "table-create"|"table-alter"|..., "database",
"table", "def", ["old"], "sql", "ts": commit ms, ["position"]}``.

Decoding rules (details and the type table: ``docs/formats/maxwell-json.md``):

* ``before`` of an update is ``data`` overlaid with ``old``; ``changed`` is ``old``'s
  columns. A column in ``old`` but absent from ``data`` became NULL (with
  ``output_nulls=false`` Maxwell omits NULLs from ``data`` but keeps the old value).
* Maxwell declares no column types: values keep their JSON types and ``columns`` is
  ``None`` (the typing stage infers from values); objects and arrays (JSON columns,
  SETs) become JSON text; integers of any size (BIGINT UNSIGNED, DECIMAL(65,0)) stay
  exact ``int`` (a message orjson would round is parsed again exactly).
* ``ts_ms`` is ``ts * 1000`` for rows (Maxwell writes seconds) and ``ts`` for DDL
  (milliseconds). ``seq`` is ``(binlog file number, offset, xoffset)`` from
  ``position``; the commit row, which Maxwell prints without ``xoffset``, sorts last
  in its transaction. Without ``position`` (``output_binlog_position=false``, the
  default) ``seq`` is ``None``.
* Key: ``primary_key_columns``, else the ``pk.*`` names of the Kafka key (Maxwell's
  ``kafka_key_format`` hash or array), else ``options.primary_keys``, else ``MISSING_KEY``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from cdcflow.errors import Code, DecodeError
from cdcflow.formats.base import (
    DecoderOptions,
    Record,
)
from cdcflow.formats.common.exact_json import ExactJsonDecoder, json_image
from cdcflow.formats.common.fields import field_error, require
from cdcflow.formats.common.keys import TableInfo, with_key
from cdcflow.model import ChangeEvent, Op, SourceTable, Txn
from cdcflow.types import INT64_MAX, INT64_MIN, field_range_error

__all__ = ["MaxwellJsonDecoder", "MaxwellJsonOptions"]

IDENTIFIER = "maxwell-json"

# --------------------------------------------------------------------------- op codes
TYPE_INSERT = "insert"  # row inserted: ``data`` is the new row
TYPE_UPDATE = "update"  # row updated: ``data`` new row, ``old`` changed columns' old values
TYPE_DELETE = "delete"  # row deleted: ``data`` is the deleted row
TYPE_BOOTSTRAP_INSERT = "bootstrap-insert"  # a row read by a bootstrap (initial load)
TYPE_BOOTSTRAP_START = "bootstrap-start"  # bootstrap of a table begins (``data`` {})
TYPE_BOOTSTRAP_COMPLETE = "bootstrap-complete"  # bootstrap of a table finished
_ROW_OPS = {
    TYPE_INSERT: Op.INSERT,
    TYPE_UPDATE: Op.UPDATE,
    TYPE_DELETE: Op.DELETE,
    TYPE_BOOTSTRAP_INSERT: Op.SNAPSHOT,
}
_MARKERS = frozenset({TYPE_BOOTSTRAP_START, TYPE_BOOTSTRAP_COMPLETE})
#: Maxwell's ``ResolvedSchemaChange`` subtypes (``output_ddl=true``).
DDL_TYPES = frozenset(
    {
        "database-create",
        "database-alter",
        "database-drop",
        "table-create",
        "table-alter",
        "table-drop",
    }
)
#: top-level fields kept in ``meta`` when present
_META_FIELDS = ("server_id", "thread_id", "schema_id", "gtid", "query")
_META_SET = frozenset(_META_FIELDS)

#: ``seq`` third part of the transaction's commit row (printed without ``xoffset``); an
#: ``xoffset`` is below it (``0..COMMIT_ROW_XOFFSET - 1``), so the commit row sorts last.
COMMIT_ROW_XOFFSET = 2**32
_STRINGS = frozenset({str})
#: ``ts`` of a row message is epoch seconds: ``ts * 1000`` (``ts_ms``) must fit 64 bits
_TS_S_MIN, _TS_S_MAX = -(2**63 // 1000), (2**63 - 1) // 1000


@dataclass(frozen=True)
class MaxwellJsonOptions(DecoderOptions):
    """Options of ``maxwell-json``.

    Attributes:
        key_from_kafka_key: when a message has no ``primary_key_columns``, take the key
            column names from the Kafka message key that Maxwell writes (``{"database",
            "table", "pk.<col>": v}`` or ``[db, table, [{col: v}]]``). Default ``True``.
        float_as_decimal: decode JSON numbers with a fraction or exponent as exact
            ``Decimal`` instead of ``float`` (Maxwell prints DECIMAL columns as JSON
            numbers, so ``float`` may round them). Slower. Default ``False``.
    """

    key_from_kafka_key: bool = True
    float_as_decimal: bool = False


# --------------------------------------------------------------------------- decoder


def _position(text: Any) -> tuple[int, int]:
    """``"mysql-bin.000006:800911"`` -> ``(6, 800911)``."""
    if type(text) is str:
        name, _, offset = text.rpartition(":")
        number = name.rpartition(".")[2]
        if number.isdigit() and offset.isdigit():
            return int(number), int(offset)
    raise DecodeError(f"position {text!r} is not 'binlog-file.NNNNNN:offset'", Code.BAD_FIELD)


def _key_names(key: bytes) -> list[str] | None:
    """Key column names (lower case) from a Maxwell Kafka key, or ``None``."""
    try:
        parsed = orjson.loads(key)
    except orjson.JSONDecodeError:
        return None
    if type(parsed) is dict:
        names = [k[3:] for k in parsed if k.startswith("pk.")]
        return names or None
    if type(parsed) is list and len(parsed) == 3 and type(parsed[2]) is list:
        names = [n for part in parsed[2] if type(part) is dict for n in part]
        return names or None
    return None


class MaxwellJsonDecoder(ExactJsonDecoder[MaxwellJsonOptions]):
    """Decodes Maxwell JSON messages (see the module docstring for the rules)."""

    identifier: ClassVar[str] = IDENTIFIER
    options_class = MaxwellJsonOptions

    def __init__(self, options: MaxwellJsonOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._exact: bool = self.options.float_as_decimal
        self._tables: dict[tuple[str, str], TableInfo] = {}
        self._files: dict[str, int] = {}  # binlog file name -> its number

    def _decode(self, msg: Any, record: Record, checked: bool) -> ChangeEvent:
        if type(msg) is not dict:
            raise DecodeError("a Maxwell message is a JSON object", Code.NOT_AN_OBJECT)
        get = msg.get
        typ = require(msg, "type", str)
        op = _ROW_OPS.get(typ)
        if op is None:
            if typ in DDL_TYPES:
                return self._ddl(msg, typ, record)
            if typ not in _MARKERS:
                raise DecodeError(f"unknown Maxwell type {typ!r}", Code.UNKNOWN_OP)
        db, table = get("database"), get("table")
        info = (
            self._tables.get((db, table)) if type(db) is str and type(table) is str else None
        ) or self._table(msg, table_required=True)
        source = info.source
        data = require(msg, "data", dict)
        ts = get("ts")
        if ts is not None:
            if type(ts) is not int:
                raise field_error("ts", ts, "an integer (epoch seconds)")
            if not _TS_S_MIN <= ts <= _TS_S_MAX:
                raise field_range_error(
                    "ts",
                    ts,
                    _TS_S_MIN,
                    _TS_S_MAX,
                    "epoch seconds; ts_ms = ts * 1000 is a 64-bit integer",
                )
            ts *= 1000
        xid = get("xid")
        xoffset = get("xoffset")
        commit = get("commit") is True
        if xoffset is not None and (
            type(xoffset) is not int or not 0 <= xoffset < COMMIT_ROW_XOFFSET
        ):
            if type(xoffset) is not int:
                raise field_error("xoffset", xoffset, "an integer")
            raise field_range_error(
                "xoffset",
                xoffset,
                0,
                COMMIT_ROW_XOFFSET - 1,
                "the row's position in its transaction, below the commit row's place in seq",
            )
        txn = None
        if xid is not None:
            if type(xid) is not int:
                raise field_error("xid", xid, "an integer")
            txn = Txn(str(xid), None if xoffset is None else xoffset + 1, commit)
        seq = None
        pos = get("position")
        if pos is not None:
            if xoffset is None:
                xoffset = COMMIT_ROW_XOFFSET if commit else 0
            if type(pos) is str:
                name, _, offset = pos.rpartition(":")
                number = self._files.get(name)
                if number is None:
                    number = self._binlog_number(name)
                if number is not None and offset.isdigit():
                    seq = (number, int(offset), xoffset)
            if seq is None:
                _position(pos)  # raises BAD_FIELD
        meta = None
        if not _META_SET.isdisjoint(msg):
            meta = {k: msg[k] for k in _META_FIELDS if k in msg}
        if op is None:  # bootstrap-start / bootstrap-complete marker
            meta = {**(meta or {}), "type": typ}
            return ChangeEvent(
                Op.MESSAGE, source, seq=seq, ts_ms=ts, txn=txn, origin=record.origin, meta=meta
            )
        before = after = changed = None
        if op is Op.UPDATE:
            old = get("old")
            if old is None:
                old = {}
            elif type(old) is not dict:
                raise field_error("old", old, "an object")
            json_image(old, checked)
            json_image(data, checked)
            before = {**data, **old}
            for k in old:
                if k not in data:  # output_nulls=false: NULLs are left out of data only
                    data[k] = None
            after = data
            changed = tuple(old)
        else:
            json_image(data, checked)
            if op is Op.DELETE:
                before = data
            else:
                after = data
        event = ChangeEvent(
            op, source, None, before, after, None, seq, ts, txn, None, changed, record.origin, meta
        )
        return with_key(self, event, data, self._key_columns(msg, record, data) or info.keys)

    def _binlog_number(self, name: str) -> int | None:
        number = name[name.rfind(".") + 1 :]
        if not (number.isdigit() and number.isascii()):
            return None
        if len(self._files) > 1000:
            self._files.clear()
        self._files[name] = int(number)
        return self._files[name]

    def _key_columns(
        self, msg: dict[str, Any], record: Record, image: dict[str, Any]
    ) -> list[str] | None:
        cols = msg.get("primary_key_columns")
        if cols is not None:
            if type(cols) is list and len(cols) == 1 and type(cols[0]) is str:
                return cols
            if type(cols) is not list or not {*map(type, cols)} <= _STRINGS:
                raise field_error("primary_key_columns", cols, "a list of column names")
            return cols
        if record.key and self.options.key_from_kafka_key:
            names = _key_names(record.key)
            if names:
                # Maxwell lower-cases key names; map them back to the row's columns.
                lower = {c.lower(): c for c in image}
                return [c if c in image else lower.get(c.lower(), c) for c in names]
        return None

    def _table(self, msg: dict[str, Any], table_required: bool) -> TableInfo:
        db = msg.get("database")
        table = msg.get("table")
        if type(db) is str and type(table) is str:
            found = self._tables.get((db, table))
            if found is not None:
                return found
        if db is None:
            raise DecodeError("Maxwell message without 'database'", Code.MISSING_FIELD)
        if table is None and table_required:
            raise DecodeError("Maxwell row message without 'table'", Code.MISSING_FIELD)
        if type(db) is not str or (table is not None and type(table) is not str):
            raise DecodeError("'database' and 'table' must be strings", Code.BAD_FIELD)
        info = TableInfo(
            SourceTable(IDENTIFIER, database=db, table=table or ""), self.options.primary_keys
        )
        if table is not None:
            if len(self._tables) > 10_000:
                self._tables.clear()
            self._tables[(db, table)] = info
        return info

    def _ddl(self, msg: dict[str, Any], typ: str, record: Record) -> ChangeEvent:
        source = self._table(msg, table_required=False).source
        sql = msg.get("sql")
        if sql is not None and type(sql) is not str:
            raise field_error("sql", sql, "a string")
        ts = msg.get("ts")
        if ts is not None and type(ts) is not int:
            raise field_error("ts", ts, "an integer (epoch milliseconds)")
        if ts is not None and not INT64_MIN <= ts <= INT64_MAX:
            raise field_range_error(
                "ts", ts, INT64_MIN, INT64_MAX, "epoch milliseconds; ts_ms is a 64-bit integer"
            )
        pos = msg.get("position")
        seq = None if pos is None else (*_position(pos), 0)
        meta: dict[str, Any] = {"type": typ}
        for name in ("def", "old", "gtid"):
            if msg.get(name) is not None:
                meta[name] = msg[name]
        return ChangeEvent(
            Op.DDL, source, seq=seq, ts_ms=ts, ddl=sql, origin=record.origin, meta=meta
        )

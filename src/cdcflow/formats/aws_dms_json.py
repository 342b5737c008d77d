"""AWS Database Migration Service JSON (``aws-dms-json``), as DMS writes to a Kafka
(or Kinesis) target endpoint.

Source documents: AWS DMS user guide, *Using Apache Kafka as a target* (message format,
``IncludeTransactionDetails``, ``IncludeControlDetails``, ``IncludeTableAlterOperations``,
``IncludeNullAndEmpty``), *Before image task settings* and the ``add-before-image-columns``
transformation rule; corpus files under ``tests/formats/corpus/aws_dms/``. One record is::

    {"data": {col: value, ["BI_<col>": before value]},
     ["<BeforeImageSettings.FieldName>": {col: before value}],
     ["control": {"table-def": {...}}],
     "metadata": {"timestamp": "2024-10-27T12:39:03.210671Z", "record-type": "data"|"control",
                  "operation": "load"|"insert"|"update"|"delete"|"create-table"|...,
                  "partition-key-type", "schema-name", "table-name",
                  ["transaction-id", "transaction-record-id", "prev-transaction-id",
                   "prev-transaction-record-id", "commit-timestamp", "stream-position"]}}

Decoding rules (details and the type table: ``docs/formats/aws-dms-json.md``):

* ``load`` rows are ``Op.SNAPSHOT``; control records are ``Op.DDL`` (DMS sends no SQL
  text: the operation and the ``control`` object go to ``meta``).
* ``seq`` is ``(metadata.timestamp in microseconds,)``. DMS JSON carries no portable log
  position (``stream-position`` is engine-specific text, and only with
  ``IncludeTransactionDetails``); ``transaction-id`` is an id, not an order (Oracle and
  SQL Server ids are not monotonic); ``commit-timestamp`` is the source commit time, which
  puts changes cached during a full load before the load rows that already contain them.
  ``timestamp`` is when DMS wrote the record, in DMS's own apply order, so it orders load
  rows, cached changes and CDC the way DMS applies them. Records with equal timestamps
  tie; consumers break ties by Kafka partition offset.
* ``ts_ms`` is ``commit-timestamp`` when present, else ``timestamp``.
* Before image of an update: ``BI_``-prefixed columns in ``data`` (the
  ``add-before-image-columns`` rule) and/or the ``BeforeImageSettings`` object. A column
  in the before image but absent from ``data`` became NULL (DMS leaves NULLs out of
  ``data`` unless ``IncludeNullAndEmpty`` is set).
* Key: DMS data records name no key columns. The decoder remembers the ``primary-key``
  of each ``create-table`` control record with ``control.table-def``
  (``IncludeControlDetails``), which DMS sends when it starts a table; else
  ``options.primary_keys``; else ``MISSING_KEY``. This is the decoder's only state.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, ClassVar

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

__all__ = ["AwsDmsJsonDecoder", "AwsDmsJsonOptions"]

IDENTIFIER = "aws-dms-json"

# --------------------------------------------------------------------------- op codes
RECORD_DATA = "data"  # a row: ``data`` holds it
RECORD_CONTROL = "control"  # a table event: create/drop/alter
DATA_OPS: dict[str, Op] = {
    "load": Op.SNAPSHOT,  # full-load row
    "insert": Op.INSERT,  # CDC insert: ``data`` is the new row
    "update": Op.UPDATE,  # CDC update: ``data`` is the new row
    "delete": Op.DELETE,  # CDC delete: ``data`` is the deleted row (or its key)
}
CONTROL_OPS = frozenset(
    {
        "create-table",  # a table starts (full load or CDC); ``control.table-def`` with details
        "drop-table",  # table dropped
        "rename-table",  # IncludeTableAlterOperations
        "add-column",
        "drop-column",
        "rename-column",
        "column-type-change",
    }
)
_META_FIELDS = (
    "transaction-record-id",
    "prev-transaction-id",
    "prev-transaction-record-id",
    "stream-position",
    "partition-key-value",
)
_META_SET = frozenset(_META_FIELDS)


@dataclass(frozen=True)
class AwsDmsJsonOptions(DecoderOptions):
    """Options of ``aws-dms-json``.

    Attributes:
        before_image_prefix: column prefix of the ``add-before-image-columns`` rule
            (``before-image-def.column-prefix``); default ``"BI_"``; ``""`` turns it off
            (for tables with real columns of that name).
        before_image_fields: names of the ``BeforeImageSettings.FieldName`` object to read
            the before image from, first found wins; default ``("before-image", "before")``.
        infer_nulls_from_before: a column in an update's before image but absent from
            ``data`` is NULL in the after image (DMS omits NULLs unless
            ``IncludeNullAndEmpty``). Default ``True``.
        float_as_decimal: decode JSON numbers with a fraction or exponent as exact
            ``Decimal`` instead of ``float``. Slower. Default ``False``.
    """

    before_image_prefix: str = "BI_"
    before_image_fields: tuple[str, ...] = ("before-image", "before")
    infer_nulls_from_before: bool = True
    float_as_decimal: bool = False


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class AwsDmsJsonDecoder(ExactJsonDecoder[AwsDmsJsonOptions]):
    """Decodes AWS DMS JSON records (see the module docstring)."""

    identifier: ClassVar[str] = IDENTIFIER
    options_class = AwsDmsJsonOptions

    def __init__(self, options: AwsDmsJsonOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._exact: bool = self.options.float_as_decimal
        opts: AwsDmsJsonOptions = self.options
        self._prefix = opts.before_image_prefix
        self._prefix_bytes = b'"' + opts.before_image_prefix.encode()
        # per table: identity and key columns (options, replaced by what a create-table
        # control record declares)
        self._tables: dict[tuple[str, str], TableInfo] = {}
        self._seconds: dict[str, int] = {}  # "yyyy-mm-ddThh:mm:ss" -> epoch seconds

    def _decode(self, msg: Any, record: Record, checked: bool) -> ChangeEvent:
        if type(msg) is not dict:
            raise DecodeError("an AWS DMS record is a JSON object", Code.NOT_AN_OBJECT)
        md = require(msg, "metadata", dict)
        get = md.get
        rtype = get("record-type")
        operation = get("operation")
        if type(rtype) is not str or type(operation) is not str:
            if rtype is None or operation is None:
                raise DecodeError(
                    "AWS DMS metadata without 'record-type' or 'operation'", Code.MISSING_FIELD
                )
            raise DecodeError("'record-type' and 'operation' must be strings", Code.BAD_FIELD)
        info = self._table(get("schema-name"), get("table-name"))
        source = info.source
        stamp = get("timestamp")
        ts_us = None if stamp is None else self._epoch_us(stamp, "timestamp")
        seq = None if ts_us is None else (ts_us,)
        commit = get("commit-timestamp")
        ts_ms = ts_us if commit is None else self._epoch_us(commit, "commit-timestamp")
        if ts_ms is not None:
            ts_ms //= 1000
        meta = None
        if not _META_SET.isdisjoint(md):
            meta = {k: md[k] for k in _META_FIELDS if k in md}

        if rtype == RECORD_CONTROL:
            if operation not in CONTROL_OPS:
                raise DecodeError(
                    f"unknown AWS DMS control operation {operation!r}", Code.UNKNOWN_OP
                )
            meta = {**(meta or {}), "operation": operation}
            control = msg.get("control")
            if control is not None:
                meta["control"] = control
                if operation == "create-table":
                    self._learn_key(info, control)
            return ChangeEvent(
                Op.DDL, source, seq=seq, ts_ms=ts_ms, origin=record.origin, meta=meta
            )
        if rtype != RECORD_DATA:
            raise DecodeError(f"unknown AWS DMS record-type {rtype!r}", Code.UNKNOWN_OP)
        op = DATA_OPS.get(operation)
        if op is None:
            raise DecodeError(f"unknown AWS DMS data operation {operation!r}", Code.UNKNOWN_OP)
        if stamp is None:
            raise DecodeError(
                "AWS DMS data record without metadata 'timestamp'", Code.MISSING_FIELD
            )
        data = require(msg, "data", dict)
        json_image(data, checked)
        before = None
        if self._prefix and self._prefix_bytes in record.value:  # type: ignore[operator]  # _decode() never sees a tombstone (Decoder.decode)
            before = self._split_before(data)
        if op is Op.UPDATE:
            for name in self.options.before_image_fields:
                image = msg.get(name)
                if image is not None:
                    if type(image) is not dict:
                        raise field_error(name, image, "an object")
                    before = {**(before or {}), **json_image(image, checked)}
                    break
            if before and self.options.infer_nulls_from_before:
                for k in before:
                    if k not in data:
                        data[k] = None
            after = data
            before = before or None
        elif op is Op.DELETE:
            before, after = data, None
        else:
            before, after = None, data
        txid = get("transaction-id")
        txn = None
        if txid is not None:
            order = get("transaction-record-id")
            if type(order) is not int:
                order = None
            elif not INT64_MIN <= order <= INT64_MAX:
                raise field_range_error(
                    "transaction-record-id",
                    order,
                    INT64_MIN,
                    INT64_MAX,
                    "the record's position in its transaction; txn.order is a 64-bit integer",
                )
            txn = Txn(str(txid), order, None)
        event = ChangeEvent(
            op, source, None, before, after, None, seq, ts_ms, txn, None, None, record.origin, meta
        )
        return with_key(self, event, data, info.keys)

    @staticmethod
    def _learn_key(info: TableInfo, control: Any) -> None:
        table_def = control.get("table-def") if type(control) is dict else None
        keys = table_def.get("primary-key") if type(table_def) is dict else None
        if type(keys) is list and keys and {*map(type, keys)} == {str}:
            info.keys = keys

    def _split_before(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """Move ``BI_<col>`` columns out of ``data``; return them as ``{col: value}``."""
        prefix = self._prefix
        names = [k for k in data if k.startswith(prefix)]
        if not names:
            return None
        n = len(prefix)
        return {k[n:]: data.pop(k) for k in names}

    def _table(self, schema: Any, table: Any) -> TableInfo:
        if type(schema) is str and type(table) is str:
            found = self._tables.get((schema, table))
            if found is None:
                found = TableInfo(
                    SourceTable(IDENTIFIER, schema=schema, table=table), self.options.primary_keys
                )
                if len(self._tables) > 10_000:  # a learned key would be forgotten: rare
                    self._tables.clear()
                self._tables[(schema, table)] = found
            return found
        if schema is None or table is None:
            raise DecodeError(
                "AWS DMS metadata without 'schema-name' or 'table-name'", Code.MISSING_FIELD
            )
        raise DecodeError("'schema-name' and 'table-name' must be strings", Code.BAD_FIELD)

    def _epoch_us(self, text: Any, name: str) -> int:
        """``"2024-10-27T12:39:03.210671Z"`` -> epoch microseconds (UTC)."""
        if type(text) is str and len(text) == 27 and text[26] == "Z" and text[19] == ".":
            seconds = self._seconds.get(text[:19])  # the usual shape, seen this second
            frac = text[20:26]
            if seconds is not None and frac.isdigit() and frac.isascii():
                return seconds * 1_000_000 + int(frac)
        if type(text) is str and len(text) >= 19:
            head = text[:19]
            seconds = self._seconds.get(head)
            if seconds is None:
                try:
                    wall = dt.datetime.fromisoformat(head)
                except ValueError:
                    wall = None
                if wall is not None:
                    seconds = int((wall.replace(tzinfo=dt.UTC) - _EPOCH).total_seconds())
                    if len(self._seconds) > 100_000:
                        self._seconds.clear()
                    self._seconds[head] = seconds
            if seconds is not None:
                rest = text[19:].removesuffix("Z")
                if not rest:
                    return seconds * 1_000_000
                frac = rest[1:]
                if rest[0] == "." and frac.isdigit() and frac.isascii():
                    return seconds * 1_000_000 + int(frac[:6].ljust(6, "0"))
        raise DecodeError(
            f"metadata {name!r} {text!r} is not 'yyyy-MM-ddTHH:mm:ss.ffffffZ'", Code.BAD_FIELD
        )

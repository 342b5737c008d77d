"""SharePlex JSON (``shareplex-json``): the SharePlex-style JSON that Alibaba Cloud DTS
(and Quest SharePlex) publish to Kafka.

Source: the DTS document "Data formats of a Kafka cluster", section "Shareplex Json"
(field table and the insert / update / delete examples). One message is one row change::

    {"meta": {"time": "2017-06-16T14:24:34", "userid": 84, "op": "ins",
              "scn": "14589063118712", "rowid": "AAATGpAAIAAItcIAAA", "trans": "7.0.411499",
              "seq": 1, "size": 11, "table": "CL_BIZ1.MIO_LOG", "idx": "1/11",
              "posttime": "2017-06-16T14:33:52"},
     "data": {"MIO_LOG_ID": "32539737"}}

Rules in short (``docs/formats/shareplex-json.md`` has the full story):

* ``meta.op``: ``ins``/``upd``/``del`` (the examples) and the spelled-out forms the field
  table lists -- INSERT, UPDATE, DELETE, TRUNCATE, DROP COLUMN, UPDATE BEFORE, UPDATE AFTER
  -- compared case-insensitively; anything else is ``UNKNOWN_OP``.
* ``data`` is the after image of an insert, the before image of a delete and the new
  values of the changed columns of an update, whose ``key`` object holds the before values
  of the key and changed columns: before = ``key``, after = ``key`` updated with ``data``.
  ``UPDATE BEFORE`` / ``UPDATE AFTER`` halves are joined by :meth:`combine`.
* There are no declared types: values are kept as published (strings stay strings, even
  numeric-looking ones) unless ``column_types`` declares a table's columns.
* ``table`` ``OWNER.TABLE`` -> schema ``OWNER``, table ``TABLE``; ``seq`` = (scn, seq);
  ``ts_ms`` = ``time`` (UTC); ``txn`` = ``trans`` with ``seq`` as order and
  ``seq == size`` as last.
* Key: ``primary_keys`` for the table, else the Oracle ROWID (``meta.rowid``) as the row
  identity in the column ``rowid_column``, else ``MISSING_KEY``.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats.base import (
    FULL_ROW,
    Decoder,
    DecoderOptions,
    Record,
    key_columns_for,
    table_setting,
)
from cdcflow.formats.common.fields import field_error, require
from cdcflow.formats.common.json_object import load_object
from cdcflow.formats.common.values import bad_value, shown
from cdcflow.model import ChangeEvent, Op, SourceTable, Txn
from cdcflow.types import (
    EPOCH_NAIVE,
    INT64_MAX,
    INT64_MIN,
    INT_RANGES,
    int_range_error,
    json_text,
    parse_date_text,
    parse_timestamp_text,
    parse_type,
    to_bool,
    to_decimal,
    to_float,
    to_int,
)

__all__ = ["SharePlexJsonDecoder", "SharePlexJsonOptions", "OPERATIONS"]

IDENTIFIER = "shareplex-json"

# --------------------------------------------------------------------------- operations
OP_INS = "ins"  # insert (examples); spelled out: INSERT
OP_UPD = "upd"  # update: data = new values of changed columns, key = before values
OP_DEL = "del"  # delete: data = before image
_TRUNCATE = "truncate"  # TRUNCATE TABLE
_DROP_COLUMN = "drop column"  # a column was dropped (DDL without statement text)
_UPDATE_BEFORE = "update before"  # first half of a split update: data = before image
_UPDATE_AFTER = "update after"  # second half: data = after image

#: meta.op (lower case) -> (Op, update half or None).
OPERATIONS: dict[str, tuple[Op, str | None]] = {
    OP_INS: (Op.INSERT, None),
    "insert": (Op.INSERT, None),
    OP_UPD: (Op.UPDATE, None),
    "update": (Op.UPDATE, None),
    OP_DEL: (Op.DELETE, None),
    "delete": (Op.DELETE, None),
    _TRUNCATE: (Op.TRUNCATE, None),
    _DROP_COLUMN: (Op.DDL, None),
    _UPDATE_BEFORE: (Op.UPDATE, "before"),
    _UPDATE_AFTER: (Op.UPDATE, "after"),
}
# Exact spellings seen in the document, so the hot path needs no lower().
_OPS_EXACT = {**OPERATIONS, **{k.upper(): v for k, v in OPERATIONS.items()}}

_SUPPORTED_COLUMN_TYPES = frozenset(
    {
        "boolean",
        "int32",
        "int64",
        "float32",
        "float64",
        "decimal",
        "string",
        "json",
        "date",
        "time",
        "timestamp",
        "timestamptz",
    }
)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SharePlexJsonOptions(DecoderOptions):
    """Options of the ``shareplex-json`` decoder.

    Attributes:
        primary_keys: key columns per table (see
            :class:`~cdcflow.formats.base.DecoderOptions`); SharePlex JSON names none.
        rowid_column: when a table has no configured key, the Oracle ROWID of
            ``meta.rowid`` is the row identity: it is added to the row images under this
            column name and is the event key. ``""`` turns this off (such rows are then
            ``MISSING_KEY`` dead letters). Default ``"ROWID"``.
        column_types: declared logical types per table, ``{table: {column: type}}``
            (tables matched like ``primary_keys``). Values of these columns are converted
            (``"12.50"`` -> ``Decimal("12.50")`` for ``decimal(10,2)``); other columns
            keep the value as published. ``binary`` is not accepted (the text form of RAW
            values is not documented).
        pair_updates: join ``UPDATE BEFORE`` / ``UPDATE AFTER`` halves into one update in
            :meth:`SharePlexJsonDecoder.combine` (default ``True``).
    """

    rowid_column: str = "ROWID"
    pair_updates: bool = True
    column_types: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for table, cols in self.column_types.items():
            for col, logical in dict(cols).items():
                try:
                    base = parse_type(logical)[0]
                except ValueError:
                    base = None
                if base not in _SUPPORTED_COLUMN_TYPES:
                    raise ConfigError(
                        f"shareplex-json column_types[{table!r}][{col!r}] = {logical!r}: use "
                        f"one of {sorted(_SUPPORTED_COLUMN_TYPES - {'decimal'})} or decimal(P,S)"
                    )


# --------------------------------------------------------------------------- values


def _plain(value: Any, column: str) -> Any:
    """A published value without declared type: JSON numbers never become floats,
    objects and arrays become JSON text."""
    if isinstance(value, float):
        return decimal.Decimal(repr(value))  # through the shortest repr, e.g. 0.1 -> 0.1
    if isinstance(value, dict | list):
        return json_text(value, column)
    return value


def _image(data: dict[str, Any]) -> dict[str, Any]:
    """The published object as a row image, in place (it is a fresh dict from orjson)."""
    for col, value in data.items():
        if value is not None and type(value) is not str and type(value) is not int:
            data[col] = _plain(value, col)
    return data


def _typed(value: Any, column: str, logical: str) -> Any:
    """Convert a published value to its declared logical type (BAD_VALUE on failure)."""
    if value is None:
        return None
    base, _, scale = parse_type(logical)
    if base in ("int32", "int64"):
        n = to_int(value, column)
        assert n is not None
        lo, hi = INT_RANGES[base]
        if lo <= n <= hi:
            return n
        raise int_range_error(column, n, base)
    if base == "decimal":
        d = to_decimal(value, column)
        assert d is not None and scale is not None
        exp = d.as_tuple().exponent
        assert isinstance(exp, int)
        if -exp > scale:
            raise DecodeError(
                f"column {column!r}: {value!r} has more fractional digits than {logical}",
                Code.BAD_VALUE,
            )
        return d.quantize(decimal.Decimal(1).scaleb(-scale)) if -exp < scale else d
    if base in ("float32", "float64"):
        return to_float(value, column)
    if base == "boolean":
        return to_bool(value, column)
    if base == "date":
        return parse_date_text(value, column)
    if base == "timestamp":
        return parse_timestamp_text(value, column, aware=False)
    if base == "timestamptz":
        return parse_timestamp_text(value, column, aware=True)
    if base == "time":
        try:
            return dt.time.fromisoformat(str(value).strip())
        except ValueError:
            raise bad_value(column, value, "time of day") from None
    if isinstance(value, str):  # string, json
        return value
    return json_text(value, column) if base == "json" else str(_plain(value, column))


@lru_cache(maxsize=4096)
def _time_ms(text: str) -> int:
    """``2017-06-16T14:24:34`` (UTC, ``Z`` optional) -> epoch ms."""
    try:
        parsed = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise DecodeError(
            f"meta.time {text!r} is not yyyy-MM-ddTHH:mm:ss[Z]", Code.BAD_FIELD
        ) from None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
    return (parsed - EPOCH_NAIVE) // dt.timedelta(milliseconds=1)


def _wrong(name: str, want: str, value: Any) -> DecodeError:
    return DecodeError(f"SharePlex {name} must be {want}, got {shown(value, 60)}", Code.BAD_FIELD)


# --------------------------------------------------------------------------- decoder


class SharePlexJsonDecoder(Decoder[SharePlexJsonOptions]):
    """Decodes SharePlex JSON messages (see the module doc)."""

    identifier: ClassVar[str] = IDENTIFIER
    options_class = SharePlexJsonOptions

    def __init__(self, options: SharePlexJsonOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._tables: dict[str, SourceTable] = {}
        opts = self.options
        self._column_types: Mapping[str, Mapping[str, str]] = getattr(opts, "column_types", {})
        self._rowid_column: str = getattr(opts, "rowid_column", "ROWID")
        self._pair_updates: bool = getattr(opts, "pair_updates", True)

    def _source(self, name: str) -> SourceTable:
        table = self._tables.get(name)
        if table is None:
            owner, _, tab = name.rpartition(".")
            if not tab.strip('"'):
                raise _wrong("meta.table", "OWNER.TABLE", name)
            table = SourceTable(IDENTIFIER, "", owner.strip('"'), tab.strip('"'))
            if len(self._tables) < 10_000:
                self._tables[name] = table
        return table

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one SharePlex JSON message into one event.

        Raises:
            DecodeError: BAD_JSON, NOT_AN_OBJECT, MISSING_FIELD, BAD_FIELD, UNKNOWN_OP,
                BAD_VALUE (with ``column_types``), MISSING_KEY.
        """
        doc = load_object(record.value, "a SharePlex message")
        meta = require(doc, "meta", dict)
        op_raw = meta.get("op")
        if type(op_raw) is not str:
            raise field_error("meta.op", op_raw, "a string")
        spec = _OPS_EXACT.get(op_raw) or OPERATIONS.get(" ".join(op_raw.lower().split()))
        if spec is None:
            raise DecodeError(
                f"unknown SharePlex op {op_raw!r}; known: ins, upd, del and "
                "INSERT, UPDATE, DELETE, TRUNCATE, DROP COLUMN, UPDATE BEFORE, UPDATE AFTER",
                Code.UNKNOWN_OP,
            )
        op, half = spec
        table_name = meta.get("table")
        if type(table_name) is not str:
            raise field_error("meta.table", table_name, "a string")
        source = self._source(table_name)

        seq: tuple[int, ...] | None = None
        pos = meta.get("seq")
        scn = meta.get("scn")
        if scn is not None:
            try:
                scn_n = int(scn)
            except (TypeError, ValueError):
                raise _wrong("meta.scn", "an integer SCN", scn) from None
            if pos is None:
                seq = (scn_n,)
            elif type(pos) is int:
                seq = (scn_n, pos)
            else:
                raise _wrong("meta.seq", "an integer", pos)
        if type(pos) is int and not INT64_MIN <= pos <= INT64_MAX:
            raise _wrong(
                "meta.seq",
                f"an integer in {INT64_MIN}..{INT64_MAX} (the change's position in its "
                "transaction; txn.order is a 64-bit integer)",
                pos,
            )
        ts_ms = None
        time = meta.get("time")
        if time is not None:
            if type(time) is not str:
                raise _wrong("meta.time", "a string", time)
            ts_ms = _time_ms(time)
        txn = None
        trans = meta.get("trans")
        if trans is not None:
            size = meta.get("size")
            order = pos if type(pos) is int else None
            last = (pos == size) if order is not None and type(size) is int else None
            txn = Txn(trans if type(trans) is str else str(trans), order, last)
        event = ChangeEvent(
            op, source, seq=seq, ts_ms=ts_ms, txn=txn, origin=record.origin, meta=meta
        )

        data = doc.get("data")
        if op is Op.TRUNCATE:
            return [event]
        if op is Op.DDL:  # DROP COLUMN: no statement text; keep what the message carries
            if data is not None:
                meta["data"] = data
            return [event]
        if type(data) is not dict:
            raise field_error("data", data, "an object")
        types = table_setting(self._column_types, source) if self._column_types else None
        if op is Op.INSERT or half == "after":
            after = _image(data)
            key_obj = doc.get("key") if half == "after" else None
            if key_obj is not None:
                if type(key_obj) is not dict:
                    raise _wrong("key", "an object", key_obj)
                after = {**_image(key_obj), **after}
            event.after = after
        elif op is Op.DELETE or half == "before":
            event.before = _image(data)
        else:  # upd: key = before values of key and changed columns, data = new values
            key_obj = doc.get("key")
            if key_obj is None:
                event.after = _image(data)
            elif type(key_obj) is not dict:
                raise _wrong("key", "an object", key_obj)
            else:
                before = _image(key_obj)
                event.before = before
                event.after = {**before, **_image(data)}
            event.changed = tuple(data)
            event.partial = True  # (key and) changed columns only (document)
        if types is not None:
            self._apply_types(event, types)
        return [self._keyed(event, meta)]

    def _apply_types(self, event: ChangeEvent, types: Mapping[str, str]) -> None:
        columns: dict[str, str] = {}
        for image in (event.before, event.after):
            if image is None:
                continue
            for col, value in image.items():
                logical = types.get(col)
                if logical is not None:
                    image[col] = _typed(value, col, logical)
                    columns[col] = logical
        event.columns = columns

    def _keyed(self, event: ChangeEvent, meta: Mapping[str, Any]) -> ChangeEvent:
        configured = key_columns_for(self.options.primary_keys, event.source)
        rowid_col = self._rowid_column
        rowid = meta.get("rowid")
        if configured or not rowid_col or rowid is None:
            if (
                not configured
                and self.options.keyless == FULL_ROW
                and event.before is not None
                and event.after is not None
            ):
                # upd: its before image is the `key` object, which holds the key and
                # changed columns (document): not a whole row to identify the row by
                raise DecodeError(
                    f"update on keyless table {event.source.qualified_name!r}: SharePlex's "
                    "'key' object holds the key and changed columns, not the whole before "
                    "row, so keyless: full_row cannot identify it; keep the ROWID identity "
                    "(rowid_column) or set primary_keys for this table",
                    Code.MISSING_KEY,
                )
            return self.require_key(event, configured)
        if type(rowid) is not str:
            raise _wrong("meta.rowid", "a string", rowid)
        for image in (event.before, event.after):
            if image is not None:
                image[rowid_col] = rowid
        if event.columns is not None:
            event.columns[rowid_col] = "string"
        event.key = {rowid_col: rowid}
        return event

    def update_half(self, event: ChangeEvent) -> str | None:
        """``"before"``/``"after"`` for an ``UPDATE BEFORE``/``UPDATE AFTER`` half."""
        return _half(event)

    def combine(self, events: list[ChangeEvent]) -> list[ChangeEvent]:
        """Join each ``UPDATE BEFORE`` half with the next ``UPDATE AFTER`` half.

        Halves pair when they come from the same topic partition, table and transaction
        (``trans``), the before half first. The joined update has the before half's
        before image and the after half's after image, key, seq, time, origin and meta;
        like the DataWorks decoder, it stands at the position of the earlier (before)
        half. A half without its partner in this batch is kept as it is (an update with
        only a before or only an after image). Nothing is joined when the option
        ``pair_updates`` is off.
        """
        if not self._pair_updates:
            return events
        pending: dict[tuple[Any, ...], int] = {}
        out: list[ChangeEvent | None] = []
        for event in events:
            half = _half(event)
            if half is None:
                out.append(event)
                continue
            pair_key = (
                event.origin.topic,
                event.origin.partition,
                event.source,
                event.txn.id if event.txn else None,
            )
            if half == "before":
                pending[pair_key] = len(out)
                out.append(event)
                continue
            index = pending.pop(pair_key, None)
            if index is None:
                out.append(event)
                continue
            before = out[index]
            assert before is not None
            columns = None
            if before.columns is not None or event.columns is not None:
                columns = {**(before.columns or {}), **(event.columns or {})}
            out[index] = ChangeEvent(
                op=Op.UPDATE,
                source=event.source,
                key=event.key,
                before=before.before,
                after=event.after,
                columns=columns,
                seq=event.seq,
                ts_ms=event.ts_ms,
                txn=event.txn,
                origin=event.origin,
                meta=event.meta,
                partial=event.partial,
            )
        return [e for e in out if e is not None]


def _half(event: ChangeEvent) -> str | None:
    if event.op is not Op.UPDATE or event.meta is None:
        return None
    if event.before is not None and event.after is not None:
        return None
    op = event.meta.get("op")
    if not isinstance(op, str):
        return None
    spec = _OPS_EXACT.get(op) or OPERATIONS.get(" ".join(op.lower().split()))
    return spec[1] if spec else None

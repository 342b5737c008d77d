"""Oracle GoldenGate JSON (``ogg-json``): the operation-model JSON formatter of
GoldenGate for Big Data (GG for DAA) Kafka handler.

Source documents: GoldenGate for Big Data *Using the Pluggable Formatters* (JSON
formatter, operation model; metacolumn keywords ``${position}``, ``${csn}``, ``${xid}``,
``${txind}``, ``${primarykeycolumns}``, ``${alltokens}``); corpus files under
``tests/formats/corpus/ogg/``. One message is::

    {"table": "SCHEMA.TABLE" | "CATALOG.SCHEMA.TABLE", "op_type": "I"|"U"|"D"|"T",
     "op_ts": "yyyy-MM-dd HH:mm:ss.SSSSSS", "current_ts": "...", "pos": "000...0143",
     ["primary_keys": [...]], ["csn", "xid", "txind", "tokens"],
     "before": {col: value} | null, "after": {col: value} | null}

Decoding rules (details and the type table: ``docs/formats/ogg-json.md``):

* ``seq`` is ``(int(pos),)``: ``pos`` is the trail file sequence number and the record's
  RBA printed as one fixed-width zero-padded decimal, so its numeric order is the trail
  order (commit order). Without ``pos`` ``seq`` is ``None``.
* ``ts_ms`` is ``op_ts`` (the source commit timestamp from the trail), read in
  ``options.timestamp_zone`` (default UTC).
* Images keep exactly the columns the message has: an update carries only the changed
  and key columns unless the source logs full rows (``before`` needs ``GETUPDATEBEFORES``),
  so a column absent from ``after`` is "not present", never NULL. OGG declares no
  column types: values keep their JSON types (as in ``maxwell-json``).
* Key: ``primary_keys``, else ``options.primary_keys``, else ``MISSING_KEY``.
* ``T`` (truncate) is ``Op.TRUNCATE`` for the table, without key or images.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats.base import DecoderOptions, Record
from cdcflow.formats.common.exact_json import ExactJsonDecoder, json_image
from cdcflow.formats.common.fields import field_error, require
from cdcflow.formats.common.keys import TableInfo, with_key
from cdcflow.formats.common.zones import zone_option
from cdcflow.model import ChangeEvent, Op, SourceTable, Txn

__all__ = ["OggJsonDecoder", "OggJsonOptions"]

IDENTIFIER = "ogg-json"

# --------------------------------------------------------------------------- op codes
# ``op_type`` values: the formatter's defaults (insertOpKey, updateOpKey, deleteOpKey,
# truncateOpKey) and the full names a handler may be configured to print.
OP_CODES: dict[str, Op] = {
    "I": Op.INSERT,  # insert: ``after`` only
    "U": Op.UPDATE,  # update (also a primary-key update): ``after``, ``before`` if logged
    "D": Op.DELETE,  # delete: ``before`` only
    "T": Op.TRUNCATE,  # truncate table: no images
    "INSERT": Op.INSERT,
    "UPDATE": Op.UPDATE,
    "DELETE": Op.DELETE,
    "TRUNCATE": Op.TRUNCATE,
}
#: ``txind`` (``${txind}``) values meaning "last operation of its transaction":
#: E (end) and W (whole: the only operation), or the trail header codes 2 and 3.
_TX_LAST = frozenset({"E", "W", "2", "3", 2, 3})
_TX_NOT_LAST = frozenset({"B", "M", "0", "1", 0, 1})
_STRINGS = frozenset({str})
_TXN_FIELDS = frozenset({"xid", "csn"})
_META_FIELDS = ("current_ts", "csn", "tokens")  # kept in ``meta`` when present
_META_SET = frozenset(_META_FIELDS)


@dataclass(frozen=True)
class OggJsonOptions(DecoderOptions):
    """Options of ``ogg-json``.

    Attributes:
        timestamp_zone: zone of ``op_ts`` text (IANA name such as ``"Europe/Paris"``);
            default ``"UTC"``, as GoldenGate writes trail timestamps.
        op_codes: extra ``op_type`` codes for a handler configured with custom
            ``insertOpKey``/``updateOpKey``/``deleteOpKey``/``truncateOpKey``, as
            ``{code: "insert"|"update"|"delete"|"truncate"}``. Default: none.
        is_missing_fields: the formatter writes ``<column>_isMissing`` booleans
            (``includeIsMissingFields=true``): drop them and leave a missing column out of
            its image. Default ``False`` (such fields would be columns).
        float_as_decimal: decode JSON numbers with a fraction or exponent as exact
            ``Decimal`` (Oracle NUMBER) instead of ``float``. Slower. Default ``False``.
    """

    timestamp_zone: str = "UTC"
    op_codes: Mapping[str, str] = field(default_factory=dict)
    is_missing_fields: bool = False
    float_as_decimal: bool = False

    def __post_init__(self) -> None:
        zone_option(self.timestamp_zone)
        for code, name in dict(self.op_codes).items():
            if name not in ("insert", "update", "delete", "truncate"):
                raise ConfigError(
                    f"op_codes[{code!r}] must be insert, update, delete or truncate, not {name!r}"
                )


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _split_table(name: str) -> SourceTable:
    parts = name.split(".")
    if len(parts) >= 3:
        return SourceTable(IDENTIFIER, ".".join(parts[:-2]), parts[-2], parts[-1])
    if len(parts) == 2:
        return SourceTable(IDENTIFIER, schema=parts[0], table=parts[1])
    return SourceTable(IDENTIFIER, table=name)


class OggJsonDecoder(ExactJsonDecoder[OggJsonOptions]):
    """Decodes GoldenGate JSON operation messages (see the module docstring)."""

    identifier: ClassVar[str] = IDENTIFIER
    options_class = OggJsonOptions

    def __init__(self, options: OggJsonOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        self._exact: bool = self.options.float_as_decimal
        opts: OggJsonOptions = self.options
        self._zone = zone_option(opts.timestamp_zone)
        self._ops = {**OP_CODES, **{c: Op(n) for c, n in dict(opts.op_codes).items()}}
        self._tables: dict[str, TableInfo] = {}
        self._seconds: dict[str, int] = {}  # "yyyy-mm-dd hh:mm:ss" -> epoch seconds

    def _decode(self, msg: Any, record: Record, checked: bool) -> ChangeEvent:
        if type(msg) is not dict:
            raise DecodeError("a GoldenGate JSON message is a JSON object", Code.NOT_AN_OBJECT)
        get = msg.get
        code = require(msg, "op_type", str)
        op = self._ops.get(code)
        if op is None:
            raise DecodeError(f"unknown GoldenGate op_type {code!r}", Code.UNKNOWN_OP)
        name = require(msg, "table", str)
        info = self._tables.get(name)
        if info is None:
            info = TableInfo(_split_table(name), self.options.primary_keys)
            if len(self._tables) > 10_000:
                self._tables.clear()
            self._tables[name] = info
        source = info.source

        pos = get("pos")
        seq = None
        if pos is not None:
            if type(pos) is str and pos.isdigit() and pos.isascii():
                seq = (int(pos),)
            elif type(pos) is int and pos >= 0:
                seq = (pos,)
            else:
                raise DecodeError(f"pos {pos!r} is not a decimal position", Code.BAD_FIELD)
        op_ts = get("op_ts")
        ts_ms = None if op_ts is None else self._ts_ms(op_ts)
        txn = None if _TXN_FIELDS.isdisjoint(msg) else self._txn(get)
        meta = None
        if not _META_SET.isdisjoint(msg):
            meta = {k: msg[k] for k in _META_FIELDS if msg.get(k) is not None} or None
        if op is Op.TRUNCATE:
            return ChangeEvent(
                op, source, seq=seq, ts_ms=ts_ms, txn=txn, origin=record.origin, meta=meta
            )

        before = self._image(get("before"), "before", checked)
        after = self._image(get("after"), "after", checked)
        if op is Op.DELETE:
            if before is None:
                raise DecodeError("GoldenGate delete without a 'before' image", Code.MISSING_FIELD)
            after, image = None, before
        else:
            if after is None:
                raise DecodeError(
                    f"GoldenGate {op.value} without an 'after' image", Code.MISSING_FIELD
                )
            if op is Op.INSERT:
                before = None
            image = after
        event = ChangeEvent(
            op, source, None, before, after, None, seq, ts_ms, txn, None, None, record.origin, meta
        )
        keys = get("primary_keys")
        if keys is not None and (type(keys) is not list or not {*map(type, keys)} <= _STRINGS):
            raise field_error("primary_keys", keys, "a list of column names")
        return with_key(self, event, image, keys or info.keys)

    def _image(self, image: Any, name: str, checked: bool) -> dict[str, Any] | None:
        if image is None:
            return None
        if type(image) is not dict:
            raise field_error(name, image, "an object or null")
        if self.options.is_missing_fields:
            missing = [k for k, v in image.items() if k.endswith("_isMissing") and type(v) is bool]
            for flag in missing:
                if image.pop(flag):
                    image.pop(flag[: -len("_isMissing")], None)
        return json_image(image, checked)

    def _txn(self, get: Any) -> Txn | None:
        xid = get("xid")
        csn = get("csn")
        if xid is None and csn is None:
            return None
        txind = get("txind")
        last = None
        if type(txind) is str or type(txind) is int:
            last = True if txind in _TX_LAST else False if txind in _TX_NOT_LAST else None
        return Txn(str(xid if xid is not None else csn), None, last)

    def _ts_ms(self, text: Any) -> int:
        """``"2020-05-13 15:40:06.123456"`` (or ISO ``T``) -> epoch ms in the option zone."""
        if type(text) is str and len(text) >= 19:
            seconds = self._seconds.get(text[:19])
            if seconds is None:
                try:
                    wall = dt.datetime.fromisoformat(text[:19])
                except ValueError:
                    wall = None
                if wall is not None:
                    seconds = int((wall.replace(tzinfo=self._zone) - _EPOCH).total_seconds())
                    if len(self._seconds) > 100_000:
                        self._seconds.clear()
                    self._seconds[text[:19]] = seconds
            frac = text[20:23]
            if seconds is not None and (len(text) == 19 or (text[19] == "." and frac.isdigit())):
                return seconds * 1000 + (int(frac.ljust(3, "0")) if frac else 0)
        raise DecodeError(f"op_ts {text!r} is not 'yyyy-MM-dd HH:mm:ss[.ffffff]'", Code.BAD_FIELD)

"""Per-table rewrites of a batch's event rows before the net change.

* :func:`with_sequence_by` appends configured tie-break columns to ``seq`` so that the
  batch order, the stored ``_cdc_seq`` guard and the tombstones all use them (AUTO CDC's
  ``sequence_by``).
* :func:`drop_null_updates` turns an update's NULL values into "not present" (AUTO CDC's
  ``ignore_null_updates``), so the sink keeps the stored values.

Both take and return :data:`~cdcflow.decode.batches.EVENT_SCHEMA` rows of one table.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.model import Op, _seq_part
from cdcflow.types import parse_type

__all__ = ["TIE_BREAK_SEPARATOR", "drop_null_updates", "tie_break_part", "with_sequence_by"]

#: Joins the source sequence and each tie-break value. It sorts below every character a
#: :func:`~cdcflow.model.seq_key` uses (digits, ``.``, ``!``), so a sequence followed by
#: tie-breaks still sorts before any longer sequence it is a prefix of.
TIE_BREAK_SEPARATOR = " "
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_LIMIT = 10**40 - 1


def _clamped(n: int) -> str:
    return _seq_part(max(-_LIMIT, min(_LIMIT, n)))


def tie_break_part(value: Any, logical_type: str | None) -> str:
    """An order-preserving string for one tie-break value of ``logical_type``.

    NULL sorts first. Integers, decimals, floats (to 18 fractional digits) and timestamps
    (epoch microseconds) compare numerically; dates and text compare as text.
    """
    if value is None:
        return ""
    base = parse_type(logical_type)[0] if logical_type else None
    try:
        if base == "boolean" or isinstance(value, bool):
            return "1" + ("1" if value else "0")
        if base in ("int32", "int64") or isinstance(value, int):
            return "1" + _clamped(int(value))
        if base in ("decimal", "float32", "float64") or isinstance(value, float):
            q = decimal.Decimal(str(value)).scaleb(18).to_integral_value()
            return "1" + _clamped(int(q))
        if base in ("timestamp", "timestamptz"):
            t = dt.datetime.fromisoformat(str(value))
            if t.tzinfo is None:
                t = t.replace(tzinfo=dt.UTC)
            return "1" + _clamped((t - _EPOCH) // dt.timedelta(microseconds=1))
    except (ValueError, ArithmeticError, OverflowError):
        pass  # an unparsable value compares as text
    return "1" + str(value)


def with_sequence_by(events: pa.Table, columns: Sequence[str]) -> pa.Table:
    """``seq`` extended with the values of ``columns`` (after image; before for deletes).

    Args:
        events: EVENT_SCHEMA rows of one table.
        columns: tie-break columns, compared in this order after the source sequence.

    Returns:
        The rows with ``seq = seq + " " + part1 + " " + part2 ...``; a row without a
        source sequence gets ``"" + " " + ...`` (the tie-break alone orders it).
    """
    if not columns or events.num_rows == 0:
        return events
    seqs = events["seq"].to_pylist()
    afters = events["after"].to_pylist()
    befores = events["before"].to_pylist()
    declared = events["columns"].to_pylist()
    types: dict[str, str] = {}
    out = []
    for seq, after, before, cols in zip(seqs, afters, befores, declared, strict=True):
        if cols:
            types.update(orjson.loads(cols))
        image = after or before
        row = orjson.loads(image) if image else {}
        parts = [tie_break_part(row.get(c), types.get(c)) for c in columns]
        out.append(TIE_BREAK_SEPARATOR.join([seq or "", *parts]))
    return events.set_column(
        events.schema.get_field_index("seq"), "seq", pa.array(out, pa.string())
    )


def drop_null_updates(events: pa.Table) -> pa.Table:
    """Updates lose their NULL values, which become "not present" (``partial``).

    Inserts, snapshots and deletes are unchanged: only an update's NULL means "keep".
    """
    is_update = pc.fill_null(
        pc.and_(pc.equal(events["op"], Op.UPDATE.value), pc.is_valid(events["after"])), False
    )
    if not pc.any(is_update).as_py():
        return events
    afters = events["after"].to_pylist()
    partial = events["partial"].to_pylist()
    for i, upd in enumerate(is_update.to_pylist()):
        if not upd:
            continue
        row = orjson.loads(afters[i])
        kept = {c: v for c, v in row.items() if v is not None}
        if len(kept) != len(row):
            afters[i] = orjson.dumps(kept).decode()
            partial[i] = True
    events = events.set_column(
        events.schema.get_field_index("after"), "after", pa.array(afters, pa.string())
    )
    return events.set_column(
        events.schema.get_field_index("partial"), "partial", pa.array(partial, pa.bool_())
    )

"""Build EVENT_SCHEMA tables from ChangeEvents, independent of any format."""

from __future__ import annotations

import itertools

import pyarrow as pa

from cdcflow.decode.batches import flatten
from cdcflow.formats.base import DecodeResult
from cdcflow.model import ChangeEvent, Op, Origin, SourceTable

TABLE = SourceTable("test", "db", "", "items")
COLUMNS = {"id": "int64", "name": "string", "qty": "int64"}
_offsets = itertools.count()


def ev(
    op: Op,
    key=None,
    after=None,
    before=None,
    seq=None,
    columns=COLUMNS,
    table=TABLE,
    partition=0,
    offset=None,
) -> ChangeEvent:
    return ChangeEvent(
        op=op,
        source=table,
        key=None if key is None else {"id": key},
        before=before,
        after=after,
        columns=columns,
        seq=None if seq is None else (seq,),
        ts_ms=1000 + (seq or 0),
        origin=Origin("t", partition, next(_offsets) if offset is None else offset),
    )


def ins(k, name, qty=1, seq=None, **kw):
    return ev(Op.INSERT, k, after={"id": k, "name": name, "qty": qty}, seq=seq, **kw)


def upd(k, name, qty=1, seq=None, **kw):
    return ev(Op.UPDATE, k, after={"id": k, "name": name, "qty": qty}, seq=seq, **kw)


def dele(k, seq=None, **kw):
    return ev(Op.DELETE, k, before={"id": k}, seq=seq, **kw)


def table_of(*events: ChangeEvent) -> pa.Table:
    return pa.Table.from_batches([flatten(DecodeResult(events=list(events)))])

"""The two sides of a comparison: a source table (SQL in its database, inside the
snapshot) and its mirror (DuckDB over the Delta table's Arrow data at one version).

Both answer the same three questions (:class:`cdcflow.verify.ranges.Side`): the checksum
of a key range, keys that cut a range, and the rows of some ranges as canonical texts.
The mirror is read once per comparison into DuckDB as ``(key columns, row hash)``, sorted
by key -- the one full read of the mirror every verify needs -- and its checksums and cuts
are then answered from memory; only the rows of the leaves are read from the Delta table
again, in one scan.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cdcflow.verify.canonical import (
    Column,
    duckdb_row_hash,
    duckdb_text,
    sql_row_hash,
    sql_text,
)
from cdcflow.verify.databases import SourceDatabase, SourceTable
from cdcflow.verify.ranges import KeyRange, Row, range_predicate

__all__ = ["MirrorSide", "SourceSide"]


def _plain(value: Any) -> Any:
    """A key value as both drivers and DuckDB bind it (a UUID as its text)."""
    return str(value) if isinstance(value, uuid.UUID) else value


class SourceSide:
    """The source table's rows in the open snapshot of ``db``.

    Args:
        db: the database, its snapshot open.
        table: the table.
        key: its key columns; ``columns``: the other compared columns.
        full: hash every compared column (``False``: the key only, ``quick`` mode).
    """

    label = "source"

    def __init__(
        self,
        db: SourceDatabase,
        table: SourceTable,
        key: Sequence[Column],
        columns: Sequence[Column],
        full: bool,
    ) -> None:
        self.db, self.table = db, table
        self.key, self.columns = list(key), list(columns)
        q = db.quote
        self.relation = db.relation(table)
        self.key_texts = [sql_text(c, db.dialect, q(c.name)) for c in self.key]
        self.texts = [sql_text(c, db.dialect, q(c.name)) for c in self.columns]
        hashed = self.key_texts + (self.texts if full else [])
        self.hash = sql_row_hash(hashed, db.dialect)
        self.ordered = [db.ordered(c) for c in self.key]

    def _where(self, r: KeyRange) -> tuple[str, list[Any]]:
        return range_predicate(r, self.ordered, "%s")

    def count(self) -> int:
        return int(self.db.execute(f"SELECT count(*) FROM {self.relation}")[0][0])

    def checksum(self, r: KeyRange) -> tuple[int, int]:
        where, params = self._where(r)
        count, total = self.db.execute(
            f"SELECT count(*), sum({self.hash}) FROM {self.relation} WHERE {where}", params
        )[0]
        return int(count), int(total or 0)

    def split(self, r: KeyRange, parts: int) -> list[tuple]:
        where, params = self._where(r)
        count = self.checksum(r)[0]
        return _split_sql(
            self.db.execute,
            self.relation,
            self.key,
            self.ordered,
            where,
            params,
            count,
            parts,
            self.db.quote,
            "%s",
        )

    def rows(self, ranges: Sequence[KeyRange]) -> dict[tuple, Row]:
        out: dict[tuple, Row] = {}
        names = ", ".join(self.db.quote(c.name) for c in self.key)
        texts = ", ".join([*self.key_texts, *self.texts])
        for r in ranges:
            where, params = self._where(r)
            for got in self.db.execute(
                f"SELECT {names}, {texts} FROM {self.relation} WHERE {where}", params
            ):
                n = len(self.key)
                out[tuple(got[n : 2 * n])] = Row(
                    tuple(_plain(v) for v in got[:n]), tuple(got[2 * n :])
                )
        return out

    def rows_by_key(self, keys: Sequence[tuple]) -> dict[tuple, Row]:
        """The rows of ``keys`` (as read), by canonical key; absent keys left out."""
        out: dict[tuple, Row] = {}
        names = ", ".join(self.db.quote(c.name) for c in self.key)
        texts = ", ".join([*self.key_texts, *self.texts])
        n = len(self.key)
        one = f"({', '.join(['%s'] * n)})"
        row = names if n == 1 else f"({names})"
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ", ".join(["%s" if n == 1 else one] * len(chunk))
            params = [v for k in chunk for v in k]
            for got in self.db.execute(
                f"SELECT {names}, {texts} FROM {self.relation} WHERE {row} IN ({marks})", params
            ):
                out[tuple(got[n : 2 * n])] = Row(
                    tuple(_plain(v) for v in got[:n]), tuple(got[2 * n :])
                )
        return out


def _split_sql(
    execute: Any,
    relation: str,
    key: Sequence[Column],
    ordered: Sequence[str],
    where: str,
    params: list[Any],
    count: int,
    parts: int,
    quote: Any,
    marker: str,
) -> list[tuple]:
    """Keys at every ``count / parts``-th row of a range, by one window query (the key's
    index gives the order on the source)."""
    if count < 2 or parts < 2:
        return []
    step = max(1, -(-count // parts))
    names = ", ".join(quote(c.name) for c in key)
    order = ", ".join(ordered)
    found = execute(
        f"SELECT {names} FROM (SELECT {names}, row_number() OVER (ORDER BY {order}) AS cdcflow_rn "
        f"FROM {relation} WHERE {where}) AS cut WHERE mod(cdcflow_rn - 1, {step}) = 0 "
        f"AND cdcflow_rn > 1 ORDER BY cdcflow_rn",
        params,
    )
    return [tuple(_plain(v) for v in row) for row in found]


class MirrorSide:
    """The mirror's rows at one Delta version, through DuckDB.

    Args:
        data: the mirror's Arrow data (a ``pyarrow.dataset.Dataset`` of the Delta table at
            its version, or a table).
        schema: its Arrow schema.
        key, columns, full: as :class:`SourceSide`.
        where: a DuckDB condition the mirror's rows of this source table meet (a sharded
            target: its shard column naming the table), or ``None``.

    Raises:
        ConfigError: a column's mirror type cannot be compared (:func:`duckdb_text`).
    """

    label = "mirror"

    def __init__(
        self,
        data: Any,
        schema: pa.Schema,
        key: Sequence[Column],
        columns: Sequence[Column],
        full: bool,
        where: str | None = None,
        threads: int | None = None,
        keyed: bool = True,
    ) -> None:
        import duckdb

        self.key, self.columns = list(key), list(columns)
        self.con = duckdb.connect()
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        self.con.register("mirror_data", data)
        self.where = where or "TRUE"
        q = _duck_quote
        self.key_texts = [duckdb_text(c, schema.field(c.name).type, q(c.name)) for c in self.key]
        self.texts = [duckdb_text(c, schema.field(c.name).type, q(c.name)) for c in self.columns]
        hashed = self.key_texts + (self.texts if full else [])
        self.ordered = [q(c.name) for c in self.key]
        names = ", ".join(self.ordered)
        if not keyed:  # only rows_by_key will be asked
            return
        self.con.execute(
            f"CREATE TABLE keyed AS SELECT {names}, {duckdb_row_hash(hashed)} AS h "
            f"FROM mirror_data WHERE {self.where} ORDER BY {names}"
        )

    def _where(self, r: KeyRange) -> tuple[str, list[Any]]:
        return range_predicate(r, self.ordered, "?")

    def count(self) -> int:
        return int(self.con.execute("SELECT count(*) FROM keyed").fetchone()[0])  # type: ignore[index]  # count(*) always gives one row

    def checksum(self, r: KeyRange) -> tuple[int, int]:
        where, params = self._where(r)
        count, total = self.con.execute(
            f"SELECT count(*), sum(h) FROM keyed WHERE {where}", params
        ).fetchone()  # type: ignore[misc]  # an aggregate always gives one row
        return int(count), int(total or 0)

    def split(self, r: KeyRange, parts: int) -> list[tuple]:
        where, params = self._where(r)
        count = self.checksum(r)[0]

        def execute(sql: str, p: list[Any]) -> list[tuple]:
            return self.con.execute(sql, p).fetchall()

        return _split_sql(
            execute, "keyed", self.key, self.ordered, where, params, count, parts, _duck_quote, "?"
        )

    def rows(self, ranges: Sequence[KeyRange]) -> dict[tuple, Row]:
        if not ranges:
            return {}
        terms, params = [], []
        for r in ranges:
            where, p = self._where(r)
            terms.append(f"({where})")
            params += p
        return self._rows(" OR ".join(terms), params)

    def rows_by_key(self, keys: Sequence[tuple]) -> dict[tuple, Row]:
        if not keys:
            return {}
        n = len(self.key)
        row = self.ordered[0] if n == 1 else f"({', '.join(self.ordered)})"
        one = "?" if n == 1 else f"({', '.join(['?'] * n)})"
        marks = ", ".join([one] * len(keys))
        return self._rows(f"{row} IN ({marks})", [v for k in keys for v in k])

    def _rows(self, condition: str, params: list[Any]) -> dict[tuple, Row]:
        names = ", ".join(self.ordered)
        texts = ", ".join([*self.key_texts, *self.texts])
        n = len(self.key)
        out: dict[tuple, Row] = {}
        for got in self.con.execute(
            f"SELECT {names}, {texts} FROM mirror_data WHERE ({self.where}) AND ({condition})",
            params,
        ).fetchall():
            out[tuple(got[n : 2 * n])] = Row(tuple(_plain(v) for v in got[:n]), tuple(got[2 * n :]))
        return out

    def close(self) -> None:
        self.con.close()


def _duck_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'

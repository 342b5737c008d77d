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

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cdcflow.transform.expressions import Expression
from cdcflow.verify.canonical import (
    Column,
    duckdb_row_hash,
    duckdb_text,
    sql_row_hash,
    sql_text,
)
from cdcflow.verify.databases import SourceDatabase, SourceTable
from cdcflow.verify.ranges import KeyRange, Row, range_predicate

__all__ = ["MirrorSide", "SourceSide", "key_in"]


def _plain(value: Any) -> Any:
    """A key value as both drivers and DuckDB bind it (a UUID as its text)."""
    return str(value) if isinstance(value, uuid.UUID) else value


def _row(got: Sequence[Any], n: int) -> tuple[tuple, Row]:
    """``(canonical key, Row)`` of a result row laid out as the key's ``n`` columns as
    read, their ``n`` canonical texts, then the other columns' texts."""
    return tuple(got[n : 2 * n]), Row(tuple(_plain(v) for v in got[:n]), tuple(got[2 * n :]))


def key_in(names: Sequence[str], keys: int, marker: str) -> str:
    """The condition "the key is one of ``keys`` keys": ``k IN (?, ?)``, or for a
    composite key ``(a, b) IN ((?, ?), (?, ?))``; ``names``: the key columns as the
    side writes them."""
    if len(names) == 1:
        return f"{names[0]} IN ({', '.join([marker] * keys)})"
    one = f"({', '.join([marker] * len(names))})"
    return f"({', '.join(names)}) IN ({', '.join([one] * keys)})"


class SourceSide:
    """The source table's rows in the open snapshot of ``db``.

    Args:
        db: the database, its snapshot open.
        table: the table.
        key: its key columns; ``columns``: the other compared columns.
        full: hash every compared column (``False``: the key only, ``quick`` mode).
        row_filter: the target's row filter (``tables[].filter``): only the rows it is
            true for are the source's side (``None``: every row).
    """

    def __init__(
        self,
        db: SourceDatabase,
        table: SourceTable,
        key: Sequence[Column],
        columns: Sequence[Column],
        full: bool,
        row_filter: Expression | None = None,
    ) -> None:
        self.db = db
        self.key, self.columns = list(key), list(columns)
        q = db.quote
        self.relation = db.relation(table)
        self.key_texts = [sql_text(c, db.dialect, q(c.name)) for c in self.key]
        self.texts = [sql_text(c, db.dialect, q(c.name)) for c in self.columns]
        hashed = self.key_texts + (self.texts if full else [])
        self.hash = sql_row_hash(hashed, db.dialect)
        self.ordered = [db.ordered(c) for c in self.key]
        self.row_filter = row_filter
        #: the last range :meth:`_kept` read and its rows (the bisection asks a range's
        #: checksum, then its cut)
        self._last_kept: tuple[KeyRange, list[tuple[tuple, tuple, tuple, int]]] | None = None
        #: checksums computed ahead by :meth:`prefetch`, each used once
        self._ahead: dict[KeyRange, tuple[int, int]] = {}

    def prefetch(self, ranges: Sequence[KeyRange]) -> None:
        """Compute the checksums of ``ranges`` now, while the mirror's side builds its
        keyed table in a thread (:meth:`MirrorSide.start_build`): the two engines work at
        once. Not for a filtered table (its ranges are read whole, one at a time)."""
        if self.row_filter is None:
            for r in ranges:
                self._ahead[r] = self.checksum(r)

    def _kept(self, r: KeyRange) -> list[tuple[tuple, tuple, tuple, int]]:
        if self._last_kept is None or self._last_kept[0] != r:
            self._last_kept = (r, self._read_kept(r))
        return self._last_kept[1]

    def _read_kept(self, r: KeyRange) -> list[tuple[tuple, tuple, tuple, int]]:
        """A filtered table's rows of ``r`` the filter keeps, in key order, as ``(key as
        read, key texts, texts, hash)``: the pipeline's own filter
        (:mod:`cdcflow.transform.expressions`) over the columns it reads, evaluated here
        on the rows' values, so the source side holds exactly the rows that land."""
        assert self.row_filter is not None
        where, params = self._where(r)
        q = self.db.quote
        reads = list(self.row_filter.columns)
        select = [
            *(q(c.name) for c in self.key),
            *self.key_texts,
            *self.texts,
            self.hash,
            *(q(n) for n in reads),
        ]
        # every output aliased: a key's text (``"id"::text``) is named as the key, and
        # ORDER BY would take it for the key
        aliased = ", ".join(f"{e} AS cdcflow_{i}" for i, e in enumerate(select))
        got = self.db.execute(
            f"SELECT {aliased} FROM {self.relation} WHERE {where} "
            f"ORDER BY {', '.join(self.ordered)}",
            params,
        )
        if not got:
            return []
        n, m = len(self.key), len(self.texts)
        values = pa.table(
            {
                name: pa.array([_plain(row[2 * n + m + 1 + i]) for row in got])
                for i, name in enumerate(reads)
            }
        )
        keep = self.row_filter.evaluate(values).to_pylist()
        return [
            (
                tuple(_plain(v) for v in row[:n]),
                tuple(row[n : 2 * n]),
                tuple(row[2 * n : 2 * n + m]),
                int(row[2 * n + m]),
            )
            for row, kept in zip(got, keep, strict=True)
            if kept
        ]

    def _where(self, r: KeyRange) -> tuple[str, list[Any]]:
        return range_predicate(r, self.ordered, "%s")

    def checksum(self, r: KeyRange) -> tuple[int, int]:
        ahead = self._ahead.pop(r, None)
        if ahead is not None:
            return ahead
        if self.row_filter is not None:
            kept = self._kept(r)
            return len(kept), sum(h for *_, h in kept)
        where, params = self._where(r)
        count, total = self.db.execute(
            f"SELECT count(*), sum({self.hash}) FROM {self.relation} WHERE {where}", params
        )[0]
        return int(count), int(total or 0)

    def split(self, r: KeyRange, parts: int, rows: int | None = None) -> list[tuple]:
        if self.row_filter is not None:
            kept = self._kept(r)
            step = max(1, -(-len(kept) // parts))
            return [k for k, *_ in kept[step::step]] if len(kept) > 1 and parts > 1 else []
        where, params = self._where(r)
        count = self.checksum(r)[0] if rows is None else rows
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
        )

    def rows(self, ranges: Sequence[KeyRange]) -> dict[tuple, Row]:
        out: dict[tuple, Row] = {}
        if self.row_filter is not None:
            for r in ranges:
                for key, key_texts, row_texts, _ in self._kept(r):
                    out[key_texts] = Row(key, row_texts)
            return out
        names = ", ".join(self.db.quote(c.name) for c in self.key)
        texts = ", ".join([*self.key_texts, *self.texts])
        for r in ranges:
            where, params = self._where(r)
            out.update(
                _row(got, len(self.key))
                for got in self.db.execute(
                    f"SELECT {names}, {texts} FROM {self.relation} WHERE {where}", params
                )
            )
        return out

    def rows_by_key(self, keys: Sequence[tuple]) -> dict[tuple, Row]:
        """The rows of ``keys`` (as read), by canonical key; absent keys (and, on a
        filtered table, rows the filter leaves out) left out."""
        if self.row_filter is not None:
            found = self._rows_by_key(keys)
            kept = self._kept_keys(list(found.values()))
            return {k: row for k, row in found.items() if row.key in kept}
        return self._rows_by_key(keys)

    def _kept_keys(self, rows: Sequence[Row]) -> set[tuple]:
        """The keys (as read) among ``rows`` whose source rows the filter keeps."""
        assert self.row_filter is not None
        if not rows:
            return set()
        q = self.db.quote
        reads = list(self.row_filter.columns)
        n = len(self.key)
        names = [q(c.name) for c in self.key]
        got = self.db.execute(
            f"SELECT {', '.join(names)}, {', '.join(q(c) for c in reads)} "
            f"FROM {self.relation} WHERE {key_in(names, len(rows), '%s')}",
            [v for r in rows for v in r.key],
        )
        values = pa.table(
            {name: pa.array([_plain(g[n + i]) for g in got]) for i, name in enumerate(reads)}
        )
        keep = self.row_filter.evaluate(values).to_pylist() if got else []
        return {tuple(_plain(v) for v in g[:n]) for g, k in zip(got, keep, strict=True) if k}

    def _rows_by_key(self, keys: Sequence[tuple]) -> dict[tuple, Row]:
        out: dict[tuple, Row] = {}
        names = [self.db.quote(c.name) for c in self.key]
        texts = ", ".join([*self.key_texts, *self.texts])
        for chunk in _chunks(keys):
            out.update(
                _row(got, len(self.key))
                for got in self.db.execute(
                    f"SELECT {', '.join(names)}, {texts} FROM {self.relation} "
                    f"WHERE {key_in(names, len(chunk), '%s')}",
                    [v for k in chunk for v in k],
                )
            )
        return out

    def raw_rows_by_key(
        self, keys: Sequence[tuple], columns: Sequence[Column]
    ) -> dict[tuple, dict[str, Any]]:
        """Canonical key -> ``columns`` of the rows of ``keys`` (as read) as the driver
        returns them (``--repair``'s images; no filter applied)."""
        q = self.db.quote
        names = [q(c.name) for c in self.key]
        n = len(self.key)
        out: dict[tuple, dict[str, Any]] = {}
        for chunk in _chunks(keys):
            for row in self.db.execute(
                f"SELECT {', '.join(self.key_texts)}, {', '.join(q(c.name) for c in columns)} "
                f"FROM {self.relation} WHERE {key_in(names, len(chunk), '%s')}",
                [v for k in chunk for v in k],
            ):
                out[tuple(row[:n])] = {c.name: v for c, v in zip(columns, row[n:], strict=True)}
        return out


def _chunks(keys: Sequence[tuple], size: int = 500) -> list[Sequence[tuple]]:
    return [keys[start : start + size] for start in range(0, len(keys), size)]


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
        threads: DuckDB's threads (``None``: its default).
        keyed: build the sorted ``(key, hash)`` table the checksums and cuts read now
            (``False``: later, by :meth:`build` or :meth:`start_build`; or never, for a
            side that only reads rows by key).
        where_columns: the columns ``where`` reads.

    Raises:
        ConfigError: a column's mirror type cannot be compared (:func:`duckdb_text`).
    """

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
        where_columns: Sequence[str] = (),
    ) -> None:
        import duckdb

        self.key, self.columns = list(key), list(columns)
        self.con = duckdb.connect()
        # a zoned text without an offset is UTC, as the formats write it (never the
        # machine's zone)
        self.con.execute("SET TimeZone = 'UTC'")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        self.data = data
        self.read_columns = list(
            dict.fromkeys(
                [*(c.name for c in self.key), *(c.name for c in self.columns), *where_columns]
            )
        )
        self.where = where or "TRUE"
        q = _duck_quote
        self.key_texts = [duckdb_text(c, schema.field(c.name).type, q(c.name)) for c in self.key]
        self.texts = [duckdb_text(c, schema.field(c.name).type, q(c.name)) for c in self.columns]
        self.hashed = self.key_texts + (self.texts if full else [])
        self.ordered = [q(c.name) for c in self.key]
        self.where_columns = list(where_columns)
        #: the build of the sorted ``(key, hash)`` table, when started in a thread
        self._building: threading.Thread | None = None
        self._build_error: BaseException | None = None
        if keyed:
            self.build()

    def build(self) -> None:
        """Build the sorted ``keyed`` table of ``(key, row hash)`` the checksums and cuts
        read: one scan of the mirror, the hashing done by DuckDB."""
        names = ", ".join(self.ordered)
        self._register()
        self.con.execute(
            f"CREATE TABLE keyed AS SELECT {names}, {duckdb_row_hash(self.hashed)} AS h "
            f"FROM mirror_data WHERE {self.where} ORDER BY {names}"
        )

    def start_build(self) -> None:
        """:meth:`build` in a thread of its own (DuckDB works without the GIL), so the
        source's checksums run meanwhile; the first checksum or cut waits for it. Call
        nothing else of this side until then."""

        def run() -> None:
            try:
                self.build()
            except BaseException as exc:  # noqa: BLE001 - raised by the caller's next call
                self._build_error = exc

        self._building = threading.Thread(target=run, name="cdcflow-verify-keyed", daemon=True)
        self._building.start()

    def _built(self) -> None:
        if self._building is not None:
            self._building.join()
            self._building = None
            if self._build_error is not None:
                raise self._build_error

    def first_cuts(self, chunk_rows: int) -> tuple[int, list[tuple]]:
        """``(rows, keys)``: the rows of this source table in the mirror and the keys that
        cut them into ranges of about ``chunk_rows``, from the key columns alone (before,
        and without, the keyed table)."""
        where_only = not self.where_columns
        if where_only and hasattr(self.data, "count_rows"):
            rows = int(self.data.count_rows())
        else:
            self._register(self._key_columns())
            rows = int(
                self.con.execute(f"SELECT count(*) FROM mirror_data WHERE {self.where}").fetchall()[
                    0
                ][0]
            )
        parts = -(-rows // max(1, chunk_rows))
        if rows == 0 or parts < 2:
            return rows, []

        def execute(sql: str, p: list[Any]) -> list[tuple]:
            self._register(self._key_columns())
            return self.con.execute(sql, p).fetchall()

        cuts = _split_sql(
            execute, "mirror_data", self.key, self.ordered, self.where, [], rows, parts, _duck_quote
        )
        return rows, cuts

    def _key_columns(self) -> list[str]:
        return list(dict.fromkeys([*(c.name for c in self.key), *self.where_columns]))

    def _register(self, columns: Sequence[str] | None = None) -> None:
        """Give DuckDB the mirror's columns (``columns``; default: every column read) as a
        stream read once: a fresh reader per query. A dataset would take DuckDB's
        filters, and pyarrow refuses the string ones against a Delta table's file
        statistics (``equal`` of string and string_view); the scan is whole anyway (a
        mirror's files are not sorted by key)."""
        wanted = list(columns or self.read_columns)
        reader = (
            self.data.scanner(columns=wanted).to_reader()
            if hasattr(self.data, "scanner")
            else self.data.select(wanted).to_reader()
        )
        self.con.register("mirror_data", reader)

    def _where(self, r: KeyRange) -> tuple[str, list[Any]]:
        return range_predicate(r, self.ordered, "?")

    def checksum(self, r: KeyRange) -> tuple[int, int]:
        self._built()
        where, params = self._where(r)
        count, total = self.con.execute(
            f"SELECT count(*), sum(h) FROM keyed WHERE {where}", params
        ).fetchall()[0]
        return int(count), int(total or 0)

    def split(self, r: KeyRange, parts: int, rows: int | None = None) -> list[tuple]:
        self._built()
        where, params = self._where(r)
        count = self.checksum(r)[0] if rows is None else rows

        def execute(sql: str, p: list[Any]) -> list[tuple]:
            return self.con.execute(sql, p).fetchall()

        return _split_sql(
            execute, "keyed", self.key, self.ordered, where, params, count, parts, _duck_quote
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
        return self._rows(key_in(self.ordered, len(keys), "?"), [v for k in keys for v in k])

    def _rows(self, condition: str, params: list[Any]) -> dict[tuple, Row]:
        names = ", ".join(self.ordered)
        texts = ", ".join([*self.key_texts, *self.texts])
        self._register()
        return dict(
            _row(got, len(self.key))
            for got in self.con.execute(
                f"SELECT {names}, {texts} FROM mirror_data WHERE ({self.where}) AND ({condition})",
                params,
            ).fetchall()
        )

    def values_by_key(self, keys: Sequence[tuple], column: str) -> dict[tuple, Any]:
        """Canonical key -> the mirror's ``column`` (one of ``where_columns``) for the
        rows of ``keys`` (as read) it holds."""
        if not keys:
            return {}
        self._register()
        n = len(self.key)
        got = self.con.execute(
            f"SELECT {', '.join(self.key_texts)}, {_duck_quote(column)} FROM mirror_data "
            f"WHERE ({self.where}) AND ({key_in(self.ordered, len(keys), '?')})",
            [v for k in keys for v in k],
        ).fetchall()
        return {tuple(row[:n]): row[n] for row in got}

    def close(self) -> None:
        if self._building is not None:
            self._building.join()
        self.con.close()


def _duck_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'

"""The source database, read-only: its tables, one consistent snapshot, and its position.

PostgreSQL through psycopg 3, MySQL and MariaDB through PyMySQL (the ``verify`` extra:
``pip install 'cdcflow[verify]'``). Every statement runs inside one read-only snapshot --
``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`` (PostgreSQL), ``START TRANSACTION
WITH CONSISTENT SNAPSHOT, READ ONLY`` (MySQL) -- under a statement timeout
(``statement_timeout``; ``max_execution_time`` on MySQL, ``max_statement_time`` on
MariaDB), so that a verify never writes and never runs a query longer than asked.

The snapshot's position is recorded with it: PostgreSQL's ``pg_current_wal_lsn()`` read as
the snapshot's first statement (the snapshot is taken there, so every transaction it sees
committed at or before that LSN), MySQL's ``SHOW MASTER STATUS`` binlog file and position
and GTID set (read right after the snapshot opens: MySQL has no atomic way to read both;
the report says "about").
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cdcflow.errors import CdcflowError, Code, ConfigError
from cdcflow.verify.canonical import Column, Dialect, mysql_kind, postgres_kind

__all__ = ["SourceDatabase", "SourceTable", "connect_source", "redact"]


@dataclass
class SourceTable:
    """One table of the source database.

    Attributes:
        database, schema, table: its name as the formats name it (MySQL: schema ``""``).
        columns: every column in table order.
        key: the primary key's columns, in key order (empty: the table has none).
    """

    database: str
    schema: str
    table: str
    columns: list[Column]
    key: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """``database.schema.table`` (empty parts left out), as routes match it."""
        return ".".join(p for p in (self.database, self.schema, self.table) if p)


def redact(url: str) -> str:
    """``url`` without its password (for reports and the verifications record)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class SourceDatabase:
    """A read-only connection to the source database.

    Args:
        url: ``postgresql://user:password@host:port/database`` or
            ``mysql://user:password@host:port/database`` (``mariadb://`` too).
        statement_timeout_s: the longest statement allowed, in seconds.

    Raises:
        ConfigError: the URL names no supported database, or its driver is not installed.
        OSError: the database cannot be reached (the driver's error, as raised).
    """

    dialect: Dialect

    def __init__(self, url: str, statement_timeout_s: float = 60.0) -> None:
        self.url = url
        self.statement_timeout_s = statement_timeout_s
        scheme = urllib.parse.urlsplit(url).scheme.split("+")[0].lower()
        if scheme in ("postgresql", "postgres"):
            self.dialect = "postgresql"
            try:
                import psycopg
            except ImportError:  # pragma: no cover - the extra is missing
                raise ConfigError(
                    "--source-db postgresql://...: psycopg is not installed; "
                    "pip install 'cdcflow[verify]'"
                ) from None
            self._errors: tuple[type[Exception], ...] = (psycopg.Error,)
            try:
                # never prepared: a prepared range query gets PostgreSQL's generic plan
                # after five runs, a serial scan without parallel workers (measured: 17-21
                # s against 10.6 s for quick mode's 100 ranges of 10M rows)
                self._conn: Any = psycopg.connect(
                    url, autocommit=True, connect_timeout=10, prepare_threshold=None
                )
            except psycopg.OperationalError as exc:
                raise _unreachable(url, exc) from None
            self._conn.execute("SET default_transaction_read_only = on")
            self.database = str(self._one("SELECT current_database()")[0])
        elif scheme in ("mysql", "mariadb"):
            self.dialect = "mysql"
            try:
                import pymysql
            except ImportError:  # pragma: no cover - the extra is missing
                raise ConfigError(
                    "--source-db mysql://...: PyMySQL is not installed; "
                    "pip install 'cdcflow[verify]'"
                ) from None
            parts = urllib.parse.urlsplit(url)
            database = parts.path.lstrip("/")
            if not database:
                raise ConfigError(
                    f"--source-db {redact(url)}: name the database, e.g. mysql://user@host/shop"
                )
            self._errors = (pymysql.MySQLError,)
            try:
                self._conn = pymysql.connect(
                    host=parts.hostname or "127.0.0.1",
                    port=parts.port or 3306,
                    user=urllib.parse.unquote(parts.username or ""),
                    password=urllib.parse.unquote(parts.password or ""),
                    database=database,
                    autocommit=True,
                    charset="utf8mb4",
                    init_command="SET time_zone = '+00:00'",
                    connect_timeout=10,
                )
            except pymysql.MySQLError as exc:
                raise _unreachable(url, exc) from None
            self.database = database
            self._mysql_timeout()
        else:
            raise ConfigError(
                f"--source-db {redact(url)}: give a postgresql:// or mysql:// URL "
                "(MariaDB: mysql:// too)"
            )
        self.position: str | None = None
        self.in_snapshot = False

    # ------------------------------------------------------------------ statements

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """The rows of one statement (inside the snapshot when one is open).

        Raises:
            CdcflowError: ``SOURCE_DB_ERROR``, one line: the database failed the statement
                (a statement timeout, a lost connection, a missing privilege).
        """
        try:
            if self.dialect == "postgresql":
                cur = self._conn.execute(sql, tuple(params) or None)
                return [] if cur.description is None else list(cur.fetchall())
            with self._conn.cursor() as cur:
                cur.execute(sql, tuple(params))
                return list(cur.fetchall())
        except self._errors as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CdcflowError(
                f"--source-db {redact(self.url)} failed a statement: {first} (in: "
                f"{' '.join(sql.split())[:100]}...); a statement timeout is "
                f"--statement-timeout-s ({self.statement_timeout_s:g} s)",
                Code.SOURCE_DB_ERROR,
            ) from None

    def _one(self, sql: str) -> tuple:
        return self.execute(sql)[0]

    def _mysql_timeout(self) -> None:
        ms = max(1, int(self.statement_timeout_s * 1000))
        for statement in (
            f"SET SESSION max_statement_time = {ms / 1000:.3f}",  # MariaDB
            f"SET SESSION max_execution_time = {ms}",  # MySQL
        ):
            try:
                self.execute(statement)
                return
            except Exception:  # noqa: BLE001, S112 - the other server's variable
                continue

    # ------------------------------------------------------------------ snapshot

    def begin_snapshot(self) -> str:
        """Open the read-only snapshot every following statement reads; returns its
        position (``lsn 0/1A2B3C``; ``binlog mysql-bin.000003:1234 gtid ...``)."""
        if self.in_snapshot:
            self.end_snapshot()
        if self.dialect == "postgresql":
            self.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            ms = max(1, int(self.statement_timeout_s * 1000))
            self.execute(f"SET LOCAL statement_timeout = {ms}")
            lsn = self._one("SELECT pg_current_wal_lsn()::text")[0]
            self.position = f"lsn {lsn}"
        else:
            self.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            self.position = self._binlog_position()
        self.in_snapshot = True
        return self.position

    def _binlog_position(self) -> str:
        try:
            rows = self.execute("SHOW MASTER STATUS")
        except Exception:  # noqa: BLE001 - no privilege, or binlog off
            rows = []
        if not rows:
            return "binlog unknown (no SHOW MASTER STATUS: binlog off or no privilege)"
        file, pos = rows[0][0], rows[0][1]
        gtid = ""
        try:
            gtid = str(self._one("SELECT @@gtid_current_pos")[0])  # MariaDB
        except Exception:  # noqa: BLE001 - MySQL: the fifth column of SHOW MASTER STATUS
            gtid = str(rows[0][4]) if len(rows[0]) > 4 else ""
        return f"binlog {file}:{pos}" + (f" gtid {gtid}" if gtid else "") + " (about)"

    def end_snapshot(self) -> None:
        """Close the snapshot (it read only: a rollback)."""
        if self.in_snapshot:
            self.execute("ROLLBACK")
            self.in_snapshot = False

    def close(self) -> None:
        self.end_snapshot()
        self._conn.close()

    # ------------------------------------------------------------------ catalogue

    def tables(self) -> list[SourceTable]:
        """Every base table the connection can see (PostgreSQL: outside the system
        schemas; MySQL: in the URL's database), with columns and primary key."""
        if self.dialect == "postgresql":
            return self._postgres_tables()
        return self._mysql_tables()

    def _postgres_tables(self) -> list[SourceTable]:
        rows = self.execute(
            "SELECT c.table_schema, c.table_name, c.column_name, c.udt_name, c.data_type, "
            "c.datetime_precision FROM information_schema.columns c "
            "JOIN information_schema.tables t USING (table_schema, table_name) "
            "WHERE t.table_type = 'BASE TABLE' "
            "AND c.table_schema NOT IN ('pg_catalog', 'information_schema') "
            "ORDER BY c.table_schema, c.table_name, c.ordinal_position"
        )
        keys = self.execute(
            "SELECT n.nspname, c.relname, a.attname FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
            "WHERE i.indisprimary ORDER BY n.nspname, c.relname, k.ord"
        )
        return self._assemble(
            (
                (s, t, name, postgres_kind(udt, dtype, prec))
                for s, t, name, udt, dtype, prec in rows
            ),
            keys,
        )

    def _mysql_tables(self) -> list[SourceTable]:
        rows = self.execute(
            "SELECT c.TABLE_NAME, c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, "
            "c.DATETIME_PRECISION FROM information_schema.COLUMNS c "
            "JOIN information_schema.TABLES t "
            "ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME "
            "WHERE c.TABLE_SCHEMA = DATABASE() AND t.TABLE_TYPE = 'BASE TABLE' "
            "ORDER BY c.TABLE_NAME, c.ORDINAL_POSITION"
        )
        keys = self.execute(
            "SELECT '', TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
            "WHERE TABLE_SCHEMA = DATABASE() AND CONSTRAINT_NAME = 'PRIMARY' "
            "ORDER BY TABLE_NAME, ORDINAL_POSITION"
        )
        json_columns = self._mariadb_json_columns()
        return self._assemble(
            (
                (
                    "",
                    t,
                    name,
                    mysql_kind(
                        "json" if (_text(t), _text(name)) in json_columns else _text(dtype),
                        _text(ctype),
                        prec,
                    ),
                )
                for t, name, dtype, ctype, prec in rows
            ),
            keys,
        )

    def _mariadb_json_columns(self) -> set[tuple[str, str]]:
        """MariaDB's ``JSON`` columns: a ``LONGTEXT`` with a ``json_valid(`col`)`` check
        (https://mariadb.com/kb/en/json-data-type/); ``(table, column)``. MySQL's JSON is a
        type of its own (and its ``CHECK_CONSTRAINTS`` has no table name: nothing found)."""
        try:
            rows = self.execute(
                "SELECT TABLE_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
                "WHERE CONSTRAINT_SCHEMA = DATABASE()"
            )
        except Exception:  # noqa: BLE001 - MySQL: no TABLE_NAME column
            return set()
        found = set()
        for table, clause in rows:
            m = re.fullmatch(r"json_valid\(`((?:[^`]|``)+)`\)", _text(clause).strip())
            if m:
                found.add((_text(table), m.group(1).replace("``", "`")))
        return found

    def _assemble(self, columns: Any, keys: list[tuple]) -> list[SourceTable]:
        found: dict[tuple[str, str], SourceTable] = {}
        for schema, table, name, column in columns:
            t = found.setdefault(
                (schema, table),
                SourceTable(self.database, schema, table, []),
            )
            t.columns.append(dataclasses.replace(column, name=name))
        for schema, table, name in keys:
            if (schema, table) in found:
                found[(schema, table)].key.append(name)
        return list(found.values())

    # ------------------------------------------------------------------ SQL parts

    def quote(self, name: str) -> str:
        if self.dialect == "postgresql":
            return '"' + name.replace('"', '""') + '"'
        return "`" + name.replace("`", "``") + "`"

    def relation(self, table: SourceTable) -> str:
        """The table's quoted name."""
        if self.dialect == "postgresql":
            return f"{self.quote(table.schema)}.{self.quote(table.table)}"
        return self.quote(table.table)

    def ordered(self, column: Column) -> str:
        """The key column as ranges compare it: texts by their bytes (as the mirror's
        DuckDB does), whatever the column's collation (PostgreSQL ``COLLATE "C"``,
        MySQL ``BINARY``)."""
        q = self.quote(column.name)
        if self.dialect == "postgresql":
            texts = ("text", "varchar", "bpchar", "name", "citext")
            return f'{q} COLLATE "C"' if column.source_type in texts else q
        if column.kind == "text" and re.search(r"char|text", column.source_type, re.I):
            return f"BINARY {q}"
        return q


def _unreachable(url: str, exc: Exception) -> ConfigError:
    """One line for a database that refused the connection (the password left out)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ConfigError(
        f"--source-db {redact(url)}: cannot connect ({first}); check the host, port, "
        "database and credentials"
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def connect_source(url: str, statement_timeout_s: float = 60.0) -> SourceDatabase:
    """:class:`SourceDatabase` of ``url`` (see there)."""
    if not re.match(r"^[a-z][a-z0-9+.-]*://", url):
        raise ConfigError("--source-db: give a URL, e.g. postgresql://user:password@host:5432/shop")
    return SourceDatabase(url, statement_timeout_s)

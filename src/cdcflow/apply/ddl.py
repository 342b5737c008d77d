"""Column renames stated by DDL text that formats carry (Canal/DRS ``sql``, DTS Avro DDL,
DataWorks DDL, Debezium schema-change ``ddl``).

Only renames are read from DDL: added and dropped columns show in the images and their
declared types, which every format carries, but a rename looks like "one column dropped,
another added" there, losing the values. Recognised forms (MySQL 8, PostgreSQL, Oracle,
SQL Server's ANSI form)::

    ALTER TABLE t RENAME COLUMN a TO b
    ALTER TABLE t CHANGE [COLUMN] a b <type> ...     (MySQL; a != b)

Identifiers may be quoted with backticks, double quotes or brackets. Anything else in the
statement is ignored.
"""

from __future__ import annotations

import re

__all__ = ["column_renames"]

_IDENT = r"(?:`(?:[^`]|``)+`|\"(?:[^\"]|\"\")+\"|\[[^\]]+\]|[A-Za-z_][\w$#]*)"
_ALTER = re.compile(r"^\s*ALTER\s+TABLE\s", re.IGNORECASE)
_RENAME = re.compile(
    rf"RENAME\s+COLUMN\s+(?P<old>{_IDENT})\s+TO\s+(?P<new>{_IDENT})", re.IGNORECASE
)
_CHANGE = re.compile(
    rf"(?:^|,|\s)CHANGE\s+(?:COLUMN\s+)?(?P<old>{_IDENT})\s+(?P<new>{_IDENT})\s+\w",
    re.IGNORECASE,
)


def _unquote(name: str) -> str:
    if name[0] == "`":
        return name[1:-1].replace("``", "`")
    if name[0] == '"':
        return name[1:-1].replace('""', '"')
    if name[0] == "[":
        return name[1:-1]
    return name


def column_renames(ddl: str | None) -> list[tuple[str, str]]:
    """``[(old, new), ...]`` column renames an ``ALTER TABLE`` statement makes, in order.

    Returns ``[]`` for any other statement (and for a MySQL ``CHANGE`` that keeps the name).
    """
    if not ddl or not _ALTER.match(ddl):
        return []
    found: list[tuple[int, str, str]] = []
    for pattern in (_RENAME, _CHANGE):
        for m in pattern.finditer(ddl):
            old, new = _unquote(m.group("old")), _unquote(m.group("new"))
            if old != new:
                found.append((m.start(), old, new))
    return [(old, new) for _, old, new in sorted(found)]

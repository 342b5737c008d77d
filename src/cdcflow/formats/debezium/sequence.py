"""The source sequence of a Debezium event (``ChangeEvent.seq``), per connector.

Chosen from ``source.connector`` or, when that is missing or unknown, from the fields
``source`` carries:

=================  ====================================================================
connector          ``seq``
=================  ====================================================================
postgresql         ``(last_commit_lsn, lsn)``; ``last_commit_lsn`` is the first element
                   of ``source.sequence`` (0 when absent or null). Events arrive in
                   commit order; ``lsn`` alone is not monotonic across transactions.
mysql, mariadb     ``(binlog file number, pos, row)``; ``mysql-bin.000003`` -> 3.
oracle             ``(commit_scn, scn)``; a missing commit SCN (snapshot) is 0.
sqlserver, db2     ``(commit_lsn, change_lsn, event_serial_no)``; an LSN
                   ``00000027:00000758:0005`` is read as one hex number; null is 0.
mongodb            ``(source.ts_ms, ord)`` (oplog seconds and increment).
anything else      ``(ts_ms,)`` -- commit time only; ties keep Kafka order.
=================  ====================================================================
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from cdcflow.errors import Code, DecodeError
from cdcflow.formats.debezium.numbers import int_field

__all__ = ["SourceSequence", "hex_lsn"]

_BINLOG_NUMBER = re.compile(r"(\d+)$")


def hex_lsn(value: Any, name: str, exact: bool) -> int:
    """SQL Server / Db2 LSN text ``00000027:00000758:0005`` (fixed-width hex) -> int."""
    if value is None:
        return 0
    if value.__class__ is str:
        try:
            return int(value.replace(":", ""), 16) if value else 0
        except ValueError:
            raise DecodeError(
                f"field {name!r}: {value!r} is not a hexadecimal LSN like 00000027:00000758:0005",
                Code.BAD_FIELD,
            ) from None
    return int_field(value, name, exact)


def _last_commit_lsn(text: Any, exact: bool) -> int:
    """First element of PostgreSQL's ``source.sequence`` (``'["24023119","24023128"]'``)."""
    if text.__class__ is str:
        if text.startswith('["'):
            end = text.find('"', 2)
            try:
                return int(text[2:end])
            except ValueError:
                pass
        elif text.startswith("[null"):
            return 0
        try:
            items = orjson.loads(text)
        except orjson.JSONDecodeError:
            items = None
        if items.__class__ is list and items:
            first = items[0]
            return 0 if first is None else int_field(first, "source.sequence", exact)
    raise DecodeError(
        f'source.sequence {text!r} is not a JSON array text like \'["1","2"]\'',
        Code.BAD_FIELD,
    )


class SourceSequence:
    """The ``seq`` of a ``source`` block (see the module docstring). Holds a cache of
    MySQL binlog file numbers; call it as ``sequence(source, ts_ms, exact)``."""

    __slots__ = ("_files",)

    def __init__(self) -> None:
        self._files: dict[str, int] = {}

    def __call__(
        self, source: dict[str, Any], ts_ms: int | None, exact: bool
    ) -> tuple[int, ...] | None:
        connector = source.get("connector")
        rule = _RULES.get(connector) if connector.__class__ is str else None
        if rule is None:
            rule = _detect_rule(source)
        if rule is None:
            return None if ts_ms is None else (ts_ms,)
        return rule(self, source, exact)

    def known_binlog_number(self, name: Any) -> int | None:
        """The number of binlog file ``name`` when it was read before, else ``None``."""
        return self._files.get(name) if name.__class__ is str else None

    def binlog_number(self, name: Any) -> int:
        """``mysql-bin.000003`` -> 3; ``""`` or ``None`` (snapshot rows of some
        versions) -> 0.

        Raises:
            DecodeError: ``BAD_FIELD``, a name that does not end in a number.
        """
        fileno = self._files.get(name) if name.__class__ is str else None
        if fileno is None:
            if not name:
                fileno = 0
            else:
                m = _BINLOG_NUMBER.search(name) if name.__class__ is str else None
                if m is None:
                    raise DecodeError(
                        f"source.file {name!r} is not a binlog file name like mysql-bin.000003",
                        Code.BAD_FIELD,
                    )
                fileno = int(m.group(1))
            if name.__class__ is str:
                if len(self._files) >= 4096:
                    self._files.clear()
                self._files[name] = fileno
        return fileno

    def postgres(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        lsn = source.get("lsn")
        lsn = (
            0
            if lsn is None
            else (lsn if lsn.__class__ is int else int_field(lsn, "source.lsn", exact))
        )
        text = source.get("sequence")
        return (0 if text is None else _last_commit_lsn(text, exact), lsn)

    def mysql(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        pos = source.get("pos")
        row = source.get("row")
        return (
            self.binlog_number(source.get("file")),
            0 if pos is None else int_field(pos, "source.pos", exact),
            0 if row is None else int_field(row, "source.row", exact),
        )

    def oracle(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        commit = source.get("commit_scn")
        scn = source.get("scn")
        return (
            0 if commit is None else int_field(commit, "source.commit_scn", exact),
            0 if scn is None else int_field(scn, "source.scn", exact),
        )

    def sqlserver(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        serial = source.get("event_serial_no")
        return (
            hex_lsn(source.get("commit_lsn"), "source.commit_lsn", exact),
            hex_lsn(source.get("change_lsn"), "source.change_lsn", exact),
            0 if serial is None else int_field(serial, "source.event_serial_no", exact),
        )

    def mongodb(self, source: dict[str, Any], exact: bool) -> tuple[int, ...]:
        ts = source.get("ts_ms")
        ordinal = source.get("ord")
        return (
            0 if ts is None else int_field(ts, "source.ts_ms", exact),
            0 if ordinal is None else int_field(ordinal, "source.ord", exact),
        )


_Rule = Callable[[SourceSequence, dict[str, Any], bool], tuple[int, ...]]

_RULES: dict[str, _Rule] = {
    "postgresql": SourceSequence.postgres,
    "mysql": SourceSequence.mysql,
    "mariadb": SourceSequence.mysql,
    "oracle": SourceSequence.oracle,
    "sqlserver": SourceSequence.sqlserver,
    "db2": SourceSequence.sqlserver,
    "mongodb": SourceSequence.mongodb,
}


def _detect_rule(source: dict[str, Any]) -> _Rule | None:
    """The rule for a source block whose ``connector`` is missing or unknown."""
    if "lsn" in source:
        return SourceSequence.postgres
    if "scn" in source:
        return SourceSequence.oracle
    if "commit_lsn" in source or "change_lsn" in source:
        return SourceSequence.sqlserver
    if "file" in source and "pos" in source:
        return SourceSequence.mysql
    if "ord" in source:
        return SourceSequence.mongodb
    return None

"""Which target table each event goes to, and a micro-batch's events grouped per target.

A source table is named by ``(format, database, schema, table)``; :class:`Router` turns
that into the target's name (``inventory.public.customers``) or leaves it out, and
:func:`by_target` splits a batch's table events (row changes, truncates, DDL) into one
part per target, in target order. Heartbeats, transaction markers and messages go to no
table.

A source's routing (:class:`Routing`, its ``sources[]`` keys) decides, per source table
named ``database.schema.table`` (empty parts left out, as in the default template):

1. ``include`` / ``exclude``: regular expressions (RE2 syntax, see below) matched against
   the whole name (as
   Paimon's ``--including_tables`` / ``--excluding_tables`` and Flink CDC's ``tables``);
   a table no ``include`` matches, or one an ``exclude`` matches, is left out: its
   events are skipped on purpose (``TABLE_EXCLUDED``), never dead letters.
2. ``routes``: the first rule whose ``source_table`` regex matches the whole name gives
   the target, ``target_table`` expanded with the match's groups (``\\1``,
   ``\\g<name>``), as Flink CDC's ``route`` (``source-table`` -> ``sink-table``). Several
   source tables routed to one target are merged into it (sharded tables); the rule's
   ``shard_column`` names the column that records each row's source table, and a key
   two shards hold at once is refused (``SHARD_KEY_COLLISION``).
3. otherwise ``target_template``.
4. ``table_prefix`` / ``table_suffix`` around the target's last part (Paimon's
   ``--table_prefix`` / ``--table_suffix``).

The regular expressions run on RE2 (google-re2, :func:`compile_pattern`): matching takes
time linear in the name, whatever the pattern, so a pattern like ``(a+)+$`` cannot stall
the stream on a table name the source sends (Python's backtracking ``re`` can take
exponential time). RE2's syntax is Python's less backreferences (``\\1`` in a pattern) and
lookaround (``(?=``, ``(?!``, ``(?<=``), which are refused when the configuration loads;
``\\d``, ``\\w`` and ``\\s`` are ASCII (``\\pL`` matches any letter). Source:
https://github.com/google/re2/wiki/Syntax.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import re2
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from cdcflow.model import Op

__all__ = [
    "IMAGE_OPS",
    "ROUTED_OPS",
    "ROW_CHANGE_OPS",
    "TABLE_OPS",
    "Part",
    "Route",
    "RouteRule",
    "Router",
    "Routing",
    "by_target",
    "compile_pattern",
    "declared_types",
    "parts_by_target",
    "qualified_name",
    "source_names",
    "split_excluded",
    "declarations_on_every_row",
    "filter_declared",
    "source_ids",
]

#: ops that change a table: row changes and truncates
TABLE_OPS = pa.array(
    [Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value, Op.SNAPSHOT.value, Op.TRUNCATE.value]
)
#: ops that carry an after image
IMAGE_OPS = pa.array([Op.INSERT.value, Op.UPDATE.value, Op.SNAPSHOT.value])
#: ops that change one row
ROW_CHANGE_OPS = pa.array([*IMAGE_OPS.to_pylist(), Op.DELETE.value])
#: what a target table's part of a batch holds: its row changes, truncates and DDL
ROUTED_OPS = pa.array([*TABLE_OPS.to_pylist(), Op.DDL.value])

_SEP = "\x1f"


def qualified_name(database: str | None, schema: str | None, table: str | None) -> str:
    """``database.schema.table`` with the empty parts (and their dots) left out."""
    return ".".join(p for p in (database, schema, table) if p)


def source_names(rows: pa.Table) -> list[str]:
    """Each row's source table as :func:`qualified_name` gives it (``database.schema.table``)."""
    return [
        qualified_name(d, s, t)
        for d, s, t in zip(
            rows["database"].to_pylist(),
            rows["schema"].to_pylist(),
            rows["table"].to_pylist(),
            strict=True,
        )
    ]


def declared_types(rows: pa.Table) -> dict[str, str]:
    """Column -> logical type, as the rows' ``columns`` declarations state them (a later
    declaration's type wins)."""
    types: dict[str, str] = {}
    for text in pc.unique(rows["columns"]).drop_null().to_pylist():
        types.update(orjson.loads(text))
    return types


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error is raised, with the pattern, not logged


def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (google-re2: linear-time matching; ``fullmatch``,
    ``groups``, ``groupindex`` and ``Match.expand`` as Python's ``re``).

    Raises:
        ValueError: one line: not a regular expression RE2 accepts (a syntax error, a
            backreference, lookaround), with RE2's reason.
    """
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise ValueError(
            f"{pattern!r} is not a valid regular expression (RE2 syntax: no backreferences "
            f"or lookaround): {reason}"
        ) from None


def _compiled(pattern: str, key: str) -> Any:
    try:
        return compile_pattern(pattern)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


#: a group reference in ``target_table``: ``\1`` or ``\g<1>`` / ``\g<name>``
_GROUP_REF = re.compile(r"\\(?:(\d+)|g<(\w+)>)")


class RouteRule(BaseModel):
    """One ``routes:`` rule (Flink CDC's ``route``).

    Attributes:
        source_table: a regular expression matched against the whole source name
            ``database.schema.table``.
        target_table: the target's name; ``\\1`` or ``\\g<name>`` insert the match's groups.
        shard_column: when set, a column of this name records each row's source table
            (``database.schema.table``), and a key held by two source tables at once is a
            ``SHARD_KEY_COLLISION`` dead letter; unset, the last change of a key wins.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source_table: str
    target_table: str
    shard_column: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> RouteRule:
        pattern = _compiled(self.source_table, "source_table")
        for number, name in _GROUP_REF.findall(self.target_table):
            if number and int(number) > pattern.groups:
                raise ValueError(
                    f"target_table {self.target_table!r} refers to group {number}, but "
                    f"source_table {self.source_table!r} has {pattern.groups} group(s)"
                )
            if name and not name.isdigit() and name not in pattern.groupindex:
                raise ValueError(
                    f"target_table {self.target_table!r} refers to group {name!r}, which "
                    f"source_table {self.source_table!r} does not name"
                )
        if not self.target_table.strip("."):
            raise ValueError("target_table: name the target table, e.g. 'shop.public.orders'")
        if self.shard_column is not None and not self.shard_column:
            raise ValueError("shard_column: name a column, or leave the key out")
        return self


class Routing(BaseModel):
    """One source's table selection and routing (the ``sources[]`` keys of the same
    names; see the module docstring for the order they apply in)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    routes: tuple[RouteRule, ...] = ()
    table_prefix: str = ""
    table_suffix: str = ""

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, v: tuple[str, ...], info: Any) -> tuple[str, ...]:
        for i, pattern in enumerate(v):
            _compiled(pattern, f"{info.field_name}[{i}]")
        return v

    @property
    def selects(self) -> bool:
        """Whether anything but the template decides (the default routes every table)."""
        return bool(
            self.include or self.exclude or self.routes or self.table_prefix or self.table_suffix
        )


@dataclass(frozen=True, slots=True)
class Route:
    """Where one source table's events go.

    Attributes:
        target: the target table's name.
        shard_column: the column naming the source table in a sharded target (``None``:
            not sharded, or the route names none).
        source: the source table's ``database.schema.table``.
    """

    target: str
    shard_column: str | None
    source: str


class Router:
    """Source table -> target table name, or nothing (left out).

    Args:
        template: ``str.format`` template over ``database``, ``schema``, ``table``,
            ``format``; empty parts and the dots around them are dropped. Default
            ``"{database}.{schema}.{table}"`` (``inventory.public.customers``; MySQL
            sources without a schema give ``inventory.customers``).
        routing: the source's selection and routing rules (:class:`Routing`; default:
            every table, by the template).
    """

    def __init__(
        self, template: str = "{database}.{schema}.{table}", routing: Routing | None = None
    ) -> None:
        self.template = template
        self.routing = routing or Routing()
        r = self.routing
        self._include = [compile_pattern(p) for p in r.include]
        self._exclude = [compile_pattern(p) for p in r.exclude]
        self._routes = [(compile_pattern(rule.source_table), rule) for rule in r.routes]
        self._cache: dict[tuple[str, str, str, str], Route | None] = {}
        self._shard_columns: dict[str, str] = {}  # target -> the shard column routed to it

    @property
    def selects(self) -> bool:
        """Whether some table may be left out or renamed beyond the template."""
        return self.routing.selects

    def route(self, fmt: str, database: str, schema: str, table: str) -> Route | None:
        """The route of one source table; ``None`` when it is left out."""
        combo = (fmt or "", database or "", schema or "", table or "")
        if combo not in self._cache:
            route = self._cache[combo] = self._route(*combo)
            if route is not None and route.shard_column:
                self._shard_columns.setdefault(route.target, route.shard_column)
        return self._cache[combo]

    def _route(self, fmt: str, database: str, schema: str, table: str) -> Route | None:
        name = qualified_name(database, schema, table)
        if self._include and not any(p.fullmatch(name) for p in self._include):
            return None
        if any(p.fullmatch(name) for p in self._exclude):
            return None
        shard_column = None
        for pattern, rule in self._routes:
            m = pattern.fullmatch(name)
            if m is not None:
                target = m.expand(rule.target_table)
                shard_column = rule.shard_column
                break
        else:
            target = self.template.format(format=fmt, database=database, schema=schema, table=table)
        parts = [p for p in target.split(".") if p]
        r = self.routing
        if parts and (r.table_prefix or r.table_suffix):
            parts[-1] = f"{r.table_prefix}{parts[-1]}{r.table_suffix}"
        return Route(".".join(parts), shard_column, name)

    def shard_column(self, target: str) -> str | None:
        """The shard column of a target some routed source table was sent to with one."""
        return self._shard_columns.get(target)

    def target(self, fmt: str, database: str, schema: str, table: str) -> str | None:
        """The target table's name (``None``: the table is left out)."""
        route = self.route(fmt, database, schema, table)
        return None if route is None else route.target


def source_ids(rows: pa.Table) -> pa.ChunkedArray:
    """One string per row naming its source table (format, database, schema, table)."""
    return pc.binary_join_element_wise(
        rows["format"], rows["database"], rows["schema"], rows["table"], _SEP
    )


def _is_table_row(rows: pa.Table) -> pa.ChunkedArray:
    """Per row: a row change, truncate or DDL with a table name."""
    return pc.and_(
        pc.is_in(rows["op"], ROUTED_OPS),
        pc.invert(pc.equal(pc.fill_null(rows["table"], ""), "")),
    )


def split_excluded(rows: pa.Table, router: Router) -> tuple[pa.Table, pa.Table]:
    """``(kept, excluded)``: ``rows`` without the events of tables the router leaves
    out, and those events (both keep the rows' order)."""
    if not router.selects or rows.num_rows == 0:
        return rows, rows.slice(0, 0)
    source = source_ids(rows)
    out = [
        combo
        for combo in pc.unique(source).drop_null().to_pylist()
        if combo.split(_SEP)[3] and router.route(*combo.split(_SEP)) is None
    ]
    if not out:
        return rows, rows.slice(0, 0)
    is_out = pc.fill_null(pc.is_in(source, pa.array(out, pa.string())), False)
    return rows.filter(pc.invert(is_out)), rows.filter(is_out)


@dataclass(frozen=True, slots=True)
class Part:
    """One target table's part of a batch.

    Attributes:
        target: the target table's name.
        rows: its events, in the batch's order.
        positions: for each of ``rows``, its row number in the batch (int64, ascending).
    """

    target: str
    rows: pa.Table
    positions: np.ndarray


def parts_by_target(rows: pa.Table, router: Router) -> list[Part]:
    """One :class:`Part` per target table, in target order, for the row changes,
    truncates and DDL of ``rows`` (events without a table name, and those of tables the
    router leaves out, go nowhere). The batch is grouped once: each source table is
    routed once, and one stable sort by target keeps each part in the batch's order."""
    if rows.num_rows == 0:
        return []
    is_table = _is_table_row(rows)
    if pc.all(is_table).as_py():
        table_rows, numbers = rows, np.arange(rows.num_rows, dtype=np.int64)
    else:
        table_rows = rows.filter(is_table)
        numbers = np.flatnonzero(is_table.to_numpy(zero_copy_only=False)).astype(np.int64)
    if table_rows.num_rows == 0:
        return []
    source = source_ids(table_rows)
    combos = pc.unique(source)
    routed = [router.target(*combo.split(_SEP)) for combo in combos.to_pylist()]
    names = sorted({t for t in routed if t is not None})
    if not names:
        return []
    rank = {name: i for i, name in enumerate(names)}
    if len(names) == 1 and None not in routed:
        return [Part(names[0], table_rows, numbers)]
    of_combo = np.array([-1 if t is None else rank[t] for t in routed], dtype=np.int64)
    group = of_combo[pc.index_in(source, combos).to_numpy(zero_copy_only=False)]
    order = np.argsort(group, kind="stable")  # left out (-1) first, then target by target
    counts = np.bincount(group[group >= 0], minlength=len(names))
    start = int(np.count_nonzero(group < 0))
    order = order[start:]
    grouped = table_rows.take(pa.array(order))
    parts, at = [], 0
    for name, count in zip(names, counts.tolist(), strict=True):
        parts.append(Part(name, grouped.slice(at, count), numbers[order[at : at + count]]))
        at += count
    return parts


def by_target(rows: pa.Table, router: Router) -> Iterator[tuple[str, pa.Table]]:
    """``(target, rows)`` per target table, in target order (:func:`parts_by_target`
    without the row numbers)."""
    for part in parts_by_target(rows, router):
        yield part.target, part.rows


def filter_declared(rows: pa.Table, keep: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``rows.filter(keep)`` with each kept row still under the ``columns`` declaration
    it was under: a batch states a declaration once, on the first row of its source table
    (:func:`cdcflow.decode.batches.flatten`), so when that row leaves (filtered, refused)
    its declaration moves to the source table's next kept row, unless that row declares
    one of its own. Without it a part could reach the apply declaring no columns, and a
    new table be made without them.

    Args:
        rows: EVENT_SCHEMA rows, in order.
        keep: one bool per row (NULL: dropped, as ``Table.filter`` drops it).

    Returns:
        The kept rows, in order; ``columns`` as given on the rows that declared, a moved
        declaration on the rows that now carry it, NULL elsewhere.
    """
    keep = pc.fill_null(keep, False)
    columns = rows["columns"].combine_chunks()
    declares = columns.is_valid()
    if rows.num_rows == 0 or not pc.any(pc.and_(pc.invert(keep), declares)).as_py():
        return rows.filter(keep)  # no declaration leaves: the common case
    n = rows.num_rows
    ids = source_ids(rows).combine_chunks().dictionary_encode()
    codes = pc.fill_null(ids.indices, -1).to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")  # by source table, each in batch order
    group = codes[order]
    valid = declares.to_numpy(zero_copy_only=False)[order]
    at = np.arange(n)
    starts = np.maximum.accumulate(np.where(np.r_[True, group[1:] != group[:-1]], at, 0))
    last = np.maximum.accumulate(np.where(valid, at, -1))
    # per row (in source order): the row whose declaration it is under, -1 for none
    under = np.where(last >= starts, order[np.maximum(last, 0)], -1)
    kept = np.flatnonzero(keep.to_numpy(zero_copy_only=False)[order])
    k_group, k_under = group[kept], under[kept]
    # a kept row whose declaration differs from the previous kept row's of its source
    # (or that is its source's first kept row) and does not declare: it takes it over
    changed = np.r_[True, (k_group[1:] != k_group[:-1]) | (k_under[1:] != k_under[:-1])]
    moves = kept[changed & ~valid[kept] & (k_under >= 0)]
    source = at.copy()
    source[order[moves]] = under[moves]
    moved = columns.take(pa.array(source))
    at_columns = rows.schema.get_field_index("columns")
    return rows.set_column(at_columns, rows.schema.field(at_columns), moved).filter(keep)


def declarations_on_every_row(rows: pa.Table) -> pa.Table:
    """``columns`` filled forward per source table (a batch states each declaration once).

    Needed when events are applied in a later batch than the event that declared them.
    """
    columns = rows["columns"].combine_chunks()
    if columns.null_count == 0 or rows.num_rows == 0:
        return rows
    source = source_ids(rows).combine_chunks()
    filled = columns.to_pylist()
    last: dict[str, str] = {}
    for i, (src, cols) in enumerate(zip(source.to_pylist(), filled, strict=True)):
        if cols is not None:
            last[src] = cols
        elif src in last:
            filled[i] = last[src]
    return rows.set_column(
        rows.schema.get_field_index("columns"), "columns", pa.array(filled, pa.string())
    )

"""A workload generator that keeps an in-memory source database.

It emits random inserts, updates and deletes (optionally truncates, primary-key changes
and columns added mid-stream) as :class:`~cdcflow.formats.base.SourceChange`, applies
each to its own copy of the tables, and so knows every table's true final state: the
oracle the demo, the end-to-end tests and ``tests/oracle`` compare the Delta mirrors
with. Each format's encoder turns the changes into the Kafka messages its replication
tool would publish; :func:`capabilities` says which kinds of change it can publish.

Tables without a primary key are not generated (every :class:`TableSpec` has key columns).
"""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import random
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from cdcflow.model import Op, SourceTable
from cdcflow.types import parse_type
from cdcflow_testkit.encoders.base import Encoder, SourceChange

__all__ = [
    "ALL_TYPES_TABLES",
    "Capabilities",
    "DEMO_TABLES",
    "FIXED_START_TS_MS",
    "MAX_TS_STEP_MS",
    "TableSpec",
    "Workload",
    "capabilities",
    "compare_with_mirror",
    "mirror_by_key",
    "start_ts_ms_before",
    "tables_for",
]


@dataclass(frozen=True)
class TableSpec:
    """A source table: name, columns (logical types, in order) and key columns."""

    name: str
    columns: Mapping[str, str]
    key_columns: tuple[str, ...]


DEMO_TABLES = (
    TableSpec(
        "customers",
        {
            "id": "int64",
            "name": "string",
            "email": "string",
            "balance": "decimal(12,2)",
            "active": "boolean",
            "born": "date",
            "created_at": "timestamptz",
            "avatar": "binary",
        },
        ("id",),
    ),
    TableSpec(
        "orders",
        {
            "order_id": "int64",
            "customer_id": "int64",
            "amount": "float64",
            "status": "string",
            "placed_at": "timestamptz",
        },
        ("order_id",),
    ),
    TableSpec(
        "order_lines",
        {
            "order_id": "int64",
            "line_no": "int64",
            "sku": "string",
            "qty": "int64",
            "unit_price": "decimal(10,2)",
        },
        ("order_id", "line_no"),
    ),
)

#: The demo tables plus one with the logical types they lack (``int32``, ``float32``,
#: ``json``, ``time``, ``timestamp``), keyed by an ``int32``/``int64`` pair.
ALL_TYPES_TABLES = (
    *DEMO_TABLES,
    TableSpec(
        "readings",
        {
            "site_id": "int32",
            "reading_no": "int64",
            "level": "int32",
            "temperature": "float32",
            "attributes": "json",
            "taken_at": "timestamp",
            "taken_time": "time",
            "price": "decimal(38,10)",
        },
        ("site_id", "reading_no"),
    ),
)


def _base(t: str) -> str:
    return parse_type(t)[0]


def tables_for(
    exact_types: Iterable[str], tables: Sequence[TableSpec] = DEMO_TABLES
) -> list[TableSpec]:
    """The tables restricted to columns a format carries exactly (keys always kept)."""
    exact = set(exact_types)
    out = []
    for t in tables:
        cols = {
            c: ty
            for c, ty in t.columns.items()
            if c in t.key_columns or ty in exact or _base(ty) in exact
        }
        out.append(TableSpec(t.name, cols, t.key_columns))
    return out


_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "ünïcødé",
    "naïve café",
    "",
    "O'Brien",
]


class _KeyOrder:
    """The live keys of one table in insertion order, as a sequence ``random.choice`` can
    index in O(log n): what ``list(rows)`` gave in O(n) per change, which made a
    one-table workload of 1M changes quadratic. A Fenwick tree counts the live slots of
    an append-only key list; a removed key's slot stays, dead."""

    def __init__(self, keys: Iterable[tuple] = ()) -> None:
        self._keys: list[tuple | None] = []
        self._slot: dict[tuple, int] = {}
        self._tree = [0]
        for key in keys:
            self.append(key)

    def __len__(self) -> int:
        return len(self._slot)

    def append(self, key: tuple) -> None:
        i = len(self._keys)
        if i + 1 >= len(self._tree):  # full: rebuild at double the size
            self._tree = [0] * (2 * len(self._tree) + 1)
            for j, k in enumerate(self._keys):
                if k is not None:
                    self._add(j, 1)
        self._keys.append(key)
        self._slot[key] = i
        self._add(i, 1)

    def remove(self, key: tuple) -> None:
        i = self._slot.pop(key)
        self._keys[i] = None
        self._add(i, -1)

    def clear(self) -> None:
        self.__init__()

    def _add(self, i: int, delta: int) -> None:
        i += 1
        tree = self._tree
        while i < len(tree):
            tree[i] += delta
            i += i & -i

    def __getitem__(self, k: int) -> tuple:
        """The ``k``-th live key (0-based), in insertion order."""
        if not 0 <= k < len(self._slot):
            raise IndexError(k)
        tree, pos, step = self._tree, 0, 1 << (len(self._tree) - 1).bit_length()
        while step:  # the last position whose prefix count is <= k
            nxt = pos + step
            if nxt < len(tree) and tree[nxt] <= k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        key = self._keys[pos]
        assert key is not None
        return key


#: the source time before a :class:`Workload`'s first change by default (2023-11-14): fixed,
#: so that the changes of a seed are the same on every run
FIXED_START_TS_MS = 1_700_000_000_000

#: the most a change's source time is after the previous change's (ms)
MAX_TS_STEP_MS = 50


def start_ts_ms_before(now_ms: int, changes: int) -> int:
    """A :class:`Workload` ``start_ts_ms`` whose ``changes`` changes all have source
    times at or before ``now_ms`` (ms since the epoch): the changes happened just now,
    so a pipeline that applies them shows a lag of seconds, not of years."""
    return now_ms - MAX_TS_STEP_MS * changes


@dataclass
class Workload:
    """Random changes over in-memory tables, with the resulting final state.

    Args:
        tables: the tables to change (each with key columns).
        database, schema: source identity of every table.
        seed: random seed; the same seed gives the same changes.
        start_seq: first source sequence number.
        first_keys: table name -> its first key (default 1): shards of one table given
            disjoint key ranges, as a sharded application's tables have.
        start_ts_ms: source time (ms since the epoch) before the first change; each
            change is 1 to :data:`MAX_TS_STEP_MS` ms after the previous one. The default
            is a fixed instant (the same seed gives the same changes); the demo passes a
            time just before now (:func:`start_ts_ms_before`).

    Attributes:
        state: table name -> key tuple -> current row (column -> typed value).
        added_columns: ``(seq, table, column, logical type)`` of every column added by
            :meth:`changes`; the first change with that column has sequence ``seq + 1``.
    """

    tables: Sequence[TableSpec]
    database: str = "shop"
    schema: str = "public"
    seed: int = 7
    start_seq: int = 1_000
    first_keys: Mapping[str, int] = field(default_factory=dict)
    start_ts_ms: int = FIXED_START_TS_MS
    state: dict[str, dict[tuple, dict[str, Any]]] = field(default_factory=dict)
    added_columns: list[tuple[int, str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._seq = self.start_seq
        self._ts_ms = self.start_ts_ms
        self._next_id: dict[str, int] = {}
        self._columns: dict[str, dict[str, str]] = {}
        self._order: dict[str, _KeyOrder] = {}
        for t in self.tables:
            self.state.setdefault(t.name, {})
            self._order[t.name] = _KeyOrder(self.state[t.name])
            self._next_id[t.name] = self.first_keys.get(t.name, 1)
            self._columns[t.name] = dict(t.columns)

    def columns(self, table: str) -> dict[str, str]:
        """The table's current columns (column -> logical type), added ones last."""
        return dict(self._columns[table])

    def source_table(self, spec: TableSpec) -> SourceTable:
        return SourceTable(format="", database=self.database, schema=self.schema, table=spec.name)

    # ------------------------------------------------------------------ values

    def _value(self, column: str, logical: str, key_value: int | None = None) -> Any:
        rng = self._rng
        base, p, s = parse_type(logical)
        if key_value is not None:
            return key_value
        if rng.random() < 0.08 and base != "boolean":
            return None
        if base in ("int32", "int64"):
            return (
                rng.randint(-(2**31), 2**31 - 1)
                if base == "int32"
                else rng.randint(-(2**40), 2**40)
            )
        if base == "float32":  # a value float32 holds exactly
            return struct.unpack("f", struct.pack("f", rng.uniform(-1e6, 1e6)))[0]
        if base == "float64":
            return round(rng.uniform(-1e6, 1e6), 3)
        if base == "decimal":
            assert p is not None and s is not None
            digits = rng.randint(0, 10 ** min(p, 15) - 1)
            return decimal.Decimal(digits * (1 if rng.random() < 0.8 else -1)).scaleb(-s)
        if base == "boolean":
            return rng.random() < 0.5
        if base == "date":
            return dt.date(1950, 1, 1) + dt.timedelta(days=rng.randint(0, 30_000))
        if base == "timestamptz":
            return dt.datetime(2020, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
                milliseconds=rng.randint(0, 10**11)
            )
        if base == "timestamp":
            return dt.datetime(2020, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 10**14))
        if base == "binary":
            return bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 12)))
        if base == "time":
            return (
                dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 86_399_999_999))
            ).time()
        if base == "json":  # compact JSON text, as databases return it
            return orjson.dumps({"tag": rng.choice(_WORDS), "n": rng.randint(-99, 99)}).decode()
        return f"{rng.choice(_WORDS)} {rng.randint(0, 9999)}"

    def _row(self, spec: TableSpec, key: tuple) -> dict[str, Any]:
        row = {}
        for c, t in self._columns[spec.name].items():
            if c in spec.key_columns:
                row[c] = key[spec.key_columns.index(c)]
            else:
                row[c] = self._value(c, t)
        return row

    def _new_key(self, spec: TableSpec) -> tuple:
        n = self._next_id[spec.name]
        self._next_id[spec.name] = n + 1
        if len(spec.key_columns) == 1:
            return (n,)
        return tuple([n // 4 + 1, n % 4 + 1][: len(spec.key_columns)]) + tuple(
            n for _ in spec.key_columns[2:]
        )

    # ------------------------------------------------------------------ changes

    def _emit(self, op: Op, spec: TableSpec, before, after) -> SourceChange:
        self._seq += 1
        self._ts_ms += self._rng.randint(1, MAX_TS_STEP_MS)
        return SourceChange(
            op=op,
            table=self.source_table(spec),
            columns=dict(self._columns[spec.name]),
            key_columns=spec.key_columns,
            before=before,
            after=after,
            seq=self._seq,
            ts_ms=self._ts_ms,
            txn_id=str(self._seq // 5),
        )

    def _add_column(self, spec: TableSpec) -> None:
        """Add a nullable column (ALTER TABLE ... ADD COLUMN): stored rows hold NULL there.

        Its type is one the table already has, so every format that carries the table
        carries the new column too.
        """
        columns = self._columns[spec.name]
        kinds = [t for c, t in columns.items() if c not in spec.key_columns] or list(
            columns.values()
        )
        name = f"added_{len(self.added_columns) + 1}"
        logical = self._rng.choice(kinds)
        columns[name] = logical
        rows = self.state[spec.name]
        for key, row in rows.items():  # new dicts: emitted images must not change
            rows[key] = {**row, name: None}
        self.added_columns.append((self._seq, spec.name, name, logical))

    def changes(
        self,
        n: int,
        p_insert: float = 0.5,
        p_update: float = 0.35,
        truncate_every: int = 0,
        p_key_change: float = 0.0,
        p_add_column: float = 0.0,
    ) -> Iterator[SourceChange]:
        """``n`` random changes: inserts, updates, deletes, and optionally more.

        Args:
            n: number of changes yielded.
            p_insert, p_update: probabilities of an insert and of an update; the rest
                are deletes (a table without rows always gets an insert).
            truncate_every: a truncate of a random table every ``truncate_every``
                changes (0: never).
            p_key_change: probability that an update moves its row to a new primary key
                (the after image's key differs from the before image's; half of them
                change other columns too).
            p_add_column: probability, before each change, that its table first gains a
                column (see :attr:`added_columns`); that change and all later ones of
                the table carry it in ``columns`` and in their images.

        The in-memory state is updated as each change is yielded. With the defaults of
        the last two arguments the changes are those of earlier versions for a seed.
        """
        rng = self._rng
        for i in range(n):
            spec = rng.choice(self.tables)
            rows = self.state[spec.name]
            order = self._order[spec.name]
            if truncate_every and i and i % truncate_every == 0:
                rows.clear()
                order.clear()
                yield self._emit(Op.TRUNCATE, spec, None, None)
                continue
            if p_add_column and rng.random() < p_add_column:
                self._add_column(spec)
            r = rng.random()
            if not rows or r < p_insert:
                key = self._new_key(spec)
                while key in rows:
                    key = self._new_key(spec)
                after = self._row(spec, key)
                rows[key] = after
                order.append(key)
                yield self._emit(Op.INSERT, spec, None, after)
            elif r < p_insert + p_update:
                key = rng.choice(order)
                before = rows[key]
                if p_key_change and rng.random() < p_key_change:
                    new_key = self._new_key(spec)
                    while new_key in rows:
                        new_key = self._new_key(spec)
                    if rng.random() < 0.5:
                        after = self._row(spec, new_key)
                    else:  # UPDATE ... SET <key> = ...: only the key columns change
                        after = {**before, **dict(zip(spec.key_columns, new_key, strict=True))}
                    del rows[key]
                    order.remove(key)
                    order.append(new_key)
                    key = new_key
                else:
                    after = self._row(spec, key)
                rows[key] = after
                yield self._emit(Op.UPDATE, spec, before, after)
            else:
                key = rng.choice(order)
                order.remove(key)
                before = rows.pop(key)
                yield self._emit(Op.DELETE, spec, before, None)

    def expected_rows(self, table: str) -> list[dict[str, Any]]:
        """The source table's current rows, sorted by key."""
        return [self.state[table][k] for k in sorted(self.state[table])]


@dataclass(frozen=True)
class Capabilities:
    """Which kinds of change an encoder publishes (see :func:`capabilities`).

    Attributes:
        truncate: ``TRUNCATE TABLE`` reaches Kafka (AWS DMS, Maxwell and Qlik Replicate
            publish nothing for it).
        key_change: an update whose after image has another primary key than its
            before image.
        add_column: a change whose ``columns`` has a column earlier changes of the
            table did not have.
    """

    truncate: bool
    key_change: bool
    add_column: bool


def capabilities(encoder: Encoder) -> Capabilities:
    """What ``encoder`` can publish, found by encoding one sample change of each kind.

    A kind is supported when encoding it gives at least one message; an encoder that
    returns nothing (the tool publishes nothing) or raises ``ValueError`` (it has no
    message for it) does not support it. The probes run on a copy, so the encoder's own
    state (Qlik metadata, DMS table starts) is untouched.
    """
    probe = copy.deepcopy(encoder)
    table = SourceTable(format="", database="probe", schema="public", table="probe")
    cols = {"id": "int64", "name": "string"}
    row1, row2 = {"id": 1, "name": "a"}, {"id": 2, "name": "b"}

    def publishes(op: Op, columns: Mapping[str, str], before, after) -> bool:
        change = SourceChange(op, table, columns, ("id",), before, after, seq=2, ts_ms=2)
        try:
            return bool(probe.encode(change))
        except ValueError:
            return False

    first = SourceChange(Op.INSERT, table, cols, ("id",), None, row1, seq=1, ts_ms=1)
    probe.encode(first)
    return Capabilities(
        truncate=publishes(Op.TRUNCATE, cols, None, None),
        key_change=publishes(Op.UPDATE, cols, row1, row2),
        add_column=publishes(Op.INSERT, {**cols, "more": "int64"}, None, {**row2, "more": 3}),
    )


def _normalize(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    if isinstance(value, dt.time):  # Delta has no time type: stored as ISO-8601 text
        return value.isoformat()
    return value


def _same(expected: Any, got: Any) -> bool:
    """Equal and of the same Python type: ``1``, ``1.0`` and ``True`` are three values."""
    return type(expected) is type(got) and expected == got


def compare_with_mirror(
    expected: Sequence[Mapping[str, Any]], mirror: pa.Table, key_columns: Sequence[str]
) -> list[str]:
    """Differences between the source rows and a Delta mirror (``[]`` when equal).

    Checks the row count and that no key stands twice (a merge that inserts a second row
    for a key is a difference, not a row that overwrites the first), the column set (a
    mirror column the source never had is a difference), and every value by equality and
    Python type (``1 == 1.0 == True`` is not equal here). ``_cdc_*`` bookkeeping columns
    are ignored; values compare after normalizing aware datetimes to UTC and times to
    ISO-8601 text (their stored form). A column the mirror lacks compares as NULL (a
    column added at the source that no change carried yet).

    Args:
        expected: the source's rows, column -> typed value.
        mirror: the Delta table read back.
        key_columns: the primary key.

    Returns:
        One line per difference, sorted by kind then key.
    """
    problems = []
    columns = [c for c in mirror.column_names if not c.startswith("_cdc_")]
    source_columns = {c for r in expected for c in r}
    extra = [c for c in columns if c not in source_columns]
    if extra and expected:
        problems.append(f"columns the source does not have: {extra}")
    if mirror.num_rows != len(expected):
        problems.append(f"{mirror.num_rows} rows, expected {len(expected)}")
    got: dict[tuple, dict[str, Any]] = {}
    seen: dict[tuple, int] = {}
    for row in mirror.select(columns).to_pylist():
        row = {k: _normalize(v) for k, v in row.items()}
        key = tuple(row[k] for k in key_columns)
        seen[key] = seen.get(key, 0) + 1
        got[key] = row
    problems += [f"key {k} stands {n} times" for k, n in sorted(seen.items()) if n > 1]
    want = {
        tuple(r[k] for k in key_columns): {k: _normalize(v) for k, v in r.items()} for r in expected
    }
    for k in sorted(set(want) - set(got)):
        problems.append(f"missing row {k}")
    for k in sorted(set(got) - set(want)):
        problems.append(f"unexpected row {k}")
    for k in sorted(set(want) & set(got)):
        w, g = want[k], got[k]
        for c, v in w.items():
            if not _same(v, g.get(c)):
                problems.append(f"row {k} column {c!r}: expected {v!r}, got {g.get(c)!r}")
    return problems


def mirror_by_key(
    mirror: pa.Table | Sequence[Mapping[str, Any]],
    key_columns: Sequence[str] = ("id",),
    column: str | None = None,
) -> dict[Any, Any]:
    """A mirror's rows by key, for a test to compare whole: ``{key: row}`` (the row
    without its ``_cdc_*`` bookkeeping columns) or, with ``column``, ``{key: value}``.
    The key is the one key column's value, or a tuple of them.

    Unlike a dict built from the rows, which keeps one row of a key stored twice, a
    repeated key fails.

    Args:
        mirror: the Delta table read back (or its rows).
        key_columns: the primary key.
        column: the one column to keep.

    Raises:
        AssertionError: a key stands more than once (each such key named).
    """
    rows = mirror.to_pylist() if isinstance(mirror, pa.Table) else list(mirror)
    out: dict[Any, Any] = {}
    repeated: dict[Any, int] = {}
    for row in rows:
        key = tuple(row[k] for k in key_columns)
        key = key[0] if len(key_columns) == 1 else key
        if key in out:
            repeated[key] = repeated.get(key, 1) + 1
        if column is not None:
            out[key] = row[column]
        else:
            out[key] = {k: v for k, v in row.items() if not k.startswith("_cdc_")}
    if repeated:
        raise AssertionError(
            "keys stored more than once: "
            + ", ".join(f"{k!r} {n} times" for k, n in sorted(repeated.items(), key=repr))
        )
    return out

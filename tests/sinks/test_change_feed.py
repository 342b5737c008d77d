"""The change data feed of ``change_feed: true`` tables (docs/decisions.md 58): real Delta
tables fed a source history through the :class:`~cdcflow.apply.batch.BatchApplier`, read
back with delta-rs's ``load_cdf`` and Spark's ``readChangeFeed``, and held, commit by
commit, against what a model of the *source* says changed -- never against what the code
under test wrote.

The history (:data:`HISTORY`) has inserts, full and partial-image updates, deletes, a
primary-key move, producer duplicates (a change delivered again, which changes nothing),
new keys alone (the Arrow append), a delete of a key never stored, a truncate with an
insert after it, and a column added; it goes to a hard-deleting mirror, a soft-deleting
one and a history (SCD type 2) table at once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from tests.apply.helpers import COLUMNS, ev, table_of

from cdcflow.apply.batch import BatchApplier
from cdcflow.apply.options import TableRules
from cdcflow.model import ChangeEvent, Op, SourceTable, seq_key
from cdcflow.sinks.maintenance import MaintenancePolicy
from cdcflow.sinks.warehouse import DeltaWarehouse

ITEMS, SOFT, HIST = "db.items", "db.soft", "db.hist"
RULES = [
    (ITEMS, {"change_feed": True}),
    (SOFT, {"change_feed": True, "soft_delete": True}),
    (HIST, {"change_feed": True, "mode": "history"}),
]
WITH_PRICE = {**COLUMNS, "price": "int64"}
DATA = ("id", "name", "qty", "price")


@dataclass(frozen=True)
class Change:
    """One source change: ``op`` insert/update/delete/truncate; ``old_key`` for a key
    move; ``again``: a producer duplicate of an earlier change (same sequence and image),
    which the source did not make a second time."""

    op: str
    key: int | None = None
    after: Mapping[str, Any] | None = None
    seq: int = 0
    old_key: int | None = None
    again: bool = False
    columns: Mapping[str, str] = field(default_factory=lambda: COLUMNS)


def _row(k: int, name: str, qty: int, **more: Any) -> dict[str, Any]:
    return {"id": k, "name": name, "qty": qty, **more}


#: one list of source changes per micro-batch (sequences in steps of 10 leave room for
#: a late change)
HISTORY: list[list[Change]] = [
    [
        Change("insert", 1, _row(1, "a", 1), 10),
        Change("insert", 2, _row(2, "b", 2), 20),
        Change("insert", 3, _row(3, "c", 3), 30),
    ],
    [
        Change("update", 1, _row(1, "a2", 10), 40),
        Change("update", 2, {"id": 2, "qty": 20}, 50),  # partial image: name kept
        Change("delete", 3, seq=60),
        Change("insert", 4, _row(4, "d", 4), 70),
    ],
    [
        Change("update", 5, _row(5, "d", 4), 80, old_key=4),  # key 4 moves to 5
        Change("update", 1, _row(1, "a2", 10), 40, again=True),
        Change("insert", 2, _row(2, "b", 2), 20, again=True),
    ],
    [  # keys no stored file holds: the Arrow append
        Change("insert", 6, _row(6, "f", 6), 90),
        Change("insert", 7, _row(7, "g", 7), 100),
        Change("delete", 40, seq=110),  # never stored
    ],
    [Change("truncate", seq=120), Change("insert", 8, _row(8, "h", 8), 130)],
    [  # a column added
        Change("update", 8, _row(8, "h", 8, price=99), 140, columns=WITH_PRICE),
        Change("insert", 9, _row(9, "i", 9, price=5), 150, columns=WITH_PRICE),
    ],
    [  # a delete of a key never stored beside an insert, in delta-rs's MERGE
        Change("delete", 8, seq=160),
        Change("delete", 42, seq=170),
        Change("insert", 10, _row(10, "j", 10, price=1), 180, columns=WITH_PRICE),
    ],
    [  # duplicates alone: nothing changes
        Change("insert", 9, _row(9, "i", 9, price=5), 150, again=True, columns=WITH_PRICE),
        Change("delete", 8, seq=160, again=True),
    ],
    [  # late: before the partial image of key 2, which it leaves as it was
        Change("update", 2, _row(2, "b", 7), 25),
    ],
]


# ------------------------------------------------------------------ the events fed


def _events(changes: Iterable[Change], target: str) -> list[ChangeEvent]:
    table = SourceTable("test", "db", "", target.split(".")[1])
    out = []
    for c in changes:
        kw: dict[str, Any] = {"seq": c.seq, "columns": dict(c.columns), "table": table}
        if c.op == "truncate":
            out.append(ev(Op.TRUNCATE, **kw))
        elif c.op == "delete":
            out.append(ev(Op.DELETE, c.key, before={"id": c.key}, **kw))
        elif c.old_key is not None:
            before = {**dict(c.after or {}), "id": c.old_key}
            out.append(ev(Op.UPDATE, c.key, after=dict(c.after or {}), before=before, **kw))
        else:
            op = Op.INSERT if c.op == "insert" else Op.UPDATE
            out.append(ev(op, c.key, after=dict(c.after or {}), **kw))
    return out


def _apply_history(applier: BatchApplier, targets: Iterable[str]) -> list[int]:
    """Feed :data:`HISTORY` to ``targets``, one micro-batch per entry; the apply ids."""
    ids = []
    for n, changes in enumerate(HISTORY):
        events = [e for t in targets for e in _events(changes, t)]
        ids.append(applier.apply(table_of(*events), n).batch_id)
    return ids


# ------------------------------------------------------------------ the model of the source

Rows = dict[Any, tuple[Any, ...]]


def _diff(before: Rows, after: Rows) -> Counter[tuple[Any, ...]]:
    """The change rows that take a table holding ``before`` to ``after``: identity ->
    row values (the feed's own definition of insert, update and delete)."""
    out: Counter[tuple[Any, ...]] = Counter()
    for ident in before.keys() | after.keys():
        old, new = before.get(ident), after.get(ident)
        if old == new:
            continue
        if old is None:
            out[("insert", *new)] += 1
        elif new is None:
            out[("delete", *old)] += 1
        else:
            out[("update_preimage", *old)] += 1
            out[("update_postimage", *new)] += 1
    return out


class SourceModel:
    """The source table as its changes leave it, per micro-batch; what each commit of a
    mirror (``soft`` for a soft-deleting one) or a history table must show."""

    def __init__(self, soft: bool = False) -> None:
        self.soft = soft
        self.rows: dict[int, dict[str, Any]] = {}
        self.deleted: set[int] = set()
        self.log: list[Change] = []  # every change the source made, in order

    def mirror(self) -> Rows:
        """The source table: its changes in sequence order (a late one in its place)."""
        self.rows, self.deleted = {}, set()
        for c in sorted(self.log, key=lambda c: c.seq):
            self._fold(c)
        rows: Rows = {}
        for k, row in self.rows.items():
            values = tuple(row.get(c) for c in DATA)
            if self.soft:
                rows[k] = (*values, k in self.deleted)
            elif k not in self.deleted:
                rows[k] = values
        return rows

    def _delete(self, k: int) -> None:
        if k in self.rows:
            self.deleted.add(k)

    def apply(self, c: Change) -> None:
        self.log.append(c)

    def _fold(self, c: Change) -> None:
        if c.op == "truncate":
            for k in self.rows:
                self._delete(k)
        elif c.op == "delete":
            self._delete(c.key)
        else:
            if c.old_key is not None:
                self._delete(c.old_key)
            partial = any(col not in (c.after or {}) for col in c.columns)
            live = c.key in self.rows and c.key not in self.deleted
            base = self.rows[c.key] if partial and live else {}
            self.rows[c.key] = {**base, **dict(c.after or {})}
            self.deleted.discard(c.key)

    def versions(self) -> Rows:
        """The SCD type 2 versions of every change so far: ``(key, start) -> (data,
        start, end, is_current)``; each change opens a version at its sequence and
        closes the key's open one; a delete closes it; a truncate closes all; a partial
        image takes the open version's values for the columns it lacks."""
        open_: dict[int, tuple[int, dict[str, Any]]] = {}
        out: Rows = {}

        def close(k: int, at: int | None) -> None:
            start, image = open_.pop(k)
            values = tuple(image.get(c) for c in DATA)
            out[(k, start)] = (*values, start, at, at is None)

        for c in sorted(self.log, key=lambda c: c.seq):
            if c.op == "truncate":
                for k in list(open_):
                    close(k, c.seq)
                continue
            if c.old_key is not None and c.old_key in open_:
                close(c.old_key, c.seq)
            before = open_[c.key][1] if c.key in open_ else None
            if c.key in open_:
                close(c.key, c.seq)
            if c.op != "delete":
                partial = any(col not in (c.after or {}) for col in c.columns)
                image = {**before, **dict(c.after or {})} if partial and before else c.after
                open_[c.key] = (c.seq, dict(image or {}))
        for k in list(open_):
            close(k, None)
        return out


def expected_commits(kind: str) -> list[Counter[tuple[Any, ...]]]:
    """The change rows of each commit that changes rows, in commit order: one per
    micro-batch, and for a mirror a truncate's commit of its own before the rest of its
    micro-batch (``kind``: ``mirror``, ``soft`` or ``history``)."""
    model = SourceModel(soft=kind == "soft")
    commits = []
    for changes in HISTORY:
        fresh = [c for c in changes if not c.again]
        state = model.versions if kind == "history" else model.mirror
        before = state()
        if kind != "history" and any(c.op == "truncate" for c in fresh):
            cut = next(i for i, c in enumerate(fresh) if c.op == "truncate") + 1
            for c in fresh[:cut]:
                model.apply(c)
            commits.append(_diff(before, state()))
            before, fresh = state(), fresh[cut:]
        for c in fresh:
            model.apply(c)
        commits.append(_diff(before, state()))
    return [c for c in commits if c]


# ------------------------------------------------------------------ the feed read back

_SEQ = {seq_key((n,)): n for n in range(1000)}


def _feed_row(row: Mapping[str, Any], kind: str) -> tuple[Any, ...]:
    """A row of the feed as :func:`_diff` writes it (a column added later reads NULL in
    the versions before it)."""
    values = tuple(row.get(c) for c in DATA)
    if kind == "soft":
        return (row["_change_type"], *values, bool(row["_deleted"]))
    if kind == "history":
        end = row["__end_at"]
        return (
            row["_change_type"],
            *values,
            _SEQ[row["__start_at"]],
            None if end is None else _SEQ[end],
            row["__is_current"],
        )
    return (row["_change_type"], *values)


def _by_commit(rows: Iterable[Mapping[str, Any]], kind: str) -> list[Counter[tuple[Any, ...]]]:
    """The feed's rows grouped by ``_commit_version``, in version order; each version
    has one ``_commit_timestamp``."""
    versions: dict[int, Counter[tuple[Any, ...]]] = {}
    stamps: dict[int, set[Any]] = {}
    for row in rows:
        version = int(row["_commit_version"])
        versions.setdefault(version, Counter())[_feed_row(row, kind)] += 1
        stamps.setdefault(version, set()).add(row["_commit_timestamp"])
    assert all(len(s) == 1 and None not in s for s in stamps.values()), stamps
    return [versions[v] for v in sorted(versions)]


def delta_rs_feed(path: str, starting_version: int = 0) -> list[dict[str, Any]]:
    return pa.table(DeltaTable(path).load_cdf(starting_version=starting_version)).to_pylist()


def spark_feed(spark: Any, path: str, starting_version: int = 0) -> list[dict[str, Any]]:
    reader = spark.read.format("delta").option("readChangeFeed", "true")
    frame = reader.option("startingVersion", starting_version).load(path)
    return [r.asDict() for r in frame.collect()]


KINDS = {ITEMS: "mirror", SOFT: "soft", HIST: "history"}


def _log(path: str) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """``(version, actions)`` of each commit file of the table at ``path``."""
    for f in sorted(Path(path, "_delta_log").glob("*.json")):
        yield int(f.stem), [json.loads(line) for line in f.read_text().splitlines()]


def _check_feed(wh: DeltaWarehouse, readers: Mapping[str, Any]) -> None:
    for target, kind in KINDS.items():
        path = wh.table_path(target)
        expected = expected_commits(kind)
        for reader, read in readers.items():
            got = _by_commit(read(path), kind)
            assert got == expected, f"{target} read by {reader}"


# ------------------------------------------------------------------ tests


def test_the_feed_holds_exactly_what_each_commit_changed(tmp_path, warehouse_factory):
    """Every write path of the three kinds of table, on each sink, read back by
    delta-rs (and by Spark, on the Spark sink, which writes its own change files)."""
    wh = warehouse_factory(tmp_path / "wh")
    applier = BatchApplier(wh, tables=TableRules.of(RULES))
    ids = _apply_history(applier, KINDS)
    readers: dict[str, Any] = {"delta-rs": delta_rs_feed}
    spark = getattr(wh, "spark", None)
    if spark is not None:
        readers["spark"] = lambda path: spark_feed(spark, path)
    _check_feed(wh, readers)
    for target in KINDS:
        table = DeltaTable(wh.table_path(target))
        assert table.metadata().configuration["delta.enableChangeDataFeed"] == "true"
        if target != HIST:  # a history table skips a batch of duplicates alone
            # every batch is recorded, also one that changed nothing (the duplicate alone)
            assert table.transaction_version(wh.app_id) == ids[-1]


@pytest.mark.spark
def test_spark_reads_the_feed_delta_rs_wrote(tmp_path, spark):
    """The Arrow append's files, delta-rs's MERGE, DELETE and UPDATE change files, read
    by Spark's readChangeFeed as delta-rs reads them."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    _apply_history(BatchApplier(wh, tables=TableRules.of(RULES)), KINDS)
    _check_feed(wh, {"spark": lambda path: spark_feed(spark, path), "delta-rs": delta_rs_feed})


@pytest.mark.services
def test_the_feed_on_an_object_store_holds_exactly_what_each_commit_changed(object_store):
    """The same history on a warehouse on S3 (moto, S3Proxy) and Azure Blob (Azurite),
    read back through the store by delta-rs."""
    options = object_store.storage_options()
    wh = DeltaWarehouse(object_store.warehouse_uri(), pipeline_id="test", storage_options=options)
    _apply_history(BatchApplier(wh, tables=TableRules.of(RULES)), KINDS)

    def feed(path: str) -> list[dict[str, Any]]:
        return pa.table(DeltaTable(path, storage_options=options).load_cdf()).to_pylist()

    _check_feed(wh, {"delta-rs": feed})


def test_a_partitioned_mirror_feeds_what_delta_rs_merges(tmp_path):
    """Partitioned mirrors are merged by delta-rs (decision 50): rows move between
    partition folders, and the change files are written in them."""
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    rules = TableRules.of([(ITEMS, {"change_feed": True, "partition_by": ("qty",)})])
    _apply_history(BatchApplier(wh, tables=rules), [ITEMS])
    path = wh.table_path(ITEMS)
    assert DeltaTable(path).metadata().partition_columns == ["qty"]
    assert _by_commit(delta_rs_feed(path), "mirror") == expected_commits("mirror")


def test_a_table_without_the_option_has_no_feed(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    _apply_history(BatchApplier(wh), [ITEMS])
    path = wh.table_path(ITEMS)
    assert "delta.enableChangeDataFeed" not in DeltaTable(path).metadata().configuration
    assert not Path(path, "_change_data").exists()


def test_turning_the_feed_on_later_starts_it_at_the_property_commit(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    BatchApplier(wh).apply(table_of(*_events(HISTORY[0], ITEMS)), 0)
    path = wh.table_path(ITEMS)
    before = DeltaTable(path).version()
    on = BatchApplier(wh, tables=TableRules.of([(ITEMS, {"change_feed": True})]))
    on.apply(table_of(*_events(HISTORY[1], ITEMS)), 1)
    # the property is a commit of its own, right before the batch's merge
    _, actions = list(_log(path))[before + 1]
    assert any("metaData" in a for a in actions) and not any("add" in a for a in actions)
    assert _by_commit(delta_rs_feed(path, before + 1), "mirror") == expected_commits("mirror")[1:2]
    with pytest.raises(Exception, match="change data"):  # the creation had no feed
        delta_rs_feed(path, 0)


def test_compaction_adds_nothing_to_the_feed(tmp_path):
    """The size-tiered compaction after batches and ``cdcflow maintain``'s delta-rs
    optimize rewrite files with ``dataChange = false``: readers see no change."""
    policy = MaintenancePolicy(compact_min_files=2, small_file_bytes=1 << 20)
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    rules = TableRules.of([(ITEMS, {"change_feed": True})])
    applier = BatchApplier(wh, tables=rules, maintenance=policy)
    batches = [[Change("insert", k, _row(k, f"n{k}", k), 10 * k)] for k in range(1, 8)]
    maintained = []
    for n, changes in enumerate(batches):
        report = applier.apply(table_of(*_events(changes, ITEMS)), n)
        maintained += [m for m in report.maintenance if "items" in m]
    path = wh.table_path(ITEMS)
    # each batch of new keys is an append: add actions alone, read as inserts
    batches_committed = [actions for _, actions in _log(path) if any("txn" in a for a in actions)]
    assert len(batches_committed) == len(batches)
    assert all(
        {k for a in actions for k in a} == {"commitInfo", "add", "txn"}
        for actions in batches_committed
    )
    assert maintained, "no compaction ran after the batches"
    assert applier.maintainer.run_all([path]), "cdcflow maintain compacted nothing"
    rewrites = [
        v
        for v, actions in _log(path)
        if any("remove" in a for a in actions)
        and all(
            a[k].get("dataChange") is False for a in actions for k in a if k in ("add", "remove")
        )
    ]
    assert len(rewrites) >= 2  # both compactions committed
    model = SourceModel()
    expected = []
    for changes in batches:
        before = model.mirror()
        for c in changes:
            model.apply(c)
        expected.append(_diff(before, model.mirror()))
    assert _by_commit(delta_rs_feed(path), "mirror") == expected
    assert sorted(wh.read(ITEMS)["id"].to_pylist()) == list(range(1, 8))


def test_a_merge_or_truncate_that_changes_nothing_still_records_the_batch(
    tmp_path, warehouse_factory
):
    wh = warehouse_factory(tmp_path / "wh")
    applier = BatchApplier(wh, tables=TableRules.of([(ITEMS, {"change_feed": True})]))
    applier.apply(table_of(*_events([Change("insert", 1, _row(1, "a", 1), 10)], ITEMS)), 0)
    path = wh.table_path(ITEMS)
    for n, change in enumerate(
        [
            Change("update", 1, _row(1, "stale", 1), 5),  # older than the stored row
            Change("update", 1, _row(1, "a", 1), 10),  # delivered again
            Change("truncate", seq=3),  # before every stored row
            Change("delete", 7, seq=11),  # of a key never stored
        ],
        start=1,
    ):
        report = applier.apply(table_of(*_events([change], ITEMS)), n)
        assert wh.committed(path, report.batch_id), change
    assert _by_commit(delta_rs_feed(path), "mirror") == [Counter({("insert", 1, "a", 1, None): 1})]

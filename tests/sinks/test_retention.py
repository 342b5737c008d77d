"""Retention of the ``_cdcflow`` bookkeeping rows (``cdcflow.sinks.retention``): rows past
their table's retention are deleted, each source's last apply is kept, and nothing
exactly-once needs is ever removed (a crash's pending apply and every partition's next
offset survive a retention that expires everything). Real delta-rs tables, read back."""

from __future__ import annotations

import itertools
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.apply.helpers import dele, ins, table_of, upd

import cdcflow
from cdcflow.apply import accounting
from cdcflow.apply.batch import BatchApplier
from cdcflow.decode.batches import flatten
from cdcflow.formats.base import DecodeResult
from cdcflow.model import DeadLetter, Origin
from cdcflow.sinks.maintenance import ExpiryClock, Maintainer, MaintenancePolicy
from cdcflow.sinks.retention import RetentionPolicy, expire
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

TARGET = "db.items"
KEEP_NONE = MaintenancePolicy(enabled=False)
#: a clock past every default retention: every row is old
LATER_MS = int(time.time() * 1000) + 365 * 24 * 3_600_000


@pytest.fixture
def clock(monkeypatch):
    """Rows stamped 1000, 2000, ... ms, one tick per changelog or dead-letter builder
    call, so "older than" is exact."""
    ticks = itertools.count(1)
    monkeypatch.setattr(accounting, "_now_ms", lambda: next(ticks) * 1000)


def _rows(wh: DeltaWarehouse, name: str) -> pa.Table:
    return wh.read(name, system=True)


def _batch(b: int, source_offset: int = 0) -> pa.Table:
    """Ten new keys and one dead letter (a record that failed to decode)."""
    events = [
        ins(b * 10 + k, f"v{b}", seq=b + 1, offset=source_offset + b * 11 + k) for k in range(10)
    ]
    origin = Origin("t", 0, source_offset + b * 11 + 10)
    letter = DeadLetter("BAD_JSON", "not JSON", "test", origin, b"{", None)
    return pa.Table.from_batches([flatten(DecodeResult(events=events, dead_letters=[letter]))])


_HOUR_MS = 3_600_000


def _stamp(wh: DeltaWarehouse, batch_id: int) -> int:
    """The ``committed_at_ms`` of a batch's changelog rows."""
    rows = _rows(wh, "changelog").filter(pc.equal(pc.field("batch_id"), batch_id))
    (stamp,) = set(rows["committed_at_ms"].to_pylist())
    return stamp


def _by_source(rows: pa.Table, id_column: str) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for s, i in zip(rows["source"].to_pylist(), rows[id_column].to_pylist(), strict=True):
        out.setdefault(s, set()).add(i)
    return out


def test_rows_past_retention_expire_and_each_sources_last_apply_stays(tmp_path):
    root = str(tmp_path / "wh")
    a, b = (DeltaWarehouse(root, pipeline_id=p) for p in ("p.a", "p.b"))
    apply_a, apply_b = (BatchApplier(w, maintenance=KEEP_NONE) for w in (a, b))
    for i in range(3):
        apply_a.apply(_batch(i), i)
    for i in range(2):
        apply_b.apply(_batch(i, source_offset=1000), i)
    assert _rows(a, "changelog").num_rows == 50 and _rows(a, "dead_letters").num_rows == 5

    assert expire(a, RetentionPolicy()) == []  # nothing is a week old yet
    done = {e.table: e.rows_deleted for e in expire(a, RetentionPolicy(), now_ms=LATER_MS)}

    assert done == {"changelog": 50, "dead_letters": 5, "batches": 3, "progress": 3, "offsets": 3}
    assert _rows(a, "changelog").num_rows == 0 and _rows(a, "dead_letters").num_rows == 0
    # each source's last apply: its completion, its progress, its intent
    assert _by_source(_rows(a, "batches"), "batch_id") == {"p.a": {2}, "p.b": {1}}
    assert _by_source(_rows(a, "progress"), "batch_id") == {"p.a": {2}, "p.b": {1}}
    assert _by_source(_rows(a, "offsets"), "apply_id") == {"p.a": {2}, "p.b": {1}}
    # a second run finds nothing left to expire
    assert expire(a, RetentionPolicy(), now_ms=LATER_MS) == []
    # the mirror is not a bookkeeping table
    assert a.read(TARGET).num_rows == 30  # keys 0..29 (source b wrote 0..19 again)


def test_retention_never_removes_what_exactly_once_needs(tmp_path, clock):
    """A crash leaves apply 3 pending after its intent, its changelog and its mirror
    commit; a retention then expires every bookkeeping row it may (the changelog of the
    three applied batches, every batches/progress/offsets row but each source's last). A
    new process re-delivers every batch: the applied ones are skipped (the next offsets
    live in the Delta log, not in rows), the pending one is finished from its kept
    intent, and no record lands twice."""
    root = str(tmp_path / "wh")
    wh = DeltaWarehouse(root, pipeline_id="p.a")
    batches = [
        table_of(*(ins(k, "a", seq=1, offset=k) for k in range(10))),
        table_of(upd(3, "b", seq=2, offset=10), dele(4, seq=2, offset=11)),
        table_of(*(ins(10 + k, "c", seq=3, offset=12 + k) for k in range(5))),
    ]
    pending = table_of(
        upd(0, "d", seq=4, offset=17),
        ins(4, "late", seq=1, offset=18),  # older than its delete: the tombstone drops it
        ins(20, "e", seq=4, offset=19),
    )
    ap = BatchApplier(wh, maintenance=KEEP_NONE)
    for i, b in enumerate(batches):
        ap.apply(b, i)

    class Crash(BaseException):
        pass

    def crash(*_args, **_kwargs):
        raise Crash

    flush, wh.tombstones.flush = wh.tombstones.flush, crash  # after the mirror's commit
    with pytest.raises(Crash):
        ap.apply(pending, 3)
    wh.tombstones.flush = flush

    # an hour after the pending apply's changelog stamp, the other batches' rows expire
    expire(wh, RetentionPolicy(changelog_hours=1, **_ONLY_LOG), now_ms=_HOUR_MS + _stamp(wh, 3))
    assert sorted(_rows(wh, "changelog")["offset"].to_pylist()) == [17, 18, 19]
    expire(wh, RetentionPolicy(changelog_hours=0), now_ms=LATER_MS)
    assert _rows(wh, "batches")["batch_id"].to_pylist() == [2]  # the last completed
    assert set(_rows(wh, "offsets")["apply_id"].to_pylist()) == {3}  # the pending intent

    again = BatchApplier(DeltaWarehouse(root, pipeline_id="p.a"), maintenance=KEEP_NONE)
    assert again.ledger.pending() is not None and again.ledger.pending().apply_id == 3
    reports = [again.apply(b, 10 + i) for i, b in enumerate([*batches, pending])]
    assert [r.replayed for r in reports] == [10, 2, 5, 0]
    changelog = again.warehouse.read("changelog", system=True)
    assert sorted(changelog["offset"].to_pylist()) == [17, 18, 19]  # nothing twice
    assert again.ledger.pending() is None
    names = mirror_by_key(again.warehouse.read(TARGET), column="name")
    expected = {k: "a" for k in range(10)} | {3: "b", 0: "d", 20: "e"}
    expected |= {10 + k: "c" for k in range(5)}
    del expected[4]
    assert names == expected


def test_changelog_max_rows_keeps_the_newest_whole_batches(tmp_path, clock):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="p.a")
    ap = BatchApplier(wh, maintenance=KEEP_NONE)
    for i in range(5):
        ap.apply(table_of(*(ins(i * 10 + k, "v", seq=1, offset=i * 10 + k) for k in range(10))), i)
    # by size alone (age 0: forever); 25 rows is two and a half batches: three stay
    (done,) = expire(wh, RetentionPolicy(changelog_hours=0, changelog_max_rows=25, **_ONLY_LOG))
    assert done.table == "changelog" and done.rows_deleted == 20
    assert sorted(set(_rows(wh, "changelog")["batch_id"].to_pylist())) == [2, 3, 4]
    # by age: an hour after batch 4's stamp, the rows of batches 2 and 3 are older
    expire(wh, RetentionPolicy(changelog_hours=1, **_ONLY_LOG), now_ms=_HOUR_MS + _stamp(wh, 4))
    assert sorted(set(_rows(wh, "changelog")["batch_id"].to_pylist())) == [4]


_ONLY_LOG = {"dead_letters_hours": 0, "batches_hours": 0, "progress_hours": 0, "offsets_hours": 0}


def test_rows_written_before_the_time_column_are_kept(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="p.a")
    old = accounting.changelog_rows(table_of(ins(1, "old", seq=1, offset=0)), 0).drop_columns(
        ["committed_at_ms"]
    )
    wh.append(wh.system_path("changelog"), old, CommitContext("p.old", 0))  # a 0.3 changelog
    assert expire(wh, RetentionPolicy(), now_ms=LATER_MS) == []
    BatchApplier(wh, maintenance=KEEP_NONE).apply(table_of(ins(2, "new", seq=1, offset=1)), 1)
    (done,) = [e for e in expire(wh, RetentionPolicy(), now_ms=LATER_MS) if e.table == "changelog"]
    assert done.rows_deleted == 1
    assert _rows(wh, "changelog")["offset"].to_pylist() == [0]


def test_a_running_pipeline_expires_rows_at_most_every_retention_interval(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="p.a")
    BatchApplier(wh, maintenance=KEEP_NONE).apply(_batch(0), 0)
    maintainer = Maintainer(wh, MaintenancePolicy(retention_every_hours=1))
    first = maintainer.expire_due(now_ms=LATER_MS)
    assert {e.table for e in first} == {"changelog", "dead_letters"}
    assert [e.describe() for e in first][0].startswith("_cdcflow/changelog: 10 rows expired")
    BatchApplier(wh, maintenance=KEEP_NONE).apply(_batch(1), 1)
    assert maintainer.expire_due(now_ms=LATER_MS) == []  # not an hour since the last
    assert Maintainer(wh, KEEP_NONE).expire_due(now_ms=LATER_MS) == []  # maintenance off


def test_the_sources_of_a_pipeline_expire_the_shared_rows_once(tmp_path):
    """The bookkeeping tables are the warehouse's: with one clock, the first of a
    pipeline's sources to finish a batch expires every source's rows, and the others
    neither scan the tables again nor race its deletes."""
    policy = MaintenancePolicy(retention_every_hours=1)
    views = [DeltaWarehouse(str(tmp_path / "wh"), pipeline_id=f"p.{s}") for s in ("a", "b")]
    BatchApplier(views[0], maintenance=KEEP_NONE).apply(_batch(0), 0)
    clock = ExpiryClock()
    first, second = (Maintainer(wh, policy, clock) for wh in views)
    assert {e.table for e in second.expire_due(now_ms=LATER_MS)} == {"changelog", "dead_letters"}
    assert first.expire_due(now_ms=LATER_MS) == []
    assert Maintainer(views[0], policy).expire_due(now_ms=LATER_MS) == []  # nothing left


def test_cdcflow_maintain_expires_bookkeeping_rows(tmp_path, capsys):
    config = tmp_path / "p.yaml"
    config.write_text(
        "pipeline_id: m\nwarehouse: wh\ncheckpoint: ck\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "sources: [{name: a, format: debezium-json, topics: [t]}]\n"
        "maintenance: {retention: {changelog_hours: 0.000001, dead_letters_hours: 0}}\n"
    )
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="m.a")
    BatchApplier(wh, maintenance=KEEP_NONE).apply(_batch(0), 0)
    time.sleep(0.05)  # the changelog's retention, 3.6 ms, has passed
    report = cdcflow.maintain(config)
    assert {e.table: e.rows_deleted for e in report.expired} == {"changelog": 10}
    assert _rows(wh, "changelog").num_rows == 0 and _rows(wh, "dead_letters").num_rows == 1

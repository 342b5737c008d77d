"""The Arrow merge (``cdcflow.sinks.arrow_merge``): the same mirror as delta-rs's MERGE,
only the files holding a batch's keys rewritten, and files written sorted by key with
statistics readers can trust. Real delta-rs tables, read back with ``deltalake``."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from tests.apply.helpers import _offsets, dele, ev, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.apply.options import TableOptions
from cdcflow.errors import Code
from cdcflow.model import ChangeEvent, Op, Origin, SourceTable
from cdcflow.sinks.file_stats import STRING_PREFIX, file_stats, files_in_range
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

TARGET = "db.items"


@pytest.fixture
def file_per_batch(monkeypatch):
    """Tables past the small-table rewrite (``SMALL_TABLE_BYTES``): a batch's new keys
    are a file of their own, as in a large mirror."""
    from cdcflow.sinks import arrow_merge

    monkeypatch.setattr(arrow_merge, "SMALL_TABLE_BYTES", 0)


PAIRS = SourceTable("test", "db", "", "pairs")


def _mirror(wh: DeltaWarehouse, target: str = TARGET) -> list[dict]:
    """The mirror's rows sorted by key; a key stored twice fails (``mirror_by_key``)."""
    table = wh.read(target)
    mirror_by_key(table, [c for c in ("id", "k2") if c in table.column_names])
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: json.dumps([r.get("id"), r.get("k2")], default=str))


def _random_batches(seed: int, keys: int = 40, batches: int = 6) -> list[pa.Table]:
    """Inserts, updates (some partial), deletes and late (older) changes of ``keys`` keys."""
    rng = random.Random(seed)
    out, seq, offset = [], 10, 0
    for _ in range(batches):
        events = []
        for _ in range(rng.randrange(5, 30)):
            k, seq, offset = rng.randrange(keys), seq + 1, offset + 1
            late = rng.random() < 0.15
            s = seq - rng.randrange(1, 8) if late else seq
            roll = rng.random()
            if roll < 0.45:
                events.append(ins(k, f"n{s}", qty=s, seq=s, offset=offset))
            elif roll < 0.7:
                events.append(upd(k, f"u{s}", qty=s, seq=s, offset=offset))
            elif roll < 0.85:  # a partial image: qty absent keeps the stored value
                events.append(
                    ev(Op.UPDATE, k, after={"id": k, "name": f"p{s}"}, seq=s, offset=offset)
                )
            else:
                events.append(dele(k, seq=s, offset=offset))
        out.append(table_of(*events))
    return out


@pytest.mark.parametrize("soft_delete", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_arrow_merge_and_delta_rs_merge_give_the_same_mirror(tmp_path, seed, soft_delete):
    mirrors, refused = {}, {}
    for engine in ("arrow", "delta-rs"):
        wh = DeltaWarehouse(str(tmp_path / engine), pipeline_id="t", merge_engine=engine)
        options = TableOptions(soft_delete=soft_delete)
        ap = BatchApplier(wh, tables=lambda _t, o=options: o)
        # a partial update of a deleted key (the workload does not re-insert first) is
        # a MISSING_OLD_ROW dead letter: its other columns are unknown
        refused[engine] = [
            dict(ap.apply(b, i).dead_letters) for i, b in enumerate(_random_batches(seed))
        ]
        assert {c for r in refused[engine] for c in r} <= {Code.MISSING_OLD_ROW}
        mirrors[engine] = _mirror(wh)
    assert refused["arrow"] == refused["delta-rs"]
    assert mirrors["arrow"] == mirrors["delta-rs"]
    assert mirrors["arrow"]  # the workload left rows to compare


def _composite(op: Op, a: int, b: str, v: int | None, seq: int) -> ChangeEvent:
    """A change of ``db.pairs``, keyed by ``(id, k2)``."""
    key = {"id": a, "k2": b}
    return ChangeEvent(
        op=op,
        source=PAIRS,
        key=key,
        before=key if op == Op.DELETE else None,
        after=None if op == Op.DELETE else {**key, "v": v},
        columns={"id": "int64", "k2": "string", "v": "int64"},
        seq=(seq,),
        ts_ms=1000 + seq,
        origin=Origin("t", 0, next(_offsets)),
    )


def test_composite_keys_merge_alike(tmp_path):
    batches = [
        [_composite(Op.INSERT, a, b, 1, 1) for a in range(3) for b in ("x", "y")],
        [
            _composite(Op.UPDATE, 1, "x", 2, 2),
            _composite(Op.DELETE, 2, "y", None, 3),
            _composite(Op.UPDATE, 0, "y", 0, 0),  # older than the stored row: ignored
        ],
    ]
    mirrors = {}
    for engine in ("arrow", "delta-rs"):
        wh = DeltaWarehouse(str(tmp_path / engine), pipeline_id="t", merge_engine=engine)
        ap = BatchApplier(wh)
        for i, events in enumerate(batches):
            ap.apply(table_of(*events), i)
        mirrors[engine] = [(r["id"], r["k2"], r["v"]) for r in _mirror(wh, "db.pairs")]
    assert mirrors["arrow"] == mirrors["delta-rs"]
    assert (1, "x", 2) in mirrors["arrow"] and (2, "y", 1) not in mirrors["arrow"]
    assert (0, "y", 1) in mirrors["arrow"]


def test_a_merge_rewrites_only_the_files_its_keys_are_in(tmp_path, file_per_batch):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t", target_file_rows=100)
    ap = BatchApplier(wh)

    def merge(batch_id, events):
        report = ap.apply(table_of(*events), batch_id)
        (mirror,) = report.mirrors
        return mirror.metrics

    first = merge(0, [ins(k, "v", seq=1) for k in range(1000)])
    assert first["num_target_files_added"] == 10  # sorted by key, 100 rows a file
    files = DeltaTable(wh.table_path(TARGET)).get_add_actions(flatten=True)
    bounds = sorted(zip(files["min.id"].to_pylist(), files["max.id"].to_pylist(), strict=True))
    assert bounds == [(i * 100, i * 100 + 99) for i in range(10)]

    new_keys = merge(1, [ins(k, "new", seq=2) for k in range(1000, 1050)])
    assert new_keys["num_target_files_scanned"] == 0
    assert new_keys["num_target_files_removed"] == 0 and new_keys["num_target_files_added"] == 1

    recent = merge(2, [upd(k, "recent", seq=3) for k in range(950, 1000)])
    assert recent["num_target_files_scanned"] == 1 and recent["num_target_files_skipped"] == 10
    assert recent["num_target_files_removed"] == 1

    spread = merge(3, [upd(k, "spread", seq=4) for k in (5, 305, 1010)])
    assert spread["num_target_files_removed"] == 3 and spread["num_target_files_scanned"] == 3

    names = mirror_by_key(wh.read(TARGET), column="name")
    expected = {k: "v" for k in range(1000)} | {k: "new" for k in range(1000, 1050)}
    expected |= {k: "recent" for k in range(950, 1000)} | {
        5: "spread",
        305: "spread",
        1010: "spread",
    }
    assert names == expected


def test_a_key_in_a_files_range_but_not_in_the_file_rewrites_nothing(tmp_path, file_per_batch):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(0, "a", seq=1), ins(10, "b", seq=1)), 0)
    (mirror,) = ap.apply(table_of(ins(5, "c", seq=2)), 1).mirrors
    assert mirror.metrics["num_target_files_scanned"] == 1
    assert mirror.metrics["num_target_files_removed"] == 0
    assert mirror.metrics["num_target_files_added"] == 1


def test_a_warehouse_path_with_spaces_and_hashes(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "my wh #1"), pipeline_id="t")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=1)), 0)
    ap.apply(table_of(upd(1, "z", seq=2), dele(2, seq=2)), 1)
    assert mirror_by_key(wh.read(TARGET), column="name") == {1: "z"}


# ---------------------------------------------------------------- statistics


def _delta_rs_stats(tmp_path: Path, data: pa.Table) -> dict:
    """The stats delta-rs itself writes for ``data`` (one file)."""
    write_deltalake(str(tmp_path / "reference"), data)
    log = (tmp_path / "reference" / "_delta_log" / "00000000000000000000.json").read_text()
    (add,) = [json.loads(line)["add"] for line in log.splitlines() if '"add"' in line]
    return json.loads(add["stats"])


def test_file_statistics_agree_with_delta_rs_where_written(tmp_path):
    long = "m" * (STRING_PREFIX + 10)
    data = pa.table(
        {
            "id": pa.array([3, -1, None, 7], pa.int64()),
            "small": pa.array([1, 2, 3, None], pa.int8()),
            "name": ["b", "a", None, "c"],
            "long": [long + "a", long + "z", "a", None],
            "day": pa.array([dt.date(2020, 1, 2), None, dt.date(2019, 5, 1), dt.date(2021, 1, 1)]),
            "at": pa.array([dt.datetime(2020, 1, 1, 0, 0, 0, 999)] * 4, pa.timestamp("us", "UTC")),
            "ratio": [1.5, float("nan"), None, 0.1],
            "price": pa.array([decimal.Decimal("1.10")] * 4, pa.decimal128(10, 2)),
            "flag": [True, None, False, True],
        }
    )
    ours = json.loads(file_stats(data))
    theirs = _delta_rs_stats(tmp_path, data)
    assert ours["numRecords"] == theirs["numRecords"] == 4
    assert ours["nullCount"] == theirs["nullCount"]
    for bound in ("minValues", "maxValues"):
        for column, value in ours[bound].items():
            assert theirs[bound][column] == value, (bound, column)
    assert set(ours["minValues"]) == {"id", "small", "name", "long", "day"}
    assert set(ours["maxValues"]) == {"id", "small", "name", "day"}  # long: left out
    assert ours["minValues"]["long"] == "a" and ours["maxValues"]["day"] == "2021-01-01"


def test_files_in_range_keeps_files_a_value_can_be_in():
    files = pa.table(
        {
            "path": ["a", "b", "c", "d"],
            "min.id": pa.array([0, 100, 200, None], pa.int64()),
            "max.id": pa.array([99, 199, 299, None], pa.int64()),
        }
    )
    keep = files_in_range(files, "id", pa.array([150, 300, None], pa.int64()))
    assert keep.to_pylist() == [False, True, False, True]  # d: no bounds, kept
    assert files_in_range(files, "id", pa.array([], pa.int64())).to_pylist() == [False] * 4
    no_stats = files.select(["path"])
    assert files_in_range(no_stats, "id", pa.array([1])).to_pylist() == [True] * 4
    strings = pa.table({"path": ["x"], "min.k": ["b"], "max.k": ["d"]})
    assert files_in_range(strings, "k", pa.array(["a", "e"])).to_pylist() == [False]
    assert files_in_range(strings, "k", pa.array(["c"])).to_pylist() == [True]


def test_files_keep_their_size_when_rewritten(tmp_path, monkeypatch, file_per_batch):
    """A file about the target size stays one file when a merge rewrites it (no halving
    at every rewrite); more than 1.5 times the target is split into equal files."""
    from cdcflow.sinks import arrow_merge

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh)
    ap.apply(table_of(*(ins(k, "v" * 20, seq=1) for k in range(300))), 0)
    size = wh.read(TARGET).nbytes
    monkeypatch.setattr(arrow_merge, "TARGET_FILE_BYTES", int(size / 1.2))
    (mirror,) = ap.apply(table_of(upd(7, "w", seq=2)), 1).mirrors
    assert (
        mirror.metrics["num_target_files_removed"],
        mirror.metrics["num_target_files_added"],
    ) == (1, 1)
    monkeypatch.setattr(arrow_merge, "TARGET_FILE_BYTES", size // 3)
    (mirror,) = ap.apply(table_of(upd(8, "w", seq=3)), 2).mirrors
    assert mirror.metrics["num_target_files_added"] == 3
    files = DeltaTable(wh.table_path(TARGET)).get_add_actions(flatten=True)
    assert sorted(files["num_records"].to_pylist()) == [100, 100, 100]


def test_a_small_table_stays_one_file_sorted_by_key(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t")
    ap = BatchApplier(wh)
    for b in range(6):  # new keys below and above the stored ones, and an update
        ap.apply(
            table_of(
                ins(100 - b, "low", seq=b + 1),
                ins(100 + b, "high", seq=b + 1),
                upd(100, "u", seq=b + 1),
            ),
            b,
        )
    files = DeltaTable(wh.table_path(TARGET)).get_add_actions(flatten=True)
    assert files.num_rows == 1
    ids = [r["id"] for r in DeltaTable(wh.table_path(TARGET)).to_pyarrow_table().to_pylist()]
    assert ids == sorted(ids) == list(range(95, 106))
    (mirror,) = ap.apply(table_of(upd(100, "older", seq=0)), 6).mirrors
    assert mirror.metrics["num_target_files_added"] == 0  # an older change rewrites nothing

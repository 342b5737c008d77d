"""``_cdcflow/tombstones`` read once per process and kept current: the index follows its
own commits, sees another process's, and a purge. Real delta-rs tables read back."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from tests.apply.helpers import dele, ins, table_of

from cdcflow.apply.batch import BatchApplier
from cdcflow.model import seq_key
from cdcflow.sinks.system_tables import TOMBSTONE_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key


def _names(wh: DeltaWarehouse) -> dict[int, str]:
    return mirror_by_key(wh.read("db.items"), column="name")


def test_a_tombstone_committed_by_another_process_guards_the_next_batch(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(1, "a", seq=1), ins(2, "b", seq=1)), 0)
    ap.apply(table_of(dele(1, seq=5)), 1)  # the index is read, then follows this commit
    # another process (an older cdcflow, a restore) adds a tombstone for key 2 at seq 9
    other = pa.Table.from_pylist(
        [
            {
                "target_table": "db.items",
                "key": '{"id":2}',
                "seq": seq_key((9,)),
                "batch_id": 7,
                "deleted_at_ms": 0,
            }
        ],
        schema=TOMBSTONE_SCHEMA,
    )
    write_deltalake(wh.system_path("tombstones"), other, mode="append")
    ap.apply(table_of(ins(1, "late", seq=4), ins(2, "late", seq=8), ins(3, "c", seq=8)), 2)
    assert _names(wh) == {2: "b", 3: "c"}  # both late inserts dropped


def test_views_of_one_warehouse_share_the_index(tmp_path):
    """Two sources of one pipeline (two views, two application ids) in one process: a
    delete one applies guards the other's late insert of the same table."""
    root = str(tmp_path / "wh")
    first = BatchApplier(DeltaWarehouse(root, pipeline_id="p.a"))
    second = BatchApplier(DeltaWarehouse(root, pipeline_id="p.b"))
    first.apply(table_of(ins(1, "a", seq=1)), 0)
    first.apply(table_of(dele(1, seq=5)), 1)
    second.apply(table_of(ins(1, "late", seq=3, partition=1)), 0)
    assert _names(DeltaWarehouse(root)) == {}
    assert DeltaTable(f"{root}/_cdcflow/tombstones").to_pyarrow_table().num_rows == 1


def test_after_a_purge_the_index_is_read_again(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    ap = BatchApplier(wh)
    ap.apply(table_of(ins(1, "a", seq=1)), 0)
    ap.apply(table_of(dele(1, seq=5)), 1)
    assert wh.tombstones.guard("db.items")[0] == {'{"id":1}': seq_key((5,))}
    assert wh.tombstones.purge(1.0, now_ms=10**15) == 1
    assert wh.tombstones.guard("db.items") == ({}, None)
    ap.apply(table_of(ins(1, "back", seq=3)), 2)  # purged: a late insert comes back
    assert _names(wh) == {1: "back"}

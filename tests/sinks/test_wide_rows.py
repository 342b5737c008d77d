"""A wide row (1,500 columns) through real delta-rs tables: the Arrow merge path
(``REWRITE_MIN_COLUMNS``) keeps the mirror's semantics. No timing asserts: the seconds
are in bench/wide_rows.py."""

from __future__ import annotations

from deltalake import DeltaTable
from tests.apply.helpers import ev, table_of

from cdcflow.apply.batch import BatchApplier
from cdcflow.model import Op
from cdcflow.sinks import engines
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import mirror_by_key

TARGET = "db.items"
WIDTH = 1500
COLUMNS = {"id": "int64", **{f"c{i}": ("string" if i % 2 else "int64") for i in range(WIDTH - 1)}}


def _row(key: int, version: int) -> dict:
    return {
        "id": key,
        **{f"c{i}": (f"v{i}.{version}" if i % 2 else i * version) for i in range(WIDTH - 1)},
    }


def _state(wh: DeltaWarehouse) -> dict[int, dict]:
    return mirror_by_key(wh.read(TARGET))


def test_a_wide_row_is_inserted_updated_partially_updated_and_deleted(tmp_path):
    assert len(COLUMNS) >= engines.REWRITE_MIN_COLUMNS  # the Arrow merge path, not delta-rs's
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    applier = BatchApplier(wh)

    def apply(batch_id, *events):
        report = applier.apply(table_of(*events), batch_id)
        assert not report.dead_letters
        return report

    apply(0, *(ev(Op.INSERT, k, after=_row(k, 1), seq=k, columns=COLUMNS) for k in (1, 2, 3)))
    assert _state(wh) == {k: _row(k, 1) for k in (1, 2, 3)}

    apply(1, ev(Op.UPDATE, 1, after=_row(1, 2), seq=10, columns=COLUMNS))
    assert _state(wh) == {1: _row(1, 2), 2: _row(2, 1), 3: _row(3, 1)}

    # a partial image: absent columns keep their stored values
    apply(2, ev(Op.UPDATE, 2, after={"id": 2, "c0": -1, "c1": "partial"}, seq=11, columns=COLUMNS))
    assert _state(wh)[2] == {**_row(2, 1), "c0": -1, "c1": "partial"}

    # an older update never overwrites; a delete removes; an insert of a new key lands
    apply(
        3,
        ev(Op.UPDATE, 1, after=_row(1, 9), seq=5, columns=COLUMNS),
        ev(Op.DELETE, 3, before={"id": 3}, seq=12, columns=COLUMNS),
        ev(Op.INSERT, 4, after=_row(4, 1), seq=13, columns=COLUMNS),
    )
    assert _state(wh) == {
        1: _row(1, 2),
        2: {**_row(2, 1), "c0": -1, "c1": "partial"},
        4: _row(4, 1),
    }

    table = DeltaTable(wh.table_path(TARGET))
    assert table.transaction_version(wh.app_id) == 3

    # a replay of the last batch changes nothing
    version = table.version()
    pending = applier.ledger.pending()
    assert pending is None  # every apply completed
    again = ev(Op.DELETE, 1, before={"id": 1}, seq=99, columns=COLUMNS, offset=0)
    assert applier.apply(table_of(again), 3).replayed == 1  # offset 0 was applied
    assert DeltaTable(wh.table_path(TARGET)).version() == version

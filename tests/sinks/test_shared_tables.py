"""The ``_cdcflow`` tables are shared by a pipeline's sources, whose first applies run side
by side (decision 53): they create a system table at the same moment. delta-rs fails the
commits that lose that race (``Protocol changed`` for a second creation, ``Metadata
changed`` for an append read before a creation landed); the warehouse appends again on
the table as it now is, so every source's rows land once. Without that, every round of
this test loses rows (measured: 10 rounds of 10)."""

from __future__ import annotations

import threading

import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.sinks.system_tables import OFFSETS, OFFSETS_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse

SOURCES = 6


def _intent(source: str) -> pa.Table:
    row = {f.name: [None] for f in OFFSETS_SCHEMA}
    row.update(source=[source], apply_id=[0], topic=["t"], partition=[0])
    row.update(first_offset=[0], last_offset=[9])
    return pa.table(row, schema=OFFSETS_SCHEMA)


def test_sources_creating_a_system_table_at_once_all_land(tmp_path):
    for round_ in range(3):
        views = [
            DeltaWarehouse(str(tmp_path / str(round_)), pipeline_id=f"p.s{i}")
            for i in range(SOURCES)
        ]
        start = threading.Barrier(SOURCES)
        errors: list[BaseException] = []

        def append(wh: DeltaWarehouse, start=start, errors=errors) -> None:
            start.wait()
            try:
                wh.append(wh.system_path(OFFSETS), _intent(wh.pipeline_id), wh.commit_context(0))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=append, args=(wh,)) for wh in views]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        rows = DeltaTable(views[0].system_path(OFFSETS)).to_pyarrow_table()
        assert sorted(rows["source"].to_pylist()) == sorted(wh.pipeline_id for wh in views)
        assert all(wh.committed(wh.system_path(OFFSETS), 0) for wh in views)

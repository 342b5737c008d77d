"""Maintaining a warehouse by hand: what ``cdcflow maintain`` does, as a library call.

A running pipeline maintains the tables it writes after its micro-batches, within a time
budget (:mod:`cdcflow.sinks.maintenance`). :func:`maintain` does all of it at once, for
every table of the warehouse: small files compacted, files no version within
``maintenance.vacuum_retention_hours`` needs deleted, expired log files cleaned up,
tombstones past ``apply.tombstone_retention_hours`` purged, and the ``_cdcflow``
bookkeeping rows past ``maintenance.retention`` expired (:mod:`cdcflow.sinks.retention`). It runs under the pipeline's
lease, so never beside a running pipeline (``LeaseHeld``, exit 75): schedule it daily
for pipelines run with ``--once``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cdcflow.config import PipelineConfig, load_config
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.maintenance import Maintainer, TableMaintenance
from cdcflow.sinks.retention import Expired, expire
from cdcflow.sinks.system_tables import HISTORY_LOG, LEASES, SYSTEM_FOLDER
from cdcflow.sinks.warehouse import DeltaWarehouse

__all__ = ["MaintenanceReport", "maintain", "warehouse_tables"]


@dataclass
class MaintenanceReport:
    """What :func:`maintain` did: one entry per table it changed, the tombstones it
    purged and the bookkeeping rows it expired, per system table."""

    tables: list[TableMaintenance] = field(default_factory=list)
    tombstones_purged: int = 0
    expired: list[Expired] = field(default_factory=list)


def warehouse_tables(warehouse: DeltaWarehouse) -> list[str]:
    """Paths of every Delta table of a warehouse, local or on an object store: the
    mirrors, the system tables and the history tables' change logs (the leases are left
    alone)."""
    root, store = warehouse.root, warehouse.storage
    paths = [f"{root}/{name}" for name in warehouse.mirrors()]
    for name in store.folders(SYSTEM_FOLDER):
        if name == LEASES:
            continue
        if name == HISTORY_LOG:
            logs = store.folders(SYSTEM_FOLDER, name)
            paths += [f"{root}/{SYSTEM_FOLDER}/{name}/{t}" for t in logs]
        elif store.is_table(SYSTEM_FOLDER, name):
            paths.append(f"{root}/{SYSTEM_FOLDER}/{name}")
    return paths


def maintain(config: PipelineConfig | str | Path) -> MaintenanceReport:
    """Compact, vacuum and clean up every table of the pipeline's warehouse, and purge
    old tombstones, under the pipeline's lease.

    Raises:
        ConfigError: the configuration is invalid (a path is loaded first).
        LeaseHeld: a run of the pipeline holds its lease.
    """
    if not isinstance(config, PipelineConfig):
        config = load_config(config)
    report = MaintenanceReport()
    with PipelineLease(
        config.warehouse, config.pipeline_id, storage_options=config.storage, renew_every_s=0
    ):
        warehouse = DeltaWarehouse(
            config.warehouse, pipeline_id=config.pipeline_id, storage_options=config.storage
        )
        policy = config.maintenance.policy()
        report.expired = expire(warehouse, policy.retention)  # first: compaction follows
        maintainer = Maintainer(warehouse, policy)
        overrides = {}
        for name in warehouse.mirrors():  # a mirror's folder is its target's name
            own = config.tables(name).maintenance
            if own is not None:
                overrides[warehouse.table_path(name)] = own.overrides()
        report.tables = maintainer.run_all(warehouse_tables(warehouse), overrides)
        report.tombstones_purged = warehouse.tombstones.purge(
            config.apply.tombstone_retention_hours
        )
    return report

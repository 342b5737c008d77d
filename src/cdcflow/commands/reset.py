"""Starting sources over: what ``cdcflow reset`` does, as a library call.

The warehouse records the Kafka offsets it applied (``_cdcflow/offsets``), so starting a
source's Spark checkpoint over loses nothing: the next run starts where the warehouse
stopped. The pipeline's one query keeps every source in one checkpoint
(``<checkpoint>/_query``): resetting some sources drops them from its fingerprints, and
the next run starts the checkpoint over with those sources at the warehouse's offsets and
the others where they were; resetting every source deletes it.
Deleting the warehouse too makes the next run apply the topics again from
``kafka.starting_offsets``. Either is done under the pipeline's lease, so a running
pipeline is never pulled from under (``LeaseHeld``, exit 75).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cdcflow.config import PipelineConfig, load_config
from cdcflow.errors import ConfigError
from cdcflow.runtime.checkpoint import QUERY_FOLDER, Checkpoint
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.storage import Storage

__all__ = ["ResetPlan", "plan_reset", "reset"]


@dataclass(frozen=True)
class ResetPlan:
    """What a reset deletes.

    Attributes:
        checkpoints: the checkpoint folders deleted (the pipeline's, when every source is
            reset; the per-source folders of cdcflow before 0.4 of the sources reset).
        warehouse: the warehouse folder, when it is deleted too (and exists).
        forgotten: the sources dropped from the pipeline's checkpoint (when some are
            reset), with that checkpoint's folder.
    """

    checkpoints: tuple[Checkpoint, ...]
    warehouse: str | None
    forgotten: tuple[str, ...] = ()
    query_checkpoint: Checkpoint | None = None

    @property
    def steps(self) -> list[str]:
        """One line per deletion."""
        out = [f"delete checkpoint {c.path}" for c in self.checkpoints]
        where = self.query_checkpoint.path if self.query_checkpoint else None
        out += [
            f"start source {name} over in checkpoint {where} (the other "
            "sources keep their positions)"
            for name in self.forgotten
        ]
        if self.warehouse:
            out.append(f"delete warehouse {self.warehouse} (every table)")
        return out

    @property
    def after(self) -> str:
        """Where the next run starts."""
        if self.warehouse:
            return "the next run applies the topics again from kafka.starting_offsets"
        return (
            "the next run starts from the offsets the warehouse applied (nothing is lost or "
            "applied twice)"
        )


def _config(config: PipelineConfig | str | Path) -> PipelineConfig:
    return config if isinstance(config, PipelineConfig) else load_config(config)


def plan_reset(
    config: PipelineConfig | str | Path,
    sources: Sequence[str] | None = None,
    warehouse: bool = False,
) -> ResetPlan:
    """What :func:`reset` would delete; deletes nothing.

    Args:
        config: the configuration, or its YAML file.
        sources: source names (default: every source).
        warehouse: delete the warehouse too (only with every source).

    Raises:
        ConfigError: an unknown source; ``warehouse`` with some sources only.
    """
    config = _config(config)
    names = [s.name for s in config.sources]
    chosen = list(sources or names)
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise ConfigError(f"--source {unknown[0]!r} is not a source of the pipeline: {names}")
    query = Checkpoint.of(config, QUERY_FOLDER)
    every = set(chosen) == set(names)
    # the per-source folders of cdcflow before 0.4
    candidates = [Checkpoint.of(config, name) for name in chosen]
    forgotten: tuple[str, ...] = ()
    if every:
        candidates.insert(0, query)
    elif query.exists():
        held = query.fingerprints() or {}
        forgotten = tuple(name for name in chosen if name in held)
    folders = tuple(c for c in candidates if c.exists())
    if not warehouse:
        return ResetPlan(folders, None, forgotten, query if forgotten else None)
    if set(chosen) != set(names):
        raise ConfigError("--warehouse deletes the tables of every source: leave out --source")
    store = Storage(config.warehouse, config.storage)
    return ResetPlan(folders, config.warehouse if store.exists() else None)


def reset(
    config: PipelineConfig | str | Path,
    sources: Sequence[str] | None = None,
    warehouse: bool = False,
) -> ResetPlan:
    """Start the sources over in the pipeline's checkpoint (and, with ``warehouse``,
    delete the warehouse) under the pipeline's lease.

    Returns:
        What was deleted.

    Raises:
        ConfigError: as :func:`plan_reset`.
        LeaseHeld: a run of the pipeline holds its lease; nothing was deleted.
    """

    config = _config(config)
    plan = plan_reset(config, sources, warehouse)
    if not plan.steps:
        return plan
    lease = PipelineLease(
        config.warehouse, config.pipeline_id, storage_options=config.storage, renew_every_s=0
    )
    lease.acquire()
    for checkpoint in plan.checkpoints:
        checkpoint.restart()
    if plan.forgotten and plan.query_checkpoint is not None:
        plan.query_checkpoint.forget(plan.forgotten)
    if plan.warehouse:
        Storage(config.warehouse, config.storage).delete()  # the lease goes with it
    else:
        lease.release()
    return plan

"""Starting sources over: what ``cdcflow reset`` does, as a library call.

The warehouse records the Kafka offsets it applied (``_cdcflow/offsets``), so deleting a
source's Spark checkpoint loses nothing: the next run starts where the warehouse stopped.
Deleting the warehouse too makes the next run apply the topics again from
``kafka.starting_offsets``. Either is done under the pipeline's lease, so a running
pipeline is never pulled from under (``LeaseHeld``, exit 75).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cdcflow.config import PipelineConfig, load_config
from cdcflow.errors import ConfigError

__all__ = ["ResetPlan", "plan_reset", "reset"]


@dataclass(frozen=True)
class ResetPlan:
    """What a reset deletes.

    Attributes:
        checkpoints: the sources' checkpoint folders that exist.
        warehouse: the warehouse folder, when it is deleted too (and exists).
    """

    checkpoints: tuple[Path, ...]
    warehouse: str | None

    @property
    def steps(self) -> list[str]:
        """One line per deletion."""
        out = [f"delete checkpoint {f}" for f in self.checkpoints]
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
        ConfigError: an unknown source; ``warehouse`` with some sources only, or with a
            warehouse that is not a local folder.
    """
    config = _config(config)
    names = [s.name for s in config.sources]
    chosen = list(sources or names)
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise ConfigError(f"--source {unknown[0]!r} is not a source of the pipeline: {names}")
    folders = tuple(f for f in (Path(config.checkpoint) / name for name in chosen) if f.exists())
    if not warehouse:
        return ResetPlan(folders, None)
    if "://" in config.warehouse:
        raise ConfigError(
            f"--warehouse: {config.warehouse} is not a local folder; delete it with the "
            "object store's own tools"
        )
    if set(chosen) != set(names):
        raise ConfigError("--warehouse deletes the tables of every source: leave out --source")
    return ResetPlan(folders, config.warehouse if Path(config.warehouse).exists() else None)


def reset(
    config: PipelineConfig | str | Path,
    sources: Sequence[str] | None = None,
    warehouse: bool = False,
) -> ResetPlan:
    """Delete the sources' checkpoints (and, with ``warehouse``, the warehouse) under the
    pipeline's lease.

    Returns:
        What was deleted.

    Raises:
        ConfigError: as :func:`plan_reset`.
        LeaseHeld: a run of the pipeline holds its lease; nothing was deleted.
    """
    from cdcflow.sinks.lease import PipelineLease

    config = _config(config)
    plan = plan_reset(config, sources, warehouse)
    if not plan.steps:
        return plan
    lease = PipelineLease(config.warehouse, config.pipeline_id, renew_every_s=0)
    lease.acquire()
    for folder in plan.checkpoints:
        shutil.rmtree(folder, ignore_errors=True)
    if plan.warehouse:
        shutil.rmtree(plan.warehouse, ignore_errors=True)  # the lease goes with it
    else:
        lease.release()
    return plan

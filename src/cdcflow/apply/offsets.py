"""Which Kafka records a pipeline has applied: the warehouse is the truth, not the checkpoint.

Spark's checkpoint says which offsets Spark *planned*; only the warehouse knows what was
*applied*. A checkpoint that is deleted, older than the warehouse or another pipeline's
must never make cdcflow skip a record or apply one twice, so every apply is numbered and
bounded by the warehouse itself (as Apache Iceberg's Kafka Connect sink and Hudi keep the
consumed offsets in their commit metadata):

1. **intent** — the apply's offset ranges are appended to ``_cdcflow/offsets``, the commit
   carrying ``(app_id, apply_id)``;
2. **tables** — every table write of the apply is idempotent on ``(app_id, apply_id)`` and
   carries the ranges in its commit metadata (``cdcflow.offsets``);
3. **completion** — the apply's accounting rows (``_cdcflow/batches``) are the last write;
   that commit carries ``(app_id, apply_id)`` and, per topic-partition,
   ``(app_id@topic#partition, next offset)``.

So the next offset to apply of a partition is a transaction version of the batches table,
the last completed apply is its ``(app_id)`` version, and an apply whose intent is newer
than the last completion is *pending*: a crash interrupted it after some of its tables
were written. A pending apply is finished with exactly its own records (Spark's replay of
the same micro-batch, or the pipeline re-reading its ranges from Kafka at start-up), under
its own id, so the tables it reached skip it and the others get it. Records below the next
offsets are skipped whatever micro-batch id carries them. See docs/decisions.md 20.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.errors import ApplyError, Code
from cdcflow.sinks.system_tables import BATCHES, OFFSETS, OFFSETS_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse

__all__ = ["IncompleteApply", "OffsetLedger", "PendingApply", "TopicPartition", "offset_ranges"]

#: ``(topic, partition)``
TopicPartition = tuple[str, int]


def offset_ranges(events: pa.Table) -> dict[TopicPartition, tuple[int, int]]:
    """``{(topic, partition): (first_offset, last_offset)}`` of the records in ``events``
    (:data:`~cdcflow.decode.batches.EVENT_SCHEMA` rows, several per record allowed)."""
    if events.num_rows == 0:
        return {}
    spans = (
        events.select(["topic", "partition", "offset"])
        .group_by(["topic", "partition"])
        .aggregate([("offset", "min"), ("offset", "max")])
    )
    return {
        (t, p): (lo, hi)
        for t, p, lo, hi in zip(
            spans["topic"].to_pylist(),
            spans["partition"].to_pylist(),
            spans["offset_min"].to_pylist(),
            spans["offset_max"].to_pylist(),
            strict=True,
        )
    }


def _in_ranges(
    events: pa.Table, ranges: dict[TopicPartition, tuple[int, int]], below_only: bool = False
) -> pa.ChunkedArray:
    """Mask of the rows inside ``ranges`` (``below_only``: at or below each range's end)."""
    mask = None
    for (topic, partition), (first, last) in ranges.items():
        here = pc.and_(pc.equal(events["topic"], topic), pc.equal(events["partition"], partition))
        within = pc.less_equal(events["offset"], last)
        if not below_only:
            within = pc.and_(within, pc.greater_equal(events["offset"], first))
        inside = pc.and_(here, within)
        mask = inside if mask is None else pc.or_(mask, inside)
    return mask if mask is not None else pc.is_null(events["offset"])  # none: all false


@dataclass(frozen=True, slots=True)
class PendingApply:
    """An apply whose intent is recorded but whose completion is not (a crash cut it).

    Attributes:
        apply_id: its id; finishing it reuses the id.
        ranges: ``{(topic, partition): (first_offset, last_offset)}`` it covers.
    """

    apply_id: int
    ranges: dict[TopicPartition, tuple[int, int]]

    def select(self, events: pa.Table) -> pa.Table:
        """The rows of ``events`` inside the pending apply's ranges."""
        return events.filter(_in_ranges(events, self.ranges))

    def covered_by(self, events: pa.Table) -> bool:
        """Whether ``events`` (already :meth:`select`-ed) hold every range whole: the first
        and the last record of each (what lies between is the same Kafka log)."""
        return offset_ranges(events) == self.ranges

    def describe(self) -> str:
        return ", ".join(f"{t}[{p}] {a}..{b}" for (t, p), (a, b) in sorted(self.ranges.items()))


class OffsetLedger:
    """The applied offsets of one warehouse view (``warehouse.app_id``).

    Args:
        warehouse: the source's warehouse view; its ``app_id`` names the source.

    Reads are cached: one ledger per running source, which alone writes the view.
    """

    def __init__(self, warehouse: DeltaWarehouse) -> None:
        self.warehouse = warehouse
        self._next: dict[TopicPartition, int] = {}
        self._completed: int | None = None
        self._pending: PendingApply | None | Literal[False] = False  # False: not read yet

    @property
    def offsets_path(self) -> str:
        return self.warehouse.system_path(OFFSETS)

    @property
    def batches_path(self) -> str:
        return self.warehouse.system_path(BATCHES)

    def _app(self, tp: TopicPartition) -> str:
        return f"{self.warehouse.app_id}@{tp[0]}#{tp[1]}"

    # -------------------------------------------------------------- reading

    def completed_id(self) -> int:
        """The id of the last completed apply (-1: none)."""
        if self._completed is None:
            version = self.warehouse.system_version(BATCHES)
            self._completed = -1 if version is None else version
        return self._completed

    def next_offsets(self, tps: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        """``{(topic, partition): next offset to apply}`` for the partitions of ``tps``
        the warehouse has applied records of (the others are absent)."""
        wanted = [tp for tp in tps if tp not in self._next]
        if wanted:
            apps = {self._app(tp): tp for tp in wanted}
            for app, version in self.warehouse.system_versions(BATCHES, list(apps)).items():
                self._next[apps[app]] = version
        return {tp: self._next[tp] for tp in tps if tp in self._next}

    def pending(self) -> PendingApply | None:
        """The apply a crash interrupted, if any."""
        if self._pending is False:
            self._pending = self._read_pending()
        return self._pending

    def _read_pending(self) -> PendingApply | None:
        intent = self.warehouse.system_version(OFFSETS)
        if intent is None or intent <= self.completed_id():
            return None
        rows = self.warehouse.read_system(
            OFFSETS,
            OFFSETS_SCHEMA,
            filters=[("source", "=", self.warehouse.pipeline_id), ("apply_id", "=", intent)],
        )
        ranges = {
            (t, p): (a, b)
            for t, p, a, b in zip(
                rows["topic"].to_pylist(),
                rows["partition"].to_pylist(),
                rows["first_offset"].to_pylist(),
                rows["last_offset"].to_pylist(),
                strict=True,
            )
        }
        return PendingApply(int(intent), ranges) if ranges else None

    def unapplied(
        self, events: pa.Table, ranges: dict[TopicPartition, tuple[int, int]] | None = None
    ) -> pa.Table:
        """The rows of records not applied yet (at or above their partition's next offset).

        Args:
            events: EVENT_SCHEMA rows.
            ranges: :func:`offset_ranges` of ``events``, when the caller has them.

        Returns:
            ``events`` itself when no record of it was applied (the usual case, no scan).
        """
        if events.num_rows == 0:
            return events
        ranges = offset_ranges(events) if ranges is None else ranges
        applied = {
            tp: (0, n - 1) for tp, n in self.next_offsets(ranges).items() if n > ranges[tp][0]
        }
        if not applied:
            return events
        return events.filter(pc.invert(_in_ranges(events, applied, below_only=True)))

    # -------------------------------------------------------------- writing

    def begin(
        self,
        apply_id: int,
        ranges: dict[TopicPartition, tuple[int, int]],
        delivery_id: int | None = None,
    ) -> None:
        """Record the intent of ``apply_id`` (idempotent: a re-run writes nothing)."""
        n = len(ranges)
        tps = sorted(ranges)
        data = pa.table(
            {
                "source": [self.warehouse.pipeline_id] * n,
                "apply_id": pa.array([apply_id] * n, pa.int64()),
                "topic": [t for t, _ in tps],
                "partition": pa.array([p for _, p in tps], pa.int32()),
                "first_offset": pa.array([ranges[tp][0] for tp in tps], pa.int64()),
                "last_offset": pa.array([ranges[tp][1] for tp in tps], pa.int64()),
                "delivery_id": pa.array([delivery_id] * n, pa.int64()),
                "started_at_ms": pa.array([int(time.time() * 1000)] * n, pa.int64()),
            },
            schema=OFFSETS_SCHEMA,
        )
        self.warehouse.append(self.offsets_path, data, self.warehouse.commit_context(apply_id))
        self._pending = PendingApply(apply_id, dict(ranges))

    def completion(self, ranges: dict[TopicPartition, tuple[int, int]]) -> dict[str, int]:
        """The per-partition application transactions the completing commit carries:
        ``{app_id@topic#partition: next offset}``."""
        return {self._app(tp): last + 1 for tp, (_, last) in sorted(ranges.items())}

    def completed(self, apply_id: int, ranges: dict[TopicPartition, tuple[int, int]]) -> None:
        """Note (in the cache) that ``apply_id`` completed with ``ranges``."""
        self._completed = apply_id
        self._pending = None
        for tp, (_, last) in ranges.items():
            self._next[tp] = max(self._next.get(tp, 0), last + 1)


class IncompleteApply(ApplyError):
    """A delivery holds part of a pending apply's records but not all of them.

    Raised so the records are not applied in pieces; the pipeline re-reads the pending
    ranges from Kafka at start-up (:meth:`OffsetLedger.pending`), which cannot end so.
    """

    def __init__(self, pending: PendingApply) -> None:
        super().__init__(
            f"apply {pending.apply_id} was interrupted and this micro-batch holds only part of "
            f"its records ({pending.describe()}); restart the pipeline: it finishes the "
            "interrupted apply from Kafka before reading on",
            Code.INCOMPLETE_APPLY,
        )
        self.pending = pending

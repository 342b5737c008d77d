"""Apply one micro-batch of decoded events to the warehouse.

The same code serves the streaming job (``foreachBatch``) and ``cdcflow apply``. A
delivery's records that the warehouse already applied are skipped (idempotence on Kafka
offsets, :mod:`cdcflow.apply.offsets`); the rest is one *apply* with the warehouse's own
id. Order of writes, each idempotent per ``(pipeline, apply id)``:

1. the intent: the apply's offset ranges (``_cdcflow/offsets``);
2. decoder state, then (transaction-consistent mode) the open transactions held back;
3. the changelog (every decoded event, with its origin);
4. per target table: schema changes, one merge per mirror (apply failures become dead
   letters, other tables go on); then the tombstones of every mirror, in one commit;
5. dead letters (decode and apply failures, with raw bytes or event JSON);
6. a progress row: last source sequence and time (heartbeats count), rows changed, lag;
7. the completion: the apply's accounting row per Kafka partition (records, events,
   skipped, dead), committed with the partitions' next offsets;
8. maintenance of the tables it touched, when due, within its time budget
   (:mod:`cdcflow.sinks.maintenance`: compaction and vacuum; no data changes).

Every record of the batch is accounted for: ``records = records with events + joined +
skipped + dead`` (``joined``: an update half whose change its partner's event carries).

This module is the script of those writes; the pieces are elsewhere: which table each
event goes to (:mod:`cdcflow.transform.router`), one table's apply and its faults
(:mod:`cdcflow.apply.tables`) under its schema policy (:mod:`cdcflow.apply.schema_policy`,
recorded by :mod:`cdcflow.apply.schema_log`), the rows of the bookkeeping tables
(:mod:`cdcflow.apply.accounting`), the offsets (:mod:`cdcflow.apply.offsets`) and the
held transactions (:mod:`cdcflow.apply.transactions`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.apply.accounting import (
    BatchReport,
    batches_rows,
    changelog_rows,
    combined,
    dead_letters,
    per_record,
    progress_row,
    records_of,
    rejected_events,
    shaped_out,
)
from cdcflow.apply.offsets import IncompleteApply, OffsetLedger, TopicPartition, offset_ranges
from cdcflow.apply.options import TableOptions
from cdcflow.apply.schema_log import SchemaLog
from cdcflow.apply.schema_policy import SchemaStop, stored_types
from cdcflow.apply.tables import TableApplier, TableFault
from cdcflow.apply.transactions import (
    TransactionPolicy,
    batch_clock_ms,
    load_pending,
    save_pending,
    split_transactions,
)
from cdcflow.errors import ApplyError, Code, SkipReason
from cdcflow.event_schema import KIND_DEAD, KIND_EVENT, KIND_SKIP
from cdcflow.sinks.maintenance import (
    ExpiryClock,
    Maintainer,
    MaintenancePolicy,
    log_retention_properties,
)
from cdcflow.sinks.mirror import MirrorResult
from cdcflow.sinks.system_tables import (
    BATCHES,
    CHANGELOG,
    DEAD_LETTERS,
    DECODER_STATE,
    DECODER_STATE_SCHEMA,
    OFFSETS,
    PROGRESS,
    SCHEMA_CHANGES,
    TOMBSTONES,
)
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse, arrow_schema
from cdcflow.transform.router import (
    TABLE_OPS,
    Router,
    declarations_on_every_row,
    declared_types,
    parts_by_target,
    split_excluded,
)
from cdcflow.transform.shape import Shaped, shape, shapes
from cdcflow.transform.shards import refuse_collisions

__all__ = ["BatchApplier", "IncompleteApply"]

log = logging.getLogger(__name__)

#: at most one tombstone purge per this many seconds of a running applier
_PURGE_EVERY_S = 3600.0

#: the system tables an apply writes, maintained like the mirrors
_SYSTEM = (
    BATCHES,
    CHANGELOG,
    DEAD_LETTERS,
    DECODER_STATE,
    OFFSETS,
    PROGRESS,
    SCHEMA_CHANGES,
    TOMBSTONES,
)


@dataclass(slots=True)
class _Routed:
    """A batch's events after routing and shaping (:meth:`BatchApplier._routed`).

    Attributes:
        ready: the events to record and apply, in the batch's order.
        parts: target -> its events to apply, in target order.
        options: target -> its options.
        excluded: the events of tables the router leaves out.
        shaped: target -> what shaping gave, for the targets it shapes.
    """

    ready: pa.Table
    parts: list[tuple[str, pa.Table]]
    options: dict[str, TableOptions]
    excluded: pa.Table
    shaped: list[tuple[str, Shaped]]

    @property
    def removed(self) -> pa.Table:
        """The events routing and shaping took out (:func:`shaped_out`)."""
        empty = self.excluded.slice(0, 0)
        filtered = [out.filtered for _, out in self.shaped]
        refused = [out.refused for _, out in self.shaped]
        return shaped_out(
            self.excluded,
            pa.concat_tables(filtered) if filtered else empty,
            pa.concat_tables(refused) if refused else empty,
        )


def _only(events: pa.Table, kind: pa.ChunkedArray, value: str, all_events: bool) -> pa.Table:
    """The rows of one kind (an empty table without scanning when every row is an event)."""
    if all_events:
        return events.slice(0, 0)
    return events.filter(pc.equal(kind, value))


class BatchApplier:
    """Applies :data:`~cdcflow.decode.batches.EVENT_SCHEMA` batches to a warehouse.

    Args:
        warehouse: the pipeline's Delta tables.
        router: source -> target naming.
        changelog: also append every event to ``_cdcflow/changelog`` (default on).
        tables: target name -> :class:`~cdcflow.apply.options.TableOptions` (default:
            every table a type-1 mirror that evolves its schema).
        tombstone_retention_hours: tombstones older than this are purged (at most once an
            hour of a running applier); ``0`` keeps them forever.
        transactions: apply only whole source transactions (see
            :mod:`cdcflow.apply.transactions`); ``None`` (default) applies every event at once.
        table_budget_s: a table whose apply of one batch takes longer is stopped after it
            (its changes of that batch are kept); ``0`` for no budget.
        fence: called before an apply's first commit and before its completion; raises
            (e.g. ``LeaseLost``) when this process may no longer write the warehouse.
        parallel_tables: how many tables of a micro-batch are applied at once, on a
            thread pool of the driver (delta-rs releases the GIL while it merges); ``1``
            applies them one after another.
        maintenance: when the tables an apply touched are compacted and vacuumed
            (default :class:`~cdcflow.sinks.maintenance.MaintenancePolicy`).
        expiry_clock: shared by the appliers of a pipeline's sources, so the warehouse's
            bookkeeping rows are expired by one of them at a time (default: its own).
    """

    def __init__(
        self,
        warehouse: DeltaWarehouse,
        router: Router | None = None,
        changelog: bool = True,
        tables: Callable[[str], TableOptions] | None = None,
        tombstone_retention_hours: float = 168.0,
        transactions: TransactionPolicy | None = None,
        table_budget_s: float = 600.0,
        fence: Callable[[], None] | None = None,
        parallel_tables: int = 4,
        maintenance: MaintenancePolicy | None = None,
        expiry_clock: ExpiryClock | None = None,
    ):
        self.warehouse = warehouse
        self.router = router or Router()
        self.changelog = changelog
        self.tables = tables or (lambda _target: TableOptions())
        self.tombstone_retention_hours = tombstone_retention_hours
        self.transactions = transactions
        self.fence = fence or (lambda: None)
        self.ledger = OffsetLedger(warehouse)
        self.schema_log = SchemaLog(warehouse)
        self.table_applier = TableApplier(warehouse, self.schema_log, table_budget_s)
        self._last_purge: float | None = None
        self.parallel_tables = max(1, parallel_tables)
        self.maintainer = Maintainer(warehouse, maintenance, expiry_clock)
        hours = self.maintainer.policy.log_retention_hours
        if hours is not None:  # the tables this applier creates keep that much log
            warehouse.table_configuration.update(log_retention_properties(hours))
        self._pool: ThreadPoolExecutor | None = None

    @property
    def table_budget_s(self) -> float:
        """Seconds one table's apply of a batch may take before the table stops."""
        return self.table_applier.table_budget_s

    def apply(
        self,
        events: pa.Table,
        delivery_id: int | None = None,
        on_durable: Callable[[], None] | None = None,
        records_behind: Callable[[dict[TopicPartition, tuple[int, int]]], int | None] | None = None,
    ) -> BatchReport:
        """Apply the records of one delivery (a micro-batch) that the warehouse lacks.

        Idempotent on Kafka offsets, not on the delivery: records below their partition's
        next offset in the warehouse (:class:`~cdcflow.apply.offsets.OffsetLedger`) are
        skipped, whatever ``delivery_id`` carries them, so a replayed, re-cut or re-numbered
        micro-batch (a deleted checkpoint) applies each record once. An apply that a crash
        interrupted is finished first, under its own id, with exactly its records.

        Args:
            events: :data:`~cdcflow.decode.batches.EVENT_SCHEMA` rows of the delivery.
            delivery_id: Spark's micro-batch id (recorded, never trusted).
            on_durable: called once no record of the delivery can be lost any more if
                the process dies: each is applied already or covered by the intent of
                the apply now running (finished from Kafka at the next start, see
                :meth:`~cdcflow.apply.offsets.OffsetLedger.pending`). The pipeline lets
                Spark go on to the next micro-batch from there (decision 32). Called
                before the tables are written; not called when the apply fails first.
            records_behind: given an apply's offset ranges, the records between their ends
                and the log ends (``None``: not known), recorded in ``_cdcflow/progress``.

        Returns:
            The report of what was applied (``batch_id`` is the warehouse's apply id;
            ``replayed``: records of the delivery applied before).

        Raises:
            IncompleteApply: the delivery holds part, not all, of an interrupted apply.
            StorageError (or a deltalake exception / OSError): storage failures; the batch
                should be retried.
        """
        ledger = self.ledger
        self.fence()
        reports: list[BatchReport] = []
        applied_rows = 0
        ranges = offset_ranges(events)
        pending = ledger.pending()
        if pending is not None:
            part = pending.select(events)
            if part.num_rows:
                if not pending.covered_by(part):
                    raise IncompleteApply(pending)
                reports.append(self._apply(part, pending.apply_id, delivery_id, pending.ranges))
                applied_rows += part.num_rows
        fresh = ledger.unapplied(events, ranges)
        if fresh.num_rows:
            if fresh is not events:
                ranges = offset_ranges(fresh)
            apply_id = ledger.completed_id() + 1
            ledger.begin(apply_id, ranges, delivery_id)
            if on_durable is not None:
                on_durable()
            reports.append(self._apply(fresh, apply_id, delivery_id, ranges, records_behind))
            applied_rows += fresh.num_rows
        elif on_durable is not None:
            on_durable()
        report = combined(reports, delivery_id, ledger.completed_id())
        if applied_rows < events.num_rows:  # some records were applied before
            report.replayed = records_of(events).num_rows - report.records
        return report

    def _apply(
        self,
        events: pa.Table,
        batch_id: int,
        delivery_id: int | None,
        ranges: dict[TopicPartition, tuple[int, int]],
        records_behind: Callable[[dict[TopicPartition, tuple[int, int]]], int | None] | None = None,
    ) -> BatchReport:
        """Apply ``events`` as apply ``batch_id`` (its intent already recorded): the
        ordered writes of the module docstring, steps 2 to 7."""
        started = time.perf_counter()
        report = BatchReport(
            batch_id=batch_id,
            delivery_id=delivery_id,
            ranges=dict(ranges),
            records_behind=None if records_behind is None else records_behind(ranges),
        )
        wh = self.warehouse
        # what every commit of the apply carries: its transaction and offset ranges
        commit = wh.commit_context(
            batch_id,
            {
                "cdcflow.apply_id": str(batch_id),
                "cdcflow.offsets": ",".join(
                    f"{t}#{p}:{a}-{b}" for (t, p), (a, b) in sorted(ranges.items())
                ),
            },
        )
        kind = events["kind"]
        is_event = pc.equal(kind, KIND_EVENT)
        n_events = pc.sum(pc.cast(is_event, pa.int64())).as_py() or 0
        all_events = n_events == events.num_rows
        rows = events if all_events else events.filter(is_event)
        dead = _only(events, kind, KIND_DEAD, all_events)
        skips = _only(events, kind, KIND_SKIP, all_events)
        report.events = n_events
        report.skipped.update(skips["reason"].to_pylist())
        # heartbeats, transaction markers, DDL and messages are kept in the changelog but
        # change no table: their records count as skipped on purpose, by op
        markers = rows.filter(pc.invert(pc.is_in(rows["op"], TABLE_OPS)))
        report.skipped.update(SkipReason(op.upper()) for op in markers["op"].to_pylist())
        report.dead_letters.update(dead["reason"].to_pylist())
        letters = [dead_letters(dead, batch_id, "decode", dead["reason"], dead["error"])]

        # 2. decoder state, then the open transactions held back
        self._persist_decoder_state(rows, commit)
        ready = rows
        held = rows.slice(0, 0)
        if self.transactions is not None:
            # first commit of the batch after the decoder state: what waits for the next one
            ready, held, report.transactions = self._whole_transactions(rows, commit)
        # routing and shaping: tables left out, rows filtered, columns added and dropped
        ready, parts, options, removed = self._route(ready, batch_id, report, letters)
        if held.num_rows:
            # this apply's records held for their transaction are accounted for now, as
            # their shaping will take them (the apply that releases them counts only its
            # report's skips and dead letters): decided by shaping them once more here
            removed = pa.concat_tables([removed, self._routed(held).removed])
        # 3. the changelog
        if self.changelog and ready.num_rows:
            wh.append(wh.system_path(CHANGELOG), changelog_rows(ready, batch_id), commit)

        # 4. per target table (a table's failure is its events' dead letters)
        self.schema_log.start()  # re-read once a batch: `cdcflow resume` may have written
        stopped = self.schema_log.stopped()
        wh.tombstones.begin()
        for (target, part), (outcome, collided) in zip(
            parts, self._apply_tables(parts, options, commit, stopped), strict=True
        ):
            letters.extend(
                self._account_table(target, part, options[target], batch_id, outcome, report)
            )
            if collided is not None:
                letters.append(self._collisions(target, collided, batch_id, report))
        wh.tombstones.flush(commit)  # every mirror's deleted keys, in one commit
        self.schema_log.write(commit)
        self._maybe_purge_tombstones()
        # 5. dead letters, after the mirrors so apply failures land in the same commit
        wh.append(wh.system_path(DEAD_LETTERS), pa.concat_tables(letters), commit)
        # 6. progress
        records = per_record(events, removed)
        progress = progress_row(rows, report, batch_id, wh.pipeline_id, report.records_behind)
        wh.append(wh.system_path(PROGRESS), progress, commit)
        if progress.num_rows:
            report.lag_ms = progress["lag_ms"][0].as_py()
        # 7. the completion: last, with the next offset of every partition the apply covered
        self.fence()
        accounting = batches_rows(records, batch_id, delivery_id, wh.pipeline_id)
        wh.append(
            self.ledger.batches_path,
            accounting,
            commit.with_transactions(self.ledger.completion(ranges)),
        )
        self.ledger.completed(batch_id, ranges)
        report.records = records.num_rows
        report.seconds = time.perf_counter() - started
        # 8. maintenance, after the apply is complete and within its own time budget
        touched = [m.path for m in report.mirrors] + [wh.system_path(n) for n in _SYSTEM]
        own = {m.path: options[m.target].maintenance for m in report.mirrors}
        overrides = {path: o.overrides() for path, o in own.items() if o is not None}
        done = self.maintainer.after_batch(touched, overrides)
        report.maintenance = [m.describe() for m in done]
        report.maintenance += [e.describe() for e in self.maintainer.expire_due()]
        return report

    def _route(
        self, ready: pa.Table, batch_id: int, report: BatchReport, letters: list[pa.Table]
    ) -> tuple[pa.Table, list[tuple[str, pa.Table]], dict[str, TableOptions], pa.Table]:
        """The events to record and apply, their parts per target, each target's options
        (resolved once for the batch), and the events taken out (:func:`shaped_out`),
        after the source's routing and each target's shaping (:meth:`_routed`).

        Events of tables left out are counted as skipped (``TABLE_EXCLUDED``), rows a
        filter leaves out too (``ROW_FILTERED``); events a target cannot shape become
        dead letters in ``letters``. The events keep their order.
        """
        routed = self._routed(ready)
        changes = pc.sum(pc.cast(pc.is_in(routed.excluded["op"], TABLE_OPS), pa.int64())).as_py()
        if changes:
            report.skipped[SkipReason.TABLE_EXCLUDED] += changes
        for target, out in routed.shaped:
            if out.filtered.num_rows:
                report.skipped[SkipReason.ROW_FILTERED] += out.filtered.num_rows
            if out.refused.num_rows:
                report.dead_letters[Code.EXPRESSION_FAILED] += out.refused.num_rows
                letters.append(
                    dead_letters(
                        out.refused,
                        batch_id,
                        "apply",
                        Code.EXPRESSION_FAILED,
                        pa.chunked_array([pa.array(out.messages, pa.string())]),
                        target=target,
                    )
                )
        return routed.ready, routed.parts, routed.options, routed.removed

    def _routed(self, ready: pa.Table) -> _Routed:
        """``ready`` routed and shaped (:mod:`cdcflow.transform.router`,
        :mod:`cdcflow.transform.shape`), counting and writing nothing."""
        ready, excluded = split_excluded(ready, self.router)
        grouped = parts_by_target(ready, self.router)
        options = {p.target: self.tables(p.target) for p in grouped}
        shard_columns = {p.target: self.router.shard_column(p.target) for p in grouped}
        to_shape = {t for t, o in options.items() if shapes(o.shaping, shard_columns[t])}
        if not to_shape:
            return _Routed(ready, [(p.target, p.rows) for p in grouped], options, excluded, [])
        parts: list[tuple[str, pa.Table]] = []
        shaped: list[tuple[str, Shaped]] = []
        positions: list[np.ndarray] = []
        for p in grouped:
            if p.target not in to_shape:
                parts.append((p.target, p.rows))
                positions.append(p.positions)
                continue
            table = self.warehouse.open(self.warehouse.table_path(p.target))
            stored = stored_types(None if table is None else arrow_schema(table))
            out = shape(p.rows, options[p.target].shaping, shard_columns[p.target], stored)
            parts.append((p.target, out.rows))
            shaped.append((p.target, out))
            kept = p.positions
            if out.kept is not None:
                kept = kept[out.kept.to_numpy(zero_copy_only=False)]
            positions.append(kept)
        # the events of no part (markers, messages) and the parts' shaped events, back in
        # the batch's order
        in_parts = np.zeros(ready.num_rows, dtype=bool)
        for p in grouped:
            in_parts[p.positions] = True
        others = np.flatnonzero(~in_parts)
        every = pa.concat_tables([ready.take(pa.array(others)), *(part for _, part in parts)])
        order = np.argsort(np.concatenate([others, *positions]), kind="stable")
        return _Routed(every.take(pa.array(order)), parts, options, excluded, shaped)

    def _collisions(
        self, target: str, collided: tuple[pa.Table, list[str]], batch_id: int, report: BatchReport
    ) -> pa.Table:
        """The dead letters of a sharded target's changes to keys another shard holds."""
        rows, messages = collided
        report.dead_letters[Code.SHARD_KEY_COLLISION] += rows.num_rows
        log.warning(
            "table %s: %d change(s) refused, their keys belong to another shard: %s",
            target,
            rows.num_rows,
            messages[0],
        )
        return dead_letters(
            rows,
            batch_id,
            "apply",
            Code.SHARD_KEY_COLLISION,
            pa.chunked_array([pa.array(messages, pa.string())]),
            target,
        )

    def _apply_tables(
        self,
        parts: list[tuple[str, pa.Table]],
        options: dict[str, TableOptions],
        commit: CommitContext,
        stopped: dict[str, str],
    ) -> list[tuple[MirrorResult | ApplyError, tuple[pa.Table, list[str]] | None]]:
        """Apply each target's part, up to :attr:`parallel_tables` at once; per part, in
        order, what its apply gave: the mirror's result, or the ``ApplyError`` that
        stopped it (its events become dead letters); and a sharded target's changes
        refused for keys another shard holds (``None``: none).

        Every table's commit carries the apply's application transaction, so which ones
        committed before a crash does not matter: the apply's replay skips those and
        applies the rest. Any other failure (a ``StorageError`` of the whole volume or of
        a system table) is raised once every table started has finished, the first in
        target order.
        """
        if self.parallel_tables <= 1 or len(parts) <= 1:
            return [self._apply_table(t, p, options[t], commit, stopped) for t, p in parts]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.parallel_tables, thread_name_prefix="cdcflow-apply"
            )
        futures = [
            self._pool.submit(self._apply_table, t, p, options[t], commit, stopped)
            for t, p in parts
        ]
        wait(futures)
        return [f.result() for f in futures]

    def _apply_table(
        self,
        target: str,
        part: pa.Table,
        options: TableOptions,
        commit: CommitContext,
        stopped: dict[str, str],
    ) -> tuple[MirrorResult | ApplyError, tuple[pa.Table, list[str]] | None]:
        """Apply one target's part (:class:`~cdcflow.apply.tables.TableApplier`); the
        ``ApplyError`` that stopped it is returned, not raised, beside the changes a
        sharded target refused (runs on a worker thread: touches nothing of the batch
        but the table's own Delta tables)."""
        collided = None
        try:
            if target in stopped:
                raise ApplyError(
                    f"table {target} is stopped: {stopped[target]} "
                    "(see _cdcflow/schema_changes; docs/semantics.md#schema-changes)",
                    Code.TABLE_STOPPED,
                )
            shard_column = self.router.shard_column(target)
            if shard_column is not None:
                types = declared_types(part)
                part, refused, messages = refuse_collisions(
                    self.warehouse, target, part, shard_column, types
                )
                if refused.num_rows:
                    collided = (refused, messages)
            return self.table_applier.apply(target, part, commit, options), collided
        except ApplyError as exc:
            return exc, collided

    def _account_table(
        self,
        target: str,
        part: pa.Table,
        options: TableOptions,
        batch_id: int,
        outcome: MirrorResult | ApplyError,
        report: BatchReport,
    ) -> list[pa.Table]:
        """Count one target's apply in ``report``; its dead letters: the events it
        refused, or all of them when it failed or stopped (recorded as a stop)."""
        if isinstance(outcome, ApplyError):
            exc = outcome
            log.error("table %s: batch %s not applied: %s", target, batch_id, exc)
            if isinstance(exc, SchemaStop | TableFault):
                self.schema_log.record(
                    target,
                    batch_id,
                    "stop",
                    options.schema_changes,
                    exc.first,
                    message=exc.message,
                    applied=False,
                )
            report.dead_letters[exc.code] += part.num_rows
            return [dead_letters(part, batch_id, "apply", exc.code, exc.message, target)]
        mirror = outcome
        report.mirrors.append(mirror)
        letters = [
            dead_letters(rejected_events(part, key, code), batch_id, "apply", code, why, target)
            for key, code, why in mirror.rejected
        ]
        for letter in letters:
            report.dead_letters.update(letter["code"].to_pylist())
        return letters

    def _whole_transactions(
        self, rows: pa.Table, commit: CommitContext
    ) -> tuple[pa.Table, pa.Table, dict[str, int]]:
        """The events to apply now (whole transactions), the events of ``rows`` held for
        a later batch, and the split's metrics; the events of open transactions are saved
        for the next batch (in a commit carrying ``commit``)."""
        wh = self.warehouse
        batch_id = commit.version
        assert self.transactions is not None
        now = batch_clock_ms(wh, wh.pipeline_id, batch_id, int(time.time() * 1000))
        held_before = load_pending(wh, wh.pipeline_id, batch_id)
        # rows leave the batch in any subset: each must carry its table's declaration
        rows = declarations_on_every_row(rows)
        split = split_transactions(rows, held_before, now, batch_id, self.transactions)
        save_pending(wh, wh.pipeline_id, split.held, commit, now_ms=now)
        metrics = {
            "complete": split.complete,
            "released_open": split.released_open,
            "held": split.held_transactions,
            "held_events": split.held.num_rows,
            "max_wait_ms": split.max_wait_ms,
        }
        own = pc.equal(split.held["held_batch_id"], batch_id)  # not those held before
        held = split.held.filter(own).select(rows.schema.names).cast(rows.schema)
        return split.ready.select(rows.schema.names).cast(rows.schema), held, metrics

    def _persist_decoder_state(self, rows: pa.Table, commit: CommitContext) -> None:
        """Append what the decoders learned in this batch (before anything else uses it),
        in a commit carrying ``commit``."""
        batch_id = commit.version
        learned = rows.filter(pc.is_valid(rows["state"]))["state"].to_pylist()
        items = [orjson.dumps(i).decode() for lst in learned for i in orjson.loads(lst)]
        if not items:
            return
        data = pa.table(
            {
                "source": [self.warehouse.pipeline_id] * len(items),
                "batch_id": pa.array([batch_id] * len(items), pa.int64()),
                "position": pa.array(range(len(items)), pa.int64()),
                "item": items,
            },
            schema=DECODER_STATE_SCHEMA,
        )
        self.warehouse.append(self.warehouse.system_path(DECODER_STATE), data, commit)

    def _maybe_purge_tombstones(self) -> None:
        now = time.monotonic()
        if self.tombstone_retention_hours <= 0:
            return
        if self._last_purge is not None and now - self._last_purge < _PURGE_EVERY_S:
            return
        self._last_purge = now
        purged = self.warehouse.tombstones.purge(self.tombstone_retention_hours)
        if purged:
            log.info("purged %d tombstones older than %s h", purged, self.tombstone_retention_hours)

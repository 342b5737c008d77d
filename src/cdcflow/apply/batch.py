"""Apply one micro-batch of decoded events to the warehouse.

The same code serves the streaming job (``foreachBatch``) and ``cdcflow apply``. A
delivery's records that the warehouse already applied are skipped (idempotence on Kafka
offsets, :mod:`cdcflow.apply.offsets`); the rest is one *apply* with the warehouse's own
id. Order of writes, each idempotent per ``(pipeline, apply id)``:

1. the intent: the apply's offset ranges (``_cdcflow/offsets``);
2. decoder state, then (transaction-consistent mode) the open transactions held back;
3. the changelog (every decoded event, with its origin);
4. per target table: schema changes, one merge per mirror, its tombstones (apply failures
   become dead letters, other tables go on);
5. dead letters (decode and apply failures, with raw bytes or event JSON);
6. a progress row: last source sequence and time (heartbeats count), rows changed, lag;
7. the completion: the apply's accounting row per Kafka partition (records, events,
   skipped, dead), committed with the partitions' next offsets.

Every record of the batch is accounted for: ``records = records with events + joined +
skipped + dead`` (``joined``: an update half whose change its partner's event carries).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdcflow.apply.ddl import column_renames
from cdcflow.apply.netchange import net_change
from cdcflow.apply.offsets import IncompleteApply, OffsetLedger, TopicPartition, offset_ranges
from cdcflow.apply.options import TableOptions
from cdcflow.apply.prepare import drop_null_updates, with_sequence_by
from cdcflow.apply.schema import plan_schema
from cdcflow.apply.transactions import (
    TransactionPolicy,
    batch_clock_ms,
    load_pending,
    save_pending,
    split_transactions,
)
from cdcflow.errors import ApplyError, Code, LeaseHeld
from cdcflow.event_schema import KIND_DEAD, KIND_EVENT, KIND_JOINED, KIND_SKIP
from cdcflow.images import logical_from_arrow
from cdcflow.model import Op
from cdcflow.sinks.delta import BOOKKEEPING_COLUMNS, DeltaWarehouse, MirrorResult, arrow_schema
from cdcflow.sinks.faults import GLOBAL_KINDS, storage_error
from cdcflow.sinks.history import SYSTEM_COLUMNS as HISTORY_SYSTEM_COLUMNS
from cdcflow.sinks.history import apply_history
from cdcflow.sinks.system_tables import (
    BATCHES_SCHEMA,
    CHANGELOG,
    CHANGELOG_COLUMNS,
    DEAD_LETTER_SCHEMA,
    DEAD_LETTERS,
    DECODER_STATE,
    DECODER_STATE_SCHEMA,
    PROGRESS,
    PROGRESS_SCHEMA,
    SCHEMA_CHANGES,
    SCHEMA_CHANGES_SCHEMA,
)

__all__ = ["BatchApplier", "BatchReport", "Router", "TableFault"]

log = logging.getLogger(__name__)

_TABLE_OPS = pa.array(
    [Op.INSERT.value, Op.UPDATE.value, Op.DELETE.value, Op.SNAPSHOT.value, Op.TRUNCATE.value]
)
_IMAGE_OPS = pa.array([Op.INSERT.value, Op.UPDATE.value, Op.SNAPSHOT.value])
_ROW_CHANGE_OPS = pa.array([*_IMAGE_OPS.to_pylist(), Op.DELETE.value])
#: what a target table's part of a batch holds: its row changes, truncates and DDL
_ROUTED_OPS = pa.array([*_TABLE_OPS.to_pylist(), Op.DDL.value])
_BOOKKEEPING = (*BOOKKEEPING_COLUMNS, *HISTORY_SYSTEM_COLUMNS)
#: at most one tombstone purge per this many seconds of a running applier
_PURGE_EVERY_S = 3600.0


class SchemaStop(ApplyError):
    """A schema change the table's policy refuses: the table stops (others go on)."""

    code = Code.SCHEMA_CHANGE

    def __init__(self, message: str, first: dict[str, Any] | None = None) -> None:
        super().__init__(message, Code.SCHEMA_CHANGE)
        self.first = first or {}


class TableFault(ApplyError):
    """A table's own Delta table failed (damaged log, permission denied, a failed apply):
    the table stops (others go on); the message names the table, its path and the fix."""

    code = Code.TABLE_FAULT

    def __init__(self, message: str, first: dict[str, Any] | None = None) -> None:
        super().__init__(message, Code.TABLE_FAULT)
        self.first = first or {}


class Router:
    """Source table -> target table name.

    Args:
        template: ``str.format`` template over ``database``, ``schema``, ``table``,
            ``format``; empty parts and the dots around them are dropped. Default
            ``"{database}.{schema}.{table}"`` (``inventory.public.customers``; MySQL
            sources without a schema give ``inventory.customers``).
    """

    def __init__(self, template: str = "{database}.{schema}.{table}") -> None:
        self.template = template

    def target(self, fmt: str, database: str, schema: str, table: str) -> str:
        name = self.template.format(
            format=fmt or "", database=database or "", schema=schema or "", table=table or ""
        )
        return ".".join(p for p in name.split(".") if p)


@dataclass(slots=True)
class BatchReport:
    """Counts for one applied batch."""

    batch_id: int  # the warehouse's apply id (the last one, when a delivery finished two)
    delivery_id: int | None = None  # Spark's micro-batch id
    replayed: int = 0  # records of the delivery that were applied before (skipped)
    records: int = 0
    events: int = 0
    skipped: Counter = field(default_factory=Counter)
    dead_letters: Counter = field(default_factory=Counter)
    mirrors: list[MirrorResult] = field(default_factory=list)
    seconds: float = 0.0
    #: transaction-consistent apply only: complete, released_open, held, held_events,
    #: max_wait_ms (see :class:`~cdcflow.apply.transactions.TransactionSplit`)
    transactions: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "delivery_id": self.delivery_id,
            "replayed": self.replayed,
            "records": self.records,
            "events": self.events,
            "skipped": dict(self.skipped),
            "dead_letters": dict(self.dead_letters),
            "tables": {
                m.target: {
                    "upserts": m.upserts,
                    "deletes": m.deletes,
                    "dropped_by_guard": m.dropped_by_guard,
                    "truncated": m.truncated,
                    "replayed": m.skipped_replay,
                }
                for m in self.mirrors
            },
            "transactions": dict(self.transactions),
            "seconds": round(self.seconds, 3),
        }


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
    ):
        self.warehouse = warehouse
        self.router = router or Router()
        self.changelog = changelog
        self.tables = tables or (lambda _target: TableOptions())
        self.tombstone_retention_hours = tombstone_retention_hours
        self.transactions = transactions
        self.table_budget_s = table_budget_s
        self.fence = fence or (lambda: None)
        self.ledger = OffsetLedger(warehouse)
        self._last_purge: float | None = None
        self._schema_rows: list[dict[str, Any]] = []
        self._schema_log: pa.Table | None = None

    def apply(
        self,
        events: pa.Table,
        delivery_id: int | None = None,
        on_durable: Callable[[], None] | None = None,
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

        Returns:
            The report of what was applied (``batch_id`` is the warehouse's apply id;
            ``replayed``: records of the delivery applied before).

        Raises:
            IncompleteApply: the delivery holds part, not all, of an interrupted apply.
            deltalake exceptions / OSError: storage failures; the batch should be retried.
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
            reports.append(self._apply(fresh, apply_id, delivery_id, ranges))
            applied_rows += fresh.num_rows
        elif on_durable is not None:
            on_durable()
        report = _combined(reports, delivery_id, ledger.completed_id())
        if applied_rows < events.num_rows:  # some records were applied before
            report.replayed = _records_of(events).num_rows - report.records
        return report

    def _apply(
        self,
        events: pa.Table,
        batch_id: int,
        delivery_id: int | None,
        ranges: dict[TopicPartition, tuple[int, int]],
    ) -> BatchReport:
        """Apply ``events`` as apply ``batch_id`` (its intent already recorded)."""
        started = time.perf_counter()
        report = BatchReport(batch_id=batch_id, delivery_id=delivery_id)
        wh = self.warehouse
        wh.commit_metadata = {
            "cdcflow.apply_id": str(batch_id),
            "cdcflow.offsets": ",".join(
                f"{t}#{p}:{a}-{b}" for (t, p), (a, b) in sorted(ranges.items())
            ),
        }
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
        markers = rows.filter(pc.invert(pc.is_in(rows["op"], _TABLE_OPS)))
        report.skipped.update(op.upper() for op in markers["op"].to_pylist())
        report.dead_letters.update(dead["reason"].to_pylist())

        dead_letters = [self._decode_dead_letters(dead, batch_id)]
        self._persist_decoder_state(rows, batch_id)
        ready = rows
        if self.transactions is not None:
            # first commit of the batch after the decoder state: what waits for the next one
            ready, report.transactions = self._whole_transactions(rows, batch_id)
        if self.changelog and ready.num_rows:
            wh.append(wh.system_path(CHANGELOG), self._changelog(ready, batch_id), batch_id)

        self._schema_rows = []
        self._schema_log = None  # re-read once a batch: `cdcflow resume` may have written
        stopped = self._stopped_tables()
        for target, part in self._by_target(ready):
            options = self.tables(target)
            try:
                if target in stopped:
                    raise ApplyError(
                        f"table {target} is stopped: {stopped[target]} "
                        "(see _cdcflow/schema_changes; docs/semantics.md#schema-changes)",
                        Code.TABLE_STOPPED,
                    )
                mirror = self._apply_confined(target, part, batch_id, options)
                report.mirrors.append(mirror)
                if mirror.rejected:
                    rejected = self._rejected_dead_letters(part, target, mirror, batch_id)
                    dead_letters.append(rejected)
                    report.dead_letters.update(rejected["code"].to_pylist())
            except ApplyError as exc:
                log.error("table %s: batch %s not applied: %s", target, batch_id, exc)
                if isinstance(exc, SchemaStop | TableFault):
                    self._record_schema(
                        target,
                        batch_id,
                        "stop",
                        options,
                        exc.first,
                        message=exc.message,
                        applied=False,
                    )
                report.dead_letters[exc.code] += part.num_rows
                dead_letters.append(self._apply_dead_letters(part, target, exc, batch_id))
        if self._schema_rows:
            data = pa.Table.from_pylist(self._schema_rows, schema=SCHEMA_CHANGES_SCHEMA)
            wh.append(wh.system_path(SCHEMA_CHANGES), data, batch_id)
        self._maybe_purge_tombstones()
        all_dead = pa.concat_tables(dead_letters)
        # dead letters are written after the mirrors so apply failures land in the same commit
        wh.append(wh.system_path(DEAD_LETTERS), all_dead, batch_id)
        per_record = self._per_record(events)
        wh.append(wh.system_path(PROGRESS), self._progress(rows, report, batch_id), batch_id)
        # the completion: last, with the next offset of every partition the apply covered
        self.fence()
        accounting = self._accounting(per_record, rows, batch_id, delivery_id)
        wh.append(
            self.ledger.batches_path,
            accounting,
            batch_id,
            transactions=self.ledger.completion(ranges),
        )
        self.ledger.completed(batch_id, ranges)
        wh.commit_metadata = {}
        report.records = per_record.num_rows
        report.seconds = time.perf_counter() - started
        return report

    def _whole_transactions(self, rows: pa.Table, batch_id: int) -> tuple[pa.Table, dict]:
        """The events to apply now (whole transactions) and the split's metrics; the
        events of open transactions are saved for the next batch."""
        wh = self.warehouse
        assert self.transactions is not None
        now = batch_clock_ms(wh, wh.pipeline_id, batch_id, int(time.time() * 1000))
        held_before = load_pending(wh, wh.pipeline_id, batch_id)
        # rows leave the batch in any subset: each must carry its table's declaration
        rows = _declarations_on_every_row(rows)
        split = split_transactions(rows, held_before, now, batch_id, self.transactions)
        save_pending(wh, wh.pipeline_id, split.held, batch_id, now_ms=now)
        metrics = {
            "complete": split.complete,
            "released_open": split.released_open,
            "held": split.held_transactions,
            "held_events": split.held.num_rows,
            "max_wait_ms": split.max_wait_ms,
        }
        return split.ready.select(rows.schema.names).cast(rows.schema), metrics

    def _persist_decoder_state(self, rows: pa.Table, batch_id: int) -> None:
        """Append what the decoders learned in this batch (before anything else uses it)."""
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
        self.warehouse.append(self.warehouse.system_path(DECODER_STATE), data, batch_id)

    def _by_target(self, rows: pa.Table):
        """``(target, rows)`` per target table, for the row changes, truncates and DDL."""
        is_table_op = pc.and_(
            pc.is_in(rows["op"], _ROUTED_OPS),
            pc.invert(pc.equal(pc.fill_null(rows["table"], ""), "")),
        )
        if not pc.all(is_table_op).as_py():
            rows = rows.filter(is_table_op)
        if rows.num_rows == 0:
            return
        source = _source_ids(rows)
        by_target: dict[str, list[str]] = {}
        for combo in pc.unique(source).to_pylist():
            target = self.router.target(*combo.split("\x1f"))
            by_target.setdefault(target, []).append(combo)
        if len(by_target) == 1:
            yield next(iter(by_target)), rows
            return
        for target in sorted(by_target):
            yield target, rows.filter(pc.is_in(source, pa.array(by_target[target], pa.string())))

    # ------------------------------------------------------------------ pieces

    def _apply_confined(
        self, target: str, part: pa.Table, batch_id: int, options: TableOptions
    ) -> MirrorResult:
        """Apply one table's part, confining its storage faults and slowness to it.

        A fault of the table's own Delta table (damaged log, permission denied, any other
        failure of its apply before its commit) raises :class:`TableFault`: the table
        stops, the rest of the batch goes on. A failure after the table committed the
        batch is raised as is (its events are applied; the batch's replay skips it). A volume that refuses every write (disk full, read-only) and faults
        of ``_cdcflow`` system tables stop the run instead (``StorageError``). An apply
        that took longer than ``table_budget_s`` is kept, and the table stops after it.

        Raises:
            TableFault: the table's own Delta table failed; nothing of ``part`` applied
                after the failing write.
            StorageError: the fault is not the table's alone.
            ApplyError: from the apply itself (schema stop, ...).
        """
        path = self.warehouse.table_path(target)
        started = time.monotonic()
        try:
            mirror = self._apply_mirror(target, part, batch_id, options)
        except (ApplyError, IncompleteApply, LeaseHeld):
            raise
        except Exception as exc:
            self.warehouse.forget(path)
            if self._has_committed(path, batch_id):
                # the table holds this batch: the failure came after its commit, so its
                # events are applied and cannot be dead letters; the batch fails and its
                # replay skips the table
                raise
            fault = storage_error(exc, path, target)
            if fault.kind in GLOBAL_KINDS or fault.target is None:
                raise fault from exc
            if fault.kind == "other":  # not a storage error we know: keep the traceback
                log.error("table %s: apply failed", target, exc_info=exc)
            raise TableFault(
                f"{fault.message}; the table is stopped, other tables go on, and its events "
                f"are dead letters until `cdcflow resume --warehouse {self.warehouse.root} "
                f"{target}`",
                _origin(part, 0),
            ) from exc
        took_s = time.monotonic() - started
        if self.table_budget_s and took_s > self.table_budget_s:
            message = (
                f"the apply of batch {batch_id} took {took_s:.0f} s, over "
                f"apply.table_budget_s = {self.table_budget_s:g} s; its changes are applied, "
                "later ones are TABLE_STOPPED dead letters until `cdcflow resume "
                f"--warehouse {self.warehouse.root} {target}`"
            )
            log.error("table %s: stopped: %s", target, message)
            self._record_schema(
                target, batch_id, "stop", options, _origin(part, 0), message=message
            )
        return mirror

    def _has_committed(self, path: str, batch_id: int) -> bool:
        """Whether the table at ``path`` holds apply ``batch_id`` (``False`` if unreadable)."""
        try:
            return self.warehouse.committed(path, batch_id)
        except Exception:  # the fault itself may make the table unreadable
            return False

    def _apply_mirror(
        self, target: str, part: pa.Table, batch_id: int, options: TableOptions
    ) -> MirrorResult:
        if options.ignore_null_updates:
            part = drop_null_updates(part)
        if options.sequence_by:
            part = with_sequence_by(part, options.sequence_by)
        keys = part.filter(pc.is_valid(part["key"]))["key"]
        key_columns = list(orjson.loads(keys[0].as_py())) if len(keys) else []
        table = self.warehouse.open(self.warehouse.table_path(target))
        if not key_columns and table is None:
            # only a truncate (or DDL) for a table that does not exist yet: nothing to store,
            # but a truncate's watermark must block its older rows arriving later
            self.warehouse.append_tombstones(target, net_change(part), batch_id)
            return MirrorResult(target=target, path=self.warehouse.table_path(target))
        types, renames = self._evolve_schema(target, table, part, batch_id, options, key_columns)
        if options.mode == "history":
            return self._apply_history(target, part, types, key_columns, batch_id, options)
        full_row = _full_row_identity(part)
        if full_row:
            # the row is its own identity: match every stored column (NULL-safely), so a
            # row whose image left a NULL column out still matches only itself
            key_columns = list(types)
        net = net_change(part)
        result = self.warehouse.apply_mirror(
            target,
            net,
            types,
            key_columns,
            batch_id,
            soft_delete=options.soft_delete,
            full_row_identity=full_row,
        )
        self.warehouse.append_tombstones(target, net, batch_id)
        if renames:
            self.warehouse.copy_renamed_columns(target, renames)
        return result

    def _apply_history(
        self,
        target: str,
        part: pa.Table,
        types: dict[str, str],
        key_columns: list[str],
        batch_id: int,
        options: TableOptions,
    ) -> MirrorResult:
        """SCD type 2: versions instead of one row per key (see :mod:`cdcflow.sinks.history`)."""
        h = apply_history(
            self.warehouse, target, part, types, key_columns, batch_id, options.track_history
        )
        return MirrorResult(
            target=target,
            path=h.path,
            upserts=h.versions_opened + h.updated_in_place,
            deletes=h.versions_closed,
            skipped_replay=h.skipped_replay,
            metrics={
                "versions_opened": h.versions_opened,
                "versions_closed": h.versions_closed,
                "updated_in_place": h.updated_in_place,
                "versions_removed": h.versions_removed,
                "duplicates": h.duplicates,
                **h.metrics,
            },
            rejected=list(h.rejected),
        )

    # ------------------------------------------------------------------ schema changes

    def _evolve_schema(
        self,
        target: str,
        table: DeltaTable | None,
        part: pa.Table,
        batch_id: int,
        options: TableOptions,
        key_columns: list[str],
    ) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """The column types to store for ``target`` after its schema policy, and the
        ``(old, new)`` column renames whose values the caller copies after the merge.

        Raises:
            SchemaStop: the policy is ``fail`` and the batch changes the schema, or a
                declared type cannot be stored without loss.
        """
        declared_json = [c for c in pc.unique(part["columns"]).to_pylist() if c]
        declared = [orjson.loads(c) for c in declared_json]
        stored: dict[str, str] = {}
        if table is not None:
            stored = {
                f.name: logical_from_arrow(f.type)
                for f in arrow_schema(table)
                if f.name not in _BOOKKEEPING
            }
        full = part.filter(
            pc.and_(
                pc.is_in(part["op"], _IMAGE_OPS),
                pc.and_(
                    pc.is_valid(part["after"]), pc.invert(pc.fill_null(part["partial"], False))
                ),
            )
        )["after"]
        plan = plan_schema(
            stored,
            declared,
            full_afters=full if table is not None else None,
            dropped_before=self._dropped_columns(target),
            policy=options.schema_changes,
            key_columns=key_columns,
        )
        renames = self._renames(part, stored)
        if table is None or not (plan.changes or renames):
            return plan.types, []

        def first(column: str, type_: str | None = None) -> dict[str, Any]:
            for text, cols in zip(declared_json, declared, strict=True):
                if column in cols and (type_ is None or cols[column] == type_):
                    return _origin(part, pc.index(part["columns"], text).as_py())
            return _origin(part, 0)

        policy = options.schema_changes
        fresh_renames = [(o, n, at) for o, n, at in renames if n not in stored]
        declared_new: dict[str, str] = {}
        for old, new, _ in renames:
            if new in plan.added:
                declared_new[new] = plan.added.pop(new)
                plan.types.pop(new, None)
            if old in plan.dropped:
                plan.dropped.remove(old)
        if policy == "fail" and fresh_renames:
            old, new, at = fresh_renames[0]
            raise SchemaStop(
                f"schema_changes is 'fail' and column {old!r} was renamed to {new!r}; the table "
                f"is stopped, other tables go on. Fix: rename it in the table by hand (or set "
                f"schema_changes: evolve), then `cdcflow resume {target}`",
                at,
            )
        if plan.conflicts or (policy == "fail" and (plan.added or plan.widened or plan.dropped)):
            column, (old, new) = next(
                iter(
                    {
                        **plan.conflicts,
                        **plan.widened,
                        **{c: (None, t) for c, t in plan.added.items()},
                        **{c: (stored[c], None) for c in plan.dropped},
                    }.items()
                )
            )
            if column in plan.conflicts:
                why = f"column {column!r} is stored as {old} and now declared {new}, which it cannot hold without loss"
            else:
                why = f"schema_changes is 'fail' and column {column!r} changed ({old} -> {new})"
            raise SchemaStop(
                f"{why}; the table is stopped, other tables go on. Fix: alter the table by hand "
                f"(or set schema_changes: evolve), then `cdcflow resume {target}`",
                first(column, new),
            )
        applied = policy == "evolve"
        for column, t in plan.added.items():
            self._record_schema(
                target, batch_id, "add", options, first(column, t), column, None, t, applied
            )
        for column, (old, wider) in plan.widened.items():
            self._record_schema(
                target, batch_id, "widen", options, first(column), column, old, wider, applied
            )
        for column in plan.dropped:
            self._record_schema(
                target,
                batch_id,
                "drop",
                options,
                _origin(part, 0),
                column,
                stored[column],
                None,
                applied,
            )
        for column in plan.restored:
            self._record_schema(
                target,
                batch_id,
                "restore",
                options,
                first(column),
                column,
                None,
                stored[column],
                applied,
            )
        for old, new, at in fresh_renames:
            self._record_schema(
                target,
                batch_id,
                "rename",
                options,
                at,
                old,
                stored[old],
                stored[old],
                applied,
                message=f"{old} -> {new}",
            )
            self._record_schema(
                target, batch_id, "drop", options, at, old, stored[old], None, applied
            )
            if applied:
                plan.types[new] = declared_new.get(new, stored[old])
        if applied and plan.widened:
            self.warehouse.widen_columns(target, {c: w for c, (_, w) in plan.widened.items()})
        copies = [(o, n) for o, n, _ in renames if o in stored] if applied else []
        return plan.types, copies

    @staticmethod
    def _renames(part: pa.Table, stored: dict[str, str]) -> list[tuple[str, str, dict[str, Any]]]:
        """Column renames the batch's DDL states for stored columns: (old, new, origin)."""
        ddl = pc.equal(part["op"], Op.DDL.value)
        if not stored or not pc.any(ddl).as_py():
            return []
        out = []
        indices = pc.indices_nonzero(ddl).to_pylist()
        for i in indices:
            for old, new in column_renames(part["ddl"][i].as_py()):
                if old in stored:
                    out.append((old, new, _origin(part, i)))
        return out

    def _record_schema(
        self,
        target: str,
        batch_id: int,
        change: str,
        options: TableOptions,
        origin: dict[str, Any],
        column: str | None = None,
        old_type: str | None = None,
        new_type: str | None = None,
        applied: bool = True,
        message: str | None = None,
    ) -> None:
        self._schema_rows.append(
            {
                "target_table": target,
                "batch_id": batch_id,
                "change": change,
                "column": column,
                "old_type": old_type,
                "new_type": new_type,
                "policy": options.schema_changes,
                "applied": applied,
                "message": message,
                "recorded_at_ms": int(time.time() * 1000),
                **origin,
            }
        )

    def _schema_changes(self) -> pa.Table:
        if self._schema_log is None:
            self._schema_log = self.warehouse.read_system(SCHEMA_CHANGES, SCHEMA_CHANGES_SCHEMA)
        return self._schema_log

    def _last_records(self, on: str, undo: str, target: str | None = None) -> dict:
        """The latest ``on``/``undo`` record per target (and column), in record order.

        Returns ``{(target, column): message}`` for the pairs whose latest record is ``on``.
        Records are ordered by ``recorded_at_ms``; on a tie the ``undo`` one is later.
        """
        log_ = self._schema_changes()
        mask = pc.is_in(log_["change"], pa.array([on, undo]))
        if target is not None:
            mask = pc.and_(mask, pc.equal(log_["target_table"], target))
        rows = log_.filter(mask).to_pylist()
        rows.sort(key=lambda r: (r["recorded_at_ms"] or 0, r["change"] == undo))
        state: dict[tuple[str, str | None], str | None] = {}
        for r in rows:
            where = (r["target_table"], r["column"])
            state[where] = (r["message"] or on) if r["change"] == on else None
        return {w: m for w, m in state.items() if m is not None}

    def _stopped_tables(self) -> dict[str, str]:
        """Target -> reason, for tables whose last stop/resume record is a stop."""
        return {t: m for (t, _), m in self._last_records("stop", "resume").items()}

    def _dropped_columns(self, target: str) -> set[str]:
        """Columns of ``target`` whose last drop/restore record is a drop."""
        return {c for (_, c), _m in self._last_records("drop", "restore", target).items()}

    def _maybe_purge_tombstones(self) -> None:
        now = time.monotonic()
        if self.tombstone_retention_hours <= 0:
            return
        if self._last_purge is not None and now - self._last_purge < _PURGE_EVERY_S:
            return
        self._last_purge = now
        purged = self.warehouse.purge_tombstones(self.tombstone_retention_hours)
        if purged:
            log.info("purged %d tombstones older than %s h", purged, self.tombstone_retention_hours)

    @staticmethod
    def _changelog(rows: pa.Table, batch_id: int) -> pa.Table:
        out = rows.select(CHANGELOG_COLUMNS)
        return out.append_column("batch_id", pa.array([batch_id] * out.num_rows, pa.int64()))

    @staticmethod
    def _decode_dead_letters(dead: pa.Table, batch_id: int) -> pa.Table:
        n = dead.num_rows
        return pa.table(
            {
                "batch_id": pa.array([batch_id] * n, pa.int64()),
                "topic": dead["topic"],
                "partition": dead["partition"],
                "offset": dead["offset"],
                "format": dead["format"],
                "stage": pa.array(["decode"] * n, pa.string()),
                "code": dead["reason"],
                "message": dead["error"],
                "target_table": pa.nulls(n, pa.string()),
                "raw_key": dead["raw_key"],
                "raw_value": dead["raw_value"],
            },
            schema=DEAD_LETTER_SCHEMA,
        )

    def _rejected_dead_letters(
        self, part: pa.Table, target: str, mirror: MirrorResult, batch_id: int
    ) -> pa.Table:
        """Dead letters for the events of the ``(key, code, reason)`` the table refused.

        Key ``None`` stands for the row changes without a key; a ``MISSING_SEQ`` entry for
        the key's (key ``None``: all) events without a sequence, truncates included.
        """
        out = []
        for key, code, reason in mirror.rejected:
            if key is None:  # the row changes that carry no key
                mask = pc.and_(pc.is_null(part["key"]), pc.is_in(part["op"], _ROW_CHANGE_OPS))
            else:
                mask = pc.or_(
                    pc.equal(part["key"], key), pc.fill_null(pc.equal(part["old_key"], key), False)
                )
            if code == Code.MISSING_SEQ:
                mask = (
                    pc.is_null(part["seq"])
                    if key is None
                    else pc.and_(mask, pc.is_null(part["seq"]))
                )
            events = part.filter(pc.fill_null(mask, False))
            out.append(self._apply_dead_letters(events, target, ApplyError(reason, code), batch_id))
        return pa.concat_tables(out)

    @staticmethod
    def _apply_dead_letters(
        part: pa.Table, target: str, exc: ApplyError, batch_id: int
    ) -> pa.Table:
        n = part.num_rows
        event_json = [
            orjson.dumps({"op": op, "key": k, "before": b, "after": a, "seq": s})
            for op, k, b, a, s in zip(
                part["op"].to_pylist(),
                part["key"].to_pylist(),
                part["before"].to_pylist(),
                part["after"].to_pylist(),
                part["seq"].to_pylist(),
                strict=True,
            )
        ]
        return pa.table(
            {
                "batch_id": pa.array([batch_id] * n, pa.int64()),
                "topic": part["topic"],
                "partition": part["partition"],
                "offset": part["offset"],
                "format": part["format"],
                "stage": pa.array(["apply"] * n, pa.string()),
                "code": pa.array([exc.code] * n, pa.string()),
                "message": pa.array([exc.message] * n, pa.string()),
                "target_table": pa.array([target] * n, pa.string()),
                "raw_key": pa.nulls(n, pa.binary()),
                "raw_value": pa.array(event_json, pa.binary()),
            },
            schema=DEAD_LETTER_SCHEMA,
        )

    def _progress(self, rows: pa.Table, report: BatchReport, batch_id: int) -> pa.Table:
        """One progress row for the batch (also for a batch of heartbeats only)."""
        if rows.num_rows == 0:
            return PROGRESS_SCHEMA.empty_table()
        last_seq = pc.max(rows["seq"]).as_py()
        last_ts = pc.max(rows["ts_ms"]).as_py()
        now = int(time.time() * 1000)
        changed = sum(m.upserts + m.deletes for m in report.mirrors)
        return pa.table(
            {
                "source": [self.warehouse.pipeline_id],
                "batch_id": pa.array([batch_id], pa.int64()),
                "last_seq": pa.array([last_seq], pa.string()),
                "last_source_ts_ms": pa.array([last_ts], pa.int64()),
                "events": pa.array([rows.num_rows], pa.int64()),
                "rows_changed": pa.array([changed], pa.int64()),
                "committed_at_ms": pa.array([now], pa.int64()),
                "lag_ms": pa.array([None if last_ts is None else now - last_ts], pa.int64()),
                **{
                    f"txn_{k}": pa.array([report.transactions.get(k)], pa.int64())
                    for k in ("complete", "released_open", "held", "max_wait_ms")
                },
            },
            schema=PROGRESS_SCHEMA,
        )

    @staticmethod
    def _per_record(events: pa.Table) -> pa.Table:
        """One row per consumed record: (topic, partition, offset, kind_min).

        A record is one kind only ("dead" < "event" < "joined" < "skip" by name). An event
        that changes no table (heartbeat, transaction marker, DDL, message) counts as
        "skip"; a record with any table change among its events stays "event".
        """
        is_marker = pc.and_(
            pc.equal(events["kind"], KIND_EVENT),
            pc.invert(pc.fill_null(pc.is_in(events["op"], _TABLE_OPS), False)),
        )
        kinds = pc.if_else(is_marker, KIND_SKIP, events["kind"])
        slim = pa.table(
            {
                "topic": events["topic"],
                "partition": events["partition"],
                "offset": events["offset"],
                "kind": kinds,
            }
        )
        return slim.group_by(["topic", "partition", "offset"]).aggregate([("kind", "min")])

    def _accounting(
        self, per_record: pa.Table, rows: pa.Table, batch_id: int, delivery_id: int | None
    ) -> pa.Table:
        if per_record.num_rows == 0:
            return pa.Table.from_batches([], schema=BATCHES_SCHEMA)
        ranges = per_record.group_by(["topic", "partition"]).aggregate(
            [("offset", "min"), ("offset", "max"), ("offset", "count")]
        )
        kinds = per_record.group_by(["topic", "partition", "kind_min"]).aggregate(
            [("offset", "count")]
        )
        counts: dict[tuple[str, int, str], int] = {
            (t, p, k): c
            for t, p, k, c in zip(
                kinds["topic"].to_pylist(),
                kinds["partition"].to_pylist(),
                kinds["kind_min"].to_pylist(),
                kinds["offset_count"].to_pylist(),
                strict=True,
            )
        }
        per_event = rows.group_by(["topic", "partition"]).aggregate([("offset", "count")])
        events = {
            (t, p): c
            for t, p, c in zip(
                per_event["topic"].to_pylist(),
                per_event["partition"].to_pylist(),
                per_event["offset_count"].to_pylist(),
                strict=True,
            )
        }
        topics = ranges["topic"].to_pylist()
        parts = ranges["partition"].to_pylist()
        keys = list(zip(topics, parts, strict=True))
        now = int(time.time() * 1000)

        def count(kind: str) -> pa.Array:
            return pa.array([counts.get((t, p, kind), 0) for t, p in keys], pa.int64())

        return pa.table(
            {
                "batch_id": pa.array([batch_id] * len(keys), pa.int64()),
                "topic": topics,
                "partition": pa.array(parts, pa.int32()),
                "first_offset": ranges["offset_min"].cast(pa.int64()),
                "last_offset": ranges["offset_max"].cast(pa.int64()),
                "records": ranges["offset_count"].cast(pa.int64()),
                "events": pa.array([events.get(k, 0) for k in keys], pa.int64()),
                "joined": count(KIND_JOINED),
                "skipped": count(KIND_SKIP),
                "dead_letters": count(KIND_DEAD),
                "committed_at_ms": pa.array([now] * len(keys), pa.int64()),
                "source": [self.warehouse.pipeline_id] * len(keys),
                "delivery_id": pa.array([delivery_id] * len(keys), pa.int64()),
            },
            schema=BATCHES_SCHEMA,
        )


def _combined(reports: list[BatchReport], delivery_id: int | None, last_id: int) -> BatchReport:
    """One report for the applies of a delivery (none, one, or a finished one and a new one)."""
    if len(reports) == 1:
        return reports[0]
    out = BatchReport(
        batch_id=reports[-1].batch_id if reports else last_id, delivery_id=delivery_id
    )
    for r in reports:
        out.records += r.records
        out.events += r.events
        out.skipped.update(r.skipped)
        out.dead_letters.update(r.dead_letters)
        out.mirrors.extend(r.mirrors)
        out.seconds += r.seconds
        out.transactions = r.transactions or out.transactions
    return out


def _records_of(events: pa.Table) -> pa.Table:
    """One row per record of ``events``: distinct ``(topic, partition, offset)``."""
    return (
        events.select(["topic", "partition", "offset"])
        .group_by(["topic", "partition", "offset"])
        .aggregate([])
    )


def _source_ids(rows: pa.Table) -> pa.ChunkedArray:
    """One string per row naming its source table (format, database, schema, table)."""
    return pc.binary_join_element_wise(
        rows["format"], rows["database"], rows["schema"], rows["table"], "\x1f"
    )


def _origin(part: pa.Table, i: int) -> dict[str, Any]:
    """Where event ``i`` of ``part`` came from (for the schema-change record)."""
    i = max(0, i)
    return {
        "seq": part["seq"][i].as_py(),
        "topic": part["topic"][i].as_py(),
        "partition": part["partition"][i].as_py(),
        "offset": part["offset"][i].as_py(),
    }


def _full_row_identity(part: pa.Table) -> bool:
    """Whether the table's events use the whole row as identity (no primary key)."""
    meta = part.filter(pc.is_valid(part["meta"]))["meta"]
    if not len(meta):
        return False
    return bool(pc.any(pc.match_substring(meta, '"row_identity":"full_row"')).as_py())


def _declarations_on_every_row(rows: pa.Table) -> pa.Table:
    """``columns`` filled forward per source table (a batch states each declaration once).

    Needed when events are applied in a later batch than the event that declared them.
    """
    columns = rows["columns"].combine_chunks()
    if columns.null_count == 0 or rows.num_rows == 0:
        return rows
    source = _source_ids(rows).combine_chunks()
    filled = columns.to_pylist()
    last: dict[str, str] = {}
    for i, (src, cols) in enumerate(zip(source.to_pylist(), filled, strict=True)):
        if cols is not None:
            last[src] = cols
        elif src in last:
            filled[i] = last[src]
    return rows.set_column(
        rows.schema.get_field_index("columns"), "columns", pa.array(filled, pa.string())
    )

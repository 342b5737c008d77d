"""``cdcflow verify --repair``: the keys verify found different written again from the
source, through the pipeline's own apply, exactly once, then checked.

For each source whose tables differ, one *repair generation* (as a dead-letter replay is
one, :mod:`cdcflow.commands.replay`), under the pipeline's lease (the caller holds it):

1. **Read.** In a new snapshot of the source database, each differing key's row is read
   as the driver returns it (and as verify's canonical texts, to tell later whether it
   moved), the target's row filter applied as verify applies it.
2. **Events.** A row the source holds becomes an upsert (``insert`` for a missing key,
   ``update`` for a different one) whose after image is the whole source row in the
   mirror's types (:mod:`cdcflow.verify.images`); a key the source no longer holds (or
   whose row the filter leaves out) a ``delete``. The events name the source table, so
   the target's routing, shard column, row filter, excluded and computed columns apply
   to them as to the stream's.
3. **Sequence.** A repair must never undo a change the stream applies after it, and must
   get past the guards of what the stream applied before. So its sequence is the mirror
   row's own ``_cdc_seq`` (the merge overwrites at ``>=``: the repair lands, and any
   change the stream applies next, having a higher sequence, wins); for a key the mirror
   does not hold, the least sequence above the key's tombstone and the table's truncate
   (``""`` when there is neither). Not "the snapshot's position": docs/decisions/0071-verify.md
   says why no sequence separates before and after a snapshot.
4. **Intent, apply, outcome.** The events are recorded in ``_cdcflow/repairs`` (outcome
   null) before the apply; the apply is :func:`~cdcflow.runtime.pipeline.applier_for`'s
   :class:`~cdcflow.apply.batch.BatchApplier` under the application id
   ``<pipeline>.<source>.repair.<generation>`` on the Kafka-like coordinates
   ``_cdcflow.repair``/0/0..n-1 of that id alone (never the source's topics: the
   pipeline's offsets stay its own); then every key is read again on both sides, in a
   new snapshot, and its outcome recorded: ``repaired`` (equal now), ``in_flight`` (the
   source row changed since it was read) or ``not_repaired`` (still different: the
   apply refused it, a dead letter says why).

A repair killed between its intent and its outcomes is finished by the next
``--repair`` (:func:`finish_interrupted`, before it verifies) with the very events it
recorded, under the same application id: the offsets ledger applies each once.

Not repaired: history (SCD type 2) tables (a repair would invent a version no source
change made; they are reported as refused), and a column whose mirror type has no image
(:class:`~cdcflow.verify.images.UnrepairableColumn`: the table is refused, named).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.decode.batches import flatten
from cdcflow.event_schema import EVENT_SCHEMA
from cdcflow.formats.base import DecodeResult
from cdcflow.model import ChangeEvent, Op, Origin, SourceTable, seq_key
from cdcflow.runtime.pipeline import applier_for
from cdcflow.sinks.merge import SEQ_COLUMN
from cdcflow.sinks.system_tables import REPAIRS, REPAIRS_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.verify.databases import SourceDatabase
from cdcflow.verify.images import UnrepairableColumn, image_value, logical_type
from cdcflow.verify.ranges import Row, row_differences
from cdcflow.verify.sides import MirrorSide, SourceSide
from cdcflow.verify.verifier import Mismatch, Verification, key_dict, selection

__all__ = [
    "OUTCOMES",
    "REPAIR_TOPIC",
    "KeyRepair",
    "RepairReport",
    "finish_interrupted",
    "repair",
]

log = logging.getLogger(__name__)

#: the topic name of a repair's events (its partition 0, offsets from 0 per generation)
REPAIR_TOPIC = "_cdcflow.repair"

#: what a repaired key found, in the order the report lists them
OUTCOMES = ("repaired", "in_flight", "not_repaired")


@dataclass
class KeyRepair:
    """One key's repair: what verify found, what was written, how it ended."""

    target: str
    key: dict[str, Any]
    found: str  # missing | extra | different
    action: str  # upsert | delete | none (neither side holds it now)
    seq: str | None
    outcome: str | None = None


@dataclass
class RepairReport:
    """What one source's repair did."""

    source: str
    generation: int | None = None
    keys: list[KeyRepair] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # target -> why
    seconds: float = 0.0

    @property
    def outcomes(self) -> Counter:
        return Counter(k.outcome for k in self.keys)

    @property
    def complete(self) -> bool:
        """Every key repaired or in flight, no table refused."""
        return not self.refused and not self.outcomes.get("not_repaired")


@dataclass
class _Table:
    """One table's repair in the making."""

    mismatch: Mismatch
    source: SourceSide
    mirror: MirrorSide
    raw: dict[tuple, dict[str, Any]]  # canonical key -> the source row as read
    read: dict[tuple, Row]  # canonical key -> its canonical texts when read
    keys: dict[tuple, KeyRepair]  # canonical key -> its repair
    as_read: dict[tuple, tuple] = field(default_factory=dict)  # canonical key -> as read


def repair(
    config: Any,
    db: SourceDatabase,
    run: Verification,
    fence: Callable[[], None],
    say: Callable[[str], None] = lambda line: None,
) -> list[RepairReport]:
    """Repair the keys ``run`` found different (see the module). The caller holds the
    pipeline's lease; ``fence`` raises once it is lost.

    Raises:
        CdcflowError: ``SOURCE_DB_ERROR`` (a statement failed), ``StorageError``,
            ``LeaseLost``.
    """
    by_source: dict[str, list[Mismatch]] = {}
    for m in run.mismatches:
        by_source.setdefault(m.plan.source, []).append(m)
    reports = []
    for source in config.sources:
        mismatches = by_source.get(source.name, [])
        if not mismatches:
            continue
        identity = f"{config.pipeline_id}.{source.name}"
        report = RepairReport(identity)
        started = time.monotonic()
        _repair_source(config, db, source, identity, mismatches, run, fence, report, say)
        report.seconds = time.monotonic() - started
        reports.append(report)
    return reports


def _repair_source(
    config: Any,
    db: SourceDatabase,
    source: Any,
    identity: str,
    mismatches: Sequence[Mismatch],
    run: Verification,
    fence: Callable[[], None],
    report: RepairReport,
    say: Callable[[str], None],
) -> None:
    warehouse = DeltaWarehouse(config.warehouse, storage_options=dict(config.storage))
    marks = warehouse.read_system(REPAIRS, REPAIRS_SCHEMA)
    own = marks.filter(pc.equal(marks["source"], identity))
    report.generation = (pc.max(own["generation"]).as_py() or 0) + 1 if own.num_rows else 1
    view = _view(config, identity, report.generation)
    # 1. read, 2. events, 3. sequences: in one snapshot
    db.begin_snapshot()
    tables: list[_Table] = []
    events: list[ChangeEvent] = []
    seqs: list[str | None] = []
    try:
        for m in mismatches:
            why = _refusal(config, m)
            if why is not None:
                report.refused[m.plan.target] = why
                continue
            t = _read(config, db, warehouse, m)
            try:
                made = _events(config, source, warehouse, t, len(events), run, report.generation)
            except UnrepairableColumn as exc:
                t.mirror.close()
                report.refused[m.plan.target] = str(exc)
                continue
            tables.append(t)
            for event, seq in made:
                events.append(event)
                seqs.append(seq)
    except BaseException:
        _close(tables)
        raise
    finally:
        db.end_snapshot()
    for t in tables:
        report.keys.extend(t.keys.values())
    if not events:
        for k in report.keys:
            k.outcome = "in_flight"  # neither side holds it now, or nothing to write
        _close(tables)
        return
    batch = _event_table(events, seqs)
    # 4. intent, apply, outcome
    intents = _marks(identity, report.generation, run.started_at_ms, tables, batch, None)
    warehouse.append_rows(warehouse.system_path(REPAIRS), intents)
    say(f"repair {report.generation} of {identity}: {batch.num_rows} events")
    applied = applier_for(config, view, source, fence=fence).apply(batch)
    if applied.dead_letters:
        say(f"  the apply refused some: {dict(applied.dead_letters)} (see _cdcflow/dead_letters)")
    _check(db, config, tables)
    outcomes = [k.outcome for t in tables for k in t.keys.values() if k.action != "none"]
    view.append_rows(
        view.system_path(REPAIRS),
        _marks(identity, report.generation, run.started_at_ms, tables, batch, outcomes),
    )


def _view(config: Any, identity: str, generation: int) -> DeltaWarehouse:
    return DeltaWarehouse(
        config.warehouse,
        pipeline_id=f"{identity}.repair.{generation}",
        storage_options=config.storage,
        merge_engine=config.apply.merge_engine,
    )


def _refusal(config: Any, m: Mismatch) -> str | None:
    mode = config.tables(m.plan.target).mode
    if mode == "history":
        return (
            "a history (SCD type 2) table is not repaired: a repair would write a version "
            "no source change made; rebuild it from a snapshot of the source"
        )
    return None


# ----------------------------------------------------------------------------- read


def _read(config: Any, db: SourceDatabase, warehouse: DeltaWarehouse, m: Mismatch) -> _Table:
    """Both sides' rows of the mismatched keys, in the open snapshot."""
    chosen = selection(config, m.plan)
    keys = [*m.missing, *m.different, *m.extra]
    source = SourceSide(db, m.plan.table, m.key, m.columns, True, chosen.row_filter)
    read = source.rows_by_key(keys)  # filtered as verify filters
    raw = source.raw_rows_by_key([row.key for row in read.values()], m.plan.table.columns)
    table = warehouse.open(warehouse.table_path(m.plan.target))
    assert table is not None  # verify compared it
    dataset = table.to_pyarrow_dataset()
    mirror = MirrorSide(
        dataset,
        dataset.schema,
        m.key,
        m.columns,
        False,
        chosen.where,
        keyed=False,
        where_columns=(*chosen.columns, SEQ_COLUMN),
    )
    return _Table(m, source, mirror, raw, read, {})


# ----------------------------------------------------------------------------- events


def _events(
    config: Any,
    source: Any,
    warehouse: DeltaWarehouse,
    t: _Table,
    first_offset: int,
    run: Verification,
    generation: int,
) -> list[tuple[ChangeEvent, str | None]]:
    """The table's repair events and their sequences (see the module, 2. and 3.)."""
    m = t.mismatch
    schema = t.mirror.data.schema
    mirror_types = {name: schema.field(name).type for name in schema.names}
    columns = m.plan.table.columns
    declared = {c.name: logical_type(c, mirror_types.get(c.name)) for c in columns}
    found: dict[tuple, tuple[str, tuple]] = {}  # canonical key -> (what verify found, as read)
    by_read = {row.key: canonical for canonical, row in t.read.items()}
    for kind in ("missing", "different", "extra"):
        for as_read in getattr(m, kind):
            canonical = by_read.get(as_read) or _canonical(t, as_read)
            found[canonical] = (kind, as_read)
            t.as_read[canonical] = as_read
    stored = t.mirror.values_by_key([as_read for _, as_read in found.values()], SEQ_COLUMN)
    tombstones, watermark = _tombstones(warehouse, m)
    table = SourceTable(
        source.format, m.plan.table.database, m.plan.table.schema, m.plan.table.table
    )
    now_ms = int(time.time() * 1000)
    out: list[tuple[ChangeEvent, str | None]] = []
    for canonical, (kind, as_read) in found.items():
        row = t.raw.get(canonical)
        item = key_dict(m.key, as_read)
        held = canonical in stored
        if row is None and not held:
            t.keys[canonical] = KeyRepair(m.plan.target, item, kind, "none", None, "in_flight")
            continue
        seq = stored[canonical] if held else _above(tombstones.get(_loose(as_read)), watermark)
        key_columns = {
            c.name: image_value(c, mirror_types.get(c.name), v)
            for c, v in zip(m.key, as_read, strict=True)
        }
        origin = Origin(REPAIR_TOPIC, 0, first_offset + len(out))
        meta = {"repair": generation, "verification_started_at_ms": run.started_at_ms}
        if row is None:
            event = ChangeEvent(
                Op.DELETE, table, key=key_columns, before=dict(key_columns), ts_ms=now_ms,
                origin=origin, meta=meta, columns=declared,
            )  # fmt: skip
            action = "delete"
        else:
            after = {c.name: image_value(c, mirror_types.get(c.name), row[c.name]) for c in columns}
            key_image = {c.name: after[c.name] for c in m.key}
            event = ChangeEvent(
                Op.UPDATE if held else Op.INSERT, table, key=key_image, after=after,
                columns=declared, ts_ms=now_ms, origin=origin, meta=meta, partial=False,
            )  # fmt: skip
            action = "upsert"
        t.keys[canonical] = KeyRepair(m.plan.target, item, kind, action, seq)
        out.append((event, seq))
    return out


def _canonical(t: _Table, as_read: tuple) -> tuple:
    """The canonical texts of a key the source no longer holds: the mirror's."""
    got = t.mirror.rows_by_key([as_read])
    return next(iter(got)) if got else tuple(str(v) for v in as_read)


def _loose(values: Sequence[Any]) -> tuple:
    """A key compared loosely between a tombstone's JSON and a key as read: as texts."""
    return tuple(str(v) for v in values)


def _tombstones(warehouse: DeltaWarehouse, m: Mismatch) -> tuple[dict[tuple, str], str | None]:
    """The target's tombstones (loose key -> sequence) and truncate watermark."""
    keyed, watermark = warehouse.tombstones.guard(m.plan.target)
    names = [c.name for c in m.key]
    out: dict[tuple, str] = {}
    for key_json, seq in keyed.items():
        try:
            values = orjson.loads(key_json)
            out[_loose([values[n] for n in names])] = seq
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return out, watermark


def _above(tombstone: str | None, watermark: str | None) -> str:
    """The least sequence an upsert needs to pass the key's tombstone (strictly above it)
    and the table's truncate (at or above it): ``""`` when there is neither."""
    floor = watermark or ""
    if tombstone is not None:
        above = f"{tombstone}.{seq_key((0,))}"  # an extension sorts right after its prefix
        floor = max(floor, above)
    return floor


def _event_table(events: list[ChangeEvent], seqs: list[str | None]) -> pa.Table:
    origins = [e.origin for e in events]
    result = DecodeResult(
        events=events, decoded_origins=origins, records=len(events), decoded_records=len(events)
    )
    table = pa.Table.from_batches([flatten(result)], schema=EVENT_SCHEMA)
    at = EVENT_SCHEMA.get_field_index("seq")
    return table.set_column(at, EVENT_SCHEMA.field("seq"), pa.array(seqs, pa.string()))


# ----------------------------------------------------------------------------- outcome


def _check(db: SourceDatabase, config: Any, tables: Sequence[_Table]) -> None:
    """Read every repaired key again on both sides, in a new snapshot: its outcome."""
    db.begin_snapshot()
    try:
        for t in tables:
            m = t.mismatch
            written = [k for k, r in t.keys.items() if r.action != "none"]
            if not written:
                continue
            as_read = {k: t.as_read[k] for k in written}
            warehouse = DeltaWarehouse(config.warehouse, storage_options=dict(config.storage))
            table = warehouse.open(warehouse.table_path(m.plan.target))
            assert table is not None
            dataset = table.to_pyarrow_dataset()
            chosen = selection(config, m.plan)
            mirror = MirrorSide(
                dataset, dataset.schema, m.key, m.columns, False, chosen.where, keyed=False,
                where_columns=chosen.columns,
            )  # fmt: skip
            try:
                src = t.source.rows_by_key(list(as_read.values()))
                mir = mirror.rows_by_key(list(as_read.values()))
            finally:
                mirror.close()
            still = row_differences(src, mir, m.columns)
            for k in written:
                repair = t.keys[k]
                if k not in still:
                    repair.outcome = "repaired"
                elif src.get(k) != t.read.get(k):
                    repair.outcome = "in_flight"
                else:
                    repair.outcome = "not_repaired"
    finally:
        db.end_snapshot()
        _close(tables)


def _close(tables: Sequence[_Table]) -> None:
    for t in tables:
        t.mirror.close()


def _marks(
    identity: str,
    generation: int,
    verification_ms: int,
    tables: Sequence[_Table],
    batch: pa.Table,
    outcomes: list[str | None] | None,
) -> pa.Table:
    """The ``_cdcflow/repairs`` rows of the written keys, in the events' order: intents
    (``outcomes`` None) or outcomes."""
    written = [(t, r) for t in tables for r in t.keys.values() if r.action != "none"]
    events = batch.to_pylist()
    now = int(time.time() * 1000)
    marks = outcomes if outcomes is not None else [None] * len(written)
    return pa.table(
        {
            "source": [identity] * len(written),
            "generation": pa.array([generation] * len(written), pa.int64()),
            "verification_started_at_ms": pa.array([verification_ms] * len(written), pa.int64()),
            "target_table": [r.target for _, r in written],
            "source_table": [t.mismatch.plan.table.name for t, _ in written],
            "key": [json.dumps(r.key, default=str) for _, r in written],
            "found": [r.found for _, r in written],
            "action": [r.action for _, r in written],
            "seq": pa.array([r.seq for _, r in written], pa.string()),
            "event": [json.dumps(_jsonable(e), default=str) for e in events],
            "outcome": pa.array(marks, pa.string()),
            "recorded_at_ms": pa.array([now] * len(written), pa.int64()),
        },
        schema=REPAIRS_SCHEMA,
    )


def _jsonable(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("raw_key", "raw_value")}


# ----------------------------------------------------------------------------- killed


def finish_interrupted(config: Any, fence: Callable[[], None]) -> list[str]:
    """Finish the repair generations a killed ``--repair`` left without outcomes, with the
    events their intents recorded (the ledger applies each once), before verify reads
    anything; their keys' outcome is ``applied`` (the verify that follows says whether
    they hold). Returns one line per generation finished.

    Raises:
        StorageError, LeaseLost.
    """
    warehouse = DeltaWarehouse(config.warehouse, storage_options=dict(config.storage))
    marks = warehouse.read_system(REPAIRS, REPAIRS_SCHEMA).to_pylist()
    lines = []
    for source in config.sources:
        identity = f"{config.pipeline_id}.{source.name}"
        own = [r for r in marks if r["source"] == identity]
        ended = {r["generation"] for r in own if r["outcome"] is not None}
        for generation in sorted({r["generation"] for r in own} - ended):
            taken = [r for r in own if r["generation"] == generation]
            events = pa.Table.from_pylist(
                [json.loads(r["event"]) for r in taken], schema=EVENT_SCHEMA
            )
            view = _view(config, identity, generation)
            applier_for(config, view, source, fence=fence).apply(events)
            now = int(time.time() * 1000)
            done = [{**r, "outcome": "applied", "recorded_at_ms": now} for r in taken]
            view.append_rows(
                view.system_path(REPAIRS), pa.Table.from_pylist(done, schema=REPAIRS_SCHEMA)
            )
            lines.append(
                f"repair {generation} of {identity}: finished after an interruption "
                f"({len(taken)} keys)"
            )
    return lines

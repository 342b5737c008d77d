"""``cdcflow dead-letters replay``: dead letters decoded and applied again after a fix (a
format option, the right format, a resumed table), exactly once.

For each source: the dead letters of its topics that no replay has taken yet, in Kafka
order, become one apply of a *replay generation*:

1. the letters are recorded as taken in ``_cdcflow/replays`` (outcome null): from here on
   no later replay takes them again, whatever happens;
2. their records are decoded with the source's format and options as configured now: a
   decode dead letter from its stored bytes; an apply dead letter (a table refused the
   event: stopped, a type that did not fit) from Kafka, by offset, keeping only the
   events of the table that refused them (the record's other events were applied);
3. the events are applied by the pipeline's own :class:`~cdcflow.apply.batch.BatchApplier`
   under the application id ``<pipeline>.<source>.replay.<generation>``: its offsets
   ledger makes the apply exactly once, a crash in the middle included;
4. each letter's outcome is recorded: ``applied``, ``dead_letter`` (it failed again: a new
   dead letter with a new commit time, which a later replay may take) or ``gone`` (an
   apply dead letter whose record Kafka no longer holds).

A generation whose letters were taken but whose outcomes are missing (the replay was
killed) is finished first by the next replay, through its own ledger: nothing is applied
twice, and a letter whose record the killed run dead-lettered again is ``dead_letter``
(failing again counts from when the generation took its letters). Mirrors guard against older changes by sequence, so a replayed change older than
what a table holds does not overwrite it (docs/semantics.md). The replay takes the
pipeline's lease: it is refused while the pipeline runs (exit 75).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.commands.dead_letters import LetterFilter, read_letters
from cdcflow.config import PipelineConfig, SourceConfig
from cdcflow.decode.batches import DecodeFunction
from cdcflow.errors import ConfigError
from cdcflow.event_schema import EVENT_SCHEMA
from cdcflow.runtime.pipeline import applier_for
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.system_tables import DEAD_LETTER_SCHEMA, DEAD_LETTERS, REPLAYS, REPLAYS_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.transform.router import Router

__all__ = ["ReplayReport", "replay"]

log = logging.getLogger(__name__)

#: topic, partition, offset, stage, committed_at_ms (None where the row has none: an Arrow null)
LetterKey = tuple[str, int, int, str, int | None]


@dataclass
class ReplayReport:
    """What one source's replay did."""

    source: str
    generations: list[int] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)  # applied | dead_letter | gone
    events: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        if not self.generations:
            return f"{self.source}: no dead letter to replay"
        done = ", ".join(
            f"{n:,} {outcome.replace('_', ' ')}" for outcome, n in self.outcomes.most_common()
        )
        gens = ", ".join(map(str, self.generations))
        return (
            f"{self.source}: replay {gens}: {sum(self.outcomes.values()):,} dead letters -> "
            f"{self.events:,} events; {done} ({self.seconds:.1f} s)"
        )


def _key(row: dict[str, Any]) -> LetterKey:
    committed = row.get("letter_committed_at_ms", row.get("committed_at_ms"))
    return (row["topic"], row["partition"], row["offset"], row["stage"], committed)


def replay(
    config: PipelineConfig,
    sources: Sequence[str] | None = None,
    codes: Sequence[str] | None = None,
    fence: Callable[[], None] | None = None,
) -> list[ReplayReport]:
    """Replay the dead letters of ``sources`` (default: all), of ``codes`` (default: all),
    under the pipeline's lease (see the module docstring).

    Raises:
        ConfigError: a source that is not configured, or ``sink: delta-spark``.
        LeaseHeld: the pipeline is running (exit 75).
        StorageError: the warehouse cannot be read or written.
    """

    if config.sink == "delta-spark":
        raise ConfigError("cdcflow dead-letters replay: sink delta-spark is not supported yet")
    chosen = [config.source_named(n) for n in sources] if sources else list(config.sources)
    with PipelineLease(
        config.warehouse, config.pipeline_id, storage_options=config.storage
    ) as lease:

        def fenced() -> None:
            lease.fence()
            if fence is not None:
                fence()

        return [_replay_source(config, s, codes, fenced) for s in chosen]


def _replay_source(
    config: PipelineConfig,
    source: SourceConfig,
    codes: Sequence[str] | None,
    fence: Callable[[], None],
) -> ReplayReport:

    started = time.perf_counter()
    identity = f"{config.pipeline_id}.{source.name}"
    wh = DeltaWarehouse(config.warehouse, pipeline_id=identity, storage_options=config.storage)
    report = ReplayReport(source=identity)
    where = LetterFilter(topics=source.topics or None, topic_pattern=source.topic_pattern)
    letters = {_key(r): r for r in read_letters(wh, where).to_pylist()}
    marks = wh.read_system(REPLAYS, REPLAYS_SCHEMA)
    marks = marks.filter(pc.equal(marks["source"], identity)).to_pylist()
    taken: dict[LetterKey, int] = {}
    finished: set[tuple[LetterKey, int]] = set()
    for m in marks:
        if m["outcome"] is None:
            taken[_key(m)] = m["generation"]
        else:
            finished.add((_key(m), m["generation"]))
    # 1. generations a killed replay left unfinished
    for generation in sorted({g for k, g in taken.items() if (k, g) not in finished}):
        keys = [k for k, g in taken.items() if g == generation and (k, g) not in finished]
        rows = [letters[k] for k in keys if k in letters]  # expired ones are gone for good
        # letters its killed run committed count as failing again: since it took them
        taken_ms = min(m["recorded_at_ms"] for m in marks if m["generation"] == generation)
        _run(config, source, identity, generation, rows, taken_ms, fence, report)
    # 2. a new generation for the letters no replay has taken
    todo = [r for k, r in letters.items() if k not in taken and (not codes or r["code"] in codes)]
    if todo:
        generation = max((m["generation"] for m in marks), default=0) + 1
        taking = _marks(identity, generation, todo, None)
        wh.append_rows(wh.system_path(REPLAYS), taking)
        taken_ms = taking["recorded_at_ms"][0].as_py()
        _run(config, source, identity, generation, todo, taken_ms, fence, report)
    report.seconds = time.perf_counter() - started
    return report


def _marks(
    identity: str, generation: int, rows: list[dict[str, Any]], outcomes: list[str] | None
) -> pa.Table:
    now = int(time.time() * 1000)
    marks: list[str | None] = [*outcomes] if outcomes else [None] * len(rows)
    return pa.table(
        {
            "source": [identity] * len(rows),
            "generation": pa.array([generation] * len(rows), pa.int64()),
            "topic": [r["topic"] for r in rows],
            "partition": pa.array([r["partition"] for r in rows], pa.int32()),
            "offset": pa.array([r["offset"] for r in rows], pa.int64()),
            "stage": [r["stage"] for r in rows],
            "letter_committed_at_ms": pa.array([r["committed_at_ms"] for r in rows], pa.int64()),
            "code": [r["code"] for r in rows],
            "outcome": pa.array(marks, pa.string()),
            "recorded_at_ms": pa.array([now] * len(rows), pa.int64()),
        },
        schema=REPLAYS_SCHEMA,
    )


def _run(
    config: PipelineConfig,
    source: SourceConfig,
    identity: str,
    generation: int,
    rows: list[dict[str, Any]],
    taken_ms: int,
    fence: Callable[[], None],
    report: ReplayReport,
) -> None:
    """Decode and apply one generation's letters, then record their outcomes: a letter
    whose record became a dead letter again since the generation took it (``taken_ms``,
    epoch ms; by this run or by a killed one) failed again."""

    if not rows:
        return
    view = DeltaWarehouse(
        config.warehouse,
        pipeline_id=f"{identity}.replay.{generation}",
        storage_options=config.storage,
        merge_engine=config.apply.merge_engine,
    )
    events, gone = _events(config, source, identity, view, rows)
    applied = (
        applier_for(config, view, source, fence=fence).apply(events) if events.num_rows else None
    )
    report.events += 0 if applied is None else applied.events
    again = _failed_again(view, rows, taken_ms)
    outcomes = [
        "gone" if _key(r) in gone else "dead_letter" if _where(r) in again else "applied"
        for r in rows
    ]
    view.append_rows(view.system_path(REPLAYS), _marks(identity, generation, rows, outcomes))
    report.generations.append(generation)
    report.outcomes.update(outcomes)


def _where(row: dict[str, Any]) -> tuple[str, int, int]:
    return row["topic"], row["partition"], row["offset"]


def _failed_again(view: DeltaWarehouse, rows: list[dict[str, Any]], since_ms: int) -> set:
    """Records of ``rows`` that became dead letters again in this replay."""
    fresh = view.read_system(
        DEAD_LETTERS, DEAD_LETTER_SCHEMA, filters=[("committed_at_ms", ">=", since_ms)]
    )
    wanted = {_where(r) for r in rows}
    return {_where(r) for r in fresh.to_pylist()} & wanted


def _events(
    config: PipelineConfig,
    source: SourceConfig,
    identity: str,
    view: DeltaWarehouse,
    rows: list[dict[str, Any]],
) -> tuple[pa.Table, set[LetterKey]]:
    """The letters' records decoded as configured now, in Kafka order; and the keys of
    apply letters whose record Kafka no longer holds."""
    # deferred: pyspark (~1 s); only a replay that re-reads Kafka needs it
    from cdcflow.source.kafka.schema import ARROW_SCHEMA

    raw: dict[tuple[str, int, int], dict[str, Any]] = {}
    targets: dict[tuple[str, int, int], set[str]] = {}  # apply letters: the refusing tables
    gone: set[LetterKey] = set()
    for r in rows:
        where = _where(r)
        if r["stage"] == "decode":
            raw[where] = {"key": r["raw_key"], "value": r["raw_value"], "headers": None}
        else:
            targets.setdefault(where, set()).add(r["target_table"])
    reread = _reread(config, source, sorted(targets))
    for r in rows:
        if r["stage"] != "decode":
            found = reread.get(_where(r))
            if found is None:
                gone.add(_key(r))
            else:
                raw[_where(r)] = found
    ordered = sorted(raw)
    table = pa.table(
        {
            "key": pa.array([raw[w]["key"] for w in ordered], pa.binary()),
            "value": pa.array([raw[w]["value"] for w in ordered], pa.binary()),
            "topic": [w[0] for w in ordered],
            "partition": pa.array([w[1] for w in ordered], pa.int32()),
            "offset": pa.array([w[2] for w in ordered], pa.int64()),
            "timestamp": pa.array([None] * len(ordered), ARROW_SCHEMA.field("timestamp").type),
            "timestampType": pa.array([None] * len(ordered), pa.int32()),
            "headers": pa.array(
                [raw[w]["headers"] for w in ordered], ARROW_SCHEMA.field("headers").type
            ),
        },
        schema=ARROW_SCHEMA,
    )
    # the source's own state
    state = DeltaWarehouse(config.warehouse, pipeline_id=identity, storage_options=config.storage)
    decode = DecodeFunction(
        source.format,
        dict(source.options),
        state_path=state.system_path("decoder_state"),
        state_key=identity,
        storage_options=dict(config.storage) or None,
    )
    events = pa.Table.from_batches(list(decode(iter(table.to_batches()))), schema=EVENT_SCHEMA)
    if targets and events.num_rows:
        events = _only_refused(events, targets, Router(config.target_template, source.routing()))
    return events, gone


def _only_refused(
    events: pa.Table, targets: dict[tuple[str, int, int], set[str]], router: Any
) -> pa.Table:
    """The events of apply letters' records: only those of the tables that refused them
    (the record's other events were applied when it was read)."""
    keep = []
    for i, row in enumerate(
        events.select(
            ["topic", "partition", "offset", "kind", "format", "database", "schema", "table"]
        ).to_pylist()
    ):
        refused = targets.get((row["topic"], row["partition"], row["offset"]))
        if refused is None:
            keep.append(i)  # a decode letter's record
        elif row["kind"] == "event" and row["table"]:
            target = router.target(
                row["format"], row["database"] or "", row["schema"] or "", row["table"]
            )
            if target in refused:
                keep.append(i)
    return events.take(pa.array(keep, pa.int64()))


def _reread(
    config: PipelineConfig, source: SourceConfig, where: list[tuple[str, int, int]]
) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The records at ``where`` from Kafka (those it still holds), key, value and headers."""
    # deferred: pyspark (~1 s); only a replay that re-reads Kafka needs it
    from cdcflow.source.kafka.admin import read_range

    if not where:
        return {}
    options = config.kafka.reader_options()
    options["subscribe"] = ",".join(sorted({t for t, _, _ in where}))
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for topic, partition, offset in where:
        try:
            for batch in read_range(options, topic, partition, offset, offset):
                for r in batch.to_pylist():
                    out[(topic, partition, r["offset"])] = {
                        "key": r["key"],
                        "value": r["value"],
                        "headers": r["headers"],
                    }
        except Exception as exc:  # noqa: BLE001 - DATA_LOSS: the record is gone
            log.warning("record %s[%d]@%d cannot be read again: %s", topic, partition, offset, exc)
    return out

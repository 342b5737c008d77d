"""The source-database oracle: random workloads, faulty delivery, real decode and apply.

A :class:`~cdcflow_testkit.workload.Workload` keeps the source tables in memory and emits
inserts, updates, deletes, primary-key changes, truncates and added columns over four
tables (two with composite keys, every logical type the format carries); the format's
encoder publishes them; :mod:`cdcflow_testkit.delivery` spreads the messages over 1-3
partitions by key, adds exact duplicates and replays of earlier ranges, and cuts the
partition logs into micro-batches. Each batch goes through the streaming job's own path,
without Spark or Kafka: ``DecodeFunction`` (the ``mapInArrow`` function, decoder state
persisted between batches) and ``BatchApplier.apply`` into a real ``DeltaWarehouse`` in
a temporary folder, batch ids 0, 1, 2, ... One already-applied batch is applied again
with its batch id, as Spark re-runs a batch after a crash.

The property, once the stream is drained:

1. every mirror equals its source table (``compare_with_mirror``);
2. the changelog holds no Kafka record's event twice (topic, partition, offset,
   event_index); each row's (table, seq) belongs to the source change whose message is
   at that offset; deduplicated by (table, seq) it is the set of source changes: every
   source change is there, and the copies of one (table, seq) agree on op, key and
   after image;
3. ``_cdcflow/batches`` covers every offset of every partition exactly once, with
   ``records = records with row changes + joined + skipped + dead letters`` and
   ``events`` = the batch's changelog rows;
4. the crash replay commits nothing (every Delta table keeps its version);
5. no dead letter, except (in the malformed test) exactly the malformed records, with
   their raw bytes and coordinates.

"Belongs to": the fault-free stream, decoded one record at a time, gives each source
change its (table, seq) set.

Formats publish only what their tool publishes: AWS DMS, Maxwell and Qlik Replicate
publish no truncate, so their workloads have none (``capabilities``). Tables without a
primary key are not generated.

Violations this oracle found that are not fixed yet are :data:`KNOWN_BUGS`: each is
tolerated in the random tests only in its formats, in the cases that can show it (the
delivery faults it needs) and where its exact symptom shows, so a new bug with the same
text elsewhere still fails; its minimal case is a strict xfail (it fails the run once
the bug is fixed: then delete the entry). What a format does not carry, so that cdcflow
refuses the changes with a stable code instead of writing a wrong row, is a
:data:`KNOWN_LIMITS` entry, tolerated alike; its minimal case must show it.

Examples per format: ``CDCFLOW_ORACLE_EXAMPLES`` (default 3, the first of them the trivial
one-change case; derandomized, so CI runs the same cases every time).
"""

from __future__ import annotations

import ast
import decimal
import os
import random
import re
import tempfile
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.apply.batch import BatchApplier
from cdcflow.decode.batches import DecodeFunction, flatten
from cdcflow.errors import Code
from cdcflow.formats import decoder_for, embedded_formats
from cdcflow.formats.base import Record
from cdcflow.model import Op, Origin, SourceTable
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.transform.router import Router
from cdcflow_testkit.delivery import KafkaRecord, kafka_batch, micro_batches, produce
from cdcflow_testkit.encoders import Message, SourceChange, encoder_for
from cdcflow_testkit.workload import (
    ALL_TYPES_TABLES,
    Workload,
    capabilities,
    compare_with_mirror,
    tables_for,
)

FORMATS = embedded_formats()
TOPIC = "oracle"
ROW_OPS = {op.value for op in (Op.INSERT, Op.UPDATE, Op.DELETE, Op.SNAPSHOT, Op.TRUNCATE)}


def _settings(default: int) -> settings:
    raw = os.environ.get("CDCFLOW_ORACLE_EXAMPLES", "").strip()
    return settings(
        max_examples=int(raw) if raw else default,
        deadline=None,  # Delta commits take tens of milliseconds each
        derandomize=True,  # the same examples on every run and in CI
        database=None,  # no .hypothesis/ folder in the repository
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --------------------------------------------------------------------------- a scenario


@dataclass(frozen=True)
class Scenario:
    """One case: the workload (``seed``, ``changes``), the delivery faults and the batch
    cuts (``delivery_seed`` seeds the faults' and cuts' randomness)."""

    fmt: str
    seed: int
    changes: int
    partitions: int = 1
    duplicates: bool = False
    replays: bool = False
    truncate_every: int = 0
    p_key_change: float = 0.15
    p_add_column: float = 0.05
    max_per_partition: int = 6
    malformed: int = 0
    delivery_seed: int = 0
    #: the checkpoint is lost once: delivery restarts at a random earlier position of every
    #: partition, cut anew, with micro-batch ids from 0 again (decision 20)
    checkpoint_lost: bool = False
    #: and just before, an apply is interrupted after a random number of its writes; the
    #: restart finishes it from its recorded ranges, as the pipeline does
    interrupted: bool = False


@dataclass
class Reference:
    """The fault-free stream decoded one record at a time.

    Attributes:
        owner: ``(table, seq)`` -> index of the source change it came from.
        content: ``(table, op, key JSON, after JSON)`` -> indexes of the changes with
            that event (several for the truncates of one table).
        source: table -> ``(format, database, schema, table)`` of its events.
    """

    owner: dict[tuple[str, str], int] = field(default_factory=dict)
    content: dict[tuple, set[int]] = field(default_factory=lambda: defaultdict(set))
    source: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)


@dataclass
class Outcome:
    """Every violation of the property a run found, and its size."""

    problems: list[str] = field(default_factory=list)
    batches: int = 0
    records: int = 0


def _routing_key(change: SourceChange, m: Message) -> bytes:
    """What the producer partitions by: the Kafka key; else the row's primary key (the
    after image's, else the before image's); else the table (a truncate)."""
    if m.key is not None:
        return m.key
    row = change.after if change.after is not None else change.before
    if row is not None:
        return orjson.dumps([change.table.table, *(row[c] for c in change.key_columns)])
    return change.table.table.encode()


def _malformed(fmt: str, i: int) -> bytes:
    if decoder_for(fmt).binary_values:
        return bytes([0xFF, 0x00, i % 256])  # neither Avro single-object nor a DTS record
    return b'{"not json ' + str(i).encode()


def _reference(fmt: str, options, encoded: list[list[Message]]) -> tuple[Reference, list[str]]:
    decoder = decoder_for(fmt, options or None)
    ref, problems = Reference(), []
    offset = 0
    for i, messages in enumerate(encoded):
        for m in messages:
            record = Record(m.value, m.key, m.headers, Origin(TOPIC, 0, offset))
            offset += 1
            for r in flatten(decoder.decode_batch([record])).to_pylist():
                if r["kind"] != "event":
                    problems.append(
                        f"change {i} decodes to {r['kind']} {r['reason']}: {r['error']}"
                    )
                    continue
                if r["op"] not in ROW_OPS:  # a marker: Qlik metadata, DMS control record
                    continue
                k = (r["table"], r["seq"])
                if ref.owner.setdefault(k, i) != i:
                    problems.append(f"{k} is the seq of changes {ref.owner[k]} and {i}")
                ref.content[(r["table"], r["op"], r["key"], r["after"])].add(i)
                ref.source[r["table"]] = (r["format"], r["database"], r["schema"], r["table"])
    return ref, problems


def _versions(root: str) -> dict[str, int]:
    return {
        str(p.parent): DeltaTable(str(p.parent)).version() for p in Path(root).glob("**/_delta_log")
    }


def _read(wh: DeltaWarehouse, name: str) -> list[dict]:
    try:
        return wh.read(name, system=True).to_pylist()
    except FileNotFoundError:
        return []


def _apply(
    applier: BatchApplier, fmt: str, options, batch_id: int, records: list[KafkaRecord]
) -> None:
    """Decode one micro-batch as the job's ``mapInArrow`` does (a fresh decoder, loaded
    with the decoder state persisted so far) and apply it."""
    wh = applier.warehouse
    decode = DecodeFunction(fmt, options, wh.system_path("decoder_state"), wh.pipeline_id)
    events = pa.Table.from_batches(list(decode(iter([kafka_batch(TOPIC, records)]))))
    applier.apply(events, batch_id)


def run(s: Scenario) -> Outcome:
    """Drive one scenario through decode and apply; return every violation found."""
    out = Outcome()
    rng = random.Random(s.delivery_seed)
    encoder = encoder_for(s.fmt)
    caps = capabilities(encoder)
    workload = Workload(tables_for(encoder.exact_types, ALL_TYPES_TABLES), seed=s.seed)
    changes = list(
        workload.changes(
            s.changes,
            truncate_every=s.truncate_every if caps.truncate else 0,
            p_key_change=s.p_key_change if caps.key_change else 0.0,
            p_add_column=s.p_add_column if caps.add_column else 0.0,
        )
    )
    encoded = [encoder.encode(c) for c in changes]
    options = dict(encoder.decoder_options(changes) or {})
    ref, out.problems = _reference(s.fmt, options, encoded)
    change_of = {m.value: i for i, ms in enumerate(encoded) for m in ms}

    stream = [(_routing_key(c, m), m) for c, ms in zip(changes, encoded, strict=True) for m in ms]
    bad_values = set()
    for i in range(s.malformed):
        value = _malformed(s.fmt, i)
        bad_values.add(value)
        stream.insert(rng.randrange(len(stream) + 1), (value, Message(value=value)))
    logs = produce(
        stream,
        s.partitions,
        rng,
        duplicate_rate=0.15 if s.duplicates else 0.0,
        replay_rate=0.08 if s.replays else 0.0,
    )
    batches = micro_batches(logs, rng, s.max_per_partition)
    out.batches, out.records = len(batches), sum(len(log) for log in logs)
    crash_after = rng.randrange(len(batches))
    crash_batch = rng.randint(0, crash_after)

    lost_at = rng.randrange(len(batches)) if s.checkpoint_lost else None

    with tempfile.TemporaryDirectory(prefix="cdcflow-oracle-") as root:
        wh = DeltaWarehouse(root, pipeline_id="oracle")
        applier = BatchApplier(wh, Router())
        batch_id = 0
        try:
            for batch_id, records in enumerate(batches):
                if batch_id == lost_at:
                    applier = _lose_checkpoint(
                        applier, s, options, logs, batches[: batch_id + 1], rng, out
                    )
                    break
                _apply(applier, s.fmt, options, batch_id, records)
                if batch_id == crash_after:
                    before = _versions(root)
                    _apply(applier, s.fmt, options, crash_batch, batches[crash_batch])
                    after = _versions(root)
                    if after != before:
                        changed = sorted(
                            Path(p).name for p, v in after.items() if before.get(p) != v
                        )
                        out.problems.append(
                            f"replaying batch {crash_batch} after batch {crash_after} "
                            f"committed to {changed}"
                        )
        except Exception as exc:  # noqa: BLE001 - a crash is one more violation to report
            frames = traceback.extract_tb(exc.__traceback__)
            where = [f for f in frames if "cdcflow" in f.filename][-1]
            out.problems.append(
                f"batch {batch_id} crashed: {type(exc).__name__}: {exc} "
                f"({Path(where.filename).name}:{where.lineno})"
            )
            return out
        dead = _read(wh, "dead_letters")
        changelog = _read(wh, "changelog")
        _check_mirrors(wh, workload, changes, ref, dead, changelog, out.problems)
        _check_changelog(changelog, ref, changes, encoded, logs, change_of, out.problems)
        _check_accounting(_read(wh, "batches"), changelog, logs, out.problems)
        _check_dead_letters(dead, logs, bad_values, out.problems)
    return out


class _Interrupted(Exception):
    """A crash in the middle of an apply."""


def _interrupted_apply(applier, fmt, options, batch_id, records, after_writes: int) -> None:
    """Apply a micro-batch but crash after ``after_writes`` appends (the intent first)."""
    wh = applier.warehouse
    real = wh.append
    count = {"n": 0}

    def append(*args, **kwargs):
        count["n"] += 1
        if count["n"] > after_writes:
            raise _Interrupted(f"crash after {after_writes} writes")
        return real(*args, **kwargs)

    wh.append = append
    try:
        _apply(applier, fmt, options, batch_id, records)
    except _Interrupted:
        pass
    finally:
        del wh.append


def _lose_checkpoint(applier, s, options, logs, consumed, rng, out) -> BatchApplier:
    """The last consumed micro-batch (maybe interrupted), then a restart without the
    checkpoint: the pending apply is finished from its ranges, and delivery restarts at a
    random position at or before what was consumed, with new cuts and ids from 0."""
    last = consumed[-1]
    if s.interrupted:
        _interrupted_apply(applier, s.fmt, options, len(consumed) - 1, last, rng.randint(1, 6))
    else:
        _apply(applier, s.fmt, options, len(consumed) - 1, last)
    applier = BatchApplier(applier.warehouse, Router())  # a new process
    pending = applier.ledger.pending()
    if pending is not None:
        records = [
            r
            for (topic, p), (first, last_offset) in pending.ranges.items()
            for r in logs[p][first : last_offset + 1]
        ]
        _apply(applier, s.fmt, options, -1, records)
    position = [0] * len(logs)
    for batch in consumed:
        for r in batch:
            position[r.partition] = max(position[r.partition], r.offset + 1)
    restart = [rng.randint(0, pos) for pos in position]
    again = micro_batches([log[at:] for log, at in zip(logs, restart, strict=True)], rng, 6)
    out.batches += len(again)
    for delivery_id, records in enumerate(again):
        _apply(applier, s.fmt, options, delivery_id, records)
    return applier


# --------------------------------------------------------------------------- the property


_ROW_KEY = re.compile(r"row (\(.*?\))")


def _check_mirrors(wh, workload, changes, ref, dead, changelog, problems) -> None:
    """Property 1. Each difference says what is known about its row: a key it moved
    from, its table's apply dead letters, a truncate it should not have outlived."""
    moved_from = {
        (c.table.table, tuple(c.after[k] for k in c.key_columns)): tuple(
            c.before[k] for k in c.key_columns
        )
        for c in changes
        if c.op is Op.UPDATE and any(c.before[k] != c.after[k] for k in c.key_columns)
    }
    apply_dead = {d["target_table"]: d["message"] for d in dead if d["stage"] == "apply"}
    # keys whose partial changes the mirror refused: their rows are unknown (a limit)
    unknown: dict[str, set[str]] = defaultdict(set)
    for d in dead:
        if d["stage"] == "apply" and d["code"] == Code.MISSING_OLD_ROW:
            unknown[d["target_table"]].add(orjson.loads(d["raw_value"])["key"])
    truncated_at: dict[str, str] = {}
    for r in changelog:
        if r["op"] == Op.TRUNCATE.value and r["seq"] > truncated_at.get(r["table"], ""):
            truncated_at[r["table"]] = r["seq"]
    for spec in workload.tables:
        expected = workload.expected_rows(spec.name)
        if spec.name not in ref.source:
            if expected:
                problems.append(
                    f"{spec.name}: {len(expected)} rows at the source, no event decoded"
                )
            continue
        target = Router().target(*ref.source[spec.name])
        try:
            mirror = wh.read(target)
        except FileNotFoundError:
            if expected:
                problems.append(f"{target}: no mirror, the source has {len(expected)} rows")
            continue
        stored_seq = {
            tuple(r[k] for k in spec.key_columns): r["_cdc_seq"] for r in mirror.to_pylist()
        }
        unknown_keys = {
            tuple(orjson.loads(k)[c] for c in spec.key_columns) for k in unknown.get(target, ())
        }
        for diff in compare_with_mirror(expected, mirror, spec.key_columns):
            found = _ROW_KEY.search(diff)
            if found is None:  # the row count
                notes = [f"{len(unknown_keys)} MISSING_OLD_ROW keys"] if unknown_keys else []
                problems.append(f"{target}: {diff}" + "".join(f" [{n}]" for n in notes))
                continue
            key = ast.literal_eval(found.group(1))
            notes = []
            if key in unknown_keys and diff.startswith("missing row"):
                notes.append("its partial changes are MISSING_OLD_ROW dead letters")
            if (spec.name, key) in moved_from:
                notes.append(f"moved here from key {moved_from[(spec.name, key)]}")
            seq = stored_seq.get(key)
            if diff.startswith("unexpected") and seq and seq < truncated_at.get(spec.name, ""):
                notes.append(f"stored at seq {seq}, before the table's truncate")
            if target in apply_dead:
                notes.append(f"the table has apply dead letters: {apply_dead[target][:120]}")
            problems.append(f"{target}: {diff}" + "".join(f" [{n}]" for n in notes))


def _check_changelog(changelog, ref, changes, encoded, logs, change_of, problems) -> None:
    """Property 2."""
    coords = Counter((r["topic"], r["partition"], r["offset"], r["event_index"]) for r in changelog)
    problems += [f"changelog holds {c} {n} times" for c, n in coords.items() if n > 1]
    record_change = {(r.partition, r.offset): change_of.get(r.value) for log in logs for r in log}
    covered: set[int] = set()
    seen: dict[tuple[str, str], tuple] = {}
    for r in changelog:
        if r["op"] not in ROW_OPS:
            continue
        k, at = (r["table"], r["seq"]), (r["partition"], r["offset"])
        i = ref.owner.get(k)
        if i is None:  # the event of the record's change under another seq, or none
            same = ref.content.get((r["table"], r["op"], r["key"], r["after"]), set())
            i = record_change.get(at) if record_change.get(at) in same else None
            problems.append(
                f"changelog event {k} {r['op']} at {at[0]}/{at[1]} is no source change"
                if i is None
                else f"changelog event {k} at {at[0]}/{at[1]} is source change {i} under another seq"
            )
        if i is None:
            continue
        covered.add(i)
        if record_change.get(at) != i:
            problems.append(
                f"changelog event {k} at {at} is change {i}, the record change {record_change.get(at)}"
            )
        what = (r["op"], r["key"], r["after"])
        if seen.setdefault(k, what) != what:
            problems.append(f"changelog {k}: {what} and {seen[k]} disagree")
    for i in sorted({i for i, ms in enumerate(encoded) if ms} - covered):
        c = changes[i]
        problems.append(
            f"source change {i} ({c.op.value} {c.table.table} seq {c.seq}) is not in the changelog"
        )


def _check_accounting(batches, changelog, logs, problems) -> None:
    """Property 3."""
    with_changes: dict[tuple[int, int], set[int]] = defaultdict(set)
    events: Counter = Counter()
    for r in changelog:
        events[(r["batch_id"], r["partition"])] += 1
        if r["op"] in ROW_OPS:
            with_changes[(r["batch_id"], r["partition"])].add(r["offset"])
    ranges: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for b in batches:
        at = (b["batch_id"], b["partition"])
        first, last = b["first_offset"], b["last_offset"]
        ranges[b["partition"]].append((first, last))
        if b["records"] != last - first + 1:
            problems.append(f"batch {at}: {b['records']} records in offsets {first}..{last}")
        parts = len(with_changes[at]) + b["joined"] + b["skipped"] + b["dead_letters"]
        if b["records"] != parts:
            problems.append(
                f"batch {at}: {b['records']} records, but {len(with_changes[at])} with changes "
                f"+ {b['joined']} joined + {b['skipped']} skipped + {b['dead_letters']} dead"
            )
        if b["events"] != events[at]:
            problems.append(f"batch {at}: {b['events']} events, {events[at]} in the changelog")
    for p, log in enumerate(logs):
        spans = sorted(ranges.get(p, []))
        if [o for first, last in spans for o in range(first, last + 1)] != list(range(len(log))):
            problems.append(f"partition {p}: offsets accounted {spans}, log 0..{len(log) - 1}")


def _check_dead_letters(dead, logs, bad_values, problems) -> None:
    """Property 5."""
    want = {(r.partition, r.offset): r.value for log in logs for r in log if r.value in bad_values}
    got = Counter((d["partition"], d["offset"]) for d in dead)
    for d in dead:
        at = (d["partition"], d["offset"])
        if at not in want:
            problems.append(
                f"unexpected dead letter at {at[0]}/{at[1]}: {d['stage']} {d['code']} "
                f"{d['target_table'] or ''}: {d['message']}"
            )
        elif (
            got[at] > 1
            or d["raw_value"] != want[at]
            or d["topic"] != TOPIC
            or d["stage"] != "decode"
            or not d["code"]
        ):
            problems.append(f"dead letter at {at}: {d}")
    problems += [
        f"malformed record at {p}/{o} is no dead letter" for p, o in want if (p, o) not in got
    ]


# --------------------------------------------------------------------------- known bugs


@dataclass(frozen=True)
class KnownBug:
    """A violation found by this oracle, not fixed yet: where, its exact symptom (a regex
    over a problem line), its minimal case (``None``: a test of its own below), the
    formats it shows in (at least one) and ``shows_in``: whether a case has what the bug
    needs to show (a delivery fault, a second partition)."""

    name: str
    where: str
    symptom: str
    case: Scenario | None
    formats: frozenset[str]
    shows_in: Callable[[Scenario], bool]

    def __post_init__(self) -> None:
        if not self.formats:
            raise ValueError(f"known bug {self.name}: name the formats it shows in")

    def explains(self, case: Scenario, problem: str) -> bool:
        """Whether ``problem``, found in ``case``, is this bug."""
        return (
            case.fmt in self.formats
            and self.shows_in(case)
            and re.search(self.symptom, problem) is not None
        )


KNOWN_BUGS: list[KnownBug] = [
    KnownBug(
        # SharePlex UPDATE customers SET id = 4 WHERE id = 1 carries only `id`; it is
        # applied in the micro-batch of INSERT 1 (seq 1004), before the updates of 1 at
        # seq 1017 and 1018 (the insert's partition, later batches): row 4 takes the
        # insert's name and email, and the late updates are dropped by the move's
        # tombstone of 1. Nothing in the format says how many changes of the old key come
        # before the move (decision 64); a late change of a key a partial move took away
        # is not recognised (its tombstone does not name the new key)
        "partial-key-change-before-its-old-rows-updates-keeps-stale-columns",
        "sinks/mirror.py + sinks/tombstones.py (a late change of a key moved away)",
        r"got .* \[moved here from key",
        Scenario(
            "shareplex-json",
            seed=2862,
            changes=26,
            partitions=2,
            max_per_partition=3,
            delivery_seed=6763,
        ),
        frozenset({"shareplex-json"}),
        # the move overtakes its old row's updates: keyed to another partition
        lambda s: s.partitions > 1,
    ),
]

#: What a format does not carry, found by this oracle: cdcflow refuses the changes with a
#: stable code (dead letters) rather than write a wrong row, so the mirror lacks their
#: rows. Each is tolerated as a known bug is (its formats, the cases that can show it,
#: its symptom), and its minimal case must show it (test_known_limit_minimal_case).
KNOWN_LIMITS: list[KnownBug] = [
    KnownBug(
        # SharePlex UPDATE order_lines SET line_no = 4 WHERE (order_id, line_no) = (1, 2)
        # carries only the key columns; its message (keyed by the new key) is in partition
        # 0 and applied in batch 1, before INSERT (1, 2) from partition 1 (batch 2): the
        # old row is not stored yet, so the columns the moved row lacks are unknown. It was
        # a row with NULL sku and qty; it is a MISSING_OLD_ROW dead letter, and so is every
        # later partial change of (1, 4) (docs/formats/shareplex-json.md, decision 64)
        "partial-key-change-before-its-old-row-arrives",
        "docs/formats/shareplex-json.md (Limits)",
        r"MISSING_OLD_ROW",
        Scenario("shareplex-json", seed=8, changes=11, partitions=2, delivery_seed=2),
        frozenset({"shareplex-json"}),
        # the move overtakes the old row's insert: keyed to another partition
        lambda s: s.partitions > 1,
    ),
]

#: Minimal cases of violations this oracle found and that are fixed (commit 9977105; a
#: batch of only TYPE_CONFLICT changes crashing the apply is fixed too, and pinned by
#: test_a_batch_of_only_type_conflicts_dead_letters_them),
#: kept as regression tests: (what broke, the case).
FIXED: list[tuple[str, Scenario]] = [
    # a time column (stored as string) stopped its table at the table's second batch,
    # and the replay of a batch wrote schema changes and dead letters again
    ("time-column-stopped-its-table", Scenario("debezium-json", seed=0, changes=1)),
    # orjson wrote time(8, 15, 41, 68916) as "08:15:41.68916"
    ("time-lost-a-leading-zero-of-its-microseconds", Scenario("debezium-json", 24, 2)),
    # a batch with only the DMS create-table record of an existing mirror crashed
    ("ddl-only-batch-crashed", Scenario("aws-dms-json", 0, 1, partitions=2, max_per_partition=2)),
    # TRUNCATE orders in batch 0, before its mirror existed, was forgotten: the older
    # insert and key change of batch 1 (another partition) left row 2 behind
    (
        "truncate-before-its-mirror-was-forgotten",
        Scenario(
            "debezium-json", 6, 10, partitions=3, replays=True, truncate_every=9, p_add_column=0
        ),
    ),
    # SharePlex UPDATE SET id = 2 (only `id` in the image) left the moved row's other
    # columns NULL
    ("partial-key-change-lost-columns", Scenario("shareplex-json", seed=8, changes=10)),
    # canal-json seq held the Kafka offset: a change copied to another offset or
    # partition had another seq, so the changelog held it twice (decision 62: DTS's `id`
    # names one operation, id_semantics="operation" leaves the offset out)
    ("canal-seq-held-the-kafka-offset", Scenario("canal-json", seed=2, changes=2, partitions=2)),
    (
        "canal-seq-held-the-kafka-offset-with-copies-and-replays",
        Scenario("canal-json", seed=2, changes=30, partitions=2, duplicates=True, replays=True),
    ),
    # DRS "decimal" without precision was typed by the batch's first row: a wider value
    # later in the batch was a TYPE_CONFLICT dead letter
    ("undeclared-decimal-typed-by-the-first-row", Scenario("drs-json", seed=29, changes=3)),
    # issue 8: a deleted checkpoint restarted Spark's batch ids at 0; batches at or below
    # the warehouse's last transaction version were skipped though they held other offsets
    (
        "deleted-checkpoint-skipped-and-reapplied-records",
        Scenario(
            "dataworks-json",
            5,
            30,
            partitions=2,
            duplicates=True,
            replays=True,
            max_per_partition=5,
            delivery_seed=5,
            checkpoint_lost=True,
            interrupted=True,
        ),
    ),
]


def unexplained(case: Scenario, problems: list[str]) -> list[str]:
    """The problems of ``case`` no known bug explains."""
    known = [*KNOWN_BUGS, *KNOWN_LIMITS]
    return [p for p in problems if not any(b.explains(case, p) for b in known)]


# --------------------------------------------------------------------------- the tests


@st.composite
def scenarios(draw, fmt: str, malformed: int = 0) -> Scenario:
    return Scenario(
        fmt=fmt,
        seed=draw(st.integers(0, 10_000)),
        changes=draw(st.integers(1, 40)),
        partitions=draw(st.integers(1, 3)),
        duplicates=draw(st.booleans()),
        replays=draw(st.booleans()),
        truncate_every=draw(st.sampled_from([0, 0, 9, 17])),
        max_per_partition=draw(st.integers(3, 12)),
        malformed=malformed,
        delivery_seed=draw(st.integers(0, 10_000)),
        checkpoint_lost=draw(st.booleans()),
        interrupted=draw(st.booleans()),
    )


@pytest.mark.parametrize("fmt", FORMATS)
@_settings(3)
@given(data=st.data())
def test_every_mirror_equals_its_source_and_every_offset_is_accounted_for(fmt, data):
    s = data.draw(scenarios(fmt))
    problems = unexplained(s, run(s).problems)
    assert problems == [], f"{s}: {problems[:8]}"


@pytest.mark.parametrize("fmt", ["debezium-json", "dataworks-json", "dts-avro"])
@_settings(3)
@given(data=st.data())
def test_malformed_records_are_exactly_the_dead_letters(fmt, data):
    s = data.draw(scenarios(fmt, malformed=3))
    problems = unexplained(s, run(s).problems)
    assert problems == [], f"{s}: {problems[:8]}"


@pytest.mark.parametrize(
    "bug",
    [
        pytest.param(
            b, id=b.name, marks=pytest.mark.xfail(strict=True, reason=f"{b.name} ({b.where})")
        )
        for b in KNOWN_BUGS
        if b.case is not None
    ],
)
def test_known_bug_minimal_case(bug):
    problems = run(bug.case).problems
    assert bug.case is not None
    assert not [p for p in problems if bug.explains(bug.case, p)], problems[:8]


@pytest.mark.parametrize("case", [c for _, c in FIXED], ids=[name for name, _ in FIXED])
def test_fixed_bug_minimal_case(case):
    problems = unexplained(case, run(case).problems)
    assert problems == [], problems[:8]


#: a problem line each known bug's symptom matches, as the checks above word it
_SYMPTOM_LINES = {
    "partial-key-change-before-its-old-rows-updates-keeps-stale-columns": (
        "public.customers: row (4,) column 'name': expected None, got 'charlie 7438' "
        "[moved here from key (1,)]"
    ),
    "partial-key-change-before-its-old-row-arrives": (
        "public.order_lines: missing row (1, 4) [its partial changes are MISSING_OLD_ROW "
        "dead letters] [moved here from key (1, 2)]"
    ),
}


@pytest.mark.parametrize("limit", KNOWN_LIMITS, ids=[b.name for b in KNOWN_LIMITS])
def test_known_limit_minimal_case(limit):
    """The limit shows in its minimal case (the changes are dead letters with its code),
    and nothing else does: no row with values the source never had."""
    problems = run(limit.case).problems
    assert [p for p in problems if limit.explains(limit.case, p)], problems[:8]
    assert unexplained(limit.case, problems) == [], problems[:8]
    assert not [p for p in problems if "got None" in p], problems[:8]


_KNOWN = [*KNOWN_BUGS, *KNOWN_LIMITS]


@pytest.mark.parametrize("bug", _KNOWN, ids=[b.name for b in _KNOWN])
def test_a_known_bugs_symptom_elsewhere_is_not_explained(bug):
    """The same text in another format, or in a case without the faults the bug needs
    (one partition, no copies, no replays), is a new bug: it fails the random tests."""
    line = _SYMPTOM_LINES[bug.name]
    case = bug.case or Scenario(sorted(bug.formats)[0], seed=0, changes=1, partitions=2)
    assert bug.explains(case, line)
    other_format = next(f for f in FORMATS if f not in bug.formats)
    assert not bug.explains(replace(case, fmt=other_format), line)
    calm = replace(case, partitions=1, duplicates=False, replays=False, checkpoint_lost=False)
    assert not bug.explains(calm, line)
    assert unexplained(calm, [line]) == [line]


@_settings(30)
@given(
    n=st.integers(0, 80),
    partitions=st.integers(1, 4),
    rng=st.randoms(use_true_random=False),
)
def test_delivery_keeps_key_order_and_batches_hold_every_record_once(n, partitions, rng):
    messages = [
        (b"k%d" % (i % 5), Message(value=b"%d" % i, key=b"k%d" % (i % 5))) for i in range(n)
    ]
    logs = produce(messages, partitions, rng, duplicate_rate=0.2, replay_rate=0.2)
    for p, log in enumerate(logs):
        assert [r.offset for r in log] == list(range(len(log)))
        assert all(r.partition == p for r in log)
    # without its duplicates and replays, each key's messages are in order, in one partition
    for key in {m.key for _, m in messages}:
        where = {r.partition for log in logs for r in log if r.key == key}
        assert len(where) == 1
        firsts, seen = [], set()
        for r in logs[where.pop()]:
            if r.key == key and r.value not in seen:
                seen.add(r.value)
                firsts.append(r.value)
        assert firsts == [m.value for _, m in messages if m.key == key]
    batches = micro_batches(logs, rng, max_per_partition=3)
    assert all(batches)
    got = [(r.partition, r.offset) for b in batches for r in b]
    assert sorted(got) == [(r.partition, r.offset) for log in logs for r in log]
    for p in range(partitions):
        assert [o for q, o in got if q == p] == list(range(len(logs[p])))
    assert kafka_batch(TOPIC, [r for b in batches for r in b]).num_rows == len(got)


@_settings(30)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 120))
def test_the_workload_state_is_its_changes_replayed(seed, n):
    """The oracle's own ground truth: replaying the emitted changes on empty tables gives
    the workload's state; key changes and added columns do occur."""
    workload = Workload(ALL_TYPES_TABLES, seed=seed)
    tables: dict[str, dict[tuple, dict]] = {t.name: {} for t in ALL_TYPES_TABLES}
    moved = 0
    for c in workload.changes(n, truncate_every=13, p_key_change=0.3, p_add_column=0.05):
        rows = tables[c.table.table]

        def key(row, columns=c.key_columns):
            return tuple(row[k] for k in columns)

        assert all(set(img) == set(c.columns) for img in (c.before, c.after) if img is not None)
        if c.op is Op.TRUNCATE:
            rows.clear()
        elif c.op is Op.INSERT:
            assert key(c.after) not in rows
            rows[key(c.after)] = dict(c.after)
        else:  # the before image is the stored row (NULL in columns added since)
            stored = rows.pop(key(c.before))
            assert {col: stored.get(col) for col in c.columns} == dict(c.before)
            if c.op is Op.UPDATE:
                assert key(c.after) not in rows
                moved += key(c.before) != key(c.after)
                rows[key(c.after)] = dict(c.after)
    for name, rows in tables.items():
        width = workload.columns(name)
        assert sorted(rows) == sorted(workload.state[name])
        for k, row in rows.items():
            assert {c: row.get(c) for c in width} == workload.state[name][k]
    if n >= 100:
        assert moved and workload.added_columns


def _canal_insert_update_replay(
    tmp_path, seqs: tuple[int, int], options: dict
) -> tuple[list, list[dict]]:
    """INSERT (1, 'a') then UPDATE to (1, 'b'), written with ``id`` = ``seqs``, applied
    in batch 0; the insert again at a higher offset (a replay) in batch 1. The mirror's
    names, and the changelog."""
    encoder = encoder_for("canal-json")
    table = SourceTable("", "shop", "", "items")
    columns = {"id": "int64", "name": "string"}
    a, b = {"id": 1, "name": "a"}, {"id": 1, "name": "b"}
    ts = 1_700_000_000_000
    changes = [
        SourceChange(Op.INSERT, table, columns, ("id",), None, a, seq=seqs[0], ts_ms=ts),
        SourceChange(Op.UPDATE, table, columns, ("id",), a, b, seq=seqs[1], ts_ms=ts),
    ]
    insert, update = (m for c in changes for m in encoder.encode(c))
    log = [KafkaRecord(0, i, m.key, m.value) for i, m in enumerate([insert, update, insert])]
    applier = BatchApplier(DeltaWarehouse(str(tmp_path)))
    _apply(applier, "canal-json", options, 0, log[:2])
    _apply(applier, "canal-json", options, 1, log[2:])  # the insert, replayed
    wh = applier.warehouse
    return wh.read("shop.items")["name"].to_pylist(), _read(wh, "changelog")


def test_a_replayed_dts_canal_message_never_overwrites_a_newer_change(tmp_path):
    """DTS gives every operation its own ``id`` (decision 62): with
    ``id_semantics="operation"`` the replay has its original's ``seq`` (no Kafka offset
    in it), below the update's, so it changes nothing, and the changelog taken distinct
    on (table, key, seq, op) (decision 18) holds the insert once. Same ``es``: only
    ``id`` orders."""
    names, changelog = _canal_insert_update_replay(tmp_path, (7, 8), {"id_semantics": "operation"})
    assert names == ["b"]
    inserts = [r for r in changelog if r["op"] == Op.INSERT.value]
    assert sorted(r["offset"] for r in inserts) == [0, 2]  # the original and the replay
    assert len({(r["table"], r["key"], r["seq"], r["op"]) for r in inserts}) == 1


@pytest.mark.xfail(
    strict=True,
    reason="limit of canal-json id_semantics=batch (decision 62): a Canal batch's messages "
    "share es and id, so only the Kafka offset orders them and a replay looks newer",
)
def test_a_replayed_canal_message_never_overwrites_a_newer_one_of_its_canal_batch(tmp_path):
    """Open-source Canal gives every message of one Canal batch the same ``id`` and
    ``es``; the decoder (default ``id_semantics="batch"``) orders them by Kafka offset, so
    a replay (at a higher offset) of the batch's insert outranks the batch's later update.
    The message carries nothing that tells a replay from a later message of its batch;
    the limit is on the format's page (docs/formats/canal-json.md)."""
    assert _canal_insert_update_replay(tmp_path, (7, 7), {})[0] == ["b"]


def test_a_batch_of_only_type_conflicts_dead_letters_them(tmp_path):
    """The batch's one change of ``shop.public.items`` declares ``decimal(5,2)`` and
    carries 123456.78: it must become a TYPE_CONFLICT dead letter, not fail the batch."""
    table = SourceTable("", "shop", "public", "items")
    change = SourceChange(
        Op.INSERT,
        table,
        {"id": "int64", "amount": "decimal(5,2)"},
        ("id",),
        None,
        {"id": 1, "amount": decimal.Decimal("123456.78")},
        seq=5,
        ts_ms=1_700_000_000_000,
    )
    (m,) = encoder_for("debezium-json").encode(change)
    applier = BatchApplier(DeltaWarehouse(str(tmp_path)))
    _apply(applier, "debezium-json", {}, 0, [KafkaRecord(0, 0, m.key, m.value)])
    dead = applier.warehouse.read("dead_letters", system=True).to_pylist()
    assert [(d["offset"], d["stage"], d["code"]) for d in dead] == [(0, "apply", "TYPE_CONFLICT")]

"""``cdcflow dead-letters replay`` SIGKILLed at each of its fences, then run again.

One warehouse holds dead letters of both stages: source ``a`` read a topic of Debezium
messages as canal-json (every record a *decode* letter: its bytes are stored); source
``b`` read its topic right, but a table ``filter`` that fails on ``b_customers``' rows with
``active`` true refused those events (*apply* letters, ``EXPRESSION_FAILED``: replay reads
their records again from the broker). The fix is in the configuration: ``a``'s format is
debezium-json, the filter is gone.

A full replay calls its fence :data:`FENCES` times: per source, its generation's
:class:`~cdcflow.apply.batch.BatchApplier` before the apply's first commit and before its
completion. For each fence ``k`` a replay in a child process kills itself with SIGKILL at
call ``k`` (the letters taken, part of the apply written or not); then ``cdcflow
dead-letters replay CONFIG --yes`` finishes it: every mirror equals its source (the
refused events older than rows that were applied are dropped by the mirrors' sequence
guard), each record's events are in ``_cdcflow/changelog`` once, each letter is marked
``applied`` in one generation, a further replay has nothing to do, the lease is free.
With ``b``'s filter left in place its letters fail again, and a killed replay's letters
are still marked ``dead_letter`` by the run that finishes it.

The warehouse is built without Spark, the way the pipeline applies a micro-batch: records
read from the broker (tansu), decoded by the source's ``DecodeFunction``, applied by
``applier_for``'s ``BatchApplier``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdcflow.cli import main
from cdcflow.commands.dead_letters import LetterFilter, read_letters
from cdcflow.commands.replay import replay
from cdcflow.config import PipelineConfig, load_config
from cdcflow.decode.batches import DecodeFunction
from cdcflow.event_schema import EVENT_SCHEMA, KIND_EVENT
from cdcflow.runtime.pipeline import applier_for
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.system_tables import REPLAYS, REPLAYS_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.source.kafka.admin import read_range
from cdcflow_testkit.encoders import encoder_for
from cdcflow_testkit.workload import Workload, compare_with_mirror, tables_for

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "kill"
#: source -> (workload seed, changes); ``a`` is read with the wrong format, ``b`` filtered
SOURCES = {"a": (3, 30), "b": (27, 40)}
#: fence calls of a full replay: two per source (BatchApplier: before the first commit and
#: before the completion), the sources one after the other
FENCES = 2 * len(SOURCES)
FILTERED = "shop.public.b_customers"
#: 1 / 0 for every row with active true: those events are refused (EXPRESSION_FAILED)
FILTER = f"tables:\n  - {{match: {FILTERED}, filter: '1 / if(active, 0, 1) = 1'}}\n"


@dataclass
class Before:
    """The pipeline folder (configuration already fixed, warehouse with the letters) that
    each test copies, and what the source holds."""

    folder: Path
    topics: dict[str, str]  # source -> topic
    workloads: dict[str, Workload]
    letters: dict[str, int]  # source -> dead letters
    events: Counter  # (topic, partition, offset, event_index, op, seq) of every event


def _config_text(broker, topics: dict[str, str], fixed: bool) -> str:
    wrong = "debezium-json" if fixed else "canal-json"
    text = (
        f"pipeline_id: {PIPELINE}\nwarehouse: wh\ncheckpoint: ck\n"
        f"kafka: {{bootstrap_servers: '{broker.bootstrap_servers}'}}\n"
        "sources:\n"
        f"  - {{name: a, format: {wrong}, topics: [{topics['a']}], table_prefix: a_}}\n"
        f"  - {{name: b, format: debezium-json, topics: [{topics['b']}], table_prefix: b_}}\n"
    )
    return text if fixed else text + FILTER


def _decoded(fmt: str, records: pa.Table, wh: DeltaWarehouse | None = None) -> pa.Table:
    """The records decoded as the job's ``mapInArrow`` does (with the source's state)."""
    decode = DecodeFunction(
        fmt,
        {},
        state_path=None if wh is None else wh.system_path("decoder_state"),
        state_key="" if wh is None else wh.pipeline_id,
    )
    return pa.Table.from_batches(list(decode(iter(records.to_batches()))), schema=EVENT_SCHEMA)


def _records(config: PipelineConfig, topic: str, first: int, last: int) -> pa.Table:
    options = {**config.kafka.reader_options(), "subscribe": topic}
    return pa.Table.from_batches(list(read_range(options, topic, 0, first, last)))


def _identities(events: pa.Table) -> Counter:
    rows = (
        events.filter(pc.equal(events["kind"], KIND_EVENT))
        if "kind" in events.column_names
        else events
    )
    cols = ["topic", "partition", "offset", "event_index", "op", "seq"]
    return Counter(tuple(r.values()) for r in rows.select(cols).to_pylist())


@pytest.fixture(scope="module")
def before(broker, tmp_path_factory) -> Before:
    """The warehouse after two micro-batches per source, and the configuration fixed."""
    folder = tmp_path_factory.mktemp("replay-kills") / "pipeline"
    folder.mkdir()
    enc = encoder_for("debezium-json")
    run = uuid.uuid4().hex[:8]  # the broker is the session's: topics of this module's own
    topics = {name: f"replay-kills.{name}.{run}" for name in SOURCES}
    workloads, sizes = {}, {}
    for name, (seed, changes) in SOURCES.items():
        workloads[name] = Workload(tables_for(enc.exact_types), seed=seed)
        messages = [m for c in workloads[name].changes(changes) for m in enc.encode(c)]
        broker.create_topic(topics[name], partitions=1)
        broker.produce(topics[name], messages, partition=0)
        sizes[name] = len(messages)  # a new topic of one partition: offsets 0..n-1
    cfg = folder / "pipeline.yaml"
    cfg.write_text(_config_text(broker, topics, fixed=False))
    config = load_config(cfg)
    events: Counter = Counter()
    for source in config.sources:
        wh = DeltaWarehouse(config.warehouse, pipeline_id=f"{PIPELINE}.{source.name}")
        applier = applier_for(config, wh, source)
        topic = source.topics[0]
        n = sizes[source.name]
        for delivery, (first, last) in enumerate([(0, n // 2 - 1), (n // 2, n - 1)]):
            records = _records(config, topic, first, last)
            applier.apply(_decoded(source.format, records, wh), delivery)
            events += _identities(_decoded("debezium-json", records))
    wh = DeltaWarehouse(config.warehouse)
    letters = read_letters(wh).to_pylist()
    by_topic = Counter((r["topic"], r["stage"], r["code"], r["target_table"]) for r in letters)
    decode_letters = [k for k in by_topic if k[0] == topics["a"]]
    assert [k[1] for k in decode_letters] == ["decode"]
    assert set(by_topic) - set(decode_letters) == {
        (topics["b"], "apply", "EXPRESSION_FAILED", FILTERED)
    }, "b's only letters are its filter's"
    count = {name: sum(n for k, n in by_topic.items() if k[0] == topics[name]) for name in SOURCES}
    assert count["a"] == SOURCES["a"][1] and count["b"] >= 5, count
    # the guard's case: refused changes older than a change of their row that was applied
    # (an update of a row whose before image has active true is refused too)
    refused = [orjson.loads(r["raw_value"]) for r in letters if r["stage"] == "apply"]
    applied = wh.read("changelog", system=True)
    applied = applied.filter(pc.equal(applied["topic"], topics["b"]))
    applied = applied.filter(pc.equal(applied["table"], "customers"))
    newest: dict[str, str] = {}
    for row in applied.select(["key", "seq"]).to_pylist():  # seq: text that sorts in order
        newest[row["key"]] = max(newest.get(row["key"], ""), row["seq"])
    guarded = [r for r in refused if r["seq"] < newest.get(r["key"], "")]
    assert len(guarded) >= 2, (refused, newest)
    cfg.write_text(_config_text(broker, topics, fixed=True))  # the fix
    return Before(folder, topics, workloads, count, events)


def _copy(before: Before, tmp_path: Path) -> Path:
    folder = tmp_path / "pipeline"
    shutil.copytree(before.folder, folder)
    return folder / "pipeline.yaml"


def _marks(wh: DeltaWarehouse) -> list[dict]:
    return wh.read_system(REPLAYS, REPLAYS_SCHEMA).to_pylist()


def _replayed(before: Before, name: str) -> str:
    n = before.letters[name]
    return f"{PIPELINE}.{name}: replay 1: {n} dead letters -> {n} events; {n} applied"


def _check_finished(before: Before, cfg: Path, capsys) -> None:
    """Every record applied once, every letter done, nothing left, the lease free."""
    wh = DeltaWarehouse(str(cfg.parent / "wh"))
    problems = {
        f"{name}_{spec.name}": compare_with_mirror(
            w.expected_rows(spec.name),
            wh.read(f"shop.public.{name}_{spec.name}"),
            spec.key_columns,
        )
        for name, w in before.workloads.items()
        for spec in w.tables
    }
    assert {t: p for t, p in problems.items() if p} == {}
    changelog = _identities(wh.read("changelog", system=True))
    assert changelog == before.events, (
        f"missing: {before.events - changelog}; more than once: {changelog - before.events}"
    )
    letters = read_letters(wh).to_pylist()
    assert len(letters) == sum(before.letters.values())  # none failed again
    marks = _marks(wh)
    outcomes: dict[tuple, list] = {}
    for m in marks:
        where = (m["source"], m["generation"], m["topic"], m["offset"], m["stage"])
        outcomes.setdefault(where, []).append(m["outcome"])
    for name, topic in before.topics.items():
        mine = {k: v for k, v in outcomes.items() if k[0] == f"{PIPELINE}.{name}"}
        assert {k[1] for k in mine} == {1}, "one generation"
        expected = {
            (f"{PIPELINE}.{name}", 1, topic, r["offset"], r["stage"])
            for r in letters
            if r["topic"] == topic
        }
        assert set(mine) == expected
        assert all(sorted(map(str, v)) == ["None", "applied"] for v in mine.values()), mine
    assert main(["dead-letters", "replay", str(cfg), "--yes"]) == 0
    assert capsys.readouterr().out == "".join(
        f"{PIPELINE}.{name}: no dead letter to replay\n" for name in SOURCES
    )
    lease = PipelineLease(str(cfg.parent / "wh"), PIPELINE).read()
    assert lease is not None and lease.released


def test_a_full_replay_calls_its_fence_FENCES_times(before, tmp_path, capsys):
    """The fence points the kills below go through, and a replay not killed passes the
    same checks."""
    cfg = _copy(before, tmp_path)
    calls: list[int] = []
    reports = replay(load_config(cfg), fence=lambda: calls.append(1))
    assert len(calls) == FENCES
    assert [re.sub(r" \(.*\)$", "", r.describe()) for r in reports] == [
        _replayed(before, name) for name in SOURCES
    ]
    _check_finished(before, cfg, capsys)


_CHILD = """
import os, signal, sys
from cdcflow.commands.replay import replay
from cdcflow.config import load_config

config, kill_at, calls = load_config(sys.argv[1]), int(sys.argv[2]), []

def fence():
    calls.append(1)
    if len(calls) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

replay(config, fence=fence)
sys.exit(f"the replay called its fence {len(calls)} times, never a {kill_at}th")
"""


def _killed_at(cfg: Path, k: int) -> None:
    """A replay of ``cfg`` in a child process that SIGKILLs itself at fence call ``k``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "testkit" / "src")]),
    }
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(cfg), str(k)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]


@pytest.mark.parametrize("k", range(1, FENCES + 1))
def test_a_replay_sigkilled_at_a_fence_is_finished_by_the_next_exactly_once(
    before, tmp_path, capsys, k
):
    """Killed at fence ``k`` in a child process, the replay is finished by the next one:
    the unfinished generation first, under its own apply id, nothing applied twice."""
    cfg = _copy(before, tmp_path)
    _killed_at(cfg, k)

    # what the kill left: the killed source's letters taken (outcome null), no outcome;
    # at an even fence (before the completion) its apply's changelog written already
    names = list(SOURCES)
    killed = names[(k - 1) // 2]
    wh = DeltaWarehouse(str(cfg.parent / "wh"))
    marks = _marks(wh)
    unfinished = Counter(m["source"] for m in marks if m["outcome"] is None)
    unfinished -= Counter(m["source"] for m in marks if m["outcome"] is not None)
    assert dict(unfinished) == {f"{PIPELINE}.{killed}": before.letters[killed]}
    written = names[: names.index(killed) + (k % 2 == 0)]
    not_yet = sum(n for name, n in before.letters.items() if name not in written)
    changelog = wh.read("changelog", system=True).num_rows
    assert changelog == sum(before.events.values()) - not_yet  # a letter is one event here

    assert main(["dead-letters", "replay", str(cfg), "--yes"]) == 0
    out = [re.sub(r" \(.*\)$", "", line) for line in capsys.readouterr().out.splitlines()]
    done_before = names[: names.index(killed)]
    assert out == [
        f"{PIPELINE}.{name}: no dead letter to replay"
        if name in done_before
        else _replayed(before, name)
        for name in SOURCES
    ]
    _check_finished(before, cfg, capsys)


@pytest.mark.parametrize("k", [FENCES - 1, FENCES])  # b's fences
def test_letters_that_fail_again_in_a_killed_replay_are_marked_dead_letter(
    before, tmp_path, capsys, k
):
    """b's filter left in place: its letters fail again. Killed before b's apply (fence 3)
    or before its completion (fence 4: the new letters committed already), the run that
    finishes generation 1 marks its letters ``dead_letter``, not ``applied`` (it took the
    new letters' commit time to be its own start: fence 4 marked them applied)."""
    cfg = _copy(before, tmp_path)
    cfg.write_text(cfg.read_text() + FILTER)
    _killed_at(cfg, k)
    assert main(["dead-letters", "replay", str(cfg), "--yes"]) == 0
    capsys.readouterr()
    wh = DeltaWarehouse(str(cfg.parent / "wh"))
    first = Counter(
        m["outcome"] for m in _marks(wh) if m["source"] == f"{PIPELINE}.b" and m["generation"] == 1
    )
    n = before.letters["b"]
    assert first == {None: n, "dead_letter": n}
    assert read_letters(wh, LetterFilter(topics=[before.topics["b"]])).num_rows >= 2 * n

"""Process faults: ``cdcflow run`` SIGKILLed mid-batch and restarted, then drained.

The pipeline runs as the real command in a child process (its own Spark JVM); the
embedded broker serves a Debezium topic with duplicates, replayed ranges, tombstones and
malformed messages over two partitions. After two kill/restart cycles and a ``--once``
drain, every mirror must equal the source, the changelog must hold every change record's
event exactly once, every offset must be accounted for with no gap or overlap, and the
dead letters must be exactly the malformed messages (``cdcflow_testkit.faults``).
"""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest

from cdcflow.apply.batch import BatchApplier
from cdcflow.decode.batches import flatten
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Origin
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.encoders import encoder_for
from cdcflow_testkit.faults import (
    MALFORMED,
    TOMBSTONE,
    FaultyTopic,
    inject_faults,
    run_with_kills,
    verify,
    workload_stream,
    write_config,
)
from cdcflow_testkit.workload import Workload, tables_for

KILLS = 2
PARTITIONS = 2


def _faulty_topic(seed: int, n_changes: int, database: str = "shop") -> FaultyTopic:
    rng = random.Random(seed)
    workload = Workload(
        tables_for(encoder_for("debezium-json").exact_types), database=database, seed=seed
    )
    stream = workload_stream(workload, n_changes, truncate_every=n_changes * 9 // 20)
    topic = f"faults.{uuid.uuid4().hex[:8]}"
    return inject_faults(
        stream, topic, PARTITIONS, rng, duplicate_rate=0.03, replays=3, max_replay_length=60
    )


# ----------------------------------------------------------------- the oracle itself


def _apply(wh: DeltaWarehouse, faulty: FaultyTopic, batch_id: int, ranges) -> None:
    """Apply offsets ``ranges`` ({partition: (start, end)}) as one batch, as the job does."""
    records = [
        Record(value=v, key=k, origin=Origin(faulty.topic, p, o))
        for p, (start, end) in ranges.items()
        for o, (k, v) in enumerate(faulty.messages[p][start:end], start=start)
    ]
    decoder = decoder_for("debezium-json")
    result = decoder.decode_batch(records)
    events = pa.Table.from_batches([flatten(result, decoder.state_items, records)])
    BatchApplier(wh).apply(events, batch_id)


def _thirds(faulty: FaultyTopic, i: int) -> dict[int, tuple[int, int]]:
    return {p: (len(m) * i // 3, len(m) * (i + 1) // 3) for p, m in enumerate(faulty.messages)}


def test_the_oracle_passes_a_warehouse_that_applied_every_offset_once(tmp_path):
    faulty = _faulty_topic(seed=3, n_changes=400)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    for i in range(3):
        _apply(wh, faulty, i, _thirds(faulty, i))
    ends = {p: len(m) for p, m in enumerate(faulty.messages)}
    problems, counts = verify(wh, faulty, ends)
    assert problems == []
    assert counts.records == faulty.records and counts.batches == 3
    assert counts.dead_letters == faulty.count(MALFORMED) > 0
    assert counts.skipped == faulty.count(TOMBSTONE) > 0


def test_the_oracle_catches_a_batch_applied_twice_and_a_range_never_applied(tmp_path):
    faulty = _faulty_topic(seed=4, n_changes=400)
    ends = {p: len(m) for p, m in enumerate(faulty.messages)}

    twice = DeltaWarehouse(str(tmp_path / "twice"))
    for i in range(3):
        _apply(twice, faulty, i, _thirds(faulty, i))
    # cdcflow itself skips a range it applied (whatever batch id carries it: decision 20),
    # so the double application comes from a second pipeline id writing the same warehouse
    other = DeltaWarehouse(str(tmp_path / "twice"), pipeline_id="other")
    _apply(other, faulty, 3, _thirds(faulty, 1))
    problems, _ = verify(twice, faulty, ends)
    assert any("overlap" in p for p in problems)
    assert any("in the changelog twice" in p for p in problems)
    assert any("dead letters written twice" in p for p in problems)

    lost = DeltaWarehouse(str(tmp_path / "lost"))
    for i in (0, 2):  # the middle third is never applied
        _apply(lost, faulty, i, _thirds(faulty, i))
    problems, _ = verify(lost, faulty, ends)
    assert any("gap" in p for p in problems)
    assert any("have no changelog event" in p for p in problems)
    assert any("source changes are not in the changelog" in p for p in problems)
    assert any(p.startswith("shop.public.") for p in problems), "a mirror differs"


# ----------------------------------------------------------------- process faults


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_sigkill_mid_batch_and_restart_lose_nothing_and_repeat_nothing(broker, tmp_path):
    rng = random.Random(20_260_611)
    faulty = _faulty_topic(seed=29, n_changes=2_000)
    topic = faulty.topic
    broker.create_topic(topic, partitions=PARTITIONS)
    config = write_config(
        tmp_path / "pipeline.yaml",
        broker.bootstrap_servers,
        topic,
        warehouse=tmp_path / "wh",
        checkpoint=tmp_path / "ck",
        # small batches: each process's slice is several batches, so a kill aimed at an
        # apply that finished before the harness saw it has another batch to aim at (with
        # 250, a slice was 3 batches and a fast apply could leave the stream dry: an idle
        # kill, seen once under a full `make test`)
        max_offsets_per_trigger=100,
        processing_time="1 second",
    )

    run = run_with_kills(
        config,
        kills=KILLS,
        rng=rng,
        # one slice of the topic before each process: data keeps arriving across restarts
        before_start=lambda i: faulty.produce(broker, i, KILLS + 1),
        # the first process dies after its batch's apply began (some Delta commits
        # made, not all); the restarted one before its first commit, usually inside the
        # batch the first kill interrupted, run again
        early_kill_probability=1.0,
        apply_kill_probability=1.0,
        min_commits=1,
        max_commits=2,
        log_dir=tmp_path / "logs",
    )

    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="faults.debezium-json")
    problems, counts = verify(wh, faulty, broker.end_offsets(topic), run)
    print(counts.summary(), *run.kills, sep="\n")
    assert problems == [], "\n".join(problems[:30])

    # the faults really happened: both kinds of injected records and both kills
    assert faulty.duplicates > 0 and faulty.replayed > 0
    assert counts.tombstones > 0 and counts.malformed == faulty.count(MALFORMED) > 0
    assert counts.skipped == faulty.count(TOMBSTONE) and counts.dead_letters == counts.malformed
    assert len(run.kills) == KILLS and run.starts == KILLS + 1
    first, second = run.kills
    # the first kill: batches had committed, the next one was partly applied
    assert first.committed >= 0 and first.in_flight == first.committed + 1
    assert not first.first_of_process and first.stage in ("apply", "checkpoint")
    # the second: killed with a batch in flight too (before the process's first commit,
    # unless that commit came sooner than the random moment chosen)
    assert second.in_flight is not None
    assert run.committed > second.committed, "more batches committed after the last kill"
    assert counts.batches == run.committed + 1
    assert counts.records == faulty.records


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_sigkill_with_two_sources_in_one_query_loses_nothing_and_repeats_nothing(broker, tmp_path):
    """Two sources read by the pipeline's one query (decision 53), each with its own
    offsets ledger and tables, applied side by side: a kill can fall between one
    source's durable intent and the other's. After the kills and a drain, each source's
    mirrors, changelog, dead letters and accounting are exactly its topic's."""
    rng = random.Random(20_261_127)
    first = _faulty_topic(seed=31, n_changes=1_200)
    second = _faulty_topic(seed=37, n_changes=1_200, database="depot")
    for faulty in (first, second):
        broker.create_topic(faulty.topic, partitions=PARTITIONS)
    config = write_config(
        tmp_path / "pipeline.yaml",
        broker.bootstrap_servers,
        first.topic,
        warehouse=tmp_path / "wh",
        checkpoint=tmp_path / "ck",
        max_offsets_per_trigger=100,
        processing_time="1 second",
        more_topics=[second.topic],
    )

    def produce(i: int) -> None:
        for faulty in (first, second):
            faulty.produce(broker, i, KILLS + 1)

    run = run_with_kills(
        config,
        kills=KILLS,
        rng=rng,
        before_start=produce,
        early_kill_probability=1.0,
        apply_kill_probability=1.0,
        min_commits=1,
        max_commits=2,
        log_dir=tmp_path / "logs",
    )

    assert len(run.kills) == KILLS and run.starts == KILLS + 1
    assert run.kills[0].in_flight is not None, "the first kill fell inside a micro-batch"
    for faulty, name in ((first, "debezium-json"), (second, "s1")):
        wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id=f"faults.{name}")
        problems, counts = verify(wh, faulty, broker.end_offsets(faulty.topic), shared=True)
        print(name, counts.summary())
        assert problems == [], "\n".join(problems[:30])
        assert counts.records == faulty.records
        assert counts.dead_letters == faulty.count(MALFORMED) > 0

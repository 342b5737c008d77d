"""End to end, as an operator meets it (issue 8): a record far too wide for any real table
arrives between ordinary ones, and a second ``cdcflow run`` of a running pipeline is
started by mistake. The real embedded broker, real local Spark, real Delta tables.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml
from tests.e2e.helpers import (
    CDCFLOW,
    Scenario,
    check_accounting,
    check_changelog_once,
    cli_env,
    config_dict,
    partition_of,
    pipeline_config,
)

from cdcflow.apply.offsets import OffsetLedger
from cdcflow.cli import EXIT_PIPELINE_RUNNING
from cdcflow.config import load_config
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Op, Origin, SourceTable
from cdcflow.runtime.pipeline import Pipeline
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.encoders import Message, SourceChange, encoder_for
from cdcflow_testkit.faults import _kill_session, _session
from cdcflow_testkit.services.process import free_port

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

FORMAT = "debezium-json"
WIDE_COLUMNS = 100_000
#: librdkafka's producer refuses a message over ``message.max.bytes`` (default 1,000,000)
#: before sending it; this is the decoder's default ``max_record_bytes``
PRODUCER_MESSAGE_MAX_BYTES = 16 * 1024 * 1024


# ----------------------------------------------------------------- a 100,000-column record


def _wide_messages() -> list[Message]:
    """Two Debezium records of one 100,000-column table: an insert with its ``schema`` part
    (as the ``JsonConverter`` with ``schemas.enable=true`` writes it, 11.8 MB) and an update
    without it (``schemas.enable=false``: the payload alone, before and after images, 3.2 MB).
    """
    columns = {"id": "int64", **{f"c{i:06d}": "int32" for i in range(1, WIDE_COLUMNS)}}
    row = {c: i for i, c in enumerate(columns)}
    row["id"] = 1
    table = SourceTable(format="", database="shop", schema="public", table="wide")
    encoder = encoder_for(FORMAT)

    def change(op: Op, before, after, seq: int) -> Message:
        [m] = encoder.encode(
            SourceChange(op, table, columns, ("id",), before, after, seq, 1_700_000_000_000 + seq)
        )
        return m

    with_schema = change(Op.INSERT, None, row, 90_000_001)
    updated = change(Op.UPDATE, row, {**row, "c000001": -1}, 90_000_002)
    schemaless = Message(
        value=orjson.dumps(orjson.loads(updated.value)["payload"]),
        key=orjson.dumps(orjson.loads(updated.key)["payload"]),
    )
    return [with_schema, schemaless]


def _produce_large(broker, topic: str, messages: list[Message]) -> list[tuple[int, int]]:
    """Produce each message as a batch of its own (the last batch of its partition is then
    visible: tansu's high-watermark quirk), with ``message.max.bytes`` raised as a user
    producing large records must. Returns ``(partition, offset)`` of each."""
    from confluent_kafka import Producer

    producer = Producer(
        broker.client_config(
            **{
                "message.max.bytes": PRODUCER_MESSAGE_MAX_BYTES,
                "linger.ms": 0,
                "batch.num.messages": 1,
                "acks": "all",
            }
        )
    )
    delivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append((msg.partition(), msg.offset()))

    for m in messages:
        producer.produce(
            topic, value=m.value, key=m.key, partition=partition_of(m), on_delivery=on_delivery
        )
        assert producer.flush(30) == 0, "a large message is still queued"  # one at a time
    assert errors == [] and len(delivered) == len(messages), errors
    return delivered


def test_a_100000_column_record_is_one_dead_letter_and_the_stream_goes_on(spark, broker, tmp_path):
    """A 100,000-column record between ordinary ones is one ``TOO_MANY_COLUMNS`` dead
    letter; the ordinary tables are applied by the same run, no mirror of it is created.

    Settings this needed, as a user would set them:

    * producer (librdkafka): ``message.max.bytes`` raised from 1,000,000 to 16 MiB, or
      the 11.8 MB record is refused locally (``MSG_SIZE_TOO_LARGE``) and never sent.
    * broker: the topic's ``max.message.bytes`` (Apache Kafka's default is ~1 MB) raised
      above the record's size; Apache Kafka refuses the record otherwise
      (``MSG_SIZE_TOO_LARGE`` from the broker). The embedded tansu 0.6 stored and served
      12 MB records with no size setting.
    * cdcflow: nothing. Its Kafka source asks for ``fetch.max.bytes`` 64 MiB and
      ``max.partition.fetch.bytes`` 16 MiB (a larger first batch is returned anyway), and
      ``sources[].options.max_record_bytes`` defaults to 16 MiB, so the record is parsed
      and refused for its width by ``max_columns`` (default 4,096), not for its size.
    """
    s = Scenario(
        broker, FORMAT, seed=13, topic_config={"max.message.bytes": str(PRODUCER_MESSAGE_MAX_BYTES)}
    )
    s.produce(150)
    wide = _wide_messages()
    coordinates = _produce_large(broker, s.topic, wide)
    s.produced += len(wide)
    s.produce(150)  # the stream goes on after the wide records

    started = time.monotonic()
    summary = Pipeline(pipeline_config(tmp_path, broker, FORMAT, s.topic), spark=spark).run(
        once=True
    )
    run_s = time.monotonic() - started
    # everything, the records after the wide ones included, was applied by this one run
    assert sum(r.records for r in summary.reports[FORMAT]) == s.produced

    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    dead = wh.read("dead_letters", system=True).to_pylist()
    assert len(dead) == len(wide)
    by_offset = {(d["partition"], d["offset"]): d for d in dead}
    for m, (p, o) in zip(wide, coordinates, strict=True):
        d = by_offset[(p, o)]
        assert (d["topic"], d["code"], d["stage"], d["format"]) == (
            s.topic,
            "TOO_MANY_COLUMNS",
            "decode",
            FORMAT,
        )
        assert d["raw_value"] == m.value and d["raw_key"] == m.key
        assert f"{WIDE_COLUMNS} columns, over the limit of 4096" in d["message"]
        assert "max_columns" in d["message"]
    assert not any("wide" in name for name in wh.mirrors()), wh.mirrors()
    assert "wide" not in set(wh.read("changelog", system=True)["table"].to_pylist())

    batches = check_accounting(wh, s.produced)
    check_changelog_once(wh)
    assert sum(b["dead_letters"] for b in batches) == len(wide)
    for p, o in coordinates:  # ordinary records before and after it, in the same batch
        [holding] = [
            b for b in batches if b["partition"] == p and b["first_offset"] <= o <= b["last_offset"]
        ]
        assert holding["first_offset"] < o < holding["last_offset"]

    # the decode of a wide record alone: parsed whole, then refused (decision 23)
    decoder = decoder_for(FORMAT)
    for m, (p, o) in zip(wide, coordinates, strict=True):
        record = Record(value=m.value, key=m.key, origin=Origin(s.topic, p, o))
        t0 = time.perf_counter()
        result = decoder.decode_batch([record])
        decode_s = time.perf_counter() - t0
        assert [d.code for d in result.dead_letters] == ["TOO_MANY_COLUMNS"]
        print(f"wide record of {len(m.value):,} bytes: decode_batch {decode_s:.3f} s")
        assert decode_s < 5.0, "the decode of one wide record must stay bounded"
    print(f"pipeline run (--once, {s.produced} records): {run_s:.1f} s")


# ----------------------------------------------------------------- two runs of one pipeline


def _cdcflow(*args: str, command=CDCFLOW, env=None, **kwargs) -> subprocess.Popen:
    """``cdcflow ARGS`` as a user runs it (the console entry point), in a session of its
    own so that its JVM and Python workers can be cleaned up with it."""
    return subprocess.Popen(
        [*command, *args],
        env=env or cli_env(),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        **kwargs,
    )


#: seconds the first fence of the held apply waits (the signal is sent meanwhile), then
#: its completion's fence (the test reads the warehouse's pending intent meanwhile)
HOLD_S = (4.0, 4.0)

#: ``cdcflow`` whose appliers, once the file ``$E2E_HOLD/armed`` exists, hold the next
#: apply at its two fences (``BatchApplier.fence``: before its first commit and before its
#: completion), writing ``$E2E_HOLD/fence-1`` and ``fence-2`` (the wall-clock time) as each
#: is reached. Patched in this process only, the driver; the product is unchanged.
HOLDING_CDCFLOW = [
    sys.executable,
    "-c",
    f"""
import os, time
from pathlib import Path
from cdcflow.apply.batch import BatchApplier
from cdcflow.cli import entry

folder, hold_s, held = Path(os.environ["E2E_HOLD"]), {HOLD_S!r}, []
init = BatchApplier.__init__

def holding_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    fence = self.fence

    def holding():
        if len(held) < len(hold_s) and (folder / "armed").exists():
            held.append(time.time())
            written = folder / f"fence-{{len(held)}}.tmp"
            written.write_text(repr(held[-1]))
            written.rename(folder / f"fence-{{len(held)}}")
            time.sleep(hold_s[len(held) - 1])
        fence()

    self.fence = holding

BatchApplier.__init__ = holding_init
entry()
""",
]


def _streaming_config(
    tmp_path: Path, broker, s: Scenario, pipeline_id: str
) -> tuple[Path, dict, DeltaWarehouse]:
    """A streaming pipeline's YAML file (1-second trigger) over ``s``'s topic: its path,
    its content and its warehouse."""
    config = tmp_path / "pipeline.yaml"
    raw = config_dict(
        tmp_path,
        broker,
        FORMAT,
        s.topic,
        pipeline_id=pipeline_id,
        trigger={"processing_time": "1 second"},
    )
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config, raw, DeltaWarehouse(raw["warehouse"])


def _applied(wh: DeltaWarehouse) -> int:
    table = wh.open(wh.system_path("batches"))
    if table is None:
        return 0
    return sum(table.to_pyarrow_table(columns=["records"])["records"].to_pylist())


def _wait_applied(wh: DeltaWarehouse, records: int, proc: subprocess.Popen, log: Path, timeout_s):
    deadline = time.monotonic() + timeout_s
    while _applied(wh) < records:
        assert proc.poll() is None, f"the run exited ({proc.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"nothing applied in {timeout_s} s:\n{log.read_text()}"
        time.sleep(0.25)
    return _applied(wh)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_run_of_a_running_pipeline_is_refused_and_the_first_goes_on(
    broker, tmp_path, stop
):
    """``cdcflow run CONFIG`` twice: the second exits 75 at once with one line naming the
    first; the first keeps applying. Stopped by Ctrl-C (SIGINT) or by ``kill`` (SIGTERM,
    as the line suggests), it stops after the running apply ends, releases its lease (the
    next run takes it at once), prints one line and its run's summary, and exits 130, its
    JVM and workers with it.

    SIGINT is sent to an idle run. SIGTERM is sent during an apply, deterministically: the
    run is :data:`HOLDING_CDCFLOW`, which holds the apply of the records produced for it at
    its first fence (before its first commit) while the signal is sent, and again at its
    completion's fence, where the test sees its intent pending in the warehouse and the
    process alive; that apply then completes before the process exits (no pending intent,
    every mirror equal to its source, every offset accounted for once).

    Measured here: the refusal took 0.7-0.9 s (the lease is read before Spark starts); the
    first run applied its first batch 15-26 s after it started (Spark's start-up).
    """
    s = Scenario(broker, FORMAT, seed=31)
    s.produce(100)
    config, raw, wh = _streaming_config(tmp_path, broker, s, "e2e-lease")
    # what standard tools see (issue 19, item 5): Prometheus metrics, Spark's UI, and the
    # applied offsets in a consumer group
    metrics_port = free_port("127.0.0.1")
    raw["monitoring"] = {"prometheus_port": metrics_port, "spark_ui": True}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    log = tmp_path / "first.log"
    hold = tmp_path / "hold"  # HOLDING_CDCFLOW's files: armed, fence-1, fence-2
    hold.mkdir()
    during_apply = stop == signal.SIGTERM
    command, env = (
        (HOLDING_CDCFLOW, cli_env(E2E_HOLD=str(hold))) if during_apply else (CDCFLOW, None)
    )

    t0 = time.monotonic()
    with open(log, "wb") as out:
        first = _cdcflow(
            "-v", "run", str(config), command=command, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        _wait_applied(wh, s.produced, first, log, timeout_s=120)
        first_batch_s = time.monotonic() - t0

        t1 = time.monotonic()
        second = _cdcflow("run", str(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out2, err2 = second.communicate(timeout=60)
        finally:
            _kill_session(second)
        refused_s = time.monotonic() - t1
        lines = err2.decode().strip().splitlines()
        print(f"second run: exit {second.returncode} after {refused_s:.2f} s; stderr: {lines}")
        assert second.returncode == EXIT_PIPELINE_RUNNING == 75
        assert out2 == b"" and len(lines) == 1
        assert lines[0].startswith("cdcflow: [PIPELINE_RUNNING] pipeline 'e2e-lease' is already ")
        assert f"(pid {first.pid})" in lines[0] and "kill" in lines[0]
        assert refused_s < 10.0, "the lease is taken before Spark starts: refused at once"

        # the newcomer never touched the first run: it holds the lease and applies more
        held = PipelineLease(raw["warehouse"], "e2e-lease").read()
        assert held is not None and held.owner.pid == first.pid and not held.released
        s.produce(100)
        t2 = time.monotonic()
        _wait_applied(wh, s.produced, first, log, timeout_s=60)
        more_s = time.monotonic() - t2
        assert first.poll() is None
        _check_monitoring(broker, wh, metrics_port, s.produced, "cdcflow-e2e-lease", log)
        s.check_mirrors(wh)
        check_accounting(wh, s.produced)
        check_changelog_once(wh)

        if during_apply:  # the apply of the next records is held at its first fence
            (hold / "armed").touch()  # before producing: an idle run applies nothing
            s.produce(100)
            _wait_file(hold / "fence-1", first, log, timeout_s=60)
        t3 = time.monotonic()
        os.kill(first.pid, stop)
        signalled_at = time.time()
        if during_apply:
            # the apply goes on after the signal: its intent is written, its tables are,
            # and it reaches the fence of its completion with the process still running
            _wait_file(hold / "fence-2", first, log, timeout_s=60)
            assert float((hold / "fence-2").read_text()) > signalled_at
            pending = OffsetLedger(_source_view(raw)).pending()
            assert first.poll() is None, "the run exited before its apply completed"
            assert pending is not None, "the held apply has written its intent"
            held_ranges = pending.describe()
        try:
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the first run did not stop on {stop.name}:\n{log.read_text()[-3000:]}")
        stop_s = time.monotonic() - t3
        while _session(first.pid) and time.monotonic() < t3 + 30:
            time.sleep(0.1)  # its JVM and Python workers follow the driver
        assert not _session(first.pid), "processes of the stopped run are left"
        gone_s = time.monotonic() - t3
        print(
            f"first run: first batch applied {first_batch_s:.1f} s after start; the next "
            f"records {more_s:.1f} s after produce; {stop.name}: exit {first.returncode} "
            f"after {stop_s:.1f} s, its JVM and workers gone after {gone_s:.1f} s"
        )
        if during_apply:  # the held apply completed before the process exited
            assert OffsetLedger(_source_view(raw)).pending() is None, held_ranges
            s.check_mirrors(wh)
            check_accounting(wh, s.produced)
            check_changelog_once(wh)
        lease = PipelineLease(raw["warehouse"], "e2e-lease", renew_every_s=0)
        state = lease.read()
        assert state is not None
        # Ctrl-C and SIGTERM (kill, docker stop) both stop the run and release its lease
        assert state.released, f"{stop.name} releases the lease"
        assert first.returncode == 130, log.read_text()[-3000:]
        # the console (issue 19): a line per micro-batch, then on the stop one line and
        # the run's summary -- no traceback, no py4j or Rust text
        console = log.read_text()
        for noise in ("Traceback", "py4j", "Py4J", "panicked", "falling behind", " WARN "):
            assert noise not in console, f"{noise!r} on the console:\n{console[-3000:]}"
        assert re.search(
            r"^batch \d+ debezium-json: [\d,]+ records -> [\d,]+ events, [\d,]+ events/s;.* "
            r"behind; lag ",
            console,
            re.M,
        ), console
        stopped = re.search(
            r"^cdcflow: stopped after micro-batch \d+; the next run resumes at "
            rf"{re.escape(s.topic)}\[\d\]@\d+.*\n(.*)\n",
            console,
            re.M,
        )
        assert stopped, console[-3000:]
        # everything this run applied, which is everything produced
        assert f" micro-batches: {s.produced} records, " in stopped.group(1), stopped.group(1)
        assert re.search(
            r"^debezium-json\.shop\.public\.orders +[\d,]+ +[\d,]+ +[\d,]+$", console, re.M
        )
        t4 = time.monotonic()
        lease.acquire()
        lease.release()
        print(
            f"lease released: {state.released}; the next run took it in {time.monotonic() - t4:.2f} s"
        )
    finally:
        _kill_session(first)


def _wait_file(path: Path, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run exited ({proc.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {path.name} in {timeout_s} s:\n{log.read_text()}"
        time.sleep(0.05)


def _source_view(raw: dict) -> DeltaWarehouse:
    """The warehouse view of the streaming config's one source (its offsets ledger's)."""
    return DeltaWarehouse(raw["warehouse"], pipeline_id=f"{raw['pipeline_id']}.{FORMAT}")


def _check_monitoring(broker, wh, port: int, records: int, group: str, log: Path) -> None:
    """The running pipeline's metrics count what it applied, its console says where they
    and Spark's UI are, and its consumer group holds the warehouse's next offsets."""
    from confluent_kafka import Consumer, TopicPartition
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{port}/metrics"
    deadline, applied = time.monotonic() + 30, None
    while applied != records and time.monotonic() < deadline:  # published after the apply
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.labels.get("source") in (None, FORMAT)
        }
        applied = samples.get("cdcflow_records_total")
        time.sleep(0.25)
    assert applied == records, f"metrics say {applied} records applied, not {records}"
    assert samples["cdcflow_micro_batches_total"] >= 2
    console = log.read_text()
    assert f"metrics at {url}" in console
    assert re.search(r"^Spark UI at http://\S+:40\d\d$", console, re.M), console[-2000:]

    batches = wh.open(wh.system_path("batches")).to_pyarrow_table().to_pylist()
    next_offsets: dict[tuple[str, int], int] = {}
    for b in batches:
        tp = (b["topic"], b["partition"])
        next_offsets[tp] = max(next_offsets.get(tp, 0), b["last_offset"] + 1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    try:
        deadline, found = time.monotonic() + 30, None
        while found != next_offsets and time.monotonic() < deadline:  # committed on a thread
            tps = [TopicPartition(t, p) for t, p in next_offsets]
            found = {(c.topic, c.partition): c.offset for c in consumer.committed(tps, timeout=10)}
            time.sleep(0.25)
    finally:
        consumer.close()
    assert found == next_offsets, "the consumer group holds the warehouse's next offsets"


def test_an_apply_failing_after_its_intent_stops_an_idle_streaming_run_at_once(
    spark, broker, tmp_path
):
    """Decision 32: a micro-batch's tables are written beside the next micro-batch, once
    its offsets are in the warehouse's intent. When that write fails, the run must stop
    with its one line at once -- not when the next record reaches an idle topic -- and the
    next run must finish the apply from Kafka, losing and duplicating nothing."""
    import shutil

    s = Scenario(broker, FORMAT, seed=33)
    s.produce(100)
    config, _, wh = _streaming_config(tmp_path, broker, s, "e2e-lane")
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        run = _cdcflow("run", str(config), stdout=subprocess.PIPE, stderr=out)
    try:
        _wait_applied(wh, s.produced, run, log, timeout_s=120)
        # the changelog, written after the mirrors, cannot be written any more: its
        # folder becomes a file (a fault no table can escape, decision 25)
        changelog = Path(wh.system_path("changelog"))
        kept = tmp_path / "changelog-kept"
        shutil.copytree(changelog, kept)
        shutil.rmtree(changelog)
        changelog.write_text("not a table")
        s.produce(40)  # one micro-batch; then the topic stays idle
        t0 = time.monotonic()
        try:
            run.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the failed apply did not stop the idle run:\n{log.read_text()[-3000:]}")
        stopped_s = time.monotonic() - t0
    finally:
        _kill_session(run)
    err = log.read_text()
    lines = [ln for ln in err.splitlines() if ln.startswith("cdcflow: ")]
    print(f"stopped {stopped_s:.1f} s after the produce, exit {run.returncode}: {lines}")
    assert run.returncode not in (0, None), err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("cdcflow: ["), err[-3000:]
    assert "Traceback" not in err, err[-3000:]

    changelog.unlink()
    shutil.copytree(kept, changelog)
    # the next run (in this process, on the shared session) finishes the apply from Kafka
    Pipeline(load_config(config), spark=spark).run(once=True)
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)

"""End to end across broker outages: ``cdcflow run CONFIG`` (the real command, in a process
of its own) streams from a real broker that keeps its records (tansu on durable (s3)
storage, and Apache Kafka) while the broker is taken down and brought back on the same
port.

* A 45 s outage mid-stream (issue 8, item 4): the run survives with one warning line per
  retry; after more records are produced, every mirror equals the source and every Kafka
  offset was applied exactly once.
* An outage longer than ``kafka.outage_budget_s``: the run exits 69 with one line on stderr
  naming the brokers, the duration, the last client error and the fix; no traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tests.brokers import durable_broker
from tests.e2e.helpers import PARTITIONS, check_accounting, check_changelog_once, produce

from cdcflow.cli import EXIT_SOURCE_UNAVAILABLE
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.demo import _target
from cdcflow_testkit.encoders import encoder_for
from cdcflow_testkit.faults import _kill_session
from cdcflow_testkit.services.broker import EmbeddedBroker
from cdcflow_testkit.workload import Workload, compare_with_mirror, tables_for

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

FORMAT = "debezium-json"
TOPIC = "outage.debezium"
SRC = str(Path(__file__).resolve().parents[2] / "src")
#: a micro-batch's line on the console (cdcflow.runtime.progress)
PROGRESS_LINE = re.compile(r"batch \d+ \S+: [\d,]+ records -> ")
JVM_BANNER = "WARNING: Using incubator modules: jdk.incubator.vector"  # every Spark 4 JVM
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} |\d\d/\d\d/\d\d \d\d:\d\d:\d\d )")
OUTAGE_WARNING = re.compile(
    r" WARNING cdcflow\.source\.outage: Kafka brokers 127\.0\.0\.1:\d+ unavailable: (.+) "
    r"failed \(attempt (\d+)\): (.+); (\d+) s left of the outage budget "
    r"\(kafka\.outage_budget_s\), next retry in (\d+\.\d) s$"
)


def _produce(broker: EmbeddedBroker, workload: Workload, n_changes: int) -> int:
    """Encode ``n_changes`` changes, keyed so each row's changes stay in one partition."""
    encoder = encoder_for(FORMAT)
    return produce(
        broker, TOPIC, [m for c in workload.changes(n_changes) for m in encoder.encode(c)]
    )


def _start(tmp_path: Path, broker: EmbeddedBroker, **kafka) -> tuple[subprocess.Popen, Path]:
    """``cdcflow run CONFIG`` (a micro-batch every second) in a session of its own."""
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pipeline_id": "outage",
                "warehouse": str(tmp_path / "wh"),
                "checkpoint": str(tmp_path / "ck"),
                "trigger": {"processing_time": "1 second"},
                "target_template": "{format}.{database}.{schema}.{table}",
                "kafka": {"bootstrap_servers": broker.bootstrap_servers, **kafka},
                "sources": [{"format": FORMAT, "topics": [TOPIC]}],
            }
        )
    )
    stderr = tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": SRC, "PYSPARK_PYTHON": sys.executable}
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdcflow.cli", "run", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its JVM and Python workers go with it
        )
    return proc, stderr


def _applied(wh_path: Path) -> int:
    """Records the warehouse has applied (``_cdcflow/batches``), 0 before the first batch."""
    wh = DeltaWarehouse(str(wh_path))
    batches = wh.open(wh.system_path("batches"))
    if batches is None:
        return 0
    return sum(batches.to_pyarrow_table(columns=["records"])["records"].to_pylist())


def _wait_applied(proc, stderr: Path, wh_path: Path, records: int, timeout_s: float) -> float:
    """Wait until ``records`` are applied; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while _applied(wh_path) < records:
        if proc.poll() is not None:
            pytest.fail(f"cdcflow run exited {proc.returncode}:\n{stderr.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(
                f"{_applied(wh_path)} of {records} records applied after {timeout_s:.0f} s:\n"
                f"{stderr.read_text()[-3000:]}"
            )
        time.sleep(0.5)
    return time.monotonic()


def _check_exactly_once(tmp_path: Path, workload: Workload, ends: dict[int, int]) -> None:
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    for spec in workload.tables:
        target = _target(FORMAT, workload, spec, {})
        problems = compare_with_mirror(
            workload.expected_rows(spec.name), wh.read(target), spec.key_columns
        )
        assert problems == [], f"{target}: {problems[:5]}"
    batches = check_accounting(wh, sum(ends.values()))
    for p, end in ends.items():
        last = max(b["last_offset"] for b in batches if b["topic"] == TOPIC and b["partition"] == p)
        assert last == end - 1, f"partition {p}: applied up to {last}, its log ends at {end}"
    check_changelog_once(wh)


# What a client meets while a broker is away (connections refused, then a broker that
# answers again with its log kept) is the same from tansu on S3 and from Apache Kafka;
# each broker's restart with its records kept is tests/e2e/test_broker_restart.py's, on
# both. So the long outage runs on Apache Kafka and the spent budget on tansu.
@pytest.mark.parametrize("kind", ["apache-kafka"])
def test_a_streaming_run_survives_a_45_s_broker_outage_and_applies_every_offset_once(
    tmp_path, kind
):
    workload = Workload(tables_for(encoder_for(FORMAT).exact_types), seed=45)
    with durable_broker(kind) as broker:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        produced = _produce(broker, workload, 1200)
        # several micro-batches of 150 records: a backlog is left when the broker goes down
        proc, stderr = _start(tmp_path, broker, max_offsets_per_trigger=150)
        try:
            _wait_applied(proc, stderr, tmp_path / "wh", 150, timeout_s=240)
            before = _applied(tmp_path / "wh")
            down = time.monotonic()
            outage = broker.pause_for(45)
            outage.join()
            assert outage.error is None
            back = time.monotonic()
            during = _applied(tmp_path / "wh")
            assert proc.poll() is None, f"the run died in the outage:\n{stderr.read_text()}"
            drained = _wait_applied(proc, stderr, tmp_path / "wh", produced, timeout_s=180)

            produced += _produce(broker, workload, 600)  # after the outage
            ends = broker.end_offsets(TOPIC)
            assert sum(ends.values()) == produced
            _wait_applied(proc, stderr, tmp_path / "wh", produced, timeout_s=180)
            assert proc.poll() is None
        finally:
            _kill_session(proc)
        _check_exactly_once(tmp_path, workload, ends)

    lines = stderr.read_text().splitlines()
    warnings = [m for m in map(OUTAGE_WARNING.search, lines) if m]
    recovered = [line for line in lines if "reachable again after" in line]
    print(
        f"applied {before} records before the outage, {during} by its end; the backlog was "
        f"drained {drained - back:.1f} s after the broker came back ({back - down:.1f} s down)",
        *[line for line in lines if "cdcflow.source.outage" in line],
        sep="\n",
    )
    assert warnings, f"no retry warning:\n{stderr.read_text()}"
    assert warnings[0].group(2) == "1"
    assert all(0 < int(m.group(4)) <= 300 for m in warnings)
    assert recovered, "no line says the brokers are reachable again"
    assert not [line for line in lines if "Traceback" in line or " ERROR " in line]


@pytest.mark.parametrize("kind", ["tansu-s3"])
def test_a_run_exits_69_with_one_line_when_the_budget_is_spent(tmp_path, kind):
    workload = Workload(tables_for(encoder_for(FORMAT).exact_types), seed=69)
    with durable_broker(kind) as broker:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        _produce(broker, workload, 100)
        proc, stderr = _start(tmp_path, broker, outage_budget_s=5)
        try:
            _wait_applied(proc, stderr, tmp_path / "wh", 1, timeout_s=240)
            down = time.monotonic()
            broker.pause()
            proc.wait(timeout=120)
            took = time.monotonic() - down
        finally:
            _kill_session(proc)

    text = stderr.read_text()
    print(f"exit {proc.returncode} {took:.1f} s after the broker went down; stderr:\n{text}")
    assert proc.returncode == EXIT_SOURCE_UNAVAILABLE == 69, text
    lines = text.splitlines()
    # what is left besides the JVM's start-up banner, time-stamped log lines (the outage
    # warnings) and the progress lines of micro-batches is the one line of the error
    errors = [
        line
        for line in lines
        if line != JVM_BANNER and not LOG_LINE.match(line) and not PROGRESS_LINE.match(line)
    ]
    assert len(errors) == 1, text
    error = errors[0]
    assert lines[-1] == error
    assert error.startswith(
        f"cdcflow: [SOURCE_UNAVAILABLE] Kafka brokers {broker.bootstrap_servers} unavailable for "
    )
    assert "kafka.outage_budget_s=5) while " in error and "; last error: _" in error
    assert error.endswith(
        "Fix: bring the brokers back or check kafka.bootstrap_servers and the network, then "
        "run again (it resumes from its checkpoint); raise kafka.outage_budget_s to wait longer"
    )
    assert "Traceback" not in text and "\tat " not in text and " ERROR " not in text
    assert took < 60

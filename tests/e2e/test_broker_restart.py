"""End to end across a broker restart: a real broker that keeps its records (tansu on
durable (s3) storage, and Apache Kafka) is stopped and started between two runs of the
pipeline from one checkpoint.

Half the workload is produced and applied, the broker restarts (same port, same storage),
the other half is produced and the pipeline resumes from its checkpoint. Every mirror must
equal the source, and ``_cdcflow/batches`` must cover every Kafka offset exactly once.
"""

from __future__ import annotations

import zlib

import pytest
from tests.brokers import DURABLE_BROKERS, durable_broker
from tests.e2e.helpers import check_accounting, check_changelog_once

from cdcflow.config import parse_config
from cdcflow.runtime.pipeline import Pipeline
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.demo import _target
from cdcflow_testkit.encoders import encoder_for
from cdcflow_testkit.services.broker import EmbeddedBroker
from cdcflow_testkit.workload import Workload, compare_with_mirror, tables_for

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

FORMAT = "debezium-json"
TOPIC = "restart.debezium"
PARTITIONS = 2
TEMPLATE = "{format}.{database}.{schema}.{table}"


def _produce(broker: EmbeddedBroker, workload: Workload, n_changes: int) -> int:
    """Encode ``n_changes`` changes, keyed so each row's changes stay in one partition."""
    encoder = encoder_for(FORMAT)
    by_partition: dict[int, list] = {}
    for change in workload.changes(n_changes):
        for m in encoder.encode(change):
            p = zlib.crc32(m.key or m.value or b"") % PARTITIONS
            by_partition.setdefault(p, []).append(m)
    for p, messages in sorted(by_partition.items()):
        broker.produce(TOPIC, messages, partition=p)
    return sum(len(ms) for ms in by_partition.values())


@pytest.mark.parametrize("kind", DURABLE_BROKERS)
def test_the_pipeline_resumes_from_its_checkpoint_after_a_broker_restart(spark, tmp_path, kind):
    workload = Workload(tables_for(encoder_for(FORMAT).exact_types), seed=31)
    with durable_broker(kind) as broker:
        broker.create_topic(TOPIC, partitions=PARTITIONS)
        config = parse_config(
            {
                "pipeline_id": "restart",
                "warehouse": str(tmp_path / "wh"),
                "checkpoint": str(tmp_path / "ck"),
                "trigger": "available_now",
                "target_template": TEMPLATE,
                "kafka": {
                    "bootstrap_servers": broker.bootstrap_servers,
                    "max_offsets_per_trigger": 150,
                },
                "sources": [{"format": FORMAT, "topics": [TOPIC]}],
            }
        )
        produced = _produce(broker, workload, 160)
        first = Pipeline(config, spark=spark).run(once=True).totals()
        assert first["records"] == produced and first["batches"] >= 2

        ends = broker.end_offsets(TOPIC)
        pid = broker._proc.pid
        broker.restart()
        assert broker._proc.pid != pid
        assert broker.end_offsets(TOPIC) == ends, "the restart lost records"

        produced += _produce(broker, workload, 160)
        ends = broker.end_offsets(TOPIC)
        second = Pipeline(config, spark=spark).run(once=True).totals()
        assert second["records"] == produced - first["records"]

    wh = DeltaWarehouse(str(tmp_path / "wh"))
    for spec in workload.tables:
        target = _target(FORMAT, workload, spec, {})
        problems = compare_with_mirror(
            workload.expected_rows(spec.name), wh.read(target), spec.key_columns
        )
        assert problems == [], f"{target}: {problems[:5]}"

    assert produced == sum(ends.values())
    batches = check_accounting(wh, produced)
    for p, end in ends.items():
        last = max(b["last_offset"] for b in batches if b["topic"] == TOPIC and b["partition"] == p)
        assert last == end - 1, f"partition {p}: applied up to {last}, its log ends at {end}"
    check_changelog_once(wh)

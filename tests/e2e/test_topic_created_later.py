"""The normal order on a fresh deployment: cdcflow starts before the replication tool has
created (or filled) its topic. The empty micro-batches of those first runs must not make
the checkpoint and the warehouse disagree: once the topic has changes, the next run
applies them all."""

from __future__ import annotations

import pytest
from tests.brokers import every_broker
from tests.e2e.helpers import (
    PARTITIONS,
    Scenario,
    check_accounting,
    check_changelog_once,
    config_dict,
    pipeline_config,
)

from cdcflow.config import parse_config
from cdcflow.runtime.pipeline import Pipeline
from cdcflow.sinks.warehouse import DeltaWarehouse

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


@every_broker  # topic metadata of a topic created later
def test_a_run_before_the_topic_exists_then_a_run_after_applies_everything(spark, broker, tmp_path):
    s = Scenario(broker, "debezium-json", create_topic=False)
    config = pipeline_config(tmp_path, broker, s.fmt, s.topic, s.options)
    first = Pipeline(config, spark=spark).run(once=True)
    assert first.totals()["records"] == 0
    broker.create_topic(s.topic, partitions=PARTITIONS)
    second = Pipeline(config, spark=spark).run(once=True)  # the topic exists, still empty
    assert second.totals()["records"] == 0
    s.produce(200)
    Pipeline(pipeline_config(tmp_path, broker, s.fmt, s.topic, s.options), spark=spark).run(
        once=True
    )
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)


@every_broker  # topic metadata of a topic created later
def test_a_run_at_latest_that_read_nothing_then_a_run_after_applies_the_new_changes(
    spark, broker, tmp_path
):
    """``starting_offsets: latest`` on a topic with history: the first micro-batch reads
    nothing but its end offsets are above 0; it must not count either."""
    s = Scenario(broker, "debezium-json")
    s.produce(50)  # history before cdcflow starts, skipped at "latest"
    history = s.produced
    starts = broker.end_offsets(s.topic)
    raw = config_dict(tmp_path, broker, s.fmt, s.topic, s.options)
    raw["kafka"]["starting_offsets"] = "latest"
    first = Pipeline(parse_config(raw), spark=spark).run(once=True)
    assert first.totals()["records"] == 0
    s.produce(50)
    raw = config_dict(tmp_path, broker, s.fmt, s.topic, s.options)
    raw["kafka"]["starting_offsets"] = "latest"
    second = Pipeline(parse_config(raw), spark=spark).run(once=True)
    assert second.totals()["records"] == s.produced - history
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    check_accounting(wh, s.produced - history, first_offsets=starts)
    check_changelog_once(wh)

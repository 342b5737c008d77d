"""Apache Kafka as a test broker (``cdcflow_testkit.services.apache_kafka``): its jars, its start,
its log folder kept across restarts and removed at the end, its errors."""

from __future__ import annotations

import os

import pytest

from cdcflow_testkit.services.apache_kafka import ApacheKafkaBroker, kafka_libs
from cdcflow_testkit.services.broker import BrokerError

pytestmark = pytest.mark.kafka


def test_the_jars_resolve_once_into_the_cache(tmp_path, monkeypatch):
    libs = kafka_libs()  # resolved by `make test` before the tests start
    assert any(p.name.startswith("kafka_2.13-") for p in libs.iterdir())
    assert (libs.parent / ".resolved").exists()
    # a cache folder without the jars and no Maven: one error that says what to do
    monkeypatch.setenv("CDCFLOW_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerError, match="resolved with Maven: install it"):
        kafka_libs()


def test_a_broker_keeps_its_log_across_a_restart_and_removes_it_at_stop():
    broker = ApacheKafkaBroker()
    with broker:
        broker.create_topic("kept", partitions=2)
        broker.produce("kept", [(b"k%d" % i, b"v") for i in range(10)])
        data_dir = broker.data_dir
        assert data_dir and os.path.isdir(data_dir)
        ends = broker.end_offsets("kept")
        port = broker.port
        broker.pause()
        assert not broker.running
        broker.resume()
        assert broker.port == port and broker.end_offsets("kept") == ends
    assert not broker.running
    assert not os.path.exists(data_dir)
    broker.stop()  # idempotent


def test_a_broker_that_cannot_start_is_an_error_naming_its_log(tmp_path):
    empty = tmp_path / "libs"
    empty.mkdir()
    broker = ApacheKafkaBroker(libs=str(empty), startup_timeout_s=20)
    with pytest.raises(BrokerError) as info:
        broker.start()
    assert "Apache Kafka" in str(info.value)
    assert not broker.running
    broker.stop()

"""Checks before Spark starts (``cdcflow.runtime.preflight``, ``cdcflow validate``; issue 19,
item 3): librdkafka settings, brokers within ``kafka.startup_timeout_s``, the sources'
topics and the folders a run writes. Real brokers where one is needed (tansu and Apache
Kafka), real folders; each failure's time to the error is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cdcflow.config import parse_config
from cdcflow.errors import Code, ConfigError, SourceError, StorageError
from cdcflow.runtime.preflight import preflight, raise_first_failure
from cdcflow_testkit.services.process import free_port

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _config(tmp_path, bootstrap, sources=None, **kafka):
    return parse_config(
        {
            "pipeline_id": "pre",
            "warehouse": str(tmp_path / "wh"),
            "checkpoint": str(tmp_path / "ck"),
            "kafka": {"bootstrap_servers": bootstrap, **kafka},
            "sources": sources or [{"format": "debezium-json", "topics": ["t"]}],
        }
    )


def test_folders_are_created_and_written_once(tmp_path):
    checks = preflight(_config(tmp_path, "127.0.0.1:1"), brokers=False)
    assert [(c.item, c.ok) for c in checks] == [("warehouse", True), ("checkpoint", True)]
    assert sorted(os.listdir(tmp_path / "wh")) == [] and sorted(os.listdir(tmp_path / "ck")) == []


def test_a_folder_that_cannot_be_written_is_a_storage_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    config = parse_config(
        {
            "warehouse": str(tmp_path / "file" / "wh"),
            "checkpoint": str(tmp_path / "ck"),
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "sources": [{"format": "debezium-json", "topics": ["t"]}],
        }
    )
    checks = preflight(config, brokers=False)
    assert [(c.item, c.ok) for c in checks] == [("warehouse", False), ("checkpoint", True)]
    with pytest.raises(StorageError) as info:
        raise_first_failure(checks)
    assert str(tmp_path / "file" / "wh") in info.value.message


def test_an_unknown_librdkafka_setting_is_named_at_once(tmp_path):
    start = time.monotonic()
    checks = preflight(_config(tmp_path, "127.0.0.1:1", options={"sasl.pasword": "x"}))
    took = time.monotonic() - start
    [kafka] = [c for c in checks if c.item == "kafka"]
    assert not kafka.ok and isinstance(kafka.error, ConfigError)
    assert kafka.detail.startswith("kafka.options: librdkafka has no setting 'sasl.pasword'")
    assert took < 10, took  # no wait for the brokers: the start-up budget is 30 s


def test_unreachable_brokers_fail_within_the_startup_timeout(tmp_path):
    port = free_port("127.0.0.1")  # nothing listens there
    start = time.monotonic()
    checks = preflight(_config(tmp_path, f"127.0.0.1:{port}", startup_timeout_s=2))
    took = time.monotonic() - start
    [kafka] = [c for c in checks if c.item == "kafka"]
    assert isinstance(kafka.error, SourceError) and kafka.error.code == Code.SOURCE_UNAVAILABLE
    assert "kafka.startup_timeout_s=2" in kafka.detail
    assert "raise kafka.startup_timeout_s to wait longer" in kafka.detail
    assert 1.5 < took < 10, took  # the start-up budget, not the 300 s outage budget


@pytest.mark.kafka
@pytest.mark.parametrize("kind", ["tansu_broker", "apache_kafka"])
def test_the_sources_topics_are_reported(request, kind, tmp_path):
    broker = request.getfixturevalue(kind)
    tag = uuid.uuid4().hex[:8]
    broker.create_topic(f"pg.{tag}.orders", partitions=2)
    broker.create_topic(f"my.{tag}.a")
    broker.create_topic(f"my.{tag}.b")
    sources = [
        {"name": "pg", "format": "debezium-json", "topics": [f"pg.{tag}.orders", f"pg.{tag}.x"]},
        {"name": "my", "format": "canal-json", "topic_pattern": rf"my\.{tag}\..*"},
        {"name": "none", "format": "maxwell-json", "topic_pattern": rf"nothing\.{tag}\..*"},
    ]
    checks = preflight(_config(tmp_path, broker.bootstrap_servers, sources))
    assert all(c.ok for c in checks), checks
    details = {c.item: c.detail for c in checks}
    assert details["sources[0] (pg)"] == (
        f"1 topic(s), 2 partition(s); not created yet (read once they are): pg.{tag}.x"
    )
    assert details["sources[1] (my)"] == "2 topic(s), 2 partition(s)"
    assert details["sources[2] (none)"].startswith("0 topic(s), 0 partition(s); no topic matches")

    overlapping = [
        {"name": "a", "format": "canal-json", "topic_pattern": rf"my\.{tag}\..*"},
        {"name": "b", "format": "maxwell-json", "topic_pattern": rf".*\.{tag}\.b"},
    ]
    checks = preflight(_config(tmp_path, broker.bootstrap_servers, overlapping))
    with pytest.raises(ConfigError, match=f"'my.{tag}.b' is one of sources 'a' and 'b'"):
        raise_first_failure(checks)


def _cdcflow(*args, timeout=120):
    # JAVA_HOME points nowhere: a check that let Spark start would fail differently
    env = {**os.environ, "PYTHONPATH": SRC, "JAVA_HOME": "/nonexistent-java"}
    return subprocess.run(
        [sys.executable, "-c", "from cdcflow.cli import entry; entry()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _yaml(tmp_path, bootstrap, **kafka) -> Path:
    path = tmp_path / "pipeline.yaml"
    extra = "".join(f", {k}: {v}" for k, v in kafka.items())
    path.write_text(
        "pipeline_id: pre\nwarehouse: wh\ncheckpoint: ck\n"
        f"kafka: {{bootstrap_servers: '{bootstrap}'{extra}}}\n"
        "sources: [{format: debezium-json, topics: [t]}]\n"
    )
    return path


def test_run_stops_before_spark_when_the_brokers_do_not_answer(tmp_path):
    config = _yaml(tmp_path, f"127.0.0.1:{free_port('127.0.0.1')}", startup_timeout_s=2)
    start = time.monotonic()
    done = _cdcflow("run", "--once", str(config))
    took = time.monotonic() - start
    assert done.returncode == 69, done.stderr
    assert done.stderr.splitlines()[-1].startswith("cdcflow: [SOURCE_UNAVAILABLE] Kafka brokers")
    assert "kafka.startup_timeout_s=2" in done.stderr and "Traceback" not in done.stderr
    assert took < 15, took


def test_validate_prints_each_check_and_exits_as_a_run_would(tmp_path):
    config = _yaml(tmp_path, "127.0.0.1:1", options="{sasl.pasword: x}")
    done = _cdcflow("validate", str(config))
    assert done.returncode == 2, done.stderr
    assert "ok    warehouse" in done.stdout and "FAIL  kafka" in done.stdout
    assert done.stderr.strip().startswith("cdcflow: [BAD_CONFIG] kafka.options: librdkafka")

    config = _yaml(tmp_path, "127.0.0.1:1")
    done = _cdcflow("validate", "--no-brokers", "--json", str(config))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and [c["item"] for c in report["checks"]] == ["warehouse", "checkpoint"]


def test_a_metrics_port_that_is_taken_is_named_before_spark_starts(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        raw = {
            "warehouse": str(tmp_path / "wh"),
            "checkpoint": str(tmp_path / "ck"),
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "sources": [{"format": "debezium-json", "topics": ["t"]}],
            "monitoring": {"prometheus_port": port},
        }
        started = time.monotonic()
        checks = preflight(parse_config(raw), brokers=False)
        assert [(c.item, c.ok) for c in checks][-1] == ("metrics", False)
        with pytest.raises(ConfigError) as info:
            raise_first_failure(checks)
        assert info.value.message.startswith(
            f"monitoring.prometheus_port: cannot listen on 127.0.0.1:{port} ("
        )
        assert info.value.message.endswith("; choose a free port or set it to null")
        assert time.monotonic() - started < 1.0
    free = preflight(parse_config(raw), brokers=False)[-1]  # closed again: free now
    assert (free.item, free.ok, free.detail) == ("metrics", True, f"127.0.0.1:{port} is free")


@pytest.mark.kafka
@pytest.mark.services
def test_refused_credentials_are_named_as_an_authentication_failure(apache_kafka, tmp_path):
    """Found in issue 19: a failed SASL handshake said to fix kafka.bootstrap.servers, after
    the whole start-up budget. Apache Kafka's SASL/PLAIN listener, a wrong password."""
    from cdcflow.source.kafka.admin import list_partitions
    from cdcflow_testkit.services.apache_kafka import SASL_USERS

    [(user, password)] = SASL_USERS.items()
    apache_kafka.create_topic("pre.sasl", partitions=1)
    sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user}
    sources = [{"format": "debezium-json", "topics": ["pre.sasl"]}]

    good = _config(tmp_path, apache_kafka.sasl_bootstrap_servers, sources,
                   options={**sasl, "sasl.password": password})  # fmt: skip
    assert [c.ok for c in preflight(good)] == [True, True, True, True]

    bad = _config(tmp_path, apache_kafka.sasl_bootstrap_servers, sources,
                  options={**sasl, "sasl.password": "not-" + password})  # fmt: skip
    started = time.monotonic()
    checks = preflight(bad)
    took = time.monotonic() - started
    print(f"refused credentials found in {took:.1f} s: {checks[-1].detail}")
    assert [(c.item, c.ok) for c in checks][-1] == ("kafka", False)
    with pytest.raises(ConfigError) as info:  # exit 2: the configuration to fix
        raise_first_failure(checks)
    message = info.value.message
    assert message.startswith(
        "kafka.options: listing the topics: authentication failed, the brokers refused the "
        "client's credentials (_AUTHENTICATION: "
    )
    assert message.endswith("fix kafka.options: security.protocol, sasl.mechanism, "
                            "sasl.username and sasl.password (or the ssl.* settings)")  # fmt: skip
    assert "bootstrap" not in message.split("(_AUTHENTICATION")[0]
    assert password not in message
    assert took < 5.0, "found at the first refused handshake, not after the 30 s budget"

    # mid-run, the source's own error says the same (a SourceError crosses from Spark)
    options = {**bad.kafka.reader_options(), "subscribe": "pre.sasl"}
    with pytest.raises(SourceError) as info:
        list_partitions(options, budget_s=30)
    assert info.value.refused == "authentication"
    assert "authentication failed" in info.value.message

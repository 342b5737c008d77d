"""``cdcflow broker`` / ``cdcflow-broker`` (issue 19, item 4): the embedded broker for
trying things out, and the advice it prints about tansu's high-watermark quirk, checked
against the real broker."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

pytestmark = [pytest.mark.kafka]


def test_the_command_starts_loads_and_says_how_to_produce(tmp_path):
    values = tmp_path / "values.jsonl"
    values.write_text("".join(f'{{"n": {i}}}\n' for i in range(67)) + "null\n")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cdcflow.cli import main; import sys; sys.exit(main())",
            "broker",
            "--topic",
            "try.me",
            str(values),
            "--exit-after-load",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "loaded 67 messages into try.me" in out  # the tombstone without a key is no message
    servers = re.search(r"^broker at (127\.0\.0\.1:\d+) ", out, re.M).group(1)
    assert f"kcat -P -b {servers} -t T -X batch.num.messages=1" in out
    assert "produce one message per batch (batch.num.messages=1)" in out


def _visible(broker, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "hw"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        consumer.close()
    return high


@pytest.mark.parametrize(
    ("batching", "all_visible"), [({}, False), ({"batch.num.messages": 1}, True)]
)
def test_the_advice_holds_on_the_embedded_broker(tansu_broker, batching, all_visible):
    """Found in issue 19: a plain producer's 67 records, 4 visible. One message per batch
    (the advice) makes every one visible."""
    topic = f"hw.{len(batching)}"
    tansu_broker.create_topic(topic, partitions=1)
    producer = Producer(
        {"bootstrap.servers": tansu_broker.bootstrap_servers, "linger.ms": 50, **batching}
    )
    for i in range(67):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    visible = _visible(tansu_broker, topic)
    assert (visible == 67) is all_visible, f"{visible} of 67 records visible"

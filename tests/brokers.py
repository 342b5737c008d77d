"""The brokers a test folder can run its Kafka tests on (see ``tests/conftest.py``)."""

from __future__ import annotations

from typing import Any

import pytest

#: test id -> the session fixture of that broker
BROKERS = {"tansu": "tansu_broker", "apache-kafka": "apache_kafka"}


@pytest.fixture(params=sorted(BROKERS))
def broker(request: Any) -> Any:
    """Each broker of :data:`BROKERS` in turn: a test folder's ``conftest.py`` imports this
    fixture to run its tests on every broker instead of tansu alone."""
    return request.getfixturevalue(BROKERS[request.param])


#: brokers that keep their records across a restart (for outage and restart tests)
DURABLE_BROKERS = ("tansu-s3", "apache-kafka")


def durable_broker(kind: str) -> Any:
    """A new, not yet started broker of ``kind`` (one of :data:`DURABLE_BROKERS`) whose
    records outlive its process: tansu on S3 storage, or Apache Kafka (its log folder)."""
    from cdcflow_testkit.services.apache_kafka import ApacheKafkaBroker
    from cdcflow_testkit.services.broker import EmbeddedBroker

    return EmbeddedBroker(storage="s3") if kind == "tansu-s3" else ApacheKafkaBroker()

"""The brokers a test folder can run its Kafka tests on (see ``tests/conftest.py``).

A folder whose tests exercise the broker itself (the Kafka source, the broker tools)
imports :func:`broker` into its ``conftest.py``: every test there runs on every broker.
The end-to-end folder imports :func:`broker_where_it_matters` instead: a test runs on
:data:`DEFAULT_BROKER` alone unless it is marked :data:`every_broker` (or parametrizes
``broker`` itself), because decoding, shaping and applying behave the same whichever
broker delivered the bytes; what differs between brokers (offsets after a restart,
fetching at given offsets, null values, topics created later) is marked.
"""

from __future__ import annotations

from typing import Any

import pytest

#: test id -> the session fixture of that broker
BROKERS = {"tansu": "tansu_broker", "apache-kafka": "apache_kafka"}

#: the broker of end-to-end tests where the broker's semantics do not matter
DEFAULT_BROKER = "tansu"

#: mark an end-to-end test that exercises what brokers do differently: it runs on each
every_broker = pytest.mark.parametrize("broker", sorted(BROKERS), indirect=True)


@pytest.fixture(params=sorted(BROKERS))
def broker(request: Any) -> Any:
    """Each broker of :data:`BROKERS` in turn: a test folder's ``conftest.py`` imports this
    fixture to run its tests on every broker instead of tansu alone."""
    return request.getfixturevalue(BROKERS[request.param])


@pytest.fixture(name="broker")
def broker_where_it_matters(request: Any) -> Any:
    """The broker of a test: the one its ``broker`` parameter names (:data:`every_broker`
    gives each of :data:`BROKERS`), else :data:`DEFAULT_BROKER`."""
    return request.getfixturevalue(BROKERS[getattr(request, "param", DEFAULT_BROKER)])


#: brokers that keep their records across a restart (for outage and restart tests)
DURABLE_BROKERS = ("tansu-s3", "apache-kafka")


def durable_broker(kind: str) -> Any:
    """A new, not yet started broker of ``kind`` (one of :data:`DURABLE_BROKERS`) whose
    records outlive its process: tansu on S3 storage, or Apache Kafka (its log folder)."""
    from cdcflow_testkit.services.apache_kafka import ApacheKafkaBroker
    from cdcflow_testkit.services.broker import EmbeddedBroker

    return EmbeddedBroker(storage="s3") if kind == "tansu-s3" else ApacheKafkaBroker()

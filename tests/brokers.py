"""The brokers a test folder can run its Kafka tests on (see ``tests/conftest.py``)."""

from __future__ import annotations

from typing import Any

#: test id -> the session fixture of that broker
BROKERS = {"tansu": "tansu_broker", "apache-kafka": "apache_kafka"}


def broker_of(request: Any) -> Any:
    """The broker of a ``broker`` fixture parametrized over :data:`BROKERS`::

    @pytest.fixture(params=sorted(BROKERS))
    def broker(request):
        return broker_of(request)
    """
    return request.getfixturevalue(BROKERS[request.param])

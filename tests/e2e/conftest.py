"""The end-to-end tests run on tansu and on Apache Kafka."""

import pytest
from tests.brokers import BROKERS, broker_of


@pytest.fixture(params=sorted(BROKERS))
def broker(request):
    """Each broker of :data:`tests.brokers.BROKERS` in turn."""
    return broker_of(request)

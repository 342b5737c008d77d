"""The end-to-end tests run on the default broker (tansu); those marked
``tests.brokers.every_broker`` run on tansu and on Apache Kafka (see ``tests/brokers.py``)."""

from tests.brokers import broker_where_it_matters  # noqa: F401 - the ``broker`` fixture

"""The broker tests run on tansu and on Apache Kafka."""

from tests.brokers import broker  # noqa: F401 - the fixture, parametrized over the brokers

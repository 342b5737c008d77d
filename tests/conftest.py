"""Shared fixtures: one local SparkSession for the whole run, one embedded broker."""

from __future__ import annotations

import os
import sys

import pytest

# Spark's Python workers must run this interpreter (the virtual environment's).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession (2 cores, few shuffle partitions), shared by all tests."""
    from cdcflow.spark import get_or_create_session

    session = get_or_create_session(app_name="cdcflow-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker():
    """The real embedded Kafka-compatible broker (tansu) on 127.0.0.1 with a free port."""
    from cdcflow.testing.broker import EmbeddedBroker

    with EmbeddedBroker() as b:
        yield b

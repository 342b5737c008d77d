"""Shared fixtures: one local SparkSession for the whole run, one broker of each kind.

``broker`` is the embedded tansu broker. Test folders that run on Apache Kafka as well
override it in their own ``conftest.py`` by importing ``tests.brokers.broker`` (one run
per broker).
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from hypothesis import settings

# Property tests run the same cases on every run (deterministic CI); set
# HYPOTHESIS_PROFILE=search to explore new random cases instead.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("search", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Spark's Python workers must run this interpreter (the virtual environment's).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession (2 cores, few shuffle partitions), shared by all tests;
    with Delta Lake's Spark jars and extension, for the ``delta-spark`` sink's tests."""
    from cdcflow.runtime.spark import get_or_create_session

    session = get_or_create_session(app_name="cdcflow-tests", delta_spark=True)
    yield session
    session.stop()


@pytest.fixture(
    params=["delta-rs", "delta-rs-merge", pytest.param("delta-spark", marks=pytest.mark.spark)]
)
def warehouse_factory(request):
    """``factory(root, pipeline_id) -> DeltaWarehouse`` of each sink and merge engine:
    the Arrow merge on the driver (the default), delta-rs's MERGE on the driver
    (``merge_engine="delta-rs"``), and ``delta-spark``
    (:class:`~cdcflow.sinks.delta_spark.SparkDeltaWarehouse`), which merges with Delta
    Lake's Spark commands on the shared session."""
    from cdcflow.sinks.warehouse import DeltaWarehouse

    def factory(root, pipeline_id="test"):
        if request.param == "delta-spark":
            from cdcflow.sinks.delta_spark import SparkDeltaWarehouse

            spark = request.getfixturevalue("spark")
            return SparkDeltaWarehouse(str(root), spark, pipeline_id=pipeline_id)
        engine = "delta-rs" if request.param == "delta-rs-merge" else "arrow"
        return DeltaWarehouse(str(root), pipeline_id=pipeline_id, merge_engine=engine)

    return factory


@pytest.fixture(scope="session")
def tansu_broker():
    """The real embedded Kafka-compatible broker (tansu) on 127.0.0.1 with a free port."""
    from cdcflow_testkit.services.broker import EmbeddedBroker

    with EmbeddedBroker() as b:
        yield b


@pytest.fixture(scope="session")
def moto_s3():
    """moto's S3 server on 127.0.0.1 with a free port (``cdcflow_testkit.services.object_stores``)."""
    from cdcflow_testkit.services.object_stores import MotoS3

    with MotoS3() as server:
        yield server


@pytest.fixture(scope="session")
def s3proxy():
    """S3Proxy (Maven Central's jar, Java) on 127.0.0.1 with a free port, in memory."""
    from cdcflow_testkit.services.object_stores import S3Proxy

    with S3Proxy() as server:
        yield server


@pytest.fixture(scope="session")
def azurite():
    """Azurite's Blob service (npm) on 127.0.0.1 with a free port, in memory."""
    from cdcflow_testkit.services.object_stores import Azurite

    with Azurite() as server:
        yield server


@pytest.fixture(params=["moto", pytest.param("s3proxy", marks=pytest.mark.services)])
def s3_store(request):
    """Each S3 implementation the tests run on: moto's server and S3Proxy, so that a vendor
    difference shows. Each test writes its own prefix (``s3_store.warehouse_uri()``)."""
    return request.getfixturevalue("moto_s3" if request.param == "moto" else "s3proxy")


@pytest.fixture(scope="session")
def apache_kafka():
    """A real Apache Kafka broker (KRaft, one node) on 127.0.0.1 with free ports, from
    Maven Central's jars (``cdcflow_testkit.services.apache_kafka``)."""
    from cdcflow_testkit.services.apache_kafka import ApacheKafkaBroker

    with ApacheKafkaBroker() as b:
        yield b


@pytest.fixture(scope="session")
def broker(tansu_broker):
    """The default broker of the tests: tansu (see the module docstring)."""
    return tansu_broker


#: fixtures that make a test need a mark (``make test`` splits its lanes by marks:
#: tests/run_suite.py), added here so that no test lands in the wrong lane
_FIXTURE_MARKS = {
    "spark": "spark",
    "broker": "kafka",
    "tansu_broker": "kafka",
    "apache_kafka": "kafka",
    "s3proxy": "services",
    "azurite": "services",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & _FIXTURE_MARKS.keys():
            if item.get_closest_marker(_FIXTURE_MARKS[fixture]) is None:
                item.add_marker(_FIXTURE_MARKS[fixture])


_exit_status: list[int] = []

#: the whole suite's budget in seconds (`make test` from a fresh clone, issue 33's target)
SUITE_BUDGET_S = float(os.environ.get("CDCFLOW_SUITE_BUDGET_S", 25 * 60))
_started_at: list[float] = []


def pytest_sessionstart(session):
    _started_at.append(time.monotonic())


def pytest_sessionfinish(session, exitstatus):
    _exit_status.append(int(exitstatus))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The suite's time guard: one line with the wall time against :data:`SUITE_BUDGET_S`.

    It says so (a warning line, not a failure) when a run of the whole suite passes its
    budget, so the minutes each capability adds are seen where they are added.
    """
    if not _started_at:
        return
    elapsed_s = time.monotonic() - _started_at[0]
    whole_suite = not config.option.markexpr and not config.option.keyword
    line = f"suite time {elapsed_s:.0f} s (budget {SUITE_BUDGET_S:.0f} s for the whole suite)"
    if whole_suite and elapsed_s > SUITE_BUDGET_S:
        terminalreporter.write_line(
            f"WARNING {line}: over by {elapsed_s - SUITE_BUDGET_S:.0f} s; "
            "see --durations in `make test`'s output for where it goes",
            yellow=True,
        )
    else:
        terminalreporter.write_line(line)


def pytest_unconfigure(config):
    """Leave without interpreter teardown once pytest has reported everything.

    Arrow's and delta-rs's native thread pools can abort CPython's finalization
    (``terminate called without an active exception``, delta-io/delta-rs#2184), which
    would turn a passing run into exit 134. The summary is printed by now.
    """
    if _exit_status and os.environ.get("CDCFLOW_TEST_HARD_EXIT", "1") == "1":
        import gc

        gc.collect()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])


@pytest.fixture(
    params=[
        "moto",
        pytest.param("s3proxy", marks=pytest.mark.services),
        pytest.param("azurite", marks=pytest.mark.services),
    ]
)
def object_store(request):
    """Each object-store server a warehouse is tested on: moto and S3Proxy (S3), Azurite
    (Azure Blob); each has ``warehouse_uri()`` and ``storage_options()``."""
    return request.getfixturevalue("moto_s3" if request.param == "moto" else request.param)


@pytest.fixture
def store_proxy(moto_s3):
    """A fault-injecting proxy in front of moto's S3 server, fresh per test
    (``cdcflow_testkit.services.store_proxy``): give a client its ``endpoint_url``."""
    from cdcflow_testkit.services.store_proxy import StoreProxy

    with StoreProxy(moto_s3.endpoint_url) as proxy:
        yield proxy

"""Apache Kafka as a test broker: one KRaft node on 127.0.0.1, from Maven Central's jars.

:class:`ApacheKafkaBroker` is :class:`~cdcflow_testkit.services.broker.EmbeddedBroker`'s interface
(topics, produce, watermarks, pause/resume/restart, outages) over a real Apache Kafka
broker instead of tansu: the ``org.apache.kafka:kafka_2.13`` jars and their dependencies,
resolved once with Maven into a cache folder (:func:`kafka_libs`), run as
``java kafka.Kafka`` in combined mode (broker and controller in one process, as Kafka's
own quick start does) with its log folder on local disk. The log folder outlives the
process, so :meth:`~cdcflow_testkit.services.broker.EmbeddedBroker.restart` and
:meth:`~cdcflow_testkit.services.broker.EmbeddedBroker.pause`/``resume`` keep every topic, record
and committed transaction, as a real broker restart does; :meth:`ApacheKafkaBroker.stop`
removes it.

Source documents: Apache Kafka's *Quick Start* (KRaft: ``kafka-storage.sh format`` then
``kafka-server-start.sh``) and its broker configuration reference
(``process.roles``, ``controller.quorum.voters``, ``listeners``).

Needs ``java`` (17 or newer) and, for the first resolution, ``mvn`` with access to Maven
Central. ``python -m cdcflow_testkit.services.apache_kafka`` resolves the jars and prints their
folder (``make test`` runs it first).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from cdcflow_testkit.services.broker import BrokerError, EmbeddedBroker
from cdcflow_testkit.services.maven import MavenError, maven_libs
from cdcflow_testkit.services.process import free_port, java_executable

__all__ = ["KAFKA_VERSION", "SASL_USERS", "ApacheKafkaBroker", "kafka_libs"]

#: the Apache Kafka release the tests run (``org.apache.kafka:kafka_2.13``)
KAFKA_VERSION = "4.4.0"
#: the SLF4J binding that sends the broker's log through Log4j 2 to its log file
LOG4J_VERSION = "2.24.3"

LOG4J2 = """status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""

_SERVER = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller_port}
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port},SASL_PLAINTEXT://{host}:{sasl_port}
advertised.listeners=PLAINTEXT://{host}:{port},SASL_PLAINTEXT://{host}:{sasl_port}
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required {users};
log.dirs={log_dir}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=1000
"""

#: the users of the SASL/PLAIN listener (:attr:`ApacheKafkaBroker.sasl_bootstrap_servers`)
SASL_USERS = {"cdcflow": "cdcflow-secret"}

#: JVM options: a small heap and the quick-starting compiler, for a test broker
_JVM_OPTIONS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """The folder holding Apache Kafka ``version``'s broker jars and their dependencies
    (``org.apache.kafka:kafka_2.13`` and an SLF4J binding for its log), resolved from
    Maven Central on first use (:func:`cdcflow_testkit.services.maven.maven_libs`).

    Raises:
        BrokerError: ``mvn`` is missing or could not resolve the artifacts.
    """
    try:
        return maven_libs(
            f"kafka_2.13-{version}",
            [
                f"org.apache.kafka:kafka_2.13:{version}",
                f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
            ],
        )
    except MavenError as exc:
        raise BrokerError(str(exc)) from exc


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as
    ``kafka-storage.sh random-uuid`` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


class ApacheKafkaBroker(EmbeddedBroker):
    """A single-node Apache Kafka broker (KRaft, combined mode) as a child process.

    Use as :class:`~cdcflow_testkit.services.broker.EmbeddedBroker`::

        with ApacheKafkaBroker() as broker:
            broker.create_topic("orders", partitions=3)
            broker.produce("orders", [(b"k1", b"v1")])
            broker.restart()  # same ports and log folder: everything is still there

    Args:
        libs: folder of the broker's jars; default :func:`kafka_libs` (``version``).
        version: Apache Kafka release to resolve when ``libs`` is not given.
        host, port, startup_timeout_s, request_timeout_s, keep_log: as
            :class:`~cdcflow_testkit.services.broker.EmbeddedBroker`.
        log_level: the broker's Log4j level (its log goes to :attr:`log_path`).
        java: the ``java`` executable; default ``$JAVA_HOME/bin/java``, else ``java``.

    Attributes:
        data_dir: the folder of the broker's configuration and log segments (removed by
            :meth:`stop`).
    """

    name = "Apache Kafka"
    #: a controlled shutdown (leadership moved, logs flushed) takes a few seconds
    term_grace_s = 20.0

    def __init__(
        self,
        libs: str | None = None,
        version: str = KAFKA_VERSION,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 90.0,
        request_timeout_s: float = 30.0,
        keep_log: bool = False,
        log_level: str = "WARN",
        java: str | None = None,
    ) -> None:
        super().__init__(
            binary=libs,
            host=host,
            port=port,
            startup_timeout_s=startup_timeout_s,
            request_timeout_s=request_timeout_s,
            keep_log=keep_log,
        )
        self.version = version
        self.log_level = log_level
        self.java = java or java_executable()
        self.data_dir: str | None = None
        self._controller_port: int | None = None
        self._sasl_port: int | None = None

    @property
    def sasl_bootstrap_servers(self) -> str:
        """A second listener, ``SASL_PLAINTEXT`` with mechanism ``PLAIN`` and the users of
        :data:`SASL_USERS`, for authentication tests."""
        if self._sasl_port is None:
            raise BrokerError("the broker has not started")
        return f"{self.host}:{self._sasl_port}"

    def _resolve_binary(self) -> str:
        return str(kafka_libs(self.version))

    def _command(self, binary: str, port: int) -> tuple[list[str], dict[str, str] | None]:
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="cdcflow-kafka-")
        data = Path(self.data_dir)
        if self._controller_port is None or self.port != port:
            self._controller_port = free_port(self.host)
            self._sasl_port = free_port(self.host)
        properties = data / "server.properties"
        properties.write_text(
            _SERVER.format(
                host=self.host,
                port=port,
                controller_port=self._controller_port,
                sasl_port=self._sasl_port,
                users=" ".join(f'user_{u}="{p}"' for u, p in SASL_USERS.items()),
                log_dir=data / "logs",
            )
        )
        log4j = data / "log4j2.properties"
        log4j.write_text(LOG4J2.format(level=self.log_level))
        base = [
            self.java,
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            os.path.join(binary, "*"),
        ]
        if not (data / "logs" / "meta.properties").exists():
            self._format(base, properties)
        return [*base, "kafka.Kafka", str(properties)], None

    def _format(self, base: list[str], properties: Path) -> None:
        """``kafka-storage.sh format``: a new cluster id in an empty log folder."""
        cmd = [*base, "kafka.tools.StorageTool", "format", "-t", _cluster_id()]
        run = subprocess.run(
            [*cmd, "-c", str(properties)], capture_output=True, text=True, check=False
        )
        if run.returncode != 0:
            tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
            raise BrokerError(
                f"formatting Apache Kafka's log folder failed (exit {run.returncode}): "
                f"{' | '.join(tail)}"
            )

    def resume(self) -> ApacheKafkaBroker:
        """Start the broker again (:meth:`EmbeddedBroker.resume`) and wait until every
        partition has its leader again: for a moment after a restart Apache Kafka answers
        ``NOT_LEADER_FOR_PARTITION`` (seen under load in a watermark request).

        Raises:
            BrokerError: as :meth:`EmbeddedBroker.resume`, or a partition had no leader
                within ``startup_timeout_s``.
        """
        super().resume()
        deadline = time.monotonic() + self.startup_timeout_s
        for topic in self.topics():
            if not topic.startswith("__"):
                self._wait_leaders(topic, deadline)
        return self

    def stop(self) -> None:
        """Stop the broker as :class:`~cdcflow_testkit.services.broker.EmbeddedBroker` does, then
        remove its log folder. Idempotent."""
        super().stop()
        if self.data_dir is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.data_dir)
            self.data_dir = None


if __name__ == "__main__":  # python -m cdcflow_testkit.services.apache_kafka: resolve the jars
    try:
        print(kafka_libs(sys.argv[1] if len(sys.argv) > 1 else KAFKA_VERSION))
    except BrokerError as exc:
        print(f"cdcflow: {exc}", file=sys.stderr)
        sys.exit(1)

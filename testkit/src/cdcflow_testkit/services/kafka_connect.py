"""Kafka Connect in standalone mode with Debezium's connectors, for capture tests.

:class:`ConnectStandalone` runs ``org.apache.kafka.connect.cli.ConnectStandalone`` (from
``org.apache.kafka:connect-runtime``) with Debezium's connectors on its class path, one
worker and the connectors given, against a test broker; the worker's source offsets live
in a file of its own folder. Its REST API (a free port on 127.0.0.1) tells when a
connector's task runs. This is how a user runs Debezium without a Connect cluster, and
the messages it publishes are Debezium's own, through Kafka Connect's ``JsonConverter``.

Source documents: Apache Kafka's *Kafka Connect* documentation (standalone mode, worker
configuration, ``JsonConverter`` and ``schemas.enable``) and Debezium's PostgreSQL
connector documentation (its configuration properties).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdcflow_testkit.services.apache_kafka import LOG4J2, LOG4J_VERSION
from cdcflow_testkit.services.broker import BrokerError
from cdcflow_testkit.services.maven import maven_libs
from cdcflow_testkit.services.process import ManagedProcess, free_port, java_executable

__all__ = [
    "CONNECT_VERSION",
    "DEBEZIUM_VERSION",
    "DEBEZIUM_VERSIONS",
    "ConnectStandalone",
    "connect_libs",
]

#: Kafka Connect's release (``org.apache.kafka:connect-runtime``): the Kafka line
#: Debezium 3.6 is built and tested with
CONNECT_VERSION = "4.1.1"
#: Debezium's release (the newest whose connectors all resolve from Maven Central here)
DEBEZIUM_VERSION = "3.6.1.Final"
#: the release of each Debezium connector: the MariaDB connector is served only up to
#: 3.5.0.Final (3.6 is not on Maven Central here)
DEBEZIUM_VERSIONS = {
    "postgres": DEBEZIUM_VERSION,
    "mysql": DEBEZIUM_VERSION,
    "mariadb": "3.5.0.Final",
}

_WORKER = """bootstrap.servers={bootstrap}
{converters}
offset.storage.file.filename={offsets}
offset.flush.interval.ms=500
listeners=http://127.0.0.1:{rest_port}
plugin.discovery=only_scan
"""
_JSON_CONVERTERS = """key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable={schemas}
value.converter.schemas.enable={schemas}"""
#: Apicurio's AvroConverter writing the Confluent wire format (magic byte 0, the 4-byte id
#: of the schema's content, Avro binary) with no schema id in headers, so that a
#: Confluent-compatible reader (the ccompat API) can read it
_AVRO_CONVERTER = """{side}.converter=io.apicurio.registry.utils.converter.AvroConverter
{side}.converter.apicurio.registry.url={registry}
{side}.converter.apicurio.registry.auto-register=true
{side}.converter.apicurio.registry.find-latest=true
{side}.converter.apicurio.registry.as-confluent=true
{side}.converter.apicurio.registry.use-id=contentId
{side}.converter.apicurio.registry.headers.enabled=false"""
_JVM_OPTIONS = ["-Xms128m", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


def connect_libs(connector: str = "postgres") -> Path:
    """The jars of Kafka Connect's runtime, its JSON converter and Debezium's ``connector``
    (``postgres``, ``mysql`` or ``mariadb``: :data:`DEBEZIUM_VERSIONS`), resolved from
    Maven Central on first use.

    Raises:
        cdcflow_testkit.services.maven.MavenError: Maven is missing or could not resolve them.
    """
    version = DEBEZIUM_VERSIONS[connector]
    return maven_libs(
        f"connect-{CONNECT_VERSION}-debezium-{connector}-{version}",
        [
            f"org.apache.kafka:connect-runtime:{CONNECT_VERSION}",
            f"org.apache.kafka:connect-json:{CONNECT_VERSION}",
            f"io.debezium:debezium-connector-{connector}:{version}",
            f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
        ],
    )


class ConnectStandalone(ManagedProcess):
    """One Kafka Connect standalone worker running the given connectors.

    Args:
        bootstrap_servers: the broker's ``host:port``.
        connectors: connector name -> its configuration (``connector.class`` and the
            connector's own properties).
        schemas: ``JsonConverter``'s ``schemas.enable`` for keys and values (``True``:
            each message is ``{"schema", "payload"}``, Kafka Connect's default).
        connector: the Debezium connector whose jars to load (``postgres``, ``mysql``).
        avro_registry_url: Apicurio Registry's own API
            (:attr:`cdcflow_testkit.services.apicurio.ApicurioRegistry.registry_url`): keys and
            values go through Apicurio's ``AvroConverter`` in the Confluent wire format
            instead of ``JsonConverter`` (``schemas`` is then ignored).
        startup_timeout_s: how long :meth:`start` waits for every connector's task.
        log_level: the worker's Log4j level (its log goes to :attr:`log_path`).

    Attributes:
        log_path: the worker's log file (kept when a start fails).
    """

    name = "Kafka Connect"
    log_name = "connect.log"
    stop_grace_s = 20.0
    error = BrokerError

    def __init__(
        self,
        bootstrap_servers: str,
        connectors: Mapping[str, Mapping[str, Any]],
        schemas: bool = True,
        connector: str = "postgres",
        avro_registry_url: str | None = None,
        startup_timeout_s: float = 120.0,
        log_level: str = "WARN",
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.connectors = {name: dict(conf) for name, conf in connectors.items()}
        self.schemas = schemas
        self.connector = connector
        self.avro_registry_url = avro_registry_url
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self._rest_port: int | None = None
        self._waiting: set[str] = set()

    def start(self) -> ConnectStandalone:
        """Start the worker and wait until every connector's task is ``RUNNING``.

        Raises:
            BrokerError: the worker exited, or a connector or task failed or did not run
                within ``startup_timeout_s`` (the message has the failure's trace head
                and names the log file).
        """
        self._libs = connect_libs(self.connector)
        self._waiting = set(self.connectors)
        return super().start()

    def _command(self, directory: str) -> list[str]:
        folder = Path(directory)
        self._rest_port = free_port("127.0.0.1")
        worker = folder / "worker.properties"
        if self.avro_registry_url is None:
            converters = _JSON_CONVERTERS.format(schemas=str(self.schemas).lower())
        else:
            from cdcflow_testkit.services.apicurio import converter_libs

            converters = "\n".join(
                _AVRO_CONVERTER.format(side=side, registry=self.avro_registry_url)
                for side in ("key", "value")
            )
            # a plugin folder of its own: its Avro and Apicurio jars stay apart from the
            # worker's class path (Kafka Connect's plugin isolation)
            converters += f"\nplugin.path={converter_libs().parent}"
        worker.write_text(
            _WORKER.format(
                bootstrap=self.bootstrap_servers,
                converters=converters,
                offsets=folder / "offsets",
                rest_port=self._rest_port,
            )
        )
        files = []
        for name, conf in self.connectors.items():
            path = folder / f"{name}.properties"
            lines = [f"name={name}", *(f"{k}={v}" for k, v in conf.items())]
            path.write_text("\n".join(lines) + "\n")
            files.append(str(path))
        log4j = folder / "log4j2.properties"
        log4j.write_text(LOG4J2.format(level=self.log_level))
        return [
            java_executable(),
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            os.path.join(str(self._libs), "*"),
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            *files,
        ]

    def status(self, name: str) -> dict[str, Any] | None:
        """The REST API's ``/connectors/{name}/status``, or ``None`` while it does not
        answer."""
        url = f"http://127.0.0.1:{self._rest_port}/connectors/{name}/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _ready(self) -> bool:
        """Every connector and its tasks ``RUNNING``; a ``FAILED`` one raises."""
        for name in sorted(self._waiting):
            status = self.status(name)
            if status is None:
                continue
            states = [status.get("connector", {}), *status.get("tasks", [])]
            failed = [s for s in states if s.get("state") == "FAILED"]
            if failed:
                trace = str(failed[0].get("trace", "")).splitlines()[:3]
                raise BrokerError(
                    f"Debezium connector {name!r} failed: {' | '.join(trace)}; log: {self.log_path}"
                )
            if status.get("tasks") and all(s.get("state") == "RUNNING" for s in states):
                self._waiting.discard(name)
        return not self._waiting


if __name__ == "__main__":  # python -m cdcflow_testkit.services.kafka_connect: resolve the jars
    import sys

    from cdcflow_testkit.services.maven import MavenError

    try:
        for name in sys.argv[1:] or ["postgres"]:
            print(connect_libs(name))
    except MavenError as exc:
        print(f"cdcflow: {exc}", file=sys.stderr)
        sys.exit(1)

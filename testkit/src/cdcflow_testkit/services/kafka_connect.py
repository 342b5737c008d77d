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

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdcflow_testkit.services.apache_kafka import LOG4J2, LOG4J_VERSION
from cdcflow_testkit.services.broker import BrokerError, _free_port, _stop_process
from cdcflow_testkit.services.maven import maven_libs

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


class ConnectStandalone:
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
        self.log_path: str | None = None
        self._dir: str | None = None
        self._rest_port: int | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> ConnectStandalone:
        """Start the worker and wait until every connector's task is ``RUNNING``.

        Raises:
            BrokerError: the worker exited, or a connector or task failed or did not run
                within ``startup_timeout_s`` (the message has the failure's trace head
                and names the log file).
        """
        libs = connect_libs(self.connector)
        self._dir = tempfile.mkdtemp(prefix="cdcflow-connect-")
        folder = Path(self._dir)
        self._rest_port = _free_port("127.0.0.1")
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
        self.log_path = str(folder / "connect.log")
        home = os.environ.get("JAVA_HOME")
        java = os.path.join(home, "bin", "java") if home else "java"
        cmd = [
            java,
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            os.path.join(str(libs), "*"),
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            *files,
        ]
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            self._wait_running()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def status(self, name: str) -> dict[str, Any] | None:
        """The REST API's ``/connectors/{name}/status``, or ``None`` while it does not
        answer."""
        url = f"http://127.0.0.1:{self._rest_port}/connectors/{name}/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return json.loads(answer.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _wait_running(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        waiting = set(self.connectors)
        while waiting:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"Kafka Connect exited with code {self._proc.returncode} during start-up; "
                    f"see its log: {self.log_path}"
                )
            for name in sorted(waiting):
                status = self.status(name)
                if status is None:
                    continue
                states = [status.get("connector", {}), *status.get("tasks", [])]
                failed = [s for s in states if s.get("state") == "FAILED"]
                if failed:
                    trace = str(failed[0].get("trace", "")).splitlines()[:3]
                    raise BrokerError(
                        f"Debezium connector {name!r} failed: {' | '.join(trace)}; "
                        f"log: {self.log_path}"
                    )
                if status.get("tasks") and all(s.get("state") == "RUNNING" for s in states):
                    waiting.discard(name)
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"Debezium connectors {sorted(waiting)} did not run within "
                    f"{self.startup_timeout_s:.0f} s; log: {self.log_path}"
                )
            time.sleep(0.2)

    def stop(self, keep_log: bool = False) -> None:
        """Stop the worker (SIGTERM, then SIGKILL) and remove its folder (unless
        ``keep_log``). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_process(proc, grace_s=20.0)
        if self._dir and not keep_log:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._dir)
            self._dir = None

    def __enter__(self) -> ConnectStandalone:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop(keep_log=exc_info[0] is not None)  # a failed test keeps the worker's log


if __name__ == "__main__":  # python -m cdcflow_testkit.services.kafka_connect: resolve the jars
    import sys

    from cdcflow_testkit.services.maven import MavenError

    try:
        for name in sys.argv[1:] or ["postgres"]:
            print(connect_libs(name))
    except MavenError as exc:
        print(f"cdcflow: {exc}", file=sys.stderr)
        sys.exit(1)

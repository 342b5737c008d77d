"""Maxwell's daemon (zendesk/maxwell) on a MariaDB binlog, for capture tests.

Maven Central has Maxwell only up to 1.22.6 (2019), which fails on MariaDB 10.11
("unhandled character set 'utf8mb3'"). Maxwell 1.45.0 is therefore built from its
source: ``testkit/third_party/maxwell/maxwell-1.45.0-src.tar.gz`` holds its ``pom.xml``,
``LICENSE`` (Apache 2.0), ``bin/`` and ``src/main`` exactly as tagged ``v1.45.0``
(commit 1fd299dc) in github.com/zendesk/maxwell. :func:`maxwell_home` builds it once with
Maven into the test kit's cache (dependencies from Maven Central; about 200 MB, 30 s
with a warm Maven cache), with one change: ``mysql-binlog-connector-java`` 0.31.0 is not
on Maven Central, so 0.30.1 is used and the one call 1.45.0 added for it
(``setTransparentlyDecompressTransactions``, MySQL 8.4's compressed transactions, which
MariaDB does not write) is left out.

:class:`Maxwell` runs ``bin/maxwell`` with the Kafka producer against a database and a
broker, in UTC (Maxwell formats TIME through ``java.sql.Time`` in the JVM's zone).

Source documents: Maxwell's documentation (quickstart, configuration reference: the
``output_*`` options, ``kafka_version``, ``schema_database``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

from cdcflow_testkit.services.broker import BrokerError
from cdcflow_testkit.services.maven import MavenError, cache_root, run_maven
from cdcflow_testkit.services.process import ManagedProcess

__all__ = ["MAXWELL_VERSION", "Maxwell", "maxwell_home", "source_tarball"]

MAXWELL_VERSION = "1.45.0"
#: the one kafka-clients jar Maxwell 1.45.0's build bundles (``--kafka_version``)
KAFKA_CLIENTS_VERSION = "3.7.1"
#: what Maxwell's log says once it reads the binlog
_READY = "Binlog connected."

# (file, old text, new text): the build's changes, each applied exactly once
_CHANGES = [
    (
        "pom.xml",
        "<artifactId>mysql-binlog-connector-java</artifactId>\n      <version>0.31.0</version>",
        "<artifactId>mysql-binlog-connector-java</artifactId>\n      <version>0.30.1</version>",
    ),
    (
        "src/main/java/com/zendesk/maxwell/replication/BinlogConnectorReplicator.java",
        "\t\tthis.client.setTransparentlyDecompressTransactions(true);\n",
        "",
    ),
]


def source_tarball() -> Path:
    """Maxwell's source kept beside the test kit (``testkit/third_party/maxwell``), or
    ``$CDCFLOW_MAXWELL_SOURCE``."""
    env = os.environ.get("CDCFLOW_MAXWELL_SOURCE")
    if env:
        return Path(env)
    kit = Path(__file__).resolve().parents[3]  # testkit/ (src/cdcflow_testkit/services/)
    return kit / "third_party" / "maxwell" / f"maxwell-{MAXWELL_VERSION}-src.tar.gz"


def maxwell_home(tarball: Path | None = None) -> Path:
    """The folder of Maxwell's built distribution (``bin/maxwell``, ``lib/``), built on
    first use under the test kit's cache folder (module docstring).

    Raises:
        MavenError: Maven is missing, the source is not found, a change no longer applies,
            or the build failed (its first error line; its log is kept).
    """
    home = cache_root() / f"maxwell-{MAXWELL_VERSION}"
    dist = home / "dist"
    if (home / ".built").exists() and (dist / "bin" / "maxwell").exists():
        return dist
    tarball = tarball or source_tarball()
    if not tarball.exists():
        raise MavenError(
            f"Maxwell's source is not at {tarball}: run from a checkout of cdcflow, or set "
            "CDCFLOW_MAXWELL_SOURCE to maxwell-1.45.0-src.tar.gz"
        )
    if shutil.which("mvn") is None:
        raise MavenError("Maxwell is built with Maven: install it (apt-get install maven)")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(home, filter="data")
    src = home / f"maxwell-{MAXWELL_VERSION}"
    for name, old, new in _CHANGES:
        path = src / name
        text = path.read_text()
        if text.count(old) != 1:
            raise MavenError(f"the build change to {name} no longer applies: {old!r} not found")
        path.write_text(text.replace(old, new))
    log = home / "build.log"
    what = f"building Maxwell {MAXWELL_VERSION}"
    args = ["-f", str(src / "pom.xml"), "package", "-DskipTests"]
    run_maven([*args, "-Dmaven.javadoc.skip=true", "-Dgpg.skip"], log, what)
    built = src / "target" / f"maxwell-{MAXWELL_VERSION}" / f"maxwell-{MAXWELL_VERSION}"
    if not (built / "bin" / "maxwell").exists():
        raise MavenError(f"{what} made no distribution ({built}); log: {log}")
    built.rename(dist)
    shutil.rmtree(src)  # the build tree (600 MB) is not needed to run
    (home / ".built").touch()
    return dist


class Maxwell(ManagedProcess):
    """One Maxwell daemon publishing a database's binlog to Kafka.

    Args:
        host, port, user, password: the database and an account with ``SELECT``,
            ``REPLICATION CLIENT``, ``REPLICATION SLAVE`` and all rights on the
            ``maxwell`` schema (Maxwell's own state: positions, schemas).
        bootstrap_servers: the broker's ``host:port``.
        topic: Maxwell's ``kafka_topic``.
        options: more ``--name=value`` options (e.g. ``{"output_ddl": "true"}``).
        startup_timeout_s: how long :meth:`start` waits for ``Binlog connected.``.

    Attributes:
        log_path: Maxwell's log (kept when a start fails or a test fails).
    """

    name = "Maxwell"
    log_name = "maxwell.log"
    error = BrokerError
    new_session = True  # bin/maxwell is a script: SIGTERM goes to its process group

    def __init__(
        self,
        host: str,
        port: int,
        user: str,
        password: str,
        bootstrap_servers: str,
        topic: str,
        options: dict[str, str] | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        self.args = [
            f"--host={host}",
            f"--port={port}",
            f"--user={user}",
            f"--password={password}",
            "--schema_database=maxwell",
            "--producer=kafka",
            f"--kafka_version={KAFKA_CLIENTS_VERSION}",
            f"--kafka.bootstrap.servers={bootstrap_servers}",
            f"--kafka_topic={topic}",
            *(f"--{k}={v}" for k, v in (options or {}).items()),
        ]
        self.startup_timeout_s = startup_timeout_s

    def start(self) -> Maxwell:
        """Build Maxwell if needed, start it and wait until it reads the binlog.

        Raises:
            MavenError: Maxwell cannot be built.
            BrokerError: Maxwell exited or did not connect within the timeout.
        """
        self._home = maxwell_home()
        return super().start()

    def _command(self, folder: str) -> list[str]:
        return [str(self._home / "bin" / "maxwell"), *self.args]

    def _environment(self) -> dict[str, str]:
        return dict(os.environ, JAVA_OPTS="-Xmx384m -XX:+UseSerialGC -Duser.timezone=UTC")

    def _ready(self) -> bool:
        assert self.log_path is not None
        return _READY in Path(self.log_path).read_text(errors="replace")

    def _terminate(self, proc: subprocess.Popen) -> None:
        """SIGTERM to the group (Maxwell stores its position and exits), SIGKILL after 30 s."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


if __name__ == "__main__":  # python -m cdcflow_testkit.services.maxwell: build Maxwell
    import sys

    try:
        print(maxwell_home())
    except MavenError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)

"""Maxwell's daemon (zendesk/maxwell) on a MariaDB binlog, for capture tests.

Maven Central has Maxwell only up to 1.22.6 (2019), which fails on MariaDB 10.11
("unhandled character set 'utf8mb3'"). Maxwell 1.45.0 is therefore built from its
source: ``third_party/maxwell/maxwell-1.45.0-src.tar.gz`` holds its ``pom.xml``,
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
import tempfile
import time
from pathlib import Path

from cdcflow_testkit.services.broker import BrokerError
from cdcflow_testkit.services.maven import MavenError, cache_root, run_maven

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
    """Maxwell's source in this repository (``third_party/maxwell``), or
    ``$CDCFLOW_MAXWELL_SOURCE``."""
    env = os.environ.get("CDCFLOW_MAXWELL_SOURCE")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    return repo / "third_party" / "maxwell" / f"maxwell-{MAXWELL_VERSION}-src.tar.gz"


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


class Maxwell:
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
        self.log_path: str | None = None
        self._dir: str | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> Maxwell:
        """Build Maxwell if needed, start it and wait until it reads the binlog.

        Raises:
            MavenError: Maxwell cannot be built.
            BrokerError: Maxwell exited or did not connect within the timeout.
        """
        dist = maxwell_home()
        self._dir = tempfile.mkdtemp(prefix="cdcflow-maxwell-")
        self.log_path = os.path.join(self._dir, "maxwell.log")
        env = dict(os.environ, JAVA_OPTS="-Xmx384m -XX:+UseSerialGC -Duser.timezone=UTC")
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(dist / "bin" / "maxwell"), *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self._dir,
                env=env,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + self.startup_timeout_s
            while _READY not in Path(self.log_path).read_text(errors="replace"):
                if self._proc.poll() is not None:
                    raise BrokerError(
                        f"Maxwell exited with code {self._proc.returncode} during start-up; "
                        f"see its log: {self.log_path}"
                    )
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"Maxwell did not connect within {self.startup_timeout_s:.0f} s; "
                        f"log: {self.log_path}"
                    )
                time.sleep(0.2)
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM (Maxwell stores its position and exits), SIGKILL after 30 s; removes
        its folder unless ``keep_log``. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._dir and not keep_log:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._dir)
            self._dir = None

    def __enter__(self) -> Maxwell:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop(keep_log=exc_info[0] is not None)


if __name__ == "__main__":  # python -m cdcflow_testkit.services.maxwell: build Maxwell
    import sys

    try:
        print(maxwell_home())
    except MavenError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)

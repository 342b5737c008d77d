"""A throwaway PostgreSQL server on 127.0.0.1 with logical decoding on, for capture tests.

:class:`LocalPostgres` runs Debian's PostgreSQL server binaries (package
``postgresql``; ``pg_config --bindir`` or ``/usr/lib/postgresql/<n>/bin``): ``initdb`` into a
new folder, ``wal_level=logical`` (what Debezium's PostgreSQL connector reads with the
``pgoutput`` plugin), a free port, trust authentication on loopback only. PostgreSQL
refuses to run as root, so when this process is root the server runs as the ``postgres``
system user (``runuser``). :meth:`LocalPostgres.stop` stops it and removes the folder.

Source documents: PostgreSQL 15 *Server Setup and Operation* (``initdb``, ``pg_ctl``) and
*Logical Decoding* (``wal_level``, replication slots); Debezium's PostgreSQL connector
documentation, "Setting up PostgreSQL" (``pgoutput``, ``REPLICA IDENTITY``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from typing import Any

from cdcflow_testkit.services.broker import BrokerError
from cdcflow_testkit.services.process import free_port, wait_until

__all__ = ["LocalPostgres", "PostgresError"]

_OS_USER = "postgres"


class PostgresError(BrokerError):
    """The PostgreSQL server could not be found, started or reached."""


def _bindir() -> str:
    """The folder of PostgreSQL's server programs (``initdb``, ``pg_ctl``)."""
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        path = out.stdout.strip()
        if out.returncode == 0 and os.path.exists(os.path.join(path, "initdb")):
            return path
    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(path, "initdb")):
            return path
    raise PostgresError(
        "PostgreSQL's server programs (initdb, pg_ctl) are not installed: "
        "apt-get install postgresql (Debian), then run again"
    )


class LocalPostgres:
    """A PostgreSQL server of its own, started by :meth:`start` and removed by :meth:`stop`.

    Use as a context manager::

        with LocalPostgres() as pg:
            with pg.connect() as conn:
                conn.execute("CREATE TABLE t (id int PRIMARY KEY)")

    Args:
        database: the database created for the tests.
        host: interface to listen on.
        startup_timeout_s: how long to wait for the server to accept connections.

    Attributes:
        port: TCP port (a free one, chosen by :meth:`start`).
        user: the superuser to connect as (``postgres``).
        data_dir: the server's folder.
    """

    def __init__(
        self, database: str = "shop", host: str = "127.0.0.1", startup_timeout_s: float = 60.0
    ) -> None:
        self.database = database
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.port: int | None = None
        self.user = "postgres"
        self.data_dir: str | None = None
        self._root: str | None = None
        self._bin: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", _OS_USER, "--", *cmd]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if check and run.returncode != 0:
            tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
            raise PostgresError(f"{os.path.basename(args[0])} failed: {' | '.join(tail)}")
        return run

    def start(self) -> LocalPostgres:
        """``initdb``, configure, start and create :attr:`database`.

        Raises:
            PostgresError: PostgreSQL is not installed, or did not start in time (the
                message has the tail of its log).
        """
        self._bin = _bindir()
        self._root = tempfile.mkdtemp(prefix="cdcflow-pg-")
        self.data_dir = os.path.join(self._root, "data")
        if os.geteuid() == 0:
            shutil.chown(self._root, _OS_USER, _OS_USER)
        try:
            self._run(
                os.path.join(self._bin, "initdb"),
                "-D",
                self.data_dir,
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            )
            self.port = free_port(self.host)
            with open(os.path.join(self.data_dir, "postgresql.conf"), "a") as conf:
                conf.write(
                    f"listen_addresses = '{self.host}'\n"
                    f"port = {self.port}\n"
                    f"unix_socket_directories = '{self._root}'\n"
                    "wal_level = logical\n"
                    "max_replication_slots = 10\n"
                    "max_wal_senders = 10\n"
                    "fsync = off\n"
                    "synchronous_commit = off\n"
                    "full_page_writes = off\n"
                    "timezone = 'UTC'\n"
                )
            with open(os.path.join(self.data_dir, "pg_hba.conf"), "w") as hba:
                hba.write(
                    "local all all trust\n"
                    f"host all all {self.host}/32 trust\n"
                    f"host replication all {self.host}/32 trust\n"
                )
            log = os.path.join(self._root, "server.log")
            self._run(
                os.path.join(self._bin, "pg_ctl"),
                "-D",
                self.data_dir,
                "-l",
                log,
                "-w",
                "-t",
                str(int(self.startup_timeout_s)),
                "start",
            )
            self._wait_ready()
            with self.connect("postgres") as conn:
                conn.execute(f'CREATE DATABASE "{self.database}"')
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        import psycopg

        def accepts() -> bool:
            with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                return True

        wait_until(
            accepts,  # pg_ctl started the server and returned: no process to watch
            name="PostgreSQL",
            log=os.path.join(self._root or "", "server.log"),
            timeout_s=self.startup_timeout_s,
            not_yet=(psycopg.OperationalError,),
            interval_s=0.1,
            error=PostgresError,
        )

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its folder. Idempotent."""
        if self._bin and self.data_dir and os.path.exists(self.data_dir):
            self._run(
                os.path.join(self._bin, "pg_ctl"),
                "-D",
                self.data_dir,
                "-m",
                "fast",
                "stop",
                check=False,
            )
        if self._root:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._root)
        self._root = self.data_dir = None

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ clients

    def dsn(self, database: str | None = None) -> str:
        """A libpq connection string for ``database`` (default :attr:`database`)."""
        if self.port is None:
            raise PostgresError("the PostgreSQL server is not started; call start() first")
        return (
            f"host={self.host} port={self.port} user={self.user} dbname={database or self.database}"
        )

    def version(self) -> str:
        """The server's ``SELECT version()``."""
        with self.connect() as conn:
            return str(conn.execute("SELECT version()").fetchone()[0])

    def connect(self, database: str | None = None) -> Any:
        """A psycopg connection in autocommit mode (each statement its own transaction
        unless the caller opens one with ``conn.transaction()``)."""
        import psycopg

        return psycopg.connect(self.dsn(database), autocommit=True)

"""A throwaway MariaDB server on 127.0.0.1 with a row-based binlog, for capture tests.

:class:`LocalMariaDB` runs Debian's MariaDB server (package ``mariadb-server``):
``mariadb-install-db`` into a new folder, then ``mariadbd`` on a free port with the binary
log on in ``ROW`` format with full row images (what Debezium's MariaDB connector and
Maxwell read), server id 1, time zone UTC. MariaDB refuses to run as root unless told
which user to be, so when this process is root it runs as the ``mysql`` system user. A
user ``cdc`` (password ``cdc``) with every privilege, replication included, is created for
the capture tools. :meth:`LocalMariaDB.stop` stops it and removes the folder.

Source documents: MariaDB's *mariadb-install-db* and *Binary Log Formats*
(``binlog_format=ROW``, ``binlog_row_image=FULL``); Debezium's MariaDB connector
documentation, "Setting up MariaDB".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from typing import Any

from cdcflow_testkit.services.broker import BrokerError
from cdcflow_testkit.services.process import free_port, stop_process, wait_until

__all__ = ["LocalMariaDB", "MariaDBError"]

_OS_USER = "mysql"


class MariaDBError(BrokerError):
    """The MariaDB server could not be found, started or reached."""


class LocalMariaDB:
    """A MariaDB server of its own, started by :meth:`start` and removed by :meth:`stop`.

    Args:
        database: the database created for the tests.
        host: interface to listen on.
        startup_timeout_s: how long to wait for the server to accept connections.

    Attributes:
        port: TCP port (a free one, chosen by :meth:`start`).
        user, password: the capture tools' account (``cdc``/``cdc``).
    """

    def __init__(
        self, database: str = "shop", host: str = "127.0.0.1", startup_timeout_s: float = 60.0
    ) -> None:
        self.database = database
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.port: int | None = None
        self.user = "cdc"
        self.password = "cdc"
        self._root: str | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> LocalMariaDB:
        """Install a data folder, start the server and create the database and account.

        Raises:
            MariaDBError: MariaDB is not installed or did not start in time (the message
                names its log).
        """
        server = shutil.which("mariadbd") or (
            "/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None
        )
        install = shutil.which("mariadb-install-db")
        if server is None or install is None:
            raise MariaDBError(
                "MariaDB's server is not installed: apt-get install mariadb-server (Debian), "
                "then run again"
            )
        self._root = tempfile.mkdtemp(prefix="cdcflow-mariadb-")
        data = os.path.join(self._root, "data")
        as_user = ["--user=" + _OS_USER] if os.geteuid() == 0 else []
        if os.geteuid() == 0:
            shutil.chown(self._root, _OS_USER, _OS_USER)
        try:
            run = subprocess.run(
                [
                    install,
                    "--no-defaults",
                    f"--datadir={data}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    *as_user,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if run.returncode != 0:
                tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
                raise MariaDBError(f"mariadb-install-db failed: {' | '.join(tail)}")
            self.port = free_port(self.host)
            self.log_path = os.path.join(self._root, "server.log")
            cmd = [
                server,
                "--no-defaults",
                f"--datadir={data}",
                f"--port={self.port}",
                f"--bind-address={self.host}",
                f"--socket={os.path.join(self._root, 'mysqld.sock')}",
                f"--pid-file={os.path.join(self._root, 'mysqld.pid')}",
                f"--log-error={self.log_path}",
                f"--log-bin={os.path.join(self._root, 'binlog')}",
                "--server-id=1",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--default-time-zone=+00:00",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
                "--innodb-flush-log-at-trx-commit=2",
                "--skip-name-resolve",
                *as_user,
            ]
            self._proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
            )
            self._wait_ready()
            with self.connect(root=True) as conn, conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{self.database}`")
                cur.execute(f"CREATE USER '{self.user}'@'%' IDENTIFIED BY '{self.password}'")
                cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{self.user}'@'%' WITH GRANT OPTION")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        import pymysql

        assert self._proc is not None
        wait_until(
            lambda: self.connect(root=True).close() is None,
            name="MariaDB",
            log=self.log_path,
            timeout_s=self.startup_timeout_s,
            processes=[self._proc],
            not_yet=(pymysql.err.OperationalError,),
            interval_s=0.1,
            error=MariaDBError,
        )

    def stop(self) -> None:
        """Stop the server (SIGTERM: a clean shutdown) and remove its folder. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, grace_s=30.0)
        if self._root:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._root)
        self._root = None

    def __enter__(self) -> LocalMariaDB:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def version(self) -> str:
        """The server's ``SELECT VERSION()``."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            return str(cur.fetchone()[0])

    def connect(self, root: bool = False) -> Any:
        """A PyMySQL connection in autocommit mode, time zone UTC (as ``root`` over the
        server's socket, else as the capture account over TCP to :attr:`database`)."""
        import pymysql

        if root:
            assert self._root is not None
            return pymysql.connect(
                unix_socket=os.path.join(self._root, "mysqld.sock"),
                user="root",
                autocommit=True,
                init_command="SET time_zone = '+00:00'",
            )
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=self.database,
            autocommit=True,
            init_command="SET time_zone = '+00:00'",
        )

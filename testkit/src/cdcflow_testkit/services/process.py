"""One way to run a real service for the tests: a child process on 127.0.0.1 with a free
port, a work folder and a log, started until it is ready or has exited, then stopped.

:class:`ManagedProcess` is the launchers' base (Apicurio Registry, Kafka Connect, Maxwell);
:func:`free_port` and :func:`stop_process` serve the launchers that manage more than one
process or one they do not start themselves (tansu, Apache Kafka, PostgreSQL's ``pg_ctl``,
MariaDB, the Spark cluster).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import ClassVar, Self

from cdcflow.errors import CdcflowError

__all__ = [
    "ManagedProcess",
    "ServiceError",
    "free_port",
    "java_executable",
    "stop_process",
    "wait_until",
]


class ServiceError(CdcflowError):
    """A test service did not start, or failed while running; the message names its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen, hard: bool = False, grace_s: float = 5.0) -> None:
    """SIGTERM (SIGKILL if ``hard``) and wait; SIGKILL after ``grace_s`` seconds."""
    if proc.poll() is None:
        if hard:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def java_executable() -> str:
    """The ``java`` to run: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else "java"


def wait_until(
    ready: Callable[[], bool],
    *,
    name: str,
    log: str | None,
    timeout_s: float,
    processes: Sequence[subprocess.Popen] = (),
    not_yet: tuple[type[BaseException], ...] = (),
    interval_s: float = 0.2,
    error: Callable[[str], BaseException] = ServiceError,
) -> None:
    """Poll ``ready`` until it answers ``True``: the one start-up wait of every launcher.

    Args:
        ready: the probe (a connection, a request, a line in a log).
        name: the service, as messages name it.
        log: where its output is, named in every message.
        timeout_s: how long to wait, seconds.
        processes: the service's processes; one that exits ends the wait at once.
        not_yet: exceptions of ``ready`` that mean "not ready yet" (the last is named).
        interval_s: the pause between probes, seconds.
        error: the exception class raised.

    Raises:
        ``error``: a process exited, or the service was not ready within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        for proc in processes:
            if proc.poll() is not None:
                raise error(
                    f"{name} exited with code {proc.returncode} during start-up; see its log: {log}"
                )
        try:
            if ready():
                return
        except not_yet as exc:
            last = exc
        if time.monotonic() > deadline:
            why = f" (last error: {last})" if last is not None else ""
            raise error(f"{name} was not ready within {timeout_s:.0f} s{why}; log: {log}")
        time.sleep(interval_s)


class ManagedProcess:
    """A service run as one child process: :meth:`start` makes a work folder, runs
    :meth:`_command` there with its output in :attr:`log_path`, and polls :meth:`_ready`
    until it answers ``True``; :meth:`stop` ends it and removes the folder. As a context
    manager a failed block keeps the folder, so the log can be read.

    Subclasses set :attr:`name`, :attr:`log_name`, :attr:`stop_grace_s` and implement
    :meth:`_command` and :meth:`_ready` (which raises :attr:`error` for a failure that
    waiting will not mend); :meth:`_prepare` writes configuration files first.

    Raises (from :meth:`start`):
        ServiceError (or the subclass's :attr:`error`): the process exited during start-up,
            or was not ready within ``startup_timeout_s``; the message names the log.
    """

    name: ClassVar[str] = "service"
    log_name: ClassVar[str] = "service.log"
    stop_grace_s: ClassVar[float] = 10.0
    poll_interval_s: ClassVar[float] = 0.2
    error: ClassVar[type[Exception]] = ServiceError
    #: run in a session of its own (a launcher script whose children a signal to the
    #: process group must reach, as Maxwell's)
    new_session: ClassVar[bool] = False

    startup_timeout_s: float = 120.0
    log_path: str | None = None
    _dir: str | None = None
    _proc: subprocess.Popen | None = None

    # -------------------------------------------------------------- subclass hooks

    def _prepare(self, folder: str) -> None:
        """Write what the process reads (configuration files) into ``folder``."""

    def _command(self, folder: str) -> list[str]:
        """The command line, run in ``folder``."""
        raise NotImplementedError

    def _environment(self) -> dict[str, str] | None:
        """The process's environment (``None``: this process's)."""
        return None

    def _ready(self) -> bool:
        """Whether the service answers yet."""
        raise NotImplementedError

    def _terminate(self, proc: subprocess.Popen) -> None:
        stop_process(proc, grace_s=self.stop_grace_s)

    # -------------------------------------------------------------- life cycle

    def start(self) -> Self:
        self._dir = tempfile.mkdtemp(prefix=f"cdcflow-{self.log_name.split('.')[0]}-")
        self.log_path = os.path.join(self._dir, self.log_name)
        try:
            self._prepare(self._dir)
            with open(self.log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    self._command(self._dir),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self._dir,
                    env=self._environment(),
                    start_new_session=self.new_session,
                )
            self._wait_ready()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        wait_until(
            self._ready,
            name=self.name,
            log=self.log_path,
            timeout_s=self.startup_timeout_s,
            processes=[self._proc],
            interval_s=self.poll_interval_s,
            error=self.error,
        )

    def stop(self, keep_log: bool = False) -> None:
        """End the process (:meth:`_terminate`) and remove its folder unless ``keep_log``.
        Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._terminate(proc)
        if self._dir and not keep_log:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._dir)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop(keep_log=exc_info[0] is not None)  # a failed block keeps the log

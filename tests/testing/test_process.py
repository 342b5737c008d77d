"""The launchers' one start-up wait: ready, exited (log named), or timed out (last error
named)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cdcflow_testkit.services.process import ServiceError, java_executable, wait_until


def test_returns_once_the_probe_answers():
    answers = iter([False, False, True])
    wait_until(lambda: next(answers), name="svc", log="svc.log", timeout_s=5, interval_s=0)


def test_a_process_that_exits_ends_the_wait_with_its_code_and_log():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(
        ServiceError, match=r"svc exited with code 3 during start-up; see its log: L"
    ):
        wait_until(lambda: False, name="svc", log="L", timeout_s=5, processes=[proc])


def test_a_timeout_names_the_last_not_yet_error_and_other_errors_escape():
    def refused() -> bool:
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(
        ServiceError, match=r"not ready within 0 s \(last error: nobody listens\); log: L"
    ):
        wait_until(refused, name="svc", log="L", timeout_s=0, not_yet=(OSError,), interval_s=0)
    with pytest.raises(ConnectionRefusedError):  # not a "not yet": a failure of the probe
        wait_until(refused, name="svc", log="L", timeout_s=5, interval_s=0)


def test_java_is_java_home_s_or_the_path_s(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert java_executable() == str(tmp_path / "bin" / "java")
    monkeypatch.delenv("JAVA_HOME")
    assert java_executable() == "java"

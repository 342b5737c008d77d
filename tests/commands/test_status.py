"""``cdcflow status CONFIG`` and unreachable brokers: the warehouse is read first, so a
folder without cdcflow tables, or a warehouse with nothing applied yet, is reported at
once instead of after ``kafka.startup_timeout_s`` of waiting for brokers it does not need;
with applied partitions the wait is that budget, and the brokers' failure is one line."""

from __future__ import annotations

import time

from tests.report_warehouse import build_empty_warehouse, build_warehouse

from cdcflow.cli import main
from cdcflow_testkit.services.process import free_port


def _config(tmp_path, **kafka) -> str:
    """A pipeline ``shop`` whose brokers do not answer (nothing listens on the port)."""
    settings = ", ".join(
        [f"bootstrap_servers: '127.0.0.1:{free_port('127.0.0.1')}'"]
        + [f"{k}: {v}" for k, v in kafka.items()]
    )
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        f"pipeline_id: shop\nwarehouse: {tmp_path / 'wh'}\ncheckpoint: {tmp_path / 'ck'}\n"
        f"kafka: {{{settings}}}\n"
        "sources: [{name: pg, format: debezium-json, topics: [pg.cdc]}]\n"
    )
    return str(path)


def test_a_folder_without_cdcflow_tables_is_said_at_once(tmp_path, capsys):
    (tmp_path / "wh").mkdir()
    config = _config(tmp_path)  # kafka.startup_timeout_s: 30 (the default)
    started = time.monotonic()
    assert main(["status", config]) == 2
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert "holds no cdcflow tables" in err and err.count("\n") == 1
    assert took < 10, f"status waited {took:.0f} s for brokers it did not need"


def test_nothing_applied_yet_needs_no_brokers(tmp_path, capsys):
    build_empty_warehouse(tmp_path / "wh", tables={"shop.public.orders": 2})
    config = _config(tmp_path)
    started = time.monotonic()
    assert main(["status", config]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert "sources   0" in out and "records behind unknown" not in out
    assert took < 10, f"status waited {took:.0f} s for brokers it did not need"


def test_unreachable_brokers_are_one_line_after_the_startup_timeout(tmp_path, capsys):
    build_warehouse(tmp_path / "wh")
    config = _config(tmp_path, startup_timeout_s=1)
    started = time.monotonic()
    assert main(["status", config]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if "records behind unknown" in x]
    assert line.startswith(
        "  (records behind unknown: [SOURCE_UNAVAILABLE] Kafka brokers 127.0.0.1:"
    )
    assert "kafka.startup_timeout_s=1" in line
    assert "pg.cdc[0] next offset" in out and "behind)" not in out  # no log end shown
    assert took < 15, took

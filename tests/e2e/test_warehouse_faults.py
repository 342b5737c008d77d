"""End to end, faults of the warehouse (issue 8, items 3 and 6; decision 25): the real
embedded broker, real local Spark, real Delta tables damaged or starved the way operators
find them.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from tests.e2e.helpers import Scenario, check_accounting, check_changelog_once, pipeline_config
from tests.volumes import fill, tmpfs, truncate_last_commit

from cdcflow.config import load_config
from cdcflow.errors import Code
from cdcflow.runtime.pipeline import Pipeline
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.demo import _target
from cdcflow_testkit.workload import compare_with_mirror

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

FMT = "debezium-json"


def test_a_truncated_log_in_one_mirror_stops_that_table_and_the_others_apply(
    spark, broker, tmp_path
):
    """The probe of issue 8: a truncated last commit file in one mirror's ``_delta_log``
    stopped the whole source with ``Kernel error: Json error``, naming no table."""
    s = Scenario(broker, FMT, seed=21)
    s.produce(300)
    config = pipeline_config(tmp_path, broker, FMT, s.topic, s.options, batch=10_000)
    Pipeline(config, spark=spark).run(once=True)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    targets = {spec.name: _target(FMT, s.workload, spec, s.options) for spec in s.workload.tables}
    damaged_name, damaged = sorted(targets.items())[0]
    truncate_last_commit(wh.table_path(damaged))

    s.produce(300)
    summary = Pipeline(config, spark=spark).run(once=True)  # no exception: the stream goes on

    for spec in s.workload.tables:
        if spec.name == damaged_name:
            continue
        problems = compare_with_mirror(
            s.workload.expected_rows(spec.name), wh.read(targets[spec.name]), spec.key_columns
        )
        assert problems == [], f"{targets[spec.name]}: {problems[:5]}"
    stops = [
        r
        for r in wh.read("schema_changes", system=True).to_pylist()
        if r["change"] == "stop" and r["target_table"] == damaged
    ]
    assert len(stops) == 1
    message = stops[0]["message"]
    assert wh.table_path(damaged) in message and "Truncated record" in message
    assert f"cdcflow resume --warehouse {wh.root} {damaged}" in message
    dead = wh.read("dead_letters", system=True).to_pylist()
    fault = [d for d in dead if d["target_table"] == damaged]
    assert fault and {d["code"] for d in fault} <= {Code.TABLE_FAULT, Code.TABLE_STOPPED}
    assert all(d["offset"] is not None and d["raw_value"] for d in fault)
    reported = sum(r.dead_letters[Code.TABLE_FAULT] for r in summary.reports[FMT])
    assert reported >= 1
    check_accounting(wh, s.produced)
    check_changelog_once(wh)


def _run_cli(config_path: pathlib.Path, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    src = str(pathlib.Path(__file__).resolve().parents[2] / "src")
    return subprocess.run(
        [sys.executable, "-m", "cdcflow.cli", "run", "--once", str(config_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
        cwd=cwd,
        timeout=300,
    )


def test_a_full_disk_exits_74_with_one_line_and_the_next_run_loses_nothing(spark, broker, tmp_path):
    """The probe of issue 8: disk full read "Failed to parse parquet ... No space left on
    device" inside a long traceback. The run that meets the full disk is ``cdcflow run
    --once`` as a user runs it; the one before it (which fills the warehouse) and the one
    after it (which must lose nothing) run in this process on the shared session."""
    from cdcflow.cli import EXIT_STORAGE_ERROR

    s = Scenario(broker, FMT, seed=22)
    s.produce(200)
    with tmpfs(tmp_path / "volume", "16m") as volume:
        config = tmp_path / "pipeline.yaml"
        config.write_text(
            "pipeline_id: full\n"
            f"warehouse: {volume / 'wh'}\n"
            f"checkpoint: {tmp_path / 'ck'}\n"
            "target_template: '{format}.{database}.{schema}.{table}'\n"
            f"kafka: {{bootstrap_servers: '{broker.bootstrap_servers}'}}\n"
            f"sources: [{{format: {FMT}, topics: ['{s.topic}'], options: {s.options!r}}}]\n"
        )
        Pipeline(load_config(config), spark=spark).run(once=True)
        s.produce(200)
        filler = fill(volume)
        full = _run_cli(config, tmp_path)
        assert full.returncode == EXIT_STORAGE_ERROR == 74, full.stderr
        lines = [ln for ln in full.stderr.splitlines() if ln.startswith("cdcflow: ")]
        assert len(lines) == 1, full.stderr
        assert lines[0].startswith("cdcflow: [STORAGE_ERROR] ")
        assert "No space left on device" in lines[0] and str(volume / "wh") in lines[0]
        assert "Traceback" not in full.stderr, full.stderr
        assert "panicked" not in full.stderr, "no Rust panic text (issue 19)"

        filler.unlink()
        Pipeline(load_config(config), spark=spark).run(once=True)  # the next run
        wh = DeltaWarehouse(str(volume / "wh"))
        s.check_mirrors(wh)
        check_accounting(wh, s.produced)
        check_changelog_once(wh)

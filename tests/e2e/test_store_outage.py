"""A warehouse store that fails beyond delta-rs's retries, as a user runs cdcflow:
``cdcflow run`` on moto's S3 server behind the fault proxy, whose answers to the mirrors'
commits are ``503 SlowDown`` for a while. The run starts its query again from the
checkpoint (``apply.store_outage_budget_s``, :mod:`cdcflow.runtime.store_outage`), says so
on its console, and ends with every mirror equal to its source, every offset applied once
and no data file or transaction in a log twice. A store that keeps failing past the
budget stops the run with one line and exit 74.
"""

from __future__ import annotations

import pytest
import yaml
from tests.e2e.helpers import (
    Scenario,
    check_accounting,
    check_changelog_once,
    config_dict,
    delta_log_problems,
    run_cli,
)

from cdcflow.runtime.store_outage import BUDGET_KEY
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.services.store_proxy import Fault

pytestmark = [pytest.mark.kafka, pytest.mark.services, pytest.mark.slow]

FMT = "debezium-json"
#: a mirror's commit (a ``_delta_log`` JSON of a table the template names, not ``_cdcflow``)
MIRROR_COMMIT = rf"/warehouse/{FMT}\.[^/]+/_delta_log/\d+\.json"
#: delta-rs gives a request up after one retry (its default: 10 over 180 s)
RETRIES = {"max_retries": "1", "retry_timeout": "5s"}


def _config(tmp_path, broker, s, moto_s3, store_proxy, budget_s):
    uri = moto_s3.warehouse_uri()
    options = {**moto_s3.storage_options(), **RETRIES, "aws_endpoint_url": store_proxy.endpoint_url}
    data = config_dict(tmp_path, broker, FMT, s.topic, s.options, batch=150)
    data.update(warehouse=uri, storage=options, apply={BUDGET_KEY.split(".")[1]: budget_s})
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, uri, {**options, "aws_endpoint_url": moto_s3.endpoint_url}


def test_a_store_outage_past_the_retries_restarts_the_query_and_loses_nothing(
    broker, tmp_path, moto_s3, store_proxy
):
    s = Scenario(broker, FMT, seed=69)
    s.produce(300)
    path, uri, direct = _config(tmp_path, broker, s, moto_s3, store_proxy, budget_s=120)
    # six refusals: more than one commit's retries, so the query fails and starts again
    store_proxy.inject(Fault("slow_down", "PUT", MIRROR_COMMIT, times=6))

    run = run_cli("run", str(path), "--once")

    assert run.returncode == 0, run.stderr[-3000:]
    (fault,) = store_proxy.faults
    assert fault.spent, fault
    console = run.stdout + run.stderr
    restarts = [ln for ln in console.splitlines() if "restarting the query in" in ln]
    assert restarts, console[-3000:]
    assert f"warehouse {uri} unavailable: " in restarts[0] and "503" in restarts[0]
    assert "(restart 1, " in restarts[0] and BUDGET_KEY in restarts[0]
    assert f"warehouse {uri} answers again after" in console
    wh = DeltaWarehouse(uri, storage_options=direct)
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)
    assert delta_log_problems(uri, direct) == []


def test_a_store_that_keeps_failing_stops_the_run_after_the_budget_in_one_line(
    broker, tmp_path, moto_s3, store_proxy
):
    s = Scenario(broker, FMT, seed=70)
    s.produce(100)
    path, uri, direct = _config(tmp_path, broker, s, moto_s3, store_proxy, budget_s=4)
    store_proxy.inject(Fault("slow_down", "PUT", MIRROR_COMMIT, times=None))

    run = run_cli("run", str(path), "--once")

    assert run.returncode == 74, run.stderr[-3000:]
    error = [ln for ln in run.stderr.splitlines() if "Fix:" in ln]
    assert len(error) == 1, run.stderr[-3000:]
    assert f"{BUDGET_KEY}=4; raise it to wait longer" in error[0]
    assert "restarting the query in" in run.stdout + run.stderr
    store_proxy.clear()  # the store recovers: the next run applies everything once
    again = run_cli("run", str(path), "--once")
    assert again.returncode == 0, again.stderr[-3000:]
    wh = DeltaWarehouse(uri, storage_options=direct)
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    assert delta_log_problems(uri, direct) == []

"""A warehouse on S3 (moto's server, a real S3 API over HTTP): the run, its restart under
the lease, and the commands that read, maintain and delete the warehouse, as a user runs
them. Every mirror is compared with its source model and every offset accounted for once.
"""

from __future__ import annotations

import json
import subprocess

import pyarrow.fs as pafs
import pytest
import yaml
from deltalake.fs import DeltaStorageHandler
from tests.e2e.helpers import (
    Scenario,
    check_accounting,
    check_changelog_once,
    config_dict,
    run_cli,
)

from cdcflow.commands.maintain import maintain, warehouse_tables
from cdcflow.config import parse_config
from cdcflow.errors import LeaseHeld
from cdcflow.runtime.runner import run
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.storage import Storage
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.encoders import Message

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=120, env=env)


def _assert_nowhere(secret: str, checkpoint, store: Storage) -> None:
    """``secret`` is in no file of the checkpoint and no object of the warehouse."""
    for path in checkpoint.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    fs = pafs.PyFileSystem(DeltaStorageHandler(store.root, dict(store.options)))
    objects = [i for i in fs.get_file_info(pafs.FileSelector("", recursive=True)) if i.is_file]
    assert objects
    for info in objects:
        with fs.open_input_stream(info.path) as f:
            assert secret.encode() not in f.read(), info.path


def test_a_warehouse_on_s3_mirrors_its_source_through_a_restart_and_the_commands_see_it(
    spark, broker, tmp_path, s3_store
):
    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=34)
    s.produce(300, extra=[Message(key=b"bad", value=b"{not json")])  # one dead letter
    uri, options = s3_store.warehouse_uri(), s3_store.storage_options()
    secret = options["aws_secret_access_key"]  # random per server: never to be shown
    data = config_dict(tmp_path, broker, fmt, s.topic, s.options, batch=120)
    data.update(warehouse=uri, storage=options)
    assert run(parse_config(data), once=True, spark=spark).totals()["batches"] >= 2
    s.produce(200)
    data["sources"][0]["options"] = s.options
    config = parse_config(data)
    run(config, once=True, spark=spark)

    wh = DeltaWarehouse(uri, storage_options=options)
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)
    _assert_nowhere(secret, tmp_path / "ck", Storage(uri, options))
    mirrors = wh.mirrors()
    assert len(mirrors) == len(s.workload.tables) >= 2
    assert not (tmp_path / "wh").exists()  # nothing was written to local disk instead

    # the lease lives on the store: a second holder is refused while the first holds it
    holder = PipelineLease(uri, config.pipeline_id, storage_options=options, renew_every_s=0)
    with holder, pytest.raises(LeaseHeld):
        run(config, once=True, spark=spark)

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({**data, "checkpoint": str(tmp_path / "ck")}))
    from_config = _cli("status", str(path), "--no-brokers", "--json")
    assert from_config.returncode == 0, from_config.stderr
    assert sorted(t["name"] for t in json.loads(from_config.stdout)["tables"]) == mirrors
    # --warehouse URI: the credentials from the provider's default chain (AWS_* variables)
    env = {
        "AWS_ENDPOINT_URL": s3_store.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3_store.access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3_store.secret_access_key,
        "AWS_REGION": s3_store.region,
        "AWS_ALLOW_HTTP": "true",
    }
    shown = _cli("status", "--warehouse", uri, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert sorted(t["name"] for t in found["tables"]) == mirrors
    assert "pipeline e2e: no run holds its lease" in found["lease"]
    drawn = _cli("report", str(path), "-o", str(tmp_path / "report.html"))
    assert drawn.returncode == 0, drawn.stderr
    for out in (from_config, drawn):
        assert secret not in out.stdout + out.stderr
    assert f"{len(mirrors)} tables" in drawn.stdout

    letters = _cli("dead-letters", "list", str(path), "--json")
    assert letters.returncode == 0, letters.stderr
    assert [(r["code"], r["count"]) for r in json.loads(letters.stdout)] == [("BAD_JSON", 1)]
    replayed = _cli("dead-letters", "replay", str(path), "--yes")  # under the lease, on the store
    assert replayed.returncode == 0, replayed.stderr
    assert "1 dead letters -> 0 events; 1 dead letter (" in replayed.stdout  # failed again
    resumed = _cli("resume", "--warehouse", uri, mirrors[0], env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{mirrors[0]}: not stopped" in resumed.stdout

    tables = warehouse_tables(wh)
    assert {f"{uri}/{m}" for m in mirrors} <= set(tables)
    assert f"{uri}/_cdcflow/changelog" in tables and f"{uri}/_cdcflow/batches" in tables
    assert not any("/leases" in t for t in tables)
    maintain(config)  # under the lease, on the store
    s.check_mirrors(DeltaWarehouse(uri, storage_options=options))

    assert Storage(uri, options).exists()
    reset = _cli("reset", str(path), "--warehouse", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert f"delete warehouse {uri}" in reset.stdout
    assert not Storage(uri, options).exists()

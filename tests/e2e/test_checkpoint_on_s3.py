"""Spark's checkpoint on S3 (moto's server), as a user runs cdcflow: ``cdcflow run`` starts
its own Spark with Hadoop's S3A connector, writes the checkpoint and the warehouse to the
store, and a second run resumes the checkpoint where the first stopped. ``reset`` deletes
it from the store. Every mirror is compared with its source model and every offset
accounted for once.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml
from tests.e2e.helpers import CDCFLOW, Scenario, check_accounting, cli_env, config_dict

from cdcflow.runtime.checkpoint import QUERY_FOLDER, Checkpoint
from cdcflow.sinks.warehouse import DeltaWarehouse

pytestmark = [pytest.mark.kafka, pytest.mark.services, pytest.mark.slow]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CDCFLOW, *args], capture_output=True, text=True, timeout=600, env=cli_env()
    )


def test_a_checkpoint_on_s3_is_resumed_by_the_next_run_and_reset(broker, tmp_path, moto_s3):
    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=66)
    s.produce(300)
    uri, options = moto_s3.warehouse_uri(), moto_s3.storage_options()
    checkpoint_uri = moto_s3.warehouse_uri("checkpoint")
    data = config_dict(tmp_path, broker, fmt, s.topic, s.options, batch=150)
    data.update(warehouse=uri, checkpoint=checkpoint_uri, storage=options)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))

    first = _cli("run", str(path), "--once")
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = Checkpoint(f"{checkpoint_uri}/{QUERY_FOLDER}", options)
    finished = checkpoint.committed_batches()
    assert len(finished) >= 2 and finished == list(range(len(finished)))
    assert set(checkpoint.fingerprints() or {}) == {fmt}

    s.produce(200)
    data["sources"][0]["options"] = s.options
    path.write_text(yaml.safe_dump(data))
    second = _cli("run", str(path), "--once")
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = Checkpoint(f"{checkpoint_uri}/{QUERY_FOLDER}", options).committed_batches()
    assert resumed[: len(finished)] == finished and len(resumed) > len(finished)  # not anew
    assert "starts over" not in second.stderr

    wh = DeltaWarehouse(uri, storage_options=options)
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "wh").exists()
    secret = options["aws_secret_access_key"]
    store = checkpoint.store
    for name in ("cdcflow.json", "metadata", f"offsets/{resumed[-1]}"):
        assert secret.encode() not in store.read_bytes(*name.split("/")), name
    for out in (first, second):
        assert secret not in out.stdout + out.stderr

    reset = _cli("reset", str(path), "--yes")
    assert reset.returncode == 0, reset.stderr
    assert f"delete checkpoint {checkpoint_uri}/{QUERY_FOLDER}" in reset.stdout
    assert not checkpoint.exists()
    s.check_mirrors(DeltaWarehouse(uri, storage_options=options))  # the warehouse stays

"""A Kafka password given through ``${env:...}`` and ``${file:...}`` never appears in
anything a run leaves behind: its console (``-v``), the checkpoint, the warehouse's
tables and logs, or any file the run writes in its working folder (issue 19, item 7).
The real embedded broker, real local Spark, real Delta tables, ``cdcflow`` as a user
runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from tests.e2e.helpers import (
    CDCFLOW,
    Scenario,
    check_accounting,
    check_changelog_once,
    cli_env,
    config_dict,
)

from cdcflow.sinks.warehouse import DeltaWarehouse

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

PASSWORD = "Zq9-hunter2-s3cret-in-env"
REGISTRY_SECRET = "Zq9-registry-user:s3cret-in-file"


def _run_once(config: Path, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    """``cdcflow -v run --once CONFIG`` as a user runs it, with the password in the
    environment."""
    return subprocess.run(
        [*CDCFLOW, "-v", "run", "--once"] + [str(config)],
        env=cli_env(KPASS=PASSWORD),
        cwd=cwd,
        capture_output=True,
        timeout=timeout,
    )


def test_a_password_never_appears_in_any_output_log_checkpoint_or_table(broker, tmp_path):
    s = Scenario(broker, "debezium-json", seed=41)
    s.produce(60)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "registry.secret").write_text(REGISTRY_SECRET + "\n")
    raw = config_dict(tmp_path, broker, "debezium-json", s.topic)
    # librdkafka takes SASL credentials even on a PLAINTEXT listener (unused there), so
    # the run is real and the password travels wherever the Kafka settings go
    raw["kafka"]["options"] = {"sasl.username": "alice", "sasl.password": "${env:KPASS}"}
    raw["kafka"]["outage_budget_s"] = 30
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(raw))
    run = _run_once(config, run_dir, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output.decode(errors="replace")[-3000:]
    wh = DeltaWarehouse(raw["warehouse"])
    s.check_mirrors(wh)  # the run applied the records, each once
    check_accounting(wh, s.produced)
    check_changelog_once(wh)

    # a bad configuration holding the password is refused in one line, without it
    bad = dict(raw, kafka={**raw["kafka"], "starting_offsets": "earliset"})
    bad["kafka"]["options"] = {
        "sasl.password": "${env:KPASS}",
        "basic.auth.user.info": "${file:registry.secret}",
    }
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text(yaml.safe_dump(bad))
    refused = _run_once(bad_config, run_dir, timeout=300)
    assert refused.returncode == 2, refused.stderr.decode(errors="replace")
    assert b"kafka.starting_offsets" in refused.stderr

    scanned = 0
    leaks = []
    for secret in (PASSWORD, REGISTRY_SECRET.split(":")[1]):
        needle = secret.encode()
        if needle in output or needle in refused.stdout + refused.stderr:
            leaks.append(f"console: {secret}")
    for root in (Path(raw["warehouse"]), Path(raw["checkpoint"]), run_dir):
        for path in root.rglob("*"):
            if path.is_file():
                scanned += 1
                data = path.read_bytes()
                leaks += [f"{path}" for n in (PASSWORD, "s3cret-in-file") if n.encode() in data]
    assert scanned > 20  # the warehouse's tables, the checkpoint and the staging were read
    assert not leaks, leaks

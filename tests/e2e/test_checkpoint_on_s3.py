"""Spark's checkpoint on S3 (moto's server), as a user runs cdcflow: ``cdcflow run`` starts
its own Spark with Hadoop's S3A connector, writes the checkpoint and the warehouse to the
store, and a second run resumes the checkpoint where the first stopped. ``reset`` deletes
it from the store. Every mirror is compared with its source model and every offset
accounted for once.
"""

from __future__ import annotations

import pytest
import yaml
from tests.e2e.helpers import Scenario, check_accounting, config_dict, run_cli

from cdcflow.runtime.checkpoint import QUERY_FOLDER, Checkpoint
from cdcflow.sinks.warehouse import DeltaWarehouse

pytestmark = [pytest.mark.kafka, pytest.mark.services, pytest.mark.slow]


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

    first = run_cli("run", str(path), "--once")
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = Checkpoint(f"{checkpoint_uri}/{QUERY_FOLDER}", options)
    finished = checkpoint.committed_batches()
    assert len(finished) >= 2 and finished == list(range(len(finished)))
    assert set(checkpoint.fingerprints() or {}) == {fmt}

    s.produce(200)
    data["sources"][0]["options"] = s.options
    path.write_text(yaml.safe_dump(data))
    second = run_cli("run", str(path), "--once")
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

    reset = run_cli("reset", str(path), "--yes")
    assert reset.returncode == 0, reset.stderr
    assert f"delete checkpoint {checkpoint_uri}/{QUERY_FOLDER}" in reset.stdout
    assert not checkpoint.exists()
    s.check_mirrors(DeltaWarehouse(uri, storage_options=options))  # the warehouse stays


def test_sigkills_mid_batch_on_s3_lose_nothing_and_repeat_nothing(broker, tmp_path, moto_s3):
    """cdcflow run SIGKILLed twice mid-batch, the warehouse and the checkpoint both on S3:
    every mirror equals the source, every offset is applied once, the changelog holds every
    event once, and the dead letters are exactly the malformed messages."""
    import random
    import uuid

    from cdcflow_testkit.encoders import encoder_for
    from cdcflow_testkit.faults import (
        MALFORMED,
        inject_faults,
        run_with_kills,
        verify,
        workload_stream,
        write_config,
    )
    from cdcflow_testkit.workload import Workload, tables_for

    seed, kills = 34, 2
    workload = Workload(tables_for(encoder_for("debezium-json").exact_types), seed=seed)
    stream = workload_stream(workload, 600, truncate_every=270)
    faulty = inject_faults(
        stream, f"s3faults.{uuid.uuid4().hex[:8]}", 2, random.Random(seed), replays=2
    )
    broker.create_topic(faulty.topic, partitions=2)
    uri, options = moto_s3.warehouse_uri(), moto_s3.storage_options()
    config = write_config(
        tmp_path / "pipeline.yaml",
        broker.bootstrap_servers,
        faulty.topic,
        warehouse=uri,
        checkpoint=moto_s3.warehouse_uri("checkpoint"),
        max_offsets_per_trigger=100,
        storage=options,
    )
    run = run_with_kills(
        config,
        kills=kills,
        rng=random.Random(seed),
        before_start=lambda i: faulty.produce(broker, i, kills + 1),
        early_kill_probability=0.0,
        apply_kill_probability=1.0,
        min_commits=1,
        max_commits=2,
        log_dir=tmp_path / "logs",
    )
    wh = DeltaWarehouse(uri, pipeline_id="faults.debezium-json", storage_options=options)
    problems, counts = verify(wh, faulty, broker.end_offsets(faulty.topic), run)
    print(counts.summary(), *run.kills, sep="\n")
    assert problems == [], "\n".join(problems[:30])
    assert len(run.kills) == kills and run.drain_exit_code == 0
    assert all(k.in_flight is not None for k in run.kills), run.kills  # killed mid-batch
    assert counts.records == faulty.records
    assert counts.dead_letters == faulty.count(MALFORMED) > 0
    assert not (tmp_path / "wh").exists()

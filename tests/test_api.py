"""The Python API (issue 19, item 6): ``cdcflow.Pipeline(config, spark=spark)`` on a
session the user built, with a virtual environment that is not activated (Spark's
workers start ``python3`` from the PATH, which has no cdcflow), and
``cdcflow.read_changes`` as a streaming DataFrame. A real user session in a process of
its own, the real embedded broker, real Delta tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from tests.e2e.helpers import Scenario, config_dict

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

USER_JOB = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    import cdcflow

    # the user's own session: no PYSPARK_PYTHON, so its workers would run python3 from PATH
    spark = (SparkSession.builder.master("local[2]").appName("user-notebook")
             .config("spark.ui.enabled", "false").getOrCreate())
    config = sys.argv[1]
    lines = []
    pipeline = cdcflow.Pipeline(config, spark=spark, progress=lines.append)
    summary = pipeline.run(once=True)
    status = pipeline.status()

    seen = []
    changes = cdcflow.read_changes(spark, config)
    query = (changes.writeStream.trigger(availableNow=True)
             .option("checkpointLocation", sys.argv[2])
             .foreachBatch(lambda df, _: seen.extend(r.asDict() for r in df.select("kind", "op").collect()))
             .start())
    query.awaitTermination()
    print(json.dumps({
        "python_exec": spark.sparkContext.pythonExec,
        "totals": summary.totals(),
        "lines": lines,
        "lease": status.lease,
        "sources": [s.name for s in status.sources],
        "changes": len(seen),
        "kinds": sorted({r["kind"] for r in seen}),
    }))
    spark.stop()
    """
)


def test_a_pipeline_on_the_users_session_without_the_environment_on_path(broker, tmp_path):
    s = Scenario(broker, "debezium-json", seed=51)
    s.produce(80)
    raw = config_dict(tmp_path, broker, "debezium-json", s.topic, pipeline_id="api")
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(raw))
    job = tmp_path / "job.py"
    job.write_text(USER_JOB)
    # the job's interpreter has cdcflow installed (this virtual environment's); the PATH
    # has not: python3 there is the system's
    skip = ("PYSPARK_", "VIRTUAL_ENV", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env["PATH"] = "/usr/bin:/bin"
    assert subprocess.run(
        ["python3", "-c", "import cdcflow"], env=env, capture_output=True
    ).returncode
    done = subprocess.run(
        [sys.executable, str(job), str(config), str(tmp_path / "user-ck")],
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["python_exec"] == sys.executable  # pointed at the interpreter with cdcflow
    assert result["totals"]["records"] == s.produced
    assert result["totals"]["events"] == s.produced
    assert any(line.startswith("batch 0 debezium-json: ") for line in result["lines"])
    assert result["lease"] == "pipeline api: no run holds its lease"  # taken, then released
    assert result["sources"] == ["api.debezium-json"]
    assert result["changes"] == s.produced and result["kinds"] == ["event"]
    from cdcflow.sinks.warehouse import DeltaWarehouse

    s.check_mirrors(DeltaWarehouse(raw["warehouse"]))

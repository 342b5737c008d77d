"""The cluster path: ``cdcflow run --once`` (the real command, in a process of its own)
on a Spark standalone cluster of a master and two workers on 127.0.0.1, reading Apache
Kafka with cdcflow's Python source or with Spark's own Kafka source
(``spark-sql-kafka-0-10``, its jars given with ``--jars``: the pipeline picks it when it
is on the class path). On a cluster the decode tasks run in the workers' executors and
their events travel back through Spark (no staging folder is shared with the driver,
decision 12). With ``sink: delta-rs`` the mirrors' merges run on the driver; with
``sink: delta-spark`` they are Delta Lake's ``MERGE INTO`` on the executors (the commits
say which engine wrote them). Every mirror must equal the source.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.e2e.helpers import Scenario, check_accounting

from cdcflow.runtime.spark import SUBMIT_MAIN, delta_submit_args
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.services.spark_cluster import StandaloneCluster, spark_kafka_jars

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(master: str | None) -> dict[str, str]:
    """The environment of a cdcflow process run against the cluster: this checkout's
    source, this interpreter on every node, and ``CDCFLOW_SPARK_MASTER`` (none: unset)."""
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("CDCFLOW_SPARK_MASTER", None)
    if master:
        env["CDCFLOW_SPARK_MASTER"] = master
    return env


@pytest.fixture(scope="module")
def cluster():
    with StandaloneCluster(workers=2, cores=1) as c:
        yield c


def merge_engines(table_path: Path, arrow_merges: bool = False) -> set[str]:
    """The ``engineInfo`` of the commits that merged into a Delta table (``MERGE``):
    ``delta-rs:...`` or ``Apache-Spark/... Delta-Lake/...``; with ``arrow_merges``, also
    the Arrow merge's commits of file actions (``WRITE`` commits of an apply, which carry
    its ``cdcflow.apply_id``: decision 44)."""
    engines = set()
    for commit in sorted((table_path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if not info:
                continue
            merged = info.get("operation") == "MERGE" or (
                arrow_merges and info.get("operation") == "WRITE" and "cdcflow.apply_id" in info
            )
            if merged:
                engines.add(str(info.get("engineInfo") or info.get("clientVersion")))
    return engines


@pytest.mark.parametrize(
    ("fmt", "source", "sink"),
    [
        ("debezium-json", "python", "delta-rs"),
        ("canal-json", "python", "delta-rs"),
        ("debezium-json", "spark-kafka", "delta-rs"),
        # spark-kafka with delta-spark: the spark-submit test below, as the README runs it
    ],
)
def test_a_run_on_a_standalone_cluster_mirrors_its_source(
    cluster, apache_kafka, tmp_path, fmt, source, sink
):
    s = Scenario(apache_kafka, fmt, seed=17)
    s.produce(300)
    s.produce(200)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pipeline_id": f"cluster-{fmt}-{source}-{sink}",
                "sink": sink,
                "warehouse": str(tmp_path / "wh"),
                "checkpoint": str(tmp_path / "ck"),
                "trigger": "available_now",
                "target_template": "{format}.{database}.{schema}.{table}",
                "kafka": {
                    "bootstrap_servers": apache_kafka.bootstrap_servers,
                    "max_offsets_per_trigger": 250,
                },
                "sources": [{"format": fmt, "topics": [s.topic], "options": s.options}],
            }
        )
    )
    env = _env(cluster.master_url)
    if source == "spark-kafka":
        env["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(spark_kafka_jars())} pyspark-shell"
    run = subprocess.run(
        [sys.executable, "-m", "cdcflow.cli", "run", "--once", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    # the decode ran in the workers' executors: the master launched them for this run
    master_log = (Path(cluster.log_dir) / "master.log").read_text()
    assert f"Registering app cdcflow-cluster-{fmt}-{source}-{sink}" in master_log
    assert master_log.count("Launching executor") >= 2
    # which source read Kafka: Spark's logs its Java consumer's configuration
    java_consumer = "ConsumerConfig values" in cluster.last_app_logs()
    assert java_consumer == (source == "spark-kafka")
    assert not (tmp_path / "ck" / "staging").exists()
    mirrors = [p for p in (tmp_path / "wh").iterdir() if (p / "_delta_log").is_dir()]
    engines = set().union(
        *(
            merge_engines(p, arrow_merges=sink == "delta-rs")
            for p in mirrors
            if not p.name.startswith("_")
        )
    )
    assert engines, "no mirror was merged"
    if sink == "delta-spark":
        assert all("Delta-Lake/4.4.0" in e for e in engines), engines
    else:
        assert all(e.startswith("delta-rs") for e in engines), engines


@pytest.mark.parametrize("sink", ["delta-rs", "delta-spark"])
def test_the_demo_runs_on_the_cluster(cluster, tmp_path, sink):
    """``cdcflow-demo`` with the cluster as master, with each sink: every table equals its
    source, the dead letters are the expected ones. Every format with ``delta-rs``; with
    ``delta-spark`` (a Spark MERGE per table, about 2.5 s each here) one format, since the
    sink's path does not depend on the format (Debezium JSON on this sink and cluster is
    the spark-submit test's)."""
    env = _env(cluster.master_url)
    formats = [] if sink == "delta-rs" else ["qlik-json"]
    master_log = Path(cluster.log_dir) / "master.log"
    apps_before = set(cluster.app_ids())
    registered_before = master_log.read_text().count("Registering app ")
    run = subprocess.run(
        [
            *(sys.executable, "-m", "cdcflow_testkit.demo"),
            *("--warehouse", str(tmp_path / "wh"), "--sink", sink),
            *("--changes", "500"),  # inserts, updates and deletes of every table (make demo: 2,000)
            *(arg for fmt in formats for arg in ("--format", fmt)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "RESULT: every table equals its source" in run.stdout
    assert "-> verified" in run.stdout
    # this run's application, not an earlier test's: one more registered, with executors
    assert master_log.read_text().count("Registering app ") == registered_before + 1
    new_apps = sorted(set(cluster.app_ids()) - apps_before)
    assert len(new_apps) == 1, f"the demo ran {new_apps} on the cluster"
    assert cluster.app_logs(new_apps[0]), "no executor of the demo's application ran"


def test_spark_submit_runs_cdcflow_on_the_cluster_with_the_delta_spark_sink(
    cluster, apache_kafka, tmp_path
):
    """What the README tells a user to run on their own cluster: ``spark-submit`` with the
    cluster's master, Delta Lake's jars and settings (``python -m cdcflow.runtime.spark``), Spark's
    Kafka connector with ``--jars``, and cdcflow's command line as the application. Its
    master, packages and settings stand (cdcflow does not replace them); Spark's Kafka
    source reads the topic in several micro-batches, the mirrors are merged by Delta Lake
    on the executors and equal the source (the cluster path of spark-kafka with
    delta-spark)."""
    import pyspark

    s = Scenario(apache_kafka, "debezium-json", seed=29)
    s.produce(300)
    s.produce(200)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pipeline_id": "cluster-spark-submit",
                "warehouse": str(tmp_path / "wh"),
                "checkpoint": str(tmp_path / "ck"),
                "sink": "delta-spark",
                "target_template": "{format}.{database}.{schema}.{table}",
                "kafka": {
                    "bootstrap_servers": apache_kafka.bootstrap_servers,
                    "max_offsets_per_trigger": 250,  # several micro-batches
                },
                "sources": [{"format": "debezium-json", "topics": [s.topic], "options": s.options}],
            }
        )
    )
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = _env(None)  # spark-submit's --master decides
    run = subprocess.run(
        [
            str(submit),
            *("--master", cluster.master_url),
            *("--jars", ",".join(spark_kafka_jars())),
            *delta_submit_args(),  # python -m cdcflow.runtime.spark prints them, then SUBMIT_MAIN
            str(SUBMIT_MAIN),
            *("run", "--once", str(config)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    master_log = (Path(cluster.log_dir) / "master.log").read_text()
    assert "Registering app cdcflow-cluster-spark-submit" in master_log
    assert master_log.count("Launching executor") >= 2
    # Spark's own Kafka source read the topic (it logs its Java consumer's configuration)
    assert "ConsumerConfig values" in cluster.last_app_logs()
    assert not (tmp_path / "ck" / "staging").exists()
    engines = set().union(*(merge_engines(Path(wh.table_path(t))) for t in wh.mirrors()))
    assert engines and all("Delta-Lake/4.4.0" in e for e in engines), engines

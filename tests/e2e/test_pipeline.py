"""End to end: the real embedded broker, real local Spark, real Delta tables read back.

Each test produces a workload (the generator keeps the source's true final state),
runs the pipeline with ``Trigger.AvailableNow`` and compares every Delta mirror with the
source, then checks that every Kafka offset is accounted for exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from tests.brokers import DEFAULT_BROKER, every_broker
from tests.e2e.helpers import Scenario, check_accounting, check_changelog_once, pipeline_config

from cdcflow.formats import embedded_formats
from cdcflow.runtime.pipeline import Pipeline
from cdcflow.sinks.mirror import Mirrors
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.encoders import Message

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


@pytest.mark.parametrize(
    ("broker", "fmt"),
    # decoding does not depend on the broker: every format on the default one, and the
    # default format on Apache Kafka too
    [(DEFAULT_BROKER, fmt) for fmt in embedded_formats()] + [("apache-kafka", "debezium-json")],
    indirect=["broker"],
)
def test_every_format_mirrors_its_source(spark, broker, tmp_path, fmt):
    s = Scenario(broker, fmt)
    s.produce(300)
    Pipeline(pipeline_config(tmp_path, broker, fmt, s.topic, s.options), spark=spark).run(once=True)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)


@pytest.mark.parametrize(
    ("broker", "fmt"),
    [(DEFAULT_BROKER, "debezium-json"), (DEFAULT_BROKER, "dataworks-json")]
    + [("apache-kafka", "debezium-json")],
    indirect=["broker"],
)
def test_restart_from_checkpoint_has_no_duplicate_and_no_loss(spark, broker, tmp_path, fmt):
    s = Scenario(broker, fmt, seed=5)
    s.produce(400)
    first = Pipeline(
        pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=150), spark=spark
    ).run(once=True)
    assert first.totals()["batches"] >= 2  # several micro-batches, then stop
    s.produce(400)
    Pipeline(
        pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=150), spark=spark
    ).run(once=True)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)


class Crash(RuntimeError):
    pass


def _run_crashing_in_batch_1(spark, config, monkeypatch) -> None:
    """Run the pipeline once; it crashes after the fifth mirror commit, the second mirror
    of apply 1 (its changelog and first mirrors committed, the rest not)."""
    real = Mirrors.apply
    calls = {"n": 0}

    def crashing(self, target, net, types, key_columns, commit, **options):
        result = real(self, target, net, types, key_columns, commit, **options)
        calls["n"] += 1
        if commit.version == 1 and calls["n"] == 5:
            raise Crash("killed mid-batch")
        return result

    monkeypatch.setattr(Mirrors, "apply", crashing)
    with pytest.raises(Exception, match="killed mid-batch"):
        Pipeline(config, spark=spark).run(once=True)
    monkeypatch.setattr(Mirrors, "apply", real)


def test_a_batch_replayed_after_a_crash_changes_nothing(spark, broker, tmp_path, monkeypatch):
    """Crash after the changelog and one mirror were committed, before the rest; restart."""
    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=3)
    s.produce(600)
    config = pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=250)

    _run_crashing_in_batch_1(spark, config, monkeypatch)

    summary = Pipeline(config, spark=spark).run(once=True)
    replayed = [m for r in summary.reports[fmt] for m in r.mirrors if m.skipped_replay]
    assert replayed, "the restarted batch must find its earlier commits and skip them"
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    changelog = wh.read("changelog", system=True)
    coords = list(
        zip(
            changelog["partition"].to_pylist(),
            changelog["offset"].to_pylist(),
            changelog["event_index"].to_pylist(),
            strict=True,
        )
    )
    assert len(coords) == len(set(coords))


def test_malformed_records_and_unknown_ops_are_dead_letters_and_the_stream_goes_on(
    spark, broker, tmp_path
):
    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=9)
    bad = [
        Message(
            value=b'{"before": null, "after": {"id": 1}, "op": "x", "source": {"db": "shop", '
            b'"schema": "public", "table": "customers", "lsn": 5}}',
            key=b'{"id": 1}',
        ),
        Message(value=b"\x00\x01 not json at all", key=b"k2"),
        Message(
            value=b'{"before": null, "after": {"id": 1}, "op": "c", "source": {"db": "shop", '
            b'"schema": "public", "table": "nokey", "lsn": 5}}',
            key=None,
        ),
    ]
    s.produce(200, extra=bad)
    s.produce(100)  # the stream goes on after the bad records
    Pipeline(pipeline_config(tmp_path, broker, fmt, s.topic, s.options), spark=spark).run(once=True)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    dead = wh.read("dead_letters", system=True).to_pylist()
    by_value = {d["raw_value"]: d for d in dead}
    assert {by_value[m.value]["code"] for m in bad} == {"UNKNOWN_OP", "BAD_JSON", "MISSING_KEY"}
    for m in bad:
        d = by_value[m.value]
        assert (
            d["topic"] == s.topic and d["offset"] >= 0 and d["message"] and d["stage"] == "decode"
        )
        assert d["raw_key"] == m.key
    batches = check_accounting(wh, s.produced)
    assert sum(b["dead_letters"] for b in batches) == 3


@every_broker  # records with a null value
def test_tombstones_are_skipped_on_purpose_and_counted(spark, broker, tmp_path):
    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=4)
    s.produce(
        50, extra=[Message(value=None, key=b'{"id": 1}'), Message(value=None, key=b'{"id": 2}')]
    )
    Pipeline(pipeline_config(tmp_path, broker, fmt, s.topic, s.options), spark=spark).run(once=True)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    batches = check_accounting(wh, s.produced)
    assert sum(b["skipped"] for b in batches) == 2
    assert DeltaTable(wh.system_path("changelog")).to_pyarrow_table().num_rows >= 50


def test_qlik_metadata_from_an_earlier_micro_batch_types_later_data(spark, broker, tmp_path):
    """Qlik sends a table's metadata (MD) once; data messages in later micro-batches (and
    other Spark tasks) must still find it: the decoder state is persisted and preloaded."""
    fmt = "qlik-json"
    s = Scenario(broker, fmt, seed=21)
    s.produce(120)
    summary = Pipeline(
        pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=10), spark=spark
    ).run(once=True)
    assert summary.totals()["batches"] >= 5
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    state = wh.read("decoder_state", system=True)
    assert state.num_rows >= len(s.workload.tables)  # one metadata item per table at least
    assert sorted(set(state["batch_id"].to_pylist()))[0] == 0
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    assert not (tmp_path / "wh" / "_cdcflow" / "dead_letters").exists()


@pytest.mark.parametrize(
    "engine, staging",
    [("python", True), ("python", False), ("python-mapinarrow", False)],
    ids=["fused-staged", "fused-in-band", "mapinarrow"],
)
def test_every_decode_path_gives_the_same_tables(spark, broker, tmp_path, engine, staging):
    """Staged Arrow files, events through Spark, and the mapInArrow path (used with Spark's
    JVM Kafka source) must give the same mirrors and accounting."""
    fmt = "dataworks-json"
    s = Scenario(broker, fmt, seed=17)
    s.produce(300)
    config = pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=200)
    Pipeline(config, spark=spark, kafka_engine=engine, staging=staging).run(once=True)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    staged = tmp_path / "ck" / fmt / "staging"
    assert not staged.exists() or not any(staged.iterdir()), "staged files are removed after commit"


@every_broker  # fetching at the offsets the warehouse gives
def test_a_deleted_checkpoint_loses_and_duplicates_nothing(spark, broker, tmp_path):
    """The probe of issue 8: with the warehouse kept, a rerun after `rm -rf checkpoint`
    restarted Spark's batch ids at 0 and skipped or re-applied records."""
    import shutil

    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=8)
    s.produce(400)  # inserts, updates and deletes
    config = pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=150)
    assert Pipeline(config, spark=spark).run(once=True).totals()["batches"] >= 2
    s.produce(400)
    shutil.rmtree(tmp_path / "ck")
    summary = Pipeline(config, spark=spark).run(once=True)
    applied = sum(r.records for r in summary.reports[fmt])
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)
    assert 0 < applied < s.produced  # it started at the warehouse's offsets, not at 0


def test_a_crash_then_a_deleted_checkpoint_finishes_the_interrupted_apply(
    spark, broker, tmp_path, monkeypatch
):
    """Crash mid-apply (some tables written), then the checkpoint is deleted: the restart
    re-reads the interrupted apply's exact ranges from Kafka and finishes it first."""
    import shutil

    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=9)
    s.produce(600)
    config = pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=250)
    _run_crashing_in_batch_1(spark, config, monkeypatch)
    shutil.rmtree(tmp_path / "ck")
    s.produce(200)
    summary = Pipeline(config, spark=spark).run(once=True)
    finished = summary.reports[fmt][0]
    assert finished.batch_id == 1 and finished.delivery_id is None  # re-read from Kafka
    assert any(m.skipped_replay for m in finished.mirrors)  # tables it had reached skip it
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)


def test_a_checkpoint_of_another_stream_is_refused(spark, broker, tmp_path):
    from cdcflow.errors import ConfigError

    fmt = "debezium-json"
    s = Scenario(broker, fmt, seed=2)
    s.produce(50)
    config = pipeline_config(tmp_path, broker, fmt, s.topic, s.options)
    Pipeline(config, spark=spark).run(once=True)
    other = Scenario(broker, fmt, seed=2)  # another topic, same checkpoint folder
    with pytest.raises(ConfigError, match=r"belongs to another stream: topics .*cdcflow reset"):
        Pipeline(pipeline_config(tmp_path, broker, fmt, other.topic), spark=spark).run(once=True)
    # the refused run wrote nothing: the warehouse holds the first run's records, once
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)
    # the warehouse deleted, the checkpoint kept: it would skip what was never applied
    import shutil

    shutil.rmtree(tmp_path / "wh")
    with pytest.raises(ConfigError, match="has applied nothing of source"):
        Pipeline(config, spark=spark).run(once=True)


@pytest.mark.parametrize("fmt", ["debezium-json", "canal-json"])
def test_the_delta_spark_sink_mirrors_the_source_through_restarts(spark, broker, tmp_path, fmt):
    """``sink: delta-spark``: the mirrors' merges are Delta Lake's Spark commands (their
    commits say so), in several micro-batches and across a restart, with the same mirrors,
    accounting and exactly-once changelog as the delta-rs sink. Three micro-batches (each
    a Spark MERGE per table, about 2.5 s here): two in the first run, one after it."""
    from tests.cluster.test_standalone_cluster import merge_engines

    s = Scenario(broker, fmt, seed=23)
    s.produce(300)
    config = pipeline_config(tmp_path, broker, fmt, s.topic, s.options, batch=150)
    config = config.model_copy(update={"sink": "delta-spark"})
    Pipeline(config, spark=spark).run(once=True)
    s.produce(150)  # after the first run: the restart resumes from its checkpoint
    Pipeline(config, spark=spark).run(once=True)
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    s.check_mirrors(wh)
    check_accounting(wh, s.produced)
    check_changelog_once(wh)
    engines = set().union(*(merge_engines(Path(wh.table_path(t))) for t in wh.mirrors()))
    assert engines and all("Delta-Lake/4.4.0" in e for e in engines), engines


def test_a_source_added_or_removed_starts_the_checkpoint_over_where_each_source_was(
    spark, broker, tmp_path
):
    """The pipeline's one query keeps every source in one checkpoint (decision 53). A
    checkpoint of cdcflow before 0.4 (a folder per source) is taken over; a source added,
    then one removed, starts the checkpoint over: each kept source at the warehouse's
    offsets (nothing applied twice), a new one from the start. Every mirror ends equal to
    its source, every changelog event is there once and every offset of both topics is
    accounted for once (:func:`check_accounting`)."""
    import json

    from tests.e2e.helpers import config_dict

    from cdcflow.config import parse_config
    from cdcflow.runtime.checkpoint import QUERY_FOLDER, Checkpoint

    a = Scenario(broker, "debezium-json", seed=3)
    a.produce(200)
    one = config_dict(tmp_path, broker, "debezium-json", a.topic, a.options)
    Pipeline(parse_config(one), spark=spark).run(once=True)
    ck = tmp_path / "ck"
    # as cdcflow before 0.4 left it: the source's own folder, its own fingerprint
    (ck / QUERY_FOLDER).rename(ck / "debezium-json")
    fingerprint = ck / "debezium-json" / "cdcflow.json"
    fingerprint.write_text(json.dumps(json.loads(fingerprint.read_text())["sources"][0]))

    def run(config, *more, new=()):
        before = {s: 0 if s in new else s.produced for s in more}
        for s in more:
            s.produce(60)
        summary = Pipeline(parse_config(config), spark=spark).run(once=True)
        for s in more:
            applied = sum(r.records for r in summary.reports[s.fmt])
            assert applied == s.produced - before[s], f"{s.fmt}: each new record once"

    run(one, a)  # taken over from the old folder
    b = Scenario(broker, "canal-json", seed=4)
    b.produce(150)
    two = {
        **one,
        "sources": [
            *one["sources"],
            {"format": "canal-json", "topics": [b.topic], "options": b.options},
        ],
    }
    run(two, a, b, new=[b])  # all of b's records are new to the pipeline
    assert set(Checkpoint(str(ck / QUERY_FOLDER)).fingerprints()) == {"debezium-json", "canal-json"}
    only_b = {**one, "sources": two["sources"][1:]}
    run(only_b, b)
    assert set(Checkpoint(str(ck / QUERY_FOLDER)).fingerprints()) == {"canal-json"}
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    a.check_mirrors(wh)
    b.check_mirrors(wh)
    # both sources' bookkeeping in the one warehouse, strictly: each partition of each
    # topic from offset 0 (both start at earliest) to its end, once, over the four runs
    batches = check_accounting(wh, a.produced + b.produced)
    for s in (a, b):
        assert sum(x["records"] for x in batches if x["topic"] == s.topic) == s.produced
    check_changelog_once(wh)

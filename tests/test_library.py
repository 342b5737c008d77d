"""The library's front door: what each command does is one call of ``cdcflow``."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

import cdcflow
from cdcflow.errors import ConfigError, LeaseHeld
from cdcflow.runtime.checkpoint import QUERY_FOLDER, Checkpoint, Fingerprint
from cdcflow.sinks.lease import PipelineLease

CASES = Path(__file__).parent / "formats" / "cases"
INSERT = CASES / "dataworks-json" / "paimon-aliyun-insert.input.jsonl"
UPDATE = CASES / "dataworks-json" / "paimon-aliyun-update-in-one.input.jsonl"


def test_the_exports_are_the_functions_the_commands_call():
    from cdcflow.commands.files import apply_files, decode_files
    from cdcflow.commands.reset import plan_reset, reset
    from cdcflow.runtime.runner import run

    assert (cdcflow.run, cdcflow.reset, cdcflow.plan_reset) == (run, reset, plan_reset)
    assert (cdcflow.apply_files, cdcflow.decode_files) == (apply_files, decode_files)
    assert sorted(dir(cdcflow)) == sorted(cdcflow.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cdcflow.nope  # noqa: B018


def test_decode_files_gives_events_and_accounts_for_every_record():
    result = cdcflow.decode_files("dataworks-json", [str(INSERT), str(UPDATE)])
    assert result.records == 2 and len(result.events) == 2 and not result.dead_letters


def test_apply_files_applies_each_line_once_per_warehouse(tmp_path):
    wh = str(tmp_path / "wh")
    first = cdcflow.apply_files("dataworks-json", [str(INSERT)], wh)
    assert (first.batch_id, first.records, first.events, first.replayed) == (0, 1, 1, 0)
    second = cdcflow.apply_files("dataworks-json", [str(INSERT), str(UPDATE)], wh)
    assert second.replayed == 1  # the insert file's line 0 was applied by the first call
    rows = DeltaTable(f"{wh}/bigdata_test.sync_test_table").to_pyarrow_table().to_pylist()
    assert [(r["id"], r["val"]) for r in rows] == [(2, 2.2)]


def test_apply_files_refuses_an_unknown_format_option(tmp_path):
    with pytest.raises(ConfigError, match="timestamp_zon"):
        cdcflow.apply_files("dataworks-json", [str(INSERT)], str(tmp_path), {"timestamp_zon": 1})


def _pipeline(tmp_path) -> Path:
    config = tmp_path / "p.yaml"
    config.write_text(
        "pipeline_id: r\nwarehouse: wh\ncheckpoint: ck\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "sources: [{name: a, format: debezium-json, topics: [t]},"
        " {name: b, format: canal-json, topics: [u]}]\n"
    )
    for name in ("a", "b"):  # per-source checkpoints of cdcflow before 0.4
        (tmp_path / "ck" / name / "offsets").mkdir(parents=True)
    loaded = cdcflow.load_config(config)
    query = Checkpoint(str(tmp_path / "ck" / QUERY_FOLDER))
    query.claim([Fingerprint.of(loaded, s) for s in loaded.sources])
    (tmp_path / "ck" / QUERY_FOLDER / "offsets").mkdir()
    (tmp_path / "wh" / "t").mkdir(parents=True)
    return config


def test_reset_of_some_sources_starts_them_over_and_keeps_the_others(tmp_path):
    config = _pipeline(tmp_path)
    plan = cdcflow.plan_reset(config, ["a"])
    assert [c.path for c in plan.checkpoints] == [str(tmp_path / "ck" / "a")]
    assert plan.warehouse is None
    assert plan.forgotten == ("a",)
    assert (tmp_path / "ck" / "a").exists()  # a plan deletes nothing
    cdcflow.reset(config, ["a"])
    assert not (tmp_path / "ck" / "a").exists() and (tmp_path / "ck" / "b").exists()
    query = Checkpoint(str(tmp_path / "ck" / QUERY_FOLDER))
    assert set(query.fingerprints()) == {"b"}  # the next run starts the checkpoint over
    assert (tmp_path / "wh" / "t").exists()
    assert cdcflow.plan_reset(config, ["a"]).steps == []  # nothing left to do


def test_reset_of_every_source_deletes_the_checkpoint(tmp_path):
    config = _pipeline(tmp_path)
    cdcflow.reset(config)
    assert not (tmp_path / "ck" / QUERY_FOLDER).exists() and not (tmp_path / "ck" / "a").exists()
    assert (tmp_path / "wh" / "t").exists()


def test_reset_refuses_while_a_run_holds_the_lease_and_deletes_nothing(tmp_path):
    config = _pipeline(tmp_path)
    loaded = cdcflow.load_config(config)
    with (
        PipelineLease(loaded.warehouse, loaded.pipeline_id, ttl_s=600),
        pytest.raises(LeaseHeld),
    ):
        cdcflow.reset(config, warehouse=True)
    assert (tmp_path / "ck" / "a").exists() and (tmp_path / "wh" / "t").exists()
    cdcflow.reset(config, warehouse=True)
    assert not (tmp_path / "wh").exists() and not (tmp_path / "ck" / "b").exists()


@pytest.mark.parametrize(
    ("sources", "warehouse", "message"),
    [
        (["c"], False, "--source 'c' is not a source of the pipeline"),
        (["a"], True, "--warehouse deletes the tables of every source"),
    ],
)
def test_reset_names_what_is_wrong(tmp_path, sources, warehouse, message):
    with pytest.raises(ConfigError, match=message):
        cdcflow.plan_reset(_pipeline(tmp_path), sources, warehouse)

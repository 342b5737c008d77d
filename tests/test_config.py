from __future__ import annotations

import pytest

from cdcflow.config import load_config, parse_config
from cdcflow.errors import ConfigError

GOOD = {
    "warehouse": "wh",
    "checkpoint": "ck",
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "options": {"security.protocol": "SSL"}},
    "sources": [
        {
            "format": "debezium-json",
            "topics": ["a", "b"],
            "options": {"primary_keys": {"t": ["id"]}},
        }
    ],
}


def test_defaults_and_reader_options(tmp_path):
    cfg = parse_config(GOOD, base_dir=tmp_path)
    assert cfg.warehouse == str(tmp_path / "wh") and cfg.pipeline_id == "default"
    assert cfg.trigger.processing_time == "1 second" and not cfg.trigger.available_now
    src = cfg.sources[0]
    assert (src.name, src.topics) == ("debezium-json", ("a", "b"))
    opts = cfg.kafka.reader_options()
    assert opts["kafka.bootstrap.servers"] == "127.0.0.1:9092"
    assert opts["kafka.security.protocol"] == "SSL"
    assert opts["startingOffsets"] == "earliest" and opts["failOnDataLoss"] == "true"


def test_outage_budget_is_seconds_in_yaml_and_milliseconds_for_the_source():
    assert parse_config(GOOD).kafka.outage_budget_s == 300.0
    assert parse_config(GOOD).kafka.reader_options()["outageBudgetMs"] == "300000"
    for given, ms in [(45, "45000"), (2.5, "2500"), (0, "0")]:
        cfg = parse_config({**GOOD, "kafka": {**GOOD["kafka"], "outage_budget_s": given}})
        assert cfg.kafka.reader_options()["outageBudgetMs"] == ms
    for bad in (-1, "five minutes", True, None):
        with pytest.raises(ConfigError) as e:
            parse_config({**GOOD, "kafka": {**GOOD["kafka"], "outage_budget_s": bad}})
        problem = str(e.value).splitlines()[1]  # one line per bad key
        assert problem.startswith("  kafka.outage_budget_s: ")
        assert "must be a number of seconds >= 0" in problem and "e.g. 300" in problem


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, "kafka": {**GOOD["kafka"], "bootstrap": "x"}})
    msg = str(e.value)
    assert "kafka.bootstrap: unknown key" in msg and "bootstrap_servers" in msg


def test_missing_key_is_named():
    bad = dict(GOOD)
    del bad["warehouse"]
    with pytest.raises(ConfigError, match="warehouse: required key is missing"):
        parse_config(bad)


def test_unknown_format_lists_the_formats():
    with pytest.raises(ConfigError, match="unknown format 'debezium'.*debezium-json"):
        parse_config({**GOOD, "sources": [{"format": "debezium", "topics": ["a"]}]})


def test_exactly_one_of_topics_or_pattern():
    with pytest.raises(ConfigError, match="exactly one of 'topics'"):
        parse_config(
            {
                **GOOD,
                "sources": [{"format": "debezium-json", "topics": ["a"], "topic_pattern": "a.*"}],
            }
        )
    with pytest.raises(ConfigError, match="exactly one of 'topics'"):
        parse_config({**GOOD, "sources": [{"format": "debezium-json"}]})


def test_available_now_trigger_and_duplicate_source_names():
    cfg = parse_config({**GOOD, "trigger": "available_now"})
    assert cfg.trigger.available_now and cfg.trigger.processing_time is None
    two = [
        {"format": "debezium-json", "topics": ["a"]},
        {"format": "debezium-json", "topics": ["b"]},
    ]
    with pytest.raises(ConfigError, match="distinct 'name'"):
        parse_config({**GOOD, "sources": two})


def test_yaml_errors_are_config_errors(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("kafka: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "missing.yaml")


def test_table_rules_and_apply_settings():
    cfg = parse_config(
        {
            **GOOD,
            "tables": [
                {"match": "*", "schema_changes": "ignore"},
                {"match": "shop.*", "mode": "history", "track_history": ["status"]},
                {"match": "shop.audit", "soft_delete": True, "sequence_by": ["ts"]},
            ],
            "apply": {
                "tombstone_retention_hours": 24,
                "transactions": {"consistent": True, "max_wait_ms": 500},
            },
        }
    )
    audit = cfg.tables("shop.audit")
    assert (audit.mode, audit.track_history, audit.soft_delete) == ("history", ("status",), True)
    assert audit.sequence_by == ("ts",) and audit.schema_changes == "ignore"
    assert cfg.tables("other.t").mode == "mirror"
    assert cfg.apply.tombstone_retention_hours == 24
    policy = cfg.apply.transaction_policy()
    assert policy is not None and (policy.max_wait_ms, policy.max_events) == (500, 100_000)
    assert parse_config(GOOD).apply.transaction_policy() is None  # off by default


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"tables": [{"match": "*", "soft_delet": True}]}, "tables.0.soft_delet: unknown key"),
        ({"tables": [{"match": "*", "schema_changes": "evolv"}]}, "'evolve', 'ignore', 'fail'"),
        ({"tables": [{"match": "*", "mode": "mirror", "track_history": ["a"]}]}, "history only"),
        (
            {"tables": [{"match": "*", "mode": "history", "soft_delete": True}]},
            "remove soft_delete",
        ),
        ({"tables": [{"mode": "history"}]}, "tables.0.match: required"),
        ({"apply": {"transactions": {"consisten": True}}}, "valid keys here: ['consistent'"),
        ({"apply": {"tombstone_retention_hours": -1}}, "apply.tombstone_retention_hours"),
    ],
)
def test_bad_table_and_apply_settings_name_the_key(bad, named):
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, **bad})
    assert named in str(e.value)

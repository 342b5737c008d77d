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
        [problem] = str(e.value).splitlines()  # one line naming the key
        assert problem.startswith("[BAD_CONFIG] kafka.outage_budget_s: ")
        assert "must be a number of seconds >= 0" in problem and "e.g. 300" in problem


def test_several_problems_are_listed_one_line_each():
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, "kafka": {**GOOD["kafka"], "bootstrap": "x"}, "sink": "nope"})
    lines = str(e.value).splitlines()
    assert lines[0] == "[BAD_CONFIG] invalid configuration (2 problems):"
    assert [line[:17] for line in lines[1:]] == ["  kafka.bootstrap", "  sink: Input sho"]


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, "kafka": {**GOOD["kafka"], "bootstrap": "x"}})
    msg = str(e.value)
    assert "kafka.bootstrap: unknown key; did you mean 'bootstrap_servers'?" in msg
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, "kafka": {**GOOD["kafka"], "xyzzy": 1}})
    assert "did you mean" not in str(e.value)  # nothing close: only the list


def test_an_unknown_format_option_says_which_was_meant():
    source = {**GOOD["sources"][0], "options": {"primary_key": {"t": ["id"]}}}
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, "sources": [source]})
    assert "unknown option(s) ['primary_key'] for this format; did you mean 'primary_keys'? " in (
        str(e.value)
    )


def test_several_unknown_format_options_say_which_was_meant_for_which():
    options = {"primary_key": {"t": ["id"]}, "keyles": "full_row", "xyzzy": 1}
    source = {**GOOD["sources"][0], "options": options}
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, "sources": [source]})
    assert (
        "unknown option(s) ['keyles', 'primary_key', 'xyzzy'] for this format; did you mean "
        "'keyless' for 'keyles', 'primary_keys' for 'primary_key'? valid options: ["
    ) in str(e.value)


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
        ({"tables": [{"match": "*", "soft_delet": True}]}, "tables[0].soft_delet: unknown key"),
        ({"tables": [{"match": "*", "schema_changes": "evolv"}]}, "'evolve', 'ignore', 'fail'"),
        ({"tables": [{"match": "*", "mode": "mirror", "track_history": ["a"]}]}, "history only"),
        (
            {"tables": [{"match": "*", "mode": "history", "soft_delete": True}]},
            "remove soft_delete",
        ),
        ({"tables": [{"mode": "history"}]}, "tables[0].match: required"),
        ({"apply": {"transactions": {"consisten": True}}}, "valid keys here: ['consistent'"),
        ({"apply": {"tombstone_retention_hours": -1}}, "apply.tombstone_retention_hours"),
    ],
)
def test_bad_table_and_apply_settings_name_the_key(bad, named):
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, **bad})
    assert named in str(e.value)


# ---------------------------------------------------------------- checked at load


def _problem(bad: dict) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config({**GOOD, **bad})
    lines = str(e.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("[BAD_CONFIG] "), lines
    return lines[0].removeprefix("[BAD_CONFIG] ")  # one line, naming the key


def _source(**over) -> dict:
    return {"sources": [{"format": "canal-json", "topics": ["t"], **over}]}


@pytest.mark.parametrize(
    ("bad", "line"),
    [
        ({"trigger": "10 seconds"}, "trigger: '10 seconds' is not a trigger; write trigger: "),
        ({"trigger": {"processing_time": "10 sekunds"}}, "trigger.processing_time: '10 sekunds'"),
        (
            {"trigger": {"processing_time": "1 second", "available_now": True}},
            "trigger: set either processing_time or available_now",
        ),
        (
            {"kafka": {**GOOD["kafka"], "starting_offsets": "earliset"}},
            "kafka.starting_offsets: 'earliset' is not valid; use \"earliest\"",
        ),
        (
            {"kafka": {**GOOD["kafka"], "starting_offsets": '{"t": {"0": -3}}'}},
            "kafka.starting_offsets: offset -3 of t[0] must be",
        ),
        (
            {"kafka": {**GOOD["kafka"], "options": {"auto.offset.reset": "earliest"}}},
            "kafka.options: 'auto.offset.reset' is set by cdcflow: set kafka.starting_offsets",
        ),
        (
            {"kafka": {**GOOD["kafka"], "options": {"bootstrap.servers": "h:1"}}},
            "kafka.options: 'bootstrap.servers' is set by cdcflow: set kafka.bootstrap_servers",
        ),
        (
            _source(options={"timestamp_zon": "UTC"}),
            "sources[0].options: unknown option(s) ['timestamp_zon']",
        ),
        (_source(options={"keyless": "maybe"}), "sources[0].options: "),
        (
            _source(topics=[], topic_pattern="("),
            "sources[0].topic_pattern: '(' is not a valid regular",
        ),
        ({"sources": []}, "sources: name at least one source"),
    ],
)
def test_what_load_config_checks_before_spark_starts(bad, line):
    """Each mistake is one line that names the YAML key (not a Spark option) and the fix."""
    assert _problem(bad).startswith(line)


def test_the_format_options_are_checked_by_the_formats_own_class():
    cfg = parse_config(
        {**GOOD, **_source(options={"timestamp_zone": "UTC", "keyless": "full_row"})}
    )
    assert cfg.sources[0].options == {"timestamp_zone": "UTC", "keyless": "full_row"}
    assert "(format canal-json)" in _problem(_source(options={"keyless": "maybe"}))


@pytest.mark.parametrize("word", ["available_now", {"available_now": True}])
def test_available_now_in_either_spelling(word):
    trigger = parse_config({**GOOD, "trigger": word}).trigger
    assert trigger.available_now and trigger.processing_time is None


INTERVALS = [
    "1 second", "1 seconds", "500 milliseconds", "interval 2 minutes", "1.5 seconds",
    "1 hour 30 minutes", "2 days", "1 week", "1 microsecond", "10   seconds", "1 SECOND",
    "1.5 minutes", "10 sekunds", "10s", "10 sec", "10 min", "100 ms", "", "seconds",
]  # fmt: skip


def _accepted(interval: str) -> bool:
    try:
        parse_config({**GOOD, "trigger": {"processing_time": interval}})
    except ConfigError:
        return False
    return True


def test_trigger_intervals_accepted_at_load():
    accepted = {i for i in INTERVALS if _accepted(i)}
    assert accepted == set(INTERVALS[:11])


@pytest.mark.spark
def test_trigger_intervals_agree_with_spark(spark):
    """load_config accepts exactly the intervals Spark's Trigger.ProcessingTime accepts."""
    stream = spark.readStream.format("rate").load().writeStream
    for interval in INTERVALS:
        try:
            stream.trigger(processingTime=interval)
            spark_accepts = True
        except Exception:  # noqa: BLE001 - Spark's IllegalArgumentException, through py4j
            spark_accepts = False
        assert _accepted(interval) == spark_accepts, interval


@pytest.mark.parametrize(
    ("interval", "ms"),
    [("1 second", 1000), ("500 milliseconds", 500), ("interval 1 minute 30 seconds", 90_000)],
)
def test_the_trigger_interval_in_milliseconds(interval, ms):
    config = parse_config({**GOOD, "trigger": {"processing_time": interval}})
    assert config.trigger.interval_ms == ms
    assert parse_config({**GOOD, "trigger": "available_now"}).trigger.interval_ms is None


def test_the_dead_letter_limit_is_a_share():
    assert parse_config(GOOD).apply.dead_letter_limit is None  # never stops by default
    assert parse_config({**GOOD, "apply": {"dead_letter_limit": 0}}).apply.dead_letter_limit == 0
    with pytest.raises(ConfigError, match=r"apply\.dead_letter_limit: "):
        parse_config({**GOOD, "apply": {"dead_letter_limit": 1.5}})


# ---------------------------------------------------------------- bad input, one line


def _tables(**rule) -> dict:
    return {"tables": [{"match": "shop.*", **rule}]}


@pytest.mark.parametrize(
    ("bad", "line"),
    [
        (
            _tables(computed_columns={"d": "(" * 2000 + "a" + ")" * 2000}),
            "tables[0]: computed_columns.d: cannot parse '((((",
        ),
        (_tables(filter="NOT " * 5000 + "flag"), "tables[0]: filter: cannot parse 'NOT NOT"),
        (_tables(filter=" + ".join(["a"] * 5000) + " > 0"), "tables[0]: filter: cannot parse"),
        (
            _tables(computed_columns={"d": "upper(" * 300 + "a" + ")" * 300}),
            "tables[0]: computed_columns.d: cannot parse 'upper(upper(",
        ),
    ],
)
def test_an_expression_nested_too_deep_is_one_line_naming_the_key(bad, line):
    problem = _problem(bad)
    assert problem.startswith(line)
    assert "nested more than 64 levels deep" in problem and len(problem) < 400


@pytest.mark.parametrize(
    ("override", "accepted"),
    [
        ("decimal(99,200)", False),
        ("decimal(39,2)", False),
        ("decimal(10,11)", False),
        ("decimal(0,0)", False),
        ("decimal(10,-1)", False),
        ("decimal(38,38)", True),
        ("decimal(1,0)", True),
        ("decimal(38,10)", True),
    ],
)
def test_a_type_override_is_a_decimal_delta_can_store(override, accepted):
    bad = _tables(type_overrides={"amount": override})
    if accepted:
        assert parse_config({**GOOD, **bad}).tables("shop.x").shaping.overrides["amount"]
        return
    problem = _problem(bad)
    assert problem.startswith(f"tables[0]: type_overrides.amount: '{override}' is not a Delta")
    assert "1 <= P <= 38 and 0 <= S <= P" in problem


@pytest.mark.parametrize(
    ("key", "pattern"),
    [
        ("include", r"shop\.(\w+)\.\1"),  # a backreference
        ("exclude", r"shop\.(?!audit).*"),  # lookaround
    ],
)
def test_a_table_pattern_re2_cannot_run_is_one_line_naming_the_key(key, pattern):
    problem = _problem(_source(**{key: [pattern]}))
    assert problem.startswith(f"sources[0].{key}: {pattern!r} is not a valid regular expression")
    assert "RE2" in problem


def test_a_route_re2_cannot_run_is_one_line_naming_the_key():
    problem = _problem(_source(routes=[{"source_table": r"(a)\1", "target_table": "b"}]))
    assert problem.startswith("sources[0].routes[0]: source_table: '(a)\\\\1' is not a valid")


def test_nested_quantifiers_match_table_names_in_linear_time():
    """``(a+)+$`` takes Python's backtracking engine exponential time on a name of a's
    and one other letter; RE2 answers at once."""
    import time

    from cdcflow.transform.router import Router

    config = parse_config(
        {
            **GOOD,
            **_source(
                include=["(a+)+$", "shop\\..*"],
                routes=[{"source_table": "shop\\.(x+x+)+y", "target_table": "t.t"}],
            ),
        }
    )
    router = Router(routing=config.sources[0].routing())
    started = time.monotonic()
    assert router.target("f", "a" * 5000 + "b", "", "") is None  # left out: no include matches
    assert router.target("f", "a" * 40, "", "") == "a" * 40
    assert router.target("f", "shop", "", "x" * 5000) == "shop." + "x" * 5000  # no route
    assert router.target("f", "shop", "", "xxy") == "t.t"
    assert router.target("f", "shop", "", "orders") == "shop.orders"
    assert time.monotonic() - started < 2.0

"""Secrets in the configuration (``cdcflow.secrets``): ``${env:NAME}``/``${NAME}``/
``${file:PATH}`` references resolved at load, and secret-looking keys' values masked
wherever a configuration is shown (issue 19, item 7)."""

from __future__ import annotations

import pytest

from cdcflow.config import load_config, parse_config
from cdcflow.errors import ConfigError
from cdcflow.secrets import MASK, RedactedDict, is_secret_key, redact, resolve_references

SECRET = "hunter2-Zq9s3cret"


def _config(kafka_options=None, source_options=None, **kafka):
    return {
        "warehouse": "wh",
        "checkpoint": "ck",
        "kafka": {"bootstrap_servers": "b:9092", "options": kafka_options or {}, **kafka},
        "sources": [{"format": "debezium-json", "topics": ["t"], "options": source_options or {}}],
    }


def test_environment_references_are_resolved_in_any_string(monkeypatch):
    monkeypatch.setenv("KPASS", SECRET)
    monkeypatch.setenv("KUSER", "alice")
    data = resolve_references(
        {"a": {"p": "${env:KPASS}", "u": "${KUSER}"}, "l": ["x-${KUSER}-y", 3, None]}
    )
    assert data == {"a": {"p": SECRET, "u": "alice"}, "l": ["x-alice-y", 3, None]}
    assert resolve_references("$${KUSER} and $${env:X}") == "${KUSER} and ${env:X}"
    assert resolve_references("no reference, $HOME {x}") == "no reference, $HOME {x}"


def test_file_references_are_read_relative_to_the_configuration(tmp_path, monkeypatch):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "kafka").write_text(SECRET + "\n")
    monkeypatch.setenv("KUSER", "alice")
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        "warehouse: wh\ncheckpoint: ck\n"
        "kafka:\n  bootstrap_servers: b:9092\n  options:\n"
        "    sasl.username: ${KUSER}\n    sasl.password: ${file:secrets/kafka}\n"
        "sources: [{format: debezium-json, topics: [t]}]\n"
    )
    config = load_config(path)
    assert config.kafka.options["sasl.password"] == SECRET
    assert config.kafka.options["sasl.username"] == "alice"
    assert config.kafka.reader_options()["kafka.sasl.password"] == SECRET  # the client gets it


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("${NOT_SET_ANYWHERE_1}", "kafka.options.sasl.password: environment variable "),
        ("${env:NOT_SET_ANYWHERE_1}", "NOT_SET_ANYWHERE_1 is not set"),
        ("${file:/nonexistent/kafka.pw}", "cannot read /nonexistent/kafka.pw"),
        ("${vault:kafka/pw}", "unknown reference '${vault:kafka/pw}'"),
        ("${two words}", "is not an environment variable reference"),
    ],
)
def test_a_reference_that_cannot_be_resolved_is_one_line_naming_the_key(value, message):
    with pytest.raises(ConfigError) as info:
        parse_config(_config({"sasl.password": value}))
    text = str(info.value)
    assert message in text
    assert text.count("\n") == 0 and text.startswith("[BAD_CONFIG] kafka.options.sasl.password")


def test_secret_looking_keys():
    for key in (
        "sasl.password",
        "ssl.key.password",
        "sasl.oauthbearer.client.secret",
        "basic.auth.user.info",
        "bearer.auth.token",
        "aws_secret_access_key",
        "sasl.jaas.config",
    ):
        assert is_secret_key(key), key
    for key in ("sasl.username", "bootstrap.servers", "security.protocol", "url", "topics"):
        assert not is_secret_key(key), key
    nested = {"registry": {"url": "u", "basic.auth.user.info": "a:b"}, "l": [{"token": "t"}]}
    assert redact(nested) == {
        "registry": {"url": "u", "basic.auth.user.info": MASK},
        "l": [{"token": MASK}],
    }
    assert nested["registry"]["basic.auth.user.info"] == "a:b"  # a copy


def test_a_configuration_never_shows_a_secret(monkeypatch):
    monkeypatch.setenv("KPASS", SECRET)
    config = parse_config(
        _config(
            {"sasl.password": "${KPASS}", "sasl.username": "alice"},
            {"primary_keys": {"t": ["id"]}},
        )
    )
    options = config.kafka.reader_options()
    assert isinstance(options, RedactedDict) and options["kafka.sasl.password"] == SECRET
    shown = [
        repr(config),
        str(config),
        repr(config.kafka),
        repr(options),
        str(options),
        f"{options}",
    ]
    for text in shown:
        assert SECRET not in text
        assert MASK in text
    assert "alice" in repr(config)  # only secrets are masked


def test_a_validation_error_never_repeats_a_secret(monkeypatch):
    """pydantic's own message repeats the input; the ConfigError is not chained to it."""
    monkeypatch.setenv("KPASS", SECRET)
    bad = _config({"sasl.password": "${KPASS}"}, starting_offsets="earliset")
    with pytest.raises(ConfigError) as info:
        parse_config(bad)
    assert "kafka.starting_offsets" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert SECRET not in str(info.value)


def test_positions_read_as_in_yaml():
    with pytest.raises(ConfigError, match=r"sources\[0\]\.topic_pattern: "):
        parse_config({**_config(), "sources": [{"format": "debezium-json", "topic_pattern": "("}]})

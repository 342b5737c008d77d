"""The configuration examples of the README and docs/configuration.md load.

Every YAML block must parse (one that does not fails, it is not skipped). A block whose
top-level keys are configuration keys is completed with what it leaves out (warehouse,
checkpoint, brokers, a source); a fragment of one source (``routes:``) is put in a
source, of one table rule (``metadata_columns:``) in a rule, a list in ``tables:``. Each
is validated as ``cdcflow run`` validates a file, so an example cannot drift from the
options it shows; a block that is none of these fails too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cdcflow.apply.options import TableOptions
from cdcflow.config import PipelineConfig, SourceConfig, parse_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "configuration.md"]
_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, int, str]]:
    """``(doc, index, text)`` of every YAML block of the docs."""
    return [
        (path.name, i, m.group(1))
        for path in DOCS
        for i, m in enumerate(_BLOCK.finditer(path.read_text()))
    ]


def _as_configuration(text: str) -> dict:
    """The configuration a block shows (the parts it leaves out are added by the test).

    Raises:
        yaml.YAMLError: the block does not parse.
        ValueError: the block is neither a configuration, a fragment of a source or of
            a table rule, nor a list of table rules.
    """
    # secrets: a mounted file stands for itself; variables are set by the test
    data = yaml.safe_load(re.sub(r"\$\{file:[^}]*\}", "from-a-file", text))
    if isinstance(data, dict) and data and set(data) <= set(PipelineConfig.model_fields):
        return data
    if isinstance(data, dict) and data and set(data) <= set(SourceConfig.model_fields):
        return {"sources": [{"format": "debezium-json", **data}]}
    if isinstance(data, dict) and data and set(data) <= set(TableOptions.model_fields):
        return {"tables": [{"match": "*", **data}]}
    if isinstance(data, list) and data and all(isinstance(r, dict) and "match" in r for r in data):
        return {"tables": data}
    raise ValueError(f"neither a configuration nor a part of one: {str(data)[:200]}")


BLOCKS = _blocks()


def test_the_docs_have_examples_to_check():
    assert len(BLOCKS) >= 5
    assert any("routes:" in text for _, _, text in BLOCKS)


def test_a_block_that_does_not_parse_fails_and_is_not_skipped():
    with pytest.raises(yaml.YAMLError):
        _as_configuration("sources:\n  - format: x\n   topics: [t]\n")  # misindented
    with pytest.raises(ValueError, match="neither a configuration"):
        _as_configuration("sourcse: []\n")  # a misspelt key is no fragment either


@pytest.mark.parametrize(("doc", "index", "text"), BLOCKS, ids=[f"{d}-{i}" for d, i, _ in BLOCKS])
def test_a_documented_configuration_loads(doc, index, text, tmp_path, monkeypatch):
    data = _as_configuration(text)
    for name in re.findall(r"\$\{(?:env:)?(\w+)\}", str(data)):
        monkeypatch.setenv(name, "user:secret")  # (a registry takes user:password)
    data = {
        "warehouse": str(tmp_path / "wh"),
        "checkpoint": str(tmp_path / "ck"),
        **data,
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", **data.get("kafka", {})},
    }
    data.setdefault("sources", [{"format": "debezium-json", "topics": ["t"]}])
    for source in data["sources"]:  # examples elide the subscription
        if "topics" not in source and "topic_pattern" not in source:
            source["topics"] = ["t"]
    parse_config(data, base_dir=tmp_path)

"""The configuration examples of the README and docs/configuration.md load.

Every YAML block whose top-level keys are configuration keys is completed with what it
leaves out (warehouse, checkpoint, brokers, a source) and validated as ``cdcflow run``
validates a file, so an example cannot drift from the options it shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cdcflow.config import PipelineConfig, parse_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "configuration.md"]
_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def _examples() -> list[tuple[str, int, dict]]:
    found = []
    for path in DOCS:
        for i, m in enumerate(_BLOCK.finditer(path.read_text())):
            # secrets: a mounted file stands for itself; variables are set by the test
            text = re.sub(r"\$\{file:[^}]*\}", "from-a-file", m.group(1))
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue  # an indented fragment of a larger example
            if isinstance(data, dict) and data and set(data) <= set(PipelineConfig.model_fields):
                found.append((path.name, i, data))
    return found


EXAMPLES = _examples()


def test_the_docs_have_examples_to_check():
    assert len(EXAMPLES) >= 5
    assert any("routes" in s for _, _, d in EXAMPLES for s in d.get("sources", []))


@pytest.mark.parametrize(
    ("doc", "index", "data"), EXAMPLES, ids=[f"{d}-{i}" for d, i, _ in EXAMPLES]
)
def test_a_documented_configuration_loads(doc, index, data, tmp_path, monkeypatch):
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

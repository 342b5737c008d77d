"""The golden captures of real replication tools, replayed: the messages a real tool
published for a real database (``tests/capture/golden/<capture>/messages.jsonl``, written
by the live capture tests with ``CDCFLOW_SAVE_CAPTURE=1``) are produced again to the
embedded broker, ``cdcflow run --once`` mirrors them, and every mirror must equal the
database state they came from (``database.json``), value by value and type by type --
without the database or the tool at hand.
"""

from __future__ import annotations

import base64
import uuid

import pytest
from tests.capture.helpers import (
    GOLDEN,
    TYPED,
    TYPED_MARIADB,
    compare,
    expected_schemaless,
    expected_typed,
    load_capture,
    mirror_rows,
    run_cdcflow,
)

from cdcflow_testkit.encoders import Message

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

CAPTURES = sorted(p.name for p in GOLDEN.iterdir() if (p / "messages.jsonl").exists())


def test_the_golden_captures_are_there():
    assert "debezium-postgres-pg_schemas" in CAPTURES
    assert "debezium-postgres-pg_schemaless" in CAPTURES
    assert "debezium-mariadb" in CAPTURES
    assert "debezium-mariadb-schemaless" in CAPTURES


@pytest.mark.parametrize("capture", CAPTURES)
def test_a_golden_capture_replayed_mirrors_its_database(spark, broker, tmp_path, capture):
    messages, state = load_capture(GOLDEN / capture)
    run = f"replay{uuid.uuid4().hex[:8]}"
    by_partition: dict[tuple[str, int], list[Message]] = {}
    for m in messages:
        by_partition.setdefault((m["topic"], m["partition"]), []).append(
            Message(
                value=None if m["value"] is None else m["value"].encode(),
                key=None if m["key"] is None else m["key"].encode(),
                headers=tuple((k, base64.b64decode(v)) for k, v in m["headers"]),
            )
        )
    for topic in sorted({t for t, _ in by_partition}):
        partitions = 1 + max(p for t, p in by_partition if t == topic)
        broker.create_topic(f"{run}.{topic}", partitions=partitions)
    for (topic, p), ms in sorted(by_partition.items()):
        broker.produce(f"{run}.{topic}", ms, partition=p)

    schemas = state["schemas"]
    summary, wh = run_cdcflow(spark, broker, tmp_path, schemas, rf"{run}\..*")
    report = summary.reports["debezium-json"]
    assert sum(b.records for b in report) == len(messages)
    assert not any(b.dead_letters for b in report)

    source = state.get("source", "postgres")
    typed, schema_name = (TYPED, "public.") if source == "postgres" else (TYPED_MARIADB, "")
    customers = state["tables"]["customers"]
    got, schema = mirror_rows(wh, f"shop.{schema_name}customers", customers["key"])
    if schemas:
        assert {f.name: f.type for f in schema} == {c: typed[c] for c in customers["types"]}
    problems = compare(customers["rows"], got, expected_typed if schemas else expected_schemaless)
    assert problems == [], "\n".join(problems[:20])
    lines = state["tables"]["order_lines"]
    got, _ = mirror_rows(wh, f"shop.{schema_name}order_lines", lines["key"])
    assert got == lines["rows"]

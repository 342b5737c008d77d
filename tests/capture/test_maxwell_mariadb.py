"""A second real tool: Maxwell's daemon 1.45.0 (built from its source, see
``testkit/third_party/maxwell``) reads a real MariaDB 10.11's binlog into Apache Kafka;
``cdcflow run --once`` mirrors its topic as ``maxwell-json``; every mirror is compared
with ``SELECT *``, value by value.

The workload is the Debezium MariaDB module's (inserts, updates, deletes, a primary-key
change, NULLs, ``ALTER TABLE ... ADD COLUMN``, a transaction over two tables, TRUNCATE and
17 column types), run after Maxwell starts (Maxwell publishes no snapshot without its
separate bootstrap). Maxwell declares no column types: each mirror value is compared
with the JSON value Maxwell publishes for the database value, typed by cdcflow from the
JSON alone (``docs/formats/maxwell-json.md``, "Types").

What the real tool showed (checked below, and in the closing note of issue 10):

* Maxwell publishes nothing for ``TRUNCATE``: the mirror keeps the rows it removed.
* Maxwell formats TIME through ``java.sql.Time``: values outside 00:00:00-23:59:59 wrap
  (``-838:59:59`` is published as ``"17:04:05"``) and follow the JVM's time zone (run it
  in UTC). The workload's TIME values are within a day.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
from tests.capture.helpers import compare, mirror_rows, run_cdcflow
from tests.capture.test_debezium_mariadb import _snapshot_rows, _workload, mariadb_rows

from cdcflow.config import parse_config
from cdcflow.verify.databases import SourceDatabase
from cdcflow.verify.verifier import VerifyOptions, verify
from cdcflow_testkit.services.mariadb import LocalMariaDB
from cdcflow_testkit.services.maxwell import MAXWELL_VERSION, Maxwell

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

#: the mirror's type of each column: what cdcflow infers from Maxwell's JSON values
TYPED_MAXWELL = {
    "id": pa.int64(),
    "name": pa.string(),
    "visits": pa.int64(),
    "small": pa.int64(),
    "active": pa.int64(),
    "balance": pa.float64(),  # a JSON number with a fraction (float_as_decimal: off)
    "score": pa.float64(),
    "ratio": pa.float64(),
    "born": pa.string(),  # dates and times are strings: Maxwell declares no types
    "wake": pa.string(),
    "created_at": pa.string(),
    "updated_at": pa.string(),
    "avatar": pa.string(),  # base64
    "doc": pa.string(),
    "feeling": pa.string(),
    "perms": pa.string(),  # a SET is a JSON array: its text
    "notes": pa.string(),
    "tier": pa.int64(),
}


def expected_maxwell(name: str, value):
    """The mirror value of a database value: the JSON value Maxwell publishes for it
    (Maxwell's ``RowMap`` and column types), typed by cdcflow from the JSON alone."""
    if value is None:
        return None
    if name == "balance":
        return float(value)
    if name == "ratio":
        # MariaDB's FLOAT is a float32; Maxwell prints Java's shortest text of it
        return float(str(np.float32(value)))
    if name == "born":
        return value.isoformat()
    if name == "wake":
        return value.strftime("%H:%M:%S.%f")
    if name == "created_at":
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if name == "updated_at":
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    if name == "avatar":
        return base64.b64encode(bytes(value)).decode()
    if name == "perms":
        return json.dumps(value.split(",") if value else [], separators=(",", ":"))
    return value


def _sentinel_seen(broker, topic: str, timeout_s: float = 120.0) -> int:
    """Wait until Maxwell published the sentinel row; the topic's record count."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(broker.client_config(**{"group.id": "mx", "enable.auto.commit": False}))
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        while time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=1):
                seen += 1
                if m.error() is None and b'"table":"sentinel"' in (m.value() or b""):
                    return sum(broker.end_offsets(topic).values())
        raise AssertionError(f"Maxwell did not publish the sentinel row ({seen} records)")
    finally:
        consumer.close()


def test_maxwell_on_mariadb_mirrors_equal_the_database(spark, apache_kafka, tmp_path):
    topic = f"mx_{uuid.uuid4().hex[:6]}"
    apache_kafka.create_topic(topic)
    with LocalMariaDB() as db:
        options = {
            "output_ddl": "true",
            "output_primary_key_columns": "true",
            "output_commit_info": "true",
            "output_binlog_position": "true",
            "output_xoffset": "true",
        }
        mx = Maxwell(
            db.host, db.port, db.user, db.password, apache_kafka.bootstrap_servers, topic, options
        )
        with mx:
            _snapshot_rows(db)  # after Maxwell starts: published as inserts
            _workload(db)
            count = _sentinel_seen(apache_kafka, topic)
        summary, wh = run_cdcflow(
            spark,
            apache_kafka,
            tmp_path,
            False,
            rf"{topic}",
            {"format": "maxwell-json", "options": {}},
        )
        print(f"Maxwell {MAXWELL_VERSION}: {count} records; {summary}")
        report = summary.reports["maxwell-json"]
        assert not any(b.dead_letters for b in report), report

        customers, _ = mariadb_rows(db, "customers", "id", exact=("ratio",))
        got, schema = mirror_rows(wh, "shop.customers", ["id"])
        assert {f.name: f.type for f in schema} == {c: TYPED_MAXWELL[c] for c in customers[0]}
        problems = compare(customers, got, expected_maxwell)
        assert problems == [], "\n".join(problems[:20])

        # TRUNCATE order_lines published nothing: its rows (orders 1-5) stay in the mirror
        lines, _ = mariadb_rows(db, "order_lines", "order_id, line_no")
        got, _ = mirror_rows(wh, "shop.order_lines", ["order_id", "line_no"])
        truncated = [
            {"order_id": o, "line_no": n, "sku": f"sku-{o}-{n}", "qty": o * n}
            for o in range(1, 6)
            for n in range(1, 4)
        ]
        assert got == sorted(truncated + lines, key=lambda r: (r["order_id"], r["line_no"]))

        # cdcflow verify against the live database says the same, by itself: customers
        # equal (Maxwell's SET as a JSON array, DECIMAL as a number, times as text), and
        # exactly the truncated rows extra in order_lines
        config = parse_config(
            {
                "pipeline_id": "maxwell",
                "warehouse": str(tmp_path / "wh"),
                "checkpoint": str(tmp_path / "ck"),
                "kafka": {"bootstrap_servers": apache_kafka.bootstrap_servers},
                "sources": [{"format": "maxwell-json", "topics": [topic]}],
            }
        )
        source = SourceDatabase(f"mysql://{db.user}:{db.password}@{db.host}:{db.port}/shop")
        try:
            run = verify(config, source, VerifyOptions(wait_s=0, recheck_after_s=0, chunk_rows=8))
        finally:
            source.close()
        tables = {t.target: t for t in run.tables}
        assert tables["shop.customers"].equal, tables["shop.customers"].different[:4]
        assert tables["shop.customers"].left_out_columns == {}
        extra = tables["shop.order_lines"].extra
        assert extra == [{"order_id": r["order_id"], "line_no": r["line_no"]} for r in truncated]
        assert tables["shop.order_lines"].missing == tables["shop.order_lines"].different == []

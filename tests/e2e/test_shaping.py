"""End to end, shaping the lakehouse: one topic set carries 16 shards of ``orders``, a
``customers`` table kept only where a filter holds and an ``order_lines`` table left out.
The real broker, real local Spark and real Delta tables read back: the shards land in one
target with the shard named in a column and a computed partition column, the filtered
table holds exactly the source rows its filter is true for (rows that stop matching are
deleted), and the left-out table's changes are counted as skipped, never dead letters."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from tests.e2e.helpers import PARTITIONS, check_accounting, check_changelog_once, produce

from cdcflow.config import parse_config
from cdcflow.errors import SkipReason
from cdcflow.runtime.pipeline import Pipeline
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.encoders import encoder_for
from cdcflow_testkit.workload import DEMO_TABLES, TableSpec, Workload, compare_with_mirror

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def broker(tansu_broker):
    """tansu alone: routing and shaping happen after the read, the same on every broker
    (the e2e folder's other tests run on Apache Kafka too; the suite's time is bounded)."""
    return tansu_broker


SHARDS = 16
_customers, _orders, _lines = DEMO_TABLES
TABLES = [
    *(TableSpec(f"orders_{n}", _orders.columns, _orders.key_columns) for n in range(SHARDS)),
    TableSpec("customers", {c: t for c, t in _customers.columns.items()}, _customers.key_columns),
    _lines,
]


def _config(tmp_path, broker, topic, options) -> dict:
    return {
        "pipeline_id": "shaping",
        "warehouse": str(tmp_path / "wh"),
        "checkpoint": str(tmp_path / "ck"),
        "trigger": "available_now",
        "kafka": {"bootstrap_servers": broker.bootstrap_servers, "max_offsets_per_trigger": 400},
        "sources": [
            {
                "name": "shop",
                "format": "debezium-json",
                "topics": [topic],
                "options": options,
                "include": [r"shop\.public\..*"],
                "exclude": [r"shop\.public\.order_lines"],
                "routes": [
                    {
                        "source_table": r"shop\.public\.(orders)_\d+",
                        "target_table": r"shop.\1",
                        "shard_column": "_shard",
                    }
                ],
                "table_prefix": "ods_",
            }
        ],
        "tables": [
            {
                "match": "shop.ods_orders",
                "computed_columns": {"placed_date": "date(placed_at)"},
                "partition_by": ["placed_date"],
                "change_feed": True,
            },
            {
                "match": "shop.public.ods_customers",
                "filter": "active = TRUE AND balance >= 0",
                "columns": {"exclude": ["avatar"]},
                "computed_columns": {"name_upper": "upper(name)"},
            },
        ],
    }


def test_sixteen_shards_and_a_filtered_table_land_in_their_targets(spark, broker, tmp_path):
    encoder = encoder_for("debezium-json")
    workload = Workload(
        TABLES, seed=20, first_keys={f"orders_{n}": n * 1_000_000 + 1 for n in range(SHARDS)}
    )
    changes = list(workload.changes(1_500))
    messages = [m for c in changes for m in encoder.encode(c)]
    topic = "shaping.shop"
    broker.create_topic(topic, partitions=PARTITIONS)
    produced = produce(broker, topic, messages)
    options = encoder.decoder_options(changes) or {}
    config = parse_config(_config(tmp_path, broker, topic, options))

    summary = Pipeline(config, spark=spark).run(once=True)

    wh = DeltaWarehouse(str(tmp_path / "wh"))
    assert sorted(wh.mirrors()) == ["shop.ods_orders", "shop.public.ods_customers"]
    expected_orders = [
        {**row, "_shard": f"shop.public.orders_{n}", "placed_date": _utc_date(row["placed_at"])}
        for n in range(SHARDS)
        for row in workload.expected_rows(f"orders_{n}")
    ]
    assert len({r["order_id"] for r in expected_orders}) == len(expected_orders) > 100
    problems = compare_with_mirror(
        sorted(expected_orders, key=lambda r: r["order_id"]),
        wh.read("shop.ods_orders"),
        ("order_id",),
    )
    assert problems == [], problems[:5]
    _check_change_feed(spark, wh.table_path("shop.ods_orders"), wh.read("shop.ods_orders"))

    kept = [  # SQL: a NULL makes the filter not true
        r
        for r in workload.expected_rows("customers")
        if r["active"] is True and r["balance"] is not None and r["balance"] >= 0
    ]
    expected_customers = [
        {**{c: v for c, v in r.items() if c != "avatar"}, "name_upper": r["name"].upper()}
        for r in kept
    ]
    assert 0 < len(kept) < len(workload.expected_rows("customers"))
    problems = compare_with_mirror(
        expected_customers, wh.read("shop.public.ods_customers"), ("id",)
    )
    assert problems == [], problems[:5]

    lines = sum(1 for c in changes if c.table.table == "order_lines")
    reports = [r for rs in summary.reports.values() for r in rs]
    assert sum(r.skipped[SkipReason.TABLE_EXCLUDED] for r in reports) == lines > 0
    assert sum(r.skipped[SkipReason.ROW_FILTERED] for r in reports) > 0
    assert not any(r.dead_letters for r in reports)
    # the records shaping skipped are skipped in _cdcflow/batches: checked per batch row
    check_accounting(wh, produced)
    check_changelog_once(wh)
    changelog = wh.read("changelog", system=True)
    assert "order_lines" not in set(changelog["table"].to_pylist())
    assert not any("avatar" in (a or "") for a in changelog["after"].to_pylist())


def _check_change_feed(spark, path: str, mirror: pa.Table) -> None:
    """Both readers read the same changes, and replaying them commit by commit gives the
    mirror: the feed holds exactly what changed."""
    delta_rs = pa.table(DeltaTable(path).load_cdf(starting_version=0)).to_pylist()
    frame = spark.read.format("delta").option("readChangeFeed", "true")
    by_spark = [r.asDict() for r in frame.option("startingVersion", 0).load(path).collect()]

    def kinds(rows: list[dict]) -> Counter:
        return Counter((r["_commit_version"], r["_change_type"], r["order_id"]) for r in rows)

    assert kinds(delta_rs) == kinds(by_spark)
    assert {r["_change_type"] for r in delta_rs} == {
        "insert",
        "update_preimage",
        "update_postimage",
        "delete",
    }
    replayed: dict[int, dict] = {}
    for r in sorted(delta_rs, key=lambda r: (r["_commit_version"], r["_change_type"] != "delete")):
        if r["_change_type"] == "delete":
            del replayed[r["order_id"]]
        elif r["_change_type"] in ("insert", "update_postimage"):
            replayed[r["order_id"]] = {k: v for k, v in r.items() if not _bookkeeping(k)}
    stored = {
        r["order_id"]: {k: v for k, v in r.items() if not _bookkeeping(k)}
        for r in mirror.to_pylist()
    }
    assert all("_shard" in row for row in stored.values())
    assert replayed == stored


def _bookkeeping(column: str) -> bool:
    return column.startswith("_cdc") or column in (
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    )


def _utc_date(value: dt.datetime | None) -> dt.date | None:
    return None if value is None else value.astimezone(dt.UTC).date()

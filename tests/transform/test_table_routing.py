"""Selection and routing per source, on real Delta tables: include/exclude, route rules
with groups, prefix/suffix, sharded source tables merged into one target with the shard
named in a column, and a key two shards hold refused (SHARD_KEY_COLLISION)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from tests.apply.helpers import COLUMNS, dele, ev, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.config import parse_config
from cdcflow.errors import Code, ConfigError, SkipReason
from cdcflow.model import Op, SourceTable
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.transform.router import Router, RouteRule, Routing, by_target, split_excluded
from cdcflow_testkit.workload import mirror_by_key


def _shard(n: int) -> SourceTable:
    return SourceTable("test", "shop", "", f"orders_{n}")


SHARDS = Routing(
    routes=(
        RouteRule(
            source_table=r"shop\.orders_(\d+)", target_table="shop.orders", shard_column="_shard"
        ),
    )
)


def _applier(tmp_path, routing: Routing) -> tuple[DeltaWarehouse, BatchApplier]:
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="test")
    return wh, BatchApplier(wh, Router(routing=routing))


def _by_id(wh: DeltaWarehouse, target: str) -> dict:
    return mirror_by_key(wh.read(target))


# ---------------------------------------------------------------- the router alone


def test_include_exclude_routes_prefix_and_suffix_in_that_order():
    router = Router(
        routing=Routing(
            include=(r"shop\..*",),
            exclude=(r"shop\.public\.audit_.*",),
            routes=(
                RouteRule(
                    source_table=r"shop\.public\.(?P<t>\w+)_(\d+)", target_table=r"shop.\g<t>"
                ),
            ),
            table_prefix="ods_",
            table_suffix="_v1",
        )
    )
    assert router.target("f", "shop", "public", "orders_7") == "shop.ods_orders_v1"
    assert router.target("f", "shop", "public", "items") == "shop.public.ods_items_v1"
    assert router.target("f", "shop", "public", "audit_log") is None  # excluded
    assert router.target("f", "crm", "public", "people") is None  # not included
    # patterns match whole names: 'shop' alone is no include of 'shop.public.x'
    assert Router(routing=Routing(include=("shop",))).target("f", "shop", "public", "x") is None
    # the first matching route wins
    first = Router(
        routing=Routing(
            routes=(
                RouteRule(source_table=r"db\.a.*", target_table="db.first"),
                RouteRule(source_table=r"db\.ab", target_table="db.second"),
            )
        )
    )
    assert first.target("f", "db", "", "ab") == "db.first"
    assert Router().target("f", "db", "", "ab") == "db.ab"  # no rules: the template


def test_route_rules_are_checked_when_loaded():
    with pytest.raises(ValidationError, match="refers to group 2"):
        RouteRule(source_table=r"db\.(a)", target_table=r"db.\2")
    with pytest.raises(ValidationError, match="does not name"):
        RouteRule(source_table=r"db\.(a)", target_table=r"db.\g<x>")
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        RouteRule(source_table=r"db\.(a", target_table="db.a")


def _config(**source):
    return {
        "warehouse": "/tmp/wh",
        "checkpoint": "/tmp/cp",
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "sources": [{"format": "debezium-json", "topics": ["t"], **source}],
    }


def test_the_configuration_names_the_bad_routing_key():
    with pytest.raises(ConfigError, match=r"sources\[0\]\.include: .*not a valid regular"):
        parse_config(_config(include=["shop.(orders"]))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.routes\[0\]: .*refers to group 1"):
        parse_config(_config(routes=[{"source_table": "a", "target_table": r"b.\1"}]))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.routes\[0\]\.target: unknown key"):
        parse_config(_config(routes=[{"source_table": "a", "target": "b"}]))
    config = parse_config(
        _config(
            include=[r"shop\..*"],
            table_prefix="ods_",
            routes=[{"source_table": "a", "target_table": "b"}],
        )
    )
    assert config.sources[0].routing().selects
    assert Router(routing=config.sources[0].routing()).target("f", "shop", "", "x") == "shop.ods_x"


def test_excluded_tables_leave_the_batch_and_markers_stay():
    other = SourceTable("test", "db", "", "secret")
    rows = table_of(ins(1, "a", seq=1), ins(2, "b", seq=1, table=other), upd(1, "c", seq=2))
    kept, out = split_excluded(rows, Router(routing=Routing(exclude=(r"db\.secret",))))
    assert kept["table"].to_pylist() == ["items", "items"]
    assert out["table"].to_pylist() == ["secret"]
    assert [t for t, _ in by_target(rows, Router(routing=Routing(exclude=(r"db\.secret",))))] == [
        "db.items"
    ]


# ---------------------------------------------------------------- applied


def test_excluded_tables_are_skipped_on_purpose_never_dead_letters(tmp_path):
    other = SourceTable("test", "db", "", "secret")
    wh, applier = _applier(tmp_path, Routing(exclude=(r"db\.secret",)))
    report = applier.apply(
        table_of(ins(1, "a", seq=1), ins(2, "b", seq=1, table=other), dele(2, seq=2, table=other))
    )
    assert report.skipped[SkipReason.TABLE_EXCLUDED] == 2
    assert not report.dead_letters
    assert wh.mirrors() == ["db.items"]
    changelog = wh.read("changelog", system=True)
    assert changelog["table"].to_pylist() == ["items"]  # the left-out table never lands
    batches = wh.read("batches", system=True)
    assert batches["records"].to_pylist() == [3]


def test_sixteen_shards_merge_into_one_target_with_the_shard_named(tmp_path):
    wh, applier = _applier(tmp_path, SHARDS)
    events = [
        ins(100 * n + i, f"s{n}-{i}", seq=n * 10 + i, table=_shard(n))
        for n in range(16)
        for i in range(3)
    ]
    events.append(upd(0, "s0-0 changed", seq=500, table=_shard(0)))
    events.append(dele(1501, seq=501, table=_shard(15)))
    report = applier.apply(table_of(*events))
    assert not report.dead_letters
    assert wh.mirrors() == ["shop.orders"]
    rows = _by_id(wh, "shop.orders")
    assert len(rows) == 16 * 3 - 1
    assert rows[0] == {"id": 0, "name": "s0-0 changed", "qty": 1, "_shard": "shop.orders_0"}
    assert rows[1502]["_shard"] == "shop.orders_15"
    assert 1501 not in rows


def test_a_key_two_shards_hold_is_a_dead_letter_and_the_owner_keeps_its_row(tmp_path):
    wh, applier = _applier(tmp_path, SHARDS)
    applier.apply(table_of(ins(1, "from 0", seq=1, table=_shard(0))))
    # a later batch: shard 1 inserts, updates and deletes the key shard 0 holds
    report = applier.apply(
        table_of(
            ins(1, "from 1", seq=2, table=_shard(1)),
            upd(1, "from 1 again", seq=3, table=_shard(1)),
            dele(1, seq=4, table=_shard(1)),
            ins(2, "fine", seq=5, table=_shard(1)),
        )
    )
    assert report.dead_letters[Code.SHARD_KEY_COLLISION] == 3
    rows = _by_id(wh, "shop.orders")
    assert rows[1] == {"id": 1, "name": "from 0", "qty": 1, "_shard": "shop.orders_0"}
    assert rows[2]["_shard"] == "shop.orders_1"
    letters = wh.read("dead_letters", system=True)
    assert set(letters["code"].to_pylist()) == {Code.SHARD_KEY_COLLISION}
    assert set(letters["target_table"].to_pylist()) == {"shop.orders"}
    assert "belongs to shard shop.orders_0" in letters["message"][0].as_py()
    # within one batch: the first shard to take a key owns it
    report = applier.apply(
        table_of(ins(7, "a", seq=6, table=_shard(2)), ins(7, "b", seq=7, table=_shard(3)))
    )
    assert report.dead_letters[Code.SHARD_KEY_COLLISION] == 1
    assert _by_id(wh, "shop.orders")[7]["_shard"] == "shop.orders_2"


def test_a_refused_change_that_declared_its_shard_s_columns_leaves_the_declaration(tmp_path):
    # a batch states a shard's declaration on its first event only: when that event is
    # refused, the shard's next one still lands with the columns it declared
    wh, applier = _applier(tmp_path, SHARDS)
    applier.apply(table_of(ins(1, "a", seq=1, table=_shard(0))))
    wider = {**COLUMNS, "note": "string"}
    report = applier.apply(
        table_of(
            ev(Op.INSERT, 1, after={"id": 1, "name": "b", "qty": 1, "note": "x"}, seq=2,
               columns=wider, table=_shard(1)),
            ev(Op.INSERT, 2, after={"id": 2, "name": "c", "qty": 1, "note": "y"}, seq=3,
               columns=wider, table=_shard(1)),
        )
    )  # fmt: skip
    assert report.dead_letters == {Code.SHARD_KEY_COLLISION: 1}
    rows = _by_id(wh, "shop.orders")
    assert rows[1] == {"id": 1, "name": "a", "qty": 1, "note": None, "_shard": "shop.orders_0"}
    assert rows[2] == {"id": 2, "name": "c", "qty": 1, "note": "y", "_shard": "shop.orders_1"}


def test_a_key_one_shard_deleted_may_be_taken_by_another(tmp_path):
    wh, applier = _applier(tmp_path, SHARDS)
    applier.apply(table_of(ins(1, "a", seq=1, table=_shard(0))))
    report = applier.apply(
        table_of(dele(1, seq=2, table=_shard(0)), ins(1, "moved", seq=3, table=_shard(5)))
    )
    assert not report.dead_letters
    assert _by_id(wh, "shop.orders")[1]["_shard"] == "shop.orders_5"
    # and across batches
    applier.apply(table_of(dele(1, seq=4, table=_shard(5))))
    report = applier.apply(table_of(ins(1, "back", seq=5, table=_shard(0))))
    assert not report.dead_letters
    assert _by_id(wh, "shop.orders")[1] == {
        "id": 1,
        "name": "back",
        "qty": 1,
        "_shard": "shop.orders_0",
    }

"""Which source a topic belongs to (``cdcflow.source.subscription``): the pipeline's one query
reads every source's topics, decodes each in its source's format and splits the events
by source for each source's applier (decision 53)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from cdcflow.decode.batches import DecodeFunction
from cdcflow.errors import ConfigError
from cdcflow.event_schema import EVENT_SCHEMA
from cdcflow.source.kafka.schema import ARROW_SCHEMA
from cdcflow.source.subscription import DecodeByTopic, SourceTopics, Subscription


def _route(name: str, fmt: str, topics=(), pattern=None) -> SourceTopics:
    return SourceTopics(name, tuple(topics), pattern, DecodeFunction(fmt))


def test_each_topic_belongs_to_the_source_that_names_or_matches_it():
    routing = Subscription(
        [_route("pg", "debezium-json", ["pg.orders"]), _route("mysql", "canal-json", (), r"my\..*")]
    )
    assert routing.source_of("pg.orders") == "pg"
    assert routing.source_of("my.orders") == "mysql"
    assert routing.source_of("other") is None
    assert routing.source_of("__consumer_offsets") is None  # internal, as Kafka's own
    assert routing.subscription() == {"subscribePattern": r"pg\.orders|(?:my\..*)"}
    assert Subscription([_route("a", "maxwell-json", ["x", "y"])]).subscription() == {
        "subscribe": "x,y"
    }


def test_a_topic_of_two_sources_is_a_configuration_error():
    with pytest.raises(ConfigError, match="both name topic 't'"):
        Subscription([_route("a", "debezium-json", ["t"]), _route("b", "canal-json", ["t"])])
    overlapping = Subscription(
        [_route("a", "debezium-json", (), "shop.*"), _route("b", "canal-json", (), ".*orders")]
    )
    assert overlapping.source_of("shop.customers") == "a"
    with pytest.raises(ConfigError, match="'shop.orders' is one of sources 'a' and 'b'"):
        overlapping.source_of("shop.orders")


def _events(topics: list[str]) -> pa.Table:
    n = len(topics)
    columns = {f.name: pa.nulls(n, f.type) for f in EVENT_SCHEMA}
    columns["kind"] = pa.array(["event"] * n)
    columns["topic"] = pa.array(topics)
    columns["offset"] = pa.array(range(n), pa.int64())
    return pa.table(columns, schema=EVENT_SCHEMA)


def test_a_micro_batch_splits_by_source_in_order_and_rejects_a_stray_topic():
    routing = Subscription(
        [_route("a", "debezium-json", ["t1", "t3"]), _route("b", "canal-json", ["t2"])]
    )
    parts = routing.split(_events(["t1", "t2", "t3", "t1", "t2"]))
    assert list(parts) == ["a", "b"]
    assert parts["a"]["offset"].to_pylist() == [0, 2, 3]  # the source's rows in batch order
    assert parts["b"]["offset"].to_pylist() == [1, 4]
    assert routing.split(_events([])) == {}
    with pytest.raises(ConfigError, match="'t9' was read but belongs to no source"):
        routing.split(_events(["t1", "t9"]))


def test_routes_travel_as_json_without_storage_options():
    route = SourceTopics(
        "pg",
        ("t",),
        None,
        DecodeFunction(
            "debezium-json", {"key_columns": {}}, "wh/_cdcflow/decoder_state", "p.pg", {"k": "s"}
        ),
    )
    data = orjson.loads(orjson.dumps(route.as_json()))
    assert "storage_options" not in data
    back = SourceTopics.from_json(data)
    assert (back.name, back.topics, back.decode.format_name) == ("pg", ("t",), "debezium-json")
    assert (back.decode.state_path, back.decode.state_key) == ("wh/_cdcflow/decoder_state", "p.pg")


def _kafka_batch(rows: list[tuple[str, int, bytes]]) -> pa.RecordBatch:
    n = len(rows)
    return pa.RecordBatch.from_pydict(
        {
            "key": [None] * n,
            "value": [v for _, _, v in rows],
            "topic": [t for t, _, _ in rows],
            "partition": [0] * n,
            "offset": [o for _, o, _ in rows],
            "timestamp": [dt.datetime(2026, 11, 27, tzinfo=dt.UTC)] * n,
            "timestampType": [0] * n,
            "headers": [[] for _ in rows],
        },
        schema=ARROW_SCHEMA,
    )


CASES = Path(__file__).parents[1] / "formats" / "cases"
#: a Maxwell insert and a Canal insert, from the vendors' test data (see each folder's
#: SOURCES.md): Apache Paimon's test resources
MAXWELL = (
    (CASES / "maxwell-json" / "paimon-schemaevolution-data-1.input.jsonl")
    .read_bytes()
    .splitlines()[0]
)
CANAL = (CASES / "canal-json" / "paimon-event-insert.input.jsonl").read_bytes().splitlines()[0]


def test_routed_decode_decodes_each_topic_in_its_sources_format():
    """Spark's JVM Kafka source hands raw records to ``mapInArrow``: each topic's rows are
    decoded by its source's format, so the same bytes are an event for one source and
    a dead letter for the other."""
    routing = Subscription([_route("mw", "maxwell-json", ["m"]), _route("cn", "canal-json", ["c"])])
    batch = _kafka_batch([("m", 0, MAXWELL), ("c", 0, CANAL), ("c", 1, MAXWELL)])
    out = pa.Table.from_batches(list(DecodeByTopic(routing)([batch])), schema=EVENT_SCHEMA)
    rows = sorted(
        zip(
            out["topic"].to_pylist(),
            out["offset"].to_pylist(),
            out["kind"].to_pylist(),
            strict=True,
        ),
    )
    assert rows == [("c", 0, "event"), ("c", 1, "dead"), ("m", 0, "event")]
    assert set(out.filter(pa.compute.equal(out["kind"], "event"))["format"].to_pylist()) == {
        "maxwell-json",
        "canal-json",
    }

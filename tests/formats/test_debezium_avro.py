"""debezium-avro: the Confluent wire format, schemas from a real schema registry
(Apicurio Registry, started from the test kit), and the same events as debezium-json.

The writer schemas are the ones Debezium registered in a real capture
(``cases/debezium-avro/SOURCES.md``); the messages are written with them by fastavro. The
end-to-end proof -- Debezium itself writing the messages -- is in ``tests/capture``."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
from pathlib import Path

import pytest
from fastavro import parse_schema, schemaless_writer

from cdcflow.errors import Code, ConfigError, DecodeError, SourceError
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.formats.debezium.avro_decoder import connect_schema
from cdcflow.formats.schema_registry import REGISTRY_UNAVAILABLE, split_wire
from cdcflow.model import Op, Origin

CASE = json.loads(
    (Path(__file__).parent / "cases" / "debezium-avro" / "pg-customers-schemas.json").read_text()
)


# --------------------------------------------------------------------------- no registry


def test_connect_schema_reads_back_what_kafka_connect_wrote():
    named: dict = {}
    connect_schema(CASE["source"]["schema"], named)
    envelope = connect_schema(CASE["envelope"]["schema"], named)
    fields = {f["field"]: f for f in envelope["fields"]}
    assert list(fields) == [
        "before",
        "after",
        "source",
        "transaction",
        "op",
        "ts_ms",
        "ts_us",
        "ts_ns",
    ]
    assert fields["before"]["optional"] and fields["after"]["optional"]
    assert fields["source"]["name"] == "io.debezium.connector.postgresql.Source"
    row = {f["field"]: f for f in fields["after"]["fields"]}
    assert fields["before"]["fields"] == fields["after"]["fields"]  # "Value" by reference
    assert (row["id"]["type"], row["id"]["optional"]) == ("int64", False)
    assert (row["small"]["type"], row["ratio"]["type"]) == ("int16", "float32")
    assert row["balance"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert row["balance"]["parameters"] == {"scale": "2", "connect.decimal.precision": "12"}
    assert row["created_at"]["name"] == "io.debezium.time.MicroTimestamp"
    assert row["tags"]["type"] == "array" and row["tags"]["items"]["type"] == "string"


def test_connect_schema_without_connect_names_uses_avro_logical_types():
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {
                "name": "d",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3},
            },
            {"name": "t", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        ],
    }
    d, t = connect_schema(schema)["fields"]
    assert d["name"] == "org.apache.kafka.connect.data.Decimal"
    assert d["parameters"] == {"scale": "3", "connect.decimal.precision": "9"}
    assert (t["name"], t["optional"]) == ("io.debezium.time.MicroTimestamp", True)


def test_a_union_of_two_types_is_bad_avro():
    with pytest.raises(DecodeError) as err:
        connect_schema(
            {"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}
        )
    assert err.value.code == Code.BAD_AVRO


@pytest.mark.parametrize(
    "value", [b"", b"\x00\x00\x01", b"\x01\x00\x00\x00\x01\x02", b'{"op":"c"}']
)
def test_split_wire_refuses_what_is_not_the_wire_format(value):
    with pytest.raises(DecodeError) as err:
        split_wire(value)
    assert err.value.code == Code.BAD_AVRO


def test_split_wire():
    schema_id, body = split_wire(b"\x00\x00\x00\x01\x02abc")
    assert (schema_id, bytes(body)) == (258, b"abc")


def test_registry_url_is_required_and_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match=r"sources\[\]\.options\.schema_registry\.url"):
        decoder_for("debezium-avro", {})
    with pytest.raises(ConfigError, match="schema_registry"):
        decoder_for("debezium-avro", {"schema_registry": {"url": "http://x", "no.such.key": 1}})


# --------------------------------------------------------------------------- real registry


@pytest.fixture(scope="module")
def registry():
    from cdcflow_testkit.services.apicurio import ApicurioRegistry

    with ApicurioRegistry() as r:
        yield r


@pytest.fixture(scope="module")
def ids(registry):
    """The case's schemas registered as Debezium registered them: Source on its own, the
    Envelope referring to it, the Key."""
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry.ccompat_url})
    source = "io.debezium.connector.postgresql.Source"
    out = {
        "source": client.register_schema(
            source, Schema(json.dumps(CASE["source"]["schema"]), "AVRO")
        )
    }
    ref = SchemaReference(source, source, 1)
    envelope = Schema(json.dumps(CASE["envelope"]["schema"]), "AVRO", [ref])
    out["envelope"] = client.register_schema("t.public.customers-value", envelope)
    out["key"] = client.register_schema(
        "t.public.customers-key", Schema(json.dumps(CASE["key"]["schema"]), "AVRO")
    )
    return out


def _writer(name: str):
    named: dict = {}
    parse_schema(CASE["source"]["schema"], named_schemas=named)
    return parse_schema(CASE[name]["schema"], named_schemas=named)


def _wire(schema_id: int, name: str, datum: dict) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, _writer(name), datum)
    return b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()


def _row(i: int, **changes) -> dict:
    row = {
        "id": i,
        "name": f"n{i}",
        "email": None,
        "balance": decimal.Decimal("-12.34"),
        "score": 1.5,
        "ratio": 0.25,
        "visits": 7,
        "small": -3,
        "active": True,
        "born": dt.date(1999, 12, 31),
        "wake": 3_600_000_001,
        "created_at": 1_600_000_000_123_456,
        "updated_at": "2021-06-01T10:00:00.5Z",
        "avatar": b"\x00\xff",
        "doc": '{"a": 1}',
        "uid": "7d44b4a4-3b0a-4a4c-9d2e-51b0c1a3e0f1",
        "feeling": "ok",
        "tags": ["x", "y"],
        "notes": None,
    }
    return {**row, **changes}


def _source(lsn: int) -> dict:
    return {
        "version": "3.6.1.Final",
        "connector": "postgresql",
        "name": "t",
        "ts_ms": 1_700_000_000_000,
        "snapshot": "false",
        "db": "shop",
        "sequence": f'["{lsn - 8}","{lsn}"]',
        "ts_us": None,
        "ts_ns": None,
        "schema": "public",
        "table": "customers",
        "txId": 771,
        "lsn": lsn,
        "xmin": None,
        "origin": None,
        "origin_lsn": None,
    }


def _envelope(op: str, before, after, lsn: int) -> dict:
    return {
        "before": before,
        "after": after,
        "source": _source(lsn),
        "transaction": None,
        "op": op,
        "ts_ms": 1_700_000_000_100,
        "ts_us": None,
        "ts_ns": None,
    }


def _as_json(value):
    """The JsonConverter form of an Avro datum: bytes as base64, a decimal as the base64
    of its unscaled two's-complement bytes, a date as days since 1970-01-01."""
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, decimal.Decimal):
        unscaled = int(value.scaleb(2))
        return base64.b64encode(
            unscaled.to_bytes(8, "big", signed=True).lstrip(b"\xff") or b"\xff"
        ).decode()
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    return value


def _debezium_json_schema() -> dict:
    """The Connect schema Debezium itself wrote with ``JsonConverter`` for the same table
    (the capture kept in tests/capture/golden), not one made from the Avro schema by
    :func:`connect_schema`: the JSON side's types are then the real tool's, and a wrong
    reading of the Avro schema shows as a difference."""
    golden = Path(__file__).parents[1] / "capture" / "golden" / "debezium-postgres-pg_schemas"
    with (golden / "messages.jsonl").open() as lines:
        for line in lines:
            message = json.loads(line)
            if message["topic"].endswith(".public.customers") and message["value"]:
                return json.loads(message["value"])["schema"]
    raise AssertionError("no customers message in the PostgreSQL capture")


def _json_message(envelope: dict) -> bytes:
    schema = _debezium_json_schema()
    return json.dumps({"schema": schema, "payload": _as_json(envelope)}).encode()


def _avro_datum(envelope: dict) -> dict:
    """fastavro writes the encoded values (the decoder reads them without logical types):
    a decimal as its unscaled bytes, a date as days."""

    def enc(row):
        if row is None:
            return None
        out = dict(row)
        d = out["balance"]
        out["balance"] = None if d is None else int(d.scaleb(2)).to_bytes(8, "big", signed=True)
        out["born"] = (out["born"] - dt.date(1970, 1, 1)).days
        return out

    return {**envelope, "before": enc(envelope["before"]), "after": enc(envelope["after"])}


def _record(value: bytes | None, key: bytes | None, offset: int) -> Record:
    return Record(
        value=value, key=key, headers=None, origin=Origin("t.public.customers", 0, offset)
    )


CHANGES = [
    _envelope("c", None, _row(1), 100),
    _envelope(
        "u", _row(1), _row(1, name="renamed", balance=decimal.Decimal("99999999.99"), tags=[]), 200
    ),
    _envelope("d", _row(1, name="renamed"), None, 300),
]


@pytest.mark.slow
@pytest.mark.services
def test_avro_events_equal_the_same_changes_in_debezium_json(registry, ids):
    avro = decoder_for("debezium-avro", {"schema_registry": {"url": registry.ccompat_url}})
    as_json = decoder_for("debezium-json", {"schema_include": True})
    for offset, envelope in enumerate(CHANGES):
        key = {"id": 1}
        a = avro.decode(
            _record(
                _wire(ids["envelope"], "envelope", _avro_datum(envelope)),
                _wire(ids["key"], "key", key),
                offset,
            )
        )
        j = as_json.decode(_record(_json_message(envelope), json.dumps(key).encode(), offset))
        assert len(a) == len(j) == 1
        got, want = a[0], j[0]
        assert got.op == want.op and got.op in (Op.INSERT, Op.UPDATE, Op.DELETE)
        assert (got.before, got.after, got.key) == (want.before, want.after, want.key)
        assert (got.columns, got.seq, got.ts_ms, got.source) == (
            want.columns,
            want.seq,
            want.ts_ms,
            want.source,
        )
    assert got.key == {"id": 1} and got.before["balance"] == decimal.Decimal("-12.34")


@pytest.mark.slow
@pytest.mark.services
def test_what_the_registry_cannot_explain_is_a_dead_letter(registry, ids):
    avro = decoder_for("debezium-avro", {"schema_registry": {"url": registry.ccompat_url}})
    good = _wire(ids["envelope"], "envelope", _avro_datum(CHANGES[0]))
    records = [
        _record(b"\x00" + (987_654).to_bytes(4, "big") + good[5:], None, 0),  # unknown id
        _record(good[:20], None, 1),  # cut short
        _record(b'{"op":"c"}', None, 2),  # JSON, not the wire format
        _record(good, _wire(ids["key"], "key", {"id": 1}), 3),  # the stream goes on
        _record(None, None, 4),  # tombstone
    ]
    result = avro.decode_batch(records)
    assert [d.code for d in result.dead_letters] == [
        Code.UNKNOWN_SCHEMA_ID,
        Code.BAD_AVRO,
        Code.BAD_AVRO,
    ]
    assert "987654" in result.dead_letters[0].message
    assert [e.op for e in result.events] == [Op.INSERT]
    assert [s.reason for s in result.skipped] == ["TOMBSTONE"]


def test_a_registry_that_does_not_answer_fails_the_batch():
    avro = decoder_for(
        "debezium-avro", {"schema_registry": {"url": "http://127.0.0.1:9", "max.retries": 0}}
    )
    record = _record(b"\x00\x00\x00\x00\x01\x02", None, 0)
    with pytest.raises(SourceError) as err:
        avro.decode_batch([record])
    assert err.value.code == REGISTRY_UNAVAILABLE

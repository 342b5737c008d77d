"""The source-database oracle made real: Debezium's PostgreSQL connector (Kafka Connect
standalone, ``pgoutput``) captures a workload on a real PostgreSQL 15 into Apache Kafka;
``cdcflow run --once`` mirrors the topics into Delta; every mirror is compared with
``SELECT *`` from the database, value by value and type by type.

The workload covers inserts, updates, deletes, a primary-key change, a TRUNCATE, an
``ALTER TABLE ... ADD COLUMN``, NULLs, a TOASTed text that later updates leave unchanged
(Debezium then writes its unavailable-value placeholder), and the common column types:
bigint, integer, smallint, numeric, double precision, real, boolean, text, varchar, date,
time, timestamp, timestamptz, bytea, jsonb, uuid, an enum and text[].

With ``JsonConverter``'s schemas (Kafka Connect's default) the mirror's columns take the
types the schema declares. Without them (``schemas.enable=false``) the JSON values alone
are left: the connector is set as Debezium documents for schemaless consumers
(``decimal.handling.mode=string``), and each mirror value is compared with the value
Debezium publishes for it (a date as days since 1970-01-01, a timestamp as microseconds).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
import string
import uuid

import pytest
from tests.capture.helpers import (
    GOLDEN,
    TYPED,
    compare,
    database_rows,
    expected_schemaless,
    expected_typed,
    mirror_rows,
    postgres_connector,
    run_cdcflow,
    save_capture,
    wait_captured,
    wait_snapshot_done,
)

from cdcflow_testkit.services.kafka_connect import (
    CONNECT_VERSION,
    DEBEZIUM_VERSION,
    ConnectStandalone,
)
from cdcflow_testkit.services.postgres import LocalPostgres

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

#: Debezium's ``topic.prefix`` of each run (its topics are ``<prefix>.public.<table>``)
PREFIXES = {True: "pg_schemas", False: "pg_schemaless"}
SCHEMA_SQL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE customers (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    email varchar(200),
    balance numeric(12, 2),
    score double precision,
    ratio real,
    visits integer,
    small smallint,
    active boolean,
    born date,
    wake time,
    created_at timestamp,
    updated_at timestamptz,
    avatar bytea,
    doc jsonb,
    uid uuid,
    feeling mood,
    tags text[],
    notes text
);
CREATE TABLE order_lines (
    order_id integer,
    line_no integer,
    sku text,
    qty integer,
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE sentinel (id integer PRIMARY KEY);
"""


def _big_text(seed: int) -> str:
    """About 9 KB of incompressible text: stored out of line (TOAST)."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(9000))


def _workload(pg: LocalPostgres) -> None:
    """Changes after the connector's snapshot: every kind of row change and DDL."""
    rng = random.Random(7)
    with pg.connect() as c:
        for i in range(3, 40):
            c.execute(
                "INSERT INTO customers VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s, %s, %s, %s, %s)",
                (
                    i,
                    f"name {i} ünïcødé" if i % 7 == 0 else f"name {i}",
                    None if i % 5 == 0 else f"c{i}@example.com",
                    None if i % 6 == 0 else decimal.Decimal(rng.randint(-(10**9), 10**9)) / 100,
                    None if i % 4 == 0 else rng.uniform(-1e6, 1e6),
                    rng.uniform(0, 1) if i % 3 else None,
                    rng.randint(-(2**31), 2**31 - 1),
                    rng.randint(-(2**15), 2**15 - 1),
                    None if i % 9 == 0 else bool(i % 2),
                    dt.date(1950, 1, 1) + dt.timedelta(days=rng.randint(0, 30000)),
                    dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), i * 1000),
                    dt.datetime(2020, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 10**14)),
                    dt.datetime(2021, 6, 1, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))
                    + dt.timedelta(microseconds=rng.randint(0, 10**14)),
                    bytes(rng.randrange(256) for _ in range(i)),
                    json.dumps({"n": i, "tags": ["a", "b"], "nested": {"x": None}}),
                    uuid.UUID(int=rng.getrandbits(128)),
                    ["sad", "ok", "happy"][i % 3],
                    [f"t{i}", "x,y", 'q"uote'] if i % 2 else [],
                    _big_text(i) if i % 10 == 0 else f"short {i}",
                ),
            )
        c.execute(
            "UPDATE customers SET balance = balance + 1.01, visits = visits / 2 WHERE id < 20"
        )
        # the TOASTed notes are unchanged by these updates: Debezium writes its placeholder
        c.execute("UPDATE customers SET name = name || ' (toast kept)' WHERE id IN (10, 20, 30)")
        c.execute("UPDATE customers SET email = NULL, doc = NULL WHERE id % 8 = 0")
        c.execute("DELETE FROM customers WHERE id IN (4, 11)")
        c.execute("UPDATE customers SET id = 1000 WHERE id = 12")  # primary-key change
        c.execute("ALTER TABLE customers ADD COLUMN tier integer")
        c.execute("UPDATE customers SET tier = id % 3 WHERE id > 30")
        c.execute("INSERT INTO customers (id, name, tier) VALUES (2000, 'after alter', 9)")
        for o in range(1, 6):
            for line in range(1, 4):
                c.execute(
                    "INSERT INTO order_lines VALUES (%s, %s, %s, %s)",
                    (o, line, f"sku-{o}-{line}", o * line),
                )
        c.execute("TRUNCATE order_lines")
        c.execute("INSERT INTO order_lines VALUES (7, 1, 'after truncate', 1)")
        c.execute("UPDATE order_lines SET line_no = 2 WHERE order_id = 7")  # key change
        with c.transaction():  # one transaction over two tables
            c.execute("INSERT INTO order_lines VALUES (8, 1, 'in txn', 5)")
            c.execute("UPDATE customers SET visits = 0 WHERE id = 3")
        c.execute("INSERT INTO sentinel VALUES (1)")


def _snapshot_rows(pg: LocalPostgres) -> None:
    """Rows that exist before the connector starts (its snapshot reads them: op ``r``)."""
    with pg.connect() as c:
        c.execute(SCHEMA_SQL)
        c.execute(
            "INSERT INTO customers (id, name, balance, born, notes) VALUES "
            "(1, 'snap one', 1.50, '1999-12-31', %s), (2, 'snap two', NULL, NULL, NULL)",
            (_big_text(1),),
        )
        c.execute("ALTER TABLE order_lines REPLICA IDENTITY FULL")


@pytest.mark.parametrize("schemas", [True, False], ids=["with-schemas", "schemaless"])
def test_debezium_on_postgresql_mirrors_equal_the_database(spark, apache_kafka, tmp_path, schemas):
    slot = f"cdcflow_{uuid.uuid4().hex[:8]}"
    extra = {} if schemas else {"decimal.handling.mode": "string"}
    prefix = PREFIXES[schemas]
    with LocalPostgres() as pg:
        _snapshot_rows(pg)
        connectors = {"pg-source": postgres_connector(pg, slot, prefix, **extra)}
        with ConnectStandalone(
            apache_kafka.bootstrap_servers, connectors, schemas=schemas
        ) as connect:
            wait_snapshot_done(apache_kafka, prefix, connect)
            _workload(pg)
            counts = wait_captured(apache_kafka, prefix, "public.sentinel", connect)
        pattern = rf"{prefix}\.public\..*"
        summary, wh = run_cdcflow(spark, apache_kafka, tmp_path, schemas, pattern)
        print(f"captured {counts}; {summary}")
        if os.environ.get("CDCFLOW_SAVE_CAPTURE") == "1":  # refresh the golden files
            tables = {
                "customers": (["id"], *database_rows(pg, "customers", "id")),
                "order_lines": (
                    ["order_id", "line_no"],
                    *database_rows(pg, "order_lines", "order_id, line_no"),
                ),
            }
            about = {
                "tool": f"Debezium {DEBEZIUM_VERSION} PostgresConnector (pgoutput) on Kafka "
                f"Connect {CONNECT_VERSION} standalone, JsonConverter schemas.enable={schemas}",
                "database": pg.version(),
                "connector": {k: v for k, v in connectors["pg-source"].items() if "port" not in k},
                "schemas": schemas,
            }
            save_capture(
                GOLDEN / f"debezium-postgres-{prefix}", apache_kafka, prefix, tables, about
            )

        db, _ = database_rows(pg, "customers", "id")
        got, schema = mirror_rows(wh, "shop.public.customers", ["id"])
        if schemas:
            for f in schema:
                assert f.type == TYPED[f.name], f"customers.{f.name}: {f.type} != {TYPED[f.name]}"
            problems = compare(db, got, expected_typed)
        else:
            problems = compare(db, got, expected_schemaless)
        assert problems == [], "\n".join(problems[:20])

        db, _ = database_rows(pg, "order_lines", "order_id, line_no")
        got, _ = mirror_rows(wh, "shop.public.order_lines", ["order_id", "line_no"])
        assert got == db


def test_debezium_avro_through_apicurio_mirrors_equal_the_database(spark, apache_kafka, tmp_path):
    """Debezium's most common production set-up: an Avro converter and a schema registry.
    Apicurio's ``AvroConverter`` registers each schema in Apicurio Registry and writes the
    Confluent wire format; ``debezium-avro`` fetches the schemas through the registry's
    Confluent-compatible API. Besides the mirrors (equal to the database, value by value
    and type by type, as with JSON and schemas), the run shows what a registry cannot
    answer: a schema id it does not know and a value outside the wire format are dead
    letters with their codes, and a registry that is down fails the run before anything
    is committed (a second run then applies everything)."""
    from confluent_kafka import Producer

    from cdcflow_testkit.services.apicurio import APICURIO_VERSION, ApicurioRegistry

    slot = f"cdcflow_{uuid.uuid4().hex[:8]}"
    prefix = "pg_avro"
    with ApicurioRegistry() as registry, LocalPostgres() as pg:
        _snapshot_rows(pg)
        connectors = {"pg-source": postgres_connector(pg, slot, prefix)}
        with ConnectStandalone(
            apache_kafka.bootstrap_servers, connectors, avro_registry_url=registry.registry_url
        ) as connect:
            wait_snapshot_done(apache_kafka, prefix, connect, marker=b"\x08last")
            _workload(pg)
            counts = wait_captured(apache_kafka, prefix, "public.sentinel", connect)
        subjects = registry.get("/apis/ccompat/v6/subjects")
        assert f"{prefix}.public.customers-value" in subjects, subjects

        # two records the registry cannot explain, in a topic of the same pattern
        garbage = f"{prefix}.public.garbage"
        apache_kafka.create_topic(garbage)
        unknown_id = b"\x00" + (999_999).to_bytes(4, "big") + b"\x02\x06abc"
        not_wire = b'{"op": "c"}'
        producer = Producer(apache_kafka.client_config())
        for value in (unknown_id, not_wire):
            producer.produce(garbage, value=value, key=b"k")
        producer.flush(10)

        pattern = rf"{prefix}\.public\..*"
        down = {
            "format": "debezium-avro",
            "options": {"schema_registry": {"url": "http://127.0.0.1:9"}},
        }
        with pytest.raises(Exception, match="REGISTRY_UNAVAILABLE"):
            run_cdcflow(spark, apache_kafka, tmp_path, True, pattern, source=down)
        wh_path = tmp_path / "wh"
        assert not (wh_path / "shop.public.customers").exists(), "a failed run committed a table"

        up = {
            "format": "debezium-avro",
            "options": {"schema_registry": {"url": registry.ccompat_url}},
        }
        summary, wh = run_cdcflow(spark, apache_kafka, tmp_path, True, pattern, source=up)
        print(f"Apicurio {APICURIO_VERSION}; captured {counts}; {summary}")

        db, _ = database_rows(pg, "customers", "id")
        got, schema = mirror_rows(wh, "shop.public.customers", ["id"])
        for f in schema:
            assert f.type == TYPED[f.name], f"customers.{f.name}: {f.type} != {TYPED[f.name]}"
        problems = compare(db, got, expected_typed)
        assert problems == [], "\n".join(problems[:20])
        db, _ = database_rows(pg, "order_lines", "order_id, line_no")
        got, _ = mirror_rows(wh, "shop.public.order_lines", ["order_id", "line_no"])
        assert got == db

        dead = wh.read("dead_letters", system=True).to_pylist()
        by_value = {d["raw_value"]: d for d in dead}
        assert by_value[unknown_id]["code"] == "UNKNOWN_SCHEMA_ID"
        assert by_value[not_wire]["code"] == "BAD_AVRO"
        assert {d["topic"] for d in dead} == {garbage}, dead

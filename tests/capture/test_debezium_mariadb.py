"""Debezium's MariaDB connector (Kafka Connect standalone, reading the row-based binlog)
captures a workload on a real MariaDB 10.11 into Apache Kafka; ``cdcflow run --once``
mirrors the topics; every mirror is compared with ``SELECT *``, value by value and, with
schemas, type by type.

The workload: a snapshot, inserts, updates, deletes, a primary-key change, a TRUNCATE, an
``ALTER TABLE ... ADD COLUMN``, NULLs, a transaction over two tables, and the common
MariaDB column types: BIGINT, INT, SMALLINT, TINYINT(1), DECIMAL, DOUBLE, FLOAT, VARCHAR,
TEXT, DATE, TIME(6), DATETIME(6), TIMESTAMP(6), BLOB, JSON, ENUM, SET.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import os
import random
import uuid

import pytest
from tests.capture.helpers import (
    GOLDEN,
    TYPED_MARIADB,
    compare,
    expected_schemaless,
    expected_typed,
    mirror_rows,
    run_cdcflow,
    save_capture,
    wait_captured,
    wait_snapshot_done,
)

from cdcflow_testkit.services.apicurio import ApicurioRegistry
from cdcflow_testkit.services.kafka_connect import (
    CONNECT_VERSION,
    DEBEZIUM_VERSIONS,
    ConnectStandalone,
)
from cdcflow_testkit.services.mariadb import LocalMariaDB

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

SCHEMA_SQL = [
    """CREATE TABLE customers (
        id BIGINT PRIMARY KEY,
        name VARCHAR(100) NOT NULL,
        visits INT,
        small SMALLINT,
        active TINYINT(1),
        balance DECIMAL(12, 2),
        score DOUBLE,
        ratio FLOAT,
        born DATE,
        wake TIME(6),
        created_at DATETIME(6),
        updated_at TIMESTAMP(6) NULL DEFAULT NULL,
        avatar BLOB,
        doc JSON,
        feeling ENUM('sad', 'ok', 'happy'),
        perms SET('read', 'write', 'admin'),
        notes TEXT
    )""",
    """CREATE TABLE order_lines (
        order_id INT,
        line_no INT,
        sku VARCHAR(40),
        qty INT,
        PRIMARY KEY (order_id, line_no)
    )""",
    "CREATE TABLE sentinel (id INT PRIMARY KEY)",
]


def _workload(db: LocalMariaDB) -> None:
    rng = random.Random(5)
    with db.connect() as c, c.cursor() as cur:
        for i in range(3, 30):
            cur.execute(
                "INSERT INTO customers VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s, %s, %s)",
                (
                    i,
                    f"name {i} ünïcødé" if i % 7 == 0 else f"name {i}",
                    rng.randint(-(2**31), 2**31 - 1),
                    rng.randint(-(2**15), 2**15 - 1),
                    None if i % 9 == 0 else i % 2,
                    None if i % 6 == 0 else decimal.Decimal(rng.randint(-(10**9), 10**9)) / 100,
                    None if i % 4 == 0 else rng.uniform(-1e6, 1e6),
                    rng.uniform(0, 1) if i % 3 else None,
                    dt.date(1950, 1, 1) + dt.timedelta(days=rng.randint(0, 30000)),
                    dt.timedelta(seconds=rng.randint(0, 86399), microseconds=i),
                    dt.datetime(2020, 1, 1) + dt.timedelta(microseconds=rng.randint(0, 10**14)),
                    dt.datetime(2021, 6, 1) + dt.timedelta(microseconds=rng.randint(0, 10**14)),
                    bytes(rng.randrange(256) for _ in range(i)),
                    json.dumps({"n": i, "tags": ["a", "b"]}),
                    ["sad", "ok", "happy"][i % 3],
                    ["read", "read,write", "", "admin,read"][i % 4],
                    None if i % 5 == 0 else f"notes {i}",
                ),
            )
        cur.execute(
            "UPDATE customers SET balance = balance + 1.01, visits = visits DIV 2 WHERE id < 20"
        )
        cur.execute("UPDATE customers SET doc = NULL, notes = NULL WHERE id % 8 = 0")
        cur.execute("DELETE FROM customers WHERE id IN (4, 11)")
        cur.execute("UPDATE customers SET id = 1000 WHERE id = 12")
        cur.execute("ALTER TABLE customers ADD COLUMN tier INT")
        cur.execute("UPDATE customers SET tier = id % 3 WHERE id > 20")
        cur.execute("INSERT INTO customers (id, name, tier) VALUES (2000, 'after alter', 9)")
        for o in range(1, 6):
            for line in range(1, 4):
                cur.execute(
                    "INSERT INTO order_lines VALUES (%s, %s, %s, %s)",
                    (o, line, f"sku-{o}-{line}", o * line),
                )
        cur.execute("TRUNCATE order_lines")
        cur.execute("INSERT INTO order_lines VALUES (7, 1, 'after truncate', 1)")
        cur.execute("UPDATE order_lines SET line_no = 2 WHERE order_id = 7")
        c.begin()
        cur.execute("INSERT INTO order_lines VALUES (8, 1, 'in txn', 5)")
        cur.execute("UPDATE customers SET visits = 0 WHERE id = 3")
        c.commit()
        cur.execute("INSERT INTO sentinel VALUES (1)")


def _snapshot_rows(db: LocalMariaDB) -> None:
    with db.connect() as c, c.cursor() as cur:
        for statement in SCHEMA_SQL:
            cur.execute(statement)
        cur.execute(
            "INSERT INTO customers (id, name, balance, born) VALUES "
            "(1, 'snap one', 1.50, '1999-12-31'), (2, 'snap two', NULL, NULL)"
        )


def _connector(db: LocalMariaDB, prefix: str, history: str, **extra: str) -> dict[str, str]:
    return {
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "tasks.max": "1",
        "database.hostname": db.host,
        "database.port": str(db.port),
        "database.user": db.user,
        "database.password": db.password,
        "database.server.id": str(random.Random().randint(1000, 9999)),
        "database.include.list": db.database,
        "database.ssl.mode": "disable",
        "topic.prefix": prefix,
        "include.schema.changes": "false",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": history,
        "skipped.operations": "none",
        **extra,
    }


def mariadb_rows(
    db: LocalMariaDB, table: str, key: str, exact: tuple[str, ...] = ()
) -> tuple[list[dict], dict[str, str]]:
    """``SELECT *`` ordered by ``key``, with PyMySQL's values made the ones the mirror
    stands for: a TIME (a ``timedelta``) as a time of day, a TIMESTAMP (UTC, the session's
    zone) as an aware datetime; the ``exact`` FLOAT columns read as
    ``CAST(... AS DOUBLE)`` (the text protocol prints a FLOAT with 6 significant digits,
    the binlog and the mirror have the float32 itself). Also each column's ``DATA_TYPE``."""
    with db.connect() as c, c.cursor() as cur:
        extra = "".join(f", CAST({col} AS DOUBLE) AS `{col}:exact`" for col in exact)
        cur.execute(f"SELECT *{extra} FROM {table} ORDER BY {key}")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        cur.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (db.database, table),
        )
        types = {name: kind for name, kind in cur.fetchall()}
    for row in rows:
        for col in exact:
            row[col] = row.pop(f"{col}:exact")
        for col, kind in types.items():
            value = row[col]
            if value is None:
                continue
            if kind == "time":
                row[col] = (dt.datetime.min + value).time()
            elif kind == "timestamp":
                row[col] = value.replace(tzinfo=dt.UTC)
    return rows, types


@pytest.mark.parametrize(
    ("schemas", "avro"),
    [(True, False), (False, False), (True, True)],
    ids=["with-schemas", "schemaless", "avro-apicurio"],
)
def test_debezium_on_mariadb_mirrors_equal_the_database(
    spark, apache_kafka, tmp_path, schemas, avro
):
    """``avro``: Apicurio's AvroConverter through Apicurio Registry, read as
    ``debezium-avro`` (see the PostgreSQL module's Avro test)."""
    prefix = f"maria_{uuid.uuid4().hex[:6]}"
    extra = {} if schemas else {"decimal.handling.mode": "string"}
    with contextlib.ExitStack() as stack:
        registry = stack.enter_context(ApicurioRegistry()) if avro else None
        db = stack.enter_context(LocalMariaDB())
        _snapshot_rows(db)
        connectors = {
            "maria-source": _connector(db, prefix, str(tmp_path / "history.dat"), **extra)
        }
        with ConnectStandalone(
            apache_kafka.bootstrap_servers,
            connectors,
            schemas=schemas,
            connector="mariadb",
            avro_registry_url=registry.registry_url if registry else None,
        ) as connect:
            marker = b"\x08last" if avro else b'"snapshot":"last"'
            wait_snapshot_done(apache_kafka, prefix, connect, marker=marker)
            _workload(db)
            counts = wait_captured(apache_kafka, prefix, "shop.sentinel", connect)
        pattern = rf"{prefix}\.shop\..*"
        source = None
        if registry is not None:
            registry_options = {"schema_registry": {"url": registry.ccompat_url}}
            source = {"format": "debezium-avro", "options": registry_options}
        summary, wh = run_cdcflow(spark, apache_kafka, tmp_path, schemas, pattern, source)
        print(f"captured {counts}; {summary}")
        report = summary.reports["debezium-avro" if avro else "debezium-json"]
        assert not any(b.dead_letters for b in report), report
        assert sum(b.events for b in report) > 0

        customers = mariadb_rows(db, "customers", "id", exact=("ratio",))
        lines = mariadb_rows(db, "order_lines", "order_id, line_no")
        if os.environ.get("CDCFLOW_SAVE_CAPTURE") == "1" and not avro:  # refresh the golden files
            about = {
                "tool": f"Debezium {DEBEZIUM_VERSIONS['mariadb']} MariaDbConnector on Kafka "
                f"Connect {CONNECT_VERSION} standalone, JsonConverter schemas.enable={schemas}",
                "database": f"MariaDB {db.version()}",
                "source": "mariadb",
                "connector": {
                    k: v
                    for k, v in connectors["maria-source"].items()
                    if "port" not in k and "filename" not in k
                },
                "schemas": schemas,
            }
            tables = {
                "customers": (["id"], *customers),
                "order_lines": (["order_id", "line_no"], *lines),
            }
            name = "debezium-mariadb" if schemas else "debezium-mariadb-schemaless"
            save_capture(GOLDEN / name, apache_kafka, prefix, tables, about)

        got, schema = mirror_rows(wh, "shop.customers", ["id"])
        if schemas:
            assert {f.name: f.type for f in schema} == {c: TYPED_MARIADB[c] for c in customers[1]}
        problems = compare(customers[0], got, expected_typed if schemas else expected_schemaless)
        assert problems == [], "\n".join(problems[:20])
        got, _ = mirror_rows(wh, "shop.order_lines", ["order_id", "line_no"])
        assert got == lines[0]

"""What the verify tests share: a real database holding a golden capture's final state,
and a mirror made from that capture's messages by cdcflow's own decode and apply.

The golden captures (``tests/capture/golden/<capture>/``) are what Debezium published for
a real PostgreSQL 15 and a real MariaDB 10.11 (messages.jsonl) and the rows those
databases held at the end (database.json); the capture tests check that the mirrors equal
those rows. Here the rows go back into a fresh database of the same schema, so that
``cdcflow verify`` compares a mirror written from a real capture with a real database,
without running Kafka Connect again.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from tests.capture.helpers import GOLDEN, load_capture

from cdcflow.config import parse_config
from cdcflow.decode.batches import decode_records
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Origin
from cdcflow.runtime.pipeline import applier_for
from cdcflow.sinks.warehouse import DeltaWarehouse

#: the capture tests' schemas, at the end of their workloads (``tier`` added by ALTER)
POSTGRES_SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE customers (
    id bigint PRIMARY KEY, name text NOT NULL, email varchar(200), balance numeric(12, 2),
    score double precision, ratio real, visits integer, small smallint, active boolean,
    born date, wake time, created_at timestamp, updated_at timestamptz, avatar bytea,
    doc jsonb, uid uuid, feeling mood, tags text[], notes text, tier integer
);
CREATE TABLE order_lines (
    order_id integer, line_no integer, sku text, qty integer, PRIMARY KEY (order_id, line_no)
);
"""
MARIADB_SCHEMA = [
    """CREATE TABLE customers (
        id BIGINT PRIMARY KEY, name VARCHAR(100) NOT NULL, visits INT, small SMALLINT,
        active TINYINT(1), balance DECIMAL(12, 2), score DOUBLE, ratio FLOAT, born DATE,
        wake TIME(6), created_at DATETIME(6), updated_at TIMESTAMP(6) NULL DEFAULT NULL,
        avatar BLOB, doc JSON, feeling ENUM('sad', 'ok', 'happy'),
        perms SET('read', 'write', 'admin'), notes TEXT, tier INT
    )""",
    """CREATE TABLE order_lines (
        order_id INT, line_no INT, sku VARCHAR(40), qty INT, PRIMARY KEY (order_id, line_no)
    )""",
]


def golden_state(capture: str) -> tuple[list[dict], dict[str, Any]]:
    """The capture's messages and final database state (:func:`load_capture`)."""
    return load_capture(GOLDEN / capture)


def fill_postgres(pg: Any, state: dict[str, Any]) -> None:
    """Create the capture's tables in ``pg`` and insert their final rows."""
    from psycopg.types.json import Jsonb

    with pg.connect() as c:
        c.execute(POSTGRES_SCHEMA)
        for name, table in state["tables"].items():
            columns = list(table["types"])
            for row in table["rows"]:
                values = [
                    Jsonb(row[k]) if table["types"][k] == "jsonb" and row[k] is not None else row[k]
                    for k in columns
                ]
                c.execute(
                    f"INSERT INTO {name} ({', '.join(columns)}) "
                    f"VALUES ({', '.join(['%s'] * len(columns))})",
                    values,
                )


def fill_mariadb(db: Any, state: dict[str, Any]) -> None:
    """Create the capture's tables in ``db`` and insert their final rows."""
    with db.connect() as c, c.cursor() as cur:
        for statement in MARIADB_SCHEMA:
            cur.execute(statement)
        for name, table in state["tables"].items():
            columns = list(table["types"])
            for row in table["rows"]:
                cur.execute(
                    f"INSERT INTO {name} ({', '.join(columns)}) "
                    f"VALUES ({', '.join(['%s'] * len(columns))})",
                    [row[k] for k in columns],
                )


#: Debezium's golden PostgreSQL captures, with schemas and schemaless (the first fills the
#: test database: both captured the same rows)
PG_CAPTURES = ["debezium-postgres-pg_schemas", "debezium-postgres-pg_schemaless"]


def pg_url(pg: Any) -> str:
    """The ``--source-db`` URL of a test kit PostgreSQL server."""
    return f"postgresql://{pg.user}@{pg.host}:{pg.port}/{pg.database}"


def mirror_capture(
    messages: list[dict], root: Path, schemas: bool, config: Any = None
) -> DeltaWarehouse:
    """Decode the capture's messages as ``debezium-json`` and apply them to ``root`` in one
    micro-batch (the path ``cdcflow apply`` takes: no Spark, no broker), with ``config``'s
    routing and table options (:func:`~cdcflow.runtime.pipeline.applier_for`; default:
    :func:`config_for` ``root``)."""
    config = config or config_for(root, schemas)
    decoder = decoder_for("debezium-json", {"schema_include": schemas})
    records = [
        Record(
            value=None if m["value"] is None else m["value"].encode(),
            key=None if m["key"] is None else m["key"].encode(),
            origin=Origin(topic=m["topic"], partition=m["partition"], offset=m["offset"]),
        )
        for m in messages
    ]
    warehouse = DeltaWarehouse(str(root), pipeline_id="verify")
    events = pa.Table.from_batches([decode_records(decoder, records)])
    report = applier_for(config, warehouse, config.sources[0]).apply(events)
    assert not report.dead_letters, report
    return warehouse


def config_dict(root: Path, schemas: bool, tables: list | None = None, **source: Any) -> dict:
    """A pipeline configuration whose warehouse is ``root`` and whose one source reads
    Debezium JSON (routing as given in ``source``; ``tables``: its table rules), as the
    YAML would hold it."""
    return {
        "tables": tables or [],
        "pipeline_id": "verify",
        "warehouse": str(root),
        "checkpoint": str(root.parent / "checkpoint"),
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "sources": [
            {
                "format": "debezium-json",
                "topic_pattern": r"pg\..*",
                "options": {"schema_include": schemas},
                **source,
            }
        ],
    }


def config_for(root: Path, schemas: bool, tables: list | None = None, **source: Any) -> Any:
    """:func:`config_dict`, loaded."""
    return parse_config(config_dict(root, schemas, tables, **source))


def write_config(tmp_path: Path) -> Path:
    """``tmp_path/pipeline.yaml`` of :func:`config_dict` for the warehouse
    ``tmp_path/wh`` (JSON is YAML), for the command line."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(json.dumps(config_dict(tmp_path / "wh", True)))
    return path


def damage(root: Path, prefix: str, null_column: str) -> None:
    """Damage the mirror ``<prefix>.customers`` in each way issue 35 lists, one key each --
    id 5 deleted, 777 added (a copy of 3), 6 renamed, ``null_column`` of 7 set to NULL,
    ``created_at`` of 9 a microsecond later (a timestamp, or schemaless JSON's
    microseconds) -- and delete ``order_id`` 8 from
    ``<prefix>.order_lines`` (a composite key)."""
    path = str(root / f"{prefix}.customers")
    table = DeltaTable(path)
    table.delete("id = 5")
    table.update({"name": "'renamed'"}, predicate="id = 6")
    table.update({null_column: "NULL"}, predicate="id = 7")
    created = DeltaTable(path).to_pyarrow_table(filters=[("id", "=", 9)])["created_at"][0]
    if isinstance(created.as_py(), int):  # schemaless JSON: microseconds since the epoch
        DeltaTable(path).update({"created_at": f"{created.as_py() + 1}"}, predicate="id = 9")
    else:
        later = created.as_py() + dt.timedelta(microseconds=1)
        DeltaTable(path).update(
            {"created_at": f"CAST('{later.isoformat()}' AS TIMESTAMP)"}, predicate="id = 9"
        )
    extra = DeltaTable(path).to_pyarrow_table(filters=[("id", "=", 3)])
    extra = extra.set_column(extra.schema.get_field_index("id"), "id", pa.array([777], pa.int64()))
    write_deltalake(path, extra, mode="append")
    DeltaTable(str(root / f"{prefix}.order_lines")).delete("order_id = 8")

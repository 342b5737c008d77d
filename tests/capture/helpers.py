"""What the capture tests share: reading the database and the mirrors, the value each
database value must have in a mirror, and the captured messages kept as golden files."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cdcflow.config import parse_config
from cdcflow.runtime.pipeline import Pipeline
from cdcflow.sinks.warehouse import DeltaWarehouse

GOLDEN = Path(__file__).parent / "golden"


def database_rows(pg: Any, table: str, key: str) -> tuple[list[dict], dict[str, str]]:
    """``SELECT *`` of ``table`` ordered by ``key``: the rows, and each column's type
    (PostgreSQL's ``udt_name``: ``int8``, ``numeric``, ``_text``, an enum's name...)."""
    with pg.connect() as c:
        cur = c.execute(f"SELECT * FROM {table} ORDER BY {key}")
        names = [d.name for d in cur.description]
        rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        types = dict(
            c.execute(
                "SELECT column_name, udt_name FROM information_schema.columns "
                "WHERE table_name = %s ORDER BY ordinal_position",
                (table,),
            ).fetchall()
        )
    return rows, types


def run_cdcflow(
    spark: Any,
    broker: Any,
    tmp_path: Path,
    schemas: bool,
    topic_pattern: str,
    source: dict[str, Any] | None = None,
) -> tuple[Any, DeltaWarehouse]:
    """``cdcflow run --once`` (in this process) of the topics ``topic_pattern`` into
    ``tmp_path/wh``, reading them as Debezium JSON with or without schemas, or as
    ``source`` says (``format`` and ``options``)."""
    config = parse_config(
        {
            "pipeline_id": f"capture-{'schemas' if schemas else 'schemaless'}",
            "warehouse": str(tmp_path / "wh"),
            "checkpoint": str(tmp_path / "ck"),
            "trigger": "available_now",
            "target_template": "{database}.{schema}.{table}",
            "kafka": {"bootstrap_servers": broker.bootstrap_servers},
            "sources": [
                {
                    "format": "debezium-json",
                    "topic_pattern": topic_pattern,
                    "options": {"schema_include": schemas},
                    **(source or {}),
                }
            ],
        }
    )
    summary = Pipeline(config, spark=spark).run(once=True)
    return summary, DeltaWarehouse(str(tmp_path / "wh"))


# --------------------------------------------------------------------------- golden files
# A capture is kept as ``golden/<name>/``: ``messages.jsonl`` (every record of the
# tool's topics, in offset order per partition: topic, partition, offset, key and value as
# text or null, headers as [name, base64]) and ``database.json`` (the versions and
# settings that produced them, and each table's columns, types, key and final rows).


#: column types (PostgreSQL's udt_name, MariaDB's DATA_TYPE) kept as text in the files
_DECIMAL = ("numeric", "decimal")
_TIMES = {
    "date": dt.date,
    "time": dt.time,
    "timestamp": dt.datetime,
    "timestamptz": dt.datetime,
    "datetime": dt.datetime,
}
_BINARY = ("bytea", "blob", "longblob", "mediumblob", "tinyblob", "binary", "varbinary")


def _to_json(udt: str, value: Any) -> Any:
    if value is None:
        return None
    if udt in _DECIMAL:
        return str(value)
    if udt in _TIMES:
        return value.isoformat()
    if udt in _BINARY:
        return base64.b64encode(bytes(value)).decode()
    if udt == "uuid":
        return str(value)
    return value


def _from_json(udt: str, value: Any) -> Any:
    if value is None:
        return None
    if udt in _DECIMAL:
        return decimal.Decimal(value)
    if udt in _TIMES:
        return _TIMES[udt].fromisoformat(value)
    if udt in _BINARY:
        return base64.b64decode(value)
    if udt == "uuid":
        return uuid.UUID(value)
    return value


def save_capture(
    folder: Path, broker: Any, prefix: str, tables: dict[str, tuple], about: dict[str, Any]
) -> None:
    """Write the records of the topics starting with ``prefix.`` and ``tables``
    (name -> ``(key columns, rows, types)`` of :func:`database_rows`) under ``folder``."""
    from confluent_kafka import Consumer, TopicPartition

    folder.mkdir(parents=True, exist_ok=True)
    consumer = Consumer(
        broker.client_config(**{"group.id": "capture", "enable.auto.commit": False})
    )
    lines = []
    try:
        for topic in sorted(t for t in broker.topics() if t.startswith(f"{prefix}.")):
            for p, end in sorted(broker.end_offsets(topic).items()):
                consumer.assign([TopicPartition(topic, p, 0)])
                got = 0
                while got < end:
                    for m in consumer.consume(1000, timeout=5):
                        if m.error() is not None or m.offset() >= end:
                            continue
                        got = m.offset() + 1
                        lines.append(
                            {
                                "topic": topic,
                                "partition": p,
                                "offset": m.offset(),
                                "key": None if m.key() is None else m.key().decode(),
                                "value": None if m.value() is None else m.value().decode(),
                                "headers": [
                                    [k, base64.b64encode(v or b"").decode()]
                                    for k, v in (m.headers() or [])
                                ],
                            }
                        )
    finally:
        consumer.close()
    with open(folder / "messages.jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    state = {
        name: {
            "key": list(key),
            "types": types,
            "rows": [{c: _to_json(types[c], v) for c, v in row.items()} for row in rows],
        }
        for name, (key, rows, types) in tables.items()
    }
    (folder / "database.json").write_text(
        json.dumps({**about, "tables": state}, indent=1, ensure_ascii=False) + "\n"
    )


def load_capture(folder: Path) -> tuple[list[dict], dict[str, Any]]:
    """The records and the database state :func:`save_capture` wrote; the state's rows
    with their Python values again (as psycopg gives them)."""
    with open(folder / "messages.jsonl") as f:
        messages = [json.loads(line) for line in f if line.strip()]
    state = json.loads((folder / "database.json").read_text())
    for table in state["tables"].values():
        types = table["types"]
        table["rows"] = [{c: _from_json(types[c], v) for c, v in r.items()} for r in table["rows"]]
    return messages, state


# What the mirror's column type is for each PostgreSQL column, read through Debezium's
# schemas (decimal.handling.mode=precise, time.precision.mode=adaptive: its defaults).
TYPED = {
    "id": pa.int64(),
    "name": pa.string(),
    "email": pa.string(),
    "balance": pa.decimal128(12, 2),
    "score": pa.float64(),
    "ratio": pa.float32(),
    "visits": pa.int32(),
    "small": pa.int32(),  # int16 is stored as int32
    "active": pa.bool_(),
    "born": pa.date32(),
    "wake": pa.string(),  # see _expected_typed: time has no Delta type
    "created_at": pa.timestamp("us"),
    "updated_at": pa.timestamp("us", tz="UTC"),
    "avatar": pa.binary(),
    "doc": pa.string(),
    "uid": pa.string(),
    "feeling": pa.string(),
    "tags": pa.string(),
    "notes": pa.string(),
    "tier": pa.int32(),
}


#: MariaDB: the mirror's type of each column with Debezium's schemas (its defaults:
#: decimal.handling.mode=precise, time.precision.mode=adaptive_time_microseconds)
TYPED_MARIADB = {
    "id": pa.int64(),
    "name": pa.string(),
    "visits": pa.int32(),
    "small": pa.int32(),
    "active": pa.int32(),  # TINYINT(1) is an int16 in Debezium's schema
    "balance": pa.decimal128(12, 2),
    "score": pa.float64(),
    "ratio": pa.float32(),
    "born": pa.date32(),
    "wake": pa.string(),  # time has no Delta type: its ISO text
    "created_at": pa.timestamp("us"),
    "updated_at": pa.timestamp("us", tz="UTC"),
    "avatar": pa.binary(),
    "doc": pa.string(),
    "feeling": pa.string(),
    "perms": pa.string(),
    "notes": pa.string(),
    "tier": pa.int32(),
}


def expected_typed(name: str, value):
    """The mirror value of a database value, through Debezium's schemas."""
    if value is None:
        return None
    if name == "doc":
        return value  # compared parsed, below
    if name in ("uid",):
        return str(value)
    if name == "tags":
        return value
    if name == "wake":
        return value.isoformat()
    if name == "avatar":
        return bytes(value)
    if name == "ratio":
        # psycopg reads a real's shortest text as a double; the mirror's float32 column
        # holds the float32 itself
        return float(np.float32(value))
    return value


def mirror_rows(wh: DeltaWarehouse, target: str, key: list[str]) -> tuple[list[dict], pa.Schema]:
    table = wh.read(target)
    user = [n for n in table.column_names if not n.startswith("_")]
    rows = table.select(user).to_pylist()
    rows.sort(key=lambda r: tuple(r[k] for k in key))
    return rows, table.select(user).schema


def compare(db_rows, mirror_rows, expected) -> list[str]:
    problems = []
    if len(db_rows) != len(mirror_rows):
        problems.append(f"{len(mirror_rows)} rows in the mirror, {len(db_rows)} in the database")
    for want, got in zip(db_rows, mirror_rows, strict=False):
        for name, value in want.items():
            exp = expected(name, value)
            have = got.get(name)
            if name in ("doc", "tags") and have is not None and exp is not None:
                have = json.loads(have)
                if name == "doc" and isinstance(exp, str):
                    exp = json.loads(exp)
            if have != exp:
                problems.append(f"row {want.get('id', want)}: {name}: mirror {have!r} != {exp!r}")
    return problems


def expected_schemaless(name: str, value):
    """The mirror value of a database value when Debezium's messages carry no schema:
    the JSON value Debezium writes, typed by cdcflow from the JSON alone."""
    if value is None:
        return None
    epoch = dt.date(1970, 1, 1)
    if name == "balance":
        return str(value)  # decimal.handling.mode=string
    if name == "born":
        return (value - epoch).days
    if name == "wake":
        return (value.hour * 3600 + value.minute * 60 + value.second) * 10**6 + value.microsecond
    if name == "created_at":
        return (value - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    if name == "updated_at":
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").replace(".000000Z", "Z")
    if name == "avatar":
        return base64.b64encode(bytes(value)).decode()
    if name == "uid":
        return str(value)
    if name == "ratio":
        # Debezium writes a real as Java's shortest text of the float32, which a reader
        # without the schema takes for a double
        return float(str(np.float32(value)))
    return value


def wait_captured(
    broker: Any, prefix: str, sentinel: str, connect: Any, timeout_s: float = 240.0
) -> dict[str, int]:
    """Wait until the event of the row inserted last (into the table ``sentinel``, e.g.
    ``public.sentinel``) is in Kafka and the tool's topics stop growing; returns each
    topic's record count. ``connect``: the :class:`ConnectStandalone` running the tool."""
    deadline = time.monotonic() + timeout_s
    topic = f"{prefix}.{sentinel}"
    while topic not in broker.topics() or not sum(broker.end_offsets(topic).values()):
        assert time.monotonic() < deadline, (
            f"Debezium did not publish the sentinel row; status "
            f"{[connect.status(n) for n in connect.connectors]}; log: {connect.log_path}"
        )
        time.sleep(0.5)
    last: dict[str, int] = {}
    while True:
        now = {
            t: sum(broker.end_offsets(t).values())
            for t in broker.topics()
            if t.startswith(f"{prefix}.")
        }
        if now == last:
            return now
        assert time.monotonic() < deadline, "Debezium's topics kept growing"
        last = now
        time.sleep(1.0)


def wait_snapshot_done(
    broker: Any,
    prefix: str,
    connect: Any,
    timeout_s: float = 240.0,
    marker: bytes = b'"snapshot":"last"',
) -> None:
    """Wait until the tool's initial snapshot is over: its last record (``"snapshot":
    "last"`` in its ``source`` block) is in one of the topics starting with ``prefix.``.
    A workload started earlier races the snapshot: a TRUNCATE or ALTER of a table the
    snapshot is reading fails it (MariaDB: "Table definition has changed"). ``marker``:
    the bytes of that field in the converter's encoding (Avro: ``b"\\x08last"``, the
    string's zig-zag length 4, then its text)."""
    from confluent_kafka import Consumer, TopicPartition

    deadline = time.monotonic() + timeout_s
    consumer = Consumer(
        broker.client_config(**{"group.id": "snapshot", "enable.auto.commit": False})
    )
    try:
        while True:
            for topic in [t for t in broker.topics() if t.startswith(f"{prefix}.")]:
                for p, end in broker.end_offsets(topic).items():
                    if not end:
                        continue
                    consumer.assign([TopicPartition(topic, p, 0)])
                    seen = 0
                    while seen < end:
                        msgs = consumer.consume(1000, timeout=2)
                        if not msgs:
                            break
                        for m in msgs:
                            seen = max(seen, m.offset() + 1)
                            if m.error() is None and marker in (m.value() or b""):
                                return
            assert time.monotonic() < deadline, (
                f"the snapshot did not end; status "
                f"{[connect.status(n) for n in connect.connectors]}; log: {connect.log_path}"
            )
            time.sleep(0.5)
    finally:
        consumer.close()


def postgres_connector(pg: Any, slot: str, prefix: str, **extra: str) -> dict[str, str]:
    """Debezium's PostgreSQL connector (``pgoutput``, a slot and publication named after
    ``slot``, truncates published) for ``pg`` (a :class:`LocalPostgres`), topics
    ``<prefix>.<schema>.<table>``; ``extra`` settings on top."""
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(pg.port),
        "database.user": pg.user,
        "database.password": "unused",
        "database.dbname": pg.database,
        "topic.prefix": prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": f"{slot}_pub",
        "publication.autocreate.mode": "all_tables",
        "skipped.operations": "none",  # Debezium skips truncates unless told otherwise
        **extra,
    }

"""The decoded-event batch: the Arrow schema that crosses from the decode stage (Spark's
executors) to the apply (the driver), shared by every layer.

One row per decoded event, per skipped record and per dead letter (``kind`` says which),
so every consumed Kafka record is accounted for. Written by
:func:`cdcflow.decode.batches.flatten`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = [
    "EVENT_SCHEMA",
    "KIND_DEAD",
    "KIND_EVENT",
    "KIND_JOINED",
    "KIND_SKIP",
    "spark_event_schema",
]

KIND_EVENT = "event"
KIND_JOINED = "joined"  # decoded, and its change is part of another record's event
KIND_SKIP = "skip"
KIND_DEAD = "dead"

#: One row per decoded event / skipped record / dead letter.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),  # event | joined | skip | dead
        pa.field("op", pa.string()),
        pa.field("format", pa.string()),
        pa.field("database", pa.string()),
        pa.field("schema", pa.string()),
        pa.field("table", pa.string()),
        pa.field("key", pa.string()),  # canonical JSON object, key columns in key order
        pa.field("old_key", pa.string()),  # key of the before image when an update moved it
        pa.field("before", pa.string()),  # canonical JSON object or null
        pa.field("after", pa.string()),
        pa.field("partial", pa.bool_()),  # after image lacks some declared columns
        pa.field(
            "columns", pa.string()
        ),  # JSON {column: logical type}; first event per declaration
        pa.field("seq", pa.string()),  # model.seq_key form
        pa.field("ts_ms", pa.int64()),
        pa.field("txn_id", pa.string()),
        pa.field("txn_order", pa.int64()),
        pa.field("txn_last", pa.bool_()),
        pa.field("ddl", pa.string()),
        pa.field("meta", pa.string()),  # JSON object
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("event_index", pa.int32()),  # position among one record's events
        pa.field("state", pa.string()),  # JSON list: what the event taught its decoder
        pa.field("reason", pa.string()),  # skip reason or dead-letter code
        pa.field("error", pa.string()),  # dead-letter message
        pa.field("raw_key", pa.binary()),  # dead letters only
        pa.field("raw_value", pa.binary()),  # dead letters only
    ]
)


def spark_event_schema() -> Any:
    """:data:`EVENT_SCHEMA` as a Spark ``StructType`` (imports PySpark)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(EVENT_SCHEMA)

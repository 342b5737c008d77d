"""The columns of Spark's Kafka source, as a Spark schema and as an Arrow schema.

Both Kafka sources -- Spark's JVM ``kafka`` source and cdcflow's Python ``cdcflow_kafka``
(:mod:`cdcflow.source.kafka.datasource`) -- give rows of :data:`KAFKA_SCHEMA`; the Python
reader (:mod:`cdcflow.source.kafka.reader`) yields Arrow batches of :data:`ARROW_SCHEMA`.
Reference: Spark "Structured Streaming + Kafka Integration Guide" (the source's schema).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ARROW_SCHEMA", "KAFKA_SCHEMA"]


def _spark_schema() -> Any:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )


def _arrow_schema() -> Any:
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", pa.list_(pa.field("element", header))),
        ]
    )


KAFKA_SCHEMA = _spark_schema()
"""Columns of Spark's Kafka source: ``key binary, value binary, topic string, partition
int, offset long, timestamp timestamp, timestampType int,
headers array<struct<key:string,value:binary>>``. ``timestampType`` is Kafka's id
(0 CreateTime, 1 LogAppendTime); ``headers`` is null for a record without headers."""

ARROW_SCHEMA = _arrow_schema()
"""The Arrow schema of the batches ``read`` yields (Spark's mapping of KAFKA_SCHEMA)."""

"""Kafka batches as the decoders see them (``records_from_kafka_batch``)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from cdcflow.decode.batches import records_from_kafka_batch
from cdcflow.model import Origin
from cdcflow.source.kafka.schema import ARROW_SCHEMA

UTC = dt.UTC


def test_records_keep_every_column_and_timestamps_become_epoch_ms():
    stamps = [
        dt.datetime(2024, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC),  # truncated, never rounded up
        None,
        dt.datetime(1970, 1, 1, 0, 0, 1, 500, tzinfo=UTC),
    ]
    headers = [None, [{"key": "__debezium.oldkey", "value": b'{"id":1}'}], []]
    batch = pa.RecordBatch.from_pydict(
        {
            "key": [b"k0", None, b"k2"],
            "value": [b"v0", b"v1", None],
            "topic": ["a", "a", "b"],
            "partition": [0, 1, 2],
            "offset": [10, 11, 12],
            "timestamp": stamps,
            "timestampType": [0, 0, 1],
            "headers": headers,
        },
        schema=ARROW_SCHEMA,
    )
    records = records_from_kafka_batch(batch)
    assert [r.value for r in records] == [b"v0", b"v1", None]
    assert [r.key for r in records] == [b"k0", None, b"k2"]
    assert [r.origin for r in records] == [
        Origin("a", 0, 10),
        Origin("a", 1, 11),
        Origin("b", 2, 12),
    ]
    assert [r.timestamp_ms for r in records] == [1_704_067_200_999, None, 1_000]
    assert [r.headers for r in records] == [(), (("__debezium.oldkey", b'{"id":1}'),), ()]


def test_a_batch_without_timestamps_and_headers_gives_none_and_empty():
    batch = pa.RecordBatch.from_pydict(
        {"key": [None], "value": [b"v"], "topic": ["t"], "partition": [0], "offset": [0]}
    )
    (record,) = records_from_kafka_batch(batch)
    assert record.timestamp_ms is None and record.headers == ()


def test_decoding_a_batch_restores_the_garbage_collector_as_it_was():
    import gc

    from cdcflow.decode.batches import decode_kafka_batch
    from cdcflow.formats import decoder_for

    batch = pa.RecordBatch.from_pydict(
        {"key": [None], "value": [b"not json"], "topic": ["t"], "partition": [0], "offset": [0]}
    )
    decoder = decoder_for("debezium-json")
    assert gc.isenabled()
    out = decode_kafka_batch(decoder, batch)
    assert out.column("kind").to_pylist() == ["dead"] and gc.isenabled()
    gc.disable()
    try:
        decode_kafka_batch(decoder, batch)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
    with pytest.raises(KeyError):  # no "key" column: the batch fails ...
        decode_kafka_batch(decoder, pa.RecordBatch.from_pydict({"value": [b"{}"]}))
    assert gc.isenabled()  # ... and the collector runs again

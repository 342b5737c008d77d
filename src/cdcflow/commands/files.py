"""Message files through the same decode and apply path as a run (``cdcflow decode``,
``cdcflow apply``).

A file holds one Kafka message value per line, as the replication tool wrote it:
``null`` is a tombstone (a Kafka record without a value), and the values of binary
formats (Avro) are base64 text. A record's origin is the file's name as its topic,
partition 0, and its line number (0-based, blank lines counted) as its offset, so a
line is applied once per warehouse however often the file is applied.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.formats import decoder_class, decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Origin

if TYPE_CHECKING:
    from cdcflow.apply.accounting import BatchReport
    from cdcflow.formats.base import DecodeResult, Record

__all__ = ["apply_files", "decode_files", "read_records"]


def read_records(
    fmt: str, files: Sequence[str], key_delimiter: bytes | None = None
) -> Iterator[Record]:
    """The records of message files, in file and line order.

    Args:
        fmt: the format identifier (its decoder says whether values are binary).
        files: paths; ``-`` reads standard input.
        key_delimiter: with it, each line is ``key<delimiter>value`` as ``kcat -K``
            prints messages (an empty key is none; an empty value, ``null`` or ``NULL`` is
            a tombstone); binary formats' keys are base64 as their values. ``None``: a
            line is a value.

    Raises:
        ConfigError: unknown format.
        OSError: a file cannot be read.
        binascii.Error: a line of a binary format is not base64.
    """

    binary = decoder_class(fmt).binary_values
    for name in files:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        for i, line in enumerate(data.splitlines()):
            key = None
            if key_delimiter is not None:
                raw_key, found, line = line.partition(key_delimiter)
                if not found:  # no delimiter: the line is a value without key
                    raw_key, line = b"", raw_key
                if raw_key.strip():
                    key = base64.b64decode(raw_key) if binary else raw_key
            text = line.strip()
            if not text and key is None:
                continue
            if text in (b"null", b"") or (key_delimiter is not None and text == b"NULL"):
                value = None  # kcat prints a null value as nothing, or NULL with -Z
            elif binary:
                value = base64.b64decode(text)
            else:
                value = line
            yield Record(value=value, key=key, origin=Origin(topic=name, partition=0, offset=i))


def decode_files(
    fmt: str,
    files: Sequence[str],
    options: Mapping[str, Any] | None = None,
    key_delimiter: bytes | None = None,
) -> DecodeResult:
    """Decode message files into change events, skips and dead letters.

    Args:
        fmt: the format identifier.
        files: paths (``-``: standard input).
        options: the format's options (``sources[].options`` of a configuration).
        key_delimiter: lines are ``key<delimiter>value`` (:func:`read_records`).

    Raises:
        ConfigError: unknown format or option.
    """

    decoder = decoder_for(fmt, dict(options or {}) or None)
    return decoder.decode_batch(read_records(fmt, files, key_delimiter))


def apply_files(
    fmt: str,
    files: Sequence[str],
    warehouse: str,
    options: Mapping[str, Any] | None = None,
    *,
    pipeline_id: str = "cli",
    target_template: str = "{database}.{schema}.{table}",
    key_delimiter: bytes | None = None,
) -> BatchReport:
    """Decode message files and apply them to the warehouse's tables as one micro-batch,
    with the decoder state (e.g. Qlik's table metadata) the warehouse kept.

    Args:
        fmt: the format identifier.
        files: paths (``-``: standard input).
        warehouse: the warehouse folder (or delta-rs URI).
        options: the format's options.
        pipeline_id: the application-transaction id the offsets are recorded under.
        target_template: the target-name template.
        key_delimiter: lines are ``key<delimiter>value`` (:func:`read_records`).

    Returns:
        The batch's report; ``replayed`` counts lines applied before.

    Raises:
        ConfigError: unknown format or option.
        StorageError: the warehouse cannot be written.
    """
    import pyarrow as pa

    # deferred: deltalake and pydantic (~1 s); `cdcflow decode` writes JSON lines and never applies
    from cdcflow.apply.batch import BatchApplier
    from cdcflow.decode.batches import decode_records, load_decoder_state
    from cdcflow.sinks.warehouse import DeltaWarehouse
    from cdcflow.transform.router import Router

    decoder = decoder_for(fmt, dict(options or {}) or None)
    store = DeltaWarehouse(warehouse, pipeline_id=pipeline_id)
    decoder.load_state(load_decoder_state(store.system_path("decoder_state"), store.pipeline_id))
    events = pa.Table.from_batches(
        [decode_records(decoder, list(read_records(fmt, files, key_delimiter)))]
    )
    return BatchApplier(store, Router(target_template)).apply(events)

"""``cdcflow dead-letters list|show|export``: the dead letters of a warehouse, read from
``_cdcflow/dead_letters`` (raw bytes, topic/partition/offset, stage, code, message).

Read-only, like ``cdcflow status``: safe beside a running pipeline. Kafka Connect's
dead-letter queue (a topic with the error in its headers) and its ``errors.*`` metrics are
the model; here the queue is a Delta table, and ``export --values`` writes the raw values
in the form ``cdcflow decode`` reads, so a fix can be tried on the records that failed::

    cdcflow dead-letters export CONFIG --code MISSING_FIELD --values -K '\t' -o failed.txt
    cdcflow decode --format debezium-json -K '\t' failed.txt
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.formats import decoder_class
from cdcflow.model import dumps
from cdcflow.sinks.system_tables import DEAD_LETTER_SCHEMA, DEAD_LETTERS
from cdcflow.sinks.warehouse import DeltaWarehouse

__all__ = ["LetterFilter", "export_lines", "read_letters", "show_lines", "summary_rows"]


@dataclass(frozen=True)
class LetterFilter:
    """Which dead letters: of these topics (or a topic pattern), codes, stage; ``None``
    matches all."""

    topics: Sequence[str] | None = None
    topic_pattern: str | None = None
    codes: Sequence[str] | None = None
    stage: str | None = None  # decode | apply

    def mask(self, letters: pa.Table) -> Any:
        mask = pa.array([True] * letters.num_rows)
        if self.topics is not None or self.topic_pattern is not None:
            wanted = set(self.topics or ())
            pattern = re.compile(self.topic_pattern) if self.topic_pattern else None
            names = letters["topic"].to_pylist()
            mask = pa.array(
                [
                    t in wanted or (pattern is not None and pattern.fullmatch(t or "") is not None)
                    for t in names
                ]
            )
        if self.codes:
            mask = pc.and_(mask, pc.is_in(letters["code"], pa.array(list(self.codes))))
        if self.stage:
            mask = pc.and_(mask, pc.equal(letters["stage"], self.stage))
        return pc.fill_null(mask, False)


def read_letters(warehouse: DeltaWarehouse, where: LetterFilter | None = None) -> pa.Table:
    """The dead letters ``where`` selects, oldest first (by commit, then Kafka position).

    Raises:
        StorageError: the table cannot be read.
    """
    letters = warehouse.read_system(DEAD_LETTERS, DEAD_LETTER_SCHEMA)
    if where is not None and letters.num_rows:
        letters = letters.filter(where.mask(letters))
    return letters.sort_by(
        [("committed_at_ms", "ascending"), ("topic", "ascending"), ("partition", "ascending"),
         ("offset", "ascending")]
    )  # fmt: skip


def summary_rows(letters: pa.Table) -> list[dict[str, Any]]:
    """Counts by code, stage and topic, most first: ``code``, ``stage``, ``topic``,
    ``count``, ``first_offset``/``last_offset`` (any partition), ``last_at_ms``."""
    if not letters.num_rows:
        return []
    grouped = letters.group_by(["code", "stage", "topic"]).aggregate(
        [
            ("offset", "count"),
            ("offset", "min"),
            ("offset", "max"),
            ("committed_at_ms", "max"),
        ]
    )
    rows = [
        {
            "code": r["code"],
            "stage": r["stage"],
            "topic": r["topic"],
            "count": r["offset_count"],
            "first_offset": r["offset_min"],
            "last_offset": r["offset_max"],
            "last_at_ms": r["committed_at_ms_max"],
        }
        for r in grouped.to_pylist()
    ]
    return sorted(rows, key=lambda r: (-r["count"], r["code"], r["topic"] or ""))


def _text(raw: bytes | None, limit: int | None = None) -> str:
    """``raw`` as text when it is UTF-8, else ``base64:...``; ``null`` for no bytes."""
    if raw is None:
        return "null"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = "base64:" + base64.b64encode(raw).decode()
    if limit is not None and len(text) > limit:
        return f"{text[:limit]}... ({len(raw):,} bytes)"
    return text


def show_lines(letters: pa.Table, last: int = 5, width: int = 300) -> list[str]:
    """The ``last`` dead letters in full, newest last: where, code, message, the key and
    the first ``width`` characters of the value."""
    lines: list[str] = []
    for r in letters.slice(max(0, letters.num_rows - last)).to_pylist():
        lines.append(
            f"{r['topic']}[{r['partition']}]@{r['offset']}  {r['code']} ({r['stage']}, "
            f"{r['format']}, apply {r['batch_id']})"
        )
        lines.append(f"  message: {r['message']}")
        if r["target_table"]:
            lines.append(f"  table:   {r['target_table']}")
        if r["raw_key"] is not None:
            lines.append(f"  key:     {_text(r['raw_key'], width)}")
        lines.append(f"  value:   {_text(r['raw_value'], width)}")
    return lines


def _binary(fmt: str | None) -> bool:
    """Whether ``fmt``'s values are bytes (Avro): written as base64 for ``cdcflow decode``."""

    try:
        return bool(decoder_class(fmt or "").binary_values)
    except Exception:  # noqa: BLE001 - an unknown or old format name: by the bytes
        return False


def _decode_line(raw: bytes | None, binary: bool) -> str:
    """One key or value as ``cdcflow decode`` reads it."""
    if raw is None:
        return "null"
    text = None if binary else _text(raw)
    if text is None or text.startswith("base64:"):
        return base64.b64encode(raw).decode()
    # line breaks become spaces: JSON allows them between tokens and never holds one raw
    # inside a string, so each record stays one line
    return text.replace("\r", " ").replace("\n", " ")


def export_lines(
    letters: pa.Table, values_only: bool = False, key_delimiter: str | None = None
) -> Iterator[str]:
    """One line per dead letter: a JSON object of every column (bytes as UTF-8 text, or
    ``base64:...``); or with ``values_only`` the record as ``cdcflow decode`` reads it: the
    raw value (``null`` for a tombstone; base64 for a binary format such as Avro), after
    the raw key and ``key_delimiter`` when one is given (``decode -K``, as ``kcat -K``)."""
    binary: dict[str | None, bool] = {}
    for r in letters.to_pylist():
        if values_only:
            fmt = r["format"]
            if fmt not in binary:
                binary[fmt] = _binary(fmt)
            value = _decode_line(r["raw_value"], binary[fmt])
            if key_delimiter is None:
                yield value
            else:
                key = "" if r["raw_key"] is None else _decode_line(r["raw_key"], binary[fmt])
                yield f"{key}{key_delimiter}{value}"
            continue
        row = dict(r)
        row["raw_key"] = None if r["raw_key"] is None else _text(r["raw_key"])
        row["raw_value"] = None if r["raw_value"] is None else _text(r["raw_value"])
        yield dumps(row).decode()

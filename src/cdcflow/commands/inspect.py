"""``cdcflow inspect``: the first (or last) messages of a pipeline's topics, as the
replication tool wrote them and as cdcflow decodes them.

For each topic-partition of the configured sources (or one ``--topic``): the first ``n``
records from the log start (``--last``: the ``n`` before the log end) with their key,
headers and value, the formats whose signature the value has (``cdcflow.formats.auto``
detection), and what the source's configured format makes of them -- events, a skip, or a
dead letter with its code. The question it answers is the one a batch of dead letters
raises: is this topic really in the format the source says? Nothing is written; no group
joins (the records are read by offset, as the pipeline reads them).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from cdcflow.config import PipelineConfig, SourceConfig
from cdcflow.errors import ConfigError
from cdcflow.formats import decoder_for
from cdcflow.formats.auto import detect
from cdcflow.formats.base import Record
from cdcflow.model import Origin

__all__ = ["InspectedRecord", "describe", "inspect"]

#: characters of a value or key shown on a line
_WIDTH = 240


@dataclass
class InspectedRecord:
    """One Kafka record and what became of it."""

    source: str
    fmt: str  # the source's configured format
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    detected: tuple[str, ...]  # formats whose signature the value has (JSON only)
    events: list[str] = field(default_factory=list)  # "op table key", per event
    skipped: str | None = None  # the skip reason
    dead_letter: tuple[str, str] | None = None  # (code, message)


def _detected(value: bytes | None) -> tuple[str, ...]:
    if value is None:
        return ("tombstone",)
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError:
        return ("not JSON (Avro or other bytes)",)
    found = detect(obj)
    return found or ("no known JSON format",)


def _partitions(config: PipelineConfig, source: SourceConfig, topic: str | None) -> tuple:
    # deferred: pyspark (~1 s); inspecting files needs no Kafka reader
    from cdcflow.source.kafka.admin import watermarks

    options = config.kafka.reader_options()
    options.update({"subscribe": topic} if topic is not None else source.subscription())
    marks = watermarks(options, config.kafka.startup_timeout_s, "kafka.startup_timeout_s")
    return options, marks


def _records(options: dict, tp: tuple[str, int], first: int, last: int) -> Iterator[Any]:
    # deferred: pyspark (~1 s); inspecting files needs no Kafka reader
    from cdcflow.source.kafka.admin import read_range

    for batch in read_range(options, tp[0], tp[1], first, last):
        for row in batch.to_pylist():
            stamp = row["timestamp"]
            yield Record(
                value=row["value"],
                key=row["key"],
                headers=tuple((h["key"], h["value"]) for h in row["headers"] or ()),
                origin=Origin(topic=row["topic"], partition=row["partition"], offset=row["offset"]),
                timestamp_ms=None if stamp is None else int(stamp.timestamp() * 1000),
            )


def inspect(
    config: PipelineConfig, topic: str | None = None, n: int = 3, last: bool = False
) -> list[InspectedRecord]:
    """Read and decode ``n`` records of each topic-partition (see the module docstring).

    Raises:
        ConfigError: ``topic`` belongs to no source of the configuration.
        SourceError: the brokers do not answer within ``kafka.startup_timeout_s``.
    """

    sources = list(config.sources)
    if topic is not None:
        owner = next(
            (
                s
                for s in sources
                if topic in s.topics
                or (s.topic_pattern and re.fullmatch(s.topic_pattern, topic) is not None)
            ),
            None,
        )
        if owner is None:
            raise ConfigError(
                f"--topic {topic!r}: no source reads it (sources: "
                f"{', '.join(f'{s.name} {list(s.topics) or s.topic_pattern}' for s in sources)})"
            )
        sources = [owner]
    out: list[InspectedRecord] = []
    for source in sources:
        options, marks = _partitions(config, source, topic)
        for tp, (low, high) in sorted(marks.items()):
            if high <= low:
                continue
            first, end = (max(low, high - n), high - 1) if last else (low, min(high, low + n) - 1)
            records = list(_records(options, tp, first, end))
            decoder = decoder_for(source.format, dict(source.options) or None)
            result = decoder.decode_batch(records)
            found = {
                r.origin.offset: InspectedRecord(
                    source.name,
                    source.format,
                    tp[0],
                    tp[1],
                    r.origin.offset,
                    r.timestamp_ms,
                    r.key,
                    r.value,
                    list(r.headers),
                    _detected(r.value),
                )  # fmt: skip
                for r in records
            }
            for event in result.events:
                where = found.get(event.origin.offset)
                if where is not None:
                    key = "" if event.key is None else " key " + orjson.dumps(event.key).decode()
                    where.events.append(
                        f"{event.op.value} {event.source.qualified_name}{key}".strip()
                    )
            for skip in result.skipped:
                if skip.origin.offset in found:
                    found[skip.origin.offset].skipped = str(skip.reason)
            for d in result.dead_letters:
                if d.origin.offset in found:
                    found[d.origin.offset].dead_letter = (str(d.code), d.message)
            out.extend(found[o] for o in sorted(found))
    return out


def _shown(raw: bytes | None) -> str:
    if raw is None:
        return "null"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(raw):,} bytes, not UTF-8: {raw[:24].hex()}...>"
    if len(text) > _WIDTH:
        return f"{text[:_WIDTH]}... ({len(raw):,} bytes)"
    return text


def describe(records: list[InspectedRecord]) -> list[str]:
    """The lines ``cdcflow inspect`` prints."""
    import time

    lines: list[str] = []
    for r in records:
        when = ""
        if r.timestamp_ms is not None:
            when = "  " + time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.timestamp_ms / 1000))
        lines.append(f"{r.topic}[{r.partition}]@{r.offset}{when} UTC  (source {r.source})")
        lines.append(f"  key:      {_shown(r.key)}")
        if r.headers:
            shown = ", ".join(f"{k}={_shown(v)}" for k, v in r.headers)
            lines.append(f"  headers:  {shown}")
        lines.append(f"  value:    {_shown(r.value)}")
        verdict = "" if r.fmt in r.detected else f"  <- the source says {r.fmt}"
        lines.append(f"  looks like: {', '.join(r.detected)}{verdict}")
        if r.dead_letter is not None:
            code, message = r.dead_letter
            lines.append(f"  {r.fmt}: DEAD LETTER {code}: {message}")
        elif r.skipped is not None:
            lines.append(f"  {r.fmt}: skipped ({r.skipped})")
        for event in r.events:
            lines.append(f"  {r.fmt}: {event}")
    return lines


def as_dicts(records: list[InspectedRecord]) -> list[dict[str, Any]]:
    """``--json``: each record with bytes as UTF-8 text (or hex)."""
    out = []
    for r in records:
        d = dataclasses.asdict(r)
        d["key"] = None if r.key is None else _shown(r.key)
        d["value"] = None if r.value is None else _shown(r.value)
        d["headers"] = [[k, None if v is None else _shown(v)] for k, v in r.headers]
        out.append(d)
    return out

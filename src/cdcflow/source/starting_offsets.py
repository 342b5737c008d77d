"""Where a new query starts reading: Spark's ``startingOffsets`` syntax, parsed once.

``"earliest"``, ``"latest"``, or JSON ``{"topic": {"partition": offset}}`` with ``-2``
for a partition's earliest and ``-1`` for its latest offset -- the syntax of Spark's
Kafka source (Structured Streaming + Kafka Integration Guide, "startingOffsets",
https://spark.apache.org/docs/latest/structured-streaming-kafka-integration.html).
Used by the Kafka source (``startingOffsets``) and by the configuration
(``kafka.starting_offsets``), so both accept and refuse the same text.
"""

from __future__ import annotations

import json

__all__ = ["EARLIEST", "LATEST", "parse_starting_offsets"]

EARLIEST = -2  # JSON form: the partition's low watermark
LATEST = -1  # JSON form: the partition's high watermark

_FIX = (
    'use "earliest", "latest" or JSON such as {"topic":{"0":23,"1":-2}} '
    "(-2 = earliest, -1 = latest)"
)


def parse_starting_offsets(raw: str) -> str | dict[str, dict[int, int]]:
    """Parse a ``startingOffsets`` value.

    Args:
        raw: the text as configured.

    Returns:
        ``"earliest"`` | ``"latest"`` | ``{topic: {partition: offset}}``.

    Raises:
        ValueError: the text is neither word nor valid JSON of that shape; the message
            (without the option's name, which the caller adds) says the fix.
    """
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise ValueError(f"{raw!r} is not valid; {_FIX}")
    result: dict[str, dict[int, int]] = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict):
            raise ValueError(f"{topic!r} must map to an object; {_FIX}")
        result[topic] = {}
        for p, off in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise ValueError(f"partition {p!r} of {topic!r} is not a number; {_FIX}") from None
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise ValueError(
                    f"offset {off!r} of {topic}[{p}] must be an offset >= 0, -2 (earliest) "
                    "or -1 (latest)"
                )
            result[topic][partition] = off
    return result

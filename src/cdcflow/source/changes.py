"""``cdcflow_changes``: the Kafka source with decoding fused into its read.

The Python Kafka source (:mod:`cdcflow.source.kafka`) yields raw records; decoding them
with ``mapInArrow`` sends every record through the JVM twice more (Arrow -> rows -> Arrow
to the decoding worker, and back). This source runs the same
:class:`~cdcflow.apply.events.DecodeFunction` inside the worker that reads Kafka, so its
rows are decoded events (:data:`~cdcflow.apply.events.EVENT_SCHEMA`) from the start.
Offsets, admission control, ``Trigger.AvailableNow`` and data-loss checks are the Kafka
source's own: only ``read`` differs.

Options: those of ``cdcflow_kafka``, plus ``cdcflow.format`` (format identifier, required)
``cdcflow.formatOptions`` (the format's options as JSON, default ``{}``), and
``cdcflow.statePath``/``cdcflow.stateKey`` (where decoder state is persisted, see
:meth:`cdcflow.formats.base.Decoder.state_items`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from cdcflow.apply.events import DecodeFunction
from cdcflow.errors import ConfigError
from cdcflow.source.kafka import KafkaDataSource, KafkaStreamReader, parse_options, read_partition

__all__ = ["ChangesDataSource", "FORMAT", "register"]

FORMAT = "cdcflow_changes"
_FORMAT_OPTION = "cdcflow.format"
_FORMAT_OPTIONS_OPTION = "cdcflow.formatoptions"  # Spark hands options over lower-cased


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], DecodeFunction]:
    kafka = {k: v for k, v in options.items() if not str(k).lower().startswith("cdcflow.")}
    own = {str(k).lower(): v for k, v in options.items() if str(k).lower().startswith("cdcflow.")}
    fmt = own.get(_FORMAT_OPTION)
    if not fmt:
        raise ConfigError(f"{FORMAT} needs option 'cdcflow.format' (a format identifier)")
    try:
        format_options = orjson.loads(own.get(_FORMAT_OPTIONS_OPTION) or "{}")
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"option 'cdcflow.formatOptions' must be a JSON object: {exc}") from exc
    return kafka, DecodeFunction(
        str(fmt), format_options,
        state_path=own.get("cdcflow.statepath") or None, state_key=own.get("cdcflow.statekey") or "",
    )


class ChangesStreamReader(KafkaStreamReader):
    """The Kafka stream reader whose ``read`` yields decoded event batches."""

    def __init__(self, opts: Any, decode: DecodeFunction) -> None:
        super().__init__(opts)
        self.decode = decode

    def read(self, partition: Any) -> Iterator[Any]:
        """:data:`~cdcflow.apply.events.EVENT_SCHEMA` batches of one Kafka partition range."""
        return self.decode(read_partition(self.opts, partition))


class ChangesDataSource(KafkaDataSource):
    """The PySpark data source ``cdcflow_changes`` (streaming reads only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        from cdcflow.pipeline import spark_event_schema

        kafka, _ = _split(dict(self.options))
        parse_options(kafka)
        return spark_event_schema()

    def streamReader(self, schema: Any) -> ChangesStreamReader:
        kafka, decode = _split(dict(self.options))
        return ChangesStreamReader(parse_options(kafka), decode)


def register(spark: Any) -> None:
    """Register ``cdcflow_changes`` with a SparkSession (idempotent)."""
    spark.dataSource.register(ChangesDataSource)

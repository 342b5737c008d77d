"""``cdcflow_changes``: the Kafka source with decoding fused into its read.

The Python Kafka source (:mod:`cdcflow.source.kafka.datasource`) yields raw records; decoding them
with ``mapInArrow`` sends every record through the JVM twice more (Arrow -> rows -> Arrow
to the decoding worker, and back). This source runs the same
:class:`~cdcflow.decode.batches.DecodeFunction` inside the worker that reads Kafka, so its
rows are decoded events (:data:`~cdcflow.decode.batches.EVENT_SCHEMA`) from the start.
Offsets, admission control, ``Trigger.AvailableNow`` and data-loss checks are the Kafka
source's own: only ``read`` differs.

Options: those of ``cdcflow_kafka``, plus either ``cdcflow.sources`` (a JSON list of
sources, :meth:`~cdcflow.source.subscription.SourceTopics.as_json`: each topic is decoded by
the format of the source it belongs to), or for one format of every topic
``cdcflow.format`` (format identifier), ``cdcflow.formatOptions`` (the format's options as
JSON, default ``{}``) and ``cdcflow.statePath``/``cdcflow.stateKey`` (where decoder state
is persisted, see :meth:`cdcflow.formats.base.Decoder.state_items`); and
``cdcflow.storage.<key>`` for each of the warehouse's storage options (the state's table
may be on an object store).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import pyarrow as pa

from cdcflow.decode.batches import DecodeFunction
from cdcflow.errors import ConfigError
from cdcflow.event_schema import EVENT_SCHEMA, spark_event_schema
from cdcflow.source.kafka.datasource import KafkaDataSource, KafkaStreamReader, register_once
from cdcflow.source.kafka.options import parse_options
from cdcflow.source.kafka.planning import ranges_of
from cdcflow.source.kafka.reader import read_records
from cdcflow.source.subscription import SourceTopics, Subscription

__all__ = ["ChangesDataSource", "FORMAT", "STAGED_SCHEMA", "read_staged", "register"]

#: Manifest rows returned instead of the events when staging is on.
STAGED_SCHEMA = pa.schema([pa.field("staged_path", pa.string()), pa.field("rows", pa.int64())])
_UNSAFE = re.compile(r"[^0-9A-Za-z_.\-]")

FORMAT = "cdcflow_changes"
_FORMAT_OPTION = "cdcflow.format"
_FORMAT_OPTIONS_OPTION = "cdcflow.formatoptions"  # Spark hands options over lower-cased
_SOURCES_OPTION = "cdcflow.sources"
#: ``cdcflow.storage.<key>``: the warehouse's storage options, for the decoders' state
STORAGE_OPTION_PREFIX = "cdcflow.storage."


def _staging(options: dict[str, Any]) -> str | None:
    for k, v in options.items():
        if str(k).lower() == "cdcflow.stagingpath" and v:
            return str(v)
    return None


def read_staged(manifest: pa.Table) -> pa.Table:
    """The event rows of the files a staged micro-batch's manifest lists (memory-mapped)."""
    tables = [
        pa.ipc.open_file(pa.memory_map(path)).read_all()
        for path in manifest["staged_path"].to_pylist()
    ]
    if not tables:
        return EVENT_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], Subscription]:
    """The Kafka source's options and the sources whose formats decode the topics:
    ``cdcflow.sources`` (a JSON list, :meth:`SourceTopics.as_json`), or one source of every
    topic read (``cdcflow.format`` and its companions)."""
    kafka = {k: v for k, v in options.items() if not str(k).lower().startswith("cdcflow.")}
    own = {str(k).lower(): v for k, v in options.items() if str(k).lower().startswith("cdcflow.")}
    storage = {
        k.removeprefix(STORAGE_OPTION_PREFIX): str(v)
        for k, v in own.items()
        if k.startswith(STORAGE_OPTION_PREFIX)
    }
    if own.get(_SOURCES_OPTION):
        try:
            routes = [
                SourceTopics.from_json(r, storage_options=storage)
                for r in orjson.loads(own[_SOURCES_OPTION])
            ]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"option 'cdcflow.sources' is not a list of sources: {exc}") from exc
        return kafka, Subscription(routes)
    fmt = own.get(_FORMAT_OPTION)
    if not fmt:
        raise ConfigError(
            f"{FORMAT} needs option 'cdcflow.format' (a format identifier) or 'cdcflow.sources'"
        )
    try:
        format_options = orjson.loads(own.get(_FORMAT_OPTIONS_OPTION) or "{}")
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"option 'cdcflow.formatOptions' must be a JSON object: {exc}") from exc
    decode = DecodeFunction(
        str(fmt),
        format_options,
        state_path=own.get("cdcflow.statepath") or None,
        state_key=own.get("cdcflow.statekey") or "",
        storage_options=storage or None,
    )
    return kafka, Subscription([SourceTopics(str(fmt), (), ".*", decode)])


class ChangesStreamReader(KafkaStreamReader):
    """The Kafka stream reader whose ``read`` yields decoded event batches, each
    partition decoded by the format of its topic's source."""

    def __init__(self, opts: Any, routing: Subscription, staging: str | None = None) -> None:
        super().__init__(opts)
        self.routing = routing
        self.staging = staging

    def read(self, partition: Any) -> Iterator[Any]:
        """:data:`~cdcflow.decode.batches.EVENT_SCHEMA` batches of an input partition's
        Kafka ranges, each range decoded by a new decoder of its topic's source (the
        source's decoder state is read once per task), or with staging one
        :data:`STAGED_SCHEMA` row naming the file that holds them all.

        Raises:
            ConfigError: a range's topic belongs to no source, or to two.
        """
        ranges = ranges_of(partition)
        routes = []
        for part in ranges:
            route = self.routing.source_topics_of(part.topic)
            if route is None:
                raise ConfigError(f"topic {part.topic!r} was read but belongs to no source")
            routes.append(route)
        batches = self._decode(ranges, routes)
        if self.staging is None:
            return batches
        return self._stage(self.staging, ranges, batches)

    def _decode(self, ranges: Sequence[Any], routes: Sequence[SourceTopics]) -> Iterator[Any]:
        states: dict[str, list[Any]] = {}
        for part, route in zip(ranges, routes, strict=True):
            if route.name not in states:
                states[route.name] = route.decode.load_state()
            yield from route.decode.records(read_records(self.opts, part), states[route.name])

    def _stage(
        self, staging: str, ranges: Sequence[Any], batches: Iterator[pa.RecordBatch]
    ) -> Iterator[Any]:
        os.makedirs(staging, exist_ok=True)
        first = ranges[0]
        name = f"{_UNSAFE.sub('_', first.topic)}-{first.partition}-{first.start}-{first.end}"
        if len(ranges) > 1:  # the task's ranges, named so that a re-run writes the same file
            digest = hashlib.sha1(repr(ranges).encode(), usedforsecurity=False).hexdigest()
            name = f"{name}-and-{len(ranges) - 1}-{digest[:16]}"
        path = os.path.join(staging, f"{name}.arrow")
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        rows = 0
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, EVENT_SCHEMA) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        os.replace(tmp, path)  # atomic: a re-run of the same ranges replaces the file whole
        yield pa.RecordBatch.from_pydict(
            {"staged_path": [path], "rows": [rows]}, schema=STAGED_SCHEMA
        )


class ChangesDataSource(KafkaDataSource):
    """The PySpark data source ``cdcflow_changes`` (streaming reads only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        kafka, _ = _split(dict(self.options))
        parse_options(kafka)
        if _staging(dict(self.options)):
            from pyspark.sql.pandas.types import from_arrow_schema

            return from_arrow_schema(STAGED_SCHEMA)
        return spark_event_schema()

    def streamReader(self, schema: Any) -> ChangesStreamReader:
        options = dict(self.options)
        kafka, routing = _split(options)
        return ChangesStreamReader(parse_options(kafka), routing, _staging(options))


def register(spark: Any) -> None:
    """Register ``cdcflow_changes`` with a SparkSession (once per session)."""
    register_once(spark, ChangesDataSource)

"""Which source a topic belongs to: one streaming query reads every source's topics.

A pipeline runs one Structured Streaming query over the union of its sources' topics
(decision 53): one Python source process and one plan per run instead of one per
source. Each Kafka topic belongs to exactly one source, which gives the format that
decodes it and the offsets ledger that records it. :class:`Subscription` answers that
question on the driver (to split a micro-batch's events by source) and in the decode
tasks (to pick the format); :class:`DecodeByTopic` is the decode step of Spark's JVM
Kafka source (``mapInArrow``), which reads raw records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.decode.batches import DecodeFunction, decode_kafka_batch
from cdcflow.errors import ConfigError

__all__ = ["DecodeByTopic", "SourceTopics", "Subscription", "subscription", "topic_named_twice"]


def subscription(selections: Iterable[tuple[Sequence[str], str | None]]) -> dict[str, str]:
    """The Kafka source option that reads every ``(topics, topic_pattern)`` selection:
    ``subscribe`` when each names its topics, else ``subscribePattern`` (the patterns and
    escaped topic names as one alternation, matched against whole names)."""
    selections = list(selections)
    if all(pattern is None for _, pattern in selections):
        return {"subscribe": ",".join(t for topics, _ in selections for t in topics)}
    parts = [
        f"(?:{pattern})" if pattern is not None else "|".join(re.escape(t) for t in topics)
        for topics, pattern in selections
    ]
    return {"subscribePattern": "|".join(parts)}


def topic_named_twice(sources: Iterable[tuple[str, Iterable[str]]]) -> str | None:
    """Why ``(name, topics)`` pairs are not a valid set of sources: the first topic two of
    them name, as an error message (``None``: each topic is named once)."""
    owner: dict[str, str] = {}
    for name, topics in sources:
        for topic in topics:
            if topic in owner:
                return (
                    f"sources {owner[topic]!r} and {name!r} both name topic {topic!r}: a "
                    "topic belongs to one source (one format, one offsets ledger); remove it "
                    "from one of them"
                )
            owner[topic] = name
    return None


@dataclass(frozen=True)
class SourceTopics:
    """One source's topics and how they are decoded.

    Attributes:
        name: the source's name (``sources[].name``).
        topics: the topics named, or empty when ``topic_pattern`` is set.
        topic_pattern: a regular expression matched against whole topic names.
        decode: the format's decode function (format, options, decoder state).
    """

    name: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    decode: DecodeFunction

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of this source's."""
        if self.topic_pattern is None:
            return topic in self.topics
        if topic.startswith("__"):
            return False  # internal topics (__consumer_offsets), as Kafka's own subscription
        return re.fullmatch(self.topic_pattern, topic) is not None

    def as_json(self) -> dict[str, Any]:
        """The route as JSON (the fused source's ``cdcflow.sources`` option; without the
        warehouse's storage options, which are secrets)."""
        d = self.decode
        return {
            "name": self.name,
            "topics": list(self.topics),
            "topic_pattern": self.topic_pattern,
            "format": d.format_name,
            "format_options": d.options,
            "state_path": d.state_path,
            "state_key": d.state_key,
        }

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any], storage_options: Mapping[str, str] | None = None
    ) -> SourceTopics:
        """The inverse of :meth:`as_json`; ``storage_options`` (the warehouse's, for the
        decoder's state) travel apart: they hold secrets."""
        return cls(
            name=str(data["name"]),
            topics=tuple(data.get("topics") or ()),
            topic_pattern=data.get("topic_pattern"),
            decode=DecodeFunction(
                str(data["format"]),
                dict(data.get("format_options") or {}),
                state_path=data.get("state_path"),
                state_key=str(data.get("state_key") or ""),
                storage_options=dict(storage_options) if storage_options else None,
            ),
        )


@dataclass
class Subscription:
    """The sources of one query, and which one each topic belongs to.

    Args:
        routes: the sources, in configuration order.

    Raises:
        ConfigError: two sources name the same topic.
    """

    routes: Sequence[SourceTopics]
    _owner: dict[str, SourceTopics | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        twice = topic_named_twice((r.name, r.topics) for r in self.routes)
        if twice is not None:
            raise ConfigError(twice)

    @property
    def names(self) -> list[str]:
        """The sources' names, in configuration order."""
        return [r.name for r in self.routes]

    def source_topics_of(self, topic: str) -> SourceTopics | None:
        """The source ``topic`` belongs to (``None``: none reads it).

        Raises:
            ConfigError: ``topic`` is one of two sources (their patterns overlap).
        """
        if topic in self._owner:
            return self._owner[topic]
        found = [r for r in self.routes if r.matches(topic)]
        if len(found) > 1:
            names = " and ".join(repr(r.name) for r in found)
            raise ConfigError(
                f"topic {topic!r} is one of sources {names} (their topics or topic_pattern "
                "overlap): a topic belongs to one source; narrow a topic_pattern"
            )
        owner = found[0] if found else None
        self._owner[topic] = owner
        return owner

    def source_of(self, topic: str) -> str | None:
        """The name of the source ``topic`` belongs to (see :meth:`source_topics_of`)."""
        route = self.source_topics_of(topic)
        return None if route is None else route.name

    def subscription(self) -> dict[str, str]:
        """The Kafka source option that reads every source's topics (:func:`subscription`)."""
        return subscription((r.topics, r.topic_pattern) for r in self.routes)

    def split(self, events: pa.Table) -> dict[str, pa.Table]:
        """A micro-batch's event rows by source (by their ``topic`` column); sources
        without rows are left out.

        Raises:
            ConfigError: a row's topic belongs to no source or to two.
        """
        if events.num_rows == 0:
            return {}
        topics = events.column("topic")
        distinct = pc.unique(topics).to_pylist()
        owners: dict[str, list[str]] = {}
        for topic in distinct:
            name = self.source_of(topic)
            if name is None:
                raise ConfigError(f"topic {topic!r} was read but belongs to no source")
            owners.setdefault(name, []).append(topic)
        if len(owners) == 1:
            return {next(iter(owners)): events}
        out: dict[str, pa.Table] = {}
        for name in self.names:
            if name in owners:
                mask = pc.is_in(topics, value_set=pa.array(owners[name], pa.string()))
                out[name] = events.filter(mask)
        return out


class DecodeByTopic:
    """The picklable ``mapInArrow`` function decoding raw Kafka batches of several
    sources: each batch's rows are decoded by the format of their topic's source.

    Args:
        routing: the query's sources.
    """

    def __init__(self, routing: Subscription) -> None:
        self.routing = routing

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoders: dict[str, Any] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            topics = batch.column(batch.schema.get_field_index("topic"))
            distinct = pc.unique(topics).to_pylist()
            for topic in distinct:
                route = self.routing.source_topics_of(topic)
                if route is None:
                    raise ConfigError(f"topic {topic!r} was read but belongs to no source")
                decoder = decoders.get(route.name)
                if decoder is None:
                    decoder = decoders[route.name] = route.decode.new_decoder()
                part = batch if len(distinct) == 1 else batch.filter(pc.equal(topics, topic))
                yield decode_kafka_batch(decoder, part)

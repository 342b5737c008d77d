"""The options of cdcflow's Python Kafka source: parsed and validated into
:class:`KafkaSourceOptions` (:func:`parse_options`).

Options (names as in Spark's Kafka source, case-insensitive):

=============================  ===========================================================
``kafka.bootstrap.servers``    required; ``host:port[,host:port...]``
``kafka.<librdkafka key>``     passed to librdkafka (``kafka.security.protocol``,
                               ``kafka.sasl.mechanism``, ``kafka.sasl.username``, ...)
``subscribe``                  comma-separated topics
``subscribePattern``           regular expression matched against whole topic names
``assign``                     JSON ``{"topic": [0, 1]}``
``startingOffsets``            ``earliest`` / ``latest`` (default) / JSON
                               ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)
``maxOffsetsPerTrigger``       maximum records per micro-batch, over all partitions
``failOnDataLoss``             ``true`` (default) / ``false``
``kafkaConsumer.pollTimeoutMs``  how long ``read`` waits without progress, ms (120000)
``maxRecordsPerBatch``         rows per Arrow batch yielded by ``read`` (10000)
``outageBudgetMs``             how long transient broker errors are retried, ms (300000;
                               0: fail at the first one). cdcflow's own option
``maxPartitions``              the most Spark tasks a micro-batch is read with: ranges of
                               many topic-partitions are packed into them (default: a
                               task per topic-partition, as Spark's). cdcflow's own option
=============================  ===========================================================

Exactly one of ``subscribe``, ``subscribePattern`` and ``assign`` must be set.
Reference: Spark "Structured Streaming + Kafka Integration Guide" (options).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from cdcflow.errors import ConfigError
from cdcflow.source.outage import BUDGET_KEY
from cdcflow.source.starting_offsets import parse_starting_offsets

__all__ = ["FORBIDDEN_KAFKA_KEYS", "KafkaSourceOptions", "parse_options"]


_DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark: spark.network.timeout
_DEFAULT_RECORDS_PER_BATCH = 10_000
_DEFAULT_OUTAGE_BUDGET_MS = 300_000  # see docs/decisions.md: a broker restart or election fits


# Options of Spark's Kafka source accepted and ignored here (they do not change what
# is read): headers are always included; one input partition per Kafka partition.
_IGNORED_OPTIONS = frozenset(
    {
        "includeheaders",
        "minpartitions",
        "groupidprefix",
        "fetchoffset.numretries",
        "fetchoffset.retryintervalms",
        "maxtriggerdelay",
    }
)
# Options of Spark's Kafka source that change what is read and are not implemented.
_UNSUPPORTED_OPTIONS = {
    "endingoffsets": "endingOffsets is for batch queries; this is a streaming source",
    "startingoffsetsbytimestamp": "start from offsets (startingOffsets) instead",
    "startingtimestamp": "start from offsets (startingOffsets) instead",
    "startingoffsetsbytimestampstrategy": "start from offsets (startingOffsets) instead",
    "minoffsetspertrigger": "remove it (only maxOffsetsPerTrigger is supported)",
}
_OWN_OPTIONS = {
    "subscribe": "subscribe",
    "subscribepattern": "subscribePattern",
    "assign": "assign",
    "startingoffsets": "startingOffsets",
    "maxoffsetspertrigger": "maxOffsetsPerTrigger",
    "failondataloss": "failOnDataLoss",
    "kafkaconsumer.polltimeoutms": "kafkaConsumer.pollTimeoutMs",
    "maxrecordsperbatch": "maxRecordsPerBatch",
    "outagebudgetms": "outageBudgetMs",
    "maxpartitions": "maxPartitions",
}
# librdkafka settings the source owns (Spark rejects the same ones).
FORBIDDEN_KAFKA_KEYS = {
    "auto.offset.reset": "use the option startingOffsets instead",
    "enable.auto.commit": "offsets are kept in Spark's checkpoint, not committed to Kafka",
    "key.deserializer": "keys are always returned as bytes (cast or decode them in Spark)",
    "value.deserializer": "values are always returned as bytes (decode them in Spark)",
}


@dataclasses.dataclass(frozen=True)
class KafkaSourceOptions:
    """Validated options of the Python Kafka source (see the module docstring).

    Attributes:
        client_config: librdkafka configuration: every ``kafka.*`` option without its
            prefix, including ``bootstrap.servers``.
        subscribe: topics to read, or ``None``.
        subscribe_pattern: regular expression matched against whole topic names, or ``None``.
        assign: ``{topic: (partition, ...)}`` to read, or ``None``.
        starting_offsets: ``"earliest"``, ``"latest"`` or ``{topic: {partition: offset}}``
            with -2 for earliest and -1 for latest.
        max_offsets_per_trigger: maximum records per micro-batch, or ``None`` (no limit).
        fail_on_data_loss: raise on records lost to retention or topic re-creation.
        poll_timeout_ms: how long ``read`` waits for the next record, ms.
        max_records_per_batch: rows per Arrow record batch.
        outage_budget_s: how long transient broker errors are retried, seconds (0: none).
        max_partitions: the most Spark input partitions (tasks) a micro-batch is read
            with, or ``None``: one per topic-partition with records (:func:`~cdcflow.source.kafka.planning.pack_ranges`).
        outage_budget_key: the configuration key of ``outage_budget_s`` that warnings
            and errors name (the start-up check's is ``kafka.startup_timeout_s``).
    """

    client_config: Mapping[str, str]
    subscribe: tuple[str, ...] | None = None
    subscribe_pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] | None = None
    starting_offsets: str | Mapping[str, Mapping[int, int]] = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = _DEFAULT_POLL_TIMEOUT_MS
    max_records_per_batch: int = _DEFAULT_RECORDS_PER_BATCH
    outage_budget_s: float = _DEFAULT_OUTAGE_BUDGET_MS / 1000.0
    max_partitions: int | None = None
    #: the configuration key named in outage warnings and errors
    outage_budget_key: str = BUDGET_KEY

    @property
    def bootstrap_servers(self) -> str:
        """``kafka.bootstrap.servers``."""
        return str(self.client_config["bootstrap.servers"])

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one this source reads."""
        if self.subscribe is not None:
            return topic in self.subscribe
        if self.assign is not None:
            return topic in self.assign
        assert self.subscribe_pattern is not None
        return re.fullmatch(self.subscribe_pattern, topic) is not None


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def _outage_budget_ms(raw: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"option outageBudgetMs must be a whole number of milliseconds >= 0, got {raw!r}; "
            "e.g. 300000 to retry an unreachable broker for 5 minutes, 0 to fail at once "
            "(in the pipeline YAML: kafka.outage_budget_s)"
        )
    return value


def _parse_starting_offsets(raw: str) -> str | dict[str, dict[int, int]]:
    try:
        return parse_starting_offsets(raw)
    except ValueError as exc:
        raise ConfigError(f"option startingOffsets: {exc}") from None


def _parse_assign(raw: str) -> dict[str, tuple[int, ...]]:
    fix = 'use JSON such as {"topicA":[0,1],"topicB":[0]}'
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"option assign={raw!r} is not valid JSON; {fix}") from exc
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError(f"option assign={raw!r} is not valid; {fix}")
    result = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise ConfigError(f"option assign: {topic!r} must map to a list of partitions; {fix}")
        result[topic] = tuple(sorted(set(parts)))
    return result


def parse_options(options: Mapping[str, Any]) -> KafkaSourceOptions:
    """Validate the options of the Kafka source.

    Args:
        options: option name -> value as given to ``DataStreamReader.option``; names
            are case-insensitive.

    Returns:
        The validated options.

    Raises:
        ConfigError: a required option is missing, a value is malformed, the options
            name no or several topic selections, or an option is unknown or not
            supported; the message names the option and the fix.
    """
    opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in options.items()}
    unknown = sorted(
        k
        for k in opts
        if not k.startswith("kafka.")
        and k not in _OWN_OPTIONS
        and k not in _IGNORED_OPTIONS
        and k not in _UNSUPPORTED_OPTIONS
    )
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown} for the Kafka source; valid options: "
            f"{sorted(_OWN_OPTIONS.values())} and kafka.<librdkafka setting>"
        )
    for key in opts:
        if key in _UNSUPPORTED_OPTIONS:
            raise ConfigError(
                f"option {key} is not supported by cdcflow's Kafka source; "
                f"{_UNSUPPORTED_OPTIONS[key]}"
            )

    client: dict[str, str] = {}
    for key, value in opts.items():
        if key.startswith("kafka."):
            name = key[len("kafka.") :]
            if name in FORBIDDEN_KAFKA_KEYS:
                raise ConfigError(
                    f"option kafka.{name} is not supported: {FORBIDDEN_KAFKA_KEYS[name]}"
                )
            client[name] = value
    if not client.get("bootstrap.servers", "").strip():
        raise ConfigError(
            "option kafka.bootstrap.servers is required: set it to the broker list, "
            "e.g. .option('kafka.bootstrap.servers', 'host1:9092,host2:9092')"
        )

    chosen = [_OWN_OPTIONS[k] for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(chosen) != 1:
        what = "none of them is set" if not chosen else f"{' and '.join(chosen)} are all set"
        raise ConfigError(
            "set exactly one of the options subscribe (comma-separated topics), "
            f"subscribePattern (regular expression) or assign (JSON); {what}"
        )
    subscribe = pattern = assign = None
    if opts.get("subscribe"):
        subscribe = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise ConfigError("option subscribe names no topic; give comma-separated topics")
    elif opts.get("subscribepattern"):
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"option subscribePattern={pattern!r} is not a valid regular expression: {exc}"
            ) from exc
    else:
        assign = _parse_assign(opts["assign"])

    starting: str | dict[str, dict[int, int]] = "latest"
    if opts.get("startingoffsets"):
        starting = _parse_starting_offsets(opts["startingoffsets"])
    max_per_trigger = None
    if opts.get("maxoffsetspertrigger"):
        max_per_trigger = _positive_int("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"])
    fail = opts.get("failondataloss", "true").strip().lower()
    if fail not in ("true", "false"):
        raise ConfigError(f"option failOnDataLoss must be true or false, got {fail!r}")
    poll_ms = _DEFAULT_POLL_TIMEOUT_MS
    if opts.get("kafkaconsumer.polltimeoutms"):
        poll_ms = _positive_int("kafkaConsumer.pollTimeoutMs", opts["kafkaconsumer.polltimeoutms"])
    per_batch = _DEFAULT_RECORDS_PER_BATCH
    if opts.get("maxrecordsperbatch"):
        per_batch = _positive_int("maxRecordsPerBatch", opts["maxrecordsperbatch"])
    budget_ms = _DEFAULT_OUTAGE_BUDGET_MS
    if opts.get("outagebudgetms", "").strip():
        budget_ms = _outage_budget_ms(opts["outagebudgetms"])
    max_partitions = None
    if opts.get("maxpartitions", "").strip():
        max_partitions = _positive_int("maxPartitions", opts["maxpartitions"])
    return KafkaSourceOptions(
        client_config=client,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=starting,
        max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=fail == "true",
        poll_timeout_ms=poll_ms,
        max_records_per_batch=per_batch,
        outage_budget_s=budget_ms / 1000.0,
        max_partitions=max_partitions,
    )

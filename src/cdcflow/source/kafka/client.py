"""The confluent-kafka (librdkafka) client of the Kafka source: its configuration
(:func:`client_config`, :func:`make_consumer`) and its error policy -- which errors a
broker outage causes and are retried (:func:`is_transient`), which mean refused
credentials or access (:func:`refused_access`), and the one-line errors they become
(:func:`kafka_error`).

librdkafka's own log lines go to the Python logger ``cdcflow.source.librdkafka`` at
DEBUG level. Reference: librdkafka's CONFIGURATION.md and its error codes (rdkafka.h).
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any, Literal

from cdcflow.errors import ConfigError, SourceError
from cdcflow.source.kafka.options import KafkaSourceOptions

__all__ = [
    "REQUEST_TIMEOUT_S",
    "ErrorSink",
    "Refusal",
    "client_config",
    "error_text",
    "is_transient",
    "kafka_error",
    "make_consumer",
    "refused_access",
    "watermarks_of",
]


# A metadata or offsets request waits this long at most. While the brokers are down
# librdkafka waits out the whole timeout, so it is also how soon an outage is reported
# (a slow answer is only retried, within the outage budget).
REQUEST_TIMEOUT_S = 10.0


# librdkafka error codes of a broker that is down, restarting, electing a leader or out
# of reach for a while. An unknown topic or partition is here too: the source asks only
# about partitions the metadata just listed, so "unknown" means stale metadata or no
# leader yet (librdkafka answers _UNKNOWN_PARTITION at once while its broker is down).
# _DESTROY_BROKER fails the requests outstanding on a broker connection librdkafka tore
# down; seen here when the broker went away mid-request (tests/e2e/test_broker_outage.py).
_TRANSIENT_CODES = (
    "_TRANSPORT",
    "_DESTROY_BROKER",
    "_ALL_BROKERS_DOWN",
    "_TIMED_OUT",
    "_TIMED_OUT_QUEUE",
    "_RESOLVE",
    "_WAIT_COORD",
    "_UNKNOWN_PARTITION",
    "_UNKNOWN_TOPIC",
    "UNKNOWN_TOPIC_OR_PART",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "REQUEST_TIMED_OUT",
    "BROKER_NOT_AVAILABLE",
    "REPLICA_NOT_AVAILABLE",
    "NETWORK_EXCEPTION",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "NOT_COORDINATOR",
    "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "KAFKA_STORAGE_ERROR",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE",
    "PREFERRED_LEADER_NOT_AVAILABLE",
)
_transient_codes: frozenset[int] | None = None


def is_transient(err: Any) -> bool:
    """Whether a librdkafka error is one a broker outage causes, to be retried.

    Transient: the codes in ``_TRANSIENT_CODES`` (transport failure, all brokers down,
    timeouts, name resolution, no leader, unknown partition, ...) and any error
    librdkafka marks retriable. Never transient: fatal errors, and everything else
    (authentication, authorization, SSL, invalid settings, offsets out of range).

    Args:
        err: a ``confluent_kafka.KafkaError``, or a ``KafkaException`` carrying one;
            anything else is not transient.
    """
    global _transient_codes
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException):
        err = err.args[0] if err.args else None
    if not isinstance(err, KafkaError) or err.fatal():
        return False
    if _transient_codes is None:
        _transient_codes = frozenset(
            getattr(KafkaError, name) for name in _TRANSIENT_CODES if hasattr(KafkaError, name)
        )
    return err.code() in _transient_codes or bool(err.retriable())


def error_text(err: Any) -> str:
    """One line: ``NAME: description`` of a KafkaError (or the text of anything else)."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        err = err.args[0]
    if isinstance(err, KafkaError):
        return " ".join(f"{err.name()}: {err.str()}".split())
    return " ".join(str(err).split())


class ErrorSink:
    """librdkafka's ``error_cb``: keeps the newest client-level error (broker down,
    authentication failed, ...). librdkafka calls it from ``poll``/``consume``.

    A failed request often says only "transport failure" while the client's own error
    events say why (e.g. ``_AUTHENTICATION``, which is not transient); such an error is
    kept apart so that a later "all brokers down" does not hide it."""

    __slots__ = ("last", "permanent")

    def __init__(self) -> None:
        self.last: Any = None  # confluent_kafka.KafkaError
        self.permanent: Any = None  # the newest that is not transient

    def __call__(self, err: Any) -> None:
        self.last = err
        if not is_transient(err):
            self.permanent = err

    def take(self) -> Any:
        """The newest error that is not transient since the last call, else the newest
        error, or ``None``; forgets them."""
        err = self.permanent if self.permanent is not None else self.last
        self.last = self.permanent = None
        return err


class _LibrdkafkaLog:
    """librdkafka's log lines (``logger``) to the Python logger ``cdcflow.source.librdkafka``
    at DEBUG level: during an outage librdkafka logs every reconnect, many per second;
    the source's own warnings (one per retry) say what matters."""

    def __init__(self) -> None:
        self._log = logging.getLogger("cdcflow.source.librdkafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug(msg, *args)


def client_config(
    opts: KafkaSourceOptions, role: str, errors: ErrorSink | None = None
) -> dict[str, Any]:
    """The librdkafka configuration of a consumer of the source: a group id of its own
    (``cdcflow-kafka-source-<role>-<random>``; nothing is committed to it), no offset
    commits or stores, ``auto.offset.reset=error`` (the source decides where a read
    starts), end-of-partition events, fetch sizes, librdkafka's log to
    ``cdcflow.source.librdkafka``; then the options' ``kafka.*`` settings over these.

    Args:
        opts: validated source options.
        role: who uses the client (``driver``, ``executor``, ``monitor``), in the group id.
        errors: librdkafka's ``error_cb``, or ``None`` for none.

    Returns:
        The configuration for ``confluent_kafka.Consumer``.
    """
    config: dict[str, Any] = {
        "group.id": f"cdcflow-kafka-source-{role}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # Spark's default: read records of open transactions too, up to the high watermark.
        "isolation.level": "read_uncommitted",
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "fetch.wait.max.ms": 100,
        "logger": _LibrdkafkaLog(),
    }
    if errors is not None:
        config["error_cb"] = errors
    config.update(opts.client_config)
    return config


def make_consumer(opts: KafkaSourceOptions, role: str, errors: ErrorSink | None = None) -> Any:
    """A ``confluent_kafka.Consumer`` configured by :func:`client_config`.

    Raises:
        ConfigError: librdkafka refuses a ``kafka.*`` setting (the message names it).
    """
    from confluent_kafka import Consumer, KafkaException

    try:
        return Consumer(client_config(opts, role, errors))
    except (KafkaException, ValueError, TypeError) as exc:
        text = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
        unknown = re.match(r'No such configuration property: "([^"]+)"', text)
        what = (
            f"kafka.options: librdkafka has no setting {unknown.group(1)!r}"
            if unknown
            else f"librdkafka rejected the kafka.* options: {text}"
        )
        raise ConfigError(
            f"{what}; kafka.options are passed to librdkafka, whose setting names can "
            "differ from the Java client's (see "
            "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)"
        ) from None


#: librdkafka's and Kafka's error names of refused credentials and refused access
_AUTHENTICATION_ERRORS = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL")
_AUTHORIZATION_ERRORS = (
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
)


#: what the brokers refused: the client's credentials, or its access
Refusal = Literal["authentication", "authorization"]


def refused_access(err: Any) -> Refusal | None:
    """``"authentication"`` when the brokers refused the client's credentials (a failed
    SASL handshake, an SSL failure), ``"authorization"`` when they refused it access (ACLs),
    else ``None``.

    Args:
        err: a ``confluent_kafka.KafkaError``, or a ``KafkaException`` carrying one.
    """
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    if not isinstance(err, KafkaError):
        return None
    if err.name() in _AUTHENTICATION_ERRORS:
        return "authentication"
    if err.name() in _AUTHORIZATION_ERRORS:
        return "authorization"
    return None


def kafka_error(exc: BaseException, what: str) -> SourceError:
    """The one-line :class:`SourceError` of a Kafka error that is not retried: refused
    credentials or access name the settings to fix (its ``refused`` attribute says which,
    see :func:`refused_access`), anything else the brokers and the client settings.

    Args:
        exc: a ``confluent_kafka.KafkaException`` or ``KafkaError``.
        what: what failed, e.g. ``"listing the topics"``.
    """
    refused = refused_access(exc)
    if refused is not None:
        error = _refused_error(exc, what, refused)
        error.refused = refused
        return error
    return SourceError(
        f"{what}: {error_text(exc)}; check kafka.bootstrap.servers, the kafka.* client "
        "settings and that the brokers are up"
    )


def _refused_error(exc: BaseException, what: str, refused: Refusal) -> SourceError:
    if refused == "authentication":
        return SourceError(
            f"{what}: authentication failed, the brokers refused the client's credentials "
            f"({error_text(exc)}); fix kafka.options: security.protocol, sasl.mechanism, "
            "sasl.username and sasl.password (or the ssl.* settings)"
        )
    return SourceError(
        f"{what}: authorization failed, the brokers refused access ({error_text(exc)}); "
        "the user of kafka.options' sasl.username needs Describe and Read on the topics "
        "(Kafka ACLs)"
    )


def watermarks_of(
    consumer: Any, topic: str, partition: int, timeout_s: float = REQUEST_TIMEOUT_S
) -> tuple[int, int]:
    """``(low, high)`` of one partition, asked of the broker (not librdkafka's cache).

    Raises:
        confluent_kafka.KafkaException: the request failed.
    """
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(
        TopicPartition(topic, partition), timeout=timeout_s, cached=False
    )
    return int(low), int(high)

"""The executor side of the Kafka source: the records ``[start, end)`` of one
topic-partition, read with a confluent-kafka consumer (:func:`read_partition` as Arrow
batches of :data:`~cdcflow.source.kafka.schema.ARROW_SCHEMA`, :func:`read_records` as
decoder records).

A read stops exactly before ``end``, never yields a record twice or outside its range,
raises ``DATA_LOSS`` for records deleted before they were read (unless
``failOnDataLoss=false``), and waits out broker outages within ``outageBudgetMs``
(:mod:`cdcflow.source.outage`) -- see :func:`_read_columns`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from cdcflow.errors import SourceError
from cdcflow.formats.base import Record, new_record
from cdcflow.model import new_origin
from cdcflow.source.kafka.client import (
    REQUEST_TIMEOUT_S,
    ErrorSink,
    error_text,
    is_transient,
    kafka_error,
    make_consumer,
    watermarks_of,
)
from cdcflow.source.kafka.options import KafkaSourceOptions
from cdcflow.source.kafka.planning import DATA_LOSS, KafkaInputPartition, resolve_start_offset
from cdcflow.source.kafka.schema import ARROW_SCHEMA
from cdcflow.source.outage import OutageBudget

__all__ = ["read_partition", "read_records", "worker_logging"]

log = logging.getLogger(__name__)

_HEADERS_TYPE = ARROW_SCHEMA.field("headers").type

_STALL_CHECK_S = 2.0  # a read without records this long asks the broker for the offsets
_PROBE_TIMEOUT_S = 5.0


def read_partition(opts: KafkaSourceOptions, part: KafkaInputPartition) -> Iterator[Any]:
    """Read the records ``[part.start, part.end)`` of one topic-partition as Arrow batches
    (see :func:`_read_columns` for the reading rules and errors).

    Yields:
        ``pyarrow.RecordBatch`` with :data:`ARROW_SCHEMA`, up to
        ``opts.max_records_per_batch`` rows each, in offset order.
    """
    for cols in _read_columns(opts, part):
        yield cols.to_record_batch(part.topic, part.partition)


def read_records(opts: KafkaSourceOptions, part: KafkaInputPartition) -> Iterator[list[Record]]:
    """Read the records ``[part.start, part.end)`` of one topic-partition as decoder
    :class:`~cdcflow.formats.base.Record` lists, without an Arrow batch in between (the
    fused decode source; same rules and errors as :func:`read_partition`).

    Yields:
        Lists of up to ``opts.max_records_per_batch`` records, in offset order.
    """
    for cols in _read_columns(opts, part):
        yield cols.to_records(part.topic, part.partition)


def _read_columns(opts: KafkaSourceOptions, part: KafkaInputPartition) -> Iterator[_Columns]:
    """Read the records ``[part.start, part.end)`` of one topic-partition, batch by batch.

    The consumer is assigned to the partition at ``part.start`` and stops at the first
    record at or beyond ``part.end`` (or at the end of the log): no record outside the
    range is ever emitted. Gaps inside the range (compaction, transaction markers) are
    normal and skipped.

    A broker outage -- a transient error (:func:`is_transient`) reported by the consumer,
    or no record for ``kafkaConsumer.pollTimeoutMs`` while the partition's offsets cannot
    be fetched -- is waited out: each failed attempt logs one warning and waits its
    backoff while polling, and the next attempt uses a new consumer assigned at the next
    offset to read, until records arrive again or the outage budget is spent.

    Args:
        opts: source options (client configuration, failOnDataLoss, timeouts, budget).
        part: topic, partition and offset range.

    Yields:
        :class:`_Columns` of up to ``opts.max_records_per_batch`` records, in offset order.

    Raises:
        SourceError: code ``DATA_LOSS`` if records of the range were deleted and
            ``failOnDataLoss`` is true; ``SOURCE_UNAVAILABLE`` when the brokers stay
            unreachable for ``outageBudgetMs``; otherwise when no record arrives within
            ``kafkaConsumer.pollTimeoutMs`` although the broker answers, or the consumer
            reports an error that is not transient.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    if part.end <= part.start:
        return
    worker_logging()
    errors = ErrorSink()
    outage = OutageBudget(opts.outage_budget_s, opts.bootstrap_servers, key=opts.outage_budget_key)
    topic, partition, end = part.topic, part.partition, part.end
    next_offset = part.start
    consumer = make_consumer(opts, "executor", errors)
    try:
        consumer.assign([TopicPartition(topic, partition, next_offset)])
        timeout_s = opts.poll_timeout_ms / 1000.0
        stall_s = min(_STALL_CHECK_S, timeout_s)
        last_progress = time.monotonic()  # last record, or the end of an outage
        check_at = last_progress + stall_s  # when a read without records is looked into
        while next_offset < end:
            want = min(opts.max_records_per_batch, end - next_offset)
            try:
                msgs = consumer.consume(num_messages=want, timeout=min(1.0, timeout_s))
            except KafkaException as exc:
                if not is_transient(exc):
                    raise kafka_error(exc, f"reading {topic}[{partition}]") from exc
                errors.last, msgs = exc.args[0], []
            # (not ``.count(None)``: confluent-kafka's KafkaError cannot be compared with None)
            if msgs and not any([m.error() for m in msgs]):
                # Fast path: no error events and every record inside the range.
                offsets = [m.offset() for m in msgs]
                if offsets[0] >= next_offset and offsets[-1] < end:
                    next_offset = offsets[-1] + 1
                    last_progress = time.monotonic()
                    check_at = last_progress + stall_s
                    errors.take()  # records arrive: earlier errors are stale
                    if outage.failing:
                        outage.ok()
                    yield _Columns.of(msgs, offsets)
                    continue
            # Slow path, record by record: error events, or records outside the range.
            cols = _Columns()
            add_key, add_value, add_offset = (
                cols.keys.append,
                cols.values.append,
                cols.offsets.append,
            )
            add_kind, add_stamp, add_headers = (
                cols.kinds.append,
                cols.stamps.append,
                cols.headers.append,
            )
            done = False
            for m in msgs:
                err = m.error()
                if err is not None:
                    code = err.code()
                    try:
                        if code == KafkaError._PARTITION_EOF:
                            if m.offset() >= end:
                                done = True
                                break
                            next_offset = _check_log_end(opts, consumer, part, next_offset)
                            if next_offset >= end:
                                done = True
                                break
                            continue
                        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                            next_offset = _recover_out_of_range(opts, consumer, part, next_offset)
                            if next_offset >= end:
                                done = True
                                break
                            continue
                    except KafkaException as exc:
                        if not is_transient(exc):
                            raise kafka_error(
                                exc, f"querying the offsets of {topic}[{partition}]"
                            ) from exc
                        errors.last = exc.args[0]
                        break
                    if is_transient(err):
                        errors.last = err
                        continue
                    raise SourceError(
                        f"reading topic {topic!r} partition {partition} at offset "
                        f"{next_offset}: {error_text(err)}"
                    )
                off = m.offset()
                if off < next_offset:
                    continue  # before the range (or a re-delivery): never emitted twice
                if off >= end:
                    done = True
                    break
                add_key(m.key())
                add_value(m.value())
                add_offset(off)
                kind, ms = m.timestamp()
                add_kind(kind)
                add_stamp(ms)
                add_headers(m.headers())
                next_offset = off + 1
            if cols.offsets:
                last_progress = time.monotonic()
                check_at = last_progress + stall_s
                errors.take()
                if outage.failing:
                    outage.ok()
                yield cols
            if done:
                break
            if cols.offsets:
                continue
            # No record this round. Records of the range are in the log, so a read without
            # records for a while is an outage (an error event, or no offsets from the
            # broker) or a slow broker (pollTimeoutMs); before that, keep polling -- also
            # through the backoff of an outage, so its end is seen at once.
            now = time.monotonic()
            if now < check_at:
                continue
            err = errors.take()
            if err is None:
                try:
                    probe_s = min(_PROBE_TIMEOUT_S, outage.attempt_timeout_s(REQUEST_TIMEOUT_S))
                    watermarks_of(consumer, topic, partition, probe_s)
                except KafkaException as exc:
                    if not is_transient(exc):
                        raise kafka_error(
                            exc, f"querying the offsets of {topic}[{partition}]"
                        ) from exc
                    err = errors.take() or exc.args[0]  # the client's own event says more
                else:
                    if outage.failing:  # reachable again: pollTimeoutMs from now
                        outage.ok()
                        last_progress = now
                    elif now - last_progress > timeout_s:
                        raise SourceError(
                            f"no record of topic {topic!r} partition {partition} arrived for "
                            f"{opts.poll_timeout_ms} ms while reading offsets "
                            f"{next_offset}..{end - 1} although the broker answers; check the "
                            "brokers, or raise the option kafkaConsumer.pollTimeoutMs"
                        )
                    check_at = time.monotonic() + stall_s
                    continue
            if not is_transient(err):
                raise SourceError(
                    f"reading topic {topic!r} partition {partition} at offset "
                    f"{next_offset}: {error_text(err)}; check kafka.bootstrap.servers and "
                    "the kafka.* client settings"
                )
            delay = outage.failed(
                f"reading {topic}[{partition}] at offset {next_offset}",
                error_text(err),
                since=last_progress,
            )
            check_at = time.monotonic() + delay
            consumer = _renew_consumer(opts, consumer, errors, topic, partition, next_offset)
    finally:
        consumer.close()


def _renew_consumer(
    opts: KafkaSourceOptions,
    consumer: Any,
    errors: ErrorSink,
    topic: str,
    partition: int,
    offset: int,
) -> Any:
    """Close ``consumer`` and return a new one assigned to ``topic[partition]`` at ``offset``."""
    from confluent_kafka import TopicPartition

    try:
        consumer.close()
    except Exception:  # noqa: BLE001 - a client of an unreachable broker
        log.debug("closing the Kafka consumer failed", exc_info=True)
    errors.take()
    fresh = make_consumer(opts, "executor", errors)
    fresh.assign([TopicPartition(topic, partition, offset)])
    return fresh


def worker_logging() -> None:
    """In a Spark Python worker (no logging configured), show cdcflow's warnings on
    stderr in the driver's format instead of Python's bare last-resort lines."""
    root = logging.getLogger()
    package = logging.getLogger("cdcflow")
    if root.handlers or package.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(logging.WARNING)


def _recover_out_of_range(
    opts: KafkaSourceOptions, consumer: Any, part: KafkaInputPartition, next_offset: int
) -> int:
    """After "offset out of range": raise DATA_LOSS, or seek to the low watermark."""
    from confluent_kafka import TopicPartition

    low, high = watermarks_of(consumer, part.topic, part.partition)
    start = resolve_start_offset(
        part.topic, part.partition, next_offset, low, high, opts.fail_on_data_loss
    )
    consumer.assign([TopicPartition(part.topic, part.partition, start)])
    return start


def _check_log_end(
    opts: KafkaSourceOptions, consumer: Any, part: KafkaInputPartition, next_offset: int
) -> int:
    """End of log reached before ``part.end``: was the log truncated?"""
    low, high = watermarks_of(consumer, part.topic, part.partition)
    if high >= part.end:
        return next_offset  # more records are on their way
    if high <= next_offset:
        # The log ends before the planned range: offsets went backwards.
        if opts.fail_on_data_loss:
            raise SourceError(
                f"topic {part.topic!r} partition {part.partition} now ends at offset {high} "
                f"but offsets up to {part.end - 1} were planned for this micro-batch; the "
                "topic was deleted and re-created or its log was truncated. To go on, reset "
                "this query's checkpoint or set the option failOnDataLoss=false",
                DATA_LOSS,
            )
        log.warning(
            "%s[%d] ends at %d before the planned end %d; failOnDataLoss=false: stopping",
            part.topic,
            part.partition,
            high,
            part.end,
        )
        return part.end
    return next_offset


class _Columns:
    """Column lists of one Arrow batch, filled one Kafka message at a time."""

    __slots__ = ("keys", "values", "offsets", "kinds", "stamps", "headers")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.kinds: list[int] = []  # confluent-kafka TIMESTAMP_* (0 none, 1 create, 2 append)
        self.stamps: list[int] = []  # epoch ms
        self.headers: list[list[tuple[str, bytes | None]] | None] = []

    @classmethod
    def of(cls, msgs: Sequence[Any], offsets: list[int]) -> _Columns:
        """Columns of error-free messages whose offsets are ``offsets``."""
        cols = cls()
        cols.keys = [m.key() for m in msgs]
        cols.values = [m.value() for m in msgs]
        cols.offsets = offsets
        stamps = [m.timestamp() for m in msgs]
        cols.kinds = [t[0] for t in stamps]
        cols.stamps = [t[1] for t in stamps]
        cols.headers = [m.headers() for m in msgs]
        return cols

    def to_records(self, topic: str, partition: int) -> list[Record]:
        """The rows as decoder records (the same values :func:`records_from_kafka_batch`
        gives for :meth:`to_record_batch`'s batch: epoch-ms timestamps, ``None`` where the
        message has none)."""
        return [
            new_record(
                v, k, tuple(hs) if hs else (), new_origin(topic, partition, o), ms if kind else None
            )
            for v, k, o, kind, ms, hs in zip(
                self.values,
                self.keys,
                self.offsets,
                self.kinds,
                self.stamps,
                self.headers,
                strict=True,
            )
        ]

    def to_record_batch(self, topic: str, partition: int) -> Any:
        """The rows as a ``pyarrow.RecordBatch`` with :data:`ARROW_SCHEMA`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.offsets)
        kinds = pa.array(self.kinds, pa.int32())
        # confluent-kafka's 0/1/2 (none/create/log-append) are Kafka's ids -1/0/1 plus one.
        ts_type = pc.subtract(kinds, pa.scalar(1, pa.int32()))
        micros = pc.multiply(pa.array(self.stamps, pa.int64()), pa.scalar(1000, pa.int64()))
        stamps = pc.if_else(pc.equal(kinds, 0), pa.scalar(None, pa.int64()), micros)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([topic] * n, pa.string()),
                pa.array([partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                stamps.cast(pa.timestamp("us", tz="UTC")),
                ts_type,
                pa.array(self.headers, _HEADERS_TYPE),
            ],
            schema=ARROW_SCHEMA,
        )

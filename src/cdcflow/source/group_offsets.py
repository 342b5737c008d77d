"""The applied offsets, committed to a Kafka consumer group for monitoring tools.

cdcflow resumes from the offsets its warehouse records (``_cdcflow/batches``), never from
Kafka's: its readers use throw-away group ids and commit nothing (Spark's Kafka source
does the same). Operators still expect ``kafka-consumer-groups --describe --group G`` and
Kafka UIs to show a pipeline's position and lag, as they do for Kafka Connect's sink
connectors (``connect-<name>``). So after each applied micro-batch the driver commits
the next offset of every partition it applied to ``kafka.group_id`` (default
``cdcflow-<pipeline_id>``), with a consumer that never joins the group (no subscription,
no rebalance: a "simple" consumer's offset commit).

A failed commit is logged once as a warning and never stops the pipeline: the offsets
are for people, not for resuming.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from cdcflow.source.kafka.client import client_config
from cdcflow.source.kafka.options import parse_options

__all__ = ["GroupOffsets"]

log = logging.getLogger(__name__)

_SUBSCRIPTIONS = ("subscribe", "subscribepattern", "assign")

#: seconds a commit may take before it is given up (the next micro-batch commits again)
_COMMIT_TIMEOUT_S = 5.0


class GroupOffsets:
    """Commits ``{(topic, partition): next_offset}`` to one consumer group, on a thread of
    its own: :meth:`submit` never waits for Kafka (a commit to an unreachable coordinator
    can block for long), and offsets submitted while a commit runs are merged into the
    next one.

    Args:
        options: the Kafka source options (Spark's names: ``kafka.bootstrap.servers``,
            ``kafka.<librdkafka setting>``), as :meth:`KafkaConfig.reader_options` gives.
        group_id: the consumer group.
    """

    def __init__(self, options: Mapping[str, Any], group_id: str) -> None:
        self.options = options
        self.group_id = group_id
        self._consumer: Any = None
        self._warned = False
        self._pending: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        #: commits made, for the tests and the console
        self.commits = 0

    def submit(self, next_offsets: Mapping[tuple[str, int], int]) -> None:
        """Have ``next_offsets`` committed soon (merged with those not committed yet)."""
        if not next_offsets:
            return
        with self._lock:
            for tp, offset in next_offsets.items():
                self._pending[tp] = max(offset, self._pending.get(tp, offset))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="cdcflow-group-offsets", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                pending, self._pending = self._pending, {}
                stop = self._stop
            if pending:
                self._commit(pending)
            if stop:
                return

    def _commit(self, next_offsets: Mapping[tuple[str, int], int]) -> bool:
        from confluent_kafka import TopicPartition

        try:
            consumer = self._client()
            consumer.commit(
                offsets=[
                    TopicPartition(t, p, int(o)) for (t, p), o in sorted(next_offsets.items())
                ],
                asynchronous=False,
            )
        except Exception as exc:  # noqa: BLE001 - monitoring never stops the pipeline
            if not self._warned:
                log.warning(
                    "could not commit the applied offsets to consumer group %s (for monitoring "
                    "only; the warehouse's offsets are what a run resumes from): %s",
                    self.group_id,
                    exc,
                )
                self._warned = True
            return False
        self.commits += 1
        return True

    def _client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            options = dict(self.options)
            if not any(k.lower() in _SUBSCRIPTIONS for k in options):
                options["subscribe"] = "cdcflow-monitoring"  # required; never subscribed
            config = client_config(parse_options(options), "monitor")
            config.update(
                {"group.id": self.group_id, "socket.timeout.ms": int(_COMMIT_TIMEOUT_S * 1000)}
            )
            config.pop("enable.partition.eof", None)
            self._consumer = Consumer(config)
        return self._consumer

    def close(self, timeout_s: float = _COMMIT_TIMEOUT_S) -> None:
        """Commit what is pending (waiting at most ``timeout_s``), then close the client;
        a commit still hanging then is left to its daemon thread."""
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                return
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                log.debug("could not close the monitoring consumer", exc_info=True)

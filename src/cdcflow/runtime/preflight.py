"""What can be checked before Spark starts, in seconds: the brokers, the topics and the
folders a run writes (issue 19, "Everything checked before Spark starts").

The configuration itself is checked when it is loaded (:mod:`cdcflow.config`). What needs
the outside world is checked here, by :func:`preflight`, which ``cdcflow run`` calls
under the pipeline's lease before it starts Spark and ``cdcflow validate`` calls alone:

* **librdkafka settings**: the client is built from ``kafka.options``; a setting it
  refuses is a :class:`~cdcflow.errors.ConfigError` naming it (exit 2);
* **the brokers**: their metadata is asked for within ``kafka.startup_timeout_s``
  (default 30 s), not the mid-run outage budget (``kafka.outage_budget_s``, 300 s): a
  mistyped address fails in that time with ``SOURCE_UNAVAILABLE`` (exit 69), brokers
  still starting (a compose file) are waited for;
* **the topics**: each source's topics (or pattern) and the partitions found; a topic
  that does not exist yet is reported, not an error (a pipeline may start before its
  topics: they are read once created); a topic two sources' patterns match is a
  ``ConfigError`` naming both;
* **the folders**: the warehouse and the checkpoint, when local, are created if needed and
  written once (a probe file, removed at once); one that cannot be written is a
  :class:`~cdcflow.errors.StorageError` (exit 74);
* **a warehouse on an object store**: listed, written, read, and two commits of one Delta
  version made, of which the store must refuse the second (put-if-absent, what the lease
  and exactly-once commits rely on): :meth:`~cdcflow.sinks.storage.Storage.probe`, in a
  ``_cdcflow/probes/`` prefix deleted again; a failure is a ``StorageError`` (exit 74)
  naming the step.

Kafka Connect's ``PUT /connector-plugins/{name}/config/validate`` and Flink's job
submission checks are the models: one answer per item, before any work.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from cdcflow.config import PipelineConfig
from cdcflow.decode.batches import DecodeFunction
from cdcflow.errors import CdcflowError, ConfigError, SourceError, StorageError
from cdcflow.sinks.faults import storage_error
from cdcflow.sinks.storage import Storage
from cdcflow.source.subscription import SourceTopics, Subscription

__all__ = ["Check", "STARTUP_KEY", "preflight"]

STARTUP_KEY = "kafka.startup_timeout_s"


@dataclass(frozen=True)
class Check:
    """One item checked.

    Attributes:
        item: what was checked, as the configuration names it (``kafka``,
            ``sources[0] (pg)``, ``warehouse``, ``checkpoint``).
        ok: whether it passed.
        detail: one line: what was found, or the error and its fix.
        seconds: how long the check took.
        error: the error raised, when ``ok`` is false (to re-raise with its exit code).
    """

    item: str
    ok: bool
    detail: str
    seconds: float
    error: CdcflowError | None = None


def preflight(config: PipelineConfig, *, brokers: bool = True) -> list[Check]:
    """Check what a run of ``config`` needs outside itself; every check runs, in order.

    Args:
        config: the loaded configuration.
        brokers: ask the brokers (``False``: folders only).

    Returns:
        The checks: the folders, then ``kafka`` (settings and brokers), then one per
        source (its topics and partitions). After a failed ``kafka`` check the sources
        are not checked.
    """
    checks = [
        _writable("warehouse", config.warehouse, config.storage),
        _writable("checkpoint", config.checkpoint, config.storage),
    ]
    if config.monitoring.prometheus_port is not None:
        checks.append(
            _listenable(config.monitoring.prometheus_host, config.monitoring.prometheus_port)
        )
    if brokers:
        checks.extend(_kafka(config))
    return checks


def raise_first_failure(checks: list[Check]) -> None:
    """Raise the first failed check's error (its exit code is the run's)."""
    for check in checks:
        if not check.ok and check.error is not None:
            raise check.error


def _writable(item: str, path: str, storage_options: Mapping[str, str] | None = None) -> Check:
    start = time.monotonic()
    if "://" in path:  # an object store: Delta's commits for a warehouse, files for Spark's
        store = Storage(path, storage_options or {})
        try:
            proven = store.probe() if item == "warehouse" else store.probe_files(item)
        except StorageError as refused:
            return Check(item, False, refused.message, time.monotonic() - start, refused)
        return Check(item, True, proven, time.monotonic() - start)
    probe = os.path.join(path, f".cdcflow-probe-{uuid.uuid4().hex}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"cdcflow")
        os.remove(probe)
    except OSError as exc:
        error = storage_error(exc, path)
        return Check(item, False, str(error.message), time.monotonic() - start, error)
    return Check(item, True, f"{path} is writable", time.monotonic() - start)


def _listenable(host: str, port: int) -> Check:
    """The metrics' port can be listened on (closed again at once)."""
    import socket

    start = time.monotonic()
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        error = ConfigError(
            f"monitoring.prometheus_port: cannot listen on {host}:{port} "
            f"({exc.strerror or exc}); choose a free port or set it to null"
        )
        return Check("metrics", False, error.message, time.monotonic() - start, error)
    return Check("metrics", True, f"{host}:{port} is free", time.monotonic() - start)


def _kafka(config: PipelineConfig) -> list[Check]:
    # deferred: pyspark (~1 s); only the broker check needs it, `validate --no-brokers` never does
    from cdcflow.source.kafka.admin import list_partitions

    start = time.monotonic()
    routes = [
        SourceTopics(s.name, tuple(s.topics), s.topic_pattern, DecodeFunction(s.format))
        for s in config.sources
    ]
    routing = Subscription(routes)
    options = {**config.kafka.reader_options(), **routing.subscription()}
    budget = config.kafka.startup_timeout_s
    try:
        partitions = list_partitions(options, budget_s=budget, budget_key=STARTUP_KEY)
    except (ConfigError, SourceError) as exc:
        if isinstance(exc, SourceError) and exc.refused is not None:
            # refused credentials or access: the configuration (or the ACLs) to fix, exit 2
            exc = ConfigError(f"kafka.options: {exc.message}")
        return [Check("kafka", False, exc.message, time.monotonic() - start, exc)]
    servers = config.kafka.bootstrap_servers
    checks = [
        Check(
            "kafka",
            True,
            f"brokers {servers} answered; settings accepted",
            time.monotonic() - start,
        )
    ]
    found: Counter[str] = Counter()
    topics: dict[str, set[str]] = {}
    for topic, _ in partitions:
        try:
            source_name = routing.source_of(topic)
        except ConfigError as exc:
            return [*checks, Check("sources", False, exc.message, 0.0, exc)]
        if source_name is not None:
            found[source_name] += 1
            topics.setdefault(source_name, set()).add(topic)
    for i, source in enumerate(config.sources):
        mine = topics.get(source.name, set())
        missing = sorted(set(source.topics) - mine)
        detail = f"{len(mine)} topic(s), {found[source.name]} partition(s)"
        if missing:
            detail += f"; not created yet (read once they are): {', '.join(missing)}"
        elif not mine:
            detail += f"; no topic matches {source.topic_pattern!r} yet (read once one does)"
        checks.append(Check(f"sources[{i}] ({source.name})", True, detail, 0.0))
    return checks

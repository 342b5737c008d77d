"""Prometheus metrics of a running pipeline (``monitoring.prometheus_port``; off by default).

Served by ``prometheus-client``'s HTTP server at ``http://HOST:PORT/metrics`` from the
driver, updated once per applied micro-batch (the same reports the console prints:
:mod:`cdcflow.runtime.progress`). Names follow Prometheus' conventions (``_total`` counters, base
units in names); labels are the source (``<source>`` of the configuration), the table
(the target name), the dead-letter code and the skip reason::

    cdcflow_micro_batches_total
    cdcflow_records_total{source}            cdcflow_events_total{source}
    cdcflow_skipped_total{source,reason}     cdcflow_dead_letters_total{source,code}
    cdcflow_records_behind{source}           cdcflow_lag_seconds{source}
    cdcflow_batch_duration_seconds{source}   cdcflow_last_batch_timestamp_seconds{source}
    cdcflow_table_rows_total{table,change}   (change: inserted | updated | deleted)
    cdcflow_store_restarts_total{kind}       cdcflow_store_outage_seconds
                                             (kind: unavailable | unreachable)

The last two count the query's restarts across a warehouse outage
(:mod:`cdcflow.runtime.store_outage`) and how long the current outage has lasted (0:
none).

Kafka Connect's sink-task and error metrics and Flink's ``numRecordsIn`` / ``currentEmitEventTimeLag``
are the models. Each :class:`Metrics` has a registry of its own, so two pipelines in one
process (tests, a notebook) do not collide.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from cdcflow.apply.accounting import BatchReport
from cdcflow.runtime.progress import TableCounts

__all__ = ["Metrics"]


class Metrics:
    """The metrics of one pipeline, served over HTTP until :meth:`close`.

    Args:
        port: the port to listen on (0: any free one; :attr:`port` says which).
        host: the address to listen on.

    Raises:
        OSError: the port cannot be listened on (taken, or not allowed).
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = r = CollectorRegistry()
        self.micro_batches = Counter("cdcflow_micro_batches", "Micro-batches applied", registry=r)
        self.records = Counter("cdcflow_records", "Kafka records applied", ["source"], registry=r)
        self.events = Counter("cdcflow_events", "Change events decoded", ["source"], registry=r)
        self.skipped = Counter(
            "cdcflow_skipped", "Records skipped on purpose", ["source", "reason"], registry=r
        )
        self.dead_letters = Counter(
            "cdcflow_dead_letters", "Dead letters written", ["source", "code"], registry=r
        )
        self.behind = Gauge(
            "cdcflow_records_behind", "Records behind the log end", ["source"], registry=r
        )
        self.lag = Gauge(
            "cdcflow_lag_seconds",
            "Commit time minus the newest source time",
            ["source"],
            registry=r,
        )
        self.duration = Gauge(
            "cdcflow_batch_duration_seconds", "Apply time of the last micro-batch", ["source"],
            registry=r,
        )  # fmt: skip
        self.last = Gauge(
            "cdcflow_last_batch_timestamp_seconds", "When the last micro-batch was applied",
            ["source"], registry=r,
        )  # fmt: skip
        self.rows = Counter(
            "cdcflow_table_rows", "Rows changed in target tables", ["table", "change"], registry=r
        )
        self.store_restarts = Counter(
            "cdcflow_store_restarts",
            "Restarts of the query after the warehouse's store failed beyond its retries",
            ["kind"],
            registry=r,
        )
        self.store_outage = Gauge(
            "cdcflow_store_outage_seconds",
            "How long the current warehouse outage has lasted (0: none)",
            registry=r,
        )
        self._server, self._thread = start_http_server(port, addr=host, registry=r)
        self.host = host
        self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def observe(self, reports: Mapping[str, BatchReport]) -> None:
        """Count one micro-batch's applies (``reports`` per source)."""
        self.micro_batches.inc()
        now = time.time()
        for source, r in reports.items():
            self.records.labels(source).inc(r.records)
            self.events.labels(source).inc(r.events)
            for reason, n in r.skipped.items():
                self.skipped.labels(source, str(reason)).inc(n)
            for code, n in r.dead_letters.items():
                self.dead_letters.labels(source, str(code)).inc(n)
            if r.records_behind is not None:
                self.behind.labels(source).set(r.records_behind)
            if r.lag_ms is not None:
                self.lag.labels(source).set(r.lag_ms / 1000)
            self.duration.labels(source).set(r.seconds)
            self.last.labels(source).set(now)
            for mirror in r.mirrors:
                if mirror.skipped_replay:
                    continue
                c = TableCounts()
                c.add(mirror)
                for change, n in (("inserted", c.inserted), ("updated", c.updated),
                                  ("deleted", c.deleted)):  # fmt: skip
                    if n:
                        self.rows.labels(mirror.target, change).inc(n)

    def store_restarted(self, kind: str | None, outage_s: float) -> None:
        """A restart of the query after a store failure of ``kind`` (``None``: the outage
        ended), ``outage_s`` seconds into the outage."""
        if kind is not None:
            self.store_restarts.labels(kind).inc()
        self.store_outage.set(outage_s)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

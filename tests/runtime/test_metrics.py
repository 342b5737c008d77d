"""Prometheus metrics (``cdcflow.runtime.metrics``): a real ``prometheus-client`` HTTP server on a
free port, scraped over HTTP after micro-batches' reports are observed."""

from __future__ import annotations

import socket
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcflow.apply.accounting import BatchReport
from cdcflow.runtime.metrics import Metrics
from cdcflow.sinks.mirror import MirrorResult


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _report(records, events, dead=None, skipped=None, behind=None, lag_ms=None, mirrors=()):
    return BatchReport(
        batch_id=0,
        records=records,
        events=events,
        dead_letters=Counter(dead or {}),
        skipped=Counter(skipped or {}),
        records_behind=behind,
        lag_ms=lag_ms,
        seconds=0.25,
        mirrors=list(mirrors),
    )


@pytest.fixture
def metrics():
    m = Metrics(0)  # any free port
    yield m
    m.close()


def test_counters_and_gauges_per_source_and_table_after_two_micro_batches(metrics):
    orders = MirrorResult("shop.orders", "/wh/shop.orders", upserts=5, deletes=1,
                          metrics={"num_target_rows_inserted": 3})  # fmt: skip
    metrics.observe(
        {
            "pg": _report(10, 9, dead={"BAD_JSON": 1}, behind=500, lag_ms=1500, mirrors=[orders]),
            "mysql": _report(4, 4, skipped={"TOMBSTONE": 2}),
        }
    )
    metrics.observe({"pg": _report(6, 6, dead={"BAD_JSON": 2}, behind=0, lag_ms=250)})
    got = _scrape(metrics.url)
    assert got[("cdcflow_micro_batches_total", ())] == 2
    assert got[("cdcflow_records_total", (("source", "pg"),))] == 16
    assert got[("cdcflow_records_total", (("source", "mysql"),))] == 4
    assert got[("cdcflow_events_total", (("source", "pg"),))] == 15
    assert got[("cdcflow_dead_letters_total", (("code", "BAD_JSON"), ("source", "pg")))] == 3
    assert got[("cdcflow_skipped_total", (("reason", "TOMBSTONE"), ("source", "mysql")))] == 2
    assert got[("cdcflow_records_behind", (("source", "pg"),))] == 0  # the newest value
    assert got[("cdcflow_lag_seconds", (("source", "pg"),))] == 0.25
    assert ("cdcflow_records_behind", (("source", "mysql"),)) not in got  # never known
    assert got[("cdcflow_batch_duration_seconds", (("source", "pg"),))] == 0.25
    rows = {c: got[("cdcflow_table_rows_total", (("change", c), ("table", "shop.orders")))]
            for c in ("inserted", "updated", "deleted")}  # fmt: skip
    assert rows == {"inserted": 3, "updated": 2, "deleted": 1}


def test_two_pipelines_in_one_process_have_their_own_metrics(metrics):
    other = Metrics(0)
    try:
        metrics.observe({"pg": _report(1, 1)})
        assert _scrape(other.url)[("cdcflow_micro_batches_total", ())] == 0
        assert _scrape(metrics.url)[("cdcflow_micro_batches_total", ())] == 1
    finally:
        other.close()


def test_a_taken_port_is_an_os_error_naming_nothing_else():
    with socket.create_server(("127.0.0.1", 0)) as taken, pytest.raises(OSError):
        Metrics(taken.getsockname()[1])


def test_store_restarts_count_by_kind_and_the_outage_gauge_returns_to_zero(metrics):
    metrics.store_restarted("unavailable", 1.0)
    metrics.store_restarted("unavailable", 3.5)
    metrics.store_restarted("unreachable", 8.0)
    got = _scrape(metrics.url)
    assert got[("cdcflow_store_restarts_total", (("kind", "unavailable"),))] == 2
    assert got[("cdcflow_store_restarts_total", (("kind", "unreachable"),))] == 1
    assert got[("cdcflow_store_outage_seconds", ())] == 8.0
    metrics.store_restarted(None, 0.0)  # a micro-batch applied: the outage is over
    got = _scrape(metrics.url)
    assert got[("cdcflow_store_outage_seconds", ())] == 0
    assert got[("cdcflow_store_restarts_total", (("kind", "unavailable"),))] == 2

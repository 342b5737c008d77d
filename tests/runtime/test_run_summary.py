"""``RunSummary`` (``cdcflow.runtime.pipeline``): what a run applied, as the Python API
returns it. A long streaming run adds a report per source and micro-batch: the totals
count every one, the reports kept stay bounded."""

from __future__ import annotations

from collections import Counter

from cdcflow.apply.accounting import BatchReport
from cdcflow.runtime.pipeline import RECENT_REPORTS, RunSummary


def report(delivery_id: int | None, records: int, dead: int = 0) -> BatchReport:
    return BatchReport(
        batch_id=delivery_id or 0,
        delivery_id=delivery_id,
        records=records,
        events=records - dead,
        skipped=Counter({"TOMBSTONE": 1}),
        dead_letters=Counter({"BAD_JSON": dead}) if dead else Counter(),
    )


def test_a_long_run_keeps_its_totals_and_only_the_newest_reports():
    summary = RunSummary()
    batches = 3 * RECENT_REPORTS
    for delivery_id in range(batches):
        summary.add("shop.pg", report(delivery_id, 10, dead=delivery_id % 2))
        if delivery_id % 3 == 0:  # the other source has records in every third one
            summary.add("shop.mysql", report(delivery_id, 4))

    assert [len(r) for r in summary.reports.values()] == [RECENT_REPORTS, RECENT_REPORTS]
    newest = [r.delivery_id for r in summary.reports["shop.pg"]]
    assert newest == list(range(batches - RECENT_REPORTS, batches))
    mysql_applies = len(range(0, batches, 3))
    assert summary.totals() == {
        "batches": batches,  # a micro-batch of both sources is counted once
        "records": 10 * batches + 4 * mysql_applies,
        "events": 10 * batches - batches // 2 + 4 * mysql_applies,
        "skipped": batches + mysql_applies,
        "dead_letters": batches // 2,
    }
    assert summary.totals("shop.mysql") == {
        "batches": mysql_applies,
        "records": 4 * mysql_applies,
        "events": 4 * mysql_applies,
        "skipped": mysql_applies,
        "dead_letters": 0,
    }
    assert summary.totals("shop.none") == dict.fromkeys(summary.totals(), 0)


def test_a_replayed_micro_batch_and_a_finished_interrupted_apply():
    summary = RunSummary(max_reports=2)
    summary.add("shop.pg", report(None, 5))  # finished at start-up: a micro-batch of its own
    summary.add("shop.pg", report(7, 1))
    summary.add("shop.pg", report(7, 0))  # Spark delivered micro-batch 7 again
    summary.add("shop.mysql", report(7, 2))
    summary.add("shop.mysql", report(None, 3))
    assert summary.totals()["batches"] == 3
    assert summary.totals()["records"] == 11
    assert [r.records for r in summary.reports["shop.pg"]] == [1, 0]  # the newest two

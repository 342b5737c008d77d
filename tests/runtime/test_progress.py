"""The console of a running pipeline (``cdcflow.runtime.progress``): a line per micro-batch and
source once both its apply and Spark's progress are in, records behind the log end from
the progress's offsets, the mostly-dead-letters warning, the stop line and the summary.

The progress JSON is the shape Spark 4's ``StreamingQueryProgress.json`` has for
cdcflow's Python Kafka source (captured from a run: ``tests/e2e/test_console.py`` runs
the real thing).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cdcflow.apply.accounting import BatchReport
from cdcflow.runtime.progress import ProgressReporter, summary_lines, table_counts
from cdcflow.sinks.mirror import MirrorResult


def _progress(batch_id: int, end: dict, latest: dict, duration_ms: int = 300, rows: int = 2) -> str:
    """A ``StreamingQueryProgress.json`` as Spark writes it for the Python source."""
    return json.dumps(
        {
            "id": "q",
            "runId": "r",
            "name": "cdcflow-e2e",
            "batchId": batch_id,
            "batchDuration": duration_ms,
            "numInputRows": rows,
            "sources": [
                {
                    "description": "PythonMicroBatchStreamWithTriggerAvailableNow@1",
                    "startOffset": None,
                    "endOffset": end,
                    "latestOffset": latest,
                    "numInputRows": rows,
                }
            ],
        }
    )


def _report(records=100, events=100, dead=None, skipped=None, ranges=None, lag_ms=2400, **kw):
    return BatchReport(
        batch_id=kw.pop("apply_id", 0),
        records=records,
        events=events,
        dead_letters=Counter(dead or {}),
        skipped=Counter(skipped or {}),
        ranges=ranges or {("orders", 0): (0, records - 1)},
        lag_ms=lag_ms,
        **kw,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def console():
    lines: list[str] = []
    clock = Clock()
    reporter = ProgressReporter(
        write=lines.append,
        source_of=lambda topic: {"orders": "pg", "items": "pg", "canal": "mysql"}.get(topic),
        formats={"pg": "debezium-json", "mysql": "canal-json"},
        topics={"pg": "orders, items", "mysql": "canal"},
        trigger_ms=1000,
        clock=clock,
    )
    return reporter, lines, clock


def test_a_line_once_both_the_apply_and_the_progress_are_in(console):
    reporter, lines, clock = console
    reporter.started()
    clock.now += 2.0
    reporter.applied(0, {"pg": _report(records=1000, events=1020, skipped={"TOMBSTONE": 12})})
    assert lines == []  # Spark's progress of batch 0 has not arrived
    reporter.query_progress(
        _progress(
            0,
            {"orders": {"0": 600}, "items": {"0": 400}},
            {"orders": {"0": 900}, "items": {"0": 450}},
        )
    )
    assert lines == [
        "batch 0 pg: 1,000 records -> 1,020 events, 510 events/s; 12 skipped (TOMBSTONE 12); "
        "350 behind; lag 2.4 s"
    ]
    assert reporter.behind == {"pg": 350}


def test_the_progress_may_come_first_and_a_slow_batch_says_catching_up(console):
    reporter, lines, clock = console
    reporter.query_progress(
        _progress(3, {"orders": {"0": 10}}, {"orders": {"0": 5010}}, duration_ms=4500)
    )
    clock.now += 1.0
    reporter.applied(3, {"pg": _report(records=10, events=10, lag_ms=125_000)})
    assert lines == [
        "batch 3 pg: 10 records -> 10 events, 10 events/s; 5,000 behind; lag 2 min 5 s; "
        "catching up: 4.5 s a micro-batch"
    ]


def test_records_behind_are_added_up_per_source_of_each_topic(console):
    reporter, lines, clock = console
    reporter.query_progress(
        _progress(
            1,
            {"orders": {"0": 5, "1": 7}, "canal": {"0": 100}},
            {"orders": {"0": 10, "1": 7}, "canal": {"0": 130}, "unrouted": {"0": 99}},
        )
    )
    reporter.applied(1, {"pg": _report(records=5), "mysql": _report(records=20)})
    assert [line.split("; ")[-2] for line in lines] == ["30 behind", "5 behind"]  # mysql, pg
    assert reporter.behind == {"pg": 5, "mysql": 30}


def test_only_the_followed_query_counts(console):
    reporter, lines, _ = console
    reporter.started("q")
    other = json.loads(_progress(0, {"orders": {"0": 1}}, {"orders": {"0": 99}}))
    other["id"] = "someone-elses-query"
    reporter.query_progress(other)
    assert reporter.log_ends == {}
    reporter.query_progress(_progress(0, {"orders": {"0": 1}}, {"orders": {"0": 9}}))
    assert reporter.log_ends == {("orders", 0): 9}


def test_an_empty_trigger_and_a_progress_without_apply_write_nothing(console):
    reporter, lines, _ = console
    reporter.query_progress(_progress(7, {"orders": {"0": 1}}, {"orders": {"0": 1}}, rows=0))
    reporter.query_progress(_progress(8, {"orders": {"0": 1}}, {"orders": {"0": 1}}))
    reporter.flush()
    assert lines == []


def test_flush_writes_applied_batches_whose_progress_never_came(console):
    reporter, lines, clock = console
    reporter.applied(0, {"pg": _report(records=3, events=3, lag_ms=None)})
    reporter.flush()
    assert lines == ["batch 0 pg: 3 records -> 3 events"]  # no rate: no time passed


def test_a_batch_left_behind_is_written_when_two_newer_ones_are(console):
    reporter, lines, clock = console
    for batch in (0, 1, 2):
        clock.now += 1
        reporter.applied(batch, {"pg": _report(records=1, events=1, lag_ms=None)})
    assert lines == ["batch 0 pg: 1 records -> 1 events, 1 events/s"]


def test_mostly_dead_letters_warns_with_the_top_code_and_what_to_check(console):
    reporter, lines, clock = console
    clock.now += 1
    dead = {"MISSING_FIELD": 1600, "BAD_JSON": 100}
    reporter.applied(0, {"mysql": _report(records=1700, events=0, dead=dead, lag_ms=None)})
    reporter.flush()
    assert lines[0] == (
        "batch 0 mysql: 1,700 records -> 0 events, 0 events/s; 1,700 dead letters "
        "(MISSING_FIELD 1,600, BAD_JSON 100)"
    )
    assert lines[1] == (
        "WARNING source mysql: every record of micro-batch 0 failed, most with MISSING_FIELD "
        "(1,600): is canal really canal-json? `cdcflow inspect CONFIG` shows what the topics "
        "hold, `cdcflow dead-letters show CONFIG --source mysql --code MISSING_FIELD` the "
        "failures; apply.dead_letter_limit makes this fatal"
    )
    assert reporter.warnings == [lines[1]]


@pytest.mark.parametrize(
    ("records", "dead", "warned"),
    [(100, 50, False), (100, 51, True), (9, 9, False)],  # half is not most; tiny batches
)
def test_the_warning_needs_most_of_a_batch_of_some_size(console, records, dead, warned):
    reporter, lines, _ = console
    reporter.applied(0, {"pg": _report(records=records, events=0, dead={"BAD_JSON": dead})})
    reporter.flush()
    assert bool(reporter.warnings) is warned


def test_the_stop_line_names_the_last_batch_and_where_the_next_run_resumes(console):
    reporter, _, _ = console
    assert reporter.stop_line().startswith("stopped before any micro-batch was applied")
    reporter.applied(4, {"pg": _report(ranges={("orders", 0): (10, 19), ("orders", 1): (0, 4)})})
    reporter.applied(5, {"pg": _report(ranges={("orders", 0): (20, 29)})})
    assert reporter.stop_line() == (
        "stopped after micro-batch 5; the next run resumes at orders[0]@30, orders[1]@5 "
        "(the warehouse's offsets)"
    )
    ranges = {("t", p): (0, 0) for p in range(6)}
    reporter.applied(6, {"pg": _report(ranges=ranges)})
    assert reporter.stop_line().endswith("t[1]@1 and 4 more partitions (the warehouse's offsets)")


def _mirror(target, upserts, deletes, inserted=None, truncated=False, replay=False):
    metrics = {} if inserted is None else {"num_target_rows_inserted": inserted}
    return MirrorResult(
        target=target,
        path=f"/wh/{target}",
        upserts=upserts,
        deletes=deletes,
        truncated=truncated,
        skipped_replay=replay,
        metrics=metrics,
    )


def test_the_summary_has_totals_codes_and_rows_per_table():
    first = _report(records=10, events=9, dead={"BAD_JSON": 1}, skipped={"TOMBSTONE": 2})
    first.mirrors = [_mirror("shop.orders", 6, 1, inserted=4), _mirror("shop.items", 2, 0)]
    second = _report(records=5, events=5)
    second.mirrors = [
        _mirror("shop.orders", 3, 2, inserted=3, truncated=True),
        _mirror("shop.items", 9, 9, replay=True),  # applied before: not counted again
    ]
    assert table_counts([first, second])["shop.orders"].inserted == 7
    assert summary_lines({"pg": [first, second]}, batches=2) == [
        "2 micro-batches: 15 records, 14 events; 2 skipped (TOMBSTONE 2); "
        "1 dead letters (BAD_JSON 1)",
        "table           inserted    updated    deleted",
        "shop.items             0          2          0",
        "shop.orders            7          2          3  (1 truncate)",
    ]


def test_an_interrupted_apply_finished_at_start_up_has_a_line_and_counts(console):
    reporter, lines, _ = console
    reporter.finished("pg", _report(records=4, events=4, apply_id=17, lag_ms=None))
    assert lines == ["apply 17 (interrupted, finished) pg: 4 records -> 4 events"]
    assert reporter.summary()[0].startswith("1 micro-batches: 4 records")

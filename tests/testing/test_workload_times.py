"""The workload's source times: a fixed instant by default (a seed gives the same changes
on every run), or just before now for the demo (its lag is seconds, not years)."""

from __future__ import annotations

import time

from cdcflow_testkit.workload import (
    DEMO_TABLES,
    FIXED_START_TS_MS,
    MAX_TS_STEP_MS,
    Workload,
    start_ts_ms_before,
)


def test_default_source_times_are_fixed() -> None:
    first = [c.ts_ms for c in Workload(DEMO_TABLES, seed=5).changes(200)]
    again = [c.ts_ms for c in Workload(DEMO_TABLES, seed=5).changes(200)]
    assert first == again
    assert FIXED_START_TS_MS < first[0] <= FIXED_START_TS_MS + MAX_TS_STEP_MS
    assert all(0 < b - a <= MAX_TS_STEP_MS for a, b in zip(first, first[1:], strict=False))


def test_a_start_changes_only_the_times() -> None:
    fixed = list(Workload(DEMO_TABLES, seed=5).changes(300))
    moved = list(Workload(DEMO_TABLES, seed=5, start_ts_ms=10_000).changes(300))
    assert [c.ts_ms - FIXED_START_TS_MS for c in fixed] == [c.ts_ms - 10_000 for c in moved]
    assert [(c.op, c.seq, c.before, c.after) for c in fixed] == [
        (c.op, c.seq, c.before, c.after) for c in moved
    ]


def test_the_demo_changes_happened_just_now() -> None:
    now_ms = int(time.time() * 1000)
    n = 2_000
    times = [
        c.ts_ms
        for c in Workload(DEMO_TABLES, seed=7, start_ts_ms=start_ts_ms_before(now_ms, n)).changes(n)
    ]
    assert max(times) <= now_ms  # never in the future: the lag is never negative
    assert now_ms - min(times) <= MAX_TS_STEP_MS * n  # the oldest under two minutes ago

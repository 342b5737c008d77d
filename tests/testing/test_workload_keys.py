"""The workload generator picks the row an update or delete hits in O(log n): from its
``_KeyOrder``, which must index the live keys exactly as ``list(rows)`` would (the
changes for a seed stay those of earlier versions)."""

from __future__ import annotations

import random

from cdcflow_testkit.workload import DEMO_TABLES, Workload, _KeyOrder


def test_key_order_indexes_live_keys_in_insertion_order() -> None:
    rng = random.Random(11)
    order, rows = _KeyOrder(), {}
    for step in range(5_000):
        r = rng.random()
        if not rows or r < 0.45:
            key = (step,)
            rows[key] = step
            order.append(key)
        elif r < 0.55:  # a key change: out, and in again at the end
            key = rng.choice(list(rows))
            del rows[key]
            order.remove(key)
            rows[key] = step
            order.append(key)
        elif r < 0.999:
            key = rng.choice(list(rows))
            del rows[key]
            order.remove(key)
        else:
            rows.clear()
            order.clear()
        assert len(order) == len(rows)
        if step % 97 == 0:
            assert [order[i] for i in range(len(order))] == list(rows)


def test_the_state_follows_the_changes_with_key_changes_and_truncates() -> None:
    workload = Workload(DEMO_TABLES, seed=3)
    for _ in workload.changes(3_000, truncate_every=400, p_key_change=0.2):
        pass
    for spec in DEMO_TABLES:
        order = workload._order[spec.name]
        assert [order[i] for i in range(len(order))] == list(workload.state[spec.name])

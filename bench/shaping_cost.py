"""What shaping a target costs (issue 20, part 2; docs/decisions.md 59).

    python bench/shaping_cost.py                 # 50,000 inserts of a 5-column table
    python bench/shaping_cost.py --events 200000

Times :func:`cdcflow.transform.shape.shape` alone (no Delta, no Kafka, no Spark) over one
target's part of a micro-batch, once per set of options, on one core: events/s and
microseconds per event, the best of three runs. An unshaped table does not call it
(``shapes()`` is false), so the reference is zero.
"""

from __future__ import annotations

import argparse
import time

import pyarrow as pa

from cdcflow.apply.options import TableOptions
from cdcflow.decode.batches import flatten
from cdcflow.formats.base import DecodeResult
from cdcflow.model import ChangeEvent, Op, Origin, SourceTable
from cdcflow.transform.shape import shape

TABLE = SourceTable("bench", "shop", "", "orders")
COLUMNS = {
    "id": "int64",
    "status": "string",
    "amount": "decimal(10,2)",
    "created_at": "timestamp",
    "card": "string",
}
CASES = {
    "metadata columns (2)": TableOptions(metadata_columns=["op", "ts_ms"]),
    "one column excluded": TableOptions(columns={"exclude": ["card"]}),
    "two computed (date, bucket)": TableOptions(
        computed_columns={"d": "date(created_at)", "b": "bucket(id, 16)"}
    ),
    "a filter (1/3 out)": TableOptions(filter="status <> 'test'"),
    "all, and an override": TableOptions(
        metadata_columns=["op"],
        columns={"exclude": ["card"]},
        computed_columns={"d": "date(created_at)", "b": "bucket(id, 16)"},
        filter="status <> 'test'",
        type_overrides={"amount": "decimal(38,10)"},
    ),
}


def part(n: int) -> pa.Table:
    """``n`` inserts of one table, as the apply receives them."""
    events = [
        ChangeEvent(
            op=Op.INSERT,
            source=TABLE,
            key={"id": i},
            after={
                "id": i,
                "status": "test" if i % 3 == 0 else "new",
                "amount": f"{i % 1000}.25",
                "created_at": "2024-03-05T10:30:00",
                "card": "4111",
            },
            columns=COLUMNS,
            seq=(i,),
            ts_ms=1_700_000_000_000 + i,
            origin=Origin("bench", 0, i),
        )
        for i in range(n)
    ]
    return pa.Table.from_batches([flatten(DecodeResult(events=events))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args()
    rows = part(args.events)
    print(f"{'options':30s} {'events/s':>10s} {'us/event':>9s}")
    for name, options in CASES.items():
        best = min(_timed(rows, options) for _ in range(3))
        print(f"{name:30s} {args.events / best:>10,.0f} {best * 1e6 / args.events:>9.1f}")


def _timed(rows: pa.Table, options: TableOptions) -> float:
    started = time.perf_counter()
    shape(rows, options)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()

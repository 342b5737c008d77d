"""Micro-benchmark: ``DebeziumJsonDecoder.decode_batch`` on one core.

    python bench/decode_debezium.py                 # 100,000 messages, best of 5
    python bench/decode_debezium.py --events 200000 --repeat 3

Decodes the schemaless PostgreSQL-connector messages of ``e2e_debezium.generate()``
(Records -> ChangeEvents, key and value) with a fresh decoder per run, and times
``orjson.loads`` of the same values alone (keeping the parsed objects) as the yardstick. Prints msg/s of both (best
run, CPU time) and their ratio. Pin it to one core (``taskset -c 0``).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from e2e_debezium import generate  # noqa: E402

from cdcflow.formats.base import Record  # noqa: E402
from cdcflow.formats.debezium.json_decoder import DebeziumJsonDecoder  # noqa: E402
from cdcflow.model import Origin  # noqa: E402


def _best(fn, repeat: int) -> float:
    """Least CPU time of ``repeat`` runs of ``fn``, seconds (GC off while timing).

    CPU time, not wall time: on a shared machine the wait for the core is not the
    decoder's cost."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
        finally:
            gc.enable()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    messages, _ = generate(args.events, args.keys)
    records = [
        Record(value=v, key=k, origin=Origin("bench.debezium", p, i))
        for i, (k, v, p) in enumerate(messages)
    ]
    values = [v for _, v, _ in messages]
    size = sum(map(len, values)) / len(values)

    def decode() -> None:
        result = DebeziumJsonDecoder().decode_batch(records)
        assert result.decoded_records == len(records), result.dead_letters[:1]

    loads = orjson.loads
    n = len(records)

    def parse() -> None:  # keeps what it parsed, as decode_batch keeps the images
        parsed = [loads(v) for v in values]
        assert len(parsed) == n

    t_decode = _best(decode, args.repeat)
    t_loads = _best(parse, args.repeat)
    print(f"{n} messages, {size:.0f} B average, best of {args.repeat}")
    print(f"decode_batch  {n / t_decode:>10,.0f} msg/s")
    print(f"orjson.loads  {n / t_loads:>10,.0f} msg/s")
    print(f"ratio         {t_loads / t_decode:>10.2f} (decode_batch / orjson.loads speed)")


if __name__ == "__main__":
    main()

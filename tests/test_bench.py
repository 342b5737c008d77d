"""Smoke test of the decode benchmark (``bench/decode_formats.py``): every registered format
generates, decodes without dead letters, and gets its rows. No timing is asserted."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench_module(name: str):
    """Import ``bench/<name>.py`` (bench/ on the path only while it is used)."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def decode_formats():
    yield from _bench_module("decode_formats")


def test_decode_benchmark_gives_its_rows_for_every_format(decode_formats):
    from cdcflow.formats import decoder_for, embedded_formats

    rows = decode_formats.run(events=200, repeats=1, pin=False)
    # and the e2e benchmark's schemaless Debezium messages, for the columnar path
    formats = [*embedded_formats(), "debezium-json/schemaless"]
    figures = [r["figure"] for r in rows]
    for fmt in formats:
        assert f"{fmt} decode_batch" in figures and f"{fmt} decode_kafka_batch" in figures
        # the JSON formats get Arrow's parser ceiling beside them, the Avro ones none
        binary = type(decoder_for(fmt.split("/")[0])).binary_values
        assert (f"{fmt} arrow ceiling" in figures) is not binary, fmt
    assert {r["format"] for r in rows} == set(formats)
    for r in rows:
        assert r["value"] > 0 and r["reference"] > 0
        assert r["messages"] == 200
    assert all(r["target"] for r in rows if r["figure"].endswith("decode_kafka_batch"))


@pytest.fixture(scope="module")
def long_run():
    yield from _bench_module("long_run")


def test_long_run_benchmark_measures_both_runs_at_its_marks(long_run):
    runs = {
        "without maintenance": long_run.run_one(3, tables=2, rows=500, maintained=False, day_s=60),
        "with maintenance": long_run.run_one(3, tables=2, rows=500, maintained=True, day_s=60),
    }
    for marks in runs.values():
        assert set(marks) == {3}
        figures = marks[3]
        assert figures["files per mirror"] >= 1 and figures["apply per batch (s)"] > 0
        assert figures["bookkeeping data files"] >= 4
    rows = long_run.rows_of(runs)
    assert len(rows) == 2 * len(runs["with maintenance"][3])
    assert all(r["target"] is None for r in rows)  # one mark: nothing to be flat against


@pytest.fixture(scope="module")
def store_requests():
    yield from _bench_module("store_requests")


@pytest.mark.services
def test_store_benchmark_counts_the_requests_of_each_micro_batch(store_requests):
    rows = store_requests.run([2], changes=5, batches=1, latency_ms=0, parallel=2)
    seconds, requests = rows
    assert seconds["figure"] == "micro-batch, 2 tables x 5 changes, s3proxy at 0 ms"
    assert seconds["value"] > 0 and seconds["reference"] > 0
    # every micro-batch reads, lists and writes: each kind is counted, none made up
    kinds = ("delete", "get", "head", "list", "post", "put")
    assert requests["value"] == sum(requests.get(k, 0) for k in kinds)
    assert requests["get"] > 0 and requests["list"] > 0 and requests["put"] > 0


@pytest.fixture(scope="module")
def verify_cost():
    yield from _bench_module("verify_cost")


def test_verify_benchmark_mirror_holds_the_source_tables_values(verify_cost):
    import datetime as dt
    from decimal import Decimal

    keys = verify_cost.damaged_keys(1000, 10)
    assert keys.tolist() == [51 + 100 * k for k in range(10)]  # one in each tenth
    rows = verify_cost.mirror_table(100_000, damaged=keys[:1]).to_pylist()
    # the values the INSERT computes from i (numeric, text, timestamptz, float8, bool)
    assert rows[0] == {
        "id": 1,
        "amount": Decimal("0.01"),
        "note": "note 1",
        "created_at": dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=dt.UTC),
        "score": 1 / 7,
        "flag": False,
    }
    assert rows[99_999]["amount"] == Decimal("0.00") and rows[98]["flag"] is True
    assert rows[12_344]["amount"] == Decimal("123.45")
    assert rows[50]["amount"] == Decimal("1.51")  # id 51 damaged: one more


@pytest.mark.services
def test_verify_benchmark_gives_its_four_figures(verify_cost):
    rows = verify_cost.run(2000, repeats=1, differences=3, chunk_rows=500, leaf_rows=16, fanout=4)
    figures = [r["figure"] for r in rows]
    assert figures == [
        "verify floor, 2,000 rows (source sum + mirror read)",
        "verify quick, 2,000 rows",
        "verify full, 2,000 rows",
        "verify full, 3 differing keys",
    ]
    floor, quick, full, diff = rows
    assert floor["value"] > 0 and floor["source_s"] > 0 and floor["mirror_s"] > 0
    assert quick["reference"] == full["reference"] == floor["value"]
    assert diff["reference"] == full["value"]
    # equal tables: 4 ranges, none differing; the damage: 3 keys, bisected to leaves
    assert full["ranges"] == 4 and full["differing_ranges"] == 0
    assert diff["differing_ranges"] > 0 and diff["leaves"] >= 3
    assert diff["phases_s"]["mirror keyed table"] > 0 and diff["phases_s"]["source checksum"] > 0
    assert all(r["target"] for r in rows[1:])

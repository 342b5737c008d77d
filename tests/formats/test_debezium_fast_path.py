"""The debezium-json fast path gives exactly the events of the general path.

``DebeziumJsonDecoder._fast_row`` decodes the common record shape with fewer Python
operations and hands everything else to the general path (``_decode``). These tests run
whole streams -- the real-world golden inputs and a generated stream that varies every
field the fast path reads -- through two decoders, one with the fast path switched off
(``_fast_ok = False``), and compare everything ``decode_batch`` returns, by ``repr`` so
that ``1``, ``1.0`` and ``True`` (equal in Python) and the column order count too.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from tests.formats.helpers import count_answers

from cdcflow.decode import batches as batches_module
from cdcflow.decode.batches import decode_records, flatten
from cdcflow.formats.base import DecodeResult, Record
from cdcflow.formats.debezium import json_decoder
from cdcflow.formats.debezium.json_decoder import DebeziumJsonDecoder, DebeziumJsonOptions
from cdcflow.model import Origin
from cdcflow_testkit.golden import load_case

CASES = Path(__file__).parent / "cases" / "debezium-json"
PLACEHOLDER = "__debezium_unavailable_value"


def _outcome(result: DecodeResult) -> list[str]:
    return [
        repr(result.events),
        repr(result.decoded_origins),
        repr(result.skipped),
        repr(result.dead_letters),
        repr((result.records, result.decoded_records)),
    ]


def _both(records: list[Record], options: DebeziumJsonOptions, batch: int) -> tuple[list, list]:
    """Outcomes of the fast and the general decoder, ``batch`` records per decode_batch
    (decoders keep their caches across batches, as on an executor)."""
    fast, general = DebeziumJsonDecoder(options), DebeziumJsonDecoder(options)
    general._fast_ok = False
    a, b = [], []
    for i in range(0, len(records), batch):
        a += _outcome(fast.decode_batch(records[i : i + batch]))
        b += _outcome(general.decode_batch(records[i : i + batch]))
    return a, b


def test_the_hot_path_builds_events_without_the_generated_init():
    # _row_change sets the slots directly; it falls back to ChangeEvent(...) (twice as
    # slow) when ChangeEvent's fields change -- keep _EVENT_FIELDS in step
    assert json_decoder._new_row_change is json_decoder._row_change


def _golden_stream() -> list[Record]:
    """The golden inputs without options beyond primary keys, as one stream."""
    records: list[Record] = []
    for expected in sorted(CASES.glob("*.expected.jsonl")):
        case = load_case(expected)
        if case.options and set(case.options) - {"primary_keys"}:
            continue  # other options: decoded alone by test_debezium_json
        records += case.records
    return [
        Record(r.value, r.key, r.headers, Origin("golden", 0, i), r.timestamp_ms)
        for i, r in enumerate(records)
    ]


def test_golden_inputs_in_one_stream_decode_alike():
    records = _golden_stream()
    options = DebeziumJsonOptions(primary_keys={"*": ("id",)})
    for batch in (1, 7, len(records)):
        a, b = _both(records, options, batch)
        assert a == b
    assert len(records) > 40


# --------------------------------------------------------------------------- generated


def _value(rng: random.Random, kind: str) -> Any:
    return {
        "int": lambda: rng.choice([0, 1, -1, rng.randint(-(10**6), 10**6), 2**63 - 1]),
        "bigint": lambda: rng.choice([2**63, 2**64 - 1, -(2**63), 9_200_000_000_000_000_000]),
        "float": lambda: rng.choice([0.5, -2.25, 1e300, 9.2e18, -9.2e18, 9.1e18, 1.0]),
        "str": lambda: rng.choice(["", "x", "é€", "1", "X19kZWJleml1bV91bmF2"]),
        "placeholder": lambda: rng.choice(
            [PLACEHOLDER, "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="]
        ),
        "bool": lambda: rng.choice([True, False]),
        "null": lambda: None,
        "nested": lambda: rng.choice([{"a": 1}, [1, 2], [PLACEHOLDER], {}, []]),
    }[kind]()


_KINDS = ["int", "int", "int", "float", "str", "str", "str", "bool", "null", "null"]
_RARE = ["bigint", "nested", "placeholder"]
_TABLES = [("shop", "public", "customers"), ("shop", "public", "orders"), ("inv", None, "items")]


def _image(rng: random.Random, key: int, columns: list[str]) -> dict[str, Any]:
    image: dict[str, Any] = {"id": key}
    for c in columns:
        if rng.random() < 0.05:
            continue  # a column missing from this image
        kind = rng.choice(_RARE) if rng.random() < 0.01 else rng.choice(_KINDS)
        image[c] = _value(rng, kind)
    if rng.random() < 0.05:
        image["added"] = rng.randint(0, 9)  # schema change: a new column
    return image


def _source(rng: random.Random, i: int, table: tuple, lsn: int) -> dict[str, Any]:
    db, schema, name = table
    connector = "postgresql" if schema else "mysql"
    if rng.random() < 0.02:
        connector = rng.choice(["oracle", "sqlserver", None, "other"])
    source: dict[str, Any] = {
        "version": "2.7.0.Final",
        "connector": connector,
        "name": "gen",
        "ts_ms": rng.choice([1_700_000_000_000 + i] * 60 + [0, None, 1.5, "17", 2**64 - 1]),
        "db": db,
        "table": name,
    }
    if schema is not None:
        source["schema"] = schema
        source["lsn"] = rng.choice([lsn] * 60 + [None, "12", 1.5])
        source["sequence"] = rng.choice(
            [f'["{lsn - 7}","{lsn}"]'] * 60
            + [f'[null,"{lsn}"]', None, '["²","1"]', '["٣","1"]', '["1_0","2"]', '[""]', "x"]
            + ['["' + "9" * 30 + '","1"]', '["-1","2"]', '[1,"2"]', 7]
        )
        source["txId"] = rng.choice(
            [5000 + i // 7] * 40 + [str(5000 + i // 7), None, 1.5, True, [1]]
        )
    else:
        source["file"] = rng.choice(["mysql-bin.000003"] * 10 + ["mysql-bin.000004", "", "x"])
        source["pos"] = rng.choice([lsn] * 10 + [None, "7"])
        source["row"] = rng.choice([0, 0, 0, 1, None])
    if rng.random() < 0.01:
        source["table"] = rng.choice(["", None, ["t"], {"t": 1}])
    return source


def _stream(seed: int, n: int) -> list[Record]:
    rng = random.Random(seed)
    columns = ["a", "b", "c", "d", "e"]
    rows: dict[tuple, dict[str, Any]] = {}
    records: list[Record] = []
    lsn = 1000
    for i in range(n):
        lsn += rng.randint(1, 50)
        table = rng.choice(_TABLES)
        key = rng.randint(1, 40)
        before = rows.get((table, key))
        if before is None:
            op = rng.choice(["c"] * 9 + ["r"])
        else:
            op = rng.choice(["u"] * 6 + ["d"] * 2 + ["c", "r"])
        after = None if op == "d" else _image(rng, key, columns)
        payload: dict[str, Any] = {
            "before": before if op in ("u", "d") and rng.random() < 0.9 else None,
            "after": after,
            "source": _source(rng, i, table, lsn),
            "op": op,
            "ts_ms": rng.choice([1_700_000_000_100 + i, None, 0]),
            "transaction": None,
        }
        r = rng.random()
        if r < 0.01:
            payload["transaction"] = {"id": "tx", "total_order": 1, "data_collection_order": 1}
        elif r < 0.02:
            payload["op"] = rng.choice(["t", "x", 1, None, ["c"]])
        elif r < 0.03:
            payload["after"] = rng.choice(["text", [1], 5])
        if after is not None and rng.random() < 0.01:
            after[rng.choice(columns)] = {"nested": [1, {"x": None}]}
        if op == "d":
            rows.pop((table, key), None)
        else:
            rows[(table, key)] = after  # type: ignore[assignment]
        raw_key = rng.choice(
            [orjson.dumps({"id": key})] * 40
            + [None, b"", b"[1]", b"{}", b"not json", orjson.dumps({"id": key, "a": 1})]
            + [orjson.dumps({"payload": {"id": key}, "schema": {"type": "struct"}})]
            + [orjson.dumps({"missing": 1})]
        )
        headers: tuple = ()
        if rng.random() < 0.02:
            headers = (("__debezium.oldkey", orjson.dumps({"id": key - 1})),)
        value = orjson.dumps(payload)
        if rng.random() < 0.01:
            value = rng.choice([b"{", b"[]", b'{"schema": null, "payload": null}', b"null"])
        records.append(Record(value, raw_key, headers, Origin("gen", i % 3, i), None))
        if rng.random() < 0.01:
            records.append(Record(None, raw_key, (), Origin("gen", 0, -i), None))  # tombstone
    return records


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_streams_decode_alike(seed):
    records = _stream(seed, 3000)
    for options in (
        DebeziumJsonOptions(),
        DebeziumJsonOptions(primary_keys={"customers": ("id",), "inv.items": ("id", "a")}),
        DebeziumJsonOptions(keyless="full_row", max_columns=6),
    ):
        for batch in (1, 50, len(records)):
            a, b = _both(records, options, batch)
            assert a == b, (seed, options, batch)


def test_the_generated_stream_exercises_the_fast_path():
    # a stream the fast path declines everywhere would prove nothing
    records = _stream(1, 3000)
    dec = DebeziumJsonDecoder()
    dec.decode_batch(records)  # warm the caches (tables, binlog files)
    fast = 0
    for r in records:
        try:
            obj = orjson.loads(r.value) if r.value else None
        except orjson.JSONDecodeError:
            continue
        if obj.__class__ is dict and dec._fast_row(obj, r) is not None:
            fast += 1
    assert 0.3 * len(records) < fast < 0.95 * len(records)


def test_both_ways_of_building_events_decode_alike(monkeypatch):
    # what the fast path does if ChangeEvent's fields no longer match _EVENT_FIELDS
    records = _stream(4, 1000)
    expected = _both(records, DebeziumJsonOptions(), 100)[0]
    monkeypatch.setattr(json_decoder, "_new_row_change", json_decoder._row_change_init)
    a, b = _both(records, DebeziumJsonOptions(), 100)
    assert a == b == expected


# --------------------------------------------------------------------------- decode stage


def _batches_both(records: list[Record], options: DebeziumJsonOptions, batch: int):
    """EVENT_SCHEMA batches of the decode stage (``decode_records``: flat rows from
    ``decode_flat``, the rest through ``decode_batch``) and of the general path alone
    (``flatten(decode_batch)`` with the fast path off), ``batch`` records at a time."""
    stage, general = DebeziumJsonDecoder(options), DebeziumJsonDecoder(options)
    general._fast_ok = False
    a, b = [], []
    for i in range(0, len(records), batch):
        part = records[i : i + batch]
        a.append(decode_records(stage, part))
        b.append(flatten(general.decode_batch(part), general.state_items, part))
    return a, b


@pytest.mark.parametrize("probe", ["windows", "every record"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_decode_stage_gives_the_batches_of_the_general_path(seed, probe, monkeypatch):
    if probe == "every record":  # decode_flat asked for each record, however many decline
        monkeypatch.setattr(batches_module, "_FLAT_PROBE", 0)
    records = _stream(seed, 1500)
    for options in (
        DebeziumJsonOptions(),
        DebeziumJsonOptions(primary_keys={"customers": ("id",), "inv.items": ("id", "a")}),
        DebeziumJsonOptions(keyless="full_row", max_columns=6),
        DebeziumJsonOptions(max_record_bytes=420),
    ):
        for batch in (1, 50, len(records)):
            # one record a batch costs ~3 ms a record in the stage (4 s for the stream, per
            # options): the first 250 records take that path, the whole stream the others
            part = records[:250] if batch == 1 else records
            a, b = _batches_both(part, options, batch)
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                assert x.schema == y.schema
                assert x.to_pylist() == y.to_pylist(), (seed, options, batch, i)


def test_the_decode_stage_on_the_golden_inputs():
    records = _golden_stream()
    options = DebeziumJsonOptions(primary_keys={"*": ("id",)})
    for batch in (1, 7, len(records)):
        a, b = _batches_both(records, options, batch)
        assert [x.to_pylist() for x in a] == [y.to_pylist() for y in b]


def test_the_decode_stage_builds_most_rows_without_events(monkeypatch):
    # the comparison above proves nothing if decode_flat answered for no record
    records = _stream(1, 3000)
    answered = count_answers(monkeypatch, DebeziumJsonDecoder, "decode_flat")
    monkeypatch.setattr(batches_module, "_FLAT_PROBE", 0)
    decode_records(DebeziumJsonDecoder(), records)
    assert 0.3 * len(records) < sum(answered) < 0.95 * len(records)


def test_common_records_are_all_built_flat(monkeypatch):
    # the bench's shape (benchmarks/e2e_debezium.py): every record but a table's first;
    # the columnar path (test_debezium_columnar.py), which takes such windows first, off
    monkeypatch.setattr(DebeziumJsonDecoder, "decode_columnar", lambda self, records: None)
    records = [
        Record(
            orjson.dumps(
                {
                    "before": None,
                    "after": {"id": i, "name": f"n{i}", "balance": i / 4, "ok": i % 2 == 0},
                    "source": {
                        "connector": "postgresql",
                        "ts_ms": 1_700_000_000_000 + i,
                        "db": "shop",
                        "schema": "public",
                        "table": "customers",
                        "lsn": 1000 + i,
                        "sequence": f'["{999 + i}","{1000 + i}"]',
                        "txId": 7,
                    },
                    "op": "c",
                    "ts_ms": 1_700_000_000_100 + i,
                    "transaction": None,
                }
            ),
            orjson.dumps({"id": i}),
            (),
            Origin("t", 0, i),
            None,
        )
        for i in range(3000)
    ]
    answered = count_answers(monkeypatch, DebeziumJsonDecoder, "decode_flat")
    out = decode_records(DebeziumJsonDecoder(), records)
    assert answered.count(False) == 1 and out.num_rows == 3000


def test_a_batch_of_uncommon_records_goes_the_general_way_whole(monkeypatch):
    # schema-ful messages: decode_flat declines; after the probe it is not asked again
    records = [
        Record(
            orjson.dumps({"schema": {"type": "struct"}, "payload": {"op": "x"}}),
            None,
            (),
            Origin("t", 0, i),
            None,
        )
        for i in range(2000)
    ]
    asked = count_answers(monkeypatch, DebeziumJsonDecoder, "decode_flat")
    out = decode_records(DebeziumJsonDecoder(), records)
    assert out.num_rows == 2000 and set(out.column("kind").to_pylist()) == {"dead"}
    # each window of _FLAT_WINDOW records is probed, then handed over whole
    windows = -(-len(records) // batches_module._FLAT_WINDOW)
    assert len(asked) == windows * (batches_module._FLAT_PROBE // 2 + 1)

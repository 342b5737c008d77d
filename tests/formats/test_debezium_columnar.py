"""Debezium's columnar path gives exactly the batches of the record-by-record way.

``DebeziumJsonDecoder.decode_columnar`` answers for whole windows of the common shape
(decision 33); the decode stage (``decode_records``) then builds their rows from columns,
and decodes from the first window it declines on record by record. These tests run
streams of that shape -- clean, and with every kind of record the columnar path must
decline sprinkled in at several rates -- through the decode stage with small windows,
and compare each batch with ``flatten(decode_batch)`` of a decoder whose fast paths are
off, value for value (``to_pylist``, so types count).
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.formats.helpers import count_answers

from cdcflow.decode import batches as batches_module
from cdcflow.decode.batches import decode_records, flatten
from cdcflow.formats.base import Record
from cdcflow.formats.debezium.json_decoder import DebeziumJsonDecoder, DebeziumJsonOptions
from cdcflow.model import Origin

PLACEHOLDER = "__debezium_unavailable_value"
COLUMNS = ["name", "qty", "price", "ok", "note"]


def _value(rng: random.Random, column: str) -> Any:
    if rng.random() < 0.1:
        return None
    return {
        "name": lambda: rng.choice(["a", "é€", "x y", "", "1"]) + str(rng.randint(0, 99)),
        "qty": lambda: rng.randint(-(10**12), 10**12),
        "price": lambda: round(rng.uniform(-1e6, 1e6), rng.randint(0, 6)),
        "ok": lambda: rng.random() < 0.5,
        "note": lambda: None,
    }[column]()


#: what each odd record does; the columnar path must decline every one of them
ODD = [
    "escaped string",  # "a\"b", "\u00e9" written escaped, a newline
    "placeholder",
    "big float",  # 1e20, 1.5e-7: Arrow and orjson print them differently
    "integral float",  # 5.0 in an int column, 5 in a float column
    "big int",
    "nested",
    "missing column",
    "reordered",
    "added column",
    "spaces",
    "overflow",  # 1e999 somewhere in the message
    "mysql",
    "other table",
    "transaction",
    "headers",
    "no key",
    "odd key",
    "odd sequence",
    "ts zero",  # not odd: the envelope's ts_ms is taken
    "truncate",
    "tombstone",
    "delete without before",
]


def _record(
    rng: random.Random, i: int, rows: dict, odd: str | None, connector: str = "postgresql"
) -> Record:
    key = rng.randint(1, 60)
    before = rows.get(key)
    op = rng.choice(["c", "c", "c", "r"] if before is None else ["u"] * 6 + ["d", "c"])
    after: dict[str, Any] | None = None
    if op != "d":
        after = {"id": key, **{c: _value(rng, c) for c in COLUMNS}}
        if rng.random() < 0.05 and op == "u":
            after["id"] = key + 100  # the row moved to another key
    lsn = 5000 + 10 * i
    source: dict[str, Any] = {
        "version": "2.7.0.Final",
        "connector": "postgresql",
        "name": "gen",
        "ts_ms": 1_700_000_000_000 + i,
        "snapshot": "false",
        "db": "shop",
        "sequence": rng.choice([f'["{lsn - 3}","{lsn}"]', f'[null,"{lsn}"]', None]),
        "schema": "public",
        "table": "items",
        "txId": rng.choice([700 + i // 5, None]),
        "lsn": lsn,
        "xmin": None,
    }
    if connector != "postgresql":  # MySQL/MariaDB: a binlog position, no schema level
        for member in ("sequence", "schema", "txId", "lsn", "xmin"):
            del source[member]
        source.update(
            connector=connector,
            file=f"mysql-bin.{3 + i // 300:06d}",
            pos=4 + 100 * i,
            row=rng.choice([0, 0, 1]),
            server_id=223344,
            gtid=None,
            thread=7,
        )
    envelope: dict[str, Any] = {
        "before": before if op == "d" or (op == "u" and rng.random() < 0.9) else None,
        "after": after,
        "source": source,
        "op": op,
        "ts_ms": 1_700_000_000_100 + i,
        "transaction": None,
    }
    raw_key: bytes | None = orjson.dumps({"id": (after or before or {"id": key})["id"]})
    headers: tuple = ()
    value: bytes | None = None
    image = after if after is not None else before
    if odd == "escaped string" and image is not None:
        image["name"] = rng.choice(['a"b', "tab\there", "back\\slash", "line\nbreak"])
    elif odd == "placeholder" and image is not None:
        image["note"] = PLACEHOLDER
    elif odd == "big float" and image is not None:
        image["price"] = rng.choice([1e20, 1.5e-7, 123456789012345.6])
    elif odd == "integral float" and image is not None:
        image["qty"] = 5.0
    elif odd == "big int" and image is not None:
        image["qty"] = 2**63 + 5
    elif odd == "nested" and image is not None:
        image["note"] = rng.choice([{"a": 1}, [1, 2], []])
    elif odd == "missing column" and image is not None:
        image.pop("price", None)
    elif odd == "reordered" and image is not None:
        items = list(image.items())
        rng.shuffle(items)
        image.clear()
        image.update(items)
    elif odd == "added column" and image is not None:
        image["added"] = 7
    elif odd == "mysql":
        source.update(connector="mysql", file="mysql-bin.000003", pos=lsn, row=0)
    elif odd == "other table":
        source["table"] = "others"
    elif odd == "transaction":
        envelope["transaction"] = {"id": "7", "total_order": 1, "data_collection_order": 1}
    elif odd == "headers":
        headers = (("h", b"v"),)
    elif odd == "no key":
        raw_key = None
    elif odd == "odd key":
        raw_key = rng.choice([b"[1]", b"{}", b"not json", orjson.dumps({"id": key, "x": 1})])
    elif odd == "odd sequence":
        source["sequence"] = rng.choice(['["٣","1"]', '["' + "9" * 21 + '","1"]', "x", '[""]'])
    elif odd == "ts zero":
        source["ts_ms"] = 0
    elif odd == "odd binlog position" and connector != "postgresql":
        source.update(
            rng.choice([{"file": "binlog"}, {"file": None}, {"pos": None}, {"row": None}])
        )
    elif odd == "truncate":
        envelope.update(op="t", before=None, after=None)
    elif odd == "delete without before":
        envelope.update(op="d", before=None, after=None)
    if odd == "tombstone":
        value = None
    else:
        value = orjson.dumps(envelope)
        if odd == "spaces":
            value = orjson.dumps(envelope, option=orjson.OPT_INDENT_2)
        elif odd == "overflow":
            value = value[:-1] + b',"x":1e999}'
    if op == "d":
        rows.pop(key, None)
    elif after is not None:
        rows[after["id"]] = after
    return Record(value, raw_key, headers, Origin("gen", 0, i), None)


def _stream(seed: int, n: int, odd_rate: float, connector: str = "postgresql") -> list[Record]:
    rng = random.Random(seed)
    rows: dict[int, dict] = {}
    kinds = ODD if connector == "postgresql" else [*ODD, "odd binlog position"]
    return [
        _record(rng, i, rows, rng.choice(kinds) if rng.random() < odd_rate else None, connector)
        for i in range(n)
    ]


def _compare(records: list[Record], options: DebeziumJsonOptions, batch: int) -> None:
    stage, general = DebeziumJsonDecoder(options), DebeziumJsonDecoder(options)
    general._fast_ok = False  # no decode_flat, no decode_columnar
    for i in range(0, len(records), batch):
        part = records[i : i + batch]
        got = decode_records(stage, part)
        want = flatten(general.decode_batch(part), general.state_items, part)
        assert got.schema == want.schema
        assert got.to_pylist() == want.to_pylist(), (options, batch, i)


def _assert_as_general(records: list[Record]) -> None:
    """One decode stage call on a fresh decoder gives the general way's batch."""
    got = decode_records(DebeziumJsonDecoder(), records)
    general = DebeziumJsonDecoder()
    general._fast_ok = False
    want = flatten(general.decode_batch(records), general.state_items, records)
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("connector", ["postgresql", "mysql", "mariadb"])
@pytest.mark.parametrize("odd_rate", [0.0, 0.003, 0.03])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_columnar_path_gives_the_batches_of_the_general_path(
    seed, odd_rate, connector, monkeypatch
):
    monkeypatch.setattr(batches_module, "_COLUMNAR_WINDOW", 40)
    answered = count_answers(monkeypatch, DebeziumJsonDecoder, "decode_columnar")
    records = _stream(seed, 1600, odd_rate, connector)
    for options in (
        DebeziumJsonOptions(),
        DebeziumJsonOptions(primary_keys={"items": ("id",)}),
        DebeziumJsonOptions(max_columns=5),
        DebeziumJsonOptions(max_record_bytes=540),
    ):
        for batch in (400, len(records)):
            _compare(records, options, batch)
    # the comparison proves nothing if the columnar path answered for no window
    assert any(answered)
    if odd_rate == 0.0:
        assert all(answered[: len(records) // 40])  # a clean stream: every window


@pytest.mark.parametrize("odd", ODD)
def test_each_odd_record_is_declined_and_decoded_alike(odd, monkeypatch):
    monkeypatch.setattr(batches_module, "_COLUMNAR_WINDOW", 16)
    answered = count_answers(monkeypatch, DebeziumJsonDecoder, "decode_columnar")
    rng = random.Random(3)
    rows: dict[int, dict] = {}
    records = [_record(rng, i, rows, odd if i == 37 else None) for i in range(100)]
    _compare(records, DebeziumJsonOptions(primary_keys={"items": ("id",)}), len(records))
    assert answered[:2] == [True, True]  # windows 0-15, 16-31
    if odd != "ts zero":
        assert answered[2] is False  # the window of record 37, then record by record


def test_a_fresh_decoder_answers_for_the_first_window(monkeypatch):
    # the table registry and key columns are filled as the general way fills them, so a
    # Spark task's first chunk is columnar too
    answered = count_answers(monkeypatch, DebeziumJsonDecoder, "decode_columnar")
    _assert_as_general(_stream(5, 300, 0.0))
    assert answered == [True]


def test_one_declaration_per_table_across_columnar_windows_and_the_rest(monkeypatch):
    monkeypatch.setattr(batches_module, "_COLUMNAR_WINDOW", 25)
    records = _stream(6, 200, 0.0)
    records[150] = _record(random.Random(1), 150, {}, "big int")
    out = decode_records(DebeziumJsonDecoder(), records)
    declared = [c for c in out.column("columns").to_pylist() if c is not None]
    assert len(declared) == len(set(declared))


_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_FLOATS, st.integers(-(2**63), 2**63 - 1)), min_size=1, max_size=30))
def test_numbers_of_every_magnitude_decode_alike(numbers):
    """Arrow prints a double as orjson does only in part of the range; elsewhere the
    window must be declined, never written in Arrow's form."""
    records = []
    for i, x in enumerate(numbers):
        after = {"id": i, "x": x, "y": -x if not isinstance(x, bool) else x}
        envelope = {
            "before": None,
            "after": after,
            "source": {
                "connector": "postgresql",
                "db": "d",
                "schema": "s",
                "table": "t",
                "ts_ms": 1,
                "lsn": 10 + i,
                "sequence": None,
                "txId": None,
            },
            "op": "c",
            "ts_ms": 2,
        }
        records.append(
            Record(orjson.dumps(envelope), orjson.dumps({"id": i}), (), Origin("t", 0, i))
        )
    _assert_as_general(records)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=6), min_size=1, max_size=20))
def test_strings_of_any_characters_decode_alike(texts):
    records = []
    for i, text in enumerate(texts):
        envelope = {
            "after": {"id": i, "s": text},
            "source": {
                "connector": "postgresql",
                "db": "d",
                "schema": "s",
                "table": "t",
                "lsn": 10 + i,
            },
            "op": "r",
        }
        records.append(
            Record(orjson.dumps(envelope), orjson.dumps({"id": i}), (), Origin("t", 0, i))
        )
    _assert_as_general(records)


@pytest.mark.parametrize("position", [{"file": "binlog"}, {"file": None}, {"pos": None}])
def test_an_odd_binlog_position_is_declined_and_decoded_alike(position, monkeypatch):
    monkeypatch.setattr(batches_module, "_COLUMNAR_WINDOW", 16)
    answered = count_answers(monkeypatch, DebeziumJsonDecoder, "decode_columnar")
    rng = random.Random(4)
    rows: dict[int, dict] = {}
    records = [_record(rng, i, rows, None, "mysql") for i in range(60)]
    envelope = orjson.loads(records[37].value)
    envelope["source"].update(position)
    records[37] = Record(orjson.dumps(envelope), records[37].key, (), records[37].origin, None)
    _compare(records, DebeziumJsonOptions(), len(records))
    assert answered == [True, True, False]  # windows 0-15, 16-31; 32-47 declined

"""Fuzzing every registered decoder: bad bytes end as dead letters, never as a crash.

For each format (``cdcflow.formats.embedded_formats()``), hypothesis feeds
:meth:`~cdcflow.formats.base.Decoder.decode_batch`:

* arbitrary bytes, arbitrary JSON, and JSON objects built from the format's own field
  names and values;
* mutations of valid messages -- the format's encoder output for a few workload changes
  and the golden inputs in ``tests/formats/cases/<format>/`` -- with byte flips,
  truncations, insertions, deleted/duplicated slices and splices, and, on JSON, deleted,
  duplicated and renamed fields, type swaps (number/string/null/object/array), huge
  numbers, ``NaN``/``Infinity`` literals, invalid UTF-8, lone surrogates and mutated JSON
  inside string fields; batches also lose, repeat and reorder records, so stateful
  decoders (Qlik metadata) and :meth:`~cdcflow.formats.base.Decoder.combine` (update
  halves) see broken sequences.

Fixed cases add 10 MB messages (a valid envelope with a 10 MB string value, 10 MB of
garbage) and deeply nested JSON (depth 300 to 100,000, bare and inside a valid envelope).

The property (:func:`check`): ``decode_batch`` never raises and finishes within
:data:`HANG_SECONDS`; every record ends exactly once as decoded, skipped or dead-lettered;
a dead letter has a known code and keeps the record's exact bytes and origin; events are
well formed; input that is not JSON yields no event from a JSON format; and
:func:`cdcflow.decode.batches.flatten` turns the result into Arrow rows without raising.

Bugs found this way keep a minimal reproducer at the end of the file, each asserting the
fixed behaviour (the dead-letter code and what its message names, or the event). The
hypothesis tests tolerate nothing: every event of every example is checked and flattened.

The default run is sized for about a minute on two cores. ``CDCFLOW_FUZZ_EXAMPLES=N``
runs N examples per format and property instead (e.g. 5000 for a long run); pytest's
``--hypothesis-seed`` replays a run.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import decimal
import functools
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.decode.batches import flatten
from cdcflow.errors import Code
from cdcflow.formats import decoder_for, embedded_formats
from cdcflow.formats.base import Decoder, DecodeResult, Record
from cdcflow.model import ROW_OPS, ChangeEvent, DeadLetter, Op, Origin, SourceTable, Txn, seq_key
from cdcflow.types import parse_type
from cdcflow_testkit.encoders import SourceChange, encoder_for
from cdcflow_testkit.golden import load_case
from cdcflow_testkit.workload import TableSpec, Workload, tables_for

FORMATS = embedded_formats()
KNOWN_CODES = frozenset(Code)
CASES = Path(__file__).parent / "cases"

#: A batch of a few small records using more CPU time than this is a hang. CPU time, not
#: wall time: ``make test`` runs this lane at ``nice 10`` beside Spark, and a wall clock
#: once read 7.8 s for a batch that uses 0.01 s of CPU (CI of stop 38).
HANG_SECONDS = 5.0
MB = 1024 * 1024


def _examples(default: int) -> int:
    """Examples per format and property: ``CDCFLOW_FUZZ_EXAMPLES`` or ``default``."""
    raw = os.environ.get("CDCFLOW_FUZZ_EXAMPLES", "").strip()
    return int(raw) if raw else default


def _fuzz_settings(default: int) -> settings:
    return settings(
        max_examples=_examples(default),
        deadline=None,  # check() measures every batch against HANG_SECONDS instead
        database=None,  # no .hypothesis/ folder in the repository
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --------------------------------------------------------------------------- the property


def _is_json(value: bytes) -> bool:
    """Whether any reasonable JSON parser could read ``value`` (orjson, or the stdlib,
    which also takes NaN/Infinity, huge numbers and UTF-16/32)."""
    try:
        orjson.loads(value)
        return True
    except orjson.JSONDecodeError:
        pass
    try:
        json.loads(value)
        return True
    except (ValueError, RecursionError):
        return False


#: The Python values of image columns (the table in :mod:`cdcflow.model`).
SCALARS = (bool, int, float, decimal.Decimal, str, bytes, dt.date, dt.time, dt.datetime)


def _int64(n: Any) -> bool:
    return type(n) is int and -(2**63) <= n < 2**63


def _check_image(image: Any, where: str) -> None:
    if image is None:
        return
    assert isinstance(image, dict), f"{where} is a {type(image).__name__}, not a dict"
    for column, value in image.items():
        assert isinstance(column, str), f"{where}: column name {column!r} is not a string"
        assert value is None or isinstance(value, SCALARS), (
            f"{where}[{column!r}] is a {type(value).__name__}: {value!r:.80}"
        )


def check_event(event: ChangeEvent, decoded: set[Origin]) -> None:
    """The sanity of one decoded event (not its meaning)."""
    assert isinstance(event, ChangeEvent), type(event)
    assert isinstance(event.op, Op), f"op {event.op!r} is not an Op"
    src = event.source
    assert isinstance(src, SourceTable) and all(
        isinstance(p, str) for p in (src.format, src.database, src.schema, src.table)
    ), src
    if event.op in ROW_OPS:
        assert isinstance(event.key, dict) and event.key, f"{event.op} without a key: {event.key!r}"
        assert all(isinstance(c, str) for c in event.key), event.key
        assert event.before is not None or event.after is not None, f"{event.op} without an image"
    else:
        assert event.key is None or isinstance(event.key, dict), event.key
    if event.columns is not None:
        assert isinstance(event.columns, dict), event.columns
        for column, logical in event.columns.items():
            assert isinstance(column, str), column
            parse_type(logical)  # a logical type (ValueError otherwise)
    _check_image(event.key, "key")
    _check_image(event.before, "before")
    _check_image(event.after, "after")
    if event.seq is not None:
        assert isinstance(event.seq, tuple), f"seq {event.seq!r} is not a tuple"
        assert all(type(n) is int for n in event.seq), f"seq {event.seq!r} is not all ints"
        seq_key(event.seq)
    assert event.ts_ms is None or _int64(event.ts_ms), f"ts_ms {event.ts_ms!r} is not an int64"
    assert event.txn is None or isinstance(event.txn, Txn), event.txn
    if event.txn is not None:
        assert isinstance(event.txn.id, str), event.txn
        assert event.txn.order is None or _int64(event.txn.order), f"txn.order {event.txn.order!r}"
        assert event.txn.last is None or isinstance(event.txn.last, bool), event.txn
    assert event.ddl is None or isinstance(event.ddl, str), event.ddl
    assert event.changed is None or (
        isinstance(event.changed, tuple) and all(isinstance(c, str) for c in event.changed)
    ), event.changed
    assert event.meta is None or isinstance(event.meta, dict), event.meta
    assert event.origin in decoded, f"event from {event.origin}, not a decoded record"


def check(
    decoder: Decoder,
    records: Sequence[Record],
    *,
    hang_seconds: float = HANG_SECONDS,
) -> DecodeResult:
    """Decode ``records`` and assert the fuzzing property (see the module docstring).

    Args:
        decoder: a fresh decoder.
        records: records with distinct origins.
        hang_seconds: the most CPU time ``decode_batch`` may use.

    Returns:
        The decode result, for further checks.
    """
    origins = [r.origin for r in records]
    assert len(set(origins)) == len(origins), "test bug: records need distinct origins"
    by_origin = {r.origin: r for r in records}
    started = time.process_time()
    result = decoder.decode_batch(records)
    elapsed = time.process_time() - started
    assert elapsed < hang_seconds, (
        f"decode_batch used {elapsed:.1f} s of CPU for {len(records)} records"
    )

    # every record ends exactly once as decoded, skipped or dead-lettered
    assert result.records == len(records)
    assert result.records == (
        result.decoded_records + len(result.skipped) + len(result.dead_letters)
    ), (result.records, result.decoded_records, result.skipped, result.dead_letters)
    assert len(result.decoded_origins) == result.decoded_records
    ends = Counter(result.decoded_origins)
    ends.update(s.origin for s in result.skipped)
    ends.update(d.origin for d in result.dead_letters)
    assert ends == Counter(origins), "a record ended twice or not at all"

    for s in result.skipped:
        assert isinstance(s.reason, str) and s.reason, s
    for d in result.dead_letters:
        record = by_origin[d.origin]
        assert d.code in KNOWN_CODES, f"unknown dead-letter code {d.code!r}"
        assert d.format == decoder.identifier
        assert isinstance(d.message, str) and d.message.strip(), d
        assert d.value is record.value or (type(d.value) is bytes and d.value == record.value)
        assert d.key == record.key

    decoded = set(result.decoded_origins)
    for event in result.events:
        check_event(event, decoded)

    # a JSON format never makes an event out of bytes that are not JSON
    if not decoder.binary_values:
        from_records = {e.origin for e in result.events}
        for origin in from_records:
            value = by_origin[origin].value
            assert value is not None and _is_json(value), (
                f"events from a record that is not JSON: {value[:200]!r}"
            )

    batch = flatten(result)
    with_events = {e.origin for e in result.events}
    joined = sum(1 for o in result.decoded_origins if o not in with_events)
    # flatten turns a record whose events cannot be stored into one BAD_VALUE dead letter
    rows = batch.to_pydict()
    decode_dead = {
        (d.origin.topic, d.origin.partition, d.origin.offset) for d in result.dead_letters
    }
    converted = {
        (t, p, o)
        for k, r, t, p, o in zip(
            rows["kind"],
            rows["reason"],
            rows["topic"],
            rows["partition"],
            rows["offset"],
            strict=True,
        )
        if k == "dead" and (t, p, o) not in decode_dead
    }
    assert all(
        r == "BAD_VALUE"
        for k, r, t, p, o in zip(
            rows["kind"],
            rows["reason"],
            rows["topic"],
            rows["partition"],
            rows["offset"],
            strict=True,
        )
        if (t, p, o) in converted
    )
    kept = sum(
        1
        for e in result.events
        if (e.origin.topic, e.origin.partition, e.origin.offset) not in converted
    )
    want = {
        "event": kept,
        "joined": joined,
        "skip": len(result.skipped),
        "dead": len(result.dead_letters) + len(converted),
    }
    assert Counter(batch.column("kind").to_pylist()) == {k: n for k, n in want.items() if n}
    return result


_CAUGHT = re.compile(r"([A-Z]\w*): ")


def unexpected(dead: DeadLetter) -> bool:
    """Whether ``dead`` comes from ``decode_batch``'s safety net: the decoder raised an
    exception other than ``DecodeError`` (message ``"<ExceptionType>: ..."``), so its
    code and message say nothing about the input."""
    m = _CAUGHT.match(dead.message)
    if dead.code != Code.BAD_FIELD or m is None:
        return False
    name = m.group(1)
    return name.endswith(("Error", "Exception")) or isinstance(getattr(builtins, name, None), type)


def assert_clear(result: DecodeResult) -> None:
    """Every dead letter says what is wrong with the input (no stray exception)."""
    stray = [(d.origin.offset, d.message[:120]) for d in result.dead_letters if unexpected(d)]
    assert not stray, f"dead letters from an unexpected exception: {stray}"


def _records(
    values: Iterable[tuple[bytes | None, bytes | None, tuple]], topic: str = "fuzz"
) -> list[Record]:
    return [
        Record(value=v, key=k, headers=h, origin=Origin(topic, 0, i))
        for i, (v, k, h) in enumerate(values)
    ]


# --------------------------------------------------------------------------- seed messages


@dataclasses.dataclass(frozen=True)
class Seed:
    """Valid (or golden) records of one format, with the options to decode them."""

    name: str
    records: tuple[Record, ...]
    options: Any

    def decoder(self, fmt: str) -> Decoder:
        return decoder_for(fmt, self.options)


#: Every type the workload generates values for; each format keeps the ones it carries.
_FUZZ_TABLE = TableSpec(
    "fuzz_types",
    {
        "id": "int64",
        "i32": "int32",
        "f64": "float64",
        "amount": "decimal(18,4)",
        "flag": "boolean",
        "day": "date",
        "at": "timestamptz",
        "local": "timestamp",
        "raw": "binary",
        "label": "string",
    },
    ("id",),
)


def _encoder_seed(fmt: str, seed: int, truncate_every: int) -> Seed:
    encoder = encoder_for(fmt)
    specs = tables_for(encoder.exact_types) + tables_for(encoder.exact_types, [_FUZZ_TABLE])
    workload = Workload(specs, seed=seed)
    changes: list[SourceChange] = []
    messages = []
    for change in workload.changes(12, truncate_every=truncate_every):
        try:
            encoded = encoder.encode(change)
        except Exception:  # noqa: BLE001 - e.g. Qlik publishes nothing for a truncate
            continue
        changes.append(change)
        messages.extend(encoded)
    values = [(m.value, m.key, m.headers) for m in messages]
    return Seed(f"encoder-{seed}", tuple(_records(values)), encoder.decoder_options(changes))


def _golden_seeds(folder: str, wrap_for: str | None = None) -> list[Seed]:
    out = []
    for path in sorted((CASES / folder).glob("*.expected.jsonl")):
        case = load_case(path)
        options = case.options
        if wrap_for == "auto":
            options = {"format_options": {folder: options}} if options else None
        out.append(Seed(f"{folder}/{case.name}", tuple(case.records), options))
    return out


@functools.cache
def seeds(fmt: str) -> tuple[Seed, ...]:
    """The format's own encoder output, and its golden inputs (``auto``: every JSON
    format's golden inputs, each format's options passed through ``format_options``)."""
    out = [_encoder_seed(fmt, 1, 0), _encoder_seed(fmt, 2, 4)]
    if fmt == "auto":
        for other in FORMATS:
            if other != "auto" and not decoder_for(other).binary_values:
                out.extend(_golden_seeds(other, wrap_for="auto"))
    else:
        out.extend(_golden_seeds(fmt))
    return tuple(s for s in out if any(r.value is not None for r in s.records))


def _walk(node: Any, keys: set[str], strings: set[str]) -> None:
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            keys.update(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and len(node) <= 64:
            strings.add(node)


@functools.cache
def vocabulary(fmt: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Field names and short string values found in the format's JSON seeds."""
    keys: set[str] = set()
    strings: set[str] = set()
    for seed in seeds(fmt):
        for r in seed.records:
            try:
                _walk(orjson.loads(r.value or b""), keys, strings)
            except orjson.JSONDecodeError:
                continue
    return tuple(sorted(keys)) or ("a",), tuple(sorted(strings)) or ("a",)


# --------------------------------------------------------------------------- strategies

_INT64 = st.integers(-(2**63), 2**63 - 1)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


_JSON = st.recursive(
    st.none() | st.booleans() | _INT64 | _FLOATS | st.text(max_size=16), _containers, max_leaves=16
)


@functools.cache
def _vocab_json(fmt: str) -> st.SearchStrategy[Any]:
    """JSON built from the format's own field names and string values."""
    keys, strings = vocabulary(fmt)
    names = st.sampled_from(keys)

    def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=8)

    leaves = (
        st.none()
        | st.booleans()
        | _INT64
        | _FLOATS
        | st.sampled_from(strings)
        | st.text(max_size=8)
    )
    return st.recursive(leaves, containers, max_leaves=24)


@functools.cache
def _envelopes(fmt: str) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes, arbitrary JSON, and JSON objects made of the format's vocabulary."""
    return (
        st.binary(max_size=300)
        | _JSON.map(orjson.dumps)
        | _vocab_json(fmt).map(orjson.dumps)
        | st.dictionaries(st.sampled_from(vocabulary(fmt)[0]), _vocab_json(fmt), max_size=10).map(
            orjson.dumps
        )
    )


#: Raw JSON literals a mutation puts in place of a value.
LITERALS: tuple[bytes, ...] = (
    b"null",
    b"true",
    b"false",
    b"0",
    b"-0",
    b"-1",
    b"1",
    b"0.5",
    b"-0.0",
    b"1e-400",
    b"2147483648",
    b"-2147483649",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"18446744073709551616",
    b"1" + b"0" * 40,
    b"-" + b"9" * 400,
    b"1e400",
    b"-1e400",
    b"1.7976931348623157e309",
    b"1e-7",
    b"123456789.123456789123456789",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"nan",
    b"inf",
    b'""',
    b'" "',
    b'"x"',
    b'"0"',
    b'"-1"',
    b'"1e400"',
    b'"NaN"',
    b'"null"',
    b'"true"',
    b'"\\u0000"',
    b'"\\ud800"',
    b'"\\udfff\\ud800"',
    b'"\xff\xfe"',
    b'"\xc3("',
    b'"\xed\xa0\x80"',
    b'"2024-13-45T25:61:61Z"',
    b'"0000-00-00 00:00:00"',
    b'"9999-12-31 23:59:59.999999999"',
    b'"24:00:00"',
    b'"2024-02-30"',
    b'"+08:00"',
    b'"\\/Date(1)\\/"',
    b"{}",
    b"[]",
    b"[null]",
    b"[[]]",
    b'{"":null}',
    b'{"a":{"b":[1,{"c":null}]}}',
    b"[1,2,3]",
    b'"' + b"x" * 5000 + b'"',
    b"[" + b"0," * 2000 + b"0]",
    b"[" * 300 + b"]" * 300,  # deeper than orjson writes (254), not than it reads (1024)
)

#: Bytes a mutation inserts.
TOKENS: tuple[bytes, ...] = (
    b'"',
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b" ",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"NaN",
    b"-",
    b"9" * 30,
    b"e999",
    b'"a":1,',
    b",}",
    b",]",
    # Avro zig-zag varints: huge and negative lengths / counts, an unterminated varint
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\xfe\xff\xff\xff\x0f",
    b"\x01",
    b"\x03",
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
    b"\x80",
)

_MARK = "\x00fuzz-mark\x00"
_MARK_JSON = orjson.dumps(_MARK)
_DUP = "\x00fuzz-dup\x00"
_DUP_JSON = orjson.dumps(_DUP)


def _slots(doc: Any, limit: int = 500) -> list[tuple[Any, Any]]:
    """``(container, key or index)`` of every value under ``doc`` (breadth first)."""
    out: list[tuple[Any, Any]] = []
    queue = [doc]
    while queue and len(out) < limit:
        node = queue.pop(0)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out.append((node, k))
            if isinstance(v, dict | list):
                queue.append(v)
    return out


def _derived(value: Any) -> list[bytes]:
    """Replacements made from the value being replaced (type swaps that keep its content)."""
    out = [
        orjson.dumps([value]),
        orjson.dumps({"value": value}),
        orjson.dumps(orjson.dumps(value).decode()),
    ]
    if isinstance(value, bool):
        out += [b"1" if value else b"0", b'"true"' if value else b'"false"']
    elif isinstance(value, int | float):
        text = orjson.dumps(value)
        out += [b'"' + text + b'"', b"-" + text, text + b"0" * 30, text + b"e400", text + b".5"]
    elif isinstance(value, str):
        raw = value.encode()
        if raw[:1].isdigit() or raw[:1] == b"-":
            out += [raw, raw + b"0" * 30]
        out += [
            orjson.dumps(value * 50),
            orjson.dumps(value[:-1]),
            b'"' + raw[:3] + b"\xff" + raw[3:] + b'"',
        ]
    return out


def _rebuild(d: dict, k: str, new_key: str | None, dup: bool) -> None:
    """Rename ``d[k]`` to ``new_key``, or add a duplicate marker after it, in place."""
    items = list(d.items())
    d.clear()
    for key, val in items:
        if key == k and new_key is not None:
            d[new_key] = val
            continue
        d[key] = val
        if key == k and dup:
            d[_DUP] = _MARK


def _mutate_json(draw: st.DrawFn, value: bytes, fmt: str, depth: int = 0) -> bytes | None:
    """One structural mutation of a JSON container, or ``None`` when ``value`` is not one."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict | list) or not doc:
        return None
    slots = _slots(doc)
    parent, k = draw(st.sampled_from(slots))
    current = parent[k]
    keys, strings = vocabulary(fmt)
    action = draw(
        st.sampled_from(["delete", "swap", "swap", "swap", "duplicate", "rename", "inner", "graft"])
    )
    raw = draw(
        st.sampled_from(LITERALS)
        | st.sampled_from(_derived(current))
        | st.sampled_from(strings).map(orjson.dumps)
        | _vocab_json(fmt).map(orjson.dumps)
    )
    if action == "inner" and isinstance(current, str) and current[:1] in "{[" and depth < 2:
        inner = _mutate_json(draw, current.encode(), fmt, depth + 1)
        if inner is not None:
            raw = orjson.dumps(inner.decode("utf-8", "replace"))
        action = "swap"
    if action == "graft":
        other_parent, other_k = draw(st.sampled_from(slots))
        raw = orjson.dumps(other_parent[other_k])
        action = "swap"
    if action == "delete":
        del parent[k]
        return orjson.dumps(doc)
    if isinstance(parent, dict) and action in ("duplicate", "rename"):
        if action == "rename":
            _rebuild(parent, k, draw(st.sampled_from(keys) | st.text(max_size=6)), dup=False)
            return orjson.dumps(doc)
        _rebuild(parent, k, None, dup=True)
        text = orjson.dumps(doc)
        return text.replace(_DUP_JSON, orjson.dumps(k), 1).replace(_MARK_JSON, raw, 1)
    parent[k] = _MARK
    return orjson.dumps(doc).replace(_MARK_JSON, raw, 1)


def _mutate_bytes(draw: st.DrawFn, value: bytes, others: Sequence[bytes]) -> bytes:
    n = len(value)
    action = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "duplicate", "splice"]))
    at = draw(st.integers(0, n))
    if action == "flip" and n:
        at = min(at, n - 1)
        return value[:at] + bytes([value[at] ^ draw(st.integers(1, 255))]) + value[at + 1 :]
    if action == "truncate":
        return value[:at]
    if action in ("delete", "duplicate"):
        length = draw(st.integers(1, 64))
        piece = value[at : at + length]
        return value[:at] + (piece * 2 if action == "duplicate" else b"") + value[at + length :]
    if action == "splice" and others:
        other = draw(st.sampled_from(others))
        a = draw(st.integers(0, len(other)))
        return value[:at] + other[a : a + draw(st.integers(1, 200))] + value[at:]
    return (
        value[:at] + draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=8)) + value[at:]
    )


def mutate(draw: st.DrawFn, value: bytes, fmt: str, others: Sequence[bytes]) -> bytes:
    """One to three mutations of ``value``: structural on JSON, byte-level on anything."""
    for _ in range(draw(st.integers(1, 3))):
        mutated = None
        if draw(st.integers(0, 3)):  # mostly structural, which keeps the value JSON
            try:
                mutated = _mutate_json(draw, value, fmt)
            except TypeError:  # deeper than orjson writes (an earlier step's deep literal)
                mutated = None
        value = mutated if mutated is not None else _mutate_bytes(draw, value, others)
    return value


_HEADER_NAMES = ("__debezium.oldkey", "__debezium.newkey")


@st.composite
def mutated_batches(draw: st.DrawFn, fmt: str) -> tuple[Seed, list[Record]]:
    """A seed's records with one or two of them mutated, and maybe some lost, repeated or
    swapped."""
    seed = draw(st.sampled_from(seeds(fmt)))
    items = [(r.value, r.key, r.headers) for r in seed.records]
    others = [v for v, _, _ in items if v]
    for _ in range(draw(st.integers(1, 2))):
        i = draw(st.integers(0, len(items) - 1))
        value, key, headers = items[i]
        which = draw(st.integers(0, 19))
        if which == 0 and key is not None:
            key = mutate(draw, key, fmt, others)
        elif which == 1:  # a header (Debezium reads its primary-key-change headers)
            name = draw(st.sampled_from(_HEADER_NAMES) | st.text(max_size=12))
            headers = (
                *headers,
                (name, draw(st.none() | st.sampled_from(LITERALS) | _envelopes(fmt))),
            )
        else:
            value = mutate(draw, value if value is not None else b"{}", fmt, others)
        items[i] = (value, key, headers)
    if len(items) > 1:
        reshape = draw(st.sampled_from(["none", "none", "drop", "repeat", "swap"]))
        i = draw(st.integers(0, len(items) - 2))
        if reshape == "drop":
            del items[i]
        elif reshape == "repeat":
            items.insert(i, items[i])
        elif reshape == "swap":
            items[i], items[i + 1] = items[i + 1], items[i]
    return seed, _records(items)


@st.composite
def arbitrary_batches(draw: st.DrawFn, fmt: str) -> tuple[Seed, list[Record]]:
    """Records of arbitrary bytes / JSON, decoded with the options of one of the seeds."""
    seed = draw(st.sampled_from(seeds(fmt)))
    record = st.tuples(st.none() | _envelopes(fmt), st.none() | st.binary(max_size=16), st.just(()))
    items = draw(st.lists(record, min_size=1, max_size=4))
    return seed, _records(items)


# --------------------------------------------------------------------------- fuzz tests


@pytest.mark.parametrize("fmt", FORMATS)
@_fuzz_settings(150)
@given(data=st.data())
def test_arbitrary_input_is_decoded_or_dead_lettered(fmt: str, data: st.DataObject) -> None:
    seed, records = data.draw(arbitrary_batches(fmt))
    check(seed.decoder(fmt), records)


@pytest.mark.parametrize("fmt", FORMATS)
@_fuzz_settings(500)
@given(data=st.data())
def test_mutated_messages_are_decoded_or_dead_lettered(fmt: str, data: st.DataObject) -> None:
    seed, records = data.draw(mutated_batches(fmt))
    check(seed.decoder(fmt), records)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_seed_decodes_cleanly_through_check(fmt: str) -> None:
    """The unmutated seeds satisfy the property (so a failure above is the mutation's)."""
    for seed in seeds(fmt):
        check(seed.decoder(fmt), list(seed.records))


# --------------------------------------------------------------------------- 10 MB messages

_TABLE = SourceTable(format="", database="shop", schema="public", table="items")


def _insert(columns: dict[str, str], row: dict[str, Any]) -> SourceChange:
    return SourceChange(
        op=Op.INSERT,
        table=_TABLE,
        columns=columns,
        key_columns=("id",),
        before=None,
        after=row,
        seq=42,
        ts_ms=1_700_000_000_000,
    )


def _encoded(fmt: str, change: SourceChange) -> tuple[list[Record], Any]:
    encoder = encoder_for(fmt)
    messages = encoder.encode(change)
    return _records([(m.value, m.key, m.headers) for m in messages]), encoder.decoder_options(
        [change]
    )


#: 10 MiB of text with characters that need escaping in JSON and several UTF-8 lengths
_UNIT = 'scooter "quoted" back\\slash\nnaïve café 日本 🎉 '
BIG_TEXT = (_UNIT * (10 * MB // len(_UNIT) + 1))[: 10 * MB]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_10_mb_string_value_in_a_valid_envelope(fmt: str) -> None:
    records, options = _encoded(
        fmt, _insert({"id": "int64", "name": "string"}, {"id": 1, "name": BIG_TEXT})
    )
    assert max(len(r.value or b"") for r in records) > 10 * MB
    result = check(decoder_for(fmt, options), records)
    assert_clear(result)
    rows = [e for e in result.events if e.op in ROW_OPS]
    if rows:  # handled: the value arrives whole
        assert [e.after["name"] for e in rows] == [BIG_TEXT]
    else:  # or dead-lettered with a clear code
        assert result.dead_letters, result.skipped


_GARBAGE = random.Random(10).randbytes(10 * MB)
BIG_GARBAGE = {
    "random": _GARBAGE,
    "unterminated-json-string": b'{"a":"' + b"x" * (10 * MB),
    "long-json-array": b"[" + b"1," * (5 * MB) + b"1]",
    "avro-like": b"\x00" * 16 + _GARBAGE[: 10 * MB - 16],
}


@pytest.mark.parametrize("kind", list(BIG_GARBAGE))
@pytest.mark.parametrize("fmt", FORMATS)
def test_10_mb_of_garbage_is_dead_lettered(fmt: str, kind: str) -> None:
    records = _records([(BIG_GARBAGE[kind], None, ())])
    result = check(decoder_for(fmt), records)
    assert_clear(result)
    if not decoder_for(fmt).binary_values:
        assert result.events == [] and len(result.dead_letters) == 1


# --------------------------------------------------------------------------- deep nesting

DEPTHS = (300, 1_000, 10_000, 100_000)  # orjson writes at most 254 levels and reads 1024


def _deep_array(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _deep_object(depth: int) -> bytes:
    return b'{"a":' * depth + b"null" + b"}" * depth


_SENTINEL = "fuzzsentinel0"


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_deeply_nested_json_is_decoded_or_dead_lettered(fmt: str, depth: int) -> None:
    values = [
        _deep_array(depth),
        _deep_object(depth),
        b"[" * depth,
        b'{"a":' * depth,
        b'{"payload":' + _deep_object(depth) + b"}",
    ]
    result = check(decoder_for(fmt), _records([(v, None, ()) for v in values]))
    assert_clear(result)
    if not decoder_for(fmt).binary_values:
        assert result.events == []


def _envelope_with(fmt: str, raw: bytes) -> tuple[list[Record], Any]:
    """The format's valid insert message with the string value of column ``name``
    replaced by the raw JSON ``raw`` (JSON formats)."""
    records, options = _encoded(
        fmt, _insert({"id": "int64", "name": "string"}, {"id": 1, "name": _SENTINEL})
    )
    quoted = orjson.dumps(_SENTINEL)
    out = []
    for r in records:
        value = r.value.replace(quoted, raw) if r.value and quoted in r.value else r.value
        out.append((value, r.key, r.headers))
    assert any(quoted in (r.value or b"") for r in records), "sentinel not found"
    return _records(out), options


#: Formats that keep an object or array in a string (or undeclared) column as JSON text.
#: A value that orjson reads (up to 1024 levels) but cannot write back (over 254) was a
#: ``BAD_FIELD`` "TypeError: Recursion limit reached" from decode_batch's safety net; it is
#: a ``BAD_VALUE`` that names the column and the limit.
_KEPT_AS_JSON_TEXT = frozenset(
    {"aws-dms-json", "maxwell-json", "ogg-json", "canal-json", "shareplex-json"}
)


def _envelope_params() -> list[Any]:
    return [
        pytest.param(fmt, depth, id=f"{fmt}-{depth}")
        for fmt in FORMATS
        if not decoder_for(fmt).binary_values
        for depth in DEPTHS
    ]


@pytest.mark.parametrize(("fmt", "depth"), _envelope_params())
def test_deeply_nested_column_value_in_a_valid_envelope(fmt: str, depth: int) -> None:
    for raw in (_deep_array(depth), _deep_object(depth)):
        records, options = _envelope_with(fmt, raw)
        result = check(decoder_for(fmt, options), records)
        assert_clear(result)
        if fmt in _KEPT_AS_JSON_TEXT and depth <= 1024:  # read by orjson, not writable
            assert result.dead_letters
            for dead in result.dead_letters:
                assert dead.code == Code.BAD_VALUE, dead
                assert "column 'name'" in dead.message
                assert "nested deeper than 254 levels" in dead.message


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_deeply_nested_json_text_as_a_string_or_json_column(fmt: str, depth: int) -> None:
    """Nested JSON *text* as a column value: a ``json`` column may be parsed by the decoder."""
    exact = encoder_for(fmt).exact_types
    columns = {"id": "int64", "name": "string"}
    text = _deep_array(depth).decode()
    row: dict[str, Any] = {"id": 1, "name": text}
    if "json" in exact:
        columns["doc"] = "json"
        row["doc"] = _deep_object(depth).decode()
    records, options = _encoded(fmt, _insert(columns, row))
    result = check(decoder_for(fmt, options), records)
    assert_clear(result)
    rows = [e for e in result.events if e.op in ROW_OPS]
    if rows:
        assert rows[0].after["name"] == text


# --------------------------------------------------------------------------- size limit


def _options_class(fmt: str) -> type:
    return type(decoder_for(fmt)).options_class


def _options_with_limit(fmt: str, options: Any, limit: int) -> Any:
    """The format's options object built from ``options`` with ``max_record_bytes=limit``."""
    cls = _options_class(fmt)
    base = (
        cls()
        if options is None
        else (options if dataclasses.is_dataclass(options) else cls.from_mapping(options))
    )
    return dataclasses.replace(base, max_record_bytes=limit)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_options_class_takes_max_record_bytes(fmt: str, tmp_path: Path) -> None:
    cls = _options_class(fmt)
    assert cls().max_record_bytes == 16 * MB
    assert cls(max_record_bytes=123).max_record_bytes == 123
    mapping: dict[str, Any] = {"max_record_bytes": 123}
    if fmt == "drs-avro":  # its configuration path requires a schema file
        from cdcflow.formats.drs_avro import STANDIN_SCHEMA

        schema = tmp_path / "record.avsc"
        schema.write_text(json.dumps(STANDIN_SCHEMA))
        mapping["schema_path"] = str(schema)
    assert decoder_for(fmt, mapping).options.max_record_bytes == 123


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_record_over_max_record_bytes_is_dead_lettered_too_large(fmt: str) -> None:
    records, options = _encoded(
        fmt, _insert({"id": "int64", "name": "string"}, {"id": 1, "name": "x" * 5000})
    )
    biggest = max(len(r.value or b"") for r in records)
    small = [r for r in records if len(r.value or b"") < biggest]
    # at the limit: decoded as before
    at_limit = decoder_for(fmt, _options_with_limit(fmt, options, biggest)).decode_batch(records)
    assert at_limit.dead_letters == [] and at_limit.events
    # one byte under it: the big record is a TOO_LARGE dead letter, the others decode
    decoder = decoder_for(fmt, _options_with_limit(fmt, options, biggest - 1))
    result = check(decoder, records)
    assert [d.code for d in result.dead_letters] == [Code.TOO_LARGE]
    dead = result.dead_letters[0]
    assert len(dead.value) == biggest
    assert str(biggest) in dead.message and str(biggest - 1) in dead.message
    assert "max_record_bytes" in dead.message
    assert result.decoded_records + len(result.skipped) == len(small)


def test_the_default_limit_dead_letters_a_17_mb_record_without_parsing_it() -> None:
    value = b'{"a":"' + b"x" * (17 * MB) + b'"}'
    decoder = decoder_for("debezium-json")
    decoder.decode = None  # type: ignore[method-assign]  # any decode attempt would raise TypeError
    result = decoder.decode_batch([Record(value=value, origin=Origin("t", 1, 5))])
    assert [(d.code, d.origin, d.value is value) for d in result.dead_letters] == [
        (Code.TOO_LARGE, Origin("t", 1, 5), True)
    ]
    message = result.dead_letters[0].message
    assert "debezium-json options" in message and "sources[].options.max_record_bytes" in message


def test_a_tombstone_is_skipped_whatever_the_limit() -> None:
    decoder = decoder_for("maxwell-json", {"max_record_bytes": 0})
    result = decoder.decode_batch(
        [Record(value=None), Record(value=b"{}", origin=Origin("t", 0, 1))]
    )
    assert [s.reason for s in result.skipped] == ["TOMBSTONE"]
    assert [d.code for d in result.dead_letters] == [Code.TOO_LARGE]


# --------------------------------------------------------------------------- bug reproducers
# Minimal reproducers of what the fuzzer found. Each expects the correct behaviour (a
# well-formed event that flattens, or a dead letter with a clear code); one not fixed yet
# is marked xfail(strict=True), and the mark goes when the decoder is fixed.

_INSERT = _insert({"id": "int64", "name": "string"}, {"id": 1, "name": "x"})


def _patched(
    fmt: str, edits: dict[tuple[Any, ...], bytes | None], index: int = -1
) -> tuple[list[Record], Any]:
    """The format's messages for one insert, with JSON fields of message ``index`` set to
    raw JSON (``None``: deleted)."""
    records, options = _encoded(fmt, _INSERT)
    doc = orjson.loads(records[index].value)
    raws = []
    for path, raw in edits.items():
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        if raw is None:
            del parent[path[-1]]
        else:
            parent[path[-1]] = f"\x00raw{len(raws)}\x00"
            raws.append(raw)
    value = orjson.dumps(doc)
    for i, raw in enumerate(raws):
        value = value.replace(orjson.dumps(f"\x00raw{i}\x00"), raw, 1)
    records[index] = dataclasses.replace(records[index], value=value)
    return records, options


_BEYOND_INT64 = b"9223372036854775808"  # 2**63
_INT64_RANGE = "-9223372036854775808..9223372036854775807"


def _dead(code: str, *names: str) -> tuple[str, str, tuple[str, ...]]:
    """Expect the patched record to be one dead letter ``code`` whose message has ``names``."""
    return ("dead", code, names)


def _json_text(column: str, text: str) -> tuple[str, str, tuple[str, ...]]:
    """Expect a row event whose undeclared ``column`` holds JSON ``text``, declared json."""
    return ("json", column, (text,))


BUG_CASES = [
    # ts_ms from an epoch-ms field was not range-checked (2**63 ms)
    pytest.param(
        "canal-json",
        {("es",): _BEYOND_INT64},
        -1,
        _dead(Code.BAD_FIELD, "'es'", _INT64_RANGE),
        id="canal-es",
    ),
    pytest.param(
        "drs-json",
        {("es",): _BEYOND_INT64},
        -1,
        _dead(Code.BAD_FIELD, "'es'", _INT64_RANGE),
        id="drs-es",
    ),
    pytest.param(
        "drs-json-c",
        {("es",): _BEYOND_INT64},
        -1,
        _dead(Code.BAD_FIELD, "'es'", _INT64_RANGE),
        id="drs-c-es",
    ),
    pytest.param(
        "dataworks-json",
        {("payload", "timestamp", "eventTime"): _BEYOND_INT64},
        -1,
        _dead(Code.BAD_FIELD, "eventTime", "0..9223372036854775807"),
        id="dataworks-eventTime",
    ),
    # ts in epoch seconds, times 1000, was not range-checked
    pytest.param(
        "maxwell-json",
        {("ts",): b"9223372036854775807"},
        -1,
        _dead(Code.BAD_FIELD, "'ts'", "-9223372036854775..9223372036854775"),
        id="maxwell-ts",
    ),
    # txn.order from a counter was not range-checked
    pytest.param(
        "aws-dms-json",
        {("metadata", "transaction-record-id"): _BEYOND_INT64},
        -1,
        _dead(Code.BAD_FIELD, "transaction-record-id", _INT64_RANGE),
        id="dms-transaction-record-id",
    ),
    pytest.param(  # xoffset + 1 is txn.order; xoffset sorts below the commit row (2**32)
        "maxwell-json",
        {("xoffset",): b"9223372036854775807"},
        -1,
        _dead(Code.BAD_FIELD, "'xoffset'", "0..4294967295"),
        id="maxwell-xoffset-plus-1",
    ),
    pytest.param(
        "qlik-json",
        {("message", "headers", "transactionEventCounter"): _BEYOND_INT64},
        -1,
        _dead(Code.BAD_FIELD, "transactionEventCounter", _INT64_RANGE),
        id="qlik-transactionEventCounter",
    ),
    pytest.param(
        "shareplex-json",
        {("meta", "seq"): _BEYOND_INT64},
        -1,
        _dead(Code.BAD_FIELD, "meta.seq", _INT64_RANGE),
        id="shareplex-meta-seq",
    ),
    # maxwell checked xoffset's type only when xid was present; flatten then failed in seq_key
    pytest.param(
        "maxwell-json",
        {("xid",): None, ("xoffset",): b'"a"'},
        -1,
        _dead(Code.BAD_FIELD, "'xoffset'", "integer"),
        id="maxwell-xoffset-string",
    ),
    pytest.param(
        "maxwell-json",
        {("xid",): None, ("xoffset",): b"true"},
        -1,
        _dead(Code.BAD_FIELD, "'xoffset'", "integer"),
        id="maxwell-xoffset-bool",
    ),
    # a column missing from the declared types kept its raw JSON value (a list or dict)
    pytest.param(
        "canal-json",
        {("data", 0, "extra"): b'[1,{"a":2}]'},
        -1,
        _json_text("extra", '[1,{"a":2}]'),
        id="canal-undeclared-array",
    ),
    pytest.param(
        "drs-json",
        {("data", 0, "extra"): b'{"a":[2]}'},
        -1,
        _json_text("extra", '{"a":[2]}'),
        id="drs-undeclared-object",
    ),
    pytest.param(
        "drs-json-c",
        {("data", 0, "extra"): b"[1]"},
        -1,
        _json_text("extra", "[1]"),
        id="drs-c-undeclared-array",
    ),
    pytest.param(
        "qlik-json",
        {("message", "data", "extra"): b"[1]"},
        -1,
        _json_text("extra", "[1]"),
        id="qlik-column-not-in-metadata",
    ),
    # a huge column ordinal in Qlik metadata became a 2**ordinal bit mask: MemoryError
    # (ordinal 8e9 takes 2 GB and 1.4 s before the mask fits); the insert's table has 2
    # columns, and the data message then has no metadata
    pytest.param(
        "qlik-json",
        {("message", "tableStructure", "tableColumns", "name", "ordinal"): b"1099511627776"},
        0,
        _dead(Code.BAD_FIELD, "tableColumns.name.ordinal", "1..2"),
        id="qlik-huge-ordinal",
    ),
]


@pytest.mark.parametrize(("fmt", "edits", "index", "expect"), BUG_CASES)
def test_bug_reproducer(
    fmt: str,
    edits: dict[tuple[Any, ...], bytes | None],
    index: int,
    expect: tuple[str, str, tuple[str, ...]],
) -> None:
    records, options = _patched(fmt, edits, index)
    result = check(decoder_for(fmt, options), records)
    assert_clear(result)
    patched = records[index].origin
    kind, what, texts = expect
    if kind == "dead":
        dead = [d for d in result.dead_letters if d.origin == patched]
        assert [d.code for d in dead] == [what], result.dead_letters
        assert all(t in dead[0].message for t in texts), dead[0].message
        assert not [e for e in result.events if e.origin == patched]
    else:
        (event,) = [e for e in result.events if e.origin == patched and e.op in ROW_OPS]
        assert event.after[what] == texts[0]
        assert event.columns[what] == "json"
        assert event.columns["id"] == "int64"  # the declared types are kept beside it


def test_dts_avro_source_timestamp_beyond_int64_ms_is_bad_field() -> None:
    import io

    import fastavro

    from cdcflow.formats.dts_avro import record_schema

    # sourceTimestamp is an Avro long in seconds; 2**62 s is a valid long, 2**62 * 1000 ms is not
    records, options = _encoded("dts-avro", _INSERT)
    schema = record_schema()
    rec = fastavro.schemaless_reader(io.BytesIO(records[0].value), schema, None)
    rec["sourceTimestamp"] = 2**62
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema, rec)
    records[0] = dataclasses.replace(records[0], value=out.getvalue())
    result = check(decoder_for("dts-avro", options), records)
    (dead,) = result.dead_letters
    assert dead.code == Code.BAD_FIELD and dead.origin == records[0].origin
    assert (
        "sourceTimestamp" in dead.message and "-9223372036854775..9223372036854775" in dead.message
    )


_DEEP_300 = b"[" * 300 + b"]" * 300

#: Messages with a field nested 300 levels deep (orjson reads 1024, writes 254) that the
#: decoder copies into ``meta``; flatten then fails on the event.
DEEP_META_CASES = {
    "maxwell-json": b'{"database":"d","table":"t","type":"insert","ts":1,"xid":1,"server_id":DEEP,'
    b'"position":"mysql-bin.000001:4","primary_key_columns":["id"],"data":{"id":1}}',
    "ogg-json": b'{"table":"s.t","op_type":"I","op_ts":"2023-11-14 22:13:20.000000","current_ts":DEEP,'
    b'"pos":"00000000000000000042","primary_keys":["id"],"after":{"id":1}}',
    "shareplex-json": b'{"meta":{"time":"2023-11-14T22:13:20","userid":0,"op":"ins","scn":"42",'
    b'"rowid":DEEP,"trans":"0.0.42","seq":1,"size":1,"table":"s.t","idx":"1/1",'
    b'"posttime":"2023-11-14T22:13:20"},"data":{"id":1}}',
    "canal-json": b'{"database":"d","es":1,"id":1,"isDdl":true,"sql":"create table t (id int)",'
    b'"table":"t","ts":DEEP,"type":"CREATE"}',
    "debezium-json": b'{"status":"END","id":"571:53195832","ts_ms":1486500577691,"event_count":2,'
    b'"data_collections":DEEP}',
    "aws-dms-json": b'{"control":{"table-def":{"columns":{"id":{"nullable":false,"type":"INT64"}},'
    b'"primary-key":[DEEP]}},"metadata":{"timestamp":"2023-11-14T22:13:20.000000Z",'
    b'"record-type":"control","operation":"create-table","partition-key-type":"task-id",'
    b'"schema-name":"s","table-name":"t"}}',
}


@pytest.mark.parametrize("fmt", list(DEEP_META_CASES))
def test_deeply_nested_field_copied_into_meta_is_handled(fmt: str) -> None:
    """Fixed in flatten: an event that cannot be serialized makes its record a BAD_VALUE
    dead letter (with raw bytes) instead of failing the Spark task."""
    value = DEEP_META_CASES[fmt].replace(b"DEEP", _DEEP_300)
    options = {"primary_keys": {"*": ["id"]}} if fmt == "shareplex-json" else None
    result = check(decoder_for(fmt, options), _records([(value, None, ())]))
    assert_clear(result)


def test_deeply_nested_debezium_oldkey_header_is_handled() -> None:
    records, options = _encoded("debezium-json", _INSERT)
    records[0] = dataclasses.replace(records[0], headers=(("__debezium.oldkey", _DEEP_300),))
    result = check(decoder_for("debezium-json", options), records)
    assert_clear(result)

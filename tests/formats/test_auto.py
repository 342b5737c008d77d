"""Tests of ``--format auto``: per-record detection delegating to the format decoders.

The main claim is checked against every golden case of every JSON format: decoding the
case with ``auto`` gives the events (and skips, and dead letters) the named format gives.
The only records allowed to differ are those the named decoder itself rejects because
the envelope is wrong (``NOT_AN_OBJECT``, ``MISSING_FIELD``, ``BAD_FIELD``,
``UNKNOWN_OP``): when the wrong or missing field is one the format is recognized by, no
signature matches and ``auto`` says ``UNKNOWN_FORMAT`` instead. Canal, DRS JSON and DRS
JSON-C share one layout, so with every format as candidate most of their records are
ambiguous; the strict comparison lists only one of the three.
"""

from __future__ import annotations

import datetime as dt
import json
import pickle
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import Code, ConfigError
from cdcflow.formats import decoder_for
from cdcflow.formats.auto import (
    AMBIGUOUS_CODE,
    AVRO_FORMATS,
    CANAL_FAMILY,
    JSON_FORMATS,
    AutoDecoder,
    AutoOptions,
    detect,
)
from cdcflow.formats.base import DecodeResult, DecoderOptions, Record
from cdcflow.model import Op, Origin, SourceTable
from cdcflow_testkit.encoders import SourceChange, encoder_for
from cdcflow_testkit.encoders.auto import AutoEncoder
from cdcflow_testkit.encoders.debezium_json import DebeziumJsonEncoder
from cdcflow_testkit.golden import GoldenCase, load_case

CASES = Path(__file__).parent / "cases"
ALIYUN = (
    Path(__file__).parent / "corpus" / "aliyun"
)  # DataWorks messages (Paimon's aliyun-json tests)

#: dead-letter codes about the envelope: where the field at fault is one a format is
#: recognized by, auto cannot recognize the record and says UNKNOWN_FORMAT instead
ENVELOPE_CODES = {Code.NOT_AN_OBJECT, Code.MISSING_FIELD, Code.BAD_FIELD, Code.UNKNOWN_OP}
#: dead letters auto raises itself, before any delegate sees the record
OWN_CODES = {Code.BAD_JSON, Code.NOT_AN_OBJECT}


def _json_cases() -> list[Path]:
    return sorted(
        p
        for p in CASES.glob("*/*.expected.jsonl")
        if p.parent.name in JSON_FORMATS
        and p.with_name(p.name.replace(".expected.jsonl", ".input.jsonl")).exists()
    )


def _aliyun_cases() -> list[GoldenCase]:
    """The DataWorks corpus files (Paimon's aliyun-json inputs) as cases."""
    out = []
    for path in sorted(ALIYUN.glob("*.txt")):
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        records = [Record(value=v, origin=Origin(path.stem, 0, i)) for i, v in enumerate(lines)]
        out.append(GoldenCase(path.stem, records, None))
    return out


def _auto_options(
    fmt: str, case_options: dict[str, Any] | None, formats: tuple[str, ...]
) -> AutoOptions:
    """The case's options as auto options: keys shared, the rest under ``format_options``."""
    rest = dict(case_options or {})
    keys = rest.pop("primary_keys", {})
    options = AutoOptions.from_mapping(
        {
            "formats": list(formats),
            "primary_keys": keys,
            "format_options": {fmt: rest} if rest else {},
        }
    )
    assert isinstance(options, AutoOptions)
    return options


ABSORBED = ("absorbed",)  # the record's event was joined into another record's event


def _outcomes(result: DecodeResult) -> dict[int, tuple[Any, ...]]:
    """What became of each record (by offset): its events, its skip, or its dead letter."""
    out: dict[int, Any] = {}
    for e in result.events:
        out.setdefault(e.origin.offset, ["events"]).append(e)
    out = {k: tuple(v) for k, v in out.items()}
    for s in result.skipped:
        out[s.origin.offset] = ("skipped", s.reason)
    for d in result.dead_letters:
        out[d.origin.offset] = ("dead", d.code, d.message)
    return out


def _same_dead_letter(fmt: str, named: tuple[Any, ...], auto: tuple[Any, ...]) -> bool:
    """Auto's dead letter is the delegate's (code kept, message prefixed with the format),
    or one auto raised itself with the same code (not JSON, not an object)."""
    if auto[0] != "dead" or named[0] != "dead" or auto[1] != named[1]:
        return False
    return auto[2] == f"{fmt}: {named[2]}" or auto[1] in OWN_CODES


def _compare(
    fmt: str, case: GoldenCase, formats: tuple[str, ...]
) -> tuple[DecodeResult, DecodeResult, list[str]]:
    """Decode ``case`` with its format and with auto; return both and the differences
    that are allowed (described), failing on any other."""
    named = decoder_for(fmt, case.options).decode_batch(case.records)
    auto = AutoDecoder(_auto_options(fmt, case.options, formats)).decode_batch(case.records)
    n_out, a_out = _outcomes(named), _outcomes(auto)
    allowed = []
    for i, record in enumerate(case.records):
        n, a = n_out.get(i, ABSORBED), a_out.get(i, ABSORBED)
        where = f"{fmt}/{case.name} line {i}"
        if n[0] == "dead":
            if _same_dead_letter(fmt, n, a):
                continue
            if a[0] == "dead" and a[1] == Code.UNKNOWN_FORMAT and n[1] in ENVELOPE_CODES:
                allowed.append(f"{where}: {n[1]} -> UNKNOWN_FORMAT")
                continue
        if a[0] == "dead" and a[1] == AMBIGUOUS_CODE and "ambiguous" in a[2]:
            assert fmt in CANAL_FAMILY and len(set(formats) & set(CANAL_FAMILY)) > 1, (where, a)
            assert fmt in a[2], (where, a)
            allowed.append(f"{where}: ambiguous")
            continue
        assert a == n, (where, record.value, n, a)
    for d in auto.dead_letters:
        assert d.format == "auto"
        assert (d.value, d.key, d.origin) == (
            case.records[d.origin.offset].value,
            case.records[d.origin.offset].key,
            case.records[d.origin.offset].origin,
        )
    assert auto.records == named.records
    return named, auto, allowed


# --------------------------------------------------------------------------- golden cases


@pytest.mark.parametrize("expected_path", _json_cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_case_decodes_as_with_its_own_format(expected_path: Path) -> None:
    """Only the case's format of the Canal family is a candidate: everything the named
    decoder accepts, auto decodes to the very same events."""
    fmt = expected_path.parent.name
    case = load_case(expected_path)
    formats = tuple(f for f in JSON_FORMATS if f == fmt or f not in CANAL_FAMILY)
    named, auto, allowed = _compare(fmt, case, formats)
    assert auto.events == named.events
    assert all(e.source.format == fmt for e in auto.events)
    assert not any("ambiguous" in a for a in allowed)


@pytest.mark.parametrize("expected_path", _json_cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_case_with_every_json_format_as_candidate(expected_path: Path) -> None:
    """The default candidates: the same, except that Canal-family records without a
    telling field are ambiguous (and only those)."""
    fmt = expected_path.parent.name
    case = load_case(expected_path)
    named, auto, allowed = _compare(fmt, case, JSON_FORMATS)
    if fmt not in CANAL_FAMILY:
        assert auto.events == named.events


@pytest.mark.parametrize("case", _aliyun_cases(), ids=lambda c: c.name)
def test_dataworks_corpus_decodes_as_dataworks(case: GoldenCase) -> None:
    named, auto, allowed = _compare("dataworks-json", case, JSON_FORMATS)
    assert auto.events == named.events and auto.events and not allowed


def test_the_allowed_differences_are_envelope_errors_only() -> None:
    """Across all cases, auto differs from the named decoders only where they reject the
    envelope -- and there are such records, so the rule above is exercised."""
    allowed = []
    for path in _json_cases():
        fmt = path.parent.name
        formats = tuple(f for f in JSON_FORMATS if f == fmt or f not in CANAL_FAMILY)
        allowed += _compare(fmt, load_case(path), formats)[2]
    assert allowed and all("-> UNKNOWN_FORMAT" in a for a in allowed)
    # e.g. Maxwell's documentation snippets without "database"
    assert any(a.startswith("maxwell-json/docs-dataformat line") for a in allowed)


# --------------------------------------------------------------------------- helpers


def _rec(value: Any, offset: int = 0, key: bytes | None = None, topic: str = "t") -> Record:
    raw = value if isinstance(value, bytes) else orjson.dumps(value)
    return Record(value=raw, key=key, origin=Origin(topic, 0, offset))


def _decode(value: Any, **options: Any) -> DecodeResult:
    decoder = AutoDecoder(AutoOptions.from_mapping(options) if options else None)  # type: ignore[arg-type]
    return decoder.decode_batch([_rec(value)])


def _dead(value: Any, **options: Any) -> tuple[str, str]:
    result = _decode(value, **options)
    assert not result.events and len(result.dead_letters) == 1, result
    return result.dead_letters[0].code, result.dead_letters[0].message


def _first(path: str, line: int = 0) -> dict[str, Any]:
    lines = (CASES / path).read_bytes().splitlines()
    return orjson.loads(lines[line])


# Canal flat message from the Paimon corpus (canal-json/paimon-event-insert, line 0)
CANAL_INSERT = _first("canal-json/paimon-event-insert.input.jsonl")
# the DRS JSON INSERT of drs-json/constructed-multi-row (MySQL timestamp "paid_at")
DRS_INSERT = _first("drs-json/constructed-multi-row.input.jsonl")

DBZ_SOURCE = {
    "version": "2.7.0.Final",
    "connector": "postgresql",
    "name": "pg",
    "ts_ms": 1,
    "db": "d",
    "schema": "public",
    "table": "t",
    "txId": 5,
    "lsn": 10,
}
DMS_ROW = {
    "data": {"id": 1, "v": "a"},
    "metadata": {
        "timestamp": "2024-10-27T12:39:03.210671Z",
        "record-type": "data",
        "operation": "insert",
        "partition-key-type": "schema-table",
        "schema-name": "s",
        "table-name": "t",
    },
}


# --------------------------------------------------------------------------- signatures


@pytest.mark.parametrize(
    ("value", "fmt"),
    [
        ({"magic": "atMSG", "type": "DT", "message": {}}, "qlik-json"),
        ({"data": {"A": 1}, "beforeData": None, "headers": {"operation": "INSERT"}}, "qlik-json"),
        ({"schemaId": "x", "lineage": {}, "tableStructure": {"tableColumns": {}}}, "qlik-json"),
        (
            {
                "schema": {"dataColumn": None, "primaryKey": None, "source": None},
                "payload": {
                    "before": None,
                    "after": None,
                    "sequenceId": None,
                    "timestamp": {"eventTime": 1620457659000},
                    "op": "MHEARTBEAT",
                    "ddl": None,
                },
                "version": "0.0.1",
            },
            "dataworks-json",
        ),
        ({"op": "c", "source": DBZ_SOURCE, "after": {"id": 1}}, "debezium-json"),
        (
            {
                "schema": {"type": "struct"},
                "payload": {"op": "d", "source": DBZ_SOURCE, "before": {"id": 1}},
            },
            "debezium-json",
        ),
        ({"schema": {"type": "struct"}, "payload": None}, "debezium-json"),
        ({"op": "x", "source": DBZ_SOURCE, "after": {}}, "debezium-json"),  # unknown op
        (
            {"status": "END", "id": "571:1", "ts_ms": 1, "event_count": 2, "data_collections": []},
            "debezium-json",
        ),
        (
            {
                "source": DBZ_SOURCE,
                "databaseName": "d",
                "ddl": "CREATE TABLE t (id INT)",
                "tableChanges": [],
            },
            "debezium-json",
        ),
        ({"ts_ms": 1700000000000}, "debezium-json"),  # heartbeat
        ({"meta": {"op": "ins", "table": "A.B"}, "data": {"X": "1"}}, "shareplex-json"),
        ({"meta": {"op": "TRUNCATE", "table": "A.B"}}, "shareplex-json"),
        (
            {"database": "d", "table": "t", "type": "insert", "ts": 1, "data": {"id": 1}},
            "maxwell-json",
        ),
        (
            {"database": "d", "table": "t", "type": "table-create", "ts": 1, "sql": "x"},
            "maxwell-json",
        ),
        (
            {"database": "d", "type": "database-create", "ts": 1, "sql": "create database d"},
            "maxwell-json",
        ),
        ({"table": "S.T", "op_type": "I", "after": {"id": 1}}, "ogg-json"),
        (
            {"control": {}, "metadata": {"record-type": "control", "operation": "create-table"}},
            "aws-dms-json",
        ),
    ],
)
def test_signature(value: dict[str, Any], fmt: str) -> None:
    assert detect(value) == (fmt,)


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"hello": "world"},
        {"magic": "atMSX", "type": "DT", "message": {}},  # not Qlik's magic
        {"schema": {}, "payload": {}},  # Debezium's outline, nothing in it
        {"schema": {"type": "struct"}, "payload": {"id": 1}},  # a Debezium *key* message
        {"status": "COMMIT", "id": "1", "event_count": 1},  # not a Debezium status
        {"op": "c", "after": {"id": 1}},  # no source block
        {"ts_ms": 1, "x": 2},
        {"meta": {"op": 1}, "data": {}},
        {"type": "insert", "table": "t", "data": {"id": 1}},  # Maxwell snippet, no database
        {"op_type": 3, "table": "T"},
        {"metadata": {"operation": "insert"}, "data": {}},
    ],
)
def test_no_signature(value: dict[str, Any]) -> None:
    assert detect(value) == ()


# the fields signatures look at, so that generated objects come close to them
_FIELDS = [
    "magic",
    "headers",
    "operation",
    "data",
    "beforeData",
    "tableStructure",
    "schema",
    "payload",
    "dataColumn",
    "sequenceId",
    "op",
    "source",
    "before",
    "after",
    "status",
    "id",
    "event_count",
    "ddl",
    "ts_ms",
    "meta",
    "table",
    "type",
    "database",
    "isDdl",
    "gtid",
    "old",
    "sqlType",
    "mysqlType",
    "ts",
    "xid",
    "op_type",
    "metadata",
    "record-type",
]
_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.sampled_from(
        [
            "c",
            "u",
            "DELETE",
            "INSERT",
            "BEGIN",
            "atMSG",
            "timestamp",
            "1.5",
            "2024-01-01 00:00:00",
            "database-create",
        ]
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_FIELDS), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=8))
def test_any_object_is_decoded_or_dead_lettered_never_a_crash(value: dict[str, Any]) -> None:
    # the standard library writes integers beyond 64 bits too (orjson refuses them)
    result = AutoDecoder().decode_batch([_rec(json.dumps(value).encode())])
    assert result.records == result.decoded_records + len(result.skipped) + len(result.dead_letters)
    for dead in result.dead_letters:  # a stable code, not a decoder bug turned BAD_FIELD
        assert not dead.message.startswith(("TypeError", "AttributeError", "KeyError"))
    assert len(detect(value)) <= 3


def test_a_record_with_two_signatures_is_ambiguous() -> None:
    value = {
        "table": "S.T",
        "op_type": "I",
        "after": {"id": 1},
        "meta": {"op": "ins", "table": "S.T"},
        "data": {"ID": "1"},
    }
    assert detect(value) == ("shareplex-json", "ogg-json")
    code, message = _dead(value)
    assert code == AMBIGUOUS_CODE
    assert "ambiguous" in message and "shareplex-json" in message and "ogg-json" in message


def test_unknown_record_names_the_candidates_and_its_fields() -> None:
    code, message = _dead({"hello": "world", "n": 1})
    assert code == Code.UNKNOWN_FORMAT
    assert all(f in message for f in JSON_FORMATS)
    assert "'hello'" in message and "'n'" in message


def test_a_format_not_listed_is_not_detected() -> None:
    value = {"op": "c", "source": DBZ_SOURCE, "after": {"id": 1}}
    code, message = _dead(value, formats=["maxwell-json", "ogg-json"])
    assert code == Code.UNKNOWN_FORMAT and "['maxwell-json', 'ogg-json']" in message


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (b"", Code.BAD_JSON),
        (b"{", Code.BAD_JSON),
        (b"\xff\xfe\x00garbage", Code.BAD_JSON),
        (b"[1, 2, 3]", Code.NOT_AN_OBJECT),
        (b'"text"', Code.NOT_AN_OBJECT),
        (b"42", Code.NOT_AN_OBJECT),
        (b"{}", Code.UNKNOWN_FORMAT),
    ],
)
def test_bad_input_is_a_dead_letter(value: bytes, code: str) -> None:
    result = AutoDecoder().decode_batch([Record(value=value, origin=Origin("t", 3, 9))])
    (dead,) = result.dead_letters
    assert (dead.code, dead.format, dead.value, dead.origin) == (
        code,
        "auto",
        value,
        Origin("t", 3, 9),
    )


def test_tombstones_are_skipped() -> None:
    result = AutoDecoder().decode_batch([Record(value=None, origin=Origin("t", 0, 1))])
    assert [s.reason for s in result.skipped] == ["TOMBSTONE"] and not result.dead_letters
    # and the Connect envelope of a null payload is Debezium's tombstone, skipped by it
    result = _decode({"schema": {"type": "struct", "fields": []}, "payload": None})
    assert [s.reason for s in result.skipped] == ["TOMBSTONE"]


def test_a_delegate_dead_letter_keeps_its_code_and_names_the_format() -> None:
    code, message = _dead({"op": "x", "source": DBZ_SOURCE, "after": {"id": 1}})
    assert code == Code.UNKNOWN_OP and message.startswith("debezium-json: unknown Debezium op")


# --------------------------------------------------------------------------- Canal family


def _canal(**changes: Any) -> dict[str, Any]:
    value = {**CANAL_INSERT, **changes}
    return {k: v for k, v in value.items() if v is not ...}


def _drs(**changes: Any) -> dict[str, Any]:
    value = {**DRS_INSERT, **changes}
    return {k: v for k, v in value.items() if v is not ...}


_TS_TEXT = [{**DRS_INSERT["data"][0], "paid_at": "2023-11-14 22:13:20"}]
_NO_TS = {"id": "bigint", "customer": "varchar"}


@pytest.mark.parametrize(
    ("value", "found"),
    [
        (_canal(), CANAL_FAMILY),  # nothing tells them apart
        (_canal(gtid="3E11FA47-71CA-11E1-9E33-C80AA9429562:23"), ("canal-json",)),
        (_canal(id=...), ("canal-json",)),  # DRS always writes its event id
        (
            _canal(type="ALTER", isDdl=True, data=None, sql="ALTER TABLE t ADD c INT"),
            ("canal-json",),
        ),
        (
            _canal(type="INIT_DDL", isDdl=True, data=None, sql="CREATE TABLE t (id INT)"),
            ("drs-json", "drs-json-c"),
        ),
        (_canal(type="DDL", isDdl=True, data=None, sql="ALTER TABLE t ADD c INT"), CANAL_FAMILY),
        (_canal(type="DELETE"), ("canal-json", "drs-json-c")),  # row in data
        (
            _canal(type="DELETE", old=CANAL_INSERT["data"], data=None),
            ("canal-json", "drs-json"),
        ),  # row in old: DRS JSON, or DTS before 2022-03-20
        (_drs(mysqlType=_NO_TS), ("drs-json", "drs-json-c")),  # sqlType 94 for DATETIME
        (_drs(), ("drs-json",)),  # epoch-second TIMESTAMP
        (_drs(data=_TS_TEXT), ("drs-json-c",)),  # date-time text TIMESTAMP and sqlType 94
        (_drs(data=_TS_TEXT, sqlType={"id": -5, "paid_at": 93}), ("canal-json", "drs-json-c")),
    ],
    ids=[
        "insert",
        "gtid",
        "no-id",
        "canal-ddl-type",
        "drs-ddl-type",
        "ddl",
        "delete-in-data",
        "delete-in-old",
        "sqltype-94",
        "epoch-timestamp",
        "text-timestamp-94",
        "text-timestamp",
    ],
)
def test_canal_family_evidence(value: dict[str, Any], found: tuple[str, ...]) -> None:
    assert detect(value) == found
    # with a format left out of the candidates, the same evidence picks among the rest
    assert detect(value, ("canal-json", "drs-json-c", "ogg-json")) == tuple(
        f for f in found if f != "drs-json"
    )


def test_canal_family_ambiguity_says_how_to_settle_it() -> None:
    code, message = _dead(_canal())
    assert code == AMBIGUOUS_CODE
    assert "canal-json, drs-json, drs-json-c" in message and "formats" in message
    # listing one of them settles it: that format's decoder gets the record
    result = _decode(_canal(), formats=["canal-json", "debezium-json"])
    assert [e.source.format for e in result.events] == ["canal-json"]


def test_contradicting_evidence_is_unknown_with_the_reasons() -> None:
    # a DRS JSON-C style DELETE (row in data) with DRS JSON's epoch-second TIMESTAMP
    value = _drs(type="DELETE")
    assert detect(value) == ()
    code, message = _dead(value)
    assert code == Code.UNKNOWN_FORMAT
    assert "a DELETE with its row in 'data'" in message and "epoch seconds" in message


def test_one_listed_canal_family_format_takes_every_canal_shaped_record() -> None:
    """Evidence only chooses between listed formats; with one listed, its decoder judges
    the record (here DRS JSON-C reads the DRS JSON DELETE and dead-letters it)."""
    value = _drs(type="DELETE", data=None, old=DRS_INSERT["data"])
    code, message = _dead(value, formats=["drs-json-c"])
    assert code == Code.MISSING_FIELD and message.startswith("drs-json-c: DELETE with no row")


# --------------------------------------------------------------------------- options


def test_default_candidates_are_the_json_formats() -> None:
    assert AutoOptions().formats == JSON_FORMATS
    assert not set(AVRO_FORMATS) & set(JSON_FORMATS)


@pytest.mark.parametrize(
    "values",
    [
        {"formats": ["nope-json"]},
        {"formats": []},
        {"formats": "debezium-json"},
        {"formats": ["debezium-json", "debezium-json"]},
        {"formats": ["debezium-json"], "format_options": {"ogg-json": {}}},
        {"format_options": ["ogg-json"]},
        {"unknown_key": 1},
    ],
)
def test_bad_options_are_config_errors(values: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        AutoOptions.from_mapping(values)


def test_a_bad_delegate_option_fails_at_construction_and_names_the_format() -> None:
    options = AutoOptions.from_mapping({"format_options": {"ogg-json": {"bogus": 1}}})
    with pytest.raises(ConfigError, match=r"format_options\.ogg-json"):
        AutoDecoder(options)


def test_primary_keys_reach_every_delegate_and_format_options_override_them() -> None:
    code, message = _dead(DMS_ROW)
    assert code == Code.MISSING_KEY and message.startswith("aws-dms-json: ")
    (event,) = _decode(DMS_ROW, primary_keys={"t": ["id"]}).events
    assert event.key == {"id": 1}
    options = {
        "primary_keys": {"t": ["id"]},
        "format_options": {"aws-dms-json": {"primary_keys": {"t": ["v"]}}},
    }
    (event,) = _decode(DMS_ROW, **options).events
    assert event.key == {"v": "a"}
    # and a plain DecoderOptions works too (keys only)
    decoder = AutoDecoder(DecoderOptions(primary_keys={"t": ("id",)}))
    assert decoder.decode(_rec(DMS_ROW))[0].key == {"id": 1}


def test_format_options_reach_their_delegate() -> None:
    value = (
        b'{"database":"d","table":"t","type":"insert","ts":1,'
        b'"primary_key_columns":["id"],"data":{"id":1,"price":1.10}}'
    )
    (plain,) = _decode(value).events
    (exact,) = _decode(value, format_options={"maxwell-json": {"float_as_decimal": True}}).events
    assert type(plain.after["price"]) is float and str(exact.after["price"]) == "1.10"


def test_delegates_are_created_lazily_once() -> None:
    decoder = AutoDecoder()
    value = {
        "database": "d",
        "table": "t",
        "type": "insert",
        "ts": 1,
        "primary_key_columns": ["id"],
        "data": {"id": 1},
    }
    decoder.decode_batch([_rec(value, 0), _rec(value, 1)])
    assert set(decoder._delegates) == {"maxwell-json"}
    assert decoder.delegate("maxwell-json") is decoder.delegate("maxwell-json")


def test_pickles_as_its_options_and_keeps_decoding() -> None:
    decoder = AutoDecoder(AutoOptions(primary_keys={"t": ("id",)}))
    decoder.decode(_rec(DMS_ROW))
    copy = pickle.loads(pickle.dumps(decoder))
    assert copy.options == decoder.options and not copy._delegates
    assert copy.decode(_rec(DMS_ROW)) == decoder.decode(_rec(DMS_ROW))


def test_numbers_beyond_64_bits_stay_exact_on_the_parsed_object_path() -> None:
    """Maxwell, GoldenGate and DMS get auto's parsed object; a number orjson cannot hold
    exactly makes them parse again, as their own decode does."""
    big = 2**70 + 1
    raw = (
        b'{"table":"S.T","op_type":"I","primary_keys":["id"],"after":{"id":'
        + str(big).encode()
        + b"}}"
    )
    (event,) = AutoDecoder().decode(_rec(raw))
    assert event.after == {"id": big} and event == decoder_for("ogg-json").decode(_rec(raw))[0]


# --------------------------------------------------------------------------- Avro


def _avro_change(seq: int) -> SourceChange:
    return SourceChange(
        op=Op.INSERT,
        table=SourceTable("", "shop", "", "items"),
        columns={"id": "int64", "name": "string"},
        key_columns=("id",),
        before=None,
        after={"id": seq, "name": f"n{seq}"},
        seq=seq,
        ts_ms=1_700_000_000_000 + seq,
    )


def test_a_listed_avro_format_gets_what_matches_no_json_signature() -> None:
    encoder = encoder_for("dts-avro")
    changes = [_avro_change(1)]
    (avro,) = encoder.encode(changes[0])
    avro_options = dict(encoder.decoder_options(changes) or {})
    options = AutoOptions.from_mapping(
        {"formats": ["debezium-json", "dts-avro"], "format_options": {"dts-avro": avro_options}}
    )
    dbz = {"op": "c", "source": DBZ_SOURCE, "after": {"id": 1}}
    records = [
        Record(value=avro.value, key=avro.key, origin=Origin("t", 0, 0)),
        _rec(dbz, 1, key=b'{"id": 1}'),
    ]
    result = AutoDecoder(options).decode_batch(records)
    assert not result.dead_letters
    assert [e.source.format for e in result.events] == ["dts-avro", "debezium-json"]
    assert result.events[0] == decoder_for("dts-avro", avro_options).decode(records[0])[0]
    # garbage goes to the Avro decoder too, and its dead letter says so
    (dead,) = AutoDecoder(options).decode_batch([_rec(b"\x02garbage")]).dead_letters
    assert dead.message.startswith("dts-avro (the value is not JSON): ")


def test_two_avro_formats_cannot_be_told_apart() -> None:
    standin = CASES / "drs-avro" / "standin-record.avsc"  # drs-avro needs a schema file
    code, message = _dead(
        b"\x02\x04ab",
        formats=["dts-avro", "drs-avro", "ogg-json"],
        format_options={"drs-avro": {"schema_path": str(standin)}},
    )
    assert code == AMBIGUOUS_CODE and "dts-avro, drs-avro" in message


# --------------------------------------------------------------------------- mixed topics

# DataWorks' update in two records, from the seed document's examples ("Format of a Kafka
# message for data update in a source", two-record mode), compacted.
_DW_SCHEMA = {
    "dataColumn": [
        {"name": "name", "type": "STRING"},
        {"name": "job", "type": "STRING"},
        {"name": "sex", "type": "STRING"},
        {"name": "#alibaba_rds_row_id#", "type": "LONG"},
    ],
    "primaryKey": None,
    "source": {"dbType": "MySQL", "dbName": "pkset_test", "tableName": "pkset_test_no_pk"},
}
_DW_TIME = {
    "eventTime": 1620458077000,
    "systemTime": 1620458077779,
    "checkpointTime": 1620458077000,
}
DW_BEFORE = {
    "schema": _DW_SCHEMA,
    "payload": {
        "before": {
            "dataColumn": {
                "name": "name11",
                "job": "job11",
                "sex": "man",
                "#alibaba_rds_row_id#": 15,
            }
        },
        "after": None,
        "sequenceId": "1620457642589000001",
        "timestamp": _DW_TIME,
        "op": "UPDATE_BEFOR",
        "ddl": None,
    },
    "version": "0.0.1",
}
DW_AFTER = {
    "schema": _DW_SCHEMA,
    "payload": {
        "before": None,
        "after": {
            "dataColumn": {
                "name": "name11",
                "job": "job11",
                "sex": "woman",
                "#alibaba_rds_row_id#": 15,
            }
        },
        "sequenceId": "1620457642589000001",
        "timestamp": _DW_TIME,
        "op": "UPDATE_AFTER",
        "ddl": None,
    },
    "version": "0.0.1",
}


def _lines(path: str, count: int | None = None) -> list[tuple[bytes, bytes | None]]:
    """``(value, key)`` of a golden case's records (its first ``count``)."""
    case = load_case(CASES / path.replace(".input.jsonl", ".expected.jsonl"))
    return [(r.value, r.key) for r in case.records[:count]]  # type: ignore[misc]


def _mixed() -> tuple[list[Record], dict[str, list[int]]]:
    """One topic, records of eight formats interleaved; the DataWorks and SharePlex update
    halves have other formats' records between them. Returns the records and, per
    format, the indexes of its records."""
    streams = {
        "dataworks-json": [(orjson.dumps(DW_BEFORE), None), (orjson.dumps(DW_AFTER), None)],
        # UPDATE BEFORE, an INSERT of another table, UPDATE AFTER
        "shareplex-json": _lines("shareplex-json/constructed-update-halves.input.jsonl", 3),
        "debezium-json": _lines("debezium-json/docs-postgresql-transaction.input.jsonl"),
        "maxwell-json": _lines("maxwell-json/paimon-schemaevolution-data-1.input.jsonl"),
        "ogg-json": _lines("ogg-json/paimon-event-insert.input.jsonl"),
        "qlik-json": _lines("qlik-json/unwrapped.input.jsonl"),  # keyed by table name
        "canal-json": _lines("canal-json/paimon-schemaevolution-2.input.jsonl"),
        "aws-dms-json": _lines("aws-dms-json/paimon-schemaevolution-data-1.input.jsonl"),
    }
    pairs: list[tuple[bytes, bytes | None]] = []
    owners: dict[str, list[int]] = {f: [] for f in streams}
    longest = max(len(v) for v in streams.values())
    for i in range(longest):  # round robin: every format's i-th record, then the next
        for fmt, lines in streams.items():
            if i < len(lines):
                owners[fmt].append(len(pairs))
                pairs.append(lines[i])
    records = [
        Record(value=v, key=k, origin=Origin("mixed", 0, n)) for n, (v, k) in enumerate(pairs)
    ]
    return records, owners


MIXED_OPTIONS = {
    # this topic has no DRS messages: say so, and Canal's inserts are not ambiguous
    "formats": [f for f in JSON_FORMATS if f not in ("drs-json", "drs-json-c")],
    "primary_keys": {"product": ["id"]},  # DMS names no key columns
    "format_options": {
        "maxwell-json": {"primary_keys": {"*": ["id"]}},
        "debezium-json": {"primary_keys": {"*": ["pk"]}},
    },
}


def test_mixed_topic_gives_each_format_its_own_events_in_record_order() -> None:
    records, owners = _mixed()
    result = AutoDecoder(AutoOptions.from_mapping(MIXED_OPTIONS)).decode_batch(records)
    assert not result.dead_letters and not result.skipped
    assert result.decoded_records == len(records)
    decoder = AutoDecoder(AutoOptions.from_mapping(MIXED_OPTIONS))
    for fmt, indexes in owners.items():
        alone = decoder._options_for(fmt)
        want = decoder_for(fmt, alone).decode_batch([records[i] for i in indexes]).events
        got = [e for e in result.events if e.source.format == fmt]
        assert got == want and got, fmt

    # each event stands where its (first) record stands
    place = {r.origin: n for n, r in enumerate(records)}
    first_half = {
        "dataworks-json": owners["dataworks-json"][0],
        "shareplex-json": owners["shareplex-json"][0],
    }

    def where(e: Any) -> int:
        joined = e.op is Op.UPDATE and e.before is not None and e.after is not None
        if joined and e.source.format in first_half:
            return first_half[e.source.format]
        return place[e.origin]

    places = [where(e) for e in result.events]
    assert places == sorted(places)


def test_update_halves_are_joined_across_other_formats_records() -> None:
    records, owners = _mixed()
    before, after = owners["dataworks-json"]
    assert after - before > 1  # other formats' records in between
    result = AutoDecoder(AutoOptions.from_mapping(MIXED_OPTIONS)).decode_batch(records)
    (dw,) = [e for e in result.events if e.source.format == "dataworks-json"]
    assert dw.op is Op.UPDATE and not (dw.meta or {}).get("half")
    assert dw.before["sex"] == "man" and dw.after["sex"] == "woman"
    assert dw.key == {"#alibaba_rds_row_id#": 15}
    sp = [e for e in result.events if e.source.format == "shareplex-json"]
    assert [e.op for e in sp] == [Op.UPDATE, Op.INSERT]
    assert sp[0].before is not None and sp[0].after is not None
    # the joined update stands at its before half: before the records in between
    assert result.events.index(dw) < result.events.index(sp[1])


def test_combine_keeps_events_when_no_format_combines() -> None:
    decoder = AutoDecoder()
    events = decoder.decode_batch(
        [
            _rec({"table": "S.T", "op_type": "I", "primary_keys": ["id"], "after": {"id": i}}, i)
            for i in range(3)
        ]
    ).events
    assert decoder.combine(events) is events


def test_halves_of_one_format_alone_are_joined_as_its_decoder_joins_them() -> None:
    records = [_rec(DW_BEFORE, 0), _rec(DW_AFTER, 1)]
    got = AutoDecoder().decode_batch(records).events
    assert got == decoder_for("dataworks-json").decode_batch(records).events and len(got) == 1


# --------------------------------------------------------------------------- encoder


def test_encoder_is_debeziums_and_round_trips_through_detection() -> None:
    encoder = AutoEncoder()
    assert encoder.identifier == "auto"
    assert encoder.exact_types == DebeziumJsonEncoder.exact_types
    assert encoder_for("debezium-json").exact_types == AutoEncoder.exact_types
    change = SourceChange(
        op=Op.UPDATE,
        table=SourceTable("", "shop", "public", "items"),
        columns={"id": "int64", "at": "timestamptz"},
        key_columns=("id",),
        before={"id": 1, "at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)},
        after={"id": 1, "at": dt.datetime(2024, 1, 2, tzinfo=dt.UTC)},
        seq=7,
        ts_ms=1_700_000_000_000,
    )
    messages = encoder.encode(change)
    assert [m.value for m in messages] == [m.value for m in DebeziumJsonEncoder().encode(change)]
    records = [Record(value=m.value, key=m.key, headers=m.headers) for m in messages]
    options = encoder.decoder_options([change])
    (event,) = (
        AutoDecoder(AutoOptions.from_mapping(options) if options else None)
        .decode_batch(records)
        .events
    )
    assert event.source.format == AutoEncoder.event_format == "debezium-json"
    assert event.after == change.after and event.key == {"id": 1}


def test_docs_list_every_signature() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "formats" / "auto.md").read_text()
    assert all(f"`{f}`" in doc for f in (*JSON_FORMATS, *AVRO_FORMATS))


def test_plain_decoder_options_keep_the_record_size_limit():
    from cdcflow.formats.base import DecoderOptions, Record

    decoder = decoder_for("auto", DecoderOptions(max_record_bytes=10))
    result = decoder.decode_batch([Record(value=b'{"a": "more than ten bytes"}')])
    assert [d.code for d in result.dead_letters] == ["TOO_LARGE"]

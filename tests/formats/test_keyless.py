"""Tables without a primary key: the format's row id, or the whole row as identity.

* ``keyless: full_row`` (every format): a row change of a table whose messages name no key
  columns (and none are configured) is identified by all its columns. Checked for every
  registered format on keyless changes written by the format's own encoder, through the
  Arrow rows the apply reads (``key``/``old_key``) and the net change.
* The default (``dead_letter``) keeps such changes ``MISSING_KEY`` dead letters.
* A row id that the format adds wins over both: DataWorks ``#alibaba_rds_row_id#`` and the
  SharePlex ROWID, on the documents' own examples (golden inputs).
* Every golden case decodes exactly as before under ``full_row``, except records that were
  ``MISSING_KEY`` dead letters.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.formats.test_conformance import COLUMNS, ROW_1, ROW_2, _base, _restrict

from cdcflow.apply.netchange import net_change
from cdcflow.decode.batches import flatten
from cdcflow.errors import Code, ConfigError
from cdcflow.formats import decoder_class, decoder_for, embedded_formats
from cdcflow.formats.base import Decoder, Record, is_full_row
from cdcflow.model import ROW_OPS, Op, Origin, SourceTable, dumps
from cdcflow_testkit.encoders import SourceChange, encoder_for
from cdcflow_testkit.golden import load_case

CASES = Path(__file__).parent / "cases"
TABLE = SourceTable(format="", database="shop", schema="public", table="notes")
#: SharePlex adds the Oracle ROWID by default; switched off to reach the full-row identity.
NO_ROW_ID = {"shareplex-json": {"rowid_column": ""}}


def _decoder(fmt: str, **options) -> Decoder:
    cls = decoder_class(fmt)
    return cls(cls.options_class(**{**NO_ROW_ID.get(fmt, {}), **options}))


def _keyless_changes(fmt: str) -> list[SourceChange]:
    """Insert ROW_1, update it to ROW_2, delete ROW_2 -- a table without a key."""
    exact = encoder_for(fmt).exact_types
    columns = {c: t for c, t in COLUMNS.items() if _base(t) in exact or t in exact}

    def change(op, before, after, seq):
        return SourceChange(
            op=op,
            table=TABLE,
            columns=columns,
            key_columns=(),
            before=_restrict(before, exact),
            after=_restrict(after, exact),
            seq=seq,
            ts_ms=1_700_000_000_000 + seq,
        )

    return [
        change(Op.INSERT, None, ROW_1, 10),
        change(Op.UPDATE, ROW_1, ROW_2, 11),
        change(Op.DELETE, ROW_2, None, 12),
    ]


def _records(fmt: str, changes: list[SourceChange]) -> list[Record]:
    encoder = encoder_for(fmt)
    messages = [m for c in changes for m in encoder.encode(c)]
    return [
        Record(value=m.value, key=m.key, headers=m.headers, origin=Origin("t", 0, i))
        for i, m in enumerate(messages)
    ]


def _key_json(row) -> str:
    """The ``key`` column of a full-row identity: the row, columns in name order."""
    return dumps(dict(sorted(row.items()))).decode()


@pytest.fixture(params=embedded_formats())
def fmt(request):
    return request.param


def test_full_row_identity_round_trip(fmt):
    changes = _keyless_changes(fmt)
    decoder = _decoder(fmt, keyless="full_row")
    result = decoder.decode_batch(_records(fmt, changes))
    rows = [e for e in result.events if e.op in ROW_OPS]
    row_1, row_2 = changes[0].after, changes[1].after
    if fmt == "shareplex-json":
        # `upd`: the before image is the `key` object, not a whole row (see its page)
        assert [d.code for d in result.dead_letters] == [Code.MISSING_KEY]
        assert "'key' object" in result.dead_letters[0].message
        assert [e.op for e in rows] == [Op.INSERT, Op.DELETE]
        assert [e.key for e in rows] == [row_1, row_2]
        return
    assert result.dead_letters == []
    assert [e.op for e in rows] == [Op.INSERT, Op.UPDATE, Op.DELETE]
    assert all(is_full_row(e) for e in rows)
    # the key is the whole row, columns in name order (every image gives the same key)
    assert [e.key for e in rows] == [row_1, row_2, row_2]
    assert all(list(e.key) == sorted(e.key) for e in rows)
    assert rows[1].before == row_1

    # what the apply reads: the update moves the row from key ROW_1 to key ROW_2
    table = pa.Table.from_batches([flatten(result)])
    events = table.filter(pc.is_in(table["op"], pa.array(["insert", "update", "delete"])))
    keys = events["key"].to_pylist()
    old_keys = events["old_key"].to_pylist()
    assert keys == [_key_json(row_1), _key_json(row_2), _key_json(row_2)]
    assert old_keys == [None, _key_json(row_1), None]
    assert all('"row_identity":"full_row"' in m for m in events["meta"].to_pylist())

    # insert + update in one batch: net effect is "no ROW_1, ROW_2 upserted"
    net = net_change(events.slice(0, 2)).rows
    assert dict(zip(net["key"].to_pylist(), net["is_delete"].to_pylist(), strict=True)) == {
        _key_json(row_1): True,
        _key_json(row_2): False,
    }


def test_keyless_rows_stay_missing_key_dead_letters_by_default(fmt):
    records = _records(fmt, _keyless_changes(fmt))
    result = _decoder(fmt).decode_batch(records)
    assert [e for e in result.events if e.op in ROW_OPS] == []
    assert result.dead_letters, "every row change must be a dead letter"
    assert {d.code for d in result.dead_letters} == {Code.MISSING_KEY}
    assert all("keyless: full_row" in d.message for d in result.dead_letters)


def test_update_halves_in_different_batches_move_the_row():
    # DataWorks two-record updates (UPDATE_BEFOR, UPDATE_AFTER); the partner of each half
    # is in another micro-batch: the before half deletes the old row, the after half
    # upserts the new one (docs/decisions.md, 7)
    changes = _keyless_changes("dataworks-json")
    before_half, after_half = _records("dataworks-json", changes)[1:3]
    decoder = _decoder("dataworks-json", keyless="full_row")
    (gone,) = decoder.decode_batch([before_half]).events
    (came,) = decoder.decode_batch([after_half]).events
    assert (gone.before, gone.after, gone.key) == (changes[1].before, None, changes[1].before)
    assert (came.before, came.after, came.key) == (None, changes[1].after, changes[1].after)
    assert is_full_row(gone) and is_full_row(came)


# --------------------------------------------------------------------------- images


def _debezium(op: str, before, after) -> bytes:
    source = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg"}
    source |= {"ts_ms": 1, "db": "shop", "schema": "public", "table": "notes", "lsn": 10}
    return orjson.dumps({"before": before, "after": after, "source": source, "op": op})


@pytest.mark.parametrize(
    ("op", "before", "after"),
    [
        # PostgreSQL's default REPLICA IDENTITY publishes no before image of a keyless row
        ("u", None, {"note": "b", "n": 2}),
        ("d", None, None),
    ],
    ids=["update-without-before", "delete-without-before"],
)
def test_a_change_without_its_before_image_cannot_be_matched(op, before, after):
    value = _debezium(op, before, after)
    result = decoder_for("debezium-json", {"keyless": "full_row"}).decode_batch([Record(value)])
    assert result.events == []
    (dead,) = result.dead_letters
    assert dead.code == Code.MISSING_KEY
    assert "before image is missing" in dead.message
    assert "REPLICA IDENTITY FULL" in dead.message and "primary_keys" in dead.message


def test_an_update_whose_before_image_lacks_columns_cannot_be_matched():
    # AWS DMS with BeforeImageSettings column-filter pk-only (or a BI_ rule on some
    # columns): the before image holds only some of the row's columns
    value = orjson.dumps(
        {
            "data": {"note": "b", "n": 2, "BI_note": "a"},
            "metadata": {
                "timestamp": "2024-10-27T12:39:03.210671Z",
                "record-type": "data",
                "operation": "update",
                "schema-name": "public",
                "table-name": "notes",
            },
        }
    )
    result = decoder_for("aws-dms-json", {"keyless": "full_row"}).decode_batch([Record(value)])
    (dead,) = result.dead_letters
    assert dead.code == Code.MISSING_KEY and "lacks columns ['n']" in dead.message


def test_the_key_does_not_depend_on_the_order_of_columns_in_an_image():
    inserted = _debezium("c", None, {"note": "a", "n": 1})
    deleted = _debezium("d", {"n": 1, "note": "a"}, None)
    decoder = decoder_for("debezium-json", {"keyless": "full_row"})
    result = decoder.decode_batch([Record(inserted), Record(deleted, origin=Origin("t", 0, 1))])
    rows = pa.Table.from_batches([flatten(result)])
    assert rows["key"].to_pylist() == ['{"n":1,"note":"a"}'] * 2


def test_identical_rows_are_one_row_of_the_mirror():
    # Paimon's Canal corpus: a table without a primary key receives the same row twice
    case = load_case(CASES / "canal-json" / "paimon-nonpk.expected.jsonl")
    decoder = decoder_for("canal-json", {"keyless": "full_row"})
    result = decoder.decode_batch(case.records)
    assert [e.key for e in result.events] == [{"v0": "five", "v1": 50}] * 2
    net = net_change(pa.Table.from_batches([flatten(result)]))
    assert net.rows.num_rows == 1 and net.superseded == 1


# --------------------------------------------------------------------------- row ids


def _decode(fmt: str, case, **extra):
    cls = decoder_class(fmt)
    options = cls.options_class.from_mapping(case.options) if case.options else cls.options_class()
    return cls(dataclasses.replace(options, **extra)).decode_batch(case.records)


@pytest.mark.parametrize(
    "case",
    [
        "doc-insert",
        "doc-update-two-records",
        "doc-update-one-record",
        "doc-update-before-only",
        "doc-update-after-only",
        "doc-delete",
    ],
)
@pytest.mark.parametrize("keyless", ["dead_letter", "full_row"])
def test_dataworks_row_id_is_the_key_of_a_table_without_primary_key(case, keyless):
    # DataWorks document, table pkset_test_no_pk: "primaryKey": null and the column
    # "#alibaba_rds_row_id#" (LONG) in every image
    result = _decode(
        "dataworks-json",
        load_case(CASES / "dataworks-json" / f"{case}.expected.jsonl"),
        keyless=keyless,
    )
    assert result.dead_letters == [] and result.events
    assert all(e.key == {"#alibaba_rds_row_id#": 15} for e in result.events)
    assert not any(is_full_row(e) for e in result.events)


@pytest.mark.parametrize("keyless", ["dead_letter", "full_row"])
def test_shareplex_rowid_is_the_key_and_its_update_example_is_not_a_whole_row(keyless):
    # DTS document, SharePlex JSON examples (corrected, as in the golden case), no options
    case = load_case(CASES / "shareplex-json" / "doc-examples-corrected.expected.jsonl")
    case = dataclasses.replace(case, options=None)
    result = _decode("shareplex-json", case, keyless=keyless)
    insert = result.events[0]
    assert insert.op is Op.INSERT and insert.key == {"ROWID": "AAATGpAAIAAItcIAAA"}
    assert not is_full_row(insert)
    # the update and delete examples carry no rowid; the update's `key` object lacks
    # CG_NO, a column the delete example shows: it is not the whole before row
    assert [d.origin.offset for d in result.dead_letters][:1] == [1]
    assert all(d.code == Code.MISSING_KEY for d in result.dead_letters)
    if keyless == "dead_letter":
        assert [d.origin.offset for d in result.dead_letters] == [1, 2]
        return
    assert "'key' object" in result.dead_letters[0].message
    (delete,) = result.events[1:]
    assert delete.op is Op.DELETE and is_full_row(delete)
    assert delete.key == {
        "CG_NO": None,
        "CNTR_TYPE": None,
        "MIO_LOG_ID": "32539739",
        "PLNMIO_REC_ID": "31557806",
        "POL_CODE": None,
    }


# --------------------------------------------------------------------------- golden cases


def _golden_cases() -> list[Path]:
    return sorted(CASES.glob("*/*.expected.jsonl"))


@pytest.mark.parametrize("path", _golden_cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_full_row_changes_nothing_but_missing_key_dead_letters(path):
    fmt = path.parent.name
    case = load_case(path)
    default = _decode(fmt, case)
    full = _decode(fmt, case, keyless="full_row")

    def by_record(result):
        events: dict[int, list] = {}
        for e in result.events:
            events.setdefault(e.origin.offset, []).append(e)
        dead = {d.origin.offset: d for d in result.dead_letters}
        return events, dead

    events_d, dead_d = by_record(default)
    events_f, dead_f = by_record(full)
    assert [s.origin.offset for s in full.skipped] == [s.origin.offset for s in default.skipped]
    for offset, events in events_d.items():
        assert events_f.get(offset) == events, f"line {offset} changed"
    for offset, dead in dead_d.items():
        if dead.code != Code.MISSING_KEY:
            assert dead_f[offset] == dead
        elif offset not in dead_f:  # now identified by its whole row
            assert events_f[offset] and all(is_full_row(e) for e in events_f[offset])
    assert set(dead_f) <= set(dead_d)
    assert set(events_f) - set(events_d) <= set(dead_d)


# --------------------------------------------------------------------------- options


def test_keyless_is_checked_and_passed_through_auto():
    with pytest.raises(ConfigError, match=r"keyless must be one of \['dead_letter', 'full_row'\]"):
        decoder_for("canal-json", {"keyless": "all_columns"})
    auto = decoder_for("auto", {"keyless": "full_row", "formats": ["maxwell-json"]})
    assert auto.delegate("maxwell-json").options.keyless == "full_row"
    own = decoder_for(
        "auto",
        {"keyless": "full_row", "format_options": {"debezium-json": {"keyless": "dead_letter"}}},
    )
    assert own.delegate("debezium-json").options.keyless == "dead_letter"

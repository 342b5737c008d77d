"""``max_columns``: bounded work per record, checked in the shared decode layer.

One record with 100,000 columns once made a mirror of 100,003 columns and a merge of
minutes. Every format's records go through :meth:`Decoder.decode_batch`, which refuses an
event whose before image, after image or declared column types hold more than
``max_columns`` columns: the record is a ``TOO_MANY_COLUMNS`` dead letter with its bytes
and coordinates, and the other records of the batch decode as before. The records are
made by each format's own encoder, as the tool would publish them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdcflow.errors import Code, ConfigError
from cdcflow.formats import decoder_for, embedded_formats
from cdcflow.formats.base import DEFAULT_MAX_COLUMNS, DecoderOptions, Record
from cdcflow.model import ROW_OPS, Op, Origin, SourceTable
from cdcflow_testkit.encoders import SourceChange, encoder_for

FORMATS = embedded_formats()


def _change(table: str, width: int, row_id: int, seq: int) -> SourceChange:
    """An insert into ``table`` whose row has ``width`` columns (``id`` and text)."""
    columns = {"id": "int64", **{f"c{i}": "string" for i in range(1, width)}}
    row: dict[str, Any] = {"id": row_id, **{f"c{i}": f"v{i}" for i in range(1, width)}}
    return SourceChange(
        op=Op.INSERT,
        table=SourceTable("", "shop", "public", table),
        columns=columns,
        key_columns=("id",),
        before=None,
        after=row,
        seq=seq,
        ts_ms=1_700_000_000_000 + seq,
    )


def _encoded(fmt: str, changes: list[SourceChange]) -> tuple[list[Record], list[int], Any]:
    """The records of ``changes`` (distinct offsets), the change index of each, options."""
    encoder = encoder_for(fmt)
    pairs = [(n, m) for n, c in enumerate(changes) for m in encoder.encode(c)]
    records = [
        Record(value=m.value, key=m.key, headers=m.headers, origin=Origin("t", 2, 100 + i))
        for i, (_, m) in enumerate(pairs)
    ]
    return records, [n for n, _ in pairs], encoder.decoder_options(changes)


def _with_limit(fmt: str, options: Any, max_columns: int | None) -> Any:
    """The format's options built from ``options``, with ``max_columns`` when given."""
    cls = type(decoder_for(fmt)).options_class
    if options is None:
        base = cls()
    elif dataclasses.is_dataclass(options):
        base = options
    else:
        base = cls.from_mapping(options)
    return base if max_columns is None else dataclasses.replace(base, max_columns=max_columns)


def _rows(events: list[Any]) -> list[tuple[str, str, Any]]:
    return [(e.op.value, e.source.table, e.key) for e in events if e.op in ROW_OPS]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_record_over_max_columns_is_a_dead_letter_and_its_neighbours_decode(fmt: str) -> None:
    changes = [_change("narrow", 3, 1, 10), _change("wide", 12, 2, 11), _change("narrow", 3, 3, 12)]
    records, change_of, options = _encoded(fmt, changes)
    decoder = decoder_for(fmt, _with_limit(fmt, options, 10))
    result = decoder.decode_batch(records)

    assert _rows(result.events) == [
        ("insert", "narrow", {"id": 1}),
        ("insert", "narrow", {"id": 3}),
    ]
    assert result.dead_letters, "the 12-column row must be refused"
    wide = {r.origin: r for r, n in zip(records, change_of, strict=True) if n == 1}
    # the record that carries the wide row is refused (Qlik: its metadata message too)
    assert records[max(i for i, n in enumerate(change_of) if n == 1)].origin in {
        d.origin for d in result.dead_letters
    }
    for dead in result.dead_letters:
        assert dead.code == Code.TOO_MANY_COLUMNS, dead
        assert dead.origin in wide and dead.value == wide[dead.origin].value
        assert dead.key == wide[dead.origin].key and dead.format == fmt
        assert "12 columns" in dead.message and "limit of 10 columns" in dead.message
        assert "sources[].options.max_columns" in dead.message
    assert result.records == result.decoded_records + len(result.skipped) + len(result.dead_letters)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_at_max_columns_decodes(fmt: str) -> None:
    changes = [_change("wide", 12, 2, 11)]
    records, _, options = _encoded(fmt, changes)
    result = decoder_for(fmt, _with_limit(fmt, options, 12)).decode_batch(records)
    assert result.dead_letters == []
    assert _rows(result.events) == [("insert", "wide", {"id": 2})]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_default_lets_a_2000_column_row_through(fmt: str) -> None:
    changes = [_change("erp", 2000, 7, 11)]
    records, _, options = _encoded(fmt, changes)
    decoder = decoder_for(fmt, _with_limit(fmt, options, None))
    assert decoder.options.max_columns == DEFAULT_MAX_COLUMNS == 4096
    result = decoder.decode_batch(records)
    assert result.dead_letters == []
    (row,) = [e for e in result.events if e.op in ROW_OPS]
    assert row.key == {"id": 7} and len(row.after) == 2000


def _debezium(payload: dict[str, Any], schema: dict[str, Any] | None = None) -> Record:
    value = payload if schema is None else {"schema": schema, "payload": payload}
    return Record(value=orjson.dumps(value), key=b'{"id": 1}', origin=Origin("t", 0, 5))


_SOURCE = {"connector": "postgresql", "db": "shop", "schema": "public", "table": "t", "lsn": 9}


def test_a_before_image_over_the_limit_is_refused() -> None:
    before = {"id": 1, **{f"c{i}": i for i in range(11)}}
    record = _debezium({"op": "u", "before": before, "after": {"id": 1}, "source": _SOURCE})
    result = decoder_for("debezium-json", {"max_columns": 10}).decode_batch([record])
    (dead,) = result.dead_letters
    assert dead.code == Code.TOO_MANY_COLUMNS and dead.origin == Origin("t", 0, 5)
    assert "before image has 12 columns" in dead.message


def test_declared_column_types_over_the_limit_are_refused() -> None:
    """Debezium's schema declares every column; the image may hold fewer."""
    fields = [{"field": f"c{i}", "type": "int32", "optional": True} for i in range(11)]
    row = {
        "type": "struct",
        "optional": True,
        "fields": [{"field": "id", "type": "int32"}, *fields],
    }
    schema = {
        "type": "struct",
        "name": "pg.public.t.Envelope",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "field": "source", "fields": []},
            {"type": "string", "field": "op"},
        ],
    }
    payload = {"op": "c", "before": None, "after": {"id": 1, "c0": 5}, "source": _SOURCE}
    result = decoder_for("debezium-json", {"max_columns": 10}).decode_batch(
        [_debezium(payload, schema)]
    )
    (dead,) = result.dead_letters
    assert dead.code == Code.TOO_MANY_COLUMNS
    assert "declares 12 columns" in dead.message
    ok = decoder_for("debezium-json", {"max_columns": 12}).decode_batch(
        [_debezium(payload, schema)]
    )
    assert ok.dead_letters == [] and len(ok.events[0].columns) == 12


def test_a_refused_qlik_metadata_message_is_not_learned() -> None:
    """Qlik keeps table metadata across records: one over the limit is never kept."""
    records, _, _ = _encoded("qlik-json", [_change("wide", 12, 2, 11)])
    decoder = decoder_for("qlik-json", {"max_columns": 10})
    result = decoder.decode_batch(records[:1])  # the metadata message alone
    assert [d.code for d in result.dead_letters] == [Code.TOO_MANY_COLUMNS]
    assert "metadata message" in result.dead_letters[0].message
    assert decoder._named("public.wide") is None


@pytest.mark.parametrize("bad", [0, -1, "4096", 4096.0, True, None])
@pytest.mark.parametrize("fmt", ["debezium-json", "canal-json", "qlik-json", "dts-avro", "auto"])
def test_a_bad_max_columns_is_a_config_error_naming_the_key(fmt: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"max_columns must be a positive integer") as e:
        decoder_for(fmt, {"max_columns": bad})
    assert "sources[].options.max_columns" in str(e.value)
    cls = type(decoder_for(fmt)).options_class
    with pytest.raises(ConfigError, match="max_columns"):
        decoder_for(fmt, cls(max_columns=bad))


def test_a_bad_max_columns_for_an_auto_delegate_names_its_place() -> None:
    with pytest.raises(ConfigError, match=r"format_options\.canal-json: max_columns"):
        decoder_for("auto", {"format_options": {"canal-json": {"max_columns": 0}}})


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_options_class_takes_max_columns(fmt: str, tmp_path: Path) -> None:
    cls = type(decoder_for(fmt)).options_class
    assert cls().max_columns == 4096
    mapping: dict[str, Any] = {"max_columns": 50}
    if fmt == "drs-avro":  # its configuration path requires a schema file
        from cdcflow.formats.drs_avro import STANDIN_SCHEMA

        schema = tmp_path / "record.avsc"
        schema.write_text(json.dumps(STANDIN_SCHEMA))
        mapping["schema_path"] = str(schema)
    assert decoder_for(fmt, mapping).options.max_columns == 50


@pytest.mark.parametrize("fmt", ["debezium-json", "canal-json", "auto"])
def test_common_options_survive_the_formats_own_options_class(fmt: str) -> None:
    """Given plain :class:`DecoderOptions`, a format that needs its own options class keeps
    every common option (it kept only ``primary_keys`` before)."""
    given = DecoderOptions(
        primary_keys={"t": ("id",)}, max_record_bytes=99, max_columns=7, keyless="full_row"
    )
    options = decoder_for(fmt, given).options
    assert (options.primary_keys, options.max_record_bytes, options.max_columns) == (
        {"t": ("id",)},
        99,
        7,
    )
    assert options.keyless == "full_row"

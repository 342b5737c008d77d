"""Huawei Cloud DRS "synchronize to Kafka" Avro (``drs-avro``).

Source document: *Kafka Message Format* of Huawei Cloud Data Replication Service
(``https://support.huaweicloud.com/intl/en-us/realtimesyn-drs/drs_03_0052.html``): "For details about the schema
definition in Avro format, see record.rar" -- an archive that is not public here. What
*is* public is Huawei's own Flink sample that reads these records
(``com.huawei.bigdata.flink.avro.parser.Avro2Json``): it decodes each Kafka value with
``com.huawei.hwclouds.drs.avro.Record.getDecoder().decode(bytes)`` -- Avro's
*single-object encoding* (``C3 01``, the schema's 8-byte CRC-64-AVRO fingerprint, then
the binary record) -- and reads the fields ``version``, ``seqno``, ``shardId``,
``eventid``, ``updateTimestamp`` (epoch ms), ``tableName`` (with ``"`` quotes),
``operation`` (``INSERT``/``UPDATE``/``DELETE``, any case), ``columnCount``, ``fields``
(``[{name, ...}]``), ``beforeImages`` and ``afterImages`` (one nullable ``{value}`` item
per field).

So this decoder reads records with **a schema file the user supplies**
(:attr:`DrsAvroOptions.schema_path`, DRS's ``record.avsc``) and a field mapping whose
defaults are those names. Without options, ``DrsAvroDecoder()`` uses
:data:`STANDIN_SCHEMA` -- a stand-in written for cdcflow's tests, **not Huawei's schema**:
real DRS records then fail the fingerprint check and become ``BAD_AVRO`` dead letters
whose message says to set ``schema_path``. The configuration path
(:meth:`DrsAvroOptions.from_mapping`) requires ``schema_path``.

Decoding rules (see ``docs/formats/drs-avro.md``): ``seq`` is ``(seqno,)``; ``ts_ms`` is
``updateTimestamp``; column types come from each field's type (a MySQL type name or a
JDBC number) and values are read as DRS JSON writes them (:mod:`cdcflow.formats.drs_json`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats.base import (
    Decoder,
    DecoderOptions,
    Record,
    is_full_row,
)
from cdcflow.formats.common.values import bad_value
from cdcflow.formats.common.zones import zone_option
from cdcflow.formats.drs_json import (
    mysql_column,
)
from cdcflow.model import ChangeEvent, Op, SourceTable

__all__ = ["STANDIN_SCHEMA", "DrsAvroDecoder", "DrsAvroOptions"]

IDENTIFIER = "drs-avro"

# --------------------------------------------------------------------------- op codes
# Values of the operation field; compared in upper case (Huawei's sample uses
# equalsIgnoreCase). Only INSERT/UPDATE/DELETE are attested for Avro; the others are
# the names DRS JSON uses.

OP_INSERT = "INSERT"  # row inserted
OP_UPDATE = "UPDATE"  # row updated: before and after images
OP_DELETE = "DELETE"  # row deleted: before image
OP_INIT = "INIT"  # row of the full (initial) synchronization (DRS JSON's name)
OP_DDL = "DDL"  # schema change (DRS JSON's name)
OP_INIT_DDL = "INIT_DDL"  # table definition of the full synchronization (DRS JSON's name)
OP_TRUNCATE = "TRUNCATE"  # table emptied (Canal's name)

_OPS: dict[str, Op] = {
    OP_INSERT: Op.INSERT,
    OP_UPDATE: Op.UPDATE,
    OP_DELETE: Op.DELETE,
    OP_INIT: Op.SNAPSHOT,
    OP_DDL: Op.DDL,
    OP_INIT_DDL: Op.DDL,
    OP_TRUNCATE: Op.TRUNCATE,
}

# --------------------------------------------------------------------------- schema

SINGLE_OBJECT_MAGIC = b"\xc3\x01"  # Avro single-object encoding marker

#: STAND-IN schema (not Huawei's ``record.avsc``): the field names of Huawei's public
#: sample, plus ``pkNames`` so that tests can carry key columns. Also shipped as
#: ``tests/formats/cases/drs-avro/standin-record.avsc``.
STANDIN_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Record",
    "namespace": "cdcflow.standin.drs.avro",
    "doc": "STAND-IN written for cdcflow tests; NOT Huawei DRS's record.avsc. Field names "
    "follow Huawei's public Flink sample (com.huawei.bigdata.flink.avro.parser.Avro2Json); "
    "types, Field.type, Value.value and pkNames are cdcflow's guesses.",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "seqno", "type": "long"},
        {"name": "shardId", "type": ["null", "string"], "default": None},
        {"name": "eventid", "type": "string"},
        {"name": "updateTimestamp", "type": "long", "doc": "epoch milliseconds"},
        {"name": "tableName", "type": "string", "doc": '"db"."table"'},
        {"name": "operation", "type": "string"},
        {"name": "columnCount", "type": "int"},
        {
            "name": "fields",
            "type": [
                "null",
                {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Field",
                        "fields": [
                            {"name": "name", "type": "string"},
                            {"name": "type", "type": "string", "doc": "MySQL type name"},
                        ],
                    },
                },
            ],
            "default": None,
        },
        {
            "name": "beforeImages",
            "type": [
                "null",
                {
                    "type": "array",
                    "items": [
                        "null",
                        {
                            "type": "record",
                            "name": "Value",
                            "fields": [
                                {"name": "value", "type": ["string", "bytes"]},
                            ],
                        },
                    ],
                },
            ],
            "default": None,
        },
        {
            "name": "afterImages",
            "type": ["null", {"type": "array", "items": ["null", "Value"]}],
            "default": None,
        },
        {
            "name": "pkNames",
            "type": ["null", {"type": "array", "items": "string"}],
            "default": None,
        },
    ],
}

_FRAMINGS = ("auto", "single-object", "raw")


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class DrsAvroOptions(DecoderOptions):
    """Options of the ``drs-avro`` decoder: DRS's schema file and where its fields are.

    Attributes:
        schema_path: path of DRS's Avro schema (``record.avsc`` from ``record.rar``).
            Required in configuration; ``None`` only when built in code, which selects
            the bundled :data:`STANDIN_SCHEMA` (tests).
        framing: ``"auto"`` (default: single-object encoding when the value starts with
            ``C3 01``, else a bare binary record), ``"single-object"`` or ``"raw"``.
        op_field: field holding the operation name. Default ``"operation"``.
        table_field: field holding the (possibly quoted and qualified) table name.
            Default ``"tableName"``.
        database_field: field holding the database name, if the schema has one apart.
            Default ``None`` (taken from a qualified ``tableName``).
        fields_field: field holding the column list. Default ``"fields"``.
        field_name_key: key of a column's name in a ``fields`` item. Default ``"name"``.
        field_type_key: key of a column's type in a ``fields`` item: a MySQL type name or
            a JDBC type number. Default ``"type"``; ``None``: types undeclared.
        before_field: field holding the before image. Default ``"beforeImages"``.
        after_field: field holding the after image. Default ``"afterImages"``.
        value_key: key of the value in an image item. Default ``"value"``.
        seq_field: field holding DRS's sequence number. Default ``"seqno"``.
        timestamp_field: field holding the source time in epoch ms. Default
            ``"updateTimestamp"``; ``None``: no ``ts_ms``.
        key_field: field holding the primary-key column names. Default ``"pkNames"``
            (a stand-in field); a record without it uses ``primary_keys``.
        ddl_field: field holding the DDL statement. Default ``None``.
        meta_fields: fields copied to ``meta`` when present. Default
            ``("version", "shardId", "eventid")``.
        timestamp_zone: zone of MySQL ``timestamp`` text without an offset (see
            ``drs-json``). Default ``"UTC"``.
    """

    schema_path: str | None = None
    framing: str = "auto"
    op_field: str = "operation"
    table_field: str = "tableName"
    database_field: str | None = None
    fields_field: str = "fields"
    field_name_key: str = "name"
    field_type_key: str | None = "type"
    before_field: str = "beforeImages"
    after_field: str = "afterImages"
    value_key: str = "value"
    seq_field: str = "seqno"
    timestamp_field: str | None = "updateTimestamp"
    key_field: str | None = "pkNames"
    ddl_field: str | None = None
    meta_fields: tuple[str, ...] = ("version", "shardId", "eventid")
    timestamp_zone: str = "UTC"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> Self:
        """Options from configuration; ``schema_path`` is required here.

        Raises:
            ConfigError: ``schema_path`` missing, or an unknown option key.
        """
        values = dict(values or {})
        if not values.get("schema_path"):
            raise ConfigError(
                "format drs-avro needs option schema_path: the path of DRS's Avro schema "
                "(record.avsc from the record.rar that Huawei Cloud's DRS documentation "
                "links to, 'Kafka Message Format'); YAML: formats.drs-avro.schema_path"
            )
        if "meta_fields" in values:
            values["meta_fields"] = tuple(values["meta_fields"])
        return super().from_mapping(values)


def load_schema(path: str) -> dict[str, Any]:
    """Read an ``.avsc`` file.

    Raises:
        ConfigError: the file cannot be read or is not an Avro schema (names
            ``schema_path``).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            schema: dict[str, Any] = json.load(fh)  # record.avsc: one record schema
        parse_schema(schema)
    except (OSError, ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise ConfigError(
            f"schema_path={path!r} is not a readable Avro schema: {exc}; point it at DRS's "
            "record.avsc"
        ) from exc
    return schema


def schema_fingerprint(schema: dict[str, Any]) -> bytes:
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


_QUOTED_PART = re.compile(r'"((?:[^"]|"")*)"|([^."]+)')


def split_table_name(name: str) -> tuple[str, str, str]:
    """``"db"."table"``, ``db.table``, ``"db"."schema"."table"`` -> (database, schema, table)."""
    if '"' in name:
        parts = [q.replace('""', '"') if q else u for q, u in _QUOTED_PART.findall(name)]
    else:
        parts = name.split(".")
    parts = [p.strip() for p in parts]
    if len(parts) == 1:
        return "", "", parts[0]
    if len(parts) == 2:
        return parts[0], "", parts[1]
    return parts[0], ".".join(parts[1:-1]), parts[-1]


# --------------------------------------------------------------------------- decoder


class DrsAvroDecoder(Decoder[DrsAvroOptions]):
    """Decoder of DRS Avro records (``drs-avro``), one row per record."""

    identifier: ClassVar[str] = IDENTIFIER
    options_class = DrsAvroOptions
    binary_values: ClassVar[bool] = True

    def __init__(self, options: DrsAvroOptions | DecoderOptions | None = None) -> None:
        super().__init__(options)
        opts = self.options
        assert isinstance(opts, DrsAvroOptions)
        if opts.framing not in _FRAMINGS:
            raise ConfigError(f"framing={opts.framing!r}; valid values: {list(_FRAMINGS)}")
        self._standin = opts.schema_path is None
        schema = STANDIN_SCHEMA if self._standin else load_schema(opts.schema_path or "")
        self._schema = parse_schema(schema)
        self._fingerprint = schema_fingerprint(schema)
        self._zone = zone_option(opts.timestamp_zone)
        self._plans: dict[Any, tuple[dict[str, str], tuple[Any, ...]]] = {}
        self._tables: dict[tuple[Any, Any], SourceTable] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_plans"], state["_tables"] = {}, {}
        return state

    # -- bytes -> record ---------------------------------------------------------------

    def _read(self, value: bytes) -> dict[str, Any]:
        framing = self.options.framing
        start = 0
        if framing == "single-object" or (framing == "auto" and value[:2] == SINGLE_OBJECT_MAGIC):
            if value[:2] != SINGLE_OBJECT_MAGIC or len(value) < 10:
                raise DecodeError(
                    "not an Avro single-object record (C3 01 + fingerprint)", Code.BAD_AVRO
                )
            if value[2:10] != self._fingerprint:
                which = (
                    "the bundled STAND-IN schema (no schema_path given): set "
                    "formats.drs-avro.schema_path to DRS's record.avsc"
                    if self._standin
                    else f"schema_path={self.options.schema_path!r}"
                )
                raise DecodeError(
                    f"record written with schema fingerprint {value[2:10].hex()}, but the "
                    f"decoder reads with {which} (fingerprint {self._fingerprint.hex()})",
                    Code.BAD_AVRO,
                )
            start = 10
        fo = io.BytesIO(value)
        fo.seek(start)
        try:
            rec = fastavro.schemaless_reader(fo, self._schema, None)
        except Exception as exc:  # noqa: BLE001 - any failure of the reader is bad bytes
            raise DecodeError(
                f"not a DRS Avro record: {type(exc).__name__}: {exc}", Code.BAD_AVRO
            ) from None
        if fo.tell() != len(value):
            raise DecodeError(
                f"{len(value) - fo.tell()} bytes left after the record: the schema does "
                "not match these bytes",
                Code.BAD_AVRO,
            )
        if not isinstance(rec, dict):
            raise DecodeError("the schema's top level is not a record", Code.NOT_AN_OBJECT)
        return rec

    # -- record -> events --------------------------------------------------------------

    def _plan(self, fields: Any) -> tuple[dict[str, str], tuple[Any, ...]]:
        """(declared types, ((column, converter or None), ...)) of a ``fields`` list."""
        opts = self.options
        name_key, type_key = opts.field_name_key, opts.field_type_key
        if fields.__class__ is not list:
            raise DecodeError(
                f"{opts.fields_field!r} must be a list of columns",
                Code.BAD_FIELD,
            )
        try:
            pairs = tuple(
                (f[name_key], f.get(type_key) if type_key else None)
                if isinstance(f, dict)
                else (f, None)
                for f in fields
            )
            return self._plans[pairs]
        except KeyError as exc:
            if isinstance(exc.args[0], str) and exc.args[0] == name_key:
                raise DecodeError(f"a column has no {name_key!r}", Code.MISSING_FIELD) from None
        except TypeError:
            raise DecodeError(
                "column names and types must be strings or numbers", Code.BAD_FIELD
            ) from None
        columns: dict[str, str] = {}
        convs = []
        for name, type_value in pairs:
            if not isinstance(name, str):
                raise DecodeError(f"column name {name!r} is not a string", Code.BAD_FIELD)
            type_name = type_value if isinstance(type_value, str) else None
            jdbc = type_value if isinstance(type_value, int) else None
            logical, conv = mysql_column(type_name, jdbc, self._zone)
            if logical is not None:
                columns[name] = logical
            convs.append((name, logical, conv))
        plan = (columns, tuple(convs))
        if len(self._plans) >= 4096:
            self._plans.clear()
        self._plans[pairs] = plan
        return plan

    def _image(self, items: Any, plan: tuple[Any, ...], field: str) -> dict[str, Any]:
        if items.__class__ is not list or len(items) != len(plan):
            raise DecodeError(
                f"{field!r} must be a list with one item per column ({len(plan)})",
                Code.BAD_FIELD,
            )
        value_key = self.options.value_key
        row: dict[str, Any] = {}
        for (name, logical, conv), item in zip(plan, items, strict=True):
            value = item.get(value_key) if item.__class__ is dict else item
            if value is not None:
                if value.__class__ is bytes:
                    if logical == "binary":
                        row[name] = value
                        continue
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        raise bad_value(
                            name, value, f"{logical or 'text'} (bytes not UTF-8)"
                        ) from None
                if conv is not None:
                    value = conv(value, name)
                elif logical in ("string", "json") and value.__class__ is not str:
                    raise bad_value(name, value, "string")
            row[name] = value
        return row

    def _source(self, rec: dict[str, Any]) -> SourceTable:
        opts = self.options
        raw = rec.get(opts.table_field)
        db_field = opts.database_field
        db = rec.get(db_field) if db_field else None
        try:
            return self._tables[(db, raw)]
        except (KeyError, TypeError):
            pass
        if not isinstance(raw, str) or not raw.strip():
            raise DecodeError(
                f"no table name in {opts.table_field!r}",
                Code.MISSING_FIELD,
            )
        database, schema, table = split_table_name(raw)
        if db_field:
            if db is not None and not isinstance(db, str):
                raise DecodeError(f"{db_field!r} must be a string", Code.BAD_FIELD)
            database = (db or "").strip()
        source = SourceTable(IDENTIFIER, database, schema, table)
        if len(self._tables) >= 4096:
            self._tables.clear()
        self._tables[(db, raw)] = source
        return source

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one DRS Avro record into one change event.

        Raises:
            DecodeError: BAD_AVRO, NOT_AN_OBJECT, MISSING_FIELD, BAD_FIELD, UNKNOWN_OP,
                MISSING_KEY or BAD_VALUE (see ``docs/formats/drs-avro.md``).
        """
        opts = self.options
        assert isinstance(opts, DrsAvroOptions)
        rec = self._read(record.value or b"")
        op_name = rec.get(opts.op_field)
        if op_name is None:
            raise DecodeError(f"no operation in {opts.op_field!r}", Code.MISSING_FIELD)
        if not isinstance(op_name, str):
            raise DecodeError(f"{opts.op_field!r} must be a string", Code.BAD_FIELD)
        op = _OPS.get(op_name.upper())
        if op is None:
            raise DecodeError(
                f"unknown DRS operation {op_name!r}; known: {sorted(_OPS)}", Code.UNKNOWN_OP
            )
        seq_value = rec.get(opts.seq_field)
        if seq_value is None:
            raise DecodeError(f"no sequence number in {opts.seq_field!r}", Code.MISSING_FIELD)
        if seq_value.__class__ is int:
            seq = (seq_value,)
        elif (
            isinstance(seq_value, str)
            and seq_value.strip().isascii()
            and seq_value.strip().isdigit()
        ):
            seq = (int(seq_value),)
        else:
            raise DecodeError(
                f"{opts.seq_field!r} is not an integer: {seq_value!r}", Code.BAD_FIELD
            )
        ts_ms = rec.get(opts.timestamp_field) if opts.timestamp_field else None
        if ts_ms is not None and (isinstance(ts_ms, bool) or not isinstance(ts_ms, int)):
            raise DecodeError(f"{opts.timestamp_field!r} must be epoch ms", Code.BAD_FIELD)
        source = self._source(rec)
        meta = {
            f: rec[f] for f in opts.meta_fields if isinstance(rec.get(f), str | int | float | bool)
        } or None
        if op not in (Op.INSERT, Op.UPDATE, Op.DELETE, Op.SNAPSHOT):
            ddl = rec.get(opts.ddl_field) if opts.ddl_field else None
            return [
                ChangeEvent(
                    op=op,
                    source=source,
                    seq=seq,
                    ts_ms=ts_ms,
                    ddl=ddl if isinstance(ddl, str) else None,
                    origin=record.origin,
                    meta={**(meta or {}), "operation": op_name},
                )
            ]

        fields = rec.get(opts.fields_field)
        if fields is None:
            raise DecodeError(f"{op_name} record has no {opts.fields_field!r}", Code.MISSING_FIELD)
        columns, plan = self._plan(fields)
        before_items = rec.get(opts.before_field)
        after_items = rec.get(opts.after_field)
        before = after = None
        if op is Op.DELETE:
            if before_items is None:
                raise DecodeError(f"DELETE without {opts.before_field!r}", Code.MISSING_FIELD)
            before = self._image(before_items, plan, opts.before_field)
        else:
            if after_items is None:
                raise DecodeError(f"{op_name} without {opts.after_field!r}", Code.MISSING_FIELD)
            after = self._image(after_items, plan, opts.after_field)
            if op is Op.UPDATE and before_items is not None:
                before = self._image(before_items, plan, opts.before_field)
        event = ChangeEvent(
            op=op,
            source=source,
            before=before,
            after=after,
            columns=dict(columns),
            seq=seq,
            ts_ms=ts_ms,
            origin=record.origin,
            meta=meta,
        )
        pk = rec.get(opts.key_field) if opts.key_field else None
        if pk is not None and (not isinstance(pk, list) or not all(isinstance(c, str) for c in pk)):
            raise DecodeError(f"{opts.key_field!r} must be a list of column names", Code.BAD_FIELD)
        self.require_key(event, pk or None)
        if before is not None and after is not None and event.key and not is_full_row(event):
            old_key = {c: before[c] for c in event.key if c in before}
            if len(old_key) == len(event.key) and old_key != event.key:
                event.meta = {**(event.meta or {}), "old_key": old_key}
        return [event]

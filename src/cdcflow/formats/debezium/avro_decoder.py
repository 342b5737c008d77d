"""Debezium change events in Avro through a schema registry (format ``debezium-avro``).

What Debezium publishes with an Avro converter -- Confluent's ``AvroConverter``, or
Apicurio's with ``apicurio.registry.as-confluent=true`` and
``apicurio.registry.headers.enabled=false`` -- in the Confluent wire format
(:mod:`cdcflow.formats.schema_registry`): keys and values are Avro records whose writer
schemas live in the registry. Each event decodes to the same :class:`ChangeEvent` as the
same event in ``debezium-json`` with schemas: the Avro schema is read back into the Kafka
Connect schema it was made from (Kafka Connect's ``AvroData``: a Connect type's semantic
name and parameters travel as ``connect.name`` and ``connect.parameters``, ``int8`` and
``int16`` as ``connect.type``), and the row images are typed by it exactly as in
:mod:`cdcflow.formats.debezium.json_decoder`.

Source documents: Debezium's documentation, "Avro serialization" (the converters and
``schema.name.adjustment.mode``) and the connectors' "Data type mappings"; Confluent's
Schema Registry documentation, "Wire format"; Apicurio Registry 2.4, "Kafka Connect
converters"; the Avro 1.11 specification (binary encoding, unions, named types).

Records:

* value ``None`` (Kafka tombstone after a delete) -> skipped ``TOMBSTONE``;
* a value not in the wire format -> ``BAD_AVRO``; a schema id the registry does not
  know -> ``UNKNOWN_SCHEMA_ID``; bytes that do not decode with the id's schema ->
  ``BAD_AVRO``; every other error as in ``debezium-json``;
* a registry that cannot be reached is not the record's fault: ``SourceError``
  ``REGISTRY_UNAVAILABLE`` fails the micro-batch, which is not committed.

A key in the wire format is decoded the same way; a key in another form (a JSON or string
key converter) is read as ``debezium-json`` reads keys.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastavro import parse_schema, schemaless_reader

from cdcflow.errors import Code, DecodeError, SkipReason
from cdcflow.formats.base import ColumnarEvents, DecoderOptions, FlatEvent, Record, SkipRecord
from cdcflow.formats.debezium.json_decoder import DebeziumJsonDecoder
from cdcflow.formats.debezium.options import DebeziumJsonOptions
from cdcflow.formats.schema_registry import (
    RegistrySchemas,
    check_registry_config,
    in_wire_format,
    split_wire,
)
from cdcflow.model import ChangeEvent

__all__ = ["IDENTIFIER", "DebeziumAvroDecoder", "DebeziumAvroOptions", "connect_schema"]

IDENTIFIER = "debezium-avro"

#: Avro primitive type -> Kafka Connect type (``AvroData.toConnectSchema``)
_PRIMITIVES = {
    "null": "null",
    "boolean": "boolean",
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "bytes": "bytes",
    "string": "string",
}

#: an Avro ``logicalType`` -> the Connect semantic name it stands for, for schemas that
#: carry no ``connect.name`` (written by a producer other than Kafka Connect)
_LOGICAL_NAMES = {
    "decimal": "org.apache.kafka.connect.data.Decimal",
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
    "uuid": "io.debezium.data.Uuid",
}


@dataclass(frozen=True)
class DebeziumAvroOptions(DebeziumJsonOptions):
    """Options of the ``debezium-avro`` decoder: those of ``debezium-json`` (its
    ``schema_include`` has no meaning here: every Avro message has its schema), and

    Attributes:
        schema_registry: the registry client's settings, passed through to
            ``confluent_kafka.schema_registry.SchemaRegistryClient``: ``url`` (required;
            Apicurio: ``http://host:8080/apis/ccompat/v7``), ``basic.auth.user.info``
            (``user:password``), ``basic.auth.credentials.source``, ``ssl.ca.location``,
            ``ssl.certificate.location``, ``ssl.key.location``, ``bearer.auth.*``,
            ``timeout``, ``max.retries``. YAML: ``sources[].options.schema_registry``.
    """

    schema_registry: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Raises:
        ConfigError: as ``debezium-json``'s options, or ``schema_registry`` lacks
            ``url`` or holds a setting the registry client refuses."""
        super().__post_init__()
        object.__setattr__(self, "schema_include", True)  # every Avro message has its schema
        object.__setattr__(
            self,
            "schema_registry",
            check_registry_config(self.schema_registry, "sources[].options.schema_registry"),
        )


# --------------------------------------------------------------------------- Avro -> Connect


def _without_logical_types(schema: Any) -> Any:
    """``schema`` without ``logicalType`` annotations, so that fastavro gives the encoded
    values (bytes, int, long) the Connect converters of ``debezium-json`` read."""
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_without_logical_types(s) for s in schema]
    return schema


def _full_name(schema: Mapping[str, Any], namespace: str | None) -> tuple[str, str | None]:
    name = str(schema.get("name"))
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    ns = schema.get("namespace", namespace)
    return (f"{ns}.{name}" if ns else name), ns


def connect_schema(
    avro: Any, named: dict[str, dict[str, Any]] | None = None, namespace: str | None = None
) -> dict[str, Any]:
    """The Kafka Connect schema (as ``JsonConverter`` writes it) that Kafka Connect's
    ``AvroData`` made the Avro schema ``avro`` from.

    Args:
        avro: a parsed Avro schema (JSON value of the registry's schema text).
        named: named types seen so far (fullname -> Connect schema); records are named
            once and referenced by name after.
        namespace: the enclosing namespace, for unqualified names.

    Returns:
        ``{"type": ..., "optional": ..., "name"?, "version"?, "parameters"?, "fields"?}``.

    Raises:
        DecodeError: ``BAD_AVRO`` for an unknown type name or a union of two or more
            non-null branches (``AvroData`` writes those only for Connect types Debezium
            does not use).
    """
    if named is None:
        named = {}
    if isinstance(avro, list):  # a union: [null, T] is an optional T
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise DecodeError(
                f"Avro union {avro!r} has {len(branches)} non-null branches; only optional "
                "types ([null, T]) come from Kafka Connect's Avro converter",
                Code.BAD_AVRO,
            )
        branch = dict(connect_schema(branches[0], named, namespace))
        branch["optional"] = len(avro) > 1
        return branch
    if isinstance(avro, str):
        if avro in _PRIMITIVES:
            return {"type": _PRIMITIVES[avro], "optional": False}
        found = named.get(avro) or (named.get(f"{namespace}.{avro}") if namespace else None)
        if found is None:
            raise DecodeError(f"Avro type {avro!r} is not defined", Code.BAD_AVRO)
        return found
    if not isinstance(avro, dict):
        raise DecodeError(f"not an Avro schema: {avro!r}", Code.BAD_AVRO)
    kind = avro.get("type")
    out: dict[str, Any]
    if kind == "record":
        full, ns = _full_name(avro, namespace)
        out = {"type": "struct", "optional": False, "name": full}
        named[full] = out  # before the fields: a record may refer to itself
        named.setdefault(str(avro.get("name")), out)
        out["fields"] = [
            {**connect_schema(f.get("type"), named, ns), "field": f.get("name")}
            for f in avro.get("fields") or ()
        ]
    elif kind in ("enum", "fixed"):
        full, _ = _full_name(avro, namespace)
        out = {"type": "string" if kind == "enum" else "bytes", "optional": False}
        named[full] = out
    elif kind == "array":
        out = {"type": "array", "optional": False}
        out["items"] = connect_schema(avro.get("items"), named, namespace)
    elif kind == "map":
        out = {"type": "map", "optional": False, "keys": {"type": "string"}}
        out["values"] = connect_schema(avro.get("values"), named, namespace)
    elif isinstance(kind, str) and kind in _PRIMITIVES:
        out = {"type": _PRIMITIVES[kind], "optional": False}
    else:
        raise DecodeError(f"unknown Avro type {kind!r}", Code.BAD_AVRO)
    connect_type = avro.get("connect.type")
    if connect_type in ("int8", "int16"):
        out["type"] = connect_type
    name = avro.get("connect.name")
    params = avro.get("connect.parameters")
    logical = avro.get("logicalType")
    if name is None and logical in _LOGICAL_NAMES:
        name = _LOGICAL_NAMES[logical]
        if logical == "decimal":
            params = {
                "scale": str(avro.get("scale", 0)),
                "connect.decimal.precision": str(avro.get("precision", "")),
            }
    if name is not None and kind != "record":
        out["name"] = name
    if params:
        out["parameters"] = dict(params)
    if "connect.version" in avro:
        out["version"] = avro["connect.version"]
    return out


class _Writer:
    """One writer schema: the fastavro schema that reads its messages and the Connect
    schema of what they hold."""

    __slots__ = ("avro", "connect")

    def __init__(self, avro: Any, connect: dict[str, Any]) -> None:
        self.avro = avro
        self.connect = connect


def _prepare(schema_id: int, parsed: Any, references: Sequence[Any] = ()) -> _Writer:
    """The writer of schema ``schema_id``; ``references``: the schemas it names, each
    after those it names (:class:`RegistrySchemas`)."""
    avro_named: dict[str, Any] = {}
    connect_named: dict[str, dict[str, Any]] = {}
    try:
        for ref in references:
            parse_schema(_without_logical_types(ref), named_schemas=avro_named)
            connect_schema(ref, connect_named)
        avro = parse_schema(_without_logical_types(parsed), named_schemas=avro_named)
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - fastavro's SchemaParseException and others
        raise DecodeError(
            f"schema id {schema_id} is not a valid Avro schema: {type(exc).__name__}: {exc}",
            Code.BAD_AVRO,
        ) from None
    return _Writer(avro, connect_schema(parsed, connect_named))


# --------------------------------------------------------------------------- decoder


class DebeziumAvroDecoder(DebeziumJsonDecoder):
    """Decodes Debezium change events in Avro (see the module docstring).

    Instances hold the registry's schemas of this process; they pickle without them.
    """

    identifier = IDENTIFIER
    options_class = DebeziumAvroOptions
    options: DebeziumAvroOptions

    def __init__(self, options: DecoderOptions | None = None) -> None:
        if options is not None:
            options = DebeziumAvroOptions.from_options(options)
        super().__init__(options)

    def _setup(self) -> None:
        super()._setup()
        self._writers = RegistrySchemas(self.options.schema_registry, _prepare)

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Decode one Debezium Avro record.

        Args:
            record: the Kafka record; its key (a Debezium key, Avro or JSON) names the key
                columns.

        Returns:
            One event, as ``debezium-json`` gives for the same change.

        Raises:
            DecodeError: BAD_AVRO, UNKNOWN_SCHEMA_ID, and the codes of ``debezium-json``.
            SkipRecord: ``TOMBSTONE`` for a Kafka tombstone.
            SourceError: ``REGISTRY_UNAVAILABLE`` (module docstring).
        """
        value = record.value
        if value is None:
            raise SkipRecord(SkipReason.TOMBSTONE)
        payload, schema = self._read(value, "value")
        if payload.__class__ is not dict:
            raise DecodeError("the Avro value is not a record", Code.BAD_AVRO)
        return self._decode({"schema": schema, "payload": payload}, record, False)

    def _read(self, raw: bytes, what: str) -> tuple[Any, dict[str, Any]]:
        schema_id, body = split_wire(raw)
        writer = self._writers.get(schema_id)
        try:
            datum = schemaless_reader(io.BytesIO(body), writer.avro, None)
        except Exception as exc:  # noqa: BLE001 - EOFError, UnicodeDecodeError, IndexError...
            raise DecodeError(
                f"the {what} does not decode with its schema (id {schema_id}): "
                f"{type(exc).__name__}: {exc}",
                Code.BAD_AVRO,
            ) from None
        return datum, writer.connect

    def decode_flat(self, record: Record) -> FlatEvent | None:
        """Always ``None``: Avro records go the general way (:meth:`decode`)."""
        return None

    def decode_columnar(self, records: Sequence[Record]) -> ColumnarEvents | None:
        """Always ``None``: Avro records go the general way (:meth:`decode`)."""
        return None

    def _key(self, event: ChangeEvent, record: Record, exact: bool) -> None:
        raw = record.key
        assert raw is not None
        if not in_wire_format(raw):  # a JSON or string key
            super()._key(event, record, exact)
            return
        payload, key_schema = self._read(raw, "key")
        self._key_from(event, payload, key_schema if key_schema.get("fields") else None, exact)

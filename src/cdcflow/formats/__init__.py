"""Message formats: an explicit registry ``identifier -> module:Class``, imported lazily.

Adding a format means adding one module under ``cdcflow/formats/`` and one line to
:data:`DECODERS` (and, for the tests and the demo, an encoder in ``cdcflow_testkit.encoders``). Nothing here imports a format module until it
is asked for, so importing :mod:`cdcflow.formats` has no side effects.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from cdcflow.errors import ConfigError
from cdcflow.formats.base import Decoder, DecoderOptions

__all__ = [
    "DECODERS",
    "REGISTRY_FORMATS",
    "decoder_class",
    "decoder_for",
    "embedded_formats",
    "format_names",
    "load_entry",
]

#: identifier -> "module:DecoderClass"
DECODERS: dict[str, str] = {
    "debezium-json": "cdcflow.formats.debezium.json_decoder:DebeziumJsonDecoder",
    "debezium-avro": "cdcflow.formats.debezium.avro_decoder:DebeziumAvroDecoder",
    "dataworks-json": "cdcflow.formats.dataworks_json:DataWorksJsonDecoder",
    "qlik-json": "cdcflow.formats.qlik_json:QlikJsonDecoder",
    "dts-avro": "cdcflow.formats.dts_avro:DtsAvroDecoder",
    "shareplex-json": "cdcflow.formats.shareplex_json:SharePlexJsonDecoder",
    "canal-json": "cdcflow.formats.canal_json:CanalJsonDecoder",
    "drs-json": "cdcflow.formats.drs_json:DrsJsonDecoder",
    "drs-json-c": "cdcflow.formats.drs_json:DrsJsonCDecoder",
    "drs-avro": "cdcflow.formats.drs_avro:DrsAvroDecoder",
    "maxwell-json": "cdcflow.formats.maxwell_json:MaxwellJsonDecoder",
    "ogg-json": "cdcflow.formats.ogg_json:OggJsonDecoder",
    "aws-dms-json": "cdcflow.formats.aws_dms_json:AwsDmsJsonDecoder",
    "auto": "cdcflow.formats.auto:AutoDecoder",
}

#: formats whose messages name their schema in a schema registry: they decode only with
#: a registry (``sources[].options.schema_registry``), and have no encoder in the test kit -- their
#: test messages come from the real tool through a real registry (tests/capture)
REGISTRY_FORMATS = frozenset({"debezium-avro"})


def format_names() -> list[str]:
    """The registered format identifiers, sorted."""
    return sorted(DECODERS)


def embedded_formats() -> list[str]:
    """The formats that decode without a service beside Kafka, sorted: every format but
    :data:`REGISTRY_FORMATS`. The demo and the format-wide tests run these."""
    return sorted(set(DECODERS) - REGISTRY_FORMATS)


def load_entry(table: Mapping[str, str], name: str, what: str) -> Any:
    """The object ``table[name]`` names as ``"module:attribute"``, its module imported now.

    Args:
        table: a registry such as :data:`DECODERS` (the test kit's encoders use one too).
        name: the format identifier.
        what: what the table holds (``"decoder"``, ``"encoder"``), named in the error.

    Raises:
        ConfigError: ``name`` is not in ``table``; the message lists the valid names.
    """
    try:
        target = table[name]
    except KeyError:
        raise ConfigError(
            f"unknown format {name!r} ({what}); valid formats: {sorted(table)}",
        ) from None
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def decoder_class(name: str) -> type[Decoder]:
    """The decoder class of format ``name`` (no instance, no options).

    Raises:
        ConfigError: unknown format name.
    """
    cls: type[Decoder] = load_entry(DECODERS, name, "decoder")  # DECODERS names Decoders
    return cls


def decoder_for(name: str, options: Mapping[str, Any] | DecoderOptions | None = None) -> Decoder:
    """A decoder instance for format ``name``.

    Args:
        name: format identifier, e.g. ``"debezium-json"``.
        options: the format's options dataclass, or a plain mapping of its fields.

    Raises:
        ConfigError: unknown format name or unknown option key.
    """
    cls = decoder_class(name)
    if options is None or isinstance(options, DecoderOptions):
        return cls(options)
    return cls(cls.options_class.from_mapping(options))

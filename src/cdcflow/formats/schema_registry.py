"""Avro messages in the Confluent wire format, their writer schemas fetched from a schema
registry -- what every format read through a registry shares.

Wire format (Confluent Schema Registry documentation, "Wire format"): byte 0 is the magic
byte ``0``, bytes 1-4 the schema id (big-endian unsigned 32-bit), the rest the Avro
binary encoding of one datum with that schema. The registry answers
``GET /schemas/ids/{id}`` with the schema text; Confluent's registry, Apicurio's
``/apis/ccompat/v6`` (or v7) API, Karapace and Redpanda serve it alike.

The registry client is ``confluent_kafka.schema_registry.SchemaRegistryClient``; its
settings (``url``, ``basic.auth.user.info``, ``ssl.*``, ``bearer.auth.*``...) are passed
through as given, the way ``kafka.options`` reach librdkafka. Schemas are cached per
process: a schema id never changes its schema.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from cdcflow.errors import Code, ConfigError, DecodeError, SourceError

__all__ = [
    "MAGIC_BYTE",
    "REGISTRY_UNAVAILABLE",
    "RegistrySchemas",
    "check_registry_config",
    "in_wire_format",
    "split_wire",
]

#: the first byte of every message in the Confluent wire format
MAGIC_BYTE = 0
#: :class:`SourceError` code: the registry did not answer (the micro-batch fails, nothing
#: is committed; a restart resumes from the checkpoint)
REGISTRY_UNAVAILABLE = "REGISTRY_UNAVAILABLE"


def in_wire_format(value: bytes) -> bool:
    """Whether ``value`` can be a message in the Confluent wire format: 5 bytes or more,
    the first the magic byte 0."""
    return len(value) >= 5 and value[0] == MAGIC_BYTE


def split_wire(value: bytes) -> tuple[int, memoryview]:
    """``(schema id, Avro body)`` of a message in the Confluent wire format.

    Raises:
        DecodeError: ``BAD_AVRO`` when the value is not (:func:`in_wire_format`).
    """
    if not in_wire_format(value):
        head = bytes(value[:8]).hex(" ")
        raise DecodeError(
            f"the value is not in the Confluent wire format (magic byte 0, a 4-byte schema "
            f"id, then Avro): it starts with {head or 'nothing'}; a converter that puts the "
            "schema id in headers (Apicurio's default) or writes JSON does not fit "
            "debezium-avro",
            Code.BAD_AVRO,
        )
    return int.from_bytes(value[1:5], "big"), memoryview(value)[5:]


def check_registry_config(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The registry client's settings, checked without contacting the registry.

    Args:
        config: the settings, e.g. ``{"url": "http://registry:8081"}``.
        where: the YAML key they came from, named in errors.

    Raises:
        ConfigError: ``url`` is missing, or the client refuses a key or value.
    """
    conf = {str(k): v for k, v in dict(config or {}).items()}
    if not conf.get("url"):
        raise ConfigError(
            f"{where}.url is required: the schema registry's address, e.g. "
            "http://registry:8081 (Apicurio: http://host:8080/apis/ccompat/v7)"
        )
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        SchemaRegistryClient(dict(conf))
    except ImportError as exc:
        raise ConfigError(
            f"{where} needs confluent-kafka's schema registry client: pip install "
            f"'confluent-kafka[schemaregistry]' ({exc})"
        ) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return conf


class RegistrySchemas:
    """Writer schemas by id from one registry, fetched once each per process.

    Args:
        config: :func:`check_registry_config`'s settings.
        prepare: ``prepare(schema_id, schema, references)`` turns a schema (the parsed
            JSON of its text) into what the caller keeps for it (e.g. a parsed fastavro
            schema); ``references`` are the parsed schemas it refers to by name (schema
            references: Apicurio's converter registers Debezium's ``Source`` record on its
            own), each after those it refers to. Its result is cached.
    """

    def __init__(self, config: Mapping[str, Any], prepare: Any) -> None:
        self._config = dict(config)
        self._prepare = prepare
        self._client: Any = None
        self._cache: dict[int, Any] = {}
        self._lock = threading.Lock()

    def get(self, schema_id: int) -> Any:
        """What ``prepare`` made of schema ``schema_id``.

        Raises:
            DecodeError: ``UNKNOWN_SCHEMA_ID`` when the registry does not know the id,
                ``BAD_AVRO`` when its schema is not an Avro schema ``prepare`` accepts.
            SourceError: ``REGISTRY_UNAVAILABLE`` when the registry cannot be reached or
                answers with a server error.
        """
        found = self._cache.get(schema_id)
        if found is None:
            with self._lock:
                found = self._cache.get(schema_id)
                if found is None:
                    found = self._cache[schema_id] = self._fetch(schema_id)
        return found

    def _fetch(self, schema_id: int) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if self._client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            self._client = SchemaRegistryClient(dict(self._config))
        url = self._config.get("url")
        what = f"schema id {schema_id}"
        try:
            schema = self._client.get_schema(schema_id)
            references: list[Any] = []
            self._references(schema, references, set())
        except SchemaRegistryError as exc:
            status = exc.http_status_code
            if status == 404 or exc.error_code in (40403, 40401):
                raise DecodeError(
                    f"{what} (or a schema it refers to) is not known to the schema registry {url} "
                    f"({exc.error_message}); the message was written against another "
                    "registry, or its schema was deleted",
                    Code.UNKNOWN_SCHEMA_ID,
                ) from None
            if status is not None and 400 <= status < 500:
                raise SourceError(
                    f"the schema registry {url} refused the request for schema id "
                    f"{schema_id}: HTTP {status} {exc.error_message}; check "
                    "sources[].options.schema_registry (credentials, url)",
                    REGISTRY_UNAVAILABLE,
                ) from None
            raise SourceError(
                f"the schema registry {url} failed for schema id {schema_id}: {exc}",
                REGISTRY_UNAVAILABLE,
            ) from None
        except Exception as exc:  # noqa: BLE001 - httpx's connection errors and the like
            raise SourceError(
                f"the schema registry {url} cannot be reached ({type(exc).__name__}: {exc}); "
                "the micro-batch is not committed: start the registry or fix "
                "sources[].options.schema_registry.url, then run again",
                REGISTRY_UNAVAILABLE,
            ) from None
        return self._prepare(schema_id, _avro_json(schema, what), references)

    def _references(self, schema: Any, out: list[Any], seen: set[tuple[str, int]]) -> None:
        """The schemas ``schema`` refers to, depth first (each after its own references)."""
        for ref in schema.references or ():
            key = (ref.subject, ref.version)
            if key in seen:
                continue
            seen.add(key)
            found = self._client.get_version(ref.subject, ref.version).schema
            self._references(found, out, seen)
            out.append(_avro_json(found, f"referenced schema {ref.subject} v{ref.version}"))


def _avro_json(schema: Any, what: str) -> Any:
    if (schema.schema_type or "AVRO") != "AVRO":
        raise DecodeError(f"{what} is a {schema.schema_type} schema, not Avro", Code.BAD_AVRO)
    try:
        return json.loads(schema.schema_str)
    except ValueError as exc:
        raise DecodeError(
            f"{what}: the registry's schema text is not JSON ({exc})", Code.BAD_AVRO
        ) from None

"""Format detection per record (format identifier ``auto``).

One topic may carry messages of several replication tools, or the operator may not know
which tool wrote it. :class:`AutoDecoder` parses each record once with orjson, looks for
the fields that only one format has (its *signature*), and hands the record to that
format's own decoder. Detection never guesses: a record that fits no candidate format,
or fits several with no rule that tells them apart, is a dead letter whose message names
the formats it was checked against. See ``docs/formats/auto.md`` for the rules table.

Signatures (checked on the parsed JSON object; "wrapped" = Kafka Connect's
``{"schema", "payload"}`` envelope, whose ``payload`` is then checked):

=================  ======================================================================
format             signature
=================  ======================================================================
qlik-json          ``magic == "atMSG"``; or bare: ``headers`` object with ``operation``
                   and ``data``/``beforeData``; or bare metadata: ``tableStructure`` object
dataworks-json     ``schema`` and ``payload`` objects, ``payload.op`` a string, and
                   ``schema.dataColumn`` or ``payload.sequenceId`` present
debezium-json      (wrapped or not) ``op`` a string and ``source`` an object, with ``op``
                   in c/u/d/r/t/m or a ``before``/``after`` field; or transaction metadata
                   (``status`` BEGIN/END, ``id``, ``event_count``/``data_collections``); or
                   a schema change (``source`` object with ``ddl``/``tableChanges``); or a
                   heartbeat (exactly ``{"ts_ms"}``); or ``payload: null`` under a Connect
                   struct schema (a tombstone the Debezium decoder skips)
shareplex-json     ``meta`` object with a string ``op``, and ``data`` or ``meta.table``
maxwell-json       string ``type``, ``database``, ``table`` (not in ``database-*`` DDL),
                   ``data``/``ts``/``xid``, no ``isDdl`` and ``data`` not an array
canal-json,        string ``type``, ``database``, ``table``, and ``isDdl`` or an array
drs-json,          ``data`` (Canal's flat message, which DRS copied); then the evidence
drs-json-c         rules of :func:`_canal_family` choose among them
ogg-json           string ``op_type`` and ``table``
aws-dms-json       ``metadata`` object with ``record-type``
dts-avro,          no signature (schemaless Avro): a listed Avro format gets the records
drs-avro           that match no JSON signature
=================  ======================================================================

Events are exactly the delegate's, with the delegate's identifier in ``source.format``;
dead letters of a delegate keep its code, with the detected format named in the message.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from cdcflow.errors import Code, ConfigError, DecodeError
from cdcflow.formats.aws_dms_json import AwsDmsJsonDecoder
from cdcflow.formats.base import (
    Decoder,
    DecoderOptions,
    Record,
)
from cdcflow.formats.common.exact_json import InexactNumber, loads_exact
from cdcflow.formats.maxwell_json import MaxwellJsonDecoder
from cdcflow.formats.ogg_json import OggJsonDecoder
from cdcflow.model import ChangeEvent

__all__ = [
    "AMBIGUOUS_CODE",
    "AVRO_FORMATS",
    "AutoDecoder",
    "AutoOptions",
    "CANAL_FAMILY",
    "IDENTIFIER",
    "JSON_FORMATS",
    "detect",
]

IDENTIFIER = "auto"

#: formats with a JSON signature: the default candidates (messages list them in this order)
JSON_FORMATS: tuple[str, ...] = (
    "debezium-json",
    "dataworks-json",
    "qlik-json",
    "shareplex-json",
    "canal-json",
    "drs-json",
    "drs-json-c",
    "maxwell-json",
    "ogg-json",
    "aws-dms-json",
)
#: schemaless Avro formats: no signature, candidates only when listed explicitly
AVRO_FORMATS: tuple[str, ...] = ("dts-avro", "drs-avro")
#: Canal's flat message and the two DRS formats that copy its layout
CANAL_FAMILY: tuple[str, ...] = ("canal-json", "drs-json", "drs-json-c")

#: dead-letter code of a record that fits several formats. ``Code.AMBIGUOUS_FORMAT`` once
#: errors.py defines it; until then ``UNKNOWN_FORMAT`` (the message says "ambiguous").
AMBIGUOUS_CODE: str = Code.AMBIGUOUS_FORMAT

_SHARED_SKELETON = (MaxwellJsonDecoder, OggJsonDecoder, AwsDmsJsonDecoder)
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError

# --------------------------------------------------------------------------- signatures

# Debezium ``Envelope.Operation`` codes: c create, u update, d delete, r snapshot read,
# t truncate, m logical-decoding message.
_DEBEZIUM_OPS = frozenset({"c", "u", "d", "r", "t", "m"})
# Debezium transaction metadata ``status`` values.
_DEBEZIUM_STATUS = frozenset({"BEGIN", "END"})
_QLIK_MAGIC = "atMSG"


def _debezium(obj: dict[str, Any]) -> bool:
    p: Any = obj
    if "payload" in obj and "schema" in obj:  # JsonConverter with schemas.enable=true
        p = obj["payload"]
        if p is None:  # what the Debezium decoder skips as a tombstone
            schema = obj["schema"]
            return schema.__class__ is dict and schema.get("type") == "struct"
        if p.__class__ is not dict:
            return False
    op = p.get("op")
    if op is not None:
        if op.__class__ is not str or p.get("source").__class__ is not dict:
            return False
        return op in _DEBEZIUM_OPS or "after" in p or "before" in p
    status = p.get("status")
    if status is not None:  # transaction metadata topic
        return (
            status.__class__ is str
            and status in _DEBEZIUM_STATUS
            and "id" in p
            and ("event_count" in p or "data_collections" in p)
        )
    if p.get("source").__class__ is dict:  # schema change topic
        return "ddl" in p or "tableChanges" in p
    return len(p) == 1 and "ts_ms" in p  # heartbeat topic


def _dataworks(obj: dict[str, Any]) -> bool:
    schema = obj.get("schema")
    payload = obj.get("payload")
    if schema.__class__ is not dict or payload.__class__ is not dict:
        return False
    return payload.get("op").__class__ is str and (
        "dataColumn" in schema or "sequenceId" in payload
    )


def _qlik(obj: dict[str, Any]) -> bool:
    if "magic" in obj:
        magic: object = obj["magic"]
        return magic == _QLIK_MAGIC
    headers = obj.get("headers")
    if headers.__class__ is dict:  # a data message without the envelope
        return "operation" in headers and ("data" in obj or "beforeData" in obj)
    return obj.get("tableStructure").__class__ is dict  # a bare metadata message


def _shareplex(obj: dict[str, Any]) -> bool:
    meta = obj.get("meta")
    if meta.__class__ is not dict or meta.get("op").__class__ is not str:
        return False
    return "data" in obj or "table" in meta


_CANAL_SHAPED, _MAXWELL_SHAPED = 1, 2


def _type_shape(obj: dict[str, Any]) -> int:
    """For a record with a ``type`` field: :data:`_CANAL_SHAPED` (string ``type``,
    ``database``, ``table``, and ``isDdl`` or an array ``data``: Canal's flat message,
    which DRS copied), :data:`_MAXWELL_SHAPED` (string ``type``, ``database``, ``table``
    -- absent in Maxwell's ``database-*`` DDL --, no ``isDdl``, a non-array ``data``, and
    ``data``, ``ts`` or ``xid``), or 0."""
    typ = obj.get("type")
    if typ.__class__ is not str or "database" not in obj:
        return 0
    if "table" in obj:
        if "isDdl" in obj or obj.get("data").__class__ is list:
            return _CANAL_SHAPED
    elif not typ.startswith("database-") or "isDdl" in obj:
        return 0
    if obj.get("data").__class__ is list:
        return 0
    return _MAXWELL_SHAPED if "data" in obj or "ts" in obj or "xid" in obj else 0


def _ogg(obj: dict[str, Any]) -> bool:
    return obj.get("op_type").__class__ is str and "table" in obj


def _aws_dms(obj: dict[str, Any]) -> bool:
    metadata = obj.get("metadata")
    return metadata.__class__ is dict and "record-type" in metadata


# ----------------------------------------------------------- Canal, DRS JSON, DRS JSON-C

# Canal ``EventType`` names of DDL statements. DRS names every DDL ``DDL`` (``INIT_DDL`` in
# its full synchronization) and so does Alibaba DTS's Canal JSON; these names are Canal's.
_CANAL_ONLY_TYPES = frozenset({"CREATE", "ALTER", "ERASE", "RENAME", "CINDEX", "DINDEX", "QUERY"})
_DRS_ONLY_TYPES = frozenset({"INIT_DDL"})
# DRS's sqlType for MySQL DATETIME. java.sql.Types has no 94; Canal writes JDBC codes
# (93 for DATETIME and TIMESTAMP alike).
_DRS_DATETIME_SQL_TYPE = 94
_EPOCH_SECONDS = re.compile(r"-?\d+(?:\.\d+)?")  # DRS JSON: MySQL TIMESTAMP as epoch seconds
_DATETIME_TEXT = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d")  # Canal and DRS JSON-C


def _canal_family(
    obj: dict[str, Any], candidates: tuple[str, ...], why: list[str] | None = None
) -> tuple[str, ...]:
    """The members of ``candidates`` (a subset of :data:`CANAL_FAMILY`, two or more) that a
    Canal-shaped record can be. Every rule removes the formats whose documents rule the
    record out, and every rule runs, so contradicting evidence (a DRS JSON-C DELETE with
    DRS JSON timestamps) leaves none; ``why`` (when given) collects the reasons."""
    left = set(candidates)

    def drop(names: Iterable[str], reason: str) -> None:
        hit = left.intersection(names)
        if hit:
            left.difference_update(hit)
            if why is not None:
                why.append(f"{reason} (not {', '.join(sorted(hit))})")

    typ = obj["type"]
    if "gtid" in obj:
        drop(("drs-json", "drs-json-c"), "has 'gtid', which DRS does not write")
    if "id" not in obj:
        drop(("drs-json", "drs-json-c"), "has no 'id', which DRS always writes")
    if typ in _CANAL_ONLY_TYPES:
        drop(("drs-json", "drs-json-c"), f"type {typ} is a Canal event type; DRS writes DDL")
    elif typ in _DRS_ONLY_TYPES:
        drop(("canal-json",), f"type {typ} is DRS's")
    elif typ == "DELETE":
        data, old = obj.get("data"), obj.get("old")
        if data and not old:
            drop(("drs-json",), "a DELETE with its row in 'data' (DRS JSON puts it in 'old')")
        elif old and not data:
            drop(("drs-json-c",), "a DELETE with its row in 'old' (DRS JSON-C uses 'data')")
    sql_type = obj.get("sqlType")
    if sql_type.__class__ is dict and _DRS_DATETIME_SQL_TYPE in sql_type.values():
        drop(("canal-json",), "sqlType 94 (DRS's code for DATETIME; not a JDBC type)")
    form = _timestamp_form(obj)
    if form == "epoch":
        drop(("canal-json", "drs-json-c"), "a TIMESTAMP value in epoch seconds (DRS JSON)")
    elif form == "text":
        drop(("drs-json",), "a TIMESTAMP value as date-time text (DRS JSON writes epoch seconds)")
    return tuple(f for f in candidates if f in left)


def _timestamp_form(obj: dict[str, Any]) -> str | None:
    """``"epoch"`` or ``"text"``: how the message writes its MySQL TIMESTAMP values (the
    first non-null one decides); ``None`` when it has none."""
    mysql_type = obj.get("mysqlType")
    if mysql_type.__class__ is not dict:
        return None
    columns = [
        c for c, t in mysql_type.items() if t.__class__ is str and t.lower().startswith("timestamp")
    ]
    if not columns:
        return None
    for rows in (obj.get("data"), obj.get("old")):
        if rows.__class__ is not list:
            continue
        for row in rows:
            if row.__class__ is not dict:
                continue
            for c in columns:
                v = row.get(c)
                if v.__class__ is str:
                    if _EPOCH_SECONDS.fullmatch(v):
                        return "epoch"
                    if _DATETIME_TEXT.match(v):
                        return "text"
    return None


def _match(obj: dict[str, Any], want: frozenset[str], family: tuple[str, ...]) -> list[str]:
    """The formats in ``want`` (and ``family``: the Canal-like formats in ``want``) whose
    signature ``obj`` has. Each signature needs one of a few top-level fields, so a record
    costs a handful of ``in`` tests plus the one or two signature checks it could pass."""
    out = []
    if "payload" in obj:
        if "dataworks-json" in want and _dataworks(obj):
            out.append("dataworks-json")
        if "debezium-json" in want and _debezium(obj):
            out.append("debezium-json")
    elif (
        ("source" in obj or "status" in obj or "ts_ms" in obj)
        and "debezium-json" in want
        and _debezium(obj)
    ):
        out.append("debezium-json")
    if "type" in obj:
        shape = _type_shape(obj)
        if shape == _CANAL_SHAPED:
            if family:
                out.extend(family if len(family) == 1 else _canal_family(obj, family))
        elif shape == _MAXWELL_SHAPED and "maxwell-json" in want:
            out.append("maxwell-json")
    if "metadata" in obj and "aws-dms-json" in want and _aws_dms(obj):
        out.append("aws-dms-json")
    if "op_type" in obj and "ogg-json" in want and _ogg(obj):
        out.append("ogg-json")
    if "meta" in obj and "shareplex-json" in want and _shareplex(obj):
        out.append("shareplex-json")
    if (
        ("magic" in obj or "headers" in obj or "tableStructure" in obj)
        and "qlik-json" in want
        and _qlik(obj)
    ):
        out.append("qlik-json")
    return out


def detect(obj: Any, formats: Iterable[str] = JSON_FORMATS) -> tuple[str, ...]:
    """The JSON formats among ``formats`` whose signature a parsed record has.

    Args:
        obj: the record value parsed as JSON.
        formats: candidate format identifiers (Avro formats are ignored: no signature).

    Returns:
        The matching identifiers in :data:`JSON_FORMATS` order: one for a recognized
        record, none for an unknown one, several for an ambiguous one.
    """
    if obj.__class__ is not dict:
        return ()
    want = frozenset(formats)
    found = _match(obj, want, tuple(f for f in CANAL_FAMILY if f in want))
    return tuple(f for f in JSON_FORMATS if f in found)


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class AutoOptions(DecoderOptions):
    """Options of the ``auto`` decoder.

    Attributes:
        formats: the candidate formats (default: every JSON format, :data:`JSON_FORMATS`).
            Avro formats (``dts-avro``, ``drs-avro``) are candidates only when listed:
            schemaless Avro has no signature, so a listed Avro format receives the
            records that match no JSON signature. List fewer formats to settle records
            that are ambiguous between Canal, DRS JSON and DRS JSON-C.
        primary_keys: passed to every delegate (see :class:`DecoderOptions`).
        keyless: passed to every delegate unless its ``format_options`` set it.
        format_options: per-format options, ``{format: {option: value}}``, e.g.
            ``{"drs-json-c": {"timestamp_zone": "Asia/Shanghai"}}``; a ``primary_keys``
            given here replaces the shared one for that format.
    """

    formats: tuple[str, ...] = JSON_FORMATS
    format_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = (*JSON_FORMATS, *AVRO_FORMATS)
        formats = self.formats
        if isinstance(formats, str) or not isinstance(formats, Iterable):
            raise ConfigError(f"formats must be a list of format names from {list(known)}")
        formats = tuple(formats)
        unknown = [f for f in formats if f not in known]
        if unknown or not formats or len(set(formats)) != len(formats):
            raise ConfigError(
                f"formats must name each candidate once, from {list(known)}; got {list(formats)}"
            )
        object.__setattr__(self, "formats", formats)
        if not isinstance(self.format_options, Mapping):
            raise ConfigError("format_options must map a format name to its options")
        extra = sorted(set(self.format_options) - set(formats))
        if extra:
            raise ConfigError(
                f"format_options for {extra}, which are not among the candidate formats "
                f"{list(formats)}"
            )


# --------------------------------------------------------------------------- decoder


class AutoDecoder(Decoder[AutoOptions]):
    """Detects each record's format and decodes it with that format's decoder.

    Delegates are created on first use, once per format, and keep their state (Qlik
    metadata, DMS table definitions) across records. The instance pickles as its options.
    """

    identifier: ClassVar[str] = IDENTIFIER
    options_class = AutoOptions
    options: AutoOptions

    def __init__(self, options: DecoderOptions | None = None) -> None:
        super().__init__(options)  # Decoder carries plain DecoderOptions over
        opts = self.options
        self._formats = opts.formats
        # Build every delegate's options now, so a wrong option fails at configuration.
        self._delegate_options = {f: self._options_for(f) for f in opts.formats}
        self._delegates: dict[str, Decoder] = {}
        # format -> decode(parsed value, record) of its delegate (see _parsed_entry)
        self._entries: dict[str, Callable[[Any, Record], list[ChangeEvent]]] = {}
        self._want = frozenset(opts.formats)
        self._family = tuple(f for f in CANAL_FAMILY if f in self._want)
        self._avro = tuple(f for f in AVRO_FORMATS if f in self._want)

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]  # unpickling re-runs __init__; mypy refuses __init__ on an instance

    def _options_for(self, fmt: str) -> DecoderOptions:
        # deferred: the registry (cdcflow.formats) names this module, so a top import is a cycle
        from cdcflow.formats import decoder_class

        cls: type[Decoder] = decoder_class(fmt)
        given = self.options.format_options.get(fmt)
        if isinstance(given, DecoderOptions):
            return given
        values = dict(given or {})
        if self.options.primary_keys and "primary_keys" not in values:
            values["primary_keys"] = dict(self.options.primary_keys)
        if "keyless" not in values:
            values["keyless"] = self.options.keyless
        try:
            return cls.options_class.from_mapping(values)
        except ConfigError as exc:
            raise ConfigError(f"format_options.{fmt}: {exc.message}") from exc

    def delegate(self, fmt: str) -> Decoder:
        """The decoder of format ``fmt`` (created on first use)."""
        found = self._delegates.get(fmt)
        if found is None:
            # deferred: the registry (cdcflow.formats) names this module (an import cycle)
            from cdcflow.formats import decoder_for

            found = decoder_for(fmt, self._delegate_options[fmt])
            self._entries[fmt] = _parsed_entry(found)
            self._delegates[fmt] = found
        return found

    # ------------------------------------------------------------------ decode

    def detect(self, obj: Any) -> tuple[str, ...]:
        """The candidate formats whose signature the parsed record ``obj`` has."""
        if obj.__class__ is not dict:
            return ()
        found = _match(obj, self._want, self._family)
        return tuple(f for f in JSON_FORMATS if f in found)

    def decode(self, record: Record) -> list[ChangeEvent]:
        """Detect the record's format and decode it with that format's decoder.

        Raises:
            DecodeError: ``BAD_JSON`` / ``NOT_AN_OBJECT`` (no Avro candidate),
                ``UNKNOWN_FORMAT`` (no signature matches), :data:`AMBIGUOUS_CODE`
                (several match), or the delegate's own error, its message prefixed with
                the detected format.
            SkipRecord: as the delegate raises it.
        """
        value: bytes = record.value  # type: ignore[assignment]  # decode() never sees a tombstone (Decoder.decode)
        try:
            obj = _loads(value)
        except _JSONDecodeError as exc:
            if self._avro:
                return self._avro_fallback(record, "the value is not JSON")
            raise DecodeError(
                f"value is not JSON ({exc}); none of the candidate formats "
                f"{list(self._formats)} is binary",
                Code.BAD_JSON,
            ) from None
        if obj.__class__ is not dict:
            if self._avro:
                return self._avro_fallback(record, "the value is not a JSON object")
            raise DecodeError(
                f"value is a JSON {type(obj).__name__}, not an object: no candidate format "
                f"{list(self._formats)} writes that",
                Code.NOT_AN_OBJECT,
            )
        found = _match(obj, self._want, self._family)
        if len(found) != 1:
            if not found and self._avro:
                return self._avro_fallback(record, "the value matches no JSON format")
            raise self._undetected(obj, tuple(f for f in JSON_FORMATS if f in found))
        fmt = found[0]
        entry = self._entries.get(fmt)
        if entry is None:
            self.delegate(fmt)
            entry = self._entries[fmt]
        try:
            return entry(obj, record)
        except DecodeError as exc:
            raise DecodeError(f"{fmt}: {exc.message}", exc.code) from exc

    def _avro_fallback(self, record: Record, reason: str) -> list[ChangeEvent]:
        if len(self._avro) > 1:
            raise DecodeError(
                f"ambiguous format: {reason}, and schemaless Avro has no signature to "
                f"choose between {', '.join(self._avro)}; list only one of them in formats",
                AMBIGUOUS_CODE,
            )
        fmt = self._avro[0]
        try:
            return self.delegate(fmt).decode(record)
        except DecodeError as exc:
            raise DecodeError(f"{fmt} ({reason}): {exc.message}", exc.code) from exc

    def _undetected(self, obj: dict[str, Any], found: tuple[str, ...]) -> DecodeError:
        if found:
            hint = ""
            if set(found) <= set(CANAL_FAMILY):
                hint = (
                    " (Canal's flat message and DRS JSON/JSON-C share one layout; this record "
                    "has no field that tells them apart)"
                )
            return DecodeError(
                f"ambiguous format: the record fits {', '.join(found)}{hint}; list only one "
                "of them in the formats option of the auto format",
                AMBIGUOUS_CODE,
            )
        keys = list(obj)[:12]
        detail = ""
        if self._family and "type" in obj and _type_shape(obj) == _CANAL_SHAPED:
            why: list[str] = []
            _canal_family(obj, self._family, why)
            detail = f"; a Canal-style flat message, but {'; '.join(why)}"
        return DecodeError(
            f"unknown format: the record matches none of the candidate formats "
            f"{list(self._formats)} (top-level fields {keys}){detail}; see "
            "docs/formats/auto.md for the fields each format is recognized by",
            Code.UNKNOWN_FORMAT,
        )

    # ------------------------------------------------------------------ combine

    def combine(self, events: list[ChangeEvent]) -> list[ChangeEvent]:
        """Let each format's decoder combine its own events (DataWorks and SharePlex join
        update halves), keeping the record order across formats.

        Each format's events go through its decoder's ``combine`` alone; an event that
        combine returns unchanged keeps its place, a new (joined) event takes the place
        of the first event it replaced, and the formats' streams are merged back by
        place, each in the order its combine returned.
        """
        if not events:
            return events
        groups: dict[str, list[int]] = {}
        for i, event in enumerate(events):
            fmt = event.source.format
            if fmt in groups:
                groups[fmt].append(i)
            else:
                groups[fmt] = [i]
        combiners = {
            fmt: d
            for fmt in groups
            if (d := self._delegates.get(fmt)) is not None
            and type(d).combine is not Decoder.combine
        }
        if not combiners:
            return events
        if len(groups) == 1:
            (fmt,) = groups
            return combiners[fmt].combine(events)
        streams: list[list[tuple[int, int, ChangeEvent]]] = []
        for fmt, places in groups.items():
            mine = [events[i] for i in places]
            decoder = combiners.get(fmt)
            if decoder is None:
                streams.append([(p, 0, e) for p, e in zip(places, mine, strict=True)])
                continue
            streams.append(_placed(places, mine, decoder.combine(mine)))
        return [e for _, _, e in heapq.merge(*streams, key=lambda t: (t[0], t[1]))]


def _parsed_entry(decoder: Decoder) -> Callable[[Any, Record], list[ChangeEvent]]:
    """How ``decoder`` decodes a record whose value auto has parsed already.

    ``maxwell-json``, ``ogg-json`` and ``aws-dms-json`` share one decode skeleton
    (orjson, then ``_decode(msg, record, checked)``, parsing again exactly on
    :class:`~cdcflow.formats.common.exact_json.InexactNumber`): the parsed object is handed to
    ``_decode`` as their ``decode`` would, saving the second parse (the golden tests
    check the results are the same). Every other decoder parses the bytes again.
    """
    if isinstance(decoder, _SHARED_SKELETON) and not decoder._exact:
        inner = decoder._decode

        def parsed(obj: Any, record: Record) -> list[ChangeEvent]:
            try:
                return [inner(obj, record, False)]
            except InexactNumber:
                return [inner(loads_exact(record.value, False), record, True)]  # type: ignore[arg-type]  # parsed() is handed decoded values only: never a tombstone

        return parsed
    decode = decoder.decode
    return lambda obj, record: decode(record)


def _placed(
    places: list[int], given: list[ChangeEvent], combined: list[ChangeEvent]
) -> list[tuple[int, int, ChangeEvent]]:
    """``(place, tie, event)`` for the events a combine returned (see ``combine``)."""
    place_of = {id(e): p for p, e in zip(places, given, strict=True)}
    kept = {id(e) for e in combined}
    free = iter([p for p, e in zip(places, given, strict=True) if id(e) not in kept])
    out = []
    last, tie = -1, 0
    for event in combined:
        place = place_of.get(id(event))
        if place is None:  # a new event: the first replaced place after the previous one
            place = next((p for p in free if p > last), last)
        tie = tie + 1 if place == last else 0
        out.append((place, tie, event))
        last = place
    return out

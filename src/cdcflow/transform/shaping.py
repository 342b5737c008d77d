"""A table's shaping options, checked and compiled once, when the configuration loads.

The ``tables[]`` keys ``columns``, ``computed_columns``, ``metadata_columns``,
``type_overrides`` and ``filter`` (:class:`~cdcflow.apply.options.TableOptions` holds them
as the YAML writes them) are compiled here into a :class:`Shaping`: the expressions
parsed (:mod:`cdcflow.transform.expressions`), the logical types split into
:class:`TypeOverride`, the metadata fields checked. :func:`~cdcflow.transform.shape.shape`
applies a :class:`Shaping` to every micro-batch without parsing anything again.

Sources: Paimon's Kafka CDC sync (``--computed_column``, ``--metadata_column``,
``--type_mapping``: https://paimon.apache.org/docs/master/cdc-ingestion/kafka-cdc/), Flink
CDC's transform (https://nightlies.apache.org/flink/flink-cdc-docs-stable/docs/core-concept/transform/).
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from cdcflow.transform.expressions import Expression, parse_expression, parse_filter
from cdcflow.types import parse_type

__all__ = [
    "METADATA_FIELDS",
    "SHAPING_OPTIONS",
    "ColumnSelection",
    "Shaping",
    "TypeOverride",
    "compile_shaping",
    "parse_override",
]

#: the option names (``tables[]`` keys) a :class:`Shaping` is compiled from
SHAPING_OPTIONS = ("columns", "computed_columns", "metadata_columns", "type_overrides", "filter")

#: What a metadata column may hold (``tables[].metadata_columns``), each from the event:
#: the source table's names, the change's op, the source commit time (epoch ms), the
#: source sequence, the transaction id, the Kafka record's coordinates and the format.
METADATA_FIELDS = {
    "database": "string",
    "schema": "string",
    "table": "string",
    "source_table": "string",  # database.schema.table, empty parts left out
    "op": "string",
    "ts_ms": "int64",
    "seq": "string",
    "txn_id": "string",
    "topic": "string",
    "partition": "int32",
    "offset": "int64",
    "format": "string",
}

#: Delta's decimals (and Arrow's decimal128): precision 1..38, 0 <= scale <= precision
_MAX_PRECISION = 38


@dataclass(frozen=True, slots=True)
class TypeOverride:
    """One ``type_overrides`` value: the logical type a column is stored as, and for
    timestamps the zone a naive wall clock is read in (``timestamptz(Asia/Shanghai)``) or
    written for (``timestamp(Asia/Shanghai)``)."""

    logical: str
    zone: str | None = None


def parse_override(text: str) -> TypeOverride:
    """A ``type_overrides`` value: a logical type (``int64``, ``decimal(38,10)``,
    ``string``, ``date``, ...), or ``timestamptz(ZONE)`` / ``timestamp(ZONE)`` with an
    IANA zone name.

    Raises:
        ValueError: not a logical type, a decimal Delta cannot store (precision 1..38,
            0 <= scale <= precision), or an unknown zone.
    """
    text = text.strip()
    for base in ("timestamptz", "timestamp"):
        if text.startswith(f"{base}(") and text.endswith(")"):
            zone = text[len(base) + 1 : -1].strip()
            try:
                zoneinfo.ZoneInfo(zone)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                raise ValueError(
                    f"{zone!r} is not a time zone; use an IANA name, e.g. 'Asia/Shanghai'"
                ) from None
            return TypeOverride(base, zone)
    try:
        base, precision, scale = parse_type(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a logical type; use boolean, int32, int64, float32, float64, "
            "decimal(P,S), string, json, binary, date, time, timestamp, timestamptz or "
            "timestamptz(ZONE)"
        ) from None
    if base == "decimal":
        assert precision is not None and scale is not None
        if not (1 <= precision <= _MAX_PRECISION and 0 <= scale <= precision):
            raise ValueError(
                f"{text!r} is not a Delta decimal; decimal(P,S) needs 1 <= P <= "
                f"{_MAX_PRECISION} and 0 <= S <= P, e.g. decimal(38,10)"
            )
    return TypeOverride(text)


class ColumnSelection(BaseModel):
    """``tables[].columns``: ``include`` (only these land) or ``exclude`` (these do not);
    names are exact column names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one(self) -> ColumnSelection:
        if self.include is not None and self.exclude:
            raise ValueError("columns: set include or exclude, not both")
        return self

    def keeps(self, column: str) -> bool:
        """Whether ``column`` lands."""
        if self.include is not None:
            return column in self.include
        return column not in self.exclude


def compile_shaping(given: Mapping[str, Any]) -> dict[str, Any]:
    """The shaping options among ``given`` (option name -> value as configured; other
    names are left out), checked and compiled: ``computed_columns`` to
    ``{name: Expression}``, ``filter`` to an :class:`Expression` (``None`` stays),
    ``type_overrides`` to ``{column: TypeOverride}``; ``columns`` and
    ``metadata_columns`` as given.

    Raises:
        ValueError: one line naming the option and the fix (an expression that does not
            parse or nests too deep, an unknown metadata field or logical type).
    """
    out: dict[str, Any] = {}
    if "columns" in given:
        out["columns"] = given["columns"]
    if "metadata_columns" in given:
        metadata = dict(given["metadata_columns"] or {})
        for name, what in metadata.items():
            if what not in METADATA_FIELDS:
                raise ValueError(
                    f"metadata_columns.{name}: unknown metadata {what!r}; use one of "
                    f"{sorted(METADATA_FIELDS)}"
                )
        out["metadata_columns"] = metadata
    if "type_overrides" in given:
        overrides = {}
        for name, text in (given["type_overrides"] or {}).items():
            try:
                overrides[name] = parse_override(text)
            except ValueError as exc:
                raise ValueError(f"type_overrides.{name}: {exc}") from None
        out["type_overrides"] = overrides
    if "computed_columns" in given:
        computed = {}
        for name, text in (given["computed_columns"] or {}).items():
            try:
                computed[name] = parse_expression(text)
            except ValueError as exc:
                raise ValueError(f"computed_columns.{name}: {exc}") from None
        out["computed_columns"] = computed
    if "filter" in given:
        condition = given["filter"]
        try:
            out["filter"] = None if condition is None else parse_filter(condition)
        except ValueError as exc:
            raise ValueError(f"filter: {exc}") from None
    return out


@dataclass(frozen=True, slots=True)
class Shaping:
    """One target's shaping, compiled (:func:`compile_shaping`).

    Attributes:
        columns: which source columns land (``None``: all).
        computed: column -> its parsed expression, in the order written.
        metadata: column -> the event field it holds (one of :data:`METADATA_FIELDS`).
        overrides: column -> the logical type it is stored as.
        filter: the parsed row filter (``None``: every row lands).
    """

    columns: ColumnSelection | None = None
    computed: Mapping[str, Expression] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    overrides: Mapping[str, TypeOverride] = field(default_factory=dict)
    filter: Expression | None = None

    @classmethod
    def of(cls, compiled: Mapping[str, Any]) -> Shaping:
        """From :func:`compile_shaping`'s result (options left out keep their defaults)."""
        return cls(
            columns=compiled.get("columns"),
            computed=compiled.get("computed_columns") or {},
            metadata=compiled.get("metadata_columns") or {},
            overrides=compiled.get("type_overrides") or {},
            filter=compiled.get("filter"),
        )

    @property
    def shapes(self) -> bool:
        """Whether any option is set (columns, computed, metadata, types, filter)."""
        return bool(
            self.columns
            or self.computed
            or self.metadata
            or self.overrides
            or self.filter is not None
        )

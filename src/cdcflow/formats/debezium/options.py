"""Options of the Debezium formats (``debezium-json``, and ``debezium-avro`` on top)."""

from __future__ import annotations

from dataclasses import dataclass

from cdcflow import types as T
from cdcflow.errors import ConfigError
from cdcflow.formats.base import (
    DecoderOptions,
)

IDENTIFIER = "debezium-json"


# ``DebeziumJsonOptions.undeclared_columns``: a row image column the schema does not declare
UNDECLARED_DEAD_LETTER = "dead_letter"  # the record is an UNDECLARED_COLUMN dead letter


UNDECLARED_KEEP = "keep"  # the column is kept, its type inferred from its value


UNDECLARED_MODES = (UNDECLARED_DEAD_LETTER, UNDECLARED_KEEP)


@dataclass(frozen=True)
class DebeziumJsonOptions(DecoderOptions):
    """Options of the ``debezium-json`` decoder.

    Attributes:
        schema_include: ``None`` (default) detects per message whether the value is the
            ``{"schema", "payload"}`` wrapper of ``JsonConverter`` with
            ``schemas.enable=true``; ``True`` requires the wrapper; ``False`` takes the
            value as the bare payload.
        decimal_precision: precision declared for an
            ``org.apache.kafka.connect.data.Decimal`` column whose schema has no
            ``connect.decimal.precision`` parameter (default 38).
        variable_scale_decimal_type: logical type declared for
            ``io.debezium.data.VariableScaleDecimal`` columns (NUMERIC/NUMBER without a
            fixed scale); the values keep their own exact scale. Default
            ``decimal(38,18)``.
        float_as_decimal: schemaless messages only: read JSON numbers with a fraction as
            exact ``Decimal`` (``decimal(P,S)``) instead of ``float64``. Use it when the
            connector writes decimals as JSON numbers (``decimal.format=NUMERIC``) and
            the schema is not included. Slower (standard-library JSON parser).
        unavailable_value_placeholder: Debezium's ``unavailable.value.placeholder``; a
            column holding it (text, its base64 or hex bytes, or a one-element array of
            it) was not captured (unchanged TOASTed value) and is left out of the image.
        undeclared_columns: what a row image column that the message's schema does not
            declare makes of its record (messages with a schema only).
            ``"dead_letter"`` (default): an ``UNDECLARED_COLUMN`` dead letter -- Kafka
            Connect's ``JsonConverter`` writes exactly the fields of the schema, so such a
            message was altered or made by another producer. ``"keep"``: the column is
            kept with a type inferred from its value, as without a schema
            (docs/decisions.md, 24).
    """

    schema_include: bool | None = None
    decimal_precision: int = 38
    variable_scale_decimal_type: str = "decimal(38,18)"
    float_as_decimal: bool = False
    unavailable_value_placeholder: str = "__debezium_unavailable_value"
    undeclared_columns: str = UNDECLARED_DEAD_LETTER

    def __post_init__(self) -> None:
        if self.undeclared_columns not in UNDECLARED_MODES:
            raise ConfigError(
                f"undeclared_columns must be one of {list(UNDECLARED_MODES)} (YAML: "
                f"sources[].options.undeclared_columns), not {self.undeclared_columns!r}"
            )
        if self.schema_include not in (None, True, False):
            raise ConfigError("schema_include must be true, false or null (detect per message)")
        if not isinstance(self.decimal_precision, int) or self.decimal_precision < 1:
            raise ConfigError("decimal_precision must be a positive integer, e.g. 38")
        try:
            base = T.parse_type(self.variable_scale_decimal_type)[0]
        except (ValueError, TypeError):
            base = None
        if base != "decimal":
            raise ConfigError(
                "variable_scale_decimal_type must be a decimal type such as 'decimal(38,18)', "
                f"not {self.variable_scale_decimal_type!r}"
            )
        if not isinstance(self.unavailable_value_placeholder, str) or not (
            self.unavailable_value_placeholder
        ):
            raise ConfigError("unavailable_value_placeholder must be a non-empty string")

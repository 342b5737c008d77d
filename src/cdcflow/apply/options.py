"""Per-table apply options, chosen by target-name patterns.

A pipeline's ``tables:`` section is a list of rules applied in file order; every rule
whose ``match`` pattern (``fnmatch``, e.g. ``"shop.public.*"``) matches a target table
overrides the options it sets. A target no rule matches gets the defaults below, which
are the behaviour of every earlier cdcflow release (SCD type 1 mirror, hard deletes,
schema evolution on).

Example::

    tables:
      - match: "*"
        schema_changes: evolve
      - match: "shop.public.orders"
        mode: history              # SCD type 2
        track_history: [status, amount]
        sequence_by: [updated_at]
      - match: "shop.audit.*"
        soft_delete: true
      - match: "shop.public.events"
        maintenance: {target_file_bytes: 268435456, vacuum_retention_hours: 720}
        partition_by: [event_date]   # when cdcflow creates the table

The options are declared once, in :class:`TableOptions`; :class:`TableRule` is derived
from it (every option optional, plus ``match``), so the YAML and the applier cannot
disagree. See docs/semantics.md for what each option does.

The shaping options (``columns``, ``computed_columns``, ``metadata_columns``,
``type_overrides``, ``filter``) are checked and compiled when a rule or options load
(:mod:`cdcflow.transform.shaping`: the expressions parsed once); resolving a target's
options merges the rules' compiled parts into :attr:`TableOptions.shaping`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    RootModel,
    create_model,
    model_validator,
)

from cdcflow.transform.shaping import (
    METADATA_FIELDS,
    SHAPING_OPTIONS,
    ColumnSelection,
    Shaping,
    TypeOverride,
    compile_shaping,
    parse_override,
)

__all__ = [
    "METADATA_FIELDS",
    "SCHEMA_POLICIES",
    "ColumnSelection",
    "TableMaintenanceOptions",
    "TableOptions",
    "TableRule",
    "TableRules",
    "TypeOverride",
    "parse_override",
]

#: What a schema change does to a table (Flink CDC's schema-change behaviours):
#: ``evolve`` applies it (add, widen, record drops and renames); ``ignore`` keeps the
#: table's schema (new columns are not stored, values that do not fit are dead letters);
#: ``fail`` stops the table at the first change, with the offending event recorded.
SCHEMA_POLICIES = ("evolve", "ignore", "fail")


def _known_policy(value: Any) -> Any:
    if value not in SCHEMA_POLICIES:
        raise ValueError(f"unknown schema_changes {value!r}; use one of {list(SCHEMA_POLICIES)}")
    return value


SchemaPolicy = Annotated[Literal["evolve", "ignore", "fail"], BeforeValidator(_known_policy)]


class TableMaintenanceOptions(BaseModel):
    """One table's maintenance, over the pipeline's ``maintenance:`` (an unset key keeps
    the pipeline's value; :class:`~cdcflow.sinks.maintenance.MaintenancePolicy` says what
    each does). A big, hot table may want bigger files; a table readers time-travel on,
    a longer vacuum retention; a table another job compacts, ``enabled: false``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool | None = None
    compact_min_files: Annotated[int, Field(ge=2)] | None = None
    small_file_bytes: Annotated[int, Field(ge=1)] | None = None
    mirror_file_bytes: Annotated[int, Field(ge=1024)] | None = None
    target_file_bytes: Annotated[int, Field(ge=1024)] | None = None
    vacuum_every_hours: Annotated[float, Field(ge=0)] | None = None
    vacuum_retention_hours: Annotated[float, Field(ge=0)] | None = None

    def overrides(self) -> dict[str, Any]:
        """The keys set, by name (what :func:`dataclasses.replace` takes)."""
        return {name: getattr(self, name) for name in self.model_fields_set}


def _named_metadata(value: Any) -> Any:
    """``[table, op]`` is ``{table: table, op: op}``: a list names each column after its field."""
    if isinstance(value, list | tuple):
        return {str(v): v for v in value}
    return value


class TableOptions(BaseModel):
    """How changes are applied to one target table.

    Attributes:
        mode: ``"mirror"`` (SCD type 1: one row per key) or ``"history"`` (SCD type 2:
            one row per version, with ``__start_at``/``__end_at``/``__is_current``).
        sequence_by: after-image columns that break ties between changes with the same
            source sequence (AUTO CDC's ``sequence_by``): compared, in order, after the
            source sequence and before the Kafka position.
        soft_delete: a delete sets ``_deleted = true`` on the stored row instead of
            removing it (a later insert of the key sets it back to false).
        ignore_null_updates: in an update, a NULL value means "unchanged" (keep the
            stored value), as AUTO CDC's ``ignore_null_updates``.
        schema_changes: one of :data:`SCHEMA_POLICIES`.
        track_history: ``history`` mode only: the columns whose changes open a new
            version; changes to other columns update the current version in place.
            ``None``: every column is tracked.
        maintenance: this table's compaction and vacuum settings over the pipeline's
            (:class:`TableMaintenanceOptions`); ``None``: the pipeline's.
        partition_by: data columns the table is partitioned by (Delta partition columns,
            one folder per value), set when cdcflow creates the table; an existing
            table keeps its layout. ``()``: unpartitioned, clustered by key (the
            default, and what most tables want: docs/decisions.md 50).
        change_feed: the table records a change data feed (Delta's Change Data Feed:
            ``delta.enableChangeDataFeed``), so ``readChangeFeed`` in Spark and
            ``DeltaTable.load_cdf`` in delta-rs read what each commit changed.
        columns: which columns land (:class:`ColumnSelection`: ``include`` or
            ``exclude``); the key columns always do.
        computed_columns: ``name -> expression`` (:mod:`cdcflow.transform.expressions`),
            evaluated in Arrow over each image, in order (a later one may use an earlier).
        metadata_columns: ``name -> metadata`` (one of :data:`METADATA_FIELDS`): a column
            filled from the event, not the row (source table, op, Kafka position, ...).
        type_overrides: ``column -> logical type`` the column is stored as, over the type
            its messages declare (``decimal(38,10)``, ``string``, ``timestamptz(Asia/Shanghai)``:
            a naive wall-clock time read in that zone).
        filter: a boolean expression over the after image; rows it is not true for are
            skipped on purpose (``ROW_FILTERED``), and a row that stops matching is
            deleted (docs/configuration.md#row-filters).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["mirror", "history"] = "mirror"
    sequence_by: tuple[str, ...] = ()
    soft_delete: bool = False
    ignore_null_updates: bool = False
    schema_changes: SchemaPolicy = "evolve"
    track_history: tuple[str, ...] | None = None
    maintenance: TableMaintenanceOptions | None = None
    partition_by: tuple[str, ...] = ()
    change_feed: bool = False
    columns: ColumnSelection | None = None
    computed_columns: Mapping[str, str] = Field(default_factory=dict)
    metadata_columns: Annotated[Mapping[str, str], BeforeValidator(_named_metadata)] = Field(
        default_factory=dict
    )
    type_overrides: Mapping[str, str] = Field(default_factory=dict)
    filter: str | None = None

    #: the shaping options compiled (:class:`~cdcflow.transform.shaping.Shaping`)
    _shaping: Shaping = PrivateAttr(default_factory=Shaping)

    @model_validator(mode="after")
    def _distinct_partition_columns(self) -> TableOptions:
        _check_partition_by(self.partition_by)
        compiled = compile_shaping({name: getattr(self, name) for name in SHAPING_OPTIONS})
        self._shaping = Shaping.of(compiled)
        return self

    @property
    def shaping(self) -> Shaping:
        """The shaping options, compiled once when the options were made (the expressions
        parsed, the overrides' types split): what :func:`~cdcflow.transform.shape.shape`
        applies."""
        return self._shaping

    @property
    def shapes(self) -> bool:
        """Whether any shaping option is set (columns, computed, metadata, types, filter)."""
        return self._shaping.shapes


def _check_partition_by(columns: Sequence[str] | None) -> None:
    if columns and (len(set(columns)) != len(columns) or "" in columns):
        raise ValueError(
            f"partition_by {list(columns)} names a column twice or an empty name; "
            "list each partition column once"
        )


class _RuleBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str
    #: the shaping options this rule sets, compiled (option name -> compiled value)
    _shaping: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> _RuleBase:
        given = self.overrides()
        _check_partition_by(given.get("partition_by"))
        self._shaping = compile_shaping(given)
        if "track_history" in given and given.get("mode") == "mirror":
            raise ValueError("track_history applies to mode: history only; remove one of them")
        if given.get("soft_delete") and given.get("mode") == "history":
            raise ValueError(
                "soft_delete applies to mirrors; a history table closes the version on delete "
                "(__end_at); remove soft_delete"
            )
        return self

    def overrides(self) -> dict[str, Any]:
        """The options this rule sets (those written in it), by name."""
        return {name: getattr(self, name) for name in self.model_fields_set if name != "match"}


#: One ``tables:`` rule: ``match`` (an fnmatch pattern over target names) and any of
#: :class:`TableOptions`' fields, each optional (unset: the earlier rules' value stands).
if TYPE_CHECKING:
    # create_model's fields are made at run time, out of the checker's sight; the rule is
    # a subclass of _RuleBase and the code uses only _RuleBase's members (match,
    # overrides, _shaping), so to the checker a rule is a _RuleBase
    TableRule = _RuleBase
else:
    TableRule = create_model(
        "TableRule",
        __base__=_RuleBase,
        __module__=__name__,
        **{
            name: (Optional[field.rebuild_annotation()], None)  # noqa: UP045 - runtime type
            for name, field in TableOptions.model_fields.items()
        },
    )


class TableRules(RootModel[tuple[TableRule, ...]]):
    """Ordered rules; see the module docstring. Called with a target name, gives its
    :class:`TableOptions` (cached per name by the caller if it matters)."""

    model_config = ConfigDict(frozen=True)
    root: tuple[TableRule, ...] = ()

    def __call__(self, target: str) -> TableOptions:
        """The options of ``target``: the defaults, then each matching rule's, in order.
        The rules' shaping options were compiled when the rules loaded; none is parsed
        here (a caller resolves a target once per micro-batch)."""
        options = TableOptions()
        shaping: dict[str, Any] = {}
        for rule in self.root:
            if fnmatch.fnmatchcase(target, rule.match):
                update = rule.overrides()
                if update.get("maintenance") is not None and options.maintenance is not None:
                    # a later rule's maintenance keys over an earlier rule's, key by key
                    merged = options.maintenance.overrides() | update["maintenance"].overrides()
                    update["maintenance"] = TableMaintenanceOptions(**merged)
                options = options.model_copy(update=update)
                shaping.update(rule._shaping)
        if shaping:
            options._shaping = Shaping.of(shaping)
        return options

    @classmethod
    def of(cls, rules: Sequence[tuple[str, Mapping[str, Any]]]) -> TableRules:
        """Rules from ``(pattern, overrides)`` pairs.

        Raises:
            KeyError: an unknown option name.
            pydantic.ValidationError: a value of the wrong type.
        """
        names = tuple(TableOptions.model_fields)
        for _, overrides in rules:
            unknown = set(overrides) - set(names)
            if unknown:
                raise KeyError(f"unknown table options {sorted(unknown)}; valid: {names}")
        return cls(tuple(TableRule(match=p, **o) for p, o in rules))

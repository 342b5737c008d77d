"""Pipeline configuration: YAML validated at the edge, frozen dataclasses inside.

Example (every key with its default where it has one)::

    pipeline_id: orders            # names the Delta application transactions
    warehouse: ./warehouse         # Delta tables (local folder or delta-rs URI)
    checkpoint: ./checkpoint       # Spark streaming checkpoints, one folder per source
    target_template: "{database}.{schema}.{table}"
    trigger: {processing_time: "1 second"}    # or: available_now   (cdcflow run --once forces it)
    sink: delta-rs                 # delta-rs (merges on the driver) | delta-spark (on the executors)
    kafka:
      bootstrap_servers: 127.0.0.1:9092
      starting_offsets: earliest   # earliest | latest | Spark's per-partition JSON
      max_offsets_per_trigger: 200000
      fail_on_data_loss: true
      outage_budget_s: 300         # retry an unreachable broker this long, then exit 69
      options: {}                  # librdkafka settings, e.g. security.protocol, sasl.*
    sources:
      - name: pg                   # default: the format identifier
        format: debezium-json
        topics: [pg.public.customers]   # or topic_pattern: 'pg\\..*'
        options:                   # the format's options
          primary_keys: {customers: [id]}
    tables:                        # per-table rules, in order; later matches override
      - match: "*"                 # fnmatch pattern over target table names
        mode: mirror               # mirror (SCD type 1) | history (SCD type 2)
        schema_changes: evolve     # evolve | ignore | fail
        soft_delete: false
        ignore_null_updates: false
        sequence_by: []            # tie-break columns after the source sequence
        track_history: null        # history mode: columns that open a new version
    apply:
      tombstone_retention_hours: 168   # deleted keys remembered this long (0: forever)
      table_budget_s: 600          # a table whose apply of one batch takes longer stops (0: off)
      transactions:                # transaction-consistent micro-batches (off by default)
        consistent: false
        max_wait_ms: 60000         # an open transaction is applied anyway after this
        max_events: 100000         # ... or when more events than this are held

An unknown key is an error that lists the valid ones; a missing one names the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cdcflow.apply.options import SCHEMA_POLICIES, TableRules
from cdcflow.apply.transactions import TransactionPolicy
from cdcflow.errors import ConfigError

__all__ = [
    "ApplyConfig",
    "KafkaConfig",
    "PipelineConfig",
    "SourceConfig",
    "load_config",
    "parse_config",
]


# --------------------------------------------------------------------------- inside


#: ``kafka.outage_budget_s``: long enough for a broker restart, a leader election or a
#: network blip; short enough that a real outage stops the run (exit 69) within minutes
#: for a supervisor or an alert to act on. See docs/decisions.md.
DEFAULT_OUTAGE_BUDGET_S = 300.0


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = 200_000
    fail_on_data_loss: bool = True
    #: seconds transient broker errors are retried (with backoff) before the run stops
    outage_budget_s: float = DEFAULT_OUTAGE_BUDGET_S
    options: Mapping[str, str] = field(default_factory=dict)

    def reader_options(self) -> dict[str, str]:
        """Options for the Kafka source, in the names Spark's own Kafka source uses."""
        out = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            "includeHeaders": "true",
            "outageBudgetMs": str(round(self.outage_budget_s * 1000)),
        }
        if self.max_offsets_per_trigger:
            out["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        out.update({f"kafka.{k}": str(v) for k, v in self.options.items()})
        return out


@dataclass(frozen=True)
class SourceConfig:
    name: str
    format: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ApplyConfig:
    """Warehouse-wide apply settings (see docs/semantics.md)."""

    #: tombstones older than this (by commit time) are purged; 0 keeps them forever
    tombstone_retention_hours: float = 168.0
    #: apply only whole source transactions per micro-batch
    consistent_transactions: bool = False
    transaction_max_wait_ms: int = 60_000
    transaction_max_events: int = 100_000
    #: a table whose apply of one micro-batch takes longer is stopped after it; 0: no budget
    table_budget_s: float = 600.0

    def transaction_policy(self) -> TransactionPolicy | None:
        """The policy for :class:`~cdcflow.apply.batch.BatchApplier` (``None``: off)."""
        if not self.consistent_transactions:
            return None
        return TransactionPolicy(
            max_wait_ms=self.transaction_max_wait_ms, max_events=self.transaction_max_events
        )


@dataclass(frozen=True)
class PipelineConfig:
    pipeline_id: str
    warehouse: str
    checkpoint: str
    kafka: KafkaConfig
    sources: tuple[SourceConfig, ...]
    target_template: str = "{database}.{schema}.{table}"
    trigger: str = "processing_time"  # processing_time | available_now
    trigger_interval: str = "1 second"
    tables: TableRules = field(default_factory=TableRules)
    apply: ApplyConfig = field(default_factory=ApplyConfig)
    #: who merges the mirrors: ``delta-rs`` (the driver) or ``delta-spark`` (the executors)
    sink: str = "delta-rs"


#: ``sink``: who merges the mirrors (docs/decisions.md, 39)
Sink = Literal["delta-rs", "delta-spark"]
SINKS: tuple[str, ...] = get_args(Sink)


# --------------------------------------------------------------------------- edge


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Kafka(_Strict):
    bootstrap_servers: str
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = Field(default=200_000, gt=0)
    fail_on_data_loss: bool = True
    outage_budget_s: float = DEFAULT_OUTAGE_BUDGET_S
    options: dict[str, str | int | bool] = Field(default_factory=dict)

    @field_validator("outage_budget_s", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e9:
            raise ValueError(
                f"must be a number of seconds >= 0, got {v!r}; e.g. 300 to retry an "
                "unreachable broker for 5 minutes, 0 to stop at the first broker error"
            )
        return float(v)


class _Source(_Strict):
    name: str | None = None
    format: str
    topics: list[str] | None = None
    topic_pattern: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        from cdcflow.formats import format_names

        if v not in format_names():
            raise ValueError(f"unknown format {v!r}; valid formats: {format_names()}")
        return v

    @model_validator(mode="after")
    def _one_subscription(self) -> _Source:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("set exactly one of 'topics' (a list) or 'topic_pattern' (a regex)")
        return self


class _TableRule(_Strict):
    match: str
    mode: Literal["mirror", "history"] | None = None
    sequence_by: list[str] | None = None
    soft_delete: bool | None = None
    ignore_null_updates: bool | None = None
    schema_changes: str | None = None
    track_history: list[str] | None = None

    @field_validator("schema_changes")
    @classmethod
    def _known_policy(cls, v: str | None) -> str | None:
        if v is not None and v not in SCHEMA_POLICIES:
            raise ValueError(f"unknown schema_changes {v!r}; use one of {list(SCHEMA_POLICIES)}")
        return v

    @model_validator(mode="after")
    def _history_only(self) -> _TableRule:
        if self.track_history is not None and self.mode == "mirror":
            raise ValueError("track_history applies to mode: history only; remove one of them")
        if self.soft_delete and self.mode == "history":
            raise ValueError(
                "soft_delete applies to mirrors; a history table closes the version on delete "
                "(__end_at); remove soft_delete"
            )
        return self

    def overrides(self) -> dict[str, Any]:
        out = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name == "match" or name not in self.model_fields_set:
                continue
            out[name] = tuple(value) if isinstance(value, list) else value
        return out


class _Transactions(_Strict):
    consistent: bool = False
    max_wait_ms: int = Field(default=60_000, ge=0)
    max_events: int = Field(default=100_000, gt=0)


class _Apply(_Strict):
    tombstone_retention_hours: float = Field(default=168.0, ge=0)
    table_budget_s: float = Field(default=600.0, ge=0)
    transactions: _Transactions = Field(default_factory=_Transactions)


class _Trigger(_Strict):
    processing_time: str | None = None
    available_now: bool | None = None


class _Pipeline(_Strict):
    pipeline_id: str = "default"
    warehouse: str
    checkpoint: str
    target_template: str = "{database}.{schema}.{table}"
    trigger: _Trigger | Literal["available_now"] = Field(
        default_factory=lambda: _Trigger(processing_time="1 second")
    )
    kafka: _Kafka
    sources: list[_Source] = Field(min_length=1)
    tables: list[_TableRule] = Field(default_factory=list)
    apply: _Apply = Field(default_factory=_Apply)
    sink: Sink = "delta-rs"


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            model = _Pipeline
            for part in err["loc"][:-1]:
                if isinstance(part, int):
                    continue
                fld = model.model_fields.get(str(part))
                ann = getattr(fld, "annotation", None) if fld else None
                model = next(
                    (
                        m
                        for m in (_Kafka, _Source, _Trigger, _TableRule, _Apply, _Transactions)
                        if m is ann or str(ann).endswith(f".{m.__name__}]")
                    ),
                    model,
                )
            lines.append(f"{where}: unknown key; valid keys here: {sorted(model.model_fields)}")
        elif err["type"] == "missing":
            lines.append(f"{where}: required key is missing")
        else:
            lines.append(f"{where}: {err['msg']}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_config(data: Mapping[str, Any], base_dir: Path | None = None) -> PipelineConfig:
    """Validate a configuration mapping.

    Args:
        data: the parsed YAML.
        base_dir: relative ``warehouse``/``checkpoint`` paths are taken from here.

    Raises:
        ConfigError: listing each bad key, with the valid keys or the fix.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            "the configuration must be a YAML mapping (key: value), see docs/configuration.md"
        )
    try:
        model = _Pipeline.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(_explain(exc)) from exc

    def _path(p: str) -> str:
        if "://" in p or base_dir is None or Path(p).is_absolute():
            return p
        return str((base_dir / p).resolve())

    trig = model.trigger
    if trig == "available_now" or (isinstance(trig, _Trigger) and trig.available_now):
        trigger, interval = "available_now", ""
    else:
        trigger, interval = "processing_time", (trig.processing_time or "1 second")
    names: set[str] = set()
    sources = []
    for s in model.sources:
        name = s.name or s.format
        if name in names:
            raise ConfigError(
                f"sources: two sources are called {name!r}; give each a distinct 'name'"
            )
        names.add(name)
        sources.append(
            SourceConfig(name, s.format, tuple(s.topics or ()), s.topic_pattern, s.options)
        )
    return PipelineConfig(
        pipeline_id=model.pipeline_id,
        warehouse=_path(model.warehouse),
        checkpoint=_path(model.checkpoint),
        kafka=KafkaConfig(
            bootstrap_servers=model.kafka.bootstrap_servers,
            starting_offsets=model.kafka.starting_offsets,
            max_offsets_per_trigger=model.kafka.max_offsets_per_trigger,
            fail_on_data_loss=model.kafka.fail_on_data_loss,
            outage_budget_s=model.kafka.outage_budget_s,
            options={
                k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in model.kafka.options.items()
            },
        ),
        sources=tuple(sources),
        target_template=model.target_template,
        trigger=trigger,
        trigger_interval=interval,
        tables=TableRules.of([(r.match, r.overrides()) for r in model.tables]),
        apply=ApplyConfig(
            tombstone_retention_hours=model.apply.tombstone_retention_hours,
            consistent_transactions=model.apply.transactions.consistent,
            transaction_max_wait_ms=model.apply.transactions.max_wait_ms,
            transaction_max_events=model.apply.transactions.max_events,
            table_budget_s=model.apply.table_budget_s,
        ),
        sink=model.sink,
    )


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML configuration file.

    Raises:
        ConfigError: unreadable file, invalid YAML, or an invalid configuration.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    return parse_config(data or {}, base_dir=path.parent)

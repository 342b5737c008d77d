"""Pipeline configuration: one set of frozen pydantic models, checked whole at load.

Example (every key with its default where it has one)::

    pipeline_id: orders            # names the Delta application transactions
    warehouse: ./warehouse         # Delta tables: a folder, s3://, abfss:// or gs:// (sinks/storage.py)
    storage: {}                    # delta-rs's storage options of the warehouse, e.g. aws_endpoint_url
    checkpoint: ./checkpoint       # the Spark checkpoint of the pipeline's one query (a folder)
    target_template: "{database}.{schema}.{table}"
    trigger: {processing_time: "1 second"}    # or: available_now   (cdcflow run --once forces it)
    sink: delta-rs                 # delta-rs (merges on the driver) | delta-spark (on the executors)
    kafka:
      bootstrap_servers: 127.0.0.1:9092
      starting_offsets: earliest   # earliest | latest | Spark's per-partition JSON
      max_offsets_per_trigger: 200000
      fail_on_data_loss: true
      outage_budget_s: 300         # retry an unreachable broker this long, then exit 69
      startup_timeout_s: 30        # ... at start-up, before Spark starts
      options: {}                  # librdkafka settings, e.g. security.protocol, sasl.*
      group_id: null               # offsets committed here for monitoring (null: cdcflow-<pipeline_id>)
      commit_offsets: true         # ... after each applied micro-batch (resume uses the warehouse's)
    sources:
      - name: pg                   # default: the format identifier
        format: debezium-json
        topics: [pg.public.customers]   # or topic_pattern: 'pg\\..*'
        options:                   # the format's options
          primary_keys: {customers: [id]}
        include: []                # regexes over database.schema.table; [] = every table
        exclude: []                # ... left out (skipped on purpose: TABLE_EXCLUDED)
        routes:                    # first match wins; else target_template
          - source_table: 'shop\\.public\\.orders_(\\d+)'
            target_table: shop.public.orders   # \\1, \\g<name>: the match's groups
            shard_column: _shard   # each row's source table; a key in two shards: dead letter
        table_prefix: ""           # around the last part of every target name
        table_suffix: ""
    tables:                        # per-table rules, in order; later matches override
      - match: "*"                 # fnmatch pattern over target table names
        mode: mirror               # mirror (SCD type 1) | history (SCD type 2)
        schema_changes: evolve     # evolve | ignore | fail
        soft_delete: false
        ignore_null_updates: false
        sequence_by: []            # tie-break columns after the source sequence
        track_history: null        # history mode: columns that open a new version
        change_feed: false         # Delta Change Data Feed (readChangeFeed, load_cdf)
        columns: null              # {include: [..]} or {exclude: [card_number]}; keys always land
        computed_columns: {}       # name: expression, e.g. order_date: date(created_at)
        metadata_columns: {}       # name: field, e.g. src_table: source_table (or a list)
        type_overrides: {}         # column: logical type, e.g. amount: decimal(38,10)
        filter: null               # e.g. "status <> 'test'": other rows skipped (ROW_FILTERED)
    apply:
      tombstone_retention_hours: 168   # deleted keys remembered this long (0: forever)
      table_budget_s: 600          # a table whose apply of one batch takes longer stops (0: off)
      store_outage_budget_s: 60    # a store failing beyond delta-rs's retries: restart this long, then exit 74
      parallel_tables: 4           # tables of a micro-batch applied at once (1: one by one; 32 on a store)
      merge_engine: arrow          # arrow (rewrite only the files a batch's keys are in) | delta-rs
      dead_letter_limit: null      # share of a micro-batch's records; over it the run stops (0: any)
      transactions:                # transaction-consistent micro-batches (off by default)
        consistent: false
        max_wait_ms: 60000         # an open transaction is applied anyway after this
        max_events: 100000         # ... or when more events than this are held
    monitoring:
      prometheus_port: null        # e.g. 9108: Prometheus metrics at /metrics (cdcflow.runtime.metrics)
      prometheus_host: 127.0.0.1   # 0.0.0.0 for a scraper on another machine
      spark_ui: false              # Spark's web UI on the session cdcflow creates
    maintenance:                   # after micro-batches, within a budget; `cdcflow maintain`
      enabled: true
      budget_s: 2                  # no new table is started past this, per micro-batch
      compact_min_files: 16        # a size tier with this many files is compacted
      small_file_bytes: 1048576    # smaller files are tier 0
      mirror_file_bytes: 16777216  # a mirror's compaction writes files up to this size
      target_file_bytes: 67108864  # ... the bookkeeping tables' (and cdcflow maintain's)
      vacuum_every_hours: 24       # files no recent version needs are deleted this often
      vacuum_retention_hours: 168  # ... kept this long for readers of older versions
      log_retention_hours: 24      # delta.logRetentionDuration of the tables it creates

An unknown key is an error that lists the valid ones; a missing one names the key.
Everything that can be checked without a broker is checked by :func:`load_config`,
before Spark starts: the format's options (by the format's own options class), the
starting offsets, the trigger interval, the topic pattern and the Kafka client settings
cdcflow owns. The models are the configuration the pipeline reads; there is no second
copy of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cdcflow.apply.options import TableRule, TableRules
from cdcflow.apply.transactions import TransactionPolicy
from cdcflow.errors import CdcflowError, ConfigError, did_you_mean
from cdcflow.formats import decoder_for, format_names
from cdcflow.secrets import RedactedDict, redact, resolve_references
from cdcflow.sinks.maintenance import MaintenancePolicy
from cdcflow.sinks.retention import RetentionPolicy
from cdcflow.sinks.s3a import check_checkpoint_options, checkpoint_on_store
from cdcflow.sinks.storage import check_storage_options, provider_of
from cdcflow.source.kafka.options import FORBIDDEN_KAFKA_KEYS
from cdcflow.source.starting_offsets import parse_starting_offsets
from cdcflow.source.subscription import subscription, topic_named_twice
from cdcflow.transform.router import RouteRule, Routing, compile_pattern

__all__ = [
    "SINKS",
    "ApplyConfig",
    "KafkaConfig",
    "PipelineConfig",
    "SourceConfig",
    "TransactionsConfig",
    "TriggerConfig",
    "load_config",
    "parse_config",
]


#: ``kafka.outage_budget_s``: long enough for a broker restart, a leader election or a
#: network blip; short enough that a real outage stops the run (exit 69) within minutes
#: for a supervisor or an alert to act on. See docs/decisions.md.
DEFAULT_OUTAGE_BUDGET_S = 300.0

#: ``sink``: who merges the mirrors (docs/decisions.md, 39)
Sink = Literal["delta-rs", "delta-spark"]
SINKS: tuple[str, ...] = get_args(Sink)

#: Spark's processing-time interval (``Trigger.ProcessingTime``): ``<number> <unit>``
#: terms, optionally after ``interval``; units of fixed length, spelled out; a fraction
#: only of seconds (tests/test_config.py holds this against Spark itself)
_INTERVAL_TERM = (
    r"(?:\d+\s+(?:week|day|hour|minute|millisecond|microsecond)s?|\d+(?:\.\d+)?\s+seconds?)"
)
_UNIT_MS = {
    "week": 604_800_000.0,
    "day": 86_400_000.0,
    "hour": 3_600_000.0,
    "minute": 60_000.0,
    "second": 1000.0,
    "millisecond": 1.0,
    "microsecond": 0.001,
}
_INTERVAL = re.compile(rf"\s*(?:interval\s+)?{_INTERVAL_TERM}(?:\s+{_INTERVAL_TERM})*\s*", re.I)

#: librdkafka settings that ``kafka.options`` must not set, with the fix
_OWNED_KAFKA_OPTIONS = {
    "bootstrap.servers": "set kafka.bootstrap_servers instead",
    "auto.offset.reset": "set kafka.starting_offsets instead",
}


def _seconds(v: Any, example: str) -> float:
    """A number of seconds >= 0 (not a boolean), as a float; else a ValueError ending
    with ``example``."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e9:
        raise ValueError(f"must be a number of seconds >= 0, got {v!r}; {example}")
    return float(v)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __repr_args__(self) -> Any:
        # secret-looking keys' values (kafka.options' sasl.password, a schema registry's
        # basic.auth.user.info...) never reach a repr, a log line or an error message
        for name, value in super().__repr_args__():
            yield name, redact(value, name)


class KafkaConfig(_Strict):
    """``kafka:``: the brokers and how the sources read them.

    Attributes:
        bootstrap_servers: ``host:port[,host:port...]``.
        starting_offsets: ``earliest`` | ``latest`` | Spark's per-partition JSON; where a
            source's first run starts (later runs resume from their checkpoint).
        max_offsets_per_trigger: records per micro-batch at most (``None``: no limit).
        fail_on_data_loss: stop (``DATA_LOSS``) when records were deleted before read.
        outage_budget_s: seconds transient broker errors are retried before the run
            stops (exit 69); 0 stops at the first error.
        startup_timeout_s: seconds the brokers are waited for before Spark starts
            (:mod:`cdcflow.runtime.preflight`); past it the run stops (exit 69).
        read_tasks: the most Spark tasks a micro-batch is read and decoded with on the
            Python Kafka source; topic-partitions are packed into them (decision 54).
            ``None``: twice Spark's default parallelism (the cores of local Spark).
        options: librdkafka settings (``security.protocol``, ``sasl.*``, ...), as text.
        group_id: the consumer group whose offsets cdcflow commits after each applied
            micro-batch, for monitoring tools (``kafka-consumer-groups``, Kafka UIs) only:
            a run resumes from the warehouse's offsets. ``None``: ``cdcflow-<pipeline_id>``.
        commit_offsets: commit them (``monitoring.commit_offsets`` in other tools' terms).
    """

    bootstrap_servers: str = Field(min_length=1)
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = Field(default=200_000, gt=0)
    fail_on_data_loss: bool = True
    outage_budget_s: float = DEFAULT_OUTAGE_BUDGET_S
    startup_timeout_s: float = 30.0
    read_tasks: int | None = Field(default=None, gt=0)
    options: dict[str, str] = Field(default_factory=dict)
    group_id: str | None = Field(default=None, min_length=1)
    commit_offsets: bool = True

    @field_validator("starting_offsets")
    @classmethod
    def _starting_offsets(cls, v: str) -> str:
        parse_starting_offsets(v)  # ValueError names the fix
        return v

    @field_validator("outage_budget_s", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> float:
        return _seconds(
            v,
            "e.g. 300 to retry an unreachable broker for 5 minutes, 0 to stop at the first "
            "broker error",
        )

    @field_validator("startup_timeout_s", mode="before")
    @classmethod
    def _startup(cls, v: Any) -> float:
        return _seconds(
            v,
            "e.g. 30 to wait for brokers that are starting, 0 to stop at once when they do "
            "not answer",
        )

    @field_validator("options", mode="before")
    @classmethod
    def _client_options(cls, v: Any) -> Any:
        if not isinstance(v, Mapping):
            return v  # pydantic names the type error

        out = {}
        for key, value in v.items():
            owned = _OWNED_KAFKA_OPTIONS.get(key) or FORBIDDEN_KAFKA_KEYS.get(key)
            if owned:
                raise ValueError(f"{key!r} is set by cdcflow: {owned}")
            if not isinstance(value, str | int | float | bool):
                raise ValueError(f"{key!r} must be text, a number or a boolean, got {value!r}")
            out[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    def reader_options(self) -> dict[str, str]:
        """Options for the Kafka source, in the names Spark's own Kafka source uses (a
        :class:`~cdcflow.secrets.RedactedDict`: secrets are masked when it is shown)."""
        out = RedactedDict(
            {
                "kafka.bootstrap.servers": self.bootstrap_servers,
                "startingOffsets": self.starting_offsets,
                "failOnDataLoss": str(self.fail_on_data_loss).lower(),
                "includeHeaders": "true",
                "outageBudgetMs": str(round(self.outage_budget_s * 1000)),
            }
        )
        if self.max_offsets_per_trigger:
            out["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        out.update({f"kafka.{k}": v for k, v in self.options.items()})
        return out


_SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


class SourceConfig(_Strict):
    """One ``sources:`` entry: a set of topics in one format.

    Attributes:
        name: names the source's checkpoint and offsets (default: the format identifier).
        format: a format identifier (``cdcflow.formats.format_names()``).
        topics: the topics, or empty when ``topic_pattern`` is set.
        topic_pattern: a regular expression matched against whole topic names.
        options: the format's options, checked by the format's options class at load.
        include, exclude: regular expressions over whole source names
            ``database.schema.table``: only included tables land, excluded ones do not
            (their events are skipped on purpose: ``TABLE_EXCLUDED``).
        routes: rules sending matching source tables to a named target, sharded tables
            merged (:class:`~cdcflow.transform.router.RouteRule`).
        table_prefix, table_suffix: around the last part of every target's name.
    """

    name: str = ""
    format: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    routes: tuple[RouteRule, ...] = ()
    table_prefix: str = ""
    table_suffix: str = ""

    def routing(self) -> Routing:
        """The source's table selection and routing (:class:`~cdcflow.transform.router.Routing`)."""
        return Routing(
            include=self.include,
            exclude=self.exclude,
            routes=self.routes,
            table_prefix=self.table_prefix,
            table_suffix=self.table_suffix,
        )

    @field_validator("include", "exclude")
    @classmethod
    def _table_patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in v:
            try:
                compile_pattern(pattern)
            except ValueError as exc:
                raise ValueError(
                    f"{exc}; patterns match whole names database.schema.table, e.g. "
                    "'shop\\.public\\..*'"
                ) from None
        return v

    def subscription(self) -> dict[str, str]:
        """The Kafka source option that reads this source's topics (``subscribe`` or
        ``subscribePattern``)."""

        return subscription([(self.topics, self.topic_pattern)])

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if v and not _SOURCE_NAME.fullmatch(v):
            raise ValueError(
                f"{v!r}: a source name is letters, digits, '_', '-' and '.', starting with a "
                "letter or digit (it names the source's offsets and log lines)"
            )
        return v

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v not in format_names():
            raise ValueError(f"unknown format {v!r}; valid formats: {format_names()}")
        return v

    @field_validator("topic_pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"{v!r} is not a valid regular expression: {exc}") from None
        return v

    @field_validator("options")
    @classmethod
    def _format_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        fmt = info.data.get("format")
        if fmt is None or not v:
            return v  # an unknown format is reported on its own key

        try:
            decoder_for(fmt, v)  # the format's options class checks names and values
        except CdcflowError as exc:
            raise ValueError(f"{exc.message} (format {fmt})") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not valid for format {fmt}: {exc}") from None
        return v

    @model_validator(mode="after")
    def _one_subscription(self) -> SourceConfig:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("set exactly one of 'topics' (a list) or 'topic_pattern' (a regex)")
        if not self.name:
            object.__setattr__(self, "name", self.format)
        return self


class TransactionsConfig(_Strict):
    """``apply.transactions:`` transaction-consistent micro-batches (off by default)."""

    consistent: bool = False
    max_wait_ms: int = Field(default=60_000, ge=0)
    max_events: int = Field(default=100_000, gt=0)


class ApplyConfig(_Strict):
    """``apply:``: warehouse-wide apply settings (see docs/semantics.md).

    Attributes:
        tombstone_retention_hours: tombstones older than this (by commit time) are
            purged; 0 keeps them forever.
        table_budget_s: a table whose apply of one micro-batch takes longer is stopped
            after it; 0: no budget.
        store_outage_budget_s: seconds a warehouse store that throttles or does not
            answer beyond delta-rs's own retries is waited out, by starting the query
            again from its checkpoint (:mod:`cdcflow.runtime.store_outage`); then the run
            stops (exit 74). 0: the first such failure stops it. The lease's validity
            (40 s of its 60 s TTL) ends a longer outage first.
        parallel_tables: how many tables of a micro-batch are applied at once (threads
            on the driver; 1 applies them one after another). Default 4 on a local
            warehouse, 32 on an object store, where a table's apply mostly waits on
            requests (measured: 500 tables at 30 ms a request on S3Proxy, 22.3 s at 16,
            16.5 s at 32; decision 70).
        merge_engine: who computes the mirrors' merges with ``sink: delta-rs``:
            ``arrow`` (cdcflow's, :mod:`cdcflow.sinks.arrow_merge`) or ``delta-rs``
            (its MERGE).
        transactions: apply only whole source transactions per micro-batch.
        dead_letter_limit: the share of a source's records in one micro-batch that may be
            dead letters; over it the run stops after committing the micro-batch (exit 1,
            ``DEAD_LETTER_LIMIT``). ``0`` stops on the first dead letter (Kafka Connect's
            ``errors.tolerance=none``); ``None`` (default) never stops: a batch that is
            mostly dead letters is only warned about on the console.
    """

    tombstone_retention_hours: float = Field(default=168.0, ge=0)
    table_budget_s: float = Field(default=600.0, ge=0)
    store_outage_budget_s: float = Field(default=60.0, ge=0)
    parallel_tables: int = Field(default=4, ge=1, le=64)
    merge_engine: Literal["arrow", "delta-rs"] = "arrow"
    transactions: TransactionsConfig = Field(default_factory=TransactionsConfig)
    dead_letter_limit: float | None = Field(default=None, ge=0, le=1)

    def transaction_policy(self) -> TransactionPolicy | None:
        """The policy for :class:`~cdcflow.apply.batch.BatchApplier` (``None``: off)."""
        if not self.transactions.consistent:
            return None
        return TransactionPolicy(
            max_wait_ms=self.transactions.max_wait_ms, max_events=self.transactions.max_events
        )


class RetentionConfig(_Strict):
    """``maintenance.retention:``: how long the ``_cdcflow`` bookkeeping rows are kept
    (:class:`~cdcflow.sinks.retention.RetentionPolicy`; ``0``: forever)."""

    changelog_hours: float = Field(default=168.0, ge=0)
    changelog_max_rows: int = Field(default=0, ge=0)
    dead_letters_hours: float = Field(default=720.0, ge=0)
    batches_hours: float = Field(default=720.0, ge=0)
    progress_hours: float = Field(default=720.0, ge=0)
    offsets_hours: float = Field(default=720.0, ge=0)
    every_hours: float = Field(default=1.0, gt=0)


class MaintenanceConfig(_Strict):
    """``maintenance:``: compaction and vacuum of the tables, after micro-batches and by
    ``cdcflow maintain`` (:class:`~cdcflow.sinks.maintenance.MaintenancePolicy`)."""

    enabled: bool = True
    budget_s: float = Field(default=2.0, ge=0)
    small_file_bytes: int = Field(default=1024 * 1024, ge=1)
    compact_min_files: int = Field(default=16, ge=2)
    mirror_file_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    target_file_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    vacuum_every_hours: float = Field(default=24.0, ge=0)
    vacuum_retention_hours: float = Field(default=168.0, ge=0)
    log_retention_hours: float | None = Field(default=24.0, gt=0)
    retention: RetentionConfig = RetentionConfig()

    def policy(self) -> MaintenancePolicy:
        """The policy :class:`~cdcflow.apply.batch.BatchApplier` maintains by."""
        fields = self.model_dump(exclude={"retention"})
        retention = self.retention.model_dump(exclude={"every_hours"})
        return MaintenancePolicy(
            **fields,
            retention=RetentionPolicy(**retention),
            retention_every_hours=self.retention.every_hours,
        )


class TriggerConfig(_Strict):
    """``trigger:``: ``{processing_time: "1 second"}`` (the default), or
    ``available_now`` (drain what is there, then stop; ``cdcflow run --once`` forces it)."""

    processing_time: str | None = None
    available_now: bool = False

    @field_validator("processing_time")
    @classmethod
    def _interval(cls, v: str | None) -> str | None:
        if v is not None and not _INTERVAL.fullmatch(v):
            raise ValueError(
                f"{v!r} is not an interval; write a number and a unit, e.g. '1 second', "
                "'500 milliseconds', '2 minutes'"
            )
        return v

    @property
    def interval_ms(self) -> int | None:
        """The processing-time interval in milliseconds (``None``: available-now)."""
        if self.available_now or self.processing_time is None:
            return None
        ms = 0.0
        for n, unit in re.findall(r"(\d+(?:\.\d+)?)\s+([a-z]+?)s?\b", self.processing_time.lower()):
            ms += float(n) * _UNIT_MS[unit]
        return int(ms)

    @model_validator(mode="after")
    def _one_kind(self) -> TriggerConfig:
        if self.available_now and self.processing_time is not None:
            raise ValueError("set either processing_time or available_now, not both")
        if not self.available_now and self.processing_time is None:
            object.__setattr__(self, "processing_time", "1 second")
        return self


class MonitoringConfig(_Strict):
    """``monitoring:``: what a running pipeline shows to standard tools.

    Attributes:
        prometheus_port: serve Prometheus metrics on this port (``/metrics``, counters and
            gauges per source and table: :mod:`cdcflow.runtime.metrics`); ``None``: off.
        prometheus_host: the address to listen on (``127.0.0.1``: this machine only;
            ``0.0.0.0`` for a scraper elsewhere).
        spark_ui: Spark's web UI (port 4040 and up) on a session cdcflow creates.
    """

    prometheus_port: int | None = Field(default=None, ge=1, le=65535)
    prometheus_host: str = "127.0.0.1"
    spark_ui: bool = False


class PipelineConfig(_Strict):
    """The whole configuration (see the module docstring for every key)."""

    pipeline_id: str = "default"
    warehouse: str
    #: delta-rs's storage options for the warehouse (:mod:`cdcflow.sinks.storage`)
    storage: dict[str, str] = Field(default_factory=dict)
    checkpoint: str
    target_template: str = "{database}.{schema}.{table}"
    trigger: TriggerConfig = Field(default_factory=TriggerConfig)
    kafka: KafkaConfig
    sources: tuple[SourceConfig, ...]
    tables: TableRules = Field(default_factory=TableRules)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    apply: ApplyConfig = Field(default_factory=ApplyConfig)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    #: who merges the mirrors: ``delta-rs`` (the driver) or ``delta-spark`` (the executors)
    sink: Sink = "delta-rs"

    @model_validator(mode="before")
    @classmethod
    def _storage_spelling(cls, data: Any) -> Any:
        # one spelling of a warehouse's options (decision 65); the others users may try
        if isinstance(data, Mapping):
            for other in ("storage_options", "warehouse_options", "object_store"):
                if other in data:
                    raise ValueError(
                        f"{other}: unknown key; a warehouse's storage options go in the "
                        "top-level storage: section (docs/configuration.md, storage)"
                    )
            if isinstance(data.get("warehouse"), Mapping):
                raise ValueError(
                    "warehouse: give one folder or URI (warehouse: s3://bucket/prefix); "
                    "its options go in the top-level storage: section"
                )
            storage = data.get("storage")
            if storage is not None and not isinstance(storage, Mapping):
                raise ValueError("storage: give a mapping of delta-rs storage options (key: value)")
            if isinstance(data.get("warehouse"), str):
                try:  # the warehouse's scheme is checked with them
                    options = check_storage_options(data["warehouse"], storage or {})
                except ConfigError as exc:
                    raise ValueError(exc.message) from None
                data = {**data, "storage": options}
                apply = data.get("apply")
                if provider_of(data["warehouse"]) != "local" and (
                    apply is None or (isinstance(apply, Mapping) and "parallel_tables" not in apply)
                ):  # on a store a table's apply waits on requests, not on the CPU
                    data = {**data, "apply": {**(apply or {}), "parallel_tables": 32}}
            checkpoint = data.get("checkpoint")
            if isinstance(checkpoint, str) and checkpoint_on_store(checkpoint):
                try:  # Spark's checkpoint on S3 takes the warehouse's options (S3A)
                    check_checkpoint_options(
                        checkpoint, str(data.get("warehouse")), data.get("storage") or {}
                    )
                except ConfigError as exc:
                    raise ValueError(exc.message) from None
        return data

    @field_validator("trigger", mode="before")
    @classmethod
    def _trigger_word(cls, v: Any) -> Any:
        if v == "available_now":
            return {"available_now": True}
        if isinstance(v, str):
            raise ValueError(
                f"{v!r} is not a trigger; write trigger: available_now, or "
                f"trigger: {{processing_time: {v!r}}} for a micro-batch every interval"
            )
        return v

    @field_validator("sources", mode="before")
    @classmethod
    def _some_sources(cls, v: Any) -> Any:
        if isinstance(v, list | tuple) and not v:
            raise ValueError("name at least one source (format and topics)")
        return v

    def subscription(self) -> dict[str, str]:
        """The Kafka source option that reads every source's topics."""

        return subscription((s.topics, s.topic_pattern) for s in self.sources)

    def source_named(self, name: str, what: str = "--source") -> SourceConfig:
        """The source called ``name``.

        Raises:
            ConfigError: no source is called so; the message names ``what`` and the
                configured sources.
        """
        for source in self.sources:
            if source.name == name:
                return source
        known = ", ".join(sorted(s.name for s in self.sources))
        raise ConfigError(f"{what} {name!r}: the configuration's sources are {known}")

    @property
    def group_id(self) -> str:
        """The consumer group cdcflow commits its applied offsets to (monitoring only)."""
        return self.kafka.group_id or f"cdcflow-{self.pipeline_id}"

    @model_validator(mode="after")
    def _one_writer_engine(self) -> PipelineConfig:
        if self.sink == "delta-spark" and provider_of(self.warehouse) != "local":
            raise ValueError(
                "sink: delta-spark writes only to a local (or mounted) warehouse: on an "
                "object store every table is written by delta-rs, whose commits are "
                "put-if-absent (Delta on Spark has no such log store on S3, delta-io/delta#3596); "
                "use sink: delta-rs (decision 65)"
            )
        return self

    @model_validator(mode="after")
    def _distinct_sources(self) -> PipelineConfig:
        names = [s.name for s in self.sources]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(
                    f"sources: two sources are called {name!r}; give each a distinct 'name'"
                )

        twice = topic_named_twice((s.name, s.topics) for s in self.sources)
        if twice is not None:
            raise ValueError(twice)
        return self


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel]:
    """The model whose keys are valid at ``loc`` (a pydantic error location)."""
    model: type[BaseModel] = PipelineConfig
    for part in loc:
        if isinstance(part, int) or part not in model.model_fields:
            continue
        pending = [model.model_fields[part].annotation]
        while pending:
            ann = pending.pop()
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = TableRule if ann is TableRules else ann
                break
            pending.extend(get_args(ann))
    return model


def _location(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the YAML reads: ``sources[0].options``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        where = _location(loc)
        if err["type"] == "extra_forbidden":
            valid = sorted(_model_at(loc[:-1]).model_fields)
            hint = did_you_mean(str(loc[-1]), valid)
            lines.append(f"{where}: unknown key; {hint}valid keys here: {valid}")
        elif err["type"] == "missing":
            lines.append(f"{where}: required key is missing")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: {msg}" if loc else msg)
    if len(lines) == 1:  # the common case: one line naming the key and the fix
        return lines[0]
    return f"invalid configuration ({len(lines)} problems):\n  " + "\n  ".join(lines)


def parse_config(data: Mapping[str, Any], base_dir: Path | None = None) -> PipelineConfig:
    """Validate a configuration mapping.

    Args:
        data: the parsed YAML; ``${env:NAME}``, ``${NAME}`` and ``${file:PATH}`` in its
            strings are resolved first (:func:`cdcflow.secrets.resolve_references`).
        base_dir: relative ``warehouse``/``checkpoint`` paths and ``${file:PATH}`` are
            taken from here.

    Raises:
        ConfigError: listing each bad key (one line each), with the valid keys or the
            fix; or one line for a reference that cannot be resolved.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(
            "the configuration must be a YAML mapping (key: value), see docs/configuration.md"
        )
    # a mapping in, the same mapping out, its strings resolved
    resolved: dict[str, Any] = resolve_references(dict(data), base_dir)
    if isinstance(resolved.get("tables"), list):
        resolved["tables"] = tuple(resolved["tables"])
    try:
        config = PipelineConfig.model_validate(resolved)
    except ValidationError as exc:
        # not chained: pydantic's own text repeats the input values, secrets included
        raise ConfigError(_explain(exc)) from None

    def _path(p: str) -> str:
        if "://" in p or base_dir is None or Path(p).is_absolute():
            return p
        return str((base_dir / p).resolve())

    return config.model_copy(
        update={"warehouse": _path(config.warehouse), "checkpoint": _path(config.checkpoint)}
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

"""The ``_cdcflow`` system tables: their names and Arrow schemas, in one place.

Every read and write of one goes through :class:`~cdcflow.sinks.warehouse.DeltaWarehouse`
(:meth:`~cdcflow.sinks.warehouse.DeltaWarehouse.system_path`,
:meth:`~cdcflow.sinks.warehouse.DeltaWarehouse.read_system`,
:meth:`~cdcflow.sinks.warehouse.DeltaWarehouse.append`), so the warehouse's storage options
and its error mapping (``StorageError``, :mod:`cdcflow.sinks.faults`) apply to them all.

Layout under the warehouse folder::

    <warehouse>/_cdcflow/changelog/            every decoded event, with its origin
    <warehouse>/_cdcflow/dead_letters/         raw bytes, topic/partition/offset, code
    <warehouse>/_cdcflow/replays/              which dead letters `dead-letters replay` took
    <warehouse>/_cdcflow/tombstones/           deleted keys (and truncates) with sequence
    <warehouse>/_cdcflow/offsets/              per apply: the offset ranges it is about to write
    <warehouse>/_cdcflow/batches/              per apply and partition: offsets and counts
    <warehouse>/_cdcflow/decoder_state/        what decoders learned (Qlik metadata), per source
    <warehouse>/_cdcflow/progress/             per batch and source: last sequence, source time, lag
    <warehouse>/_cdcflow/schema_changes/       every schema change seen, applied or not, and stops
    <warehouse>/_cdcflow/pending_transactions/ events of open transactions (consistent mode)
    <warehouse>/_cdcflow/history_log/<table>/  every change applied to a history table
    <warehouse>/_cdcflow/leases/<pipeline>/    which process may write the pipeline's tables
"""

from __future__ import annotations

import pyarrow as pa

from cdcflow.event_schema import EVENT_SCHEMA

__all__ = [
    "BATCHES",
    "BATCHES_SCHEMA",
    "CHANGELOG",
    "CHANGELOG_COLUMNS",
    "DEAD_LETTERS",
    "DEAD_LETTER_SCHEMA",
    "DECODER_STATE",
    "DECODER_STATE_SCHEMA",
    "HELD_SCHEMA",
    "HISTORY_LOG",
    "HISTORY_LOG_SCHEMA",
    "LEASES",
    "OFFSETS",
    "OFFSETS_SCHEMA",
    "PENDING_SCHEMA",
    "PENDING_TRANSACTIONS",
    "PROGRESS",
    "PROGRESS_SCHEMA",
    "REPAIRS",
    "REPAIRS_SCHEMA",
    "REPLAYS",
    "REPLAYS_SCHEMA",
    "SCHEMA_CHANGES",
    "SCHEMA_CHANGES_SCHEMA",
    "SYSTEM_FOLDER",
    "TOMBSTONES",
    "TOMBSTONE_SCHEMA",
    "VERIFICATIONS",
    "VERIFICATIONS_SCHEMA",
    "VERIFY_PROGRESS",
    "VERIFY_PROGRESS_SCHEMA",
]

#: The folder of the system tables, under the warehouse root.
SYSTEM_FOLDER = "_cdcflow"

# table names (``DeltaWarehouse.system_path(name)``)
CHANGELOG = "changelog"
DEAD_LETTERS = "dead_letters"
TOMBSTONES = "tombstones"
OFFSETS = "offsets"
BATCHES = "batches"
DECODER_STATE = "decoder_state"
PROGRESS = "progress"
SCHEMA_CHANGES = "schema_changes"
PENDING_TRANSACTIONS = "pending_transactions"
REPLAYS = "replays"
#: ``cdcflow verify``'s outcomes, one row per table and run (:mod:`cdcflow.commands.verify`)
VERIFICATIONS = "verifications"
#: ``cdcflow verify --repair``'s intents and outcomes, one row per key and state
REPAIRS = "repairs"
#: ``cdcflow verify``'s tables of a run not yet recorded, for ``--resume``
VERIFY_PROGRESS = "verify_progress"
#: folder of the history tables' change logs, one table per history table under it
HISTORY_LOG = "history_log"
#: folder of the pipelines' leases (:mod:`cdcflow.sinks.lease`, a protocol of its own on
#: table properties, with the same storage options and error mapping)
LEASES = "leases"

#: Event columns kept in the changelog (the rest of EVENT_SCHEMA is dead-letter only);
#: each row also carries its ``batch_id`` and ``committed_at_ms`` (wall clock of the
#: commit, which retention counts from: :mod:`cdcflow.sinks.retention`).
CHANGELOG_COLUMNS = [
    "op",
    "format",
    "database",
    "schema",
    "table",
    "key",
    "before",
    "after",
    "columns",
    "seq",
    "ts_ms",
    "txn_id",
    "txn_order",
    "txn_last",
    "ddl",
    "meta",
    "topic",
    "partition",
    "offset",
    "event_index",
]

DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("format", pa.string()),
        ("stage", pa.string()),  # decode | apply
        ("code", pa.string()),
        ("message", pa.string()),
        ("target_table", pa.string()),
        ("raw_key", pa.binary()),
        ("raw_value", pa.binary()),  # record bytes (decode) or the event's JSON (apply)
        ("committed_at_ms", pa.int64()),  # wall clock of the commit: retention counts from it
    ]
)

BATCHES_SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("records", pa.int64()),
        ("events", pa.int64()),
        ("joined", pa.int64()),  # records whose change another record's event carries
        ("skipped", pa.int64()),
        ("dead_letters", pa.int64()),
        ("committed_at_ms", pa.int64()),
        ("source", pa.string()),  # <pipeline>.<source> (null in warehouses before 0.3)
        ("delivery_id", pa.int64()),  # Spark's micro-batch id that delivered the records
    ]
)

#: The apply ledger ``_cdcflow/offsets``: what each apply is about to write, first.
OFFSETS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # <pipeline>.<source>
        ("apply_id", pa.int64()),  # the warehouse's own batch number (batch_id elsewhere)
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("first_offset", pa.int64()),  # first record of the apply in this partition
        ("last_offset", pa.int64()),  # last record of the apply in this partition
        ("delivery_id", pa.int64()),  # Spark's micro-batch id (null: not from Spark)
        ("started_at_ms", pa.int64()),
    ]
)

#: ``_cdcflow/replays``: per dead letter a replay took, its intent (``outcome`` null,
#: written before the apply) and then its outcome (:mod:`cdcflow.commands.replay`). A dead letter
#: is named by its row: topic, partition, offset, stage and commit time.
REPLAYS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # <pipeline>.<source>
        ("generation", pa.int64()),  # the replay's number; its apply is <source>.replay.<n>
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("stage", pa.string()),
        ("letter_committed_at_ms", pa.int64()),
        ("code", pa.string()),  # the letter's code
        ("outcome", pa.string()),  # null: taken | applied | dead_letter | gone
        ("recorded_at_ms", pa.int64()),
    ]
)

#: ``_cdcflow/verify_progress``: one row per table whose first round a ``cdcflow verify`` run
#: finished, until the run records its outcome in ``_cdcflow/verifications`` (then its rows
#: are deleted): what ``--resume`` goes on from (:mod:`cdcflow.commands.verify`).
VERIFY_PROGRESS_SCHEMA = pa.schema(
    [
        ("pipeline", pa.string()),
        ("started_at_ms", pa.int64()),  # the run's start: its identity
        ("mode", pa.string()),
        ("target_table", pa.string()),
        ("source_table", pa.string()),
        ("saved_at_ms", pa.int64()),
        ("state", pa.string()),  # JSON: the table's first round (cdcflow.verify.verifier)
    ]
)

#: ``_cdcflow/repairs``: per key ``cdcflow verify --repair`` wrote, its intent (``outcome``
#: null, written before the apply, with the change event itself so that a killed repair
#: is finished with exactly that event) and then its outcome (:mod:`cdcflow.verify.repair`).
REPAIRS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # <pipeline>.<source>
        ("generation", pa.int64()),  # the repair's number; its apply is <source>.repair.<n>
        ("verification_started_at_ms", pa.int64()),  # the verify run that found the key
        ("target_table", pa.string()),
        ("source_table", pa.string()),
        ("key", pa.string()),  # JSON object, the key as verify reports it
        ("found", pa.string()),  # missing | extra | different
        ("action", pa.string()),  # upsert | delete
        ("seq", pa.string()),  # the repair's sequence (seq_key form)
        ("event", pa.string()),  # JSON: the change event applied (EVENT_SCHEMA fields)
        ("outcome", pa.string()),  # null: taken | repaired | in_flight | not_repaired
        ("recorded_at_ms", pa.int64()),
    ]
)

PROGRESS_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # <pipeline>.<source>
        ("batch_id", pa.int64()),
        ("last_seq", pa.string()),  # highest source sequence seen (seq_key form)
        ("last_source_ts_ms", pa.int64()),  # newest source time seen, heartbeats included
        ("events", pa.int64()),  # decoded events in the batch
        ("rows_changed", pa.int64()),  # upserts + deletes committed to mirrors
        ("committed_at_ms", pa.int64()),
        ("lag_ms", pa.int64()),  # committed_at_ms - last_source_ts_ms
        # records between the batch's end offsets and the log ends Spark last reported
        # (its listener's latestOffset: at most one micro-batch old); NULL: not known
        ("records_behind", pa.int64()),
        # transaction-consistent apply only (NULL otherwise):
        ("txn_complete", pa.int64()),  # transactions completed in the batch
        ("txn_released_open", pa.int64()),  # released incomplete by max_wait_ms/max_events
        ("txn_held", pa.int64()),  # open transactions waiting for the next batch
        ("txn_max_wait_ms", pa.int64()),  # longest wait among the released transactions
    ]
)

DECODER_STATE_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # the warehouse view's pipeline id (<pipeline>.<source>)
        ("batch_id", pa.int64()),
        ("position", pa.int64()),  # order inside the batch
        ("item", pa.string()),  # JSON, as Decoder.state_items gave it
    ]
)

TOMBSTONE_SCHEMA = pa.schema(
    [
        ("target_table", pa.string()),
        ("key", pa.string()),  # null: a truncate watermark for the whole table
        ("seq", pa.string()),
        ("batch_id", pa.int64()),
        ("deleted_at_ms", pa.int64()),  # commit time: tombstone retention counts from here
    ]
)

SCHEMA_CHANGES_SCHEMA = pa.schema(
    [
        ("target_table", pa.string()),
        ("batch_id", pa.int64()),
        ("change", pa.string()),  # add | widen | drop | restore | rename | stop | resume
        ("column", pa.string()),
        ("old_type", pa.string()),
        ("new_type", pa.string()),
        ("policy", pa.string()),  # evolve | ignore | fail
        ("applied", pa.bool_()),  # false: ignored by the policy, or the table stopped
        ("message", pa.string()),
        ("seq", pa.string()),  # the first event that carried the change
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("recorded_at_ms", pa.int64()),
    ]
)

#: Held rows: the events plus when (wall clock, ms) and in which batch each was first held.
HELD_SCHEMA = pa.schema(
    [*EVENT_SCHEMA, pa.field("held_since_ms", pa.int64()), pa.field("held_batch_id", pa.int64())]
)

#: ``_cdcflow/pending_transactions``: one snapshot of held rows per (source, batch).
PENDING_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string()),
        pa.field("batch_id", pa.int64()),  # the batch that wrote the snapshot
        pa.field("previous_batch_id", pa.int64()),  # the snapshot it replaced (null: none)
        pa.field("split_at_ms", pa.int64()),  # now_ms of that batch's split (its clock)
        *HELD_SCHEMA,
    ]
)

#: ``_cdcflow/history_log/<table>``: one row per applied change of one history table.
HISTORY_LOG_SCHEMA = pa.schema(
    [
        ("key", pa.string()),  # canonical key JSON (typed values); null for a truncate
        ("op", pa.string()),  # upsert | delete | truncate
        ("seq", pa.string()),
        ("image", pa.string()),  # after image JSON (upserts)
        ("partial", pa.bool_()),
        ("ts_ms", pa.int64()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("event_index", pa.int32()),
        ("sub", pa.int8()),  # 0: the old key's delete of a key move, 1 otherwise
        ("batch_id", pa.int64()),
    ]
)

#: ``_cdcflow/verifications``: per table and ``cdcflow verify`` run, what it found
VERIFICATIONS_SCHEMA = pa.schema(
    [
        ("pipeline", pa.string()),
        ("started_at_ms", pa.int64()),  # the run's start: one run, one value
        ("target_table", pa.string()),
        ("source_table", pa.string()),
        ("source_db", pa.string()),  # the URL without its password
        ("mode", pa.string()),
        ("position", pa.string()),  # the first snapshot's source position
        ("mirror_version", pa.int64()),
        ("equal", pa.bool_()),
        ("rows_source", pa.int64()),
        ("rows_mirror", pa.int64()),
        ("missing", pa.int64()),
        ("extra", pa.int64()),
        ("different", pa.int64()),
        ("in_flight", pa.int64()),
        ("caught_up", pa.bool_()),
        ("refused", pa.string()),
        ("seconds", pa.float64()),
        ("details", pa.string()),  # JSON: every differing key (TableResult)
    ]
)

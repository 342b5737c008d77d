"""One error hierarchy with stable codes.

Every error has a ``code`` (stable, upper snake case, safe to alert on) and a message
that says how to fix the cause. Errors raised on Spark executors must pickle, so every
class keeps its constructor arguments in ``args``.

Terminal vs transient decides what happens to a record: a :class:`DecodeError` is
terminal for that record (it becomes a dead letter and the stream goes on); a
:class:`SourceError` or a Delta I/O failure stops the micro-batch so it is retried.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import StrEnum

__all__ = [
    "ApplyError",
    "CdcflowError",
    "Code",
    "ConfigError",
    "DecodeError",
    "LeaseHeld",
    "LeaseLost",
    "SkipReason",
    "SourceError",
    "StorageError",
    "did_you_mean",
]


class Code(StrEnum):
    """Stable dead-letter and error codes (``docs/semantics.md``, "Codes", lists them all;
    ``tests/test_codes.py`` holds the two in step). A member is its own name as a string,
    so ``Code.BAD_JSON == "BAD_JSON"`` and it lands in Arrow and Delta as that text."""

    BAD_JSON = "BAD_JSON"  # the value is not JSON (or not UTF-8)
    BAD_AVRO = "BAD_AVRO"  # the value is not a record of the expected Avro schema
    UNKNOWN_SCHEMA_ID = "UNKNOWN_SCHEMA_ID"  # a schema id the schema registry does not know
    NOT_AN_OBJECT = "NOT_AN_OBJECT"  # JSON, but not the envelope object the format defines
    MISSING_FIELD = "MISSING_FIELD"  # a field the format requires is absent
    BAD_FIELD = "BAD_FIELD"  # a field has the wrong JSON type or an unparsable value
    UNKNOWN_OP = "UNKNOWN_OP"  # an operation code the format does not define
    MISSING_KEY = "MISSING_KEY"  # a row change whose key columns cannot be found
    BAD_VALUE = "BAD_VALUE"  # a column value that does not fit its declared type
    UNKNOWN_FORMAT = "UNKNOWN_FORMAT"  # --format auto: the record fits no candidate format
    AMBIGUOUS_FORMAT = "AMBIGUOUS_FORMAT"  # --format auto: the record fits several candidates
    DATA_LOSS = "DATA_LOSS"  # Kafka records were deleted before they were read
    SOURCE_UNAVAILABLE = "SOURCE_UNAVAILABLE"  # brokers unreachable for kafka.outage_budget_s
    TYPE_CONFLICT = "TYPE_CONFLICT"  # a value's type cannot be stored in its table column
    TOO_LARGE = "TOO_LARGE"  # a record over the configured size limit
    TOO_MANY_COLUMNS = "TOO_MANY_COLUMNS"  # an image or table declaration over max_columns
    UNDECLARED_COLUMN = "UNDECLARED_COLUMN"  # a row image column its message's schema lacks
    SCHEMA_CHANGE = "SCHEMA_CHANGE"  # a schema change the table's policy does not apply
    TABLE_STOPPED = "TABLE_STOPPED"  # the target table was stopped by an earlier change
    MISSING_SEQ = "MISSING_SEQ"  # a history (SCD type 2) table needs a source sequence
    SHARD_KEY_COLLISION = (
        "SHARD_KEY_COLLISION"  # a key another source table of a merged target holds
    )
    EXPRESSION_FAILED = (
        "EXPRESSION_FAILED"  # a computed column, row filter or type override failed for the row
    )
    MISSING_OLD_ROW = (
        "MISSING_OLD_ROW"  # a partial image of a row the mirror does not hold: columns unknown
    )
    INCOMPLETE_APPLY = "INCOMPLETE_APPLY"  # a micro-batch holds part of an interrupted apply
    PIPELINE_RUNNING = "PIPELINE_RUNNING"  # another run of the pipeline holds its lease
    LEASE_LOST = "LEASE_LOST"  # a running pipeline's lease was taken over; it stops
    TABLE_FAULT = "TABLE_FAULT"  # the target table could not be read or written; it stops
    STORAGE_ERROR = "STORAGE_ERROR"  # the warehouse cannot be written (disk full); run stops
    DEAD_LETTER_LIMIT = "DEAD_LETTER_LIMIT"  # a micro-batch over apply.dead_letter_limit; run stops
    BAD_CONFIG = "BAD_CONFIG"  # a configuration value is missing or wrong (exit 2)
    SOURCE_DB_ERROR = "SOURCE_DB_ERROR"  # verify: the source database failed a statement
    SOURCE_ERROR = "SOURCE_ERROR"  # the Kafka source cannot go on (data loss, outage)
    APPLY_ERROR = "APPLY_ERROR"  # a change cannot be applied to its Delta table
    CDCFLOW_ERROR = "CDCFLOW_ERROR"  # any other cdcflow error


class SkipReason(StrEnum):
    """Why a record was skipped on purpose: accounted for, never applied, never a dead letter
    (``docs/semantics.md``, "Codes")."""

    TOMBSTONE = "TOMBSTONE"  # a Kafka tombstone (null value) that follows a delete
    NO_EVENTS = "NO_EVENTS"  # a well-formed record that carries no row change
    DTS_NOOP = "DTS_NOOP"  # a DTS Avro NOOP operation
    # events kept in the changelog that change no table's rows, by their op
    DDL = "DDL"  # a schema change statement (its effect is the table's schema policy)
    HEARTBEAT = "HEARTBEAT"  # a liveness record of the replication tool
    BEGIN = "BEGIN"  # a transaction start marker
    COMMIT = "COMMIT"  # a transaction end marker
    MESSAGE = "MESSAGE"  # a logical-decoding message (Debezium op m)
    TABLE_EXCLUDED = "TABLE_EXCLUDED"  # a change of a table the source's include/exclude leaves out
    ROW_FILTERED = "ROW_FILTERED"  # a change its table's filter is not true for
    JOINED = "JOINED"  # not a skip: an update half whose change its partner's event carries


class CdcflowError(Exception):
    """Base of all cdcflow errors.

    Attributes:
        code: stable error code.
        message: what went wrong and how to fix it.
    """

    code: str = Code.CDCFLOW_ERROR

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message, code)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class DecodeError(CdcflowError):
    """A record cannot be decoded; it becomes a dead letter with ``code``."""

    code = Code.BAD_FIELD


class ConfigError(CdcflowError):
    """A configuration value is missing or wrong; the message names the key and the fix."""

    code = Code.BAD_CONFIG


class SourceError(CdcflowError):
    """The Kafka source cannot go on (e.g. data lost to retention, or the brokers stayed
    unreachable longer than the outage budget: ``SOURCE_UNAVAILABLE``). Not a dead letter.

    Attributes:
        refused: ``"authentication"`` or ``"authorization"`` when the brokers refused the
            client's credentials or access, else ``None``.
    """

    code = Code.SOURCE_ERROR
    refused: str | None = None


class ApplyError(CdcflowError):
    """A change cannot be applied to its Delta table."""

    code = Code.APPLY_ERROR


class DeadLetterLimit(CdcflowError):
    """A source's micro-batch had a larger share of dead letters than
    ``apply.dead_letter_limit``: the run stops after committing it (its dead letters are in
    ``_cdcflow/dead_letters``), as Kafka Connect's ``errors.tolerance=none`` does.

    Args:
        source: the source's name.
        batch_id: Spark's micro-batch id.
        dead_letters: by code, in the micro-batch.
        records: records of the source in the micro-batch.
        limit: the share allowed (0: none).
    """

    code = Code.DEAD_LETTER_LIMIT

    def __init__(
        self, source: str, batch_id: int, dead_letters: dict[str, int], records: int, limit: float
    ) -> None:
        dead = sum(dead_letters.values())
        top = max(dead_letters, key=dead_letters.__getitem__) if dead_letters else "?"
        super().__init__(
            f"source {source}: {dead:,} of {records:,} records of micro-batch {batch_id} are "
            f"dead letters (most {top}), over apply.dead_letter_limit {limit:g}. They are "
            f"committed to _cdcflow/dead_letters; see them with `cdcflow dead-letters show "
            f"CONFIG --source {source}`. Fix the source's format or options (or raise the "
            "limit), then run again"
        )
        self.source = source


class StorageError(CdcflowError):
    """A Delta table of the warehouse cannot be read or written: disk full, permission
    denied, a damaged ``_delta_log``. One line naming the table, the path, the OS (or
    Delta) error and the fix.

    Attributes:
        path: the table's folder or URI.
        target: the mirror's name, or ``None`` for a ``_cdcflow`` system table.
        kind: ``full`` | ``read_only`` | ``permission`` | ``damaged`` | ``other`` |
            ``conditional_put`` (the store overwrote a commit: :func:`cdcflow.sinks.storage.Storage.probe`).
        cause: the first line of the underlying error.
    """

    code = Code.STORAGE_ERROR

    def __init__(self, message: str, path: str, target: str | None, kind: str, cause: str) -> None:
        super().__init__(message, Code.STORAGE_ERROR)
        self.path = path
        self.target = target
        self.kind = kind
        self.cause = cause


class LeaseHeld(CdcflowError):
    """Another run of the same pipeline holds its lease on the warehouse (one-line message
    naming the holder: host, pid, since when, and what to do)."""

    code = Code.PIPELINE_RUNNING


class LeaseLost(LeaseHeld):
    """The lease of a running pipeline was taken over (or could not be renewed within its
    TTL); the run must stop writing."""

    code = Code.LEASE_LOST


def did_you_mean(names: str | Iterable[str], valid: Iterable[str]) -> str:
    """The hint of an error about unknown names: ``"did you mean 'x'? "`` (trailing space
    included, to go before the list of valid names), or ``""`` when no valid name is close.

    Args:
        names: the unknown name, or several; with more than one, each close match says
            which name it is for (``"did you mean 'x' for 'y', 'a' for 'b'? "``).
        valid: the names that would be accepted (their order does not matter).

    Close means :func:`difflib.get_close_matches` with its default cutoff (0.6), the
    nearest one per unknown name.
    """
    unknown = [names] if isinstance(names, str) else list(names)
    choices = sorted(valid)
    near = {u: m[0] for u in unknown if (m := difflib.get_close_matches(u, choices, n=1))}
    meant = [f"{m!r}" if len(unknown) == 1 else f"{m!r} for {u!r}" for u, m in near.items()]
    return f"did you mean {', '.join(meant)}? " if meant else ""

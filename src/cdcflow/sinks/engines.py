"""Who computes a mirror's merge: the merge engines (``apply.merge_engine``, ``sink``).

A :class:`MergeEngine` does the two data-moving steps of a mirror's apply
(:meth:`cdcflow.sinks.mirror.Mirrors.apply`), each in one commit that carries the apply's
:class:`~cdcflow.sinks.warehouse.CommitContext`: the merge of a batch's checked merge
source (:meth:`MergeEngine.merge`) and the removal of the rows stored before a truncate
(:meth:`MergeEngine.truncate`). Everything else of the apply (guards, value checks,
schema, tombstones) is the mirror's and the same for every engine.

* ``arrow`` (:class:`ArrowMerge`, the default): the merge computed in Arrow
  (:mod:`cdcflow.sinks.arrow_merge`), only the files holding the batch's keys rewritten;
  a partitioned mirror goes through delta-rs's MERGE (decision 50);
* ``delta-rs`` (:class:`DeltaRsMerge`): delta-rs's MERGE, except for mirrors of at least
  :data:`REWRITE_MIN_COLUMNS` data columns (its plan costs O(columns²), decision 22);
* ``delta-spark``: Delta Lake's ``MERGE INTO`` on Spark
  (:class:`cdcflow.sinks.delta_spark.SparkMerge`).

Change data feed (``change_feed`` per table, docs/decisions.md 58): whatever the engine,
into a table with ``delta.enableChangeDataFeed`` a batch of new keys alone is appended in
Arrow (:func:`~cdcflow.sinks.arrow_merge.insert_actions`, read as inserts) and every
other batch goes through delta-rs's MERGE, whose commit carries the ``cdc`` files of the
rows it changed, with only the source rows that change something
(:func:`effective_source`).

Source documents: Delta transaction protocol ("Change Data Files"); docs/decisions.md
22, 44, 50, 58.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import RemoveAction
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt

from cdcflow.errors import ApplyError, Code
from cdcflow.sinks.arrow_merge import (
    TARGET_FILE_ROWS,
    effective_rows,
    insert_actions,
    rewrite_actions,
)
from cdcflow.sinks.merge import (
    DELETE_FLAG,
    SEQ_COLUMN,
    SOFT_DELETE_COLUMN,
    TS_COLUMN,
    MergeSpec,
    merge_condition,
    merge_expressions,
    quote_column,
    table_feeds_changes,
)
from cdcflow.sinks.refresh import commit_hooks

if TYPE_CHECKING:
    from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse

__all__ = [
    "MERGE_ENGINES",
    "REWRITE_MIN_COLUMNS",
    "ArrowMerge",
    "DeltaRsMerge",
    "MergeEngine",
    "delta_rs_merge",
    "delta_rs_truncate",
    "effective_source",
    "merge_engine",
]

#: With ``merge_engine="delta-rs"``, from this many data columns a mirror's batch is still
#: merged in Arrow (:func:`rewrite_merge`): delta-rs's MERGE builds a DataFusion plan in
#: O(columns²) (docs/decisions.md 22).
REWRITE_MIN_COLUMNS = 200

#: The engines named by ``apply.merge_engine``: ``arrow`` (:mod:`cdcflow.sinks.arrow_merge`,
#: the default: only the files holding the batch's keys are rewritten) or ``delta-rs``
#: (its MERGE; docs/decisions.md 44).
MERGE_ENGINES = ("arrow", "delta-rs")

#: merges computed again when a concurrent rewrite removed a file they read
_MERGE_ATTEMPTS = 3

log = logging.getLogger(__name__)

T = TypeVar("T")


class MergeEngine(Protocol):
    """Computes and commits a mirror's merge and truncate (module docstring)."""

    #: the engine's name (:data:`MERGE_ENGINES`, or ``delta-spark``)
    name: str

    def merge(
        self,
        warehouse: DeltaWarehouse,
        table: DeltaTable,
        source: pa.Table,
        spec: MergeSpec,
        commit: CommitContext,
    ) -> dict[str, Any]:
        """Merge the checked merge source (:meth:`cdcflow.sinks.mirror.Mirrors.apply`)
        into the mirror ``table`` in one commit carrying ``commit`` (an empty one when
        nothing changed).

        Returns:
            The merge's metrics under delta-rs's names, plus ``merge_s`` (seconds).
        """
        ...

    def truncate(
        self,
        warehouse: DeltaWarehouse,
        table: DeltaTable,
        truncate_seq: str,
        commit: CommitContext | None,
        soft_delete: bool,
    ) -> None:
        """Remove (or, with ``soft_delete``, flag) the rows stored before a truncate at
        ``truncate_seq``; the commit carries ``commit`` when given (the truncate is the
        batch's last change to the table), and records it alone when no row matched."""
        ...


class ArrowMerge:
    """The merge computed in Arrow and committed as file actions (module docstring).

    Args:
        target_file_rows: most rows per data file the Arrow merge writes.
    """

    name = "arrow"
    #: merge in Arrow whenever the table allows (unpartitioned); else only wide mirrors
    prefer_arrow = True

    def __init__(self, target_file_rows: int = TARGET_FILE_ROWS) -> None:
        self.target_file_rows = target_file_rows

    def merge(
        self,
        warehouse: DeltaWarehouse,
        table: DeltaTable,
        source: pa.Table,
        spec: MergeSpec,
        commit: CommitContext,
    ) -> dict[str, Any]:
        return _delta_merge(self, warehouse, table, source, spec, commit, self.prefer_arrow)

    def truncate(
        self,
        warehouse: DeltaWarehouse,
        table: DeltaTable,
        truncate_seq: str,
        commit: CommitContext | None,
        soft_delete: bool,
    ) -> None:
        delta_rs_truncate(warehouse, table, truncate_seq, commit, soft_delete)


class DeltaRsMerge(ArrowMerge):
    """delta-rs's MERGE (the Arrow merge for wide mirrors only; module docstring).

    Args:
        target_file_rows: most rows per data file an Arrow merge writes.
    """

    name = "delta-rs"
    prefer_arrow = False


def merge_engine(name: str, target_file_rows: int = TARGET_FILE_ROWS) -> MergeEngine:
    """The engine ``name`` of :data:`MERGE_ENGINES`.

    Raises:
        ValueError: another name.
    """
    if name not in MERGE_ENGINES:
        raise ValueError(f"merge_engine must be one of {MERGE_ENGINES}, not {name!r}")
    engine = ArrowMerge if name == "arrow" else DeltaRsMerge
    return engine(target_file_rows)


def _delta_merge(
    engine: ArrowMerge,
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    commit: CommitContext,
    prefer_arrow: bool,
) -> dict[str, Any]:
    """Which way the delta-rs sink merges a batch: the feed's, the Arrow rewrite or
    delta-rs's MERGE (module docstring)."""
    partitioned = bool(table.metadata().partition_columns)
    rows = engine.target_file_rows
    if table_feeds_changes(table):
        # the feed: new keys alone are an append (read as inserts); any other batch
        # is delta-rs's MERGE, which writes the cdc files (docs/decisions.md 58)
        if not partitioned:
            appended = _append_new_keys(warehouse, table, source, spec, commit, rows)
            if appended is not None:
                return appended
        return delta_rs_merge(warehouse, table, source, spec, commit)
    wide = len(spec.columns) >= REWRITE_MIN_COLUMNS
    if (prefer_arrow or wide) and not partitioned:
        return _rewrite_merge(warehouse, table, source, spec, commit, rows)
    # a partitioned mirror: delta-rs writes each row into its partition's folder, and
    # prunes partitions when the key holds the partition columns (decision 50)
    return delta_rs_merge(warehouse, table, source, spec, commit)


def _landed(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    commit: CommitContext | None,
    make: Callable[[], T],
) -> tuple[T | None, bool]:
    """``make()``, a delta-rs operation committing ``commit``; ``(result, True)``, or
    ``(None, False)`` when its commit failed but the store holds ``commit`` (the
    response to it was lost, decision 66: not to be committed again, nor marked).

    Raises:
        CommitFailedError: the commit failed and the store does not hold it.
    """
    try:
        return make(), True
    except CommitFailedError:
        if commit is None or not warehouse.holds(table, commit):
            raise
        log.warning(
            "table %s: the store holds apply %d although its commit failed (a lost "
            "response); not applied again",
            table.table_uri,
            commit.version,
        )
        return None, False


def delta_rs_truncate(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    truncate_seq: str,
    commit: CommitContext | None,
    soft_delete: bool,
) -> None:
    """:meth:`MergeEngine.truncate` by delta-rs's DELETE (or UPDATE with ``soft_delete``)."""
    predicate = (
        f"{quote_column(SEQ_COLUMN)} IS NULL OR {quote_column(SEQ_COLUMN)} < '{truncate_seq}'"
    )
    props = warehouse.commit_properties(commit) if commit is not None else None
    before = table.version()

    def truncate() -> object:
        if soft_delete:
            return table.update(
                updates={
                    quote_column(SOFT_DELETE_COLUMN): "true",
                    quote_column(SEQ_COLUMN): f"'{truncate_seq}'",
                },
                predicate=f"({predicate}) AND NOT {quote_column(SOFT_DELETE_COLUMN)}",
                commit_properties=props,
                post_commithook_properties=commit_hooks(table),
            )
        return table.delete(
            predicate, commit_properties=props, post_commithook_properties=commit_hooks(table)
        )

    _, made = _landed(warehouse, table, commit, truncate)
    if made and commit is not None and table.version() == before:
        # delta-rs commits nothing when no row matched: the batch is recorded alone
        warehouse.mark(table, commit)


def delta_rs_merge(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    commit: CommitContext,
) -> dict[str, Any]:
    """delta-rs's MERGE of the checked merge source, in one commit carrying ``commit``
    (an empty one when nothing changed); its metrics, plus ``merge_s``.

    Into a table with a change data feed only the source rows that change something
    are merged (:func:`effective_source`).
    """
    started = time.perf_counter()
    unchanged_rows = 0
    if table_feeds_changes(table):
        source, unchanged_rows = effective_source(warehouse, table, source, spec, commit)
        if not source.num_rows:
            took = round(time.perf_counter() - started, 4)
            return {"num_source_rows_unchanged": unchanged_rows, "merge_s": took}
    partitions = table.metadata().partition_columns
    on = merge_condition(spec, source, partitions, "IS NOT DISTINCT FROM")
    newer, updates, inserts = merge_expressions(source, spec.columns, spec.soft_delete)
    updates = {quote_column(c): v for c, v in updates.items()}
    inserts = {quote_column(c): v for c, v in inserts.items()}
    before = table.version()
    merger = table.merge(
        source,
        predicate=on,
        source_alias="s",
        target_alias="t",
        commit_properties=warehouse.commit_properties(commit),
        post_commithook_properties=commit_hooks(table),
    )
    is_delete = f"s.{quote_column(DELETE_FLAG)} AND {newer}"
    if spec.soft_delete:
        flag = quote_column(SOFT_DELETE_COLUMN)
        merger = merger.when_matched_update(
            updates={
                flag: "true",
                quote_column(SEQ_COLUMN): f"s.{quote_column(SEQ_COLUMN)}",
                quote_column(TS_COLUMN): f"s.{quote_column(TS_COLUMN)}",
            },
            predicate=is_delete,
        )
    else:
        merger = merger.when_matched_delete(predicate=is_delete)
    merger = merger.when_matched_update(
        updates=updates, predicate=f"NOT s.{quote_column(DELETE_FLAG)} AND {newer}"
    ).when_not_matched_insert(updates=inserts, predicate=f"NOT s.{quote_column(DELETE_FLAG)}")
    executed, made = _landed(warehouse, table, commit, merger.execute)
    metrics: dict[str, Any] = dict(executed or {})
    if made and table.version() == before:
        # delta-rs commits nothing when no row changed: the batch is recorded alone
        warehouse.mark(table, commit)
    if unchanged_rows:
        metrics["num_source_rows_unchanged"] = unchanged_rows
    metrics["merge_s"] = round(time.perf_counter() - started, 4)
    return metrics


def effective_source(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    commit: CommitContext,
) -> tuple[pa.Table, int]:
    """The source rows of a merge into a table with a change data feed that change
    something (:func:`~cdcflow.sinks.arrow_merge.effective_rows` says what and why),
    and how many were left out; when none is left the batch is recorded by an empty
    commit carrying ``commit``, so the caller merges nothing."""
    effective = effective_rows(table, source, spec, warehouse.storage_options)
    left_out = int((~effective).sum())
    if left_out:
        source = source.filter(pa.array(effective))
    if not source.num_rows:
        warehouse.mark(table, commit)
    return source, left_out


def _append_new_keys(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    commit: CommitContext,
    target_file_rows: int,
) -> dict[str, Any] | None:
    """The merge of a batch whose keys no stored file can hold, as a blind append of
    Arrow-written files (:func:`~cdcflow.sinks.arrow_merge.insert_actions`): a commit
    of ``add`` actions alone, which change data feed readers read as inserts (Delta
    protocol, "Change Data Files"); one carrying ``commit``.

    Returns:
        The merge metrics (delta-rs's names, plus ``merge_s``), or ``None`` when a
        stored file may hold one of the keys (the caller merges with delta-rs).
    """
    started = time.perf_counter()
    planned = insert_actions(table, source, spec, warehouse.storage_options, target_file_rows)
    if planned is None:
        return None
    adds, metrics = planned
    if adds:
        on_version = table.version()
        _, made = _landed(
            warehouse,
            table,
            commit,
            lambda: table.create_write_transaction(
                list(adds),
                "append",
                table.schema(),
                commit_properties=warehouse.commit_properties(commit),
                post_commithook_properties=commit_hooks(table),
            ),
        )
        if made:
            warehouse.made(table.table_uri, on_version, commit)
    else:  # deletes of keys the table never held
        warehouse.mark(table, commit)
    metrics["merge_s"] = round(time.perf_counter() - started, 4)
    return metrics


class _RewriteRaced(Exception):
    """A rewrite's commit lost the race to a concurrent commit (computed again)."""


def _rewrite_merge(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    commit: CommitContext,
    target_file_rows: int,
) -> dict[str, Any]:
    """The merge of :func:`delta_rs_merge`, computed in Arrow
    (:func:`~cdcflow.sinks.arrow_merge.rewrite_actions`) and committed as file actions in
    one commit carrying ``commit`` (an empty one when nothing changes); computed again,
    up to :data:`_MERGE_ATTEMPTS` times in all, when a concurrent commit landed first.

    Returns:
        Merge metrics named as delta-rs names them, plus ``merge_s`` (seconds).

    Raises:
        ApplyError: ``TABLE_FAULT`` when every attempt found its files rewritten.
    """
    started = time.perf_counter()
    retrying = Retrying(
        stop=stop_after_attempt(_MERGE_ATTEMPTS),
        retry=retry_if_exception_type(_RewriteRaced),
        before_sleep=lambda state: log.info(
            "table %s: committed to meanwhile; merging again", table.table_uri
        ),
    )
    try:
        for attempt in retrying:
            with attempt:
                number = attempt.retry_state.attempt_number
                if number > 1:
                    table.update_incremental()
                metrics, committed = _rewrite_once(
                    warehouse, table, source, spec, commit, target_file_rows
                )
                if committed and number > 1:
                    metrics["merge_attempts"] = number
    except RetryError as exc:
        raise ApplyError(
            f"the merge into {table.table_uri} found its files rewritten by another "
            f"writer {_MERGE_ATTEMPTS} times; cdcflow maintains its mirrors itself "
            "(stop other OPTIMIZE jobs on them)",
            Code.TABLE_FAULT,
        ) from exc.last_attempt.exception()
    metrics["merge_s"] = round(time.perf_counter() - started, 4)
    return metrics


def _rewrite_once(
    warehouse: DeltaWarehouse,
    table: DeltaTable,
    source: pa.Table,
    spec: MergeSpec,
    commit: CommitContext,
    target_file_rows: int,
) -> tuple[dict[str, Any], bool]:
    """One attempt of :func:`_rewrite_merge` on the version ``table`` holds: its metrics,
    and whether file actions were committed (else an empty commit recorded the batch).

    Raises:
        _RewriteRaced: a rewrite's commit found a newer version (nothing committed).
    """
    actions, metrics = rewrite_actions(
        table, source, spec, warehouse.storage_options, target_file_rows
    )
    if not actions:
        warehouse.mark(table, commit)
        return metrics, False
    # delta-rs checks no read set for a commit of file actions: committed over a
    # concurrent compaction of the files this merge read, the rewrite would keep
    # their rows twice. A rewrite is therefore committed only on the version it
    # read (no retry on a newer one, so no log refresh before it); losing that
    # race, the merge is computed again on the new version. New keys alone are
    # a blind append, which any version takes.
    rewrites = any(isinstance(a, RemoveAction) for a in actions)
    on_version = table.version()
    try:
        _, made = _landed(
            warehouse,
            table,
            commit,
            lambda: table.create_write_transaction(
                actions,
                "append",
                table.schema(),
                commit_properties=warehouse.commit_properties(
                    commit, max_commit_retries=0 if rewrites else None
                ),
                post_commithook_properties=commit_hooks(table),
            ),
        )
    except CommitFailedError as exc:  # not landed
        if not rewrites:
            raise
        raise _RewriteRaced(str(exc)) from exc
    if made:
        warehouse.made(table.table_uri, on_version, commit)
    return metrics, True

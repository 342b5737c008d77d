"""Mirrors merged by Delta Lake's Spark commands on the executors (``sink: delta-spark``).

:class:`SparkMerge` is the :class:`~cdcflow.sinks.engines.MergeEngine` whose two
data-moving steps of a mirror's apply -- the merge of a batch's net change and the removal
of rows before a truncate -- run as Delta Lake's ``MERGE INTO`` and ``DELETE``/``UPDATE``
on Spark (``delta-spark``), so the reading and rewriting of the mirror's files happens on
the executors, not in the driver. Everything else is shared with the delta-rs sink and
runs on the driver as before: the net change, the tombstone and truncate guards, the
value checks that reject rows with a ``TYPE_CONFLICT``, schema evolution (metadata
commits through delta-rs), tombstones, the changelog, dead letters and accounting.

Exactly once: the command's commit carries the application transaction
``(cdcflow-<pipeline>.<source>, apply_id)`` through Delta's SQL settings
``spark.databricks.delta.write.txnAppId`` / ``txnVersion`` (set on a session of its own
per command, so concurrent sources never share them), the same transaction the delta-rs
sink writes; ``transaction_version`` reads it back either way. The apply's Kafka offset
ranges (the :class:`~cdcflow.sinks.warehouse.CommitContext`'s metadata) go into the
commit's ``userMetadata``. :func:`SparkDeltaWarehouse` is the warehouse whose mirrors are
merged so.

The merge has the delta-rs sink's conditions (:mod:`cdcflow.sinks.engines`): a stored row is
overwritten or deleted only by a row with a sequence >= its own; a partial image keeps
the stored values of the columns it lacks; keyless tables match NULL-safely (``<=>``).

Change data feed: Delta's Spark commands write the ``_change_data`` files themselves
when the table has ``delta.enableChangeDataFeed`` (set by the shared
:func:`~cdcflow.sinks.mirror.ensure_table` at creation, or before the next
merge of a table ``change_feed`` was turned on for). The merge then takes only the source
rows that change something, as the delta-rs sink's, and a truncate that removes nothing
records the batch by an empty commit (docs/decisions.md 58).

Deletion vectors stay off: delta-rs 1.x, which cdcflow reads every table with, cannot
read a table with the ``deletionVectors`` reader feature (docs/decisions.md, 39).

Source documents: Delta Lake 4.x documentation, "Table deletes, updates, and merges"
(``MERGE INTO`` syntax and semantics) and "Idempotent table writes"
(``txnAppId``/``txnVersion``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
import pyarrow as pa
from deltalake import DeltaTable

from cdcflow.sinks.engines import effective_source
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
from cdcflow.sinks.warehouse import CommitContext, DeltaWarehouse

__all__ = ["DELTA_EXTENSION", "SparkDeltaWarehouse", "SparkMerge", "delta_spark_ready"]

#: Delta Lake's Spark session extension (``spark.sql.extensions``)
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def delta_spark_ready(spark: Any) -> bool:
    """Whether ``spark`` has Delta Lake's session extension (and so its jars)."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return DELTA_EXTENSION in [e.strip() for e in extensions.split(",")]


def SparkDeltaWarehouse(  # noqa: N802 -- the warehouse of ``sink: delta-spark``
    root: str,
    spark: Any,
    pipeline_id: str = "default",
    storage_options: Mapping[str, str] | None = None,
) -> DeltaWarehouse:
    """The Delta tables of one pipeline, mirrors merged on Spark (module docstring).

    Args:
        root: warehouse folder.
        spark: a SparkSession with Delta Lake's extension (:func:`delta_spark_ready`).
        pipeline_id, storage_options: as :class:`~cdcflow.sinks.warehouse.DeltaWarehouse`.
    """
    return DeltaWarehouse(
        root,
        pipeline_id=pipeline_id,
        storage_options=storage_options,
        merge_engine=SparkMerge(spark),
    )


class SparkMerge:
    """:class:`~cdcflow.sinks.engines.MergeEngine` by Delta Lake's Spark commands
    (module docstring).

    Args:
        spark: a SparkSession with Delta Lake's extension (:func:`delta_spark_ready`).
    """

    name = "delta-spark"

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def _session(self, commit: CommitContext | None) -> Any:
        """A session of its own for one command: its transaction and metadata settings."""
        session = self.spark.newSession()
        if commit is not None:
            session.conf.set(_TXN_APP, commit.app_id)
            session.conf.set(_TXN_VERSION, str(commit.version))
            if commit.metadata:
                session.conf.set(_USER_METADATA, orjson.dumps(dict(commit.metadata)).decode())
        return session

    def _target(self, table: DeltaTable) -> str:
        return f"delta.{quote_column(table.table_uri)}"

    def truncate(
        self,
        warehouse: DeltaWarehouse,
        table: DeltaTable,
        truncate_seq: str,
        commit: CommitContext | None,
        soft_delete: bool,
    ) -> None:
        """:meth:`~cdcflow.sinks.engines.MergeEngine.truncate` by Spark's ``DELETE`` (or
        ``UPDATE`` with ``soft_delete``)."""
        seq = quote_column(SEQ_COLUMN)
        before = f"({seq} IS NULL OR {seq} < '{truncate_seq}')"
        session = self._session(commit)
        version = table.version()
        if soft_delete:
            flag = quote_column(SOFT_DELETE_COLUMN)
            session.sql(
                f"UPDATE {self._target(table)} SET {flag} = true, {seq} = '{truncate_seq}' "
                f"WHERE {before} AND NOT {flag}"
            )
        else:
            session.sql(f"DELETE FROM {self._target(table)} WHERE {before}")
        if commit is not None:
            table.update_incremental()
            if table.version() == version:
                # Spark commits nothing when no row matched: the batch is recorded alone
                warehouse.mark(table, commit)

    def merge(
        self,
        warehouse: DeltaWarehouse,
        table: DeltaTable,
        source: pa.Table,
        spec: MergeSpec,
        commit: CommitContext,
    ) -> dict[str, Any]:
        """One ``MERGE INTO`` of ``source`` (the checked merge source of
        :meth:`~cdcflow.sinks.mirror.Mirrors.apply`) run by Spark, its commit carrying
        ``commit``; the metrics under delta-rs's names, plus ``merge_s``."""
        started = time.perf_counter()
        if table_feeds_changes(table):
            # the rows that change something alone: a Spark MERGE that changes nothing
            # still rewrites the files it matched, without cdc files (decision 58)
            source, unchanged_rows = effective_source(warehouse, table, source, spec, commit)
            if not source.num_rows:
                return {
                    "num_source_rows_unchanged": unchanged_rows,
                    "engine": "delta-spark",
                    "merge_s": round(time.perf_counter() - started, 4),
                }
        session = self._session(commit)
        view = f"cdcflow_merge_source_{spec.batch_id}"
        session.createDataFrame(source).createOrReplaceTempView(view)
        # Spark's Delta MERGE prunes partitions by the target's own conditions in it
        on = merge_condition(spec, source, table.metadata().partition_columns, "<=>")
        newer, updates, inserts = merge_expressions(source, spec.columns, spec.soft_delete)
        flag = quote_column(DELETE_FLAG)
        if spec.soft_delete:
            seq, ts = quote_column(SEQ_COLUMN), quote_column(TS_COLUMN)
            on_delete = f"UPDATE SET t.{quote_column(SOFT_DELETE_COLUMN)} = true, t.{seq} = s.{seq}, t.{ts} = s.{ts}"
        else:
            on_delete = "DELETE"
        set_clause = ", ".join(f"t.{quote_column(c)} = {v}" for c, v in updates.items())
        names = ", ".join(quote_column(c) for c in inserts)
        values = ", ".join(inserts.values())
        sql = (
            f"MERGE INTO {self._target(table)} AS t USING {view} AS s ON {on} "
            f"WHEN MATCHED AND s.{flag} AND {newer} THEN {on_delete} "
            f"WHEN MATCHED AND NOT s.{flag} AND {newer} THEN UPDATE SET {set_clause} "
            f"WHEN NOT MATCHED AND NOT s.{flag} THEN INSERT ({names}) VALUES ({values})"
        )
        try:
            row = session.sql(sql).first()
        finally:
            session.catalog.dropTempView(view)
        counts = row.asDict() if row is not None else {}
        return {
            "num_source_rows": source.num_rows,
            "num_target_rows_inserted": int(counts.get("num_inserted_rows", 0)),
            "num_target_rows_updated": int(counts.get("num_updated_rows", 0)),
            "num_target_rows_deleted": int(counts.get("num_deleted_rows", 0)),
            "engine": "delta-spark",
            "merge_s": round(time.perf_counter() - started, 4),
        }

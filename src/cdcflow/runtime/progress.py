"""What a running pipeline says on the console: a line per micro-batch and source, a
warning when most of a batch is dead letters, and the run's summary when it ends.

Two things feed it, both on the driver:

- the applies (:meth:`ProgressReporter.applied`, called by the pipeline once a
  micro-batch's sources are applied): records, events, skips and dead letters by code,
  the offsets applied and the source lag (``_cdcflow/progress.lag_ms``);
- Spark's ``StreamingQueryListener`` (:meth:`ProgressReporter.query_progress`, the
  ``StreamingQueryProgress`` JSON): each micro-batch's end offsets and the log-end offsets
  Spark saw when it planned it, hence the records behind the log end per source, and the
  batch's duration against the trigger's interval.

A micro-batch's line is written when both have arrived, whichever is second (the listener
is asynchronous; the apply of micro-batch N runs while Spark plans N+1, decision 32).
:meth:`ProgressReporter.flush` writes what is left without the listener's part.

Example line (``docs/operations.md``)::

    batch 4 pg: 1,000 records -> 1,020 events, 2,310 events/s; 12 skipped (TOMBSTONE 12); 3 dead letters (MISSING_FIELD 3); 48,000 behind; lag 2.4 s
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cdcflow.apply.accounting import BatchReport

__all__ = [
    "MOSTLY_DEAD_LETTERS",
    "ProgressReporter",
    "RunTotals",
    "TableCounts",
    "counts",
    "human_duration",
    "summary_lines",
    "table_counts",
]

#: share of a source's records in one micro-batch above which the batch is "mostly dead
#: letters": a warning names the top code and what to check
MOSTLY_DEAD_LETTERS = 0.5
#: below this many records a batch's dead letters are not warned about as a share
_WARN_MIN_RECORDS = 10

TopicPartition = tuple[str, int]


def counts(counter: Counter | dict[str, int]) -> str:
    """``MISSING_FIELD 3, BAD_JSON 1``: codes by count, most first."""
    return ", ".join(f"{code} {n:,}" for code, n in Counter(counter).most_common())


@dataclass
class TableCounts:
    """Rows one run changed in one target table."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    truncated: int = 0  # truncates applied

    def add(self, mirror: Any) -> None:
        """Add one :class:`~cdcflow.sinks.mirror.MirrorResult`: inserts and updates from the
        merge's metrics where it has them, else all its upserts as ``updated``."""
        metrics = mirror.metrics or {}
        if "num_target_rows_inserted" in metrics:
            inserted = int(metrics.get("num_target_rows_inserted") or 0)
            self.inserted += inserted
            self.updated += max(0, mirror.upserts - inserted)
        else:
            self.updated += mirror.upserts
        self.deleted += mirror.deletes
        self.truncated += int(bool(mirror.truncated))


@dataclass
class RunTotals:
    """What a run applied, added up report by report (a long streaming run keeps counters,
    not its reports)."""

    micro_batches: int = 0
    records: int = 0
    events: int = 0
    skipped: Counter = field(default_factory=Counter)
    dead_letters: Counter = field(default_factory=Counter)
    tables: dict[str, TableCounts] = field(default_factory=dict)

    def add(self, report: BatchReport) -> None:
        """Add one source's report (the caller counts the micro-batches)."""
        self.records += report.records
        self.events += report.events
        self.skipped.update(report.skipped)
        self.dead_letters.update(report.dead_letters)
        for mirror in report.mirrors:
            if not mirror.skipped_replay:  # applied before: counted then
                self.tables.setdefault(mirror.target, TableCounts()).add(mirror)

    def lines(self) -> list[str]:
        """The end of a run: totals, skips and dead letters by code, and per table the
        rows inserted, updated and deleted (the widest tables' names are not cut)."""
        skipped, dead = self.skipped, self.dead_letters
        line = f"{self.micro_batches:,} micro-batches: {self.records:,} records, {self.events:,} events"
        line += f"; {sum(skipped.values()):,} skipped" + (
            f" ({counts(skipped)})" if skipped else ""
        )
        line += f"; {sum(dead.values()):,} dead letters" + (f" ({counts(dead)})" if dead else "")
        lines = [line]
        if self.tables:
            width = max(12, *(len(t) for t in self.tables))
            lines.append(f"{'table':{width}}  {'inserted':>10} {'updated':>10} {'deleted':>10}")
            for name in sorted(self.tables):
                c = self.tables[name]
                truncated = (
                    f"  ({c.truncated} truncate{'s' * (c.truncated > 1)})" if c.truncated else ""
                )
                lines.append(
                    f"{name:{width}}  {c.inserted:>10,} {c.updated:>10,} {c.deleted:>10,}{truncated}"
                )
        return lines


def table_counts(reports: Iterable[BatchReport]) -> dict[str, TableCounts]:
    """Per target table, what ``reports`` changed."""
    totals = RunTotals()
    for report in reports:
        totals.add(report)
    return totals.tables


def summary_lines(reports: dict[str, list[BatchReport]], batches: int) -> list[str]:
    """:meth:`RunTotals.lines` of ``reports`` (per source) over ``batches`` micro-batches."""
    totals = RunTotals(micro_batches=batches)
    for source_reports in reports.values():
        for report in source_reports:
            totals.add(report)
    return totals.lines()


@dataclass
class _Batch:
    """What is known of one micro-batch: its applies' reports and Spark's progress."""

    reports: dict[str, BatchReport] | None = None
    seconds: float | None = None  # wall time since the previous micro-batch's apply ended
    progress: dict[str, Any] | None = None


@dataclass
class ProgressReporter:
    """Console lines of a running pipeline (see the module docstring).

    Args:
        write: takes one line (no newline); e.g. a print to stderr.
        source_of: the source a topic belongs to (``Subscription.source_of``), to add up
            the records behind per source.
        formats: source name -> its format, named in the dead-letter warning.
        topics: source name -> a topic (or the pattern) to name in the warning.
        trigger_ms: the trigger's interval in milliseconds (``None``: available-now), to
            say when micro-batches run back to back.
        clock: seconds, monotonic.
    """

    write: Callable[[str], None]
    source_of: Callable[[str], str | None] = lambda topic: None
    formats: dict[str, str] = field(default_factory=dict)
    topics: dict[str, str] = field(default_factory=dict)
    trigger_ms: int | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, _Batch] = {}
        self._started = self.clock()
        self._last_end = self._started
        #: what the run applied so far (:meth:`summary`)
        self.totals = RunTotals()
        #: Spark's id of the last micro-batch whose applies ended (``None``: none yet)
        self.last_batch: int | None = None
        #: (topic, partition) -> the next offset to apply (after the last applied record)
        self.next_offsets: dict[TopicPartition, int] = {}
        #: source -> records behind the log end after its last line (``None``: unknown)
        self.behind: dict[str, int] = {}
        #: warnings written, for a summary's reader and the tests
        self.warnings: list[str] = []
        #: the followed query's id (:meth:`started`; ``None``: any)
        self.query_id: str | None = None
        #: (topic, partition) -> the newest log end Spark reported (latestOffset)
        self.log_ends: dict[TopicPartition, int] = {}

    # ------------------------------------------------------------------ inputs

    def started(self, query_id: str | None = None) -> None:
        """The query has started: the first micro-batch's rate counts from here; only the
        progress of ``query_id`` is followed (a session can run other queries)."""
        with self._lock:
            self._last_end = self.clock()
            self.query_id = query_id

    def applied(self, batch_id: int, reports: dict[str, BatchReport]) -> None:
        """A micro-batch's applies have ended: ``reports`` per source (none: nothing of
        the micro-batch was new to the warehouse)."""
        with self._lock:
            now = self.clock()
            batch = self._batches.setdefault(batch_id, _Batch())
            batch.reports = dict(reports)
            batch.seconds = now - self._last_end
            self._last_end = now
            self.last_batch = batch_id
            self.totals.micro_batches += 1
            for report in reports.values():
                self.totals.add(report)
                for tp, (_, last) in report.ranges.items():
                    self.next_offsets[tp] = max(self.next_offsets.get(tp, 0), last + 1)
            self._write_ready(batch_id)

    def finished(self, source: str, report: BatchReport) -> None:
        """An apply a crash interrupted was finished at start-up, from Kafka."""
        with self._lock:
            self.totals.add(report)
            self.totals.micro_batches += 1  # an apply of its own
            line = self._line(-1, source, report, None, None)
            self.write(
                line.replace("batch -1", f"apply {report.batch_id} (interrupted, finished)", 1)
            )

    def query_progress(self, progress: dict[str, Any] | str) -> None:
        """A ``StreamingQueryProgress`` (its ``json``, or parsed)."""
        if isinstance(progress, str):
            progress = json.loads(progress)
        assert isinstance(progress, dict)  # a progress's json is one JSON object
        batch_id = progress.get("batchId")
        if batch_id is None or not progress.get("numInputRows"):
            return  # a trigger that found nothing new
        if self.query_id is not None and progress.get("id") not in (None, self.query_id):
            return  # another query of the session
        with self._lock:
            for source in progress.get("sources") or ():
                for tp, end in _offsets(source.get("latestOffset")).items():
                    self.log_ends[tp] = max(end, self.log_ends.get(tp, end))
            self._batches.setdefault(int(batch_id), _Batch()).progress = progress
            self._write_ready(int(batch_id))

    def records_behind(
        self, source: str, ranges: dict[TopicPartition, tuple[int, int]]
    ) -> int | None:
        """Records of ``source`` between a batch's ends (``ranges``, and what was applied
        before) and the newest log ends Spark reported, at most one micro-batch old, so
        a low estimate while new records arrive; ``None`` before Spark reported any."""
        with self._lock:
            behind, known = 0, False
            for tp, log_end in self.log_ends.items():
                if self.source_of(tp[0]) != source:
                    continue
                at = max(ranges[tp][1] + 1 if tp in ranges else -1, self.next_offsets.get(tp, -1))
                if at >= 0:
                    behind += max(0, log_end - at)
                    known = True
            return behind if known else None

    def flush(self) -> None:
        """Write the lines of applied micro-batches whose progress has not arrived."""
        with self._lock:
            for batch_id in sorted(self._batches):
                if self._batches[batch_id].reports is not None:
                    self._write(batch_id, self._batches.pop(batch_id))

    # ------------------------------------------------------------------ outputs

    def stop_line(self) -> str:
        """``stopped after micro-batch N; the next run resumes at ...`` for a stop."""
        if self.last_batch is None:
            return (
                "stopped before any micro-batch was applied; the next run starts where this one did"
            )
        at = sorted(self.next_offsets.items())
        shown = ", ".join(f"{t}[{p}]@{o:,}" for (t, p), o in at[:4])
        more = f" and {len(at) - 4} more partitions" if len(at) > 4 else ""
        where = f"at {shown}{more}" if at else "where this one stopped"
        return (
            f"stopped after micro-batch {self.last_batch}; the next run resumes {where} "
            "(the warehouse's offsets)"
        )

    def summary(self) -> list[str]:
        """:meth:`RunTotals.lines` of everything applied so far."""
        return self.totals.lines()

    # ------------------------------------------------------------------ lines

    def _write_ready(self, batch_id: int) -> None:
        batch = self._batches[batch_id]
        if batch.reports is not None and batch.progress is not None:
            self._write(batch_id, self._batches.pop(batch_id))
        # a batch applied long ago whose progress never came (Spark drops listener events
        # under load): written without it once two newer batches are applied
        for old in [b for b in self._batches if b < batch_id - 1]:
            if self._batches[old].reports is not None:
                self._write(old, self._batches.pop(old))

    def _behind(self, progress: dict[str, Any] | None) -> dict[str, int]:
        """Records between each source's end offsets and the log end Spark saw."""
        if not progress:
            return {}
        out: dict[str, int] = {}
        for source in progress.get("sources") or ():
            end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
            for (topic, partition), log_end in latest.items():
                name = self.source_of(topic)
                if name is None:
                    continue
                at = end.get((topic, partition), 0)
                out[name] = out.get(name, 0) + max(0, log_end - at)
        return out

    def _write(self, batch_id: int, batch: _Batch) -> None:
        reports = batch.reports or {}
        behind = self._behind(batch.progress)
        self.behind.update(behind)
        duration_ms = (batch.progress or {}).get("batchDuration")
        if not reports:
            return
        # Spark's "Current batch is falling behind" WARN, said once per line instead (it is
        # silenced in log4j2.properties): micro-batches run back to back, which is how a
        # pipeline catches up, not a fault
        slow = None
        if duration_ms and self.trigger_ms and duration_ms > self.trigger_ms:
            slow = f"catching up: {human_duration(duration_ms / 1000)} a micro-batch"
        for name, report in sorted(reports.items()):
            line = self._line(batch_id, name, report, batch.seconds, behind.get(name))
            self.write(f"{line}; {slow}" if slow and behind.get(name) else line)
            self._warn_dead_letters(batch_id, name, report)

    def _line(
        self,
        batch_id: int,
        name: str,
        r: BatchReport,
        seconds: float | None,
        behind: int | None,
    ) -> str:
        parts = [f"batch {batch_id} {name}: {r.records:,} records -> {r.events:,} events"]
        if seconds and seconds > 0:
            parts[0] += f", {r.events / seconds:,.0f} events/s"
        if r.skipped:
            parts.append(f"{sum(r.skipped.values()):,} skipped ({counts(r.skipped)})")
        if r.dead_letters:
            parts.append(
                f"{sum(r.dead_letters.values()):,} dead letters ({counts(r.dead_letters)})"
            )
        if r.replayed:
            parts.append(f"{r.replayed:,} applied before")
        if behind is not None:
            parts.append(f"{behind:,} behind")
        if r.lag_ms is not None:
            parts.append(f"lag {human_duration(r.lag_ms / 1000)}")
        return "; ".join(parts)

    def _warn_dead_letters(self, batch_id: int, name: str, r: BatchReport) -> None:
        dead = sum(r.dead_letters.values())
        if r.records < _WARN_MIN_RECORDS or dead <= MOSTLY_DEAD_LETTERS * r.records:
            return
        code, n = Counter(r.dead_letters).most_common(1)[0]
        share = "every record" if dead >= r.records else f"{dead:,} of {r.records:,} records"
        fmt = self.formats.get(name, "?")
        topic = self.topics.get(name, "its topics")
        warning = (
            f"WARNING source {name}: {share} of micro-batch {batch_id} failed, most with "
            f"{code} ({n:,}): is {topic} really {fmt}? `cdcflow inspect CONFIG` shows what "
            f"the topics hold, `cdcflow dead-letters show CONFIG --source {name} --code {code}` "
            "the failures; apply.dead_letter_limit makes this fatal"
        )
        self.warnings.append(warning)
        self.write(warning)


def _offsets(value: Any) -> dict[TopicPartition, int]:
    """``{"topic": {"0": 12}}`` (a progress's offsets, parsed or JSON) as a flat dict."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    out: dict[TopicPartition, int] = {}
    for topic, partitions in value.items():
        if isinstance(partitions, dict):
            for p, offset in partitions.items():
                try:
                    out[(topic, int(p))] = int(offset)
                except (TypeError, ValueError):
                    continue
    return out


def human_duration(seconds: float) -> str:
    """``850 ms``, ``2.4 s``, ``3 min 20 s``, ``5 h 2 min``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def attach(spark, reporter: ProgressReporter):
    """Add a ``StreamingQueryListener`` feeding ``reporter`` to ``spark``'s queries;
    returns it, for :func:`detach`."""
    from pyspark.sql.streaming import StreamingQueryListener

    class _Listener(StreamingQueryListener):
        def onQueryStarted(self, event) -> None:
            pass

        def onQueryProgress(self, event) -> None:
            reporter.query_progress(event.progress.json)

        def onQueryIdle(self, event) -> None:
            pass

        def onQueryTerminated(self, event) -> None:
            pass

    listener = _Listener()
    spark.streams.addListener(listener)
    return listener


def detach(spark, listener, timeout_s: float = 5.0) -> None:
    """Deliver the listener's pending events (Spark's listener bus is asynchronous: the
    last micro-batch's progress comes after the query stops), then remove it."""
    # a private API: without it, the last lines lack "behind"; the session may be going away
    with contextlib.suppress(Exception):
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))
    with contextlib.suppress(Exception):
        spark.streams.removeListener(listener)

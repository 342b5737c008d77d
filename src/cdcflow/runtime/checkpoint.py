"""The pipeline's Spark checkpoint, as far as cdcflow must know it.

A pipeline runs one streaming query over every source's topics (decision 53); its
checkpoint is ``<checkpoint>/_query`` (:data:`QUERY_FOLDER`). cdcflow before 0.4 ran one
query per source, checkpointed in ``<checkpoint>/<source name>``: those folders are read
once, for positions the warehouse does not know, when the pipeline's checkpoint starts.


Spark's checkpoint folder of a streaming query holds ``offsets/<batch>`` (the planned
offsets of each micro-batch) and ``commits/<batch>`` (the batches that finished). cdcflow
adds ``cdcflow.json``, the checkpoint's *fingerprints*: which pipeline, sources, formats,
topics and warehouse it belongs to. A checkpoint whose fingerprint differs from the
configuration would make Spark resume another stream's positions; it is refused with one
line naming the difference and the fix (``cdcflow reset``).
``cdcflow-read.json`` records, per source, the first micro-batch that delivered a record,
so that micro-batches that read nothing never count as reading something.

The warehouse, not the checkpoint, knows what was applied (:mod:`cdcflow.apply.offsets`),
so a deleted checkpoint loses nothing: the next run starts from the warehouse's offsets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cdcflow.errors import ConfigError
from cdcflow.sinks.s3a import checkpoint_on_store
from cdcflow.sinks.storage import Storage

__all__ = ["Checkpoint", "Fingerprint", "QUERY_FOLDER"]

#: the pipeline query's checkpoint folder under ``checkpoint`` (no source is called so:
#: source names start with a letter or digit)
QUERY_FOLDER = "_query"
FINGERPRINT_FILE = "cdcflow.json"
#: ``{"first_batch_with_records": id | null, "sources": {name: id}}``: the first
#: micro-batch that delivered a record (of any source, and of each), written by cdcflow
#: before the micro-batch can finish (decision 41)
READ_FILE = "cdcflow-read.json"


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a checkpoint belongs to."""

    pipeline_id: str
    source: str
    format: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    warehouse: str

    @classmethod
    def of(cls, config: Any, source: Any) -> Fingerprint:
        """What a checkpoint must hold of ``source`` (a ``SourceConfig``) of ``config``
        (a ``PipelineConfig``)."""
        return cls(
            pipeline_id=config.pipeline_id,
            source=source.name,
            format=source.format,
            topics=tuple(source.topics),
            topic_pattern=source.topic_pattern,
            warehouse=config.warehouse,
        )

    def differences(self, other: Fingerprint) -> list[str]:
        """``"field: checkpoint value != configured value"`` for each field that differs."""
        mine, theirs = asdict(self), asdict(other)
        return [
            f"{k} {theirs[k]!r} (configured: {mine[k]!r})" for k in mine if mine[k] != theirs[k]
        ]


class Checkpoint:
    """The checkpoint folder of a streaming query, in a folder or on S3.

    Args:
        path: the folder or URI (``<checkpoint>/_query``; before 0.4
            ``<checkpoint>/<source>``).
        storage_options: delta-rs's options to reach a URI (the ``storage:`` section).
    """

    def __init__(self, path: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.store = Storage(path, storage_options or {})
        #: :meth:`_first_read`'s answer, once read or written: only this run writes it
        #: (it holds the pipeline's lease), so :meth:`delivered` reads no file per batch
        self._read_state: tuple[bool, int | None] | None = None
        #: source -> the first micro-batch that delivered one of its records
        self._source_reads: dict[str, int] | None = None

    @classmethod
    def of(cls, config: Any, folder: str = QUERY_FOLDER) -> Checkpoint:
        """``folder`` of a ``PipelineConfig``'s ``checkpoint`` (a URI gets the ``storage:``
        options)."""
        root = str(config.checkpoint).rstrip("/")
        options = config.storage if checkpoint_on_store(root) else None
        return cls(f"{root}/{folder}", options)

    def _batches(self, sub: str) -> list[int]:
        return sorted(int(n) for n in self.store.names(sub) if n.isdigit())

    def _read_json(self, *parts: str) -> Any:
        return json.loads(self.store.read_bytes(*parts))

    def exists(self) -> bool:
        """Whether anything was written to the checkpoint.

        On S3 the empty marker objects S3A writes for folders (keys ending in ``/``) do
        not count: delta-rs's object store cannot name them, so :meth:`restart` leaves
        them behind (they hold nothing and cost nothing to keep).
        """
        if self.store.local:
            return self.store.exists()
        return self.store.holds_data()

    def committed_batches(self) -> list[int]:
        """Spark's micro-batch ids that finished (``commits/``)."""
        return self._batches("commits")

    def planned_batches(self) -> list[int]:
        """Spark's micro-batch ids that were planned (``offsets/``)."""
        return self._batches("offsets")

    def _first_read(self) -> tuple[bool, int | None]:
        """``(tracked, id)``: whether cdcflow has tracked this checkpoint's reads since its
        first micro-batch (:data:`READ_FILE` exists) and the first micro-batch that
        delivered a record (``None``: none did)."""
        if self._read_state is None:
            self._read_state = self._load_read()
        return self._read_state

    def _load_read(self) -> tuple[bool, int | None]:
        try:
            data = self._read_json(READ_FILE)
            first = data.get("first_batch_with_records")
            sources = data.get("sources")
        except FileNotFoundError:
            return False, None
        except (OSError, ValueError, AttributeError):
            return False, None  # unreadable: judged by the offsets, as before tracking
        if isinstance(sources, dict):
            self._source_reads = {str(k): v for k, v in sources.items() if isinstance(v, int)}
        return True, first if isinstance(first, int) else None

    def _write_read(self, first: int | None) -> None:
        sources = self._source_reads or {}
        data = {"first_batch_with_records": first, "sources": sources}
        self.store.write_bytes(json.dumps(data).encode(), READ_FILE)
        self._read_state = (True, first)

    def track_reads(self) -> None:
        """Start tracking reads on a new checkpoint (no micro-batch planned yet)."""
        if self.is_new() and not self._first_read()[0]:
            self._source_reads = {}
            self._write_read(None)

    def delivered(self, batch_id: int, sources: Sequence[str] = ()) -> None:
        """Record that micro-batch ``batch_id`` delivered records (of ``sources``); called
        before it is applied, so before Spark can record it finished."""
        tracked, first = self._first_read()
        if not tracked:
            return
        known = self._source_reads if self._source_reads is not None else {}
        new = [s for s in sources if s not in known or batch_id < known[s]]
        if new or first is None or batch_id < first:
            self._source_reads = {**known, **{s: batch_id for s in new}}
            self._write_read(batch_id if first is None or batch_id < first else first)

    def read_nothing(self, source: str | None = None) -> bool:
        """Whether no finished micro-batch delivered a record (of ``source``, if given).

        A tracked checkpoint (:meth:`track_reads`) knows it: no finished micro-batch is at
        or after the first one that delivered records. Whatever the start offsets were
        (``earliest``, ``latest``, a trimmed topic), an empty micro-batch does not count.
        An untracked one (written before tracking, or its file unreadable) is judged by
        the last finished micro-batch's end offsets (``offsets/<id>``, one JSON object per
        source after Spark's two header lines): they name no partition (the topic did not
        exist yet) or only partitions at offset 0 (it had no record yet). Kafka offsets
        only grow, so then no micro-batch read anything. Anything else, or a file that
        does not read so, is ``False``."""
        committed = self.committed_batches()
        if not committed:
            return True
        tracked, first = self._first_read()
        if tracked and source is not None and self._source_reads is not None:
            first = self._source_reads.get(source)
        if tracked:
            return first is None or first > committed[-1]
        try:
            sources = self._offsets(committed[-1])
        except (OSError, ValueError):
            return False
        for offsets in sources:
            if not isinstance(offsets, dict):
                return False
            for partitions in offsets.values():
                if not isinstance(partitions, dict):
                    return False
                if any(not isinstance(o, int) or o != 0 for o in partitions.values()):
                    return False
        return bool(sources)

    def is_new(self) -> bool:
        """No micro-batch was ever planned: the query starts from ``startingOffsets``."""
        return not self.planned_batches()

    def fingerprints(self) -> dict[str, Fingerprint] | None:
        """The recorded fingerprints by source (``None``: none written, e.g. by cdcflow
        before 0.3). A checkpoint of cdcflow before 0.4 holds one source's."""
        try:
            data = self._read_json(FINGERPRINT_FILE)
            entries = data.get("sources", [data])
            found = {}
            for entry in entries:
                entry["topics"] = tuple(entry.get("topics") or ())
                fp = Fingerprint(**{k: entry.get(k) for k in Fingerprint.__slots__})
                found[fp.source] = fp
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(
                f"checkpoint {self.path}: {FINGERPRINT_FILE} cannot be read ({exc}); fix: "
                "`cdcflow reset CONFIG` (the warehouse keeps what was applied)"
            ) from exc
        return found

    def claim(
        self, expected: Fingerprint | Sequence[Fingerprint], config_path: str = "CONFIG"
    ) -> bool:
        """Check that the checkpoint belongs to the ``expected`` sources and record them.

        A new checkpoint, or one written before fingerprints existed, is claimed.

        Returns:
            ``True``: the checkpoint can be resumed; ``False``: its set of sources is not
            the configured one (sources were added, removed or reset): it must start
            over (:meth:`restart`), and is not claimed.

        Raises:
            ConfigError: a source of the checkpoint is configured with another pipeline,
                format, topic selection or warehouse (one line: the differences and the
                fix).
        """
        wanted = [expected] if isinstance(expected, Fingerprint) else list(expected)
        found = self.fingerprints()
        if found is not None:
            for fp in wanted:
                had = found.get(fp.source)
                if had is not None and had != fp:
                    raise ConfigError(
                        f"checkpoint {self.path} belongs to another stream: "
                        f"{'; '.join(fp.differences(had))}. Resuming it would skip or re-read "
                        f"records. Fix: `cdcflow reset {config_path} --source {fp.source}` "
                        "(the warehouse keeps what was applied; the next run starts from its "
                        "offsets) or set `checkpoint` to another folder"
                    )
            return set(found) == {fp.source for fp in wanted}
        self._write_fingerprints(wanted)
        return True

    def _write_fingerprints(self, fingerprints: Sequence[Fingerprint]) -> None:
        entries = [{**asdict(fp), "topics": list(fp.topics)} for fp in fingerprints]
        self.store.write_bytes(
            json.dumps({"sources": entries}, indent=1).encode(), FINGERPRINT_FILE
        )

    def forget(self, sources: Sequence[str]) -> list[str]:
        """Drop ``sources`` from the fingerprints, so the next run starts the checkpoint
        over: those sources at the warehouse's offsets, the others where they are
        (``cdcflow reset --source``). Returns the sources dropped."""
        found = self.fingerprints() or {}
        gone = [name for name in sources if name in found]
        if gone:
            self._write_fingerprints([fp for name, fp in found.items() if name not in gone])
        return gone

    def committed_end_offsets(self) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` where the last finished micro-batch ended
        (empty: none finished, or its offsets do not read as Kafka offsets)."""
        committed = self.committed_batches()
        if not committed:
            return {}
        try:
            out: dict[tuple[str, int], int] = {}
            for offsets in self._offsets(committed[-1]):
                for topic, partitions in offsets.items():
                    for partition, offset in partitions.items():
                        if isinstance(offset, int) and offset >= 0:
                            out[(str(topic), int(partition))] = offset
            return out
        except (OSError, ValueError, AttributeError, TypeError):
            return {}

    def _offsets(self, batch_id: int) -> list[Any]:
        """The end offsets of micro-batch ``batch_id``: one JSON value per source, after
        Spark's two header lines of ``offsets/<id>``."""
        text = self.store.read_bytes("offsets", str(batch_id)).decode()
        return [json.loads(line) for line in text.splitlines()[2:] if line.strip()]

    def restart(self) -> None:
        """Delete the checkpoint: the query starts over from ``startingOffsets``."""
        self.store.delete()
        self._read_state = None
        self._source_reads = None

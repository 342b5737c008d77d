"""A source's Spark checkpoint, as far as cdcflow must know it.

Spark's checkpoint folder of a streaming query holds ``offsets/<batch>`` (the planned
offsets of each micro-batch) and ``commits/<batch>`` (the batches that finished). cdcflow
adds ``cdcflow.json``, the checkpoint's *fingerprint*: which pipeline, source, format,
topics and warehouse it belongs to. A checkpoint whose fingerprint differs from the
configuration would make Spark resume another stream's positions; it is refused with one
line naming the difference and the fix (``cdcflow reset``).
``cdcflow-read.json`` records the first micro-batch that delivered a record, so that
micro-batches that read nothing never count as reading something.

The warehouse, not the checkpoint, knows what was applied (:mod:`cdcflow.apply.offsets`),
so a deleted checkpoint loses nothing: the next run starts from the warehouse's offsets.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from cdcflow.errors import ConfigError

__all__ = ["Checkpoint", "Fingerprint"]

FINGERPRINT_FILE = "cdcflow.json"
#: ``{"first_batch_with_records": id | null}``: the first micro-batch that delivered a
#: record, written by cdcflow before the micro-batch can finish (decision 41)
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

    def differences(self, other: Fingerprint) -> list[str]:
        """``"field: checkpoint value != configured value"`` for each field that differs."""
        mine, theirs = asdict(self), asdict(other)
        return [
            f"{k} {theirs[k]!r} (configured: {mine[k]!r})" for k in mine if mine[k] != theirs[k]
        ]


class Checkpoint:
    """The checkpoint folder of one source's streaming query (local paths only).

    Args:
        path: the folder (``<checkpoint>/<source name>``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        #: :meth:`_first_read`'s answer, once read or written: only this run writes it
        #: (it holds the pipeline's lease), so :meth:`delivered` reads no file per batch
        self._read_state: tuple[bool, int | None] | None = None

    def _batches(self, sub: str) -> list[int]:
        folder = os.path.join(self.path, sub)
        if not os.path.isdir(folder):
            return []
        return sorted(int(n) for n in os.listdir(folder) if n.isdigit())

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
            with open(os.path.join(self.path, READ_FILE), encoding="utf-8") as f:
                first = json.load(f).get("first_batch_with_records")
        except FileNotFoundError:
            return False, None
        except (OSError, ValueError, AttributeError):
            return False, None  # unreadable: judged by the offsets, as before tracking
        return True, first if isinstance(first, int) else None

    def _write_read(self, first: int | None) -> None:
        os.makedirs(self.path, exist_ok=True)
        tmp = os.path.join(self.path, READ_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"first_batch_with_records": first}, f)
        os.replace(tmp, os.path.join(self.path, READ_FILE))
        self._read_state = (True, first)

    def track_reads(self) -> None:
        """Start tracking reads on a new checkpoint (no micro-batch planned yet)."""
        if self.is_new() and not self._first_read()[0]:
            self._write_read(None)

    def delivered(self, batch_id: int) -> None:
        """Record that micro-batch ``batch_id`` delivered records; called before it is
        applied, so before Spark can record it finished."""
        tracked, first = self._first_read()
        if tracked and (first is None or batch_id < first):
            self._write_read(batch_id)

    def read_nothing(self) -> bool:
        """Whether no finished micro-batch delivered a record.

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
        if tracked:
            return first is None or first > committed[-1]
        try:
            with open(
                os.path.join(self.path, "offsets", str(committed[-1])), encoding="utf-8"
            ) as f:
                lines = [line for line in f.read().splitlines()[2:] if line.strip()]
            sources = [json.loads(line) for line in lines]
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

    def fingerprint(self) -> Fingerprint | None:
        """The recorded fingerprint (``None``: none written, e.g. by cdcflow before 0.3)."""
        try:
            with open(os.path.join(self.path, FINGERPRINT_FILE), encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"checkpoint {self.path}: {FINGERPRINT_FILE} cannot be read ({exc}); fix: "
                "`cdcflow reset CONFIG` (the warehouse keeps what was applied)"
            ) from exc
        data["topics"] = tuple(data.get("topics") or ())
        return Fingerprint(**{k: data.get(k) for k in Fingerprint.__slots__})

    def claim(self, expected: Fingerprint, config_path: str = "CONFIG") -> None:
        """Check that the checkpoint belongs to ``expected`` and record it.

        A new checkpoint, or one written before fingerprints existed, is claimed.

        Raises:
            ConfigError: the checkpoint belongs to another pipeline, source, format,
                topic selection or warehouse (one line: the differences and the fix).
        """
        found = self.fingerprint()
        if found is not None and found != expected:
            raise ConfigError(
                f"checkpoint {self.path} belongs to another stream: "
                f"{'; '.join(expected.differences(found))}. Resuming it would skip or re-read "
                f"records. Fix: `cdcflow reset {config_path} --source {expected.source}` "
                "(the warehouse keeps what was applied; the next run starts from its "
                "offsets) or set `checkpoint` to another folder"
            )
        if found is None:
            os.makedirs(self.path, exist_ok=True)
            tmp = os.path.join(self.path, FINGERPRINT_FILE + ".tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({**asdict(expected), "topics": list(expected.topics)}, f, indent=1)
            os.replace(tmp, os.path.join(self.path, FINGERPRINT_FILE))

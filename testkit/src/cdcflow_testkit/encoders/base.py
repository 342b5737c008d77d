"""What an encoder encodes and produces: :class:`SourceChange` in, :class:`Message` out.

The test kit's half of the format contract (the product's half, :class:`Decoder`, is in
:mod:`cdcflow.formats.base`): encoders turn the workload's changes into the messages each
replication tool publishes, so that every format can be tested and demonstrated
decode(encode(change)) == change.
"""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from cdcflow.model import Op, SourceTable
from cdcflow.types import LOGICAL_TYPES

__all__ = [
    "ENCODABLE_TYPES",
    "EPOCH",
    "EPOCH_DATE",
    "EPOCH_NAIVE",
    "MICROSECOND",
    "MILLISECOND",
    "Encoder",
    "Message",
    "SourceChange",
]

#: every logical type a workload column can have (``decimal`` stands for ``decimal(p,s)``);
#: an encoder's ``exact_types`` is these less what its format cannot carry without loss
ENCODABLE_TYPES = LOGICAL_TYPES | {"decimal"}

#: the Unix epoch, as an aware UTC datetime, a naive datetime and a date
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_NAIVE = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
MILLISECOND = dt.timedelta(milliseconds=1)
MICROSECOND = dt.timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class SourceChange:
    """One change of the workload's in-memory source database (what an encoder encodes).

    Attributes:
        op: INSERT, UPDATE, DELETE, SNAPSHOT or TRUNCATE.
        table: source table (its ``format`` is ignored).
        columns: column -> logical type, in table column order.
        key_columns: primary-key columns (empty for a table without one).
        before: before image (updates, deletes) with typed Python values.
        after: after image (inserts, updates, snapshots).
        seq: strictly increasing position in the source log.
        ts_ms: commit time, epoch ms.
        txn_id: transaction id, if the workload groups changes.
    """

    op: Op
    table: SourceTable
    columns: Mapping[str, str]
    key_columns: tuple[str, ...]
    before: Mapping[str, Any] | None
    after: Mapping[str, Any] | None
    seq: int
    ts_ms: int
    txn_id: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A Kafka message to produce."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class Encoder(ABC):
    """Encodes workload changes as the replication tool of this format would.

    Attributes:
        exact_types: the logical types this format carries without loss, so that
            decode(encode(change)) gives back the same typed values. The workload
            generator only gives a format tables whose columns have these types.
    """

    identifier: ClassVar[str]
    exact_types: ClassVar[frozenset[str]]

    @abstractmethod
    def encode(self, change: SourceChange) -> list[Message]:
        """The messages the tool publishes for ``change`` (one or more, in order)."""

    def decoder_options(self, changes: Iterable[SourceChange]) -> Mapping[str, Any] | None:
        """Decoder options a consumer of these messages must configure, or ``None``.

        Formats whose messages never name their key columns (SharePlex JSON) return
        ``{"primary_keys": {...}}`` for the tables in ``changes``, as a user would.
        """
        return None

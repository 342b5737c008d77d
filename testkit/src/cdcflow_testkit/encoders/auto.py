"""The auto encoder: workload changes as the replication tool publishes them.

Moved out of :mod:`cdcflow.formats.auto` (test kit, not product); the decoder and its
source document are there."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from cdcflow.formats.auto import (
    IDENTIFIER,
)
from cdcflow_testkit.encoders.base import Encoder, Message, SourceChange
from cdcflow_testkit.encoders.debezium_json import DebeziumJsonEncoder


class AutoEncoder(Encoder):
    """Encodes as Debezium JSON (``debezium-json``'s encoder).

    ``auto`` is not a message format of any tool; this encoder exists only so that the
    conformance suite and the demo can exercise detection end to end. Decoded events say
    ``source.format == "debezium-json"``.
    """

    identifier: ClassVar[str] = IDENTIFIER
    exact_types: ClassVar[frozenset[str]] = DebeziumJsonEncoder.exact_types
    #: the format the decoded events name in ``source.format``
    event_format: ClassVar[str] = DebeziumJsonEncoder.identifier

    def __init__(self) -> None:
        self._inner = DebeziumJsonEncoder()

    def encode(self, change: SourceChange) -> list[Message]:
        """The Debezium JSON messages for ``change``."""
        return self._inner.encode(change)

    def decoder_options(self, changes: Iterable[SourceChange]) -> Mapping[str, Any] | None:
        """``{"format_options": {"debezium-json": ...}}`` when Debezium needs options."""
        inner = self._inner.decoder_options(changes)
        return {"format_options": {self.event_format: dict(inner)}} if inner else None

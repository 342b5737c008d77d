"""Key columns of a source table: what a decoder looks up once per table, and the
fast path of :meth:`Decoder.require_key` for images that hold the declared key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdcflow.formats.base import Decoder, key_columns_for
from cdcflow.model import ChangeEvent, SourceTable

__all__ = ["TableInfo", "with_key"]


class TableInfo:
    """What a decoder looks up once per source table: its identity and configured keys."""

    __slots__ = ("source", "keys")

    def __init__(self, source: SourceTable, primary_keys: Any) -> None:
        self.source = source
        #: ``options.primary_keys`` for this table (a format may replace it with what
        #: the source declares, e.g. a DMS ``create-table`` record)
        self.keys: tuple[str, ...] | list[str] | None = key_columns_for(primary_keys, source)


def with_key(
    decoder: Decoder, event: ChangeEvent, image: dict[str, Any], declared: Sequence[str] | None
) -> ChangeEvent:
    """``decoder.require_key(event, declared)`` with a fast path for the common case:
    declared key columns that are all in ``image`` (the after image, else the before)."""
    if declared:
        if len(declared) == 1:
            c = declared[0]
            if c in image:
                event.key = {c: image[c]}
                return event
        elif all(c in image for c in declared):
            event.key = {c: image[c] for c in declared}
            return event
    return decoder.require_key(event, declared)

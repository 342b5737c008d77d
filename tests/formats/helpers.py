"""Helpers shared by the decoder tests."""

from __future__ import annotations

from typing import Any


def count_answers(monkeypatch: Any, cls: type, method: str) -> list[bool]:
    """Whether ``cls.method`` answered (returned something other than ``None``), per
    call from now on; for fast paths that may decline (``decode_flat``,
    ``decode_columnar``)."""
    answered: list[bool] = []
    original = getattr(cls, method)

    def counting(self, *args):
        result = original(self, *args)
        answered.append(result is not None)
        return result

    monkeypatch.setattr(cls, method, counting)
    return answered

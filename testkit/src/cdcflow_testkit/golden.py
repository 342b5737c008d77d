"""Golden-case files for format tests (see ``tests/formats/test_golden.py``)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from cdcflow.formats.base import Decoder, Record
from cdcflow.model import Origin, dumps, event_to_json_dict

__all__ = ["GoldenCase", "decode_case", "load_case", "render_case"]


@dataclass(frozen=True)
class GoldenCase:
    name: str
    records: list[Record]
    options: dict[str, Any] | None


def _values(path: Path) -> list[bytes | None]:
    if path.suffix == ".b64":
        return [base64.b64decode(x) for x in path.read_text().splitlines() if x.strip()]
    out: list[bytes | None] = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        out.append(None if line.strip() == b"null" else line)
    return out


def load_case(expected_path: Path) -> GoldenCase:
    """Load the case that ``expected_path`` (``<scenario>.expected.jsonl``) belongs to."""
    stem = expected_path.name.removesuffix(".expected.jsonl")
    folder = expected_path.parent
    inputs = [
        p for p in (folder / f"{stem}.input.jsonl", folder / f"{stem}.input.b64") if p.exists()
    ]
    if len(inputs) != 1:
        raise FileNotFoundError(f"{folder}/{stem}: need exactly one .input.jsonl or .input.b64")
    values = _values(inputs[0])
    keys_path = folder / f"{stem}.keys.jsonl"
    keys: list[bytes | None] = _values(keys_path) if keys_path.exists() else [None] * len(values)
    if len(keys) != len(values):
        raise ValueError(f"{keys_path}: {len(keys)} keys for {len(values)} values")
    opts_path = folder / f"{stem}.options.json"
    options = json.loads(opts_path.read_text()) if opts_path.exists() else None
    records = [
        Record(value=v, key=k, origin=Origin(topic=stem, partition=0, offset=i))
        for i, (v, k) in enumerate(zip(values, keys, strict=True))
    ]
    return GoldenCase(stem, records, options)


def decode_case(decoder: Decoder, case: GoldenCase) -> list[Any]:
    """Decode a case into the JSON-able list its expected file holds."""
    result = decoder.decode_batch(case.records)
    out: list[Any] = [orjson.loads(dumps(event_to_json_dict(e))) for e in result.events]
    tail = [
        (s.origin.offset, {"skipped": s.reason, "line": s.origin.offset}) for s in result.skipped
    ]
    tail += [
        (d.origin.offset, {"dead_letter": d.code, "line": d.origin.offset})
        for d in result.dead_letters
    ]
    out.extend(item for _, item in sorted(tail, key=lambda t: t[0]))
    return out


def render_case(decoder: Decoder, case: GoldenCase) -> str:
    """The expected-file text for a case, to be *reviewed by hand* before it is committed."""
    return "".join(dumps(x).decode() + "\n" for x in decode_case(decoder, case))

"""Golden tests: every case under ``tests/formats/cases/<format>/`` decodes as expected.

A case is ``<scenario>.input.jsonl`` (one Kafka message value per line, ``null`` for a
tombstone) or ``<scenario>.input.b64`` (one base64 value per line, for binary formats),
beside ``<scenario>.expected.jsonl``. Optional siblings:

* ``<scenario>.keys.jsonl`` -- the Kafka message key of each input line (``null``: none);
* ``<scenario>.options.json`` -- decoder options (e.g. ``{"primary_keys": {...}}``).

The expected file holds every decoded event (``cdcflow decode`` form) in order, then one
``{"skipped": REASON, "line": N}`` or ``{"dead_letter": CODE, "line": N}`` per record
that was skipped or dead-lettered (N is the 0-based input line). Each folder's
``SOURCES.md`` says where every input came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdcflow.formats import decoder_for, format_names
from cdcflow_testkit.golden import decode_case, load_case

CASES = Path(__file__).parent / "cases"


def _cases() -> list[Path]:
    return sorted(p for p in CASES.glob("*/*.expected.jsonl"))


@pytest.mark.parametrize("expected_path", _cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_case(expected_path: Path) -> None:
    fmt = expected_path.parent.name
    case = load_case(expected_path)
    decoder = decoder_for(fmt, case.options)
    got = decode_case(decoder, case)
    want = [json.loads(line) for line in expected_path.read_text().splitlines() if line.strip()]
    assert got == want


def test_every_case_folder_is_a_registered_format_with_sources() -> None:
    for folder in sorted(p for p in CASES.iterdir() if p.is_dir()):
        assert folder.name in format_names(), f"{folder.name} is not a registered format"
        assert (folder / "SOURCES.md").is_file(), f"{folder} must say where its inputs came from"

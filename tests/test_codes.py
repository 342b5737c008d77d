"""The code tables of docs/semantics.md ("Codes") and the enums hold the same names."""

from __future__ import annotations

import re
from pathlib import Path

from cdcflow.errors import Code, SkipReason

SEMANTICS = Path(__file__).resolve().parents[1] / "docs" / "semantics.md"


def _documented(header: str) -> list[str]:
    """The first-column names of the markdown table whose header row starts with ``header``."""
    lines = SEMANTICS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    names = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names.append(re.match(r"\| `([A-Z_]+)` \|", line).group(1))
    return names


def test_every_code_is_documented_once_and_no_other():
    documented = _documented("code")
    assert len(documented) == len(set(documented))
    assert set(documented) == {c.value for c in Code}


def test_every_skip_reason_is_documented_once_and_no_other():
    documented = _documented("skip reason")
    assert len(documented) == len(set(documented))
    assert set(documented) == {r.value for r in SkipReason}


def test_codes_are_their_own_names():
    for member in [*Code, *SkipReason]:
        assert member == member.name and f"{member}" == member.name


def test_every_event_that_changes_no_rows_has_its_skip_reason():
    from cdcflow.model import Op
    from cdcflow.transform.router import TABLE_OPS

    for op in set(Op) - {Op(o) for o in TABLE_OPS.to_pylist()}:
        assert SkipReason(op.upper()) == op.upper()

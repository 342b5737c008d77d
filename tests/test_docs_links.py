"""The documents' own links resolve, and the decisions are one file each, all in the index.

Every relative link of README.md, CHANGELOG.md and docs/ (inline ``[text](path#anchor)``
and reference definitions ``[label]: path``) must name a file of the checkout, and an
anchor must be a heading of that file as GitHub makes anchors of headings. Each
``docs/decisions/NNNN-title.md`` starts with its number and a ``Status:`` line, and
``docs/decisions/README.md`` lists every one of them once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DECISIONS = ROOT / "docs" / "decisions"

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_INLINE = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_DEFINITION = re.compile(r"^\[[^\]\n]+\]:\s*(\S+)", re.M)
_HEADING = re.compile(r"^#{1,6} +(.*?) *#*$", re.M)


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _links(text: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and code spans left out."""
    text = _CODE.sub("", _FENCE.sub("", text))
    return _INLINE.findall(text) + _DEFINITION.findall(text)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-`` (links and code spans keep their text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_anchor(h) for h in _HEADING.findall(_FENCE.sub("", path.read_text()))}


def broken_links(root: Path, documents: list[Path]) -> list[str]:
    """``document: target`` for each relative link whose file or anchor does not exist
    (documents named relative to ``root``)."""
    broken = []
    for doc in documents:
        for target in _links(doc.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists() or (anchor and file.is_file() and anchor not in _anchors(file)):
                broken.append(f"{doc.relative_to(root)}: {target}")
    return broken


def test_the_documents_links_resolve():
    assert broken_links(ROOT, _documents()) == []


def test_the_check_finds_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Top part\n\n## Codes\n")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md) [ok](a.md#top-part) [ok](#here) [web](https://example.com/x.md)\n"
        "# Here\n`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n"
        "[gone](missing.md) [bad](a.md#nowhere)\n[ref]: also-missing.md\n"
    )
    assert broken_links(tmp_path, [doc]) == [
        "b.md: missing.md",
        "b.md: a.md#nowhere",
        "b.md: also-missing.md",
    ]


def _decision_files() -> list[Path]:
    return sorted(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))


def test_the_decisions_are_numbered_without_gaps():
    numbers = [int(p.name[:4]) for p in _decision_files()]
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(numbers) >= 59


@pytest.mark.parametrize("path", _decision_files(), ids=lambda p: p.name[:4])
def test_a_decision_states_its_number_and_status(path):
    lines = path.read_text().splitlines()
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", path.stem[5:]), "a kebab-case title"
    assert lines[0].startswith(f"# {int(path.name[:4])}. ")
    status = next((line for line in lines[1:6] if line.startswith("Status: ")), None)
    assert status, "a Status: line under the heading"
    assert re.match(r"Status: (Accepted|Superseded by \[\d{4}\]\(\d{4}-[a-z0-9-]+\.md\))", status)


def test_the_index_lists_every_decision_once():
    index = (DECISIONS / "README.md").read_text()
    rows = re.findall(r"^\| (\d{4}) \| \[[^\n]*?\]\((\d{4}-[a-z0-9-]+\.md)\) \|", index, re.M)
    assert [name for _, name in rows] == [p.name for p in _decision_files()]
    assert all(name.startswith(number) for number, name in rows)

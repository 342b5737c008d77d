"""The parse trees of every expression the tests and the docs use, kept as they are.

``expression_trees.json`` holds, for each text, the tree :func:`parse_expression` gives
(node kind, source span, operator or value, arguments, literal parameters) and whether
:func:`parse_filter` accepts it. A change of the parser (a library's parser in place of
the hand-written one) must give the same trees: this test fails, naming the text, when
one differs. Regenerate the file only for a change of the language itself:
``python -m tests.transform.test_expression_trees``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdcflow.transform.expressions import parse_expression, parse_filter

GOLDEN = Path(__file__).with_name("expression_trees.json")


def tree(node: Any) -> list[Any]:
    """A parse tree as JSON: ``[kind, start, end, ...]`` (the nodes' dataclass fields)."""
    kind = type(node).__name__.lstrip("_").lower()
    if kind == "literal":
        return [kind, node.start, node.end, repr(node.value), str(node.type)]
    if kind == "column":
        return [kind, node.start, node.end, node.name]
    return [
        kind,
        node.start,
        node.end,
        node.op,
        [tree(a) for a in node.args],
        [repr(p) for p in node.params],
    ]


def _accepts_filter(text: str) -> bool:
    try:
        parse_filter(text)
    except ValueError:
        return False
    return True


def observed(text: str) -> dict[str, Any]:
    expr = parse_expression(text)
    return {
        "columns": list(expr.columns),
        "tree": tree(expr._root),
        "filter": _accepts_filter(text),
    }


CASES = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


def test_the_golden_file_holds_the_docs_examples():
    for text in ("country = 'FR' AND NOT test_account", "date_format(placed_at, '%Y-%m')"):
        assert text in CASES
    assert len(CASES) > 400


@pytest.mark.parametrize("text", sorted(CASES))
def test_each_expression_parses_to_its_kept_tree(text):
    assert observed(text) == CASES[text]


if __name__ == "__main__":  # regenerate from texts given one per line on stdin
    import sys

    texts = [line.rstrip("\n") for line in sys.stdin if line.strip()]
    lines = [f"{json.dumps(t)}: {json.dumps(observed(t))}" for t in sorted(set(texts))]
    GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one expression a line

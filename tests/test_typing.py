"""The product's types stay honest: every ``# type: ignore`` names its error code and says
why mypy cannot be right there, on the same line.

mypy itself runs in ``make lint`` (configuration in pyproject.toml: ``warn_unused_ignores``
and ``ignore-without-code`` are on, so an ignore that hides nothing or names no code fails
there); this test adds what mypy cannot check: the reason a reader needs.
"""

from __future__ import annotations

import re
from pathlib import Path

PRODUCT = Path(__file__).resolve().parents[1] / "src" / "cdcflow"

#: ``# type: ignore[code, ...]  # reason`` with a reason of at least a few words
_EXPLAINED = re.compile(r"#\s*type:\s*ignore\[[a-z0-9_-]+(,\s*[a-z0-9_-]+)*\]\s+#\s*\S.{8,}")


def unexplained_ignores(root: Path) -> list[str]:
    """``file:line`` of each ``type: ignore`` below ``root`` without a code and a reason."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"#\s*type:\s*ignore", line) and not _EXPLAINED.search(line):
                found.append(f"{path.relative_to(root)}:{n}")
    return found


def test_every_type_ignore_names_its_code_and_its_reason(tmp_path):
    assert unexplained_ignores(PRODUCT) == []
    # the check can fail: a bare ignore, and one with a code but no reason, are named
    (tmp_path / "x.py").write_text(
        "a = f()  # type: ignore\n"
        "b = g()  # type: ignore[arg-type]\n"
        "c = h()  # type: ignore[arg-type]  # h's stub says str; it returns bytes\n"
    )
    assert unexplained_ignores(tmp_path) == ["x.py:1", "x.py:2"]

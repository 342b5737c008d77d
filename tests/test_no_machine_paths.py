"""No tracked file names a path that exists on one machine only: a fresh clone elsewhere
must run every test and follow every citation. Test data from other projects is vendored
under ``tests/`` with its origin (``tests/formats/corpus/SOURCES.md``); documents are cited
by title and public address."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: a development machine's folders: the workspace, its shared folder, home folders (not
#: preceded by a word character or a dot, so a URL with a ``work`` folder does not count)
#: (written in pieces, like the paths planted below, so that this file names none of them
#: and is checked like any other)
WORK, SHARED, HOME = "/" + "work/", ".." + "/shared/", "/" + "home/"
MACHINE_PATH = re.compile(rf"(?<![\w.])({re.escape(WORK)}|{re.escape(SHARED)}|{HOME}[a-z])")

#: tracked files allowed to name such a path, each with the reason why. Empty.
ALLOWED: frozenset[str] = frozenset()


def machine_paths(root: Path, files: list[str]) -> list[str]:
    """``file:line: text`` for each line of a text file among ``files`` that names one."""
    found = []
    for name in files:
        data = (root / name).read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    return found


def tracked_files() -> list[str]:
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [
        name
        for name in listing.split("\0")
        if name and (ROOT / name).is_file() and name not in ALLOWED
    ]


def test_no_tracked_file_names_a_path_of_this_machine():
    assert machine_paths(ROOT, tracked_files()) == []


def test_the_check_finds_one(tmp_path):
    (tmp_path / "a.py").write_text(f'DATA = "{WORK}main/data.csv"\nok = "/work"\n')
    (tmp_path / "b.md").write_text(f"see {SHARED}seeds/x.txt\nsee https://example.com{WORK}x\n")
    (tmp_path / "c.bin").write_bytes(b"\0" + WORK.encode() + b"shared")
    (tmp_path / "d.txt").write_text(f"{HOME}alice/notes\n")
    assert machine_paths(tmp_path, ["a.py", "b.md", "c.bin", "d.txt"]) == [
        f'a.py:1: DATA = "{WORK}main/data.csv"',
        f"b.md:1: see {SHARED}seeds/x.txt",
        f"d.txt:1: {HOME}alice/notes",
    ]

"""Storage as operators find it broken, for the fault tests: a small full volume, a Delta
log whose last commit file a crash cut in half."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def tmpfs(path: pathlib.Path, size: str) -> Iterator[pathlib.Path]:
    """A real tmpfs of ``size`` (``"8m"``) mounted at ``path`` (created), unmounted after.

    Skips the test, with the reason, where this process may not mount one.
    """
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill a volume: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(volume: pathlib.Path) -> pathlib.Path:
    """Fill ``volume`` to the last byte with one file; returns it (delete it to free)."""
    filler = volume / "filler"
    st = os.statvfs(volume)
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize))
    return filler


def truncate_last_commit(table_path: str) -> tuple[pathlib.Path, bytes]:
    """Cut the last commit file of a Delta table's ``_delta_log`` in half; returns the file
    and its whole content (write it back to repair the table)."""
    last = sorted((pathlib.Path(table_path) / "_delta_log").glob("*.json"))[-1]
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    return last, data

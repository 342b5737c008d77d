"""The clock of a Delta log's clean-up, moved instead of waited for.

delta-rs removes a commit file once its last-modified time (the file's mtime on a local
disk) is older than the table's ``delta.logRetentionDuration``; tests of that clean-up
age the files they mean to be expired instead of sleeping past the retention.
"""

from __future__ import annotations

import os
import time


def age_log(table_path: str, seconds: float) -> int:
    """Set the mtime of every file in ``table_path``'s ``_delta_log`` ``seconds`` into the
    past, as if they were written that long ago; returns how many files."""
    log = os.path.join(table_path, "_delta_log")
    then = time.time() - seconds
    names = [n for n in os.listdir(log) if os.path.isfile(os.path.join(log, n))]
    for name in names:
        os.utime(os.path.join(log, name), (then, then))
    return len(names)

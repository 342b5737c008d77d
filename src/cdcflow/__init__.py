"""cdcflow: Kafka CDC topics to Delta Lake tables on PySpark.

The library's front door (each name is imported on first use, so ``import cdcflow`` stays
light):

- :func:`run` -- run a pipeline under its lease (``cdcflow run``);
- :func:`load_config` -- read and check a YAML configuration (``ConfigError`` names the key);
- :func:`reset`, :func:`plan_reset` -- start sources over (``cdcflow reset``);
- :func:`maintain` -- compact, vacuum and clean up every table now (``cdcflow maintain``);
- :func:`decode_files`, :func:`apply_files` -- message files through the same decode and
  apply path (``cdcflow decode``, ``cdcflow apply``);
- :class:`Pipeline` -- a pipeline on the user's SparkSession, run under its lease
  (``cdcflow.Pipeline(config, spark=spark).run(once=True)``); :func:`read_changes` -- the
  decoded change stream as a streaming DataFrame (:mod:`cdcflow.api`);
- :func:`status` -- what ``cdcflow status`` shows, as data.

``cdcflow.runtime.pipeline.Pipeline`` is the bare engine under :func:`run`, without the lease.

See README.md for the two commands, and docs/ for formats, semantics and decisions.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("cdcflow")
except PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"

#: public name -> the module that defines it
_EXPORTS = {
    "run": "cdcflow.runtime.runner",
    "load_config": "cdcflow.config",
    "reset": "cdcflow.commands.reset",
    "maintain": "cdcflow.commands.maintain",
    "plan_reset": "cdcflow.commands.reset",
    "decode_files": "cdcflow.commands.files",
    "apply_files": "cdcflow.commands.files",
    "Pipeline": "cdcflow.api",
    "read_changes": "cdcflow.api",
    "status": "cdcflow.commands.status",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cdcflow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

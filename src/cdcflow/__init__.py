"""cdcflow: Kafka CDC topics to Delta Lake tables on PySpark.

See README.md for the two commands, and docs/ for formats, semantics and decisions.
"""

__version__ = "0.1.0"


def run(config, *, once: bool = False):
    """Run a pipeline under its lease: :func:`cdcflow.runner.run` (imported on call, so
    ``import cdcflow`` stays light)."""
    from cdcflow.runner import run as run_under_lease

    return run_under_lease(config, once=once)

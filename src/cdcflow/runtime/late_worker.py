"""Spark's Python worker late to start: the query started again, a few times.

The pipeline's Kafka source is a Python data source (:mod:`cdcflow.source.kafka.datasource`):
Spark plans each micro-batch's reads in a Python process it starts on the driver, and waits
**10 seconds** (a constant of Spark 4.2's ``PythonWorkerFactory``, no setting) for it to
connect back. On a host whose cores are all busy, starting Python and importing
``pyspark.worker`` can take longer; the query then fails with ``Python worker failed to
connect back`` (seen once in a CI run here, three test lanes on two cores, as the
query started). Whatever micro-batch that was, a query started again resumes from its
checkpoint exactly as a new run would (:mod:`cdcflow.runtime.store_outage` says why that
is safe: an apply is idempotent on Kafka offsets, an interrupted one is finished first),
so :meth:`~cdcflow.runtime.pipeline.Pipeline.run` starts it again, at
most :data:`RETRIES` times in a row (a micro-batch applied resets the count), one console
line each. Past that, the error stops the run: a host that cannot start a Python process
in 10 s four times running needs fewer jobs on it, not more waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RETRIES", "SPARK_MESSAGES", "LateWorker"]

#: restarts in a row before the error stops the run
RETRIES = 3

#: how Spark 4.2 says it (``SparkException`` and its ``SocketTimeoutException`` cause)
SPARK_MESSAGES = (
    "Python worker failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
)


class LateWorker:
    """Counts a run's query failures on a late Python worker.

    Args:
        say: where the console line of each restart goes.
        retries: restarts in a row before :meth:`failed` says no.
        sleep: waits between a failure and the restart (seconds); tests pass their own.
    """

    def __init__(
        self,
        say: Callable[[str], None],
        retries: int = RETRIES,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.say = say
        self.retries = retries
        self.sleep = sleep
        #: restarts since the last applied micro-batch
        self.restarts = 0

    def failed(self, exc: BaseException) -> bool:
        """``True`` when ``exc`` is Spark's late worker and a restart is left (said, and
        counted, after a pause of ``restarts`` seconds); ``False`` for any other error,
        or when the restarts are spent."""
        if not any(message in str(exc) for message in SPARK_MESSAGES):
            return False
        if self.restarts >= self.retries:
            return False
        self.restarts += 1
        self.say(
            "Spark's Python worker did not connect back within Spark's 10 s (a busy host); "
            f"restarting the query from its checkpoint (restart {self.restarts} of "
            f"{self.retries})"
        )
        self.sleep(float(self.restarts))
        return True

    def ok(self) -> None:
        """A micro-batch applied: the count starts over."""
        self.restarts = 0

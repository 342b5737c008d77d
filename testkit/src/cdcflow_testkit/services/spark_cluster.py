"""A Spark standalone cluster on 127.0.0.1 -- a master and workers -- from the installed
PySpark, for tests of cdcflow's cluster path.

:class:`StandaloneCluster` runs ``spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker`` (PySpark's own ``bin/spark-class``) with free ports and no web
UI; each worker offers ``cores`` cores and ``memory`` of memory to executors. A pipeline
reaches it with ``CDCFLOW_SPARK_MASTER=<master_url>`` (``cdcflow.runtime.spark``). Executors run
the driver's Python (``PYSPARK_PYTHON``), so cdcflow must be importable there: on one
machine it is.

Source document: Spark's *Spark Standalone Mode* (starting a cluster manually).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from cdcflow_testkit.services.broker import BrokerError
from cdcflow_testkit.services.process import free_port, stop_process, wait_until

__all__ = ["SPARK_KAFKA_VERSION", "StandaloneCluster", "spark_kafka_jars"]

#: Spark's Kafka connector (``spark-sql-kafka-0-10_2.13``): the installed PySpark's version
#: (4.2.0, the newest Spark that Maven Central's connector and Delta Lake's Spark jars
#: both exist for; docs/decisions.md, 39)
SPARK_KAFKA_VERSION = "4.2.0"
#: the connector's jars that PySpark does not ship itself
_KAFKA_JARS = (
    "spark-sql-kafka-0-10_",
    "spark-token-provider-kafka-0-10_",
    "kafka-clients-",
    "commons-pool2-",
)


def spark_kafka_jars(version: str = SPARK_KAFKA_VERSION) -> list[str]:
    """Paths of Spark's Kafka connector jars (and the Kafka client it needs), resolved from
    Maven Central on first use, for ``--jars`` or ``spark.jars``.

    Raises:
        cdcflow_testkit.services.maven.MavenError: Maven is missing or could not resolve them.
    """
    from cdcflow_testkit.services.maven import maven_libs

    libs = maven_libs(
        f"spark-sql-kafka-{version}", [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"]
    )
    return sorted(str(p) for p in libs.iterdir() if p.name.startswith(_KAFKA_JARS))


class StandaloneCluster:
    """A master and ``workers`` workers, started by :meth:`start`, stopped by :meth:`stop`.

    Args:
        workers: number of workers.
        cores: cores each worker offers.
        memory: memory each worker offers (Spark's size syntax, e.g. ``"1500m"``).
        startup_timeout_s: how long to wait for every worker to register.

    Attributes:
        master_url: ``spark://127.0.0.1:<port>``.
        log_dir: the folder of the master's and workers' logs.
    """

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1500m",
        startup_timeout_s: float = 90.0,
    ) -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.startup_timeout_s = startup_timeout_s
        self.master_url: str | None = None
        self.log_dir: str | None = None
        self._procs: list[subprocess.Popen] = []

    @staticmethod
    def _spark_class() -> str:
        import pyspark

        return str(Path(pyspark.__file__).parent / "bin" / "spark-class")

    def _launch(self, name: str, args: list[str]) -> subprocess.Popen:
        assert self.log_dir is not None
        env = {
            **os.environ,
            "SPARK_LOG_DIR": self.log_dir,
            "SPARK_WORKER_DIR": os.path.join(self.log_dir, "work"),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            "SPARK_NO_DAEMONIZE": "1",
        }
        log = open(os.path.join(self.log_dir, f"{name}.log"), "wb")  # noqa: SIM115
        with log:
            proc = subprocess.Popen(
                [self._spark_class(), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; wait until every worker registered.

        Raises:
            BrokerError: a process exited or the workers did not register in time (the
                message names the log folder).
        """
        self.log_dir = tempfile.mkdtemp(prefix="cdcflow-spark-cluster-")
        port = free_port("127.0.0.1")
        self.master_url = f"spark://127.0.0.1:{port}"
        try:
            self._launch(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(free_port("127.0.0.1")),
                ],
            )
            for i in range(self.workers):
                self._launch(
                    f"worker-{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--webui-port",
                        str(free_port("127.0.0.1")),
                        self.master_url,
                    ],
                )
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self) -> None:
        assert self.log_dir is not None
        master_log = Path(self.log_dir) / "master.log"

        def registered() -> bool:
            text = master_log.read_text(errors="replace") if master_log.exists() else ""
            return len(re.findall(r"Registering worker", text)) >= self.workers

        wait_until(
            registered,
            name=f"a Spark standalone cluster of {self.workers} workers at {self.master_url}",
            log=self.log_dir,
            timeout_s=self.startup_timeout_s,
            processes=self._procs,
            error=BrokerError,
        )

    def app_ids(self) -> list[str]:
        """The applications the workers ran, oldest first (``app-<time>-<n>``)."""
        assert self.log_dir is not None
        return sorted(p.name for p in Path(self.log_dir).glob("work/app-*"))

    def app_logs(self, app_id: str) -> str:
        """The text of every executor's stderr of application ``app_id``."""
        assert self.log_dir is not None
        folder = Path(self.log_dir) / "work" / app_id
        return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*/stderr")))

    def last_app_logs(self) -> str:
        """:meth:`app_logs` of the application that started last; empty before any."""
        apps = self.app_ids()
        return self.app_logs(apps[-1]) if apps else ""

    def stop(self) -> None:
        """Stop the workers and the master. Idempotent; the logs stay in :attr:`log_dir`."""
        procs, self._procs = self._procs, []
        for proc in reversed(procs):
            with contextlib.suppress(Exception):
                stop_process(proc, grace_s=10.0)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


if __name__ == "__main__":  # python -m cdcflow_testkit.services.spark_cluster: resolve the jars
    from cdcflow_testkit.services.maven import MavenError

    try:
        print("\n".join(spark_kafka_jars()))
    except MavenError as exc:
        print(f"cdcflow: {exc}", file=sys.stderr)
        sys.exit(1)

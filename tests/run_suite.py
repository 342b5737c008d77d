"""`make test`: the whole suite as three pytest runs side by side.

On this 2-core machine the suite spends much of its wall time waiting: JVM start-ups, the
sleeps of a broker outage, a database's recovery. Run serially it used 17 CPU-minutes in
29.5 wall minutes. So it runs in three lanes, each a pytest session of its own, split by
the tests' marks:

========  ==========================================  ==================================
lane      tests                                        why apart
========  ==========================================  ==================================
spark     ``-m spark``: a SparkSession (local or the   the long pole; its output streams
          cluster), most of them a broker too          to the terminal
brokers   ``-m "(kafka or services) and not spark"``:  mostly waiting (outages, restarts,
          brokers, Kafka Connect, kills, stores       SIGKILLs): it fits beside Spark,
                                                       at ``nice 5`` (its runs on S3 took
                                                       CPU the long pole needed)
python    everything else: plain Python               CPU only, no port, no JVM; at a
                                                       lower CPU priority (``nice``)
========  ==========================================  ==================================

Each lane has its own session fixtures (a lane that needs a broker starts its own) and its
own ``--basetemp``, and only the spark lane keeps pytest's cache. pytest-xdist cannot make
this split: its ``loadgroup`` did not keep marked tests on one worker here (pytest 9.2,
xdist 3.8), and spread over two workers two Spark tests at once competed and one failed.

The spark lane's output streams as it runs; the other lanes' are kept in files and printed
after it, then one line of the whole suite's wall time against its budget
(``CDCFLOW_SUITE_BUDGET_S``, 25 minutes). The exit status is the first non-zero of the
lanes. Extra arguments go to every lane (``python tests/run_suite.py -x``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: (lane, marker expression, CPU niceness); the first lane streams to the terminal
LANES: tuple[tuple[str, str, int], ...] = (
    ("spark", "spark", 0),
    ("brokers", "(kafka or services) and not spark", 5),
    ("python", "not spark and not kafka and not services", 10),
)
SUITE_BUDGET_S = float(os.environ.get("CDCFLOW_SUITE_BUDGET_S", 25 * 60))


def main(argv: list[str]) -> int:
    started = time.monotonic()
    pytest = [sys.executable, "-m", "pytest"]
    with tempfile.TemporaryDirectory(prefix="cdcflow-suite-") as tmp:
        background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        codes: list[int] = []
        try:
            for lane, marks, nice in LANES[1:]:
                log_path = Path(tmp) / f"{lane}.log"
                with log_path.open("wb") as log:  # the child keeps its own descriptor
                    command = [*pytest, "-m", marks, "-p", "no:cacheprovider"]
                    command += [f"--basetemp={tmp}/{lane}", "--durations=15", *argv]
                    background.append(
                        (
                            lane,
                            subprocess.Popen(
                                ["nice", "-n", str(nice), *command],
                                stdout=log,
                                stderr=subprocess.STDOUT,
                            ),
                            log_path,
                        )
                    )
            lane, marks, _ = LANES[0]
            codes.append(subprocess.call([*pytest, "-m", marks, "--durations=40", *argv]))
        finally:
            codes += [proc.wait() for _, proc, _ in background]
        for lane, _, log_path in background:
            print(f"\n{'=' * 30} lane {lane} (run beside the spark lane) {'=' * 30}")
            sys.stdout.write(log_path.read_text(errors="replace"))
    elapsed_s = time.monotonic() - started
    line = f"whole suite {elapsed_s:.0f} s in {len(LANES)} lanes (budget {SUITE_BUDGET_S:.0f} s)"
    if elapsed_s > SUITE_BUDGET_S:
        line = (
            f"WARNING {line}: over by {elapsed_s - SUITE_BUDGET_S:.0f} s; see the durations above"
        )
    print(line)
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

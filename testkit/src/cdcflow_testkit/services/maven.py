"""Jars from Maven Central for the test kit's Java parts (Apache Kafka, Kafka Connect,
Debezium), resolved once with ``mvn`` into a cache folder.

The cache folder is ``$CDCFLOW_CACHE/cdcflow``, else ``$XDG_CACHE_HOME/cdcflow``, else
``~/.cache/cdcflow``; each set of artifacts gets a folder of its own with the ``pom.xml``
that resolved it and a ``libs`` folder of jars (the artifacts and their runtime
dependencies, ``mvn dependency:copy-dependencies``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cdcflow.errors import CdcflowError

__all__ = ["MavenError", "cache_root", "maven_libs", "run_maven"]

_POM_HEAD = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.cdcflow.testing</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
"""
_DEPENDENCY = """    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>{exclusions}
    </dependency>
"""
_EXCLUSION = """
        <exclusion><groupId>{group}</groupId><artifactId>{artifact}</artifactId></exclusion>"""
_POM_TAIL = """  </dependencies>
</project>
"""


class MavenError(CdcflowError):
    """Maven is missing, or could not resolve the artifacts."""


def run_maven(args: Sequence[str], log: Path, what: str) -> None:
    """``mvn -B -q <args>`` with its output in ``log``.

    Raises:
        MavenError: ``what`` failed: the exit code, Maven's first "Failed to ..." line
            (it names the artifact or goal) or else its first error lines, and the log.
    """
    with open(log, "wb") as out:
        run = subprocess.run(
            ["mvn", "-B", "-q", *args], stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if run.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()
        failed = [line for line in lines if "] Failed to" in line][:1]
        failed = failed or [line for line in lines if "[ERROR]" in line][:2] or lines[-5:]
        raise MavenError(f"{what} failed (exit {run.returncode}): {' | '.join(failed)}; log: {log}")


def cache_root() -> Path:
    """The folder the test kit keeps downloaded parts in (module docstring)."""
    base = os.environ.get("CDCFLOW_CACHE") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "cdcflow" if base else Path.home() / ".cache" / "cdcflow"


def maven_libs(name: str, artifacts: Sequence[str], exclusions: Sequence[str] = ()) -> Path:
    """The folder of the jars of ``artifacts`` (``group:artifact:version``) and their
    runtime dependencies, resolved with ``mvn`` on first use under :func:`cache_root`
    ``/name``. ``exclusions`` (``group:artifact``, ``*`` for any artifact of a group)
    are left out of every artifact's dependencies: a dependency Maven Central does not
    serve, or classes the host process provides.

    Raises:
        MavenError: ``mvn`` is missing or could not resolve the artifacts (the tail of its
            output is in the message).
    """
    home = cache_root() / name
    libs = home / "libs"
    done = home / ".resolved"
    if done.exists():
        return libs
    if shutil.which("mvn") is None:
        raise MavenError(
            f"the jars of {', '.join(artifacts)} are resolved with Maven: install it "
            f"(apt-get install maven), or put them in {libs} and create {done}"
        )
    home.mkdir(parents=True, exist_ok=True)
    excluded = ""
    if exclusions:
        body = "".join(
            _EXCLUSION.format(group=g, artifact=a) for g, a in (e.split(":") for e in exclusions)
        )
        excluded = f"\n      <exclusions>{body}\n      </exclusions>"
    deps = []
    for coordinates in artifacts:
        group, artifact, version = coordinates.split(":")
        deps.append(
            _DEPENDENCY.format(group=group, artifact=artifact, version=version, exclusions=excluded)
        )
    (home / "pom.xml").write_text(_POM_HEAD.format(name=name) + "".join(deps) + _POM_TAIL)
    tmp = Path(tempfile.mkdtemp(prefix="libs-", dir=home))
    args = ["-f", str(home / "pom.xml"), "dependency:copy-dependencies"]
    try:
        run_maven(
            [*args, f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
            home / "mvn.log",
            f"resolving {', '.join(artifacts)}",
        )
    except MavenError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)
    done.touch()
    return libs

"""Apicurio Registry on 127.0.0.1, for tests of Avro through a schema registry.

:class:`ApicurioRegistry` runs Apicurio Registry 2.4.2.Final with its in-memory storage on
a free port. Its Confluent-compatible API (``/apis/ccompat/v6``) is what cdcflow's
``debezium-avro`` decoder reads; its own API (``/apis/registry/v2``) is what Apicurio's
Kafka Connect ``AvroConverter`` (:func:`converter_libs`) registers schemas through.

Apicurio publishes the registry as a Quarkus application's *classes*
(``io.apicurio:apicurio-registry-app``), not as a runnable jar. :func:`registry_jar`
builds one once with Maven into the test kit's cache (about 130 MB, 20 s): it unpacks the
app, lets ``quarkus-maven-plugin`` (Quarkus 2.16.4.Final, the release the app was built
with) assemble it, and adds one class (:data:`_PRODUCER`) that stands in for a build step
of an Apicurio extension Maven Central does not serve. What Maven Central lacks:

* Apicurio 2.5 to 3.3's ``apicurio-registry-schema-util-provider`` or parent POMs (so
  2.4.2.Final is the newest release that resolves here);
* ``org.everit.json.schema`` (JSON Schema support; on JitPack only): left out, so this
  registry stores Avro and Protobuf schemas but cannot check JSON Schemas;
* ``apicurio-common-app-components-config-index-deployment``: its runtime part is left out
  and the list of dynamic settings it would generate is empty (none can be changed
  through the admin API).

Source documents: Apicurio Registry 2.4 documentation, "Installing Apicurio Registry
using in-memory storage", "Configuring Kafka serializers/deserializers" (``as-confluent``,
``use-id``, ``headers.enabled``), "Confluent Schema Registry API compatibility".
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cdcflow_testkit.services.broker import BrokerError
from cdcflow_testkit.services.maven import MavenError, cache_root, maven_libs, run_maven
from cdcflow_testkit.services.process import ManagedProcess, free_port, java_executable

__all__ = [
    "APICURIO_VERSION",
    "ApicurioRegistry",
    "converter_libs",
    "registry_jar",
]

#: Apicurio Registry's release: the newest whose application resolves from Maven Central
APICURIO_VERSION = "2.4.2.Final"
#: the Quarkus release Apicurio 2.4.2.Final is built with (its parent POM's quarkus.version)
QUARKUS_VERSION = "2.16.4.Final"

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.cdcflow.testing</groupId>
  <artifactId>apicurio-registry</artifactId>
  <version>{version}</version>
  <packaging>jar</packaging>
  <properties>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>io.quarkus</groupId>
        <artifactId>quarkus-bom</artifactId>
        <version>{quarkus}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>io.apicurio</groupId>
      <artifactId>apicurio-registry-app</artifactId>
      <version>{version}</version>
      <type>pom</type>
      <exclusions>
        <exclusion>
          <groupId>io.apicurio</groupId>
          <artifactId>apicurio-common-app-components-config-index</artifactId>
        </exclusion>
        <exclusion>
          <groupId>com.github.everit-org.json-schema</groupId>
          <artifactId>org.everit.json.schema</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-compiler-plugin</artifactId>
        <version>3.13.0</version>
        <configuration><release>11</release></configuration>
      </plugin>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>3.8.1</version>
        <executions>
          <execution>
            <id>unpack-app</id>
            <phase>generate-resources</phase>
            <goals><goal>unpack</goal></goals>
            <configuration>
              <artifactItems>
                <artifactItem>
                  <groupId>io.apicurio</groupId>
                  <artifactId>apicurio-registry-app</artifactId>
                  <version>{version}</version>
                  <type>jar</type>
                  <outputDirectory>${{project.build.outputDirectory}}</outputDirectory>
                </artifactItem>
              </artifactItems>
            </configuration>
          </execution>
        </executions>
      </plugin>
      <plugin>
        <groupId>io.quarkus</groupId>
        <artifactId>quarkus-maven-plugin</artifactId>
        <version>{quarkus}</version>
        <executions>
          <execution><goals><goal>build</goal></goals></execution>
        </executions>
      </plugin>
    </plugins>
  </build>
</project>
"""

#: What the left-out build step would generate: the (here empty) list of the settings an
#: administrator may change while the registry runs.
_PRODUCER = """package io.cdcflow.testing;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.inject.Produces;

@ApplicationScoped
public class DynamicConfigProducer {
    @Produces
    @ApplicationScoped
    DynamicConfigPropertyList dynamicConfigProperties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
"""


def registry_jar() -> Path:
    """The runnable jar of Apicurio Registry (module docstring), built on first use under
    the test kit's cache folder.

    Raises:
        MavenError: Maven is missing, or the build failed (its first error line is in the
            message; the build's folder and log are kept).
    """
    home = cache_root() / f"apicurio-registry-{APICURIO_VERSION}"
    jar = home / "target" / f"apicurio-registry-{APICURIO_VERSION}-runner.jar"
    done = home / ".built"
    if done.exists() and jar.exists():
        return jar
    if shutil.which("mvn") is None:
        raise MavenError(
            "Apicurio Registry is built from Maven Central's artifacts with Maven: install "
            "it (apt-get install maven)"
        )
    shutil.rmtree(home, ignore_errors=True)
    source = home / "src" / "main" / "java" / "io" / "cdcflow" / "testing"
    source.mkdir(parents=True)
    (source / "DynamicConfigProducer.java").write_text(_PRODUCER)
    (home / "pom.xml").write_text(_POM.format(version=APICURIO_VERSION, quarkus=QUARKUS_VERSION))
    log = home / "build.log"
    what = f"building Apicurio Registry {APICURIO_VERSION}"
    run_maven(["-f", str(home / "pom.xml"), "package", "-DskipTests"], log, what)
    if not jar.exists():
        raise MavenError(f"{what} made no runner jar ({jar}); log: {log}")
    done.touch()
    return jar


def converter_libs() -> Path:
    """The jars of Apicurio's Kafka Connect converters (``AvroConverter``), as a Kafka
    Connect plugin folder: without Kafka's own classes, Jackson or SLF4J, which the
    worker provides.

    Raises:
        MavenError: Maven is missing or could not resolve them.
    """
    return maven_libs(
        f"apicurio-converter-{APICURIO_VERSION}",
        [f"io.apicurio:apicurio-registry-utils-converter:{APICURIO_VERSION}"],
        exclusions=[
            "org.apache.kafka:*",
            "com.fasterxml.jackson.core:*",
            "org.slf4j:*",
            "com.github.everit-org.json-schema:org.everit.json.schema",
        ],
    )


class ApicurioRegistry(ManagedProcess):
    """One Apicurio Registry with in-memory storage (schemas live until :meth:`stop`).

    Use as a context manager::

        with ApicurioRegistry() as registry:
            registry.ccompat_url   # http://127.0.0.1:PORT/apis/ccompat/v6

    Args:
        startup_timeout_s: how long :meth:`start` waits for the API to answer.

    Attributes:
        log_path: the registry's log file (kept when a start fails).
    """

    name = "Apicurio Registry"
    log_name = "registry.log"
    stop_grace_s = 10.0
    error = BrokerError

    def __init__(self, startup_timeout_s: float = 90.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.port: int | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self.port is None:
            raise BrokerError("the registry is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API: a Confluent client's ``url``."""
        return f"{self.url}/apis/ccompat/v6"

    @property
    def registry_url(self) -> str:
        """Apicurio's own API: the converter's ``apicurio.registry.url``."""
        return f"{self.url}/apis/registry/v2"

    def start(self) -> ApicurioRegistry:
        """Build the jar if needed, start the registry and wait until its API answers.

        Raises:
            MavenError: the jar cannot be built.
            BrokerError: the registry exited or did not answer within the timeout.
        """
        self._jar = registry_jar()
        return super().start()

    def _command(self, folder: str) -> list[str]:
        self.port = free_port("127.0.0.1")
        return [
            java_executable(),
            "-Xms64m",
            "-Xmx384m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.http.host=127.0.0.1",
            "-Dquarkus.management.enabled=false",
            "-Dquarkus.log.level=WARN",
            "-jar",
            str(self._jar),
        ]

    def _ready(self) -> bool:
        try:
            self.get("/apis/ccompat/v6/subjects")
            return True
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def get(self, path: str) -> Any:
        """``GET path`` on the registry, the JSON answer.

        Raises:
            urllib.error.HTTPError: the registry answered with an error status.
        """
        with urllib.request.urlopen(self.url + path, timeout=5) as answer:
            return json.loads(answer.read())


if (
    __name__ == "__main__"
):  # python -m cdcflow_testkit.services.apicurio: build the jar, get the jars
    import sys

    try:
        print(registry_jar())
        print(converter_libs())
    except MavenError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)

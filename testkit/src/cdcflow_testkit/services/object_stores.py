"""Object-store servers on 127.0.0.1 for the tests: real servers, started like the brokers.

Two implementations of the S3 API, so that a vendor difference shows:

- :class:`S3Proxy` is S3Proxy (gaul/s3proxy, Apache 2.0) 3.1.0, the runnable jar Maven
  Central serves (``org.gaul:s3proxy:3.1.0:jar:jar-with-dependencies``, 93 MB, fetched
  once into the test kit's cache by :func:`s3proxy_jar`), with its in-memory ``transient``
  jclouds back end and AWS v2/v4 signatures checked against one key pair (a wrong secret
  is refused, as on S3). It answers ``If-None-Match: *`` with 412 (measured).
And the other providers' emulators:

- :class:`Azurite` is Microsoft's Azure Storage emulator (npm package ``azurite`` 3.37.0,
  installed once into the test kit's cache by :func:`azurite_bin`), its Blob service in
  memory; delta-rs reaches it through ``azure_storage_endpoint`` with the emulator's
  well-known account key, and the container is made with ``azure-storage-blob``.

- :class:`MotoS3` is moto's S3 server (``python -m moto.server``, PyPI packages ``moto[s3]``,
``flask`` and ``flask-cors``) in a child process with a free port. It holds buckets in its
memory: they outlive any number of restarts of the processes that use them (a tansu
broker's ``s3://`` storage, a cdcflow run) and are gone after :meth:`MotoS3.stop`.

Each server gives the delta-rs storage options that reach it (:meth:`MotoS3.storage_options`,
the keys of cdcflow's ``storage:`` section) and the URI of a fresh prefix
(:meth:`MotoS3.warehouse_uri`), so a test writes a warehouse there as a user would.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from cdcflow_testkit.services.maven import MavenError, cache_root, run_maven
from cdcflow_testkit.services.process import (
    ManagedProcess,
    ServiceError,
    free_port,
    java_executable,
    stop_process,
    wait_until,
)

__all__ = [
    "AZURITE_VERSION",
    "Azurite",
    "azurite_bin",
    "S3PROXY_VERSION",
    "MotoS3",
    "ObjectStoreError",
    "S3Proxy",
    "StorageUnavailable",
    "s3proxy_jar",
]

#: S3Proxy's release: 3.1.0 runs on Java 17 (4.x needs a newer Java)
S3PROXY_VERSION = "3.1.0"
#: Azurite's release (npm)
AZURITE_VERSION = "3.37.0"


class ObjectStoreError(ServiceError):
    """An object-store server could not start, or a request to set it up failed."""

    code = "OBJECT_STORE_ERROR"


class StorageUnavailable(ObjectStoreError):
    """The server cannot be started here (a package is missing)."""

    code = "STORAGE_UNAVAILABLE"


class _S3Endpoint:
    """What both S3 servers give a test: the endpoint, delta-rs's storage options (the
    keys of cdcflow's ``storage:`` section) and a fresh prefix of the bucket. The secret is
    random per server, so that a test can look for it where it must never appear."""

    #: names the server in "not started" errors
    server_name = "the S3 server"
    access_key_id = "cdcflow"
    region = "us-east-1"
    host: str
    port: int | None
    bucket: str
    secret_access_key: str

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` of the running server."""
        if self.port is None:
            raise ObjectStoreError(f"{self.server_name} is not started; call start() first")
        return f"http://{self.host}:{self.port}"

    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for this server (``aws_conditional_put`` left to
        delta-rs's default: both servers answer ``If-None-Match: *`` with 412)."""
        return {
            "aws_endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_region": self.region,
            "aws_allow_http": "true",
        }

    def warehouse_uri(self, name: str = "warehouse") -> str:
        """``s3://<bucket>/<random>/<name>``: a prefix no other test has written."""
        return f"s3://{self.bucket}/{uuid.uuid4().hex}/{name}"

    def client(self) -> Any:
        """A boto3 S3 client of this server (signed with its credentials), for what a
        test does beside delta-rs (e.g. objects S3A writes)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        )


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status: an unsigned request is 403)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            response.read()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


class MotoS3(_S3Endpoint):
    """moto's S3 server as a child process on ``host`` (see the module docstring).

    Args:
        host: interface to listen on.
        bucket: the bucket created at start (more with :meth:`create_bucket`).
        startup_timeout_s: how long to wait until the server has created the bucket.

    Attributes:
        port: TCP port while running, else ``None``.
        log_path: file that receives the server's stdout and stderr (kept when the
            server fails to start).
    """

    server_name = "the local S3 server"  # moto accepts any credentials

    def __init__(
        self, host: str = "127.0.0.1", bucket: str = "cdcflow", startup_timeout_s: float = 30.0
    ) -> None:
        self.host = host
        self.bucket = bucket
        self.startup_timeout_s = startup_timeout_s
        self.secret_access_key = f"moto-secret-{uuid.uuid4().hex}"
        self.port: int | None = None
        self.log_path: str | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def storage_url(self) -> str:
        """tansu's ``--storage-engine`` value: ``s3://<bucket>/``."""
        return f"s3://{self.bucket}/"

    def tansu_env(self) -> dict[str, str]:
        """Environment variables that point tansu's S3 client at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT": self.endpoint_url,
            "AWS_ALLOW_HTTP": "true",
        }

    def create_bucket(self, name: str) -> None:
        """Create the bucket ``name`` (``PUT /name``).

        Raises:
            ObjectStoreError: the server refused it.
        """
        request = urllib.request.Request(f"{self.endpoint_url}/{name}", method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except OSError as exc:
            raise ObjectStoreError(
                f"creating bucket {name!r} on {self.endpoint_url}: {exc}"
            ) from exc

    def start(self) -> MotoS3:
        """Start the server and create the bucket.

        Returns:
            ``self``.

        Raises:
            StorageUnavailable: moto, flask or flask-cors is not installed.
            ObjectStoreError: the server exited or did not answer within
                ``startup_timeout_s``; the message names its log file.
        """
        if self.running:
            return self
        missing = [
            m for m in ("moto", "flask", "flask_cors") if importlib.util.find_spec(m) is None
        ]
        if missing:
            raise StorageUnavailable(
                f"the local S3 server is moto's, but {', '.join(missing)} "
                f"is not installed in {sys.executable}; install it with "
                "pip install 'moto[s3]' flask flask-cors (or pip install -e ./testkit)"
            )
        last_error: ObjectStoreError | None = None
        for _ in range(3):  # a free port can be taken before the server binds it
            try:
                self._launch(free_port(self.host))
                return self
            except ObjectStoreError as exc:
                last_error = exc
                self._kill()
            except BaseException:
                self._kill()
                raise
        assert last_error is not None
        raise last_error

    def _launch(self, port: int) -> None:
        fd, self.log_path = tempfile.mkstemp(prefix="cdcflow-s3-", suffix=".log")
        cmd = [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)]
        with os.fdopen(fd, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.port = port
        atexit.register(self._kill)
        request = urllib.request.Request(f"{self.endpoint_url}/{self.bucket}", method="PUT")

        def answers() -> bool:
            with urllib.request.urlopen(request, timeout=2) as response:
                response.read()
            return True

        wait_until(
            answers,
            name=f"the local S3 server on {self.host}:{port}",
            log=self.log_path,
            timeout_s=self.startup_timeout_s,
            processes=[self._proc],
            not_yet=(OSError,),  # not listening yet
            interval_s=0.05,
            error=ObjectStoreError,
        )

    def stop(self) -> None:
        """Stop the server (its objects are lost) and remove its log. Idempotent."""
        had_process = self._proc is not None
        self._kill()
        if had_process and self.log_path:
            with contextlib.suppress(OSError):
                os.remove(self.log_path)
        self.port = None

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(Exception):
            atexit.unregister(self._kill)
        stop_process(proc, hard=True)  # its objects are discarded anyway

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def s3proxy_jar() -> Path:
    """S3Proxy's runnable jar (module docstring), copied from Maven Central with ``mvn`` on
    first use into the test kit's cache.

    Raises:
        MavenError: Maven is missing, or could not fetch the jar.
    """
    home = cache_root() / f"s3proxy-{S3PROXY_VERSION}"
    jar = home / f"s3proxy-{S3PROXY_VERSION}-jar-with-dependencies.jar"
    if jar.exists():
        return jar
    if shutil.which("mvn") is None:
        raise MavenError("S3Proxy's jar is fetched with Maven: install it (apt-get install maven)")
    home.mkdir(parents=True, exist_ok=True)
    artifact = f"org.gaul:s3proxy:{S3PROXY_VERSION}:jar:jar-with-dependencies"
    run_maven(
        ["dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={home}"],
        home / "fetch.log",
        f"fetching {artifact}",
    )
    if not jar.exists():
        raise MavenError(f"fetching {artifact} left no {jar}; log: {home / 'fetch.log'}")
    return jar


class S3Proxy(_S3Endpoint, ManagedProcess):
    """S3Proxy on 127.0.0.1 with a free port, in memory (module docstring).

    Args:
        bucket: the bucket created at start.
        startup_timeout_s: how long to wait until it answers.

    Attributes:
        port: its port while running.
    """

    name = "S3Proxy"
    log_name = "s3proxy.log"
    stop_grace_s = 1.0  # in memory: nothing to flush
    error = ObjectStoreError
    server_name = "S3Proxy"

    def __init__(self, bucket: str = "cdcflow", startup_timeout_s: float = 60.0) -> None:
        self.bucket = bucket
        #: checked by S3Proxy; random per server, so that a test can look for it
        self.secret_access_key = f"s3proxy-secret-{uuid.uuid4().hex}"
        self.startup_timeout_s = startup_timeout_s
        self.host = "127.0.0.1"
        self.port: int | None = None
        self._jar: Path | None = None

    def start(self) -> S3Proxy:
        """Fetch the jar (first use), start the server and create the bucket.

        Raises:
            MavenError: the jar cannot be fetched.
            ObjectStoreError: the server did not answer within ``startup_timeout_s``.
        """
        self._jar = s3proxy_jar()
        self.port = free_port(self.host)
        super().start()
        self.create_bucket(self.bucket)
        return self

    def _prepare(self, folder: str) -> None:
        Path(folder, "s3proxy.conf").write_text(
            f"s3proxy.endpoint={self.endpoint_url}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={self.access_key_id}\n"
            f"s3proxy.credential={self.secret_access_key}\n"
            "jclouds.provider=transient\n"
            "s3proxy.ignore-unknown-headers=true\n"
            f"jclouds.identity={self.access_key_id}\n"
            f"jclouds.credential={self.secret_access_key}\n"
        )

    def _command(self, folder: str) -> list[str]:
        assert self._jar is not None
        heap = ["-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        return [java_executable(), *heap, "-jar", str(self._jar), "--properties", "s3proxy.conf"]

    def _ready(self) -> bool:
        return _answers(f"{self.endpoint_url}/")

    def create_bucket(self, name: str) -> None:
        """Create the bucket ``name`` (a signed ``PUT /name``, through boto3).

        Raises:
            ObjectStoreError: the server refused it.
        """
        try:
            self.client().create_bucket(Bucket=name)
        except Exception as exc:  # botocore's ClientError and connection errors
            raise ObjectStoreError(f"creating bucket {name!r} on S3Proxy: {exc}") from exc


def azurite_bin() -> Path:
    """Azurite's ``azurite-blob`` program, installed with ``npm`` on first use into the
    test kit's cache.

    Raises:
        ObjectStoreError: npm is missing, or the install failed (its log is named).
    """
    home = cache_root() / f"azurite-{AZURITE_VERSION}"
    program = home / "node_modules" / ".bin" / "azurite-blob"
    if program.exists():
        return program
    if shutil.which("npm") is None:
        raise ObjectStoreError("Azurite is installed with npm: install Node.js and npm")
    home.mkdir(parents=True, exist_ok=True)
    log = home / "install.log"
    with open(log, "wb") as out:
        done = subprocess.run(
            ["npm", "install", "--prefix", str(home), "--no-audit", "--no-fund"]
            + [f"azurite@{AZURITE_VERSION}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0 or not program.exists():
        raise ObjectStoreError(f"npm install azurite@{AZURITE_VERSION} failed; log: {log}")
    return program


class Azurite(ManagedProcess):
    """Azurite's Blob service on 127.0.0.1 with a free port, in memory (module docstring).

    Args:
        container: the container created at start.
        startup_timeout_s: how long to wait until it answers.
    """

    name = "Azurite"
    log_name = "azurite.log"
    stop_grace_s = 1.0  # in memory: nothing to flush
    error = ObjectStoreError

    #: the emulator's well-known account and key (Azurite's documentation)
    account = "devstoreaccount1"
    account_key = (
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    )

    def __init__(self, container: str = "cdcflow", startup_timeout_s: float = 60.0) -> None:
        self.container = container
        self.startup_timeout_s = startup_timeout_s
        self.host = "127.0.0.1"
        self.port: int | None = None
        self._program: Path | None = None

    @property
    def endpoint_url(self) -> str:
        """The account's Blob endpoint, ``http://127.0.0.1:port/devstoreaccount1``."""
        if self.port is None:
            raise ObjectStoreError("Azurite is not started; call start() first")
        return f"http://{self.host}:{self.port}/{self.account}"

    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options (cdcflow's ``storage:`` section) for this emulator."""
        return {
            "azure_storage_account_name": self.account,
            "azure_storage_account_key": self.account_key,
            "azure_storage_endpoint": self.endpoint_url,
            "allow_http": "true",
        }

    def warehouse_uri(self, name: str = "warehouse") -> str:
        """``abfss://<container>@<account>.dfs.core.windows.net/<random>/<name>``."""
        return (
            f"abfss://{self.container}@{self.account}.dfs.core.windows.net/"
            f"{uuid.uuid4().hex}/{name}"
        )

    def start(self) -> Azurite:
        """Install Azurite (first use), start it and create the container.

        Raises:
            ObjectStoreError: npm or the install failed, or it did not answer in time.
        """
        self._program = azurite_bin()
        self.port = free_port(self.host)
        super().start()
        from azure.storage.blob import BlobServiceClient

        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};"
            f"AccountKey={self.account_key};BlobEndpoint={self.endpoint_url};"
        )
        try:
            BlobServiceClient.from_connection_string(connection).create_container(self.container)
        except Exception as exc:  # azure-core's HttpResponseError and connection errors
            raise ObjectStoreError(f"creating container {self.container!r}: {exc}") from exc
        return self

    def _command(self, folder: str) -> list[str]:
        assert self._program is not None and self.port is not None
        return [
            str(self._program),
            "--inMemoryPersistence",
            "--blobHost",
            self.host,
            "--blobPort",
            str(self.port),
            "--skipApiVersionCheck",  # delta-rs may speak a newer API version
            "--silent",
        ]

    def _ready(self) -> bool:
        return _answers(f"{self.endpoint_url}?comp=list")


if __name__ == "__main__":  # python -m cdcflow_testkit.services.object_stores: fetch them
    try:
        print(s3proxy_jar())
        print(azurite_bin())
    except (MavenError, ObjectStoreError) as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)

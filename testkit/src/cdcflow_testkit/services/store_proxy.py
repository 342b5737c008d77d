"""A fault-injecting HTTP reverse proxy between a client (cdcflow's delta-rs) and an S3
server (moto's, :class:`~cdcflow_testkit.services.object_stores.MotoS3`).

:class:`StoreProxy` runs it as a child process listening on 127.0.0.1 (a free port): the
standard library's ``ThreadingHTTPServer`` receives, ``urllib3`` (a pool of connections)
forwards. A request that no rule matches goes to the server unchanged,
its ``Host`` header included: an S3 client signs ``Host`` (AWS Signature V4), and the
proxy's address is the endpoint it signed for, so the server checks the signature the
client made (S3Proxy, which checks signatures, accepts requests through it).

A :class:`Fault` matches a method and a path pattern and takes a number of matching
requests (or all of them); each request meets the first rule that still takes one:

==================  ===============================================================
action              what the client sees
==================  ===============================================================
``slow_down``       ``503 SlowDown`` (S3's XML error body), the request not forwarded
``internal_error``  ``500 InternalError``, not forwarded
``delay``           the server's answer, ``seconds`` late
``hang``            no answer for ``seconds`` (a time-out on the client), then the
                    connection closed; not forwarded
``cut``             the connection reset after ``after_bytes`` bytes of the request's
                    body were read (an upload cut off); not forwarded
``drop_response``   forwarded (the server acted on it: a commit landed), then the
                    connection reset instead of the answer: the response is lost
==================  ===============================================================

Every request is recorded (:attr:`StoreProxy.seen`, :meth:`StoreProxy.counts`), so a
test, or a benchmark, counts the requests a workload makes by method.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import urllib3

from cdcflow_testkit.services.process import ManagedProcess, ServiceError

__all__ = ["Action", "Fault", "Seen", "StoreProxy", "StoreProxyError"]

Action = Literal["slow_down", "internal_error", "delay", "hang", "cut", "drop_response"]

#: S3's error bodies (https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html)
_ERRORS = {
    "slow_down": (503, "SlowDown", "Please reduce your request rate."),
    "internal_error": (500, "InternalError", "We encountered an internal error. Please try again."),
}

#: headers of one hop, not forwarded (RFC 9110, 7.6.1)
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


class StoreProxyError(ServiceError):
    """The proxy could not start, or was asked for something it cannot do."""

    code = "STORE_PROXY_ERROR"


@dataclass
class Fault:
    """One programmable fault.

    Attributes:
        action: what the matching requests meet (:data:`Action`, module docstring).
        method: the HTTP method it matches (``PUT``, ``GET``, ...); ``*``: any.
        path: a regular expression searched in the request's path and query string
            (``/bucket/key?query``), e.g. ``r"_delta_log/\\d+\\.json$"`` for commits.
        times: how many matching requests it takes, then it is spent; ``None``: all.
        seconds: the wait of ``delay`` and ``hang``, in seconds.
        after_bytes: how many bytes of the body ``cut`` reads before the reset.
        hits: how many requests it took so far (kept by the proxy).
    """

    action: Action
    method: str = "*"
    path: str = ""
    times: int | None = 1
    seconds: float = 0.0
    after_bytes: int = 0
    hits: int = 0

    def __post_init__(self) -> None:
        self._pattern = re.compile(self.path)

    def takes(self, method: str, path: str) -> bool:
        """Whether this fault takes the request (it matches and is not spent)."""
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method != "*" and self.method.upper() != method:
            return False
        return self._pattern.search(path) is not None

    @property
    def spent(self) -> bool:
        """Whether it took all the requests it was to take."""
        return self.times is not None and self.hits >= self.times


@dataclass(frozen=True)
class Seen:
    """One request the proxy received (recorded when its handling ended: a hung request
    after its ``seconds``).

    Attributes:
        method: its HTTP method.
        path: its path and query string.
        fault: the action it met; ``None``: forwarded untouched.
        status: the status the client received; ``None``: no answer (a reset, a hang).
    """

    method: str
    path: str
    fault: str | None
    status: int | None


@dataclass
class _State:
    """What the proxy process keeps: the faults set and the requests seen."""

    faults: list[Fault] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)


#: the control API's path prefix (no S3 bucket name starts with ``_``)
CONTROL = "/_store_proxy"


class StoreProxy(ManagedProcess):
    """The proxy as a child process on 127.0.0.1 (a free port) in front of ``upstream``.

    A child process, not a thread of the test: delta-rs holds Python's GIL in some of its
    blocking calls (``DeltaStorageHandler.open_output_stream`` waits for its
    ``POST ?uploads`` with the GIL held), so a proxy in the caller's interpreter would
    wait for the client that waits for it. The test steers it through a small JSON API
    under :data:`CONTROL` on the same port (never recorded, never faulted).

    Args:
        upstream: the server's ``http://host:port`` (an S3 server's ``endpoint_url``).
        startup_timeout_s: how long to wait until it answers.

    Attributes:
        port: its port while running, else ``None``.

    Use it as a context manager, or :meth:`start` and :meth:`stop`.
    """

    name = "the store proxy"
    log_name = "store-proxy.log"
    stop_grace_s = 2.0
    poll_interval_s = 0.05
    error = StoreProxyError

    def __init__(self, upstream: str, startup_timeout_s: float = 30.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.startup_timeout_s = startup_timeout_s

    # ------------------------------------------------------------------ life

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` of the running proxy: the endpoint a client is given."""
        if self.port is None:
            raise StoreProxyError("the store proxy is not started; call start() first")
        return f"http://{self.host}:{self.port}"

    def _command(self, folder: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "cdcflow_testkit.services.store_proxy",
            self.upstream,
            os.path.join(folder, "port"),
        ]

    def _ready(self) -> bool:
        assert self._dir is not None
        try:
            self.port = int(Path(self._dir, "port").read_text())
        except (OSError, ValueError):
            return False  # not listening yet
        self._control("GET", "faults")
        return True

    def stop(self, keep_log: bool = False) -> None:
        """Stop the proxy (hung requests are cut). Idempotent."""
        super().stop(keep_log)
        self.port = None

    # ------------------------------------------------------------------ control

    def _control(self, method: str, what: str, data: object = None) -> Any:
        body = None if data is None else json.dumps(data).encode()
        request = urllib.request.Request(
            f"{self.endpoint_url}{CONTROL}/{what}", data=body, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"null")
        except OSError as exc:
            raise StoreProxyError(f"{method} {CONTROL}/{what} on the store proxy: {exc}") from exc

    def inject(self, *faults: Fault) -> None:
        """Add ``faults`` after the ones set (the first that takes a request wins).

        Raises:
            StoreProxyError: the proxy is not running.
        """
        self._control("POST", "faults", [asdict(f) for f in faults])

    def clear(self) -> None:
        """Remove every fault (the record of requests is kept)."""
        self._control("DELETE", "faults")

    @property
    def faults(self) -> list[Fault]:
        """The faults set, in order, with the requests each took (``hits``)."""
        return [Fault(**f) for f in self._control("GET", "faults")]

    @property
    def seen(self) -> list[Seen]:
        """Every request handled since the start or :meth:`reset_counts`, in the order
        their handling ended (control requests are not recorded)."""
        return [Seen(**s) for s in self._control("GET", "seen")]

    def counts(self, path: str = "") -> Counter[tuple[str, bool]]:
        """Requests by ``(method, faulted)`` whose path (and query) the regular expression
        ``path`` matches; ``""``: all."""
        pattern = re.compile(path)
        return Counter((s.method, s.fault is not None) for s in self.seen if pattern.search(s.path))

    def reset_counts(self) -> None:
        """Forget the requests received so far."""
        self._control("DELETE", "seen")


class _Handler(BaseHTTPRequestHandler):
    """One client connection (HTTP/1.1 keep-alive); every method goes through
    :meth:`_handle`."""

    protocol_version = "HTTP/1.1"
    state: _State
    pool: urllib3.HTTPConnectionPool

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass  # the record of requests is StoreProxy.seen

    def do_GET(self) -> None:  # noqa: N802 (the base's naming)
        self._handle()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET  # noqa: N815

    # ------------------------------------------------------------------ one request

    def _handle(self) -> None:
        method, path = self.command, self.path
        if path.startswith(CONTROL + "/"):
            self._control(method, path.removeprefix(CONTROL + "/"))
            return
        fault = self._take(method, path)
        action = fault.action if fault else None
        status: int | None = None
        try:
            if action == "cut":
                assert fault is not None
                self._read_body(limit=fault.after_bytes)
                self._reset()
            elif action == "hang":
                assert fault is not None
                self._read_body()
                self.state.stopping.wait(fault.seconds)
                self._reset()
            elif action in _ERRORS:
                self._read_body()
                status = self._send_error(*_ERRORS[action])
            else:
                if action == "delay":
                    assert fault is not None
                    self.state.stopping.wait(fault.seconds)
                answer = self._forward(method, path, self._read_body())
                if action == "drop_response":
                    self._reset()
                else:
                    status = self._send(answer, head=method == "HEAD")
        finally:
            with self.state.lock:
                self.state.seen.append(Seen(method, path, action, status))

    def _control(self, method: str, what: str) -> None:
        """The control API: ``GET|POST|DELETE faults``, ``GET|DELETE seen`` (JSON)."""
        state = self.state
        with state.lock:
            if (method, what) == ("POST", "faults"):
                given = json.loads(self._read_body())
                state.faults.extend(Fault(**f) for f in given)
            elif (method, what) == ("DELETE", "faults"):
                state.faults.clear()
            elif (method, what) == ("DELETE", "seen"):
                state.seen.clear()
            elif (method, what) not in (("GET", "faults"), ("GET", "seen")):
                self._send_error(404, "NoSuchControl", f"{method} {what}")
                return
            kept = state.faults if what == "faults" else state.seen
            body = json.dumps([asdict(x) for x in kept]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _take(self, method: str, path: str) -> Fault | None:
        with self.state.lock:
            for fault in self.state.faults:
                if fault.takes(method, path):
                    fault.hits += 1
                    return fault
        return None

    def _read_body(self, limit: int | None = None) -> bytes:
        """The request's body (``Content-Length`` or chunked); at most ``limit`` bytes."""
        length = self.headers.get("Content-Length")
        if length is not None:
            size = int(length)
            return self.rfile.read(size if limit is None else min(size, limit))
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return b""
        body = bytearray()
        while limit is None or len(body) < limit:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                break
            body += self.rfile.read(size)
            self.rfile.readline()  # the chunk's CRLF
        return bytes(body if limit is None else body[:limit])

    def _forward(
        self, method: str, path: str, body: bytes
    ) -> tuple[urllib3.BaseHTTPResponse, bytes] | None:
        """The server's answer to the request and its body (as sent, not decoded);
        ``None``: the server could not be reached."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or method in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        try:
            answer = self.pool.urlopen(
                method,
                path,
                body=body or None,
                headers=headers,
                redirect=False,
                retries=False,
                preload_content=False,
                decode_content=False,
                assert_same_host=False,
            )
            data = answer.read(decode_content=False)
        except urllib3.exceptions.HTTPError:
            return None
        return answer, data

    def _send(self, forwarded: tuple[urllib3.BaseHTTPResponse, bytes] | None, head: bool) -> int:
        if forwarded is None:
            return self._send_error(502, "BadGateway", "the proxy could not reach the store")
        answer, body = forwarded
        self.send_response(answer.status, answer.reason)
        for key, value in answer.headers.items():
            if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        length = answer.headers.get("Content-Length") if head else str(len(body))
        if length is not None:
            self.send_header("Content-Length", length)
        self.end_headers()
        if not head:
            self.wfile.write(body)
        return int(answer.status)

    def _send_error(self, status: int, code: str, message: str) -> int:
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{self.path}</Resource><RequestId>cdcflow-store-proxy</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return status

    def _reset(self) -> None:
        """Close the connection with a TCP reset (``SO_LINGER`` 0), no answer sent."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # delta-rs opens many connections at once


def serve(upstream: str, port_file: str, host: str = "127.0.0.1") -> None:
    """Run the proxy until the process is ended: listen on ``host`` (a free port, written
    to ``port_file`` once listening) and forward to ``upstream`` (``http://host:port``).

    Raises:
        StoreProxyError: ``upstream`` is not an ``http://host:port`` URL.
    """
    parsed = urllib3.util.parse_url(upstream)
    if parsed.scheme != "http" or not parsed.host:
        raise StoreProxyError(f"upstream {upstream!r}: give http://host:port")
    pool = urllib3.HTTPConnectionPool(
        parsed.host, parsed.port or 80, maxsize=32, block=False, retries=False
    )
    state = _State()
    handler = type("_BoundHandler", (_Handler,), {"state": state, "pool": pool})
    server = _Server((host, 0), handler)
    written = Path(port_file + ".tmp")
    written.write_text(str(server.server_address[1]))
    written.rename(port_file)  # whole, never half written

    def terminate(*_: object) -> None:
        state.stopping.set()  # lets hung requests go
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminate)
    try:
        server.serve_forever()
    finally:
        state.stopping.set()
        server.server_close()


if __name__ == "__main__":  # python -m cdcflow_testkit.services.store_proxy UPSTREAM PORT_FILE
    serve(sys.argv[1], sys.argv[2])

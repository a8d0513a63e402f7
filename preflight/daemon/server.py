"""The daemon's HTTP side: ``/metrics``, ``/healthz``, ``/report``; nothing that runs a check.

A scrape renders the cached Report (a dict lookup once rendered); the server only reads through the
:class:`Served` interface, so it knows nothing of the scheduler.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from preflight.core.result import Report
from preflight.core.textsafe import escape

log = logging.getLogger(__name__)

#: The text format every Prometheus parses (2.x included); prometheus_client >= 0.22 labels its
#: output 1.0.0, which only differs for non-legacy metric names, and we have none.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def parse_listen(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:9857"`` for IPv6) -> (host, port).

    Raises:
        ValueError: not HOST:PORT, or the port is not in 0..65535 (0 = any free port).
    """
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not port_text.isascii():
        raise ValueError(f"listen address {text!r} is not HOST:PORT (e.g. 127.0.0.1:9857)")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"listen address {text!r}: port {port} is not in 0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"listen address {text!r}: write an IPv6 host in brackets, "
                         "e.g. [::1]:9857")
    if not host:
        raise ValueError(f"listen address {text!r} has no host; say 0.0.0.0:{port} to listen "
                         "on every IPv4 address")
    return host, port



@dataclass(frozen=True)
class Health:
    ok: bool
    message: str


class Served(Protocol):
    """What the HTTP side reads from the daemon."""

    def metrics(self) -> bytes: ...

    def health(self) -> Health: ...

    def report(self) -> Report | None: ...


class Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # socketserver's default backlog of 5 makes the 6th simultaneous connection wait for a SYN
    # retransmit (1 s, then 3 s): a fleet of Prometheus replicas or a burst of clients must not.
    request_queue_size = 128
    #: Connections served at once; one more is closed as soon as it is accepted. Each costs a
    #: thread and a file descriptor: without a cap, a client holding 1,100 idle connections took
    #: every descriptor systemd allows (LimitNOFILE=1024) and the next check run could not open
    #: its pipes (RunFailed: a healthy node shown unhealthy).
    max_connections = 64
    preflight: Served

    #: Seconds between two warnings about closed connections (a flood must not flood the log).
    refused_log_every_s = 60.0

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._refused = 0
        self._refused_logged_at = -self.refused_log_every_s
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refused += 1
            now = time.monotonic()
            if now - self._refused_logged_at >= self.refused_log_every_s:
                log.warning("more than %d HTTP connections at once: closed %d connection(s) "
                            "(the last from %s) since the previous warning",
                            self.max_connections, self._refused,
                            client_address[0] if client_address else "?")
                self._refused, self._refused_logged_at = 0, now
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def make_server(host: str, port: int, daemon: Served) -> Server:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]

    class FamilyServer(Server):
        address_family = family

    server = FamilyServer((host, port), _Handler)
    server.preflight = daemon
    return server


class _Handler(BaseHTTPRequestHandler):
    """``/metrics``, ``/healthz``, ``/report``; nothing else, nothing that runs a check."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes
    # Headers and body are two writes; with Nagle on, the body of a kept-alive connection waits
    # for the client's delayed ACK (40 ms on Linux) on every scrape.
    disable_nagle_algorithm = True
    timeout = 10.0  # a client that stops talking cannot hold a thread for ever
    server: Server
    server_version = "preflight"

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        try:
            self._get()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left
        except Exception as exc:
            # The child's report is validated before it is kept, so this is a bug of ours; a
            # request still gets an answer, and the log one line, not a traceback per scrape.
            log.error("cannot answer %s: %s: %s", escape(self.path, 100), type(exc).__name__,
                      escape(str(exc), 200))
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR,
                       b"preflight serve: internal error; see the daemon's log\n",
                       "text/plain; charset=utf-8")

    def _get(self) -> None:
        daemon = self.server.preflight
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, daemon.metrics(), METRICS_CONTENT_TYPE)
        elif path == "/healthz":
            health = daemon.health()
            self._send(200 if health.ok else 503, health.message.encode(),
                       "text/plain; charset=utf-8")
        elif path == "/report":
            report = daemon.report()
            if report is None:
                body = {"error": "no check run has finished yet; retry in a few seconds"}
                self._send(503, json.dumps(body).encode() + b"\n", "application/json")
            else:
                self._send(200, json.dumps(report.to_json(), indent=2).encode() + b"\n",
                           "application/json")
        elif path == "/":
            self._send(200, b"preflight serve: /metrics /healthz /report\n",
                       "text/plain; charset=utf-8")
        else:
            self._send(HTTPStatus.NOT_FOUND, f"no such page {escape(path, 100)!r}; try /metrics "
                       "/healthz /report\n".encode(), "text/plain; charset=utf-8")

    do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

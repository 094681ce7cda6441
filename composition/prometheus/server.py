"""``/metrics`` over HTTP from a process without a web server (``runworkers``), as a component,
and beside it ``/health/workers``, the host's worker check, for an HTTP probe.

prometheus_client's own WSGI app does the serving (content negotiation, gzip, ``name[]``
filters) and its ``ThreadingWSGIServer`` the threading; we only put the access policy in front
and give the server a start and a stop, which ``start_http_server`` (a daemon thread with no way
to stop it or to add a policy) does not have.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from composition.errors import described
from composition.prometheus.access import MetricsAccess
from composition.prometheus.collector import scrape_registry
from composition.prometheus.errors import MetricsDirectoryBusy

__all__ = ["HEALTH_PATH", "MetricsServerComponent", "guarded_app", "with_health"]

log = structlog.get_logger("composition.metrics")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# Where the server answers its health check: 200 healthy, 503 not, its report as JSON.
HEALTH_PATH = "/health/workers"


class Report(Protocol):
    """What a health check answers (``composition.health.HealthReport``)."""

    @property
    def ok(self) -> bool: ...

    def as_dict(self, *, public: bool = False) -> dict[str, Any]: ...


def _answer(start_response: Callable[..., Any], status: int, body: str,
            headers: dict[str, str] | None = None) -> list[bytes]:
    payload = (body + "\n").encode()
    start_response(f"{status} {HTTPStatus(status).phrase}",
                   [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(payload))),
                    *(headers or {}).items()])
    return [payload]


def guarded_app(app: WSGIApp, access: Callable[[], MetricsAccess] = MetricsAccess.from_settings) -> WSGIApp:
    """``app`` behind the access policy: 403 or 401 when refused, 503 while the multiprocess
    directory stays locked."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        refusal = access().refusal(authorization=environ.get("HTTP_AUTHORIZATION"),
                                   client_address=environ.get("REMOTE_ADDR"))
        if refusal is not None:
            return _answer(start_response, refusal.status, refusal.reason, refusal.headers)
        try:
            return app(environ, start_response)
        except MetricsDirectoryBusy as exc:
            log.warning("metrics scrape refused: directory busy", error=str(exc))
            return _answer(start_response, 503, "metrics directory busy, retry")

    return guarded


def with_health(app: WSGIApp, check: Callable[[], Report]) -> WSGIApp:
    """``app``, with ``HEALTH_PATH`` answered by ``check`` instead: a process that has Django
    loaded already answers in milliseconds what ``manage.py health workers --local`` spends a
    second of CPU starting up for, at every probe."""

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != HEALTH_PATH:
            return app(environ, start_response)
        try:
            report = check()
            status, body = (200 if report.ok else 503), report.as_dict(public=True)
        except Exception as exc:  # a check that cannot answer is a failed check, not a 500
            log.warning("worker health check failed", error=described(exc))
            status, body = 503, {"status": "fail", "error": type(exc).__name__}
        payload = json.dumps(body, default=str).encode()
        start_response(f"{status} {HTTPStatus(status).phrase}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
        return [payload]

    return routed


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServerComponent:
    """Serves ``scrape_registry()`` (the merged multiprocess directory, or this process's
    registry) on ``address:port`` from start to stop, and ``health``'s report at ``HEALTH_PATH``
    when given, both behind the access policy. Port 0 takes a free port (see ``port``)."""

    name = "metrics-server"
    depends_on = ("metrics",)

    def __init__(self, port: int, *, address: str = "0.0.0.0", registry: Collector | None = None,
                 access: Callable[[], MetricsAccess] = MetricsAccess.from_settings,
                 health: Callable[[], Report] | None = None) -> None:
        self.requested_port = port
        self.health = health
        self.address = address
        self.registry = registry
        self.access = access
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the requested one, or the free one port 0 took)."""
        return self._server.server_port if self._server is not None else self.requested_port

    def start(self) -> None:
        access = self.access
        access()  # a malformed policy fails the start, not the first scrape
        app: WSGIApp = make_wsgi_app(self.registry or scrape_registry())
        if self.health is not None:
            app = with_health(app, self.health)
        app = guarded_app(app, access)

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in self.address else socket.AF_INET

        server = make_server(self.address, self.requested_port, app, Server, handler_class=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True)
        try:
            thread.start()
        except BaseException:
            server.server_close()  # the port is not held by a server nothing serves
            raise
        self._server, self._thread = server, thread
        log.info("serving metrics", address=self.address, port=self.port)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float) -> None:
        if self._server is None:
            return
        self._server.shutdown()  # returns once serve_forever has left its loop
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout_s)

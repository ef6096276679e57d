"""The Prometheus endpoints of the JobManager and the TaskManagers, behind the same switch as the REST
API: bound to a loopback address they stay open (a Prometheus on the same host scrapes them); bound to
any other address with tokens configured, a scrape needs ``Authorization: Bearer <token>`` of a token
holding ``read`` (Prometheus: ``authorization: {credentials_file: ...}`` in the scrape job); without
tokens a non-loopback bind is refused at start (:meth:`TransportSecurity.check_bind`), as the REST API's.
``/healthz`` stays open, as the REST API's: a liveness probe (Docker's, Kubernetes') carries no token.

prometheus_client's own ``start_http_server`` has no hook for a check, so this serves its WSGI app
(``make_wsgi_app``) behind one.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.registry import Collector

from weir.core.roles import METRICS_ROLE, AccessTable
from weir.core.transport_security import AuthDecision, authorize, is_loopback, refusal_message

log = structlog.get_logger("weir.security")

_Environ = dict[str, Any]
_StartResponse = Callable[..., Any]
_App = Callable[[_Environ, _StartResponse], Iterable[bytes]]


HEALTH_PATH: Final = "/healthz"


def _health(start_response: _StartResponse) -> Iterable[bytes]:
    body = b"ok\n"
    start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
    return [body]


def with_health(app: _App) -> _App:
    """``app`` with ``/healthz`` answering 200 (nothing else: it tells no metric)."""

    def serve(environ: _Environ, start_response: _StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == HEALTH_PATH:
            return _health(start_response)
        return app(environ, start_response)

    return serve


def guarded(app: _App, access: AccessTable) -> _App:
    """``app`` answering 401 (no token, not the cluster's) or 403 (no ``read``) before it runs."""

    def guard(environ: _Environ, start_response: _StartResponse) -> Iterable[bytes]:
        decision = authorize(environ.get("HTTP_AUTHORIZATION"), access, METRICS_ROLE)
        if decision.allowed:
            return app(environ, start_response)
        log.warning("metrics_scrape_refused", decision=decision.value, path=environ.get("PATH_INFO"))
        status = "403 Forbidden" if decision is AuthDecision.FORBIDDEN else "401 Unauthorized"
        body = (refusal_message(decision, METRICS_ROLE, "a metrics scrape") + "\n").encode()
        headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        if decision is not AuthDecision.FORBIDDEN:
            headers.append(("WWW-Authenticate", "Bearer"))
        start_response(status, headers)
        return [body]

    return guard


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # the base class's name
        """Scrapes are not logged (one every few seconds)."""


def serve_metrics(
    port: int, addr: str, access: AccessTable | None, registry: Collector = REGISTRY
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on ``addr:port`` in a daemon thread; guarded when ``access`` is given and
    ``addr`` is not loopback."""
    app: _App = make_wsgi_app(registry)
    if access is not None and not is_loopback(addr):
        app = guarded(app, access)
    app = with_health(app)
    server_class: type[_Server] = type("_MetricsServer", (_Server,), {})
    if ":" in addr.strip("[]"):
        server_class.address_family = socket.AF_INET6
    server = make_server(addr.strip("[]"), port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread

"""The container healthcheck against real sockets on 127.0.0.1 (no service of Weir's needed)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from weir.tools.probe import main, probe


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        code = {"/healthz": 200, "/starting": 503}.get(self.path, 404)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the http.server API
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_http_2xx_is_healthy(http_port: int) -> None:
    assert probe(f"http://127.0.0.1:{http_port}/healthz") is None
    assert main([f"http://127.0.0.1:{http_port}/healthz"]) == 0


def test_http_503_and_404_are_not(http_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe(f"http://127.0.0.1:{http_port}/starting") == f"http://127.0.0.1:{http_port}/starting answered 503"
    assert main([f"http://127.0.0.1:{http_port}/nothing"]) == 1
    assert "answered 404" in capsys.readouterr().err


def test_tcp_open_and_closed(http_port: int) -> None:
    assert probe(f"tcp://127.0.0.1:{http_port}") is None
    closed = _closed_port()
    reason = probe(f"tcp://127.0.0.1:{closed}", timeout_s=2)
    assert reason is not None and reason.startswith(f"tcp://127.0.0.1:{closed}: ")
    assert probe(f"http://127.0.0.1:{closed}/healthz", timeout_s=2) is not None


def test_bad_arguments() -> None:
    assert probe("tcp://127.0.0.1") == "tcp://127.0.0.1: expected tcp://HOST:PORT"
    assert probe("ftp://x/y") is not None
    assert main([]) == 2

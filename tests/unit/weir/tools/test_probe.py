"""The container healthcheck against real sockets on 127.0.0.1 (no service of Weir's needed); HTTPS with
the development credentials of weir.tools.dev_credentials, with and without client certificates."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from weir.tools.dev_credentials import DevCredentials, generate
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


HttpsServer = Callable[[bool], int]
"""Start an HTTPS server with the development credentials (True: client certificates required); its port."""


@pytest.fixture
def credentials(tmp_path: Path) -> DevCredentials:
    return generate(tmp_path / "credentials").credentials


@pytest.fixture
def https_server(credentials: DevCredentials) -> Iterator[HttpsServer]:
    servers: list[ThreadingHTTPServer] = []

    def start(client_certificates: bool) -> int:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(credentials.certificate, credentials.key)
        if client_certificates:
            context.load_verify_locations(credentials.ca_certificate)
            context.verify_mode = ssl.CERT_REQUIRED
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_https_trusts_the_ca_of_the_settings(https_server: HttpsServer, credentials: DevCredentials) -> None:
    url = f"https://127.0.0.1:{https_server(False)}/healthz"
    assert probe(url, environ={"WEIR_TLS_CA_FILE": str(credentials.ca_certificate)}) is None
    untrusted = probe(url, timeout_s=2, environ={})
    assert untrusted is not None and "CERTIFICATE_VERIFY_FAILED" in untrusted
    missing = probe(url, environ={"WEIR_TLS_CA_FILE": str(credentials.directory / "absent.crt")})
    assert missing is not None and missing.startswith(f"{url}: ")


def test_https_shows_the_certificate_when_asked(https_server: HttpsServer, credentials: DevCredentials) -> None:
    url = f"https://127.0.0.1:{https_server(True)}/healthz"
    assert probe(url, environ=credentials.environment()) is None
    only_ca = probe(url, timeout_s=2, environ={"WEIR_TLS_CA_FILE": str(credentials.ca_certificate)})
    assert only_ca is not None, "no client certificate: the handshake fails"


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

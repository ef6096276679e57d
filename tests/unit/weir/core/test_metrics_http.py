"""The Prometheus endpoint of weir.core.metrics_http: open on loopback, behind a ``read`` token on any
other address when tokens are configured."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from weir.core.metrics_http import serve_metrics
from weir.core.roles import AccessTable, access_table, parse_tokens_file


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("weir_test_scrapes", "a counter to find in the answer", registry=registry).inc()
    return registry


@pytest.fixture
def access() -> AccessTable:
    table = access_table(None, parse_tokens_file("read r\nsubmit s\n", "tokens"), "internal")
    assert table is not None
    return table


def _scrape(port: int, token: str | None, path: str = "/metrics") -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


Serve = Callable[[str, AccessTable | None], int]
"""Serve the registry on this address (port 0) with these tokens; answers the port."""


@pytest.fixture
def serve(registry: CollectorRegistry) -> Iterator[Serve]:
    servers = []

    def start(addr: str, access: AccessTable | None) -> int:
        server, _ = serve_metrics(0, addr, access, registry)
        servers.append(server)
        return int(server.server_address[1])

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_on_a_non_loopback_bind_a_scrape_needs_a_token_holding_read(serve: Serve, access: AccessTable) -> None:
    port = serve("0.0.0.0", access)
    status, body = _scrape(port, None)
    assert status == 401 and "WEIR_AUTH_TOKEN" in body
    assert _scrape(port, "stranger")[0] == 401
    status, body = _scrape(port, "internal")  # the cluster's own token is not a reader's
    assert status == 403 and "'read'" in body
    for token in ("r", "s"):
        status, body = _scrape(port, token)
        assert status == 200 and "weir_test_scrapes_total 1.0" in body
    assert _scrape(port, None, "/") == _scrape(port, None, "/anything")  # every metrics path is guarded
    assert _scrape(port, None, "/")[0] == 401


def test_healthz_answers_a_probe_without_a_token_and_tells_no_metric(serve: Serve, access: AccessTable) -> None:
    for port in (serve("0.0.0.0", access), serve("127.0.0.1", None)):
        assert _scrape(port, None, "/healthz") == (200, "ok\n")


def test_on_loopback_or_without_tokens_a_scrape_is_open(serve: Serve, access: AccessTable) -> None:
    for port in (serve("127.0.0.1", access), serve("0.0.0.0", None)):
        status, body = _scrape(port, None)
        assert status == 200 and "weir_test_scrapes_total 1.0" in body

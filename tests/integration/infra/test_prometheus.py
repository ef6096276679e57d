"""The local Prometheus is ready and scrapes a target that a test adds at run time."""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.integration import polling
from tests.observability import targets_dir
from weir.core.config import Endpoints

pytestmark = pytest.mark.integration


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"# TYPE weir_infra_probe gauge\nweir_infra_probe 42\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def probe_target(services: Endpoints) -> Iterator[tuple[str, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    label = f"infra-{uuid.uuid4().hex[:8]}"
    target = f"127.0.0.1:{server.server_address[1]}"
    path = targets_dir(services) / f"{label}.json"
    path.write_text(json.dumps([{"targets": [target], "labels": {"test": label}}]))
    try:
        yield target, label
    finally:
        path.unlink(missing_ok=True)
        server.shutdown()


def query(endpoints: Endpoints, promql: str) -> list[dict[str, object]]:
    url = f"{endpoints.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        payload = json.load(response)
    assert payload["status"] == "success", payload
    return payload["data"]["result"]


def test_ready_and_scrapes_a_test_target(services: Endpoints, probe_target: tuple[str, str]) -> None:
    with urllib.request.urlopen(f"{services.prometheus_url}/-/ready", timeout=5) as response:
        assert response.status == 200

    _target, label = probe_target
    result = polling.until(
        "Prometheus to scrape the test target", 60, lambda: query(services, f'weir_infra_probe{{test="{label}"}}'), 0.5
    )
    assert result[0]["value"][1] == "42"  # type: ignore[index]
    assert query(services, f'up{{test="{label}"}}')[0]["value"][1] == "1"  # type: ignore[index]

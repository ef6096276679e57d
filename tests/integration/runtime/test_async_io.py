"""Async I/O (``stream.async_map``) on the session cluster: every event is enriched by an HTTP
lookup with random latency (a local service), ordered and unordered, a TaskManager SIGKILLed once a
checkpoint completed; the job restores, issues again the lookups that were in flight at its
checkpoint, and finishes with both sinks exact (``weir verify``: the window sums, which hold each
lookup's answer, equal the reference run's record for record)."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

JOB = "tests/integration/runtime/jobs/async_enrichment.py"
EVENTS = 6_000  # at 1,000/s: the kill lands well inside the input (two checkpoints of 500 ms complete first)


class _Server(ThreadingHTTPServer):
    # Three subtasks with up to 32 lookups each connect at once after a restore: the default listen
    # backlog of 5 drops their SYNs, and a retried connect can take longer than the lookup's timeout.
    request_queue_size = 256

    def handle_error(self, request: object, client_address: object) -> None:
        # The killed TaskManager's connections drop mid-request: expected, not worth a traceback
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class WeightService:
    """``GET /weight?key=K&id=I`` answers K's weight (1-5, from the key alone) after 0-15 ms."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the lookups reuse their connections
            # headers and body go out in two writes: with Nagle on, the body waits for the client's delayed
            # ACK of the headers (~40 ms per lookup on Linux)
            disable_nagle_algorithm = True

            def do_GET(self) -> None:  # noqa: N802  # http.server's name
                query = parse_qs(urlparse(self.path).query)
                key, event_id = query["key"][0], query["id"][0]
                with lock:
                    service.requests[event_id] += 1
                time.sleep(random.uniform(0, 0.015))  # the service's latency, not a wait for a condition
                body = str(sum(key.encode()) % 5 + 1).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def weight_service() -> Iterator[WeightService]:
    service = WeightService()
    yield service
    service.close()


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_async_lookups_survive_a_taskmanager_kill_exactly_once(
    weir_cluster: WeirCluster, unique: str, weight_service: WeightService, ordered: bool
) -> None:
    endpoints = weir_cluster.endpoints
    params = keyed_aggregation_inputs(endpoints, unique, EVENTS, records_per_second=1000, checkpoint_interval="500ms")
    params |= {
        "enrich.url": weight_service.url,
        "enrich.ordered": str(ordered).lower(),
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit(JOB, params, parallelism=3)

    victim = "taskmanager-2"
    status = wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and (s.last_completed_checkpoint or 0) >= 2
            and process_running(weir_cluster, victim)
        ),
        "two completed checkpoints",
    )
    assert (status.last_completed_checkpoint or 0) >= 2
    kill_process(weir_cluster.directory, victim)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure
    assert final.last_restore_at is not None, f"the job never restored after killing {victim}"

    # Every event was looked up (at least once: the lookups replayed after the restore again).
    cluster_requests = sum(weight_service.requests.values())
    assert len(weight_service.requests) == EVENTS, len(weight_service.requests)
    assert cluster_requests > EVENTS, "no lookup was issued again after the restore"
    assert_sinks_exact(JOB, params, job_id, endpoints)

"""`weir cluster up --standbys 1`: a leader and a standby JobManager under the supervisor, every process
with high availability; the standby's /healthz answers 503 and names the leader it read in the lease, and
its metrics port (the leader's - 1) says it does not lead: ``weir_jobmanager_leader`` 0, the leader's 1 with
its term."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.polling import poll
from weir.connectors.object_storage import open_storage
from weir.core.config import Endpoints
from weir.core.errors import ClusterUnavailableError
from weir.jobmanager.lease import LeaseStore
from weir.tools.client import JobManagerClient

pytestmark = pytest.mark.integration

# Ports of this cluster's own (beside the session's cluster): the JobManagers on 27323 and 27324.
PORTS = {
    "WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:27323",
    "WEIR_JOBMANAGER_METRICS_PORT": "27349",
    "WEIR_JOBMANAGER_REST_PORT": "27381",
    "WEIR_TASKMANAGER_METRICS_BASE_PORT": "27360",
}
ADDRESSES = ("127.0.0.1:27323", "127.0.0.1:27324")
REST = {"127.0.0.1:27323": 27381, "127.0.0.1:27324": 27382}
METRICS = {"127.0.0.1:27323": 27349, "127.0.0.1:27324": 27348}


def weir(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weir.tools.cli", *args], env=env, capture_output=True, text=True, timeout=240
    )


@pytest.fixture
def cluster_env(services: Endpoints, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {
        **os.environ,
        **PORTS,
        "WEIR_RUN_DIR": str(tmp_path / "run"),
        "WEIR_CHECKPOINT_DIR": f"s3://{services.s3_bucket}/test-standbys-{uuid.uuid4().hex[:8]}",
    }
    env.pop("WEIR_JOBMANAGER_ADDRESSES", None)
    env.pop("WEIR_HA_ENABLED", None)
    yield env
    weir(env, "cluster", "down")


def taskmanagers_alive(client: JobManagerClient) -> int | None:
    try:
        return len(client.cluster_status().alive_taskmanagers)
    except ClusterUnavailableError:
        return None


def health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, {}


def leadership(port: int) -> tuple[float, float] | None:
    """(weir_jobmanager_leader, weir_jobmanager_leader_term) scraped from a metrics port; None: no answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values["weir_jobmanager_leader"], values["weir_jobmanager_leader_term"]


def test_cluster_up_with_a_standby_and_the_standby_names_the_leader(cluster_env: dict[str, str]) -> None:
    started = weir(cluster_env, "cluster", "up", "--standbys", "1", "--timeout", "180")
    assert started.returncode == 0, started.stderr
    assert "127.0.0.1:27323, 127.0.0.1:27324" in started.stdout and "1 on standby" in started.stdout
    with JobManagerClient(",".join(ADDRESSES), timeout_s=5.0) as client:
        # A call that reaches the standby first fails over to the leader on its retry, as the tools' do.
        alive = poll("the leader to answer", 60, lambda: taskmanagers_alive(client))
    assert alive == 3

    lease = LeaseStore(open_storage(cluster_env["WEIR_CHECKPOINT_DIR"])).read().record
    assert lease is not None and lease.address in ADDRESSES
    (standby,) = [a for a in ADDRESSES if a != lease.address]
    _, body = poll(
        "the standby's /healthz to name the leader",
        60,
        lambda: found if (found := health(REST[standby]))[0] == 503 and "leader" in found[1] else None,
    )
    assert body == {"status": "starting", "leader": {"address": lease.address, "term": lease.term}}
    assert health(REST[lease.address])[0] == 200

    listed = weir(cluster_env, "cluster", "status", "--json")
    assert listed.returncode == 0, listed.stderr
    names = {process["name"] for process in json.loads(listed.stdout)["local"]["processes"]}
    assert {"jobmanager", "jobmanager-standby-1"} <= names

    assert poll("the standby's metrics", 60, lambda: leadership(METRICS[standby])) == (0.0, 0.0)
    assert poll("the leader's metrics", 60, lambda: leadership(METRICS[lease.address])) == (1.0, float(lease.term))

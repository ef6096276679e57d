"""The ports of the integration tests' session clusters (tests/integration/ports.py), without a cluster:
the workers of a parallel run (pytest-xdist) and the private clusters beside their session clusters
never share a port, for the defaults of weir/core/endpoints.env and for a port set given in the
environment."""

from __future__ import annotations

import itertools

import pytest

from tests.integration.ports import private_ports, worker_index, worker_ports
from weir.core.config import Endpoints
from weir.tools.supervisor import TASKMANAGERS

DEFAULTS: dict[str, str] = {}
GIVEN = {  # a port set as a developer's worktree gives one (26X23, 26X49, 26X81, 26X60)
    "WEIR_JOBMANAGER_PORT": "26723",
    "WEIR_JOBMANAGER_METRICS_PORT": "26749",
    "WEIR_JOBMANAGER_REST_PORT": "26781",
    "WEIR_TASKMANAGER_METRICS_BASE_PORT": "26760",
}
SERVICES = {19092, 19093, 15432, 19000, 19090}  # Kafka (and its controller), PostgreSQL, S3, Prometheus


def ports_of(variables: dict[str, str]) -> set[int]:
    """Every port a cluster on these variables listens on: the JobManager's three, TaskManager N's metrics."""
    endpoints = Endpoints.from_env(variables)
    jobmanager = int(endpoints.jobmanager_address.rpartition(":")[2])
    base = endpoints.taskmanager_metrics_base_port
    taskmanagers = {base + n for n in range(1, TASKMANAGERS + 1)}
    return {jobmanager, endpoints.jobmanager_metrics_port, endpoints.jobmanager_rest_port} | taskmanagers


@pytest.mark.parametrize("environment", [DEFAULTS, GIVEN], ids=["defaults", "given"])
def test_two_workers_and_their_private_clusters_use_disjoint_ports(environment: dict[str, str]) -> None:
    base = Endpoints.from_env(environment)
    clusters = {}
    for index in (0, 1):
        session = {**environment, **worker_ports(base, index)}
        clusters[f"gw{index}"] = ports_of(session)
        clusters[f"gw{index} private"] = ports_of({**session, **private_ports(Endpoints.from_env(session))})
    for (a, ports_a), (b, ports_b) in itertools.combinations(clusters.items(), 2):
        assert not ports_a & ports_b, f"{a} and {b} share {sorted(ports_a & ports_b)}"
    for name, ports in clusters.items():
        assert len(ports) == 3 + TASKMANAGERS, f"{name}: {sorted(ports)}"
        assert not ports & SERVICES, f"{name} takes a service's port: {sorted(ports & SERVICES)}"


def test_worker_zero_keeps_the_session_ports_and_worker_one_moves_every_one() -> None:
    base = Endpoints.from_env(GIVEN)
    assert worker_ports(base, 0) == {**GIVEN, "WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:26723"}
    assert worker_ports(base, 1) == {
        "WEIR_JOBMANAGER_PORT": "26733",
        "WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:26733",
        "WEIR_JOBMANAGER_METRICS_PORT": "26759",
        "WEIR_JOBMANAGER_REST_PORT": "26791",
        "WEIR_TASKMANAGER_METRICS_BASE_PORT": "26770",
    }


def test_an_address_given_keeps_its_host_and_a_free_port_choice_stays_free() -> None:
    base = Endpoints.from_env({"WEIR_JOBMANAGER_ADDRESS": "localhost:16123", "WEIR_JOBMANAGER_REST_PORT": "0"})
    moved = worker_ports(base, 1)
    assert moved["WEIR_JOBMANAGER_ADDRESS"] == "localhost:16133"
    assert moved["WEIR_JOBMANAGER_REST_PORT"] == "0"


def test_worker_index() -> None:
    assert worker_index({}) == 0
    assert worker_index({"PYTEST_XDIST_WORKER": "gw0"}) == 0
    assert worker_index({"PYTEST_XDIST_WORKER": "gw12"}) == 12
    with pytest.raises(ValueError, match="PYTEST_XDIST_WORKER='master' is not a pytest-xdist worker id"):
        worker_index({"PYTEST_XDIST_WORKER": "master"})

"""Two of Flink's job routes against the session's cluster: ``GET /jobs/{id}/execution-result`` (what
``flink run`` in attached mode polls: IN_PROGRESS while the job runs, then COMPLETED with its result, for
a job that finished, one that failed and one cancelled) and ``PUT /jobs/{id}/resource-requirements`` (the
adaptive scheduler's bounds: Flink's validation errors, nothing for bounds the job runs within, then a live
rescale 2 -> 1 -> 2 within them under load, both sinks exact at the end)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from weir.core.config import Endpoints
from weir.core.states import JobStatus, TaskState
from weir.jobmanager.rest.ids import flink_job_id
from weir.jobmanager.rest.java_serialization import serialized_throwable

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "tests" / "integration" / "jobmanager" / "jobs" / "fail_on_request.py"
RESCALABLE = "examples/keyed_aggregation.py"
DEADLINE_S = 120.0


@pytest.fixture
def http(weir_cluster: WeirCluster) -> Iterator[httpx.Client]:
    base = f"http://127.0.0.1:{weir_cluster.endpoints.jobmanager_rest_port}"
    with httpx.Client(base_url=base, timeout=30.0) as client:
        yield client


def get(http: httpx.Client, path: str) -> Any:
    response = http.get(path)
    assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
    return response.json()


def submit(cluster: WeirCluster, directory: Path, **extra: str) -> str:
    params = {
        "fail_request": str(directory / "fail-request"),
        "fail_done": str(directory / "fail-done"),
        "output": str(directory / "out"),
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    } | extra
    return cluster.submit(str(JOB), {k: v for k, v in params.items() if v}, parallelism=2)


def runs_at(cluster: WeirCluster, job_id: str, parallelism: int) -> bool:
    """The job RUNNING at ``parallelism``, every vertex with that many subtasks, every task running."""
    status = cluster.client.job_status(job_id)
    if status.summary.status is not JobStatus.RUNNING or status.summary.parallelism != parallelism:
        return False
    per_vertex: dict[str, int] = {}
    for task in status.tasks:
        per_vertex[task.vertex_uid] = per_vertex.get(task.vertex_uid, 0) + 1
    return all(t.state is TaskState.RUNNING for t in status.tasks) and set(per_vertex.values()) == {parallelism}


def bounds(nodes: list[dict[str, Any]], lower: int, upper: int) -> dict[str, Any]:
    return {n["id"]: {"parallelism": {"lowerBound": lower, "upperBound": upper}} for n in nodes}


def put_requirements(http: httpx.Client, job_id: str, body: object) -> httpx.Response:
    return http.put(f"/v1/jobs/{flink_job_id(job_id)}/resource-requirements", json=body)


def test_resource_requirements_rescale_a_running_job_within_them_and_its_result_comes_at_its_end(
    weir_cluster: WeirCluster, services: Endpoints, unique: str, http: httpx.Client
) -> None:
    """examples/keyed_aggregation.py (Kafka source, keyed windows, Kafka and PostgreSQL sinks) under
    load, rescaled 2 -> 1 -> 2 by Flink's resource requirements, then left to finish: both sinks exact."""
    # 20 s of input at 1500 a second: the requests and both rescales took 6 s of it on a loaded machine
    # (load 10); the job still running at the last rescale is asserted below.
    params = keyed_aggregation_inputs(services, unique, 30_000, records_per_second=1500, checkpoint_interval="1s") | {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit(RESCALABLE, params, 2)
    flink_id = flink_job_id(job_id)
    polling.until("the job running at 2", DEADLINE_S, lambda: runs_at(weir_cluster, job_id, 2))
    polling.until(
        "a completed checkpoint", DEADLINE_S, lambda: weir_cluster.client.job_status(job_id).last_completed_checkpoint
    )
    assert get(http, f"/jobs/{flink_id}/execution-result") == {"status": {"id": "IN_PROGRESS"}}
    nodes = get(http, f"/jobs/{job_id}/plan")["plan"]["nodes"]
    first, rest = nodes[0], nodes[1:]
    assert rest, "a job of several vertices"

    # Flink's validation: each problem one line, nothing changed.
    bad = put_requirements(http, job_id, {first["id"]: {"parallelism": {"lowerBound": 3, "upperBound": 2}}})
    assert (bad.status_code, bad.json()) == (
        400,
        {
            "errors": [
                f"The requested lower bound [3] for job vertex [{first['id']}] is higher than the upper bound [2].",
                *(f"The request is incomplete, missing job vertex [{n['id']}] resource requirements." for n in rest),
            ]
        },
    )
    empty = put_requirements(http, job_id, {})
    assert (empty.status_code, empty.json()) == (
        400,
        {"errors": ["Request body does not specify resource requirements."]},
    )
    apart = put_requirements(http, job_id, bounds([first], 1, 1) | bounds(rest, 2, 2))
    listed = ", ".join([f"{first['uid']!r} [1, 1]", *(f"{n['uid']!r} [2, 2]" for n in rest)])
    assert (apart.status_code, apart.json()) == (
        409,
        {
            "errors": [
                f"job {job_id}: the vertices {listed} run at the job's parallelism, one number for all of them in "
                "Weir, and their bounds have none in common"
            ]
        },
    )
    # Within the bounds the job runs at already: nothing happens.
    same = put_requirements(http, job_id, bounds(nodes, 1, 2))
    assert (same.status_code, same.json()) == (200, {})
    assert runs_at(weir_cluster, job_id, 2)

    # 2 -> 1 and back, each a live rescale.
    down = put_requirements(http, job_id, bounds(nodes, 1, 1))
    assert (down.status_code, down.json()) == (200, {})
    polling.until("the job running at 1", DEADLINE_S, lambda: runs_at(weir_cluster, job_id, 1))
    assert get(http, f"/jobs/{job_id}/resource-requirements") == bounds(nodes, 1, 1)
    assert weir_cluster.client.job_status(job_id).summary.status is JobStatus.RUNNING, "input ended: raise the events"
    up = put_requirements(http, job_id, bounds(nodes, 2, 2))
    assert (up.status_code, up.json()) == (200, {})
    polling.until("the job running at 2 again", DEADLINE_S, lambda: runs_at(weir_cluster, job_id, 2))
    assert get(http, f"/jobs/{job_id}/resource-requirements") == bounds(nodes, 2, 2)
    assert weir_cluster.client.job_status(job_id).summary.status is JobStatus.RUNNING, "input ended: raise the events"

    status = weir_cluster.wait_for(job_id, timeout_s=600.0)
    assert status.summary.status is JobStatus.FINISHED, status
    assert status.summary.restarts == 0, "a rescale is no restart"
    assert_sinks_exact(RESCALABLE, params, job_id, services)
    details = get(http, f"/jobs/{job_id}")
    assert get(http, f"/jobs/{flink_id}/execution-result") == {
        "status": {"id": "COMPLETED"},
        "job-execution-result": {
            "id": flink_id,
            "application-status": "SUCCEEDED",
            "accumulator-results": {},
            "net-runtime": details["end-time"] - details["start-time"],
        },
    }
    ended = put_requirements(http, job_id, bounds(nodes, 1, 1))
    assert (ended.status_code, ended.json()) == (
        409,
        {"errors": [f"job {job_id} is FINISHED: an ended job has no resource requirements"]},
    )


def test_a_failed_job_s_result_carries_its_failure_as_flink_s_serialized_throwable(
    weir_cluster: WeirCluster, http: httpx.Client, tmp_path: Path
) -> None:
    (tmp_path / "fail-request").touch()  # the first record fails the job; no restart
    job_id = submit(weir_cluster, tmp_path, **{"restart.strategy": "none", "restart.delay": ""})
    weir_cluster.wait_for(job_id, ("FAILED",), timeout_s=DEADLINE_S)
    details = get(http, f"/jobs/{job_id}")
    assert details["state"] == "FAILED" and details["failure"]["type"] == "RequestedFailure", details["failure"]
    result = get(http, f"/jobs/{job_id}/execution-result")
    cause = result["job-execution-result"].pop("failure-cause")
    assert result == {
        "status": {"id": "COMPLETED"},
        "job-execution-result": {
            "id": flink_job_id(job_id),
            "application-status": "FAILED",
            "accumulator-results": {},
            "net-runtime": details["end-time"] - details["start-time"],
        },
    }
    trace = cause["stack-trace"]
    assert set(cause) == {"class", "stack-trace", "serialized-throwable"} and cause["class"] == "RequestedFailure"
    assert "fail_on_request.py" in trace and "RequestedFailure: failure requested by the test at record" in trace
    assert base64.b64decode(cause["serialized-throwable"]) == serialized_throwable(
        "RequestedFailure", details["failure"]["message"], trace
    )


def test_a_cancelled_job_s_result_is_canceled(weir_cluster: WeirCluster, http: httpx.Client, tmp_path: Path) -> None:
    job_id = submit(weir_cluster, tmp_path)
    polling.until("the job running", DEADLINE_S, lambda: runs_at(weir_cluster, job_id, 2))
    assert http.patch(f"/jobs/{job_id}").status_code == 202
    weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=DEADLINE_S)
    details = get(http, f"/jobs/{job_id}")
    assert get(http, f"/jobs/{job_id}/execution-result") == {
        "status": {"id": "COMPLETED"},
        "job-execution-result": {
            "id": flink_job_id(job_id),
            "application-status": "CANCELED",
            "accumulator-results": {},
            "net-runtime": details["end-time"] - details["start-time"],
        },
    }
    unknown = http.get("/jobs/00000000000000000000000000000000/execution-result")
    assert unknown.status_code == 404 and set(unknown.json()) == {"errors"}

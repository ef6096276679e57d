"""Flink's rescaling routes on Weir's REST API: ``PATCH /jobs/{id}/rescaling?parallelism=N`` answers
the request's trigger id (200), ``GET /jobs/{id}/rescaling/{trigger id}`` its outcome in Flink's
``AsynchronousOperationResult``; refusals are 409 with one line, before the job is touched."""

from __future__ import annotations

import warnings

from tests.unit.jobmanager.conftest import Harness
from tests.unit.jobmanager.test_rescale import ack, running_job
from weir.jobmanager.rest.ids import flink_job_id

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient



def test_a_rescale_through_flink_s_routes_reports_in_progress_then_completed(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    path = f"/v1/jobs/{flink_job_id(job.job_id)}/rescaling"
    response = client.patch(path, params={"parallelism": 2})
    assert response.status_code == 200, response.text
    trigger_id = response.json()["request-id"]
    assert len(trigger_id) == 32 and int(trigger_id, 16) >= 0
    assert client.get(f"{path}/{trigger_id}").json() == {"status": {"id": "IN_PROGRESS"}}
    op = harness.jm.executor.rescales.active(job.job_id)
    assert op is not None and op.checkpoint_id is not None
    ack(harness, job, op.checkpoint_id)
    assert client.get(f"{path}/{trigger_id}").json() == {"status": {"id": "IN_PROGRESS"}}, "redeploying"
    with harness.jm.lock:
        harness.jm.executor.execute(job, job.lifecycle.deploying(harness.clock())[1])
        harness.jm.executor.execute(
            job, job.lifecycle.tasks_running(harness.clock(), job.all_task_ids(), restored=True)
        )
    assert client.get(f"{path}/{trigger_id}").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {"checkpointId": op.checkpoint_id},
    }


def test_a_failed_rescale_answers_its_failure_cause(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    trigger_id = client.patch(f"/jobs/{job.job_id}/rescaling", params={"parallelism": 2}).json()["request-id"]
    harness.fail(job, "a task broke", retriable=True)
    answer = client.get(f"/jobs/{job.job_id}/rescaling/{trigger_id}").json()
    assert answer["status"] == {"id": "COMPLETED"}
    cause = answer["operation"]["failure-cause"]
    assert cause["class"] == "RescaleFailedError" and "a task broke" in cause["stack-trace"]


def test_refusals_and_unknowns(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    refused = client.patch(f"/jobs/{job.job_id}/rescaling", params={"parallelism": 3})
    assert refused.status_code == 409 and refused.json() == {
        "errors": [f"job {job.job_id} already runs at parallelism 3"]
    }
    assert client.patch(f"/jobs/{job.job_id}/rescaling", params={"parallelism": 129}).status_code == 409
    assert client.patch(f"/jobs/{job.job_id}/rescaling").status_code == 400, "parallelism is required"
    assert client.patch(f"/jobs/{job.job_id}/rescaling", params={"parallelism": 0}).status_code == 400
    assert client.patch("/jobs/nope/rescaling", params={"parallelism": 2}).status_code == 404
    unknown = client.get(f"/jobs/{job.job_id}/rescaling/{'0' * 32}")
    assert unknown.status_code == 404 and "has no rescale" in unknown.json()["errors"][0]

"""Flink's ``GET /jobs/{id}/execution-result`` on Weir's REST API (``JobExecutionResultResponseBody``):
IN_PROGRESS until the job ended, then COMPLETED with its ``job-execution-result`` in Flink 2.2's fields;
a FAILED job's failure as Flink's ``SerializedThrowable``, its Java serialization included."""

from __future__ import annotations

import base64
import warnings

from tests.unit.jobmanager.conftest import Harness
from weir.core.errors import Fault
from weir.core.failures import Failure
from weir.core.states import JobStatus, TaskState
from weir.jobmanager.messages import TaskStateReport
from weir.jobmanager.rest.java_serialization import serialized_throwable

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient

from weir.jobmanager.rest.ids import flink_job_id

JOB_ID = "5f1c0a2b3c4d5e6f"  # a Weir id: Flink's form is it zero-padded to 32


def test_a_running_job_is_in_progress_and_a_cancelled_one_completed_as_canceled(
    harness: Harness, client: TestClient
) -> None:
    job = harness.job(job_id=JOB_ID)
    assert client.get(f"/v1/jobs/{flink_job_id(JOB_ID)}/execution-result").json() == {"status": {"id": "IN_PROGRESS"}}
    harness.clock.advance(2.5)
    harness.jm.cancel(job.job_id)
    assert job.status is JobStatus.CANCELED  # the fakes resolve its sinks at once
    assert client.get(f"/jobs/{JOB_ID}/execution-result").json() == {
        "status": {"id": "COMPLETED"},
        "job-execution-result": {
            "id": flink_job_id(JOB_ID),
            "application-status": "CANCELED",
            "accumulator-results": {},
            "net-runtime": round(harness.clock() * 1000),  # submitted at 0.0
        },
    }


def test_a_finished_job_succeeded(harness: Harness, client: TestClient) -> None:
    job = harness.job(job_id=JOB_ID)
    harness.finish(job)
    assert job.status is JobStatus.FINISHED
    result = client.get(f"/jobs/{JOB_ID}/execution-result").json()
    assert result["status"] == {"id": "COMPLETED"}
    assert result["job-execution-result"]["application-status"] == "SUCCEEDED"
    assert "failure-cause" not in result["job-execution-result"]


def test_a_failed_job_carries_its_failure_as_flink_s_serialized_throwable(harness: Harness, client: TestClient) -> None:
    job = harness.job({"restart.strategy": "none"}, job_id=JOB_ID)
    harness.clock.advance(3.0)
    trace = 'Traceback (most recent call last):\n  File "job.py", line 3, in f\nTypeError: bad function\n'
    cause = Failure("TypeError", "bad function", Fault.USER, False, stacktrace=trace)
    harness.jm.report_task_state(
        TaskStateReport(job.job_id, "gen", 0, job.attempt, TaskState.FAILED, cause, 0, 0, False)
    )
    assert job.status is JobStatus.FAILED
    result = client.get(f"/jobs/{JOB_ID}/execution-result").json()
    failure = result["job-execution-result"].pop("failure-cause")
    assert result == {
        "status": {"id": "COMPLETED"},
        "job-execution-result": {
            "id": flink_job_id(JOB_ID),
            "application-status": "FAILED",
            "accumulator-results": {},
            "net-runtime": round(harness.clock() * 1000),
        },
    }
    message = "task gen#0 failed: bad function"
    assert {k: v for k, v in failure.items() if k != "serialized-throwable"} == {
        "class": "TypeError",
        "stack-trace": trace,
    }
    assert base64.b64decode(failure["serialized-throwable"]) == serialized_throwable("TypeError", message, trace)


def test_an_unknown_job_is_not_found(client: TestClient) -> None:
    response = client.get("/jobs/nope/execution-result")
    assert response.status_code == 404 and "nope" in response.json()["errors"][0]

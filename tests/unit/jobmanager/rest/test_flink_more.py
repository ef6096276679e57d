"""The Flink REST operations added to close the spec's gaps, in Flink's shapes (Flink 2.2's
response classes' field names): the JobManager's environment, a vertex's TaskManagers, a vertex's
subtasks in a checkpoint, the client heartbeat, the cluster datasets and the log URLs Flink serves
only with a URL pattern configured. Over a JobManager built without network, as ``test_app``."""

from __future__ import annotations

import dataclasses
import platform
import sys
import warnings

import pytest

from tests.unit.jobmanager.conftest import TM_A, TM_B, Harness
from tests.unit.jobmanager.rest.test_flink_shapes import complete_checkpoint, errors_of, ok, running_job
from weir.core.states import TaskState
from weir.jobmanager.checkpointing.pending import TaskAckMetrics
from weir.jobmanager.messages import CheckpointAck, ClusterView
from weir.jobmanager.rest import environment, vertices, views
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient


STATS = {"min", "max", "avg", "p50", "p90", "p95", "p99", "p999"}
AGGREGATES = {"min", "max", "avg", "sum", "median", "p25", "p75", "p95"}


# Environment ---------------------------------------------------------------------------------------


def test_the_environment_is_this_interpreter_s_in_flink_s_environment_info(
    harness: Harness, client: TestClient
) -> None:
    running_job(harness)
    body = ok(client, "/jobmanager/environment")
    assert set(body) == {"jvm", "classpath"} and set(body["jvm"]) == {"version", "arch", "options"}
    assert body["jvm"]["version"] == f"{platform.python_implementation()} {platform.python_version()}"
    assert body["jvm"]["arch"] == platform.machine() and body["jvm"]["arch"]
    assert body["classpath"] == sys.path
    assert body["jvm"]["options"] == environment.interpreter_options(sys.orig_argv)
    assert ok(client, "/v1/jobmanager/environment") == body
    assert ok(client, f"/jobs/{flink_job_id('job-1')}/jobmanager/environment") == body
    assert ok(client, "/v1/jobs/job-1/jobmanager/environment") == body
    errors_of(client.get("/jobs/nope/jobmanager/environment"), 404)


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["python"], []),
        (["python", "-m", "weir.jobmanager", "-X", "x"], []),
        (
            ["python", "-u", "-X", "dev", "-W", "error", "-m", "weir.jobmanager", "--port", "1"],
            ["-u", "-X", "dev", "-W", "error"],
        ),
        (["python", "-O", "job.py", "-u"], ["-O"]),
        (["python", "-Xfrozen_modules=off", "-c", "pass"], ["-Xfrozen_modules=off"]),
        (["python", "-"], []),
    ],
)
def test_interpreter_options_are_those_before_the_program(argv: list[str], options: list[str]) -> None:
    assert environment.interpreter_options(argv) == options


# A vertex's TaskManagers ----------------------------------------------------------------------------


def test_a_vertex_s_taskmanagers_are_flink_s_job_vertex_taskmanagers_info(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    job.submission = dataclasses.replace(job.submission, submitted_at=50.0)
    harness.clock.advance(10)
    body = ok(client, "/jobs/job-1/vertices/gen/taskmanagers")
    assert set(body) == {"id", "uid", "name", "now", "taskmanagers"}
    assert (body["id"], body["uid"]) == (flink_vertex_id("gen"), "gen")
    (tm,) = body["taskmanagers"]
    assert set(tm) == {
        "host", "endpoint", "status", "start-time", "end-time", "duration", "metrics",
        "status-counts", "taskmanager-id", "aggregated",
    }  # fmt: skip
    assert (tm["host"], tm["endpoint"], tm["taskmanager-id"], tm["status"]) == (TM_A, TM_A, "tm-a", "RUNNING")
    assert tm["status-counts"]["RUNNING"] == 1 and sum(tm["status-counts"].values()) == 1
    assert (tm["metrics"]["read-records"], tm["metrics"]["write-records"]) == (40, 35)
    assert (tm["start-time"], tm["end-time"]) == (50_000, -1)  # its subtask's deployment, not ended
    assert tm["duration"] == body["now"] - 50_000
    assert set(tm["aggregated"]) == {"metrics", "status-duration"}
    assert tm["aggregated"]["metrics"]["read-records"] == {
        "min": 40, "max": 40, "avg": 40, "sum": 40, "median": 40, "p25": 40, "p75": 40, "p95": 40,
    }  # fmt: skip
    assert set(tm["aggregated"]["status-duration"]) == {"CREATED", "SCHEDULED", "INITIALIZING", "DEPLOYING", "RUNNING"}
    assert tm["aggregated"]["status-duration"]["RUNNING"]["sum"] == -1  # Weir records no state's duration
    assert ok(client, f"/v1/jobs/{flink_job_id('job-1')}/vertices/{flink_vertex_id('gen')}/taskmanagers") == body
    for path in ("/jobs/job-1/vertices/nope/taskmanagers", "/jobs/nope/vertices/gen/taskmanagers"):
        errors_of(client.get(path), 404)


def test_subtasks_are_grouped_by_their_taskmanager_with_their_states_counted(harness: Harness) -> None:
    """Three subtasks, two on tm-a (one RUNNING, one FINISHED) and one not deployed: two groups; each
    group's status is the subtasks' aggregated one, its records their sums, its statistics over them."""
    running_job(harness)
    status = harness.jm.job_status("job-1")
    (gen,) = [t for t in status.tasks if t.vertex_uid == "gen"]
    finished = dataclasses.replace(gen, subtask=1, state=TaskState.FINISHED, records_in=10, records_out=5)
    unassigned = dataclasses.replace(
        gen, subtask=2, state=None, taskmanager_id="", attempt=0, records_in=0, records_out=0
    )
    others = tuple(t for t in status.tasks if t.vertex_uid != "gen")
    status = dataclasses.replace(status, tasks=(*others, gen, finished, unassigned))
    plan = harness.jm.job_plan("job-1")
    (vertex,) = [v for v in plan.vertices if v.uid == "gen"]
    cluster = harness.jm.cluster_status()
    body = vertices.vertex_taskmanagers(status, vertex, cluster).model_dump(by_alias=True)
    by_tm = {tm["taskmanager-id"]: tm for tm in body["taskmanagers"]}
    assert set(by_tm) == {"tm-a", "(unassigned)"}
    on_a = by_tm["tm-a"]
    assert on_a["status"] == "RUNNING"  # any RUNNING, as Flink aggregates a vertex's
    assert (on_a["status-counts"]["RUNNING"], on_a["status-counts"]["FINISHED"]) == (1, 1)
    assert on_a["metrics"]["read-records"] == 50 and on_a["metrics"]["write-records"] == 40
    reads = on_a["aggregated"]["metrics"]["read-records"]
    assert (reads["min"], reads["max"], reads["sum"], reads["avg"]) == (10, 40, 50, 25)
    assert on_a["end-time"] == -1  # not all ended
    none = by_tm["(unassigned)"]
    assert (none["status"], none["host"], none["start-time"], none["duration"]) == ("CREATED", "(unassigned)", -1, -1)
    assert none["status-counts"]["CREATED"] == 1
    assert set(on_a["aggregated"]["metrics"]["accumulated-busy-time"]) == AGGREGATES
    assert TM_B not in {tm["host"] for tm in body["taskmanagers"]}
    assert isinstance(cluster, ClusterView)


# A vertex's subtasks in a checkpoint -----------------------------------------------------------------


def test_a_checkpoint_s_subtasks_of_a_vertex_are_flink_s_with_their_acknowledgement(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    checkpoint_id = complete_checkpoint(harness, job, 0.25, 120, 30)
    acked_at = round(harness.clock() * 1000)
    body = ok(client, f"/jobs/job-1/checkpoints/details/{checkpoint_id}/subtasks/gen")
    part = ok(client, f"/jobs/job-1/checkpoints/details/{checkpoint_id}")["tasks"][flink_vertex_id("gen")]
    assert {k: v for k, v in body.items() if k not in ("summary", "subtasks")} == part
    assert set(body["summary"]) == {
        "checkpointed_size", "state_size", "end_to_end_duration", "checkpoint_duration", "alignment", "start_delay",
    }  # fmt: skip
    assert set(body["summary"]["alignment"]) == {"buffered", "processed", "persisted", "duration"}
    assert set(body["summary"]["checkpoint_duration"]) == {"sync", "async"}
    assert set(body["summary"]["state_size"]) == STATS
    (subtask,) = body["subtasks"]
    assert set(subtask) == {
        "className", "index", "status", "ack_timestamp", "end_to_end_duration", "state_size",
        "checkpointed_size", "checkpoint", "alignment", "start_delay", "unaligned_checkpoint", "aborted",
    }  # fmt: skip
    assert (subtask["className"], subtask["status"], subtask["index"]) == ("completed", "completed", 0)
    assert (subtask["ack_timestamp"], subtask["end_to_end_duration"]) == (acked_at, 250)
    assert (subtask["state_size"], subtask["unaligned_checkpoint"], subtask["aborted"]) == (120, True, False)
    assert subtask["alignment"]["persisted"] == 30 and subtask["alignment"]["buffered"] == 0
    assert body["summary"]["end_to_end_duration"]["max"] == 250
    assert body["summary"]["alignment"]["persisted"]["min"] == 30
    assert ok(client, f"/v1/jobs/{flink_job_id('job-1')}/checkpoints/details/{checkpoint_id}/subtasks/gen") == body


def test_a_subtask_that_has_not_acknowledged_is_pending(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    checkpoint_id = harness.jm.trigger_checkpoint(job.job_id, full=False)
    body = ok(client, f"/jobs/job-1/checkpoints/details/{checkpoint_id}/subtasks/{flink_vertex_id('gen')}")
    assert body["subtasks"] == [{"className": "pending", "index": 0, "status": "pending_or_failed"}]
    assert (body["num_subtasks"], body["num_acknowledged_subtasks"], body["latest_ack_timestamp"]) == (1, 0, -1)
    assert body["summary"]["state_size"] == dict.fromkeys(STATS, 0)
    harness.jm.acknowledge_checkpoint(
        CheckpointAck(job.job_id, "gen", 0, job.attempt, checkpoint_id, (), b"{}", TaskAckMetrics(state_size_bytes=2))
    )
    (done,) = ok(client, f"/jobs/job-1/checkpoints/details/{checkpoint_id}/subtasks/gen")["subtasks"]
    assert done["status"] == "completed" and done["state_size"] == 2


def test_checkpoint_subtasks_of_unknown_things_are_404(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    checkpoint_id = complete_checkpoint(harness, job, 0.1, 50, 0)
    errors_of(client.get(f"/jobs/job-1/checkpoints/details/{checkpoint_id}/subtasks/nope"), 404)
    errors_of(client.get(f"/jobs/job-1/checkpoints/details/{checkpoint_id + 7}/subtasks/gen"), 404)
    errors_of(client.get(f"/jobs/nope/checkpoints/details/{checkpoint_id}/subtasks/gen"), 404)
    errors_of(client.get("/jobs/job-1/checkpoints/details/x/subtasks/gen"), 400)
    # a checkpoint without statistics of the vertex (one a restarted JobManager read back from storage)
    detail = harness.jm.checkpoint_detail("job-1", checkpoint_id)
    unread = dataclasses.replace(detail, checkpoint=dataclasses.replace(detail.checkpoint, tasks=(), pending_tasks=()))
    assert views.vertex_checkpoint_details(unread, "gen", [0]) is None
    assert views.vertex_checkpoint_details(detail, "gen", [0]) is not None


# Client heartbeat, datasets, log URLs ---------------------------------------------------------------


def test_a_client_heartbeat_is_accepted_for_a_known_job_and_refused_otherwise(
    harness: Harness, client: TestClient
) -> None:
    running_job(harness)
    for prefix in ("", "/v1"):
        response = client.patch(
            f"{prefix}/jobs/{flink_job_id('job-1')}/clientHeartbeat", json={"expiredTimestamp": 1_700_000_000_000}
        )
        assert (response.status_code, response.json()) == (202, {})
    errors_of(client.patch("/jobs/nope/clientHeartbeat", json={"expiredTimestamp": 1}), 404)
    errors_of(client.patch("/jobs/job-1/clientHeartbeat", json={"expiredTimestamp": "soon"}), 400)
    errors_of(client.patch("/jobs/job-1/clientHeartbeat", json={}), 400)
    assert harness.jm.job_status("job-1").summary.status.value == "RUNNING"  # a beat changes nothing


def test_datasets_are_an_empty_list_and_deleting_one_completes_as_flink_s_for_an_unknown_one(
    client: TestClient,
) -> None:
    assert ok(client, "/datasets") == {"dataSets": []} == ok(client, "/v1/datasets")
    response = client.delete("/datasets/" + "ab" * 16)
    assert response.status_code == 202, response.text
    trigger = response.json()["request-id"]
    assert ok(client, f"/datasets/delete/{trigger}") == {"status": {"id": "COMPLETED"}, "operation": {}}
    assert ok(client, f"/v1/datasets/delete/{trigger}") == {"status": {"id": "COMPLETED"}, "operation": {}}
    assert "32 hex digits" in errors_of(client.delete("/datasets/not-an-id"), 400)[0]
    errors_of(client.get("/datasets/delete/" + "0" * 32), 404)


def test_log_urls_are_404_as_flink_s_without_a_url_pattern(harness: Harness, client: TestClient) -> None:
    running_job(harness)
    message = errors_of(client.get("/jobs/job-1/jobmanager/log-url"), 404)[0]
    assert "historyserver.log.jobmanager.url-pattern" in message
    message = errors_of(client.get("/v1/jobs/job-1/taskmanagers/tm-a/log-url"), 404)[0]
    assert "historyserver.log.taskmanager.url-pattern" in message
    assert "nope" in errors_of(client.get("/jobs/nope/jobmanager/log-url"), 404)[0]


def test_every_new_route_is_in_the_openapi_document(client: TestClient) -> None:
    paths = ok(client, "/openapi.json")["paths"]
    expected: dict[str, set[str]] = {
        "/jobmanager/environment": {"get"},
        "/jobs/{job_id}/jobmanager/environment": {"get"},
        "/jobs/{job_id}/jobmanager/log-url": {"get"},
        "/jobs/{job_id}/taskmanagers/{taskmanager_id}/log-url": {"get"},
        "/jobs/{job_id}/vertices/{vertex_id}/taskmanagers": {"get"},
        "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex_id}": {"get"},
        "/jobs/{job_id}/clientHeartbeat": {"patch"},
        "/datasets": {"get"},
        "/datasets/{dataset_id}": {"delete"},
        "/datasets/delete/{trigger_id}": {"get"},
    }
    for path, methods in expected.items():
        assert methods <= set(paths[path]), path

"""The REST API over a JobManager built without network (fake gateway, clock and storage): every path,
its answers in the API's shape, and the one error mapping (404, 400, 409, 503)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import weir
from tests.unit.jobmanager.conftest import Harness, MakeHarness
from weir.core.checkpointing import ChannelBarrierTime, SubtaskCheckpointTimeline
from weir.core.errors import Fault
from weir.core.failures import Failure
from weir.core.ids import CheckpointId
from weir.core.states import JobStatus, TaskState
from weir.core.task_time import TimeRatios, TimeTotals
from weir.jobmanager.checkpointing.pending import TaskAckMetrics
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.leader_election import LeaderTerm, LeaseRecord
from weir.jobmanager.messages import CheckpointAck, Heartbeat, TaskProgress, TaskStateReport

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # Starlette would rather have httpx2 under it
    from fastapi.testclient import TestClient

from openapi_spec_validator import validate

from weir.core.roles import REST_ROUTE_ROLES, access_table, parse_tokens_file, rest_route_role
from weir.jobmanager.rest import views
from weir.jobmanager.rest.app import create_app
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id, slot_sharing_group_id

JOB_PATHS = (
    "/jobs/{job}",
    "/jobs/{job}/plan",
    "/jobs/{job}/exceptions",
    "/jobs/{job}/checkpoints",
    "/jobs/{job}/checkpoints/details/1",
    "/jobs/{job}/vertices/gen/backpressure",
    "/jobs/{job}/status",
    "/jobs/{job}/resource-requirements",
    "/jobs/{job}/execution-result",
)


def running_job(h: Harness) -> JobMaster:
    """The harness's job with its one task RUNNING and checkpoints started (triggered only on request)."""
    job = h.job({"checkpointing.interval": "1h", "restart.strategy": "fixed-delay", "restart.delay": "1s"})
    h.jm.report_task_state(TaskStateReport(job.job_id, "gen", 0, job.attempt, TaskState.RUNNING, None, 0, 0, False))
    assert job.coordinator.is_running
    return job


def failed(job: JobMaster, failure: Failure) -> TaskStateReport:
    return TaskStateReport(job.job_id, "gen", 0, job.attempt, TaskState.FAILED, failure, 0, 0, False)


def errors_of(response: Any, status: int) -> list[str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"errors"} and body["errors"] and all(isinstance(e, str) for e in body["errors"]), body
    return list(body["errors"])


# The bearer token -----------------------------------------------------------------------------------


def test_with_a_token_every_api_route_answers_401_without_it_or_with_a_wrong_one(harness: Harness) -> None:
    with TestClient(create_app(harness.jm, token="s3cret")) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            for path in ("/overview", "/jobs", "/taskmanagers", "/jobs/nope"):
                response = client.get(path, headers=headers)
                assert "WEIR_AUTH_TOKEN" in errors_of(response, 401)[0]
                assert response.headers["www-authenticate"] == "Bearer"
            assert client.patch("/jobs/nope", headers=headers).status_code == 401
        assert client.get("/jobs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/jobs/nope", headers={"Authorization": "Bearer s3cret"}).status_code == 404
        assert client.get("/healthz").status_code == 200  # probes carry no token
        assert client.get("/openapi.json").status_code == 200


def test_the_token_is_checked_before_readiness(make_harness: MakeHarness) -> None:
    h = make_harness()
    with TestClient(create_app(h.jm, token="s3cret")) as client:
        errors_of(client.get("/jobs"), 401)
        errors_of(client.get("/jobs", headers={"Authorization": "Bearer s3cret"}), 503)


# Roles -----------------------------------------------------------------------------------------------


def test_every_api_route_has_a_role_and_the_table_names_no_other(harness: Harness) -> None:
    paths = create_app(harness.jm, token="s3cret").openapi()["paths"]  # every API route (/v1: the same ones)
    routes = {
        (method.upper(), path) for path, operations in paths.items() if path != "/healthz" for method in operations
    }
    assert len(routes) >= 25
    assert {r for r in routes if rest_route_role(*r) is None} == set(), "routes without a role: add them"
    assert set(REST_ROUTE_ROLES) - routes == set(), "roles of routes the API no longer has"


def test_a_read_token_reads_but_cannot_cancel_stop_or_savepoint_and_an_operate_token_can(harness: Harness) -> None:
    job = running_job(harness)
    access = access_table(None, parse_tokens_file("read r\noperate o\n", "tokens"), "internal")
    with TestClient(create_app(harness.jm, access=access)) as client:
        read, operate = {"Authorization": "Bearer r"}, {"Authorization": "Bearer o"}
        internal = {"Authorization": "Bearer internal"}
        assert client.get("/jobs", headers=read).status_code == 200
        assert client.get(f"/v1/jobs/{job.job_id}", headers=read).status_code == 200
        for path in (f"/jobs/{job.job_id}", f"/v1/jobs/{job.job_id}"):
            (message,) = errors_of(client.patch(path, headers=read), 403)
            assert "'operate'" in message and "PATCH /jobs/{job_id}" in message, message
        for path in (f"/jobs/{job.job_id}/stop", f"/jobs/{job.job_id}/savepoints", "/savepoint-disposal"):
            assert "'operate'" in errors_of(client.post(path, headers=read, json={}), 403)[0]
        errors_of(client.get("/jobs", headers=internal), 403)  # the cluster's token is no client's
        assert harness.jm.job_status(job.job_id).summary.status == "RUNNING"  # nothing ran
        assert client.patch(f"/jobs/{job.job_id}", headers=operate).status_code == 202


# Health and readiness ------------------------------------------------------------------------------


def test_before_its_jobs_are_recovered_healthz_says_starting_and_every_read_answers_503(
    make_harness: MakeHarness,
) -> None:
    h = make_harness()
    client = TestClient(create_app(h.jm))
    response = client.get("/healthz")
    assert (response.status_code, response.json()) == (503, {"status": "starting"})
    assert "taking over its jobs" in errors_of(client.get("/jobs"), 503)[0]
    errors_of(client.get("/overview"), 503)
    h.jm.recover_jobs()
    assert client.get("/healthz").json() == {"status": "ok", "taskmanagers": 1, "jobs_running": 0}
    assert client.get("/jobs").status_code == 200
    h.jm.stop()
    assert client.get("/healthz").json() == {"status": "stopping"}


def test_a_standbys_healthz_names_the_leader_it_knows(make_harness: MakeHarness) -> None:
    """High availability: a standby answers 503 `starting` with the leader it last read in the lease,
    so a probe or an operator sees where to go; none known yet: no `leader`."""
    h = make_harness()
    known: list[views.KnownLeader | None] = [None]
    client = TestClient(create_app(h.jm, known_leader=lambda: known[0]))
    assert (client.get("/healthz").status_code, client.get("/healthz").json()) == (503, {"status": "starting"})
    known[0] = views.known_leader(LeaseRecord("jm-b", LeaderTerm(3), "10.0.0.2:6123", 6.0))
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "starting", "leader": {"address": "10.0.0.2:6123", "term": 3}}


def test_healthz_counts_live_taskmanagers_and_running_jobs(harness: Harness, client: TestClient) -> None:
    harness.job()
    harness.jm.register_taskmanager("tm-b", "tm-b:6124", 4, 0, incarnation="first")
    assert client.get("/healthz").json() == {"status": "ok", "taskmanagers": 2, "jobs_running": 1}


# The cluster ---------------------------------------------------------------------------------------


def test_overview_counts_slots_of_live_taskmanagers_and_jobs_by_status(harness: Harness, client: TestClient) -> None:
    harness.job()
    ended = harness.job(job_id="job-2")
    harness.fail(ended)
    assert client.get("/overview").json() == {
        "taskmanagers": 1,
        "slots-total": 4,
        "slots-available": 3,
        "jobs-running": 1,
        "jobs-finished": 0,
        "jobs-cancelled": 0,
        "jobs-failed": 1,
        "taskmanagers-blocked": 0,
        "slots-free-and-blocked": 0,
        "flink-version": weir.__version__,
        "flink-commit": "unknown",
        "weir-version": weir.__version__,
    }


UNKNOWN_PROFILE = {
    "cpuCores": -1.0,
    "taskHeapMemory": -1,
    "taskOffHeapMemory": -1,
    "managedMemory": -1,
    "networkMemory": -1,
    "extendedResources": {},
}
MEMORY_POOLS = (
    "frameworkHeap",
    "taskHeap",
    "frameworkOffHeap",
    "taskOffHeap",
    "networkMemory",
    "managedMemory",
    "jvmMetaspace",
    "jvmOverhead",
    "totalFlinkMemory",
    "totalProcessMemory",
)


def test_taskmanagers_list_their_tasks_and_heartbeat_age_in_ms(harness: Harness, client: TestClient) -> None:
    job = harness.job()
    harness.clock.advance(0.75)
    (tm,) = client.get("/taskmanagers").json()["taskmanagers"]
    assert tm == {
        "id": "tm-a",
        "path": "tm-a:6124",
        "slotsNumber": 4,
        "freeSlots": 3,
        "timeSinceLastHeartbeat": 750,
        "alive": True,
        "tasks": [{"job_id": "job-1", "vertex_id": "gen", "subtask": 0, "attempt": job.attempt, "status": "DEPLOYING"}],
        # Flink's fields a TaskManager does not report: its address's port, no JMX, Flink's unknown
        # resource profile, hardware not reported (-1), no JVM memory (0), never blocked
        "dataPort": 6124,
        "jmxPort": -1,
        "totalResource": UNKNOWN_PROFILE,
        "freeResource": UNKNOWN_PROFILE,
        "hardware": {"cpuCores": -1, "physicalMemory": -1, "freeMemory": 0, "managedMemory": 0},
        "memoryConfiguration": dict.fromkeys(MEMORY_POOLS, 0),
        "blocked": False,
    }


# Jobs ----------------------------------------------------------------------------------------------


def test_jobs_are_listed_newest_first_with_start_time_in_ms(harness: Harness, client: TestClient) -> None:
    harness.job()
    newer = harness.job(job_id="job-2")
    object.__setattr__(newer.submission, "submitted_at", 12.5)
    assert client.get("/jobs").json()["jobs"] == [
        {"id": "job-2", "name": "j", "status": "RUNNING", "start-time": 12_500, "parallelism": 1, "restarts": 0},
        {"id": "job-1", "name": "j", "status": "RUNNING", "start-time": 0, "parallelism": 1, "restarts": 0},
    ]


def test_a_job_s_details_show_its_vertices_subtasks_and_their_load(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    watermark = round(harness.clock() * 1000) - 1_500
    harness.jm.heartbeat(
        Heartbeat(
            "tm-a",
            (
                TaskProgress(
                    job.job_id,
                    "gen",
                    0,
                    job.attempt,
                    40,
                    35,
                    TimeRatios(0.5, 0.25, 0.25),
                    watermark,
                    totals=TimeTotals(busy_s=12.25, backpressured_s=3.5, idle_s=0.125),
                ),
            ),
        )
    )
    details = client.get("/jobs/job-1").json()
    now = round(harness.clock() * 1000)
    assert details["jid"] == "job-1" and details["state"] == "RUNNING" and details["now"] == now
    assert (details["start-time"], details["end-time"], details["duration"]) == (0, -1, now)
    assert details["last_completed_checkpoint"] is None and details["failure"] is None
    # Flink's: the job's vertices per ExecutionState, every one (its one vertex RUNNING)
    assert details["status-counts"] == dict.fromkeys(views.FLINK_EXECUTION_STATES, 0) | {"RUNNING": 1}
    (vertex,) = details["vertices"]
    assert (vertex["id"], vertex["uid"], vertex["name"], vertex["parallelism"], vertex["status"]) == (
        flink_vertex_id("gen"),
        "gen",
        "generator -> print",
        1,
        "RUNNING",
    )
    # Flink's ExecutionState counts (every state, no total), the job's one slot sharing group
    assert vertex["tasks"] == dict.fromkeys(views.FLINK_EXECUTION_STATES, 0) | {"RUNNING": 1}
    assert vertex["slotSharingGroupId"] == slot_sharing_group_id("job-1")
    assert len(vertex["slotSharingGroupId"]) == 32
    assert (details["job-type"], details["pending-operators"]) == ("STREAMING", 0)
    # Flink's IOMetricsInfo: the records and the task thread's busy/backpressured/idle ms so far
    assert vertex["metrics"] == {
        "read-bytes": 0,
        "read-bytes-complete": False,
        "write-bytes": 0,
        "write-bytes-complete": False,
        "read-records": 40,
        "read-records-complete": True,
        "write-records": 35,
        "write-records-complete": True,
        "accumulated-busy-time": 12_250.0,
        "accumulated-backpressured-time": 3_500,
        "accumulated-idle-time": 125,
    }
    assert vertex["subtasks"] == [
        {
            "subtask": 0,
            "status": "RUNNING",
            "taskmanager_id": "tm-a",
            "attempt": job.attempt,
            "read-records": 40,
            "write-records": 35,
            "busyRatio": 0.5,
            "backPressuredRatio": 0.25,
            "idleRatio": 0.25,
            "watermark": watermark,
            "watermark_lag": 1_500,
        }
    ]


def test_an_ended_job_has_an_end_time_and_its_failure_by_fault_name(harness: Harness, client: TestClient) -> None:
    job = harness.job({"restart.strategy": "none"})
    harness.clock.advance(3.0)
    cause = Failure("TypeError", "bad function", Fault.USER, False)
    harness.jm.report_task_state(
        TaskStateReport(job.job_id, "gen", 0, job.attempt, TaskState.FAILED, cause, 0, 0, False)
    )
    details = client.get("/jobs/job-1").json()
    assert details["state"] == "FAILED" and details["end-time"] == round(harness.clock() * 1000)
    assert details["duration"] == details["end-time"] - details["start-time"]
    assert details["failure"] == {
        "type": "TypeError",
        "message": "task gen#0 failed: bad function",
        "fault": "USER",
        "retriable": False,
    }


def test_a_job_s_plan_names_each_chain_in_topological_order(harness: Harness, client: TestClient) -> None:
    harness.job()
    assert client.get("/jobs/job-1/plan").json() == {
        "plan": {
            "jid": "job-1",
            "name": "j",
            "type": "STREAMING",
            "nodes": [
                {
                    "id": flink_vertex_id("gen"),
                    "uid": "gen",
                    "parallelism": 1,
                    "operator": "generator",
                    "operator_strategy": "",
                    "description": "generator -> print",
                    "optimizer_properties": {},
                    "operators": [{"uid": "gen", "name": "generator"}, {"uid": "out", "name": "print"}],
                    "inputs": [],
                }
            ],
        }
    }


def test_cancel_cancels_the_job_and_only_the_cancel_mode_is_accepted(harness: Harness, client: TestClient) -> None:
    job = harness.job()
    assert "query.mode" in errors_of(client.patch("/jobs/job-1?mode=stop"), 400)[0]
    assert job.status is JobStatus.RUNNING
    response = client.patch("/jobs/job-1")
    assert (response.status_code, response.json()) == (202, {})
    assert job.status is JobStatus.CANCELED  # the fakes resolve its sinks at once
    assert client.patch("/jobs/job-1?mode=cancel").status_code == 202  # an ended job stays as it is


# Exceptions ----------------------------------------------------------------------------------------


def test_exceptions_come_newest_first_with_their_task_and_are_cut_at_max_exceptions(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    first = Failure("ValueError", "bad record", Fault.USER, True)
    harness.clock.advance(1.0)
    harness.jm.report_task_state(
        TaskStateReport(job.job_id, "gen", 0, job.attempt, TaskState.FAILED, first, 0, 0, False)
    )
    with harness.jm.lock:  # the restart: attempt 2 is deployed
        job.schedule(harness.jm.registry.offers(), harness.jm.registry.addresses(), harness.clock())
    harness.clock.advance(1.0)
    harness.jm.register_taskmanager("tm-a", "tm-a:6124", 4, 0, incarnation="second")  # lost with its tasks
    history = client.get("/jobs/job-1/exceptions").json()["exceptionHistory"]
    assert history["truncated"] is False
    lost, failed = history["entries"]
    assert failed == {
        "exceptionName": "ValueError",
        "message": "bad record",
        "fault": "USER",
        "retriable": True,
        "timestamp": 101_000,
        "taskName": "generator -> print",
        "vertex_id": "gen",
        "subtask": 0,
        "attempt": 1,
        "taskmanager_id": "tm-a",
        "stacktrace": "ValueError: bad record",
    }
    assert (lost["taskName"], lost["vertex_id"], lost["subtask"], lost["taskmanager_id"], lost["attempt"]) == (
        None,
        None,
        None,
        "tm-a",
        2,
    )
    assert lost["fault"] == "INTERNAL" and lost["timestamp"] == 102_000
    cut = client.get("/jobs/job-1/exceptions?maxExceptions=1").json()["exceptionHistory"]
    assert cut == {"entries": [lost], "truncated": True}


def test_an_exception_carries_its_stacktrace_and_the_newest_is_the_root_exception(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    trace = 'Traceback (most recent call last):\n  File "job.py", line 7, in parse\nValueError: bad record\n'
    harness.clock.advance(1.0)
    harness.jm.report_task_state(failed(job, Failure("ValueError", "bad record", Fault.USER, True, stacktrace=trace)))
    answer = client.get("/jobs/job-1/exceptions").json()
    (entry,) = answer["exceptionHistory"]["entries"]
    assert entry["stacktrace"] == trace
    assert answer["root-exception"] == trace and answer["timestamp"] == 101_000


def test_a_failure_without_a_traceback_shows_its_type_and_message_as_its_stacktrace(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    harness.jm.report_task_state(failed(job, Failure("ValueError", "bad record", Fault.USER, True)))
    (entry,) = client.get("/jobs/job-1/exceptions").json()["exceptionHistory"]["entries"]
    assert entry["stacktrace"] == "ValueError: bad record"


def test_no_exceptions_have_no_root_exception(harness: Harness, client: TestClient) -> None:
    running_job(harness)
    answer = client.get("/jobs/job-1/exceptions").json()
    assert answer["root-exception"] is None and answer["timestamp"] is None
    assert answer["exceptionHistory"] == {"entries": [], "truncated": False}


@pytest.mark.parametrize("bad", ["0", "1001", "-3", "many", ""])
def test_max_exceptions_out_of_range_is_a_bad_request(harness: Harness, client: TestClient, bad: str) -> None:
    harness.job()
    assert "maxExceptions" in errors_of(client.get(f"/jobs/job-1/exceptions?maxExceptions={bad}"), 400)[0]


# Checkpoints and savepoints ------------------------------------------------------------------------


def test_a_savepoint_is_triggered_listed_in_progress_then_completed_with_its_details(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    response = client.post("/jobs/job-1/savepoints", json={"target-directory": None, "cancel-job": False})
    assert response.status_code == 202, response.text
    trigger_id = response.json()["request-id"]
    savepoint_id = int(trigger_id, 16)
    assert len(trigger_id) == 32  # Flink's TriggerId
    assert client.get(f"/v1/jobs/job-1/savepoints/{trigger_id}").json() == {"status": {"id": "IN_PROGRESS"}}
    pending = client.get(f"/jobs/job-1/checkpoints/details/{savepoint_id}").json()
    assert pending["status"] == "IN_PROGRESS" and pending["checkpoint_type"] == "SAVEPOINT"
    assert [(s["vertex_id"], s["subtask"], s["status"], s["timeline"]) for s in pending["subtasks"]] == [
        ("gen", 0, "PENDING", None)
    ]
    harness.clock.advance(0.25)
    recorded = SubtaskCheckpointTimeline(
        first_barrier_at=100.02,
        channels=(ChannelBarrierTime(0, "up", 1, 100.025), ChannelBarrierTime(1, "up", 0, None)),
        alignment_end_at=100.03,
        sync_end_at=100.06,
        async_end_at=100.16,
    )
    metrics = TaskAckMetrics(
        alignment_duration_s=0.01,
        start_delay_s=0.02,
        state_size_bytes=64,
        sync_duration_s=0.03,
        async_duration_s=0.1,
        timeline=recorded,
    )
    harness.jm.acknowledge_checkpoint(
        CheckpointAck(job.job_id, "gen", 0, job.attempt, CheckpointId(savepoint_id), (), b"{}", metrics)
    )
    listing = client.get("/jobs/job-1/checkpoints").json()
    assert listing["counts"] == {"restored": 0, "total": 1, "in_progress": 0, "completed": 1, "failed": 0}
    (savepoint,) = listing["history"]
    assert savepoint == listing["latest"]["savepoint"]
    assert listing["latest"]["completed"] is None and listing["latest"]["failed"] is None
    assert listing["latest"]["restored"] is None
    assert savepoint["id"] == savepoint_id and savepoint["status"] == "COMPLETED" and savepoint["is_savepoint"]
    assert savepoint["trigger_timestamp"] == 100_000 and savepoint["latest_ack_timestamp"] == 100_250
    assert savepoint["end_to_end_duration"] == 250
    assert (savepoint["num_subtasks"], savepoint["num_acknowledged_subtasks"]) == (1, 1)
    assert savepoint["failure_message"] is None and savepoint["external_path"].endswith("/")
    assert client.get(f"/jobs/job-1/savepoints/{trigger_id}").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {"location": savepoint["external_path"]},
    }
    errors_of(client.get(f"/jobs/job-1/savepoints/{'f' * 32}"), 404)
    details = client.get(f"/jobs/job-1/checkpoints/details/{savepoint_id}").json()
    assert {k: v for k, v in details.items() if k != "subtasks"} == savepoint
    assert details["subtasks"] == [
        {
            "vertex_id": "gen",
            "subtask": 0,
            "status": "COMPLETED",
            "ack_timestamp": 100_250,
            "alignment_duration": 10,
            "start_delay": 20,
            "sync_duration": 30,
            "async_duration": 100,
            "state_size": 64,
            "unaligned": False,
            "inflight_size": 0,
            "timeline": {
                "trigger_timestamp": 100_000,
                "first_barrier_timestamp": 100_020,
                "channels": [
                    {"channel": 0, "upstream_vertex": "up", "upstream_subtask": 1, "barrier_timestamp": 100_025},
                    {"channel": 1, "upstream_vertex": "up", "upstream_subtask": 0, "barrier_timestamp": None},
                ],
                "alignment_end_timestamp": 100_030,
                "sync_end_timestamp": 100_060,
                "async_end_timestamp": 100_160,
                "ack_timestamp": 100_250,
            },
        }
    ]


def test_a_checkpoint_is_triggered_and_its_outcome_read_by_its_trigger_id(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    response = client.post("/v1/jobs/job-1/checkpoints", json={"checkpointType": "CONFIGURED"})
    assert response.status_code == 202, response.text
    trigger_id = response.json()["request-id"]
    checkpoint_id = int(trigger_id, 16)
    assert len(trigger_id) == 32
    assert client.get(f"/jobs/job-1/checkpoints/{trigger_id}").json() == {"status": {"id": "IN_PROGRESS"}}
    (listed,) = client.get("/jobs/job-1/checkpoints").json()["history"]
    assert (listed["id"], listed["is_savepoint"]) == (checkpoint_id, False)
    harness.jm.acknowledge_checkpoint(
        CheckpointAck(job.job_id, "gen", 0, job.attempt, CheckpointId(checkpoint_id), (), b"{}", TaskAckMetrics())
    )
    assert client.get(f"/jobs/job-1/checkpoints/{trigger_id}").json() == {
        "status": {"id": "COMPLETED"},
        "operation": {"checkpointId": checkpoint_id},
    }
    errors_of(client.get(f"/jobs/job-1/checkpoints/{'f' * 32}"), 404)
    errors_of(client.get("/jobs/job-1/checkpoints/no-trigger"), 404)
    assert client.get("/jobs/job-1/checkpoints/config").status_code == 200  # still Flink's config


def test_a_checkpoint_without_a_body_is_the_configured_type(harness: Harness, client: TestClient) -> None:
    running_job(harness)
    assert client.post("/jobs/job-1/checkpoints").status_code == 202


def test_a_savepoint_s_trigger_id_names_no_checkpoint(harness: Harness, client: TestClient) -> None:
    running_job(harness)
    trigger_id = client.post("/jobs/job-1/savepoints", json={}).json()["request-id"]
    errors_of(client.get(f"/jobs/job-1/checkpoints/{trigger_id}"), 404)


def test_a_checkpoint_of_a_job_that_is_not_running_is_a_conflict(harness: Harness, client: TestClient) -> None:
    harness.job()  # deployed, its task not running yet
    assert "not running" in errors_of(client.post("/jobs/job-1/checkpoints", json={}), 409)[0]
    errors_of(client.post("/jobs/nope/checkpoints", json={}), 404)


@pytest.mark.parametrize(("checkpoint_type", "full"), [("FULL", True), ("INCREMENTAL", False), ("CONFIGURED", False)])
def test_a_checkpoint_s_type_reaches_the_sources_and_the_history(
    harness: Harness, client: TestClient, checkpoint_type: str, full: bool
) -> None:
    """Flink's `checkpointType`: FULL tells the sources' barrier to reuse no earlier file, and the
    history says `full`; INCREMENTAL and CONFIGURED (Weir's checkpoints are incremental) do not."""
    running_job(harness)
    assert client.post("/jobs/job-1/checkpoints", json={"checkpointType": checkpoint_type}).status_code == 202
    (entry,) = client.get("/jobs/job-1/checkpoints").json()["history"]
    assert entry["full"] is full and entry["checkpoint_type"] == "CHECKPOINT"
    assert harness.gateway.full_triggers == ([entry["id"]] if full else [])


@pytest.mark.parametrize("body", [{"checkpointType": "SOMETIMES"}, {"checkpointType": 1}, {"unknown": True}])
def test_a_bad_checkpoint_body_is_a_bad_request(harness: Harness, client: TestClient, body: object) -> None:
    running_job(harness)
    errors_of(client.post("/jobs/job-1/checkpoints", json=body), 400)


def test_a_savepoint_of_a_job_that_is_not_running_is_a_conflict(harness: Harness, client: TestClient) -> None:
    harness.job()  # deployed, its task not running yet
    assert "savepoint" in errors_of(client.post("/jobs/job-1/savepoints", json={}), 409)[0]


@pytest.mark.parametrize(
    "body",
    [
        {"cancel-job": "yes"},
        {"cancel-job": 1},
        {"drain": True},  # drain without stopping
        {"target-directory": ""},
        {"target-directory": 7},
        {"target_dir": "s3://x"},  # no such field
        [],
    ],
)
def test_a_bad_savepoint_body_is_a_bad_request(harness: Harness, client: TestClient, body: object) -> None:
    running_job(harness)
    errors_of(client.post("/jobs/job-1/savepoints", json=body), 400)
    assert harness.jm.list_checkpoints("job-1").checkpoints == ()  # nothing triggered


def test_a_savepoint_body_that_is_not_json_is_a_bad_request(harness: Harness, client: TestClient) -> None:
    running_job(harness)
    errors_of(client.post("/jobs/job-1/savepoints", content=b"{", headers={"content-type": "application/json"}), 400)


def test_a_checkpoint_id_that_is_no_integer_is_a_bad_request_and_an_unknown_one_is_not_found(
    harness: Harness, client: TestClient
) -> None:
    harness.job()
    assert "checkpoint_id" in errors_of(client.get("/jobs/job-1/checkpoints/details/latest"), 400)[0]
    assert "no checkpoint 7" in errors_of(client.get("/jobs/job-1/checkpoints/details/7"), 404)[0]


# Backpressure --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backpressured", "level"), [(0.0, "ok"), (0.1, "ok"), (0.11, "low"), (0.5, "low"), (0.51, "high"), (1.0, "high")]
)
def test_backpressure_levels_follow_flink_s_thresholds(
    harness: Harness, client: TestClient, backpressured: float, level: str
) -> None:
    job = running_job(harness)
    harness.clock.advance(2.0)
    ratios = TimeRatios(busy=1.0 - backpressured, backpressured=backpressured, idle=0.0)
    harness.jm.heartbeat(Heartbeat("tm-a", (TaskProgress(job.job_id, "gen", 0, job.attempt, 0, 0, ratios),)))
    assert client.get("/jobs/job-1/vertices/gen/backpressure").json() == {
        "status": "ok",
        "backpressureLevel": level,
        "end-timestamp": 102_000,
        "subtasks": [
            {
                "subtask": 0,
                "backpressureLevel": level,
                "ratio": backpressured,
                "busyRatio": 1.0 - backpressured,
                "idleRatio": 0.0,
            }
        ],
    }


def test_backpressure_before_any_measurement_has_no_ratios(harness: Harness, client: TestClient) -> None:
    harness.job()
    (subtask,) = client.get("/jobs/job-1/vertices/gen/backpressure").json()["subtasks"]
    assert subtask == {"subtask": 0, "backpressureLevel": "ok", "ratio": None, "busyRatio": None, "idleRatio": None}


# Errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", JOB_PATHS)
def test_an_unknown_job_is_not_found_on_every_job_path(harness: Harness, client: TestClient, path: str) -> None:
    harness.job()
    assert errors_of(client.get(path.format(job="nope")), 404) == ["unknown job nope"]


def test_an_unknown_job_is_not_found_for_savepoints_and_cancel(client: TestClient) -> None:
    errors_of(client.post("/jobs/nope/savepoints", json={}), 404)
    errors_of(client.patch("/jobs/nope"), 404)


def test_an_unknown_vertex_or_path_is_not_found(harness: Harness, client: TestClient) -> None:
    harness.job()
    assert "no vertex 'out'" in errors_of(client.get("/jobs/job-1/vertices/out/backpressure"), 404)[0]
    errors_of(client.get("/no/such/path"), 404)
    errors_of(client.get("/web/no-such-asset.js"), 404)


def test_an_unexpected_error_is_a_500_in_the_api_s_shape(harness: Harness) -> None:
    harness.job()

    def broken(job_id: str) -> None:
        raise RuntimeError("the read API broke")

    harness.jm.job_plan = broken  # type: ignore[assignment, method-assign]
    client = TestClient(create_app(harness.jm), raise_server_exceptions=False)
    assert "RuntimeError: the read API broke" in errors_of(client.get("/jobs/job-1/plan"), 500)[0]


# The document and the UI ---------------------------------------------------------------------------


def test_the_openapi_document_is_valid_and_documents_every_path_with_400_instead_of_422(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    validate(document)
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == {
        "/healthz",
        "/overview",
        "/config",
        "/jobmanager/config",
        "/jobmanager/metrics",
        "/taskmanagers/metrics",
        "/taskmanagers/{taskmanager_id}/metrics",
        "/jobs/metrics",
        "/jobs/{job_id}/metrics",
        "/jobs/{job_id}/vertices/{vertex_id}/metrics",
        "/jobs/{job_id}/vertices/{vertex_id}/watermarks",
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/metrics",
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}/metrics",
        "/jobs/{job_id}/accumulators",
        "/jobs/{job_id}/vertices/{vertex_id}/accumulators",
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/accumulators",
        "/jobmanager/logs",
        "/jobmanager/logs/{filename}",
        "/jobmanager/log",
        "/jobmanager/stdout",
        "/jobmanager/thread-dump",
        "/taskmanagers/{taskmanager_id}/thread-dump",
        "/taskmanagers/{taskmanager_id}/logs",
        "/taskmanagers/{taskmanager_id}/logs/{filename}",
        "/taskmanagers/{taskmanager_id}/log",
        "/taskmanagers/{taskmanager_id}/stdout",
        "/jobs/{job_id}/status",
        "/jobs/{job_id}/resource-requirements",
        "/jobs/{job_id}/execution-result",
        "/jars/{jar_id}/plan",
        "/jobs/{job_id}/config",
        "/jobs/{job_id}/jobmanager/config",
        "/jobmanager/environment",
        "/jobs/{job_id}/jobmanager/environment",
        "/jobs/{job_id}/jobmanager/log-url",
        "/jobs/{job_id}/taskmanagers/{taskmanager_id}/log-url",
        "/jobs/{job_id}/vertices/{vertex_id}/taskmanagers",
        "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex_id}",
        "/jobs/{job_id}/clientHeartbeat",
        "/datasets",
        "/datasets/{dataset_id}",
        "/datasets/delete/{trigger_id}",
        "/taskmanagers",
        "/taskmanagers/{taskmanager_id}",
        "/jobs",
        "/jobs/{job_id}",
        "/jobs/{job_id}/plan",
        "/jobs/{job_id}/exceptions",
        "/jobs/{job_id}/checkpoints",
        "/jobs/{job_id}/checkpoints/config",
        "/jobs/{job_id}/checkpoints/{trigger_id}",
        "/jobs/{job_id}/checkpoints/details/{checkpoint_id}",
        "/jobs/{job_id}/vertices/{vertex_id}/backpressure",
        "/jobs/{job_id}/vertices/{vertex_id}",
        "/jobs/{job_id}/vertices/{vertex_id}/subtasktimes",
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}",
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}/attempts/{attempt}",
        "/jobs/{job_id}/savepoints",
        "/jobs/overview",
        "/jobs/{job_id}/stop",
        "/jobs/{job_id}/savepoints/{trigger_id}",
        "/jobs/{job_id}/rescaling",
        "/jobs/{job_id}/rescaling/{trigger_id}",
        "/savepoint-disposal",
        "/savepoint-disposal/{trigger_id}",
        "/jars",
        "/jars/upload",
        "/jars/{jar_id}",
        "/jars/{jar_id}/run",
    }
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert all("422" not in op["responses"] for op in operations)
    assert "400" in document["paths"]["/jobs/{job_id}/exceptions"]["get"]["responses"]
    assert "409" in document["paths"]["/jobs/{job_id}/savepoints"]["post"]["responses"]
    assert "409" in document["paths"]["/jobs/{job_id}/rescaling"]["patch"]["responses"]
    requirements = document["paths"]["/jobs/{job_id}/resource-requirements"]
    assert {"400", "409"} <= set(requirements["put"]["responses"]) and "get" in requirements
    upload = document["paths"]["/jars/upload"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert upload["schema"]["required"] == ["jarfile"]
    schemas = document["components"]["schemas"]
    assert schemas["FailureInfo"]["properties"]["fault"]["enum"] == ["USER", "EXTERNAL", "INTERNAL"]
    assert "timeline" in schemas["SubtaskCheckpoint"]["properties"] and "Timeline" in schemas


def test_the_web_ui_is_served_at_the_root(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")


def test_a_jobs_status_alone_and_its_resource_requirements_are_flinks_shapes(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    assert client.get("/v1/jobs/job-1/status").json() == {"status": "RUNNING"}
    assert client.get(f"/jobs/{flink_job_id('job-1')}/status").json() == {"status": "RUNNING"}
    assert client.get("/jobs/job-1/resource-requirements").json() == {
        flink_vertex_id("gen"): {"parallelism": {"lowerBound": 1, "upperBound": 1}}
    }
    harness.jm.cancel(job.job_id)
    assert client.get("/jobs/job-1/status").json()["status"] in ("CANCELLING", "CANCELED")
    for path in ("/jobs/nope/status", "/jobs/nope/resource-requirements"):
        assert "nope" in errors_of(client.get(path), 404)[0]

"""Flink's REST endpoints that Weir answers in Flink's shapes (field names and nesting of Flink's
``rest_v1_dispatcher.yml``): a vertex and its subtasks, subtask times, the checkpoint statistics'
summary and configuration, a TaskManager's details, the cluster's, the JobManager's and a job's
configuration. Over a JobManager built without network, as ``test_app``."""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import weir
from tests.unit.jobmanager.conftest import TM_A, Harness
from weir.core.hardware import measure_hardware
from weir.core.states import TaskState
from weir.jobmanager.checkpointing.pending import StateObject, TaskAckMetrics
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import CheckpointAck, Heartbeat, TaskProgress, TaskStateReport
from weir.jobmanager.service import JobManagerServicer
from weir.wire import jobmanager_pb2

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # Starlette would rather have httpx2 under it
    from fastapi.testclient import TestClient

from weir.jobmanager.rest import app as rest_app
from weir.jobmanager.rest.app import create_app
from weir.jobmanager.rest.config import hide_uri_password
from weir.jobmanager.rest.ids import flink_vertex_id
from weir.jobmanager.rest.views import percentile

IO_METRICS = {
    "read-bytes",
    "read-bytes-complete",
    "write-bytes",
    "write-bytes-complete",
    "read-records",
    "read-records-complete",
    "write-records",
    "write-records-complete",
    "accumulated-backpressured-time",
    "accumulated-idle-time",
    "accumulated-busy-time",
}
SUBTASK_FIELDS = {
    "subtask",
    "status",
    "attempt",
    "host",
    "endpoint",
    "start-time",
    "end-time",
    "duration",
    "metrics",
    "taskmanager-id",
    "start_time",
    "status-duration",
}


def running_job(h: Harness, parameters: dict[str, str] | None = None) -> JobMaster:
    params = {"checkpointing.interval": "1h", "restart.strategy": "fixed-delay", "restart.delay": "1s"}
    job = h.job({**params, **(parameters or {})})
    h.jm.report_task_state(TaskStateReport(job.job_id, "gen", 0, job.attempt, TaskState.RUNNING, None, 0, 0, False))
    h.jm.heartbeat(Heartbeat("tm-a", (TaskProgress(job.job_id, "gen", 0, job.attempt, 40, 35),)))
    return job


def ok(client: TestClient, path: str) -> Any:
    response = client.get(path)
    assert response.status_code == 200, f"{path}: {response.status_code} {response.text}"
    return response.json()


def errors_of(response: Any, status: int) -> list[str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"errors"} and body["errors"], body
    return list(body["errors"])


# Vertices and subtasks -----------------------------------------------------------------------------


def test_a_vertex_s_details_are_flink_s_job_vertex_details_info(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    harness.clock.advance(7.5)
    now = round(harness.clock() * 1000)
    vertex = ok(client, "/jobs/job-1/vertices/gen")
    assert set(vertex) == {"id", "uid", "name", "parallelism", "maxParallelism", "now", "subtasks"}
    assert (vertex["id"], vertex["uid"], vertex["name"]) == (flink_vertex_id("gen"), "gen", "generator -> print")
    assert (vertex["parallelism"], vertex["now"]) == (1, now)
    # the path takes the vertex's id in Flink's form too, in either case
    assert ok(client, f"/v1/jobs/job-1/vertices/{flink_vertex_id('gen').upper()}") == vertex
    assert len(flink_vertex_id("gen")) == 32 and int(flink_vertex_id("gen"), 16) >= 0
    assert vertex["maxParallelism"] == job.loaded.graph.max_parallelism
    (subtask,) = vertex["subtasks"]
    assert set(subtask) == SUBTASK_FIELDS and set(subtask["metrics"]) == IO_METRICS
    assert (subtask["subtask"], subtask["status"], subtask["attempt"]) == (0, "RUNNING", job.attempt)
    assert (subtask["host"], subtask["endpoint"], subtask["taskmanager-id"]) == (TM_A, TM_A, "tm-a")
    assert subtask["end-time"] == -1
    assert subtask["metrics"]["read-records"] == 40 and subtask["metrics"]["write-records"] == 35
    assert subtask["metrics"]["read-records-complete"] is True
    assert (subtask["metrics"]["read-bytes"], subtask["metrics"]["read-bytes-complete"]) == (0, False)
    # Weir records no state's entry but the deployment: Flink's -1 (not known) for each timed state
    assert subtask["status-duration"] == dict.fromkeys(
        ("CREATED", "SCHEDULED", "DEPLOYING", "INITIALIZING", "RUNNING"), -1
    )
    assert ok(client, "/v1/jobs/job-1/vertices/gen") == vertex


def test_a_subtask_s_start_is_its_attempt_s_deployment_and_its_end_the_job_s(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    job.submission = dataclasses.replace(job.submission, submitted_at=50.0)
    harness.clock.advance(10)  # now 110 s
    subtask = ok(client, "/jobs/job-1/vertices/gen/subtasks/0")
    assert (subtask["start-time"], subtask["start_time"], subtask["end-time"]) == (50_000, 50_000, -1)
    assert subtask["duration"] == 110_000 - 50_000
    harness.finish(job)
    assert harness.jm.job_status("job-1").summary.status.terminal
    ended = ok(client, "/jobs/job-1/vertices/gen/subtasks/0")
    end = ended["end-time"]
    assert ended["status"] == "FINISHED" and end > 0 and ended["duration"] == end - 50_000
    times = ok(client, "/jobs/job-1/vertices/gen/subtasktimes")
    assert set(times) == {"id", "uid", "name", "now", "subtasks"}
    (entry,) = times["subtasks"]
    assert set(entry) == {"subtask", "host", "endpoint", "duration", "timestamps"}
    assert entry["endpoint"] == entry["host"] == TM_A
    assert entry["timestamps"]["DEPLOYING"] == 50_000 and entry["timestamps"]["FINISHED"] == end
    assert entry["timestamps"]["RUNNING"] == 0  # not recorded per subtask
    assert set(entry["timestamps"]) == {
        "CREATED",
        "SCHEDULED",
        "DEPLOYING",
        "RUNNING",
        "FINISHED",
        "CANCELING",
        "CANCELED",
        "FAILED",
        "RECONCILING",
        "INITIALIZING",
    }


def test_a_subtask_by_its_attempt_and_the_unknown_ones(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    assert ok(client, f"/jobs/job-1/vertices/gen/subtasks/0/attempts/{job.attempt}")["attempt"] == job.attempt
    assert (
        "keeps no other"
        in errors_of(client.get(f"/jobs/job-1/vertices/gen/subtasks/0/attempts/{job.attempt + 1}"), 404)[0]
    )
    assert "no subtask 3" in errors_of(client.get("/jobs/job-1/vertices/gen/subtasks/3"), 404)[0]
    errors_of(client.get("/jobs/job-1/vertices/gen/subtasks/x"), 400)
    for path in ("/jobs/job-1/vertices/nope", "/jobs/job-1/vertices/nope/subtasktimes", "/jobs/nope/vertices/gen"):
        errors_of(client.get(path), 404)


def test_a_subtask_not_deployed_yet_is_created_and_unassigned(harness: Harness, client: TestClient) -> None:
    harness.job()
    with harness.jm.lock:
        record = harness.jm.jobs["job-1"].tasks[("gen", 0)]
        record.attempt, record.taskmanager_id, record.state = 0, "", None
    subtask = ok(client, "/jobs/job-1/vertices/gen")["subtasks"][0]
    assert (subtask["status"], subtask["host"], subtask["taskmanager-id"]) == (
        "CREATED",
        "(unassigned)",
        "(unassigned)",
    )
    assert (subtask["start-time"], subtask["duration"]) == (0, -1)
    assert subtask["metrics"]["read-records-complete"] is False


# Checkpoints: summary and configuration ------------------------------------------------------------

STATS = {"min", "max", "avg", "p50", "p90", "p95", "p99", "p999"}


def complete_checkpoint(h: Harness, job: JobMaster, duration_s: float, state_bytes: int, inflight: int) -> int:
    """Trigger a savepoint of the one-task job and acknowledge it ``duration_s`` later, its state
    ``state_bytes`` (its inline snapshot, a JSON document of that length)."""
    savepoint_id = h.jm.trigger_savepoint(job.job_id, "", stop=False, drain=False)
    h.clock.advance(duration_s)
    metrics = TaskAckMetrics(state_size_bytes=state_bytes, unaligned=inflight > 0, inflight_bytes=inflight)
    snapshot = b'{"p":"' + b"x" * (state_bytes - 8) + b'"}'
    h.jm.acknowledge_checkpoint(CheckpointAck(job.job_id, "gen", 0, job.attempt, savepoint_id, (), snapshot, metrics))
    return int(savepoint_id)


def test_checkpoint_statistics_have_flink_s_counts_summary_and_latest(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    empty = ok(client, "/jobs/job-1/checkpoints")["summary"]
    assert set(empty) == {"checkpointed_size", "state_size", "end_to_end_duration", "persisted_data"}
    assert empty["state_size"] == dict.fromkeys(STATS, 0) | {p: 0.0 for p in STATS - {"min", "max", "avg"}}
    for duration_s, size, inflight in ((0.1, 100, 0), (0.3, 300, 30), (0.2, 200, 0)):
        complete_checkpoint(harness, job, duration_s, size, inflight)
    statistics = ok(client, "/jobs/job-1/checkpoints")
    assert set(statistics) == {"counts", "summary", "latest", "history"}
    assert set(statistics["counts"]) == {"restored", "total", "in_progress", "completed", "failed"}
    assert set(statistics["latest"]) == {"completed", "savepoint", "failed", "restored"}
    summary = statistics["summary"]
    assert set(summary["state_size"]) == STATS
    assert (summary["state_size"]["min"], summary["state_size"]["max"], summary["state_size"]["avg"]) == (100, 300, 200)
    assert summary["state_size"]["p50"] == 200.0 and summary["state_size"]["p999"] == 300.0
    assert (summary["end_to_end_duration"]["min"], summary["end_to_end_duration"]["max"]) == (100, 300)
    assert (summary["persisted_data"]["max"], summary["persisted_data"]["avg"]) == (30, 10)
    newest = statistics["history"][0]
    assert newest["className"] == "completed" and newest["persisted_data"] == 0
    assert statistics["history"][1]["persisted_data"] == 30
    assert statistics["latest"]["savepoint"] == newest


def test_a_checkpoint_s_checkpointed_size_leaves_out_what_it_reuses_and_each_vertex_has_its_part(
    harness: Harness, client: TestClient
) -> None:
    """Flink's ``checkpointed_size`` is what a checkpoint uploaded; an incremental one reuses files of
    an earlier one, which count in its ``state_size`` only. ``tasks`` is Flink's per-vertex part."""
    job = running_job(harness)
    inline = b'{"offset":7}'
    first = harness.jm.trigger_checkpoint(job.job_id, full=False)
    harness.clock.advance(0.25)
    first_objects = (StateObject("job-1/shared/a.sst", 1000),)
    metrics = TaskAckMetrics(state_size_bytes=1000 + len(inline))
    harness.jm.acknowledge_checkpoint(
        CheckpointAck(job.job_id, "gen", 0, job.attempt, first, first_objects, inline, metrics)
    )
    second = harness.jm.trigger_checkpoint(job.job_id, full=False)
    harness.clock.advance(0.5)
    acked_at = round(harness.clock() * 1000)
    second_objects = (StateObject("job-1/shared/a.sst", 1000, reused=True), StateObject("job-1/shared/b.sst", 300))
    metrics = TaskAckMetrics(state_size_bytes=1300 + len(inline), inflight_bytes=0)
    harness.jm.acknowledge_checkpoint(
        CheckpointAck(job.job_id, "gen", 0, job.attempt, second, second_objects, inline, metrics)
    )
    pending = harness.jm.trigger_checkpoint(job.job_id, full=False)  # no acknowledgement yet
    statistics = ok(client, "/jobs/job-1/checkpoints")
    by_id = {c["id"]: c for c in statistics["history"]}
    assert (by_id[first]["state_size"], by_id[first]["checkpointed_size"]) == (1000 + len(inline), 1000 + len(inline))
    assert (by_id[second]["state_size"], by_id[second]["checkpointed_size"]) == (1300 + len(inline), 300 + len(inline))
    summary = statistics["summary"]["checkpointed_size"]
    assert (summary["min"], summary["max"]) == (300 + len(inline), 1000 + len(inline))
    assert (by_id[second]["latest_ack_timestamp"], by_id[second]["discarded"]) == (acked_at, False)
    assert (by_id[second]["alignment_buffered"], by_id[second]["processed_data"]) == (0, 0)  # not measured
    assert by_id[second]["tasks"] == {
        flink_vertex_id("gen"): {
            "id": second,
            "status": "COMPLETED",
            "latest_ack_timestamp": acked_at,
            "checkpointed_size": 300 + len(inline),
            "state_size": 1300 + len(inline),
            "end_to_end_duration": 500,
            "alignment_buffered": 0,
            "processed_data": 0,
            "persisted_data": 0,
            "num_subtasks": 1,
            "num_acknowledged_subtasks": 1,
        }
    }
    # in progress: Flink's -1 for no acknowledgement yet, its one subtask pending
    assert (by_id[pending]["latest_ack_timestamp"], by_id[pending]["end_to_end_duration"]) == (-1, -1)
    assert by_id[pending]["discarded"] is None and by_id[pending]["tasks"][flink_vertex_id("gen")]["num_subtasks"] == 1


def test_a_checkpoint_no_longer_retained_is_discarded(harness: Harness, client: TestClient) -> None:
    job = running_job(harness, {"checkpointing.retained": "1"})
    ids = []
    for _ in range(2):
        ids.append(harness.jm.trigger_checkpoint(job.job_id, full=False))
        metrics = TaskAckMetrics(state_size_bytes=2)
        harness.jm.acknowledge_checkpoint(CheckpointAck(job.job_id, "gen", 0, job.attempt, ids[-1], (), b"{}", metrics))
    by_id = {c["id"]: c for c in ok(client, "/jobs/job-1/checkpoints")["history"]}
    assert (by_id[ids[0]]["discarded"], by_id[ids[1]]["discarded"]) == (True, False)
    assert by_id[ids[0]]["external_path"] is None and by_id[ids[1]]["external_path"]


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 50, 0.0),
        ([7], 99.9, 7.0),
        ([1, 2, 3, 4], 50, 2.5),  # position 2.5: halfway between the 2nd and the 3rd
        ([1, 2, 3, 4], 10, 1.0),  # position 0.5 < 1: the smallest
        ([1, 2, 3, 4], 90, 4.0),  # position 4.5 >= n: the largest
        ([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], 90, 99.0),  # position 9.9
    ],
)
def test_percentiles_are_estimated_as_commons_math_s(values: list[int], p: float, expected: float) -> None:
    assert percentile(values, p) == pytest.approx(expected)


def test_the_checkpoint_config_is_flink_s_from_the_job_s_settings(harness: Harness, client: TestClient) -> None:
    running_job(
        harness,
        {
            "checkpointing.interval": "2s",
            "checkpointing.timeout": "1m",
            "checkpointing.min-pause": "500ms",
            "checkpointing.max-concurrent": "2",
            "checkpointing.retained": "5",
            "checkpointing.unaligned": "true",
            "checkpointing.aligned-checkpoint-timeout": "3s",
        },
    )
    assert ok(client, "/v1/jobs/job-1/checkpoints/config") == {
        "mode": "exactly_once",
        "interval": 2_000,
        "timeout": 60_000,
        "min_pause": 500,
        "max_concurrent": 2,
        "externalization": {"enabled": True, "delete_on_cancellation": False},
        "state_backend": "rocksdb",
        "checkpoint_storage": harness.jm.storage.uri,
        "unaligned_checkpoints": True,
        "aligned_checkpoint_timeout": 3_000,
        "checkpoints_after_tasks_finish": True,
        "tolerable_failed_checkpoints": 2**31 - 1,  # a failed checkpoint never fails a Weir job
        "state_changelog_enabled": False,
        "changelog_periodic_materialization_interval": -1,  # no state changelog
        "retained": 5,
    }


def test_a_job_without_periodic_checkpoints_has_flink_s_never_interval(harness: Harness, client: TestClient) -> None:
    harness.job({"restart.strategy": "none", "checkpointing.mode": "at_least_once"})
    answer = ok(client, "/jobs/job-1/checkpoints/config")
    assert (answer["mode"], answer["interval"], answer["unaligned_checkpoints"]) == ("at_least_once", 2**63 - 1, False)
    assert (answer["timeout"], answer["retained"]) == (600_000, 3)
    errors_of(client.get("/jobs/nope/checkpoints/config"), 404)


# TaskManagers --------------------------------------------------------------------------------------


def test_a_taskmanager_s_details_are_flink_s_with_what_the_jobmanager_knows(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    harness.jm.register_taskmanager("tm-b", "10.0.0.7:6125", 2, 9251, incarnation="first")
    listed = {tm["id"]: tm for tm in ok(client, "/taskmanagers")["taskmanagers"]}
    details = ok(client, "/taskmanagers/tm-a")
    assert {k: v for k, v in details.items() if k not in {"allocatedSlots", "metrics", "metricsPort"}} == listed["tm-a"]
    # slot sharing: one slot per job and subtask index placed here; Flink's JVM figures a TaskManager has none of
    assert [s["jobId"] for s in details["allocatedSlots"]] == ["job-1"]
    assert details["allocatedSlots"][0]["resource"]["cpuCores"] == -1.0
    jvm = details["metrics"]
    assert jvm.pop("garbageCollectors") == [] and len(jvm) == 18 and set(jvm.values()) == {0}
    assert (details["path"], details["dataPort"], details["jmxPort"]) == (TM_A, 6124, -1)
    assert (details["slotsNumber"], details["freeSlots"]) == (4, 3)
    assert details["tasks"] == [
        {"job_id": "job-1", "vertex_id": "gen", "subtask": 0, "attempt": job.attempt, "status": "RUNNING"}
    ]
    other = ok(client, "/v1/taskmanagers/tm-b")
    assert (other["dataPort"], other["metricsPort"], other["slotsNumber"], other["tasks"]) == (6125, 9251, 2, [])
    assert "GET /taskmanagers lists them" in errors_of(client.get("/taskmanagers/tm-z"), 404)[0]


def test_a_taskmanager_s_hardware_is_what_it_reported_at_registration(harness: Harness, client: TestClient) -> None:
    servicer = JobManagerServicer(harness.jm)
    registration = {"address": "10.0.0.8:6126", "slots": 2, "metrics_port": 0, "incarnation": "one"}
    request = jobmanager_pb2.RegisterTaskManagerRequest(
        taskmanager_id="tm-c", cpu_cores=6, physical_memory_bytes=16 * 2**30, **registration
    )
    servicer.RegisterTaskManager(request, None)  # type: ignore[arg-type]  # the call reads no context
    older = jobmanager_pb2.RegisterTaskManagerRequest(taskmanager_id="tm-d", **registration)  # sends none
    servicer.RegisterTaskManager(older, None)  # type: ignore[arg-type]
    assert ok(client, "/taskmanagers/tm-c")["hardware"] == {
        "cpuCores": 6,
        "physicalMemory": 16 * 2**30,
        "freeMemory": 0,  # no JVM heap
        "managedMemory": 0,  # no managed memory
    }
    listed = {tm["id"]: tm["hardware"] for tm in ok(client, "/taskmanagers")["taskmanagers"]}
    assert (listed["tm-c"]["cpuCores"], listed["tm-d"]["cpuCores"], listed["tm-d"]["physicalMemory"]) == (6, -1, -1)


def test_the_hardware_measured_is_this_process_s_cores_and_the_machine_s_memory() -> None:
    hardware = measure_hardware()
    assert hardware.cpu_cores == len(os.sched_getaffinity(0)) >= 1
    assert hardware.physical_memory_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 0


# Configuration -------------------------------------------------------------------------------------


def test_the_dashboard_configuration_is_flink_s_with_weir_s_version(client: TestClient) -> None:
    answer = ok(client, "/config")
    assert set(answer) == {
        "refresh-interval",
        "timezone-name",
        "timezone-offset",
        "flink-version",
        "flink-revision",
        "features",
    }
    assert answer["flink-version"] == weir.__version__ and answer["timezone-offset"] == -time.timezone * 1000
    assert answer["features"] == {"web-submit": False, "web-cancel": True, "web-rescale": False, "web-history": False}
    app_js = (Path(rest_app.__file__).with_name("web") / "app.js").read_text()
    assert f"const POLL_MS = {answer['refresh-interval']};" in app_js  # what the web UI really does


ENVIRONMENT = {
    "WEIR_JOBMANAGER_PORT": "26123",
    "WEIR_AUTH_TOKEN": "t0ken-value",
    "WEIR_S3_ACCESS_KEY": "weiradmin",
    "WEIR_S3_SECRET_KEY": "s3-secret-value",
    "WEIR_POSTGRES_DSN": "postgresql://weir:pg-password@db:5432/weir",
    "WEIR_LOG_LEVEL": "debug",
}


def test_the_jobmanager_config_lists_its_settings_and_hides_every_secret(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WEIR_AUTH_TOKEN_FILE", raising=False)
    with TestClient(create_app(harness.jm, settings_overrides={"WEIR_JOBMANAGER_BIND": "0.0.0.0"})) as client:
        response = client.get("/jobmanager/config")
        harness.job()
        assert client.get("/jobs/job-1/jobmanager/config").json() == response.json()
        errors_of(client.get("/jobs/nope/jobmanager/config"), 404)
    assert response.status_code == 200, response.text
    entries = response.json()
    assert all(set(e) == {"key", "value"} for e in entries)
    keys = [e["key"] for e in entries]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    values = {e["key"]: e["value"] for e in entries}
    assert values["WEIR_JOBMANAGER_PORT"] == "26123" and values["WEIR_JOBMANAGER_BIND"] == "0.0.0.0"
    assert values["WEIR_LOG_LEVEL"] == "DEBUG" and values["WEIR_S3_ACCESS_KEY"] == "weiradmin"
    assert values["WEIR_AUTH_TOKEN"] == values["WEIR_S3_SECRET_KEY"] == "******"
    assert values["WEIR_POSTGRES_DSN"] == "postgresql://weir:******@db:5432/weir"
    for secret in ("t0ken-value", "s3-secret-value", "pg-password"):
        assert secret not in response.text


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("postgresql://u:p@h:5432/d?sslmode=require", "postgresql://u:******@h:5432/d?sslmode=require"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("127.0.0.1:9092", "127.0.0.1:9092"),
    ],
)
def test_a_uri_s_password_is_hidden(uri: str, shown: str) -> None:
    assert hide_uri_password(uri) == shown


def test_a_job_s_config_is_flink_s_with_its_parameters_as_given(harness: Harness, client: TestClient) -> None:
    running_job(
        harness,
        {
            "kafka.sasl.password": "${env:KAFKA_PASSWORD}",
            "kafka.ssl.key.password": "literal",  # refused at submit; here the job is made without the check
            "execution.buffer-timeout": "50ms",
        },
    )
    answer = ok(client, "/jobs/job-1/config")
    assert set(answer) == {"jid", "name", "execution-config", "max_parallelism", "buffer_timeout"}
    assert (answer["jid"], answer["name"]) == ("job-1", "j")
    # Weir's own settings beside Flink 2.2's ExecutionConfigInfo, which Flink reads strictly
    assert (answer["max_parallelism"], answer["buffer_timeout"]) == (
        harness.jm.jobs["job-1"].loaded.graph.max_parallelism,
        50,
    )
    execution = answer["execution-config"]
    assert {k: v for k, v in execution.items() if k != "user-config"} == {
        "restart-strategy": "fixed-delay",
        "job-parallelism": 1,
        "object-reuse-mode": False,
    }
    user = execution["user-config"]
    assert user["kafka.sasl.password"] == "${env:KAFKA_PASSWORD}" and user["kafka.ssl.key.password"] == "<redacted>"
    assert user["checkpointing.interval"] == "1h" and list(user) == sorted(user)
    errors_of(client.get("/jobs/nope/config"), 404)


# Job ids -------------------------------------------------------------------------------------------

WEIR_ID = "5f1c0a9be2d34c71"
FLINK_ID = "0000000000000000" + WEIR_ID


def test_every_job_id_field_goes_out_as_flink_s_32_hex_job_id(harness: Harness, client: TestClient) -> None:
    job = harness.job({"checkpointing.interval": "1h"}, job_id=WEIR_ID)
    harness.jm.report_task_state(
        TaskStateReport(job.job_id, "gen", 0, job.attempt, TaskState.RUNNING, None, 0, 0, False)
    )
    for form in (WEIR_ID, FLINK_ID):  # a path takes either form
        assert ok(client, f"/jobs/{form}")["jid"] == FLINK_ID
        assert ok(client, f"/jobs/{form}")["plan"]["jid"] == FLINK_ID
        assert ok(client, f"/jobs/{form}/plan")["plan"]["jid"] == FLINK_ID
        assert ok(client, f"/jobs/{form}/config")["jid"] == FLINK_ID
    assert [j["id"] for j in ok(client, "/jobs")["jobs"]] == [FLINK_ID]
    assert [j["jid"] for j in ok(client, "/jobs/overview")["jobs"]] == [FLINK_ID]
    assert {t["job_id"] for tm in ok(client, "/taskmanagers")["taskmanagers"] for t in tm["tasks"]} == {FLINK_ID}
    assert {t["job_id"] for t in ok(client, "/taskmanagers/tm-a")["tasks"]} == {FLINK_ID}

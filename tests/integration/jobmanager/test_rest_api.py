"""The JobManager's REST API and gRPC health checking against the session's cluster: every path with
one running job (two vertices behind a hash edge, checkpoints every second, one failure the test asks
for), the errors (404, 400, 409), a savepoint, the exception history across a JobManager restart
(the process killed and started again by the supervisor), and cancel. The tests share the job and
run in file order: the restart and the cancel come last."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from openapi_spec_validator import validate

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, WeirCluster
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id
from weir.jobmanager.rest.views import FLINK_EXECUTION_STATES
from weir.tools.supervisor import TASKMANAGERS, kill_process

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "tests" / "integration" / "jobmanager" / "jobs" / "fail_on_request.py"
PARALLELISM = 2
DEADLINE_S = 90.0
POLL_S = 0.2
GRPC_SERVICE = "weir.wire.JobManagerService"
TASKMANAGER_IDS = tuple(f"taskmanager-{n}" for n in range(1, TASKMANAGERS + 1))

T = TypeVar("T")


def running_tasks(details: dict[str, Any]) -> int:
    """The job's RUNNING tasks: its vertices' counts per ExecutionState (Flink's ``tasks``), summed."""
    return sum(vertex["tasks"]["RUNNING"] for vertex in details["vertices"])


@dataclass(frozen=True)
class Unanswered:
    """A REST probe's answer while it has none: false, so ``polling.until`` goes on and, at the
    deadline, names the last error (the JobManager restarting, a field not there yet) and what the
    probe last saw."""

    error: BaseException | None
    saw: list[Any] | None

    def __bool__(self) -> bool:
        return False


def eventually(
    probe: Callable[[], T | None], what: str, timeout_s: float = DEADLINE_S, context: list[Any] | None = None
) -> T:
    """``polling.until`` over a REST probe, which may fail while the JobManager restarts or a field is
    not there yet (``context``: what the probe last saw, named at the deadline)."""
    last: list[BaseException] = []

    def answer() -> T | Unanswered:
        try:
            value = probe()
        except (httpx.TransportError, KeyError) as exc:
            last[:] = [exc]
            value = None
        return value if value else Unanswered(last[0] if last else None, None if context is None else list(context))

    result = polling.until(what, timeout_s, answer, POLL_S)
    assert not isinstance(result, Unanswered)
    return result


@dataclass
class RestJob:
    cluster: WeirCluster
    http: httpx.Client
    job_id: str
    fail_request: Path

    def get(self, path: str) -> Any:
        response = self.http.get(path)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
        return response.json()

    def errors(self, response: httpx.Response, status: int) -> list[str]:
        assert response.status_code == status, f"{response.request.url}: {response.status_code} {response.text}"
        body = response.json()
        assert set(body) == {"errors"} and body["errors"], body
        return list(body["errors"])

    def completed_checkpoints(self) -> list[dict[str, Any]]:
        history = self.get(f"/jobs/{self.job_id}/checkpoints")["history"]
        return [c for c in history if c["status"] == "COMPLETED" and not c["is_savepoint"]]


def grpc_health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return (
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        )


@pytest.fixture(scope="module")
def rest(weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestJob]:
    """The job, RUNNING in its second attempt after the failure the test asked for once its first
    attempt completed a checkpoint (so the second restored it)."""
    directory = tmp_path_factory.mktemp("rest-job")
    fail_request = directory / "fail-request"
    params = {
        "fail_request": str(fail_request),
        "fail_done": str(directory / "fail-done"),
        "output": str(directory / "out"),
        "checkpointing.interval": "1s",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit(str(JOB), params, parallelism=PARALLELISM)
    base = f"http://127.0.0.1:{weir_cluster.endpoints.jobmanager_rest_port}"
    with httpx.Client(base_url=base, timeout=10.0) as http:
        job = RestJob(weir_cluster, http, job_id, fail_request)
        eventually(job.completed_checkpoints, "a completed checkpoint of the first attempt")
        fail_request.touch()
        eventually(lambda: job.get(f"/jobs/{job_id}/exceptions")["exceptionHistory"]["entries"], "the failure")
        eventually(
            lambda: (
                job.get(f"/jobs/{job_id}")["state"] == "RUNNING"
                and running_tasks(job.get(f"/jobs/{job_id}")) == 2 * PARALLELISM
            ),
            "the second attempt running",
        )
        try:
            yield job
        finally:
            weir_cluster.client.cancel_job(job_id)


# Health --------------------------------------------------------------------------------------------


def test_healthz_answers_ok_with_the_live_taskmanagers(rest: RestJob) -> None:
    health = rest.get("/healthz")
    assert health["status"] == "ok" and health["taskmanagers"] == TASKMANAGERS
    assert health["jobs_running"] >= 1


def test_grpc_health_answers_serving_for_the_server_and_the_jobmanager_service(rest: RestJob) -> None:
    address = rest.cluster.endpoints.jobmanager_address
    assert grpc_health(address, "") == health_pb2.HealthCheckResponse.SERVING
    assert grpc_health(address, GRPC_SERVICE) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as unknown:
        grpc_health(address, "weir.wire.NoSuchService")
    assert unknown.value.code() is grpc.StatusCode.NOT_FOUND


# The cluster ---------------------------------------------------------------------------------------


def test_overview_counts_the_cluster_and_its_jobs(rest: RestJob) -> None:
    overview = rest.get("/overview")
    assert overview["taskmanagers"] == TASKMANAGERS
    assert overview["slots-total"] >= overview["slots-available"] + PARALLELISM
    assert overview["jobs-running"] >= 1 and isinstance(overview["weir-version"], str)


def test_taskmanagers_list_the_job_s_running_tasks(rest: RestJob) -> None:
    taskmanagers = rest.get("/taskmanagers")["taskmanagers"]
    assert sorted(tm["id"] for tm in taskmanagers) == sorted(TASKMANAGER_IDS)
    assert all(tm["alive"] and tm["timeSinceLastHeartbeat"] < 6_000 for tm in taskmanagers)
    tasks = sorted(
        (t["vertex_id"], t["subtask"], t["attempt"], t["status"])
        for tm in taskmanagers
        for t in tm["tasks"]
        if t["job_id"] == flink_job_id(rest.job_id)
    )
    assert tasks == sorted((v, s, 2, "RUNNING") for v in ("numbers", "fail-once") for s in range(PARALLELISM))


def test_a_taskmanager_s_details_are_flink_s(rest: RestJob) -> None:
    base = rest.cluster.endpoints.taskmanager_metrics_base_port
    for n, tm_id in enumerate(TASKMANAGER_IDS, start=1):
        details = rest.get(f"/v1/taskmanagers/{tm_id}")
        assert details["id"] == tm_id and details["alive"] and details["slotsNumber"] >= 1
        assert details["dataPort"] == int(details["path"].rsplit(":", 1)[1]) and details["jmxPort"] == -1
        assert details["metricsPort"] == base + n
        assert 0 <= details["freeSlots"] <= details["slotsNumber"]
    assert "no TaskManager" in rest.errors(rest.http.get("/taskmanagers/taskmanager-0"), 404)[0]


def test_the_cluster_s_jobmanager_s_and_job_s_config_are_flink_s(rest: RestJob) -> None:
    dashboard = rest.get("/v1/config")
    assert dashboard["flink-version"] == rest.get("/overview")["weir-version"]
    assert dashboard["features"]["web-cancel"] is True and dashboard["refresh-interval"] > 0
    settings = {e["key"]: e["value"] for e in rest.get("/jobmanager/config")}
    endpoints = rest.cluster.endpoints
    assert settings["WEIR_JOBMANAGER_REST_PORT"] == str(endpoints.jobmanager_rest_port)
    assert settings["WEIR_JOBMANAGER_PORT"] == str(endpoints.jobmanager_port)
    if endpoints.s3_secret_key is not None:
        assert settings["WEIR_S3_SECRET_KEY"] == "******"
        assert endpoints.s3_secret_key.get_secret_value() not in str(settings)
    job = rest.get(f"/jobs/{rest.job_id}/config")
    assert job["jid"] == flink_job_id(rest.job_id) and job["execution-config"]["job-parallelism"] == PARALLELISM
    assert job["execution-config"]["restart-strategy"] == "fixed-delay"
    assert job["execution-config"]["user-config"]["checkpointing.interval"] == "1s"


# The job -------------------------------------------------------------------------------------------


def test_jobs_list_the_job(rest: RestJob) -> None:
    (entry,) = [j for j in rest.get("/jobs")["jobs"] if j["id"] == flink_job_id(rest.job_id)]
    assert entry["status"] == "RUNNING" and entry["parallelism"] == PARALLELISM and entry["restarts"] == 1
    assert abs(entry["start-time"] - time.time() * 1000) < 600_000


def test_the_job_s_details_show_live_records_ratios_and_watermarks(rest: RestJob) -> None:
    seen: list[Any] = []

    def measured() -> dict[str, Any] | None:
        details = rest.get(f"/jobs/{rest.job_id}")
        seen[:] = [details]
        subtasks = [s for v in details["vertices"] for s in v["subtasks"]]
        ready = all(s["busyRatio"] is not None and s["watermark"] is not None for s in subtasks)
        flowing = all(v["metrics"]["write-records"] + v["metrics"]["read-records"] > 0 for v in details["vertices"])
        return details if ready and flowing else None

    details = eventually(measured, "every subtask's ratios, watermark and records", context=seen)
    assert details["jid"] == flink_job_id(rest.job_id) and details["end-time"] == -1 and details["restarts"] == 1
    assert details["last_completed_checkpoint"] >= 1
    numbers, fail_once = details["vertices"]
    assert (numbers["uid"], numbers["name"], numbers["parallelism"]) == ("numbers", "generator", PARALLELISM)
    assert fail_once["uid"] == "fail-once" and fail_once["name"].startswith("map -> file-sink:")
    assert (numbers["id"], fail_once["id"]) == (flink_vertex_id("numbers"), flink_vertex_id("fail-once"))
    for vertex in (numbers, fail_once):
        assert vertex["status"] == "RUNNING"
        assert vertex["metrics"]["read-records"] == sum(s["read-records"] for s in vertex["subtasks"])
        for s in vertex["subtasks"]:
            assert s["status"] == "RUNNING" and s["attempt"] == 2 and s["taskmanager_id"] in TASKMANAGER_IDS
            total = s["busyRatio"] + s["backPressuredRatio"] + s["idleRatio"]
            assert abs(total - 1.0) < 1e-6, s
            assert s["watermark_lag"] == details["now"] - s["watermark"]
            assert 0 <= s["watermark_lag"] < 60_000, s  # the generators stamp wall-clock time
    assert running_tasks(details) == 2 * PARALLELISM
    # Flink's status-counts: the job's vertices per ExecutionState, every state (both vertices RUNNING)
    assert {state: n for state, n in details["status-counts"].items() if n} == {"RUNNING": 2}
    assert len(details["status-counts"]) == len(FLINK_EXECUTION_STATES)


def test_the_plan_shows_the_chains_and_the_hash_edge(rest: RestJob) -> None:
    plan = rest.get(f"/jobs/{rest.job_id}/plan")["plan"]
    assert plan["jid"] == flink_job_id(rest.job_id)
    numbers, fail_once = plan["nodes"]
    assert (numbers["id"], numbers["uid"], numbers["operator"], numbers["inputs"]) == (
        flink_vertex_id("numbers"),
        "numbers",
        "generator",
        [],
    )
    assert [o["uid"] for o in fail_once["operators"]] == ["fail-once", "file"]
    assert fail_once["inputs"] == [
        {
            "num": 0,
            "id": flink_vertex_id("numbers"),
            "ship_strategy": "HASH",
            "exchange": "pipelined_bounded",
            "side_output": None,
        }
    ]


def test_backpressure_per_subtask_of_each_vertex(rest: RestJob) -> None:
    for vertex in ("numbers", flink_vertex_id("fail-once")):  # by uid or in Flink's form
        answer = rest.get(f"/jobs/{rest.job_id}/vertices/{vertex}/backpressure")
        assert answer["status"] == "ok" and answer["backpressureLevel"] in ("ok", "low", "high")
        assert abs(answer["end-timestamp"] - time.time() * 1000) < 30_000
        assert [s["subtask"] for s in answer["subtasks"]] == list(range(PARALLELISM))
        for s in answer["subtasks"]:
            assert s["ratio"] is not None and 0.0 <= s["ratio"] <= 1.0 and s["busyRatio"] is not None
    assert "no vertex 'file'" in rest.errors(rest.http.get(f"/jobs/{rest.job_id}/vertices/file/backpressure"), 404)[0]


def test_a_vertex_its_subtasks_and_their_times_in_flink_s_shapes(rest: RestJob) -> None:
    taskmanagers = {tm["id"]: tm["path"] for tm in rest.get("/taskmanagers")["taskmanagers"]}
    flink_id = "0" * 16 + rest.job_id
    seen: list[Any] = []

    def flowing() -> dict[str, Any] | None:
        answer = rest.get(f"/v1/jobs/{flink_id}/vertices/fail-once")
        seen[:] = [answer]
        return answer if all(s["metrics"]["read-records"] > 0 for s in answer["subtasks"]) else None

    vertex = eventually(flowing, "records read by every subtask of fail-once", context=seen)
    assert (vertex["id"], vertex["uid"], vertex["parallelism"]) == (
        flink_vertex_id("fail-once"),
        "fail-once",
        PARALLELISM,
    )
    assert vertex["maxParallelism"] >= PARALLELISM and abs(vertex["now"] - time.time() * 1000) < 30_000
    assert [s["subtask"] for s in vertex["subtasks"]] == list(range(PARALLELISM))
    for s in vertex["subtasks"]:
        assert (s["status"], s["attempt"], s["end-time"]) == ("RUNNING", 2, -1)
        assert s["host"] == taskmanagers[s["taskmanager-id"]] == s["endpoint"]
        assert 0 < s["start-time"] <= vertex["now"] and s["duration"] == vertex["now"] - s["start-time"]
        assert s["metrics"]["read-records-complete"] and not s["metrics"]["read-bytes-complete"]
        assert (
            rest.get(f"/jobs/{rest.job_id}/vertices/fail-once/subtasks/{s['subtask']}/attempts/2")["host"] == s["host"]
        )
    times = rest.get(f"/jobs/{rest.job_id}/vertices/fail-once/subtasktimes")
    assert [t["timestamps"]["DEPLOYING"] for t in times["subtasks"]] == [s["start-time"] for s in vertex["subtasks"]]


# Exceptions ----------------------------------------------------------------------------------------


def the_failure(rest: RestJob) -> dict[str, Any]:
    entries = rest.get(f"/jobs/{rest.job_id}/exceptions")["exceptionHistory"]["entries"]
    (failure,) = [e for e in entries if e["exceptionName"] == "RequestedFailure"]
    return dict(failure)


def test_the_exception_history_has_the_failure_with_its_typed_cause_and_task(rest: RestJob) -> None:
    failure = the_failure(rest)
    assert failure["fault"] == "USER" and failure["retriable"] is True
    assert "failure requested by the test" in failure["message"]
    assert failure["vertex_id"] == "fail-once" and failure["subtask"] in range(PARALLELISM)
    assert failure["taskName"].startswith("map -> file-sink:") and failure["attempt"] == 1
    assert failure["taskmanager_id"] in TASKMANAGER_IDS
    assert abs(failure["timestamp"] - time.time() * 1000) < 300_000
    history = rest.get(f"/jobs/{rest.job_id}/exceptions?maxExceptions=1")["exceptionHistory"]
    assert len(history["entries"]) == 1 and history["truncated"] is False


def test_the_failure_s_stacktrace_names_the_user_function_s_file_and_line(rest: RestJob) -> None:
    raising_line = next(
        n for n, line in enumerate(JOB.read_text().splitlines(), start=1) if "raise RequestedFailure(" in line
    )
    stacktrace = the_failure(rest)["stacktrace"]
    assert f'{JOB.name}", line {raising_line}, in fail_once' in stacktrace, stacktrace
    assert "RequestedFailure: failure requested by the test" in stacktrace
    answer = rest.get(f"/jobs/{rest.job_id}/exceptions")
    assert answer["root-exception"] == answer["exceptionHistory"]["entries"][0]["stacktrace"]


@pytest.mark.parametrize("bad", ["0", "1001", "x"])
def test_a_bad_max_exceptions_is_a_bad_request(rest: RestJob, bad: str) -> None:
    rest.errors(rest.http.get(f"/jobs/{rest.job_id}/exceptions", params={"maxExceptions": bad}), 400)


# Checkpoints ---------------------------------------------------------------------------------------


def test_checkpoints_count_list_and_name_the_restored_one(rest: RestJob) -> None:
    listing = rest.get(f"/jobs/{rest.job_id}/checkpoints")
    counts = listing["counts"]
    assert counts["completed"] >= 1 and counts["total"] >= counts["completed"] + counts["failed"]
    assert counts["restored"] == 1
    ids = [c["id"] for c in listing["history"]]
    assert ids == sorted(ids, reverse=True)
    latest = listing["latest"]
    assert latest["completed"] is not None and latest["completed"]["status"] == "COMPLETED"
    restored = latest["restored"]
    assert restored is not None and restored["is_savepoint"] is False and restored["id"] >= 1
    completed = latest["completed"]
    assert completed["num_acknowledged_subtasks"] == completed["num_subtasks"] == 2 * PARALLELISM
    assert completed["end_to_end_duration"] >= 0 and completed["external_path"]
    assert completed["checkpoint_type"] == "CHECKPOINT"


def test_the_checkpoint_summary_and_config_are_flink_s(rest: RestJob) -> None:
    listing = rest.get(f"/v1/jobs/{rest.job_id}/checkpoints")
    completed = [c for c in listing["history"] if c["status"] == "COMPLETED"]
    sizes = [c["state_size"] for c in completed]
    durations = [c["end_to_end_duration"] for c in completed]
    summary = listing["summary"]
    assert (summary["state_size"]["min"], summary["state_size"]["max"]) == (min(sizes), max(sizes))
    assert (summary["end_to_end_duration"]["min"], summary["end_to_end_duration"]["max"]) == (
        min(durations),
        max(durations),
    )
    assert summary["state_size"]["min"] <= summary["state_size"]["p50"] <= summary["state_size"]["max"]
    assert all(c["className"] == "completed" for c in completed)
    restored = listing["latest"]["restored"]
    paths = {c["id"]: c["external_path"] for c in listing["history"]}
    assert restored["external_path"] == paths.get(restored["id"])  # None once no longer retained
    config = rest.get(f"/jobs/{rest.job_id}/checkpoints/config")
    assert (config["mode"], config["interval"], config["max_concurrent"]) == ("exactly_once", 1_000, 1)
    assert config["externalization"] == {"enabled": True, "delete_on_cancellation": False}
    assert config["unaligned_checkpoints"] is False and config["retained"] >= 1
    assert all(c["external_path"].startswith(config["checkpoint_storage"].rstrip("/")) for c in completed[:1])


def test_a_checkpoint_s_details_have_a_line_per_subtask(rest: RestJob) -> None:
    checkpoint = rest.completed_checkpoints()[0]
    details = rest.get(f"/jobs/{rest.job_id}/checkpoints/details/{checkpoint['id']}")
    assert details["id"] == checkpoint["id"] and details["status"] == "COMPLETED"
    lines = {(s["vertex_id"], s["subtask"]): s for s in details["subtasks"]}
    assert set(lines) == {(v, s) for v in ("numbers", "fail-once") for s in range(PARALLELISM)}
    for line in lines.values():
        assert line["status"] == "COMPLETED" and line["ack_timestamp"] >= details["trigger_timestamp"]
        assert line["alignment_duration"] >= 0 and line["state_size"] >= 0
        timeline = line["timeline"]
        assert timeline["trigger_timestamp"] == details["trigger_timestamp"]
        assert timeline["ack_timestamp"] == line["ack_timestamp"]
        upstream = line["vertex_id"] == "fail-once"
        # a source has no input channels; the keyed map reads one per upstream subtask
        assert len(timeline["channels"]) == (PARALLELISM if upstream else 0)
        assert sorted(c["upstream_subtask"] for c in timeline["channels"]) == (
            list(range(PARALLELISM)) if upstream else []
        )
        marks = [timeline["first_barrier_timestamp"], timeline["alignment_end_timestamp"]]
        marks += [timeline["sync_end_timestamp"], timeline["async_end_timestamp"]]
        assert all(m is not None for m in marks), timeline
        assert marks == sorted(marks), timeline


def test_a_checkpoint_id_that_is_no_integer_is_a_bad_request_and_an_unknown_one_not_found(rest: RestJob) -> None:
    rest.errors(rest.http.get(f"/jobs/{rest.job_id}/checkpoints/details/latest"), 400)
    assert (
        "no checkpoint 99999999"
        in rest.errors(rest.http.get(f"/jobs/{rest.job_id}/checkpoints/details/99999999"), 404)[0]
    )


def test_a_checkpoint_is_triggered_over_rest_and_completes(rest: RestJob) -> None:
    def trigger() -> str | None:  # the job's periodic checkpoint (every second) may be in flight: 409
        response = rest.http.post(f"/jobs/{rest.job_id}/checkpoints", json={"checkpointType": "CONFIGURED"})
        if response.status_code == 409:
            return None
        assert response.status_code == 202, response.text
        return str(response.json()["request-id"])

    trigger_id = eventually(trigger, "a checkpoint triggered between the periodic ones")
    outcome = eventually(
        lambda: (lambda o: o if o["status"]["id"] == "COMPLETED" else None)(
            rest.get(f"/jobs/{rest.job_id}/checkpoints/{trigger_id}")
        ),
        "the checkpoint completed",
    )
    assert outcome["operation"] == {"checkpointId": int(trigger_id, 16)}
    listed = {c["id"]: c for c in rest.completed_checkpoints()}
    assert int(trigger_id, 16) in listed


def test_a_savepoint_is_triggered_and_completes(rest: RestJob) -> None:
    response = rest.http.post(f"/jobs/{rest.job_id}/savepoints", json={"cancel-job": False})
    assert response.status_code == 202, response.text
    savepoint_id = int(response.json()["request-id"], 16)

    def completed() -> dict[str, Any] | None:
        history = rest.get(f"/jobs/{rest.job_id}/checkpoints")["history"]
        found = [c for c in history if c["id"] == savepoint_id and c["status"] == "COMPLETED"]
        return found[0] if found else None

    savepoint = eventually(completed, f"savepoint {savepoint_id} completed")
    assert savepoint["is_savepoint"] and savepoint["checkpoint_type"] == "SAVEPOINT" and savepoint["external_path"]
    assert rest.get(f"/jobs/{rest.job_id}/checkpoints")["latest"]["savepoint"]["id"] >= savepoint_id


@pytest.mark.parametrize("body", [{"cancel-job": "no"}, {"drain": True}, {"target": "s3://x"}])
def test_a_bad_savepoint_body_is_a_bad_request(rest: RestJob, body: dict[str, Any]) -> None:
    rest.errors(rest.http.post(f"/jobs/{rest.job_id}/savepoints", json=body), 400)


# Errors and the document ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/jobs/{job}",
        "/jobs/{job}/plan",
        "/jobs/{job}/exceptions",
        "/jobs/{job}/checkpoints",
        "/jobs/{job}/checkpoints/details/1",
        "/jobs/{job}/vertices/numbers/backpressure",
        "/jobs/{job}/status",
        "/jobs/{job}/resource-requirements",
    ],
)
def test_an_unknown_job_is_not_found(rest: RestJob, path: str) -> None:
    assert rest.errors(rest.http.get(path.format(job="0123456789abcdef")), 404) == ["unknown job 0123456789abcdef"]


def test_an_unknown_job_cannot_be_cancelled_or_savepointed(rest: RestJob) -> None:
    rest.errors(rest.http.patch("/jobs/0123456789abcdef"), 404)
    rest.errors(rest.http.post("/jobs/0123456789abcdef/savepoints", json={}), 404)
    rest.errors(rest.http.patch(f"/jobs/{rest.job_id}", params={"mode": "stop"}), 400)


def test_the_openapi_document_is_valid(rest: RestJob) -> None:
    document = rest.get("/openapi.json")
    validate(document)
    assert "/jobs/{job_id}/checkpoints/details/{checkpoint_id}" in document["paths"]


def test_the_web_ui_is_served(rest: RestJob) -> None:
    response = rest.http.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")


# Flink's environment, a vertex's TaskManagers, checkpoint subtasks, heartbeat, datasets, log URLs ---


def test_the_jobmanager_s_environment_is_its_interpreter_s(rest: RestJob) -> None:
    """The JobManager runs on the interpreter this test runs on (the project's virtual environment)."""
    environment = rest.get("/v1/jobmanager/environment")
    assert environment["jvm"]["version"] == f"{platform.python_implementation()} {platform.python_version()}"
    assert environment["jvm"]["arch"] == platform.machine()
    assert isinstance(environment["jvm"]["options"], list)
    assert any(entry.endswith("site-packages") for entry in environment["classpath"]), environment["classpath"]
    assert rest.get(f"/jobs/{flink_job_id(rest.job_id)}/jobmanager/environment") == environment


def test_a_vertex_s_taskmanagers_hold_its_subtasks(rest: RestJob) -> None:
    addresses = {tm["id"]: tm["path"] for tm in rest.get("/taskmanagers")["taskmanagers"]}
    seen: list[Any] = []

    def all_running() -> dict[str, Any] | None:
        answer = rest.get(f"/v1/jobs/{flink_job_id(rest.job_id)}/vertices/{flink_vertex_id('fail-once')}/taskmanagers")
        seen[:] = [answer]
        running = sum(tm["status-counts"]["RUNNING"] for tm in answer["taskmanagers"])
        return answer if running == PARALLELISM else None

    answer = eventually(all_running, "every subtask of fail-once RUNNING on a TaskManager", context=seen)
    assert (answer["id"], answer["uid"]) == (flink_vertex_id("fail-once"), "fail-once")
    vertex = rest.get(f"/jobs/{rest.job_id}/vertices/fail-once")
    on_each: dict[str, int] = {}
    for subtask in vertex["subtasks"]:
        on_each[subtask["taskmanager-id"]] = on_each.get(subtask["taskmanager-id"], 0) + 1
    for tm in answer["taskmanagers"]:
        assert tm["host"] == tm["endpoint"] == addresses[tm["taskmanager-id"]]
        assert tm["status"] == "RUNNING" and tm["end-time"] == -1 and tm["start-time"] > 0
        assert sum(tm["status-counts"].values()) == on_each[tm["taskmanager-id"]]
        records = tm["aggregated"]["metrics"]["read-records"]
        assert records["sum"] == tm["metrics"]["read-records"] and records["min"] <= records["max"]
    assert {tm["taskmanager-id"] for tm in answer["taskmanagers"]} == set(on_each)


def test_a_checkpoint_s_subtasks_of_each_vertex_are_its_acknowledgements(rest: RestJob) -> None:
    checkpoint = rest.completed_checkpoints()[0]
    details = rest.get(f"/jobs/{rest.job_id}/checkpoints/details/{checkpoint['id']}")
    lines = {(s["vertex_id"], s["subtask"]): s for s in details["subtasks"]}
    for uid in ("numbers", "fail-once"):
        part = rest.get(f"/v1/jobs/{rest.job_id}/checkpoints/details/{checkpoint['id']}/subtasks/{uid}")
        assert {k: v for k, v in part.items() if k not in ("summary", "subtasks")} == details["tasks"][
            flink_vertex_id(uid)
        ]
        assert [s["index"] for s in part["subtasks"]] == list(range(PARALLELISM))
        for s in part["subtasks"]:
            line = lines[(uid, s["index"])]
            assert (s["className"], s["status"], s["aborted"]) == ("completed", "completed", False)
            assert (s["ack_timestamp"], s["state_size"]) == (line["ack_timestamp"], line["state_size"])
            assert s["end_to_end_duration"] == s["ack_timestamp"] - details["trigger_timestamp"]
            assert (s["alignment"]["duration"], s["start_delay"]) == (line["alignment_duration"], line["start_delay"])
        sizes = [s["state_size"] for s in part["subtasks"]]
        assert (part["summary"]["state_size"]["min"], part["summary"]["state_size"]["max"]) == (min(sizes), max(sizes))
    rest.errors(rest.http.get(f"/jobs/{rest.job_id}/checkpoints/details/{checkpoint['id']}/subtasks/nope"), 404)


def test_a_client_heartbeat_datasets_and_log_urls_are_answered_as_flink_s(rest: RestJob) -> None:
    beat = rest.http.patch(f"/v1/jobs/{flink_job_id(rest.job_id)}/clientHeartbeat", json={"expiredTimestamp": 1})
    assert (beat.status_code, beat.json()) == (202, {})
    assert rest.get(f"/jobs/{rest.job_id}")["state"] == "RUNNING"  # a beat, even an expired one, changes nothing
    rest.errors(rest.http.patch("/jobs/0123456789abcdef/clientHeartbeat", json={"expiredTimestamp": 1}), 404)
    assert rest.get("/v1/datasets") == {"dataSets": []}
    deletion = rest.http.delete("/v1/datasets/" + "0f" * 16)
    assert deletion.status_code == 202, deletion.text
    status = rest.get(f"/v1/datasets/delete/{deletion.json()['request-id']}")
    assert status == {"status": {"id": "COMPLETED"}, "operation": {}}
    assert "url-pattern" in rest.errors(rest.http.get(f"/jobs/{rest.job_id}/jobmanager/log-url"), 404)[0]
    taskmanager = TASKMANAGER_IDS[0]
    assert (
        "url-pattern" in rest.errors(rest.http.get(f"/jobs/{rest.job_id}/taskmanagers/{taskmanager}/log-url"), 404)[0]
    )


# A JobManager restart, then cancel (last: they change the job) -------------------------------------


def test_the_exception_history_survives_a_jobmanager_restart(rest: RestJob) -> None:
    before = the_failure(rest)
    kill_process(rest.cluster.directory, "jobmanager")  # the supervisor starts it again
    address = rest.cluster.endpoints.jobmanager_address

    def serving_again() -> bool:
        try:
            return grpc_health(address, GRPC_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    eventually(lambda: rest.http.get("/healthz").status_code == 200, "the restarted JobManager's /healthz")
    assert eventually(serving_again, "the restarted JobManager's gRPC health")
    assert the_failure(rest) == before
    eventually(lambda: rest.get(f"/jobs/{rest.job_id}")["state"] == "RUNNING", "the job taken over and running")
    rest.cluster.wait_for_taskmanagers()  # every TaskManager back, for the tests after this one


def test_cancel_answers_202_and_a_savepoint_of_the_cancelled_job_is_a_conflict(rest: RestJob) -> None:
    response = rest.http.patch(f"/jobs/{rest.job_id}")
    assert (response.status_code, response.json()) == (202, {})
    eventually(lambda: rest.get(f"/jobs/{rest.job_id}")["state"] == "CANCELED", "the job CANCELED")
    details = rest.get(f"/jobs/{rest.job_id}")
    assert details["end-time"] >= details["start-time"] and details["duration"] >= 0
    assert "RUNNING job" in rest.errors(rest.http.post(f"/jobs/{rest.job_id}/savepoints", json={}), 409)[0]


def test_a_jobs_status_alone_and_its_resource_requirements_are_flinks_shapes(rest: RestJob) -> None:
    before = rest.get(f"/jobs/{rest.job_id}")["state"]
    status = rest.get(f"/v1/jobs/{rest.job_id}/status")
    after = rest.get(f"/jobs/{rest.job_id}")["state"]
    assert set(status) == {"status"} and status["status"] in (before, after)
    nodes = rest.get(f"/jobs/{rest.job_id}/plan")["plan"]["nodes"]
    assert rest.get(f"/jobs/{rest.job_id}/resource-requirements") == {
        n["id"]: {"parallelism": {"lowerBound": n["parallelism"], "upperBound": n["parallelism"]}} for n in nodes
    }

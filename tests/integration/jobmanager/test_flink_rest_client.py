"""Apache Flink's own REST client against the session's cluster, for the routes Flink's CLI does not call:
``flink_rest_client/FlinkRestProbe.java`` (compiled here against the flink-clients 2.2 jars that
``deploy/local/flink-cli.sh`` installs from Maven Central) sends each request with
``org.apache.flink.runtime.rest.RestClient`` and one of Flink's ``MessageHeaders`` and decodes the answer
with Flink's response class, as Flink's tools do: a decoding failure is a mismatch. Each decoded answer,
written back by Flink's mapper, is compared with Weir's own answer; a job's execution result is also
turned into what ``flink run`` in attached mode reports (its ``JobExecutionResult``, or the exception
with the job's failure)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from weir.core.config import Endpoints
from weir.core.hardware import measure_hardware
from weir.core.states import JobStatus, TaskState
from weir.jobmanager.rest.ids import flink_job_id

pytestmark = pytest.mark.integration

FLINK_CLI = REPO_ROOT / "deploy" / "local" / "flink-cli.sh"
PROBE_SOURCE = Path(__file__).with_name("flink_rest_client") / "FlinkRestProbe.java"
JOB = REPO_ROOT / "tests" / "integration" / "jobmanager" / "jobs" / "fail_on_request.py"
RESCALABLE = "examples/keyed_aggregation.py"
PROBE_TIMEOUT_S = 300.0
DEADLINE_S = 120.0


# What changes from one read to the next on a running job: left out when Flink's decoded answer is
# compared with Weir's own, read a moment apart.
MOVING: frozenset[str] = frozenset(
    {
        "now",
        "duration",
        "timeSinceLastHeartbeat",
        "read-records",
        "write-records",
        "read-records-complete",
        "write-records-complete",
        "accumulated-busy-time",
        "accumulated-backpressured-time",
        "accumulated-idle-time",
        "status-counts",
        "tasks",
        "history",
        "latest",
        "counts",
        "summary",
        "aggregated",
    }
)


def same_as_weir(flink: Any, weir: Any, where: str = "") -> list[str]:
    """Where Flink's decoded answer (written back by Flink's mapper) differs from Weir's: every field
    Flink read has Weir's value, but the ones in MOVING; a field Flink's class has and Weir's answer
    leaves out must be one Flink writes as null (an optional field Weir does not fill)."""
    if isinstance(flink, dict) and isinstance(weir, dict):
        found = []
        for key, value in flink.items():
            if key in MOVING:
                continue
            if key not in weir:
                found.extend([] if value is None else [f"{where}.{key}: Flink read {value!r}, Weir sent none"])
                continue
            found.extend(same_as_weir(value, weir[key], f"{where}.{key}"))
        return found
    if isinstance(flink, list) and isinstance(weir, list) and len(flink) == len(weir):
        pairs = enumerate(zip(flink, weir, strict=True))
        return [d for n, (f, w) in pairs for d in same_as_weir(f, w, f"{where}[{n}]")]
    return [] if flink == weir else [f"{where}: Flink read {flink!r}, Weir sent {weir!r}"]


@dataclass(frozen=True)
class Probe:
    lib: Path
    classes: Path

    def ask(self, cluster: WeirCluster, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        """Each request's answer as Flink's client decoded it."""
        command = [
            "java",
            "-cp",
            f"{self.lib}/*:{self.classes}",
            "FlinkRestProbe",
            "127.0.0.1",
            str(cluster.endpoints.jobmanager_rest_port),
        ]
        done = subprocess.run(
            command,
            input="\n".join(json.dumps(r) for r in requests) + "\n",
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        assert done.returncode == 0, f"FlinkRestProbe exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert [a["headers"] for a in answers] == [r["headers"] for r in requests], done.stdout + done.stderr
        return answers


@pytest.fixture(scope="module")
def probe() -> Probe:
    missing = [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"Flink's REST client needs {', '.join(missing)} (deploy/local/flink-cli.sh)")
    install = subprocess.run([str(FLINK_CLI), "install"], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, f"deploy/local/flink-cli.sh install failed: {install.stderr}"
    printed = subprocess.run([str(FLINK_CLI), "--print-dir"], capture_output=True, text=True, check=True)
    cli_dir = Path(printed.stdout.strip())
    lib = cli_dir / "lib"
    # Compiled once per probe source, jars and javac (javac over Flink's jars took 9.5 s at load 10),
    # beside the jars in Weir's cache; a changed source, jar or compiler compiles anew.
    classes = cli_dir / f"rest-probe-{probe_build_key(lib)}"
    if not classes.is_dir():
        building = Path(tempfile.mkdtemp(prefix=f"{classes.name}.", dir=cli_dir))
        compiled = subprocess.run(
            ["javac", "-d", str(building), "-cp", f"{lib}/*", str(PROBE_SOURCE)],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        if compiled.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
        assert compiled.returncode == 0, f"javac {PROBE_SOURCE.name} failed:\n{compiled.stderr}"
        try:  # whole or not there: a session stopped mid-compile leaves only its temporary
            building.rename(classes)
        except OSError:  # another session compiled it meanwhile
            shutil.rmtree(building, ignore_errors=True)
    return Probe(lib, classes)


def probe_build_key(lib: Path) -> str:
    """What the compiled probe depends on: its source, the jars' names and sizes, the javac installed
    (its resolved path and time, without starting a JVM to ask its version)."""
    javac = Path(shutil.which("javac") or "javac").resolve()
    digest = hashlib.sha256(PROBE_SOURCE.read_bytes())
    digest.update(f"{javac}:{javac.stat().st_mtime_ns}\n".encode())
    for jar in sorted(lib.glob("*.jar")):
        digest.update(f"{jar.name}:{jar.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


@pytest.fixture
def http(weir_cluster: WeirCluster) -> Iterator[httpx.Client]:
    base = f"http://127.0.0.1:{weir_cluster.endpoints.jobmanager_rest_port}"
    with httpx.Client(base_url=base, timeout=30.0) as client:
        yield client


def get(http: httpx.Client, path: str) -> Any:
    response = http.get(path)
    assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
    return response.json()


def request(headers: str, body: dict[str, Any] | None = None, **path: str) -> dict[str, Any]:
    return {"headers": headers, "path": path} | ({} if body is None else {"body": body})


def decoded(answer: dict[str, Any]) -> Any:
    assert answer["ok"], f"Flink's client could not read Weir's answer to {answer['headers']}: {answer['error']}"
    return answer["response"]


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


def every_task_running(cluster: WeirCluster, job_id: str, parallelism: int) -> Callable[[], bool]:
    """The job RUNNING at ``parallelism``, every vertex with that many subtasks, every task running."""

    def check() -> bool:
        status = cluster.client.job_status(job_id)
        per_vertex: dict[str, int] = {}
        for task in status.tasks:
            per_vertex[task.vertex_uid] = per_vertex.get(task.vertex_uid, 0) + 1
        return (
            status.summary.status is JobStatus.RUNNING
            and status.summary.parallelism == parallelism
            and set(per_vertex.values()) == {parallelism}
            and all(t.state is TaskState.RUNNING for t in status.tasks)
        )

    return check


def test_flink_s_client_reads_every_answer_about_a_running_job_and_its_cluster(
    weir_cluster: WeirCluster, services: Endpoints, unique: str, probe: Probe, http: httpx.Client
) -> None:
    """examples/keyed_aggregation.py under load: every answer about it and the cluster read by Flink's
    client, rescaled 2 -> 1 by Flink's resource requirements, then left to finish (both sinks exact) and
    its result read as `flink run` reads it."""
    # 30 s of input at 1500 a second: the probes and the rescale took its first 13 s on a loaded machine
    # (load 5-9); the job still running after them is asserted.
    params = keyed_aggregation_inputs(services, unique, 45_000, records_per_second=1500, checkpoint_interval="1s") | {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit(RESCALABLE, params, 2)
    jid = flink_job_id(job_id)
    polling.until("every task running", DEADLINE_S, every_task_running(weir_cluster, job_id, 2))
    polling.until(
        "a completed checkpoint", DEADLINE_S, lambda: weir_cluster.client.job_status(job_id).last_completed_checkpoint
    )
    nodes = get(http, f"/jobs/{job_id}/plan")["plan"]["nodes"]
    taskmanagers = get(http, "/taskmanagers")["taskmanagers"]
    tm = taskmanagers[0]["id"]
    vertex = nodes[1]["id"]
    answers = probe.ask(
        weir_cluster,
        request("JobStatusInfoHeaders", jobid=jid),
        request("JobExecutionResultHeaders", jobid=jid),
        request("JobResourceRequirementsHeaders", jobid=jid),
        request("JobDetailsHeaders", jobid=jid),
        request("JobPlanHeaders", jobid=jid),
        request("JobConfigHeaders", jobid=jid),
        request("JobExceptionsHeaders", jobid=jid),
        request("CheckpointingStatisticsHeaders", jobid=jid),
        request("CheckpointConfigHeaders", jobid=jid),
        request("JobAccumulatorsHeaders", jobid=jid),
        request("JobVertexDetailsHeaders", jobid=jid, vertexid=vertex),
        request("JobVertexBackPressureHeaders", jobid=jid, vertexid=vertex),
        request("SubtasksTimesHeaders", jobid=jid, vertexid=vertex),
        request("JobsOverviewHeaders"),
        request("ClusterOverviewHeaders"),
        request("DashboardConfigurationHeaders"),
        request("ClusterConfigurationInfoHeaders"),
        request("TaskManagersHeaders"),
        request("TaskManagerDetailsHeaders", taskmanagerid=tm),
        request("TaskManagerLogsHeaders", taskmanagerid=tm),
        request("TaskManagerThreadDumpHeaders", taskmanagerid=tm),
        request("JobManagerLogListHeaders"),
        request("JobManagerThreadDumpHeaders"),
    )
    by_name = {a["headers"]: a for a in answers}
    failed = {name: a["error"] for name, a in by_name.items() if not a["ok"]}
    assert not failed, f"Flink's client could not read: {json.dumps(failed, indent=1)}"
    weir_answers = {
        "JobDetailsHeaders": f"/jobs/{jid}",
        "JobPlanHeaders": f"/jobs/{jid}/plan",
        "JobConfigHeaders": f"/jobs/{jid}/config",
        "CheckpointingStatisticsHeaders": f"/jobs/{jid}/checkpoints",
        "CheckpointConfigHeaders": f"/jobs/{jid}/checkpoints/config",
        "JobVertexDetailsHeaders": f"/jobs/{jid}/vertices/{vertex}",
        "SubtasksTimesHeaders": f"/jobs/{jid}/vertices/{vertex}/subtasktimes",
        "ClusterOverviewHeaders": "/overview",
        "TaskManagersHeaders": "/taskmanagers",
        "TaskManagerDetailsHeaders": f"/taskmanagers/{tm}",
    }
    for name, path in weir_answers.items():
        differences = same_as_weir(decoded(by_name[name]), get(http, path))
        assert not differences, f"{name} read by Flink's client differs from GET {path}: {differences}"
    assert_true_figures(by_name, get(http, f"/jobs/{jid}/checkpoints"), get(http, f"/jobs/{jid}"))

    assert decoded(by_name["JobStatusInfoHeaders"]) == {"status": "RUNNING"}
    assert decoded(by_name["JobExecutionResultHeaders"]) == {"status": {"id": "IN_PROGRESS"}}
    assert (
        decoded(by_name["JobResourceRequirementsHeaders"])
        == get(http, f"/jobs/{jid}/resource-requirements")
        == {n["id"]: {"parallelism": {"lowerBound": 2, "upperBound": 2}} for n in nodes}
    )
    overview = decoded(by_name["JobsOverviewHeaders"])
    assert [j["state"] for j in overview["jobs"] if j["jid"] == jid] == ["RUNNING"]
    assert decoded(by_name["JobAccumulatorsHeaders"])["job-accumulators"] == []
    assert decoded(by_name["JobExceptionsHeaders"])["exceptionHistory"]["entries"] == []
    assert decoded(by_name["JobVertexBackPressureHeaders"])["status"] == "ok"
    dashboard = decoded(by_name["DashboardConfigurationHeaders"])
    assert dashboard["flink-version"] == get(http, "/config")["flink-version"]
    assert decoded(by_name["ClusterConfigurationInfoHeaders"]) == get(http, "/jobmanager/config")
    assert decoded(by_name["TaskManagerThreadDumpHeaders"])["threadInfos"], "the TaskManager's threads"
    assert decoded(by_name["JobManagerThreadDumpHeaders"])["threadInfos"], "the JobManager's threads"
    assert_same_logs(decoded(by_name["TaskManagerLogsHeaders"]), get(http, f"/taskmanagers/{tm}/logs"))
    assert_same_logs(decoded(by_name["JobManagerLogListHeaders"]), get(http, "/jobmanager/logs"))

    # The adaptive scheduler's bounds through Flink's client: 2 -> 1 by a live rescale.
    (update,) = probe.ask(
        weir_cluster,
        request(
            "JobResourcesRequirementsUpdateHeaders",
            {n["id"]: {"parallelism": {"lowerBound": 1, "upperBound": 1}} for n in nodes},
            jobid=jid,
        ),
    )
    assert decoded(update) == {}
    polling.until("every task running at 1", DEADLINE_S, every_task_running(weir_cluster, job_id, 1))
    bad, requirements = probe.ask(
        weir_cluster,
        request(
            "JobResourcesRequirementsUpdateHeaders",
            {nodes[0]["id"]: {"parallelism": {"lowerBound": 3, "upperBound": 2}}},
            jobid=jid,
        ),
        request("JobResourceRequirementsHeaders", jobid=jid),
    )
    assert not bad["ok"]
    assert (
        f"The requested lower bound [3] for job vertex [{nodes[0]['id']}] is higher than the upper bound [2]."
        in (bad["error"])
    )
    assert decoded(requirements) == {n["id"]: {"parallelism": {"lowerBound": 1, "upperBound": 1}} for n in nodes}
    assert weir_cluster.client.job_status(job_id).summary.status is JobStatus.RUNNING, "input ended: raise the events"

    # Its input read: FINISHED, exact, and `flink run` would report its JobExecutionResult.
    status = weir_cluster.wait_for(job_id, timeout_s=600.0)
    assert status.summary.status is JobStatus.FINISHED, status
    assert_sinks_exact(RESCALABLE, params, job_id, services)
    (result,) = probe.ask(weir_cluster, request("JobExecutionResultHeaders", jobid=jid))
    weir_result = get(http, f"/jobs/{jid}/execution-result")["job-execution-result"]
    assert decoded(result)["job-execution-result"] == weir_result
    assert result["result"] == {
        "jobId": jid,
        "netRuntime": weir_result["net-runtime"],
        "succeeded": True,
        "executionJobId": jid,
        "executionNetRuntime": weir_result["net-runtime"],
    }


def assert_same_logs(read: dict[str, Any], later: dict[str, Any]) -> None:
    """The same log files, each as large and as new or more by the later read (a running process
    goes on writing its log)."""
    assert [f["name"] for f in read["logs"]] == [f["name"] for f in later["logs"]], (read, later)
    for earlier, now in zip(read["logs"], later["logs"], strict=True):
        assert earlier["size"] <= now["size"] and earlier["mtime"] <= now["mtime"], (earlier, now)


def assert_true_figures(
    by_name: dict[str, dict[str, Any]], checkpoints: dict[str, Any], details: dict[str, Any]
) -> None:
    """The figures behind the moving fields, as Flink's client read them: the tasks counted per
    ExecutionState, the task threads' accounted time, the checkpoints' sizes."""
    job = decoded(by_name["JobDetailsHeaders"])
    for vertex in job["vertices"]:
        assert sum(vertex["tasks"].values()) == vertex["parallelism"] == 2, vertex["tasks"]
        assert vertex["tasks"]["RUNNING"] == 2, vertex["tasks"]
        metrics = vertex["metrics"]
        accounted = (
            metrics["accumulated-busy-time"]
            + metrics["accumulated-backpressured-time"]
            + metrics["accumulated-idle-time"]
        )
        # both subtasks' threads account their time from their start: some, never more than they ran
        assert 0 < accounted <= 2 * (job["now"] - vertex["start-time"]) + 2_000, (vertex["name"], metrics)
    assert {v["slotSharingGroupId"] for v in job["vertices"]} == {details["vertices"][0]["slotSharingGroupId"]}
    subtasks = decoded(by_name["JobVertexDetailsHeaders"])["subtasks"]
    assert all(s["metrics"]["accumulated-busy-time"] > 0 for s in subtasks), subtasks
    statistics = decoded(by_name["CheckpointingStatisticsHeaders"])
    completed = [c for c in statistics["history"] if c["status"] == "COMPLETED"]
    assert completed, statistics["history"]
    for checkpoint in completed:
        assert 0 < checkpoint["checkpointed_size"] <= checkpoint["state_size"], checkpoint
        assert sum(t["num_acknowledged_subtasks"] for t in checkpoint["tasks"].values()) == checkpoint["num_subtasks"]
        # retained: where it is; no longer retained (subsumed): discarded, its files released
        if not checkpoint["is_savepoint"]:
            assert checkpoint["discarded"] is (checkpoint["external_path"] is None), checkpoint
    weir_by_id = {c["id"]: c for c in checkpoints["history"]}
    for checkpoint in completed:
        if checkpoint["id"] in weir_by_id:  # still in Weir's recent history (perhaps subsumed since)
            lasting = {k: v for k, v in checkpoint.items() if k not in {"discarded", "external_path"}}
            assert same_as_weir(lasting, weir_by_id[checkpoint["id"]]) == []
    version = decoded(by_name["DashboardConfigurationHeaders"])["flink-version"]
    assert decoded(by_name["ClusterOverviewHeaders"])["flink-version"] == version
    taskmanager = decoded(by_name["TaskManagerDetailsHeaders"])
    assert len(taskmanager["allocatedSlots"]) == taskmanager["slotsNumber"] - taskmanager["freeSlots"]
    # the session's TaskManagers run on this machine, as this process: the same cores and memory
    hardware = measure_hardware()
    assert (taskmanager["hardware"]["cpuCores"], taskmanager["hardware"]["physicalMemory"]) == (
        hardware.cpu_cores,
        hardware.physical_memory_bytes,
    )


def test_flink_s_client_reports_a_failed_job_with_its_failure_and_a_cancelled_one_as_cancelled(
    weir_cluster: WeirCluster, probe: Probe, http: httpx.Client, tmp_path: Path
) -> None:
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "fail-request").touch()  # the first record fails the job; no restart
    failed_id = submit(weir_cluster, failing, **{"restart.strategy": "none", "restart.delay": ""})
    weir_cluster.wait_for(failed_id, ("FAILED",), timeout_s=DEADLINE_S)
    cancelled = tmp_path / "cancelled"
    cancelled.mkdir()
    cancelled_id = submit(weir_cluster, cancelled)
    polling.until("every task running", DEADLINE_S, every_task_running(weir_cluster, cancelled_id, 2))
    weir_cluster.client.cancel_job(cancelled_id)
    weir_cluster.wait_for(cancelled_id, ("CANCELED",), timeout_s=DEADLINE_S)

    failed, canceled = probe.ask(
        weir_cluster,
        request("JobExecutionResultHeaders", jobid=flink_job_id(failed_id)),
        request("JobExecutionResultHeaders", jobid=flink_job_id(cancelled_id)),
    )
    weir_failed = get(http, f"/jobs/{failed_id}/execution-result")["job-execution-result"]
    failure = get(http, f"/jobs/{failed_id}")["failure"]
    assert decoded(failed)["job-execution-result"]["application-status"] == "FAILED"
    assert failed["result"] == {
        "jobId": flink_job_id(failed_id),
        "netRuntime": weir_failed["net-runtime"],
        "succeeded": False,
        "exception": "org.apache.flink.runtime.client.JobExecutionException",
        "message": "Job execution failed.",
        "cause": {
            "class": "org.apache.flink.util.SerializedThrowable",
            "toString": f"RequestedFailure: {failure['message']}",
            "message": failure["message"],
            "originalErrorClassName": "RequestedFailure",
            "fullStringifiedStackTrace": weir_failed["failure-cause"]["stack-trace"],
        },
    }
    assert decoded(canceled)["job-execution-result"]["application-status"] == "CANCELED"
    assert {k: canceled["result"][k] for k in ("succeeded", "exception", "message")} == {
        "succeeded": False,
        "exception": "org.apache.flink.runtime.client.JobCancellationException",
        "message": "Job was cancelled.",
    }


def test_flink_s_client_reads_the_environment_a_vertex_s_taskmanagers_checkpoint_subtasks_and_datasets(
    weir_cluster: WeirCluster, probe: Probe, http: httpx.Client, tmp_path: Path
) -> None:
    """The operations added last, each decoded by Flink 2.2's response class and compared with Weir's
    own answer; the heartbeat accepted, a dataset deletion followed to its outcome, and the log URLs
    refused with 404 as Flink's without a URL pattern."""
    job_id = submit(weir_cluster, tmp_path)
    jid = flink_job_id(job_id)
    try:
        polling.until("every task running", DEADLINE_S, every_task_running(weir_cluster, job_id, 2))

        def completed_checkpoint() -> int | None:
            history = get(http, f"/jobs/{jid}/checkpoints")["history"]
            done = [c["id"] for c in history if c["status"] == "COMPLETED" and not c["is_savepoint"]]
            return done[0] if done else None

        checkpoint_id = polling.until("a completed checkpoint", DEADLINE_S, completed_checkpoint)
        vertex = get(http, f"/jobs/{jid}/plan")["plan"]["nodes"][1]["id"]
        tm = get(http, "/taskmanagers")["taskmanagers"][0]["id"]
        answers = probe.ask(
            weir_cluster,
            request("JobManagerEnvironmentHeaders"),
            request("JobManagerJobEnvironmentHeaders", jobid=jid),
            request("JobVertexTaskManagersHeaders", jobid=jid, vertexid=vertex),
            request("TaskCheckpointStatisticsHeaders", jobid=jid, checkpointid=str(checkpoint_id), vertexid=vertex),
            request("JobClientHeartbeatHeaders", {"expiredTimestamp": int(time.time() * 1000) + 60_000}, jobid=jid),
            request("ClusterDataSetListHeaders"),
            request("ClusterDataSetDeleteTriggerHeaders", datasetid="0f" * 16),
            request("JobManagerLogUrlHeaders", jobid=jid),
            request("TaskManagerLogUrlHeaders", jobid=jid, taskmanagerid=tm),
        )
        by_name = {a["headers"]: a for a in answers}
        weir_answers = {
            "JobManagerEnvironmentHeaders": "/jobmanager/environment",
            "JobManagerJobEnvironmentHeaders": f"/jobs/{jid}/jobmanager/environment",
            "JobVertexTaskManagersHeaders": f"/jobs/{jid}/vertices/{vertex}/taskmanagers",
            "TaskCheckpointStatisticsHeaders": f"/jobs/{jid}/checkpoints/details/{checkpoint_id}/subtasks/{vertex}",
        }
        for name, path in weir_answers.items():
            differences = same_as_weir(decoded(by_name[name]), get(http, path))
            assert not differences, f"{name} read by Flink's client differs from GET {path}: {differences}"
        environment = decoded(by_name["JobManagerEnvironmentHeaders"])
        assert environment["jvm"]["arch"] and environment["classpath"], environment
        taskmanagers = decoded(by_name["JobVertexTaskManagersHeaders"])["taskmanagers"]
        assert sum(t["status-counts"]["RUNNING"] for t in taskmanagers) == 2, taskmanagers
        subtasks = decoded(by_name["TaskCheckpointStatisticsHeaders"])["subtasks"]
        assert [(s["index"], s["status"]) for s in subtasks] == [(0, "completed"), (1, "completed")], subtasks
        assert decoded(by_name["JobClientHeartbeatHeaders"]) == {}
        assert decoded(by_name["ClusterDataSetListHeaders"]) == {"dataSets": []}
        for name in ("JobManagerLogUrlHeaders", "TaskManagerLogUrlHeaders"):
            assert not by_name[name]["ok"] and "url-pattern" in by_name[name]["error"], by_name[name]
        trigger = decoded(by_name["ClusterDataSetDeleteTriggerHeaders"])["request-id"]
        (status,) = probe.ask(weir_cluster, request("ClusterDataSetDeleteStatusHeaders", triggerid=trigger))
        assert decoded(status)["status"] == {"id": "COMPLETED"}, status
        assert get(http, f"/jobs/{jid}")["state"] == "RUNNING"
    finally:
        weir_cluster.client.cancel_job(job_id)

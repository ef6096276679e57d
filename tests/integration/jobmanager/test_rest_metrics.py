"""Flink's metrics, thread dump and log endpoints against the session's cluster, with a running job
(``jobs/fail_on_request.py``, never asked to fail): real values from the TaskManagers' heartbeats and
the checkpoint coordinator (numRecordsIn grows, checkpoints are counted), the TaskManagers' thread
dumps over their gRPC service, and the JobManager's log file (the supervisor's ``jobmanager.log``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.integration.conftest import REPO_ROOT, WeirCluster
from tests.integration.polling import poll
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id
from weir.tools.supervisor import TASKMANAGERS

pytestmark = pytest.mark.integration

JOB = REPO_ROOT / "tests" / "integration" / "jobmanager" / "jobs" / "fail_on_request.py"
PARALLELISM = 2
DEADLINE_S = 90.0


@dataclass
class MetricsJob:
    http: httpx.Client
    job_id: str

    def get(self, path: str, **params: str) -> Any:
        response = self.http.get(path, params=params)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
        return response.json()

    def values(self, path: str, names: str) -> dict[str, str]:
        return {m["id"]: m["value"] for m in self.get(path, get=names)}


@pytest.fixture(scope="module")
def running(weir_cluster: WeirCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsJob]:
    directory = tmp_path_factory.mktemp("rest-metrics-job")
    params = {
        "fail_request": str(directory / "never-requested"),
        "fail_done": str(directory / "fail-done"),
        "output": str(directory / "out"),
        "checkpointing.interval": "1s",
    }
    job_id = weir_cluster.submit(str(JOB), params, parallelism=PARALLELISM)
    base = f"http://127.0.0.1:{weir_cluster.endpoints.jobmanager_rest_port}"
    with httpx.Client(base_url=base, timeout=30.0) as http:
        job = MetricsJob(http, job_id)
        poll(
            "the job's tasks running",
            DEADLINE_S,
            lambda: (
                sum(v["tasks"]["RUNNING"] for v in job.get(f"/jobs/{job_id}")["vertices"]) == 2 * PARALLELISM or None
            ),
        )
        try:
            yield job
        finally:
            weir_cluster.client.cancel_job(job_id)


def test_a_subtasks_numrecordsin_grows_and_carries_a_rate(running: MetricsJob) -> None:
    path = f"/v1/jobs/{flink_job_id(running.job_id)}/vertices/fail-once/subtasks/0/metrics"
    names = {m["id"] for m in running.get(path)}
    assert {"numRecordsIn", "numRecordsOut", "currentInputWatermark"} <= names, names
    first = poll(
        "records into subtask 0 of fail-once",
        DEADLINE_S,
        lambda: int(v) if (v := running.values(path, "numRecordsIn").get("numRecordsIn", "0")) != "0" else None,
    )
    later = poll(
        "more records into subtask 0 of fail-once",
        DEADLINE_S,
        lambda: n if (n := int(running.values(path, "numRecordsIn")["numRecordsIn"])) > first else None,
    )
    assert later > first
    rate = poll(
        "a records-in rate measured between two heartbeats",
        DEADLINE_S,
        lambda: running.values(path, "numRecordsInPerSecond").get("numRecordsInPerSecond"),
    )
    assert float(rate) >= 0.0
    watermark = int(running.values(path, "currentInputWatermark")["currentInputWatermark"])
    assert watermark > 1_700_000_000_000, "the generator stamps wall-clock time"
    marks = running.get(f"/jobs/{running.job_id}/vertices/{flink_vertex_id('fail-once')}/watermarks")
    assert [m["id"] for m in marks] == [f"{n}.currentInputWatermark" for n in range(PARALLELISM)]
    assert all(int(m["value"]) > 1_700_000_000_000 for m in marks), marks


def test_the_vertex_and_the_subtasks_aggregate_the_same_counters(running: MetricsJob) -> None:
    base = f"/jobs/{running.job_id}/vertices/numbers"
    poll(
        "records out of both generators",
        DEADLINE_S,
        lambda: (
            all(int(v) > 0 for v in running.values(f"{base}/metrics", "0.numRecordsOut,1.numRecordsOut").values())
            or None
        ),
    )
    aggregated = running.get(f"{base}/subtasks/metrics", get="numRecordsOut", agg="min,max,sum")
    (entry,) = aggregated
    assert entry["id"] == "numRecordsOut" and set(entry) == {"id", "min", "max", "sum"}
    assert 0 < entry["min"] <= entry["max"] <= entry["sum"]
    (only_first,) = running.get(f"{base}/subtasks/metrics", get="numRecordsOut", agg="sum", subtasks="0")
    assert 0 < only_first["sum"] <= entry["sum"]


def test_the_jobs_metrics_count_its_checkpoints_and_uptime(running: MetricsJob) -> None:
    path = f"/jobs/{running.job_id}/metrics"
    found = poll(
        "a completed checkpoint counted",
        DEADLINE_S,
        lambda: (
            m
            if int(
                (m := running.values(path, "numberOfCompletedCheckpoints,uptime,lastCompletedCheckpointId"))[
                    "numberOfCompletedCheckpoints"
                ]
            )
            >= 1
            else None
        ),
    )
    assert int(found["uptime"]) > 0 and int(found["lastCompletedCheckpointId"]) >= 1
    (aggregated,) = running.get("/jobs/metrics", get="uptime", agg="max", jobs=flink_job_id(running.job_id))
    assert aggregated["max"] >= int(found["uptime"])


def test_the_jobmanager_and_the_taskmanagers_metrics(running: MetricsJob) -> None:
    jm = running.values("/jobmanager/metrics", "numRegisteredTaskManagers,numRunningJobs,taskSlotsTotal")
    assert int(jm["numRegisteredTaskManagers"]) == TASKMANAGERS
    assert int(jm["numRunningJobs"]) >= 1 and int(jm["taskSlotsTotal"]) >= 2 * PARALLELISM
    assert "process_resident_memory_bytes" in {m["id"] for m in running.get("/jobmanager/metrics")}
    placed = {t["id"] for t in running.get("/taskmanagers")["taskmanagers"] if t["tasks"]}
    counted = poll(
        "records counted on a TaskManager running the job",
        DEADLINE_S,
        lambda: (
            [
                tm
                for tm in placed
                if int(running.values(f"/taskmanagers/{tm}/metrics", "numRecordsIn").get("numRecordsIn", "0")) > 0
            ]
            or None
        ),
    )
    assert counted
    (slots,) = running.get("/taskmanagers/metrics", get="taskSlotsTotal", agg="sum")
    assert slots["sum"] == float(jm["taskSlotsTotal"])


def test_thread_dumps_of_the_jobmanager_and_of_a_taskmanager_running_tasks(running: MetricsJob) -> None:
    jm = running.get("/jobmanager/thread-dump")["threadInfos"]
    assert any("jobmanager" in t["stringifiedThreadInfo"] for t in jm), [t["threadName"] for t in jm]
    placed = [t for t in running.get("/taskmanagers")["taskmanagers"] if t["tasks"]]
    assert placed
    dump = running.get(f"/v1/taskmanagers/{placed[0]['id']}/thread-dump")["threadInfos"]
    assert all(set(t) == {"threadName", "stringifiedThreadInfo"} for t in dump)
    stacks = "\n".join(t["stringifiedThreadInfo"] for t in dump)
    assert "taskmanager/" in stacks and "\tat " in stacks, stacks[:2000]
    assert running.http.get("/taskmanagers/no-such-taskmanager/thread-dump").status_code == 404


def test_the_jobmanagers_log_file_is_listed_and_served(running: MetricsJob) -> None:
    logs = running.get("/jobmanager/logs")["logs"]
    assert [entry["name"] for entry in logs] == ["jobmanager.log"], logs
    assert logs[0]["size"] > 0 and logs[0]["mtime"] > 1_700_000_000_000
    response = running.http.get("/jobmanager/log")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert running.job_id in response.text, "the log names the job it accepted"


def test_a_taskmanagers_log_file_is_listed_and_served_over_its_grpc_service(running: MetricsJob) -> None:
    placed = [t["id"] for t in running.get("/taskmanagers")["taskmanagers"] if t["tasks"]]
    assert placed
    tm = placed[0]
    logs = running.get(f"/v1/taskmanagers/{tm}/logs")["logs"]
    assert [entry["name"] for entry in logs] == [f"{tm}.log"], logs  # the supervisor's file for both streams
    assert logs[0]["size"] > 0 and logs[0]["mtime"] > 1_700_000_000_000
    log = running.http.get(f"/taskmanagers/{tm}/log")
    assert log.status_code == 200 and log.headers["content-type"].startswith("text/plain")
    assert running.job_id in log.text, "the TaskManager's log names the job whose tasks it runs"
    for path in (f"/taskmanagers/{tm}/stdout", f"/v1/taskmanagers/{tm}/logs/{tm}.log"):
        again = running.http.get(path)  # the same file, read later: it only grew
        assert again.status_code == 200 and again.text.startswith(log.text[: len(log.text) // 2]), path
    assert running.http.get(f"/taskmanagers/{tm}/logs/jobmanager.log").status_code == 404
    assert running.http.get("/taskmanagers/no-such-taskmanager/logs").status_code == 404

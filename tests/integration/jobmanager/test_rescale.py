"""Rescaling a running job against the real services: examples/keyed_aggregation.py (Kafka source,
keyed windows, the Kafka transactional sink and the PostgreSQL 2PC sink) under live load, rescaled
3 → 2 with ``weir rescale --wait`` and 2 → 3 with Flink's REST form (``PATCH /v1/jobs/:jobid/rescaling``,
then ``GET .../rescaling/:triggerid`` until COMPLETED), then left to finish its bounded input: both
sinks hold exactly the reference run's output (multisets of whole records, no transaction left
prepared or open), under the same job id throughout. And a job in reactive mode growing to the
cluster's slots, losing a TaskManager and growing back, exact too."""

from __future__ import annotations

import httpx
import pytest

from tests.integration import polling
from tests.integration.conftest import WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from weir.core.config import Endpoints
from weir.core.states import JobStatus, TaskState
from weir.jobmanager.rest.ids import flink_job_id
from weir.tools.cli import EXIT_OK, run_cli
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

JOB_FILE = "examples/keyed_aggregation.py"
DEADLINE_S = 180.0


def runs_at(cluster: WeirCluster, job_id: str, parallelism: int) -> bool:
    """Every task of the job runs, each vertex with ``parallelism`` subtasks."""
    status = cluster.client.job_status(job_id)
    if status.summary.status is not JobStatus.RUNNING or status.summary.parallelism != parallelism:
        return False
    per_vertex: dict[str, int] = {}
    for task in status.tasks:
        per_vertex[task.vertex_uid] = per_vertex.get(task.vertex_uid, 0) + 1
    return all(t.state is TaskState.RUNNING for t in status.tasks) and set(per_vertex.values()) == {parallelism}


def still_reading(cluster: WeirCluster, job_id: str) -> bool:
    return cluster.client.job_status(job_id).summary.status is JobStatus.RUNNING


def test_a_running_job_rescaled_3_2_3_under_load_is_exact_in_both_sinks(
    weir_cluster: WeirCluster, services: Endpoints, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 20 s of input at 1500 a second: both rescales took 10 s of it on a loaded machine (load 10), 3 s
    # at load 7 (each wait below fails naming an input that ended first).
    params = keyed_aggregation_inputs(services, unique, 30_000, records_per_second=1500, checkpoint_interval="1s") | {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit(JOB_FILE, params, 3)
    polling.until(
        "a completed checkpoint at parallelism 3",
        DEADLINE_S,
        lambda: (weir_cluster.client.job_status(job_id).last_completed_checkpoint or 0) >= 1,
    )
    restarts_before = weir_cluster.client.job_status(job_id).summary.restarts

    # 3 -> 2 with the CLI, waiting until every task runs at 2.
    capsys.readouterr()
    code = run_cli(["rescale", job_id, "-p", "2", "--wait", "--timeout", str(DEADLINE_S)])
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert f"job {job_id} rescaled from parallelism 3 to 2" in out
    polling.until("every task running at parallelism 2", DEADLINE_S, lambda: runs_at(weir_cluster, job_id, 2))
    assert still_reading(weir_cluster, job_id), "the input ended before the second rescale: raise the event count"

    # 2 -> 3 with Flink's REST form.
    flink_id = flink_job_id(job_id)
    base = f"http://127.0.0.1:{services.jobmanager_rest_port}"
    with httpx.Client(base_url=base, timeout=10.0) as http:
        refused = http.patch(f"/v1/jobs/{flink_id}/rescaling", params={"parallelism": 2})
        assert refused.status_code == 409 and "already runs at parallelism 2" in refused.json()["errors"][0]
        response = http.patch(f"/v1/jobs/{flink_id}/rescaling", params={"parallelism": 3})
        assert response.status_code == 200, response.text
        trigger_id = response.json()["request-id"]
        outcome: dict[str, object] = {}

        def completed() -> bool:
            nonlocal outcome
            answer = http.get(f"/v1/jobs/{flink_id}/rescaling/{trigger_id}")
            assert answer.status_code == 200, answer.text
            outcome = answer.json()
            return outcome["status"] == {"id": "COMPLETED"}

        polling.until("the REST rescale to complete", DEADLINE_S, completed)
        assert outcome.get("operation", {}) and "failure-cause" not in outcome["operation"], outcome  # type: ignore[operator]
    polling.until("every task running at parallelism 3", DEADLINE_S, lambda: runs_at(weir_cluster, job_id, 3))
    assert still_reading(weir_cluster, job_id), "the input ended before the job ran at 3 again: raise the event count"

    status = weir_cluster.wait_for(job_id, timeout_s=600.0)
    assert status.summary.status is JobStatus.FINISHED, status
    assert status.summary.parallelism == 3
    assert status.summary.restarts == restarts_before, "a rescale is not a restart of the restart strategy's"
    assert_sinks_exact(JOB_FILE, params, job_id, services)


def test_a_reactive_job_follows_the_taskmanagers_and_stays_exact(
    weir_cluster: WeirCluster, services: Endpoints, unique: str
) -> None:
    """``-D scheduler-mode=reactive``: submitted at 2, the job grows to every slot of the three
    TaskManagers; one of them killed (the supervisor starts it again), the job fails over, restarts
    at what is left if it comes first, and grows back once the TaskManager registered again; its
    output stays exact."""
    # 20 s of input at 1500 a second: grown, failed over and grown back in its first 10 s (load 5-9).
    params = keyed_aggregation_inputs(services, unique, 30_000, records_per_second=1500, checkpoint_interval="1s") | {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
        "scheduler-mode": "reactive",
    }
    slots = sum(tm.slots_total for tm in weir_cluster.client.cluster_status().alive_taskmanagers)
    job_id = weir_cluster.submit(JOB_FILE, params, 2)
    polling.until(
        f"the reactive job to grow to every slot ({slots})", DEADLINE_S, lambda: runs_at(weir_cluster, job_id, slots)
    )
    seen: set[int] = set()
    grew_back: list[bool] = []

    def back_at_every_slot_or_ended() -> bool:
        status = weir_cluster.client.job_status(job_id)
        seen.add(status.summary.parallelism)
        if status.summary.status is JobStatus.RUNNING and runs_at(weir_cluster, job_id, slots):
            grew_back.append(True)
        return bool(grew_back) or status.summary.status.terminal

    kill_process(weir_cluster.directory, "taskmanager-1")
    polling.until(
        "the job to fail over",
        DEADLINE_S,
        lambda: weir_cluster.client.job_status(job_id).summary.status is not JobStatus.RUNNING,
    )
    polling.until("the job back at every slot (or ended)", 300.0, back_at_every_slot_or_ended)
    assert grew_back, f"the job ended before it grew back to {slots} slots (it ran at {seen}): raise the event count"
    status = weir_cluster.wait_for(job_id, timeout_s=600.0)
    assert status.summary.status is JobStatus.FINISHED, (status, seen)
    assert_sinks_exact(JOB_FILE, params, job_id, services)

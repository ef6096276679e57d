"""Slot workers on the session's cluster (TaskManagers run each slot's tasks in a process of its own):
a job runs exactly once in them (its TaskManager's /metrics filtered by name brings the workers' series
of that name), a killed worker fails its job over and the job recovers exactly once
while its TaskManager stays up, and a killed TaskManager leaves no worker.

Slot processes are off by default (``WEIR_TASKMANAGER_SLOT_PROCESSES``): unless the session runs with
them on, this module restarts the session's cluster with ``--slot-processes`` on its TaskManagers and
restores it as it was afterwards, so that ``make test`` covers both modes."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.integration import polling
from tests.integration.conftest import WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from weir.core.config import TaskManagerSettings
from weir.core.states import JobStatus
from weir.tools.client import JobDetails
from weir.tools.supervisor import ChildSpec, default_children, local_status, pid_alive, start_cluster, stop_cluster

pytestmark = pytest.mark.integration

JOB = "examples/keyed_aggregation.py"
WORKER_MODULE = "weir.taskmanager.slot_worker"


def with_slot_processes(spec: ChildSpec) -> ChildSpec:
    if not spec.name.startswith("taskmanager"):
        return spec
    return ChildSpec(spec.name, (*spec.argv, "--slot-processes"))


@pytest.fixture(scope="module", autouse=True)
def slot_processes_on(weir_cluster: WeirCluster) -> Iterator[None]:
    """The session's cluster with slot processes for this module's tests (see the module)."""
    if TaskManagerSettings.from_env().taskmanager_slot_processes:
        yield
        return
    restart_cluster(weir_cluster, tuple(with_slot_processes(c) for c in default_children(weir_cluster.endpoints)))
    try:
        yield
    finally:
        restart_cluster(weir_cluster, default_children(weir_cluster.endpoints))


def restart_cluster(cluster: WeirCluster, children: tuple[ChildSpec, ...]) -> None:
    """Stop the session's cluster once no job runs on it (a restarted JobManager recovers the jobs
    that had not ended) and start it again in its directory with ``children``."""
    cluster.cancel_jobs_except(set())
    polling.until("every job of the session's cluster ended", 60, lambda: not cluster.running_jobs())
    stop_cluster(cluster.directory)
    start_cluster(
        cluster.directory, cluster.endpoints, restart=True, restart_delay_s=1.0, timeout_s=90, children=children
    )


def live_pid(cluster: WeirCluster, name: str) -> int | None:
    """The pid of the supervisor's child ``name`` while it runs (None while it is being restarted)."""
    status = local_status(cluster.directory)
    assert status is not None, "no local cluster"
    pids = [p.pid for p in status.processes if p.name == name and p.alive and p.pid is not None]
    return pids[0] if pids else None


def taskmanager_pid(cluster: WeirCluster, name: str) -> int:
    pid = live_pid(cluster, name)
    assert pid is not None, f"{name} is not running"
    return pid


def restarts_of(cluster: WeirCluster, name: str) -> int:
    status = local_status(cluster.directory)
    assert status is not None
    (restarts,) = [p.restarts for p in status.processes if p.name == name]
    return restarts


def slot_workers(parent: int) -> list[int]:
    """The slot worker processes whose parent is ``parent``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == parent and WORKER_MODULE in cmdline and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def filtered_scrape(port: int, name: str) -> list[Sample]:
    """The samples of a TaskManager's ``/metrics?name[]=NAME``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?name[]={name}", timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def log_events(cluster: WeirCluster, name: str, event: str) -> list[dict[str, Any]]:
    """The structured events named ``event`` in a cluster process's log."""
    found = []
    for line in (cluster.directory / f"{name}.log").read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            entry = json.loads(line)
            if entry.get("event") == event:
                found.append(entry)
    return found


def holds_job_state(pid: int, job_id: str) -> bool:
    """The process has a file of the job's keyed state open (its RocksDB under jobs/<job>/)."""
    marker = f"/jobs/{job_id}/"
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if marker in os.readlink(fd):
                return True
        except OSError:
            continue
    return False


def running(cluster: WeirCluster, job_id: str, since_checkpoint: int = 0) -> JobDetails:
    """The job once RUNNING with every task running and a checkpoint past ``since_checkpoint``."""
    seen: list[JobDetails] = []

    def ready() -> bool:
        status = cluster.client.job_status(job_id)
        seen[:] = [status]
        if status.summary.status in (JobStatus.FAILED, JobStatus.CANCELED, JobStatus.FINISHED):
            pytest.fail(f"job {job_id} ended {status.summary.status} before it could be observed running")
        return (
            status.summary.status == JobStatus.RUNNING
            and all(t.state is not None and t.state.name == "RUNNING" for t in status.tasks)
            and (status.last_completed_checkpoint or 0) > since_checkpoint
        )

    polling.until(f"job {job_id} running past checkpoint {since_checkpoint}", 120, ready)
    return seen[0]


def test_a_job_runs_exactly_once_in_slot_workers(weir_cluster: WeirCluster, unique: str) -> None:
    endpoints = weir_cluster.endpoints
    params = keyed_aggregation_inputs(endpoints, unique, 40_000, records_per_second=4000, checkpoint_interval="1s")
    job_id = weir_cluster.submit(JOB, params)
    status = running(weir_cluster, job_id)
    # Every TaskManager of the job runs its keyed tasks in its slot workers, none in its own process.
    for name in sorted({t.taskmanager_id for t in status.tasks}):
        tm = taskmanager_pid(weir_cluster, name)
        workers = slot_workers(tm)
        assert workers, f"{name} (pid {tm}) runs no slot worker"
        assert not holds_job_state(tm, job_id), f"{name} opened the job's state in its own process"
        polling.until(
            f"a slot worker of {name} holding job {job_id}'s state",
            30,
            lambda t=tm: any(holds_job_state(w, job_id) for w in slot_workers(t)),
        )
        # A scrape filtered by name (Prometheus' ``name[]``) gets the workers' series of that name alone.
        port = endpoints.taskmanager_metrics_base_port + int(name.rsplit("-", 1)[1])
        polling.until(
            f"{name}'s /metrics?name[]=weir_records_in_total naming job {job_id}",
            30,
            lambda p=port: job_id in {s.labels.get("job_id") for s in filtered_scrape(p, "weir_records_in_total")},
        )
        assert {s.name for s in filtered_scrape(port, "weir_records_in_total")} == {"weir_records_in_total"}
    final = weir_cluster.wait_for(job_id)
    assert final.summary.status == "FINISHED", final
    assert final.summary.restarts == 0, final.failure
    assert_sinks_exact(JOB, params, job_id, endpoints)


def test_a_killed_slot_worker_fails_its_job_over_and_it_recovers_exactly_once(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    # 8 s of input at the pace: the worker is killed once the job runs past its first checkpoint, seconds in.
    params = keyed_aggregation_inputs(endpoints, unique, 48_000, records_per_second=6000, checkpoint_interval="1s")
    params |= {"restart.strategy": "fixed-delay", "restart.delay": "1s"}
    job_id = weir_cluster.submit(JOB, params)
    status = running(weir_cluster, job_id)
    name = sorted({t.taskmanager_id for t in status.tasks if t.vertex_uid == "window-count-sum"})[0]
    tm = taskmanager_pid(weir_cluster, name)
    tm_restarts = restarts_of(weir_cluster, name)
    victims: list[int] = []

    def found() -> bool:
        victims[:] = [w for w in slot_workers(tm) if holds_job_state(w, job_id)]
        return bool(victims)

    polling.until(f"a slot worker of {name} holding job {job_id}'s state", 30, found)
    victim = victims[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()

    def recovered() -> bool:
        s = weir_cluster.client.job_status(job_id)
        if s.summary.status in (JobStatus.FAILED, JobStatus.CANCELED):
            pytest.fail(f"job {job_id} ended {s.summary.status} after its slot worker was killed: {s.failure}")
        return s.summary.restarts >= 1 and s.last_restore_at is not None and s.last_restore_at >= killed_at - 1

    polling.until("the job's restore after the kill", 120, recovered)
    # Its TaskManager saw it die and failed its tasks (the job's recorded failure may be another
    # task's, whichever report reached the JobManager first: a consumer losing its producer).
    (died,) = [e for e in log_events(weir_cluster, name, "slot_worker_died") if e["pid"] == victim]
    assert died["exit"] == "was killed by SIGKILL" and died["tasks"], died
    assert not pid_alive(victim)
    assert taskmanager_pid(weir_cluster, name) == tm and restarts_of(weir_cluster, name) == tm_restarts, (
        "the TaskManager itself stayed up: only its worker died"
    )
    final = weir_cluster.wait_for(job_id)
    assert final.summary.status == "FINISHED", final
    assert_sinks_exact(JOB, params, job_id, endpoints)


def test_a_killed_taskmanager_leaves_no_slot_worker_behind(weir_cluster: WeirCluster) -> None:
    """SIGKILL of the TaskManager's process alone (not its process group, as ``weir cluster kill``
    does): its workers go with it, and the restarted TaskManager starts its own."""
    name = "taskmanager-3"
    tm = taskmanager_pid(weir_cluster, name)
    polling.until(f"{name}'s spares", 60, lambda: len(slot_workers(tm)) >= 2)
    workers = slot_workers(tm)
    os.kill(tm, signal.SIGKILL)
    polling.until(f"{name}'s workers {workers} gone", 30, lambda: not any(pid_alive(w) for w in workers))
    polling.until(f"{name} restarted", 60, lambda: live_pid(weir_cluster, name) not in (None, tm))
    restarted = taskmanager_pid(weir_cluster, name)
    polling.until(f"the restarted {name}'s spares", 60, lambda: len(slot_workers(restarted)) >= 2)
    assert not set(slot_workers(restarted)) & set(workers)
    weir_cluster.wait_for_taskmanagers()

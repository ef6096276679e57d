"""A leader JobManager and a standby on one checkpoint storage (``WEIR_HA_ENABLED``): the leader is
killed (SIGKILL) or paused (SIGSTOP) under load; the standby takes the lease over within seconds,
the TaskManagers follow it, and the job's output is exact in both sinks (multisets of whole records).
A paused leader woken after the takeover changes nothing: it starts over as a standby; paused in the
middle of a submission, the job it was creating is refused by the job index and leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import assert_sinks_exact, keyed_aggregation_inputs
from tests.integration.polling import until
from tests.integration.ports import private_ports
from weir.connectors.object_storage import open_storage
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.core.ids import JobId
from weir.core.paths import CheckpointPaths
from weir.jobmanager.job_index import JOB_INDEX_KEY, decode_index
from weir.jobmanager.lease import LeaseStore
from weir.tools.client import SUBMIT_TIMEOUT_S, JobDetails, JobManagerClient

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]
LANDED_EVENTS = frozenset({"leadership_granted", "checkpoint_completed", "job_recovered", "taskmanager_registered"})
"""What a JobManager logs only once something it did took effect outside it (a lease won, checkpoint
metadata written, a job taken over, a TaskManager served): none may follow a woken leader's step-down."""
TAKEOVER_WITHIN_S = 20.0  # lease 6 s + the takeover's recovery + the TaskManagers' re-registration


@dataclass
class HaCluster:
    addresses: tuple[str, str]
    jobmanagers: dict[str, subprocess.Popen[bytes]]  # by address
    taskmanagers: list[subprocess.Popen[bytes]]
    client: JobManagerClient
    storage_uri: str
    logs: Path

    def leader(self) -> str | None:
        record = LeaseStore(open_storage(self.storage_uri)).read().record
        return record.address if record is not None else None

    def term(self) -> int:
        record = LeaseStore(open_storage(self.storage_uri)).read().record
        return record.term if record is not None else 0


def log_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log events in ``path``; a line the exec into a standby cut short may run on into the
    next event, so each line is read as a sequence of JSON objects."""
    decoder = json.JSONDecoder()
    events: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        at = line.find("{")
        while at != -1:
            try:
                event, end = decoder.raw_decode(line, at)
            except json.JSONDecodeError:
                break
            if isinstance(event, dict):
                events.append(event)
            at = line.find("{", end)
    return events


def status(cluster: HaCluster, job_id: str) -> JobDetails | None:
    try:
        return cluster.client.job_status(job_id)
    except WeirError:
        return None  # no leader answering right now


@pytest.fixture
def ha_cluster(services: Endpoints, tmp_path: Path) -> Iterator[HaCluster]:
    with running_ha_cluster(services, tmp_path) as cluster:
        yield cluster


@contextmanager
def running_ha_cluster(
    services: Endpoints, tmp_path: Path, leader_env: dict[str, str] | None = None
) -> Iterator[HaCluster]:
    """A leader, a standby and three TaskManagers; ``leader_env``: more environment for the first
    JobManager (the one that leads first) only."""
    # The private JobManager port beside the session's cluster and the one after it.
    first = int(private_ports(services)["WEIR_JOBMANAGER_PORT"])
    addresses = (f"127.0.0.1:{first}", f"127.0.0.1:{first + 1}")
    storage_uri = f"s3://{services.s3_bucket}/test-ha-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "WEIR_RUN_DIR": str(tmp_path / "run"),
        "WEIR_CHECKPOINT_DIR": storage_uri,
        "WEIR_HA_ENABLED": "true",
        "WEIR_JOBMANAGER_ADDRESS": addresses[0],
        "WEIR_JOBMANAGER_ADDRESSES": ",".join(addresses),
    }
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, *argv: str, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it
        return subprocess.Popen(
            [sys.executable, *argv], env={**env, **(extra or {})}, stdout=out, stderr=subprocess.STDOUT
        )

    jobmanagers: dict[str, subprocess.Popen[bytes]] = {}
    for i, address in enumerate(addresses):
        port = address.rsplit(":", 1)[1]
        jobmanagers[address] = start(
            f"jobmanager-{i}",
            "-m",
            "weir.jobmanager",
            "--port",
            port,
            "--metrics-port",
            "0",
            "--rest-port",
            "0",
            extra=leader_env if i == 0 else None,
        )
        if i == 0:  # the first one leads: the lease is its own before the standby starts
            until(
                "the first JobManager to lead",
                30,
                lambda: LeaseStore(open_storage(storage_uri)).read().record is not None,
            )
    taskmanagers = [
        start(f"taskmanager-{n}", "-m", "weir.taskmanager", "--id", f"ha-taskmanager-{n}", "--metrics-port", "0")
        for n in range(1, 4)
    ]
    client = JobManagerClient(",".join(addresses), timeout_s=3.0)
    cluster = HaCluster(addresses, jobmanagers, taskmanagers, client, storage_uri, logs)

    def all_registered() -> bool:
        try:
            return sum(tm.alive for tm in client.cluster_status().taskmanagers) == 3
        except WeirError:
            return False

    try:
        until("three TaskManagers registered with the leader", 60, all_registered)
        yield cluster
    finally:
        client.close()
        for process in [*jobmanagers.values(), *taskmanagers]:
            if process.poll() is None:
                try:
                    os.kill(process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                process.terminate()
        for process in [*jobmanagers.values(), *taskmanagers]:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def run_and_disturb(ha_cluster: HaCluster, services: Endpoints, unique: str, disturb: Callable[[str], None]) -> None:
    params = keyed_aggregation_inputs(services, unique, 60_000, records_per_second=4000, checkpoint_interval="1s") | {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_file = REPO_ROOT / "examples/keyed_aggregation.py"
    job_id = ha_cluster.client.submit_job(job_file, params, 3)
    until(
        "two completed checkpoints",
        90,
        lambda: (s := status(ha_cluster, job_id)) is not None and (s.last_completed_checkpoint or 0) >= 2,
    )
    leader = ha_cluster.leader()
    assert leader == ha_cluster.addresses[0]
    term = ha_cluster.term()
    disturb(leader)
    started = time.monotonic()
    standby = ha_cluster.addresses[1]
    until("the standby to take the lease over", TAKEOVER_WITHIN_S, lambda: ha_cluster.leader() == standby)
    took_over_s = time.monotonic() - started
    assert ha_cluster.term() == term + 1
    assert took_over_s < TAKEOVER_WITHIN_S
    until(
        "the job to finish under the new leader",
        300,
        lambda: (s := status(ha_cluster, job_id)) is not None and s.summary.status == "FINISHED",
    )
    assert_sinks_exact("examples/keyed_aggregation.py", params, job_id, services)


def test_killed_leader_the_standby_takes_over_and_the_output_is_exact(
    ha_cluster: HaCluster, services: Endpoints, unique: str
) -> None:
    def kill(leader: str) -> None:
        ha_cluster.jobmanagers[leader].kill()

    run_and_disturb(ha_cluster, services, unique, kill)


def test_paused_leader_woken_after_the_takeover_changes_nothing(
    ha_cluster: HaCluster, services: Endpoints, unique: str
) -> None:
    paused: list[str] = []
    woken_at: list[float] = []

    def pause(leader: str) -> None:
        os.kill(ha_cluster.jobmanagers[leader].pid, signal.SIGSTOP)
        paused.append(leader)

    def pause_until_taken_over(leader: str) -> None:
        pause(leader)
        until("the standby to take over", TAKEOVER_WITHIN_S, lambda: ha_cluster.leader() == ha_cluster.addresses[1])
        woken_at.append(time.time())
        os.kill(ha_cluster.jobmanagers[leader].pid, signal.SIGCONT)

    run_and_disturb(ha_cluster, services, unique, pause_until_taken_over)
    old = ha_cluster.jobmanagers[paused[0]]
    assert old.poll() is None, "the woken leader is still running (as a standby)"
    assert ha_cluster.leader() == ha_cluster.addresses[1] and ha_cluster.term() == 2
    events = log_events(ha_cluster.logs / "jobmanager-0.log")
    woken = [e for e in events if datetime.fromisoformat(e["timestamp"]).timestamp() >= woken_at[0]]
    names = [e.get("event") for e in woken]
    assert "leadership_lost" in names, names
    # Woken, its threads act on what they saw before the pause (its monitor may decide a restart in
    # memory, its clock having jumped past the heartbeat timeout); nothing of it lands: every storage
    # write is fenced, every TaskManager call refused, and it starts over as a standby.
    landed = [e for e in woken if e.get("event") in LANDED_EVENTS]
    assert not landed, landed
    assert "no renewal succeeded" in woken[names.index("leadership_lost")]["reason"]
    assert "jobmanager_standby" in names
    refused = [e for e in woken if e.get("event") in ("write_fenced", "notify_failed", "trigger_failed")]
    assert all(e.get("event") == "write_fenced" or e.get("code") == "FAILED_PRECONDITION" for e in refused), refused


def test_a_leader_paused_mid_submission_creates_nothing_once_woken(
    services: Endpoints, tmp_path: Path, unique: str
) -> None:
    """The leader stops itself (SIGSTOP, a pause point) after its lease check for a new job's first
    record and before the write; the standby takes over; woken, the old leader's record write lands
    (its key is new: nothing to fence) but the job index refuses the job, the record is withdrawn, and
    the submission is not answered with an id. Submitted again, the job runs once on the new leader,
    exactly."""
    leader_env = {"WEIR_PAUSE_POINTS": "before_job_record_create", "WEIR_CRASH_ONCE_DIR": str(tmp_path / "once")}
    with running_ha_cluster(services, tmp_path, leader_env) as cluster:
        params = keyed_aggregation_inputs(services, unique, 2_000, records_per_second=2000, checkpoint_interval="1s")
        job_file = REPO_ROOT / "examples/keyed_aggregation.py"
        old_log = cluster.logs / "jobmanager-0.log"
        outcome: dict[str, object] = {}

        def submit() -> None:
            try:
                outcome["job_id"] = cluster.client.submit_job(job_file, params, 1)
            except WeirError as exc:
                outcome["error"] = exc

        submitting = threading.Thread(target=submit, name="submit-to-paused-leader")
        submitting.start()
        until(
            "the leader to pause before the new job's record",
            120,
            lambda: bool(outcome) or any(e.get("event") == "pause_point_hit" for e in log_events(old_log)),
        )
        assert not outcome, f"the submission was answered before the leader paused: {outcome}"
        (paused,) = [e for e in log_events(old_log) if e.get("event") == "pause_point_hit"]
        job_id = str(paused["job_id"])
        until("the standby to take over", TAKEOVER_WITHIN_S + 30, lambda: cluster.leader() == cluster.addresses[1])
        woken_at = time.time()
        os.kill(cluster.jobmanagers[cluster.addresses[0]].pid, signal.SIGCONT)
        submitting.join(timeout=SUBMIT_TIMEOUT_S + 30)
        assert not submitting.is_alive()
        assert "job_id" not in outcome and isinstance(outcome.get("error"), WeirError), outcome

        until(
            "the woken leader to start over as a standby",
            60,
            lambda: any(
                e.get("event") == "jobmanager_standby"
                and datetime.fromisoformat(e["timestamp"]).timestamp() >= woken_at
                for e in log_events(old_log)
            ),
        )
        woken = [e for e in log_events(old_log) if datetime.fromisoformat(e["timestamp"]).timestamp() >= woken_at]
        names = [e.get("event") for e in woken]
        withdrawn = [e for e in woken if e.get("event") == "job_creation_withdrawn"]
        assert [e["job_id"] for e in withdrawn] == [job_id], names
        assert not [e for e in woken if e.get("event") in LANDED_EVENTS | {"job_registered"}], names
        # Nothing of it survives: no record, no index entry, unknown to the leader.
        storage = open_storage(cluster.storage_uri)
        paths = CheckpointPaths()
        assert not storage.exists(paths.job_record(JobId(job_id)))
        assert not storage.exists(paths.job_artifact(JobId(job_id)))
        assert job_id not in decode_index(storage.get_bytes(JOB_INDEX_KEY)).job_ids
        listed: list[str] = []

        def listed_by_the_leader() -> bool:
            try:  # the client may still be on the old leader's address: it moves on after one refusal
                listed[:] = [j.job_id for j in cluster.client.list_jobs()]
            except WeirError:
                return False
            return True

        until("the new leader to list its jobs", 30, listed_by_the_leader)
        assert job_id not in listed

        again = cluster.client.submit_job(job_file, params, 1)
        assert again != job_id
        until(
            "the job submitted again to finish on the new leader",
            300,
            lambda: (s := status(cluster, again)) is not None and s.summary.status == "FINISHED",
        )
        assert_sinks_exact("examples/keyed_aggregation.py", params, again, services)
        until("the new leader to list its jobs", 30, listed_by_the_leader)
        assert listed == [again]

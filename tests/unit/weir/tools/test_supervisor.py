"""The local cluster's supervisor: the pure restart decision, then the real supervisor process
running fake children (sleeping Python processes) against a fake JobManager."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from weir.core.config import Endpoints
from weir.core.errors import ClusterError, UnknownProcessError
from weir.tools import supervisor as cluster
from weir.tools.cli import EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.supervisor import (
    ChildExit,
    ChildSpec,
    LocalClusterStatus,
    ProcessStatus,
    RestartPolicy,
    kill_process,
    local_status,
    pid_alive,
    start_cluster,
    stop_cluster,
)
from weir.wire import jobmanager_pb2, jobmanager_pb2_grpc

T = TypeVar("T")

SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")
CHILDREN = tuple(ChildSpec(name, SLEEPER) for name in ("jobmanager", "taskmanager-1", "taskmanager-2", "taskmanager-3"))


# The restart decision ----------------------------------------------------------------------------


def test_a_child_that_ran_stably_is_restarted_at_once() -> None:
    decision = RestartPolicy(delay_s=2.0).decide(ChildExit(returncode=-9, started_at=100.0, exited_at=200.0), 0)
    assert (decision.restart_at, decision.crash_streak) == (200.0, 1)


def test_a_second_crash_soon_after_the_restart_waits_the_delay() -> None:
    policy = RestartPolicy(delay_s=2.0, stable_after_s=10.0)
    first = policy.decide(ChildExit(returncode=-9, started_at=100.0, exited_at=200.0), 0)
    assert first.restart_at == 200.0
    second = policy.decide(ChildExit(returncode=1, started_at=200.0, exited_at=201.0), first.crash_streak)
    assert (second.restart_at, second.crash_streak) == (203.0, 2)


def test_no_restart_leaves_the_child_down() -> None:
    decision = RestartPolicy(restart=False).decide(ChildExit(returncode=1, started_at=0.0, exited_at=1.0), 0)
    assert decision.restart_at is None


def test_no_restart_while_the_supervisor_stops() -> None:
    exit = ChildExit(returncode=0, started_at=0.0, exited_at=50.0)
    assert RestartPolicy().decide(exit, 0, stopping=True).restart_at is None


def test_a_crash_loop_backs_off_up_to_the_maximum() -> None:
    policy = RestartPolicy(delay_s=1.0, max_delay_s=5.0, stable_after_s=10.0)
    streak, delays, now = 0, [], 0.0
    for _ in range(5):
        decision = policy.decide(ChildExit(returncode=1, started_at=now, exited_at=now + 0.5), streak)
        assert decision.restart_at is not None
        delays.append(decision.restart_at - (now + 0.5))
        streak, now = decision.crash_streak, decision.restart_at
    assert delays == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_a_child_that_ran_stably_resets_the_back_off() -> None:
    policy = RestartPolicy(delay_s=1.0, stable_after_s=10.0)
    decision = policy.decide(ChildExit(returncode=1, started_at=0.0, exited_at=60.0), crash_streak=4)
    assert (decision.restart_at, decision.crash_streak) == (60.0, 1)


def test_child_spec_round_trips_through_its_command_line_form() -> None:
    spec = ChildSpec("taskmanager-1", (sys.executable, "-c", "print('a b')"))
    assert ChildSpec.parse(spec.format()) == spec
    with pytest.raises(ValueError):
        ChildSpec.parse("no-command=")


def test_default_children_command_lines() -> None:
    endpoints = Endpoints.from_env({"WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:7000", "WEIR_JOBMANAGER_METRICS_PORT": "7001",
                                    "WEIR_JOBMANAGER_REST_PORT": "7002",
                                    "WEIR_TASKMANAGER_METRICS_BASE_PORT": "7010"})  # fmt: skip
    specs = cluster.default_children(endpoints, python="py")
    assert [s.argv for s in specs] == [
        ("py", "-m", "weir.jobmanager", "--port", "7000", "--metrics-port", "7001", "--rest-port", "7002"),
        ("py", "-m", "weir.taskmanager", "--id", "taskmanager-1", "--metrics-port", "7011"),
        ("py", "-m", "weir.taskmanager", "--id", "taskmanager-2", "--metrics-port", "7012"),
        ("py", "-m", "weir.taskmanager", "--id", "taskmanager-3", "--metrics-port", "7013"),
    ]


def test_standby_jobmanagers_take_the_ports_after_the_leaders_and_every_process_runs_with_ha() -> None:
    """`weir cluster up --standbys 2`: two standby JobManagers on the JobManager's port + 1 and + 2
    (REST port + 1 and + 2, metrics port - 1 and - 2: below the leader's, as the TaskManagers' follow
    their base port, which is the leader's + 1 by default); the cluster's processes all get WEIR_HA_ENABLED and the
    three addresses, so the TaskManagers and tools follow whichever leads. No standby: nothing added."""
    endpoints = Endpoints.from_env({"WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:7000", "WEIR_JOBMANAGER_METRICS_PORT": "7050",
                                    "WEIR_JOBMANAGER_REST_PORT": "7080",
                                    "WEIR_TASKMANAGER_METRICS_BASE_PORT": "7010"})  # fmt: skip
    specs = cluster.default_children(endpoints, taskmanagers=1, python="py", standbys=2)
    assert [(s.name, s.argv) for s in specs] == [
        (
            "jobmanager",
            ("py", "-m", "weir.jobmanager", "--port", "7000", "--metrics-port", "7050", "--rest-port", "7080"),
        ),
        (
            "jobmanager-standby-1",
            ("py", "-m", "weir.jobmanager", "--port", "7001", "--metrics-port", "7049", "--rest-port", "7081"),
        ),
        (
            "jobmanager-standby-2",
            ("py", "-m", "weir.jobmanager", "--port", "7002", "--metrics-port", "7048", "--rest-port", "7082"),
        ),
        ("taskmanager-1", ("py", "-m", "weir.taskmanager", "--id", "taskmanager-1", "--metrics-port", "7011")),
    ]
    assert cluster.ha_environment(endpoints, 2) == {
        "WEIR_HA_ENABLED": "true",
        "WEIR_JOBMANAGER_ADDRESSES": "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002",
    }
    assert cluster.ha_environment(endpoints, 0) == {}
    clashing = Endpoints.from_env({"WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:7000", "WEIR_JOBMANAGER_METRICS_PORT": "7001"})
    with pytest.raises(ClusterError, match="port 7001 is both jobmanager metrics and jobmanager-standby-1"):
        cluster.require_distinct_ports(clashing, 1)
    below = Endpoints.from_env({"WEIR_JOBMANAGER_METRICS_PORT": "7050", "WEIR_TASKMANAGER_METRICS_BASE_PORT": "7046"})
    with pytest.raises(ClusterError, match="port 7049 is both taskmanager-3 metrics and jobmanager-standby-1 metrics"):
        cluster.require_distinct_ports(below, 3)
    no_metrics = Endpoints.from_env({"WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:7000", "WEIR_JOBMANAGER_METRICS_PORT": "0"})
    (standby,) = [s for s in cluster.default_children(no_metrics, 1, "py", standbys=1) if s.name.endswith("standby-1")]
    assert standby.argv[standby.argv.index("--metrics-port") + 1] == "0"  # the leader has none: nor do they


# The real supervisor -----------------------------------------------------------------------------


class FakeJobManager(jobmanager_pb2_grpc.JobManagerServiceServicer):
    """Reports ``taskmanagers`` live TaskManagers."""

    def __init__(self) -> None:
        self.taskmanagers = 3

    def GetClusterStatus(  # noqa: N802
        self, request: jobmanager_pb2.GetClusterStatusRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.GetClusterStatusResponse:
        return jobmanager_pb2.GetClusterStatusResponse(
            taskmanagers=[
                jobmanager_pb2.TaskManagerInfo(
                    taskmanager_id=f"taskmanager-{n}", slots_total=2, slots_free=2, alive=True
                )
                for n in range(1, self.taskmanagers + 1)
            ]
        )


@pytest.fixture
def jobmanager() -> FakeJobManager:
    return FakeJobManager()


@pytest.fixture
def endpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, jobmanager: FakeJobManager) -> Iterator[Endpoints]:
    """A fake JobManager (3 live TaskManagers unless a test says otherwise); WEIR_RUN_DIR in tmp_path."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    jobmanager_pb2_grpc.add_JobManagerServiceServicer_to_server(jobmanager, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setenv("WEIR_JOBMANAGER_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setenv("WEIR_RUN_DIR", str(tmp_path))
    yield Endpoints.from_env()
    server.stop(grace=None)


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "cluster"
    yield path
    stop_cluster(path)  # whatever a failing test left running


def wait_for(condition: Callable[[], T | None], what: str, timeout_s: float = 5.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)  # poll interval


def process(directory: Path, name: str) -> ProcessStatus:
    status = local_status(directory)
    assert status is not None
    return next(p for p in status.processes if p.name == name)


def test_kill_restarts_the_child_and_down_removes_everything(
    endpoints: Endpoints, directory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = start_cluster(directory, endpoints, restart_delay_s=0.05, children=CHILDREN)
    assert (result.already_running, result.taskmanagers_alive) == (False, 3)
    assert [(p.name, p.alive, p.restarts) for p in result.status.processes] == [(c.name, True, 0) for c in CHILDREN]
    assert start_cluster(directory, endpoints, children=CHILDREN).already_running

    old_pid = kill_process(directory, "taskmanager-2")
    restarted = wait_for(
        lambda: (p := process(directory, "taskmanager-2")).restarts == 1 and p.alive and p,
        "taskmanager-2 to be restarted",
    )
    assert restarted.pid != old_pid and restarted.last_exit_code == -9
    assert not pid_alive(old_pid)
    assert "--- weir supervisor: starting taskmanager-2=" in Path(restarted.log).read_text()

    with pytest.raises(UnknownProcessError, match="valid names are jobmanager, taskmanager-1, taskmanager-2"):
        kill_process(directory, "taskmanager-9")
    assert run_cli(["cluster", "kill", "nope"]) == EXIT_USAGE
    assert run_cli(["cluster", "status", "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["restarts"]) for p in shown["local"]["processes"]] == [
        ("jobmanager", 0), ("taskmanager-1", 0), ("taskmanager-2", 1), ("taskmanager-3", 0)
    ]  # fmt: skip
    assert shown["jobmanager"]["answering"]

    before: LocalClusterStatus | None = local_status(directory)
    assert before is not None
    pids = [before.supervisor_pid, *(p.pid for p in before.processes if p.pid is not None)]
    stopped = stop_cluster(directory)
    assert stopped.was_running
    assert not [pid for pid in pids if pid_alive(pid)]
    assert not (directory / cluster.STATE_FILE).exists()
    assert local_status(directory) is None


def test_no_restart_leaves_a_killed_child_dead(endpoints: Endpoints, directory: Path) -> None:
    start_cluster(directory, endpoints, restart=False, children=CHILDREN)
    kill_process(directory, "jobmanager")
    dead = wait_for(
        lambda: (p := process(directory, "jobmanager")).status == "exited" and p, "the jobmanager to be reaped"
    )
    assert (dead.pid, dead.alive, dead.restarts, dead.last_exit_code) == (None, False, 0, -9)
    assert all(p.alive for p in local_status(directory).processes if p.name != "jobmanager")  # type: ignore[union-attr]
    assert stop_cluster(directory).was_running
    assert not (directory / cluster.STATE_FILE).exists()


CRASHING = ChildSpec("taskmanager-1", (sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"))


def test_a_child_dying_during_start_up_fails_up_naming_its_log(
    endpoints: Endpoints, directory: Path, jobmanager: FakeJobManager
) -> None:
    jobmanager.taskmanagers = 0
    children = (CHILDREN[0], CRASHING, *CHILDREN[2:])
    with pytest.raises(ClusterError) as failed:
        start_cluster(directory, endpoints, restart=False, children=children, timeout_s=10)
    log = directory / "taskmanager-1.log"
    assert str(failed.value) == f"taskmanager-1 exited with code 3 (read {log})"
    assert "boom" in log.read_text()
    assert local_status(directory) is None  # the half-started cluster was stopped


def test_a_start_up_timeout_names_the_logs(endpoints: Endpoints, directory: Path, jobmanager: FakeJobManager) -> None:
    jobmanager.taskmanagers = 1
    with pytest.raises(ClusterError, match=r"did not come up within 3 s: 1 of 3 TaskManagers registered") as failed:
        start_cluster(directory, endpoints, children=CHILDREN, timeout_s=3)
    assert str(directory / "supervisor.log") in str(failed.value)
    assert str(directory / "taskmanager-3.log") in str(failed.value)
    assert local_status(directory) is None


def test_a_child_due_for_restart_is_not_started_while_the_supervisor_stops(tmp_path: Path) -> None:
    """A child waiting for its restart when the supervisor is told to stop stays down, however long
    the others take to stop: it was started during the stop before, outside the children being
    terminated, and outlived the cluster (a TaskManager killed by a test just before its teardown)."""
    pids = tmp_path / "pids"
    crash_then_sleep = (
        sys.executable,
        "-c",
        "import os, sys, time\n"
        f"pids = {str(pids)!r}\n"
        "first = not os.path.exists(pids)\n"
        "open(pids, 'a').write(f'{os.getpid()}\\n')\n"
        "sys.exit(3) if first else time.sleep(60)\n",
    )
    # Stops slowly: ignores SIGTERM for 1.5 s, as a TaskManager stopping its slot workers may.
    slow_to_stop = (
        sys.executable,
        "-c",
        "import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.5), exit(0)))\ntime.sleep(60)\n",
    )
    children = (ChildSpec("jobmanager", slow_to_stop), ChildSpec("taskmanager-1", crash_then_sleep))
    said: list[str] = []
    supervisor = cluster.Supervisor(
        tmp_path / "cluster", children, RestartPolicy(delay_s=0.5), stop_timeout_s=5, log=said.append
    )
    stop = cluster.threading.Event()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(supervisor.run, stop)
        deadline = time.monotonic() + 30
        while not any(m.startswith("taskmanager-1 exited with code 3; restarting in") for m in said):
            assert time.monotonic() < deadline, f"the crashing child's restart was never scheduled: {said}"
            time.sleep(0.05)
        stop.set()  # its restart is due within 0.5 s, while the slow child still stops
        running.result(30)
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 1, f"restarted during the stop: {started[1:]}"
    assert not any(pid_alive(pid) for pid in started)


def test_a_restart_runs_the_warm_spare_with_the_child_s_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child kept with a warm spare is restarted in the spare's process (already past its imports),
    which is given the child's arguments; the next spare comes after it."""
    package = tmp_path / "recorder"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import os, sys, time\n"
        "if __name__ == '__main__':\n"
        "    with open(sys.argv[1], 'a') as f:\n"
        "        f.write(f\"{os.getpid()} {' '.join(sys.argv[2:])}\\n\")\n"
        "    time.sleep(60)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    started = tmp_path / "started"
    children = (ChildSpec("jobmanager", (sys.executable, "-m", "recorder", str(started), "--port", "1")),)
    said: list[str] = []
    supervisor = cluster.Supervisor(
        tmp_path / "cluster",
        children,
        RestartPolicy(delay_s=0.5),
        stop_timeout_s=5,
        log=said.append,
        spares={"jobmanager"},
        spare_after_s=0.0,
    )

    def spare_pids() -> list[int]:
        return [int(m.rsplit("pid ", 1)[1].rstrip(")")) for m in said if m.startswith("started a warm spare")]

    def lines() -> list[str]:
        return started.read_text().splitlines() if started.exists() else []

    stop = cluster.threading.Event()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(supervisor.run, stop)
        try:
            deadline = time.monotonic() + 30
            while not (lines() and spare_pids()):
                assert time.monotonic() < deadline, f"no child and spare: {said}"
                time.sleep(0.05)
            first_pid = int(lines()[0].split()[0])
            spare = spare_pids()[0]
            os.kill(first_pid, cluster.signal.SIGKILL)
            while len(lines()) < 2 or len(spare_pids()) < 2:
                assert time.monotonic() < deadline, f"not restarted from the spare: {said}"
                time.sleep(0.05)
        finally:
            stop.set()
            running.result(30)
    restarted = lines()[1].split()
    assert (int(restarted[0]), restarted[1:]) == (spare, ["--port", "1"])
    assert any(m.startswith(f"started jobmanager from its warm spare (pid {spare}") for m in said), said
    assert spare_pids()[1] != spare
    assert not any(pid_alive(pid) for pid in (first_pid, *spare_pids()))

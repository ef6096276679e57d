"""The supervision of slot workers (``slot_processes``), with real worker processes and no
JobManager: spares start ahead, a task runs in its slot's worker, a worker killed under its task
fails that task (reported FAILED, naming the signal) and is replaced, a job's end retires its
workers cleanly, refusals keep their meaning, and a worker never outlives its TaskManager."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from weir.core.checkpointing import CheckpointingMode
from weir.core.codec import checkpointing_mode_to_proto, task_state_from_proto
from weir.core.errors import JobDefinitionError
from weir.core.states import TaskState
from weir.core.transport_security import TransportSecurity
from weir.taskmanager.reporter import Report, StateReport
from weir.taskmanager.slot_link import SlotWorkerError
from weir.taskmanager.slot_processes import SlotProcesses
from weir.taskmanager.task_types import TaskAddress
from weir.tools.supervisor import pid_alive
from weir.wire import common_pb2, taskmanager_pb2

WITHIN_S = 60.0  # a worker starts in 1-2 s here; a loaded shared machine may take far longer

JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        numbers = env.from_generator(lambda i: i, uid="numbers", records_per_second=50)
        numbers.filter(lambda _n: False, uid="none").print(uid="sink")
    """
)


class Reports:
    """The TaskManager's reporter, as a list the test polls."""

    def __init__(self) -> None:
        self.items: list[Report] = []
        self._cond = threading.Condition()

    def put(self, report: Report) -> None:
        with self._cond:
            self.items.append(report)
            self._cond.notify_all()

    def states(self, task: TaskAddress) -> list[tuple[TaskState, str]]:
        with self._cond:
            return [
                (task_state_from_proto(r.request.state), r.request.failure.message)
                for r in self.items
                if isinstance(r, StateReport)
                and r.request.task.vertex_uid == task.vertex_uid
                and r.request.attempt == task.attempt
            ]

    def wait_for(self, task: TaskAddress, state: TaskState) -> str:
        deadline = time.monotonic() + WITHIN_S
        with self._cond:
            while time.monotonic() < deadline:
                for seen, message in self.states(task):
                    if seen is state:
                        return message
                self._cond.wait(0.5)
        raise AssertionError(f"{task} never reported {state}; reported {self.states(task)}")


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WITHIN_S:g} s: {what}")
        time.sleep(0.05)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What the workers inherit: file checkpoints and a run directory of the test's own."""
    monkeypatch.setenv("WEIR_CHECKPOINT_DIR", f"file://{tmp_path / 'checkpoints'}")
    monkeypatch.setenv("WEIR_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("WEIR_LOG_LEVEL", "WARNING")
    return tmp_path


@pytest.fixture
def slots(env: Path) -> Iterator[tuple[SlotProcesses, Reports]]:
    reports = Reports()
    workers = SlotProcesses("tm-test", "127.0.0.1:1", env / "run" / "tm-test", 2, reports, security=TransportSecurity())
    yield workers, reports
    workers.stop()


def deploy_request(task: TaskAddress, source: str = JOB, vertex: str = "numbers") -> taskmanager_pb2.DeployTaskRequest:
    return taskmanager_pb2.DeployTaskRequest(
        task=common_pb2.TaskRef(job_id=task.job_id, vertex_uid=vertex, subtask=task.subtask),
        attempt=task.attempt,
        job_name="slot test",
        job_source=source.encode(),
        job_file_name="slot_job.py",
        parallelism=1,
        checkpointing_mode=checkpointing_mode_to_proto(CheckpointingMode.EXACTLY_ONCE),
    )


def test_spares_start_ahead_one_per_slot(slots: tuple[SlotProcesses, Reports]) -> None:
    workers, _ = slots
    wait_until(lambda: workers.ready_workers() == 2, "two workers ready")
    assert len(workers.worker_pids()) == 2 and os.getpid() not in workers.worker_pids()


def test_a_worker_killed_under_its_task_fails_the_task_and_is_replaced(
    slots: tuple[SlotProcesses, Reports],
) -> None:
    workers, reports = slots
    task = TaskAddress("job-a", "numbers", 0, 1)
    workers.deploy(deploy_request(task))
    reports.wait_for(task, TaskState.RUNNING)
    (progress,) = workers.progress()
    assert (progress.task.vertex_uid, progress.attempt) == ("numbers", 1)
    victim = workers.pid_of(task)
    assert victim is not None and victim != os.getpid()
    os.kill(victim, signal.SIGKILL)
    message = reports.wait_for(task, TaskState.FAILED)
    assert f"pid {victim}" in message and "SIGKILL" in message
    wait_until(lambda: len(workers.worker_pids()) == 2 and victim not in workers.worker_pids(), "a new spare")
    assert workers.progress() == []
    assert not workers.trigger_checkpoint(
        taskmanager_pb2.TriggerCheckpointRequest(task=deploy_request(task).task, attempt=1, checkpoint_id=1)
    ), "the task is gone with its worker"


def test_a_redeployed_attempt_runs_in_the_slots_warm_worker(slots: tuple[SlotProcesses, Reports]) -> None:
    workers, reports = slots
    first, second = TaskAddress("job-b", "numbers", 0, 1), TaskAddress("job-b", "numbers", 0, 2)
    workers.deploy(deploy_request(first))
    reports.wait_for(first, TaskState.RUNNING)
    pid = workers.pid_of(first)
    workers.cancel_attempts_through("job-b", 1)
    reports.wait_for(first, TaskState.CANCELED)
    workers.deploy(deploy_request(second))
    reports.wait_for(second, TaskState.RUNNING)
    assert workers.pid_of(second) == pid, "the fail-over reused the slot's process"


def test_the_end_of_a_job_retires_its_workers_and_frees_the_slot(slots: tuple[SlotProcesses, Reports]) -> None:
    workers, reports = slots
    task = TaskAddress("job-c", "numbers", 0, 1)
    workers.deploy(deploy_request(task))
    reports.wait_for(task, TaskState.RUNNING)
    pid = workers.pid_of(task)
    assert pid is not None
    workers.cancel_attempts_through("job-c", 1, job_ended=True)
    assert not pid_alive(pid)
    assert [s for s, _ in reports.states(task)] == [TaskState.RUNNING, TaskState.CANCELED], "no FAILED: retired"
    wait_until(lambda: len(workers.worker_pids()) == 2, "a spare in its place")


def test_a_refused_deployment_keeps_its_meaning(slots: tuple[SlotProcesses, Reports]) -> None:
    workers, _ = slots
    with pytest.raises(JobDefinitionError):
        workers.deploy(deploy_request(TaskAddress("job-d", "numbers", 0, 1), source="def build(:\n"))
    with pytest.raises(SlotWorkerError, match="^KeyError: 'nowhere'"):
        workers.deploy(deploy_request(TaskAddress("job-d", "nowhere", 0, 1), vertex="nowhere"))


PARENT = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path
    from weir.core.transport_security import TransportSecurity
    from weir.taskmanager.slot_processes import SlotProcesses

    workers = SlotProcesses("tm-parent", "127.0.0.1:1", Path(sys.argv[1]), 1, None, security=TransportSecurity())
    while not workers.ready_workers():
        time.sleep(0.05)
    print("worker-pid", workers.worker_pids()[0], flush=True)
    sys.stdin.readline()
    """
)


def test_a_worker_exits_when_its_taskmanager_is_killed(env: Path) -> None:
    """SIGKILL leaves the TaskManager no chance to stop its workers: the kernel's parent-death signal
    and the end of the control link must."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(env / "run" / "tm-parent")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        line = ""
        while not line.startswith("worker-pid "):  # past the parent's own log lines
            line = parent.stdout.readline()
            assert line, "the parent ended before its worker was ready"
        worker = int(line.split()[1])
        assert pid_alive(worker)
    finally:
        parent.kill()
        parent.wait(10)
    wait_until(lambda: not pid_alive(worker), f"worker {worker} gone after its TaskManager")


def _open_sockets() -> int:
    """The sockets this process holds open (a descriptor closed while listed is not one)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue
    return count


def test_a_worker_that_cannot_start_fails_its_deployment_and_keeps_no_socket(env: Path) -> None:
    """A worker whose interpreter cannot be run: the deployment fails naming why, and the TaskManager's
    end of each would-be worker's control link is closed (a TaskManager that keeps failing to start
    workers must not run out of descriptors)."""
    before = _open_sockets()
    workers = SlotProcesses(
        "tm-broken",
        "127.0.0.1:1",
        env / "run" / "tm-broken",
        1,
        Reports(),
        security=TransportSecurity(),
        python=str(env / "no-such-python"),
    )
    try:
        task = TaskAddress("job-broken", "numbers", 0, 1)
        with pytest.raises(SlotWorkerError, match="could not start"):
            workers.deploy(deploy_request(task))
        assert workers.worker_pids() == []
        assert _open_sockets() == before
    finally:
        workers.stop()


def test_a_thread_dump_collects_every_workers_threads_with_the_running_task(
    slots: tuple[SlotProcesses, Reports],
) -> None:
    workers, reports = slots
    task = TaskAddress("job-dump", "numbers", 0, 1)
    workers.deploy(deploy_request(task))
    reports.wait_for(task, TaskState.RUNNING)
    wait_until(lambda: workers.ready_workers() == 2, "two workers ready")
    dump = workers.thread_dump()
    prefixes = {t.name.split("/", 1)[0] for t in dump}
    assert len(prefixes) == 2 and all(p.startswith("slot-worker-") for p in prefixes), prefixes
    assert all(t.stack.startswith(f'"{t.name.split("/", 1)[1]}" Id=') for t in dump)
    assert sum(1 for t in dump if t.name.endswith("/MainThread")) == 2
    assert any("\tat " in t.stack and "weir/taskmanager" in t.stack for t in dump), "a task thread's frames"


def test_a_restricted_metrics_collection_brings_only_the_series_named(slots: tuple[SlotProcesses, Reports]) -> None:
    """What ``/metrics?name[]=`` asks of the workers: their task series of those names, nothing else."""
    workers, reports = slots
    task = TaskAddress("job-metrics", "numbers", 0, 1)
    workers.deploy(deploy_request(task))
    reports.wait_for(task, TaskState.RUNNING)
    names = frozenset({"weir_source_records_read_total"})

    def records_read() -> list[tuple[str, dict[str, str], float]]:
        return [(s.name, s.labels, s.value) for f in workers.collect_metrics(names) for s in f.samples]

    wait_until(
        lambda: any(labels.get("job_id") == "job-metrics" and value > 0 for _, labels, value in records_read()),
        "the source's records read among the workers' series",
    )
    assert {name for name, _, _ in records_read()} == {"weir_source_records_read_total"}
    everything = {f.name for f in workers.collect_metrics()}
    assert {"weir_source_records_read", "weir_busy_seconds", "weir_idle_seconds"} <= everything

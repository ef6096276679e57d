"""Factory fixtures for the JobManager's parts: a fake TaskManager gateway, a fake clock, work run
inline instead of on worker threads, storage in a local directory."""

from __future__ import annotations

import textwrap
from collections import deque
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import grpc
import pytest

from weir.api import load_job_source
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.errors import Fault
from weir.core.failures import Failure
from weir.core.ids import TaskId
from weir.core.log_files import LogFileInfo, LogSelector
from weir.core.states import JobStatus, TaskState
from weir.core.thread_dump import ThreadInfo
from weir.graph import LogicalGraph
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.ending import ResolutionReport
from weir.jobmanager.errors import TaskManagerCallError
from weir.jobmanager.jobs import JobMaster, JobSubmission, TaskDeployment
from weir.jobmanager.manager import JobManager
from weir.jobmanager.messages import TaskStateReport
from weir.jobmanager.scheduler import SlotOffer
from weir.jobmanager.service import JobManagerServicer
from weir.tools.client import JobManagerClient
from weir.wire import jobmanager_pb2_grpc

P = ParamSpec("P")
R = TypeVar("R")

JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_generator(lambda i: i, uid="gen", count=100, parallelism=1).print(uid="out")
    """
).encode()
TM_A = "tm-a:6124"
TM_B = "tm-b:6124"


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class InlineExecutor(Executor):
    """Runs submitted work at once on the caller's thread: a test sees its effects on return. A test
    can ``hold`` the calls of one name (a slow metadata write: ``_persist``); they wait, in order,
    until ``release``, while everything else still runs at once (as on a pool of threads)."""

    def __init__(self) -> None:
        self._held_name: str | None = None
        self._held: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = deque()

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        future: Future[R] = Future()
        if self._held_name is not None and getattr(fn, "__name__", "") == self._held_name:
            self._held.append((future, fn, args, kwargs))
            return future
        self._run(future, fn, args, kwargs)
        return future

    @staticmethod
    def _run(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the future, as a pool would
            future.set_exception(exc)

    def hold(self, name: str) -> None:
        self._held_name = name

    @property
    def held(self) -> tuple[tuple[Any, ...], ...]:
        """The arguments of the calls held so far, in order."""
        return tuple(args for _future, _fn, args, _kwargs in self._held)

    def release(self) -> None:
        """Run what was held, in order; calls of that name run at once from now on."""
        self._held_name = None
        while self._held:
            self._run(*self._held.popleft())


@dataclass
class FakeGateway:
    """Records every call; addresses in ``unreachable`` fail the probe, ``failing`` fail calls."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    unreachable: set[str] = field(default_factory=set)
    failing: dict[str, str] = field(default_factory=dict)  # address -> gRPC status name
    accept_triggers: bool = True
    aligned_triggers: list[int] = field(default_factory=list)  # checkpoints triggered forced aligned
    full_triggers: list[int] = field(default_factory=list)  # checkpoint ids whose trigger said full

    def _fail(self, address: str) -> None:
        if address in self.failing:
            raise TaskManagerCallError(address, self.failing[address], "injected")

    def named(self, what: str) -> list[tuple[Any, ...]]:
        return [c[1:] for c in self.calls if c[0] == what]

    def connect(self, address: str) -> None:
        self.calls.append(("connect", address))

    def thread_dump(self, address: str) -> tuple[ThreadInfo, ...]:
        self._fail(address)
        self.calls.append(("thread_dump", address))
        return (ThreadInfo("MainThread", f'"MainThread" Id=1 RUNNABLE\n\tat serve({address}:1)\n'),)

    def list_logs(self, address: str) -> tuple[LogFileInfo, ...]:
        self._fail(address)
        self.calls.append(("list_logs", address))
        return (LogFileInfo(f"{address.split(':')[0]}.log", 11, 1_700_000_000.5),)

    def read_log(self, address: str, selector: LogSelector, name: str = "") -> Iterator[bytes]:
        self._fail(address)
        self.calls.append(("read_log", address, selector, name))
        if selector is LogSelector.STDOUT or (selector is LogSelector.NAMED and name != f"{address.split(':')[0]}.log"):
            raise TaskManagerCallError(address, "NOT_FOUND", "the TaskManager has no such log file")
        return iter([b"line 1\n", b"line 2\n"])

    def reachable(self, address: str, timeout_s: float) -> bool:
        return address not in self.unreachable

    def deploy_task(self, address: str, deployment: TaskDeployment) -> None:
        self._fail(address)
        self.calls.append(("deploy", address, deployment.vertex_uid, deployment.subtask, deployment.attempt))

    def cancel_job_tasks(self, address: str, job_id: str, attempt: int, *, job_ended: bool) -> None:
        self._fail(address)
        self.calls.append(("cancel", address, job_id, attempt, job_ended))

    def trigger_checkpoint(
        self,
        address: str,
        task: TaskId,
        attempt: int,
        checkpoint_id: int,
        timestamp: float,
        kind: CheckpointKind,
        *,
        final: bool,
        drain: bool = False,
        aligned: bool = False,
        full: bool = False,
    ) -> bool:
        self._fail(address)
        if aligned:
            self.aligned_triggers.append(checkpoint_id)
        self.calls.append(("trigger", address, str(task), attempt, checkpoint_id, kind, final))
        if full:
            self.full_triggers.append(checkpoint_id)
        return self.accept_triggers

    def notify_checkpoint_complete(self, address: str, job_id: str, attempt: int, checkpoint_id: int) -> None:
        self._fail(address)
        self.calls.append(("complete", address, job_id, attempt, checkpoint_id))

    def notify_checkpoint_aborted(
        self, address: str, job_id: str, attempt: int, checkpoint_id: int, reason: str
    ) -> None:
        self._fail(address)
        self.calls.append(("aborted", address, job_id, attempt, checkpoint_id))


@dataclass
class FakeResolver:
    """Resolves an ended job's transactions, or raises ``error`` while it is set."""

    resolved: list[tuple[str, int]] = field(default_factory=list)
    error: Exception | None = None
    as_of: list[int | None] = field(default_factory=list)  # the checkpoint of every resolution tried

    outcomes: list[JobStatus] = field(default_factory=list)  # how the job ended, each resolution tried

    def __call__(
        self, job: JobMaster, attempt: int, latest: CompletedCheckpoint | None, outcome: JobStatus
    ) -> ResolutionReport:
        self.as_of.append(latest.checkpoint_id if latest is not None else None)
        self.outcomes.append(outcome)
        if self.error is not None:
            raise self.error
        self.resolved.append((job.job_id, attempt))
        return ResolutionReport(sink_subtasks=0)


@dataclass
class Harness:
    jm: JobManager
    gateway: FakeGateway
    clock: FakeClock
    storage: FileCheckpointStorage
    resolver: FakeResolver
    checked: list[LogicalGraph]
    end_offsets: dict[str, dict[int, int]]
    io: InlineExecutor

    def job(self, parameters: dict[str, str] | None = None, job_id: str = "job-1") -> JobMaster:
        """A job placed on tm-a (attempt 1), as if its deployment went out."""
        params = parameters or {"restart.strategy": "fixed-delay", "restart.delay": "1s"}
        loaded = load_job_source(JOB, "j.py", params, parallelism=1)
        submission = JobSubmission(job_id, "j", "j.py", JOB, params, 1, 0.0)
        job = JobMaster.create(submission, loaded, self.jm.paths.metadata_key_fn())
        self.jm.jobs[job_id] = job
        _command, actions = job.schedule([SlotOffer("tm-a", 4)], {"tm-a": TM_A}, self.clock())
        with self.jm.lock:
            self.jm.executor.execute(job, actions)
        return job

    def finish(self, job: JobMaster) -> None:
        """Every task of the job reports FINISHED (after its final checkpoint)."""
        for vertex, subtask in list(job.tasks):
            self.jm.report_task_state(
                TaskStateReport(job.job_id, vertex, subtask, job.attempt, TaskState.FINISHED, None, 0, 0, False)
            )

    def fail(self, job: JobMaster, message: str = "boom", *, retriable: bool = False) -> None:
        """The job's task failed (not retriable by default: the restart strategy gives up, the job FAILS)."""
        failure = Failure("RuntimeError", message, Fault.INTERNAL, retriable)
        with self.jm.lock:
            self.jm.failover.fail_over(job, failure, self.clock())


MakeHarness = Callable[..., Harness]


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[MakeHarness]:
    made: list[JobManager] = []

    def make(
        storage: FileCheckpointStorage | None = None,
        *,
        taskmanagers: tuple[str, ...] = ("tm-a",),
        leader_term: Callable[[], int | None] | None = None,
    ) -> Harness:
        storage = storage or FileCheckpointStorage(tmp_path / "storage")
        gateway = FakeGateway()
        clock = FakeClock()
        resolver = FakeResolver()
        checked: list[LogicalGraph] = []
        end_offsets: dict[str, dict[int, int]] = {}
        io = InlineExecutor()
        jm = JobManager(
            storage,
            clock,
            gateway=gateway,
            read_end_offsets=lambda cluster, topic: end_offsets[topic],
            check=lambda graph, settings, allowance, parameters: checked.append(graph),
            resolve=resolver,
            io=io,
            leader_term=leader_term,
        )
        made.append(jm)
        if leader_term is not None and (term := leader_term()) is not None:
            jm.records.take_over_index(term)  # as the leader's takeover does first, before it serves
        for tm in taskmanagers:
            jm.register_taskmanager(tm, f"{tm}:6124", 4, 0, incarnation="first")
        return Harness(jm, gateway, clock, storage, resolver, checked, end_offsets, io)

    yield make
    for jm in made:
        jm.stop()


@pytest.fixture
def harness(make_harness: MakeHarness) -> Harness:
    return make_harness()


@contextmanager
def served(jm: JobManager) -> Iterator[JobManagerClient]:
    """``jm``'s servicer on a real gRPC server on a free local port, and a client of it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    jobmanager_pb2_grpc.add_JobManagerServiceServicer_to_server(JobManagerServicer(jm), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with JobManagerClient(f"127.0.0.1:{port}") as client:
            yield client
    finally:
        server.stop(None)

"""A TaskManager's slots as worker processes: each slot's tasks run in a process of their own, so a
TaskManager with N slots uses N cores (one Python process is one core, its interpreter lock).

The TaskManager process keeps what the JobManager talks to: its registration, its heartbeats, its
gRPC service and its data-plane address. :class:`SlotProcesses` runs one slot worker
(``python -m weir.taskmanager.slot_worker``) per slot, started ahead as spares, and supervises them:

- **Placement** (``slot_table``): a job slot's tasks go to the worker the slot has, else a spare;
  two jobs never share a worker. A job's workers are retired when the job is over here, and spares
  are started again so that one waits per free slot.
- **Control**: deploy, cancel, trigger and notify calls go to the worker running the task, over the
  worker's control link (``slot_link``); the workers' reports come back on it and go to the
  JobManager through the TaskManager's one reporter, in order; a heartbeat collects every worker's
  task progress.
- **Data plane**: a worker serves its tasks' input gates on a Unix socket. A producer in another
  worker of this TaskManager dials that socket directly (the deployment's consumer address is
  resolved here to the consumer's worker); a producer on another TaskManager dials this
  TaskManager, which relays the stream's bytes to the consumer's worker (:meth:`open_channel`) without
  decoding them. Producer and consumer in one worker share memory, as before.
- **Failure**: a worker that exits (killed, crashed) takes its tasks down: the TaskManager reports
  each FAILED and the job fails over; a new spare is started. A worker exits when its TaskManager
  does (``slot_worker``: PR_SET_PDEATHSIG and the end of the control link), so none is left behind.
- **Metrics**: the TaskManager's ``/metrics`` merges its workers' families (``slot_metrics``).

This is Flink's TaskExecutor with its slots in processes of their own rather than threads: Python's
interpreter lock makes a thread no core.
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import grpc
import structlog
from prometheus_client.metrics_core import Metric

from weir.core.codec import failure_to_proto, task_state_from_proto, task_state_to_proto
from weir.core.errors import WeirError
from weir.core.failures import Failure
from weir.core.grpc_security import open_channel
from weir.core.states import TaskState
from weir.core.thread_dump import ThreadInfo
from weir.core.transport_security import TransportSecurity
from weir.taskmanager.network.server import consumer_of
from weir.taskmanager.reporter import ReportSink, StateReport, task_ref
from weir.taskmanager.slot_link import (
    CancelAttempts,
    CollectMetrics,
    CollectProgress,
    CollectThreadDump,
    ControlLink,
    Deploy,
    NotifyCheckpoint,
    Ready,
    Report,
    SlotWorkerError,
    StopWorker,
    TriggerCheckpoint,
    wait_reply,
)
from weir.taskmanager.slot_table import SlotKey, SlotTable, StartWorker, UseWorker, WorkerId, describe
from weir.taskmanager.task_host import UNIX_ADDRESS_PREFIX, security_for, task_address
from weir.taskmanager.task_types import TaskAddress
from weir.wire import jobmanager_pb2, taskmanager_pb2

log = structlog.get_logger("weir.taskmanager")

WORKER_MODULE: Final = "weir.taskmanager.slot_worker"
START_TIMEOUT_S: Final = 60.0
"""The longest a worker may take from its start to ready (imports, its data-plane server)."""
DEPLOY_CALL_TIMEOUT_S: Final = 25.0
"""Below the JobManager's deploy timeout (30 s), so the TaskManager answers first and says why."""
CANCEL_SLACK_S: Final = 5.0
CHECKPOINT_CALL_TIMEOUT_S: Final = 8.0
PROGRESS_WAIT_S: Final = 1.0
METRICS_WAIT_S: Final = 2.0
STOP_WAIT_S: Final = 15.0
EXIT_WAIT_S: Final = 5.0
FIRST_REAP_S: Final = 1.0
OPEN_CHANNEL_METHOD: Final = "/weir.wire.TaskManagerService/OpenChannel"
MAX_UNIX_SOCKET_PATH: Final = 100  # sun_path holds 108 bytes


@dataclass(eq=False)
class WorkerProcess:
    """One slot worker as the TaskManager sees it."""

    id: WorkerId
    process: subprocess.Popen[bytes]
    link: ControlLink
    started_for: SlotKey | None
    ready: Future[WorkerProcess] = field(default_factory=Future)
    data_address: str = ""
    retiring: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid


def describe_exit(returncode: int | None) -> str:
    """``exited with code 3``, ``was killed by SIGKILL``, ``is still running``."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def socket_directory(taskmanager_dir: Path) -> Path:
    """Where the workers' Unix sockets go: ``<taskmanager dir>/slots``, or a private directory under
    the system's temporary one when that path is too long for a socket's name."""
    directory = taskmanager_dir / "slots"
    if len(str(directory / "worker-1000.sock")) <= MAX_UNIX_SOCKET_PATH:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, mode=0o700)
        return directory
    return Path(tempfile.mkdtemp(prefix="weir-slots-"))


class SlotProcesses:
    """The slot workers of one TaskManager; see the module. The same calls as a
    :class:`~weir.taskmanager.task_host.TaskHost`, so the runtime drives either."""

    def __init__(
        self,
        taskmanager_id: str,
        address: str,
        taskmanager_dir: Path,
        slots: int,
        reports: ReportSink,
        *,
        security: TransportSecurity,
        local_channels: bool = True,
        python: str = sys.executable,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.id = taskmanager_id
        self.address = address
        self._reports = reports
        self._security = security
        self._local_channels = local_channels
        self._python = python
        self._start_timeout_s = start_timeout_s
        # The workers share jobs/<job>/ (one RocksDB per task attempt); this process owns it: cleared
        # at its start and per job once the job is over here.
        self._jobs_dir = taskmanager_dir / "jobs"
        shutil.rmtree(self._jobs_dir, ignore_errors=True)
        self._socket_dir = socket_directory(taskmanager_dir)
        self._table = SlotTable(slots)
        self._lock = threading.RLock()
        self._workers: dict[WorkerId, WorkerProcess] = {}  # started, ready or not, until gone
        self._starting: dict[WorkerId, SlotKey | None] = {}  # queued or launched, not ready yet
        self._changed = threading.Condition(self._lock)  # a worker got ready or went
        self._pending: dict[SlotKey, Future[WorkerProcess]] = {}
        self._ids = itertools.count(1)
        self._data_channels: dict[WorkerId, grpc.Channel] = {}
        self._stopping = threading.Event()
        self._start_futures: dict[WorkerId, Future[WorkerProcess]] = {}
        # Every worker is started from this one thread: PR_SET_PDEATHSIG fires when the thread that
        # started a process ends, so that thread must live as long as the TaskManager.
        self._spawns: queue.SimpleQueue[tuple[WorkerId, SlotKey | None] | None] = queue.SimpleQueue()
        self._spawner = threading.Thread(target=self._spawn_loop, name="slot-spawner", daemon=True)
        self._spawner.start()
        self._fill_spares()

    # Workers: start, ready, gone ---------------------------------------------------------------------

    def _fill_spares(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            for _ in range(self._table.spares_wanted(len(self._starting))):
                self._start(None)

    def _start(self, key: SlotKey | None) -> Future[WorkerProcess]:
        """Queue a worker's start (called with the lock held); the future holds it once it is ready."""
        worker = WorkerId(next(self._ids))
        self._starting[worker] = key
        future: Future[WorkerProcess] = Future()
        self._start_futures[worker] = future
        self._spawns.put((worker, key))
        return future

    def _spawn_loop(self) -> None:
        while True:
            item = self._spawns.get()
            if item is None:
                return
            worker, key = item
            with self._lock:
                future = self._start_futures.pop(worker)
            if self._stopping.is_set():
                future.set_exception(SlotWorkerError(f"TaskManager {self.id} is stopping"))
                continue
            try:
                process = self._launch(worker, key)
            except OSError as exc:
                with self._lock:
                    self._starting.pop(worker, None)
                    self._changed.notify_all()
                log.error("slot_worker_start_failed", taskmanager_id=self.id, worker=worker, error=str(exc))
                future.set_exception(SlotWorkerError(f"slot worker {worker} of {self.id} could not start: {exc}"))
                continue
            process.ready.add_done_callback(partial(_pass_on, to=future))
            threading.Thread(
                target=self._watch_start, args=(process,), name=f"slot-start-{worker}", daemon=True
            ).start()

    def _launch(self, worker: WorkerId, key: SlotKey | None) -> WorkerProcess:
        ours, theirs = socket.socketpair()
        argv = [
            self._python,
            "-m",
            WORKER_MODULE,
            "--taskmanager-id",
            self.id,
            "--worker",
            str(worker),
            "--parent-pid",
            str(os.getpid()),
            "--control-fd",
            str(theirs.fileno()),
            "--socket",
            str(self._socket_dir / f"worker-{worker}.sock"),
            "--local-channels" if self._local_channels else "--no-local-channels",
        ]
        try:
            popen = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        link = ControlLink(Connection(ours.detach()), f"slot worker {worker} (pid {popen.pid}) of {self.id}")
        process = WorkerProcess(worker, popen, link, key)
        with self._lock:
            self._workers[worker] = process
        log.info("slot_worker_started", taskmanager_id=self.id, worker=worker, pid=popen.pid, slot=_key_text(key))
        threading.Thread(
            target=link.serve,
            args=(lambda message: self._on_message(process, message), lambda why: self._on_closed(process, why)),
            name=f"slot-link-{worker}",
            daemon=True,
        ).start()
        return process

    def _watch_start(self, process: WorkerProcess) -> None:
        """A worker not ready in time is killed (its link's end then fails its start)."""
        try:
            process.ready.result(self._start_timeout_s)
        except SlotWorkerError:
            return
        except TimeoutError:
            log.error("slot_worker_not_ready", taskmanager_id=self.id, worker=process.id, pid=process.pid)
            process.process.kill()

    def _on_message(self, process: WorkerProcess, message: object) -> None:
        match message:
            case Ready(data_address=data_address):
                process.data_address = data_address
                with self._lock:
                    self._starting.pop(process.id, None)
                    self._table.add_spare(process.id)
                    key = process.started_for
                    if key is not None and self._table.worker_of_key(key) is None:
                        self._table.bind(process.id, key)
                    self._changed.notify_all()
                log.info(
                    "slot_worker_ready",
                    taskmanager_id=self.id,
                    worker=process.id,
                    pid=process.pid,
                    data_address=data_address,
                )
                process.ready.set_result(process)
            case Report(report=report):
                if isinstance(report, StateReport):
                    self._track(report.request)
                self._reports.put(report)
            case _:
                log.warning("slot_link_message_unknown", taskmanager_id=self.id, type=type(message).__name__)

    def _track(self, request: jobmanager_pb2.ReportTaskStateRequest) -> None:
        """A task's state as its worker reports it: an ended task leaves the table; the job's last
        task here finishing ends the job here (its workers retire)."""
        state = task_state_from_proto(request.state)
        if not state.terminal:
            return
        task = TaskAddress(request.task.job_id, request.task.vertex_uid, request.task.subtask, request.attempt)
        with self._lock:
            self._table.task_ended(task)
            job_done = state is TaskState.FINISHED and not self._table.job_has_tasks(task.job_id)
        if job_done:
            threading.Thread(target=self._end_job, args=(task.job_id,), name="slot-job-end", daemon=True).start()

    def _on_closed(self, process: WorkerProcess, why: str) -> None:
        """The worker's link ended: it exited. Its tasks still running failed with it."""
        with self._lock:
            expected = process.retiring or self._stopping.is_set()
            lost = self._table.remove(process.id)
            self._workers.pop(process.id, None)
            self._starting.pop(process.id, None)
            channel = self._data_channels.pop(process.id, None)
            self._changed.notify_all()
        if channel is not None:
            channel.close()
        # Its link ended because it exited: the exit status is there at once (a short wait names it,
        # its tasks' failures must not wait for more).
        returncode = _reap(process.process, FIRST_REAP_S)
        if not process.ready.done():
            process.ready.set_exception(
                SlotWorkerError(
                    f"slot worker {process.id} of {self.id} {describe_exit(returncode)} before it was ready"
                )
            )
        how = describe_exit(returncode)
        if expected:
            log.info("slot_worker_exited", taskmanager_id=self.id, worker=process.id, pid=process.pid, exit=how)
        else:
            log.error(
                "slot_worker_died",
                taskmanager_id=self.id,
                worker=process.id,
                pid=process.pid,
                exit=how,
                tasks=[str(t) for t in lost],
            )
        for task in lost:
            failure = Failure.internal(
                f"the slot worker process (pid {process.pid}) of TaskManager {self.id} running task {task} {how}",
                type_name="SlotWorkerLost",
            )
            request = jobmanager_pb2.ReportTaskStateRequest(
                task=task_ref(task), state=task_state_to_proto(TaskState.FAILED), attempt=task.attempt
            )
            request.failure.CopyFrom(failure_to_proto(failure))
            self._reports.put(StateReport(request))
        if returncode is None and _reap(process.process, EXIT_WAIT_S) is None:
            process.process.kill()  # its link is gone, so it is of no use: it must not linger
            _reap(process.process, EXIT_WAIT_S)
        self._fill_spares()

    def _retire(self, process: WorkerProcess) -> None:
        """Stop a worker on purpose (its job is over here, or its slot is wanted for another job)."""
        with self._lock:
            process.retiring = True
            self._table.remove(process.id)
        log.info("slot_worker_retiring", taskmanager_id=self.id, worker=process.id, pid=process.pid)
        try:
            process.link.call(StopWorker(), STOP_WAIT_S)
        except SlotWorkerError as exc:
            log.warning("slot_worker_stop_unanswered", taskmanager_id=self.id, worker=process.id, error=str(exc))
        if _reap(process.process, EXIT_WAIT_S) is None:
            process.process.kill()

    def _end_job(self, job_id: str) -> None:
        """The job is over here: retire its workers, then delete its directory under ``jobs/``."""
        with self._lock:
            workers = [self._workers[w] for w in self._table.job_over(job_id) if w in self._workers]
        for process in workers:
            self._retire(process)
        with self._lock:
            busy = self._table.job_has_tasks(job_id)
        if not busy:
            shutil.rmtree(self._jobs_dir / job_id, ignore_errors=True)
            log.info("job_forgotten", job_id=job_id, taskmanager_id=self.id, workers_retired=len(workers))

    # Placement ----------------------------------------------------------------------------------------

    def _worker_for(self, key: SlotKey) -> WorkerProcess:
        """The ready worker the key's tasks run in: placed by the table, started when none can take it."""
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            retire: WorkerProcess | None = None
            with self._lock:
                if self._stopping.is_set():
                    raise SlotWorkerError(f"TaskManager {self.id} is stopping")
                placement = self._table.place(key)
                match placement:
                    case UseWorker(worker=worker):
                        return self._workers[worker]
                    case StartWorker(retire=retiring):
                        if any(for_key is None for for_key in self._starting.values()):
                            # A spare is on its way (the TaskManager just started, or replaces one):
                            # take it rather than start one more than there are slots.
                            self._changed.wait(max(0.0, deadline - time.monotonic()))
                            if time.monotonic() >= deadline:
                                raise SlotWorkerError(f"no slot worker of {self.id} ready for {_key_text(key)} in time")
                            continue
                        future = self._pending.get(key)
                        if future is None:
                            log.info("slot_placed", taskmanager_id=self.id, slot=_key_text(key), on=describe(placement))
                            future = self._start(key)
                            self._pending[key] = future
                            future.add_done_callback(partial(self._pending_done, key))
                            if retiring is not None:
                                retire = self._workers.get(retiring)
            if retire is not None:
                self._retire(retire)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SlotWorkerError(f"no slot worker of {self.id} ready for {_key_text(key)} in time")
            wait_reply(future, remaining, f"starting a slot worker of {self.id} for {_key_text(key)}")

    def _pending_done(self, key: SlotKey, _done: Future[WorkerProcess]) -> None:
        with self._lock:
            self._pending.pop(key, None)

    def _ready_workers(self) -> list[WorkerProcess]:
        with self._lock:
            return [self._workers[w] for w in self._table.workers() if w in self._workers]

    def pid_of(self, task: TaskAddress) -> int | None:
        """The pid of the worker running ``task`` (None: no worker here runs it)."""
        with self._lock:
            worker = self._table.worker_of(task)
            process = self._workers.get(worker) if worker is not None else None
            return process.pid if process is not None else None

    def ready_workers(self) -> int:
        with self._lock:
            return len(self._table.workers())

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._workers.values()]

    # The TaskManager's calls -------------------------------------------------------------------------

    def deploy(self, req: taskmanager_pb2.DeployTaskRequest) -> None:
        """Deploy into the task's slot worker, each consumer in this TaskManager addressed at its own
        worker's socket (the same worker: in memory)."""
        task = task_address(req)
        process = self._worker_for(SlotKey.of(task))
        resolved = taskmanager_pb2.DeployTaskRequest()
        resolved.CopyFrom(req)
        for spec in resolved.outputs:
            if spec.consumer_address == self.address:
                consumer = self._worker_for(SlotKey(spec.consumer.job_id, spec.consumer.subtask))
                spec.consumer_address = consumer.data_address
        with self._lock:
            self._table.task_deployed(process.id, task)
        try:
            process.link.call(Deploy(resolved.SerializeToString()), DEPLOY_CALL_TIMEOUT_S)
        except WeirError:
            with self._lock:
                self._table.task_ended(task)
            raise

    def cancel_attempts_through(
        self, job_id: str, attempt: int, *, job_ended: bool = False, wait_s: float = 10.0
    ) -> None:
        self._cancel(CancelAttempts(job_id, attempt, through=True, job_ended=job_ended), wait_s)
        if job_ended:
            self._end_job(job_id)

    def cancel_attempt(self, job_id: str, attempt: int, wait_s: float = 10.0) -> None:
        self._cancel(CancelAttempts(job_id, attempt, through=False), wait_s)

    def _cancel(self, command: CancelAttempts, wait_s: float) -> None:
        with self._lock:
            workers = [self._workers[w] for w in self._table.workers_of_job(command.job_id) if w in self._workers]
        calls = [(p, p.link.call_async(command)) for p in workers]
        for process, call in calls:
            try:
                wait_reply(call, wait_s + CANCEL_SLACK_S, f"cancelling in slot worker {process.id}")
            except SlotWorkerError as exc:
                log.warning("slot_worker_cancel_failed", taskmanager_id=self.id, job_id=command.job_id, error=str(exc))

    def trigger_checkpoint(self, req: taskmanager_pb2.TriggerCheckpointRequest) -> bool:
        task = TaskAddress(req.task.job_id, req.task.vertex_uid, req.task.subtask, req.attempt)
        with self._lock:
            worker = self._table.worker_of(task)
            process = self._workers.get(worker) if worker is not None else None
        if process is None:
            return False
        try:
            return bool(process.link.call(TriggerCheckpoint(req.SerializeToString()), CHECKPOINT_CALL_TIMEOUT_S))
        except SlotWorkerError as exc:
            log.warning("slot_worker_trigger_failed", taskmanager_id=self.id, task=str(task), error=str(exc))
            return False

    def notify_checkpoint(self, job_id: str, attempt: int, checkpoint_id: int, complete: bool) -> None:
        with self._lock:
            workers = [self._workers[w] for w in self._table.workers_of_job(job_id) if w in self._workers]
        for process in workers:  # in order on each link; the reply is not waited for
            process.link.call_async(NotifyCheckpoint(job_id, attempt, checkpoint_id, complete))

    def progress(self) -> list[jobmanager_pb2.TaskProgress]:
        calls = [(p, p.link.call_async(CollectProgress())) for p in self._ready_workers()]
        deadline = time.monotonic() + PROGRESS_WAIT_S
        entries: list[jobmanager_pb2.TaskProgress] = []
        for process, call in calls:
            try:
                blobs = wait_reply(call, max(0.0, deadline - time.monotonic()), f"progress of slot worker {process.id}")
            except SlotWorkerError:
                continue  # this heartbeat goes without its tasks; the next one has them
            entries.extend(jobmanager_pb2.TaskProgress.FromString(b) for b in blobs)
        return entries

    def collect_metrics(self, names: frozenset[str] | None = None) -> list[Metric]:
        """Every ready worker's metric families, with ``names`` only their samples of these names (a
        worker that does not answer in time is left out)."""
        calls = [(p, p.link.call_async(CollectMetrics(names))) for p in self._ready_workers()]
        deadline = time.monotonic() + METRICS_WAIT_S
        families: list[Metric] = []
        for process, call in calls:
            try:
                families.extend(
                    wait_reply(call, max(0.0, deadline - time.monotonic()), f"metrics of slot worker {process.id}")
                )
            except SlotWorkerError:
                continue
        return families

    def thread_dump(self) -> list[ThreadInfo]:
        """Every ready worker's threads, each name prefixed with its worker (one that does not answer in
        time is left out)."""
        calls = [(p, p.link.call_async(CollectThreadDump())) for p in self._ready_workers()]
        deadline = time.monotonic() + METRICS_WAIT_S
        threads: list[ThreadInfo] = []
        for process, call in calls:
            try:
                found = wait_reply(call, max(0.0, deadline - time.monotonic()), f"threads of slot worker {process.id}")
            except SlotWorkerError:
                continue
            threads.extend(ThreadInfo(f"slot-worker-{process.id}/{t.name}", t.stack) for t in found)
        return threads

    def stop(self) -> None:
        """Stop every worker (their tasks are cancelled, their acknowledgements sent), then the spawner."""
        self._stopping.set()
        with self._lock:
            workers = list(self._workers.values())
        calls = [(p, p.link.call_async(StopWorker())) for p in workers]
        for process, call in calls:
            try:
                wait_reply(call, STOP_WAIT_S, f"stopping slot worker {process.id}")
            except SlotWorkerError:
                pass
        for process in workers:
            if _reap(process.process, EXIT_WAIT_S) is None:
                process.process.kill()
                _reap(process.process, EXIT_WAIT_S)
        self._spawns.put(None)

    # Data plane: another TaskManager's producer -> this TaskManager -> the consumer's worker ----------

    def open_channel(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        """Relay one remote producer's ``OpenChannel`` stream to its consumer's worker: the first
        message names the consumer (read to route it); every message after it and every credit back
        pass through as bytes."""
        try:
            first = next(requests)
        except StopIteration:
            return
        header = taskmanager_pb2.DataMessage.FromString(first).header
        consumer = consumer_of(header)
        try:
            process = self._worker_for(SlotKey(consumer.job_id, consumer.subtask))
        except SlotWorkerError as exc:
            yield taskmanager_pb2.CreditMessage(error=f"no task {consumer} on {self.id}: {exc}").SerializeToString()
            return
        stream: Any = self._data_channel(process).stream_stream(OPEN_CHANNEL_METHOD)
        call: Any = stream(itertools.chain((first,), requests))
        context.add_callback(call.cancel)
        try:
            yield from call
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            if code is not grpc.StatusCode.CANCELLED:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"slot worker {process.id} of {self.id}: {code}")

    def _data_channel(self, process: WorkerProcess) -> grpc.Channel:
        with self._lock:
            channel = self._data_channels.get(process.id)
            if channel is None:
                address = process.data_address
                assert address.startswith(UNIX_ADDRESS_PREFIX), address
                channel = open_channel(address, security_for(address, self._security))
                self._data_channels[process.id] = channel
            return channel


def _pass_on(done: Future[WorkerProcess], to: Future[WorkerProcess]) -> None:
    exc = done.exception()
    if exc is not None:
        to.set_exception(exc)
    else:
        to.set_result(done.result())


def _reap(process: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _key_text(key: SlotKey | None) -> str:
    return "spare" if key is None else f"{key.job_id}#{key.subtask}"

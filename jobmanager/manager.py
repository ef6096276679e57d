"""``JobManager``: the parts of the JobManager composed for the servicer and ``python -m weir.jobmanager``.

One lock serialises the servicer's calls, the monitor thread and the workers handing outcomes back;
I/O (TaskManager calls, storage, Kafka, transaction resolution) runs on worker threads without it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.hardware import Hardware
from weir.core.ids import CheckpointId
from weir.core.log_files import LogFileInfo, LogSelector
from weir.core.paths import CheckpointPaths
from weir.core.states import JobStatus
from weir.core.thread_dump import ThreadInfo
from weir.jobmanager.deployment import Deployer
from weir.jobmanager.errors import JobManagerNotReadyError
from weir.jobmanager.exception_history import ExceptionHistory
from weir.jobmanager.failover import Failover
from weir.jobmanager.gateway import GrpcTaskManagerGateway, TaskManagerGateway
from weir.jobmanager.job_actions import JobActionExecutor, ResolveTransactions, resolve_job_transactions
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.lease import FencedStorage
from weir.jobmanager.messages import (
    CheckpointAck,
    CheckpointDecline,
    CheckpointDetailView,
    CheckpointsView,
    ClusterView,
    Heartbeat,
    HeartbeatAnswer,
    JobConfigView,
    JobPlanView,
    JobStatusView,
    JobSummaryView,
    TaskStateReport,
)
from weir.jobmanager.monitor import Monitor
from weir.jobmanager.read_api import ReadApi
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.recovery import JobRecovery
from weir.jobmanager.registry import RegisteredTaskManager, TaskManagerRegistry
from weir.jobmanager.rescale_requests import RescaleRequests
from weir.jobmanager.rescaling import ParallelismBounds, RescaleOperation
from weir.jobmanager.savepoints import SavepointTrigger
from weir.jobmanager.submission import (
    EndOffsetsReader,
    JobSubmitter,
    ResolveInherited,
    SubmitCheck,
    SubmitRequest,
    check_at_submit,
    kafka_end_offsets,
    resolve_inherited,
)
from weir.jobmanager.task_reports import TaskReports

log = structlog.get_logger("weir.jobmanager")

IO_WORKERS = 8


class JobManager:
    def __init__(
        self,
        storage: CheckpointStorage,
        clock: Callable[[], float] = time.time,
        *,
        gateway: TaskManagerGateway | None = None,
        read_end_offsets: EndOffsetsReader = kafka_end_offsets,
        check: SubmitCheck = check_at_submit,
        resolve: ResolveTransactions = resolve_job_transactions,
        resolve_inherited: ResolveInherited = resolve_inherited,
        io: Executor | None = None,
        leader_term: Callable[[], int | None] | None = None,
    ) -> None:
        """``gateway``, ``read_end_offsets``, ``check``, ``resolve`` and ``io`` (the worker threads)
        default to the real ones; tests pass fakes. ``leader_term``: under high availability, the term
        this JobManager leads in (its job records are then written conditionally, its checkpoint
        metadata names the term); None: no high availability."""
        self.lock = threading.RLock()
        self.jobs: dict[str, JobMaster] = {}
        self.storage = storage
        self.paths = CheckpointPaths()
        self._io = io if io is not None else ThreadPoolExecutor(max_workers=IO_WORKERS, thread_name_prefix="jm-io")
        self._stopping = threading.Event()
        self._recovered = threading.Event()  # recover_jobs is done: the JobManager answers for its jobs
        gateway = gateway if gateway is not None else GrpcTaskManagerGateway()
        self._gateway = gateway
        lock = self.lock
        self.registry = TaskManagerRegistry(self.jobs, gateway, clock, on_lost=self._taskmanager_lost)
        term: Callable[[], int | None] = leader_term if leader_term is not None else lambda: None
        self.records = JobRecordStore(
            storage,
            self.paths,
            clock,
            conditional=leader_term is not None,
            withdrawals=storage.unfenced if isinstance(storage, FencedStorage) else None,
        )
        self.executor = JobActionExecutor(
            self.registry, gateway, storage, self.records, self._io, lock, clock, resolve=resolve, leader_term=term
        )
        self.failover = Failover(self.jobs, self.registry, self.executor, lock, clock, gateway=gateway, io=self._io)
        self.deployer = Deployer(
            self.registry,
            gateway,
            self.failover,
            self.executor,
            self.records,
            self._io,
            lock,
            clock,
            storage.uri,
            storage=storage,
            resolve_redistributed=resolve_inherited,
        )
        self.submitter = JobSubmitter(
            self.jobs,
            self.deployer,
            self.paths,
            lock,
            clock,
            storage=storage,
            read_end_offsets=read_end_offsets,
            check=check,
            resolve_inherited=resolve_inherited,
            records=self.records if leader_term is not None else None,
        )
        self.reports = TaskReports(self.jobs, self.executor, self.failover, lock, clock)
        self.recovery = JobRecovery(
            self.jobs, self.records, storage, self.paths, self.executor, lock, clock, leader_term=term
        )
        self.savepoints = SavepointTrigger(self.jobs, self.executor, lock, clock)
        self.rescales = RescaleRequests(self.jobs, self.registry, self.executor, lock, clock, storage)
        self.reads = ReadApi(self.jobs, self.registry, lock, clock, storage.uri)
        self.monitor = Monitor(
            self.jobs,
            self.registry,
            self.failover,
            self.deployer,
            self.executor,
            self.records,
            lock,
            clock,
            rescales=self.rescales,
        )
        self._monitor_thread = threading.Thread(
            target=self.monitor.run, args=(self._stopping,), name="jm-monitor", daemon=True
        )
        self._history_thread = threading.Thread(target=self.recover_history, name="jm-history", daemon=True)

    def start(self) -> None:
        self._monitor_thread.start()
        self._history_thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._io.shutdown(wait=False, cancel_futures=True)

    @property
    def ready(self) -> bool:
        """Its jobs are recovered and it is not stopping: it answers for every job it has."""
        return self._recovered.is_set() and not self._stopping.is_set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def taskmanagers(self) -> dict[str, RegisteredTaskManager]:
        return self.registry.taskmanagers

    def _taskmanager_lost(self, tm: RegisteredTaskManager, why: str) -> None:
        self.failover.taskmanager_lost(tm, why)

    # TaskManager-facing ---------------------------------------------------------------------------

    def register_taskmanager(
        self,
        tm_id: str,
        address: str,
        slots: int,
        metrics_port: int,
        incarnation: str,
        *,
        hardware: Hardware | None = None,
    ) -> None:
        with self.lock:
            self.registry.register(tm_id, address, slots, metrics_port, incarnation, hardware=hardware)

    def heartbeat(self, heartbeat: Heartbeat) -> HeartbeatAnswer:
        with self.lock:
            return self.registry.heartbeat(heartbeat)

    def report_task_state(self, report: TaskStateReport) -> None:
        self.reports.task_state(report)

    def acknowledge_checkpoint(self, ack: CheckpointAck) -> None:
        self.reports.checkpoint_acknowledged(ack)

    def decline_checkpoint(self, decline: CheckpointDecline) -> None:
        self.reports.checkpoint_declined(decline)

    # Client-facing --------------------------------------------------------------------------------

    def submit(self, request: SubmitRequest) -> str:
        return self.submitter.submit(request)

    def cancel(self, job_id: str) -> JobStatus:
        self._not_loading(job_id)
        return self.failover.cancel(job_id)

    def trigger_savepoint(self, job_id: str, target_directory: str, *, stop: bool, drain: bool) -> CheckpointId:
        self._not_loading(job_id)
        return self.savepoints.trigger(job_id, target_directory, stop=stop, drain=drain)

    def trigger_checkpoint(self, job_id: str, *, full: bool) -> CheckpointId:
        self._not_loading(job_id)
        return self.savepoints.trigger_checkpoint(job_id, full=full)

    def rescale(self, job_id: str, parallelism: int) -> str:
        """``weir rescale``: answers the request's trigger id (RescaleRejectedError: refused, untouched)."""
        self._not_loading(job_id)
        return self.rescales.rescale(job_id, parallelism)

    def rescale_within(self, job_id: str, bounds: Mapping[str, ParallelismBounds]) -> str | None:
        """Flink's resource requirements (validated bounds by vertex uid) as a rescale: its trigger id,
        None when the job runs within them already (RescaleRejectedError: refused, untouched)."""
        self._not_loading(job_id)
        return self.rescales.rescale_within(job_id, bounds)

    def rescale_status(self, job_id: str, trigger_id: str) -> RescaleOperation:
        self._not_loading(job_id)
        return self.rescales.status(job_id, trigger_id)

    def job_status(self, job_id: str) -> JobStatusView:
        self._not_loading(job_id)
        return self.reads.job_status(job_id)

    def list_jobs(self) -> tuple[JobSummaryView, ...]:
        return self.reads.list_jobs()

    def list_checkpoints(self, job_id: str) -> CheckpointsView:
        self._not_loading(job_id)
        return self.reads.list_checkpoints(job_id)

    def checkpoint_detail(self, job_id: str, checkpoint_id: int) -> CheckpointDetailView:
        self._not_loading(job_id)
        return self.reads.checkpoint_detail(job_id, checkpoint_id)

    def cluster_status(self) -> ClusterView:
        return self.reads.cluster_status()

    def taskmanager_thread_dump(self, taskmanager_id: str) -> tuple[ThreadInfo, ...] | None:
        """The threads of a registered TaskManager, asked over its gRPC service (None: not registered;
        a TaskManager that does not answer raises TaskManagerCallError)."""
        with self.lock:
            found = self.registry.taskmanagers.get(taskmanager_id)
            address = None if found is None else found.address
        return None if address is None else self._gateway.thread_dump(address)

    def _taskmanager_address(self, taskmanager_id: str) -> str | None:
        with self.lock:
            found = self.registry.taskmanagers.get(taskmanager_id)
            return None if found is None else found.address

    def taskmanager_logs(self, taskmanager_id: str) -> tuple[LogFileInfo, ...] | None:
        """A registered TaskManager's log files, asked over its gRPC service (None: not registered)."""
        address = self._taskmanager_address(taskmanager_id)
        return None if address is None else self._gateway.list_logs(address)

    def taskmanager_log(self, taskmanager_id: str, selector: LogSelector, name: str = "") -> Iterator[bytes] | None:
        """One of them, in chunks (None: not registered; TaskManagerCallError NOT_FOUND: no such file)."""
        address = self._taskmanager_address(taskmanager_id)
        return None if address is None else self._gateway.read_log(address, selector, name)

    def job_plan(self, job_id: str) -> JobPlanView:
        self._not_loading(job_id)
        return self.reads.job_plan(job_id)

    def job_config(self, job_id: str) -> JobConfigView:
        self._not_loading(job_id)
        return self.reads.job_config(job_id)

    def exception_history(self, job_id: str) -> ExceptionHistory:
        self._not_loading(job_id)
        return self.reads.exception_history(job_id)

    # Recovery and monitoring ----------------------------------------------------------------------

    def recover_jobs(self) -> int:
        """Take over the jobs recorded in checkpoint storage; the JobManager is ready after it."""
        try:
            return self.recovery.recover_jobs()
        finally:
            self._recovered.set()

    def recover_history(self) -> int:
        """Load the ended jobs ``recover_jobs`` left for later (``start`` runs it in the background)."""
        loaded = self.recovery.recover_history()
        log.info("job_history_loaded", jobs=loaded)
        return loaded

    def _not_loading(self, job_id: str) -> None:
        if self.recovery.is_loading(job_id):
            raise JobManagerNotReadyError(
                f"the JobManager is still loading ended job {job_id} from checkpoint storage; try again shortly"
            )

    def tick(self) -> None:
        self.monitor.tick()

"""The TaskManager process: registers with the JobManager, heartbeats, reports, and runs its tasks
either in this process (one :class:`~weir.taskmanager.task_host.TaskHost`) or in one worker process
per slot (:class:`~weir.taskmanager.slot_processes.SlotProcesses`, ``--slot-processes``)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol

import grpc
import structlog

from weir.connectors.object_storage import open_storage
from weir.core.config import checkpoint_dir
from weir.core.grpc_security import open_channel
from weir.core.hardware import measure_hardware
from weir.core.leader_link import LeaderLink
from weir.core.thread_dump import ThreadInfo, thread_dump
from weir.core.transport_security import TransportSecurity
from weir.taskmanager.network.server import ChannelServer
from weir.taskmanager.reporter import JobManagerReports
from weir.taskmanager.slot_processes import SlotProcesses
from weir.taskmanager.task_host import TaskHost
from weir.wire import jobmanager_pb2, jobmanager_pb2_grpc, taskmanager_pb2

log = structlog.get_logger("weir.taskmanager")

CALL_TIMEOUT_S: Final = 5.0
"""A registration's or heartbeat's deadline; while the JobManager is unreachable, also how long one
call waits for the channel to connect."""
UNREACHABLE_PAUSE_S: Final = 0.1
"""The pause after a failed call to an unreachable JobManager before the next (waiting) call: a call
that fails without waiting (a connection reset) does not spin."""


class TaskSlots(Protocol):
    """Where a TaskManager's tasks run: a :class:`TaskHost` in this process, or its slot workers."""

    def deploy(self, req: taskmanager_pb2.DeployTaskRequest) -> None: ...

    def cancel_attempts_through(
        self, job_id: str, attempt: int, *, job_ended: bool = False, wait_s: float = 10.0
    ) -> None: ...

    def cancel_attempt(self, job_id: str, attempt: int, wait_s: float = 10.0) -> None: ...

    def trigger_checkpoint(self, req: taskmanager_pb2.TriggerCheckpointRequest) -> bool: ...

    def notify_checkpoint(self, job_id: str, attempt: int, checkpoint_id: int, complete: bool) -> None: ...

    def progress(self) -> list[jobmanager_pb2.TaskProgress]: ...

    def stop(self) -> None: ...


class TaskManagerRuntime:
    def __init__(
        self,
        taskmanager_id: str,
        advertised_address: str,
        jobmanager_address: str | Sequence[str],
        slots: int,
        run_dir: Path,
        *,
        local_channels: bool = True,
        security: TransportSecurity | None = None,
        slot_processes: bool = False,
    ) -> None:
        """``security``: how this TaskManager reaches the JobManager and its peers (default: from the
        environment). ``slot_processes``: run each slot's tasks in a worker process of its own.
        ``jobmanager_address``: the JobManager, or the leader and its standbys (it calls whichever
        leads: ``weir.core.leader_link``)."""
        self.id = taskmanager_id
        self._security = security if security is not None else TransportSecurity.from_env()
        self.address = advertised_address
        # A producer whose consumer runs here hands it buffers in memory (network.LocalOutputChannel).
        self.local_channels = local_channels
        self.slots = slots
        self.incarnation = uuid.uuid4().hex  # this process: a restart registers as a new incarnation
        self.hardware = measure_hardware()  # its cores and memory, sent with every registration
        self._run_dir = run_dir / taskmanager_id
        self._run_dir.mkdir(parents=True, exist_ok=True)
        addresses = (jobmanager_address,) if isinstance(jobmanager_address, str) else tuple(jobmanager_address)
        self.jobmanager_link = LeaderLink(
            addresses, lambda a: open_channel(a, self._security), jobmanager_pb2_grpc.JobManagerServiceStub
        )
        self.jobmanager: jobmanager_pb2_grpc.JobManagerServiceStub = self.jobmanager_link.stub
        self._stopping = threading.Event()
        self.reports = JobManagerReports(self.jobmanager, self._stopping)
        self.host: TaskHost | None = None
        self.slot_processes: SlotProcesses | None = None
        self.tasks: TaskSlots
        if slot_processes:
            self.slot_processes = SlotProcesses(
                taskmanager_id,
                advertised_address,
                self._run_dir,
                slots,
                self.reports,
                security=self._security,
                local_channels=local_channels,
            )
            self.tasks = self.slot_processes
        else:
            self.host = TaskHost(
                taskmanager_id,
                advertised_address,
                self._run_dir,
                self.reports,
                storage=open_storage(checkpoint_dir()),
                security=self._security,
                local_channels=local_channels,
            )
            self.tasks = self.host

    @property
    def channels(self) -> ChannelServer:
        """The server half of the channels into this process's tasks (without slot processes)."""
        if self.host is None:
            raise RuntimeError(f"TaskManager {self.id} runs its tasks in slot processes: they serve their channels")
        return self.host.channels

    # The JobManager's calls ------------------------------------------------------------------------------

    def deploy(self, req: taskmanager_pb2.DeployTaskRequest) -> None:
        self.tasks.deploy(req)

    def cancel_attempts_through(
        self, job_id: str, attempt: int, *, job_ended: bool = False, wait_s: float = 10.0
    ) -> None:
        """The JobManager ended attempts up to ``attempt`` of the job (a fail-over or a cancel);
        ``job_ended``: the job is over, so nothing of it is kept here."""
        self.tasks.cancel_attempts_through(job_id, attempt, job_ended=job_ended, wait_s=wait_s)

    def cancel_attempt(self, job_id: str, attempt: int, wait_s: float = 10.0) -> None:
        """Stop the tasks of exactly this attempt (a heartbeat named it as stale); the job's other
        attempts here, the current one above all, go on."""
        self.tasks.cancel_attempt(job_id, attempt, wait_s)

    def trigger_checkpoint(self, req: taskmanager_pb2.TriggerCheckpointRequest) -> bool:
        return self.tasks.trigger_checkpoint(req)

    def notify_checkpoint(self, job_id: str, attempt: int, checkpoint_id: int, complete: bool) -> None:
        self.tasks.notify_checkpoint(job_id, attempt, checkpoint_id, complete)

    # Registration and heartbeats ------------------------------------------------------------------

    def register(self, metrics_port: int, *, wait_for_jobmanager: bool = False) -> float:
        response = self.jobmanager.RegisterTaskManager(
            jobmanager_pb2.RegisterTaskManagerRequest(
                taskmanager_id=self.id,
                address=self.address,
                slots=self.slots,
                metrics_port=metrics_port,
                incarnation=self.incarnation,
                cpu_cores=self.hardware.cpu_cores,
                physical_memory_bytes=self.hardware.physical_memory_bytes,
            ),
            timeout=CALL_TIMEOUT_S,
            wait_for_ready=wait_for_jobmanager,
        )
        log.info("registered_with_jobmanager", taskmanager_id=self.id, address=self.address, slots=self.slots)
        return response.heartbeat_interval_s or 1.0

    def heartbeat_loop(self, metrics_port: int) -> None:
        """Register, then heartbeat every interval the JobManager asks for. While the JobManager is
        unreachable (killed, restarting) the next call waits for the channel to connect
        (``wait_for_ready``) instead of failing at once and sleeping an interval: a restarted JobManager
        is found as soon as it listens (within the channel's reconnect back-off), which is when it can
        place the restarted jobs (Flink's TaskExecutor reconnects to the new leader at once). With
        standbys (several addresses) a call fails fast instead, so that the link moves on to the next
        address rather than wait on one that does not lead."""
        interval = 1.0
        registered = False
        unreachable = False
        one_address = len(self.jobmanager_link.addresses) == 1
        refused: grpc.StatusCode | None = None
        while not self._stopping.is_set():
            try:
                if not registered:
                    interval = self.register(metrics_port, wait_for_jobmanager=unreachable and one_address)
                    registered = True
                running = self.tasks.progress()
                response = self.jobmanager.Heartbeat(
                    jobmanager_pb2.HeartbeatRequest(taskmanager_id=self.id, running_tasks=running),
                    timeout=CALL_TIMEOUT_S,
                    wait_for_ready=unreachable and one_address,
                )
                unreachable = False
                if response.reregister:
                    registered = False
                    continue
                for stale in response.cancel:
                    threading.Thread(
                        target=self.cancel_attempt, args=(stale.job_id, stale.attempt), daemon=True
                    ).start()
            except grpc.RpcError as exc:
                if registered and not unreachable:
                    log.warning("jobmanager_unreachable", code=exc.code().name)
                elif not registered and exc.code() != refused:  # once per cause: e.g. a refused certificate or token
                    refused = exc.code()
                    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                    log.warning("jobmanager_registration_failed", code=refused.name, details=details)
                registered = registered and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                # A deadline passed while waiting for the channel: still unreachable; a registered
                # TaskManager's heartbeat past its deadline: a slow JobManager, heartbeat at the interval.
                unreachable = exc.code() == grpc.StatusCode.UNAVAILABLE or (
                    unreachable and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                )
                if unreachable and one_address:
                    self._stopping.wait(UNREACHABLE_PAUSE_S)  # the next call itself waits for the channel
                    continue
            self._stopping.wait(interval)

    def thread_dump(self) -> list[ThreadInfo]:
        """This process's threads, then its slot workers' (``GET /taskmanagers/{id}/thread-dump``)."""
        threads = list(thread_dump())
        if self.slot_processes is not None:
            threads.extend(self.slot_processes.thread_dump())
        return threads

    def stop(self) -> None:
        self._stopping.set()
        self.tasks.stop()  # their acknowledgements still being stored are queued first
        self.reports.stop()

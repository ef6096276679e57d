"""The JobManager process: TaskManager registry, jobs, and the thin gRPC servicer over them."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from jobmanager.errors import JobManagerError, UnknownJobError
from jobmanager.jobs import DeployCommand, JobMaster, JobStatus, JobSubmission, new_job_id
from jobmanager.scheduler import SlotOffer
from taskmanager.network import GRPC_OPTIONS
from weir.api import load_job_source
from weir.errors import JobDefinitionError, WeirError
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc, taskmanager_pb2, taskmanager_pb2_grpc

log = structlog.get_logger("weir.jobmanager")

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 6.0


@dataclass
class RegisteredTaskManager:
    taskmanager_id: str
    address: str
    slots: int
    metrics_port: int
    last_heartbeat: float
    stub: taskmanager_pb2_grpc.TaskManagerServiceStub
    alive: bool = True


class JobManager:
    """Everything the JobManager knows; one lock serialises the servicer and the monitor thread."""

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self.taskmanagers: dict[str, RegisteredTaskManager] = {}
        self.jobs: dict[str, JobMaster] = {}
        self._io = ThreadPoolExecutor(max_workers=8, thread_name_prefix="jm-io")
        self._stopping = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="jm-monitor", daemon=True)

    def start(self) -> None:
        self._monitor.start()

    def stop(self) -> None:
        self._stopping.set()
        self._io.shutdown(wait=False, cancel_futures=True)

    # TaskManagers ---------------------------------------------------------------------------------

    def register_taskmanager(self, tm_id: str, address: str, slots: int, metrics_port: int) -> None:
        with self._lock:
            previous = self.taskmanagers.get(tm_id)
            if previous is not None and previous.alive and previous.address != address:
                # The TaskManager restarted under the same name: its old tasks are gone.
                self._taskmanager_lost(previous, "restarted")
            channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
            self.taskmanagers[tm_id] = RegisteredTaskManager(
                tm_id,
                address,
                slots,
                metrics_port,
                self._clock(),
                taskmanager_pb2_grpc.TaskManagerServiceStub(channel),
            )
        log.info("taskmanager_registered", taskmanager_id=tm_id, address=address, slots=slots)

    def heartbeat(self, request: jobmanager_pb2.HeartbeatRequest) -> jobmanager_pb2.HeartbeatResponse:
        with self._lock:
            tm = self.taskmanagers.get(request.taskmanager_id)
            if tm is None or not tm.alive:
                return jobmanager_pb2.HeartbeatResponse(reregister=True)
            tm.last_heartbeat = self._clock()
            cancel: set[str] = set()
            for progress in request.running_tasks:
                job = self.jobs.get(progress.task.job_id)
                if job is None or job.status.terminal or progress.attempt < job.attempt:
                    cancel.add(progress.task.job_id)
                    continue
                job.on_progress(
                    progress.task.vertex_uid,
                    progress.task.subtask,
                    progress.attempt,
                    progress.records_in,
                    progress.records_out,
                )
            return jobmanager_pb2.HeartbeatResponse(cancel_jobs=sorted(cancel))

    def _offers(self) -> list[SlotOffer]:
        used: dict[str, int] = {}
        for job in self.jobs.values():
            for tm_id in set(job.slots):
                used[tm_id] = used.get(tm_id, 0) + job.slots_used_on(tm_id)
        return [
            SlotOffer(tm.taskmanager_id, tm.slots - used.get(tm.taskmanager_id, 0))
            for tm in self.taskmanagers.values()
            if tm.alive
        ]

    def _taskmanager_lost(self, tm: RegisteredTaskManager, why: str) -> None:
        tm.alive = False
        log.warning("taskmanager_lost", taskmanager_id=tm.taskmanager_id, reason=why)
        now = self._clock()
        for job in self.jobs.values():
            if job.status is JobStatus.RUNNING and tm.taskmanager_id in job.taskmanagers_in_use():
                self._fail_over(job, f"TaskManager {tm.taskmanager_id} lost ({why})", now)

    # Jobs -----------------------------------------------------------------------------------------

    def submit(self, request: jobmanager_pb2.SubmitJobRequest) -> str:
        parallelism = request.parallelism or 1
        loaded = load_job_source(
            request.job_source, request.job_file_name, dict(request.parameters), parallelism, request.job_name or None
        )
        submission = JobSubmission(
            job_id=new_job_id(),
            job_name=request.job_name or loaded.graph.job_name,
            job_file_name=request.job_file_name,
            job_source=request.job_source,
            parameters=dict(request.parameters),
            parallelism=parallelism,
            submitted_at=self._clock(),
        )
        master = JobMaster.create(submission, loaded)
        with self._lock:
            command = master.schedule(self._offers(), self._addresses(), self._clock())
            self.jobs[submission.job_id] = master
        log.info(
            "job_submitted",
            job_id=submission.job_id,
            job_name=submission.job_name,
            parallelism=parallelism,
            vertices=list(master.plan.vertices),
        )
        self._io.submit(self._deploy, master, command)
        return submission.job_id

    def _addresses(self) -> dict[str, str]:
        return {tm.taskmanager_id: tm.address for tm in self.taskmanagers.values() if tm.alive}

    def _deploy(self, job: JobMaster, command: DeployCommand) -> None:
        for address, request in command.requests:
            if job.attempt != command.attempt or job.status is not JobStatus.RUNNING:
                return
            stub = self._stub_for(address)
            try:
                stub.DeployTask(request, timeout=30)
            except grpc.RpcError as exc:
                with self._lock:
                    self._fail_over(
                        job,
                        f"deploying {request.task.vertex_uid}#{request.task.subtask} to "
                        f"{address} failed: {exc.code().name}: {exc.details()}",
                        self._clock(),
                    )
                return

    def _stub_for(self, address: str) -> taskmanager_pb2_grpc.TaskManagerServiceStub:
        with self._lock:
            for tm in self.taskmanagers.values():
                if tm.address == address:
                    return tm.stub
        return taskmanager_pb2_grpc.TaskManagerServiceStub(grpc.insecure_channel(address, options=GRPC_OPTIONS))

    def _cancel_tasks(self, job: JobMaster, attempt: int) -> None:
        with self._lock:
            targets = [tm for tm in self.taskmanagers.values() if tm.alive and tm.taskmanager_id in job.slots]
        for tm in targets:
            try:
                tm.stub.CancelJobTasks(
                    taskmanager_pb2.CancelJobTasksRequest(job_id=job.job_id, attempt=attempt), timeout=15
                )
            except grpc.RpcError as exc:
                log.warning("cancel_failed", job_id=job.job_id, taskmanager_id=tm.taskmanager_id, code=exc.code().name)

    def _fail_over(self, job: JobMaster, reason: str, now: float) -> None:
        attempt = job.attempt
        job.fail_over(reason, now)
        self._io.submit(self._cancel_tasks, job, attempt)

    def report_task_state(self, request: jobmanager_pb2.ReportTaskStateRequest) -> None:
        with self._lock:
            job = self.jobs.get(request.task.job_id)
            if job is None:
                return
            reason = job.on_task_state(
                request.task.vertex_uid,
                request.task.subtask,
                request.attempt,
                request.state,
                request.failure,
                request.records_in,
                request.records_out,
                self._clock(),
            )
            if reason is not None:
                self._fail_over(job, reason, self._clock())

    def cancel(self, job_id: str) -> str:
        with self._lock:
            job = self._job(job_id)
            job.cancel(self._clock())
            attempt = job.attempt
            status = job.status.value
        self._io.submit(self._cancel_tasks, job, attempt)
        return status

    def _job(self, job_id: str) -> JobMaster:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"unknown job {job_id}")
        return job

    # Monitoring -----------------------------------------------------------------------------------

    def _monitor_loop(self) -> None:
        while not self._stopping.wait(0.2):
            try:
                self.tick()
            except Exception:  # the monitor must survive any single bad tick
                log.exception("monitor_tick_failed")

    def tick(self) -> None:
        now = self._clock()
        deploys: list[tuple[JobMaster, DeployCommand]] = []
        with self._lock:
            for tm in self.taskmanagers.values():
                if tm.alive and now - tm.last_heartbeat > HEARTBEAT_TIMEOUT_S:
                    self._taskmanager_lost(tm, f"no heartbeat for {now - tm.last_heartbeat:.1f}s")
            for job in self.jobs.values():
                if job.status is JobStatus.CANCELLING and now - (job.finished_at or now) > 30:
                    job.status = JobStatus.CANCELED
                if job.status is JobStatus.RESTARTING and job.restart_at is not None and now >= job.restart_at:
                    try:
                        deploys.append((job, job.schedule(self._offers(), self._addresses(), now)))
                    except JobManagerError as exc:
                        job.restart_at = now + 1.0  # wait for slots (a TaskManager may come back)
                        log.warning("restart_waiting_for_slots", job_id=job.job_id, reason=str(exc))
        for job, command in deploys:
            self._io.submit(self._deploy, job, command)

    # Reads ----------------------------------------------------------------------------------------

    def job_status(self, job_id: str) -> jobmanager_pb2.GetJobStatusResponse:
        with self._lock:
            job = self._job(job_id)
            response = jobmanager_pb2.GetJobStatusResponse(
                summary=self._summary(job),
                failure=job.failure,
                last_completed_checkpoint=job.restore_checkpoint_id,
                last_restore_at=job.last_restore_at,
            )
            for (uid, s), t in sorted(job.tasks.items()):
                response.tasks.add(
                    task=common_pb2.TaskRef(job_id=job_id, vertex_uid=uid, subtask=s),
                    operator_names=t.operator_names,
                    state=t.state,
                    taskmanager_id=t.taskmanager_id,
                    failure=t.failure,
                    records_in=t.records_in,
                    records_out=t.records_out,
                )
            return response

    def _summary(self, job: JobMaster) -> jobmanager_pb2.JobSummary:
        sub = job.submission
        return jobmanager_pb2.JobSummary(
            job_id=sub.job_id,
            job_name=sub.job_name,
            status=job.status.value,
            submitted_at=sub.submitted_at,
            parallelism=sub.parallelism,
            restarts=job.restarts,
        )

    def list_jobs(self) -> jobmanager_pb2.ListJobsResponse:
        with self._lock:
            return jobmanager_pb2.ListJobsResponse(jobs=[self._summary(j) for j in self.jobs.values()])

    def cluster_status(self) -> jobmanager_pb2.GetClusterStatusResponse:
        now = self._clock()
        with self._lock:
            offers = {o.taskmanager_id: o.free_slots for o in self._offers()}
            return jobmanager_pb2.GetClusterStatusResponse(
                taskmanagers=[
                    jobmanager_pb2.TaskManagerInfo(
                        taskmanager_id=tm.taskmanager_id,
                        address=tm.address,
                        slots_total=tm.slots,
                        slots_free=offers.get(tm.taskmanager_id, 0),
                        last_heartbeat_age_s=now - tm.last_heartbeat,
                        alive=tm.alive,
                    )
                    for tm in sorted(self.taskmanagers.values(), key=lambda t: t.taskmanager_id)
                ]
            )


def _abort(context: grpc.ServicerContext, exc: WeirError) -> None:
    code = getattr(exc, "grpc_code", None)
    if isinstance(exc, JobDefinitionError):
        code = "INVALID_ARGUMENT"
    context.abort(getattr(grpc.StatusCode, code or "INTERNAL"), str(exc))


class JobManagerServicer(jobmanager_pb2_grpc.JobManagerServiceServicer):
    """Thin: translate requests, call JobManager, map WeirError onto gRPC status codes."""

    def __init__(self, jm: JobManager) -> None:
        self._jm = jm

    def _call(self, context: grpc.ServicerContext, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except WeirError as exc:
            _abort(context, exc)

    def SubmitJob(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return jobmanager_pb2.SubmitJobResponse(job_id=self._call(context, self._jm.submit, request))

    def ListJobs(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return self._jm.list_jobs()

    def GetJobStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return self._call(context, self._jm.job_status, request.job_id)

    def CancelJob(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return jobmanager_pb2.CancelJobResponse(status=self._call(context, self._jm.cancel, request.job_id))

    def ListCheckpoints(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return self._call(context, self._jm.list_checkpoints, request.job_id)

    def GetClusterStatus(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return self._jm.cluster_status()

    def RegisterTaskManager(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self._jm.register_taskmanager(request.taskmanager_id, request.address, request.slots, request.metrics_port)
        return jobmanager_pb2.RegisterTaskManagerResponse(heartbeat_interval_s=HEARTBEAT_INTERVAL_S)

    def Heartbeat(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        return self._jm.heartbeat(request)

    def ReportTaskState(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self._jm.report_task_state(request)
        return jobmanager_pb2.ReportTaskStateResponse()

    def AcknowledgeCheckpoint(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self._call(context, self._jm.acknowledge_checkpoint, request)
        return jobmanager_pb2.AcknowledgeCheckpointResponse()

    def DeclineCheckpoint(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self._call(context, self._jm.decline_checkpoint, request)
        return jobmanager_pb2.DeclineCheckpointResponse()

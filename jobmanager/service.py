"""The JobManager process: TaskManager registry, jobs, and the thin gRPC servicer over them."""

from __future__ import annotations

import json
import pickle
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from connectors import kafka
from connectors.object_storage import CheckpointStorage
from jobmanager import metrics
from jobmanager.checkpointing import coordinator as cc
from jobmanager.checkpointing.pending import CheckpointKind, StateObject, TaskAckMetrics, TaskStateHandle
from jobmanager.checkpointing.store import CompletedCheckpoint
from jobmanager.ending import resolve_sink_transactions
from jobmanager.errors import JobManagerError
from jobmanager.jobs import DeployCommand, JobMaster, JobStatus, JobSubmission, new_job_id
from jobmanager.records import JobRecord
from jobmanager.scheduler import SlotOffer
from jobmanager.submit_checks import check_job_at_submit
from weir.api import load_job_source
from weir.codec import failure_to_proto, optional_failure_from_proto
from weir.config import Endpoints
from weir.descriptors import KafkaSourceSpec, end_offsets_parameter
from weir.errors import JobDefinitionError, NotEnoughSlotsError, ServiceUnavailableError, UnknownJobError, WeirError
from weir.failures import Failure
from weir.ids import CheckpointId, JobId
from weir.paths import CheckpointPaths
from weir.transport import GRPC_OPTIONS
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc, taskmanager_pb2, taskmanager_pb2_grpc

log = structlog.get_logger("weir.jobmanager")

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 6.0
RECORD_REFRESH_S = 2.0
RESOLUTION_DEADLINE_S = 300.0  # how long an ended job's transaction resolution is retried


@dataclass
class RegisteredTaskManager:
    taskmanager_id: str
    address: str
    slots: int
    metrics_port: int
    last_heartbeat: float
    stub: taskmanager_pb2_grpc.TaskManagerServiceStub
    channel: grpc.Channel
    incarnation: str = ""  # the TaskManager process's own id, new for every start
    alive: bool = True


def channel_connects(channel: grpc.Channel, timeout_s: float) -> bool:
    """Whether the channel's server accepts a connection: True once READY, False as soon as the
    attempt fails (a refused connection: the process is gone) or after ``timeout_s`` (no answer)."""
    outcome: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def on_state(state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.READY:
            outcome.put(True)
        elif state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            outcome.put(False)

    channel.subscribe(on_state, try_to_connect=True)
    try:
        return outcome.get(timeout=timeout_s)
    except queue.Empty:
        return False
    finally:
        channel.unsubscribe(on_state)


class JobManager:
    """Everything the JobManager knows; one lock serialises the servicer and the monitor thread."""

    def __init__(self, storage: CheckpointStorage, clock: Any = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self.taskmanagers: dict[str, RegisteredTaskManager] = {}
        self.jobs: dict[str, JobMaster] = {}
        self.storage = storage
        self.paths = CheckpointPaths()
        self._io = ThreadPoolExecutor(max_workers=8, thread_name_prefix="jm-io")
        self._records = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jm-records")  # in order
        self._stopping = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="jm-monitor", daemon=True)

    def start(self) -> None:
        self._monitor.start()

    def stop(self) -> None:
        self._stopping.set()
        self._io.shutdown(wait=False, cancel_futures=True)

    # TaskManagers ---------------------------------------------------------------------------------

    def register_taskmanager(self, tm_id: str, address: str, slots: int, metrics_port: int, incarnation: str) -> None:
        """A TaskManager (re-)registers. Another process under the same name (a new incarnation, at
        the same address or not) means the old one is gone with its tasks: the jobs it ran fail over.
        The same process registering again (it lost the JobManager for a moment) keeps its tasks."""
        with self._lock:
            previous = self.taskmanagers.get(tm_id)
            if previous is not None and previous.alive and previous.incarnation != incarnation:
                self._taskmanager_lost(previous, "restarted: registered again as a new process")
            if previous is not None and previous.alive and previous.incarnation == incarnation:
                previous.last_heartbeat = self._clock()
                log.info("taskmanager_reregistered", taskmanager_id=tm_id, address=address, incarnation=incarnation)
                return
            channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
            self.taskmanagers[tm_id] = RegisteredTaskManager(
                tm_id,
                address,
                slots,
                metrics_port,
                self._clock(),
                taskmanager_pb2_grpc.TaskManagerServiceStub(channel),
                channel,
                incarnation,
            )
        log.info("taskmanager_registered", taskmanager_id=tm_id, address=address, slots=slots, incarnation=incarnation)

    def heartbeat(self, request: jobmanager_pb2.HeartbeatRequest) -> jobmanager_pb2.HeartbeatResponse:
        with self._lock:
            tm = self.taskmanagers.get(request.taskmanager_id)
            if tm is None or not tm.alive:
                return jobmanager_pb2.HeartbeatResponse(reregister=True)
            tm.last_heartbeat = self._clock()
            cancel: set[tuple[str, int]] = set()
            for progress in request.running_tasks:
                job = self.jobs.get(progress.task.job_id)
                if job is None or job.status is not JobStatus.RUNNING or progress.attempt != job.attempt:
                    # Only that attempt stops: a lingering task of an older attempt must not take the
                    # current attempt's tasks on the same TaskManager down with it.
                    cancel.add((progress.task.job_id, progress.attempt))
                    continue
                job.on_progress(
                    progress.task.vertex_uid,
                    progress.task.subtask,
                    progress.attempt,
                    progress.records_in,
                    progress.records_out,
                )
            return jobmanager_pb2.HeartbeatResponse(
                cancel=[common_pb2.JobAttempt(job_id=job_id, attempt=attempt) for job_id, attempt in sorted(cancel)]
            )

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
                self._fail_over(job, Failure.internal(f"TaskManager {tm.taskmanager_id} lost ({why})"), now)

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
            parameters={**request.parameters, **self._fixed_source_ends(loaded)},
            parallelism=parallelism,
            submitted_at=self._clock(),
        )
        master = JobMaster.create(submission, loaded, self.paths.metadata_key_fn())
        # Sinks that cannot commit (a Kafka transaction must outlive a checkpoint interval plus a
        # restart, or the broker aborts it), missing topics and tables: refused before any task starts.
        check_job_at_submit(
            loaded.graph,
            master.checkpoint_settings,
            HEARTBEAT_TIMEOUT_S + master.restart_strategy.max_delay_s(),
            Endpoints.from_env(),
        )
        with self._lock:
            command, saved = self._schedule(master, self._clock())
            self.jobs[submission.job_id] = master
        log.info(
            "job_submitted",
            job_id=submission.job_id,
            job_name=submission.job_name,
            parallelism=parallelism,
            vertices=list(master.plan.vertices),
        )
        self._io.submit(self._deploy, master, command, saved)
        return submission.job_id

    def _fixed_source_ends(self, loaded: Any) -> dict[str, str]:
        """Bounded Kafka sources end at the offsets present at submit, in every attempt (as Flink's
        enumerator fixes stopping offsets): they travel as internal job parameters."""
        fixed: dict[str, str] = {}
        for t in loaded.graph.transformations.values():
            spec = t.source_spec
            if isinstance(spec, KafkaSourceSpec) and spec.bounded:
                ends = kafka.end_offsets(Endpoints.from_env(), spec.topic)
                fixed[end_offsets_parameter(t.uid)] = json.dumps(ends)
        return fixed

    def _schedule(self, job: JobMaster, now: float) -> tuple[DeployCommand, Future[bool]]:
        """Restore the latest completed checkpoint (if any) and place a new attempt; answers the
        deployment and the write of the job record that carries its attempt number, which must be
        durable before any task of the attempt is deployed."""
        decision = job.coordinator.restore_latest(now)
        if isinstance(decision, cc.WaitForPersist):
            raise JobManagerError(f"checkpoints {decision.checkpoint_ids} are still being persisted")
        if isinstance(decision, cc.RestoreFrom):
            completed = decision.checkpoint
            job.restore = {
                (handle.task_id.operator_uid, handle.task_id.subtask): handle.inline_payload
                for handle in completed.task_states
            }
            job.restore_checkpoint_id = completed.checkpoint_id
            job.last_restore_at = now
            metrics.RESTORES.labels(job.job_id).inc()
            log.info("job_restoring", job_id=job.job_id, checkpoint_id=completed.checkpoint_id)
        command = job.schedule(self._offers(), self._addresses(), now)
        return command, self._save_record(job)

    def _save_record(self, job: JobMaster) -> Future[bool]:
        """The job as a restarted JobManager needs it (``jobmanager.records``), written in order;
        the future answers whether it was written."""
        record = JobRecord(
            submission=job.submission,
            attempt=job.attempt,
            status=job.status.value,
            failure=job.failure,
            records_in_all_attempts={key: t.records_in_all_attempts for key, t in job.tasks.items()},
            checkpoint_ids_reserved_through=job.coordinator.ids_reserved_through,
            transactions_resolved=job.transactions_resolved,
        )
        job.record_saved_at = self._clock()
        return self._records.submit(self._put_record, job.job_id, record.to_json())

    def _put_record(self, job_id: str, record: bytes) -> bool:
        try:
            self.storage.put_bytes(self.paths.job_record(JobId(job_id)), record)
        except WeirError as exc:
            log.error("job_record_not_saved", job_id=job_id, error=str(exc))
            return False
        return True

    def _addresses(self) -> dict[str, str]:
        return {tm.taskmanager_id: tm.address for tm in self.taskmanagers.values() if tm.alive}

    def _deploy(self, job: JobMaster, command: DeployCommand, saved: Future[bool]) -> None:
        if not saved.result():
            # A JobManager taking over must know this attempt number, or it would deploy it again.
            with self._lock:
                if job.attempt == command.attempt and job.status is JobStatus.RUNNING:
                    job.replace("the job record with the new attempt could not be written", self._clock() + 1.0)
            return
        unreachable = [a for a in {a for a, _ in command.requests} if not self._reachable(a)]
        if unreachable:
            with self._lock:
                if job.attempt == command.attempt and job.status is JobStatus.RUNNING:
                    job.replace(f"TaskManager(s) at {', '.join(sorted(unreachable))} unreachable", self._clock())
                for tm in self.taskmanagers.values():
                    if tm.address in unreachable and tm.alive:
                        self._taskmanager_lost(tm, "unreachable before deployment")
            return
        for address, request in command.requests:
            if job.attempt != command.attempt or job.status is not JobStatus.RUNNING:
                return
            stub = self._stub_for(address)
            try:
                stub.DeployTask(request, timeout=30)
            except grpc.RpcError as exc:
                with self._lock:
                    reason = Failure.internal(
                        f"deploying {request.task.vertex_uid}#{request.task.subtask} to "
                        f"{address} failed: {exc.code().name}: {exc.details()}"
                    )
                    if exc.code() == grpc.StatusCode.UNAVAILABLE:
                        # The TaskManager is gone (it re-registers when it comes back): schedule the
                        # restart on the others rather than on it again.
                        for tm in self.taskmanagers.values():
                            if tm.address == address and tm.alive:
                                self._taskmanager_lost(tm, "unreachable at deployment")
                    self._fail_over(job, reason, self._clock())
                return

    def _reachable(self, address: str, timeout_s: float = 1.0) -> bool:
        """A TaskManager that died within the last heartbeat timeout still looks alive: probe it."""
        with self._lock:
            tm = next((t for t in self.taskmanagers.values() if t.address == address), None)
        channel = tm.channel if tm is not None else grpc.insecure_channel(address, options=GRPC_OPTIONS)
        return channel_connects(channel, timeout_s)

    def _stub_for(self, address: str) -> taskmanager_pb2_grpc.TaskManagerServiceStub:
        with self._lock:
            for tm in self.taskmanagers.values():
                if tm.address == address:
                    return tm.stub
        return taskmanager_pb2_grpc.TaskManagerServiceStub(grpc.insecure_channel(address, options=GRPC_OPTIONS))

    def _cancel_tasks(self, job: JobMaster, attempt: int, *, job_ended: bool = False) -> None:
        with self._lock:
            targets = [
                tm for tm in self.taskmanagers.values() if tm.alive and (job_ended or tm.taskmanager_id in job.slots)
            ]
        for tm in targets:
            try:
                tm.stub.CancelJobTasks(
                    taskmanager_pb2.CancelJobTasksRequest(job_id=job.job_id, attempt=attempt, job_ended=job_ended),
                    timeout=15,
                )
            except grpc.RpcError as exc:
                log.warning("cancel_failed", job_id=job.job_id, taskmanager_id=tm.taskmanager_id, code=exc.code().name)

    def _fail_over(self, job: JobMaster, failure: Failure, now: float) -> None:
        if job.status is not JobStatus.RUNNING:
            return
        attempt = job.attempt
        sources = job.source_task_ids()
        self._execute(job, job.coordinator.task_failed(now, sources[0], failure.message))
        job.fail_over(failure, now)
        metrics.job_status(job)
        if job.status is JobStatus.FAILED:
            self._save_record(job)
            self._io.submit(self._end_job, job, attempt)
        else:
            self._io.submit(self._cancel_tasks, job, attempt)

    def _end_job(self, job: JobMaster, attempt: int) -> None:
        """A job that is cancelled, or FAILED for good: stop its tasks, then resolve its sinks'
        transactions from the latest completed checkpoint (commit what it covers, roll back or abort
        the rest), then record that; a cancelled job becomes CANCELED only then."""
        self._cancel_tasks(job, attempt, job_ended=True)
        deadline = time.monotonic() + RESOLUTION_DEADLINE_S
        delay = 1.0
        while True:
            with self._lock:
                resolution_attempt = job.next_attempt_for_resolution()
                latest = job.coordinator.store.latest()
                saved = self._save_record(job)  # the resolution's attempt fences every earlier one
            if not saved.result():
                error = "the job record with the resolution's attempt could not be written"
            else:
                try:
                    report = resolve_sink_transactions(
                        job.loaded.graph, job.plan, job.submission, resolution_attempt, latest
                    )
                except WeirError as exc:
                    error = str(exc)
                else:
                    log.info(
                        "job_transactions_resolved",
                        job_id=job.job_id,
                        attempt=resolution_attempt,
                        checkpoint_id=latest.checkpoint_id if latest is not None else None,
                        sink_subtasks=report.sink_subtasks,
                    )
                    break
            if time.monotonic() + delay > deadline or self._stopping.is_set():
                log.error("job_transactions_not_resolved", job_id=job.job_id, error=error)
                with self._lock:
                    job.resolution_error = error
                    job.cancelled(self._clock())
                    self._save_record(job)
                    metrics.job_status(job)
                return
            log.warning("job_transactions_resolution_retrying", job_id=job.job_id, error=error, delay_s=delay)
            self._stopping.wait(delay)
            delay = min(delay * 2, 30.0)
        with self._lock:
            job.transactions_resolved = True
            job.cancelled(self._clock())
            self._save_record(job)
            metrics.job_status(job)

    def report_task_state(self, request: jobmanager_pb2.ReportTaskStateRequest) -> None:
        with self._lock:
            job = self.jobs.get(request.task.job_id)
            if job is None:
                return
            now = self._clock()
            before = job.status
            reason = job.on_task_state(
                request.task.vertex_uid,
                request.task.subtask,
                request.attempt,
                request.state,
                optional_failure_from_proto(request, "failure"),
                request.records_in,
                request.records_out,
                now,
            )
            if reason is not None:
                self._fail_over(job, reason, now)
                return
            if request.attempt != job.attempt:
                return
            coordinator = job.coordinator
            if request.input_ended:
                job.sources_ended.add((request.task.vertex_uid, request.task.subtask))
                self._trigger_final_checkpoint(job, now)
                return
            if request.state == common_pb2.TASK_STATE_RUNNING and job.all_running() and not coordinator.is_running:
                self._execute(job, coordinator.start(now, job.all_task_ids(), job.source_task_ids()))
            elif request.state == common_pb2.TASK_STATE_FINISHED and coordinator.is_running:
                # A finished task takes no part in later checkpoints: stop periodic checkpoints here.
                task = f"{request.task.vertex_uid}#{request.task.subtask}"
                self._execute(job, coordinator.stop(now, f"task {task} finished"))
            if job.status is not before and job.status.terminal:
                self._save_record(job)
                metrics.job_status(job)

    def cancel(self, job_id: str) -> str:
        with self._lock:
            job = self._job(job_id)
            self._execute(job, job.coordinator.stop(self._clock(), "job cancelled"))
            started = job.cancel(self._clock())
            attempt = job.attempt
            status = job.status.value
            if started:
                self._save_record(job)
                metrics.job_status(job)
        if started:
            self._io.submit(self._end_job, job, attempt)
        return status

    def _job(self, job_id: str) -> JobMaster:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJobError(job_id)
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
        deploys: list[tuple[JobMaster, DeployCommand, Future[bool]]] = []
        with self._lock:
            for tm in self.taskmanagers.values():
                if tm.alive and now - tm.last_heartbeat > HEARTBEAT_TIMEOUT_S:
                    self._taskmanager_lost(tm, f"no heartbeat for {now - tm.last_heartbeat:.1f}s")
            for job in self.jobs.values():
                if job.status is JobStatus.RESTARTING and job.restart_at is not None and now >= job.restart_at:
                    try:
                        deploys.append((job, *self._schedule(job, now)))
                    except (JobManagerError, NotEnoughSlotsError) as exc:
                        job.restart_at = now + 1.0  # wait for slots (a TaskManager may come back)
                        log.warning("restart_waiting", job_id=job.job_id, reason=str(exc))
                elif job.status is JobStatus.RUNNING and job.coordinator.is_running:
                    self._execute(job, job.coordinator.tick(now))
                    self._trigger_final_checkpoint(job, now)
                if job.status is JobStatus.RUNNING and now - job.record_saved_at > RECORD_REFRESH_S:
                    self._save_record(job)  # keeps the progress counters for a restarted JobManager
                metrics.job_status(job)
        for job, command, saved in deploys:
            self._io.submit(self._deploy, job, command, saved)

    # Checkpoints ----------------------------------------------------------------------------------

    def _trigger_final_checkpoint(self, job: JobMaster, now: float) -> None:
        """Once every bounded source has ended, one more checkpoint lets the sinks commit the rest."""
        if job.status is not JobStatus.RUNNING or not job.needs_final_checkpoint():
            return
        trigger = job.coordinator.trigger_now(now)
        if trigger is not None:
            job.final_checkpoint_id = trigger.checkpoint_id
            log.info("final_checkpoint_triggered", job_id=job.job_id, checkpoint_id=trigger.checkpoint_id)
            self._execute(job, (trigger,))

    def acknowledge_checkpoint(self, request: jobmanager_pb2.AcknowledgeCheckpointRequest) -> None:
        with self._lock:
            job = self.jobs.get(request.task.job_id)
            if job is None or request.attempt != job.attempt:
                return
            task = job.task_id(request.task.vertex_uid, request.task.subtask)
            handle = TaskStateHandle(
                task_id=task,
                objects=tuple(StateObject(o.key, o.size_bytes, o.reused) for o in request.objects),
                inline_payload=request.state_handle,
            )
            ack_metrics = TaskAckMetrics(
                alignment_duration_s=request.alignment_duration_s,
                start_delay_s=request.start_delay_s,
                state_size_bytes=request.state_size_bytes,
                sync_duration_s=request.sync_duration_s,
                async_duration_s=request.async_duration_s,
            )
            outcome = job.coordinator.receive_ack(
                self._clock(), CheckpointId(request.checkpoint_id), task, handle, ack_metrics
            )
            metrics.ALIGNMENT.labels(job.job_id, request.task.vertex_uid).observe(request.alignment_duration_s)
            metrics.START_DELAY.labels(job.job_id, request.task.vertex_uid).observe(request.start_delay_s)
            self._execute(job, outcome.actions)

    def decline_checkpoint(self, request: jobmanager_pb2.DeclineCheckpointRequest) -> None:
        with self._lock:
            job = self.jobs.get(request.task.job_id)
            if job is None or request.attempt != job.attempt:
                return
            task = job.task_id(request.task.vertex_uid, request.task.subtask)
            log.warning(
                "checkpoint_declined",
                job_id=job.job_id,
                checkpoint_id=request.checkpoint_id,
                task=str(task),
                reason=request.reason,
            )
            self._execute(
                job,
                job.coordinator.receive_decline(
                    self._clock(), CheckpointId(request.checkpoint_id), task, request.reason
                ),
            )

    def _execute(self, job: JobMaster, actions: tuple[cc.Action, ...]) -> None:
        """Carry out the coordinator's decisions; I/O runs on worker threads, never under the lock."""
        for action in actions:
            if isinstance(action, cc.TriggerBarriers):
                if action.reserve_ids_through is not None and not self._save_record(job).result():
                    # No barrier may carry an id a JobManager taking over could hand out again.
                    self._execute(
                        job,
                        job.coordinator.id_reservation_failed(
                            self._clock(), action.checkpoint_id, "the job record could not be written"
                        ),
                    )
                    continue
                metrics.CHECKPOINTS_TRIGGERED.labels(job.job_id).inc()
                log.info(
                    "checkpoint_triggered",
                    job_id=job.job_id,
                    checkpoint_id=action.checkpoint_id,
                    kind=action.kind.value,
                )
                self._io.submit(self._trigger, job, job.attempt, action)
            elif isinstance(action, cc.PersistCheckpoint):
                self._io.submit(self._persist, job, action.completed)
            elif isinstance(action, cc.NotifyComplete):
                self._notify(job, action.checkpoint_id, action.tasks, complete=True)
            elif isinstance(action, cc.NotifyAborted):
                if action.checkpoint_id == job.final_checkpoint_id:
                    job.final_checkpoint_id = None  # the final checkpoint failed: trigger another
                metrics.CHECKPOINTS_FAILED.labels(job.job_id).inc()
                log.warning(
                    "checkpoint_aborted",
                    job_id=job.job_id,
                    checkpoint_id=action.checkpoint_id,
                    reason=action.reason.message,
                )
                self._notify(job, action.checkpoint_id, action.tasks, complete=False, reason=action.reason.message)
            elif isinstance(action, cc.DeleteObjects):
                self._io.submit(self._delete, action)

    def _trigger(self, job: JobMaster, attempt: int, action: cc.TriggerBarriers) -> None:
        kind = (
            common_pb2.CHECKPOINT_KIND_SAVEPOINT
            if action.kind is CheckpointKind.SAVEPOINT
            else common_pb2.CHECKPOINT_KIND_CHECKPOINT
        )
        for task in action.source_tasks:
            with self._lock:
                tm = self.taskmanagers.get(job.taskmanager_of(task))
            accepted = False
            if tm is not None and tm.alive:
                try:
                    accepted = tm.stub.TriggerCheckpoint(
                        taskmanager_pb2.TriggerCheckpointRequest(
                            task=common_pb2.TaskRef(
                                job_id=job.job_id, vertex_uid=task.operator_uid, subtask=task.subtask
                            ),
                            attempt=attempt,
                            checkpoint_id=action.checkpoint_id,
                            timestamp=action.timestamp,
                            kind=kind,
                            final=action.checkpoint_id == job.final_checkpoint_id,
                        ),
                        timeout=10,
                    ).accepted
                except grpc.RpcError as exc:
                    log.warning("trigger_failed", job_id=job.job_id, task=str(task), code=exc.code().name)
            if not accepted:
                with self._lock:
                    if job.attempt == attempt:
                        self._execute(
                            job,
                            job.coordinator.receive_decline(
                                self._clock(), action.checkpoint_id, task, "source task did not accept the trigger"
                            ),
                        )
                return

    def _persist(self, job: JobMaster, completed: CompletedCheckpoint) -> None:
        """Write the metadata (last, atomically: one PUT), then let the coordinator notify the tasks."""
        try:
            self.storage.put_bytes(completed.metadata_key, pickle.dumps(completed))
        except WeirError as exc:
            with self._lock:
                self._execute(
                    job, job.coordinator.checkpoint_persist_failed(self._clock(), completed.checkpoint_id, str(exc))
                )
            return
        with self._lock:
            now = self._clock()
            metrics.checkpoint_completed(job.job_id, completed, now)
            log.info(
                "checkpoint_completed",
                job_id=job.job_id,
                checkpoint_id=completed.checkpoint_id,
                duration_s=round(now - completed.trigger_timestamp, 3),
                size_bytes=completed.total_size_bytes,
            )
            self._execute(job, job.coordinator.checkpoint_persisted(now, completed.checkpoint_id))

    def _notify(
        self, job: JobMaster, checkpoint_id: int, tasks: tuple[Any, ...], complete: bool, reason: str = ""
    ) -> None:
        tms = {job.taskmanager_of(t) for t in tasks if (t.operator_uid, t.subtask) in job.tasks}
        stubs = [self.taskmanagers[tm].stub for tm in tms if tm in self.taskmanagers and self.taskmanagers[tm].alive]
        attempt = job.attempt

        def send() -> None:
            for stub in stubs:
                try:
                    if complete:
                        stub.NotifyCheckpointComplete(
                            taskmanager_pb2.NotifyCheckpointCompleteRequest(
                                job_id=job.job_id, attempt=attempt, checkpoint_id=checkpoint_id
                            ),
                            timeout=10,
                        )
                    else:
                        stub.NotifyCheckpointAborted(
                            taskmanager_pb2.NotifyCheckpointAbortedRequest(
                                job_id=job.job_id, attempt=attempt, checkpoint_id=checkpoint_id, reason=reason
                            ),
                            timeout=10,
                        )
                except grpc.RpcError as exc:
                    log.warning("notify_failed", job_id=job.job_id, checkpoint_id=checkpoint_id, code=exc.code().name)

        self._io.submit(send)

    def _delete(self, action: cc.DeleteObjects) -> None:
        try:
            self.storage.delete(action.metadata_keys)
            self.storage.delete(action.object_keys)
        except WeirError as exc:
            log.warning("checkpoint_cleanup_failed", error=str(exc), objects=len(action.object_keys))

    def list_checkpoints(self, job_id: str) -> jobmanager_pb2.ListCheckpointsResponse:
        with self._lock:
            stats = self._job(job_id).coordinator.stats()
        response = jobmanager_pb2.ListCheckpointsResponse()
        for summary in stats.history:
            info = response.checkpoints.add(
                checkpoint_id=summary.checkpoint_id,
                status=summary.status.value,
                trigger_time=summary.trigger_timestamp,
                duration_s=summary.duration_s or 0.0,
                size_bytes=summary.state_size_bytes,
                failure=summary.failure.message if summary.failure is not None else "",
                kind=(
                    common_pb2.CHECKPOINT_KIND_SAVEPOINT
                    if summary.kind is CheckpointKind.SAVEPOINT
                    else common_pb2.CHECKPOINT_KIND_CHECKPOINT
                ),
            )
            for t in summary.tasks:
                info.tasks.add(
                    task=common_pb2.TaskRef(
                        job_id=job_id, vertex_uid=t.task_id.operator_uid, subtask=t.task_id.subtask
                    ),
                    alignment_duration_s=t.alignment_duration_s,
                    start_delay_s=t.start_delay_s,
                    state_size_bytes=t.state_size_bytes,
                )
        return response

    # Recovery of a restarted JobManager -----------------------------------------------------------

    def recover_jobs(self) -> int:
        """Reload every job from its record and its checkpoints' metadata: running ones restart, a
        cancelling one finishes cancelling, an ended one whose transactions were not resolved gets
        them resolved. A record that cannot be read is reported and left alone, never deleted."""
        recovered = 0
        records = [k for k, _ in self.storage.list("") if k.endswith("/_job")]
        now = self._clock()
        for key in records:
            try:
                record = JobRecord.from_json(self.storage.get_bytes(key), where=f"job record {key}")
            except WeirError as exc:
                log.error("job_not_recovered", record=key, error=str(exc))
                continue
            submission = record.submission
            try:
                loaded = load_job_source(
                    submission.job_source,
                    submission.job_file_name,
                    submission.parameters,
                    submission.parallelism,
                    submission.job_name,
                )
            except WeirError as exc:
                log.error("job_not_recovered", job_id=submission.job_id, error=str(exc))
                continue
            job = JobMaster.create(submission, loaded, self.paths.metadata_key_fn())
            job.attempt = record.attempt
            job.failure = record.failure
            job.transactions_resolved = record.transactions_resolved
            for task_key, total in record.records_in_all_attempts.items():
                if task_key in job.tasks:
                    job.tasks[task_key].records_in_earlier_attempts = total
            status = JobStatus(record.status)
            checkpoints: list[CompletedCheckpoint] = []
            highest = record.checkpoint_ids_reserved_through
            for meta_key, _size in self.storage.list(self.paths.checkpoints_dir(JobId(submission.job_id))):
                parsed = self.paths.parse_metadata_key(meta_key)
                if parsed is None:
                    continue
                highest = max(highest, parsed.checkpoint_id)
                checkpoints.append(pickle.loads(self.storage.get_bytes(meta_key)))
            actions = job.coordinator.load_completed(checkpoints, CheckpointId(highest) if highest else None)
            self._execute(job, actions)
            end_attempt: int | None = None
            if status is JobStatus.CANCELLING:
                job.status = JobStatus.CANCELLING  # finish cancelling; never restart a cancelled job
                job.cancel_requested_at = now
                end_attempt = job.attempt
            elif status.terminal:
                job.status = status
                if status is not JobStatus.FINISHED and not job.transactions_resolved:
                    end_attempt = job.attempt
            else:
                # Tasks of the previous attempt may still run on the TaskManagers: heartbeats cancel them.
                job.status = JobStatus.RESTARTING
                job.restart_at = now + HEARTBEAT_TIMEOUT_S / 2
            with self._lock:
                self.jobs[submission.job_id] = job
            if end_attempt is not None:
                self._io.submit(self._end_job, job, end_attempt)
            recovered += 1
            log.info(
                "job_recovered",
                job_id=submission.job_id,
                status=job.status.value,
                attempt=job.attempt,
                checkpoints=[c.checkpoint_id for c in checkpoints],
                checkpoint_ids_reserved_through=record.checkpoint_ids_reserved_through,
            )
        return recovered

    # Reads ----------------------------------------------------------------------------------------

    def job_status(self, job_id: str) -> jobmanager_pb2.GetJobStatusResponse:
        with self._lock:
            job = self._job(job_id)
            latest = job.coordinator.store.latest()
            response = jobmanager_pb2.GetJobStatusResponse(
                summary=self._summary(job),
                last_completed_checkpoint=latest.checkpoint_id if latest is not None else 0,
                last_restore_at=job.last_restore_at,
            )
            if job.failure is not None:
                response.failure.CopyFrom(failure_to_proto(job.failure))
            for (uid, s), t in sorted(job.tasks.items()):
                task = response.tasks.add(
                    task=common_pb2.TaskRef(job_id=job_id, vertex_uid=uid, subtask=s),
                    operator_names=t.operator_names,
                    state=t.state,
                    taskmanager_id=t.taskmanager_id,
                    records_in=t.records_in,
                    records_out=t.records_out,
                    records_in_all_attempts=t.records_in_all_attempts,
                )
                if t.failure is not None:
                    task.failure.CopyFrom(failure_to_proto(t.failure))
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


_STATUS_OF: dict[type[WeirError], grpc.StatusCode] = {
    UnknownJobError: grpc.StatusCode.NOT_FOUND,
    NotEnoughSlotsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    JobDefinitionError: grpc.StatusCode.INVALID_ARGUMENT,
    ServiceUnavailableError: grpc.StatusCode.FAILED_PRECONDITION,  # e.g. the job's input topic is missing
}


def _abort(context: grpc.ServicerContext, exc: WeirError) -> None:
    code = next((c for kind, c in _STATUS_OF.items() if isinstance(exc, kind)), None)
    if code is None:
        code = getattr(grpc.StatusCode, getattr(exc, "grpc_code", "INTERNAL"))
    context.abort(code, str(exc))


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
        self._jm.register_taskmanager(
            request.taskmanager_id, request.address, request.slots, request.metrics_port, request.incarnation
        )
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

"""What a TaskManager tells the JobManager about its tasks, off the task threads.

:class:`JobManagerReports` sends task states, ends of input, acknowledgements and declines in order
on a thread of its own, retried with back-off while the JobManager is unreachable (a refused
acknowledgement becomes a decline, never a silent drop). :class:`CheckpointAcknowledger` turns a
task's :class:`~weir.taskmanager.task_types.CheckpointAck` into the acknowledgement request: its
operator state stored inline, or as one object written on a background thread when large, its
broadcast states as content-addressed objects (``weir.core.broadcast_state``: the subtasks with the
same copy write the same key, so the checkpoint stores it once), and its task-state document
(``docs/formats.md``); one too large for a control message is declined with the reason instead of
timing out.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import ClassVar, Final, Protocol, assert_never

import grpc
import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.broadcast_state import StatePlacement, place_operator_states
from weir.core.checkpointing import CheckpointKind
from weir.core.codec import task_state_to_proto, timeline_to_proto
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex
from weir.core.paths import CheckpointPaths
from weir.core.states import TaskState
from weir.core.task_state import (
    INFLIGHT_STATE_NAME,
    INLINE_STATE_LIMIT_BYTES,
    InlineOperatorState,
    OperatorStateHandle,
    StoredOperatorState,
    TaskStateDocument,
    encode_task_state,
    pack_operator_states,
    relative_operator_state,
)
from weir.core.transport import MAX_MESSAGE_BYTES
from weir.taskmanager.snapshots import keyed_state_to_document, relative_handle
from weir.taskmanager.task_types import CheckpointAck, TaskAddress
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc

log = structlog.get_logger("weir.taskmanager")

RETRY_MAX_S: Final = 1.0
"""The longest pause between two tries of a report to an unreachable JobManager."""

ACK_HEADROOM_BYTES: Final = 64 * 1024
"""Room left below the gRPC message limit for the acknowledgement's own fields."""


@dataclass(frozen=True)
class StateReport:
    """A task's state (or its end of input) for the JobManager. ``sent``, when given, is set once the
    JobManager took the report (or the reporter gave it up): a failed task waits for it before it
    closes its output channels (``TaskHost``)."""

    kind: ClassVar[str] = "state"
    request: jobmanager_pb2.ReportTaskStateRequest
    sent: threading.Event | None = field(default=None, compare=False)


@dataclass(frozen=True)
class AckReport:
    kind: ClassVar[str] = "ack"
    request: jobmanager_pb2.AcknowledgeCheckpointRequest


@dataclass(frozen=True)
class DeclineReport:
    kind: ClassVar[str] = "decline"
    request: jobmanager_pb2.DeclineCheckpointRequest


@dataclass(frozen=True)
class StopReporting:
    """The TaskManager stops: the reporter ends."""


Report = StateReport | AckReport | DeclineReport | StopReporting


class ReportSink(Protocol):
    """Where reports go (the reporter's queue; a test's list)."""

    def put(self, report: Report) -> None: ...


def task_ref(addr: TaskAddress) -> common_pb2.TaskRef:
    return common_pb2.TaskRef(job_id=addr.job_id, vertex_uid=addr.vertex_uid, subtask=addr.subtask)


def decline_report(addr: TaskAddress, checkpoint_id: int, reason: str) -> DeclineReport:
    return DeclineReport(
        jobmanager_pb2.DeclineCheckpointRequest(
            task=task_ref(addr), checkpoint_id=checkpoint_id, attempt=addr.attempt, reason=reason
        )
    )


def input_ended_report(addr: TaskAddress) -> StateReport:
    return StateReport(
        jobmanager_pb2.ReportTaskStateRequest(
            task=task_ref(addr),
            state=task_state_to_proto(TaskState.RUNNING),
            attempt=addr.attempt,
            input_ended=True,
        )
    )


def oversized_ack_reason(size_bytes: int, limit_bytes: int, checkpoint_id: int) -> str | None:
    """Why an acknowledgement of ``size_bytes`` cannot be sent under a ``limit_bytes`` message limit;
    None when it fits. The checkpoint is declined with this reason instead of timing out."""
    if size_bytes + ACK_HEADROOM_BYTES <= limit_bytes:
        return None
    return (
        f"the acknowledgement of checkpoint {checkpoint_id} is {size_bytes:,} bytes, over the "
        f"{limit_bytes - ACK_HEADROOM_BYTES:,}-byte limit of a control message: the task's inline state (e.g. "
        "a transactional sink's pending output) is too large; checkpoint more often or lower the sink's backlog"
    )


class JobManagerReports:
    """The reports of one TaskManager, sent in order by one thread; see the module."""

    def __init__(self, jobmanager: jobmanager_pb2_grpc.JobManagerServiceStub, stopping: threading.Event) -> None:
        self._jobmanager = jobmanager
        self._stopping = stopping  # the TaskManager's: once set, no retry goes on and no next report is sent
        self._queue: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="reporter", daemon=True)
        self._thread.start()

    def put(self, report: Report) -> None:
        self._queue.put(report)

    def stop(self) -> None:
        """Wake the thread so that it ends (after ``stopping`` was set)."""
        self._queue.put(StopReporting())

    def _send(self, report: StateReport | AckReport | DeclineReport) -> None:
        """One report to the JobManager; raises grpc.RpcError."""
        match report:
            case StateReport(request=request):
                self._jobmanager.ReportTaskState(request, timeout=10)
            case AckReport(request=request):
                self._jobmanager.AcknowledgeCheckpoint(request, timeout=10)
            case DeclineReport(request=request):
                self._jobmanager.DeclineCheckpoint(request, timeout=10)
            case _:
                assert_never(report)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            report = self._queue.get()
            if isinstance(report, StopReporting):
                return
            try:
                self._deliver(report)
            finally:
                if isinstance(report, StateReport) and report.sent is not None:
                    report.sent.set()

    def _deliver(self, report: StateReport | AckReport | DeclineReport) -> None:
        """Send ``report``, retried while the JobManager is unreachable (until the TaskManager stops)."""
        delay = 0.2
        while not self._stopping.is_set():
            try:
                self._send(report)
                break
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    # Reports go in order: one retried through a JobManager's restart holds up the
                    # restarted attempt's (its tasks RUNNING, which the first checkpoint waits for),
                    # so the retries stay at most RETRY_MAX_S apart.
                    self._stopping.wait(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                log.warning("report_rejected", kind=report.kind, code=exc.code().name, details=exc.details())
                # An acknowledgement refused (e.g. too large for the JobManager): decline it, never drop it.
                if isinstance(report, AckReport):
                    request = report.request
                    self._queue.put(
                        DeclineReport(
                            jobmanager_pb2.DeclineCheckpointRequest(
                                task=request.task,
                                checkpoint_id=request.checkpoint_id,
                                attempt=request.attempt,
                                reason=(
                                    f"the JobManager refused the acknowledgement: {exc.code().name}: {exc.details()}"
                                ),
                            ),
                        )
                    )
                break


class CheckpointAcknowledger:
    """A task's checkpoint acknowledgements into acknowledgement requests; see the module.
    ``acknowledged`` is told after each acknowledgement is queued (the TaskManager's state gauge)."""

    def __init__(
        self,
        storage: CheckpointStorage,
        paths: CheckpointPaths,
        reports: ReportSink,
        acknowledged: Callable[[], None] = lambda: None,
    ) -> None:
        self._storage = storage
        self._paths = paths
        self._reports = reports
        self._acknowledged = acknowledged
        # The async phase of a task's operator state: its object written, then the acknowledgement.
        self._state_writes = ThreadPoolExecutor(4, thread_name_prefix="operator-state-write")

    def shutdown(self) -> None:
        """Acknowledgements still being stored go out first."""
        self._state_writes.shutdown(wait=True)

    def acknowledge(self, addr: TaskAddress, ack: CheckpointAck) -> None:
        """Store the task's operator state (inline below ``INLINE_STATE_LIMIT_BYTES``, else as one
        object; its broadcast states as content-addressed objects; the objects written on a background
        thread), then acknowledge with the task-state document."""
        snapshot = ack.snapshot
        job_id, cid = JobId(addr.job_id), CheckpointId(snapshot.checkpoint_id)

        def broadcast_key(uid: str, digest: str) -> str:
            return self._paths.broadcast_state(job_id, cid, OperatorUid(uid), digest, snapshot.kind)

        placement = place_operator_states(snapshot.operator_states, snapshot.broadcast_operator_uids, broadcast_key)
        if not placement.writes and sum(len(b) for b in placement.own.values()) < INLINE_STATE_LIMIT_BYTES:
            self._acknowledge(addr, ack, InlineOperatorState(dict(placement.own)), write_s=0.0)
            return
        self._state_writes.submit(self._store_and_acknowledge, addr, ack, placement)

    def _store_and_acknowledge(self, addr: TaskAddress, ack: CheckpointAck, placement: StatePlacement) -> None:
        snapshot = ack.snapshot
        cid = CheckpointId(snapshot.checkpoint_id)
        started = time.perf_counter()
        handle: OperatorStateHandle
        writes = dict(placement.writes)
        if sum(len(b) for b in placement.own.values()) < INLINE_STATE_LIMIT_BYTES:
            handle = InlineOperatorState(dict(placement.own), dict(placement.broadcast))
        else:
            key = self._paths.task_state(
                JobId(addr.job_id), cid, OperatorUid(addr.vertex_uid), SubtaskIndex(addr.subtask), snapshot.kind
            )
            handle, writes[key] = pack_operator_states(placement.own, key, placement.broadcast)
        for key, blob in writes.items():
            try:
                if key in placement.writes and self._storage.exists(key):
                    # Content-addressed: a subtask with the same copy wrote it (a write is atomic, so it is whole).
                    log.info("broadcast_state_shared", task=str(addr), checkpoint_id=cid, key=key, bytes=len(blob))
                    continue
                self._storage.put_bytes(key, blob)
            except Exception as exc:  # the checkpoint cannot complete without it; the next one may
                log.warning("operator_state_write_failed", task=str(addr), checkpoint_id=cid, key=key, error=str(exc))
                self._reports.put(decline_report(addr, cid, f"writing the operator state to {key} failed: {exc}"))
                return
            log.info("operator_state_written", task=str(addr), checkpoint_id=cid, key=key, bytes=len(blob))
        write_s = time.perf_counter() - started
        if ack.timeline is not None:  # the asynchronous part ends with this write
            ack = replace(ack, timeline=replace(ack.timeline, async_end_at=max(ack.timeline.async_end_at, time.time())))
        self._acknowledge(addr, ack, handle, write_s=write_s)

    def _acknowledge(
        self, addr: TaskAddress, ack: CheckpointAck, operator_state: OperatorStateHandle, write_s: float
    ) -> None:
        snapshot = ack.snapshot
        keyed = snapshot.keyed_state
        objects = [
            jobmanager_pb2.StateObjectRef(key=f.key, size_bytes=f.size_bytes, reused=f.reused)
            for f in (keyed.objects if keyed is not None else ())
        ]
        if isinstance(operator_state, StoredOperatorState):
            objects.append(jobmanager_pb2.StateObjectRef(key=operator_state.key, size_bytes=operator_state.size_bytes))
        objects.extend(
            jobmanager_pb2.StateObjectRef(key=ref.key, size_bytes=ref.size_bytes)
            for ref in operator_state.broadcast.values()
        )
        if snapshot.kind is CheckpointKind.SAVEPOINT:
            # A savepoint is relocatable: its document's keys are relative to its folder (docs/formats.md);
            # the acknowledgement's objects keep the full keys the JobManager accounts for.
            folder = self._paths.checkpoint_dir(JobId(addr.job_id), CheckpointId(snapshot.checkpoint_id), snapshot.kind)
            keyed = relative_handle(keyed, folder) if keyed is not None else None
            operator_state = relative_operator_state(operator_state, folder)
        document = TaskStateDocument(
            job_id=addr.job_id,
            vertex_uid=addr.vertex_uid,
            subtask=addr.subtask,
            attempt=addr.attempt,
            checkpoint_id=CheckpointId(snapshot.checkpoint_id),
            layout=snapshot.layout,
            operator_state=operator_state,
            keyed_state=keyed_state_to_document(keyed) if keyed is not None else None,
        )
        payload = encode_task_state(document)
        request = jobmanager_pb2.AcknowledgeCheckpointRequest(
            task=task_ref(addr),
            checkpoint_id=snapshot.checkpoint_id,
            attempt=addr.attempt,
            state_handle=payload,
            alignment_duration_s=ack.alignment_s,
            start_delay_s=ack.start_delay_s,
            state_size_bytes=len(payload) + sum(o.size_bytes for o in objects),
            objects=objects,
            sync_duration_s=ack.sync_s,
            async_duration_s=ack.async_s + write_s,
            unaligned=INFLIGHT_STATE_NAME in snapshot.operator_states,
            inflight_bytes=ack.inflight_bytes,
        )
        if ack.timeline is not None:
            request.timeline.CopyFrom(timeline_to_proto(ack.timeline))
        too_large = oversized_ack_reason(request.ByteSize(), MAX_MESSAGE_BYTES, snapshot.checkpoint_id)
        if too_large is not None:
            log.warning(
                "checkpoint_ack_too_large",
                task=str(addr),
                checkpoint_id=snapshot.checkpoint_id,
                bytes=request.ByteSize(),
            )
            self._reports.put(decline_report(addr, snapshot.checkpoint_id, too_large))
            return
        self._reports.put(AckReport(request))
        self._acknowledged()

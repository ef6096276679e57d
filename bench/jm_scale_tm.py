"""Simulated TaskManagers speaking the real gRPC protocol, many in one light process (bench/jm_scale.py).

``python -m bench.jm_scale_tm --jobmanager HOST:PORT --first I --count K ...`` starts K TaskManagers
``sim-tm-<I>..``, each with its own ``grpc.aio`` server (the ``TaskManagerService`` the JobManager
calls: deploy, cancel, trigger, notify) on a free port and its own channel to the JobManager. Each
registers, heartbeats at the interval the JobManager answers with the progress of its tasks, reports
DEPLOYING then RUNNING for each task deployed to it, and acknowledges checkpoints after
``--ack-delay`` (``bench.jm_scale.ack_due``) with the state handles of ``bench.jm_scale.StateModel``.
Like a real TaskManager's report thread, one TaskManager sends its reports and acknowledgements one
at a time, in order. It prints ``ready`` once every TaskManager registered; on ``stop`` (standard
input) it prints its books as one JSON line and exits. No task runs: no data flows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from bench.jm_scale import VERTEX_UIDS, CheckpointTimes, StateModel, ack_due, heartbeat_offsets
from weir.core.transport import GRPC_OPTIONS
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc, taskmanager_pb2, taskmanager_pb2_grpc


@dataclass
class Task:
    job_id: str
    vertex: str
    subtask: int
    attempt: int
    records: int = 0
    completed_ssts: tuple[str, ...] = ()
    pending_ssts: dict[int, tuple[str, ...]] = field(default_factory=dict)


class Books:
    """What the process saw, across its TaskManagers."""

    def __init__(self) -> None:
        self.checkpoints: dict[int, CheckpointTimes] = {}
        self.source_triggers: dict[int, list[float]] = {}
        self.notified: dict[int, set[str]] = {}
        self.hosting: set[str] = set()
        self.running_reported: list[float] = []
        self.heartbeat_wall_s: list[float] = []
        self.ack_wall_s: list[float] = []
        self.errors = 0

    def times(self, checkpoint_id: int) -> CheckpointTimes:
        return self.checkpoints.setdefault(checkpoint_id, CheckpointTimes())

    def report(self) -> dict[str, Any]:
        return {
            "checkpoints": {str(c): asdict(t) for c, t in self.checkpoints.items()},
            "notified": {str(c): sorted(tms) for c, tms in self.notified.items()},
            "hosting": sorted(self.hosting),
            "running_reported": self.running_reported,
            "heartbeat_wall_s": self.heartbeat_wall_s,
            "ack_wall_s": self.ack_wall_s,
            "errors": self.errors,
        }


class Process:
    """The TaskManagers of this process, and the barrier model across them."""

    def __init__(self, ack_delay_s: float, state: StateModel) -> None:
        self.ack_delay_s = ack_delay_s
        self.state = state
        self.books = Books()
        self.taskmanagers: list[SimTaskManager] = []

    def sources_here(self) -> int:
        return sum(1 for tm in self.taskmanagers for t in tm.tasks.values() if t.vertex == VERTEX_UIDS[0])

    def triggered(self, tm: SimTaskManager, request: taskmanager_pb2.TriggerCheckpointRequest) -> None:
        now = time.time()
        cid = request.checkpoint_id
        times = self.books.times(cid)
        times.first_trigger = times.first_trigger or now
        times.last_trigger = now
        triggers = self.books.source_triggers.setdefault(cid, [])
        triggers.append(now)
        loop = asyncio.get_running_loop()
        key = (request.task.vertex_uid, request.task.subtask)
        due = ack_due(True, now, triggers, self.sources_here(), self.ack_delay_s)
        if due is not None and key in tm.tasks:
            loop.call_at(loop.time() + (due - now), tm.enqueue_ack, key, request.attempt, cid)
        later = ack_due(False, None, triggers, self.sources_here(), self.ack_delay_s)
        if later is not None and len(triggers) == self.sources_here():
            for other in self.taskmanagers:
                for k, t in other.tasks.items():
                    if t.vertex != VERTEX_UIDS[0]:
                        loop.call_at(loop.time() + (later - now), other.enqueue_ack, k, request.attempt, cid)


class SimTaskManager(taskmanager_pb2_grpc.TaskManagerServiceServicer):
    def __init__(self, process: Process, name: str, jobmanager: str, slots: int) -> None:
        self.process = process
        self.name = name
        self.slots = slots
        self.tasks: dict[tuple[str, int], Task] = {}
        self.reports: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.channel = grpc.aio.insecure_channel(jobmanager, options=GRPC_OPTIONS)
        self.jobmanager = jobmanager_pb2_grpc.JobManagerServiceStub(self.channel)
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(self, self.server)
        self.address = ""
        self.interval_s = 1.0

    async def start(self) -> None:
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        response = await self.jobmanager.RegisterTaskManager(
            jobmanager_pb2.RegisterTaskManagerRequest(
                taskmanager_id=self.name,
                address=self.address,
                slots=self.slots,
                metrics_port=0,
                incarnation=f"{self.name}-{time.time_ns()}",
            ),
            timeout=30,
        )
        self.interval_s = response.heartbeat_interval_s or 1.0

    # -- the JobManager's calls ---------------------------------------------------------------------

    async def DeployTask(self, request: Any, context: Any) -> taskmanager_pb2.DeployTaskResponse:  # noqa: N802
        key = (request.task.vertex_uid, request.task.subtask)
        self.tasks[key] = Task(request.task.job_id, key[0], key[1], request.attempt)
        self.process.books.hosting.add(self.name)
        for state in (common_pb2.TASK_STATE_DEPLOYING, common_pb2.TASK_STATE_RUNNING):
            self.reports.put_nowait(
                (
                    "state",
                    jobmanager_pb2.ReportTaskStateRequest(
                        task=common_pb2.TaskRef(job_id=request.task.job_id, vertex_uid=key[0], subtask=key[1]),
                        state=state,
                        attempt=request.attempt,
                    ),
                )
            )
        return taskmanager_pb2.DeployTaskResponse()

    async def CancelJobTasks(self, request: Any, context: Any) -> taskmanager_pb2.CancelJobTasksResponse:  # noqa: N802
        for key in [k for k, t in self.tasks.items() if t.job_id == request.job_id and t.attempt <= request.attempt]:
            del self.tasks[key]
        return taskmanager_pb2.CancelJobTasksResponse()

    async def TriggerCheckpoint(  # noqa: N802
        self, request: Any, context: Any
    ) -> taskmanager_pb2.TriggerCheckpointResponse:
        self.process.triggered(self, request)
        return taskmanager_pb2.TriggerCheckpointResponse(accepted=True)

    async def NotifyCheckpointComplete(  # noqa: N802
        self, request: Any, context: Any
    ) -> taskmanager_pb2.NotifyCheckpointCompleteResponse:
        now = time.time()
        cid = request.checkpoint_id
        times = self.process.books.times(cid)
        times.first_complete = times.first_complete or now
        times.last_complete = now
        self.process.books.notified.setdefault(cid, set()).add(self.name)
        for t in self.tasks.values():
            if cid in t.pending_ssts:
                t.completed_ssts = t.pending_ssts.pop(cid)
                t.pending_ssts = {c: s for c, s in t.pending_ssts.items() if c > cid}
        return taskmanager_pb2.NotifyCheckpointCompleteResponse()

    async def NotifyCheckpointAborted(  # noqa: N802
        self, request: Any, context: Any
    ) -> taskmanager_pb2.NotifyCheckpointAbortedResponse:
        times = self.process.books.times(request.checkpoint_id)
        times.aborted_at = times.aborted_at or time.time()
        for t in self.tasks.values():
            t.pending_ssts.pop(request.checkpoint_id, None)
        return taskmanager_pb2.NotifyCheckpointAbortedResponse()

    # -- what it sends ------------------------------------------------------------------------------

    def enqueue_ack(self, key: tuple[str, int], attempt: int, checkpoint_id: int) -> None:
        task = self.tasks.get(key)
        if task is None or task.attempt != attempt:
            return
        state = self.process.state
        objects = state.objects(task.job_id, key[0], key[1], checkpoint_id, task.completed_ssts)
        task.pending_ssts[checkpoint_id] = StateModel.ssts(objects)
        request = jobmanager_pb2.AcknowledgeCheckpointRequest(
            task=common_pb2.TaskRef(job_id=task.job_id, vertex_uid=key[0], subtask=key[1]),
            checkpoint_id=checkpoint_id,
            attempt=attempt,
            state_handle=b"x" * state.inline_bytes,
            alignment_duration_s=0.001,
            start_delay_s=0.001,
            state_size_bytes=sum(o.size_bytes for o in objects) + state.inline_bytes,
            objects=[
                jobmanager_pb2.StateObjectRef(key=o.key, size_bytes=o.size_bytes, reused=o.reused) for o in objects
            ],
            sync_duration_s=0.001,
            async_duration_s=self.process.ack_delay_s,
        )
        self.reports.put_nowait(("ack", request))

    async def send_reports(self) -> None:
        books = self.process.books
        while True:
            kind, request = await self.reports.get()
            started = time.perf_counter()
            try:
                if kind == "ack":
                    await self.jobmanager.AcknowledgeCheckpoint(request, timeout=10)
                    now = time.time()
                    books.ack_wall_s.append(time.perf_counter() - started)
                    times = books.times(request.checkpoint_id)
                    times.last_ack = now if times.last_ack is None else max(times.last_ack, now)
                else:
                    await self.jobmanager.ReportTaskState(request, timeout=10)
                    if request.state == common_pb2.TASK_STATE_RUNNING:
                        books.running_reported.append(time.time())
            except grpc.RpcError:
                books.errors += 1

    async def heartbeat_loop(self, offset_s: float) -> None:
        books = self.process.books
        await asyncio.sleep(offset_s)
        while True:
            beat = jobmanager_pb2.HeartbeatRequest(taskmanager_id=self.name)
            now_ms = int(time.time() * 1000)
            for (vertex, subtask), t in self.tasks.items():
                t.records += 1000
                beat.running_tasks.add(
                    task=common_pb2.TaskRef(job_id=t.job_id, vertex_uid=vertex, subtask=subtask),
                    attempt=t.attempt,
                    records_in=t.records,
                    records_out=t.records,
                    busy_ratio=0.5,
                    backpressured_ratio=0.1,
                    idle_ratio=0.4,
                    input_watermark_ms=now_ms - 2000,
                )
            started = time.perf_counter()
            try:
                await self.jobmanager.Heartbeat(beat, timeout=10)
                books.heartbeat_wall_s.append(time.perf_counter() - started)
            except grpc.RpcError:
                books.errors += 1
            await asyncio.sleep(max(0.0, self.interval_s - (time.perf_counter() - started)))


async def run(args: argparse.Namespace) -> None:
    state = StateModel(**json.loads(args.state))
    process = Process(args.ack_delay, state)
    for i in range(args.first, args.first + args.count):
        process.taskmanagers.append(SimTaskManager(process, f"sim-tm-{i:03d}", args.jobmanager, args.slots))
    await asyncio.gather(*(tm.start() for tm in process.taskmanagers))
    loops = [asyncio.create_task(tm.send_reports()) for tm in process.taskmanagers]
    offsets = heartbeat_offsets(len(process.taskmanagers), process.taskmanagers[0].interval_s)
    loops += [asyncio.create_task(tm.heartbeat_loop(o)) for tm, o in zip(process.taskmanagers, offsets, strict=True)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for loop in loops:
        loop.cancel()
    await asyncio.gather(*(tm.server.stop(grace=None) for tm in process.taskmanagers))
    print(json.dumps(process.books.report()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jm_scale_tm")
    parser.add_argument("--jobmanager", required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--ack-delay", type=float, default=0.05)
    parser.add_argument("--state", default="{}", help="bench.jm_scale.StateModel's fields, JSON")
    parser.add_argument("--sources", type=int, default=0, help="unused: the barrier model counts the sources here")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

"""How far one JobManager goes (performance issue, item 5): checkpoint coordination, heartbeats and
deployment for up to 1,000 subtasks on 100 TaskManagers.

``make bench-jm-scale`` (``.venv/bin/python -m bench.jm_scale [--quick] [--skip-grpc]``) drives the real
``weir.jobmanager.manager.JobManager`` (lifecycle, checkpoint coordinator, action executor, monitor
thread, job records and checkpoint metadata written to ``file://`` storage, or the real S3 storage with
``--storage s3``) with a generated job (``job_source``: five vertices joined by all-to-all edges, as
Flink's scale tests use a job of a few vertices at parallelism P) and simulated TaskManagers. The
TaskManagers are simulated two ways, for two different questions:

- **in-process** (every figure of the curves): the simulator sits behind the JobManager's
  ``TaskManagerGateway`` and calls its TaskManager-facing methods (``register_taskmanager``,
  ``heartbeat``, ``report_task_state``, ``acknowledge_checkpoint``) from a few threads, one lane per
  TaskManager, as a TaskManager's single report thread would. Without a network or a codec in the
  way, the JobManager's own CPU is measured exactly: the CPU time of its threads (``jm-*``, read from
  ``/proc``) plus the thread CPU time spent inside each call the simulated TaskManagers make; the
  simulator's own work on the JobManager's threads (the gateway) is measured and taken off. The
  deployment requests are still encoded to protobuf as the gRPC gateway would encode them.
- **over gRPC** (a few points): the real ``python -m weir.jobmanager`` process, and light processes
  (``bench/jm_scale_tm.py``) each hosting many TaskManagers, one ``grpc.aio`` server and one channel
  per TaskManager, speaking the real protocol. The JobManager's process CPU then includes protobuf,
  the servicer and gRPC's threads, which the in-process figures leave out.

A simulated TaskManager registers, heartbeats every ``HEARTBEAT_INTERVAL_S`` with the progress of each
task it runs (counters, time shares, a watermark), reports DEPLOYING then RUNNING for each task
deployed to it, and acknowledges each checkpoint ``--ack-delay`` after the barrier reaches the task
(``ack_due``: a source when it is triggered, any other task once every source of its process was),
with a realistic state handle (``StateModel``: an inline task-state document, and for the keyed
vertices RocksDB SST files of which most are reused from the last completed checkpoint, as
incremental snapshots do, plus the private files of each snapshot).

Measured per point: deployment (submit, the placement under the lock, the last deploy call, every
task RUNNING), checkpoint round trip (the first trigger a TaskManager receives to the last
completion notice, per checkpoint), the JobManager's CPU per second of steady state, the cost of one
heartbeat, of one acknowledgement, of a monitor tick, of a job record write and of a checkpoint's
metadata; and the symptoms of what breaks (``symptoms``). Results: ``bench/results/jm_scale.json``,
``jm_scale.md`` and ``docs/benchmarks-jm-scale.md`` (generated from the JSON, never by hand). A run
with ``--label before`` writes ``jm_scale-before.json`` instead, which the document compares with.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from weir.core.ids import CheckpointId, JobId, TaskManagerId
from weir.core.paths import CheckpointPaths

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS_DIR: Final = REPO_ROOT / "bench" / "results"
DOC_PATH: Final = REPO_ROOT / "docs" / "benchmarks-jm-scale.md"
RESULT_NAME: Final = "jm_scale"

VERTICES: Final = 5
KEYED_VERTICES: Final = ("aggregate", "window")  # the vertices with RocksDB state (SST files)
VERTEX_UIDS: Final = ("source", "parse", "aggregate", "window", "sink")
SUBTASK_POINTS: Final = (10, 50, 100, 250, 500, 1000, 2000)  # 2000: past the brief, to see what breaks next
TASKMANAGER_POINTS: Final = (1, 10, 50, 100)
TM_SWEEP_SUBTASKS: Final = 500
MAX_TASKMANAGERS: Final = 100
GRPC_POINTS: Final = ((100, 10), (500, 50), (1000, 100), (2000, 100))
QUICK_SUBTASK_POINTS: Final = (10, 100, 500)
QUICK_TASKMANAGER_POINTS: Final = (1, 50)
QUICK_GRPC_POINTS: Final = ((500, 50),)

HEARTBEAT_TIMEOUT_S: Final = 6.0  # weir.jobmanager.registry.HEARTBEAT_TIMEOUT_S (checked at run time)
TICK_INTERVAL_S: Final = 0.2  # weir.jobmanager.monitor.TICK_INTERVAL_S (checked at run time)
ONE_CORE: Final = 1.0
HEARTBEAT_INTERVAL_S: Final = 1.0  # weir.jobmanager.registry.HEARTBEAT_INTERVAL_S (checked at run time)
IDLE_WINDOW_S: Final = 2.0


# ---------------------------------------------------------------------------------------------------
# Pure parts (tests/unit/bench/test_jm_scale.py)


def parallelism_for(subtasks: int, vertices: int = VERTICES) -> int:
    """The parallelism P giving ``subtasks`` subtasks over ``vertices`` vertices of equal parallelism."""
    if subtasks < vertices or subtasks % vertices:
        raise ValueError(f"{subtasks} subtasks do not split evenly over {vertices} vertices")
    return subtasks // vertices


def job_source(max_parallelism: int) -> bytes:
    """A job of five vertices, every edge all-to-all (rebalance or key_by), so nothing chains:
    source -> parse -> aggregate (keyed) -> window (keyed) -> sink. Its tasks never run: only the
    JobManager loads it, plans it and deploys it to the simulated TaskManagers."""
    return textwrap.dedent(
        f'''
        """Generated by bench/jm_scale.py: five vertices, all-to-all edges."""
        from weir.api import Environment


        def build(env: Environment) -> None:
            env.set_max_parallelism({max_parallelism})
            events = env.from_generator(lambda i: {{"key": i % 1000, "value": i}}, uid="source")
            parsed = events.rebalance().map(lambda e: e, uid="parse")
            totals = parsed.key_by(lambda e: e["key"]).reduce(lambda a, b: b, uid="aggregate")
            windows = totals.key_by(lambda e: e["key"]).reduce(lambda a, b: b, uid="window")
            windows.rebalance().print(uid="sink")
        '''
    ).encode()


def slots_per_taskmanager(parallelism: int, taskmanagers: int) -> int:
    """Slots each TaskManager offers so that the job (slot sharing: P slots) fits exactly."""
    return max(1, math.ceil(parallelism / taskmanagers))


def taskmanagers_for(subtasks: int) -> int:
    """The TaskManagers of the size sweep: ten subtasks each, at most ``MAX_TASKMANAGERS``."""
    return max(1, min(MAX_TASKMANAGERS, subtasks // 10))


def heartbeat_cpu(idle_cpu_per_s: float, empty_cpu_per_s: float, taskmanagers: int, interval_s: float) -> float:
    """CPU seconds per heartbeat over gRPC: what the TaskManagers' idle heartbeats add to the JobManager
    alone, over the heartbeats per second."""
    return max(0.0, idle_cpu_per_s - empty_cpu_per_s) * interval_s / taskmanagers


def heartbeat_offsets(taskmanagers: int, interval_s: float) -> list[float]:
    """When each TaskManager's heartbeats fall within the interval: spread evenly, as independent
    processes started at different times would be."""
    return [interval_s * i / taskmanagers for i in range(taskmanagers)]


def ack_due(
    task_is_source: bool,
    own_trigger_at: float | None,
    source_triggers: Sequence[float],
    sources_expected: int,
    delay_s: float,
) -> float | None:
    """When a task acknowledges a checkpoint (None: not yet known). A source snapshots when it is
    triggered; any other task once the barriers of every source (of its simulator process) reached
    it, i.e. after the last source trigger: downstream of all-to-all edges a task aligns the barriers
    of all its inputs. ``delay_s`` stands for the barrier's travel and the snapshot."""
    if task_is_source:
        return None if own_trigger_at is None else own_trigger_at + delay_s
    if sources_expected <= 0 or len(source_triggers) < sources_expected:
        return None
    return max(source_triggers) + delay_s


_PATHS: Final = CheckpointPaths()


@dataclass(frozen=True)
class SimObject:
    """A state object as the simulated task acknowledges it (``weir.jobmanager.checkpointing.pending.StateObject``)."""

    key: str
    size_bytes: int
    reused: bool


@dataclass(frozen=True)
class StateModel:
    """What each task acknowledges. Every task: an inline task-state document of ``inline_bytes``.
    A keyed task: ``sst_files`` live SST files (``sst_bytes`` each), of which ``new_ssts`` are
    uploaded by each checkpoint and the others reused from the last checkpoint the task was told
    completed (compaction drops the oldest), plus ``private_files`` small files of its local snapshot
    (MANIFEST, CURRENT, OPTIONS), as ``weir.core.paths`` names them."""

    inline_bytes: int = 2048
    sst_files: int = 8
    new_ssts: int = 2
    sst_bytes: int = 8 << 20
    private_files: int = 3

    def objects(
        self, job_id: str, vertex: str, subtask: int, checkpoint_id: int, completed_ssts: Sequence[str]
    ) -> tuple[SimObject, ...]:
        """The objects of one task's snapshot for ``checkpoint_id``; ``completed_ssts``: the SST keys of
        its last completed checkpoint (empty: none, or after a restart)."""
        if vertex not in KEYED_VERTICES:
            return ()
        paths = _PATHS
        job, cid, tm, db = JobId(job_id), CheckpointId(checkpoint_id), TaskManagerId("tm"), f"{vertex}-{subtask:05d}"
        keep = max(0, min(len(completed_ssts), self.sst_files - self.new_ssts))
        reused = [SimObject(k, self.sst_bytes, True) for k in completed_ssts[len(completed_ssts) - keep :]]
        fresh = [
            SimObject(paths.shared_sst(job, tm, db, cid, f"{n:06d}.sst"), self.sst_bytes, False)
            for n in range(self.sst_files - keep)
        ]
        private = [
            SimObject(paths.db_file(job, cid, tm, db, 1, name), 4096, False)
            for name in ("MANIFEST-000005", "CURRENT", "OPTIONS")
        ][: self.private_files]
        return (*reused, *fresh, *private)

    @staticmethod
    def ssts(objects: Iterable[SimObject]) -> tuple[str, ...]:
        return tuple(o.key for o in objects if o.key.endswith(".sst"))


def proc_cpu_seconds(stat_line: str, ticks_per_second: int) -> float:
    """utime + stime of a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat`` line, in seconds (the
    command name, field 2, may hold spaces and parentheses: fields are counted after its last ``)``)."""
    rest = stat_line[stat_line.rindex(")") + 2 :].split()
    utime, stime = int(rest[11]), int(rest[12])  # fields 14 and 15
    return (utime + stime) / ticks_per_second


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "mean": statistics.fmean(values) if values else None,
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


@dataclass
class CheckpointTimes:
    """One checkpoint as the TaskManagers saw it (wall clock, ``time.time()``)."""

    first_trigger: float | None = None
    last_trigger: float | None = None
    last_ack: float | None = None
    first_complete: float | None = None
    last_complete: float | None = None
    aborted_at: float | None = None  # when the first TaskManager was told it was aborted

    @property
    def aborted(self) -> bool:
        return self.aborted_at is not None

    def merge(self, other: CheckpointTimes) -> CheckpointTimes:
        """The same checkpoint seen by two simulator processes."""

        def pick(a: float | None, b: float | None, f: Callable[[float, float], float]) -> float | None:
            return b if a is None else a if b is None else f(a, b)

        return CheckpointTimes(
            pick(self.first_trigger, other.first_trigger, min),
            pick(self.last_trigger, other.last_trigger, max),
            pick(self.last_ack, other.last_ack, max),
            pick(self.first_complete, other.first_complete, min),
            pick(self.last_complete, other.last_complete, max),
            pick(self.aborted_at, other.aborted_at, min),
        )


def round_trips(
    checkpoints: Mapping[int, CheckpointTimes], notified_everywhere: Callable[[int], bool]
) -> list[dict[str, float]]:
    """Per completed checkpoint whose notice reached every TaskManager that runs its tasks: the round
    trip (first trigger received -> last completion notice received) and its parts (trigger fan-out,
    the acknowledgements, completion and notice fan-out), in id order."""
    out = []
    for checkpoint_id in sorted(checkpoints):
        t = checkpoints[checkpoint_id]
        if t.aborted or not notified_everywhere(checkpoint_id):
            continue
        if t.first_trigger is None or t.last_trigger is None or t.last_ack is None or t.last_complete is None:
            continue
        out.append(
            {
                "checkpoint_id": checkpoint_id,
                "round_trip_s": t.last_complete - t.first_trigger,
                "trigger_fanout_s": t.last_trigger - t.first_trigger,
                "acks_s": t.last_ack - t.last_trigger,
                "complete_and_notify_s": t.last_complete - t.last_ack,
            }
        )
    return out


_GRPC_STATUS = re.compile(r'status = StatusCode\.(\w+)\s+details = "([^"]*)"')


def error_line(error: str) -> str:
    """A point's error on one line: a gRPC error as its status code and details."""
    match = _GRPC_STATUS.search(error)
    if match is not None:
        return f"{match[1]}: {match[2]}"
    return error.strip().splitlines()[0] if error.strip() else error


def symptoms(point: Mapping[str, Any], interval_s: float, ack_delay_s: float) -> list[str]:
    """What is breaking at this point, most severe first (empty: it keeps up). A point the run could
    not finish (``error``) breaks by definition."""
    found: list[str] = []
    if point.get("error"):
        found.append(f"did not finish: {error_line(point['error'])}")
    if point.get("taskmanagers_lost", 0):
        found.append(f"{point['taskmanagers_lost']} TaskManager(s) declared lost (heartbeat timeout)")
    if point.get("restarts", 0):
        found.append(f"the job restarted {point['restarts']} time(s)")
    hb_max = (point.get("heartbeat_wall_s") or {}).get("max")
    if hb_max is not None and hb_max > HEARTBEAT_TIMEOUT_S / 2:
        found.append(f"a heartbeat waited {hb_max:.1f} s for the lock (timeout {HEARTBEAT_TIMEOUT_S:g} s)")
    lock_held = point.get("schedule_s")
    if lock_held is not None and lock_held > HEARTBEAT_TIMEOUT_S / 2:
        found.append(f"placing the job held the lock {lock_held:.1f} s")
    rt = (point.get("round_trip_s") or {}).get("p50")
    if rt is not None and rt - ack_delay_s > interval_s:
        found.append(f"checkpoint round trip {rt:.2f} s > interval {interval_s:g} s: checkpoints run back to back")
    if point.get("checkpoints_completed", 1) == 0 and not point.get("error"):
        found.append("no checkpoint completed in the window")
    tick_max = (point.get("monitor_tick_s") or {}).get("max")
    if tick_max is not None and tick_max > TICK_INTERVAL_S:
        found.append(f"a monitor tick took {tick_max:.2f} s (> its {TICK_INTERVAL_S:g} s interval)")
    cpu = point.get("jm_cpu_per_s")
    if cpu is not None and cpu > 0.8 * ONE_CORE:
        found.append(f"the JobManager uses {cpu:.2f} cores: near one core, the GIL's limit")
    return found


def first_break(points: Sequence[Mapping[str, Any]], interval_s: float, ack_delay_s: float) -> dict[str, Any] | None:
    """The smallest point (by subtasks, then TaskManagers) with a symptom, and its symptoms."""
    for point in sorted(points, key=lambda p: (p["subtasks"], p["taskmanagers"])):
        found = symptoms(point, interval_s, ack_delay_s)
        if found:
            return {"subtasks": point["subtasks"], "taskmanagers": point["taskmanagers"], "symptoms": found}
    return None


# ---------------------------------------------------------------------------------------------------
# CPU accounting


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def thread_cpu(prefix: str) -> dict[int, float]:
    """CPU seconds of each live thread of this process whose name starts with ``prefix``, by native id."""
    ticks = _ticks()
    out: dict[int, float] = {}
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.native_id is not None:
            try:
                out[t.native_id] = proc_cpu_seconds(Path(f"/proc/self/task/{t.native_id}/stat").read_text(), ticks)
            except (OSError, ValueError):
                continue
    return out


def process_cpu(pid: int) -> float:
    return proc_cpu_seconds(Path(f"/proc/{pid}/stat").read_text(), _ticks())


class CpuMeter:
    """Thread CPU time spent in calls, summed over threads (``time.thread_time`` around each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total_s = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.total_s += seconds


# ---------------------------------------------------------------------------------------------------
# The in-process simulator


@dataclass
class SimTask:
    job_id: str  # from its deployment, as a TaskManager knows it
    vertex: str
    subtask: int
    attempt: int
    taskmanager: str
    address: str
    completed_ssts: tuple[str, ...] = ()
    pending_ssts: dict[int, tuple[str, ...]] = field(default_factory=dict)  # checkpoint -> its SSTs
    records: int = 0


@dataclass
class _Lane:
    """One TaskManager's calls to the JobManager, in order (as its single report thread sends them)."""

    heap: list[tuple[float, int, Callable[[], None]]] = field(default_factory=list)


class InProcessCluster:
    """Simulated TaskManagers behind the JobManager's ``TaskManagerGateway``; they call the
    JobManager's TaskManager-facing methods from ``workers`` threads, TaskManager i on thread i % workers."""

    def __init__(
        self,
        taskmanagers: int,
        slots: int,
        *,
        ack_delay_s: float,
        state: StateModel,
        heartbeat_interval_s: float,
        workers: int = 4,
    ) -> None:
        from weir.jobmanager.gateway import deploy_request

        self._deploy_request = deploy_request
        self.taskmanagers = [f"sim-tm-{i:03d}" for i in range(taskmanagers)]
        self.address_of = {tm: f"sim-{i:03d}:6124" for i, tm in enumerate(self.taskmanagers)}
        self.tm_at = {a: tm for tm, a in self.address_of.items()}
        self.slots = slots
        self.ack_delay_s = ack_delay_s
        self.state = state
        self.heartbeat_interval_s = heartbeat_interval_s
        self._workers = max(1, min(workers, taskmanagers))
        self._lanes = [_Lane() for _ in range(self._workers)]
        self._lane_of = {tm: i % self._workers for i, tm in enumerate(self.taskmanagers)}
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.jm: Any = None
        self.lock = threading.Lock()  # the simulator's own books
        self.tasks: dict[tuple[str, int], SimTask] = {}
        self.sources: set[tuple[str, int]] = set()
        self.checkpoints: dict[int, CheckpointTimes] = {}
        self.source_triggers: dict[int, list[float]] = {}
        self.notified: dict[int, set[str]] = {}
        self.running_reported: dict[tuple[str, int], float] = {}
        self.deploy_calls = 0
        self.deploy_bytes = 0
        self.last_deploy_call: float | None = None
        self.first_deploy_call: float | None = None
        self.job_attempt = 0
        # Measurements of the calls into the JobManager.
        self.jm_call_cpu = CpuMeter()
        self.gateway_cpu = CpuMeter()  # the simulator's own work on the JobManager's threads
        self.calls: dict[str, list[tuple[float, float]]] = {}  # name -> [(thread cpu s, wall s)]
        self.heartbeats = 0
        self.acks = 0
        self.errors: list[str] = []

    # -- the lanes ----------------------------------------------------------------------------------

    def start(self, jm: Any) -> None:
        self.jm = jm
        for i in range(self._workers):
            thread = threading.Thread(target=self._run_lane, args=(i,), name=f"sim-lane-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        now = time.time()
        for tm in self.taskmanagers:
            self._call("register", jm.register_taskmanager, tm, self.address_of[tm], self.slots, 0, f"{tm}-inc")
        offsets = heartbeat_offsets(len(self.taskmanagers), self.heartbeat_interval_s)
        for tm, offset in zip(self.taskmanagers, offsets, strict=True):
            self._at(tm, now + offset, lambda tm=tm: self._heartbeat(tm))

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)

    def _at(self, tm: str, due: float, action: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._lanes[self._lane_of[tm]].heap, (due, next(self._seq), action))
            self._cv.notify_all()

    def _run_lane(self, index: int) -> None:
        heap = self._lanes[index].heap
        while not self._stop.is_set():
            with self._cv:
                if not heap:
                    self._cv.wait(0.05)
                    continue
                due = heap[0][0]
                wait = due - time.time()
                if wait > 0:
                    self._cv.wait(min(wait, 0.05))
                    continue
                _, _, action = heapq.heappop(heap)
            try:
                action()
            except Exception as exc:  # a failed call is a finding, not a crash of the simulator
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            return fn(*args)
        finally:
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            self.jm_call_cpu.add(cpu)
            with self.lock:
                self.calls.setdefault(name, []).append((cpu, wall))

    # -- what the TaskManagers send -----------------------------------------------------------------

    def _heartbeat(self, tm: str) -> None:
        from weir.core.task_time import TimeRatios
        from weir.jobmanager.messages import Heartbeat, TaskProgress

        if self._stop.is_set():
            return
        with self.lock:
            running = [t for t in self.tasks.values() if t.taskmanager == tm]
            for t in running:
                t.records += 1000
            progress = tuple(
                TaskProgress(
                    t.job_id,
                    t.vertex,
                    t.subtask,
                    t.attempt,
                    t.records,
                    t.records,
                    ratios=TimeRatios(0.5, 0.1, 0.4),
                    watermark=int(time.time() * 1000) - 2000,
                )
                for t in running
            )
        self._call("heartbeat", self.jm.heartbeat, Heartbeat(tm, progress))
        with self.lock:
            self.heartbeats += 1
        self._at(tm, time.time() + self.heartbeat_interval_s, lambda: self._heartbeat(tm))

    def _report(self, job_id: str, key: tuple[str, int], attempt: int, state_name: str) -> None:
        from weir.core.states import TaskState
        from weir.jobmanager.messages import TaskStateReport

        state = TaskState[state_name]
        report = TaskStateReport(job_id, key[0], key[1], attempt, state, None, 0, 0, False)
        self._call("report_task_state", self.jm.report_task_state, report)
        if state is TaskState.RUNNING:
            with self.lock:
                self.running_reported[key] = time.time()

    def _ack(self, key: tuple[str, int], attempt: int, checkpoint_id: int) -> None:
        from weir.jobmanager.checkpointing.pending import StateObject, TaskAckMetrics
        from weir.jobmanager.messages import CheckpointAck

        with self.lock:
            task = self.tasks.get(key)
            if task is None or task.attempt != attempt:
                return
            job_id = task.job_id
            objects = self.state.objects(job_id, key[0], key[1], checkpoint_id, task.completed_ssts)
            task.pending_ssts[checkpoint_id] = StateModel.ssts(objects)
        ack = CheckpointAck(
            job_id=job_id,
            vertex_uid=key[0],
            subtask=key[1],
            attempt=attempt,
            checkpoint_id=checkpoint_id,
            objects=tuple(StateObject(o.key, o.size_bytes, o.reused) for o in objects),
            inline_payload=b"x" * self.state.inline_bytes,
            metrics=TaskAckMetrics(
                alignment_duration_s=0.001,
                start_delay_s=0.001,
                state_size_bytes=sum(o.size_bytes for o in objects) + self.state.inline_bytes,
                sync_duration_s=0.001,
                async_duration_s=self.ack_delay_s,
            ),
        )
        self._call("acknowledge_checkpoint", self.jm.acknowledge_checkpoint, ack)
        now = time.time()
        with self.lock:
            self.acks += 1
            times = self.checkpoints.setdefault(checkpoint_id, CheckpointTimes())
            times.last_ack = now if times.last_ack is None else max(times.last_ack, now)

    # -- the TaskManagerGateway (called by the JobManager's threads) -------------------------------

    def _gateway(self, fn: Callable[[], Any]) -> Any:
        cpu0 = time.thread_time()
        try:
            return fn()
        finally:
            self.gateway_cpu.add(time.thread_time() - cpu0)

    def connect(self, address: str) -> None:
        pass

    def reachable(self, address: str, timeout_s: float) -> bool:
        return True

    def deploy_task(self, address: str, deployment: Any) -> None:
        # The JobManager's own work: the request as the gRPC gateway encodes it (not taken off).
        size = len(self._deploy_request(deployment).SerializeToString())

        def book() -> None:
            now = time.time()
            key = (deployment.vertex_uid, deployment.subtask)
            tm = self.tm_at[address]
            with self.lock:
                self.deploy_calls += 1
                self.deploy_bytes += size
                self.first_deploy_call = self.first_deploy_call or now
                self.last_deploy_call = now
                self.job_attempt = deployment.attempt
                self.tasks[key] = SimTask(
                    deployment.job_id, deployment.vertex_uid, deployment.subtask, deployment.attempt, tm, address
                )
                if deployment.vertex_uid == VERTEX_UIDS[0]:
                    self.sources.add(key)
            job_id, attempt = deployment.job_id, deployment.attempt
            self._at(tm, now, lambda: self._report(job_id, key, attempt, "DEPLOYING"))
            self._at(tm, now + 0.001, lambda: self._report(job_id, key, attempt, "RUNNING"))

        self._gateway(book)

    def cancel_job_tasks(self, address: str, job_id: str, attempt: int, *, job_ended: bool) -> None:
        def book() -> None:
            tm = self.tm_at[address]
            with self.lock:
                for key in [k for k, t in self.tasks.items() if t.taskmanager == tm and t.attempt <= attempt]:
                    del self.tasks[key]

        self._gateway(book)

    def trigger_checkpoint(
        self,
        address: str,
        task: Any,
        attempt: int,
        checkpoint_id: int,
        timestamp: float,
        kind: Any,
        *,
        final: bool,
        drain: bool = False,
    ) -> bool:
        def book() -> bool:
            now = time.time()
            key = (str(task.operator_uid), int(task.subtask))
            with self.lock:
                times = self.checkpoints.setdefault(checkpoint_id, CheckpointTimes())
                times.first_trigger = times.first_trigger or now
                times.last_trigger = now
                triggers = self.source_triggers.setdefault(checkpoint_id, [])
                triggers.append(now)
                all_triggered = len(triggers) == len(self.sources)
                others = [k for k in self.tasks if k not in self.sources] if all_triggered else []
                owners = {k: self.tasks[k].taskmanager for k in (key, *others) if k in self.tasks}
            due = ack_due(True, now, triggers, len(self.sources), self.ack_delay_s)
            if key in owners and due is not None:
                self._at(owners[key], due, lambda: self._ack(key, attempt, checkpoint_id))
            if all_triggered:
                later = ack_due(False, None, triggers, len(self.sources), self.ack_delay_s)
                assert later is not None
                for k in others:
                    if k in owners:
                        self._at(owners[k], later, lambda k=k: self._ack(k, attempt, checkpoint_id))
            return True

        return bool(self._gateway(book))

    def notify_checkpoint_complete(self, address: str, job_id: str, attempt: int, checkpoint_id: int) -> None:
        def book() -> None:
            now = time.time()
            tm = self.tm_at[address]
            with self.lock:
                times = self.checkpoints.setdefault(checkpoint_id, CheckpointTimes())
                times.first_complete = times.first_complete or now
                times.last_complete = now
                self.notified.setdefault(checkpoint_id, set()).add(tm)
                for t in self.tasks.values():
                    if t.taskmanager == tm and checkpoint_id in t.pending_ssts:
                        t.completed_ssts = t.pending_ssts.pop(checkpoint_id)
                        t.pending_ssts = {c: s for c, s in t.pending_ssts.items() if c > checkpoint_id}

        self._gateway(book)

    def notify_checkpoint_aborted(
        self, address: str, job_id: str, attempt: int, checkpoint_id: int, reason: str
    ) -> None:
        def book() -> None:
            with self.lock:
                times = self.checkpoints.setdefault(checkpoint_id, CheckpointTimes())
                times.aborted_at = times.aborted_at or time.time()
                tm = self.tm_at[address]
                for t in self.tasks.values():
                    if t.taskmanager == tm:
                        t.pending_ssts.pop(checkpoint_id, None)

        self._gateway(book)

    # -- reading the books --------------------------------------------------------------------------

    def hosting(self) -> set[str]:
        with self.lock:
            return {t.taskmanager for t in self.tasks.values()}

    def all_running(self, expected: int) -> bool:
        with self.lock:
            return len(self.running_reported) >= expected

    def completed_ids(self) -> list[int]:
        hosting = self.hosting()
        with self.lock:
            return [c for c, tms in self.notified.items() if tms >= hosting and not self.checkpoints[c].aborted]

    def call_stats(self, name: str, since: int = 0) -> tuple[list[float], list[float]]:
        with self.lock:
            calls = self.calls.get(name, [])[since:]
        return [c for c, _ in calls], [w for _, w in calls]

    def call_count(self, name: str) -> int:
        with self.lock:
            return len(self.calls.get(name, []))


def _configure_logs(path: Path) -> Any:
    """structlog as the JobManager process configures it (JSON lines), into a file: logging is part
    of the JobManager's cost."""
    import structlog

    out = open(path, "a")  # noqa: SIM115 - closed by the caller
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(20),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    return out


def _wait(condition: Callable[[], bool], deadline: float, poll_s: float = 0.02) -> bool:
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


@dataclass(frozen=True)
class PointPlan:
    subtasks: int
    taskmanagers: int
    interval_s: float
    ack_delay_s: float
    window_s: float
    min_checkpoints: int
    deploy_timeout_s: float
    state: StateModel


def _open_storage(kind: str, root: Path, run_id: str) -> Any:
    from weir.connectors.object_storage import FileCheckpointStorage, open_storage

    if kind == "file":
        return FileCheckpointStorage(root)
    from weir.core.config import Endpoints

    endpoints = Endpoints.from_env()
    return open_storage(f"s3://{endpoints.s3_bucket}/bench-jm-scale-{run_id}/{root.name}", endpoints)


def _remove_all(storage: Any) -> None:
    """Delete every object a point wrote (metadata, job records): the run leaves only its logs."""
    storage.delete([key for key, _size in storage.list("")])


def run_in_process_point(plan: PointPlan, storage: Any, log_path: Path) -> dict[str, Any]:
    """One point: a fresh JobManager, ``plan.taskmanagers`` simulated TaskManagers, one job of
    ``plan.subtasks`` subtasks; deploy it, hold a steady window of periodic checkpoints, cancel it."""
    from weir.core.states import JobStatus
    from weir.jobmanager import monitor as monitor_module
    from weir.jobmanager import registry as registry_module
    from weir.jobmanager.checkpointing.metadata import encode_metadata
    from weir.jobmanager.ending import ResolutionReport
    from weir.jobmanager.manager import JobManager
    from weir.jobmanager.record_store import record_of
    from weir.jobmanager.submission import SubmitRequest

    copies = (registry_module.HEARTBEAT_TIMEOUT_S, registry_module.HEARTBEAT_INTERVAL_S, monitor_module.TICK_INTERVAL_S)
    if copies != (HEARTBEAT_TIMEOUT_S, HEARTBEAT_INTERVAL_S, TICK_INTERVAL_S):
        raise RuntimeError("bench/jm_scale.py's copies of the JobManager's heartbeat and tick constants are stale")
    parallelism = parallelism_for(plan.subtasks)
    slots = slots_per_taskmanager(parallelism, plan.taskmanagers)
    sim = InProcessCluster(
        plan.taskmanagers,
        slots,
        ack_delay_s=plan.ack_delay_s,
        state=plan.state,
        heartbeat_interval_s=registry_module.HEARTBEAT_INTERVAL_S,
    )
    jm = JobManager(
        storage,
        gateway=sim,
        read_end_offsets=lambda _topic: {},
        check=lambda *_: None,
        resolve=lambda *_: ResolutionReport(0),
        resolve_inherited=lambda *_: None,
    )
    ticks: list[tuple[float, float]] = []  # (start, duration)
    real_tick = jm.monitor.tick

    def timed_tick() -> None:
        start = time.perf_counter()
        try:
            real_tick()
        finally:
            ticks.append((start, time.perf_counter() - start))

    jm.monitor.tick = timed_tick  # type: ignore[method-assign]
    schedules: list[float] = []
    real_schedule = jm.deployer.schedule

    def timed_schedule(job: Any, now: float) -> Any:
        start = time.perf_counter()
        try:
            return real_schedule(job, now)
        finally:
            schedules.append(time.perf_counter() - start)

    jm.deployer.schedule = timed_schedule  # type: ignore[method-assign]
    jm.recover_jobs()
    jm.start()
    point: dict[str, Any] = {
        "mode": "in-process",
        "subtasks": plan.subtasks,
        "taskmanagers": plan.taskmanagers,
        "parallelism": parallelism,
        "vertices": VERTICES,
        "slots_per_taskmanager": slots,
    }
    try:
        sim.start(jm)
        source = job_source(max(128, parallelism))
        request = SubmitRequest(
            job_name=f"jm-scale-{plan.subtasks}",
            job_file_name="jm_scale_job.py",
            job_source=source,
            parameters={"checkpointing.interval": f"{plan.interval_s:g}s", "checkpointing.retained": "3"},
            parallelism=parallelism,
        )
        submit_at = time.time()
        cpu0 = time.thread_time()
        job_id = jm.submit(request)
        submit_cpu = time.thread_time() - cpu0
        submitted_at = time.time()
        point["submit_s"] = submitted_at - submit_at
        point["submit_cpu_s"] = submit_cpu
        deadline = submit_at + plan.deploy_timeout_s

        def every_task_running() -> bool:
            if not sim.all_running(plan.subtasks):
                return False
            with jm.lock:  # the JobManager's view: reports of an attempt it failed over do not count
                return bool(jm.jobs[job_id].all_running())

        deployed = _wait(every_task_running, deadline)
        with sim.lock:
            last_running = max(sim.running_reported.values(), default=None)
        point["schedule_s"] = max(schedules) if schedules else None
        point["deploy_calls"] = sim.deploy_calls
        point["deploy_request_bytes"] = sim.deploy_bytes
        if sim.first_deploy_call is not None and sim.last_deploy_call is not None:
            point["deploy_calls_s"] = sim.last_deploy_call - sim.first_deploy_call
        if not deployed or last_running is None:
            point["error"] = f"not every task RUNNING within {plan.deploy_timeout_s:g} s"
            point["deploy_s"] = None
        else:
            point["deploy_s"] = last_running - submit_at
            # Steady state: from the first checkpoint on, over the window (and at least N checkpoints).
            _wait(lambda: bool(sim.checkpoints), time.time() + plan.interval_s * 3 + 5)
            hb_from = sim.call_count("heartbeat")
            ack_from = sim.call_count("acknowledge_checkpoint")
            jm_threads0 = thread_cpu("jm-")
            calls0, gateway0 = sim.jm_call_cpu.total_s, sim.gateway_cpu.total_s
            process0 = time.process_time()
            hb0, acks0, tick0 = sim.heartbeats, sim.acks, len(ticks)
            completed0 = len(sim.completed_ids())
            window_start = time.time()
            _wait(
                lambda: (
                    time.time() - window_start >= plan.window_s
                    and len(sim.completed_ids()) - completed0 >= plan.min_checkpoints
                ),
                window_start + plan.window_s * 3,
            )
            elapsed = time.time() - window_start
            jm_threads1 = thread_cpu("jm-")
            threads_s = sum(cpu - jm_threads0.get(tid, 0.0) for tid, cpu in jm_threads1.items())
            calls_s = sim.jm_call_cpu.total_s - calls0
            gateway_s = sim.gateway_cpu.total_s - gateway0
            jm_cpu = threads_s + calls_s - gateway_s
            point["window_s"] = elapsed
            point["jm_cpu_per_s"] = jm_cpu / elapsed
            point["jm_cpu_split_per_s"] = {
                "jobmanager_threads": threads_s / elapsed,
                "in_taskmanager_calls": calls_s / elapsed,
                "simulator_gateway_taken_off": gateway_s / elapsed,
            }
            point["process_cpu_per_s"] = (time.process_time() - process0) / elapsed
            point["heartbeats_per_s"] = (sim.heartbeats - hb0) / elapsed
            point["acks_per_s"] = (sim.acks - acks0) / elapsed
            hb_cpu, hb_wall = sim.call_stats("heartbeat", hb_from)
            ack_cpu, ack_wall = sim.call_stats("acknowledge_checkpoint", ack_from)
            point["heartbeat_cpu_s"] = distribution(hb_cpu)
            point["heartbeat_wall_s"] = distribution(hb_wall)
            point["ack_cpu_s"] = distribution(ack_cpu)
            point["ack_wall_s"] = distribution(ack_wall)
            window_ticks = ticks[tick0:]
            point["monitor_tick_s"] = distribution([d for _, d in window_ticks])
            gaps = [b[0] - a[0] for a, b in itertools.pairwise(window_ticks)]
            point["monitor_tick_gap_s"] = distribution(gaps)
            with sim.lock:
                checkpoints = dict(sim.checkpoints)
            done = set(sim.completed_ids())
            trips = [t for t in round_trips(checkpoints, lambda c: c in done) if t["checkpoint_id"] > 0]
            window_trips = [t for t in trips if (checkpoints[t["checkpoint_id"]].first_trigger or 0) >= window_start]
            point["checkpoints_completed"] = len(done) - completed0
            point["checkpoints_aborted"] = sum(
                1 for t in checkpoints.values() if t.aborted_at is not None and t.aborted_at >= window_start
            )
            point["round_trip_s"] = distribution([t["round_trip_s"] for t in window_trips])
            for part in ("trigger_fanout_s", "acks_s", "complete_and_notify_s"):
                point[part] = distribution([t[part] for t in window_trips])
            # The job record and the checkpoint metadata the window wrote, timed again off the lock.
            with jm.lock:
                job = jm.jobs[job_id]
                started = time.thread_time()
                record = record_of(job)
                record_take_s = time.thread_time() - started
                latest = job.coordinator.store.latest()
                restarts = job.restarts
            started = time.thread_time()
            body = record.to_json()
            point["record_take_s"] = record_take_s
            point["record_encode_s"] = time.thread_time() - started
            point["record_bytes"] = len(body)
            started = time.perf_counter()
            storage.put_bytes(f"{job_id}/bench-record-copy", body)
            point["record_put_s"] = time.perf_counter() - started
            if latest is not None:
                started = time.thread_time()
                metadata = encode_metadata(latest)
                point["metadata_encode_s"] = time.thread_time() - started
                point["metadata_bytes"] = len(metadata)
            point["restarts"] = restarts
        point["taskmanagers_lost"] = sum(1 for tm in jm.registry.taskmanagers.values() if not tm.alive)
        if sim.errors:
            point["simulator_errors"] = sim.errors[:5]
        with jm.lock:
            job = jm.jobs.get(job_id)
            status = job.status if job is not None else None
        if status is JobStatus.RUNNING:
            jm.cancel(job_id)
            _wait(lambda: jm.jobs[job_id].status.terminal, time.time() + 10)
    finally:
        sim.stop()
        jm.stop()
        jm.records.flush()
    return point


# ---------------------------------------------------------------------------------------------------
# Micro-benchmarks: one heartbeat, one job record, by size


def heartbeat_cost(tasks_per_heartbeat: Sequence[int], calls: int = 2000) -> list[dict[str, Any]]:
    """CPU per ``JobManager.heartbeat`` call (lock, registry, each task's progress), for heartbeats
    carrying 0..N running tasks of a running job (a job of 5 x P subtasks on one TaskManager)."""
    from weir.core.task_time import TimeRatios
    from weir.jobmanager.messages import Heartbeat, TaskProgress

    out = []
    for n in tasks_per_heartbeat:
        with tempfile.TemporaryDirectory(prefix="jm-scale-hb-") as root:
            from weir.connectors.object_storage import FileCheckpointStorage

            parallelism = max(1, math.ceil(n / VERTICES))
            sim = InProcessCluster(1, parallelism, ack_delay_s=0.0, state=StateModel(), heartbeat_interval_s=3600)
            jm = _bare_jobmanager(FileCheckpointStorage(root), sim)
            sim.start(jm)
            from weir.jobmanager.submission import SubmitRequest

            job_id = jm.submit(
                SubmitRequest("hb", "jm_scale_job.py", job_source(max(128, parallelism)), {}, parallelism)
            )
            expected = parallelism * VERTICES
            _wait(lambda sim=sim, expected=expected: sim.all_running(expected), time.time() + 30)
            with jm.lock:
                attempt = jm.jobs[job_id].attempt
            progress = tuple(
                TaskProgress(job_id, v, s, attempt, 10, 10, ratios=TimeRatios(0.5, 0.1, 0.4), watermark=1)
                for v in VERTEX_UIDS
                for s in range(parallelism)
            )[:n]
            beat = Heartbeat(sim.taskmanagers[0], progress)
            for _ in range(100):
                jm.heartbeat(beat)
            started = time.thread_time()
            for _ in range(calls):
                jm.heartbeat(beat)
            per_call = (time.thread_time() - started) / calls
            sim.stop()
            jm.stop()
            out.append({"tasks": n, "cpu_us": per_call * 1e6, "cpu_us_per_task": per_call * 1e6 / n if n else None})
    return out


def _bare_jobmanager(storage: Any, gateway: Any) -> Any:
    from weir.jobmanager.ending import ResolutionReport
    from weir.jobmanager.manager import JobManager

    jm = JobManager(
        storage,
        gateway=gateway,
        read_end_offsets=lambda _topic: {},
        check=lambda *_: None,
        resolve=lambda *_: ResolutionReport(0),
        resolve_inherited=lambda *_: None,
    )
    jm.recover_jobs()
    return jm


# ---------------------------------------------------------------------------------------------------
# Over gRPC: the real JobManager process and simulated TaskManager processes


def free_port() -> int:
    """A port the kernel hands out for port 0 (closed again: the JobManager binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _grpc_env(checkpoint_dir: Path, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "WEIR_CHECKPOINT_DIR": checkpoint_dir.as_uri(),
            "WEIR_JOBMANAGER_ADDRESS": f"127.0.0.1:{port}",
            "WEIR_LOG_FORMAT": "json",
            "PYTHONPATH": str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        }
    )
    return env


def run_grpc_point(
    subtasks: int,
    taskmanagers: int,
    *,
    interval_s: float,
    ack_delay_s: float,
    window_s: float,
    min_checkpoints: int,
    deploy_timeout_s: float,
    state: StateModel,
    workdir: Path,
    processes: int = 2,
) -> dict[str, Any]:
    """One point over gRPC: ``python -m weir.jobmanager`` on a free port, ``processes`` simulator
    processes hosting the TaskManagers; the same job and window as in-process."""
    import grpc

    from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc

    parallelism = parallelism_for(subtasks)
    slots = slots_per_taskmanager(parallelism, taskmanagers)
    port = free_port()
    point_dir = workdir / f"grpc-{subtasks}-{taskmanagers}"
    point_dir.mkdir(parents=True, exist_ok=True)
    env = _grpc_env(point_dir / "checkpoints", port)
    point: dict[str, Any] = {
        "mode": "grpc",
        "subtasks": subtasks,
        "taskmanagers": taskmanagers,
        "parallelism": parallelism,
        "vertices": VERTICES,
        "slots_per_taskmanager": slots,
    }
    jm_log = open(point_dir / "jobmanager.log", "w")  # noqa: SIM115 - closed below
    jm_proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weir.jobmanager",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--rest-port",
            "0",
        ],
        env=env,
        stdout=jm_log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    sims: list[subprocess.Popen[str]] = []
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = jobmanager_pb2_grpc.JobManagerServiceStub(channel)
    try:
        if not _wait(lambda: _answers(stub), time.time() + 30, 0.1):
            raise RuntimeError(f"the JobManager did not answer on port {port}; see {point_dir / 'jobmanager.log'}")
        cpu0, t0 = process_cpu(jm_proc.pid), time.time()
        time.sleep(IDLE_WINDOW_S)  # the measurement window itself: the JobManager alone, no TaskManager
        point["empty_jm_cpu_per_s"] = (process_cpu(jm_proc.pid) - cpu0) / (time.time() - t0)
        per_process = [len(range(i, taskmanagers, processes)) for i in range(min(processes, taskmanagers))]
        first = 0
        for i, count in enumerate(per_process):
            sims.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.jm_scale_tm",
                        "--jobmanager",
                        f"127.0.0.1:{port}",
                        "--first",
                        str(first),
                        "--count",
                        str(count),
                        "--slots",
                        str(slots),
                        "--ack-delay",
                        str(ack_delay_s),
                        "--state",
                        json.dumps(asdict(state)),
                        "--sources",
                        str(parallelism),
                    ],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=open(point_dir / f"sim-{i}.log", "w"),  # noqa: SIM115 - the child owns it
                    text=True,
                    cwd=REPO_ROOT,
                )
            )
            first += count
        for sim in sims:
            assert sim.stdout is not None
            line = sim.stdout.readline()
            if not line.startswith("ready"):
                raise RuntimeError(f"a simulator process did not start: {line!r}; see {point_dir}")
        # Idle heartbeats first (no job yet), against the JobManager alone measured before.
        cpu0, t0 = process_cpu(jm_proc.pid), time.time()
        time.sleep(IDLE_WINDOW_S)  # the measurement window itself
        point["idle_jm_cpu_per_s"] = (process_cpu(jm_proc.pid) - cpu0) / (time.time() - t0)
        point["heartbeat_grpc_cpu_s"] = heartbeat_cpu(
            point["idle_jm_cpu_per_s"], point["empty_jm_cpu_per_s"], taskmanagers, HEARTBEAT_INTERVAL_S
        )
        source = job_source(max(128, parallelism))
        submit_at = time.time()
        response = stub.SubmitJob(
            jobmanager_pb2.SubmitJobRequest(
                job_name=f"jm-scale-{subtasks}",
                job_file_name="jm_scale_job.py",
                job_source=source,
                parameters={"checkpointing.interval": f"{interval_s:g}s", "checkpointing.retained": "3"},
                parallelism=parallelism,
            ),
            timeout=deploy_timeout_s,
        )
        point["submit_s"] = time.time() - submit_at
        job_id = response.job_id

        def all_running() -> bool:
            status = stub.GetJobStatus(jobmanager_pb2.GetJobStatusRequest(job_id=job_id), timeout=30)
            return len(status.tasks) == subtasks and all(t.state == common_pb2.TASK_STATE_RUNNING for t in status.tasks)

        if not _wait(all_running, submit_at + deploy_timeout_s, 0.1):
            point["error"] = f"not every task RUNNING within {deploy_timeout_s:g} s"
        else:
            time.sleep(interval_s)  # the first checkpoint is due an interval after RUNNING: the window starts there
            cpu0, t0 = process_cpu(jm_proc.pid), time.time()
            time.sleep(window_s)
            point["window_s"] = time.time() - t0
            point["jm_cpu_per_s"] = (process_cpu(jm_proc.pid) - cpu0) / point["window_s"]
            point["window_from"] = t0
            point["window_to"] = time.time()
        cluster = stub.GetClusterStatus(jobmanager_pb2.GetClusterStatusRequest(), timeout=30)
        point["taskmanagers_lost"] = sum(1 for tm in cluster.taskmanagers if not tm.alive)
        status = stub.GetJobStatus(jobmanager_pb2.GetJobStatusRequest(job_id=job_id), timeout=30)
        point["restarts"] = status.summary.restarts
        stub.CancelJob(jobmanager_pb2.CancelJobRequest(job_id=job_id), timeout=30)
    except grpc.RpcError as exc:  # a point that breaks is a result
        code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        point["error"] = f"{code}: {details} (a call to the JobManager)"
    except Exception as exc:  # a point that breaks is a result
        point["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        reports = [_stop_sim(sim) for sim in sims]
        channel.close()
        jm_proc.send_signal(signal.SIGTERM)
        try:
            jm_proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            jm_proc.kill()
            jm_proc.wait()
        jm_log.close()
        shutil.rmtree(point_dir / "checkpoints", ignore_errors=True)
    _merge_sim_reports(point, [r for r in reports if r is not None], submit_at=locals().get("submit_at"))
    return point


def _answers(stub: Any) -> bool:
    import grpc

    from weir.wire import jobmanager_pb2

    try:
        stub.ListJobs(jobmanager_pb2.ListJobsRequest(), timeout=1)
        return True
    except grpc.RpcError:
        return False


def _stop_sim(sim: subprocess.Popen[str]) -> dict[str, Any] | None:
    try:
        out, _ = sim.communicate("stop\n", timeout=20)
    except subprocess.TimeoutExpired:
        sim.kill()
        sim.communicate()
        return None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    return None


def _merge_sim_reports(point: dict[str, Any], reports: Sequence[Mapping[str, Any]], submit_at: float | None) -> None:
    """The simulator processes' books merged into the point: round trips, deployment, heartbeats."""
    checkpoints: dict[int, CheckpointTimes] = {}
    notified: dict[int, set[str]] = {}
    hosting: set[str] = set()
    running: list[float] = []
    window_from = point.get("window_from")
    heartbeat_wall: list[float] = []
    ack_wall: list[float] = []
    for report in reports:
        for key, value in report["checkpoints"].items():
            times = CheckpointTimes(**value)
            checkpoints[int(key)] = checkpoints[int(key)].merge(times) if int(key) in checkpoints else times
        for key, tms in report["notified"].items():
            notified.setdefault(int(key), set()).update(tms)
        hosting.update(report["hosting"])
        running.extend(report["running_reported"])
        heartbeat_wall.extend(report["heartbeat_wall_s"])
        ack_wall.extend(report["ack_wall_s"])
    if running and submit_at is not None and not point.get("error"):
        point["deploy_s"] = max(running) - submit_at
    trips = round_trips(checkpoints, lambda c: notified.get(c, set()) >= hosting)
    window_to = point.get("window_to", float("inf"))
    if window_from is not None:
        trips = [t for t in trips if window_from <= (checkpoints[t["checkpoint_id"]].first_trigger or 0) <= window_to]
        point["checkpoints_completed"] = len(trips)
        point["checkpoints_aborted"] = sum(
            1 for t in checkpoints.values() if t.aborted_at is not None and window_from <= t.aborted_at <= window_to
        )
    point["round_trip_s"] = distribution([t["round_trip_s"] for t in trips])
    for part in ("trigger_fanout_s", "acks_s", "complete_and_notify_s"):
        point[part] = distribution([t[part] for t in trips])
    point["heartbeat_wall_s"] = distribution(heartbeat_wall)
    point["ack_wall_s"] = distribution(ack_wall)
    point["sim_errors"] = sum(int(r.get("errors", 0)) for r in reports)
    point.pop("window_from", None)
    point.pop("window_to", None)


# ---------------------------------------------------------------------------------------------------
# The document


def _fmt(value: float | None, unit: str = "s", digits: int = 3) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        if value * 1000 < 0.01:
            return "< 0.01 ms"
        return f"{value * 1000:.{digits}g} ms" if value * 1000 < 100 else f"{value * 1000:,.0f} ms"
    if unit == "µs":
        return f"{value:,.0f} µs"
    if unit == "s":
        return f"{value:.2f} s"
    return f"{value:.{digits}g}{unit}"


def _row(point: Mapping[str, Any], interval_s: float, ack_delay_s: float) -> str:
    rt = point.get("round_trip_s") or {}
    hb = point.get("heartbeat_wall_s") or {}
    tick = point.get("monitor_tick_s") or {}
    cells = [
        str(point["subtasks"]),
        str(point["taskmanagers"]),
        _fmt(point.get("deploy_s")),
        _fmt(point.get("schedule_s")),
        _fmt(rt.get("p50")),
        _fmt(rt.get("max")),
        f"{point['jm_cpu_per_s']:.3f}" if point.get("jm_cpu_per_s") is not None else "-",
        _fmt((point.get("heartbeat_cpu_s") or {}).get("mean"), "ms"),
        _fmt(hb.get("max"), "ms"),
        _fmt((point.get("ack_cpu_s") or {}).get("mean"), "ms"),
        _fmt(tick.get("max"), "ms"),
        str(point.get("checkpoints_completed", "-")),
        "; ".join(symptoms(point, interval_s, ack_delay_s)) or "keeps up",
    ]
    return "| " + " | ".join(cells) + " |"


_TABLE_HEAD = (
    "| subtasks | TMs | deploy (submit -> all RUNNING) | placing under the lock | checkpoint round trip p50 "
    "| round trip max | JM CPU (cores) | CPU / heartbeat | heartbeat wait max | CPU / ack | monitor tick max "
    "| checkpoints | what breaks |\n"
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
)


def render_markdown(document: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> str:
    """docs/benchmarks-jm-scale.md, from the results document (and the run before the fix, if any)."""
    settings = document["settings"]
    interval, ack_delay = settings["interval_s"], settings["ack_delay_s"]
    lines = [
        "# How far one JobManager goes",
        "",
        "<!-- Generated by bench/jm_scale.py (`make bench-jm-scale`) from bench/results/jm_scale.json; "
        "do not edit by hand. -->",
        "",
        f"Run {document['run_id']} at commit {document['commit']} on {document['host']['machine']} "
        f"({document['host']['cpus']} CPUs, Python {document['host']['python']}), {document['finished_at']}; "
        f"load average {_load(document['load_average_at_start'])} at the start, "
        f"{_load(document['load_average_at_end'])} at the end (the machine is shared: the figures are "
        "of a busy 2-core machine). Storage: " + settings["storage"] + ".",
        "",
        f"The job: {VERTICES} vertices (source -> parse -> aggregate -> window -> sink), every edge "
        "all-to-all, parallelism P = subtasks / 5; checkpoint every "
        f"{interval:g} s, 3 retained. Each simulated TaskManager heartbeats every second with the "
        f"progress of its tasks and acknowledges a checkpoint {ack_delay * 1000:g} ms after the barrier "
        f"reaches a task, with a {settings['state']['inline_bytes']} B inline task-state document; the "
        f"keyed vertices also list {settings['state']['sst_files']} SST files "
        f"({settings['state']['new_ssts']} new per checkpoint, the rest reused) and "
        f"{settings['state']['private_files']} private snapshot files. How it is simulated and why: "
        "`bench/jm_scale.py`'s docstring.",
        "",
        "Columns: *deploy*, submit to the last task RUNNING; *placing under the lock*, "
        "`Deployer.schedule` (the plan's channels and every deployment request, built with the "
        "JobManager's lock held); *round trip*, the first trigger a TaskManager receives to the last "
        "completion notice (it includes the "
        f"{ack_delay * 1000:g} ms acknowledgement delay); *JM CPU*, the JobManager's CPU seconds per "
        "second of steady state (its threads plus the time inside the TaskManagers' calls); *heartbeat "
        "wait*, the wall time of one heartbeat call, lock wait included; *monitor tick*, one pass of the "
        "0.2 s monitor.",
        "",
    ]
    points = document["in_process"]
    by_subtasks = [p for p in points if p["sweep"] == "subtasks"]
    by_tms = [p for p in points if p["sweep"] == "taskmanagers"]
    lines += [
        f"## Against the job's size (in-process, ten subtasks per TaskManager, at most {MAX_TASKMANAGERS})",
        "",
        _TABLE_HEAD,
        *(_row(p, interval, ack_delay) for p in by_subtasks),
        "",
        f"## Against the TaskManagers ({TM_SWEEP_SUBTASKS} subtasks, in-process)",
        "",
        _TABLE_HEAD,
        *(_row(p, interval, ack_delay) for p in by_tms),
        "",
    ]
    if document.get("curve_svg"):
        lines += [f"![round trip and CPU against subtasks]({document['curve_svg']})", ""]
    lines += ["## One heartbeat, by the tasks it carries (in-process, CPU per call)", ""]
    lines += ["| tasks in the heartbeat | CPU per heartbeat | per task |", "| ---: | ---: | ---: |"]
    for h in document["heartbeat_cost"]:
        per_task = h["cpu_us_per_task"]
        lines.append(f"| {h['tasks']} | {h['cpu_us']:,.0f} µs | {f'{per_task:.1f} µs' if per_task else '-'} |")
    lines += ["", "## Job records and checkpoint metadata (in-process points)", ""]
    lines += [
        "| subtasks | record: taken under the lock | encoded | bytes | written | metadata: encoded | bytes |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in by_subtasks:
        lines.append(
            f"| {p['subtasks']} | {_fmt(p.get('record_take_s'), 'ms')} | {_fmt(p.get('record_encode_s'), 'ms')} "
            f"| {p.get('record_bytes', '-'):,} | {_fmt(p.get('record_put_s'), 'ms')} "
            f"| {_fmt(p.get('metadata_encode_s'), 'ms')} | "
            f"{p['metadata_bytes']:,} |"
            if p.get("metadata_bytes") is not None
            else f"| {p['subtasks']} | - | - | - | - | - | - |"
        )
    grpc_points = document.get("grpc") or []
    lines += ["", "## Over gRPC (the real JobManager process, simulated TaskManager processes)", ""]
    if not grpc_points:
        lines += [f"Not run: {document.get('grpc_skipped', 'skipped')}.", ""]
    else:
        lines += [
            "| subtasks | TMs | deploy | round trip p50 | round trip max | JM process CPU (cores) "
            "| idle, heartbeats only (cores) | CPU / idle heartbeat | heartbeat call max | checkpoints | what breaks |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for p in grpc_points:
            rt = p.get("round_trip_s") or {}
            cpu = p.get("jm_cpu_per_s")
            idle = p.get("idle_jm_cpu_per_s")
            lines.append(
                f"| {p['subtasks']} | {p['taskmanagers']} | {_fmt(p.get('deploy_s'))} | {_fmt(rt.get('p50'))} "
                f"| {_fmt(rt.get('max'))} | {f'{cpu:.3f}' if cpu is not None else '-'} "
                f"| {f'{idle:.3f}' if idle is not None else '-'} "
                f"| {_fmt(p.get('heartbeat_grpc_cpu_s'), 'ms')} "
                f"| {_fmt((p.get('heartbeat_wall_s') or {}).get('max'), 'ms')} "
                f"| {p.get('checkpoints_completed', '-')} | "
                + ("; ".join(symptoms(p, interval, ack_delay)) or "keeps up")
                + " |"
            )
        lines.append("")
    lines += ["## What breaks first", ""]
    lines += _breaks(document, interval, ack_delay)
    lines += ["", "## Where the time goes", ""]
    for paragraph in document.get("findings", []):
        lines += [paragraph, ""]
    if before is not None:
        lines += ["## Before and after the fixes", ""]
        lines += _comparison(before, document)
    lines += ["## What would lift the next limits", "", *NEXT_LIMITS, ""]
    return "\n".join(lines)


NEXT_LIMITS: Final = (
    "Each of these is larger than a fix and is left as a proposal:",
    "",
    "- **Trigger and notice fan-out in parallel.** The executor asks each source task to inject the barrier "
    "with one blocking call after the other on one I/O thread, and notifies each TaskManager the same way; "
    "over gRPC the fan-out grows with the sources (see above). Sending the calls at once (gRPC futures, "
    "one batch per TaskManager as Flink's `TaskExecutorGateway` calls are asynchronous) would take the fan-out "
    "to about one round trip.",
    "- **Deployment without the channel lists, and off the lock.** Every deployment request lists all P "
    "input and P output channels of an all-to-all edge, although each TaskManager computes the same plan "
    "from the job file; Flink caches and compresses these descriptors for large jobs (its "
    "`ShuffleDescriptor` groups). The requests are also built with the JobManager's lock held and sent one "
    "at a time; built from a snapshot of the placement after the lock and sent per TaskManager in parallel, "
    "neither would hold heartbeats back.",
    "- **One Python process, one core.** Over gRPC most of the JobManager's CPU is gRPC and protobuf in "
    "Python (compare the two CPU columns at the same size): the servicer's threads, the monitor and the I/O "
    "workers share one GIL. Past about one core a larger job needs its acknowledgements batched per "
    "TaskManager (one call for all its tasks of a checkpoint), or a JobManager per job.",
)


def _load(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _breaks(document: Mapping[str, Any], interval: float, ack_delay: float) -> list[str]:
    out = []
    for name, points in (("in-process", document["in_process"]), ("over gRPC", document.get("grpc") or [])):
        found = first_break(points, interval, ack_delay)
        if not points:
            continue
        if found is None:
            largest = max(points, key=lambda p: (p["subtasks"], p["taskmanagers"]))
            out.append(
                f"- {name}: nothing broke up to {largest['subtasks']} subtasks on "
                f"{largest['taskmanagers']} TaskManagers."
            )
        else:
            out.append(
                f"- {name}: first at {found['subtasks']} subtasks on {found['taskmanagers']} TaskManagers: "
                + "; ".join(found["symptoms"])
                + "."
            )
    return out


def _cell(point: Mapping[str, Any] | None, key: str, sub: str | None = None, unit: str = "s") -> str:
    if point is None:
        return "-"
    if point.get("error") and point.get(key) is None:
        return "did not finish"
    value = point.get(key) if sub is None else (point.get(key) or {}).get(sub)
    if value is None:
        return "-"
    return f"{value:.3f}" if unit == "cores" else _fmt(value, unit)


def _comparison(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The run before the fixes beside this one, point by point, and what broke first in each."""
    interval, ack_delay = after["settings"]["interval_s"], after["settings"]["ack_delay_s"]
    lines = [
        f"Before: commit {before['commit']} (load average {_load(before['load_average_at_start'])} at its start); "
        f"after: this run. The fixes: the checkpoint coordinator looked up every live object key for each "
        "acknowledgement (a checkpoint's acknowledgements were quadratic in its tasks), and the plan renumbered a "
        "consumer's input channels for each output channel (placing an all-to-all job was cubic in its "
        "parallelism, with the lock held). Both are now linear.",
        "",
    ]
    for name, key in (("in-process", "in_process"), ("over gRPC", "grpc")):
        for label, document in (("before", before), ("after", after)):
            points = document.get(key) or []
            if not points:
                continue
            found = first_break(points, interval, ack_delay)
            lines.append(
                f"- {name}, {label}: "
                + (
                    f"first broke at {found['subtasks']} subtasks on {found['taskmanagers']} TaskManagers: "
                    + "; ".join(found["symptoms"])
                    if found is not None
                    else "nothing broke"
                )
                + "."
            )
    lines.append("")
    columns = (
        ("deploy", "deploy_s", None, "s"),
        ("placing under the lock", "schedule_s", None, "s"),
        ("round trip p50", "round_trip_s", "p50", "s"),
        ("JM CPU (cores)", "jm_cpu_per_s", None, "cores"),
        ("CPU / ack", "ack_cpu_s", "mean", "ms"),
        ("heartbeat call max", "heartbeat_wall_s", "max", "ms"),
    )
    for name, key in (("In-process", "in_process"), ("Over gRPC", "grpc")):
        old = {(p["subtasks"], p["taskmanagers"]): p for p in before.get(key) or []}
        rows = [p for p in after.get(key) or [] if (p["subtasks"], p["taskmanagers"]) in old]
        if not rows:
            continue
        shown = [c for c in columns if any(p.get(c[1]) is not None for p in rows)]
        lines += [
            f"{name}, before -> after:",
            "",
            "| subtasks | TMs | " + " | ".join(c[0] for c in shown) + " |",
            "| ---: | ---: | " + " | ".join("---:" for _ in shown) + " |",
        ]
        for p in rows:
            b = old[(p["subtasks"], p["taskmanagers"])]
            cells = [f"{_cell(b, k, sub, unit)} -> {_cell(p, k, sub, unit)}" for _, k, sub, unit in shown]
            lines.append(f"| {p['subtasks']} | {p['taskmanagers']} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _polyline(points: Sequence[tuple[float, float]], color: str, dashed: bool = False) -> str:
    coordinates = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    marks = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points)
    return f'<polyline points="{coordinates}" fill="none" stroke="{color}" stroke-width="2"{dash}/>{marks}'


def render_chart(document: Mapping[str, Any]) -> str:
    """An SVG of two panels against subtasks (log scale): the checkpoint round trip (median) and the
    JobManager's CPU, in-process and over gRPC, with the checkpoint interval drawn in. Plain SVG, so
    that the chart needs nothing installed."""
    series = {
        "in-process": [p for p in document["in_process"] if p["sweep"] == "subtasks" and not p.get("error")],
        "over gRPC": [p for p in document.get("grpc") or [] if not p.get("error")],
    }
    colors = {"in-process": "#1f77b4", "over gRPC": "#d62728"}
    xs = sorted({p["subtasks"] for points in series.values() for p in points})
    if not xs:
        return ""
    width, height, left, top, plot_w, plot_h = 900, 370, 60, 40, 340, 240
    x_lo, x_hi = math.log10(min(xs)), math.log10(max(xs))

    def x_of(panel: int, subtasks: float) -> float:
        span = (math.log10(subtasks) - x_lo) / (x_hi - x_lo) if x_hi > x_lo else 0.5
        return left + panel * (plot_w + 100) + span * plot_w

    panels = (
        ("checkpoint round trip, median (s)", lambda p: (p.get("round_trip_s") or {}).get("p50")),
        ("JobManager CPU (cores)", lambda p: p.get("jm_cpu_per_s")),
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">One JobManager against subtasks (TaskManagers: subtasks / 10, '
        f"at most {MAX_TASKMANAGERS}), commit {document['commit']}</text>",
    ]
    interval = document["settings"]["interval_s"]
    for panel, (title, value) in enumerate(panels):
        values = [v for points in series.values() for p in points if (v := value(p)) is not None]
        top_value = max([*values, interval if panel == 0 else 0.0, 1e-9]) * 1.1
        x0 = left + panel * (plot_w + 100)

        def y_of(v: float, top_value: float = top_value) -> float:
            return top + plot_h - v / top_value * plot_h

        parts.append(f'<rect x="{x0}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
        parts.append(f'<text x="{x0}" y="{top - 6}">{title}</text>')
        for fraction in (0.0, 0.5, 1.0):
            v = top_value * fraction
            parts.append(f'<text x="{x0 - 6}" y="{y_of(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        for x in xs:
            parts.append(f'<text x="{x_of(panel, x):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{x}</text>')
        parts.append(f'<text x="{x0 + plot_w / 2}" y="{top + plot_h + 34}" text-anchor="middle">subtasks</text>')
        if panel == 0:
            y = y_of(interval)
            parts.append(
                f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + plot_w}" y2="{y:.1f}" stroke="#999" stroke-dasharray="2,3"/>'
            )
            parts.append(f'<text x="{x0 + plot_w - 4}" y="{y - 4:.1f}" text-anchor="end">interval</text>')
        for name, points in series.items():
            line = [(x_of(panel, p["subtasks"]), y_of(v)) for p in points if (v := value(p)) is not None]
            if line:
                parts.append(_polyline(line, colors[name], dashed=name != "in-process"))
    for n, name in enumerate(series):
        y = height - 10
        x = left + n * 160
        parts.append(
            f'<line x1="{x}" y1="{y - 4}" x2="{x + 24}" y2="{y - 4}" stroke="{colors[name]}" stroke-width="2"/>'
        )
        parts.append(f'<text x="{x + 30}" y="{y}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------------
# Main


def _commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    commit = result.stdout.strip() or "unknown"
    return commit + ("-dirty" if dirty.stdout.strip() else "")


def _host() -> dict[str, Any]:
    return {"machine": platform.machine(), "cpus": os.cpu_count() or 0, "python": platform.python_version()}


def _largest(points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    done = [p for p in points if not p.get("error")]
    return max(done, key=lambda p: (p["subtasks"], p["taskmanagers"])) if done else None


def _p50(point: Mapping[str, Any], key: str) -> float | None:
    value = (point.get(key) or {}).get("p50")
    return float(value) if value is not None else None


def findings(document: Mapping[str, Any]) -> list[str]:
    """Paragraphs read off the figures: where the time and the CPU go at the largest points, in-process
    and over gRPC, and what a heartbeat, a deployment and a checkpoint's metadata cost."""
    out: list[str] = []
    ack_delay = document["settings"]["ack_delay_s"]
    size_sweep = [p for p in document["in_process"] if p["sweep"] == "subtasks"]
    largest = _largest(size_sweep)
    if largest is not None:
        parts = [_p50(largest, k) for k in ("trigger_fanout_s", "acks_s", "complete_and_notify_s")]
        if all(v is not None for v in parts):
            fanout, acks, complete = (float(v or 0.0) for v in parts)
            out.append(
                f"**In-process, {largest['subtasks']} subtasks on {largest['taskmanagers']} TaskManagers.** A "
                f"checkpoint's round trip (median {_p50(largest, 'round_trip_s') or 0.0:.3f} s) splits into the "
                f"trigger fan-out {fanout:.3f} s (one gateway call per source task, in turn), the "
                f"acknowledgements after the last trigger {acks:.3f} s (of which {ack_delay:g} s is the "
                f"simulated snapshot) and the completion {complete:.3f} s (the metadata of "
                f"{largest.get('metadata_bytes', 0) / 1e6:.1f} MB encoded in "
                f"{(largest.get('metadata_encode_s') or 0.0) * 1000:.0f} ms and written, then every TaskManager "
                "notified in turn)."
            )
        split = largest.get("jm_cpu_split_per_s")
        if split:
            out.append(
                f"Its JobManager uses {largest['jm_cpu_per_s']:.3f} cores: {split['jobmanager_threads']:.3f} on "
                f"its own threads (monitor, I/O workers, record writer) and {split['in_taskmanager_calls']:.3f} "
                f"inside the TaskManagers' calls; one acknowledgement costs "
                f"{((largest.get('ack_cpu_s') or {}).get('mean') or 0.0) * 1e6:.0f} µs of CPU. Placing the job "
                f"(every channel of every subtask and {largest.get('deploy_request_bytes', 0) / 1e6:.1f} MB of "
                f"deployment requests, {largest.get('deploy_request_bytes', 0) / largest['subtasks'] / 1e3:.1f} kB "
                f"each: an all-to-all job's requests list P input and P output channels) holds the lock "
                f"{largest.get('schedule_s') or 0.0:.2f} s."
            )
    grpc_points = document.get("grpc") or []
    g = _largest(grpc_points)
    if g is not None:
        parallelism = g["parallelism"]
        fanout, acks, complete = (_p50(g, k) or 0.0 for k in ("trigger_fanout_s", "acks_s", "complete_and_notify_s"))
        same = next(
            (
                p
                for p in document["in_process"]
                if (p["subtasks"], p["taskmanagers"]) == (g["subtasks"], g["taskmanagers"]) and not p.get("error")
            ),
            None,
        )
        ratio = (
            f" ({g['jm_cpu_per_s'] / same['jm_cpu_per_s']:.0f} times the in-process figure: the rest is gRPC, "
            "protobuf and the servicer, in Python)"
            if same is not None and same.get("jm_cpu_per_s") and g.get("jm_cpu_per_s")
            else ""
        )
        submit = g.get("submit_s") or 0.0
        deploy = g.get("deploy_s")
        out.append(
            f"**Over gRPC, {g['subtasks']} subtasks on {g['taskmanagers']} TaskManagers.** The round trip "
            f"(median {_p50(g, 'round_trip_s') or 0.0:.3f} s) splits into the trigger fan-out {fanout:.3f} s "
            f"({fanout / parallelism * 1000:.2f} ms per source, one blocking call after the other on one I/O "
            f"thread), the acknowledgements {acks:.3f} s ({g['subtasks']} calls into the servicer, whose median "
            f"call waited {(_p50(g, 'ack_wall_s') or 0.0) * 1000:.0f} ms) and the completion and notices "
            f"{complete:.3f} s ({g['taskmanagers']} notices in turn). The JobManager process uses "
            f"{g.get('jm_cpu_per_s') or 0.0:.3f} cores{ratio}."
            + (
                f" Deploying takes {deploy:.2f} s: {submit:.2f} s to accept and place the job, then "
                f"{(deploy - submit) / g['subtasks'] * 1000:.1f} ms per task, one DeployTask call after the other."
                if deploy is not None
                else ""
            )
        )
    hb = {h["tasks"]: h for h in document.get("heartbeat_cost", [])}
    grpc_hb = [p["heartbeat_grpc_cpu_s"] for p in grpc_points if p.get("heartbeat_grpc_cpu_s")]
    if 0 in hb and grpc_hb:
        per_task = [h["cpu_us_per_task"] for h in hb.values() if h["cpu_us_per_task"]]
        most = max(p["taskmanagers"] for p in grpc_points)
        out.append(
            f"**Heartbeats.** Handling one costs the JobManager {hb[0]['cpu_us']:.1f} µs"
            + (f" plus {statistics.median(per_task):.1f} µs per task it reports" if per_task else "")
            + " (in-process); over gRPC an idle "
            f"heartbeat costs {statistics.median(grpc_hb) * 1000:.2f} ms of the JobManager process's CPU, so "
            f"{most} TaskManagers heartbeating every second take "
            f"{most * statistics.median(grpc_hb) / HEARTBEAT_INTERVAL_S:.3f} cores. A heartbeat is a risk only "
            "when it waits for the lock (the *heartbeat call max* column) towards the "
            f"{HEARTBEAT_TIMEOUT_S:g} s heartbeat timeout."
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jm_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer points (~1.5 min)")
    parser.add_argument("--skip-grpc", action="store_true", help="in-process points only")
    parser.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, s")
    parser.add_argument("--ack-delay", type=float, default=0.05, help="barrier + snapshot time per task, s")
    parser.add_argument("--window", type=float, default=6.0, help="steady window per point, s")
    parser.add_argument("--min-checkpoints", type=int, default=3)
    parser.add_argument("--deploy-timeout", type=float, default=60.0)
    parser.add_argument("--storage", choices=("file", "s3"), default="file")
    parser.add_argument("--label", default="", help="'before': write jm_scale-before.json (the run before a fix)")
    parser.add_argument("--render", action="store_true", help="only regenerate the documents from jm_scale.json")
    parser.add_argument(
        "--note", default="", help="what the commit does not say (e.g. fixes reverted for a before run)"
    )
    args = parser.parse_args(argv)
    if args.render:
        document = json.loads((RESULTS_DIR / f"{RESULT_NAME}.json").read_text())
        document["findings"] = findings(document)
        publish(document, before_run=False)
        return 0

    run_id = time.strftime("%Y%m%d-%H%M%S")
    state = StateModel()
    load_start = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix=f"jm-scale-{run_id}-"))
    log_file = _configure_logs(workdir / "jobmanager-in-process.log")
    subtask_points = QUICK_SUBTASK_POINTS if args.quick else SUBTASK_POINTS
    tm_points = QUICK_TASKMANAGER_POINTS if args.quick else TASKMANAGER_POINTS
    plans = [("subtasks", n, taskmanagers_for(n)) for n in subtask_points]
    plans += [("taskmanagers", TM_SWEEP_SUBTASKS, t) for t in tm_points]
    points = []
    for sweep, n, tms in plans:
        _log(f"in-process: {n} subtasks on {tms} TaskManagers")
        storage = _open_storage(args.storage, workdir / f"in-process-{sweep}-{n}-{tms}", run_id)
        point = run_in_process_point(
            PointPlan(
                n, tms, args.interval, args.ack_delay, args.window, args.min_checkpoints, args.deploy_timeout, state
            ),
            storage,
            workdir / "jobmanager-in-process.log",
        )
        _remove_all(storage)
        point["sweep"] = sweep
        points.append(point)
        _log("  " + _summary(point))
    _log("heartbeat cost by tasks per heartbeat")
    hb = heartbeat_cost((0, 10, 100, 1000) if not args.quick else (0, 100))
    log_file.close()
    grpc_points: list[dict[str, Any]] = []
    document: dict[str, Any] = {
        "run_id": run_id,
        "commit": _commit() + (f" ({args.note})" if args.note else ""),
        "host": _host(),
        "settings": {
            "interval_s": args.interval,
            "ack_delay_s": args.ack_delay,
            "window_s": args.window,
            "min_checkpoints": args.min_checkpoints,
            "storage": "file:// (a local directory, fsync per object)" if args.storage == "file" else "S3",
            "state": asdict(state),
            "quick": args.quick,
        },
        "load_average_at_start": load_start,
        "in_process": points,
        "heartbeat_cost": hb,
    }
    if args.skip_grpc:
        document["grpc_skipped"] = "--skip-grpc"
    else:
        for n, tms in QUICK_GRPC_POINTS if args.quick else GRPC_POINTS:
            _log(f"over gRPC: {n} subtasks on {tms} TaskManagers")
            point = run_grpc_point(
                n,
                tms,
                interval_s=args.interval,
                ack_delay_s=args.ack_delay,
                window_s=args.window,
                min_checkpoints=args.min_checkpoints,
                deploy_timeout_s=args.deploy_timeout,
                state=state,
                workdir=workdir,
            )
            grpc_points.append(point)
            _log("  " + _summary(point))
    document["grpc"] = grpc_points
    document["load_average_at_end"] = os.getloadavg()
    document["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document["findings"] = findings(document)
    document["workdir"] = str(workdir)
    publish(document, before_run=args.label == "before")
    return 0


def publish(document: dict[str, Any], *, before_run: bool) -> None:
    """Write the results (JSON, Markdown, chart) and the generated doc page."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    if before_run:
        (RESULTS_DIR / f"{RESULT_NAME}-before.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
        print(render_markdown(document))
        return
    before_path = RESULTS_DIR / f"{RESULT_NAME}-before.json"
    before = json.loads(before_path.read_text()) if before_path.exists() else None
    chart = render_chart(document)
    if chart:
        (RESULTS_DIR / f"{RESULT_NAME}.svg").write_text(chart)
        document["curve_svg"] = f"../bench/results/{RESULT_NAME}.svg"
    (RESULTS_DIR / f"{RESULT_NAME}.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    markdown = render_markdown(document, before)
    DOC_PATH.write_text(markdown)
    (RESULTS_DIR / f"{RESULT_NAME}.md").write_text(markdown.replace("../bench/results/", ""))
    print(markdown)


def _summary(point: Mapping[str, Any]) -> str:
    rt = (point.get("round_trip_s") or {}).get("p50")
    cpu = point.get("jm_cpu_per_s")
    return (
        f"deploy {point.get('deploy_s') or float('nan'):.2f} s, round trip p50 {rt or float('nan'):.3f} s, "
        f"JM CPU {cpu or float('nan'):.2f} cores, checkpoints {point.get('checkpoints_completed')}"
        + (f", ERROR {point['error']}" if point.get("error") else "")
    )


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

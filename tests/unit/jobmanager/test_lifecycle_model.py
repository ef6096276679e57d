"""JobLifecycle (with its coordinator) in seeded random runs against a model of the world around it.

The world: source and sink tasks of the current attempt, a two-phase sink whose epochs are
pre-committed at a snapshot and committed by a completion notice, by a restore (its recovery) or by
the end's resolution; checkpoint storage where a persist's metadata lands (or not); the job record
the executor writes; a network that delivers everything late and in any order. The runs interleave
acks, declines, persist outcomes, sources reaching the end of their input, stop / stop --drain /
savepoint / cancel / rescale requests, savepoints that fail, task failures, resolutions that fail, and
JobManagers that die and are replaced by one taking the job over from its record and storage.

After every step the run checks what the protocol promises:
- every epoch a sink commits is covered by a completed checkpoint (its id is at most the newest
  checkpoint whose metadata is written), and no epoch of a completed checkpoint is rolled back;
- the end is resolved as of the latest completed checkpoint: no checkpoint completes after the end's
  resolution was decided with an older one;
- nothing is triggered while a stop's savepoint is in flight, nor after it completed or after the
  final checkpoint completed;
- checkpoint ids are never handed out twice, across JobManagers too;
- a rescale redeploys from its own checkpoint, completed and the latest one (the sinks committed it);
- in the end the job is ended with nothing prepared in the sink, or its end is unresolved and due to
  be retried.

A failing seed prints the seed and the last steps of its trace.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest

from weir.core.failures import Failure
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint, InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig, CheckpointIdCounter
from weir.jobmanager.errors import RescaleRejectedError, SavepointRejectedError
from weir.jobmanager.lifecycle import (
    CancelTasks,
    Created,
    Ended,
    Ending,
    JobLifecycle,
    RecordedEnd,
    Rescale,
    RescaleAborted,
    RescaleDeployed,
    RescaleTriggered,
    ResolveSinks,
    Running,
    SaveRecord,
    StatusChanged,
    StopRequest,
)
from weir.jobmanager.restart import parse_restart_strategy

JOB = JobId("job-m")
SOURCES = tuple(TaskId(JOB, OperatorUid("src"), SubtaskIndex(i)) for i in range(2))
SINK = TaskId(JOB, OperatorUid("sink"), SubtaskIndex(0))
TASKS = (*SOURCES, SINK)
PREPARED, COMMITTED, ROLLED_BACK = "prepared", "committed", "rolled back"


class Violation(AssertionError):
    pass


@dataclass
class Record:
    """The job record as the executor last wrote it."""

    status: JobStatus = JobStatus.CREATED
    attempt: int = 0
    end: RecordedEnd | None = None
    reserved_through: int = 0
    stop: StopRequest | None = None


@dataclass
class Sink:
    """One two-phase sink subtask: an epoch per checkpoint its attempt snapshotted."""

    epochs: dict[tuple[int, int], str] = field(default_factory=dict)  # (attempt, checkpoint id) -> state
    fenced_below: int = 0  # attempts below this can no longer touch the external system


class Simulation:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.trace: list[str] = []
        self.events: list[tuple[float, int, str, tuple[object, ...]]] = []
        self.seq = 0
        self.bounded = self.rng.random() < 0.5
        self.strategy = self.rng.choice(
            [
                {"restart.strategy": "none"},
                {"restart.strategy": "fixed-delay", "restart.delay": "1s", "restart.max-attempts": "3"},
                {"restart.strategy": "fixed-delay", "restart.delay": "0.5s"},
            ]
        )
        self.resolution_failure_rate = self.rng.choice([0.0, 0.3, 0.7])
        # The world.
        self.storage: dict[int, CompletedCheckpoint] = {}  # metadata written
        self.record = Record()
        self.sink = Sink()
        self.live_attempt = 0  # the attempt whose tasks run (0: none)
        self.ended_input: set[TaskId] = set()
        self.finished: set[TaskId] = set()
        self.final_notified = False
        self.running: set[TaskId] = set()
        self.restored = False
        # Observations.
        self.handed_ids: list[int] = []
        self.stop_savepoint: int | None = None  # a stop's savepoint triggered and not yet aborted
        self.stop_completed = False
        self.final_completed_at: float | None = None
        self.resolved_as_of: list[int | None] = []  # every resolution decided, by this run's JobManagers
        self.jobmanagers = 0
        self.lifecycle = self._new_jobmanager()
        self.jm_epoch = self.jobmanagers  # events of a dead JobManager are dropped
        self.lifecycle_actions(*self._deploy_if_due())

    # -- JobManagers ---------------------------------------------------------------------------------

    def _new_jobmanager(self) -> JobLifecycle:
        self.jobmanagers += 1
        coordinator = cc.CheckpointCoordinator(
            JOB,
            CheckpointConfig(interval_s=1.0, timeout_s=self.rng.choice([3.0, 6.0])),
            InMemoryCompletedCheckpointStore(max_retained=2),
            counter=CheckpointIdCounter(reservation_block=self.rng.choice([1, 3, 100])),
        )
        return JobLifecycle(JOB, coordinator, parse_restart_strategy(self.strategy), SOURCES)

    def take_over(self) -> None:
        """The JobManager dies; a new one takes the job over from its record and from storage."""
        self.note("JobManager killed; a new one takes over")
        for _when, _seq, kind, payload in list(self.events):
            if kind == "persist" and self.rng.random() < 0.5:  # the PUT landed before the crash
                completed = payload[1]
                assert isinstance(completed, CompletedCheckpoint)
                self.storage[completed.checkpoint_id] = completed
        self.events = [e for e in self.events if e[2] in ("task", "notify-task", "cancel-task")]
        heapq.heapify(self.events)
        lifecycle = self._new_jobmanager()
        self.jm_epoch = self.jobmanagers
        actions = lifecycle.coordinator.load_completed(
            self.storage.values(), CheckpointId(max([self.record.reserved_through, *self.storage], default=0)) or None
        )
        del actions  # deletes: nothing to model
        record = self.record
        lifecycle.take_over(self.now, record.status, record.attempt, record.end, self.now + 0.5, record.stop)
        self.lifecycle = lifecycle
        # Heartbeats to the new JobManager cancel the old attempt's tasks.
        self.schedule(self.rng.uniform(0.1, 0.5), "cancel-task", self.live_attempt)
        self.lifecycle_actions(*lifecycle.tick(self.now))

    # -- plumbing ------------------------------------------------------------------------------------

    def note(self, line: str) -> None:
        self.trace.append(f"t={self.now:7.2f} {line}")

    def schedule(self, delay: float, kind: str, *payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (self.now + delay, self.seq, kind, (self.jm_epoch, *payload)))

    def fail(self, message: str) -> None:
        trace = "\n  ".join(self.trace[-40:])
        raise Violation(f"seed {self.seed}: {message}\n  last steps:\n  {trace}")

    def record_now(self) -> None:
        lc = self.lifecycle
        self.record = Record(
            lc.status, lc.attempt, lc.recorded_end(), int(lc.coordinator.ids_reserved_through), lc.stop_request
        )

    # -- carrying out actions (the executor) ---------------------------------------------------------

    def lifecycle_actions(self, *actions: object) -> None:
        stop = self.stop_savepoint
        if stop is not None and self.lifecycle.stop_request is None:  # the stop ended
            if stop in self.storage:
                self.stop_completed = True
            else:
                self.note(f"the stop's savepoint {stop} failed")
            self.stop_savepoint = None
        for action in actions:
            match action:
                case cc.TriggerBarriers():
                    self.on_trigger(action)
                case cc.PersistCheckpoint(completed=completed):
                    self.schedule(self.rng.uniform(0.0, 1.5), "persist", completed)
                case cc.NotifyComplete(checkpoint_id=cid):
                    self.schedule(self.rng.uniform(0.0, 1.0), "notify-task", self.live_attempt, cid)
                case cc.NotifyAborted() | cc.DeleteObjects():
                    pass
                case CancelTasks(attempt=attempt):
                    self.schedule(self.rng.uniform(0.0, 0.5), "cancel-task", attempt)
                case ResolveSinks(as_of=as_of, resolution_attempt=attempt, outcome=outcome):
                    self.record_now()
                    end = self.lifecycle.recorded_end()
                    if not outcome.terminal or end is None or outcome is not end.outcome:
                        self.fail(f"the end is resolved as {outcome.value}, the job's end is {end}")
                    decided = as_of.checkpoint_id if as_of is not None else None
                    latest = max(self.storage, default=None)
                    if decided != latest:
                        self.fail(f"the end is resolved as of {decided}, the latest completed is {latest}")
                    self.resolved_as_of.append(decided)
                    self.note(f"resolve the sinks as of {decided} as attempt {attempt}")
                    self.schedule(self.rng.uniform(0.1, 1.0), "resolve", decided, attempt)
                case StatusChanged(after=after, reason=reason):
                    self.note(f"status {after.value}: {reason}")
                    self.record_now()
                case SaveRecord():
                    self.record_now()
                case RescaleTriggered(checkpoint_id=cid):
                    self.note(f"the rescale's checkpoint {cid} triggered")
                case Rescale(parallelism=parallelism, checkpoint_id=cid):
                    latest = max(self.storage, default=None)
                    if cid != latest:
                        self.fail(f"the rescale redeploys from checkpoint {cid}, the latest completed is {latest}")
                    self.note(f"rescaling to {parallelism} from checkpoint {cid}")
                case RescaleDeployed():
                    self.note("the rescale redeployed")
                case RescaleAborted(reason=reason):
                    self.note(f"the rescale failed: {reason}")
                case _:
                    self.fail(f"an action the executor does not know: {action!r}")
        self.check()

    def on_trigger(self, trigger: cc.TriggerBarriers) -> None:
        cid = int(trigger.checkpoint_id)
        if self.handed_ids and cid <= self.handed_ids[-1]:
            self.fail(f"checkpoint id {cid} handed out after {self.handed_ids[-1]}")
        if self.stop_savepoint is not None or self.stop_completed:
            self.fail(f"checkpoint {cid} triggered after the stop's savepoint {self.stop_savepoint}")
        if self.final_completed_at is not None:
            self.fail(f"checkpoint {cid} triggered after the final checkpoint completed")
        if trigger.reserve_ids_through is not None:
            self.record_now()  # the executor writes the reservation before any barrier
        if cid > self.record.reserved_through:
            self.fail(f"checkpoint {cid} went out before its id was reserved in the record")
        self.handed_ids.append(cid)
        self.note(f"trigger {trigger.kind.value} {cid}{' final' if trigger.final else ''}")
        if self.live_attempt:
            for task in TASKS:
                self.schedule(self.rng.uniform(0.0, 1.0), "snapshot", self.live_attempt, task, cid)

    # -- the world's events --------------------------------------------------------------------------

    def deliver(self, kind: str, payload: tuple[object, ...]) -> None:
        jm_epoch, *rest = payload
        to_dead_jobmanager = jm_epoch != self.jm_epoch
        match kind:
            case "snapshot":
                attempt, task, cid = rest
                if attempt != self.live_attempt or task in self.finished:
                    return
                assert isinstance(task, TaskId) and isinstance(cid, int) and isinstance(attempt, int)
                if task == SINK and attempt >= self.sink.fenced_below:
                    self.sink.epochs.setdefault((attempt, cid), PREPARED)
                if self.rng.random() < 0.04:
                    self.schedule(self.rng.uniform(0.0, 0.5), "decline", attempt, task, cid)
                else:
                    self.schedule(self.rng.uniform(0.0, 0.8), "ack", attempt, task, cid)
            case "ack" | "decline" if not to_dead_jobmanager:
                attempt, task, cid = rest
                assert isinstance(task, TaskId) and isinstance(cid, int)
                if attempt != self.lifecycle.attempt:
                    return  # the JobManager drops another attempt's messages
                if kind == "ack":
                    outcome = self.lifecycle.receive_ack(self.now, CheckpointId(cid), task, TaskStateHandle(task))
                    self.lifecycle_actions(*outcome.actions)
                else:
                    self.note(f"{task} declines {cid}")
                    self.lifecycle_actions(*self.lifecycle.receive_decline(self.now, CheckpointId(cid), task, "no"))
            case "persist" if not to_dead_jobmanager:
                (completed,) = rest
                assert isinstance(completed, CompletedCheckpoint)
                cid = completed.checkpoint_id
                if self.rng.random() < 0.08:
                    self.note(f"persist of {cid} failed")
                    self.lifecycle_actions(*self.lifecycle.checkpoint_persist_failed(self.now, cid, "S3 down"))
                    return
                if any(as_of is not None and as_of < cid or as_of is None for as_of in self.resolved_as_of):
                    self.fail(f"checkpoint {cid} completed after the end was resolved as of {self.resolved_as_of}")
                self.storage[cid] = completed
                self.note(f"checkpoint {cid} completed")
                self.lifecycle_actions(*self.lifecycle.checkpoint_persisted(self.now, cid))
                state = self.lifecycle.state
                if isinstance(state, Running) and state.final_completed and self.final_completed_at is None:
                    self.final_completed_at = self.now
            case "notify-task":
                attempt, cid = rest
                assert isinstance(attempt, int) and isinstance(cid, int)
                if attempt != self.live_attempt:
                    return
                self.commit_through(attempt, cid, why=f"notice of {cid}")
                state = self.lifecycle.state
                if self.final_completed_at is not None and isinstance(state, Running) and not self.final_notified:
                    self.final_notified = True
                    for task in TASKS:
                        self.schedule(self.rng.uniform(0.0, 0.5), "task", attempt, task, "finished")
            case "task":
                attempt, task, what = rest
                if attempt != self.live_attempt:
                    return
                assert isinstance(task, TaskId)
                if what == "running":
                    self.running.add(task)
                    if self.running >= set(TASKS) and not to_dead_jobmanager:
                        actions = self.lifecycle.tasks_running(self.now, TASKS, restored=self.restored)
                        self.lifecycle_actions(*actions)
                elif what == "ended" and not to_dead_jobmanager:
                    self.note(f"{task} read all its input")
                    self.ended_input.add(task)
                    self.lifecycle_actions(*self.lifecycle.source_ended(self.now, task))
                elif what == "finished" and not to_dead_jobmanager:
                    self.finished.add(task)
                    everything = self.finished >= set(TASKS)
                    self.lifecycle_actions(*self.lifecycle.task_finished(self.now, task, all_finished=everything))
            case "cancel-task":
                (attempt,) = rest
                assert isinstance(attempt, int)
                if attempt and attempt == self.live_attempt:
                    self.note(f"attempt {attempt}'s tasks stop")
                    self.live_attempt = 0
            case "resolve" if not to_dead_jobmanager:
                as_of, attempt = rest
                assert isinstance(attempt, int)
                self.live_attempt = 0  # every task of the job is stopped first
                if self.rng.random() < self.resolution_failure_rate:
                    self.note("the resolution failed")
                    self.lifecycle_actions(*self.lifecycle.resolution_failed(self.now, "PostgreSQL down"))
                    return
                self.recover_sink(attempt, as_of if isinstance(as_of, int) else None, why="the end's resolution")
                self.lifecycle_actions(*self.lifecycle.resolution_succeeded(self.now))
            case _:
                pass  # a message to a dead JobManager

    def commit_through(self, attempt: int, cid: int, why: str) -> None:
        if attempt < self.sink.fenced_below:
            return
        for (a, c), state in sorted(self.sink.epochs.items()):
            if state == PREPARED and c <= cid:
                self.commit(a, c, why)

    def commit(self, attempt: int, cid: int, why: str) -> None:
        covered = max(self.storage, default=0)
        if cid > covered:
            self.fail(f"the sink commits epoch {cid} ({why}); the newest completed checkpoint is {covered}")
        self.sink.epochs[(attempt, cid)] = COMMITTED

    def recover_sink(self, attempt: int, as_of: int | None, why: str) -> None:
        """A sink opened as ``attempt`` from checkpoint ``as_of``: it fences every older attempt, commits
        what the checkpoint pre-committed and rolls back the rest."""
        self.sink.fenced_below = max(self.sink.fenced_below, attempt)
        for (a, c), state in sorted(self.sink.epochs.items()):
            if state != PREPARED or a >= attempt:
                continue
            if as_of is not None and c <= as_of:
                self.commit(a, c, why)
            else:
                if c in self.storage:
                    self.fail(f"{why} rolls back epoch {c} of a completed checkpoint (as of {as_of})")
                self.sink.epochs[(a, c)] = ROLLED_BACK

    # -- the JobManager's other duties (the monitor and the deployer) --------------------------------

    def _deploy_if_due(self) -> tuple[object, ...]:
        lc = self.lifecycle
        if not (isinstance(lc.state, Created) or lc.restart_due(self.now)):
            return ()
        decision = lc.restore_decision(self.now)
        match decision:
            case cc.WaitForPersist():
                return lc.restart_later(self.now + 0.3)
            case cc.RestoreFrom(checkpoint=checkpoint):
                restored: int | None = int(checkpoint.checkpoint_id)
            case cc.StartFresh():
                restored = None
        attempt, actions = lc.deploying(self.now)
        self.note(f"deploy attempt {attempt} from checkpoint {restored}")
        self.live_attempt = attempt
        self.restored = restored is not None
        self.running = set()
        self.ended_input = set()
        self.finished = set()
        self.final_notified = False
        self.final_completed_at = None
        self.recover_sink(attempt, restored, why=f"attempt {attempt}'s restore")
        for task in TASKS:
            self.schedule(self.rng.uniform(0.0, 0.5), "task", attempt, task, "running")
            if self.bounded and task in SOURCES:
                self.schedule(self.rng.uniform(1.0, 8.0), "task", attempt, task, "ended")
        return actions

    def request(self) -> None:
        """A user, a failure or a crash: one of them at random, now and then."""
        lc = self.lifecycle
        roll = self.rng.random()
        if roll < 0.015 and lc.status is JobStatus.RUNNING:
            self.note("a task fails")
            failure = Failure.internal("injected")
            self.lifecycle_actions(*lc.task_failed(self.now, self.rng.choice(TASKS), failure))
        elif roll < 0.025:
            stop, drain = self.rng.choice([(True, False), (True, True), (False, False)])
            try:
                cid, actions = lc.trigger_savepoint(self.now, stop=stop, drain=drain)
            except SavepointRejectedError as exc:
                self.note(f"savepoint refused: {exc}")
                return
            self.note(f"{'stop' if stop else 'savepoint'}{' --drain' if drain else ''} requested: savepoint {cid}")
            self.lifecycle_actions(*actions)
            if stop:
                self.stop_savepoint = int(cid)
        elif roll < 0.028:
            try:
                actions = lc.trigger_rescale(self.now, 2)
            except RescaleRejectedError as exc:
                self.note(f"rescale refused: {exc}")
                return
            self.note("rescale requested")
            self.lifecycle_actions(*actions)
        elif roll < 0.03:
            self.note("cancel requested")
            self.lifecycle_actions(*lc.cancel(self.now))
        elif roll < 0.036:
            self.take_over()

    def step(self) -> None:
        self.now += self.rng.uniform(0.05, 0.4)
        while self.events and self.events[0][0] <= self.now:
            _when, _seq, kind, payload = heapq.heappop(self.events)
            self.deliver(kind, payload)
        self.request()
        self.lifecycle_actions(*self._deploy_if_due())
        self.lifecycle_actions(*self.lifecycle.tick(self.now))

    # -- checks --------------------------------------------------------------------------------------

    def check(self) -> None:
        state = self.lifecycle.state
        if isinstance(state, Ended | Ending) and state.resolution is not None and state.resolution.resolved:
            prepared = [k for k, v in self.sink.epochs.items() if v == PREPARED and k[0] >= self.sink.fenced_below]
            if prepared and self.live_attempt:
                self.fail(f"the end is resolved but the live attempt keeps {prepared} prepared")

    def finish(self) -> None:
        """Let the world settle: no more requests; the job ends (cancel it if it still runs)."""
        for _ in range(400):
            self.now += 0.5
            while self.events and self.events[0][0] <= self.now:
                _when, _seq, kind, payload = heapq.heappop(self.events)
                self.deliver(kind, payload)
            if self.lifecycle.status in (JobStatus.RUNNING, JobStatus.RESTARTING, JobStatus.CREATED):
                self.lifecycle_actions(*self.lifecycle.cancel(self.now))
            self.resolution_failure_rate = 0.0  # PostgreSQL is back
            self.lifecycle_actions(*self.lifecycle.tick(self.now))
            if not self.events and isinstance(self.lifecycle.state, Ended) and not self.lifecycle.unresolved_end:
                break
        state = self.lifecycle.state
        if not isinstance(state, Ended):
            self.fail(f"the job did not end: {state}")
        if self.lifecycle.unresolved_end:
            self.fail(f"the end stayed unresolved once PostgreSQL was back: {state}")
        prepared = [k for k, v in self.sink.epochs.items() if v == PREPARED]
        if prepared:
            self.fail(f"the job ended {state.outcome.value} with epochs {prepared} prepared")
        if state.resolution is not None and state.resolution.as_of != max(self.storage, default=None):
            self.fail(f"resolved as of {state.resolution.as_of}, the latest completed is {max(self.storage)}")


def _run(seed: int, steps: int = 400) -> Simulation:
    sim = Simulation(seed)
    for _ in range(steps):
        sim.step()
    sim.finish()
    return sim


@pytest.mark.parametrize("seed", range(300))
def test_random_lifecycles_keep_the_protocol(seed: int) -> None:
    _run(seed)


def test_the_random_runs_reach_every_edge() -> None:
    """The runs are worth their seeds: together they cover each edge the protocol is about."""
    seen: dict[str, int] = {}

    def saw(what: str, condition: bool) -> None:
        seen[what] = seen.get(what, 0) + int(condition)

    for seed in range(300):
        sim = _run(seed)
        text = "\n".join(sim.trace)
        saw("final checkpoint completed and every task finished", "every task finished" in text)
        saw("stopped with a savepoint", "stopped with savepoint" in text)
        saw("a stop's savepoint failed", "the stop's savepoint" in text and "failed" in text)
        saw("a drained stop failed and restarted", "stop with --drain failed" in text)
        saw("cancelled", "status CANCELLING: cancelled" in text)
        saw("the strategy gave up", "status FAILED" in text)
        saw("a resolution failed and was retried", "the resolution failed" in text)
        saw("a JobManager took over", "a new one takes over" in text)
        saw("a rescale redeployed", "the rescale redeployed" in text)
        saw("a rescale failed", "the rescale failed" in text)
        restored = any("deploy attempt" in line and "from checkpoint None" not in line for line in sim.trace)
        saw("a restart restored a checkpoint", restored)
    missing = [what for what, count in seen.items() if count == 0]
    assert not missing, f"no run reached: {missing}"

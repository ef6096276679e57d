"""When to trigger the next periodic checkpoint, and which id it gets.

``CheckpointTriggerDecider.decide`` is a pure function of the time and a ``TriggerState`` snapshot:
it answers ``TriggerNow``, ``TriggerLater(at)`` or ``Blocked(reason)`` and changes nothing. The id in
``TriggerNow`` is the counter's next id; the caller takes it with ``CheckpointIdCounter.next()`` when it
actually triggers.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from weir.core.ids import CheckpointId
from weir.jobmanager.errors import CheckpointProtocolError, ConfigError


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpointing settings; times in seconds. ``interval_s=None`` turns periodic checkpoints off.

    With ``min_pause_s > 0`` a checkpoint is triggered only when none is in flight, so the pause can be
    measured from the end of the previous one (completed or aborted).
    """

    interval_s: float | None
    timeout_s: float = 600.0
    min_pause_s: float = 0.0
    max_concurrent: int = 1

    def __post_init__(self) -> None:
        if self.interval_s is not None and not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ConfigError("checkpointing.interval", f"must be a positive duration, got {self.interval_s}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError("checkpointing.timeout", f"must be a positive duration, got {self.timeout_s}")
        if not (math.isfinite(self.min_pause_s) and self.min_pause_s >= 0):
            raise ConfigError("checkpointing.min-pause", f"must be zero or a positive duration, got {self.min_pause_s}")
        if self.max_concurrent < 1:
            raise ConfigError("checkpointing.max-concurrent", f"must be at least 1, got {self.max_concurrent}")


class CheckpointIdCounter:
    """Hands out strictly increasing checkpoint ids, starting at ``first``, never one twice, across
    JobManager restarts too.

    Ids are reserved in blocks (as Flink's checkpoint id counter lives in ZooKeeper): ``next`` answers
    the id and, when it is past the reserved block, the end of a new block that the caller must make
    durable *before* anything carries the id (a barrier, a sink transaction). A JobManager that took
    over continues after the highest reservation it reads back (``restore_after``), so an id that was
    triggered but never reached checkpoint metadata is not handed out again.
    """

    def __init__(self, first: int = 1, reservation_block: int = 100) -> None:
        if first < 1:
            raise CheckpointProtocolError(f"checkpoint ids start at 1 or later, got {first}")
        if reservation_block < 1:
            raise CheckpointProtocolError(
                f"checkpoint ids are reserved in blocks of 1 or more, got {reservation_block}"
            )
        self._next = first
        self._block = reservation_block
        self._reserved_through = first - 1  # nothing reserved yet

    @property
    def reserved_through(self) -> CheckpointId:
        """The highest id reserved so far (0: none): persist it with the job."""
        return CheckpointId(self._reserved_through)

    def peek(self) -> CheckpointId:
        """The id the next ``next()`` will return."""
        return CheckpointId(self._next)

    def next(self) -> tuple[CheckpointId, CheckpointId | None]:
        """The next id, and the end of a newly reserved block to persist before using it (None when
        the id lies within the block reserved before)."""
        value = self._next
        self._next += 1
        if value <= self._reserved_through:
            return CheckpointId(value), None
        self._reserved_through = value + self._block - 1
        return CheckpointId(value), CheckpointId(self._reserved_through)

    def reservation_failed(self, checkpoint_id: CheckpointId) -> None:
        """The reservation made for ``checkpoint_id`` did not become durable: the next id reserves again."""
        self._reserved_through = min(self._reserved_through, checkpoint_id - 1)

    def restore_after(self, last_id: CheckpointId) -> None:
        """Continue after ``last_id`` (the latest completed checkpoint, the highest id in storage, the
        highest reservation); never moves backwards.

        Ids of aborted checkpoints are not reused, since their objects may still be in storage.
        """
        self._next = max(self._next, last_id + 1)
        self._reserved_through = max(self._reserved_through, self._next - 1)


class BlockReason(enum.Enum):
    JOB_NOT_RUNNING = "job_not_running"
    PERIODIC_DISABLED = "periodic_disabled"
    TOO_MANY_CONCURRENT = "too_many_concurrent"
    SAVEPOINT_IN_PROGRESS = "savepoint_in_progress"
    PAUSE_AFTER_IN_FLIGHT = "pause_after_in_flight"  # min pause > 0 and a checkpoint is in flight


@dataclass(frozen=True)
class TriggerNow:
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class TriggerLater:
    at: float


@dataclass(frozen=True)
class Blocked:
    """No periodic checkpoint until the state changes (a checkpoint ends, the job starts...)."""

    reason: BlockReason


TriggerDecision = TriggerNow | TriggerLater | Blocked


@dataclass(frozen=True)
class TriggerState:
    """What the decider needs to know about the job and its checkpoints at one instant.

    ``in_flight`` counts checkpoints and savepoints triggered and not yet completed (persisted) or
    aborted. ``schedule_origin`` is when the job last started running; ``last_end_at`` when the last
    checkpoint completed or was aborted. ``restored``: the tasks started from restored state (a
    restart, or a job started from a checkpoint or savepoint), so the first periodic checkpoint is
    due at once: the exactly-once sinks commit the restored run's output with it, and waiting one
    interval would only delay that output.
    """

    running: bool
    in_flight: int
    savepoint_in_flight: bool
    schedule_origin: float
    last_periodic_trigger_at: float | None = None
    last_end_at: float | None = None
    restored: bool = False


class CheckpointTriggerDecider:
    """Decides on periodic checkpoints from the config; savepoints do not go through it."""

    def __init__(self, config: CheckpointConfig, counter: CheckpointIdCounter) -> None:
        self._config = config
        self._counter = counter

    @property
    def config(self) -> CheckpointConfig:
        return self._config

    def decide(self, now: float, state: TriggerState) -> TriggerDecision:
        interval = self._config.interval_s
        if not state.running:
            return Blocked(BlockReason.JOB_NOT_RUNNING)
        if interval is None:
            return Blocked(BlockReason.PERIODIC_DISABLED)
        if state.in_flight >= self._config.max_concurrent:
            return Blocked(BlockReason.TOO_MANY_CONCURRENT)
        if state.savepoint_in_flight:
            return Blocked(BlockReason.SAVEPOINT_IN_PROGRESS)
        if self._config.min_pause_s > 0 and state.in_flight > 0:
            return Blocked(BlockReason.PAUSE_AFTER_IN_FLIGHT)
        at = self.due_at(state, interval)
        if now >= at:
            return TriggerNow(self._counter.peek())
        return TriggerLater(at)

    def due_at(self, state: TriggerState, interval_s: float) -> float:
        """The earliest time the schedule and the minimum pause allow the next periodic checkpoint."""
        base = state.schedule_origin
        last = state.last_periodic_trigger_at
        if state.restored and (last is None or last < base):
            due = base  # the first checkpoint since a restore: as soon as every task runs
        else:
            due = (base if last is None else max(base, last)) + interval_s
        if state.last_end_at is not None:
            due = max(due, state.last_end_at + self._config.min_pause_s)
        return due

"""A seeded random schedule of faults: which fault, against what, when, for how long.

Pure: the same seed, count, kinds and run length always give the same schedule, so a run that found a
defect is run again by its seed (``make chaos CHAOS_ARGS="--seed 7"``).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, assert_never


class FaultKind(enum.Enum):
    KILL_TASKMANAGER = "kill-taskmanager"  # SIGKILL of one TaskManager (the supervisor restarts it)
    KILL_JOBMANAGER = "kill-jobmanager"  # SIGKILL of the JobManager (restarted; jobs recovered from their records)
    PAUSE_TASKMANAGER = "pause-taskmanager"  # SIGSTOP longer than the heartbeat timeout, then SIGCONT: a zombie
    RESTART_KAFKA = "restart-kafka"  # the broker stopped and started: coordinator gone, producers fenced/aborted
    RESTART_POSTGRES = "restart-postgres"  # connections lost; prepared transactions survive
    RESTART_S3 = "restart-s3"  # the checkpoint storage stopped and started
    PAUSE_S3 = "pause-s3"  # the S3 server SIGSTOPped for a while: uploads hang, then go on
    SLOW_S3 = "slow-s3"  # the S3 server let run a fifth of the time for a while: every upload slow
    FILL_DISK = "fill-disk"  # a TaskManager's local disk (its RocksDB databases) full for a while


ALL_KINDS: Final = tuple(FaultKind)
TASKMANAGERS: Final = ("taskmanager-1", "taskmanager-2", "taskmanager-3")


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the job started running
    kind: FaultKind
    target: str  # the process or service it hits
    duration_s: float  # how long a pause lasts or a service stays down; 0 for a kill

    def describe(self) -> str:
        held = f" for {self.duration_s:.1f}s" if self.duration_s else ""
        return f"t+{self.at_s:5.1f}s {self.kind.value} {self.target}{held}"


def target_of(kind: FaultKind, rng: random.Random) -> str:
    match kind:
        case FaultKind.KILL_TASKMANAGER | FaultKind.PAUSE_TASKMANAGER | FaultKind.FILL_DISK:
            return rng.choice(TASKMANAGERS)
        case FaultKind.KILL_JOBMANAGER:
            return "jobmanager"
        case FaultKind.RESTART_KAFKA:
            return "kafka"
        case FaultKind.RESTART_POSTGRES:
            return "postgres"
        case FaultKind.RESTART_S3 | FaultKind.PAUSE_S3 | FaultKind.SLOW_S3:
            return "s3"
        case _ as unreachable:
            assert_never(unreachable)


def duration_of(kind: FaultKind, rng: random.Random, heartbeat_timeout_s: float) -> float:
    match kind:
        case FaultKind.KILL_TASKMANAGER | FaultKind.KILL_JOBMANAGER:
            return 0.0
        case FaultKind.PAUSE_TASKMANAGER:  # long enough that the JobManager declares it lost
            return round(heartbeat_timeout_s + rng.uniform(2.0, 6.0), 1)
        case FaultKind.RESTART_KAFKA | FaultKind.RESTART_POSTGRES | FaultKind.RESTART_S3:
            return round(rng.uniform(1.0, 5.0), 1)  # down this long between stop and start
        case FaultKind.PAUSE_S3:
            return round(rng.uniform(3.0, 12.0), 1)
        case FaultKind.SLOW_S3:  # several checkpoints' uploads at a fifth of the speed
            return round(rng.uniform(8.0, 20.0), 1)
        case FaultKind.FILL_DISK:
            return round(rng.uniform(5.0, 15.0), 1)
        case _ as unreachable:
            assert_never(unreachable)


def make_schedule(
    *,
    seed: int,
    count: int,
    kinds: Sequence[FaultKind],
    run_s: float,
    min_gap_s: float,
    heartbeat_timeout_s: float,
    start_s: float = 5.0,
) -> tuple[Fault, ...]:
    """``count`` faults over ``[start_s, run_s)``, each at least ``min_gap_s`` after the previous one
    ended, kinds drawn in turn from a shuffled cycle of ``kinds`` (every kind appears once before any
    appears twice). ValueError when they cannot fit."""
    if count < 0:
        raise ValueError("the fault count must be 0 or more")
    if count and not kinds:
        raise ValueError("no fault kinds to draw from")
    rng = random.Random(seed)
    drawn: list[FaultKind] = []
    while len(drawn) < count:
        cycle = list(dict.fromkeys(kinds))
        rng.shuffle(cycle)
        drawn.extend(cycle)
    drawn = drawn[:count]
    durations = [duration_of(k, rng, heartbeat_timeout_s) for k in drawn]
    busy = sum(durations) + min_gap_s * count
    room = run_s - start_s
    if count and busy > room:
        raise ValueError(
            f"{count} faults need at least {busy:.0f}s (their durations and a gap of {min_gap_s:g}s after each) "
            f"but the run leaves {room:.0f}s: give fewer faults, a shorter gap or more events"
        )
    slack = room - busy
    # Spread the slack at random between the faults: sorted cut points of [0, slack).
    cuts = sorted(rng.uniform(0.0, slack) for _ in range(count))
    faults: list[Fault] = []
    at = start_s
    previous_cut = 0.0
    for kind, duration, cut in zip(drawn, durations, cuts, strict=True):
        at += cut - previous_cut
        previous_cut = cut
        faults.append(Fault(round(at, 1), kind, target_of(kind, rng), duration))
        at += duration + min_gap_s
    return tuple(faults)


def parse_kinds(text: str) -> tuple[FaultKind, ...]:
    """``"kill-taskmanager,restart-kafka"`` (or ``all``) as kinds; ValueError naming the valid ones."""
    if text.strip() in ("", "all"):
        return ALL_KINDS
    kinds = []
    for name in text.split(","):
        try:
            kinds.append(FaultKind(name.strip()))
        except ValueError:
            valid = ", ".join(k.value for k in FaultKind)
            raise ValueError(f"unknown fault kind {name.strip()!r}; the kinds are {valid} (or all)") from None
    return tuple(kinds)

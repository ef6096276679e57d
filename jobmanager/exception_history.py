"""A job's exception history: the last failures that failed it over, newest first (Flink's
``/jobs/:jobid/exceptions``), each with its typed cause, the task and TaskManager it came from, the
attempt it ended and when. A plain bounded value: kept in the job's durable record
(``weir.jobmanager.records``), so a JobManager that takes the job over shows the same history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from weir.core.failures import Failure

HISTORY_SIZE: Final = 100  # entries kept per job; older ones are dropped


@dataclass(frozen=True)
class ExceptionEntry:
    """One failure of a job: ``vertex_uid`` and ``subtask`` name the task that failed (None for a
    failure of no single task, e.g. a lost TaskManager); ``taskmanager_id`` where it ran (None: not
    known); ``attempt`` the job attempt it ended; ``timestamp`` seconds since the epoch."""

    failure: Failure
    timestamp: float
    attempt: int
    vertex_uid: str | None = None
    subtask: int | None = None
    taskmanager_id: str | None = None


@dataclass(frozen=True)
class ExceptionHistory:
    entries: tuple[ExceptionEntry, ...] = ()  # newest first
    capacity: int = HISTORY_SIZE

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"an exception history keeps at least one entry, not {self.capacity}")
        if len(self.entries) > self.capacity:
            object.__setattr__(self, "entries", self.entries[: self.capacity])

    def add(self, entry: ExceptionEntry) -> ExceptionHistory:
        """The history with ``entry`` as the newest; the oldest goes beyond the capacity."""
        return ExceptionHistory((entry, *self.entries)[: self.capacity], self.capacity)

    def latest(self, count: int) -> tuple[tuple[ExceptionEntry, ...], bool]:
        """The ``count`` newest entries, and whether older ones were left out."""
        return self.entries[:count], len(self.entries) > count

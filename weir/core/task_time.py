"""Where a task's time goes: busy (processing), backpressured (waiting for output credit), idle
(waiting for input or a mail), as Flink's ``busyTimeMsPerSecond`` / ``backPressuredTimeMsPerSecond``
/ ``idleTimeMsPerSecond``.

The task thread accounts its time in running totals (``weir_busy_seconds_total`` and its siblings
are fed from the same totals); the TaskManager's heartbeat turns two snapshots of them into the
shares of the interval between (``ratios_between``), which the JobManager's REST API shows per
subtask.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeTotals:
    """A task's accounted seconds so far, as of one moment."""

    busy_s: float = 0.0
    backpressured_s: float = 0.0
    idle_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.busy_s + self.backpressured_s + self.idle_s


@dataclass(frozen=True)
class TimeRatios:
    """Shares of one interval, each in [0, 1], adding up to 1."""

    busy: float
    backpressured: float
    idle: float


def ratios_between(earlier: TimeTotals, later: TimeTotals) -> TimeRatios | None:
    """The shares of the time accounted between two snapshots; None when none was (the task did not
    account any time in between)."""
    busy = max(0.0, later.busy_s - earlier.busy_s)
    backpressured = max(0.0, later.backpressured_s - earlier.backpressured_s)
    idle = max(0.0, later.idle_s - earlier.idle_s)
    total = busy + backpressured + idle
    if total <= 0.0:
        return None
    return TimeRatios(busy / total, backpressured / total, idle / total)

"""Where a task's time goes, and its counters moved into Prometheus.

:class:`TimeAccount` splits the task thread's time as Flink does (``idleTimeMsPerSecond``,
``backPressuredTimeMsPerSecond``, ``busyTimeMsPerSecond``): idle while the loop waits for input or a
mail, backpressured while it waits because its outputs cannot take more, busy the rest.
:class:`MetricsSync` is the loop's duty that moves the task's plain counters into its metrics every
:data:`METRICS_SYNC_S` (not per record).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from weir.core.metrics import TaskMetrics
from weir.core.task_time import TimeRatios, TimeTotals, ratios_between
from weir.core.watermarks import MAX_WATERMARK, MIN_WATERMARK
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.writer import TaskOutputs

METRICS_SYNC_S = 0.5


def exported_watermark(watermark: int | None) -> int | None:
    """The watermark the gauge and the heartbeat may show: never MIN or MAX (the end of input), which
    would break ``time() - watermark`` on the dashboards and alerts; the gauge keeps the last finite
    value instead."""
    if watermark is None or watermark <= MIN_WATERMARK or watermark >= MAX_WATERMARK:
        return None
    return watermark


class TimeAccount:
    """A task's idle, backpressured and busy seconds. The task thread adds idle time and brackets its
    waits for output; the TaskManager's sampler (:meth:`sync_backpressure`) and the heartbeat
    (:meth:`time_ratios`) read from other threads."""

    def __init__(self, metrics: TaskMetrics) -> None:
        self._metrics = metrics
        self.idle_s = 0.0
        self.busy_s = 0.0
        self._mark: tuple[float, float, float] | None = None  # (monotonic, idle, backpressured) at the last settle
        self._lock = threading.Lock()  # the task thread and the TaskManager's sampler sync the backpressure
        self._backpressure_synced = 0.0
        self._backpressured_s = 0.0  # waits for output availability that ended
        self._backpressured_since: float | None = None  # monotonic start of the wait going on, if any
        self._metrics_removed = False
        # The totals as of the last settle, as one value (other threads read it), and as of the last heartbeat.
        self._totals = TimeTotals()
        self._heartbeat_totals = TimeTotals()  # the heartbeat's thread only
        self._heartbeat_ratios: TimeRatios | None = None

    def begin(self) -> None:
        """The task runs: busy time counts from now."""
        self._mark = (time.monotonic(), self.idle_s, self.backpressured_total())

    def add_idle(self, seconds: float) -> None:
        self.idle_s += seconds

    def start_backpressure(self, now: float) -> None:
        with self._lock:
            self._backpressured_since = now

    def end_backpressure(self, now: float) -> None:
        with self._lock:
            since, self._backpressured_since = self._backpressured_since, None
            if since is not None:
                self._backpressured_s += now - since

    def backpressured_total(self) -> float:
        """Seconds spent waiting for output availability, the wait going on included; never decreases."""
        with self._lock:
            since = self._backpressured_since
            ongoing = time.monotonic() - since if since is not None else 0.0
            return self._backpressured_s + ongoing

    def sync_backpressure(self) -> float:
        """Move the time this task waited for its outputs, a wait still going on included, into
        ``weir_backpressured_seconds_total``; answers the total. Thread-safe: the TaskManager's
        sampler calls it while the task thread waits, where it cannot sync itself."""
        total = self.backpressured_total()
        with self._lock:
            if not self._metrics_removed and total > self._backpressure_synced:
                self._metrics.backpressured.inc(total - self._backpressure_synced)
                self._backpressure_synced = total
        return total

    def settle(self, now: float) -> None:
        """Count what was neither idle nor backpressured since the last settle as busy (task thread)."""
        backpressured = self.sync_backpressure()
        if self._mark is None:
            return
        since, idle, waited = self._mark
        self.busy_s += max(0.0, (now - since) - (self.idle_s - idle) - (backpressured - waited))
        self._mark = (now, self.idle_s, backpressured)
        self._totals = TimeTotals(self.busy_s, backpressured, self.idle_s)

    def time_ratios(self) -> TimeRatios | None:
        """The shares of busy, backpressured and idle time since the previous call (the heartbeat's
        thread calls it once per heartbeat), measured at the task's metrics syncs; the previous shares
        when no sync came in between, None before the first."""
        totals = self._totals
        ratios = ratios_between(self._heartbeat_totals, totals)
        if ratios is None:
            return self._heartbeat_ratios
        self._heartbeat_totals, self._heartbeat_ratios = totals, ratios
        return ratios

    def time_totals(self) -> TimeTotals:
        """The busy, backpressured and idle seconds so far, as of the task's latest metrics sync."""
        return self._totals

    def retire(self) -> None:
        """The task attempt is over: its series go, and a sampler must not bring them back."""
        with self._lock:
            self._metrics_removed = True
            self._metrics.remove()


class MetricsSync:
    """A duty of the task's loop: every :data:`METRICS_SYNC_S`, settle the time account and move the
    task's plain counters into its Prometheus metrics."""

    def __init__(
        self,
        metrics: TaskMetrics,
        account: TimeAccount,
        outputs: TaskOutputs,
        gate: InputGate | None,
        records_in: Callable[[], int],
        source_watermark: Callable[[], int | None],
        source_records_read: Callable[[], int],
    ) -> None:
        self._metrics = metrics
        self._account = account
        self._outputs = outputs
        self._gate = gate
        self._records_in = records_in
        self._source_watermark = source_watermark
        self._source_records_read = source_records_read  # a source task's: also when the whole job is chained
        self._synced: dict[str, float] = {}
        self._last = time.monotonic()

    def deadline(self) -> float:
        return self._last + METRICS_SYNC_S

    def run_due(self, now: float) -> None:
        if now >= self._last + METRICS_SYNC_S:
            self.sync()
            self._last = now

    def sync(self) -> None:
        """Move the counters into the metrics now (also when the task ends)."""
        m, account = self._metrics, self._account
        account.settle(time.monotonic())
        channels = self._outputs.channels
        totals = {
            "records_in": float(self._records_in()),
            "records_out": float(self._outputs.records_out),
            "source_records_read": float(self._source_records_read()),
            "bytes_out": float(sum(ch.bytes_sent for ch in channels)),
            "busy": account.busy_s,
            "idle": account.idle_s,
        }
        for name, total in totals.items():
            delta = total - self._synced.get(name, 0.0)
            if delta > 0:
                getattr(m, name).inc(delta)
            self._synced[name] = total
        m.output_credits.set(sum(ch.credits for ch in channels))
        if self._gate is not None:
            m.input_buffer_usage.set(self._gate.queued_buffers() / max(1, self._gate.capacity()))
        watermark = exported_watermark(self._source_watermark())
        if watermark is not None:
            m.show_watermark(watermark)

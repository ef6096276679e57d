"""The duties of a task's loop (``mailbox_processor.Duty``): what every iteration does, whatever the
default action, each due once ``now >= deadline``.

In Flink these are timers and mails of the mailbox (the processing-time service, the output flusher,
the alignment timer); Weir's loop asks each for its deadline (to bound its wait) and runs it once
per iteration (it does only what is due).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from weir.core.process_functions import Clock
from weir.taskmanager.chain import OperatorChain
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.writer import TaskOutputs


class ProcessingTimers:
    """The chain's processing-time timers, fired by the task's clock (epoch ms): overdue ones after a
    restore too; none once ``quiesced`` (a final checkpoint's barrier went out: Flink quiesces the
    processing-time service before the final checkpoint, as what a timer emits then would reach the
    sinks after they pre-committed)."""

    def __init__(self, chain: OperatorChain, clock: Clock, quiesced: Callable[[], bool]) -> None:
        self._chain = chain
        self._clock = clock
        self._quiesced = quiesced

    def deadline(self) -> float | None:
        if self._quiesced():
            return None
        due = self._chain.next_processing_time()
        if due is None:
            return None
        return time.monotonic() + (due + 1 - self._clock()) / 1000.0

    def run_due(self, now: float) -> None:
        """Processing time is the clock's: a timer for ``t`` fires once the clock has passed ``t``
        (``clock() >= t + 1``), and the chain is told ``clock() - 1``, so that the timers of the
        current millisecond wait for it to pass. As in Flink (a processing-time timer for ``t`` fires no
        sooner than ``t + 1``): a record arriving in a window's last millisecond (its timer's time) is
        still in that window, not in the same window opened again after it fired."""
        if self._quiesced():
            return
        due = self._chain.next_processing_time()
        if due is not None and (passed := self._clock() - 1) >= due:
            self._chain.on_processing_time(passed)


class OutputFlush:
    """``execution.buffer-timeout``: an output edge's buffer goes out once its timeout passed since the
    edge's last flush, full or not."""

    def __init__(self, outputs: TaskOutputs) -> None:
        self._outputs = outputs

    def deadline(self) -> float | None:
        return self._outputs.flush_deadline()

    def run_due(self, now: float) -> None:
        self._outputs.flush_due(now)


class AlignmentTimeout:
    """``checkpointing.aligned-checkpoint-timeout``: a barrier still queued that long after its
    checkpoint's trigger becomes a priority one, which overtakes its queue and switches the
    checkpoint to unaligned (``BarrierAligner``). The trigger time is epoch seconds (the
    JobManager's), so the deadline converts it to the loop's monotonic clock."""

    def __init__(self, gate: InputGate, timeout_s: float, log: Any) -> None:
        self._gate = gate
        self._timeout_s = timeout_s
        self._log = log

    def deadline(self) -> float | None:
        queued = self._gate.queued_barrier_times()
        if not queued:
            return None
        return time.monotonic() + min(queued.values()) + self._timeout_s - time.time()

    def run_due(self, now: float) -> None:
        wall = time.time()
        for checkpoint_id, triggered_at in self._gate.queued_barrier_times().items():
            if wall >= triggered_at + self._timeout_s:
                turned = self._gate.prioritize(checkpoint_id)
                self._log.info(
                    "aligned_checkpoint_timed_out",
                    checkpoint_id=checkpoint_id,
                    barriers=turned,
                    timeout_s=self._timeout_s,
                )

"""Values of checkpointing shared by the JobManager and the TaskManagers."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CheckpointingMode(enum.Enum):
    """``checkpointing.mode``: how a task with several inputs handles barriers.

    EXACTLY_ONCE aligns them (a channel that delivered barrier N is blocked until every channel did),
    so a snapshot holds exactly the records before the barrier; AT_LEAST_ONCE does not block, so
    records after the barrier can land in snapshot N and are counted again after a restore.
    UNALIGNED (``checkpointing.unaligned=true``, Flink's ``execution.checkpointing.unaligned.enabled``)
    is exactly once without blocking: a task snapshots on the first barrier and persists the records
    still in flight on its other channels until their barriers arrive; a restore replays them.

    One enum end to end: the JobManager settles it from the job's parameters, the deploy request
    carries it (``weir.core.codec`` converts at the wire), and each task's barrier aligner runs it.
    """

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    UNALIGNED = "unaligned"

    @classmethod
    def parse(cls, text: str) -> CheckpointingMode | None:
        """``EXACTLY_ONCE``, ``exactly-once`` and `` exactly_once`` all name EXACTLY_ONCE; None if unknown."""
        normalised = text.strip().lower().replace("-", "_")
        return next((mode for mode in cls if mode.value == normalised), None)


class CheckpointKind(enum.Enum):
    """A checkpoint (periodic, for recovery, retained as configured) or a savepoint (taken on
    request, for upgrades, never subsumed)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class BarrierAlignment(enum.Enum):
    """How the tasks a checkpoint barrier reaches align it, carried by the barrier (Flink's
    ``CheckpointOptions.AlignmentType``).

    BY_MODE follows the job's checkpointing mode: in unaligned mode a checkpoint's barrier overtakes
    the buffers queued ahead of it (or the aligned-checkpoint timeout turns it into one that does) and
    the records it overtook become the checkpoint's in-flight state. FORCED_ALIGNED (Flink's
    ``FORCED_ALIGNED``, never timeoutable) is aligned in every mode: a bounded job's final checkpoint
    (FLIP-147), whose barrier is the last thing its sources send before their end of stream. Aligned,
    every record reaches the sinks before they pre-commit at it, so nothing lies in flight behind it
    for a sink to write into an epoch no checkpoint covers."""

    BY_MODE = "by_mode"
    FORCED_ALIGNED = "forced_aligned"


class CheckpointStatus(enum.StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class ChannelBarrierTime:
    """When checkpoint N's barrier arrived on one input channel of a subtask (epoch seconds, the
    TaskManager's clock); ``barrier_at`` None: the channel ended before its barrier came."""

    channel: int
    upstream_vertex: str
    upstream_subtask: int
    barrier_at: float | None


@dataclass(frozen=True)
class SubtaskCheckpointTimeline:
    """Where one subtask spent its part of a checkpoint, as wall-clock times (epoch seconds, the
    TaskManager's clock), in the order they happen in an aligned checkpoint:

    - ``first_barrier_at``: the first barrier reached the task (at a source: the trigger did);
    - ``channels``: each input channel's barrier (none at a source); in unaligned mode the barriers
      after the first come while and after the snapshot is taken;
    - ``alignment_end_at``: every channel delivered its barrier (aligned, at least once), or the
      snapshot started (unaligned: on the first barrier);
    - ``sync_end_at``: the synchronous part of the snapshot is done and the barrier forwarded;
    - ``async_end_at``: the upload is done (keyed state, operator state written to storage).

    When the acknowledgement reached the JobManager is the JobManager's to record (``acked_at``).
    """

    first_barrier_at: float
    channels: tuple[ChannelBarrierTime, ...]
    alignment_end_at: float
    sync_end_at: float
    async_end_at: float

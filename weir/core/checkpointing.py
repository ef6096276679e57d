"""Values of checkpointing shared by the JobManager and the TaskManagers."""

from __future__ import annotations

import enum


class CheckpointingMode(enum.Enum):
    """``checkpointing.mode``: how a task with several inputs handles barriers.

    EXACTLY_ONCE aligns them (a channel that delivered barrier N is blocked until every channel did),
    so a snapshot holds exactly the records before the barrier; AT_LEAST_ONCE does not block, so
    records after the barrier can land in snapshot N and are counted again after a restore.
    UNALIGNED (``checkpointing.unaligned=true``, Flink's ``execution.checkpointing.unaligned.enabled``)
    is exactly once without blocking: a task snapshots on the first barrier and persists the records
    still in flight on its other channels until their barriers arrive; a restore replays them.
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


class CheckpointStatus(enum.StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"

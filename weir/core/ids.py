"""Identifier types shared by the JobManager, the TaskManagers and the job API.

Ids are distinct types so that a checkpoint id is never passed where a subtask index is meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

JobId = NewType("JobId", str)
OperatorUid = NewType("OperatorUid", str)
CheckpointId = NewType("CheckpointId", int)
SubtaskIndex = NewType("SubtaskIndex", int)
KeyGroup = NewType("KeyGroup", int)
TaskManagerId = NewType("TaskManagerId", str)
ChannelIndex = NewType("ChannelIndex", int)


@dataclass(frozen=True, order=True)
class TaskId:
    """One parallel instance of an operator (a subtask) within a job."""

    job_id: JobId
    operator_uid: OperatorUid
    subtask: SubtaskIndex

    def __str__(self) -> str:
        return f"{self.job_id}/{self.operator_uid}#{self.subtask}"

"""The lifecycle states of a job and of a task, one definition each (the wire has its own enums;
``weir.core.codec`` converts). String enums: a member is its name, in JSON and in a log line."""

from __future__ import annotations

import enum


class TaskState(enum.StrEnum):
    DEPLOYING = "DEPLOYING"  # deployed, restoring its state and opening its operators
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.FINISHED, TaskState.CANCELED, TaskState.FAILED)


class JobStatus(enum.StrEnum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)

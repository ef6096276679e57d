"""Savepoints on request (``weir savepoint``, ``weir stop``): trigger one now, remember where it is to
be copied, and whether the job stops at it.

A savepoint is taken like a checkpoint (aligned barriers, the sinks pre-commit and commit through it)
but its state is self-contained: every RocksDB file is uploaded under its own folder, no shared file
is reused, and its keys are relative to that folder (docs/formats.md), so it may be copied anywhere.
The JobManager never deletes a completed savepoint. Written to ``<job>/savepoints/sp-<id>/`` in the
cluster's checkpoint storage, it is copied, when asked, to a new folder
``<target directory>/savepoint-<job id>-<id>/`` (``target_directory``, else the job's
``savepoints.dir`` parameter, Flink's ``execution.checkpointing.savepoint-dir``). A stop-with-savepoint
ends the job once the savepoint completed, and nothing is triggered after it meanwhile; its end
resolves every sink as of the savepoint, so nothing stays prepared or open, and the job ends
FINISHED. A stop whose savepoint fails leaves the job running (``weir.jobmanager.lifecycle``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Final

import structlog

from weir.core.errors import UnknownJobError
from weir.core.ids import CheckpointId
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import JobMaster

log = structlog.get_logger("weir.jobmanager")

SAVEPOINTS_DIR_PARAMETER: Final = "savepoints.dir"


def savepoint_folder(target_directory: str, job_id: str, savepoint_id: int) -> str:
    """The folder a savepoint is copied to under a target directory (Flink: ``savepoint-<job>-<id>``)."""
    return f"{target_directory.rstrip('/')}/savepoint-{job_id}-{savepoint_id}"


class SavepointTrigger:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        executor: JobActionExecutor,
        lock: threading.RLock,
        clock: Callable[[], float],
    ) -> None:
        self._jobs = jobs
        self._executor = executor
        self._lock = lock
        self._clock = clock

    def trigger_checkpoint(self, job_id: str, *, full: bool) -> CheckpointId:
        """Start a checkpoint of a running job now (``weir checkpoint``); answers its id.
        CheckpointRejectedError when the job cannot take one; the lifecycle decides."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownJobError(job_id)
            checkpoint_id, actions = job.lifecycle.trigger_checkpoint(self._clock(), full=full)
            log.info("checkpoint_requested", job_id=job_id, checkpoint_id=checkpoint_id, full=full)
            self._executor.execute(job, actions)
            return checkpoint_id

    def trigger(self, job_id: str, target_directory: str, *, stop: bool, drain: bool) -> CheckpointId:
        """Start a savepoint of a running job; answers its id. SavepointRejectedError when the job
        cannot take one now (not running, a stop already under way, finishing); the lifecycle decides."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownJobError(job_id)
            checkpoint_id, actions = job.lifecycle.trigger_savepoint(self._clock(), stop=stop, drain=drain)
            directory = target_directory or job.submission.parameters.get(SAVEPOINTS_DIR_PARAMETER, "")
            if directory:
                job.savepoint_targets[checkpoint_id] = savepoint_folder(directory, job_id, checkpoint_id)
            log.info(
                "savepoint_requested",
                job_id=job_id,
                checkpoint_id=checkpoint_id,
                target=job.savepoint_targets.get(checkpoint_id),
                stop=stop,
                drain=drain,
            )
            self._executor.execute(job, actions)
            return checkpoint_id

"""Job records in checkpoint storage (the format is ``weir.jobmanager.records``): written in order on one
thread, listed and read back by the recovery of a restarted JobManager."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.errors import WeirError
from weir.core.ids import JobId
from weir.core.paths import CheckpointPaths
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.records import JobRecord

log = structlog.get_logger("weir.jobmanager")

RECORD_SUFFIX = "/_job"


def record_of(job: JobMaster) -> JobRecord:
    """The job as a restarted JobManager needs it."""
    return JobRecord(
        submission=job.submission,
        attempt=job.attempt,
        status=job.status,
        failure=job.failure,
        records_in_all_attempts={key: t.records_in_all_attempts for key, t in job.tasks.items()},
        checkpoint_ids_reserved_through=job.coordinator.ids_reserved_through,
        transactions_resolved=(resolution := job.lifecycle.resolution) is not None and resolution.resolved,
        exceptions=job.exceptions,
        restarts=job.restarts,
        end=job.lifecycle.recorded_end(),
        stop=job.lifecycle.stop_request,
    )


class JobRecordStore:
    def __init__(self, storage: CheckpointStorage, paths: CheckpointPaths, clock: Callable[[], float]) -> None:
        self._storage = storage
        self._paths = paths
        self._clock = clock
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jm-records")  # in order

    def save(self, job: JobMaster) -> Future[bool]:
        """Write the job's record (called with the lock held: the record is taken now, written in
        order after every earlier one); the future answers whether it was written."""
        record = record_of(job)
        job.record_saved_at = self._clock()
        return self._writer.submit(self._put, job.job_id, record.to_json())

    def flush(self) -> None:
        """Wait until every record saved so far is written (or failed)."""
        self._writer.submit(lambda: None).result()

    def _put(self, job_id: str, record: bytes) -> bool:
        try:
            self._storage.put_bytes(self._paths.job_record(JobId(job_id)), record)
        except WeirError as exc:
            log.error("job_record_not_saved", job_id=job_id, error=str(exc))
            return False
        return True

    def keys(self) -> list[str]:
        return [k for k, _ in self._storage.list("") if k.endswith(RECORD_SUFFIX)]

    def load(self, key: str) -> JobRecord:
        """Raises WeirError (SerializationError for a record this Weir cannot read)."""
        return JobRecord.from_json(self._storage.get_bytes(key), where=f"job record {key}")

"""Job records in checkpoint storage (the format is ``weir.jobmanager.records``): written in order on one
thread, listed and read back by the recovery of a restarted JobManager.

Under high availability (``conditional``) every write is conditional on the version this JobManager
last read or wrote of the record (S3 ``If-Match: <ETag>``, ``If-None-Match: *`` for a new job's; the
folder storage compares under ``flock``: the lease's one mechanism, ``CheckpointStorage.put_if``). A
new leader rewrites each record it takes over before it acts (``write_now``), so a deposed leader
paused between its lease check and its write can no longer land that write: its version is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import structlog

from weir.connectors.object_storage import CheckpointStorage, WritePreconditionFailedError
from weir.core.errors import ServiceUnavailableError, WeirError
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
        term_fences=job.term_fences,
    )


class JobRecordStore:
    def __init__(
        self,
        storage: CheckpointStorage,
        paths: CheckpointPaths,
        clock: Callable[[], float],
        *,
        conditional: bool = False,
    ) -> None:
        """``conditional``: write each record only over the version last read or written here (high
        availability: another JobManager may write the same records)."""
        self._storage = storage
        self._paths = paths
        self._clock = clock
        self._conditional = conditional
        self._versions: dict[str, str] = {}  # record key -> the version last read or written (conditional)
        self._unanswered: dict[str, bytes] = {}  # record key -> a write that got no answer (it may have landed)
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
        key = self._paths.job_record(JobId(job_id))
        try:
            if self._conditional:
                self._versions[key] = self._put_conditionally(key, record)
            else:
                self._storage.put_bytes(key, record)
        except WritePreconditionFailedError as exc:
            # Another JobManager wrote the record since this one read or wrote it: it leads now.
            log.error("job_record_not_saved", job_id=job_id, error=str(exc), reason="written by another JobManager")
            return False
        except WeirError as exc:
            log.error("job_record_not_saved", job_id=job_id, error=str(exc))
            return False
        return True

    def _put_conditionally(self, key: str, record: bytes) -> str:
        """``put_if`` over the version known; a write that went unanswered may still have landed (its
        version then unknown here): when the next write finds the record at another version holding
        exactly those bytes, that version was this JobManager's own, and the write goes over it."""
        try:
            version = self._storage.put_if(key, record, self._versions.get(key))
        except ServiceUnavailableError:
            self._unanswered[key] = record
            raise
        except WritePreconditionFailedError:
            unanswered = self._unanswered.pop(key, None)
            found = self._storage.get_versioned(key)
            if unanswered is None or found is None or found[0] != unanswered:
                raise
            version = self._storage.put_if(key, record, found[1])
        self._unanswered.pop(key, None)
        return version

    def keys(self) -> list[str]:
        return [k for k, _ in self._storage.list("") if k.endswith(RECORD_SUFFIX)]

    def load(self, key: str) -> JobRecord:
        """Raises WeirError (SerializationError for a record this Weir cannot read); a conditional
        store remembers the version read, which its next write of the record must still find."""
        if not self._conditional:
            return JobRecord.from_json(self._storage.get_bytes(key), where=f"job record {key}")
        found = self._storage.get_versioned(key)
        if found is None:
            raise JobRecordMissingError(f"job record {key} is gone (deleted since it was listed)")
        data, version = found
        record = JobRecord.from_json(data, where=f"job record {key}")
        self._versions[key] = version
        return record

    def write_now(self, record: JobRecord) -> bool:
        """Write ``record`` (the one read, with this leader's fence) now, over the version read, before
        acting on the job: a deposed leader's write over that version fails from then on. False when
        another JobManager wrote it in between (its write landed first: read it again)."""
        return self._writer.submit(self._put, record.submission.job_id, record.to_json()).result()


class JobRecordMissingError(WeirError):
    """A job record listed a moment ago is not there any more."""

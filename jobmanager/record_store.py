"""Job records in checkpoint storage (the format is ``weir.jobmanager.records``): written in order on one
thread, listed and read back by the recovery of a restarted JobManager.

Under high availability (``conditional``) every write is conditional on the version this JobManager
last read or wrote of the record (S3 ``If-Match: <ETag>``, ``If-None-Match: *`` for a new job's; the
folder storage compares under ``flock``: the lease's one mechanism, ``CheckpointStorage.put_if``). A
new leader rewrites each record it takes over before it acts (``write_now``), so a deposed leader
paused between its lease check and its write can no longer land that write: its version is gone.

A new job's first record has no version to fence: under high availability the job exists only once
its id is in the job index, written after the record and conditionally too (``weir.jobmanager.job_index``:
the ``Registrar`` decides, this store carries it out). A registration refused because another leader
took the index over withdraws the record (deletes it and the job's artifact: this leader created them
and nobody else writes that job's keys), and the submission is answered "not created".
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import assert_never

import structlog

from weir.connectors.object_storage import CheckpointStorage, WritePreconditionFailedError
from weir.core.errors import ServiceUnavailableError, WeirError
from weir.core.ids import JobId
from weir.core.paths import CheckpointPaths
from weir.jobmanager.errors import JobManagerError
from weir.jobmanager.job_index import (
    JOB_INDEX_KEY,
    IndexRead,
    IndexReadFailed,
    IndexWriteRefused,
    IndexWriteUnanswered,
    IndexWritten,
    JobIndex,
    ReadIndex,
    Register,
    Registered,
    Registrar,
    RegistrarAction,
    RegistrarEvent,
    RetryLater,
    TookOver,
    VersionedIndex,
    Withdraw,
    WriteIndex,
    decode_index,
    encode_index,
    stale_jobs,
    takeover_index,
)
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.lease import NotLeaderError
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
        withdrawals: CheckpointStorage | None = None,
    ) -> None:
        """``conditional``: write each record only over the version last read or written here, and
        register new jobs in the job index (high availability: another JobManager may write the same
        records). ``withdrawals``: where a refused creation's record is deleted (the storage without
        the leader's lease check: the deposed leader deletes what only it wrote; default ``storage``)."""
        self._storage = storage
        self._withdrawals = withdrawals if withdrawals is not None else storage
        self._registrar = Registrar()
        self._withdrawn: set[str] = set()  # job ids whose creation was refused (conditional)
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

    def drain(self, timeout_s: float) -> bool:
        """Like :meth:`flush`, for at most ``timeout_s``: a deposed leader lets its writes in flight
        finish (a refused creation withdraws its record) before it starts over. Answers whether they did."""
        try:
            self._writer.submit(lambda: None).result(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def withdrawn(self, job_id: str) -> bool:
        """Whether ``job_id``'s creation was refused (another leader took the job index over): the job
        does not exist and never will through this JobManager."""
        return job_id in self._withdrawn

    def _put(self, job_id: str, record: bytes) -> bool:
        if job_id in self._withdrawn:
            return False
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
            if self._conditional and isinstance(exc, NotLeaderError) and not self._registrar.registered(job_id):
                # A new job's record, and this JobManager no longer leads: the registrar settles it (its
                # index write is refused too: the record is withdrawn, unless an earlier unanswered
                # registration is found to have landed).
                self._register(job_id)
            return False
        if self._conditional and not self._registrar.registered(job_id):
            return self._register(job_id)
        return True

    def _register(self, job_id: str) -> bool:
        """Add the new job to the job index (its record is written); answers whether it is created."""
        pending: list[RegistrarAction] = self._registrar.handle(Register(job_id))
        created = False
        while pending:
            action = pending.pop(0)
            created = created or (isinstance(action, Registered) and action.job_id == job_id)
            pending.extend(self._carry_out(action))
        return created

    def _carry_out(self, action: RegistrarAction) -> list[RegistrarAction]:
        match action:
            case WriteIndex(index=index, expected_version=expected):
                event: RegistrarEvent
                try:
                    event = IndexWritten(self._storage.put_if(JOB_INDEX_KEY, encode_index(index), expected))
                except WritePreconditionFailedError:
                    event = IndexWriteRefused("another JobManager took the job index over: it leads now")
                except NotLeaderError as exc:
                    event = IndexWriteRefused(str(exc))
                except WeirError as exc:
                    event = IndexWriteUnanswered(str(exc))
                return self._registrar.handle(event)
            case ReadIndex():
                try:
                    found = self._storage.get_versioned(JOB_INDEX_KEY)
                    read: RegistrarEvent = IndexRead(
                        None if found is None else VersionedIndex(decode_index(found[0]), found[1])
                    )
                except WeirError as exc:
                    read = IndexReadFailed(str(exc))
                return self._registrar.handle(read)
            case Registered(job_id=job_id):
                log.info("job_registered", job_id=job_id)
                return []
            case Withdraw(job_id=job_id, reason=reason):
                self._withdrawn.add(job_id)
                self._withdraw(JobId(job_id), reason, "its registration in the job index was refused")
                return []
            case RetryLater(job_id=job_id, reason=reason):
                log.warning("job_not_registered", job_id=job_id, reason=reason, action="registered with its next write")
                return []
            case _:
                assert_never(action)

    def _withdraw(self, job_id: JobId, reason: str, why: str, storage: CheckpointStorage | None = None) -> None:
        """Delete a job that does not exist (its record and artifact, as far as they were written)
        from ``storage`` (default: the withdrawals' storage, without the lease check)."""
        keys = [self._paths.job_record(job_id), self._paths.job_artifact(job_id)]
        self._versions.pop(keys[0], None)
        self._unanswered.pop(keys[0], None)
        try:
            (storage if storage is not None else self._withdrawals).delete(keys)
        except WeirError as exc:
            log.error("job_record_not_withdrawn", job_id=job_id, error=str(exc), action="the next takeover deletes it")
            return
        log.warning("job_creation_withdrawn", job_id=job_id, reason=reason, why=why)

    def take_over_index(self, term: int) -> JobIndex:
        """Write the job index under this new leader's ``term`` (before listing the records to take
        over): from then on every registration of a deposed leader is refused. Raises
        JobIndexTakeoverError when it cannot (unreadable, or rewritten under each attempt)."""
        return self._writer.submit(self._take_over_index, term).result()

    def _take_over_index(self, term: int) -> JobIndex:
        last = ""
        for _ in range(INDEX_TAKEOVER_ATTEMPTS):
            found = self._storage.get_versioned(JOB_INDEX_KEY)
            current = None if found is None else VersionedIndex(decode_index(found[0]), found[1])
            listed = self._listed_jobs() if current is None else ()
            index = takeover_index(current.index if current is not None else None, listed, term)
            try:
                version = self._storage.put_if(
                    JOB_INDEX_KEY, encode_index(index), current.version if current is not None else None
                )
            except WritePreconditionFailedError as exc:  # a deposed leader's registration landed in between
                last = str(exc)
                continue
            self._registrar.handle(TookOver(VersionedIndex(index, version)))
            log.info("job_index_taken_over", term=term, jobs=len(index.job_ids), adopted=current is None)
            return index
        raise JobIndexTakeoverError(
            f"the job index {JOB_INDEX_KEY} changed under each of {INDEX_TAKEOVER_ATTEMPTS} takeover writes "
            f"(term {term}): {last}"
        )

    def _listed_jobs(self) -> list[str]:
        return [job for key in self.keys() if (job := self._paths.job_of_record(key)) is not None]

    def registered_keys(self, index: JobIndex) -> list[str]:
        """The record keys of the jobs ``index`` names; the other records (a deposed leader's refused
        creations) are deleted now, never taken over."""
        keys = self.keys()
        by_job = {job: key for key in keys if (job := self._paths.job_of_record(key)) is not None}
        for stale in sorted(stale_jobs(index, by_job)):
            # Through the lease check: only a leader deletes what it did not create itself.
            why = "a deposed leader created it unregistered"
            self._withdraw(JobId(stale), "no job index entry", why, self._storage)
        return [key for job, key in by_job.items() if job in index.job_ids]

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


INDEX_TAKEOVER_ATTEMPTS = 3


class JobIndexTakeoverError(JobManagerError):
    """A new leader could not write the job index under its term: it cannot tell which jobs exist."""


class JobRecordMissingError(WeirError):
    """A job record listed a moment ago is not there any more."""

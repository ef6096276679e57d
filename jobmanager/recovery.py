"""A restarted JobManager takes its jobs over from their durable records (``weir.jobmanager.records``)
and their checkpoints' metadata: running ones restart, a cancelling one finishes cancelling, an
ended one whose transactions were not resolved gets them resolved.

Only those need the JobManager before it serves (``recover_jobs``). The other ended jobs are history
(their status, checkpoints and exceptions for ``weir list``, the REST API and restores from their
retained checkpoints): ``recover_history`` loads them after it started, so that a checkpoint storage
holding hundreds of ended jobs does not hold up the running ones (each costs an exec of its job file,
listings and orphan collection: ~0.1 s, 15 s for the ~130 of a test machine's storage). Until then a
question about one of them is answered "not ready, try again" (``is_loading``), never "unknown job".

Under high availability a new leader first takes the job index over (``weir.jobmanager.job_index``:
only the jobs it names exist; a record it does not name, a deposed leader's refused creation, is
deleted), ignores the checkpoints a deposed leader wrote after an earlier
takeover (``weir.jobmanager.checkpointing.term_fences``), then rewrites each record it takes over (an
ended job's too, as its history loads), conditionally and with its own fence, before it acts on the job
(``JobRecordStore.write_now``); when a late write of the deposed leader landed in between, it reads the
record again and starts over."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, MutableMapping
from dataclasses import replace

import structlog

from weir.api.job_code import JobCode, SourceCode, load_job, prepare_artifact
from weir.connectors.object_storage import CheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.config import PythonJobSettings
from weir.core.errors import WeirError
from weir.core.ids import CheckpointId, JobId
from weir.core.paths import CheckpointPaths
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.checkpointing.term_fences import (
    WrittenCheckpoint,
    stale_checkpoints,
    takeover_fence,
    with_fence,
)
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.orphans import collect_orphans
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.records import JobRecord
from weir.jobmanager.restoring import plan_initial_state, read_retained_state

log = structlog.get_logger("weir.jobmanager")

TAKEOVER_ATTEMPTS = 3  # reads of a record whose takeover write found it rewritten by a deposed leader


class TakeoverRacedError(WeirError):
    """The takeover write of a job record found it rewritten since it was read (a deposed leader's
    late write landed in between): read it again."""


def needs_takeover(record: JobRecord) -> bool:
    """Whether the JobManager must take the job over before it serves: it is not ended (it restarts,
    or finishes ending), or it ended with its sinks' transactions unresolved (their resolution is
    retried). A record without an end (an older Weir's) ended unresolved unless it FINISHED."""
    status = record.status
    if not status.terminal:
        return True
    end = record.end
    if end is None:
        return status is not JobStatus.FINISHED and not record.transactions_resolved
    return not end.ended or (end.resolution is not None and not end.resolution.resolved)


class JobRecovery:
    def __init__(
        self,
        jobs: MutableMapping[str, JobMaster],
        records: JobRecordStore,
        storage: CheckpointStorage,
        paths: CheckpointPaths,
        executor: JobActionExecutor,
        lock: threading.RLock,
        clock: Callable[[], float],
        *,
        leader_term: Callable[[], int | None] = lambda: None,
    ) -> None:
        """``leader_term``: this JobManager's term under high availability (None: it runs without)."""
        self._leader_term = leader_term
        self._jobs = jobs
        self._records = records
        self._storage = storage
        self._paths = paths
        self._executor = executor
        self._lock = lock
        self._clock = clock
        self._history: deque[tuple[str, JobRecord]] = deque()  # read by recover_jobs, loaded by recover_history
        self._loading: set[str] = set()  # their job ids, until each is loaded (or found unloadable)

    def recover_jobs(self) -> int:
        """Read every job record; reload the jobs that need this JobManager (not ended, or ended with
        transactions to resolve) from their records and their checkpoints' metadata, and keep the
        other ended ones for :meth:`recover_history`. A record that cannot be read is reported and
        left alone, never deleted. Answers how many jobs were recovered."""
        now = self._clock()
        live: list[tuple[str, JobRecord]] = []
        term = self._leader_term()
        # Under high availability only the jobs in the job index exist: it is taken over first, so a
        # deposed leader's creation from now on is refused, and one it landed unregistered is deleted.
        keys = (
            self._records.keys() if term is None else self._records.registered_keys(self._records.take_over_index(term))
        )
        for key in keys:
            try:
                record = self._records.load(key)
            except WeirError as exc:
                log.error("job_not_recovered", record=key, error=str(exc))
                continue
            if needs_takeover(record):
                live.append((key, record))
            else:
                self._history.append((key, record))
        with self._lock:
            self._loading = {r.submission.job_id for _, r in self._history}
        return sum(self._take_over_one(key, record, now) for key, record in live)

    def _take_over_one(self, key: str, record: JobRecord, now: float) -> bool:
        for _ in range(TAKEOVER_ATTEMPTS):
            try:
                return self._recover_one(record, now, take_over=True)
            except TakeoverRacedError as exc:
                log.warning("job_takeover_raced", job_id=record.submission.job_id, error=str(exc))
                try:
                    record = self._records.load(key)
                except WeirError as read_error:
                    log.error("job_not_recovered", record=key, error=str(read_error))
                    return False
        log.error(
            "job_not_recovered",
            job_id=record.submission.job_id,
            error=f"its record kept changing under {TAKEOVER_ATTEMPTS} takeover writes",
            action="left as it is in checkpoint storage",
        )
        return False

    def recover_history(self) -> int:
        """Load the ended jobs ``recover_jobs`` left for later; answers how many were loaded. Under high
        availability each is taken over as a live job is (its record rewritten with this leader's
        fence): a deposed leader's late write of an ended job's record is then refused as well."""
        now = self._clock()
        loaded = 0
        while True:
            with self._lock:
                if not self._history:
                    return loaded
                key, record = self._history.popleft()
            try:
                if self._leader_term() is not None:
                    loaded += self._take_over_one(key, record, now)
                else:
                    loaded += self._recover_one(record, now)
            finally:
                with self._lock:
                    self._loading.discard(record.submission.job_id)

    def history_pending(self) -> int:
        with self._lock:
            return len(self._loading)

    def is_loading(self, job_id: str) -> bool:
        """Whether ``job_id`` is an ended job whose history is not loaded yet."""
        with self._lock:
            return job_id in self._loading

    def _recover_one(self, record: JobRecord, now: float, *, take_over: bool = False) -> bool:
        try:
            return self._recover(record, now, take_over=take_over)
        except TakeoverRacedError:
            raise
        except Exception as exc:  # one unreadable job must not keep the JobManager from starting
            log.error(
                "job_not_recovered",
                job_id=record.submission.job_id,
                error=f"{type(exc).__name__}: {exc}",
                action="left as it is in checkpoint storage",
            )
            return False

    def _recover(self, record: JobRecord, now: float, *, take_over: bool) -> bool:
        submission = record.submission
        try:
            code: JobCode = SourceCode(submission.job_file_name, submission.job_source)
            if submission.artifact_id:  # the job's files come back from storage, checked against their hash
                data = self._storage.get_bytes(self._paths.job_artifact(JobId(submission.job_id)))
                code = prepare_artifact(
                    data, expected_id=submission.artifact_id, timeout_s=PythonJobSettings.from_env().job_load_timeout
                )
            loaded = load_job(code, submission.parameters, submission.parallelism, submission.job_name)
        except WeirError as exc:
            log.error("job_not_recovered", job_id=submission.job_id, error=str(exc))
            return False
        job = JobMaster.create(submission, loaded, self._paths.metadata_key_fn())
        job.failure = record.failure
        job.exceptions = record.exceptions
        job.restarts_under_earlier_jobmanagers = record.restarts
        for task_key, total in record.records_in_all_attempts.items():
            if task_key in job.tasks:
                job.tasks[task_key].records_in_earlier_attempts = total
        checkpoints: list[CompletedCheckpoint] = []
        highest = record.checkpoint_ids_reserved_through
        job_key = JobId(submission.job_id)
        listing = [
            *self._storage.list(self._paths.checkpoints_dir(job_key)),
            # The savepoints too: the latest may be the restore point its sinks committed through.
            *self._storage.list(self._paths.checkpoints_dir(job_key, CheckpointKind.SAVEPOINT)),
        ]
        for meta_key, _size in listing:
            parsed = self._paths.parse_metadata_key(meta_key)
            if parsed is None:
                continue
            highest = max(highest, parsed.checkpoint_id)
            try:
                checkpoints.append(decode_metadata(self._storage.get_bytes(meta_key), meta_key))
            except Exception as exc:  # written by another Weir version, or damaged
                # Restoring from an older checkpoint than this one could roll back what the sinks
                # committed for it: the whole job waits, untouched, for someone to look.
                log.error(
                    "job_not_recovered",
                    job_id=submission.job_id,
                    error=f"checkpoint metadata {meta_key} cannot be read: {type(exc).__name__}: {exc}",
                    action="left as it is in checkpoint storage",
                )
                return False
        if submission.restored_from and not checkpoints:
            # No checkpoint of its own yet: it restarts from the other job's retained checkpoint.
            key = submission.restored_from
            try:
                retained = read_retained_state(key, self._storage)
                job.initial_state = plan_initial_state(retained, loaded.graph, job.plan, allow_non_restored_state=True)
            except Exception as exc:
                log.error(
                    "job_not_recovered",
                    job_id=submission.job_id,
                    error=f"the retained checkpoint it started from ({key}) cannot be read: "
                    f"{type(exc).__name__}: {exc}",
                    action="left as it is in checkpoint storage",
                )
                return False
        written = [WrittenCheckpoint(c.checkpoint_id, c.leader_term) for c in checkpoints]
        stale = stale_checkpoints(written, record.term_fences)
        if stale:
            log.warning(
                "checkpoints_ignored",
                job_id=submission.job_id,
                checkpoint_ids=sorted(stale),
                reason="written by a deposed leader after a newer leader took the job over",
            )
            checkpoints = [c for c in checkpoints if c.checkpoint_id not in stale]
        job.term_fences = record.term_fences
        term = self._leader_term()
        if take_over and term is not None:
            job.term_fences = with_fence(
                record.term_fences, takeover_fence(term, [c.checkpoint_id for c in checkpoints])
            )
            if not self._records.write_now(replace(record, term_fences=job.term_fences)):
                raise TakeoverRacedError(f"job {submission.job_id}: its record was rewritten since it was read")
        actions = job.coordinator.load_completed(checkpoints, CheckpointId(highest) if highest else None)
        self._executor.execute(job, actions)
        collect_orphans(self._storage, self._paths, job.coordinator)  # nothing is in flight yet
        # A running job restarts at once: the restart waits only for the TaskManagers' slots. Each live
        # TaskManager registers within a heartbeat interval of this JobManager serving, and the answer
        # to its first heartbeat cancels the previous attempt's tasks there. One still running
        # meanwhile is fenced from the sinks by the new attempt (a newer Kafka producer epoch, the
        # PostgreSQL sink's owner claim), as on every failover, where cancelling the old attempt and
        # deploying the new one race as well.
        job.lifecycle.take_over(now, record.status, record.attempt, record.end, now, record.stop)
        if record.end is None and record.status.terminal and needs_takeover(record):
            job.lifecycle.legacy_unresolved(now)
        with self._lock:
            self._jobs[submission.job_id] = job
            # An ending job's, or an ended one's unresolved, sinks are resolved at once.
            self._executor.execute(job, job.lifecycle.tick(now))
        log.info(
            "job_recovered",
            job_id=submission.job_id,
            status=job.status.value,
            attempt=job.attempt,
            checkpoints=[c.checkpoint_id for c in checkpoints],
            checkpoint_ids_reserved_through=record.checkpoint_ids_reserved_through,
        )
        return True

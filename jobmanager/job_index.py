"""Which job records exist under high availability: the job index, and the pure decisions around it.

A new job's first record has no version for a conditional write to fence: its key is new, so a
deposed leader paused between its lease check and that write could still create it after a takeover,
and the next takeover would have run it. So a record alone no longer makes a job: it exists once its
id is in the job index (``_ha/job-index``, docs/formats.md), one object every leader writes only
conditionally (S3 ``If-Match`` on the version it last read or wrote). The record is written first and
the index entry last (the commit point, as Arroyo's protocol writes a checkpoint's metadata last).

A new leader rewrites the index with its term before it lists the records (``takeover_index``), so
from then on a deposed leader's registration is refused by the storage itself, atomically: its
expected version is gone. The deposed leader then withdraws the record it created (nobody else ever
writes that job's key); a record no index names (its creator died before withdrawing) is ignored and
deleted by the next takeover (``stale_jobs``). This is the role of the leader session id in Flink's
HA job graph store, where a ``JobGraph`` is added only through a write checked against the current
leadership (the ConfigMap that holds the leader annotation, or a ZooKeeper transaction checking the
latch) rather than by a check before a write.

``Registrar`` decides one leader's registrations; ``weir.jobmanager.record_store`` carries its actions
out against the storage and feeds back what happened. No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, assert_never

from weir.core.documents import load_versioned, typed
from weir.core.errors import SerializationError

JOB_INDEX_KEY: Final = "_ha/job-index"
JOB_INDEX_FORMAT: Final = 1


@dataclass(frozen=True)
class JobIndex:
    """The index's content: the leader ``term`` that last wrote it and the ids of the jobs created."""

    term: int
    job_ids: frozenset[str]

    def with_job(self, job_id: str) -> JobIndex:
        return JobIndex(self.term, self.job_ids | {job_id})


@dataclass(frozen=True)
class VersionedIndex:
    """The index as read or written, at storage ``version`` (its ETag)."""

    index: JobIndex
    version: str


def encode_index(index: JobIndex) -> bytes:
    return json.dumps(
        {"format": JOB_INDEX_FORMAT, "term": index.term, "jobs": sorted(index.job_ids)}, sort_keys=True
    ).encode()


def decode_index(data: bytes) -> JobIndex:
    """Raises SerializationError for an index this Weir cannot read."""
    doc = load_versioned(
        data, f"the job index {JOB_INDEX_KEY}", JOB_INDEX_FORMAT, "a newer Weir wrote it: run that version"
    )
    try:
        jobs = typed(doc["jobs"], list)
        return JobIndex(typed(doc["term"], int), frozenset(typed(job, str) for job in jobs))
    except (KeyError, TypeError) as exc:
        raise SerializationError(f"the job index {JOB_INDEX_KEY} is malformed: {exc}") from exc


def takeover_index(found: JobIndex | None, listed: Iterable[str], term: int) -> JobIndex:
    """The index a new leader of ``term`` writes over the one it ``found``: the same jobs under its term
    (found at its own term: this leader's own takeover write, made again). No index yet (storage written
    by a Weir before it): every job whose record is ``listed`` now is adopted."""
    if found is not None:
        if found.term > term:
            raise ValueError(f"the job index is at term {found.term}: a leader of term {term} cannot take it over")
        return JobIndex(term, found.job_ids)
    return JobIndex(term, frozenset(listed))


def stale_jobs(index: JobIndex, listed: Iterable[str], creating: Iterable[str] = ()) -> frozenset[str]:
    """The jobs with a record but no index entry, other than the ones this leader is ``creating`` now:
    created by a deposed leader whose registration was refused (or never sent); never taken over."""
    return frozenset(listed) - index.job_ids - frozenset(creating)


# The registrar: one leader's registrations ---------------------------------------------------------


@dataclass(frozen=True)
class NotTakenOver:
    """Before this leader's takeover wrote the index: nothing can be registered yet."""


@dataclass(frozen=True)
class Holding:
    """The index as this leader last wrote it: nobody else has written it since, as far as it knows."""

    current: VersionedIndex


@dataclass(frozen=True)
class Writing:
    """A write adding ``job_id`` over ``current`` is on its way."""

    current: VersionedIndex
    job_id: str


@dataclass(frozen=True)
class Uncertain:
    """A write adding ``job_id`` over ``current`` got no answer: it may have landed. The next
    registration reads the index first."""

    current: VersionedIndex
    job_id: str


@dataclass(frozen=True)
class Verifying:
    """The index is being read to learn whether the unanswered write of ``unanswered`` landed, before
    ``job_id`` is registered."""

    current: VersionedIndex
    unanswered: str
    job_id: str


@dataclass(frozen=True)
class Deposed:
    """Another leader rewrote the index (or this one lost its lease): every registration of a job not
    created yet is refused. ``known``: the index as this leader last knew it, and ``found``: as the newer
    leader wrote it, when read; the jobs of either stay created."""

    reason: str
    known: JobIndex
    found: JobIndex | None = None

    def created(self, job_id: str) -> bool:
        return job_id in self.known.job_ids or (self.found is not None and job_id in self.found.job_ids)


RegistrarState = NotTakenOver | Holding | Writing | Uncertain | Verifying | Deposed


@dataclass(frozen=True)
class TookOver:
    """This leader's takeover write of the index landed."""

    written: VersionedIndex


@dataclass(frozen=True)
class Register:
    """The record of new job ``job_id`` is written: add the job to the index."""

    job_id: str


@dataclass(frozen=True)
class IndexWritten:
    version: str


@dataclass(frozen=True)
class IndexWriteRefused:
    """The write was certainly not applied: its precondition failed (another leader wrote the index),
    or this leader's lease check refused to send it."""

    reason: str


@dataclass(frozen=True)
class IndexWriteUnanswered:
    """The write got no answer (storage down, time-out): whether it landed is unknown."""

    error: str


@dataclass(frozen=True)
class IndexRead:
    """The index as read now (None: no index object)."""

    found: VersionedIndex | None


@dataclass(frozen=True)
class IndexReadFailed:
    error: str


RegistrarEvent = (
    TookOver | Register | IndexWritten | IndexWriteRefused | IndexWriteUnanswered | IndexRead | IndexReadFailed
)


@dataclass(frozen=True)
class WriteIndex:
    """Write ``index`` only over ``expected_version``."""

    index: JobIndex
    expected_version: str


@dataclass(frozen=True)
class ReadIndex:
    pass


@dataclass(frozen=True)
class Registered:
    """``job_id`` is created: its index entry landed."""

    job_id: str


@dataclass(frozen=True)
class Withdraw:
    """``job_id`` is certainly not created and never will be by this leader: delete its record (this
    leader created it and nobody else writes it) and drop the job."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class RetryLater:
    """Whether ``job_id`` is created is not known yet: register it again with its next record write."""

    job_id: str
    reason: str


RegistrarAction = WriteIndex | ReadIndex | Registered | Withdraw | RetryLater


class Registrar:
    """One leader's view of the job index. ``handle`` takes an event and answers the actions to carry
    out; one registration at a time (the record writer is one thread)."""

    def __init__(self) -> None:
        self.state: RegistrarState = NotTakenOver()

    def registered(self, job_id: str) -> bool:
        """Whether ``job_id`` is in the index as this leader last knew it."""
        state = self.state
        match state:
            case NotTakenOver():
                return False
            case Holding(current=current) | Writing(current=current) | Uncertain(current=current):
                return job_id in current.index.job_ids
            case Verifying(current=current):
                return job_id in current.index.job_ids
            case Deposed():
                return state.created(job_id)
            case _:
                assert_never(state)

    def handle(self, event: RegistrarEvent) -> list[RegistrarAction]:
        state = self.state
        match state:
            case NotTakenOver():
                return self._before_takeover(event)
            case Holding(current=current):
                return self._holding(current, event)
            case Writing():
                return self._writing(state, event)
            case Uncertain():
                return self._uncertain(state, event)
            case Verifying():
                return self._verifying(state, event)
            case Deposed():
                return self._deposed(state, event)
            case _:
                assert_never(state)

    def _before_takeover(self, event: RegistrarEvent) -> list[RegistrarAction]:
        match event:
            case TookOver(written=written):
                self.state = Holding(written)
                return []
            case Register(job_id=job_id):
                return [RetryLater(job_id, "this JobManager has not taken the job index over yet")]
            case IndexWritten() | IndexWriteRefused() | IndexWriteUnanswered() | IndexRead() | IndexReadFailed():
                return []  # an answer to nothing asked
            case _:
                assert_never(event)

    def _holding(self, current: VersionedIndex, event: RegistrarEvent) -> list[RegistrarAction]:
        match event:
            case Register(job_id=job_id):
                return self._propose(current, job_id)
            case (
                TookOver()
                | IndexWritten()
                | IndexWriteRefused()
                | IndexWriteUnanswered()
                | IndexRead()
                | IndexReadFailed()
            ):
                return []
            case _:
                assert_never(event)

    def _propose(self, current: VersionedIndex, job_id: str) -> list[RegistrarAction]:
        if job_id in current.index.job_ids:
            self.state = Holding(current)
            return [Registered(job_id)]
        self.state = Writing(current, job_id)
        return [WriteIndex(current.index.with_job(job_id), current.version)]

    def _writing(self, state: Writing, event: RegistrarEvent) -> list[RegistrarAction]:
        match event:
            case IndexWritten(version=version):
                self.state = Holding(VersionedIndex(state.current.index.with_job(state.job_id), version))
                return [Registered(state.job_id)]
            case IndexWriteRefused(reason=reason):
                self.state = Deposed(reason, state.current.index)
                return [Withdraw(state.job_id, reason)]
            case IndexWriteUnanswered(error=error):
                self.state = Uncertain(state.current, state.job_id)
                return [RetryLater(state.job_id, f"the job index write got no answer: {error}")]
            case Register(job_id=job_id):
                return [RetryLater(job_id, f"the registration of job {state.job_id} is on its way")]
            case TookOver() | IndexRead() | IndexReadFailed():
                return []
            case _:
                assert_never(event)

    def _uncertain(self, state: Uncertain, event: RegistrarEvent) -> list[RegistrarAction]:
        match event:
            case Register(job_id=job_id):
                self.state = Verifying(state.current, state.job_id, job_id)
                return [ReadIndex()]
            case (
                TookOver()
                | IndexWritten()
                | IndexWriteRefused()
                | IndexWriteUnanswered()
                | IndexRead()
                | IndexReadFailed()
            ):
                return []
            case _:
                assert_never(event)

    def _verifying(self, state: Verifying, event: RegistrarEvent) -> list[RegistrarAction]:
        match event:
            case IndexRead(found=found):
                current = state.current
                if found is not None and found.version == current.version:
                    return self._propose(current, state.job_id)  # the unanswered write did not land
                if (
                    found is not None
                    and found.index.term == current.index.term
                    and state.unanswered in found.index.job_ids
                    and current.index.job_ids <= found.index.job_ids
                ):
                    return self._propose(found, state.job_id)  # it landed: its version was this leader's
                reason = (
                    "the job index is gone"
                    if found is None
                    else f"the job index was rewritten by the leader of term {found.index.term}"
                    if found.index.term != current.index.term
                    else "the job index changed under this leader"
                )
                deposed = Deposed(reason, current.index, found.index if found is not None else None)
                self.state = deposed
                return self._deposed(deposed, Register(state.job_id))
            case IndexReadFailed(error=error):
                self.state = Uncertain(state.current, state.unanswered)
                return [RetryLater(state.job_id, f"the job index cannot be read: {error}")]
            case Register(job_id=job_id):
                return [RetryLater(job_id, f"the registration of job {state.job_id} is on its way")]
            case TookOver() | IndexWritten() | IndexWriteRefused() | IndexWriteUnanswered():
                return []
            case _:
                assert_never(event)

    def _deposed(self, state: Deposed, event: RegistrarEvent) -> list[RegistrarAction]:
        match event:
            case Register(job_id=job_id):
                if state.created(job_id):  # registered before, or its unanswered write landed before the takeover
                    return [Registered(job_id)]
                return [Withdraw(job_id, state.reason)]
            case (
                TookOver()
                | IndexWritten()
                | IndexWriteRefused()
                | IndexWriteUnanswered()
                | IndexRead()
                | IndexReadFailed()
            ):
                return []
            case _:
                assert_never(event)

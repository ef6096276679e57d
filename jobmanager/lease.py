"""The leader lease in checkpoint storage, and the thread that runs ``LeaderElection`` against it.

Why the checkpoint storage (an S3 object written with conditional writes): it is the one store every
JobManager already shares and must reach to do anything (job records, checkpoint metadata), so a
JobManager cut off from it could not act anyway, and high availability needs no further service.
``If-None-Match: *`` creates the lease, ``If-Match: <ETag>`` renews or takes it over: of two
contenders writing over the same version exactly one lands (checked on the local S3 server,
versitygw, with 16 concurrent writers: exactly one winner every time). A PostgreSQL advisory lock
would not do: it belongs to a session, and a paused (SIGSTOPped) leader keeps its connection, so it
would keep the lock forever. The local mode's folder storage compares and writes under ``flock``.

Fencing of storage writes (:class:`FencedStorage`): every write and delete of the leader checks,
right before it is sent, that its own lease time is not over (its monotonic clock) and that the
lease object still names it at its term (a read). That is not atomic with the write: a leader
paused between the check and the write could still land one write afterwards. What such a late
write could do is closed where it matters: job records are written conditionally over the version
the leader last read or wrote (``JobRecordStore``), and a new leader rewrites each one it takes
over before acting, so the deposed leader's write is refused; a new job exists only once the job
index names it (``weir.jobmanager.job_index``: written conditionally, taken over by each new
leader), so a late creation is refused there and withdrawn; a late checkpoint metadata object
names its older term, and a restore ignores it (``checkpointing.term_fences``). Everything else the
new leader decides (deploy, barriers, commits) goes through TaskManagers that refuse the old term.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Final, assert_never

import structlog

from weir.connectors.object_storage import CheckpointStorage, WritePreconditionFailedError
from weir.core.crashpoints import BEFORE_JOB_RECORD_CREATE, crash_point
from weir.core.documents import load_versioned, number, typed
from weir.core.errors import Fault, SerializationError, WeirError
from weir.core.paths import CheckpointPaths
from weir.jobmanager.leader_election import (
    Action,
    BecomeLeader,
    Event,
    LeaderElection,
    LeaderTerm,
    LeaseRead,
    LeaseRecord,
    LeaseWriteFailed,
    LeaseWriteRefused,
    LeaseWritten,
    ObservedLease,
    ReadLease,
    Renew,
    StepDown,
    Tick,
    TryAcquire,
)

log = structlog.get_logger("weir.jobmanager")

LEASE_KEY: Final = "_ha/leader-lease"
LEASE_FORMAT: Final = 1


class NotLeaderError(WeirError):
    """This JobManager does not hold the lease (any more): it must not write or call anything."""

    fault: Fault = Fault.INTERNAL


def encode_lease(record: LeaseRecord) -> bytes:
    return json.dumps(
        {
            "format": LEASE_FORMAT,
            "holder": record.holder,
            "term": record.term,
            "address": record.address,
            "duration_s": record.duration_s,
            "renewal": record.renewal,
        },
        sort_keys=True,
    ).encode()


def decode_lease(data: bytes) -> LeaseRecord:
    """Raises SerializationError for a lease this Weir cannot read."""
    doc = load_versioned(data, f"the leader lease {LEASE_KEY}", LEASE_FORMAT, "remove it once no JobManager runs")
    try:
        return LeaseRecord(
            holder=typed(doc["holder"], str),
            term=LeaderTerm(typed(doc["term"], int)),
            address=typed(doc["address"], str),
            duration_s=number(doc["duration_s"]),
            renewal=typed(doc["renewal"], int),
        )
    except (KeyError, TypeError) as exc:
        raise SerializationError(f"the leader lease {LEASE_KEY} is malformed: {exc}") from exc


class LeaseStore:
    """The lease object: read with its version, written only over the version expected."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self._storage = storage

    def read(self) -> ObservedLease:
        found = self._storage.get_versioned(LEASE_KEY)
        if found is None:
            return ObservedLease(None, None)
        data, version = found
        return ObservedLease(decode_lease(data), version)

    def write(self, record: LeaseRecord, expected_version: str | None) -> str:
        """Raises WritePreconditionFailedError when someone else wrote it since ``expected_version``."""
        return self._storage.put_if(LEASE_KEY, encode_lease(record), expected_version)


class LeaderElector:
    """Runs the election on a thread: reads, writes and the clock in, actions out.

    ``on_leader(term)`` runs once this JobManager holds the lease (the takeover: recover the jobs,
    serve); ``on_step_down(term, reason)`` once it stops holding it (the process starts over as a
    follower: nothing of the old leadership may act on)."""

    def __init__(
        self,
        election: LeaderElection,
        store: LeaseStore,
        on_leader: Callable[[LeaderTerm], None],
        on_step_down: Callable[[LeaderTerm, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.election = election
        self._store = store
        self._on_leader = on_leader
        self._on_step_down = on_step_down
        self._clock = clock
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jm-lease", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def term(self) -> LeaderTerm | None:
        """The term this JobManager may act under now (None: it must not act)."""
        with self._lock:
            return self.election.leads(self._clock())

    def known_leader(self) -> LeaseRecord | None:
        """The leader as this JobManager last read the lease (``LeaderElection.known_leader``)."""
        with self._lock:
            return self.election.known_leader()

    def check_still_leader(self) -> LeaderTerm:
        """Raises NotLeaderError unless this JobManager's lease time is not over and the lease
        object still names it at its term (read now)."""
        term = self.term()
        if term is None:
            raise NotLeaderError("this JobManager does not hold the leader lease")
        record = self._store.read().record
        if record is None or record.holder != self.election.holder or record.term != term:
            raise NotLeaderError(
                f"the leader lease is no longer this JobManager's (term {term}); it is "
                f"{record.holder if record else 'nobody'}'s at term {record.term if record else 0}"
            )
        return term

    def _handle(self, event: Event) -> list[Action]:
        with self._lock:
            return self.election.handle(event)

    def _run(self) -> None:
        interval = self.election.timing.poll_interval_s
        while not self._stopping.is_set():
            self._carry_out(self._handle(Tick(self._clock())))
            self._stopping.wait(interval)

    def _carry_out(self, actions: list[Action]) -> None:
        pending = list(actions)
        while pending:
            action = pending.pop(0)
            match action:
                case ReadLease():
                    try:
                        lease = self._store.read()
                    except WeirError as exc:
                        log.warning("leader_lease_unreadable", error=str(exc))
                        continue
                    pending.extend(self._handle(LeaseRead(self._clock(), lease)))
                case (
                    TryAcquire(record=record, expected_version=expected)
                    | Renew(record=record, expected_version=expected)
                ):
                    sent_at = self._clock()
                    try:
                        version = self._store.write(record, expected)
                        event: Event = LeaseWritten(self._clock(), sent_at, version)
                    except WritePreconditionFailedError:
                        event = LeaseWriteRefused(self._clock())
                    except WeirError as exc:
                        event = LeaseWriteFailed(self._clock(), str(exc))
                    pending.extend(self._handle(event))
                case BecomeLeader(term=term):
                    log.info("leadership_granted", holder=self.election.holder, term=term)
                    threading.Thread(target=self._on_leader, args=(term,), name="jm-takeover", daemon=True).start()
                case StepDown(term=term, reason=reason):
                    log.warning("leadership_lost", holder=self.election.holder, term=term, reason=reason)
                    self._on_step_down(term, reason)
                case _:
                    assert_never(action)


class FencedStorage(CheckpointStorage):
    """The leader's checkpoint storage: reads pass through, each write or delete first checks that
    this JobManager still leads (:meth:`LeaderElector.check_still_leader`) and raises NotLeaderError
    otherwise, so a deposed leader's job records, checkpoint metadata and deletions never land once
    it knows, nor once its lease time is over."""

    def __init__(self, inner: CheckpointStorage, elector: LeaderElector) -> None:
        self._inner = inner
        self._elector = elector
        self._paths = CheckpointPaths()

    @property
    def unfenced(self) -> CheckpointStorage:
        """The storage without the lease check: only for withdrawing what this JobManager alone wrote
        (a new job's record whose creation the job index refused, ``JobRecordStore``)."""
        return self._inner

    @property
    def uri(self) -> str:
        return self._inner.uri

    def _check(self, what: str, key: str) -> None:
        try:
            self._elector.check_still_leader()
        except NotLeaderError as exc:
            log.error("write_fenced", operation=what, key=key, error=str(exc))
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._check("put", key)
        self._inner.put_bytes(key, data)

    def put_file(self, key: str, path: Path) -> None:
        self._check("upload", key)
        self._inner.put_file(key, path)

    def get_bytes(self, key: str) -> bytes:
        return self._inner.get_bytes(key)

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        return self._inner.get_versioned(key)

    def put_if(self, key: str, data: bytes, expected_version: str | None) -> str:
        self._check("conditional put", key)
        if expected_version is None and (job_id := self._paths.job_of_record(key)) is not None:
            crash_point(BEFORE_JOB_RECORD_CREATE, job_id=job_id)  # the window the job index closes
        return self._inner.put_if(key, data, expected_version)

    def get_file(self, key: str, path: Path) -> None:
        self._inner.get_file(key, path)

    def exists(self, key: str) -> bool:
        return self._inner.exists(key)

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        return self._inner.list(prefix)

    def delete(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        if batch:
            self._check("delete", batch[0])
            self._inner.delete(batch)

"""Which JobManager leads: a lease in checkpoint storage, decided by a pure state machine.

The design follows Flink's ``LeaderElectionService`` with the Kubernetes HA services' lease (a
``ConfigMap``/``Lease`` object renewed by the leader, taken over by a contender once it stopped
changing) and the fencing token of Flink's ``FencedRpcEndpoint``: each leadership has a ``LeaderTerm``
one higher than the last, and every call the leader makes carries it.

Timing never compares two machines' clocks (as client-go's ``leaderelection``): a follower notes when
*it* first saw the lease's current version (``observed_at``, its own monotonic clock) and takes over
only after the version stayed the same for ``lease_duration_s``. The leader counts its lease from when
it *sent* its last successful renewal (``renewed_at``) and steps down ``renew_deadline_s`` after that
unless a later renewal succeeded. A renewal lands after it was sent and a follower sees it after it
landed, so a follower's takeover comes at least ``lease_duration_s - renew_deadline_s`` after the
leader stopped acting, even when the leader was paused (SIGSTOP) in between: on waking, its own clock
says its lease time is over before it acts on anything (and what it had already sent is refused by the
term fence at the TaskManagers and by the lease check before storage writes).

The machine is fed ``Event`` values and answers ``Action`` values; the driver (``weir.jobmanager.lease``)
carries the actions out against the storage and feeds back what happened. No I/O, no clock, here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NewType, assert_never

LeaderTerm = NewType("LeaderTerm", int)
"""The leader epoch (Flink's fencing token): 1 for the first leader, one more at each takeover."""

NO_TERM = LeaderTerm(0)
"""The term of calls from a JobManager that runs without high availability: never fenced, fences nothing."""


@dataclass(frozen=True)
class LeaseTiming:
    """``renew_interval_s < renew_deadline_s < lease_duration_s``: the leader renews every
    ``renew_interval_s``, stops acting ``renew_deadline_s`` after its last successful renewal was sent,
    and a follower takes over after seeing the lease unchanged for ``lease_duration_s``."""

    lease_duration_s: float = 6.0
    renew_interval_s: float = 2.0
    renew_deadline_s: float = 4.0
    poll_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_interval_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "lease timing needs 0 < renew interval < renew deadline < lease duration, got "
                f"{self.renew_interval_s} / {self.renew_deadline_s} / {self.lease_duration_s} s"
            )
        if self.poll_interval_s <= 0:
            raise ValueError(f"lease poll interval must be positive, got {self.poll_interval_s} s")


@dataclass(frozen=True)
class LeaseRecord:
    """The lease object's content (``docs/formats.md``: ``leader-lease``). ``address`` is where the
        holder serves clients and TaskManagers; ``duration_s`` is the holder's lease duration, which its
        followers wait out. ``renewal`` counts the holder's writes at this term: each renewal's content
    differs, so its version (S3's ETag is the content's MD5) does too."""

    holder: str
    term: LeaderTerm
    address: str
    duration_s: float
    renewal: int = 0


@dataclass(frozen=True)
class ObservedLease:
    """What a read found: no lease object (``record`` None), or one at storage ``version`` (its ETag)."""

    record: LeaseRecord | None
    version: str | None


# States ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Follower:
    """Someone else holds the lease, or nobody is known to: waits for it to expire. ``seen`` is the
    last lease read and ``observed_at`` when its version was first seen (None: nothing read yet)."""

    seen: ObservedLease | None = None
    observed_at: float | None = None


@dataclass(frozen=True)
class Candidate:
    """A conditional write taking the lease at ``term`` is on its way."""

    term: LeaderTerm


@dataclass(frozen=True)
class Leader:
    """Holds the lease at ``term``, storage ``version``; ``renewed_at``: when the last successful
    write (acquisition or renewal) was sent, by this process's monotonic clock."""

    term: LeaderTerm
    version: str
    renewed_at: float
    renewing: bool = False
    renewal: int = 0


@dataclass(frozen=True)
class SteppedDown:
    """Led at ``term`` and stopped: final. The process starts over as a follower (never leads again
    under the same identity, so no state of the old leadership can act under a new term)."""

    term: LeaderTerm
    reason: str


State = Follower | Candidate | Leader | SteppedDown


# Events ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passed; ``now`` is the monotonic clock."""

    now: float


@dataclass(frozen=True)
class LeaseRead:
    now: float
    lease: ObservedLease


@dataclass(frozen=True)
class LeaseWritten:
    """A conditional write (acquisition or renewal) sent at ``sent_at`` landed at ``version``."""

    now: float
    sent_at: float
    version: str


@dataclass(frozen=True)
class LeaseWriteRefused:
    """The conditional write's precondition failed: someone else wrote the lease in between."""

    now: float


@dataclass(frozen=True)
class LeaseWriteFailed:
    """The write did not get an answer (storage down, time-out): whether it landed is unknown."""

    now: float
    error: str


Event = Tick | LeaseRead | LeaseWritten | LeaseWriteRefused | LeaseWriteFailed


# Actions -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadLease:
    pass


@dataclass(frozen=True)
class TryAcquire:
    """Write ``record``: created only if absent (``expected_version`` None), else only over that version."""

    record: LeaseRecord
    expected_version: str | None


@dataclass(frozen=True)
class Renew:
    record: LeaseRecord
    expected_version: str


@dataclass(frozen=True)
class BecomeLeader:
    term: LeaderTerm


@dataclass(frozen=True)
class StepDown:
    term: LeaderTerm
    reason: str


Action = ReadLease | TryAcquire | Renew | BecomeLeader | StepDown


class LeaderElection:
    """One contender's view of the lease. ``handle`` takes an event and answers the actions to carry out."""

    def __init__(self, holder: str, address: str, timing: LeaseTiming) -> None:
        self.holder = holder
        self.address = address
        self.timing = timing
        self.state: State = Follower()

    def _record(self, term: LeaderTerm, renewal: int = 0) -> LeaseRecord:
        return LeaseRecord(self.holder, term, self.address, self.timing.lease_duration_s, renewal)

    def leads(self, now: float) -> LeaderTerm | None:
        """The term this contender may act under at ``now``: None unless it leads and its lease time
        (``renew_deadline_s`` from its last successful renewal) is not over."""
        state = self.state
        if isinstance(state, Leader) and now - state.renewed_at < self.timing.renew_deadline_s:
            return state.term
        return None

    def known_leader(self) -> LeaseRecord | None:
        """The lease as this contender last knew it: its own while it leads, the last one read while
        it follows (None: nothing read yet, or while taking over or stepped down)."""
        state = self.state
        match state:
            case Follower(seen=seen):
                return seen.record if seen is not None else None
            case Leader(term=term, renewal=renewal):
                return self._record(term, renewal)
            case Candidate() | SteppedDown():
                return None
            case _:
                assert_never(state)

    def handle(self, event: Event) -> list[Action]:
        state = self.state
        match state:
            case Follower():
                return self._as_follower(state, event)
            case Candidate():
                return self._as_candidate(state, event)
            case Leader():
                return self._as_leader(state, event)
            case SteppedDown():
                return []
            case _:
                assert_never(state)

    def _as_follower(self, state: Follower, event: Event) -> list[Action]:
        match event:
            case Tick():
                return [ReadLease()]
            case LeaseRead(now=now, lease=lease):
                record = lease.record
                if record is None:  # nobody ever led on this storage (or the lease was removed)
                    self.state = Candidate(LeaderTerm(1))
                    return [TryAcquire(self._record(LeaderTerm(1)), None)]
                assert lease.version is not None, "a lease object has a version"
                seen = state.seen
                if seen is None or seen.version != lease.version or state.observed_at is None:
                    self.state = Follower(lease, now)  # it changed: its holder is alive, the wait starts over
                    return []
                if now - state.observed_at < max(record.duration_s, self.timing.lease_duration_s):
                    self.state = replace(state, seen=lease)
                    return []
                term = LeaderTerm(record.term + 1)  # expired: unchanged for a whole lease duration
                self.state = Candidate(term)
                return [TryAcquire(self._record(term), lease.version)]
            case LeaseWritten() | LeaseWriteRefused() | LeaseWriteFailed():
                return []  # a late answer to nothing this follower asked: ignored
            case _:
                assert_never(event)

    def _as_candidate(self, state: Candidate, event: Event) -> list[Action]:
        match event:
            case Tick() | LeaseRead():
                return []  # the write's answer comes first
            case LeaseWritten(sent_at=sent_at, version=version):
                self.state = Leader(state.term, version, sent_at)
                return [BecomeLeader(state.term)]
            case LeaseWriteRefused() | LeaseWriteFailed():
                # Another contender won, or the answer was lost (if the write landed, this lease is
                # nobody's that renews it: it expires and someone, maybe this one, takes it over).
                self.state = Follower()
                return [ReadLease()]
            case _:
                assert_never(event)

    def _as_leader(self, state: Leader, event: Event) -> list[Action]:
        match event:
            case Tick(now=now):
                elapsed = now - state.renewed_at
                if elapsed >= self.timing.renew_deadline_s:
                    return self._step_down(
                        state, f"no renewal succeeded for {elapsed:.1f} s (deadline {self.timing.renew_deadline_s} s)"
                    )
                if elapsed >= self.timing.renew_interval_s and not state.renewing:
                    self.state = replace(state, renewing=True, renewal=state.renewal + 1)
                    return [Renew(self._record(state.term, state.renewal + 1), state.version)]
                return []
            case LeaseRead():
                return []  # a leader trusts its own writes
            case LeaseWritten(sent_at=sent_at, version=version):
                self.state = replace(state, version=version, renewed_at=max(state.renewed_at, sent_at), renewing=False)
                return []
            case LeaseWriteRefused():
                return self._step_down(state, "the lease was taken over (its version changed under this leader)")
            case LeaseWriteFailed(now=now, error=error):
                # Retried at the next tick; the deadline decides when to give up.
                self.state = replace(state, renewing=False)
                if now - state.renewed_at >= self.timing.renew_deadline_s:
                    return self._step_down(state, f"the lease renewal failed past its deadline: {error}")
                return []
            case _:
                assert_never(event)

    def _step_down(self, state: Leader, reason: str) -> list[Action]:
        self.state = SteppedDown(state.term, reason)
        return [StepDown(state.term, reason)]

"""The job index's pure decisions: its format, a takeover, stale records, and the registrar (every
state against every event, then a randomized simulation of leaders racing over one index)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from weir.core.errors import SerializationError
from weir.jobmanager.job_index import (
    Deposed,
    Holding,
    IndexRead,
    IndexReadFailed,
    IndexWriteRefused,
    IndexWriteUnanswered,
    IndexWritten,
    JobIndex,
    NotTakenOver,
    ReadIndex,
    Register,
    Registered,
    Registrar,
    RegistrarAction,
    RegistrarEvent,
    RegistrarState,
    RetryLater,
    TookOver,
    Uncertain,
    Verifying,
    VersionedIndex,
    Withdraw,
    WriteIndex,
    Writing,
    decode_index,
    encode_index,
    stale_jobs,
    takeover_index,
)

BASE = VersionedIndex(JobIndex(2, frozenset({"a"})), "v1")
WITH_B = VersionedIndex(JobIndex(2, frozenset({"a", "b"})), "v2")
NEWER = VersionedIndex(JobIndex(3, frozenset({"a"})), "v9")
NEWER_WITH_B = VersionedIndex(JobIndex(3, frozenset({"a", "b"})), "v9")


def test_the_index_document_round_trips_and_a_foreign_one_is_refused_in_one_line() -> None:
    index = JobIndex(4, frozenset({"j2", "j1"}))
    assert decode_index(encode_index(index)) == index
    assert encode_index(index) == b'{"format": 1, "jobs": ["j1", "j2"], "term": 4}'
    with pytest.raises(SerializationError, match="format 1"):
        decode_index(b'{"format": 2, "jobs": [], "term": 1}')
    with pytest.raises(SerializationError, match="malformed"):
        decode_index(b'{"format": 1, "jobs": [3], "term": 1}')
    with pytest.raises(SerializationError, match="malformed"):
        decode_index(b'{"format": 1, "term": 1}')


def test_a_takeover_keeps_the_jobs_under_the_new_term_or_adopts_the_listed_records() -> None:
    assert takeover_index(BASE.index, ["x"], 3) == JobIndex(3, frozenset({"a"}))  # listed ones not adopted
    assert takeover_index(BASE.index, [], 2) == BASE.index  # its own takeover write, made again
    assert takeover_index(None, ["x", "y"], 1) == JobIndex(1, frozenset({"x", "y"}))
    with pytest.raises(ValueError, match="term 2 cannot"):
        takeover_index(NEWER.index, [], 2)


def test_stale_jobs_are_the_records_no_index_names_but_those_being_created() -> None:
    assert stale_jobs(BASE.index, ["a", "b", "c"], creating=["c"]) == {"b"}
    assert stale_jobs(BASE.index, ["a"]) == frozenset()


STATES: dict[str, RegistrarState] = {
    "not taken over": NotTakenOver(),
    "holding": Holding(BASE),
    "writing b": Writing(BASE, "b"),
    "uncertain b": Uncertain(BASE, "b"),
    "verifying b then c": Verifying(BASE, "b", "c"),
    "verifying b then b": Verifying(BASE, "b", "b"),
    "deposed": Deposed("taken over", BASE.index),
    "deposed, b created before": Deposed("taken over", BASE.index, NEWER_WITH_B.index),
}
EVENTS: dict[str, RegistrarEvent] = {
    "took over": TookOver(BASE),
    "register a": Register("a"),
    "register b": Register("b"),
    "register c": Register("c"),
    "written": IndexWritten("v2"),
    "refused": IndexWriteRefused("another leader"),
    "unanswered": IndexWriteUnanswered("timeout"),
    "read: unchanged": IndexRead(BASE),
    "read: b landed": IndexRead(WITH_B),
    "read: newer term": IndexRead(NEWER),
    "read: newer term with b": IndexRead(NEWER_WITH_B),
    "read: gone": IndexRead(None),
    "read failed": IndexReadFailed("timeout"),
}
IGNORED: tuple[RegistrarAction, ...] = ()
RETRY = RetryLater  # compared by kind below: the reason is prose


def _expected(state: str, event: str) -> tuple[RegistrarState, tuple[RegistrarAction | type[RetryLater], ...]]:
    """What the registrar must answer: the whole table, written out by hand."""
    s = STATES[state]
    registering = event.startswith("register ")
    job = event.removeprefix("register ")
    match state:
        case "not taken over":
            if event == "took over":
                return Holding(BASE), ()
            return s, (RETRY,) if registering else ()
        case "holding":
            if event == "register a":
                return s, (Registered("a"),)
            if registering:
                return Writing(BASE, job), (WriteIndex(BASE.index.with_job(job), "v1"),)
            return s, ()
        case "writing b":
            if event == "written":
                return Holding(VersionedIndex(WITH_B.index, "v2")), (Registered("b"),)
            if event == "refused":
                return Deposed("another leader", BASE.index), (Withdraw("b", "another leader"),)
            if event == "unanswered":
                return Uncertain(BASE, "b"), (RETRY,)
            return s, (RETRY,) if registering else ()
        case "uncertain b":
            if registering:
                return Verifying(BASE, "b", job), (ReadIndex(),)
            return s, ()
        case "verifying b then c":
            if event == "read: unchanged":
                return Writing(BASE, "c"), (WriteIndex(BASE.index.with_job("c"), "v1"),)
            if event == "read: b landed":
                return Writing(WITH_B, "c"), (WriteIndex(WITH_B.index.with_job("c"), "v2"),)
            if event in ("read: newer term", "read: newer term with b"):
                found = NEWER if event == "read: newer term" else NEWER_WITH_B
                reason = "the job index was rewritten by the leader of term 3"
                return Deposed(reason, BASE.index, found.index), (Withdraw("c", reason),)
            if event == "read: gone":
                return Deposed("the job index is gone", BASE.index), (Withdraw("c", "the job index is gone"),)
            if event == "read failed":
                return Uncertain(BASE, "b"), (RETRY,)
            return s, (RETRY,) if registering else ()
        case "verifying b then b":  # the unanswered job itself, with its next record write
            if event == "read: unchanged":
                return Writing(BASE, "b"), (WriteIndex(WITH_B.index, "v1"),)
            if event == "read: b landed":
                return Holding(WITH_B), (Registered("b"),)
            reason = "the job index was rewritten by the leader of term 3"
            if event == "read: newer term":
                return Deposed(reason, BASE.index, NEWER.index), (Withdraw("b", reason),)
            if event == "read: newer term with b":  # it landed before the takeover: the new leader has it
                return Deposed(reason, BASE.index, NEWER_WITH_B.index), (Registered("b"),)
            if event == "read: gone":
                return Deposed("the job index is gone", BASE.index), (Withdraw("b", "the job index is gone"),)
            if event == "read failed":
                return Uncertain(BASE, "b"), (RETRY,)
            return s, (RETRY,) if registering else ()
        case "deposed":  # "a" was created before it was deposed: it stays created
            if event == "register a":
                return s, (Registered("a"),)
            return s, (Withdraw(job, "taken over"),) if registering else ()
        case "deposed, b created before":
            if event in ("register a", "register b"):
                return s, (Registered(job),)
            return s, (Withdraw(job, "taken over"),) if registering else ()
    raise AssertionError(state)


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("state", STATES)
def test_every_state_answers_every_event_as_the_table_says(state: str, event: str) -> None:
    registrar = Registrar()
    registrar.state = STATES[state]
    actions = registrar.handle(EVENTS[event])
    expected_state, expected_actions = _expected(state, event)
    assert registrar.state == expected_state
    assert len(actions) == len(expected_actions)
    for action, expected in zip(actions, expected_actions, strict=True):
        if expected is RetryLater:
            assert isinstance(action, RetryLater)
            registering = EVENTS[event]
            pending = STATES[state]
            expected_job = registering.job_id if isinstance(registering, Register) else getattr(pending, "job_id", "")
            assert action.job_id == expected_job
        else:
            assert action == expected


def test_registered_answers_from_the_index_last_known() -> None:
    registrar = Registrar()
    assert not registrar.registered("a")
    for state in ("holding", "writing b", "uncertain b", "verifying b then c", "verifying b then b"):
        registrar.state = STATES[state]
        assert registrar.registered("a") and not registrar.registered("b"), state
    registrar.state = STATES["deposed, b created before"]
    assert registrar.registered("b") and not registrar.registered("c")
    registrar.state = STATES["deposed"]
    assert registrar.registered("a") and not registrar.registered("b")


# A randomized simulation: leaders of rising terms over one index object ------------------------------


@dataclass
class Store:
    """The index object with S3's conditional writes; a write may land and lose its answer."""

    index: VersionedIndex | None = None
    writes: int = 0

    def put_if(self, index: JobIndex, expected: str | None) -> str | None:
        """The new version, or None when the precondition failed."""
        current = self.index.version if self.index is not None else None
        if current != expected:
            return None
        self.writes += 1
        self.index = VersionedIndex(index, f"v{self.writes}")
        return self.index.version


@dataclass
class Leader:
    term: int
    registrar: Registrar = field(default_factory=Registrar)
    answers: dict[str, str] = field(default_factory=dict)  # job -> registered / withdrawn (last answer)


def _carry_out(store: Store, leader: Leader, actions: list[RegistrarAction], rng: random.Random) -> None:
    pending = list(actions)
    while pending:
        action = pending.pop(0)
        match action:
            case WriteIndex(index=index, expected_version=expected):
                fate = rng.random()
                if fate < 0.15:  # lost on the way: never lands
                    pending.extend(leader.registrar.handle(IndexWriteUnanswered("timeout")))
                    continue
                version = store.put_if(index, expected)
                if version is None:
                    pending.extend(leader.registrar.handle(IndexWriteRefused("precondition failed")))
                elif fate < 0.3:  # landed, its answer lost
                    pending.extend(leader.registrar.handle(IndexWriteUnanswered("timeout")))
                else:
                    pending.extend(leader.registrar.handle(IndexWritten(version)))
            case ReadIndex():
                if rng.random() < 0.1:
                    pending.extend(leader.registrar.handle(IndexReadFailed("timeout")))
                else:
                    pending.extend(leader.registrar.handle(IndexRead(store.index)))
            case Registered(job_id=job):
                leader.answers[job] = "registered"
            case Withdraw(job_id=job):
                leader.answers[job] = "withdrawn"
            case RetryLater():
                pass


def _take_over(store: Store, term: int) -> Leader:
    leader = Leader(term)
    found = store.index
    index = takeover_index(found.index if found else None, [], term)
    version = store.put_if(index, found.version if found else None)
    assert version is not None, "nobody writes between a takeover's read and write in this simulation"
    leader.registrar.handle(TookOver(VersionedIndex(index, version)))
    return leader


@pytest.mark.parametrize("seed", range(200))
def test_leaders_racing_over_the_index_never_create_a_withdrawn_job_nor_lose_a_registered_one(seed: int) -> None:
    rng = random.Random(seed)
    store = Store()
    leaders = [_take_over(store, 1)]
    creator: dict[str, Leader] = {}
    for step in range(60):
        if rng.random() < 0.1:
            leaders.append(_take_over(store, leaders[-1].term + 1))
            continue
        leader = rng.choice(leaders)  # deposed leaders keep trying: they were paused
        if leader.answers and rng.random() < 0.3:  # a job retried with its next record write
            job = rng.choice(sorted(leader.answers))
        else:
            job = f"job-{seed}-{step}"
            creator[job] = leader
            leader.answers[job] = "asked"
        if creator.get(job) is leader:
            _carry_out(store, leader, leader.registrar.handle(Register(job)), rng)
    final = store.index
    assert final is not None
    answered = Counter(
        (job, answer) for leader in leaders for job, answer in leader.answers.items() if answer != "asked"
    )
    for (job, answer), _ in answered.items():
        if answer == "withdrawn":
            assert job not in final.index.job_ids, f"{job} was withdrawn but the index names it"
        else:
            assert job in final.index.job_ids, f"{job} was answered registered but the index lost it"
    # Each job in the index was asked by its creator before the index named it.
    assert final.index.job_ids <= set(creator)
    # A deposed leader's write never lands once a newer takeover wrote the index: every entry added
    # after the last takeover is the last leader's.
    last = leaders[-1]
    assert final.index.term == last.term

"""LeaderElection, the lease state machine: every state against every event, without storage or clock."""

from __future__ import annotations

import pytest

from weir.jobmanager.leader_election import (
    BecomeLeader,
    Candidate,
    Follower,
    Leader,
    LeaderElection,
    LeaderTerm,
    LeaseRead,
    LeaseRecord,
    LeaseTiming,
    LeaseWriteFailed,
    LeaseWriteRefused,
    LeaseWritten,
    ObservedLease,
    ReadLease,
    Renew,
    StepDown,
    SteppedDown,
    Tick,
    TryAcquire,
)

TIMING = LeaseTiming(lease_duration_s=6.0, renew_interval_s=2.0, renew_deadline_s=4.0)
OTHER = LeaseRecord("jm-b", LeaderTerm(3), "127.0.0.1:2", 6.0, renewal=7)


def election() -> LeaderElection:
    return LeaderElection("jm-a", "127.0.0.1:1", TIMING)


def leader_at(now: float, term: int = 1) -> LeaderElection:
    e = election()
    e.state = Leader(LeaderTerm(term), "v1", now)
    return e


def test_timing_must_renew_before_the_deadline_and_the_deadline_before_expiry() -> None:
    with pytest.raises(ValueError, match="renew interval < renew deadline < lease duration"):
        LeaseTiming(lease_duration_s=4.0, renew_interval_s=2.0, renew_deadline_s=4.0)
    with pytest.raises(ValueError):
        LeaseTiming(lease_duration_s=6.0, renew_interval_s=4.0, renew_deadline_s=3.0)


def test_a_follower_reads_the_lease_at_each_tick() -> None:
    assert election().handle(Tick(0.0)) == [ReadLease()]


def test_no_lease_at_all_is_taken_at_term_one_by_a_create_only_write() -> None:
    e = election()
    actions = e.handle(LeaseRead(0.0, ObservedLease(None, None)))
    assert actions == [TryAcquire(LeaseRecord("jm-a", LeaderTerm(1), "127.0.0.1:1", 6.0), None)]
    assert e.state == Candidate(LeaderTerm(1))


def test_a_lease_that_keeps_changing_is_never_taken_over() -> None:
    e = election()
    for i in range(20):  # renewed every 2 s by its holder: 40 s and never expired
        assert e.handle(LeaseRead(i * 2.0, ObservedLease(OTHER, f"v{i}"))) == []
    assert isinstance(e.state, Follower)


def test_an_unchanged_lease_is_taken_over_only_after_a_whole_lease_duration_from_first_seeing_it() -> None:
    e = election()
    assert e.handle(LeaseRead(100.0, ObservedLease(OTHER, "v9"))) == []
    assert e.handle(LeaseRead(105.9, ObservedLease(OTHER, "v9"))) == []
    actions = e.handle(LeaseRead(106.0, ObservedLease(OTHER, "v9")))
    assert actions == [TryAcquire(LeaseRecord("jm-a", LeaderTerm(4), "127.0.0.1:1", 6.0), "v9")]
    assert e.state == Candidate(LeaderTerm(4))


def test_a_longer_lease_of_its_holder_is_waited_out_in_full() -> None:
    e = election()
    long_lease = LeaseRecord("jm-b", LeaderTerm(3), "127.0.0.1:2", 30.0)
    e.handle(LeaseRead(0.0, ObservedLease(long_lease, "v1")))
    assert e.handle(LeaseRead(29.0, ObservedLease(long_lease, "v1"))) == []
    assert isinstance(e.handle(LeaseRead(30.0, ObservedLease(long_lease, "v1")))[0], TryAcquire)


def test_a_follower_ignores_write_answers_it_did_not_ask_for() -> None:
    for event in (LeaseWritten(1.0, 0.5, "v"), LeaseWriteRefused(1.0), LeaseWriteFailed(1.0, "down")):
        e = election()
        assert e.handle(event) == []
        assert e.state == Follower()


def test_a_candidate_whose_write_lands_leads_from_when_it_sent_the_write() -> None:
    e = election()
    e.state = Candidate(LeaderTerm(4))
    assert e.handle(Tick(1.0)) == []
    assert e.handle(LeaseRead(1.0, ObservedLease(OTHER, "v"))) == []
    assert e.handle(LeaseWritten(now=2.0, sent_at=1.5, version="v10")) == [BecomeLeader(LeaderTerm(4))]
    assert e.state == Leader(LeaderTerm(4), "v10", 1.5)
    assert e.leads(5.49) == LeaderTerm(4)
    assert e.leads(5.5) is None  # renew deadline from the send, not from the answer


@pytest.mark.parametrize("event", [LeaseWriteRefused(2.0), LeaseWriteFailed(2.0, "timed out")])
def test_a_candidate_that_lost_the_race_or_its_answer_follows_again(
    event: LeaseWriteRefused | LeaseWriteFailed,
) -> None:
    e = election()
    e.state = Candidate(LeaderTerm(4))
    assert e.handle(event) == [ReadLease()]
    assert e.state == Follower()
    assert e.leads(2.0) is None


def test_a_leader_renews_after_the_interval_once_with_a_new_renewal_count() -> None:
    e = leader_at(10.0, term=2)
    assert e.handle(Tick(11.9)) == []
    assert e.handle(Tick(12.0)) == [Renew(LeaseRecord("jm-a", LeaderTerm(2), "127.0.0.1:1", 6.0, renewal=1), "v1")]
    assert e.handle(Tick(12.5)) == []  # one renewal in flight at a time
    assert e.handle(LeaseWritten(now=12.6, sent_at=12.0, version="v2")) == []
    assert e.state == Leader(LeaderTerm(2), "v2", 12.0, renewing=False, renewal=1)
    assert e.handle(Tick(14.0)) == [Renew(LeaseRecord("jm-a", LeaderTerm(2), "127.0.0.1:1", 6.0, renewal=2), "v2")]


def test_a_leader_whose_renewals_fail_steps_down_at_the_deadline_before_any_follower_may_take_over() -> None:
    e = leader_at(10.0)
    assert isinstance(e.handle(Tick(12.0))[0], Renew)
    assert e.handle(LeaseWriteFailed(13.0, "S3 down")) == []  # retried at the next tick
    assert isinstance(e.handle(Tick(13.0))[0], Renew)
    assert e.leads(13.99) == LeaderTerm(1)
    actions = e.handle(Tick(14.0))
    assert len(actions) == 1 and isinstance(actions[0], StepDown) and actions[0].term == LeaderTerm(1)
    assert isinstance(e.state, SteppedDown)
    assert e.leads(14.0) is None
    assert TIMING.renew_deadline_s < TIMING.lease_duration_s  # a follower waits longer than that


def test_a_failed_renewal_answered_past_the_deadline_steps_down_at_once() -> None:
    e = leader_at(10.0)
    e.handle(Tick(12.0))
    assert isinstance(e.handle(LeaseWriteFailed(15.0, "timed out"))[0], StepDown)


def test_a_paused_leader_woken_after_its_deadline_steps_down_at_its_first_tick() -> None:
    e = leader_at(10.0)
    actions = e.handle(Tick(60.0))  # SIGSTOP for 50 s
    assert len(actions) == 1 and isinstance(actions[0], StepDown)
    assert "no renewal succeeded" in actions[0].reason


def test_a_leader_whose_lease_was_taken_over_steps_down() -> None:
    e = leader_at(10.0)
    e.handle(Tick(12.0))
    actions = e.handle(LeaseWriteRefused(12.1))
    assert len(actions) == 1 and isinstance(actions[0], StepDown) and "taken over" in actions[0].reason


def test_a_leader_trusts_its_own_writes_over_a_read() -> None:
    e = leader_at(10.0)
    assert e.handle(LeaseRead(11.0, ObservedLease(OTHER, "v9"))) == []
    assert isinstance(e.state, Leader)


def test_a_late_renewal_answer_never_moves_the_lease_time_back() -> None:
    e = leader_at(10.0)
    e.handle(LeaseWritten(now=11.0, sent_at=9.0, version="v0"))
    assert isinstance(e.state, Leader) and e.state.renewed_at == 10.0


@pytest.mark.parametrize(
    "event",
    [
        Tick(99.0),
        LeaseRead(99.0, ObservedLease(None, None)),
        LeaseWritten(99.0, 98.0, "v"),
        LeaseWriteRefused(99.0),
        LeaseWriteFailed(99.0, "x"),
    ],
)
def test_stepped_down_is_final(event: Tick | LeaseRead | LeaseWritten | LeaseWriteRefused | LeaseWriteFailed) -> None:
    e = election()
    e.state = SteppedDown(LeaderTerm(1), "gone")
    assert e.handle(event) == []
    assert e.state == SteppedDown(LeaderTerm(1), "gone")
    assert e.leads(99.0) is None


def test_two_contenders_over_one_simulated_store_never_lead_at_the_same_time() -> None:
    """A store that lands exactly one of two writes over the same version; a leader paused for a
    while (its ticks stop) and woken: at no instant do both hold a term they may act under."""
    store: dict[str, object] = {"record": None, "version": None}
    versions = iter(range(1, 10_000))

    def write(record: LeaseRecord, expected: str | None) -> str | None:
        if store["version"] != expected:
            return None
        store["record"], store["version"] = record, f"v{next(versions)}"
        return str(store["version"])

    a = LeaderElection("jm-a", "a", TIMING)
    b = LeaderElection("jm-b", "b", TIMING)
    terms_seen: list[int] = []

    def step(e: LeaderElection, now: float) -> None:
        pending = e.handle(Tick(now))
        while pending:
            action = pending.pop(0)
            match action:
                case ReadLease():
                    rec = store["record"]
                    assert rec is None or isinstance(rec, LeaseRecord)
                    pending += e.handle(LeaseRead(now, ObservedLease(rec, store["version"])))  # type: ignore[arg-type]
                case TryAcquire(record=r, expected_version=v) | Renew(record=r, expected_version=v):
                    version = write(r, v)
                    pending += e.handle(LeaseWritten(now, now, version) if version else LeaseWriteRefused(now))
                case BecomeLeader(term=t):
                    terms_seen.append(t)
                case StepDown():
                    pass

    now = 0.0
    paused = (20.0, 40.0)  # jm-a, the first leader, is SIGSTOPped in this window
    while now < 60.0:
        if not paused[0] <= now < paused[1]:
            step(a, now)
        step(b, now)
        assert not (a.leads(now) is not None and b.leads(now) is not None), now
        now = round(now + 0.5, 3)
    assert terms_seen == [1, 2]  # jm-a at 1, jm-b took over at 2; jm-a woken never led again
    assert b.leads(now - 0.5) == LeaderTerm(2)
    assert isinstance(a.state, SteppedDown)


def test_the_leader_known_is_the_last_lease_read_or_its_own_while_it_leads() -> None:
    """What a standby's /healthz names: nothing before its first read, the lease's holder after it
    (updated with each read), itself while it leads, nobody while it takes over or once it stepped down."""
    e = election()
    assert e.known_leader() is None
    e.handle(LeaseRead(0.0, ObservedLease(OTHER, "v1")))
    assert e.known_leader() == OTHER
    newer = LeaseRecord("jm-c", LeaderTerm(4), "127.0.0.1:3", 6.0)
    e.handle(LeaseRead(1.0, ObservedLease(newer, "v2")))
    assert e.known_leader() == newer
    e.state = Candidate(LeaderTerm(5))
    assert e.known_leader() is None
    e.state = Leader(LeaderTerm(5), "v3", 2.0, renewal=2)
    assert e.known_leader() == LeaseRecord("jm-a", LeaderTerm(5), "127.0.0.1:1", 6.0, renewal=2)
    e.state = SteppedDown(LeaderTerm(5), "lost it")
    assert e.known_leader() is None

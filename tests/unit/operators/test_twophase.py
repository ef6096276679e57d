from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.operators.twophase import (
    MAX_GID_LENGTH,
    CommitTxn,
    LedgerSnapshot,
    LedgerStateError,
    PendingTransaction,
    PreCommitted,
    RecoveryPlan,
    TransactionId,
    TwoPhaseCommitLedger,
    TxnStatus,
    plan_recovery,
)

JOB = JobId("job-7")
SINK = OperatorUid("orders-sink")
TASK = TaskId(JOB, SINK, SubtaskIndex(2))

MakeLedger = Callable[..., TwoPhaseCommitLedger]


@pytest.fixture
def make_ledger() -> MakeLedger:
    def make(task: TaskId = TASK) -> TwoPhaseCommitLedger:
        return TwoPhaseCommitLedger(task)

    return make


def txn(epoch: int, task: TaskId = TASK) -> TransactionId:
    return TransactionId.for_task(task, CheckpointId(epoch))


def cp(checkpoint: int) -> CheckpointId:
    return CheckpointId(checkpoint)


def run_checkpoint(ledger: TwoPhaseCommitLedger, checkpoint: int, *, write: bool = True) -> TransactionId | None:
    """Writes (opening a transaction if none is open), then the barrier."""
    if write and ledger.open_transaction is None:
        ledger.begin()
    pre_committed = ledger.pre_commit(cp(checkpoint))
    return pre_committed.txn if pre_committed is not None else None


# Transaction ids.


def test_gid_format_and_round_trip() -> None:
    transaction = txn(42)
    assert transaction.gid == "weir:job-7:orders-sink:2:00000000000000000042"
    assert str(transaction) == transaction.gid
    assert TransactionId.parse(transaction.gid, job_id=JOB, operator_uid=SINK) == transaction
    assert TransactionId.parse(transaction.gid, job_id=JOB, operator_uid=SINK, subtask=SubtaskIndex(2)) == (transaction)
    assert transaction.task == TASK


def test_gid_escapes_separators_so_sinks_cannot_collide() -> None:
    left = TransactionId(JobId("a:b"), OperatorUid("c"), SubtaskIndex(0), cp(1))
    right = TransactionId(JobId("a"), OperatorUid("b:c"), SubtaskIndex(0), cp(1))
    assert left.gid != right.gid
    assert TransactionId.parse(left.gid, job_id=JobId("a:b"), operator_uid=OperatorUid("c")) == left
    assert TransactionId.parse(left.gid, job_id=JobId("a"), operator_uid=OperatorUid("b:c")) is None
    odd = TransactionId(JobId("j %3A ü"), OperatorUid("o"), SubtaskIndex(0), cp(1))
    assert TransactionId.parse(odd.gid, job_id=JobId("j %3A ü"), operator_uid=OperatorUid("o")) == odd


@pytest.mark.parametrize(
    "gid",
    [
        txn(3, TaskId(JobId("other-job"), SINK, SubtaskIndex(2))).gid,
        txn(3, TaskId(JOB, OperatorUid("other-sink"), SubtaskIndex(2))).gid,
        "",
        "weir",
        "weir:job-7:orders-sink:2",
        "weir:job-7:orders-sink:2:42",
        "weir:job-7:orders-sink:02:00000000000000000042",
        "weir:job-7:orders-sink:-1:00000000000000000042",
        "weir:job-7:orders-sink:2:00000000000000000042:x",
        "weir:job-7:orders-sink:2:0000000000000000004\u0662",
        "weir:job%2D7:orders-sink:2:00000000000000000042",
        "flink:job-7:orders-sink:2:00000000000000000042",
        " weir:job-7:orders-sink:2:00000000000000000042",
        "_pg_some_other_application_gid",
    ],
)
def test_parse_rejects_foreign_and_malformed_gids(gid: str) -> None:
    assert TransactionId.parse(gid, job_id=JOB, operator_uid=SINK) is None


def test_parse_can_keep_to_one_subtask() -> None:
    assert TransactionId.parse(txn(3).gid, job_id=JOB, operator_uid=SINK, subtask=SubtaskIndex(1)) is None


def test_parse_never_raises_on_arbitrary_strings() -> None:
    rng = random.Random(7)
    alphabet = "weir:job-7orders-sink0123456789%3A\u0662 "
    for _ in range(3000):
        gid = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        parsed = TransactionId.parse(gid, job_id=JOB, operator_uid=SINK)
        assert parsed is None or parsed.gid == gid


def test_transaction_ids_are_validated() -> None:
    with pytest.raises(ValueError, match="shorten"):
        TransactionId(JobId("j" * 150), OperatorUid("o" * 50), SubtaskIndex(0), cp(1))
    with pytest.raises(ValueError, match="negative"):
        TransactionId(JOB, SINK, SubtaskIndex(-1), cp(1))
    with pytest.raises(ValueError, match="empty"):
        TransactionId(JobId(""), SINK, SubtaskIndex(0), cp(1))
    assert len(TransactionId(JobId("j" * 150), OperatorUid("o"), SubtaskIndex(0), cp(1)).gid) <= MAX_GID_LENGTH


# The ledger at run time.


def test_transaction_lifecycle(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    assert ledger.open_transaction is None
    opened = ledger.begin()
    assert opened == txn(1)
    assert ledger.open_transaction == opened
    assert ledger.pre_commit(cp(1)) == PreCommitted(opened, cp(1))
    assert ledger.open_transaction is None
    assert ledger.status(opened) is TxnStatus.PRE_COMMITTED
    assert ledger.snapshot_state() == LedgerSnapshot(TASK, cp(1), (PendingTransaction(cp(1), opened),))
    assert ledger.on_checkpoint_complete(cp(1)) == (CommitTxn(opened, cp(1), cp(1)),)
    assert ledger.status(opened) is TxnStatus.COMMITTING
    ledger.committed(opened)
    assert ledger.status(opened) is None
    assert ledger.pending == ()
    assert ledger.begin() == txn(2)


def test_pre_commit_without_writes_has_nothing_to_prepare(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    assert ledger.pre_commit(cp(1)) is None
    assert ledger.snapshot_state() == LedgerSnapshot(TASK, cp(1), ())
    assert ledger.on_checkpoint_complete(cp(1)) == ()
    assert ledger.begin() == txn(2)


def test_a_lost_notification_is_covered_by_the_next_one(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    first, second, third = (run_checkpoint(ledger, n) for n in (1, 2, 3))
    assert ledger.on_checkpoint_complete(cp(2)) == (
        CommitTxn(txn(1), cp(1), cp(2)),
        CommitTxn(txn(2), cp(2), cp(2)),
    )
    assert ledger.on_checkpoint_complete(cp(3)) == (CommitTxn(txn(3), cp(3), cp(3)),)
    assert (first, second, third) == (txn(1), txn(2), txn(3))


def test_older_duplicate_and_unknown_notifications_commit_nothing(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    run_checkpoint(ledger, 1)
    run_checkpoint(ledger, 2)
    assert ledger.on_checkpoint_complete(cp(9)) == ()
    assert len(ledger.on_checkpoint_complete(cp(2))) == 2
    assert ledger.on_checkpoint_complete(cp(2)) == ()
    assert ledger.on_checkpoint_complete(cp(1)) == ()


def test_commits_in_flight_are_not_issued_twice(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    run_checkpoint(ledger, 1)
    assert len(ledger.on_checkpoint_complete(cp(1))) == 1
    run_checkpoint(ledger, 2)
    assert ledger.on_checkpoint_complete(cp(2)) == (CommitTxn(txn(2), cp(2), cp(2)),)
    assert [entry.txn for entry in ledger.snapshot_state().pending] == [txn(1), txn(2)]


def test_an_aborted_checkpoint_commits_with_the_next_completed_one(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    run_checkpoint(ledger, 1)
    ledger.on_checkpoint_aborted(cp(1))
    assert ledger.status(txn(1)) is TxnStatus.PRE_COMMITTED
    run_checkpoint(ledger, 2)
    assert ledger.snapshot_state().pending == (
        PendingTransaction(cp(1), txn(1)),
        PendingTransaction(cp(2), txn(2)),
    )
    assert ledger.on_checkpoint_complete(cp(2)) == (
        CommitTxn(txn(1), cp(1), cp(2)),
        CommitTxn(txn(2), cp(2), cp(2)),
    )


def test_a_transaction_whose_checkpoint_never_reached_the_sink_is_pre_committed_later(
    make_ledger: MakeLedger,
) -> None:
    ledger = make_ledger()
    ledger.begin()
    assert ledger.pre_commit(cp(3)) == PreCommitted(txn(1), cp(3))
    assert ledger.begin() == txn(4)


def test_the_snapshot_keeps_unconfirmed_commits(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    run_checkpoint(ledger, 1)
    ledger.on_checkpoint_complete(cp(1))
    ledger.begin()
    run_checkpoint(ledger, 2)
    assert ledger.snapshot_state() == LedgerSnapshot(
        TASK, cp(2), (PendingTransaction(cp(1), txn(1)), PendingTransaction(cp(2), txn(2)))
    )
    ledger.committed(txn(1))
    assert ledger.snapshot_state().pending == (PendingTransaction(cp(2), txn(2)),)


def test_out_of_order_calls_are_rejected(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    with pytest.raises(LedgerStateError, match="snapshot before any pre-commit"):
        ledger.snapshot_state()
    ledger.begin()
    with pytest.raises(LedgerStateError, match="already open"):
        ledger.begin()
    ledger.pre_commit(cp(2))
    with pytest.raises(LedgerStateError, match="increasing order"):
        ledger.pre_commit(cp(2))
    with pytest.raises(LedgerStateError, match="not committing"):
        ledger.committed(txn(1))
    with pytest.raises(LedgerStateError, match="not committing"):
        ledger.committed(txn(5))


def test_snapshot_round_trips_through_bytes(make_ledger: MakeLedger) -> None:
    ledger = make_ledger(TaskId(JobId("j:1"), OperatorUid("sink ü"), SubtaskIndex(3)))
    for n in (1, 2, 4):
        run_checkpoint(ledger, n)
    snapshot = ledger.snapshot_state()
    assert LedgerSnapshot.from_bytes(snapshot.to_bytes()) == snapshot


def test_snapshots_are_validated() -> None:
    with pytest.raises(ValueError, match="another subtask"):
        LedgerSnapshot(TASK, cp(2), (PendingTransaction(cp(1), txn(1, TaskId(JOB, SINK, SubtaskIndex(0)))),))
    with pytest.raises(ValueError, match="pre-committed at checkpoint 3"):
        LedgerSnapshot(TASK, cp(2), (PendingTransaction(cp(3), txn(3)),))
    with pytest.raises(ValueError, match="sorted and distinct"):
        LedgerSnapshot(TASK, cp(2), (PendingTransaction(cp(2), txn(2)), PendingTransaction(cp(1), txn(1))))


# Recovery.


def snapshot_at(checkpoint: int, *pending: tuple[int, int]) -> LedgerSnapshot:
    entries = tuple(PendingTransaction(cp(at), txn(epoch)) for at, epoch in pending)
    return LedgerSnapshot(TASK, cp(checkpoint), entries)


def test_recovery_commits_the_snapshot_and_rolls_back_the_rest(make_ledger: MakeLedger) -> None:
    snapshot = snapshot_at(5, (4, 4), (5, 5))
    in_doubt = [txn(7), txn(3), txn(5), txn(6)]
    ledger = make_ledger()
    plan = ledger.recover(snapshot, in_doubt)
    assert plan == RecoveryPlan(cp(5), commit=(txn(4), txn(5)), rollback=(txn(3), txn(6), txn(7)))
    assert ledger.status(txn(4)) is TxnStatus.COMMITTING
    assert ledger.on_checkpoint_complete(cp(5)) == ()
    assert ledger.snapshot_state() == snapshot
    ledger.committed(txn(4))
    ledger.committed(txn(5))
    assert ledger.begin() == txn(6)
    assert ledger.pre_commit(cp(8)) == PreCommitted(txn(6), cp(8))
    assert ledger.on_checkpoint_complete(cp(8)) == (CommitTxn(txn(6), cp(8), cp(8)),)


def test_recovery_keeps_a_transaction_pre_committed_after_its_epoch() -> None:
    snapshot = snapshot_at(5, (5, 4))
    plan = plan_recovery(TASK, snapshot, [txn(4)])
    assert plan.commit == (txn(4),) and plan.rollback == ()


def test_recovery_rolls_back_a_transaction_of_a_skipped_epoch_pre_committed_after_the_snapshot() -> None:
    # Epoch 5 was pre-committed at checkpoint 6, which did not complete: restoring 5 rolls it back.
    plan = plan_recovery(TASK, snapshot_at(5), [txn(5)])
    assert plan == RecoveryPlan(cp(5), commit=(), rollback=(txn(5),))


def test_recovery_without_a_completed_checkpoint_rolls_back_everything(make_ledger: MakeLedger) -> None:
    ledger = make_ledger()
    assert ledger.recover(None, [txn(2), txn(1)]) == RecoveryPlan(None, (), (txn(1), txn(2)))
    assert ledger.begin() == txn(1)


def test_recovery_is_idempotent_when_repeated_after_a_crash() -> None:
    snapshot = snapshot_at(5, (4, 4), (5, 5))
    first = plan_recovery(TASK, snapshot, [txn(4), txn(5), txn(6)])
    # The first attempt committed 4 and rolled back 6, then crashed; the second sees only 5 in doubt.
    second = plan_recovery(TASK, snapshot, [txn(5)])
    assert second.commit == first.commit == (txn(4), txn(5))
    assert second.rollback == ()


def test_recovery_rejects_foreign_transactions_and_used_ledgers(make_ledger: MakeLedger) -> None:
    other = TaskId(JOB, SINK, SubtaskIndex(0))
    with pytest.raises(ValueError, match="another subtask"):
        plan_recovery(TASK, snapshot_at(5), [txn(6, other)])
    with pytest.raises(ValueError, match="snapshot is of"):
        plan_recovery(other, snapshot_at(5), [])
    ledger = make_ledger()
    ledger.begin()
    with pytest.raises(LedgerStateError, match="fresh ledger"):
        ledger.recover(snapshot_at(5), [])


# Randomized: a sink subtask against a fake external system holding prepared transactions, with lost
# notifications, aborted and skipped checkpoints, and crashes at every step of a commit or a recovery.


class Crash(Exception):
    pass


@dataclass
class PreparedStore:
    """A PostgreSQL-like store: prepared transactions by gid; each prepared instance has a token,
    because a gid is reused once its transaction was rolled back."""

    prepared: dict[str, int] = field(default_factory=dict)
    last_token: dict[str, int] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)

    def prepare(self, gid: str, token: int) -> None:
        assert gid not in self.prepared, f"gid {gid} already in use"
        self.prepared[gid] = token
        self.last_token[gid] = token

    def commit(self, gid: str) -> None:
        if gid in self.prepared:
            self.committed.append(self.prepared.pop(gid))
        else:  # "not found": the ledger's knowledge says it can only have been committed already
            assert self.last_token[gid] in self.committed, f"{gid} was lost, not committed"

    def rollback(self, gid: str) -> None:
        self.rolled_back.append(self.prepared.pop(gid))


@dataclass
class Simulation:
    rng: random.Random
    store: PreparedStore = field(default_factory=PreparedStore)
    ledger: TwoPhaseCommitLedger = field(default_factory=lambda: TwoPhaseCommitLedger(TASK))
    incarnation: int = 0
    next_checkpoint: int = 1
    latest_completed: tuple[int, bytes] | None = None
    completed: set[int] = field(default_factory=set)
    tokens: dict[int, tuple[int, int]] = field(default_factory=dict)  # token -> (incarnation, checkpoint)
    completed_by_incarnation: dict[int, set[int]] = field(default_factory=dict)
    crashes: bool = True

    def maybe_crash(self, probability: float) -> None:
        if self.crashes and self.rng.random() < probability:
            raise Crash

    def write(self) -> None:
        if self.ledger.open_transaction is None:
            self.ledger.begin()

    def checkpoint(self, *, outcome: str | None = None, notify: bool | None = None) -> None:
        checkpoint = self.next_checkpoint
        self.next_checkpoint += 1
        if outcome is None and self.rng.random() < 0.1:
            return  # aborted before its barrier reached the sink
        pre_committed = self.ledger.pre_commit(cp(checkpoint))
        if pre_committed is not None:
            token = len(self.tokens)
            self.tokens[token] = (self.incarnation, checkpoint)
            self.store.prepare(pre_committed.txn.gid, token)
        snapshot = self.ledger.snapshot_state().to_bytes()
        self.maybe_crash(0.03)
        outcome = outcome or ("complete" if self.rng.random() < 0.7 else "abort")
        if outcome == "abort":
            self.ledger.on_checkpoint_aborted(cp(checkpoint))
            return
        self.latest_completed = (checkpoint, snapshot)
        self.completed.add(checkpoint)
        self.completed_by_incarnation.setdefault(self.incarnation, set()).add(checkpoint)
        if notify if notify is not None else self.rng.random() < 0.7:
            self.run_commits(self.ledger.on_checkpoint_complete(cp(checkpoint)))

    def late_notification(self) -> None:
        ours = sorted(self.completed_by_incarnation.get(self.incarnation, set()))
        if ours:
            self.run_commits(self.ledger.on_checkpoint_complete(cp(self.rng.choice(ours))))

    def run_commits(self, commits: tuple[CommitTxn, ...]) -> None:
        for commit in commits:
            assert commit.completed_checkpoint_id in self.completed
            assert commit.pre_committed_at <= commit.completed_checkpoint_id
            self.maybe_crash(0.05)
            self.store.commit(commit.txn.gid)
            self.maybe_crash(0.05)
            self.ledger.committed(commit.txn)

    def crash_and_recover(self) -> None:
        while True:
            self.incarnation += 1
            self.ledger = TwoPhaseCommitLedger(TASK)
            try:
                self.recover()
                return
            except Crash:
                continue

    def recover(self) -> None:
        snapshot = LedgerSnapshot.from_bytes(self.latest_completed[1]) if self.latest_completed else None
        gids = [*self.store.prepared, "weir:job-7:orders-sink:0:00000000000000000001", "other_app_gid"]
        in_doubt = [parsed for gid in gids if (parsed := self.parse(gid)) is not None]
        plan = self.ledger.recover(snapshot, in_doubt)
        restored = self.latest_completed[0] if self.latest_completed else 0
        for transaction in plan.commit:
            token = self.store.last_token[transaction.gid]
            assert self.tokens[token][1] <= restored, "recovery commits past the restored checkpoint"
        for transaction in plan.rollback:
            self.maybe_crash(0.05)
            self.store.rollback(transaction.gid)
        for transaction in plan.commit:
            self.maybe_crash(0.05)
            self.store.commit(transaction.gid)
            self.ledger.committed(transaction)

    @staticmethod
    def parse(gid: str) -> TransactionId | None:
        return TransactionId.parse(gid, job_id=JOB, operator_uid=SINK, subtask=TASK.subtask)

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.45:
            self.write()
        elif roll < 0.85:
            self.checkpoint()
        elif roll < 0.92:
            self.late_notification()
        elif self.crashes:
            raise Crash

    def should_commit(self, token: int) -> bool:
        incarnation, checkpoint = self.tokens[token]
        return any(done >= checkpoint for done in self.completed_by_incarnation.get(incarnation, set()))


def test_random_sequences_commit_exactly_what_completed_checkpoints_cover() -> None:
    for seed in range(400):
        sim = Simulation(random.Random(seed))
        for _ in range(sim.rng.randint(5, 60)):
            try:
                sim.step()
            except Crash:
                sim.crash_and_recover()
        sim.crashes = False
        sim.write()
        sim.checkpoint(outcome="complete", notify=True)

        assert not sim.store.prepared, f"seed {seed}: transactions left in doubt"
        assert len(set(sim.store.committed)) == len(sim.store.committed), f"seed {seed}: committed twice"
        for token in sim.tokens:
            assert (token in sim.store.committed) == sim.should_commit(token), (seed, token, sim.tokens[token])
            assert (token in sim.store.rolled_back) != (token in sim.store.committed)
        assert sim.ledger.pending == ()

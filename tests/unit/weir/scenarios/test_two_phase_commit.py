"""The two-phase-commit scenario's rules, without a cluster: how an epoch's offsets follow from the
last stable offsets, and that each checked statement fails when the evidence contradicts it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from weir.api import load_job_file
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex
from weir.operators.transactional_sinks import CommitMarker
from weir.operators.twophase import TransactionId
from weir.scenarios.driving import Arrival
from weir.scenarios.keyed_job import KAFKA_SINK_UID, POSTGRES_SINK_UID
from weir.scenarios.two_phase_commit import (
    JOB_FILE,
    CheckpointTimes,
    Epoch,
    OpenTransactionRead,
    PreparedSighting,
    Received,
    TwoPhaseCommitConfig,
    TwoPhaseCommitRun,
    Visible,
    check,
    committed_before,
    epoch_range,
    in_ranges,
    received,
)

JOB = "job1"
CP = 3
TRIGGERED, COMPLETED = 100.0, 100.05


def gid(job: str = JOB, subtask: int = 0, checkpoint: int = CP) -> str:
    return TransactionId(
        JobId(job), OperatorUid(POSTGRES_SINK_UID), SubtaskIndex(subtask), CheckpointId(checkpoint)
    ).gid


def read(**changes: object) -> OpenTransactionRead:
    base = OpenTransactionRead(CP, 99.0, {0: (10, 14), 1: (20, 20)}, 4, 0, 0, False)
    return replace(base, **changes)  # type: ignore[arg-type]


def sighting(**changes: object) -> PreparedSighting:
    base = PreparedSighting(
        gid=gid(),
        checkpoint_id=CP,
        subtask=0,
        first_seen=100.03,
        while_prepared=Visible(100.031, 7, {1: 3, 2: 4}),
        prepared_at_snapshot=True,
        gone_at=100.07,
        after_commit=Visible(100.071, 12, {1: 3, 2: 4, CP: 5}),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def arrivals(at: float, n: int = 5) -> tuple[Received, ...]:
    return tuple(Received(0, 10 + i, at, 1000 + i) for i in range(n))


def epoch(**changes: object) -> Epoch:
    base = Epoch(
        times=CheckpointTimes(CP, TRIGGERED, COMPLETED),
        kafka_range={0: (10, 16), 1: (20, 20)},
        uncommitted=arrivals(99.5),
        committed=arrivals(100.08),
        marker=CommitMarker(JOB, "kafka-sink", 0, CP, 5, "weir-job1-kafka-sink-0"),
        marker_seen_uncommitted=100.02,
        postgres_proof_rows=5,
        prepared=sighting(),
        kafka_events_in_postgres=5,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def verdicts(e: Epoch, r: OpenTransactionRead | None = None) -> dict[str, bool]:
    run = TwoPhaseCommitRun(JOB, {CP: r or read()}, (e,), polls=100)
    return {c.name: c.passed for c in check(TwoPhaseCommitConfig(), run).checks}


def failed(e: Epoch, r: OpenTransactionRead | None = None) -> list[str]:
    return [name for name, passed in verdicts(e, r).items() if not passed]


def test_an_epoch_runs_from_the_lso_of_its_interval_to_the_lso_of_the_next() -> None:
    this = read(offsets={0: (10, 14), 1: (20, 20), 2: (5, 9)})
    after = read(checkpoint_id=CP + 1, offsets={0: (16, 18), 1: (20, 21), 2: (12, 12)})
    ranges = epoch_range(this, after)
    assert ranges == {0: (10, 16), 1: (20, 20), 2: (5, 12)}
    assert in_ranges(ranges, 0, 10) and in_ranges(ranges, 0, 15) and not in_ranges(ranges, 0, 16)
    assert not in_ranges(ranges, 1, 20) and not in_ranges(ranges, 3, 0)  # empty, unknown partition
    assert (this.open_records, this.open_partitions) == (8, (0, 2))


def test_rows_committed_before_a_checkpoint_come_from_the_earlier_proofs_only() -> None:
    assert committed_before({1: 3, 2: 4, 3: 5}, 3) == 7
    assert committed_before({}, 3) == 0


def test_a_consistent_run_passes_every_check() -> None:
    assert failed(epoch()) == []
    assert len(verdicts(epoch())) == 10
    report = check(TwoPhaseCommitConfig(), TwoPhaseCommitRun(JOB, {CP: read()}, (epoch(),), polls=100))
    assert report.check("open-kafka-transaction").numbers["intervals"] == (
        {
            "checkpoint": CP,
            "open_records": 4,
            "open_partitions": (0,),
            "read_uncommitted": 4,
            "read_committed": 0,
            "completed_by_then": False,
        },
    )
    assert report.check("kafka-proof").numbers["epochs"] == (
        {"checkpoint": CP, "marker_records": 5, "read_committed": 5},
    )


def test_a_gid_of_another_subtask_or_job_is_not_the_checkpoints_transaction() -> None:
    for wrong in (gid(subtask=1), gid(checkpoint=CP + 1)):
        assert "postgres-prepared-seen" in failed(epoch(prepared=sighting(gid=wrong)))
    other_job = epoch(prepared=sighting(gid=gid(job="other")))
    assert "postgres-prepared-seen" in failed(other_job)


def test_no_prepared_transaction_caught_fails_the_postgres_checks() -> None:
    assert failed(epoch(prepared=None)) == [
        "postgres-prepared-seen",
        "postgres-prepared-in-order",
        "postgres-hidden-while-prepared",
        "postgres-committed-after-completion",
        "postgres-proof",
    ]


def test_read_committed_seeing_the_open_transaction_fails() -> None:
    assert failed(epoch(), read(read_committed=1)) == ["open-kafka-transaction"]
    assert failed(epoch(), read(completed_by_then=True))  # a zero after the commit proves nothing
    assert failed(epoch(), read(read_uncommitted=3))  # read_uncommitted missed one of the range
    assert failed(epoch(), read(offsets={0: (14, 14)}, read_uncommitted=0))  # no open transaction at all


def test_events_already_in_postgres_during_the_interval_fail() -> None:
    assert failed(epoch(), read(in_postgres=1)) == ["open-events-not-in-postgres"]


def test_a_record_visible_to_read_committed_before_completion_fails() -> None:
    early = arrivals(100.08)[:4] + (Received(0, 14, COMPLETED - 0.001, 1004),)
    assert failed(epoch(committed=early)) == ["kafka-committed-after-completion"]


def test_read_committed_missing_records_fails_and_so_does_the_marker() -> None:
    assert failed(epoch(committed=arrivals(100.08, 4))) == [
        "kafka-committed-after-completion",
        "kafka-proof",
        "sinks-committed-same-events",
    ]


def test_a_prepared_transaction_whose_rows_are_visible_fails() -> None:
    leaked = sighting(while_prepared=Visible(100.031, 9, {1: 3, 2: 4}))
    assert "postgres-hidden-while-prepared" in failed(epoch(prepared=leaked))
    early_proof = sighting(while_prepared=Visible(100.031, 7, {1: 3, 2: 4, CP: 5}))
    assert "postgres-hidden-while-prepared" in failed(epoch(prepared=early_proof))
    unconfirmed = sighting(prepared_at_snapshot=False)
    assert "postgres-hidden-while-prepared" in failed(epoch(prepared=unconfirmed))


def test_a_commit_before_completion_or_none_at_all_fails() -> None:
    assert "postgres-prepared-in-order" in failed(epoch(prepared=sighting(gone_at=COMPLETED - 0.01)))
    assert "postgres-prepared-in-order" in failed(epoch(prepared=sighting(first_seen=TRIGGERED - 1)))
    never = failed(epoch(prepared=sighting(gone_at=None, after_commit=None)))
    assert "postgres-committed-after-completion" in never and "postgres-prepared-in-order" in never
    rolled_back = sighting(after_commit=Visible(100.071, 7, {1: 3, 2: 4}))  # gone, but nothing committed
    assert "postgres-committed-after-completion" in failed(epoch(prepared=rolled_back))


def test_proofs_that_disagree_with_what_was_seen_fail() -> None:
    marker = CommitMarker(JOB, "kafka-sink", 0, CP, 6, "weir-job1-kafka-sink-0")
    assert "kafka-proof" in failed(epoch(marker=marker))
    assert "kafka-proof" in failed(epoch(marker=None))
    assert "postgres-proof" in failed(epoch(postgres_proof_rows=4))
    assert failed(epoch(kafka_events_in_postgres=4)) == ["sinks-committed-same-events"]


@pytest.mark.parametrize("missing", ["uncommitted", "committed"])
def test_an_epoch_nobody_saw_fails(missing: str) -> None:
    assert failed(epoch(**{missing: ()}))


def test_the_job_sends_every_event_to_both_sinks() -> None:
    loaded = load_job_file(JOB_FILE)
    assert set(loaded.graph.transformations) == {"events", KAFKA_SINK_UID, POSTGRES_SINK_UID}
    assert loaded.module.event(101) == {"id": 101, "key": "k1", "value": 4}


def test_what_a_consumer_received_is_read_within_the_epochs_offsets() -> None:
    got = [
        Arrival("out", 0, 10, 1.0, b'{"id": 7, "key": "k7", "value": 1}'),
        Arrival("out", 0, 16, 1.1, b'{"id": 8, "key": "k8", "value": 1}'),  # past the range
        Arrival("out", 1, 20, 1.2, b"not an event"),
    ]
    assert received(got, {0: (10, 16), 1: (20, 21)}) == (Received(0, 10, 1.0, 7), Received(1, 20, 1.2, None))

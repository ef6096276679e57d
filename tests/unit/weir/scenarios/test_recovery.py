"""The recovery scenario's arithmetic, without a cluster: aborted records from two reads of a topic,
replayed records, the sinks' commit proofs and prepared transactions, a partial cross-sink commit, and
the checks each can fail."""

from __future__ import annotations

import json
from dataclasses import replace

from weir.core.checkpointing import CheckpointStatus
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex
from weir.core.states import JobStatus
from weir.operators.transactional_sinks import CommitMarker
from weir.operators.twophase import TransactionId
from weir.scenarios.keyed_job import (
    KAFKA_SINK_UID,
    POSTGRES_SINK_UID,
    committed_checkpoints,
    marker_entries,
    prepared_epochs,
    proof_of,
    window_of,
)
from weir.scenarios.recovery import (
    KillOutcome,
    PartialOutcome,
    ProofSnapshot,
    RecoveryConfig,
    RecoveryRun,
    aborted_output,
    check,
    replayed_records,
)
from weir.tools.client import JobDetails, JobSummary
from weir.tools.verify import CommitProof, ProofEntry, SinkKindName, SinkReport, SubtaskCommit, VerifyReport

JOB = "job1"


def result(key: str, start: int, count: int = 1) -> bytes:
    return json.dumps({"key": key, "window_start": start, "window_end": start + 500, "count": count, "sum": 1}).encode()


def gid(uid: str, subtask: int, checkpoint: int, job: str = JOB) -> str:
    return TransactionId(JobId(job), OperatorUid(uid), SubtaskIndex(subtask), CheckpointId(checkpoint)).gid


def test_a_window_is_read_from_a_result_record() -> None:
    assert window_of(result("a", 500)) == ("a", 500)
    assert window_of(b"not json") is None
    assert window_of(None) is None


def test_aborted_records_are_those_only_read_uncommitted_sees_and_each_window_is_looked_up_committed() -> None:
    uncommitted = [
        (0, 0, result("a", 0)),  # aborted; re-produced at offset 3
        (0, 1, result("b", 0)),  # aborted; never committed
        (0, 3, result("a", 0)),
        (1, 0, result("c", 0)),  # aborted; committed twice
        (1, 2, result("c", 0)),
        (1, 3, result("c", 0)),
    ]
    committed = [(0, 3, result("a", 0)), (1, 2, result("c", 0)), (1, 3, result("c", 0))]
    out = aborted_output(uncommitted, committed)
    assert (out.uncommitted, out.committed, out.aborted, out.aborted_windows) == (6, 3, 3, 3)
    assert (out.committed_once, out.not_committed, out.committed_more) == (1, 1, 1)
    assert any("never committed" in s for s in out.samples) and any("2x" in s for s in out.samples)


def test_nothing_aborted_when_both_reads_agree() -> None:
    records = [(0, 0, result("a", 0))]
    out = aborted_output(records, records)
    assert (out.aborted, out.aborted_windows, out.committed_once) == (0, 0, 0)


def test_replayed_records_are_those_received_beyond_one_per_input_event() -> None:
    assert replayed_records(12_500, 12_000) == 500
    assert replayed_records(12_000, 12_000) == 0


def marker(subtask: int, checkpoint: int, uid: str = KAFKA_SINK_UID, job: str = JOB) -> bytes:
    return CommitMarker(job, uid, subtask, checkpoint, 10, f"weir-{job}-{uid}-{subtask}").to_json()


def test_the_kafka_proof_is_each_subtasks_last_committed_marker() -> None:
    entries = marker_entries(
        [(marker(0, 3), 1), (marker(0, 5), 2), (marker(1, 4), 3), (b"junk", 4), (marker(0, 9, "other"), 5)],
        KAFKA_SINK_UID,
    )
    proof = proof_of("kafka", entries, JOB, KAFKA_SINK_UID)
    assert [(c.subtask, c.checkpoint_id) for c in proof.subtasks] == [(0, 5), (1, 4)]
    assert proof.last_committed_checkpoint == 5
    assert not proof_of("kafka", entries, "another-job", KAFKA_SINK_UID).available
    assert committed_checkpoints(entries, JOB, KAFKA_SINK_UID, 0) == {3, 5}


def test_prepared_epochs_are_the_sinks_own_gids_by_subtask() -> None:
    gids = [
        gid(POSTGRES_SINK_UID, 0, 7),
        gid(POSTGRES_SINK_UID, 2, 7),
        gid(POSTGRES_SINK_UID, 2, 8),
        gid(POSTGRES_SINK_UID, 1, 7, job="other-job"),
        gid("another-sink", 1, 7),
        "someone-elses-transaction",
    ]
    assert prepared_epochs(gids, POSTGRES_SINK_UID, JOB) == {0: (7,), 2: (7, 8)}


def proof(*commits: tuple[int, int]) -> CommitProof:
    return CommitProof("test", JOB, tuple(SubtaskCommit(s, c, 1) for s, c in commits))


def pg_entries(*commits: tuple[int, int]) -> tuple[ProofEntry, ...]:
    return tuple(ProofEntry(JOB, POSTGRES_SINK_UID, s, c, 1, 0) for s, c in commits)


def test_a_partial_commit_is_kafka_ahead_with_that_checkpoint_prepared_in_postgres() -> None:
    during = ProofSnapshot(proof((0, 8), (1, 7)), proof((0, 7), (1, 7)), {0: (8,), 1: (8,)})
    assert during.partial() == 8
    assert any("will commit 8" in line for line in during.reconciliation)
    assert ProofSnapshot(proof((0, 8)), proof((0, 8)), {}).partial() is None  # caught up
    assert ProofSnapshot(proof((0, 8)), proof((0, 7)), {}).partial() is None  # behind, but nothing prepared
    assert ProofSnapshot(proof((0, 8)), proof((0, 7)), {0: (8,)}, stable=False).partial() is None  # moved


def test_after_a_restore_an_epoch_named_earlier_can_hold_the_checkpoint_prepared() -> None:
    # restored from 3, the first epoch is named 4; checkpoint 4 never reached the sink: pre-committed at 5
    during = ProofSnapshot(proof((0, 5)), proof((0, 3)), {0: (4,)})
    assert during.behind(5) == {0: (4,)}
    assert during.partial() == 5
    assert ProofSnapshot(proof((0, 5)), proof((0, 3)), {0: (6,)}).partial() is None  # a later epoch: not N's


def test_the_behind_sink_caught_up_once_it_committed_the_checkpoint_in_every_behind_subtask() -> None:
    during = ProofSnapshot(proof((0, 8)), proof((0, 7), (1, 7)), {0: (8,), 1: (8,)}, pg_entries((0, 7), (1, 7)))
    after = ProofSnapshot(proof((0, 9)), proof((0, 8), (1, 8)), {}, pg_entries((0, 7), (1, 7), (0, 8), (1, 8)))
    outcome = PartialOutcome(8, {0: 11, 1: 12}, during, (), after, 0.0, 1)
    assert outcome.behind_subtasks == (0, 1)
    assert outcome.caught_up
    only_one = replace(after, postgres_entries=pg_entries((0, 7), (1, 7), (0, 8)))
    assert not replace(outcome, after=only_one).caught_up
    still_prepared = replace(after, prepared={1: (8,)})
    assert not replace(outcome, after=still_prepared).caught_up


def kill(status: CheckpointStatus, committed: bool, prepared_after: bool = False) -> KillOutcome:
    return KillOutcome("taskmanager-2", 42, 0, 5, 5, {0: (5,)}, {1: 3}, False, status, committed, prepared_after)


def test_the_killed_subtasks_transaction_must_follow_its_checkpoint() -> None:
    assert kill(CheckpointStatus.COMPLETED, committed=True).resolved_as_checkpoint_says
    assert kill(CheckpointStatus.FAILED, committed=False).resolved_as_checkpoint_says
    assert not kill(CheckpointStatus.FAILED, committed=True).resolved_as_checkpoint_says
    assert not kill(CheckpointStatus.COMPLETED, committed=False).resolved_as_checkpoint_says
    assert not kill(CheckpointStatus.FAILED, committed=False, prepared_after=True).resolved_as_checkpoint_says


def sink_report(uid: str, kind: SinkKindName, last: int, duplicates: int = 0) -> SinkReport:
    return SinkReport(
        uid,
        kind,
        "t",
        100,
        100 + duplicates,
        duplicates,
        0,
        0,
        0,
        {},
        proof((0, last)),
        (),
        "m",
    )


def outcome() -> RecoveryRun:
    during = ProofSnapshot(proof((0, 8)), proof((0, 7)), {0: (8,)}, pg_entries((0, 7)))
    after = ProofSnapshot(proof((0, 9)), proof((0, 9)), {}, pg_entries((0, 7), (0, 8), (0, 9)))
    sinks = (sink_report(KAFKA_SINK_UID, "kafka", 20), sink_report(POSTGRES_SINK_UID, "postgres", 20))
    final = JobDetails(JobSummary(JobId(JOB), "keyed", JobStatus.FINISHED, 0.0, 3, 2), (), None, None, None)
    return RecoveryRun(
        job_id=JOB,
        kill=kill(CheckpointStatus.FAILED, committed=False),
        partial=PartialOutcome(8, {0: 11}, during, (gid(POSTGRES_SINK_UID, 0, 8),), after, 0.0, 1),
        final=final,
        aborted=aborted_output([(0, 0, result("a", 0)), (0, 2, result("a", 0))], [(0, 2, result("a", 0))]),
        records_all_attempts=1_300,
        input_records=1_000,
        table_count=1_000,
        kafka_count=1_000,
        verify=VerifyReport("job.py", "keyed", JOB, "--job-id", (), sinks, (), ("every sink committed up to 20",)),
    )


def test_a_run_that_shows_the_outcome_passes_every_check() -> None:
    report = check(RecoveryConfig.small(), outcome())
    assert report.ok, report.failed
    assert len(report.checks) == 10
    assert report.check("duplicate-execution").numbers == {
        "records_all_attempts": 1_300,
        "input_records": 1_000,
        "replayed": 300,
    }
    assert report.check("partial-cross-sink-success").numbers["checkpoint"] == 8


def failed(o: RecoveryRun) -> list[str]:
    return [c.name for c in check(RecoveryConfig.small(), o).failed]


def test_each_check_fails_when_its_measurement_does() -> None:
    o = outcome()
    assert failed(replace(o, records_all_attempts=1_000)) == ["duplicate-execution"]
    assert failed(replace(o, table_count=999)) == ["state-counts-each-input-once"]  # an input twice, or lost
    no_aborted = aborted_output([(0, 2, result("a", 0))], [(0, 2, result("a", 0))])
    assert failed(replace(o, aborted=no_aborted)) == [
        "aborted-records-uncommitted-only",
        "aborted-windows-committed-once",
    ]
    duplicated = replace(o.verify, sinks=(sink_report(KAFKA_SINK_UID, "kafka", 20, duplicates=1), o.verify.sinks[1]))
    assert failed(replace(o, verify=duplicated)) == ["sinks-exact"]
    behind = replace(o.verify, sinks=(o.verify.sinks[0], sink_report(POSTGRES_SINK_UID, "postgres", 19)))
    assert failed(replace(o, verify=behind)) == ["behind-sink-caught-up"]  # the final proofs disagree
    no_partial = replace(o.partial, during=replace(o.partial.during, kafka=proof((0, 7))))
    assert "partial-cross-sink-success" in failed(replace(o, partial=no_partial))
    once = replace(o.final, summary=replace(o.final.summary, restarts=1))
    assert failed(replace(o, final=once)) == ["restarted-and-finished"]
    wrong = kill(CheckpointStatus.COMPLETED, committed=False)
    assert failed(replace(o, kill=wrong)) == ["prepared-resolved-as-checkpoint"]
    not_prepared = replace(o.kill, prepared_at_kill={0: (4,)})
    assert failed(replace(o, kill=not_prepared)) == ["killed-after-pre-commit"]


def test_proofs_are_settled_once_no_kafka_subtask_reads_behind_its_postgres_subtask() -> None:
    assert ProofSnapshot(proof((0, 7), (1, 7)), proof((0, 7), (1, 6)), {}).settled
    assert not ProofSnapshot(proof((0, 6), (1, 7)), proof((0, 7), (1, 7)), {}).settled  # markers not landed yet

"""The pure parts of `weir verify`: comparisons, commit proofs, reconciliation, transaction ids."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex
from weir.operators.twophase import TransactionId
from weir.tools.cli import EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.verify import (
    CommitProof,
    ProofEntry,
    SubtaskCommit,
    compare_records,
    compare_rows,
    last_commits,
    latest_job_id,
    reconcile,
    sink_transaction,
)


def test_records_compare_as_a_multiset() -> None:
    c = compare_records([b"a", b"b", b"b", b"c"], [b"a", b"a", b"b", b"x"])

    assert (c.expected, c.found) == (4, 4)
    assert (c.duplicates, c.missing, c.unexpected) == (1, 2, 1)  # a twice; one b and c missing; x unexpected
    assert c.samples["duplicates"] == ["a found 2x, expected 1x"]
    assert c.samples["unexpected"] == ["x"]


def test_equal_multisets_have_no_discrepancy() -> None:
    c = compare_records([b"a", b"b", b"b"], [b"b", b"a", b"b"])

    assert (c.duplicates, c.missing, c.unexpected, c.mismatched) == (0, 0, 0, 0)


def test_rows_compare_by_key_columns() -> None:
    expected = {("k1", 0): ("k1", 0, 5), ("k2", 0): ("k2", 0, 7), ("k3", 0): ("k3", 0, 1)}
    found = [("k1", 0, Decimal(5)), ("k2", 0, 8), ("k4", 0, 1)]

    c = compare_rows(expected, found, key_index=[0, 1])

    assert (c.expected, c.found) == (3, 3)
    assert (c.duplicates, c.missing, c.unexpected, c.mismatched) == (0, 1, 1, 1)
    assert c.samples["mismatched"] == ["key ('k2', 0): expected ('k2', 0, 7), found ('k2', 0, 8)"]


def test_a_key_found_twice_is_a_duplicate_row() -> None:
    c = compare_rows({("k",): ("k", 1)}, [("k", 1), ("k", 1)], key_index=[0])

    assert (c.duplicates, c.missing, c.mismatched) == (1, 0, 0)


def entry(job: str, uid: str, subtask: int, checkpoint: int, at: int) -> ProofEntry:
    return ProofEntry(job, uid, subtask, checkpoint, 10, at)


def test_last_commit_per_subtask_of_one_job() -> None:
    entries = [
        entry("j1", "sink", 0, 3, 100),
        entry("j1", "sink", 0, 5, 200),
        entry("j1", "sink", 1, 4, 150),
        entry("j1", "other", 1, 9, 150),
        entry("j0", "sink", 0, 7, 50),
    ]

    assert last_commits(entries, "j1", "sink") == (SubtaskCommit(0, 5, 10), SubtaskCommit(1, 4, 10))
    assert latest_job_id(entries) == "j1"
    assert latest_job_id([]) is None


def test_reconciliation_names_the_sink_behind_and_what_it_will_commit() -> None:
    kafka = CommitProof("topic", "j", (SubtaskCommit(0, 12, 1), SubtaskCommit(1, 11, 1)))
    pg = CommitProof("table", "j", (SubtaskCommit(0, 11, 1),))

    assert reconcile([("kafka-sink", kafka), ("postgres-sink", pg)]) == [
        "kafka-sink committed up to 12, postgres-sink up to 11: postgres-sink will commit 12 on recovery/next "
        "notification"
    ]
    assert reconcile([("kafka-sink", kafka), ("other", kafka)]) == [
        "every sink with a commit proof committed up to checkpoint 12"
    ]
    missing = CommitProof("table", None, missing_reason="table weir_sink_commits does not exist")
    assert reconcile([("postgres-sink", missing)]) == [
        "postgres-sink: no commit proof (table weir_sink_commits does not exist)"
    ]


def test_prepared_transactions_are_matched_to_their_sink_and_job() -> None:
    gid = TransactionId(JobId("job:1"), OperatorUid("postgres-sink"), SubtaskIndex(2), CheckpointId(7)).gid

    assert sink_transaction(gid, "postgres-sink", "job:1") is not None
    assert sink_transaction(gid, "postgres-sink", None) is not None  # any job when none is known
    assert sink_transaction(gid, "postgres-sink", "job:2") is None
    assert sink_transaction(gid, "kafka-sink", None) is None
    assert sink_transaction("some-other-gid", "postgres-sink", None) is None


# The command, without services: jobs whose sinks need no Kafka or PostgreSQL ---------------------


def test_verify_command_refuses_an_unbounded_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "forever.py"
    job.write_text('def build(env):\n    env.from_generator(lambda i: i, uid="forever").print(uid="out")\n')

    code = run_cli(["verify", str(job)])

    assert code == EXIT_USAGE
    assert capsys.readouterr().err == (
        "weir: error: reference mode needs bounded input: generator source 'forever' has no count "
        "(give from_generator a count)\n"
    )


def test_verify_command_lists_sinks_it_cannot_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "printing.py"
    job.write_text('def build(env):\n    env.from_collection([1, 2], uid="numbers").print(uid="out")\n')

    code = run_cli(["verify", str(job), "--json"])

    assert code == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["skipped_sinks"] == ["out (print)"]
    assert report["warnings"] == ["the job has no Kafka or PostgreSQL sink to verify"]
    assert report["sources"] == [
        {"uid": "numbers", "kind": "generator", "topic": None, "records": 2, "dead_lettered": 0}
    ]

"""The pure parts of `weir verify`: comparisons, commit proofs, reconciliation, transaction ids."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from weir.core.changelog import Delete
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex
from weir.operators.twophase import TransactionId
from weir.tools.cli import EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.reference import SinkCapture, SinkDescription
from weir.tools.verify import (
    CommitProof,
    ProofCount,
    ProofEntry,
    SinkReport,
    SubtaskCommit,
    check_proof_records,
    committed_by_proofs,
    compare_records,
    compare_rows,
    kafka_compared,
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


RESULTS = [b'{"key":"k1","count":3}', b'{"key":"k2","count":5}', b'{"key":"k3","count":1}']


def test_a_duplicated_record_is_reported() -> None:
    c = compare_records(RESULTS, [*RESULTS, RESULTS[1]])

    assert (c.duplicates, c.missing, c.unexpected) == (1, 0, 0)
    assert c.samples["duplicates"] == ['{"key":"k2","count":5} found 2x, expected 1x']


def test_a_missing_record_is_reported() -> None:
    c = compare_records(RESULTS, RESULTS[:2])

    assert (c.duplicates, c.missing, c.unexpected) == (0, 1, 0)
    assert c.samples["missing"] == ['{"key":"k3","count":1}']


def test_a_changed_record_is_reported_as_the_expected_one_missing_and_the_found_one_unexpected() -> None:
    c = compare_records(RESULTS, [RESULTS[0], b'{"key":"k2","count":6}', RESULTS[2]])

    assert (c.duplicates, c.missing, c.unexpected) == (0, 1, 1)
    assert c.samples == {"unexpected": ['{"key":"k2","count":6}'], "missing": ['{"key":"k2","count":5}']}


def test_a_record_that_replaces_a_duplicate_keeps_the_counts_but_not_the_multiset() -> None:
    """Two records of one window instead of one of each: the count of records is right, a set of them
    hides the duplicate, the multiset does not."""
    found = [RESULTS[0], RESULTS[0], RESULTS[2]]

    c = compare_records(RESULTS, found)

    assert len(found) == len(RESULTS) and set(found) < set(RESULTS)
    assert (c.duplicates, c.missing, c.unexpected) == (1, 1, 0)


def test_rows_changed_or_missing_are_reported() -> None:
    expected = {("k1",): ("k1", 3), ("k2",): ("k2", 5), ("k3",): ("k3", 1)}

    c = compare_rows(expected, [("k1", 3), ("k2", 6)], key_index=[0])

    assert (c.duplicates, c.missing, c.unexpected, c.mismatched) == (0, 1, 0, 1)


def test_a_row_committed_twice_is_a_duplicate_the_commit_proofs_show_though_the_upsert_hid_it() -> None:
    """Three window results, one per key: the table holds three rows either way, the proofs count four."""
    assert check_proof_records("postgres", 4, found=3, writes=3, keys=3) == ProofCount(hidden_duplicates=1)
    assert check_proof_records("postgres", 3, found=3, writes=3, keys=3) == ProofCount()


def test_proofs_counting_fewer_rows_than_written_are_a_discrepancy() -> None:
    assert check_proof_records("postgres", 2, found=3, writes=3, keys=3).problems == (
        "commit proofs count 2 rows, the reference writes 3",
    )


def test_rewritten_keys_bound_the_proof_count_between_keys_and_writes() -> None:
    """A key written in several epochs commits once per epoch, once per key within one."""
    assert check_proof_records("postgres", 4, found=2, writes=5, keys=2) == ProofCount()
    assert check_proof_records("postgres", 6, found=2, writes=5, keys=2).problems == (
        "commit proofs count 6 rows, the reference writes 5 rows over 2 keys",
    )
    assert check_proof_records("postgres", 1, found=2, writes=5, keys=2).problems == (
        "commit proofs count 1 rows, the reference writes 5 rows over 2 keys",
    )


def test_kafka_proofs_must_count_the_committed_records() -> None:
    assert check_proof_records("kafka", 3, found=3, writes=3, keys=3) == ProofCount()
    assert check_proof_records("kafka", 3, found=4, writes=3, keys=3).problems == (
        "commit proofs count 3 records, the topic holds 4 committed",
    )


def test_output_without_a_commit_proof_is_a_discrepancy() -> None:
    for kind in ("kafka", "postgres"):
        assert check_proof_records(kind, None, found=3, writes=3, keys=3).problems == ("no commit proof",)  # type: ignore[arg-type]
        assert check_proof_records(kind, None, found=0, writes=0, keys=0) == ProofCount()  # type: ignore[arg-type]


def test_proofs_are_summed_over_the_job_and_the_jobs_it_restored_from() -> None:
    entries = [
        ProofEntry("old", "sink", 0, 3, 10, 1),
        ProofEntry("old", "sink", 1, 3, 5, 1),
        ProofEntry("new", "sink", 0, 1, 7, 2),
        ProofEntry("new", "other", 0, 1, 100, 2),
        ProofEntry("unrelated", "sink", 0, 9, 1000, 3),
    ]

    assert committed_by_proofs(entries, ("new",), "sink") == 7
    assert committed_by_proofs(entries, ("new", "old"), "sink") == 22
    assert committed_by_proofs(entries, ("none",), "sink") is None


def test_a_proof_problem_fails_the_sink() -> None:
    report = SinkReport(
        uid="postgres-sink",
        kind="postgres",
        target="t",
        expected=3,
        found=3,
        duplicates=0,
        missing=0,
        unexpected=0,
        mismatched=0,
        samples={},
        commit_proof=CommitProof("table", "j"),
        open_transactions=(),
        open_transaction_method="",
        proof_records=None,
        proof_problems=("no commit proof",),
    )

    assert not report.ok
    assert report.problems() == ["no commit proof"]


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


def test_deletes_count_as_changes_so_a_lost_or_replayed_delete_is_caught() -> None:
    """The reference upserts key 1 and deletes key 2 (each key changed once): the table holds one
    row, the proofs must count two changes; one is a lost delete, three a delete committed twice."""
    capture = SinkCapture(
        "copy",
        SinkDescription("postgres", "t", columns=("id", "name"), key_columns=("id",), to_row=_change),
        values=[("upsert", 1, "a"), ("delete", 2, "")],
    )
    assert capture.final_rows() == {(1,): (1, "a")}
    writes, keys = len(capture.rows()), capture.keys_changed()
    assert (writes, keys) == (2, 2)
    assert check_proof_records("postgres", 2, found=1, writes=writes, keys=keys) == ProofCount()
    assert check_proof_records("postgres", 1, found=1, writes=writes, keys=keys).problems == (
        "commit proofs count 1 rows, the reference writes 2",
    )
    assert check_proof_records("postgres", 3, found=1, writes=writes, keys=keys) == ProofCount(hidden_duplicates=1)


def test_the_reference_table_applies_upserts_and_deletes_in_order() -> None:
    values = [("upsert", 1, "a"), ("delete", 1, ""), ("delete", 2, ""), ("upsert", 2, "b"), ("upsert", 3, "c")]
    capture = SinkCapture(
        "copy", SinkDescription("postgres", "t", columns=("id", "name"), key_columns=("id",), to_row=_change), values
    )
    assert capture.final_rows() == {(2,): (2, "b"), (3,): (3, "c")}
    assert capture.keys_changed() == 3


def _change(value: tuple[str, int, str]) -> tuple[object, ...] | Delete:
    op, key, name = value
    return Delete((key,)) if op == "delete" else (key, name)


def test_a_tombstone_compares_by_the_key_it_deletes() -> None:
    """A null-value record (an upsert-kafka delete) is told apart by its key: a tombstone of another
    key is a mismatch, not an equal empty value."""
    row, key1, key2 = b'{"id":1,"n":2}', b'{"id":1}', b'{"id":2}'
    expected = [kafka_compared(key1, row), kafka_compared(key1, None)]
    same = compare_records(expected, [kafka_compared(key1, row), kafka_compared(key1, None)])
    assert (same.duplicates, same.missing, same.unexpected) == (0, 0, 0)
    wrong = compare_records(expected, [kafka_compared(key1, row), kafka_compared(key2, None)])
    assert (wrong.duplicates, wrong.missing, wrong.unexpected) == (0, 1, 1)
    assert '<tombstone> {"id":2}' in wrong.samples["unexpected"][0]

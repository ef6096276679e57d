"""The file sink's pure decisions: part file names, buckets, rolling, the snapshot, recovery."""

from __future__ import annotations

import itertools

import pytest

from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.operators.part_files import (
    AlreadyFinished,
    DiscardPart,
    FileFormat,
    FileSinkSnapshot,
    FinishPart,
    FoundInProgress,
    PartFileName,
    PartLost,
    PendingPartFile,
    RollingPolicy,
    UploadedPart,
    check_bucket,
    hourly_bucket,
    plan_part_recovery,
)
from weir.operators.twophase import LedgerSnapshot, PendingTransaction, TransactionId

TASK = TaskId(JobId("0123abcd0123abcd"), OperatorUid("files"), SubtaskIndex(2))
OTHER_SUBTASK = TaskId(TASK.job_id, TASK.operator_uid, SubtaskIndex(3))


def name(epoch: int, number: int = 0, bucket: str = "dt=2026-12-04/hour=05", task: TaskId = TASK) -> PartFileName:
    return PartFileName(task, bucket, CheckpointId(epoch), number, FileFormat.PARQUET)


# Names --------------------------------------------------------------------------------------------


def test_a_part_file_name_is_deterministic_and_names_its_subtask_and_epoch() -> None:
    part = name(7, 3)
    assert part.key == "dt=2026-12-04/hour=05/part-files-0123abcd0123abcd-2-7-3.parquet"
    assert part.in_progress_key(4) == "dt=2026-12-04/hour=05/.part-files-0123abcd0123abcd-2-7-3.parquet.4.inprogress"
    assert PartFileName.parse(part.key) == part
    assert PartFileName.parse_in_progress(part.in_progress_key(4)) == (part, 4)
    assert PartFileName.parse(part.in_progress_key(4)) is None
    assert PartFileName.parse_in_progress(part.key) is None
    assert part.txn == TransactionId.for_task(TASK, CheckpointId(7))


@pytest.mark.parametrize("uid", ["files", "my-sink", "a/b", "x~y", "100%", "sink-1-2-3", "ü"])
@pytest.mark.parametrize("job", ["0123abcd0123abcd", "job-1", "j-2-3"])
def test_any_uid_and_job_id_read_back_from_the_name(uid: str, job: str) -> None:
    task = TaskId(JobId(job), OperatorUid(uid), SubtaskIndex(11))
    for bucket in ("", "b", "dt=2026-12-04/hour=05"):
        part = PartFileName(task, bucket, CheckpointId(12), 4, FileFormat.JSONL)
        assert "/" not in part.basename
        assert PartFileName.parse(part.key) == part
        assert PartFileName.parse_in_progress(part.in_progress_key(3)) == (part, 3)


@pytest.mark.parametrize(
    "key",
    [
        "_SUCCESS",
        "dt=x/part-files-j-0-1.parquet",  # too few fields
        "part-files-0123-2-7-3.tsv",  # unknown format (csv, jsonl and parquet are known)
        "part-files-0123-02-7-3.parquet",  # leading zero: not the name the sink writes
        ".part-files-0123-2-7-3.parquet",  # hidden
        "part-files-0123-2-7-3.parquet.1.inprogress",  # in progress
        "x/part-a-b-c-1-2-3.parquet",  # a raw '-' inside a field
    ],
)
def test_other_files_are_not_part_files(key: str) -> None:
    assert PartFileName.parse(key) is None


@pytest.mark.parametrize("bucket", ["/abs", "a//b", "a/", "../up", "a/./b", ".hidden", "a/.b"])
def test_a_bucket_is_a_relative_folder_without_hidden_segments(bucket: str) -> None:
    with pytest.raises(ValueError, match="not a relative folder"):
        check_bucket(bucket)


def test_the_default_bucket_is_the_records_hour_in_utc() -> None:
    assert hourly_bucket(1_764_820_800_000) == "dt=2025-12-04/hour=04"  # 2025-12-04T04:00:00Z
    assert hourly_bucket(1_764_820_800_000 - 1) == "dt=2025-12-04/hour=03"
    assert check_bucket(hourly_bucket(0)) == "dt=1970-01-01/hour=00"


# Rolling ------------------------------------------------------------------------------------------


def test_a_part_file_rolls_at_its_size_or_its_age() -> None:
    policy = RollingPolicy(max_part_bytes=100, rollover_interval_ms=1000)
    assert not policy.should_roll(99, opened_at_ms=5000, now_ms=5999)
    assert policy.should_roll(100, opened_at_ms=5000, now_ms=5000)
    assert policy.should_roll(0, opened_at_ms=5000, now_ms=6000)
    assert policy.roll_due_at(5000) == 6000
    with pytest.raises(ValueError):
        RollingPolicy(max_part_bytes=0)
    with pytest.raises(ValueError):
        RollingPolicy(rollover_interval_ms=0)


# The snapshot -------------------------------------------------------------------------------------


def pending_file(epoch: int, number: int = 0, upload_id: str | None = "u", bucket: str = "b") -> PendingPartFile:
    """On S3 (an upload id) or, with ``upload_id=None``, in a directory, written by attempt 1."""
    parts = (UploadedPart(1, '"e1"'), UploadedPart(2, '"e2"')) if upload_id else ()
    attempt = None if upload_id else 1
    return PendingPartFile(name(epoch, number, bucket), upload_id, parts, size=10, records=3, attempt=attempt)


def snapshot(
    checkpoint: int, files: dict[int, tuple[PendingPartFile, ...]], at: dict[int, int] | None = None
) -> FileSinkSnapshot:
    at = at or {}
    pending = tuple(
        sorted(
            PendingTransaction(CheckpointId(at.get(epoch, epoch)), TransactionId.for_task(TASK, CheckpointId(epoch)))
            for epoch in files
        )
    )
    ledger = LedgerSnapshot(TASK, CheckpointId(checkpoint), pending)
    return FileSinkSnapshot(ledger, {CheckpointId(epoch): listed for epoch, listed in files.items()})


def test_the_snapshot_round_trips_as_versioned_json() -> None:
    taken = snapshot(9, {7: (pending_file(7), pending_file(7, 1, None)), 9: (pending_file(9, 0, "v", ""),)})
    data = taken.to_bytes()
    assert data.startswith(b'{"format":1,')
    assert FileSinkSnapshot.from_bytes(data) == taken


def test_a_snapshot_of_another_format_or_not_json_is_refused_in_one_line() -> None:
    with pytest.raises(SerializationError, match="format 2, this version reads 1"):
        FileSinkSnapshot.from_bytes(b'{"format":2}')
    with pytest.raises(SerializationError, match="not JSON"):
        FileSinkSnapshot.from_bytes(b"\x80\x04")


def test_the_snapshot_lists_files_for_exactly_the_ledgers_pending_epochs() -> None:
    ledger = LedgerSnapshot(
        TASK, CheckpointId(5), (PendingTransaction(CheckpointId(5), TransactionId.for_task(TASK, CheckpointId(5))),)
    )
    with pytest.raises(ValueError, match="ledger has"):
        FileSinkSnapshot(ledger, {})
    with pytest.raises(ValueError, match="is not of epoch 5"):
        FileSinkSnapshot(ledger, {CheckpointId(5): (pending_file(4),)})


# Recovery -----------------------------------------------------------------------------------------


def found(
    epoch: int, number: int = 0, upload_id: str | None = "u", bucket: str = "b", attempt: int = 1
) -> FoundInProgress:
    """An S3 upload or, with ``upload_id=None``, a directory's hidden file of ``attempt``."""
    return FoundInProgress(name(epoch, number, bucket), upload_id, None if upload_id else attempt)


def test_without_a_snapshot_every_unfinished_part_file_is_discarded() -> None:
    unfinished = [found(1), found(2, 1), found(3, 0, None)]
    actions = plan_part_recovery(TASK, None, unfinished, frozenset())
    assert actions == tuple(DiscardPart(f) for f in sorted(unfinished, key=lambda f: f.name))


def test_listed_files_are_finished_or_found_finished_and_the_rest_discarded() -> None:
    listed_open, listed_done, listed_gone = pending_file(4), pending_file(4, 1), pending_file(5, 0, "w")
    restored = snapshot(5, {4: (listed_open, listed_done), 5: (listed_gone,)})
    after = found(6)  # written after checkpoint 5: not part of the restored output
    stale = found(4, 0, "older-upload")  # another upload of a listed name (a retried start)
    actions = plan_part_recovery(TASK, restored, [after, found(4), stale], frozenset({listed_done.name.key}))
    assert actions == (
        DiscardPart(stale),
        DiscardPart(after),
        FinishPart(listed_open),
        AlreadyFinished(listed_done),
        PartLost(listed_gone),
    )


def test_directory_files_are_matched_by_name_and_the_attempt_that_wrote_them() -> None:
    listed = pending_file(3, 0, None)
    zombie = found(3, 0, None, attempt=2)  # the same part file, written by a later attempt
    actions = plan_part_recovery(TASK, snapshot(3, {3: (listed,)}), [found(3, 0, None), zombie], frozenset())
    assert actions == (DiscardPart(zombie), FinishPart(listed))


def test_a_committable_is_an_upload_or_a_hidden_file_never_both() -> None:
    with pytest.raises(ValueError, match="either an S3 upload id or a directory's attempt"):
        PendingPartFile(name(1), "u", attempt=1)
    with pytest.raises(ValueError, match="either an S3 upload id or a directory's attempt"):
        PendingPartFile(name(1))


def test_recovery_refuses_another_subtasks_files_or_snapshot() -> None:
    with pytest.raises(ValueError, match="belongs to another subtask"):
        plan_part_recovery(TASK, None, [FoundInProgress(name(1, task=OTHER_SUBTASK))], frozenset())
    other = FileSinkSnapshot(LedgerSnapshot(OTHER_SUBTASK, CheckpointId(1), ()), {})
    with pytest.raises(ValueError, match="the snapshot is of"):
        plan_part_recovery(TASK, other, [], frozenset())


def test_every_listed_file_gets_exactly_one_decision_and_unlisted_ones_are_discarded() -> None:
    """Exhaustive over small worlds: each listed file found unfinished, finished, or neither; each
    unfinished one listed or not."""
    listed = [pending_file(2, n) for n in range(3)]
    restored = snapshot(2, {2: tuple(listed)})
    states = ("unfinished", "finished", "gone")
    for combo in itertools.product(states, repeat=len(listed)):
        for extra in (0, 1, 2):
            unfinished = [found(2, n) for n, state in enumerate(combo) if state == "unfinished"]
            strays = [found(3, n) for n in range(extra)]
            finished = frozenset(f.name.key for f, state in zip(listed, combo, strict=True) if state == "finished")
            actions = plan_part_recovery(TASK, restored, unfinished + strays, finished)
            assert [a for a in actions if isinstance(a, DiscardPart)] == [DiscardPart(s) for s in strays]
            by_state = {"unfinished": FinishPart, "finished": AlreadyFinished, "gone": PartLost}
            decided = [a for a in actions if not isinstance(a, DiscardPart)]
            assert decided == [by_state[state](f) for f, state in zip(listed, combo, strict=True)]
            # discards come first: epochs after the snapshot are reused by the next writes
            kinds = [isinstance(a, DiscardPart) for a in actions]
            assert kinds == sorted(kinds, reverse=True)


@pytest.mark.parametrize(
    "key",
    [
        "b/.part-files-0123-2-7-3.parquet.inprogress",  # no attempt
        "b/.part-files-0123-2-7-3.parquet.01.inprogress",  # not the name the sink writes
        "b/part-files-0123-2-7-3.parquet.1.inprogress",  # not hidden
        "b/.part-files-0123-2-7-3.parquet.1.tmp",  # another suffix
        "b/.other.1.inprogress",  # not a part file
    ],
)
def test_other_hidden_files_are_not_in_progress_part_files(key: str) -> None:
    assert PartFileName.parse_in_progress(key) is None

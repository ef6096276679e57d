"""A new job under high availability exists once the job index names it (``weir.jobmanager.job_index``):
a deposed leader's creation is refused by the index's conditional write, withdrawn, and never taken over."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.jobmanager.conftest import JOB, MakeHarness
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.ids import JobId
from weir.core.paths import CheckpointPaths
from weir.core.states import JobStatus
from weir.jobmanager.errors import JobNotCreatedError
from weir.jobmanager.job_index import JOB_INDEX_KEY, JobIndex, decode_index
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.records import JobRecord, JobSubmission
from weir.jobmanager.submission import SubmitRequest

PATHS = CheckpointPaths()


def record(job_id: str) -> JobRecord:
    return JobRecord(JobSubmission(job_id, "sums", "sums.py", b"", {}, 1, 100.0), 1, JobStatus.RUNNING, None, {})


def leader(storage: FileCheckpointStorage, term: int) -> JobRecordStore:
    store = JobRecordStore(storage, PATHS, lambda: 0.0, conditional=True)
    store.take_over_index(term)
    return store


def job_records(storage: FileCheckpointStorage) -> list[str]:
    return sorted(key for key, _ in storage.list("") if PATHS.job_of_record(key) is not None)


def test_a_deposed_leaders_new_job_is_refused_by_the_index_withdrawn_and_never_taken_over(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(tmp_path)
    old = leader(storage, 1)
    assert old.write_now(record("job-a"))
    assert decode_index(storage.get_bytes(JOB_INDEX_KEY)) == JobIndex(1, frozenset({"job-a"}))

    new = leader(storage, 2)
    # The deposed leader, paused after its lease check, creates job-b: the record lands (its key is
    # new: nothing to fence), the index entry does not (its version is gone), so the record goes.
    assert not old.write_now(record("job-b"))
    assert old.withdrawn("job-b") and not old.withdrawn("job-a")
    assert job_records(storage) == [PATHS.job_record(JobId("job-a"))]
    assert decode_index(storage.get_bytes(JOB_INDEX_KEY)) == JobIndex(2, frozenset({"job-a"}))
    assert not old.write_now(record("job-b")), "a withdrawn job is never written again"
    assert job_records(storage) == [PATHS.job_record(JobId("job-a"))]
    # Its jobs created before stay: the new leader takes job-a over.
    assert new.registered_keys(JobIndex(2, frozenset({"job-a"}))) == [PATHS.job_record(JobId("job-a"))]
    # And the new leader creates jobs as before.
    assert new.write_now(record("job-c"))
    assert decode_index(storage.get_bytes(JOB_INDEX_KEY)) == JobIndex(2, frozenset({"job-a", "job-c"}))


def test_a_record_no_index_names_is_deleted_by_the_next_takeover_with_its_artifact(tmp_path: Path) -> None:
    """The deposed leader died between its late record write and its withdrawal: the record (and the
    artifact written before it) is left; the next takeover deletes both and never takes the job over."""
    storage = FileCheckpointStorage(tmp_path)
    old = leader(storage, 1)
    assert old.write_now(record("job-a"))
    storage.put_bytes(PATHS.job_artifact(JobId("job-late")), b"zip")
    storage.put_bytes(PATHS.job_record(JobId("job-late")), record("job-late").to_json())
    new = JobRecordStore(storage, PATHS, lambda: 0.0, conditional=True)
    index = new.take_over_index(2)
    assert new.registered_keys(index) == [PATHS.job_record(JobId("job-a"))]
    assert job_records(storage) == [PATHS.job_record(JobId("job-a"))]
    assert not storage.exists(PATHS.job_artifact(JobId("job-late")))


def test_the_first_takeover_adopts_the_records_written_before_the_index_existed(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(tmp_path)
    plain = JobRecordStore(storage, PATHS, lambda: 0.0)  # a Weir without the index, or no high availability
    assert plain.write_now(record("job-a")) and plain.write_now(record("job-b"))
    assert not storage.exists(JOB_INDEX_KEY)
    new = JobRecordStore(storage, PATHS, lambda: 0.0, conditional=True)
    index = new.take_over_index(1)
    assert index == JobIndex(1, frozenset({"job-a", "job-b"}))
    assert new.registered_keys(index) == [PATHS.job_record(JobId(j)) for j in ("job-a", "job-b")]


def test_a_newer_leaders_index_is_never_taken_over_by_an_older_term(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(tmp_path)
    leader(storage, 3)
    with pytest.raises(ValueError, match="term 2 cannot"):
        leader(storage, 2)


def test_a_submission_to_a_deposed_leader_is_refused_and_leaves_nothing(make_harness: MakeHarness) -> None:
    """Before the job index, the deposed leader's record of a new job landed, the submission was
    answered with its id, and the next takeover started the job; now the submission is refused in one
    line, nothing of it is in storage, and no later leader runs it."""
    first = make_harness(leader_term=lambda: 1)
    assert first.jm.recover_jobs() == 0
    make_harness(first.storage, leader_term=lambda: 2)  # takes the lease and the job index over
    with pytest.raises(JobNotCreatedError, match="was not created: this JobManager stopped leading"):
        first.jm.submit(SubmitRequest("j", "j.py", JOB))
    assert first.jm.jobs == {}
    assert job_records(first.storage) == []
    third = make_harness(first.storage, leader_term=lambda: 3)
    assert third.jm.recover_jobs() == 0 and third.jm.recover_history() == 0
    assert third.jm.jobs == {}


def test_a_submission_to_the_leader_is_answered_once_the_index_names_the_job(make_harness: MakeHarness) -> None:
    first = make_harness(leader_term=lambda: 1)
    job_id = first.jm.submit(SubmitRequest("j", "j.py", JOB))
    assert job_id in decode_index(first.storage.get_bytes(JOB_INDEX_KEY)).job_ids
    second = make_harness(first.storage, leader_term=lambda: 2)
    assert second.jm.recover_jobs() == 1 and list(second.jm.jobs) == [job_id]

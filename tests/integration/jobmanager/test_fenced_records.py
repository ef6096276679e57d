"""High availability against the real S3 server (versitygw): a deposed leader's late writes.

The lease is checked before each storage write, not atomically with it. Job records are therefore
written conditionally (``If-Match`` the version last read or written, ``If-None-Match: *`` for a new
job's), and a new leader rewrites each record it takes over before acting: the deposed leader's
write over the old version is refused by the server. Its late checkpoint metadata does land, and the
next takeover ignores it (the fence in the record)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.unit.jobmanager.conftest import MakeHarness, make_harness  # noqa: F401 (a fixture)
from weir.connectors.object_storage import S3CheckpointStorage
from weir.core.config import Endpoints
from weir.core.ids import CheckpointId, JobId
from weir.core.paths import CheckpointPaths
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing.pending import TaskAckMetrics
from weir.jobmanager.checkpointing.term_fences import TermFence
from weir.jobmanager.job_index import JOB_INDEX_KEY, JobIndex, decode_index
from weir.jobmanager.messages import CheckpointAck
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.records import JobRecord, JobSubmission

pytestmark = pytest.mark.integration


@pytest.fixture
def s3(services: Endpoints) -> Iterator[S3CheckpointStorage]:
    store = S3CheckpointStorage(services, services.s3_bucket, f"it-fenced-records/{uuid.uuid4().hex[:12]}")
    yield store
    store.delete(key for key, _ in store.list(""))


def record(attempt: int, fences: tuple[TermFence, ...] = ()) -> JobRecord:
    submission = JobSubmission("job-1", "sums", "sums.py", b"", {}, 1, 100.0)
    return JobRecord(submission, attempt, JobStatus.RUNNING, None, {}, term_fences=fences)


def test_a_stale_leaders_conditional_record_write_is_refused_by_the_s3_server(s3: S3CheckpointStorage) -> None:
    paths = CheckpointPaths()
    key = paths.job_record(JobId("job-1"))
    old = JobRecordStore(s3, paths, lambda: 0.0, conditional=True)
    old.take_over_index(1)
    assert old.write_now(record(1))  # created: If-None-Match: *
    assert old.write_now(record(2))  # If-Match its own version

    new = JobRecordStore(s3, paths, lambda: 0.0, conditional=True)
    new.take_over_index(2)
    taken = new.load(key)
    assert taken.attempt == 2
    fenced = record(2, (TermFence(2, None),))
    assert new.write_now(fenced)

    # The deposed leader, paused between its lease check and its write, wakes up: refused.
    assert not old.write_now(record(3))
    assert JobRecord.from_json(s3.get_bytes(key)) == fenced
    # Nor can a writer that never read the record create it over the new leader's.
    blind = JobRecordStore(s3, paths, lambda: 0.0, conditional=True)
    assert not blind.write_now(record(9))
    assert JobRecord.from_json(s3.get_bytes(key)) == fenced


def test_a_checkpoint_a_deposed_leader_lands_late_on_s3_is_never_restored(
    make_harness: MakeHarness,  # noqa: F811
    s3: S3CheckpointStorage,
) -> None:
    first = make_harness(s3, leader_term=lambda: 1)
    job = first.job({"checkpointing.interval": "1s", "restart.strategy": "fixed-delay", "restart.delay": "1s"})
    with first.jm.lock:
        first.jm.executor.execute(job, job.lifecycle.tasks_running(first.clock(), job.all_task_ids(), restored=False))
        first.clock.advance(1.5)
        first.jm.executor.execute(job, job.lifecycle.tick(first.clock()))
    (completed_id,) = job.coordinator.pending_ids
    ack = CheckpointAck("job-1", "gen", 0, job.attempt, completed_id, (), b"a", TaskAckMetrics())
    first.jm.acknowledge_checkpoint(ack)
    with first.jm.lock:
        first.clock.advance(1.0)
        first.jm.executor.execute(job, job.lifecycle.tick(first.clock()))
    (late_id,) = job.coordinator.pending_ids
    assert first.jm.records.save(job).result()

    second = make_harness(s3, leader_term=lambda: 2)
    assert second.jm.recover_jobs() == 1

    first.jm.acknowledge_checkpoint(CheckpointAck("job-1", "gen", 0, job.attempt, late_id, (), b"b", TaskAckMetrics()))
    assert s3.exists(first.jm.paths.metadata(job.coordinator.job_id, CheckpointId(late_id)))
    assert not first.jm.records.save(job).result(), "the S3 server took the deposed leader's record write"

    third = make_harness(s3, leader_term=lambda: 3)
    assert third.jm.recover_jobs() == 1
    assert [c.checkpoint_id for c in third.jm.jobs["job-1"].coordinator.store.all()] == [completed_id]


def test_a_deposed_leaders_new_job_is_refused_by_the_s3_servers_job_index_and_withdrawn(
    s3: S3CheckpointStorage,
) -> None:
    """A new job's first record has no version to fence (``If-None-Match: *`` on a new key lands): the
    job exists once the job index names it, and the index is written ``If-Match`` the version the
    leader last wrote, which the new leader's takeover replaced: the S3 server refuses it."""
    paths = CheckpointPaths()
    old = JobRecordStore(s3, paths, lambda: 0.0, conditional=True)
    old.take_over_index(1)
    assert old.write_now(record(1))
    new = JobRecordStore(s3, paths, lambda: 0.0, conditional=True)
    index = new.take_over_index(2)

    late = JobRecord(JobSubmission("job-late", "sums", "sums.py", b"", {}, 1, 100.0), 1, JobStatus.RUNNING, None, {})
    assert not old.write_now(late)
    assert old.withdrawn("job-late")
    assert not s3.exists(paths.job_record(JobId("job-late")))
    assert decode_index(s3.get_bytes(JOB_INDEX_KEY)) == JobIndex(2, frozenset({"job-1"}))
    assert new.registered_keys(index) == [paths.job_record(JobId("job-1"))]

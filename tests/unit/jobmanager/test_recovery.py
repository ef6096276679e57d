"""Recovery of a restarted JobManager from job records and checkpoint metadata."""

from __future__ import annotations

import pytest

from tests.unit.jobmanager.conftest import TM_A, MakeHarness
from weir.core.checkpointing import CheckpointKind
from weir.core.errors import ServiceUnavailableError, UnknownJobError
from weir.core.failures import Failure
from weir.core.ids import CheckpointId, TaskManagerId
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing.pending import StateObject, TaskAckMetrics
from weir.jobmanager.errors import JobManagerNotReadyError
from weir.jobmanager.messages import CheckpointAck, Heartbeat, JobAttempt, TaskProgress
from weir.jobmanager.records import JobRecord


def test_a_running_job_restarts_as_soon_as_the_taskmanagers_slots_are_back(make_harness: MakeHarness) -> None:
    first = make_harness()
    job = first.job()
    assert first.jm.records.save(job).result()
    second = make_harness(first.storage, taskmanagers=())
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs["job-1"]
    assert recovered.status is JobStatus.RESTARTING and recovered.attempt == job.attempt
    assert recovered.lifecycle.restart_at == second.clock()  # due at once, no fixed wait
    assert second.resolver.resolved == []

    second.jm.tick()  # no TaskManager registered yet: the restart waits for slots
    assert recovered.status is JobStatus.RESTARTING and second.gateway.named("deploy") == []
    second.jm.register_taskmanager("tm-a", TM_A, 4, 0, "tm-a-2")
    # Its first heartbeat tells it to stop the old attempt's tasks ...
    answer = second.jm.heartbeat(Heartbeat("tm-a", (TaskProgress("job-1", "window", 0, job.attempt, 0, 0),)))
    assert answer.cancel == (JobAttempt("job-1", job.attempt),)
    second.jm.tick()  # ... and the restart is placed on its slots at the next tick, not after a wait
    assert recovered.status is JobStatus.RUNNING and recovered.attempt == job.attempt + 1
    assert {attempt for *_, attempt in second.gateway.named("deploy")} == {job.attempt + 1}


def test_a_failed_job_whose_transactions_were_not_resolved_gets_them_resolved(make_harness: MakeHarness) -> None:
    first = make_harness()
    job = first.job({"restart.strategy": "none"})
    first.resolver.error = ServiceUnavailableError("postgres is down")  # then the JobManager dies
    first.fail(job)
    first.jm.records.flush()
    assert job.status is JobStatus.FAILED and job.lifecycle.unresolved_end
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs["job-1"]  # its resolution is retried at once
    assert second.resolver.resolved == [("job-1", job.attempt + 1)]
    assert recovered.status is JobStatus.FAILED and not recovered.lifecycle.unresolved_end


def test_a_finished_job_is_only_listed_once_the_history_is_loaded(make_harness: MakeHarness) -> None:
    first = make_harness()
    job = first.job()
    first.finish(job)
    first.jm.records.flush()
    assert job.status is JobStatus.FINISHED
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 0  # history: not before the JobManager serves
    assert "job-1" not in second.jm.jobs
    with pytest.raises(JobManagerNotReadyError, match="still loading ended job job-1"):
        second.jm.job_status("job-1")
    with pytest.raises(UnknownJobError):
        second.jm.job_status("job-2")  # a job with no record is unknown, loading or not
    assert second.jm.recover_history() == 1
    assert second.jm.jobs["job-1"].status is JobStatus.FINISHED and second.resolver.resolved == []
    assert second.jm.job_status("job-1").summary.status is JobStatus.FINISHED


def test_the_jobs_that_need_the_jobmanager_are_taken_over_before_it_serves_and_history_after(
    make_harness: MakeHarness,
) -> None:
    """A checkpoint storage of a long-lived cluster holds many ended jobs: the JobManager killed in a
    chaos run spent 15 s loading ~130 of them before it restarted the one running job."""
    first = make_harness()
    down = ServiceUnavailableError("postgres is down")
    first.job(job_id="running")
    first.resolver.error = down
    first.jm.cancel(first.job(job_id="cancelling").job_id)
    first.fail(first.job({"restart.strategy": "none"}, job_id="failed-unresolved"))
    first.resolver.error = None
    first.fail(first.job({"restart.strategy": "none"}, job_id="failed-resolved"))
    first.finish(first.job(job_id="finished"))
    first.jm.cancel(first.job(job_id="canceled").job_id)
    statuses = {job_id: job.status for job_id, job in first.jm.jobs.items()}
    assert statuses == {
        "running": JobStatus.RUNNING,
        "cancelling": JobStatus.CANCELLING,
        "failed-unresolved": JobStatus.FAILED,
        "failed-resolved": JobStatus.FAILED,
        "finished": JobStatus.FINISHED,
        "canceled": JobStatus.CANCELED,
    }
    first.jm.records.flush()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 3
    assert sorted(second.jm.jobs) == ["cancelling", "failed-unresolved", "running"]
    assert second.jm.recover_history() == 3
    assert {job_id: job.status for job_id, job in second.jm.jobs.items()} == {
        **statuses,
        "running": JobStatus.RESTARTING,  # restarted once its old attempt's tasks were told to stop
        "cancelling": JobStatus.CANCELED,  # its resolution ran at once
    }
    assert second.jm.recover_history() == 0


def test_a_record_that_cannot_be_read_is_left_alone(make_harness: MakeHarness) -> None:
    h = make_harness()
    h.storage.put_bytes("job-9/_job", b"not json")
    assert h.jm.recover_jobs() == 0
    assert h.storage.get_bytes("job-9/_job") == b"not json"
    assert h.jm.jobs == {}


def test_a_job_whose_checkpoint_metadata_cannot_be_read_is_left_alone_and_the_jobmanager_starts(
    make_harness: MakeHarness,
) -> None:
    """Metadata another Weir version wrote (a pickle naming a module that moved) made the JobManager
    exit at start, in a restart loop; restoring an older checkpoint instead could roll back what
    the sinks committed for the unreadable one."""
    first = make_harness()
    job = first.job()
    assert first.jm.records.save(job).result()
    metadata = first.jm.paths.metadata_key_fn()(job.coordinator.job_id, CheckpointId(3), CheckpointKind.CHECKPOINT)
    first.storage.put_bytes(metadata, b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x08weir.ids\x94.")
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 0
    assert "job-1" not in second.jm.jobs
    assert second.storage.get_bytes(metadata).startswith(b"\x80\x04")  # nothing deleted


def test_the_uploads_of_a_checkpoint_the_dead_jobmanager_never_completed_are_deleted_on_recovery(
    make_harness: MakeHarness,
) -> None:
    """Checkpoint 1 completed; 2 was in flight when the JobManager died: its task had uploaded a
    shared SST and a private file, the acknowledgement never arrived. Recovery keeps 1, deletes 2's."""
    first = make_harness()
    job = first.job({"checkpointing.interval": "1s", "restart.strategy": "fixed-delay", "restart.delay": "1s"})
    paths, job_id = first.jm.paths, job.coordinator.job_id

    def upload(checkpoint_id: int, name: str, *, shared: bool) -> StateObject:
        cid = CheckpointId(checkpoint_id)
        key = (
            paths.shared_sst(job_id, TaskManagerId("tm-a"), "db1", cid, name)
            if shared
            else paths.db_file(job_id, cid, TaskManagerId("tm-a"), "db1", checkpoint_id, name)
        )
        first.storage.put_bytes(key, b"x" * 100)
        return StateObject(key, 100)

    with first.jm.lock:
        first.jm.executor.execute(job, job.lifecycle.tasks_running(first.clock(), job.all_task_ids(), restored=False))
        first.clock.advance(1.5)
        first.jm.executor.execute(job, job.lifecycle.tick(first.clock()))
    (pending_id,) = job.coordinator.pending_ids
    retained = (upload(pending_id, "a.sst", shared=True), upload(pending_id, "MANIFEST", shared=False))
    first.jm.acknowledge_checkpoint(
        CheckpointAck("job-1", "gen", 0, job.attempt, pending_id, retained, b"offsets", TaskAckMetrics())
    )
    assert job.coordinator.store.latest() is not None
    with first.jm.lock:
        first.clock.advance(1.0)
        first.jm.executor.execute(job, job.lifecycle.tick(first.clock()))
    (crashed_id,) = job.coordinator.pending_ids
    crashed = (upload(crashed_id, "b.sst", shared=True), upload(crashed_id, "MANIFEST", shared=False))
    assert first.jm.records.save(job).result()  # then the JobManager dies

    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    left = {key for key, _ in second.storage.list(paths.job_dir(job_id))}
    assert {o.key for o in retained} <= left
    assert {o.key for o in crashed}.isdisjoint(left)
    assert paths.job_record(job_id) in left and paths.metadata(job_id, CheckpointId(pending_id)) in left
    recovered = second.jm.jobs["job-1"].coordinator.store.latest()
    assert recovered is not None and recovered.checkpoint_id == pending_id


def test_a_recovered_job_reports_the_restarts_it_had_under_the_jobmanager_before(make_harness: MakeHarness) -> None:
    """Found by the chaos run: a TaskManager paused past the heartbeat timeout restarted the job, the
    JobManager was then killed, and the job it took over reported 0 restarts ("since it was submitted")."""
    first = make_harness()
    job = first.job({"restart.strategy": "fixed-delay", "restart.delay": "1s"})
    with first.jm.lock:
        first.jm.failover.fail_over(job, Failure.internal("TaskManager lost"), first.clock())
    assert job.restarts == 1 and first.jm.records.save(job).result()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs["job-1"]
    assert recovered.restarts == 1
    assert recovered.restart_strategy.restart_count == 0  # its budget starts over, as Flink's does


def test_a_checkpoint_a_deposed_leader_completes_after_a_takeover_is_never_restored(
    make_harness: MakeHarness,
) -> None:
    """High availability: the leader of term 1 completed checkpoint A and was persisting B when it
    paused; the leader of term 2 took the job over (restoring A, fence (2, A) in the record). The
    deposed leader then lands B's metadata (the one write its lease check let through) but not its job
    record (conditional over a version that is gone). The next takeover restores A, never B."""
    first = make_harness(leader_term=lambda: 1)
    job = first.job({"checkpointing.interval": "1s", "restart.strategy": "fixed-delay", "restart.delay": "1s"})
    with first.jm.lock:
        first.jm.executor.execute(job, job.lifecycle.tasks_running(first.clock(), job.all_task_ids(), restored=False))
        first.clock.advance(1.5)
        first.jm.executor.execute(job, job.lifecycle.tick(first.clock()))
    (completed_id,) = job.coordinator.pending_ids
    first.jm.acknowledge_checkpoint(
        CheckpointAck("job-1", "gen", 0, job.attempt, completed_id, (), b"a", TaskAckMetrics())
    )
    with first.jm.lock:
        first.clock.advance(1.0)
        first.jm.executor.execute(job, job.lifecycle.tick(first.clock()))
    (late_id,) = job.coordinator.pending_ids
    assert first.jm.records.save(job).result()

    second = make_harness(first.storage, leader_term=lambda: 2)
    assert second.jm.recover_jobs() == 1
    taken = second.jm.jobs["job-1"].coordinator.store.latest()
    assert taken is not None and taken.checkpoint_id == completed_id

    # The deposed leader wakes up: its late metadata lands, its job record does not.
    first.jm.acknowledge_checkpoint(CheckpointAck("job-1", "gen", 0, job.attempt, late_id, (), b"b", TaskAckMetrics()))
    paths = first.jm.paths
    late_metadata = paths.metadata(job.coordinator.job_id, CheckpointId(late_id))
    assert first.storage.exists(late_metadata), "the late metadata must land for the test to prove anything"
    assert not first.jm.records.save(job).result()

    third = make_harness(first.storage, leader_term=lambda: 3)
    assert third.jm.recover_jobs() == 1
    restored = third.jm.jobs["job-1"].coordinator.store.latest()
    assert restored is not None and restored.checkpoint_id == completed_id
    assert [c.checkpoint_id for c in third.jm.jobs["job-1"].coordinator.store.all()] == [completed_id]


def test_without_high_availability_records_are_written_unconditionally_and_no_fence_is_left(
    make_harness: MakeHarness,
) -> None:
    first = make_harness()
    job = first.job()
    assert first.jm.records.save(job).result()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    assert second.jm.jobs["job-1"].term_fences == ()
    assert first.jm.records.save(job).result()  # a restarted JobManager has no competitor to fence


def test_a_deposed_leaders_record_write_landing_during_the_takeover_is_read_again_before_acting(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deposed leader's late record write lands between the new leader's read and its takeover
    write: that write is refused, the new leader reads the record again (with what landed) and takes
    the job over from it, its fence in the record."""
    first = make_harness(leader_term=lambda: 1)
    job = first.job()
    assert first.jm.records.save(job).result()
    second = make_harness(first.storage, leader_term=lambda: 2)
    real_write = second.jm.records.write_now
    late = {"restarts": 0}

    def write_after_a_late_one(record: JobRecord) -> bool:
        if not late["restarts"]:
            job.restarts_under_earlier_jobmanagers = late["restarts"] = 5
            assert first.jm.records.save(job).result(), "the late write must land for the test to prove anything"
        return real_write(record)

    monkeypatch.setattr(second.jm.records, "write_now", write_after_a_late_one)
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs["job-1"]
    assert recovered.restarts_under_earlier_jobmanagers >= 5  # taken over from the record as it is now
    assert [f.term for f in recovered.term_fences] == [2]
    stored = JobRecord.from_json(first.storage.get_bytes(first.jm.paths.job_record(recovered.coordinator.job_id)))
    assert [f.term for f in stored.term_fences] == [2]
    assert not first.jm.records.save(job).result()


def test_a_full_checkpoint_is_still_listed_as_full_by_the_jobmanager_that_takes_the_job_over(
    make_harness: MakeHarness,
) -> None:
    """`weir checkpoint --full`: its metadata says full, so a JobManager that reads it back from storage
    (restart or takeover) lists it as full, and the incremental one after it as not."""
    first = make_harness()
    job = first.job({"checkpointing.interval": "1h", "restart.strategy": "none"})
    with first.jm.lock:
        first.jm.executor.execute(job, job.lifecycle.tasks_running(first.clock(), job.all_task_ids(), restored=False))
    ids = []
    for full in (True, False):
        cid = first.jm.trigger_checkpoint(job.job_id, full=full)
        ack = CheckpointAck(job.job_id, "gen", 0, job.attempt, cid, (), b"{}", TaskAckMetrics())
        first.jm.acknowledge_checkpoint(ack)
        ids.append(cid)
    before = {c.checkpoint_id: c.full for c in first.jm.list_checkpoints(job.job_id).checkpoints}
    assert before == {ids[0]: True, ids[1]: False}
    first.jm.records.save(job).result()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    retained = second.jm.jobs["job-1"].coordinator.store.all()
    after = {c.checkpoint_id: c.full for c in second.jm.list_checkpoints(job.job_id).checkpoints}
    assert after == {c.checkpoint_id: c.checkpoint_id == ids[0] for c in retained} and set(ids) <= set(after)


def test_a_deposed_leaders_late_write_of_an_ended_jobs_record_is_refused_after_the_takeover(
    make_harness: MakeHarness,
) -> None:
    """High availability: an ended job (history, loaded after the new leader serves) gets its record
    rewritten with the new leader's fence too, so the deposed leader's late write of that record
    (conditional on the version it wrote) is refused, and the record stays the new leader's."""
    first = make_harness(leader_term=lambda: 1)
    job = first.job({"restart.strategy": "none"})
    first.finish(job)
    first.jm.records.flush()
    assert job.status is JobStatus.FINISHED and not job.lifecycle.unresolved_end
    assert first.jm.records.save(job).result()
    second = make_harness(first.storage, leader_term=lambda: 2)
    assert second.jm.recover_jobs() == 0 and second.jm.recover_history() == 1  # ended and resolved: history
    assert [f.term for f in second.jm.jobs["job-1"].term_fences] == [2]
    key = first.jm.paths.job_record(job.coordinator.job_id)
    taken_over = first.storage.get_bytes(key)
    assert not first.jm.records.save(job).result()  # the deposed leader's late write
    assert first.storage.get_bytes(key) == taken_over
    assert [f.term for f in JobRecord.from_json(taken_over).term_fences] == [2]

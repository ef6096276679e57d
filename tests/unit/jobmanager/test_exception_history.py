"""The exception history: a bounded value, filled where the JobManager learns of a failure (a task's
FAILED report, a lost TaskManager, a failed deployment) and kept in the job record across a restart."""

from __future__ import annotations

import json

import pytest

from tests.unit.jobmanager.conftest import MakeHarness
from weir.core.errors import Fault, SerializationError
from weir.core.failures import Failure
from weir.core.states import JobStatus, TaskState
from weir.jobmanager.exception_history import HISTORY_SIZE, ExceptionEntry, ExceptionHistory
from weir.jobmanager.messages import TaskStateReport
from weir.jobmanager.records import JobRecord, JobSubmission


def entry(n: int) -> ExceptionEntry:
    return ExceptionEntry(Failure("E", f"failure {n}", Fault.USER, True), timestamp=float(n), attempt=n)


# The value -----------------------------------------------------------------------------------------


def test_the_newest_entry_comes_first_and_the_oldest_goes_beyond_the_capacity() -> None:
    history = ExceptionHistory(capacity=3)
    for n in range(1, 6):
        history = history.add(entry(n))
    assert [e.attempt for e in history.entries] == [5, 4, 3]
    assert ExceptionHistory().capacity == HISTORY_SIZE == 100


def test_latest_says_whether_older_entries_were_left_out() -> None:
    history = ExceptionHistory((entry(3), entry(2), entry(1)))
    assert history.latest(2) == ((entry(3), entry(2)), True)
    assert history.latest(3) == ((entry(3), entry(2), entry(1)), False)
    assert history.latest(50) == ((entry(3), entry(2), entry(1)), False)
    assert ExceptionHistory().latest(20) == ((), False)


def test_a_history_read_back_longer_than_its_capacity_keeps_the_newest() -> None:
    assert ExceptionHistory((entry(3), entry(2), entry(1)), capacity=2).entries == (entry(3), entry(2))
    with pytest.raises(ValueError, match="at least one"):
        ExceptionHistory(capacity=0)


def test_adding_never_changes_the_history_it_was_added_to() -> None:
    empty = ExceptionHistory()
    assert empty.add(entry(1)).entries == (entry(1),) and empty.entries == ()


# Where failures are recorded -----------------------------------------------------------------------


def failed(vertex_uid: str, subtask: int, attempt: int, failure: Failure) -> TaskStateReport:
    return TaskStateReport("job-1", vertex_uid, subtask, attempt, TaskState.FAILED, failure, 0, 0, False)


def test_a_failed_task_is_recorded_with_its_own_failure_task_attempt_taskmanager_and_time(
    make_harness: MakeHarness,
) -> None:
    h = make_harness()
    job = h.job()
    h.clock.advance(5.0)
    cause = Failure("ZeroDivisionError", "division by zero", Fault.USER, True)
    h.jm.report_task_state(failed("gen", 0, job.attempt, cause))
    assert job.status is JobStatus.RESTARTING
    (recorded,) = h.jm.exception_history("job-1").entries
    assert recorded == ExceptionEntry(cause, h.clock(), 1, "gen", 0, "tm-a")
    assert job.failure is not None and job.failure.message.startswith("task gen#0 failed: ")  # the job's own


def test_a_report_of_an_older_attempt_or_of_a_restarting_job_is_not_recorded(make_harness: MakeHarness) -> None:
    h = make_harness()
    job = h.job()
    h.jm.report_task_state(failed("gen", 0, job.attempt + 1, Failure.internal("from the future")))
    assert h.jm.exception_history("job-1").entries == ()
    h.jm.report_task_state(failed("gen", 0, job.attempt, Failure.internal("first")))
    h.jm.report_task_state(failed("gen", 0, job.attempt, Failure.internal("the job is restarting already")))
    assert [e.failure.message for e in h.jm.exception_history("job-1").entries] == ["first"]


def test_a_lost_taskmanager_is_recorded_without_a_task(make_harness: MakeHarness) -> None:
    h = make_harness()
    job = h.job()
    h.jm.register_taskmanager("tm-a", "tm-a:6124", 4, 0, incarnation="second")  # restarted: its tasks are gone
    (recorded,) = h.jm.exception_history("job-1").entries
    assert (recorded.vertex_uid, recorded.subtask, recorded.taskmanager_id, recorded.attempt) == (
        None,
        None,
        "tm-a",
        job.attempt,
    )
    assert recorded.failure.fault is Fault.INTERNAL and "TaskManager tm-a lost" in recorded.failure.message


def test_the_history_survives_a_jobmanager_restart(make_harness: MakeHarness) -> None:
    first = make_harness()
    job = first.job()
    cause = Failure("ValueError", "bad input", Fault.USER, True)
    first.jm.report_task_state(failed("gen", 0, job.attempt, cause))  # fail_over saves the record
    first.jm.records.flush()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    assert second.jm.exception_history("job-1") == first.jm.exception_history("job-1")
    assert second.jm.exception_history("job-1").entries[0].failure == cause


# In the job record ---------------------------------------------------------------------------------

SUBMISSION = JobSubmission("job-1", "sums", "sums.py", b"", {}, 1, 100.5)


def test_a_record_keeps_the_history_and_an_older_record_has_none() -> None:
    history = ExceptionHistory(
        (
            ExceptionEntry(Failure("TypeError", "bad", Fault.USER, False), 12.5, 2, "sum", 1, "tm-b"),
            ExceptionEntry(Failure.internal("TaskManager tm-a lost"), 10.0, 1, None, None, "tm-a"),
        )
    )
    record = JobRecord(SUBMISSION, 2, JobStatus.FAILED, None, {}, exceptions=history)
    document = json.loads(record.to_json())
    assert document["format"] == 1
    assert document["exceptions"][0] == {
        "failure": {"type": "TypeError", "message": "bad", "fault": "user", "retriable": False},
        "timestamp": 12.5,
        "attempt": 2,
        "vertex_uid": "sum",
        "subtask": 1,
        "taskmanager_id": "tm-b",
    }
    assert JobRecord.from_json(record.to_json()) == record
    del document["exceptions"]  # as a Weir before the exception history wrote it
    assert JobRecord.from_json(json.dumps(document).encode()).exceptions == ExceptionHistory()


@pytest.mark.parametrize(
    "bad",
    [
        {"failure": None, "timestamp": 1.0, "attempt": 1, "vertex_uid": None, "subtask": None, "taskmanager_id": None},
        {
            "failure": {"type": "E", "message": "m", "fault": "user", "retriable": True},
            "timestamp": 1.0,
            "attempt": "1",
            "vertex_uid": None,
            "subtask": None,
            "taskmanager_id": None,
        },  # fmt: skip
        {"failure": {"type": "E", "message": "m", "fault": "user", "retriable": True}, "timestamp": 1.0},
    ],
)
def test_a_malformed_history_entry_makes_the_record_malformed(bad: dict[str, object]) -> None:
    document = json.loads(JobRecord(SUBMISSION, 1, JobStatus.RUNNING, None, {}).to_json())
    document["exceptions"] = [bad]
    with pytest.raises(SerializationError, match="is malformed"):
        JobRecord.from_json(json.dumps(document).encode())


def test_a_record_keeps_a_failure_s_traceback_and_an_older_record_has_none() -> None:
    trace = 'Traceback (most recent call last):\n  File "job.py", line 7, in parse\nValueError: bad\n'
    failure = Failure("ValueError", "bad", Fault.USER, True, stacktrace=trace)
    record = JobRecord(SUBMISSION, 1, JobStatus.RUNNING, None, {}, exceptions=ExceptionHistory((entry_of(failure),)))
    document = json.loads(record.to_json())
    assert document["exceptions"][0]["failure"]["stacktrace"] == trace
    assert JobRecord.from_json(record.to_json()).exceptions.entries[0].failure.stacktrace == trace
    del document["exceptions"][0]["failure"]["stacktrace"]  # as a Weir before stack traces wrote it
    assert JobRecord.from_json(json.dumps(document).encode()).exceptions.entries[0].failure.stacktrace == ""


def entry_of(failure: Failure) -> ExceptionEntry:
    return ExceptionEntry(failure, 12.5, 1, "sum", 0, "tm-a")

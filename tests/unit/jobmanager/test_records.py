"""The job record: versioned JSON a restarted JobManager reads back; never a pickle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.errors import Fault, SerializationError, ServiceUnavailableError
from weir.core.failures import Failure
from weir.core.ids import CheckpointId, JobId
from weir.core.paths import CheckpointPaths
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing.term_fences import TermFence
from weir.jobmanager.lifecycle import RecordedEnd, Resolution, StopRequest
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.records import JobRecord, JobSubmission

SUBMISSION = JobSubmission(
    job_id="job-1",
    job_name="sums",
    job_file_name="sums.py",
    job_source=b"def build(env):\n    pass\n\xe2\x9c\x93",
    parameters={"checkpointing.interval": "1s"},
    parallelism=3,
    submitted_at=100.5,
)


def test_a_record_reads_back_as_written() -> None:
    record = JobRecord(
        submission=SUBMISSION,
        attempt=4,
        status=JobStatus.CANCELLING,
        failure=Failure("JobDefinitionError", "no table", Fault.USER, False),
        records_in_all_attempts={("sum", 0): 10, ("gen", 2): 7},
        checkpoint_ids_reserved_through=200,
        transactions_resolved=False,
        restarts=3,
    )
    data = record.to_json()
    assert json.loads(data)["format"] == 1
    assert json.loads(data)["status"] == "CANCELLING"  # the status travels by its name
    assert JobRecord.from_json(data) == record


def test_a_record_with_an_unknown_status_is_malformed() -> None:
    record = JobRecord(SUBMISSION, 1, JobStatus.RUNNING, None, {})
    document = json.loads(record.to_json())
    document["status"] = "PAUSED"
    with pytest.raises(SerializationError, match="is malformed"):
        JobRecord.from_json(json.dumps(document).encode())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x80\x04\x95pickle", "is not JSON"),
        (b'{"format": 99}', "has format 99"),
        (b'{"format": 1, "attempt": 1}', "is malformed"),
        (b"[1, 2]", "has format 'list'"),
    ],
)
def test_a_record_that_cannot_be_read_is_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(SerializationError, match=message):
        JobRecord.from_json(data, where="job record job-1/_job")


def test_a_record_without_restarts_an_older_weir_wrote_reads_as_none() -> None:
    document = json.loads(JobRecord(SUBMISSION, 1, JobStatus.RUNNING, None, {}, restarts=5).to_json())
    del document["restarts"]
    assert JobRecord.from_json(json.dumps(document).encode()).restarts == 0


@pytest.mark.parametrize(
    "end",
    [
        RecordedEnd(JobStatus.CANCELED, False, 12.5, None),
        RecordedEnd(JobStatus.FINISHED, True, 13.0, None),
        RecordedEnd(JobStatus.FAILED, True, 14.0, Resolution(CheckpointId(7), attempts=3, error="postgres is down")),
        RecordedEnd(JobStatus.FINISHED, True, 15.0, Resolution(None, attempts=1, resolved=True)),
    ],
)
def test_an_end_and_a_stop_read_back_as_written(end: RecordedEnd) -> None:
    """What a JobManager taking over needs of an ending or ended job and of a stop under way; the parts
    of a resolution that only live in one JobManager (running, when to retry) are not kept."""
    stop = StopRequest(CheckpointId(9), drain=True)
    record = JobRecord(SUBMISSION, 4, JobStatus.CANCELLING, None, {}, end=end, stop=stop)
    read = JobRecord.from_json(record.to_json())
    assert read.end == end and read.stop == stop


def test_a_record_of_an_older_weir_has_no_end_and_no_stop() -> None:
    document = json.loads(JobRecord(SUBMISSION, 1, JobStatus.FAILED, None, {}).to_json())
    assert "end" not in document and "stop" not in document
    read = JobRecord.from_json(json.dumps(document).encode())
    assert read.end is None and read.stop is None and not read.transactions_resolved


def test_an_end_with_an_outcome_that_is_no_end_is_malformed() -> None:
    document = json.loads(JobRecord(SUBMISSION, 1, JobStatus.FAILED, None, {}).to_json())
    document["end"] = {"outcome": "RUNNING", "ended": True, "at": 1.0, "resolution": None}
    with pytest.raises(SerializationError, match="outcome must be CANCELED, FAILED or FINISHED"):
        JobRecord.from_json(json.dumps(document).encode())


def test_the_takeover_fences_read_back_and_a_record_without_them_has_none() -> None:
    fences = (TermFence(2, CheckpointId(7)), TermFence(3, None))
    record = JobRecord(SUBMISSION, 1, JobStatus.RUNNING, None, {}, term_fences=fences)
    document = json.loads(record.to_json())
    assert document["format"] == 1
    assert document["term_fences"] == [{"term": 2, "checkpoints_through": 7}, {"term": 3, "checkpoints_through": None}]
    assert JobRecord.from_json(record.to_json()).term_fences == fences
    older = json.loads(JobRecord(SUBMISSION, 1, JobStatus.RUNNING, None, {}).to_json())
    assert "term_fences" not in older and JobRecord.from_json(json.dumps(older).encode()).term_fences == ()
    document["term_fences"] = [{"term": "2", "checkpoints_through": 7}]
    with pytest.raises(SerializationError, match="is malformed"):
        JobRecord.from_json(json.dumps(document).encode())


class _LandsUnanswered(FileCheckpointStorage):
    """The next conditional write lands, but its answer is lost (a timeout)."""

    lose_next_answer = False

    def put_if(self, key: str, data: bytes, expected_version: str | None) -> str:
        version = super().put_if(key, data, expected_version)
        if self.lose_next_answer:
            self.lose_next_answer = False
            raise ServiceUnavailableError("the storage did not answer in time")
        return version


def test_a_conditional_record_write_whose_answer_was_lost_is_recognised_as_its_own(tmp_path: Path) -> None:
    """A write that timed out may have landed, leaving the store without its version: the next write
    finds the record holding exactly those bytes and goes over it; another JobManager's is refused."""
    storage = _LandsUnanswered(tmp_path)
    paths = CheckpointPaths()
    store = JobRecordStore(storage, paths, lambda: 0.0, conditional=True)
    store.take_over_index(1)
    assert store.write_now(JobRecord(SUBMISSION, 1, JobStatus.RUNNING, None, {}))
    storage.lose_next_answer = True
    assert not store.write_now(JobRecord(SUBMISSION, 2, JobStatus.RUNNING, None, {}))  # unanswered, landed
    assert store.write_now(JobRecord(SUBMISSION, 3, JobStatus.RUNNING, None, {}))
    key = paths.job_record(JobId("job-1"))
    assert JobRecord.from_json(storage.get_bytes(key)).attempt == 3

    other = JobRecordStore(storage, paths, lambda: 0.0, conditional=True)
    other.take_over_index(2)
    other.load(key)
    assert other.write_now(JobRecord(SUBMISSION, 4, JobStatus.RUNNING, None, {}, term_fences=(TermFence(2, None),)))
    assert not store.write_now(JobRecord(SUBMISSION, 5, JobStatus.RUNNING, None, {}))  # refused: not its own
    assert JobRecord.from_json(storage.get_bytes(key)).attempt == 4

"""The JobManager service's enums on the wire: every domain value round-trips, UNSPECIFIED is refused."""

from __future__ import annotations

import pytest

from weir.core.checkpointing import CheckpointStatus
from weir.core.codec import (
    checkpoint_status_from_proto,
    checkpoint_status_to_proto,
    job_status_from_proto,
    job_status_to_proto,
)
from weir.core.errors import ProtocolError
from weir.core.states import JobStatus
from weir.wire import jobmanager_pb2


@pytest.mark.parametrize("status", list(JobStatus))
def test_every_job_status_round_trips_under_its_own_name(status: JobStatus) -> None:
    wire = job_status_to_proto(status)
    assert jobmanager_pb2.JobStatus.Name(wire) == f"JOB_STATUS_{status.name}"
    assert job_status_from_proto(wire) is status


@pytest.mark.parametrize("status", list(CheckpointStatus))
def test_every_checkpoint_status_round_trips_under_its_own_name(status: CheckpointStatus) -> None:
    wire = checkpoint_status_to_proto(status)
    assert jobmanager_pb2.CheckpointStatus.Name(wire) == f"CHECKPOINT_STATUS_{status.name}"
    assert checkpoint_status_from_proto(wire) is status


def test_an_unspecified_status_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="JOB_STATUS_UNSPECIFIED"):
        job_status_from_proto(jobmanager_pb2.JOB_STATUS_UNSPECIFIED)
    with pytest.raises(ProtocolError, match="CHECKPOINT_STATUS_UNSPECIFIED"):
        checkpoint_status_from_proto(jobmanager_pb2.CHECKPOINT_STATUS_UNSPECIFIED)
    with pytest.raises(ProtocolError, match="99"):
        job_status_from_proto(99)  # type: ignore[arg-type]

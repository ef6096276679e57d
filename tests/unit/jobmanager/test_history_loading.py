"""A JobManager that serves before its ended jobs' history is loaded says so over the wire: the
client hears "still loading, try again", not "no JobManager" and not "unknown job"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.jobmanager.conftest import MakeHarness, served
from weir.core.errors import ClusterUnavailableError, UnknownJobError
from weir.core.states import JobStatus
from weir.jobmanager.manager import JobManager
from weir.tools.client import JobManagerClient


@pytest.fixture
def restarted(make_harness: MakeHarness) -> Iterator[tuple[JobManager, JobManagerClient]]:
    """A JobManager restarted over a storage holding one FINISHED job, serving before its history."""
    first = make_harness()
    first.finish(first.job())
    first.jm.records.flush()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 0
    with served(second.jm) as client:
        yield second.jm, client


def test_an_ended_job_not_loaded_yet_is_not_ready_and_then_answers(
    restarted: tuple[JobManager, JobManagerClient],
) -> None:
    jm, client = restarted
    with pytest.raises(ClusterUnavailableError, match="still loading ended job job-1") as not_ready:
        client.job_status("job-1")
    assert "start the cluster" not in str(not_ready.value)
    with pytest.raises(UnknownJobError):
        client.job_status("job-2")
    assert jm.recover_history() == 1
    assert client.job_status("job-1").summary.status is JobStatus.FINISHED

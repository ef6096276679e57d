"""The integration tests' session cluster (tests/integration/conftest.py), without a cluster: a broken
one fails every later test at once with its cause, leftover jobs are cancelled whatever submitted
them, and a session deletes only the topics it made."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import SessionTopics
from tests.integration.conftest import WeirCluster
from weir.core.config import Endpoints
from weir.core.errors import ClusterUnavailableError
from weir.core.ids import JobId
from weir.core.states import JobStatus
from weir.tools.client import ClusterStatus, JobSummary, TaskManagerInfo


@dataclass
class FakeJobManager:
    """What the fixture asks of the JobManager: cluster status, the jobs, cancel."""

    answers: bool = True
    jobs: dict[str, JobStatus] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)

    def cluster_status(self) -> ClusterStatus:
        if not self.answers:
            raise ClusterUnavailableError("connection refused")
        tms = tuple(TaskManagerInfo(f"taskmanager-{n}", "", 2, 2, 0.1, True) for n in (1, 2, 3))  # type: ignore[arg-type]
        return ClusterStatus(tms)

    def list_jobs(self) -> tuple[JobSummary, ...]:
        return tuple(JobSummary(JobId(j), "job", s, 0.0, 3, 0) for j, s in self.jobs.items())

    def cancel_job(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self.jobs[job_id] = JobStatus.CANCELLING


def cluster(jm: FakeJobManager) -> WeirCluster:
    return WeirCluster(Endpoints.from_env(), Path("/nonexistent/cluster"), jm)  # type: ignore[arg-type]


def test_a_cluster_that_stops_answering_fails_the_first_test_after_its_deadline_and_every_later_one_at_once() -> None:
    jm = FakeJobManager(answers=False)
    c = cluster(jm)

    with pytest.raises(pytest.fail.Exception, match="broken: 0 of 3 TaskManagers registered after 0.3 s"):
        c.wait_for_taskmanagers(timeout_s=0.3)
    jm.answers = True  # too late: the session does not wait out another deadline
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="connection refused"):
        c.wait_for_taskmanagers(timeout_s=30.0)
    assert time.monotonic() - started < 1.0


def test_a_cluster_that_answers_is_not_broken() -> None:
    c = cluster(FakeJobManager())

    c.wait_for_taskmanagers(timeout_s=0.3)

    assert c.broken is None


def test_every_job_left_running_is_cancelled_however_it_was_submitted_but_those_running_before() -> None:
    jm = FakeJobManager(jobs={"module-fixture": JobStatus.RUNNING, "old": JobStatus.FINISHED})
    c = cluster(jm)
    before = c.running_jobs()
    jm.jobs |= {"by-cli": JobStatus.RUNNING, "by-scenario": JobStatus.RESTARTING, "done": JobStatus.FINISHED}

    cancelled = c.cancel_jobs_except(before, timeout_s=1.0)

    assert cancelled == ["by-cli", "by-scenario"] == jm.cancelled
    assert jm.jobs["module-fixture"] is JobStatus.RUNNING


def test_a_session_owns_the_topics_it_created_and_its_jobs_marker_topics_only() -> None:
    topics = SessionTopics(created={"events-1a2b3c4d"}, job_ids={"0123abcd0123abcd"})

    assert topics.owns("events-1a2b3c4d")
    assert topics.owns("weir-sink-commits.kafka-sink.0123abcd0123abcd.5f3e")
    assert not topics.owns("events-ffff0000")  # another session's, created meanwhile

"""The read API: job status, job list, checkpoints and the cluster, as plain values."""

from __future__ import annotations

import pytest

from tests.unit.jobmanager.conftest import MakeHarness
from weir.core.errors import UnknownJobError
from weir.core.states import JobStatus, TaskState


def test_a_job_s_status_names_its_tasks_and_their_states(make_harness: MakeHarness) -> None:
    h = make_harness()
    job = h.job()
    view = h.jm.job_status("job-1")
    assert view.summary.status is JobStatus.RUNNING and view.summary.job_id == "job-1"
    assert [(t.vertex_uid, t.subtask, t.state, t.taskmanager_id) for t in view.tasks] == [
        (uid, s, TaskState.DEPLOYING, "tm-a") for uid, s in sorted(job.tasks)
    ]
    assert view.last_completed_checkpoint == 0 and view.failure is None
    assert [s.job_id for s in h.jm.list_jobs()] == ["job-1"]


def test_an_unknown_job_is_an_unknown_job_error(make_harness: MakeHarness) -> None:
    h = make_harness()
    with pytest.raises(UnknownJobError):
        h.jm.job_status("nope")
    with pytest.raises(UnknownJobError):
        h.jm.list_checkpoints("nope")


def test_the_cluster_shows_free_slots_and_heartbeat_ages_sorted_by_name(make_harness: MakeHarness) -> None:
    h = make_harness(taskmanagers=("tm-b", "tm-a"))
    h.job()
    h.clock.advance(2.0)
    view = h.jm.cluster_status()
    assert [
        (t.taskmanager_id, t.slots_total, t.slots_free, t.last_heartbeat_age_s, t.alive) for t in view.taskmanagers
    ] == [
        ("tm-a", 4, 3, 2.0, True),
        ("tm-b", 4, 4, 2.0, True),
    ]

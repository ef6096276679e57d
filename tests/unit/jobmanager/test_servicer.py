"""The servicer's conversions: requests into messages, answers into responses with protobuf enums."""

from __future__ import annotations

import pytest

from weir.core.codec import set_task_load
from weir.core.errors import ProtocolError
from weir.core.failures import Failure
from weir.core.states import JobStatus, TaskState
from weir.core.task_time import TimeRatios, TimeTotals
from weir.jobmanager.messages import JobStatusView, JobSummaryView, TaskView
from weir.jobmanager.service import heartbeat_from_proto, job_status_response, task_state_report
from weir.wire import common_pb2, jobmanager_pb2


def test_a_task_state_report_carries_the_domain_state() -> None:
    report = task_state_report(
        jobmanager_pb2.ReportTaskStateRequest(
            task=common_pb2.TaskRef(job_id="job-1", vertex_uid="gen", subtask=2),
            state=common_pb2.TASK_STATE_FAILED,
            failure=common_pb2.Failure(type="E", message="boom", fault=common_pb2.FAULT_USER),
            attempt=3,
            input_ended=True,
        )
    )
    assert (report.job_id, report.vertex_uid, report.subtask, report.attempt) == ("job-1", "gen", 2, 3)
    assert report.state is TaskState.FAILED and report.failure is not None and report.failure.message == "boom"
    assert report.input_ended


def test_a_task_state_report_without_a_state_is_refused() -> None:
    with pytest.raises(ProtocolError):
        task_state_report(jobmanager_pb2.ReportTaskStateRequest(state=common_pb2.TASK_STATE_UNSPECIFIED))


def test_a_job_status_goes_out_with_protobuf_enums() -> None:
    view = JobStatusView(
        summary=JobSummaryView("job-1", "j", JobStatus.RESTARTING, 1.0, 2, 1),
        tasks=(
            TaskView("gen", 0, "gen", TaskState.RUNNING, "tm-a", None, 1, 2, 3),
            TaskView("gen", 1, "gen", None, "", Failure.internal("x"), 0, 0, 0),
        ),
        failure=None,
        last_completed_checkpoint=0,
        last_restore_at=0.0,
    )
    response = job_status_response(view)
    assert response.summary.status == jobmanager_pb2.JOB_STATUS_RESTARTING
    assert [t.state for t in response.tasks] == [common_pb2.TASK_STATE_RUNNING, common_pb2.TASK_STATE_UNSPECIFIED]
    assert not response.HasField("failure") and response.tasks[1].failure.message == "x"


def test_a_heartbeat_carries_each_task_s_time_shares_and_watermark_when_known() -> None:
    measured = jobmanager_pb2.TaskProgress(
        task=common_pb2.TaskRef(job_id="job-1", vertex_uid="gen", subtask=0), attempt=2, records_in=5, records_out=4
    )
    totals = TimeTotals(busy_s=7.5, backpressured_s=1.25, idle_s=2.0)
    set_task_load(measured, TimeRatios(busy=0.5, backpressured=0.25, idle=0.25), totals, 1_764_000_000_000)
    fresh = jobmanager_pb2.TaskProgress(task=common_pb2.TaskRef(job_id="job-1", vertex_uid="gen", subtask=1), attempt=2)
    set_task_load(fresh, None, TimeTotals(), None)
    older = jobmanager_pb2.TaskProgress(task=common_pb2.TaskRef(job_id="job-1", vertex_uid="gen", subtask=2), attempt=2)
    heartbeat = heartbeat_from_proto(
        jobmanager_pb2.HeartbeatRequest(taskmanager_id="tm-a", running_tasks=[measured, fresh, older])
    )
    first, second, third = heartbeat.running_tasks
    assert (first.vertex_uid, first.subtask, first.attempt, first.records_in, first.records_out) == ("gen", 0, 2, 5, 4)
    assert first.ratios == TimeRatios(0.5, 0.25, 0.25) and first.watermark == 1_764_000_000_000
    assert second.ratios is None and second.watermark is None  # unset on the wire, not zero
    # the running time totals behind the shares (Flink's accumulated busy/backpressured/idle times)
    assert (first.totals, second.totals) == (totals, TimeTotals())
    assert third.totals is None  # a TaskManager that sends none (an older one)

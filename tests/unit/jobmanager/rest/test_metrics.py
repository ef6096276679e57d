"""Flink's metrics endpoints over a JobManager built without network: the ids without ``get``, the
values as strings with it, the aggregations, the filters, the errors, and the read role."""

from __future__ import annotations

import warnings

import pytest
from prometheus_client import CollectorRegistry, Gauge

from tests.unit.jobmanager.conftest import Harness
from tests.unit.jobmanager.rest.test_app import errors_of, running_job
from weir.core.task_time import TimeRatios
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import (
    CheckpointCounts,
    CheckpointsView,
    Heartbeat,
    JobStatusView,
    JobSummaryView,
    RecordRates,
    TaskProgress,
)
from weir.jobmanager.rest import metrics
from weir.jobmanager.rest.app import create_app
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient

from weir.core.roles import access_table, parse_tokens_file
from weir.core.states import JobStatus


def beat(h: Harness, job: JobMaster, records_in: int, records_out: int, watermark: int | None = None) -> None:
    progress = TaskProgress(
        job.job_id, "gen", 0, job.attempt, records_in, records_out, TimeRatios(0.5, 0.25, 0.25), watermark
    )
    h.jm.heartbeat(Heartbeat("tm-a", (progress,)))


# The pure part ------------------------------------------------------------------------------------


def test_values_go_out_as_flinks_metric_store_keeps_them() -> None:
    assert [metrics.as_string(v) for v in (12, 0.5, 2.0, float("nan"), -(2**63), "n/a")] == [
        "12",
        "0.5",
        "2.0",
        "NaN",
        "-9223372036854775808",
        "n/a",
    ]


def test_a_scope_lists_its_ids_without_get_and_the_values_asked_for_with_it() -> None:
    scope = {"b": 2, "a": 1.5, "c": "x"}
    assert metrics.metric_list(scope, None).model_dump(exclude_none=True) == [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    asked = metrics.metric_list(scope, metrics.names("c,nope,b,c"))
    assert asked.model_dump(exclude_none=True) == [{"id": "c", "value": "x"}, {"id": "b", "value": "2"}]


def test_aggregations_are_flinks_over_the_scopes_that_have_the_metric() -> None:
    scopes = [{"n": 1, "s": "text"}, {"n": 3}, {"n": 8, "only": 4}, {}]
    every = metrics.aggregated_list(scopes, metrics.names("n,only,s,missing"), metrics.aggregations(None))
    # mean 4, mean absolute deviation (3 + 1 + 4) / 3 = 8/3, skew 8/3 / 4 * 100
    assert every.model_dump(exclude_none=True) == [
        {"id": "n", "min": 1.0, "max": 8.0, "avg": 4.0, "sum": 12.0, "skew": pytest.approx(200 / 3)},
        {"id": "only", "min": 4.0, "max": 4.0, "avg": 4.0, "sum": 4.0, "skew": 0.0},
    ]
    some = metrics.aggregated_list(scopes, ("n",), metrics.aggregations("SUM,max"))
    assert some.model_dump(exclude_none=True) == [{"id": "n", "sum": 12.0, "max": 8.0}]
    names = metrics.aggregated_list(scopes, None, metrics.aggregations(None)).model_dump(exclude_none=True)
    assert names == [{"id": "n"}, {"id": "only"}, {"id": "s"}]


def test_skew_is_capped_at_100_and_0_for_a_zero_mean() -> None:
    assert metrics.skew([0.0, 0.0]) == 0.0
    # mean 25, mean absolute deviation (25 * 3 + 75) / 4 = 37.5: 150 %, capped
    assert metrics.skew([0.0, 0.0, 0.0, 100.0]) == 100.0
    # mean 2, mean absolute deviation (1 + 1) / 2 = 1: 50 %
    assert metrics.skew([1.0, 3.0]) == 50.0
    assert metrics.skew([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1000.0]) == 100.0
    assert metrics.skew([5.0, 5.0, 5.0]) == 0.0


def test_subtask_ranges_and_bad_aggregations_are_refused_with_one_line() -> None:
    assert metrics.subtask_selection("0,2-4, 7") == frozenset({0, 2, 3, 4, 7})
    assert metrics.subtask_selection(None) is None
    for bad in ("a", "3-1", "1-", "-2"):
        with pytest.raises(metrics.MetricsQueryError, match="subtask"):
            metrics.subtask_selection(bad)
    with pytest.raises(metrics.MetricsQueryError, match="not a valid aggregation: 'median'"):
        metrics.aggregations("min,median")


def test_a_jobs_uptime_is_flinks_running_ended_or_not_running() -> None:
    summary = JobSummaryView("j", "name", JobStatus.RUNNING, 100.0, 2, 1)
    status = JobStatusView(summary, (), None, 0, 130.0, now=142.5)
    view = CheckpointsView("j", (), counts=CheckpointCounts(triggered=3, completed=2, failed=1))
    found = metrics.job_metrics(status, view)
    assert (found["uptime"], found["numRestarts"], found["totalNumberOfCheckpoints"]) == (12500, 1, 3)
    assert (found["lastCheckpointExternalPath"], found["lastCompletedCheckpointId"]) == ("n/a", -1)
    ended = JobStatusView(JobSummaryView("j", "name", JobStatus.CANCELED, 100.0, 2, 1), (), None, 0, 130.0, now=150)
    assert metrics.job_metrics(ended, view)["uptime"] == -1
    restarting = JobStatusView(JobSummaryView("j", "n", JobStatus.RESTARTING, 100.0, 2, 1), (), None, 0, 0.0, now=150)
    assert metrics.job_metrics(restarting, view)["uptime"] == 0


def test_record_rates_are_per_second_between_two_counts() -> None:
    assert RecordRates.between((10, 4), (40, 10), 2.0) == RecordRates(15.0, 3.0)


def test_the_jobmanagers_unlabelled_prometheus_series_are_its_metrics() -> None:
    registry = CollectorRegistry()
    Gauge("weir_jobmanager_leader", "leads", registry=registry).set(1)
    Gauge("weir_labelled", "no", ["job_id"], registry=registry).labels("j").set(5)
    from weir.jobmanager.messages import ClusterView

    found = metrics.jobmanager_metrics(ClusterView(()), (), registry)
    assert found == {
        "weir_jobmanager_leader": 1,
        "numRegisteredTaskManagers": 0,
        "taskSlotsTotal": 0,
        "taskSlotsAvailable": 0,
        "numRunningJobs": 0,
    }


# The routes -------------------------------------------------------------------------------------


def test_a_subtasks_metrics_carry_its_heartbeats_counters_rate_watermark_and_time_shares(
    harness: Harness, client: TestClient
) -> None:
    job = running_job(harness)
    beat(harness, job, 40, 35, watermark=1_000)
    harness.clock.advance(2.0)
    beat(harness, job, 100, 75, watermark=2_000)
    base = f"/jobs/{job.job_id}/vertices/gen/subtasks/0/metrics"
    ids = {m["id"] for m in client.get(base).json()}
    assert {"numRecordsIn", "numRecordsOut", "numRecordsInPerSecond", "currentInputWatermark"} <= ids
    answer = client.get(base, params={"get": "numRecordsIn,numRecordsInPerSecond,numRecordsOutPerSecond"})
    assert answer.status_code == 200
    assert answer.json() == [
        {"id": "numRecordsIn", "value": "100"},
        {"id": "numRecordsInPerSecond", "value": "30.0"},
        {"id": "numRecordsOutPerSecond", "value": "20.0"},
    ]
    shares = client.get(base, params={"get": "busyTimeMsPerSecond,currentInputWatermark"}).json()
    assert shares == [{"id": "busyTimeMsPerSecond", "value": "500.0"}, {"id": "currentInputWatermark", "value": "2000"}]
    # the same under /v1 and with the job's id in Flink's form
    flink_path = f"/v1/jobs/{flink_job_id(job.job_id)}/vertices/gen/subtasks/0/metrics"
    assert client.get(flink_path, params={"get": "numRecordsIn"}).json() == [{"id": "numRecordsIn", "value": "100"}]


def test_a_vertexs_metrics_are_its_subtasks_prefixed_with_their_index(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    beat(harness, job, 7, 6)
    answer = client.get(f"/jobs/{job.job_id}/vertices/gen/metrics", params={"get": "0.numRecordsIn,numRecordsIn"})
    assert answer.json() == [{"id": "0.numRecordsIn", "value": "7"}]
    assert {"id": "0.numRecordsOut"} in client.get(f"/jobs/{job.job_id}/vertices/gen/metrics").json()


def test_a_vertexs_watermarks_are_flinks_one_per_subtask(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    path = f"/jobs/{job.job_id}/vertices/{flink_vertex_id('gen')}/watermarks"
    assert client.get(path).json() == [{"id": "0.currentInputWatermark", "value": "-9223372036854775808"}]
    beat(harness, job, 5, 5, watermark=1_764_600_000_000)
    assert client.get(path).json() == [{"id": "0.currentInputWatermark", "value": "1764600000000"}]
    errors_of(client.get(f"/jobs/{job.job_id}/vertices/nope/watermarks"), 404)


def test_the_subtasks_aggregate_and_filter(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    beat(harness, job, 9, 3)
    path = f"/jobs/{job.job_id}/vertices/gen/subtasks/metrics"
    assert client.get(path, params={"get": "numRecordsIn", "agg": "sum,min"}).json() == [
        {"id": "numRecordsIn", "min": 9.0, "sum": 9.0}
    ]
    assert client.get(path, params={"get": "numRecordsIn", "subtasks": "1-3"}).json() == []
    assert {"id": "numRecordsOut"} in client.get(path).json()
    assert "not a valid aggregation" in errors_of(client.get(path, params={"get": "x", "agg": "median"}), 400)[0]
    assert "subtask" in errors_of(client.get(path, params={"subtasks": "x"}), 400)[0]


def test_a_jobs_metrics_and_the_jobs_aggregate(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    harness.clock.advance(3.0)
    found = {
        m["id"]: m["value"]
        for m in client.get(
            f"/jobs/{job.job_id}/metrics", params={"get": "uptime,numRestarts,numberOfCompletedCheckpoints"}
        ).json()
    }
    uptime = round(harness.clock() * 1000)  # the harness's job was submitted at 0 and runs since
    assert found == {"uptime": str(uptime), "numRestarts": "0", "numberOfCompletedCheckpoints": "0"}
    aggregated = client.get("/jobs/metrics", params={"get": "uptime", "jobs": flink_job_id(job.job_id)}).json()
    assert aggregated == [{"id": "uptime", "min": uptime, "max": uptime, "avg": uptime, "sum": uptime, "skew": 0.0}]
    assert client.get("/jobs/metrics", params={"get": "uptime", "jobs": "0" * 32}).json() == []
    assert errors_of(client.get("/jobs/feedfeedfeedfeed/metrics"), 404)


def test_the_taskmanagers_metrics_and_their_aggregate(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    beat(harness, job, 11, 10)
    tms = [tm["id"] for tm in client.get("/taskmanagers").json()["taskmanagers"]]
    assert "tm-a" in tms
    found = client.get("/taskmanagers/tm-a/metrics", params={"get": "taskSlotsTotal,numRecordsIn"}).json()
    assert found == [{"id": "taskSlotsTotal", "value": "4"}, {"id": "numRecordsIn", "value": "11"}]
    summed = client.get("/taskmanagers/metrics", params={"get": "taskSlotsTotal", "agg": "sum"}).json()
    assert summed == [{"id": "taskSlotsTotal", "sum": 4.0 * len(tms)}]
    only = client.get("/taskmanagers/metrics", params={"get": "numRecordsIn", "agg": "max", "taskmanagers": "tm-a"})
    assert only.json() == [{"id": "numRecordsIn", "max": 11.0}]
    assert errors_of(client.get("/taskmanagers/nope/metrics"), 404)


def test_the_jobmanagers_metrics(harness: Harness, client: TestClient) -> None:
    running_job(harness)
    found = {
        m["id"]: m["value"]
        for m in client.get("/jobmanager/metrics", params={"get": "numRunningJobs,numRegisteredTaskManagers"}).json()
    }
    assert found["numRunningJobs"] == "1"
    assert int(found["numRegisteredTaskManagers"]) >= 1


def test_unknown_vertices_and_subtasks_are_404(harness: Harness, client: TestClient) -> None:
    job = running_job(harness)
    assert errors_of(client.get(f"/jobs/{job.job_id}/vertices/nope/metrics"), 404)
    assert errors_of(client.get(f"/jobs/{job.job_id}/vertices/gen/subtasks/9/metrics"), 404)
    assert errors_of(client.get(f"/jobs/{job.job_id}/vertices/nope/subtasks/metrics"), 404)


METRIC_PATHS = (
    "/jobmanager/metrics",
    "/taskmanagers/metrics",
    "/taskmanagers/tm-a/metrics",
    "/jobs/metrics",
    "/jobs/{job}/metrics",
    "/jobs/{job}/vertices/gen/metrics",
    "/jobs/{job}/vertices/gen/watermarks",
    "/jobs/{job}/vertices/gen/subtasks/metrics",
    "/jobs/{job}/vertices/gen/subtasks/0/metrics",
)


def test_a_read_token_reads_every_metrics_path_and_cannot_cancel(harness: Harness) -> None:
    job = running_job(harness)
    table = access_table(None, parse_tokens_file("read reader\n", "tokens"), None)
    with TestClient(create_app(harness.jm, access=table)) as client:
        reader = {"Authorization": "Bearer reader"}
        other = {"Authorization": "Bearer not-a-token"}
        for path in METRIC_PATHS:
            url = path.format(job=job.job_id)
            assert client.get(url, headers=reader).status_code == 200, url
            assert errors_of(client.get(url), 401)
            assert errors_of(client.get(url, headers=other), 401)
        assert "operate" in errors_of(client.patch(f"/jobs/{job.job_id}", headers=reader), 403)[0]
        # a jar's plan runs the artifact's build(env): submit's, not read's
        assert "submit" in errors_of(client.get("/jars/some-jar/plan", headers=reader), 403)[0]
        assert job.status is JobStatus.RUNNING

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree

import pytest

from bench.jm_scale import (
    KEYED_VERTICES,
    VERTEX_UIDS,
    CheckpointTimes,
    StateModel,
    _merge_sim_reports,
    ack_due,
    distribution,
    error_line,
    findings,
    first_break,
    heartbeat_cpu,
    heartbeat_offsets,
    job_source,
    parallelism_for,
    percentile,
    proc_cpu_seconds,
    render_chart,
    render_markdown,
    round_trips,
    slots_per_taskmanager,
    symptoms,
    taskmanagers_for,
)
from weir.api import load_job_source
from weir.core.paths import CheckpointPaths
from weir.graph import Partitioning
from weir.plan import build_plan


def test_parallelism_splits_the_subtasks_evenly_over_the_vertices() -> None:
    assert parallelism_for(1000) == 200
    assert parallelism_for(10) == 2
    with pytest.raises(ValueError, match="12 subtasks"):
        parallelism_for(12)
    with pytest.raises(ValueError):
        parallelism_for(3)


def test_the_generated_job_has_five_unchained_vertices_of_parallelism_p() -> None:
    loaded = load_job_source(job_source(256), "jm_scale_job.py", {}, 3)
    plan = build_plan(loaded.graph)
    assert list(plan.vertices) == list(VERTEX_UIDS)
    assert {v.parallelism for v in plan.vertices.values()} == {3}
    assert [v.is_source for v in plan.vertices.values()] == [True, False, False, False, False]
    edges = [e for v in plan.vertices.values() for e in v.inputs]
    assert len(edges) == 4 and all(e.partitioning is not Partitioning.FORWARD for e in edges)
    assert sum(len(plan.input_channels(v, s)) for v in VERTEX_UIDS for s in range(3)) == 4 * 3 * 3
    # Above the default max parallelism of 128: the job raises it itself.
    assert (
        build_plan(load_job_source(job_source(256), "jm_scale_job.py", {}, 200).graph).vertices["sink"].parallelism
        == 200
    )


def test_slots_make_the_job_fit_exactly_on_the_taskmanagers() -> None:
    assert slots_per_taskmanager(200, 100) == 2
    assert slots_per_taskmanager(100, 1) == 100
    assert slots_per_taskmanager(2, 100) == 1
    assert slots_per_taskmanager(100, 50) * 50 >= 100


def test_the_size_sweep_runs_ten_subtasks_per_taskmanager_up_to_a_hundred() -> None:
    assert [taskmanagers_for(n) for n in (10, 50, 1000, 2000, 5)] == [1, 5, 100, 100, 1]


def test_a_heartbeat_costs_what_idle_taskmanagers_add_per_heartbeat() -> None:
    assert heartbeat_cpu(0.06, 0.01, 100, 1.0) == pytest.approx(0.0005)
    assert heartbeat_cpu(0.01, 0.02, 10, 1.0) == 0.0  # noise below the JobManager alone


def test_heartbeats_are_spread_over_the_interval() -> None:
    assert heartbeat_offsets(4, 1.0) == [0.0, 0.25, 0.5, 0.75]
    assert heartbeat_offsets(1, 2.0) == [0.0]


def test_a_source_acknowledges_after_its_own_trigger_and_the_others_after_the_last_source() -> None:
    assert ack_due(True, None, [], 3, 0.05) is None
    assert ack_due(True, 10.0, [10.0], 3, 0.05) == pytest.approx(10.05)
    assert ack_due(False, None, [10.0, 10.2], 3, 0.05) is None  # one source not triggered yet
    assert ack_due(False, None, [10.0, 10.3, 10.2], 3, 0.05) == pytest.approx(10.35)
    assert ack_due(False, None, [], 0, 0.05) is None


def test_a_keyed_task_reuses_the_newest_ssts_of_its_last_completed_checkpoint() -> None:
    model = StateModel(sst_files=4, new_ssts=1, sst_bytes=100, private_files=3)
    assert model.objects("job", "parse", 0, 1, ()) == ()  # not keyed: inline state only
    first = model.objects("job", KEYED_VERTICES[0], 7, 1, ())
    assert [o.reused for o in first] == [False] * 7
    ssts = StateModel.ssts(first)
    assert len(ssts) == 4
    paths = CheckpointPaths()
    assert all(paths.parse_shared_sst(k) is not None for k in ssts)
    assert all(paths.parse_checkpoint_object(o.key) is not None for o in first if o.key not in ssts)

    second = model.objects("job", KEYED_VERTICES[0], 7, 2, ssts)
    reused = [o.key for o in second if o.reused]
    assert reused == list(ssts[1:])  # compaction dropped the oldest
    fresh = [o.key for o in second if not o.reused]
    assert len(fresh) == 1 + 3 and all("00000000000000000002" in k for k in fresh)
    assert len({o.key for o in second}) == len(second)
    assert len(StateModel.ssts(second)) == 4


def test_cpu_seconds_are_read_after_the_command_name() -> None:
    fields = ["S", *["0"] * 10, "250", "50", *["0"] * 30]
    line = "4242 (jm io (1)) " + " ".join(fields)
    assert proc_cpu_seconds(line, 100) == pytest.approx(3.0)


def test_percentiles_interpolate_and_distributions_tolerate_no_values() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.99) == pytest.approx(9.9)
    assert percentile([], 0.5) is None
    assert distribution([]) == {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    assert distribution([1.0, 3.0])["mean"] == 2.0


def test_round_trips_keep_completed_checkpoints_notified_everywhere() -> None:
    done = CheckpointTimes(10.0, 10.1, 10.4, 10.5, 10.6)
    checkpoints = {
        1: done,
        2: CheckpointTimes(11.0, 11.1, 11.3, None, None),  # never completed
        3: CheckpointTimes(12.0, 12.1, 12.2, 12.3, 12.4, aborted_at=12.35),
        4: CheckpointTimes(13.0, 13.0, 13.2, 13.3, 13.5),  # not every TaskManager notified
    }
    trips = round_trips(checkpoints, lambda c: c != 4)
    assert [t["checkpoint_id"] for t in trips] == [1]
    assert trips[0]["round_trip_s"] == pytest.approx(0.6)
    assert trips[0]["trigger_fanout_s"] == pytest.approx(0.1)
    assert trips[0]["acks_s"] == pytest.approx(0.3)
    assert trips[0]["complete_and_notify_s"] == pytest.approx(0.2)


def test_two_processes_views_of_a_checkpoint_merge_to_the_widest_span() -> None:
    a = CheckpointTimes(10.0, 10.2, 10.5, 10.6, 10.7)
    b = CheckpointTimes(10.1, 10.3, 10.4, 10.55, 10.9)
    assert a.merge(b) == CheckpointTimes(10.0, 10.3, 10.5, 10.55, 10.9)
    assert CheckpointTimes().merge(a) == a
    assert not a.merge(b).aborted
    assert a.merge(CheckpointTimes(aborted_at=10.8)).merge(CheckpointTimes(aborted_at=10.7)).aborted_at == 10.7


def _report(tm: str, first_trigger: float, last_complete: float, notified: list[str]) -> dict[str, Any]:
    return {
        "checkpoints": {
            "5": {
                "first_trigger": first_trigger,
                "last_trigger": first_trigger + 0.01,
                "last_ack": first_trigger + 0.2,
                "first_complete": last_complete - 0.01,
                "last_complete": last_complete,
                "aborted_at": None,
            }
        },
        "notified": {"5": notified},
        "hosting": [tm],
        "running_reported": [first_trigger - 5.0],
        "heartbeat_wall_s": [0.001],
        "ack_wall_s": [0.002],
        "errors": 0,
    }


def test_simulator_reports_merge_into_one_round_trip_per_checkpoint() -> None:
    point: dict[str, Any] = {"window_from": 99.0}
    _merge_sim_reports(point, [_report("tm-0", 100.0, 100.5, ["tm-0"]), _report("tm-1", 100.1, 100.8, ["tm-1"])], 90.0)
    assert point["round_trip_s"]["n"] == 1
    assert point["round_trip_s"]["p50"] == pytest.approx(0.8)
    assert point["deploy_s"] == pytest.approx(5.1)
    assert point["checkpoints_completed"] == 1
    assert "window_from" not in point
    missing: dict[str, Any] = {"window_from": 99.0}
    _merge_sim_reports(missing, [_report("tm-0", 100.0, 100.5, ["tm-0"]), _report("tm-1", 100.1, 100.8, [])], 90.0)
    assert missing["round_trip_s"]["n"] == 0  # tm-1 was never told


def _healthy(**overrides: Any) -> dict[str, Any]:
    point = {
        "subtasks": 100,
        "taskmanagers": 10,
        "schedule_s": 0.1,
        "round_trip_s": {"p50": 0.2},
        "heartbeat_wall_s": {"max": 0.01},
        "monitor_tick_s": {"max": 0.01},
        "jm_cpu_per_s": 0.1,
        "checkpoints_completed": 5,
        "taskmanagers_lost": 0,
        "restarts": 0,
    }
    return point | overrides


def test_symptoms_name_each_limit_crossed() -> None:
    assert symptoms(_healthy(), 1.0, 0.05) == []
    cases = {
        "did not finish": _healthy(error="not every task RUNNING within 60 s"),
        "declared lost": _healthy(taskmanagers_lost=3),
        "restarted": _healthy(restarts=1),
        "waited": _healthy(heartbeat_wall_s={"max": 4.0}),
        "held the lock": _healthy(schedule_s=17.0),
        "back to back": _healthy(round_trip_s={"p50": 1.2}),
        "no checkpoint": _healthy(checkpoints_completed=0),
        "monitor tick": _healthy(monitor_tick_s={"max": 0.5}),
        "GIL": _healthy(jm_cpu_per_s=0.95),
    }
    for words, point in cases.items():
        found = symptoms(point, 1.0, 0.05)
        assert len(found) == 1 and words in found[0], (words, found)
    # The acknowledgement delay is the simulated TaskManagers' time, not the JobManager's.
    assert symptoms(_healthy(round_trip_s={"p50": 1.04}), 1.0, 0.05) == []


def test_first_break_is_the_smallest_point_with_a_symptom() -> None:
    points = [
        _healthy(subtasks=1000, taskmanagers=100, schedule_s=17.0),
        _healthy(subtasks=500, taskmanagers=50, round_trip_s={"p50": 1.5}),
        _healthy(subtasks=10, taskmanagers=1),
    ]
    found = first_break(points, 1.0, 0.05)
    assert found is not None and (found["subtasks"], found["taskmanagers"]) == (500, 50)
    assert first_break([_healthy()], 1.0, 0.05) is None


def _document(commit: str, schedule_s: float) -> dict[str, Any]:
    point = _healthy(
        schedule_s=schedule_s,
        sweep="subtasks",
        deploy_s=1.0,
        record_take_s=0.001,
        record_encode_s=0.002,
        record_bytes=5000,
        record_put_s=0.003,
        metadata_encode_s=0.01,
        metadata_bytes=100_000,
        heartbeat_cpu_s={"mean": 0.0001},
        ack_cpu_s={"mean": 0.0002},
    )
    return {
        "run_id": "r1",
        "commit": commit,
        "host": {"machine": "x86_64", "cpus": 2, "python": "3.11"},
        "finished_at": "2026-01-01T00:00:00Z",
        "load_average_at_start": [1.0, 1.0, 1.0],
        "load_average_at_end": [2.0, 2.0, 2.0],
        "settings": {
            "interval_s": 1.0,
            "ack_delay_s": 0.05,
            "storage": "file://",
            "state": {"inline_bytes": 2048, "sst_files": 8, "new_ssts": 2, "private_files": 3},
        },
        "in_process": [point, _healthy(sweep="taskmanagers", taskmanagers=1, subtasks=500)],
        "heartbeat_cost": [{"tasks": 0, "cpu_us": 20.0, "cpu_us_per_task": None}],
        "grpc": [],
        "grpc_skipped": "--skip-grpc",
        "findings": ["a finding"],
    }


def test_the_document_renders_every_section_from_the_results() -> None:
    after = _document("abc1234", 0.1)
    text = render_markdown(after)
    assert "commit abc1234" in text and "load average 1.00 / 1.00 / 1.00" in text
    assert "| 100 | 10 | 1.00 s | 0.10 s | 0.20 s |" in text
    assert "Not run: --skip-grpc." in text
    assert "- in-process: nothing broke up to 500 subtasks on 1 TaskManagers." in text
    assert "a finding" in text
    assert "Before and after" not in text
    compared = render_markdown(after, _document("0ld0ld0", 17.0))
    assert "| 100 | 10 | 1.00 s -> 1.00 s | 17.00 s -> 0.10 s |" in compared
    assert "- in-process, before: first broke at 100 subtasks on 10 TaskManagers: placing the job held" in compared
    assert "- in-process, after: nothing broke." in compared


def test_aborts_count_only_inside_the_window() -> None:
    early = _report("tm-0", 100.0, 100.5, ["tm-0"])
    early["checkpoints"]["6"] = dict(early["checkpoints"]["5"], aborted_at=100.9)
    early["checkpoints"]["7"] = dict(early["checkpoints"]["5"], aborted_at=103.0)  # the cancel, after the window
    point: dict[str, Any] = {"window_from": 99.0, "window_to": 102.0}
    _merge_sim_reports(point, [early], 90.0)
    assert point["checkpoints_aborted"] == 1
    assert point["round_trip_s"]["n"] == 1


def test_findings_split_the_largest_points_from_their_figures() -> None:
    document = _document("abc1234", 0.1)
    in_process = document["in_process"][0]
    in_process.update(
        subtasks=1000,
        taskmanagers=100,
        jm_cpu_per_s=0.1,
        trigger_fanout_s={"p50": 0.002},
        acks_s={"p50": 0.1},
        complete_and_notify_s={"p50": 0.05},
        deploy_request_bytes=14_000_000,
        jm_cpu_split_per_s={"jobmanager_threads": 0.06, "in_taskmanager_calls": 0.04},
    )
    document["grpc"] = [
        _healthy(
            subtasks=1000,
            taskmanagers=100,
            parallelism=200,
            jm_cpu_per_s=0.5,
            trigger_fanout_s={"p50": 0.2},
            acks_s={"p50": 0.3},
            complete_and_notify_s={"p50": 0.1},
            ack_wall_s={"p50": 0.02},
            submit_s=1.0,
            deploy_s=4.0,
            heartbeat_grpc_cpu_s=0.0007,
        )
    ]
    text = " ".join(findings(document))
    assert "the trigger fan-out 0.200 s (1.00 ms per source" in text
    assert "(5 times the in-process figure" in text
    assert "then 3.0 ms per task" in text
    assert "100 TaskManagers heartbeating every second take 0.070 cores" in text
    assert "14.0 kB each" in text


def test_the_chart_is_plain_svg_with_a_line_per_series_and_panel() -> None:
    document = _document("abc1234", 0.1)
    document["in_process"].append(_healthy(sweep="subtasks", subtasks=1000, taskmanagers=100, jm_cpu_per_s=0.2))
    document["grpc"] = [_healthy(subtasks=1000, taskmanagers=100, jm_cpu_per_s=0.5, round_trip_s={"p50": 0.6})]
    svg = ElementTree.fromstring(render_chart(document))
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 4  # two panels x (in-process, over gRPC)
    assert "commit abc1234" in "".join(svg.itertext())
    assert render_chart(document | {"in_process": [], "grpc": []}) == ""


def test_an_error_is_shown_on_one_line() -> None:
    grpc_error = (
        "_InactiveRpcError: <_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.DEADLINE_EXCEEDED"
        '\n\tdetails = "Deadline Exceeded"\n\tdebug_error_string = "x"\n>'
    )
    assert error_line(grpc_error) == "DEADLINE_EXCEEDED: Deadline Exceeded"
    assert error_line("not every task RUNNING within 60 s") == "not every task RUNNING within 60 s"
    assert error_line("first\nsecond") == "first"

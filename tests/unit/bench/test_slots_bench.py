"""bench-slots' summary and verdict: the 2-vs-1 ratio is judged against the target only when no run
was measured under a load above the core count (other processes holding the cores hide a slot's own);
where the cores went over a run's window; what a scrape tells; a baseline tree beside this one."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import pytest

from bench.slots_bench import (
    BASELINE_TREE,
    CONFIGS,
    CpuSample,
    Run,
    Scrape,
    cpu_settled,
    parse_scrape,
    render_markdown,
    summarize,
    task_time_shares,
    window_cpu,
)


def run(config: str, records_per_s: float, load: float) -> Run:
    return Run(
        config=config,
        round=1,
        load_average_before=(load, load, load),
        records_per_s=records_per_s,
        cores=1.0,
        cpu_s_per_million=16.0,
        seconds_running_to_finished=10.0,
        taskmanager_peak_rss_bytes=2**27,
        worker_peak_rss_bytes=[],
        worker_idle_rss_bytes=[],
        worker_ready_s=[],
    )


def document(runs: list[Run]) -> dict[str, Any]:
    return {
        "measured_at": "2026-12-04T00:00:00+0000",
        "git": {"commit": "0" * 40, "dirty": False},
        "host": {"cpus": 2, "python": "3.11.7"},
        "events": 400_000,
        "work": 300,
        "rounds": 1,
        "summary": summarize(runs),
        "runs": [asdict(r) for r in runs],
    }


def test_the_ratio_is_slot_processes_two_slots_over_one() -> None:
    runs = [run(CONFIGS[0].name, 50_000, 0.5), run(CONFIGS[1].name, 90_000, 0.5)]
    assert summarize(runs)["ratios"]["slot_processes_2_vs_1"] == 1.8


def test_a_quiet_run_is_judged_against_the_target() -> None:
    met = render_markdown(document([run(CONFIGS[0].name, 50_000, 0.5), run(CONFIGS[1].name, 90_000, 1.2)]))
    assert "1.80x** (target >= 1.7x: met)" in met
    missed = render_markdown(document([run(CONFIGS[0].name, 50_000, 0.5), run(CONFIGS[1].name, 60_000, 0.5)]))
    assert "1.20x** (target >= 1.7x: NOT met)" in missed


def test_a_run_under_load_above_the_cores_is_not_judged() -> None:
    text = render_markdown(document([run(CONFIGS[0].name, 50_000, 0.5), run(CONFIGS[1].name, 90_000, 2.5)]))
    assert "1.80x** (target >= 1.7x: not meaningful: the 1-min load average was above the 2 cores before 1 of 2" in text
    assert ": met)" not in text


def test_the_cores_of_a_window_are_split_by_process_and_the_rest_of_the_machine() -> None:
    samples = [
        CpuSample(0.0, taskmanager=1.0, workers=2.0, jobmanager=1.0, supervisor=0.0, bench=0.5, machine=10.0, stolen=0),
        CpuSample(
            2.0, taskmanager=1.2, workers=5.0, jobmanager=1.1, supervisor=0.2, bench=0.6, machine=14.0, stolen=0.2
        ),
    ]
    # From t=0.5 to t=1.5: a quarter to three quarters of the way, every figure interpolated.
    parts = window_cpu(samples, 0.5, 1.5)
    assert parts is not None
    assert parts["workers"] == pytest.approx(1.5)
    assert parts["taskmanager"] == pytest.approx(0.1)
    assert parts["jobmanager"] == pytest.approx(0.05)
    assert parts["supervisor"] == pytest.approx(0.1)
    assert parts["bench"] == pytest.approx(0.05)
    assert parts["machine"] == pytest.approx(2.0)
    assert parts["stolen"] == pytest.approx(0.1)
    assert parts["other"] == pytest.approx(2.0 - 1.5 - 0.1 - 0.05 - 0.1 - 0.05)
    assert window_cpu(samples, 0.5, 2.5) is None  # past the last sample


def test_a_scrape_gives_the_source_records_and_each_tasks_seconds_of_the_job_only() -> None:
    text = (
        "# TYPE weir_records_out_total counter\n"
        'weir_records_out_total{job_id="j",operator_uid="generator",subtask="0"} 100.0\n'
        'weir_records_out_total{job_id="j",operator_uid="generator",subtask="1"} 50.0\n'
        'weir_records_out_total{job_id="j",operator_uid="window-count-sum",subtask="0"} 7.0\n'
        'weir_records_out_total{job_id="other",operator_uid="generator",subtask="0"} 1000.0\n'
        "# TYPE weir_busy_seconds_total counter\n"
        'weir_busy_seconds_total{job_id="j",operator_uid="generator",subtask="0"} 3.0\n'
        'weir_busy_seconds_total{job_id="other",operator_uid="generator",subtask="0"} 9.0\n'
        "# TYPE weir_idle_seconds_total counter\n"
        'weir_idle_seconds_total{job_id="j",operator_uid="generator",subtask="0"} 1.0\n'
    )
    got = parse_scrape(text, "j")
    assert got.source_records == 150.0
    assert got.task_seconds == {
        "busy": {("generator", "0"): 3.0},
        "idle": {("generator", "0"): 1.0},
        "backpressured": {},
    }


def test_task_time_shares_are_per_second_means_over_subtasks() -> None:
    first = Scrape(0.0, {"busy": {("g", "0"): 1.0, ("g", "1"): 1.0}, "idle": {("g", "0"): 0.0}, "backpressured": {}})
    last = Scrape(0.0, {"busy": {("g", "0"): 3.0, ("g", "1"): 2.0}, "idle": {("g", "0"): 1.0}, "backpressured": {}})
    assert task_time_shares(first, last, 2.0) == {"g": {"busy": 0.75, "idle": 0.5}}


def test_a_baseline_trees_runs_are_summarized_apart_and_rendered_beside() -> None:
    runs = [run(CONFIGS[0].name, 50_000, 0.5), run(CONFIGS[1].name, 90_000, 0.5)]
    runs += [
        replace(run(CONFIGS[0].name, 50_000, 0.5), tree=BASELINE_TREE),
        replace(run(CONFIGS[1].name, 75_000, 0.5), tree=BASELINE_TREE),
    ]
    assert summarize(runs)["ratios"]["slot_processes_2_vs_1"] == 1.8
    assert summarize(runs, BASELINE_TREE)["ratios"]["slot_processes_2_vs_1"] == 1.5
    doc = document(runs)
    doc["scrape"] = "filtered"
    doc["baseline"] = {
        "tree": "/work/base",
        "scrape": "full",
        "git": {"commit": "1" * 40},
        "summary": summarize(runs, BASELINE_TREE),
    }
    text = render_markdown(doc)
    assert "## This tree (`000000000000`, /metrics scraped filtered)" in text
    assert "## Baseline: `/work/base` at `111111111111`, same rounds, /metrics scraped full" in text
    assert "- 2 slots vs 1 slot, slot processes: 1.50x (this tree: 1.80x)" in text


def test_cpu_settles_only_after_a_quiet_second_sampled_whole() -> None:
    """The warm spare's start-up (imports, ~1 s of CPU) must be over before a run is measured."""
    assert not cpu_settled([])
    assert not cpu_settled([(0.0, 1.0), (0.5, 1.0)])  # not yet a second sampled
    assert cpu_settled([(0.0, 1.0), (0.5, 1.0), (1.0, 1.01)])
    assert not cpu_settled([(0.0, 0.2), (0.5, 0.7), (1.0, 1.1)])  # still importing
    assert cpu_settled([(0.0, 0.2), (0.5, 0.7), (1.0, 1.1), (2.0, 1.1)])

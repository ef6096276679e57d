"""bench-slots' summary and verdict: the 2-vs-1 ratio is judged against the target only when no run
was measured under a load above the core count (other processes holding the cores hide a slot's own)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bench.slots_bench import CONFIGS, Run, render_markdown, summarize


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

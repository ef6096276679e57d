"""The benchmark's small statistics and its memory verdict."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import harness
from bench.harness import ProcessSampler, ProcessUsage, Progress, median, percentile
from bench.run import memory_verdict


def test_sustained_rate_excludes_start_up_and_tail() -> None:
    # nothing for 5 s (start-up), then 1,000 events/s, then a slow tail
    samples = ((0.0, 0.0), (5.0, 0.0), (15.0, 10_000.0), (25.0, 10_500.0))
    progress = Progress(samples)
    assert progress.time_at(1_000) == pytest.approx(6.0)
    assert progress.sustained_rate(10_000, low=0.1, high=0.9) == pytest.approx(1_000.0)


def test_sustained_rate_is_none_when_the_progress_never_gets_there() -> None:
    assert Progress(((0.0, 0.0), (1.0, 50.0))).sustained_rate(100) is None


def test_percentile_interpolates_and_median_skips_missing() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    assert median([None, 1.0, 3.0]) == 2.0
    assert median([None]) is None


def _sampler(series_mib: dict[str, list[float]]) -> ProcessSampler:
    sampler = ProcessSampler(keep_series=True)
    for pid, (name, series) in enumerate(series_mib.items(), start=1):
        rss = [int(mib * 2**20) for mib in series]
        sampler.usage[pid] = ProcessUsage(name, pid, 0.0, 0.0, max(rss), [(i * 0.5, r) for i, r in enumerate(rss)])
    return sampler


def test_memory_is_flat_when_rss_settles_after_warm_up() -> None:
    verdict = memory_verdict(_sampler({"taskmanager-1": [100, 150, 160] + [161] * 37}), 1000, 10.0, False)
    assert verdict["flat"] is True
    assert verdict["source_eps"] == 100.0


def test_memory_growing_past_the_allowance_is_not_flat() -> None:
    growing = [100 + 3 * i for i in range(40)]  # +3 MiB per sample: ~90 MiB from 2nd to 4th quarter
    verdict = memory_verdict(_sampler({"taskmanager-1": [150] * 40, "taskmanager-2": growing}), 1000, 10.0, False)
    assert verdict["flat"] is False
    assert verdict["taskmanagers"]["taskmanager-1"]["flat"] is True
    assert verdict["taskmanagers"]["taskmanager-2"]["flat"] is False


def test_services_started_by_a_run_live_in_the_shared_run_directory_not_the_runs_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service started in the run's private directory outlived it (the run deletes it) and kept its
    # port: the next test session's S3 could not start.
    monkeypatch.setenv("WEIR_RUN_DIR", str(tmp_path / "shared"))
    monkeypatch.delenv("WEIR_CHECKPOINT_DIR", raising=False)
    env = harness.prepare_environment("r1", checkpoints_in_s3=False)
    assert env.run_root == tmp_path / "shared" / "bench-r1"
    assert os.environ["WEIR_RUN_DIR"] == str(env.run_root)  # the cluster's processes inherit the private one
    started_in = harness.services_environment(os.environ, env.services_run_dir)
    assert started_in["WEIR_RUN_DIR"] == str(tmp_path / "shared")
    assert harness.services_environment({"A": "1"}, None) == {"A": "1"}

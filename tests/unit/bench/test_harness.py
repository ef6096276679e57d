"""The benchmark's small statistics and its memory verdict."""

from __future__ import annotations

import pytest

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

"""The backpressure scenario's measurements and verdict, on made-up runs (no cluster)."""

from __future__ import annotations

import math

import pytest

from examples.slow_sink_aggregation import SlowWrite
from weir.scenarios.backpressure import (
    BackpressureConfig,
    BackpressureRun,
    CheckpointPoint,
    ModeRun,
    Sample,
    Written,
    check,
    comparison_end,
    measure,
    slope,
)
from weir.scenarios.framework import percentile

CONFIG = BackpressureConfig(events_per_second=2_000, keys=40, window_ms=250, sink_records_per_second=40, run_s=40.0)


def _run(
    mode: str, *, input_rate: float, read_rate: float, sink_rate: float, durations: list[float], latency_s: float = 5.0
) -> ModeRun:
    """A run of 40 s sampled twice a second: the source read ``read_rate``, the sink wrote results
    aggregating ``sink_rate`` events/s (12.5 events each), checkpoints of those durations."""
    samples = tuple(Sample(t / 2, int(input_rate * t / 2), int(read_rate * t / 2)) for t in range(81))
    per_result = CONFIG.events_per_result
    results = int(sink_rate / per_result * 40)
    written = tuple(Written(40 * i / results, latency_s + 0.1 * i / results, int(per_result)) for i in range(results))
    checkpoints = tuple(
        CheckpointPoint(i + 1, 2.0 * i, "COMPLETED", d, 0.0, d * 0.9, "window-count-sum#0", 1000, 0)
        for i, d in enumerate(durations)
    )
    return ModeRun(mode, f"job-{mode}", "", samples, checkpoints, written, 40.0)


def test_slope_and_percentile() -> None:
    assert slope([(0, 1), (1, 3), (2, 5)]) == pytest.approx(2.0)
    assert slope([(1, 1)]) == 0.0
    assert slope([(1, 1), (1, 2)]) == 0.0
    assert percentile([3, 1, 2], 0.5) == 2
    assert math.isnan(percentile([], 0.5))


def test_the_configured_sustainable_rate_follows_from_the_sink_rate() -> None:
    assert CONFIG.events_per_result == 12.5  # 2000 events/s x 0.25 s / 40 keys
    assert CONFIG.sustainable_events_per_second == 1_000  # 40 results/s x 2 subtasks x 12.5


def test_a_backpressured_run_measures_rates_and_the_formula() -> None:
    m = measure(_run("aligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[1, 2, 4, 8, 9, 9]), CONFIG)
    assert m.input_rate == pytest.approx(2000, rel=0.01)
    assert m.sink_events_rate == pytest.approx(1000, rel=0.05)
    assert m.lag_growth == pytest.approx(1000, rel=0.01)
    assert m.formula_growth == pytest.approx(1000, rel=0.05)
    assert (m.completed, m.duration_first_s, m.duration_last_s, m.duration_max_s) == (6, 1.5, 9, 9)
    run = _run("aligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[1, 2, 4, 8, 9, 9])
    report = check(CONFIG, BackpressureRun({"aligned": run}))
    assert report.ok, report.failed
    assert [c.name for c in report.checks] == [
        "checkpoints-completed:aligned",
        "sink-committed:aligned",
        "backpressure:aligned",
        "lag-follows-formula:aligned",
    ]
    assert report.check("lag-follows-formula:aligned").numbers["formula_growth"] == pytest.approx(1000, rel=0.05)


def test_checkpoints_are_ordered_by_id_whatever_order_they_come_in() -> None:
    run = _run("aligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[1, 2, 8])
    reversed_run = ModeRun(run.mode, run.job_id, "", run.samples, run.checkpoints[::-1], run.written, run.duration_s)
    m = measure(reversed_run, CONFIG)
    assert (m.duration_first_s, m.duration_last_s) == (1, 8)


def _failed(**runs: ModeRun) -> set[str]:
    return {c.name for c in check(CONFIG, BackpressureRun(runs)).failed}


def test_no_checkpoint_no_backpressure_and_a_lag_off_the_formula_fail() -> None:
    keeps_up = _run("aligned", input_rate=2000, read_rate=2000, sink_rate=2000, durations=[])
    assert _failed(aligned=keeps_up) == {"checkpoints-completed:aligned", "backpressure:aligned"}
    off = _run("aligned", input_rate=2000, read_rate=1800, sink_rate=1000, durations=[1, 2])  # lag +200/s, not +1000
    assert _failed(aligned=off) == {"lag-follows-formula:aligned"}


def test_unaligned_checkpoints_must_be_clearly_shorter_and_latency_not_lower() -> None:
    aligned = _run("aligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[2, 6, 9, 10])
    good = _run("unaligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[1.2, 1.1, 1.3, 1.2])
    report = check(CONFIG, BackpressureRun({"aligned": aligned, "unaligned": good}))
    assert report.ok, report.failed
    assert len(report.checks) == 10  # four per mode, two comparing them
    numbers = report.check("unaligned-shorter").numbers
    assert (numbers["unaligned_s"], numbers["aligned_s"]) == (1.2, 10)  # none after the warm-up: the last third's

    same = _run("unaligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[2, 6, 9, 9.9])
    assert _failed(aligned=aligned, unaligned=same) == {"unaligned-shorter"}
    detail = check(CONFIG, BackpressureRun({"aligned": aligned, "unaligned": same})).check("unaligned-shorter").detail
    assert "between two buffers" in detail  # its barriers came as late as aligned ones: why

    faster = _run("unaligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[1, 1, 1], latency_s=1.0)
    assert "unaligned-latency-not-lower" in _failed(aligned=aligned, unaligned=faster)


def test_an_unavailable_mode_is_not_measured() -> None:
    aligned = _run("aligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[1, 2])
    unavailable = ModeRun("unaligned", "job-u", "UnsupportedCheckpointAction: ...")
    assert not unavailable.available
    assert comparison_end([aligned, unavailable]) == max(w.written_s for w in aligned.written)
    report = check(CONFIG, BackpressureRun({"aligned": aligned, "unaligned": unavailable}))
    assert report.ok and all(c.name.endswith(":aligned") for c in report.checks)  # only the aligned half judged
    assert any("unavailable in this runtime" in e.value for e in report.evidence)


def test_the_slow_write_paces_each_thread_and_stamps_the_write_time() -> None:
    write = SlowWrite(rate=0)  # no limit: only the stamp
    out = write({"key": "k", "window_end": 1})
    assert out["key"] == "k" and out["written_ms"] > 0


def test_the_modes_are_compared_on_the_median_after_the_warm_up_not_on_a_few_long_ones() -> None:
    """Stop 44's CI: 10 unaligned checkpoints, mostly ~0.8 s, two of 3.9 and 4.9 s (a burst of window
    firings held the task) in the last third, whose median (3.9 s) was then above half the aligned one
    (6.1 s). Compared on the checkpoints triggered after the warm-up (16 s of this 40 s run) instead."""
    aligned = _run("aligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[2, 4] + [6.1] * 10)
    spiky = [0.8] * 8 + [0.9] * 4 + [3.9, 0.8, 4.9, 3.9, 0.8, 4.9]  # checkpoints every 2 s from t=0
    unaligned = _run("unaligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=spiky)
    measured = measure(unaligned, CONFIG)
    assert measured.duration_last_s == 3.9  # the last third's median: two long ones of three
    assert measured.duration_steady_s == 0.9  # triggered at t >= 16 s: checkpoints 9-18
    report = check(CONFIG, BackpressureRun({"aligned": aligned, "unaligned": unaligned}))
    assert report.check("unaligned-shorter").passed, report.check("unaligned-shorter").detail
    assert report.check("unaligned-shorter").numbers["aligned_s"] == 6.1

    long = _run("unaligned", input_rate=2000, read_rate=1000, sink_rate=1000, durations=[0.8] * 8 + [3.9] * 10)
    assert "unaligned-shorter" in _failed(aligned=aligned, unaligned=long)  # long after the warm-up: fails

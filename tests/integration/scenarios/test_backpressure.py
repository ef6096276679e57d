"""The seed's backpressure scenario on a real cluster, smaller (`weir scenario backpressure` runs it at
full size): the keyed aggregation into a slow exactly-once Kafka sink under a faster input, aligned
then unaligned; what the measurements must show."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.scenarios.conftest import run_on
from weir.scenarios.backpressure import SCENARIO, BackpressureConfig, BackpressureRun, measured_modes
from weir.scenarios.framework import Report

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size

# One channel from the source to the window (parallelism 1): its queue holds ~5,000 records, which a
# sink of 40 results/s (x 18.75 events each = 750 events/s) drains in ~7 s, so the aligned barriers
# are late by seconds within a short run while the input (3,000 events/s) outruns the sink. On a loaded
# machine fuller buffers and a bigger first read make the first aligned barrier wait longer (22 s in
# stop 44's CI): each mode's run goes on past run_s until two checkpoints completed (timeout_s more).
CONFIG = BackpressureConfig(
    events_per_second=3_000,
    keys=40,
    window_ms=250,
    sink_records_per_second=40,
    parallelism=1,
    partitions=2,
    run_s=20.0,
    warmup_fraction=0.4,
    timeout_s=60.0,
)

Outcome = tuple[BackpressureRun, Report, str]


@pytest.fixture(scope="module")
def outcome(weir_cluster: WeirCluster) -> Outcome:
    config = replace(CONFIG, topic_prefix=f"bp-{uuid.uuid4().hex[:8]}")
    run, report, text = run_on(weir_cluster, SCENARIO, config)
    assert isinstance(run, BackpressureRun)
    return run, report, text


def test_under_a_slow_sink_the_backlog_grows_as_input_minus_sink_and_aligned_barriers_are_late(
    outcome: Outcome,
) -> None:
    run, report, text = outcome
    for name in ("checkpoints-completed", "sink-committed", "backpressure", "lag-follows-formula"):
        assert report.check(f"{name}:aligned").passed, text
    aligned = measured_modes(CONFIG, run)["aligned"]
    assert aligned.completed >= 1 and aligned.failed == 0, text
    configured_sink = CONFIG.sink_records_per_second * CONFIG.parallelism
    assert aligned.sink_results_rate == pytest.approx(configured_sink, rel=0.15), text
    assert aligned.input_rate == pytest.approx(CONFIG.events_per_second, rel=0.1), text
    lag = report.check("lag-follows-formula:aligned")
    assert lag.number("lag_growth") > 0.3 * lag.number("input_rate"), text  # the backlog grows
    assert abs(lag.number("lag_growth") - lag.number("formula_growth")) <= 0.25 * lag.number("input_rate"), text
    # the barrier waits behind the queue the slow sink drains: seconds, beyond the interval
    assert aligned.duration_max_s > 2 * CONFIG.checkpoint_interval_s, text
    assert aligned.latency_p50_s > 1.0, text  # records wait in the backlog too


def test_unaligned_mode_runs_under_backpressure_without_shortening_latency(outcome: Outcome) -> None:
    run, report, text = outcome
    assert run.runs["unaligned"].available, (
        f"unaligned checkpoints are not functional: {run.runs['unaligned'].unavailable}"
    )
    measured = measured_modes(CONFIG, run)
    aligned, unaligned = measured["aligned"], measured["unaligned"]
    assert unaligned.completed >= 1 and unaligned.failed == 0, text
    assert unaligned.sink_results_rate == pytest.approx(aligned.sink_results_rate, rel=0.15), text
    lag = report.check("lag-follows-formula:unaligned")
    assert abs(lag.number("lag_growth") - lag.number("formula_growth")) <= 0.25 * lag.number("input_rate"), text
    assert report.check("unaligned-latency-not-lower").passed, text  # not shortened by the mode
    # every completed checkpoint's in-flight state was read back from the storage (with a single input
    # channel here, and barriers that do not overtake queued buffers, there is nothing to persist: 0)
    assert len(unaligned.inflight_bytes) == unaligned.completed, text


def test_unaligned_checkpoints_are_shorter_than_aligned_ones_under_backpressure(outcome: Outcome) -> None:
    run, report, text = outcome
    assert run.runs["unaligned"].available, (
        f"unaligned checkpoints are not functional: {run.runs['unaligned'].unavailable}"
    )
    shorter = report.check("unaligned-shorter")
    assert shorter.number("unaligned_s") < CONFIG.unaligned_factor * shorter.number("aligned_s"), text
    assert report.ok, text

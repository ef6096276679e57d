"""The seed's backpressure scenario on a real cluster, smaller (`make scenario-backpressure` runs it at
full size): the keyed aggregation into a slow exactly-once Kafka sink under a faster input, aligned
then unaligned; what the measurements must show."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import pytest
from rich.console import Console

from tests.integration.conftest import WeirCluster
from weir.core.errors import WeirError
from weir.tools.scenario_backpressure import BackpressureConfig, Outcome, print_outcome, run_backpressure_scenario

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size

# One channel from the source to the window (parallelism 1): its queue holds ~5,000 records, which a
# sink of 40 results/s (x 18.75 events each = 750 events/s) drains in ~7 s, so the aligned barriers
# are late by seconds within a short run while the input (3,000 events/s) outruns the sink.
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


@pytest.fixture(scope="module")
def outcome(weir_cluster: WeirCluster) -> Iterator[tuple[Outcome, str]]:
    config = BackpressureConfig(**{**CONFIG.__dict__, "topic_prefix": f"bp-{uuid.uuid4().hex[:8]}"})
    output = io.StringIO()
    console = Console(file=output, width=160)
    try:
        result = run_backpressure_scenario(weir_cluster.endpoints, config, console)
    except WeirError as exc:
        pytest.fail(f"{exc}\n{output.getvalue()}")
    print_outcome(console, result)
    yield result, output.getvalue()


def test_under_a_slow_sink_the_backlog_grows_as_input_minus_sink_and_aligned_barriers_are_late(
    outcome: tuple[Outcome, str],
) -> None:
    result, report = outcome
    aligned = result.measured["aligned"]
    assert aligned.completed >= 1 and aligned.failed == 0, report
    configured_sink = CONFIG.sink_records_per_second * CONFIG.parallelism
    assert aligned.sink_results_rate == pytest.approx(configured_sink, rel=0.15), report
    assert aligned.input_rate == pytest.approx(CONFIG.events_per_second, rel=0.1), report
    assert aligned.lag_growth > 0.3 * aligned.input_rate, report  # the backlog grows
    assert abs(aligned.lag_growth - aligned.formula_growth) <= 0.25 * aligned.input_rate, report
    # the barrier waits behind the queue the slow sink drains: seconds, beyond the interval
    assert aligned.duration_max_s > 2 * CONFIG.checkpoint_interval_s, report
    assert aligned.latency_p50_s > 1.0, report  # records wait in the backlog too


def test_unaligned_mode_runs_under_backpressure_without_shortening_latency(outcome: tuple[Outcome, str]) -> None:
    result, report = outcome
    run = result.runs["unaligned"]
    assert run.available, f"unaligned checkpoints are not functional in this runtime: {run.unavailable}"
    aligned, unaligned = result.measured["aligned"], result.measured["unaligned"]
    assert unaligned.completed >= 1 and unaligned.failed == 0, report
    assert unaligned.sink_results_rate == pytest.approx(aligned.sink_results_rate, rel=0.15), report
    assert abs(unaligned.lag_growth - unaligned.formula_growth) <= 0.25 * unaligned.input_rate, report
    assert unaligned.latency_p50_s >= 0.7 * aligned.latency_p50_s, report  # not shortened by the mode
    # every completed checkpoint's in-flight state was read back from the storage (with a single input
    # channel here, and barriers that do not overtake queued buffers, there is nothing to persist: 0)
    assert len(unaligned.inflight_bytes) == unaligned.completed, report


def test_unaligned_checkpoints_are_shorter_than_aligned_ones_under_backpressure(outcome: tuple[Outcome, str]) -> None:
    result, report = outcome
    run = result.runs["unaligned"]
    assert run.available, f"unaligned checkpoints are not functional in this runtime: {run.unavailable}"
    aligned, unaligned = result.measured["aligned"], result.measured["unaligned"]
    assert unaligned.duration_last_s < CONFIG.unaligned_factor * aligned.duration_last_s, report
    assert not result.problems, report

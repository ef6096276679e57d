"""The seed's fifth scenario on a real cluster, smaller (`make scenario-upgrade` runs it at full size):
v1 of the keyed aggregation on live input, stopped with a savepoint, v2 (a max in the aggregate,
its accumulator migrated; a filter) resumed from it at another parallelism; every window has exactly
one result in each sink, from v1 before the cut and from v2 after it."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tests.integration.conftest import WeirCluster
from weir.core.errors import WeirError
from weir.tools.scenario_upgrade import ScenarioConfig, print_outcome, run_upgrade_scenario

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def test_the_upgrade_scenario_is_exact_and_both_versions_produce_results(
    weir_cluster: WeirCluster, unique: str
) -> None:
    config = ScenarioConfig(
        events=12_000,
        keys=60,
        events_per_second=1_500,
        checkpoint_interval="500ms",
        checkpoints_before_stop=2,
        stop_at_fraction=0.35,
        source_topic=f"upgrade-events-{unique}",
        sink_topic=f"upgrade-results-{unique}",
        dlq_topic=f"upgrade-dlq-{unique}",
        table=f"upgrade_results_{unique}",
        savepoint_dir=f"s3://{weir_cluster.endpoints.s3_bucket}/test-upgrade-savepoints-{unique}",
        timeout_s=120.0,
    )
    output = io.StringIO()
    console = Console(file=output, width=160)
    try:
        outcome = run_upgrade_scenario(weir_cluster.endpoints, config, console)
    except WeirError as exc:
        pytest.fail(f"{exc}\n{output.getvalue()}")
    print_outcome(console, outcome)
    report = output.getvalue()
    assert outcome.ok, report

    expectation = outcome.expectation
    assert expectation.count(1) > 0 and expectation.count(2) > 0, report
    assert expectation.migrated > 0 and expectation.filtered > 0 and expectation.late == 0, report
    assert expectation.events_before + expectation.events_after == config.events
    for sink in outcome.sinks:
        assert dict(sink.by_version) == {1: expectation.count(1), 2: expectation.count(2)}, report
        assert sink.found == len(expectation.results)
    assert outcome.cut.path.startswith(f"{config.savepoint_dir}/savepoint-{outcome.v1_job}-")
    assert [w.subtask for w in outcome.cut.window_watermarks] == [0, 1]  # v1 ran at parallelism 2
    assert outcome.cut.window_state_schemas == ("win v1 (pickle)",)

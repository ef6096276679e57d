"""The seed's fifth scenario on a real cluster, smaller (`weir scenario upgrade` runs it at full size):
v1 of the keyed aggregation on live input, stopped with a savepoint, v2 (a max in the aggregate,
its accumulator migrated; a filter) resumed from it at another parallelism; every window has exactly
one result in each sink, from v1 before the cut and from v2 after it."""

from __future__ import annotations

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.scenarios.conftest import Run
from weir.scenarios.keyed_job import KAFKA_SINK_UID, POSTGRES_SINK_UID, KeyedJob
from weir.scenarios.upgrade import SCENARIO, V1_FILE, UpgradeConfig, expected_results

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def test_the_upgrade_scenario_is_exact_and_both_versions_produce_results(
    weir_cluster: WeirCluster, unique: str, run_scenario: Run
) -> None:
    config = UpgradeConfig(
        job=KeyedJob.named(f"upgrade-{unique}", file=V1_FILE, restart_delay="1s", checkpoint_interval="500ms"),
        events=12_000,
        keys=60,
        events_per_second=1_500,
        checkpoints_before_stop=2,
        stop_at_fraction=0.35,
        savepoint_dir=f"s3://{weir_cluster.endpoints.s3_bucket}/test-upgrade-savepoints-{unique}",
        timeout_s=120.0,
    )
    run, report, text = run_scenario(SCENARIO, config)
    assert report.ok, text
    assert len(report.checks) == 11, text

    v1 = report.check("v1-fired-windows").number("v1_windows")
    v2 = report.check("v2-produced-windows").number("v2_windows")
    migrated, filtered = report.check("windows-migrated"), report.check("v2-filter-dropped")
    assert migrated.number("migrated") > 0 and filtered.number("filtered") > 0, text
    expectation = expected_results(run.records, run.cut, config.job.window_ms)
    assert expectation.late == 0, text
    assert expectation.events_before + expectation.events_after == config.events
    for uid in (KAFKA_SINK_UID, POSTGRES_SINK_UID):
        sink = report.check(f"sink-exact:{uid}")
        assert (sink.number("v1"), sink.number("v2")) == (v1, v2), text
        assert sink.number("found") == sink.number("expected") == len(expectation.results), text
    assert run.cut.path.startswith(f"{config.savepoint_dir}/savepoint-{run.v1_job}-")
    assert [w.subtask for w in run.cut.window_watermarks] == [0, 1]  # v1 ran at parallelism 2
    assert run.cut.window_state_schemas == ("win v1 (pickle)",)

"""The seed's first scenario on a real cluster, smaller (`weir scenario keyed-aggregation` runs it at full
size): the keyed window job on live input, stopped with a savepoint; both sinks hold exactly the fired
windows, the savepoint's keyed state exactly the open ones, every well-formed event counted once."""

from __future__ import annotations

import pytest

from tests.integration.conftest import WeirCluster
from tests.integration.scenarios.conftest import Run
from weir.scenarios.keyed_aggregation import SCENARIO, KeyedAggregationConfig
from weir.scenarios.keyed_job import KAFKA_SINK_UID, POSTGRES_SINK_UID, KeyedJob

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def test_the_keyed_aggregation_state_and_both_sinks_equal_the_reference(
    weir_cluster: WeirCluster, unique: str, run_scenario: Run
) -> None:
    config = KeyedAggregationConfig(
        job=KeyedJob.named(f"keyed-{unique}", window_ms=500, checkpoint_interval="500ms"),
        events=8_000,
        keys=40,
        events_per_second=2_000,
        malformed_every=400,
        savepoint_dir=f"s3://{weir_cluster.endpoints.s3_bucket}/test-keyed-savepoints-{unique}",
        timeout_s=60.0,
    )
    run, report, text = run_scenario(SCENARIO, config)
    assert report.ok, text
    assert len(report.checks) == 19, text

    assert report.check("input-read-back").numbers == {"read": config.events, "produced": config.events}
    dead = report.check("dead-letters-once")
    assert dead.number("dead_letters") == dead.number("malformed") == config.events // config.malformed_every
    split = report.check("windows-fired-and-open")
    fired, still_open = split.number("fired"), split.number("open")
    assert fired > 0 and still_open > 0, text
    assert report.check("state-holds-open-windows").number("found") == still_open
    for uid in (KAFKA_SINK_UID, POSTGRES_SINK_UID):
        assert report.check(f"sink-holds-fired-windows:{uid}").number("found") == fired
        assert report.check(f"sink-and-state-cover-input:{uid}").number("windows") == fired + still_open
        well_formed = report.check(f"each-event-counted-once:{uid}").number("well_formed")
        assert well_formed == config.events - config.malformed
    assert run.job.checkpoints_completed >= 1
    assert run.job.savepoint_path.startswith(f"{config.savepoint_dir}/savepoint-{run.job.job_id}-")
    assert run.job.savepoint_path.endswith(f"-{run.job.savepoint_id}/")

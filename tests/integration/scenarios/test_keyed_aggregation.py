"""The seed's first scenario on a real cluster, smaller (`weir scenario keyed-aggregation` runs it at full
size): the keyed window job on live input, stopped with a savepoint; both sinks hold exactly the fired
windows, the savepoint's keyed state exactly the open ones, every well-formed event counted once."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tests.integration.conftest import WeirCluster
from weir.core.errors import WeirError
from weir.tools.scenario_keyed_aggregation import ScenarioConfig, run_keyed_aggregation_scenario
from weir.tools.scenario_report import ScenarioReport, print_report

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def evidence(report: ScenarioReport, label: str) -> str:
    return next(e.value for e in report.evidence if e.label == label)


def number(report: ScenarioReport, label: str) -> int:
    return int(evidence(report, label).split()[0].replace(",", ""))


def test_the_keyed_aggregation_state_and_both_sinks_equal_the_reference(weir_cluster: WeirCluster, unique: str) -> None:
    config = ScenarioConfig(
        events=8_000,
        keys=40,
        events_per_second=2_000,
        malformed_every=400,
        window_ms=500,
        checkpoint_interval="500ms",
        source_topic=f"keyed-events-{unique}",
        sink_topic=f"keyed-results-{unique}",
        dlq_topic=f"keyed-dlq-{unique}",
        table=f"keyed_results_{unique}",
        savepoint_dir=f"s3://{weir_cluster.endpoints.s3_bucket}/test-keyed-savepoints-{unique}",
        timeout_s=60.0,
    )
    output = io.StringIO()
    console = Console(file=output, width=200)
    try:
        report = run_keyed_aggregation_scenario(weir_cluster.endpoints, config, console)
    except WeirError as exc:
        pytest.fail(f"{exc}\n{output.getvalue()}")
    print_report(console, report)
    text = output.getvalue()
    assert report.ok, text

    assert number(report, "events produced") == config.events
    assert number(report, "malformed (not well-formed events)") == config.events // config.malformed_every
    assert number(report, "dead-letter records") == config.events // config.malformed_every
    fired = number(report, "windows fired at the savepoint (reference)")
    still_open = number(report, "windows open at the savepoint (reference)")
    assert fired > 0 and still_open > 0, text
    assert number(report, "(key, window)s of the input (reference)") == fired + still_open
    assert number(report, "keyed state entries of 'window-count-sum' ('win')") == still_open
    assert number(report, f"records in kafka {config.sink_topic}") == fired
    assert number(report, f"records in postgres {config.table}") == fired
    assert number(report, "checkpoints completed before the savepoint") >= 1
    assert evidence(report, "savepoint").startswith(f"{config.savepoint_dir}/savepoint-")
    assert evidence(report, "savepoint").endswith(f"-{evidence(report, 'savepoint id')}/")
    assert len(report.checks) >= 15

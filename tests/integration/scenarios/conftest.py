"""Running a scenario on the session's cluster: its driver, then its checks, the text report kept for
the assertion messages (the tests assert on the typed results, never on the text)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, TypeAlias

import pytest
from rich.console import Console

from tests.integration.conftest import WeirCluster
from weir.core.errors import WeirError
from weir.scenarios.framework import Report, Scenario, render_text

Run: TypeAlias = Callable[[Scenario[Any, Any], Any], tuple[Any, Report, str]]


def run_on(cluster: WeirCluster, scenario: Scenario[Any, Any], config: Any) -> tuple[Any, Report, str]:
    """What the scenario's driver measured on the session's cluster, its report, and the report as text
    (the driver's progress first); a run that could not be carried to its end fails the test with it."""
    cluster.wait_for_taskmanagers()  # an earlier test may have killed one
    output = io.StringIO()
    console = Console(file=output, width=180)
    try:
        measured, report = scenario.run(cluster.endpoints, config, console)
    except WeirError as exc:
        pytest.fail(f"scenario {scenario.name}: {exc}\n{output.getvalue()}")
    render_text(console, report)
    return measured, report, failed_first(report) + output.getvalue()


def failed_first(report: Report) -> str:
    """The failed checks (and the run's error) in one line each, ahead of the whole report: a long
    assertion message is cut in the middle by pytest and CI, and the failed check was what got lost."""
    lines = [f"FAILED {c.name}: {c.detail}" for c in report.failed]
    if report.error:
        lines.append(f"ERROR {report.error}")
    return "".join(f"{line}\n" for line in lines)


@pytest.fixture
def run_scenario(weir_cluster: WeirCluster) -> Run:
    """``run_scenario(SCENARIO, config)``: :func:`run_on` the session's cluster."""
    return lambda scenario, config: run_on(weir_cluster, scenario, config)

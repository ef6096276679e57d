"""`weir scenario`: the registry of the design card's scenarios, the program the CLI launches, each
scenario's jobs, and the one report every scenario hands back (a check that failed, no check at all, or
a run that could not be carried to its end is a FAIL and exit 1)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from weir.api import load_job_file
from weir.scenarios import registry
from weir.scenarios.framework import Report, ReportBuilder, Scenario, Table, Verdict, render_text
from weir.scenarios.keyed_job import JOB_FILE, UIDS, KeyedJob
from weir.tools.cli import EXIT_OK, EXIT_USAGE, run_cli

REPO = Path(__file__).resolve().parents[4]


def test_every_scenario_of_the_registry_has_a_make_target_and_a_unique_name() -> None:
    names = [s.name for s in registry.SCENARIOS]
    assert len(names) == len(set(names))
    makefile = (REPO / "Makefile").read_text()
    listed = re.search(r"^SCENARIOS := (.*)$", makefile, re.MULTILINE)
    assert listed is not None and listed.group(1).split() == names
    for name in names:
        assert re.search(rf"^scenario-{name}: .*\n\t\$\(PY\) -m weir.tools.cli scenario {name} ", makefile, re.M)
        assert registry.scenario(name).name == name
    with pytest.raises(KeyError):
        registry.scenario("no-such")


@pytest.mark.parametrize("scenario", registry.SCENARIOS, ids=lambda s: s.name)
def test_each_scenarios_jobs_load_with_the_parameters_it_gives_them(scenario: Scenario[Any, Any]) -> None:
    specs = scenario.jobs(scenario.defaults)
    assert specs
    for spec in specs:
        job = load_job_file(spec.file, dict(spec.parameters))
        assert job.graph.transformations, spec.command()
        assert spec.command().startswith(f"{spec.file.name} ")


def test_the_shared_keyed_job_has_the_uids_and_parameters_the_scenarios_read() -> None:
    job = KeyedJob.named("t-1", window_ms=500, bounded=True, records_per_second=10, restart_delay="2s")
    topics = (job.source_topic, job.sink_topic, job.dlq_topic, job.table)
    assert topics == ("t-1-events", "t-1-results", "t-1-dlq", "t_1_results")
    params = job.parameters()
    assert params["window.size_ms"] == "500" and params["source.bounded"] == "true"
    assert params["source.records_per_second"] == "10"
    assert (params["restart.strategy"], params["restart.delay"]) == ("fixed-delay", "2s")
    loaded = load_job_file(JOB_FILE, params)
    assert set(loaded.graph.transformations) == set(UIDS)
    no_table = job.with_(table=None)
    assert "sink.table" not in no_table.parameters() and set(no_table.topics(4)) == {
        "t-1-events",
        "t-1-results",
        "t-1-dlq",
    }


# The program the CLI launches -------------------------------------------------------------------------------


def test_the_cli_lists_the_scenarios_and_refuses_an_unknown_one(capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["scenario"]) == EXIT_OK
    listing = capfd.readouterr().out
    for s in registry.SCENARIOS:
        assert s.name in listing
    assert run_cli(["scenario", "no-such"]) == EXIT_USAGE
    err = capfd.readouterr().err
    assert "unknown scenario 'no-such'" in err and "keyed-aggregation" in err


def test_the_cli_gives_the_scenario_its_own_arguments(capfd: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["scenario", "recovery", "--help"]) == EXIT_OK
    out = capfd.readouterr().out
    assert "weir scenario recovery" in out and "--records-per-second" in out and "--json" in out
    # a combination that makes no run is refused before anything is started
    assert run_cli(["scenario", "barriers", "--checkpoints", "2", "--inspected", "3"]) == EXIT_USAGE
    assert "--inspected must be between 1 and --checkpoints" in capfd.readouterr().err


# The report ---------------------------------------------------------------------------------------------


def _printed(report: Report) -> str:
    out = io.StringIO()
    render_text(Console(file=out, width=200), report)
    return out.getvalue()


def test_a_report_passes_only_when_it_checked_something_and_every_check_passed() -> None:
    builder = ReportBuilder("x", "an outcome")
    assert not builder.build().ok and builder.build().exit_code == 1  # nothing checked proves nothing
    assert "the run checked nothing" in _printed(builder.build())
    builder.verify("state-exact", "state equals the reference", True, "12 = 12", state=12, reference=12)
    assert builder.build().ok and builder.build().exit_code == 0
    builder.verify("no-duplicate", "no duplicate", False, "1 duplicate", duplicates=1)
    report = builder.build()
    assert not report.ok and report.exit_code == 1 and report.verdict is Verdict.FAIL
    assert [c.name for c in report.failed] == ["no-duplicate"]
    assert report.check("state-exact").numbers == {"state": 12, "reference": 12}
    assert report.check("state-exact").number("state") == 12
    builder.verify("flags", "flags are no numbers", True, "", caught_up=True, gids=("g",))
    with pytest.raises(TypeError, match="caught_up is True, not a number"):
        builder.build().check("flags").number("caught_up")
    with pytest.raises(KeyError, match="no check 'missing'"):
        report.check("missing")
    with pytest.raises(ValueError, match="made twice"):
        builder.verify("state-exact", "again", True, "")


def test_a_run_that_could_not_be_carried_to_its_end_fails_even_with_passing_checks() -> None:
    builder = ReportBuilder("x", "an outcome")
    builder.verify("a", "a holds", True, "1 = 1")
    broken = Report(**{**builder.build().__dict__, "error": "job j1 ended FAILED before RUNNING"})
    assert not broken.ok and broken.exit_code == 1
    assert "could not be carried to its end: job j1 ended FAILED" in _printed(broken)


def test_the_text_shows_every_check_with_its_verdict_and_numbers() -> None:
    builder = ReportBuilder("demo", "the card's outcome")
    builder.step("produced 10 events")
    builder.measured("records replayed", 42)
    builder.table(Table("per sink", ("sink", "found"), (("kafka", "10"),)))
    builder.verify("sinks-exact", "sinks exact", True, "10 = 10", found=10)
    builder.verify("state-once", "state counts each event once", False, "9 = 10", counted=9)
    text = _printed(builder.build())
    for part in ("scenario demo", "the card's outcome", "1. produced 10 events", "records replayed", "42", "per sink"):
        assert part in text
    for check in builder.build().checks:
        line = next(line for line in text.splitlines() if check.name in line)
        assert check.verdict.value in line and check.statement in line and check.detail in line
    assert "scenario demo: FAIL (1 of 2 checks failed)" in text


def test_the_json_document_holds_every_check_with_its_numbers() -> None:
    builder = ReportBuilder("demo", "the card's outcome")
    builder.verify("per-epoch", "each epoch seen", True, "2 epochs", epochs=({"checkpoint": 3, "records": 5},))
    builder.verify("latency", "latency measured", True, "none", p50_s=float("nan"), max_s=float("inf"))
    document = json.loads(json.dumps(builder.build().to_json(), allow_nan=False))
    assert (document["format"], document["version"], document["verdict"]) == ("weir.scenario-report", 1, "PASS")
    assert document["checks"] == [
        {
            "name": "per-epoch",
            "statement": "each epoch seen",
            "passed": True,
            "numbers": {"epochs": [{"checkpoint": 3, "records": 5}]},
            "detail": "2 epochs",
        },
        {
            "name": "latency",
            "statement": "latency measured",
            "passed": True,
            "numbers": {"p50_s": None, "max_s": None},  # nothing measured is null, not NaN
            "detail": "none",
        },
    ]

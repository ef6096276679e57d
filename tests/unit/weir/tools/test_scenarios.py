"""`weir scenario`: the registry of the design card's scenarios, the CLI that runs one by name, and the
report every scenario prints (a check that failed, or no check at all, is a FAIL and exit 1)."""

from __future__ import annotations

import importlib
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from weir.tools import scenarios
from weir.tools.cli import EXIT_OK, EXIT_USAGE, run_cli
from weir.tools.scenario_report import ScenarioReport, exit_code, print_report, summary_lines

REPO = Path(__file__).resolve().parents[4]


def test_every_scenario_of_the_registry_has_a_make_target_and_a_unique_name() -> None:
    names = [s.name for s in scenarios.SCENARIOS]
    assert len(names) == len(set(names))
    makefile = (REPO / "Makefile").read_text()
    listed = re.search(r"^SCENARIOS := (.*)$", makefile, re.MULTILINE)
    assert listed is not None and listed.group(1).split() == names
    for name in names:
        assert re.search(rf"^scenario-{name}: .*\n\t\$\(PY\) -m weir.tools.cli scenario {name} ", makefile, re.M)


def test_every_registered_module_has_a_main(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in scenarios.SCENARIOS:
        try:
            module = importlib.import_module(s.module)
        except ModuleNotFoundError as exc:  # a scenario not merged yet must name itself, not fail oddly
            pytest.fail(f"scenario {s.name}: module {s.module} missing ({exc})")
        assert callable(module.main), s.name


def test_the_cli_runs_the_named_scenario_with_its_own_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[str, list[str]]] = []

    def fake_run(name: str, argv: list[str]) -> int:
        seen.append((name, list(argv)))
        return 1

    monkeypatch.setattr(scenarios, "run_scenario", fake_run)
    assert run_cli(["scenario", "recovery", "--events", "100", "--help"]) == 1
    assert seen == [("recovery", ["--events", "100", "--help"])]


def test_the_cli_lists_the_scenarios_and_refuses_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["scenario"]) == EXIT_OK
    listing = capsys.readouterr().out
    for s in scenarios.SCENARIOS:
        assert s.name in listing
    assert run_cli(["scenario", "no-such"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "unknown scenario 'no-such'" in err and "keyed-aggregation" in err


def _printed(report: ScenarioReport) -> str:
    out = io.StringIO()
    print_report(Console(file=out, width=200), report)
    return out.getvalue()


def test_a_report_passes_only_when_it_checked_something_and_every_check_passed() -> None:
    report = ScenarioReport("x", "an outcome")
    assert not report.ok and exit_code(report) == 1  # nothing checked proves nothing
    assert "the run checked nothing" in _printed(report)
    report.verify("state equals the reference", True, "12 = 12")
    assert report.ok and exit_code(report) == 0
    report.verify("no duplicate", False, "1 duplicate")
    assert not report.ok and exit_code(report) == 1
    assert [c.statement for c in report.failed] == ["no duplicate"]
    assert summary_lines(report) == ["PASS state equals the reference (12 = 12)", "FAIL no duplicate (1 duplicate)"]


def test_the_printed_report_shows_steps_evidence_and_each_verdict() -> None:
    report = ScenarioReport("demo", "the card's outcome")
    report.step("produced 10 events")
    report.measured("records replayed", 42)
    report.verify("sinks exact", True, "10 = 10")
    text = _printed(report)
    for part in ("scenario demo", "the card's outcome", "1. produced 10 events", "records replayed", "42", "PASS"):
        assert part in text
    assert "scenario demo: PASS" in text

"""What every ``weir scenario`` prints: the steps it took, the evidence it measured, and the design
card's outcome as checked statements (PASS/FAIL, each with its numbers).

A scenario builds a :class:`ScenarioReport` from a real run and hands it to :func:`print_report`; its
exit status is :func:`exit_code` (1 when any check failed, or when there is no check at all: a
scenario that proves nothing has not passed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from rich.console import Console
from rich.table import Table

from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.tools.drive import s3_endpoints, start_local_cluster

PASS: Final = "PASS"
WIDE: Final = 150  # columns when the output is not a terminal (a log, a pipe)
FAIL: Final = "FAIL"


@dataclass(frozen=True)
class Evidence:
    """One measured fact of the run: what was measured and its value, with units."""

    label: str
    value: str


@dataclass(frozen=True)
class Check:
    """One statement of the outcome, checked against the measurements: ``numbers`` says what was
    compared (e.g. ``"state 12,000 = reference 12,000"``), so a FAIL explains itself."""

    statement: str
    passed: bool
    numbers: str

    @property
    def verdict(self) -> str:
        return PASS if self.passed else FAIL


def check(statement: str, passed: bool, numbers: str) -> Check:
    return Check(statement, bool(passed), numbers)


@dataclass
class ScenarioReport:
    """A scenario's run: its name, the card's outcome it demonstrates, then what happened."""

    name: str
    outcome: str  # the design card's verifiable outcome, in its words
    steps: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)

    def step(self, text: str) -> None:
        self.steps.append(text)

    def measured(self, label: str, value: object) -> None:
        self.evidence.append(Evidence(label, str(value)))

    def verify(self, statement: str, passed: bool, numbers: str) -> Check:
        result = check(statement, passed, numbers)
        self.checks.append(result)
        return result

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def ok(self) -> bool:
        return bool(self.checks) and not self.failed


def exit_code(report: ScenarioReport) -> int:
    return 0 if report.ok else 1


def print_report(console: Console, report: ScenarioReport) -> None:
    console.rule(f"[bold]scenario {report.name}")
    console.print(f"[bold]outcome (design card):[/] {report.outcome}", soft_wrap=True, highlight=False)
    if report.steps:
        console.print("[bold]what it did:[/]")
        for n, text in enumerate(report.steps, 1):
            console.print(f"  {n}. {text}", soft_wrap=True, highlight=False)
    for table in report.tables:
        console.print(table)
    if report.evidence:
        evidence = Table("evidence", "measured", title="evidence", title_justify="left")
        evidence.columns[1].overflow = "fold"
        for e in report.evidence:
            evidence.add_row(e.label, e.value)
        console.print(evidence)
    checks = Table("", "statement", "numbers", title="checked outcome", title_justify="left")
    checks.columns[2].overflow = "fold"
    for c in report.checks:
        checks.add_row(f"[green]{PASS}[/]" if c.passed else f"[red]{FAIL}[/]", c.statement, c.numbers)
    console.print(checks)
    if not report.checks:
        console.print(f"[red]{FAIL}[/]: the run checked nothing")
    verdict = f"[green]{PASS}[/]" if report.ok else f"[red]{FAIL}[/] ({len(report.failed)} of {len(report.checks)})"
    console.print(f"scenario {report.name}: {verdict}", highlight=False)


def summary_lines(report: ScenarioReport) -> Sequence[str]:
    """The checked outcome as plain lines (for notes and logs): ``PASS statement (numbers)``."""
    return [f"{c.verdict} {c.statement} ({c.numbers})" for c in report.checks]


def run_on_local_cluster(name: str, title: str, run: Callable[[Endpoints, Console], ScenarioReport]) -> int:
    """What a scenario's ``main`` does once its arguments are parsed: start the local cluster (or use
    the one up) with checkpoints in the S3 bucket, run, print the report; the exit status (1 on a
    FAIL, or when the run could not be carried to its end)."""
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, WIDE)
    endpoints = s3_endpoints()
    console.rule(f"[bold]Weir scenario: {title}")
    try:
        start_local_cluster(console, endpoints)
        report = run(endpoints, console)
    except WeirError as exc:
        console.print(f"[bold red]scenario {name}: {exc}[/]", soft_wrap=True)
        return 1
    print_report(console, report)
    return exit_code(report)

"""The scenario framework: what every ``weir scenario NAME`` is made of, and the one report it hands back.

A scenario is three things (:class:`Scenario`):

- its **job**: the job file and its parameters (:class:`JobSpec`), from the scenario's configuration;
- its **driver**: what it does to the cluster (recreate the inputs, submit, wait, kill, stop with a
  savepoint, resume...); it answers one value with everything it measured, and decides nothing;
- its **checks**: a pure function of the configuration and that value, building one :class:`Report`
  whose checks are typed results (:class:`CheckResult`: a name, passed or not, the numbers it measured
  and compared, and the part of the design card's outcome it states).

The report is rendered as text for the CLI (:func:`render_text`) or as one JSON document
(:meth:`Report.to_json`, ``--json``); the exit status is 1 when a check failed, or when there was no
check at all (a run that proves nothing has not passed), or when the run could not be carried to its
end. Tests call the driver and the checks and assert on the results, never on the printed text.

Flink keeps its end-to-end tests out of the product, in a module of their own
(``flink-end-to-end-tests``) that drives a cluster through the client and the CLI. This package is
Weir's: it sits above the tools (it uses the client, ``weir verify``'s comparisons and the savepoint
readers); the product never imports it, and ``weir scenario`` launches it as a program.
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Generic, TypeAlias, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.tools.client import JobManagerClient
from weir.tools.drive import s3_endpoints, start_local_cluster

WIDE: Final = 150  # columns when the output is not a terminal (a log, a pipe)
REPORT_FORMAT: Final = "weir.scenario-report"
REPORT_VERSION: Final = 1
EXAMPLES: Final = Path(__file__).resolve().parents[2] / "examples"

Scalar: TypeAlias = int | float | str | bool | None
Figure: TypeAlias = Scalar | tuple["Figure", ...] | Mapping[str, "Figure"]


class ScenarioError(WeirError):
    """The scenario could not be run to its end (a job failed, a wait timed out, a watcher failed...):
    the run proves nothing either way, and the scenario exits 1 with this one line."""


class UsageError(ValueError):
    """A scenario's arguments do not make a run (``configure`` raises it; the CLI says so, exit 2)."""


class Verdict(enum.StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"


# The report ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    """One statement of the card's outcome, checked against what the run measured.

    ``name`` is stable within its scenario (tests and JSON readers select a check by it);
    ``numbers`` are the measured values the check compared, by name; ``detail`` says the same in a
    sentence (``"12,000 found = 12,000 expected"``), so a FAIL explains itself in the text report."""

    name: str
    statement: str
    passed: bool
    numbers: Mapping[str, Figure]
    detail: str

    @property
    def verdict(self) -> Verdict:
        return Verdict.PASS if self.passed else Verdict.FAIL

    def number(self, name: str) -> int | float:
        """The measured number ``name``; TypeError when that figure is not one (a reader's mistake)."""
        value = self.numbers[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"check {self.name}: {name} is {value!r}, not a number")
        return value


@dataclass(frozen=True)
class Evidence:
    """One measured fact of the run, for the reader: what was measured and its value, with units."""

    label: str
    value: str


@dataclass(frozen=True)
class Table:
    """A table of the run (a timeline, a comparison): cells are already text."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Report:
    """A scenario's run: the card's outcome it demonstrates, what it did, what it measured, and each
    statement of the outcome checked. ``error``: why the run could not be carried to its end."""

    scenario: str
    outcome: str
    checks: tuple[CheckResult, ...] = ()
    steps: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    tables: tuple[Table, ...] = ()
    notes: tuple[str, ...] = ()  # samples of what went wrong, worth a look when a check failed
    error: str = ""

    def check(self, name: str) -> CheckResult:
        """The check named ``name``; KeyError when the run made no such check."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"scenario {self.scenario} made no check {name!r}; its checks: {[c.name for c in self.checks]}")

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.checks) and not self.failed

    @property
    def verdict(self) -> Verdict:
        return Verdict.PASS if self.ok else Verdict.FAIL

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON document (``weir scenario NAME --json``; docs/scenarios.md)."""
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "scenario": self.scenario,
            "outcome": self.outcome,
            "verdict": self.verdict.value,
            "error": self.error or None,
            "checks": [
                {
                    "name": c.name,
                    "statement": c.statement,
                    "passed": c.passed,
                    "numbers": _json_figure(c.numbers),
                    "detail": c.detail,
                }
                for c in self.checks
            ],
            "steps": list(self.steps),
            "evidence": [{"label": e.label, "value": e.value} for e in self.evidence],
            "tables": [
                {"title": t.title, "columns": list(t.columns), "rows": [list(r) for r in t.rows]} for t in self.tables
            ],
            "notes": list(self.notes),
        }


def _json_figure(value: Figure) -> Any:
    """A figure as JSON has it: tuples become lists, a number that is not finite (no value measured:
    a percentile of nothing) becomes null."""
    match value:
        case float() if not math.isfinite(value):
            return None
        case tuple():
            return [_json_figure(v) for v in value]
        case Mapping():
            return {k: _json_figure(v) for k, v in value.items()}
        case _:
            return value


class ReportBuilder:
    """Collects a report while the checks run; :meth:`build` answers the frozen :class:`Report`."""

    def __init__(self, scenario: str, outcome: str) -> None:
        self.scenario, self.outcome = scenario, outcome
        self._checks: list[CheckResult] = []
        self._steps: list[str] = []
        self._evidence: list[Evidence] = []
        self._tables: list[Table] = []
        self._notes: list[str] = []

    def step(self, text: str) -> None:
        self._steps.append(text)

    def measured(self, label: str, value: object) -> None:
        self._evidence.append(Evidence(label, str(value)))

    def table(self, table: Table) -> None:
        self._tables.append(table)

    def note(self, text: str) -> None:
        self._notes.append(text)

    def verify(self, name: str, statement: str, passed: bool, detail: str, **numbers: Figure) -> CheckResult:
        """Record one check; its name must be new in this report (a programming error otherwise)."""
        if any(c.name == name for c in self._checks):
            raise ValueError(f"scenario {self.scenario}: check {name!r} made twice")
        result = CheckResult(name, statement, bool(passed), dict(numbers), detail)
        self._checks.append(result)
        return result

    def build(self) -> Report:
        return Report(
            self.scenario,
            self.outcome,
            tuple(self._checks),
            tuple(self._steps),
            tuple(self._evidence),
            tuple(self._tables),
            tuple(self._notes),
        )


def render_text(console: Console, report: Report) -> None:
    """The report as the CLI prints it: the outcome, the steps, the tables, the evidence, each check
    with its verdict and numbers, and the scenario's verdict."""
    console.rule(f"[bold]scenario {report.scenario}")
    console.print(f"[bold]outcome (design card):[/] {report.outcome}", soft_wrap=True, highlight=False)
    if report.steps:
        console.print("[bold]what it did:[/]")
        for n, text in enumerate(report.steps, 1):
            console.print(f"  {n}. {text}", soft_wrap=True, highlight=False, markup=False)
    for table in report.tables:
        console.print(_rich_table(table))
    if report.evidence:
        evidence = RichTable("evidence", "measured", title="evidence", title_justify="left")
        evidence.columns[1].overflow = "fold"
        for e in report.evidence:
            evidence.add_row(e.label, e.value)
        console.print(evidence)
    for note in report.notes:
        console.print(f"  {note}", soft_wrap=True, markup=False, highlight=False)
    checks = RichTable("", "check", "statement", "numbers", title="checked outcome", title_justify="left")
    checks.columns[3].overflow = "fold"
    for c in report.checks:
        colour = "green" if c.passed else "red"
        checks.add_row(f"[{colour}]{c.verdict.value}[/]", c.name, c.statement, c.detail)
    console.print(checks)
    if report.error:
        broken = f"the run could not be carried to its end: {report.error}"
        console.print(f"[bold red]{Verdict.FAIL.value}[/]: {escape(broken)}", soft_wrap=True, highlight=False)
    elif not report.checks:
        console.print(f"[red]{Verdict.FAIL.value}[/]: the run checked nothing")
    verdict = (
        f"[green]{Verdict.PASS.value}[/]"
        if report.ok
        else f"[red]{Verdict.FAIL.value}[/] ({len(report.failed)} of {len(report.checks)} checks failed)"
    )
    console.print(f"scenario {report.scenario}: {verdict}", highlight=False)


def _rich_table(table: Table) -> RichTable:
    out = RichTable(*table.columns, title=table.title, title_justify="left")
    for row in table.rows:
        out.add_row(*row)
    return out


# The job and the scenario ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """A job as a scenario submits it: the job file, its ``-D`` parameters, its parallelism and, for
    a job resumed from a savepoint, where from."""

    file: Path
    parameters: Mapping[str, str]
    parallelism: int
    from_savepoint: str | None = None

    def command(self) -> str:
        """What ``weir run`` would be given: for the steps a report lists."""
        resumed = f" --from-savepoint {self.from_savepoint}" if self.from_savepoint else ""
        defines = "".join(f" -D {k}={v}" for k, v in self.parameters.items())
        return f"{self.file.name}{resumed} -p {self.parallelism}{defines}"

    def submit(self, client: JobManagerClient) -> str:
        return str(
            client.submit_job(self.file, dict(self.parameters), self.parallelism, from_checkpoint=self.from_savepoint)
        )


C = TypeVar("C")
R = TypeVar("R")


@dataclass(frozen=True)
class Scenario(Generic[C, R]):
    """One of the design card's scenarios (module docstrings say what each does and checks).

    ``defaults`` is its configuration when run as ``weir scenario NAME``; ``arguments`` adds its
    options to the parser, ``configure`` turns the parsed options into a configuration (UsageError
    for a combination that does not make a run); ``jobs`` are the jobs it submits; ``drive`` runs it
    on the cluster already up and answers what it measured; ``check`` builds the report from that."""

    name: str
    title: str
    summary: str
    outcome: str
    defaults: C
    arguments: Callable[[argparse.ArgumentParser, C], None]
    configure: Callable[[argparse.Namespace, C], C]
    jobs: Callable[[C], tuple[JobSpec, ...]]
    drive: Callable[[Endpoints, C, Console], R]
    check: Callable[[C, R], Report]

    def run(self, endpoints: Endpoints, config: C, console: Console) -> tuple[R, Report]:
        """Drive, then check: what the tests call on the session's cluster."""
        measured = self.drive(endpoints, config, console)
        return measured, self.check(config, measured)

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"weir scenario {self.name}", description=self.summary)
        self.arguments(parser, self.defaults)
        parser.add_argument(
            "--json", action="store_true", help="print the report as one JSON document on stdout (progress on stderr)"
        )
        return parser


def run_main(scenario: Scenario[Any, Any], argv: Sequence[str]) -> int:
    """``weir scenario NAME [ARGS]``: parse the arguments, start the local cluster (or use the one up)
    with checkpoints in the S3 bucket, drive, check, print the report (text, or JSON with ``--json``);
    the exit status (1 on a FAIL, or when the run could not be carried to its end; 2 for bad arguments)."""
    parser = scenario.parser()
    args = parser.parse_args(list(argv))
    try:
        config = scenario.configure(args, scenario.defaults)
    except UsageError as exc:
        parser.error(str(exc))
    console = Console(stderr=bool(args.json))
    if not console.is_terminal:
        console.width = max(console.width, WIDE)
    endpoints = s3_endpoints()
    console.rule(f"[bold]Weir scenario: {scenario.title}")
    try:
        start_local_cluster(console, endpoints)
        _measured, report = scenario.run(endpoints, config, console)
    except WeirError as exc:
        report = Report(scenario.name, scenario.outcome, error=str(exc))
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n")
    else:
        render_text(console, report)
    return report.exit_code


# Numbers, as the checks and the reports show them -----------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def distribution(values: Sequence[float]) -> str:
    """Seconds as ``p50 .. ms, p95 .. ms, max .. ms (n=..)``."""
    if not values:
        return "none"
    return (
        f"p50 {percentile(values, 0.5) * 1000:,.0f} ms, p95 {percentile(values, 0.95) * 1000:,.0f} ms, "
        f"max {max(values) * 1000:,.0f} ms (n={len(values):,})"
    )


def clock(ms: int) -> str:
    """An event time (epoch ms) as UTC clock time, with its value."""
    if abs(ms) > 10**14:  # a watermark that has not started (Long.MIN_VALUE)
        return f"none yet ({ms})"
    return f"{datetime.fromtimestamp(ms / 1000, UTC).strftime('%H:%M:%S.%f')[:-3]} UTC ({ms})"


def millis(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


@dataclass
class Samples:
    """The first few lines describing what went wrong (a duplicate, a missing window...), shortened."""

    limit: int = 5
    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        if len(self.lines) < self.limit:
            self.lines.append(text if len(text) <= 300 else text[:297] + "...")

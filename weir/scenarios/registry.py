"""The design card's scenarios, by name: what ``weir scenario NAME`` and ``make scenario-NAME`` run.

``python -m weir.scenarios [NAME [ARGS]]`` is the program (``weir scenario`` launches it): no name
lists the scenarios; an unknown name is refused in one line (exit 2); otherwise the scenario runs on
the local cluster and exits 1 when a check failed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from weir.scenarios import backpressure, barriers, keyed_aggregation, recovery, two_phase_commit, upgrade
from weir.scenarios.framework import Scenario, run_main

SCENARIOS: Final[tuple[Scenario[Any, Any], ...]] = (
    keyed_aggregation.SCENARIO,
    barriers.SCENARIO,
    two_phase_commit.SCENARIO,
    recovery.SCENARIO,
    upgrade.SCENARIO,
    backpressure.SCENARIO,
)
EXIT_USAGE: Final = 2


def scenario(name: str) -> Scenario[Any, Any]:
    """The scenario named ``name``; KeyError for an unknown name."""
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(name)


def names() -> str:
    return ", ".join(s.name for s in SCENARIOS)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("--help", "-h"):
        out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)
        out.print("weir scenario NAME [ARGS]: the design card's scenarios (`weir scenario NAME --help` for ARGS)")
        table = Table("name", "shows")
        for s in SCENARIOS:
            table.add_row(s.name, s.summary)
        out.print(table)
        return 0
    try:
        chosen = scenario(args[0])
    except KeyError:
        print(f"weir: error: unknown scenario {args[0]!r}; the scenarios are {names()}", file=sys.stderr)
        return EXIT_USAGE
    return run_main(chosen, args[1:])

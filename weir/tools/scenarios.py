"""The design card's scenarios, by name: what ``weir scenario NAME`` and ``make scenario-NAME`` run.

Each is a module with ``main(argv) -> int`` that runs on the local cluster against the real services
(it starts the cluster, or uses the one up), prints what it did, the evidence it measured and the
card's outcome as checked statements, and answers 1 when a check failed.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol, cast


@dataclass(frozen=True)
class Scenario:
    name: str
    module: str
    summary: str


SCENARIOS: Final = (
    Scenario(
        "keyed-aggregation",
        "weir.tools.scenario_keyed_aggregation",
        "the stateful keyed window job: its state and both sinks equal a reference computed from the input",
    ),
    Scenario(
        "barriers",
        "weir.tools.scenario_barriers",
        "a two-input job: per channel when barrier N arrived and how long it was held; the snapshot holds "
        "exactly the pre-barrier records; completion is a recovery point, not when output became visible",
    ),
    Scenario(
        "two-phase-commit",
        "weir.tools.scenario_two_phase_commit",
        "within one checkpoint: the open Kafka transaction and the prepared PostgreSQL transaction, then both "
        "committed after completion; each sink's own proof",
    ),
    Scenario(
        "recovery",
        "weir.tools.scenario_recovery",
        "a TaskManager SIGKILLed after pre-commit: aborted records only for read_uncommitted, replay counted, "
        "state and both sinks exact, partial cross-sink success reconciled by weir verify",
    ),
    Scenario(
        "upgrade",
        "weir.tools.scenario_upgrade",
        "v1 stopped with a savepoint, v2 (changed aggregate and filter) resumed from it at another parallelism",
    ),
    Scenario(
        "backpressure",
        "weir.tools.scenario_backpressure",
        "a slow sink: aligned checkpoints slow down, unaligned ones do not, record latency stays",
    ),
)


class _Main(Protocol):
    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def scenario(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(name)


def run_scenario(name: str, argv: Sequence[str]) -> int:
    """Run scenario ``name`` with its own arguments; KeyError for an unknown name."""
    module = importlib.import_module(scenario(name).module)
    return cast(_Main, module.main)(list(argv))

"""The seed's two-phase-commit scenario on a real cluster, shortened (`weir scenario two-phase-commit`
runs it with a 5 s interval): within each observed checkpoint interval the Kafka transaction is open
(read_uncommitted sees its records, read_committed does not) and the PostgreSQL transaction is seen
prepared, then both commit after the checkpoint completed; each sink's own proof counts what was seen."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from tests.integration.conftest import WeirCluster
from weir.core.errors import WeirError
from weir.tools.scenario_report import print_report, summary_lines
from weir.tools.scenario_two_phase_commit import ScenarioConfig, run_two_phase_commit_scenario

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size

CHECKPOINTS = 3


def test_each_sink_shows_its_open_or_prepared_transaction_then_commits_after_completion(
    weir_cluster: WeirCluster, unique: str
) -> None:
    config = ScenarioConfig(
        events_per_second=200,
        checkpoint_interval_s=2.0,
        checkpoints=CHECKPOINTS,
        sink_topic=f"tpc-results-{unique}",
        table=f"tpc_results_{unique}",
        timeout_s=60.0,
    )
    output = io.StringIO()
    console = Console(file=output, width=160)
    weir_cluster.wait_for_taskmanagers()
    try:
        report = run_two_phase_commit_scenario(weir_cluster.endpoints, config, console)
    except WeirError as exc:
        pytest.fail(f"{exc}\n{output.getvalue()}")
    print_report(console, report)
    printed = output.getvalue()
    assert report.ok, printed
    numbers = {c.statement: c.numbers for c in report.checks}
    assert len(numbers) == 10, summary_lines(report)

    (open_txn,) = [n for s, n in numbers.items() if s.startswith("during interval N")]
    reads = re.findall(r"holds (\d+) on partitions \[[^]]*\], read_uncommitted (\d+), read_committed (\d+)", open_txn)
    assert len(reads) == CHECKPOINTS and all(int(n) > 0 and n == u and c == "0" for n, u, c in reads), open_txn

    (caught,) = [n for s, n in numbers.items() if "seen prepared" in s]
    found = re.match(r"caught in (\d+) of (\d+) checkpoints", caught)
    assert found is not None and int(found[1]) >= 1 and int(found[2]) == CHECKPOINTS, caught
    assert re.search(r"weir:[0-9a-f]+:postgres-sink:0:\d{20}", caught), caught

    (kafka_proof,) = [n for s, n in numbers.items() if "Kafka sink's own proof" in s]
    markers = re.findall(r"marker (\d+) = read_committed (\d+)", kafka_proof)
    assert len(markers) == CHECKPOINTS and all(m == c and int(m) > 0 for m, c in markers), kafka_proof
    # 200 events/s for a 2 s interval: each epoch holds about 400 events
    assert all(200 <= int(m) <= 600 for m, _c in markers), kafka_proof

    (pg_proof,) = [n for s, n in numbers.items() if "PostgreSQL sink's own proof" in s]
    rows = re.findall(r"proof (\d+) = rows added (\d+)", pg_proof)
    assert len(rows) == int(found[1]) and all(p == a for p, a in rows), pg_proof

"""The seed's two-phase-commit scenario on a real cluster, shortened (`weir scenario two-phase-commit`
runs it with a 5 s interval): within each observed checkpoint interval the Kafka transaction is open
(read_uncommitted sees its records, read_committed does not) and the PostgreSQL transaction is seen
prepared, then both commit after the checkpoint completed; each sink's own proof counts what was seen."""

from __future__ import annotations

import re

import pytest

from tests.integration.scenarios.conftest import Run
from weir.scenarios.two_phase_commit import SCENARIO, TwoPhaseCommitConfig

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size

CHECKPOINTS = 3


def test_each_sink_shows_its_open_or_prepared_transaction_then_commits_after_completion(
    unique: str, run_scenario: Run
) -> None:
    config = TwoPhaseCommitConfig(
        events_per_second=200,
        checkpoint_interval_s=2.0,
        checkpoints=CHECKPOINTS,
        sink_topic=f"tpc-results-{unique}",
        table=f"tpc_results_{unique}",
        timeout_s=60.0,
    )
    run, report, text = run_scenario(SCENARIO, config)
    assert report.ok, text
    assert len(report.checks) == 10, text
    assert len(run.epochs) == CHECKPOINTS, text

    intervals = report.check("open-kafka-transaction").numbers["intervals"]
    assert isinstance(intervals, tuple) and len(intervals) == CHECKPOINTS, text
    for interval in intervals:
        assert isinstance(interval, dict)
        assert interval["open_records"] == interval["read_uncommitted"] > 0 and interval["read_committed"] == 0, text

    caught = report.check("postgres-prepared-seen").numbers
    assert isinstance(caught["caught"], int) and caught["caught"] >= 1 and caught["checkpoints"] == CHECKPOINTS, text
    gids = caught["gids"]
    assert isinstance(gids, tuple) and all(re.fullmatch(r"weir:[0-9a-f]+:postgres-sink:0:\d{20}", str(g)) for g in gids)

    epochs = report.check("kafka-proof").numbers["epochs"]
    assert isinstance(epochs, tuple) and len(epochs) == CHECKPOINTS, text
    for epoch in epochs:
        assert isinstance(epoch, dict)
        # 200 events/s for a 2 s interval: each epoch holds about 400 events
        assert epoch["marker_records"] == epoch["read_committed"], text
        assert isinstance(epoch["marker_records"], int) and 200 <= epoch["marker_records"] <= 600, text

    rows = report.check("postgres-proof").numbers["epochs"]
    assert isinstance(rows, tuple) and len(rows) == caught["caught"], text
    assert all(isinstance(r, dict) and r["proof_rows"] == r["rows_added"] for r in rows), text

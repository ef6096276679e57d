"""The seed's aligned-barriers scenario on a real cluster, shortened (`weir scenario barriers` runs it at
full size): a two-input keyed job whose payments input delivers its barriers late; the orders channels
are held until they come, the snapshot holds exactly the pre-barrier records, and output is visible to
read_uncommitted long before the checkpoint that lets read_committed see it completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.scenarios.conftest import Run
from weir.scenarios.barriers import INPUTS, SCENARIO, BarriersConfig

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def test_barriers_divide_the_inputs_and_completion_is_a_recovery_point_not_visibility(
    unique: str, tmp_path: Path, run_scenario: Run
) -> None:
    config = BarriersConfig(
        # The holds are forced: the payments source waits at a gate across each checkpoint's trigger
        # until the orders source acknowledged it, plus forced_hold_ms (no pauses left to chance).
        payments_pause_ms=0,
        gate=tmp_path,
        forced_hold_ms=150.0,
        min_hold_ms=50.0,
        # Visibility is measured against the interval: read_uncommitted must see a record before its
        # checkpoint completed (90 %) and within half an interval (p95). Under make test's load (two
        # clusters and the unit tests on two cores) the test's own consumer lags; 3 s leaves it room.
        checkpoint_interval_s=3.0,
        checkpoints=4,
        inspected=2,
        sink_topic=f"barriers-output-{unique}",
        timeout_s=90.0,
    )
    run, report, text = run_scenario(SCENARIO, config)
    assert report.ok, text
    assert len(report.checks) == 10, text

    # per channel: barrier N on both inputs of every subtask, the orders channel held for the late payments one
    assert len(run.inspected) >= config.checkpoints, text
    for cp in run.inspected:
        assert [s.subtask for s in cp.subtasks] == list(range(config.parallelism)), text
        for s in cp.subtasks:
            assert sorted(c.input_name for c in s.channels) == sorted(INPUTS), text
            assert s.alignment_end_at == pytest.approx(max(c.barrier_at or 0.0 for c in s.channels), abs=0.05), text
    held = report.check("alignment-exercised")
    assert held.number("longest_hold_ms") >= config.min_hold_ms and held.number("held_records") > 0, text  # forced
    assert report.check("barriers-divide-events").number("violations") == 0

    # the snapshots: every inspected one exact, per input and per key
    snapshots = report.check("snapshot-totals").numbers["checkpoints"]
    assert isinstance(snapshots, tuple) and len(snapshots) == config.inspected, text
    for snapshot in snapshots:
        assert isinstance(snapshot, dict)
        for i in INPUTS:
            assert snapshot[f"{i}_counted"] == snapshot[f"{i}_position"] > 0, text
    assert report.check("snapshot-per-key").number("mismatched") == 0

    # visibility: committed only after completion, uncommitted far earlier
    committed = report.check("committed-exactly-once")
    assert committed.number("covered") == committed.number("expected") > 0, text
    assert committed.number("missing") == committed.number("duplicates") == 0, text
    after = report.check("committed-after-completion")
    assert after.number("early") == 0 and after.number("min_after_completion_s") >= -0.005, text
    latency = report.check("processing-did-not-wait")
    assert latency.number("uncommitted_p50_s") < latency.number("committed_p50_s"), text

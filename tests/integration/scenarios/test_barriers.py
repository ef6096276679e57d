"""The seed's aligned-barriers scenario on a real cluster, shortened (`weir scenario barriers` runs it at
full size): a two-input keyed job whose payments input delivers its barriers late; the orders channels
are held until they come, the snapshot holds exactly the pre-barrier records, and output is visible to
read_uncommitted long before the checkpoint that lets read_committed see it completes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tests.integration.conftest import WeirCluster
from weir.core.errors import WeirError
from weir.tools.scenario_backpressure import percentile
from weir.tools.scenario_barriers import (
    INPUTS,
    BarriersConfig,
    build_report,
    check_holds,
    measure_visibility,
    records_expected,
    run_barriers,
)
from weir.tools.scenario_report import print_report

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def test_barriers_divide_the_inputs_and_completion_is_a_recovery_point_not_visibility(
    weir_cluster: WeirCluster, unique: str, tmp_path: Path
) -> None:
    config = BarriersConfig(
        # The holds are forced: the payments source waits at a gate across each checkpoint's trigger
        # until the orders source acknowledged it, plus forced_hold_ms (no pauses left to chance).
        payments_pause_ms=0,
        gate=tmp_path,
        forced_hold_ms=150.0,
        min_hold_ms=50.0,
        checkpoint_interval_s=1.5,
        checkpoints=4,
        inspected=2,
        sink_topic=f"barriers-output-{unique}",
        timeout_s=60.0,
    )
    output = io.StringIO()
    console = Console(file=output, width=160)
    try:
        run = run_barriers(weir_cluster.endpoints, config, console)
    except WeirError as exc:
        pytest.fail(f"{exc}\n{output.getvalue()}")
    report = build_report(run)
    print_report(console, report)
    text = output.getvalue()
    assert report.ok, text

    # per channel: barrier N on both inputs of every subtask, the orders channel held for the late payments one
    assert len(run.inspected) >= config.checkpoints, text
    for cp in run.inspected:
        assert [s.subtask for s in cp.subtasks] == list(range(config.parallelism)), text
        for s in cp.subtasks:
            assert sorted(c.input_name for c in s.channels) == sorted(INPUTS), text
            assert s.alignment_end_at == pytest.approx(max(c.barrier_at or 0.0 for c in s.channels), abs=0.05), text
    hold = check_holds(run.inspected, run.records)
    assert hold.held_records > 0 and not hold.violations, text
    longest = max(h for cp in run.inspected for s in cp.subtasks for c in s.channels if (h := s.held_s(c)) is not None)
    assert longest * 1000 >= config.min_hold_ms, text  # the forced hold, seen in the timeline

    # the snapshots: every inspected one exact, per input and per key
    assert len(run.states) == config.inspected, text
    for state in run.states:
        assert state.totals_match and not state.mismatched, text
        assert all(state.positions[i] > 0 for i in INPUTS), text

    # visibility: committed only after completion, uncommitted far earlier
    v = measure_visibility(run.cuts, run.records, run.committed_duplicates)
    assert v.covered == records_expected(run.cuts) and not v.committed_early, text
    assert min(v.after_completion_s) >= -0.005, text
    assert percentile(v.uncommitted_latency_s, 0.5) < percentile(v.committed_latency_s, 0.5), text

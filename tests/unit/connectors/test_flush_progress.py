"""FlushProgress: when a transactional flush gives up on a broker that acknowledges nothing."""

from __future__ import annotations

from weir.connectors.kafka import FlushProgress


def test_pending_records_that_never_fall_stall_after_the_window() -> None:
    progress = FlushProgress(pending=10, since=100.0, stall_s=15.0)
    assert not progress.stalled(10, 100.5)
    assert not progress.stalled(10, 114.9)
    assert progress.stalled(10, 115.0)


def test_each_acknowledgement_restarts_the_window() -> None:
    progress = FlushProgress(pending=10, since=0.0, stall_s=5.0)
    assert not progress.stalled(9, 4.0)
    assert not progress.stalled(9, 8.9)  # 4.9 s since the last one fell
    assert not progress.stalled(3, 8.95)
    assert not progress.stalled(3, 13.9)
    assert progress.stalled(3, 13.95)


def test_a_count_that_does_not_fall_is_no_progress() -> None:
    progress = FlushProgress(pending=4, since=0.0, stall_s=2.0)
    assert not progress.stalled(4, 1.0)
    assert not progress.stalled(5, 1.5)  # more pending (a delivery retried) is not an acknowledgement
    assert progress.stalled(5, 2.0)
    assert progress.since == 0.0

"""The TaskManager's leader-term fence: a deposed JobManager's calls are refused once a newer one called."""

from __future__ import annotations

import pytest

from weir.core.transport import LEADER_TERM_METADATA
from weir.taskmanager.leader_fence import LeaderTermFence, StaleLeaderError, term_of


def test_a_lower_term_is_refused_after_a_higher_one_was_seen() -> None:
    fence = LeaderTermFence()
    fence.admit(1, "deploy")
    fence.admit(2, "trigger checkpoint")
    fence.admit(2, "notify checkpoint complete")
    with pytest.raises(StaleLeaderError, match="leader term 1, and this TaskManager already follows term 2"):
        fence.admit(1, "notify checkpoint complete of job j")
    assert fence.highest == 2


def test_a_jobmanager_without_high_availability_is_term_zero_and_never_fenced_by_itself() -> None:
    fence = LeaderTermFence()
    for _ in range(3):
        fence.admit(term_of([], LEADER_TERM_METADATA), "cancel")
    assert fence.highest == 0


def test_the_term_is_read_from_the_calls_metadata() -> None:
    assert term_of([("authorization", "x"), (LEADER_TERM_METADATA, "7")], LEADER_TERM_METADATA) == 7
    assert term_of([(LEADER_TERM_METADATA, b"12")], LEADER_TERM_METADATA) == 12
    assert term_of([(LEADER_TERM_METADATA, "nonsense")], LEADER_TERM_METADATA) == -1  # refused once any term is seen

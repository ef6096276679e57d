"""Which checkpoints a takeover may restore: none a deposed leader wrote after a newer leader's takeover."""

from __future__ import annotations

import itertools

from weir.core.ids import CheckpointId
from weir.jobmanager.checkpointing.term_fences import (
    TermFence,
    WrittenCheckpoint,
    is_stale,
    stale_checkpoints,
    takeover_fence,
    with_fence,
)


def written(checkpoint_id: int, term: int) -> WrittenCheckpoint:
    return WrittenCheckpoint(CheckpointId(checkpoint_id), term)


def test_a_late_checkpoint_of_the_deposed_term_is_stale_and_the_new_terms_are_not() -> None:
    """Term 1 completed 1..3; term 2 took over having listed them; term 1 then landed 4 late; term 2
    went on with 5 and 6 (its ids are reserved above term 1's)."""
    fences = (TermFence(2, CheckpointId(3)),)
    checkpoints = [written(1, 1), written(2, 1), written(3, 1), written(4, 1), written(5, 2), written(6, 2)]
    assert stale_checkpoints(checkpoints, fences) == {CheckpointId(4)}


def test_a_takeover_that_found_no_checkpoint_fences_every_older_term_checkpoint() -> None:
    fences = (TermFence(2, None),)
    assert stale_checkpoints([written(1, 1), written(2, 0), written(3, 2)], fences) == {
        CheckpointId(1),
        CheckpointId(2),
    }


def test_without_fences_nothing_is_stale() -> None:
    """No high availability (term 0 everywhere, no takeover fence), or a job no leader took over."""
    assert stale_checkpoints([written(i, 0) for i in range(1, 6)], ()) == frozenset()


def test_each_of_several_takeovers_fences_the_terms_before_it() -> None:
    fences = (TermFence(2, CheckpointId(3)), TermFence(3, CheckpointId(6)))
    checkpoints = [
        written(3, 1),
        written(4, 1),
        written(5, 2),
        written(6, 2),
        written(7, 2),
        written(8, 1),
        written(9, 3),
    ]
    assert stale_checkpoints(checkpoints, fences) == {CheckpointId(4), CheckpointId(7), CheckpointId(8)}


def test_the_rule_over_every_small_case() -> None:
    """Exhaustive over ids 1..4, terms 0..3 and one or two fences: stale exactly when some fence of a
    higher term did not list the checkpoint; a checkpoint of the highest fence's term or newer, or one
    every higher fence listed, is kept."""
    throughs: list[CheckpointId | None] = [None, *(CheckpointId(i) for i in range(1, 5))]
    single = [TermFence(t, th) for t in range(1, 4) for th in throughs]
    for fences in itertools.chain(((f,) for f in single), itertools.combinations(single, 2)):
        for checkpoint_id, term in itertools.product(range(1, 5), range(4)):
            c = written(checkpoint_id, term)
            higher = [f for f in fences if f.term > term]
            listed_by_all = all(
                f.checkpoints_through is not None and checkpoint_id <= f.checkpoints_through for f in higher
            )
            assert is_stale(c, fences) is not listed_by_all, (c, fences)


def test_a_takeover_fence_lists_the_highest_kept_checkpoint_and_a_terms_first_fence_stays() -> None:
    assert takeover_fence(4, [CheckpointId(2), CheckpointId(9), CheckpointId(5)]) == TermFence(4, CheckpointId(9))
    assert takeover_fence(4, []) == TermFence(4, None)
    fences = with_fence((TermFence(3, CheckpointId(2)),), TermFence(2, CheckpointId(1)))
    assert fences == (TermFence(2, CheckpointId(1)), TermFence(3, CheckpointId(2)))
    assert with_fence(fences, TermFence(3, CheckpointId(8))) == fences

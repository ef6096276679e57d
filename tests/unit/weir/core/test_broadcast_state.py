"""Broadcast state stored once per distinct copy (``weir.core.broadcast_state``), checked exhaustively
over small jobs: every parallelism up to 4, every broadcast prefix up to 3 rules, every way an
unaligned barrier can split each subtask's rules between its state and its in-flight records, and every
new parallelism up to 5. Each subtask restored holds what an uninterrupted run holds, and the
checkpoint stores one object per distinct copy (one at an aligned checkpoint)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from weir.core.broadcast_state import (
    BroadcastStateRef,
    content_digest,
    inherited_copy,
    place_operator_states,
)
from weir.core.task_state import InlineOperatorState, read_operator_states
from weir.operators.broadcast import BroadcastStates

UID = "rules-op"
RULES = (("cpu", 90), ("disk", 50), ("cpu", 80))


def apply(states: BroadcastStates, rules: Sequence[tuple[str, int]]) -> None:
    """The broadcast side: each rule bumps its name's version, so a rule applied twice or missed
    changes the map."""
    states.writing = True
    for name, limit in rules:
        rules_state = states.state("rules")
        version, _ = rules_state.get(name) or (0, None)
        rules_state.put(name, (version + 1, limit))
    states.writing = False


def held(states: BroadcastStates) -> dict[str, object]:
    return dict(states.entries.get("rules", {}))


def key_of(uid: str, digest: str) -> str:
    return f"job/checkpoints/chk-7/broadcast/{uid}/{digest}"


def checkpoint(applied: Sequence[int]) -> tuple[dict[str, bytes], list[InlineOperatorState]]:
    """Subtask ``i`` applied the first ``applied[i]`` rules when its barrier came: what storage holds
    and each subtask's handle."""
    storage: dict[str, bytes] = {}
    handles = []
    for count in applied:
        states = BroadcastStates()
        apply(states, RULES[:count])
        blob = states.snapshot()
        placement = place_operator_states({UID: blob} if blob is not None else {}, {UID}, key_of)
        assert dict(placement.own) == {}
        for key, data in placement.writes.items():
            assert storage.get(key, data) == data  # a key is only ever written with the same bytes
            storage[key] = data
        handles.append(InlineOperatorState({}, dict(placement.broadcast)))
    return storage, handles


def restored(handle: InlineOperatorState, storage: dict[str, bytes]) -> BroadcastStates:
    states = BroadcastStates()
    data = read_operator_states(handle, storage.__getitem__).get(UID)
    if data is not None:
        states.restore(UID, data)
    return states


def uninterrupted(prefix: int) -> dict[str, object]:
    states = BroadcastStates()
    apply(states, RULES[:prefix])
    return held(states)


CASES = [
    (parallelism, prefix, applied)
    for parallelism in range(1, 5)
    for prefix in range(len(RULES) + 1)
    for applied in itertools.product(range(prefix + 1), repeat=parallelism)
]


@pytest.mark.parametrize(("parallelism", "prefix", "applied"), CASES)
def test_each_subtask_restores_its_own_copy_and_replays_its_own_inflight_rules(
    parallelism: int, prefix: int, applied: tuple[int, ...]
) -> None:
    """The barrier came after ``prefix`` rules; subtask ``i`` had applied ``applied[i]`` of them, the
    rest in flight in its input (its channel state, replayed to it after a restore)."""
    storage, handles = checkpoint(applied)
    assert len(storage) == len({count for count in applied if count > 0})  # one object per distinct copy
    for subtask, count in enumerate(applied):
        states = restored(handles[subtask], storage)
        apply(states, RULES[count:prefix])
        assert held(states) == uninterrupted(prefix), (subtask, applied)


@pytest.mark.parametrize("old", range(1, 5))
@pytest.mark.parametrize("new", range(1, 6))
@pytest.mark.parametrize("prefix", range(len(RULES) + 1))
def test_an_aligned_checkpoint_stores_one_copy_that_every_new_subtask_restores(old: int, new: int, prefix: int) -> None:
    """Aligned (also every checkpoint a restore at another parallelism accepts: in-flight records of a
    broadcast edge are refused there), every subtask applied the whole prefix."""
    storage, handles = checkpoint([prefix] * old)
    assert len(storage) == (1 if prefix else 0)
    assert len({h.broadcast[UID].key for h in handles if h.broadcast}) == len(storage)
    for subtask in range(new):
        source = inherited_copy(subtask, old)
        assert 0 <= source < old
        assert held(restored(handles[source], storage)) == uninterrupted(prefix)


def test_another_subtasks_copy_with_this_subtasks_inflight_rules_would_be_wrong() -> None:
    """Why there is no one designated copy for all at an unaligned checkpoint: subtask 0 applied both
    rules, subtask 1 only the first (the second in flight). Subtask 0's copy plus subtask 1's replay
    applies the second rule twice."""
    storage, handles = checkpoint([2, 1])
    assert len(storage) == 2
    designated = restored(handles[0], storage)
    apply(designated, RULES[1:2])
    assert held(designated) != uninterrupted(2)


def test_inherited_copy_is_round_robin_over_the_old_subtasks() -> None:
    assert [inherited_copy(s, 3) for s in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [inherited_copy(s, 5) for s in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="both must be valid"):
        inherited_copy(0, 0)


def test_only_the_named_operators_state_is_content_addressed() -> None:
    placement = place_operator_states({"enrich": b"rules", "sink": b"txn", "__inflight__": b"x"}, {"enrich"}, key_of)
    digest = content_digest(b"rules")
    assert dict(placement.own) == {"sink": b"txn", "__inflight__": b"x"}
    assert dict(placement.broadcast) == {"enrich": BroadcastStateRef("enrich", key_of("enrich", digest), 5, digest)}
    assert dict(placement.writes) == {key_of("enrich", digest): b"rules"}


def test_copies_in_another_order_are_stored_once_each_and_each_restores_its_own() -> None:
    """From a broadcast input of two channels, two subtasks interleave the same rules differently at
    an aligned checkpoint: the maps hold the same entries in another order, so their bytes (and
    content addresses) differ; each is stored once and each subtask restores its own."""
    one, other = BroadcastStates(), BroadcastStates()
    apply(one, [("cpu", 90), ("disk", 50)])
    apply(other, [("disk", 50), ("cpu", 90)])
    assert held(one) == held(other)
    blobs = [s.snapshot() for s in (one, other)]
    assert blobs[0] is not None and blobs[1] is not None
    placements = [place_operator_states({UID: b}, {UID}, key_of) for b in blobs]
    storage = {k: v for p in placements for k, v in p.writes.items()}
    assert len(storage) == 2
    for placement, states in zip(placements, (one, other), strict=True):
        again = restored(InlineOperatorState({}, dict(placement.broadcast)), storage)
        assert list(held(again).items()) == list(held(states).items())

from __future__ import annotations

from collections import Counter

import pytest

from weir.core.ids import KeyGroup, SubtaskIndex
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask
from weir.taskmanager.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    KeyGroupPartitioner,
    Partitioner,
    Partitioning,
    RebalancePartitioner,
    create_partitioner,
)


def test_forward_sends_to_own_subtask() -> None:
    partitioner = ForwardPartitioner(SubtaskIndex(2), 4, 4)
    assert partitioner.num_channels == 4
    assert partitioner.select_channels(None) == (2,)
    assert partitioner.select_channels(KeyGroup(7)) == (2,)


def test_forward_needs_equal_parallelism() -> None:
    with pytest.raises(ValueError, match="equal parallelism"):
        ForwardPartitioner(SubtaskIndex(0), 2, 3)
    with pytest.raises(ValueError, match="subtask index"):
        ForwardPartitioner(SubtaskIndex(2), 2, 2)


@pytest.mark.parametrize(("max_parallelism", "parallelism"), [(128, 1), (128, 3), (128, 128), (10, 7), (32768, 5)])
def test_key_group_partitioner_routes_to_the_owner(max_parallelism: int, parallelism: int) -> None:
    partitioner = KeyGroupPartitioner(max_parallelism, parallelism)
    assert partitioner.num_channels == parallelism
    for subtask in range(parallelism):
        for key_group in key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(subtask)):
            assert partitioner.select_channels(key_group) == (subtask,)


def test_key_group_partitioner_spreads_keys() -> None:
    partitioner = KeyGroupPartitioner(128, 4)
    counts = Counter(partitioner.select_channels(key_group_for_key(f"k{i}", 128))[0] for i in range(40_000))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > 9000


@pytest.mark.parametrize("bad", [None, -1, 128, 10**6])
def test_key_group_partitioner_rejects_missing_or_out_of_range_key_groups(bad: int | None) -> None:
    partitioner = KeyGroupPartitioner(128, 4)
    with pytest.raises(ValueError, match="key group in 0..127"):
        partitioner.select_channels(bad)  # type: ignore[arg-type]


def test_key_group_partitioner_validates_parallelism() -> None:
    with pytest.raises(ValueError):
        KeyGroupPartitioner(4, 5)
    with pytest.raises(ValueError):
        KeyGroupPartitioner(4, 0)


def test_rebalance_round_robin_from_own_offset() -> None:
    first = RebalancePartitioner(SubtaskIndex(0), 3)
    assert [first.select_channels(None)[0] for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    fifth = RebalancePartitioner(SubtaskIndex(4), 3)
    assert [fifth.select_channels(None)[0] for _ in range(4)] == [1, 2, 0, 1]
    counts = Counter(first.select_channels(None)[0] for _ in range(3000))
    assert set(counts.values()) == {1000}


def test_broadcast_selects_all_channels() -> None:
    partitioner = BroadcastPartitioner(3)
    assert partitioner.select_channels(None) == (0, 1, 2)
    assert partitioner.select_channels(KeyGroup(1)) == (0, 1, 2)


@pytest.mark.parametrize("make", [lambda: RebalancePartitioner(SubtaskIndex(0), 0), lambda: BroadcastPartitioner(0)])
def test_zero_channels_rejected(make: object) -> None:
    with pytest.raises(ValueError, match="at least one output channel"):
        make()  # type: ignore[operator]


def _create(partitioning: Partitioning, downstream_parallelism: int) -> Partitioner:
    return create_partitioner(
        partitioning,
        subtask=SubtaskIndex(1),
        upstream_parallelism=2,
        downstream_parallelism=downstream_parallelism,
        max_parallelism=128,
    )


def test_create_partitioner() -> None:
    assert isinstance(_create(Partitioning.FORWARD, 2), ForwardPartitioner)
    hashed = _create(Partitioning.HASH, 4)
    assert isinstance(hashed, KeyGroupPartitioner)
    assert hashed.select_channels(KeyGroup(127)) == (3,)
    assert _create(Partitioning.REBALANCE, 4).select_channels(None) == (1,)
    assert _create(Partitioning.BROADCAST, 4).select_channels(None) == (0, 1, 2, 3)
    assert Partitioning("hash") is Partitioning.HASH
    with pytest.raises(ValueError, match="parallelism must be"):
        _create(Partitioning.HASH, 200)
    with pytest.raises(ValueError, match="equal parallelism"):
        _create(Partitioning.FORWARD, 4)

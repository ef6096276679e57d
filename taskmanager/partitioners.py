"""Partitioners: choose the output channels of a record on an exchange between two operators.

Output channel ``i`` of a subtask leads to subtask ``i`` of the downstream operator. Every partitioner
answers ``select_channels(key_group)`` with a tuple of channel indexes; the tuples are built once at
construction, so the per-record call allocates nothing. Callers on the hot path should bind the method
once (``select = partitioner.select_channels``).
"""

from __future__ import annotations

import itertools
from typing import Protocol

from weir.core.ids import ChannelIndex, KeyGroup, SubtaskIndex
from weir.core.keygroups import check_parallelism, subtask_table
from weir.graph import Partitioning


class Partitioner(Protocol):
    """Chooses the output channels of one record."""

    @property
    def num_channels(self) -> int: ...

    def select_channels(self, key_group: KeyGroup | None) -> tuple[ChannelIndex, ...]: ...


def _check_channels(num_channels: int, subtask: SubtaskIndex) -> None:
    if num_channels < 1:
        raise ValueError(f"an exchange needs at least one output channel, got {num_channels}")
    if subtask < 0:
        raise ValueError(f"subtask index must be >= 0, got {subtask}")


class ForwardPartitioner:
    """Sends every record to the downstream subtask with the same index: channel = own subtask."""

    __slots__ = ("_channels", "num_channels")

    def __init__(self, subtask: SubtaskIndex, upstream_parallelism: int, downstream_parallelism: int) -> None:
        if upstream_parallelism != downstream_parallelism:
            raise ValueError(
                f"forward partitioning needs equal parallelism on both sides, got {upstream_parallelism} "
                f"upstream and {downstream_parallelism} downstream; use rebalance or hash partitioning"
            )
        _check_channels(downstream_parallelism, subtask)
        if subtask >= upstream_parallelism:
            raise ValueError(f"subtask index must be in 0..{upstream_parallelism - 1}, got {subtask}")
        self.num_channels = downstream_parallelism
        self._channels = (ChannelIndex(subtask),)

    def select_channels(self, key_group: KeyGroup | None) -> tuple[ChannelIndex, ...]:
        return self._channels


class KeyGroupPartitioner:
    """Hash partitioning: a record goes to the downstream subtask owning its key group."""

    __slots__ = ("_table", "max_parallelism", "num_channels")

    def __init__(self, max_parallelism: int, downstream_parallelism: int) -> None:
        owners = subtask_table(max_parallelism, downstream_parallelism)
        singles = [(ChannelIndex(i),) for i in range(downstream_parallelism)]
        self._table: tuple[tuple[ChannelIndex, ...], ...] = tuple(singles[owner] for owner in owners)
        self.max_parallelism = max_parallelism
        self.num_channels = downstream_parallelism

    def select_channels(self, key_group: KeyGroup | None) -> tuple[ChannelIndex, ...]:
        try:
            if key_group >= 0:  # type: ignore[operator]
                return self._table[key_group]  # type: ignore[index]
        except (TypeError, IndexError):
            pass
        raise ValueError(
            f"hash partitioning needs a key group in 0..{self.max_parallelism - 1}, got {key_group!r}; "
            "was the record keyed with the downstream operator's max parallelism?"
        )


class RebalancePartitioner:
    """Round-robin over all channels, starting at the subtask's own index so senders do not collide."""

    __slots__ = ("_cycle", "num_channels")

    def __init__(self, subtask: SubtaskIndex, downstream_parallelism: int) -> None:
        _check_channels(downstream_parallelism, subtask)
        singles = [(ChannelIndex(i),) for i in range(downstream_parallelism)]
        offset = subtask % downstream_parallelism
        self._cycle = itertools.cycle(singles[offset:] + singles[:offset])
        self.num_channels = downstream_parallelism

    def select_channels(self, key_group: KeyGroup | None) -> tuple[ChannelIndex, ...]:
        return next(self._cycle)


class BroadcastPartitioner:
    """Sends every record to every channel."""

    __slots__ = ("_channels", "num_channels")

    def __init__(self, downstream_parallelism: int) -> None:
        _check_channels(downstream_parallelism, SubtaskIndex(0))
        self.num_channels = downstream_parallelism
        self._channels = tuple(ChannelIndex(i) for i in range(downstream_parallelism))

    def select_channels(self, key_group: KeyGroup | None) -> tuple[ChannelIndex, ...]:
        return self._channels


def create_partitioner(
    partitioning: Partitioning,
    *,
    subtask: SubtaskIndex,
    upstream_parallelism: int,
    downstream_parallelism: int,
    max_parallelism: int,
) -> Partitioner:
    """The partitioner for one subtask's output to an exchange.

    ``max_parallelism`` is the downstream operator's: it fixes the key groups of a hash exchange.
    """
    check_parallelism(max_parallelism, downstream_parallelism)
    if partitioning is Partitioning.FORWARD:
        return ForwardPartitioner(subtask, upstream_parallelism, downstream_parallelism)
    if partitioning is Partitioning.HASH:
        return KeyGroupPartitioner(max_parallelism, downstream_parallelism)
    if partitioning is Partitioning.REBALANCE:
        return RebalancePartitioner(subtask, downstream_parallelism)
    if partitioning is Partitioning.BROADCAST:
        return BroadcastPartitioner(downstream_parallelism)
    raise ValueError(f"unknown partitioning {partitioning!r}")

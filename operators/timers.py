"""Keyed timers of a process function (Flink's InternalTimerService): one timer per key and time
in each time domain, kept as keyed state and queued in a heap.

A timer is an entry of keyed state :data:`EVENT_TIMERS` or :data:`PROCESSING_TIMERS` at
``(state, key group, length-prefixed key bytes + time as 8 signed big-endian bytes)`` holding the
key as a 1-tuple (so that a None key is told from a deleted timer). Checkpoints, restores and
rescaling by key group carry timers like any other keyed state. The heap of ``(time, key group,
state key)`` is rebuilt from that state when the operator opens, from its own key groups only.
Deleting a timer deletes its state entry; its heap entry is dropped when it comes up (a timer
fires only if its entry is still there).
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Iterator
from typing import Any, Final

from weir.core.process_functions import TimeDomain
from weir.operators.process_state import StateStore

EVENT_TIMERS: Final = "timers.event_time"
PROCESSING_TIMERS: Final = "timers.processing_time"
"""The keyed state names of the timers: reserved, no process function's state may take them."""
TIMER_STATES: Final = frozenset({EVENT_TIMERS, PROCESSING_TIMERS})

_TIME = struct.Struct(">q")


def timer_state(domain: TimeDomain) -> str:
    match domain:
        case TimeDomain.EVENT_TIME:
            return EVENT_TIMERS
        case TimeDomain.PROCESSING_TIME:
            return PROCESSING_TIMERS


class TimerQueue:
    """The timers of one time domain of one keyed operator subtask."""

    def __init__(self, store: StateStore, domain: TimeDomain) -> None:
        self._store = store
        self.domain = domain
        self._name = timer_state(domain)
        self._heap: list[tuple[int, int, bytes]] = []
        self._queued: set[tuple[int, bytes]] = set()  # (key group, state key) of every heap entry

    def rebuild(self, key_groups: Iterable[int]) -> None:
        """Queue every timer stored in ``key_groups`` (the subtask's own), forgetting any queued."""
        heap: list[tuple[int, int, bytes]] = []
        for kg in key_groups:
            for sk, _key in self._store.items(self._name, kg):
                heap.append((_TIME.unpack_from(sk, len(sk) - _TIME.size)[0], kg, sk))
        heapq.heapify(heap)
        self._heap = heap
        self._queued = {(kg, sk) for _t, kg, sk in heap}

    def register(self, key: Any, key_group: int, key_prefix: bytes, time: int) -> None:
        """A timer at ``time`` for ``key`` (whose key group and length-prefixed bytes are given);
        registering one that exists changes nothing."""
        sk = key_prefix + _TIME.pack(time)
        self._store.put(self._name, key_group, sk, (key,))
        if (key_group, sk) not in self._queued:
            self._queued.add((key_group, sk))
            heapq.heappush(self._heap, (time, key_group, sk))

    def delete(self, key_group: int, key_prefix: bytes, time: int) -> None:
        """Remove the timer at ``time`` of the key, if it has one."""
        self._store.delete(self._name, key_group, key_prefix + _TIME.pack(time))

    def next_time(self) -> int | None:
        """The earliest queued time (a deleted timer's too, until it comes up); None: no timer."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, time: int) -> Iterator[tuple[int, Any]]:
        """Remove and yield ``(time, key)`` of each timer due at ``time``, earliest first; one
        registered while this runs fires in the same pass when it is due."""
        heap, store, name = self._heap, self._store, self._name
        while heap and heap[0][0] <= time:
            when, kg, sk = heapq.heappop(heap)
            self._queued.discard((kg, sk))
            stored = store.get(name, kg, sk)
            if stored is None:  # deleted
                continue
            store.delete(name, kg, sk)
            yield when, stored[0]

    def __len__(self) -> int:
        """Heap entries, deleted timers not yet come up included."""
        return len(self._heap)

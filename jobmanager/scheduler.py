"""Slot assignment, pure: which TaskManager runs each subtask.

Slot sharing as in Flink: slot ``i`` runs subtask ``i`` of every vertex, so a job needs as many slots
as its largest parallelism. Slots are spread over TaskManagers round robin, so that a job of
parallelism 3 on three TaskManagers uses all three, and still fits on two after one is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from weir.core.errors import NotEnoughSlotsError


@dataclass(frozen=True)
class SlotOffer:
    taskmanager_id: str
    free_slots: int


def assign_slots(offers: list[SlotOffer], slots_needed: int) -> list[str]:
    """TaskManager id of each shared slot 0..slots_needed-1; raises NotEnoughSlotsError."""
    free = sum(max(0, o.free_slots) for o in offers)
    if free < slots_needed:
        raise NotEnoughSlotsError(
            f"not enough slots: the job needs {slots_needed}, the cluster has {free} free "
            f"on {len(offers)} TaskManager(s)"
        )
    remaining = {o.taskmanager_id: o.free_slots for o in offers}
    order = sorted(remaining, key=lambda tm: (-remaining[tm], tm))
    assignment: list[str] = []
    while len(assignment) < slots_needed:
        for tm in order:
            if remaining[tm] > 0 and len(assignment) < slots_needed:
                assignment.append(tm)
                remaining[tm] -= 1
    return assignment


def place_subtasks(vertex_parallelism: Mapping[str, int], slots: list[str]) -> dict[tuple[str, int], str]:
    """(vertex uid, subtask) -> TaskManager id, by slot sharing."""
    return {(uid, s): slots[s] for uid, p in vertex_parallelism.items() for s in range(p)}

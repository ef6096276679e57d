"""Slot assignment: spread round robin over TaskManagers, slot sharing across vertices."""

from __future__ import annotations

from collections import Counter

import pytest

from weir.core.errors import NotEnoughSlotsError
from weir.jobmanager.scheduler import SlotOffer, assign_slots, place_subtasks


def test_slots_spread_over_taskmanagers_before_reusing_one() -> None:
    offers = [SlotOffer("tm-c", 2), SlotOffer("tm-a", 2), SlotOffer("tm-b", 2)]
    assert assign_slots(offers, 3) == ["tm-a", "tm-b", "tm-c"]
    assert assign_slots(offers, 5) == ["tm-a", "tm-b", "tm-c", "tm-a", "tm-b"]
    assert assign_slots(offers, 6) == ["tm-a", "tm-b", "tm-c"] * 2


def test_taskmanagers_with_more_free_slots_come_first_and_full_ones_are_skipped() -> None:
    offers = [SlotOffer("tm-a", 1), SlotOffer("tm-b", 3), SlotOffer("tm-c", 0)]
    assert assign_slots(offers, 4) == ["tm-b", "tm-a", "tm-b", "tm-b"]


def test_no_taskmanager_gets_more_than_it_offers() -> None:
    offers = [SlotOffer("tm-a", 1), SlotOffer("tm-b", 5), SlotOffer("tm-c", 2)]
    used = Counter(assign_slots(offers, 8))
    assert used == {"tm-a": 1, "tm-b": 5, "tm-c": 2}


def test_zero_slots_needed() -> None:
    assert assign_slots([], 0) == []


def test_not_enough_slots_says_how_many() -> None:
    offers = [SlotOffer("tm-a", 2), SlotOffer("tm-b", 1), SlotOffer("tm-c", -1)]
    with pytest.raises(NotEnoughSlotsError) as info:
        assign_slots(offers, 4)
    assert str(info.value) == "not enough slots: the job needs 4, the cluster has 3 free on 3 TaskManager(s)"


def test_negative_free_slots_do_not_hide_others() -> None:
    assert assign_slots([SlotOffer("tm-a", -2), SlotOffer("tm-b", 2)], 2) == ["tm-b", "tm-b"]


def test_place_subtasks_shares_slot_i_for_subtask_i_of_every_vertex() -> None:
    slots = ["tm-a", "tm-b", "tm-a"]
    placement = place_subtasks({"src": 3, "win": 2, "sink": 1}, slots)
    assert placement == {
        ("src", 0): "tm-a",
        ("src", 1): "tm-b",
        ("src", 2): "tm-a",
        ("win", 0): "tm-a",
        ("win", 1): "tm-b",
        ("sink", 0): "tm-a",
    }

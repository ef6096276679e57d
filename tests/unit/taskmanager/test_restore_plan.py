"""The restore's adoption decision (``weir.taskmanager.restore_plan``): which snapshot a subtask opens as
its database, which key groups it then deletes, which snapshots it copies and which key groups of them."""

from __future__ import annotations

import pytest

from weir.core.ids import CheckpointId, KeyGroup, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.keygroups import KeyGroupRange, key_group_range_for_subtask
from weir.taskmanager.restore_plan import ADOPT_MIN_SHARE, AdoptSnapshot, CopyRanges, plan_keyed_restore
from weir.taskmanager.snapshot_handles import KeyedStateHandle, SnapshotFile

WIN = OperatorUid("win")
SUMS = OperatorUid("sums")
MAX_PARALLELISM = 128


def kgr(start: int, end: int) -> KeyGroupRange:
    return KeyGroupRange(KeyGroup(start), KeyGroup(end))


def subtask_range(parallelism: int, index: int) -> KeyGroupRange:
    return key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(index))


def handle(
    key_groups: KeyGroupRange,
    *,
    tm: str = "tm-1",
    index: int = 0,
    uids: tuple[OperatorUid, ...] = (WIN,),
    size: int = 1000,
) -> KeyedStateHandle:
    return KeyedStateHandle(
        taskmanager_id=TaskManagerId(tm),
        db_incarnation=f"db-{tm}-{index}",
        checkpoint_id=CheckpointId(7),
        snapshot_index=index,
        sst_files=(SnapshotFile(f"shared/{tm}/{index}/000009.sst", size, False, "000009.sst"),),
        db_files=(SnapshotFile(f"chk-7/{tm}/{index}/MANIFEST-000005", 100, False, "MANIFEST-000005"),),
        ranges=tuple((uid, key_groups) for uid in uids),
    )


def old_subtasks(parallelism: int, uids: tuple[OperatorUid, ...] = (WIN,)) -> list[KeyedStateHandle]:
    return [
        handle(subtask_range(parallelism, i), tm=f"tm-{i % 3}", index=i, uids=uids, size=1000 + i)
        for i in range(parallelism)
    ]


def test_same_parallelism_adopts_the_subtask_s_own_snapshot_whole_and_copies_nothing() -> None:
    handles = old_subtasks(3, (WIN, SUMS))
    for i, own in enumerate(handles):
        wanted = [(WIN, subtask_range(3, i)), (SUMS, subtask_range(3, i))]
        plan = plan_keyed_restore(handles, wanted, may_adopt=True)
        assert plan.adopt == AdoptSnapshot(own, keep=tuple(sorted(own.ranges)), deleted=())
        assert plan.copies == ()


def test_a_scale_in_adopts_one_old_subtask_and_copies_the_other_whole() -> None:
    left, right = old_subtasks(2)
    right = handle(right.ranges[0][1], tm="tm-1", index=1, size=5000)  # the larger one saves more copying
    plan = plan_keyed_restore([left, right], [(WIN, kgr(0, 127))], may_adopt=True)
    assert plan.adopt == AdoptSnapshot(right, keep=((WIN, kgr(64, 127)),), deleted=())
    assert plan.copies == (CopyRanges(left, ((WIN, kgr(0, 63)),)),)


def test_a_scale_out_by_two_adopts_the_old_snapshot_and_deletes_the_other_half() -> None:
    (only,) = old_subtasks(1)
    first = plan_keyed_restore([only], [(WIN, subtask_range(2, 0))], may_adopt=True)
    assert first.adopt == AdoptSnapshot(only, keep=((WIN, kgr(0, 63)),), deleted=((WIN, kgr(64, 127)),))
    assert first.copies == ()
    second = plan_keyed_restore([only], [(WIN, subtask_range(2, 1))], may_adopt=True)
    assert second.adopt == AdoptSnapshot(only, keep=((WIN, kgr(64, 127)),), deleted=((WIN, kgr(0, 63)),))


def test_a_middle_subtask_of_three_copies_only_the_overlap_of_each_old_half() -> None:
    left, right = old_subtasks(2)
    wanted = subtask_range(3, 1)  # 43..85: a third of each old half
    plan = plan_keyed_restore([left, right], [(WIN, wanted)], may_adopt=True)
    assert plan.adopt is None
    assert plan.copies == (
        CopyRanges(left, ((WIN, kgr(43, 63)),)),
        CopyRanges(right, ((WIN, kgr(64, 85)),)),
    )


def test_the_first_of_three_adopts_the_old_half_it_owns_most_of_and_deletes_the_rest() -> None:
    left, right = old_subtasks(2)
    plan = plan_keyed_restore([left, right], [(WIN, subtask_range(3, 0))], may_adopt=True)  # 0..42
    assert plan.adopt == AdoptSnapshot(left, keep=((WIN, kgr(0, 42)),), deleted=((WIN, kgr(43, 63)),))
    assert plan.copies == ()  # the right half holds none of 0..42: not even downloaded


def test_an_operator_the_new_job_lacks_is_deleted_from_the_adopted_snapshot() -> None:
    (old,) = old_subtasks(1, (WIN, SUMS))
    plan = plan_keyed_restore([old], [(WIN, kgr(0, 127))], may_adopt=True)
    assert plan.adopt is not None
    assert plan.adopt.keep == ((WIN, kgr(0, 127)),)
    assert plan.adopt.deleted == ((SUMS, kgr(0, 127)),)


def test_a_database_that_is_not_pristine_copies_everything() -> None:
    handles = old_subtasks(2)
    plan = plan_keyed_restore(handles, [(WIN, kgr(0, 127))], may_adopt=False)
    assert plan.adopt is None
    assert plan.copies == tuple(CopyRanges(h, h.ranges) for h in handles)


def test_handles_of_one_local_snapshot_are_one_snapshot_with_the_union_of_their_ranges() -> None:
    """Two subtasks of one TaskManager that snapshotted with nothing written in between share one
    RocksDB checkpoint: one download, adopted as a whole when the subtask owns both ranges."""
    shared = [handle(kgr(0, 63), index=4), handle(kgr(64, 127), index=4)]
    plan = plan_keyed_restore(shared, [(WIN, kgr(0, 127))], may_adopt=True)
    assert plan.adopt == AdoptSnapshot(shared[0], keep=((WIN, kgr(0, 63)), (WIN, kgr(64, 127))), deleted=())
    assert plan.copies == () and plan.snapshots_used == 1


@pytest.mark.parametrize("old_parallelism", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("new_parallelism", [1, 2, 3, 4, 7])
def test_every_wanted_key_group_is_restored_from_exactly_one_snapshot_and_nothing_else_is_kept(
    old_parallelism: int, new_parallelism: int
) -> None:
    handles = old_subtasks(old_parallelism, (WIN, SUMS))
    for index in range(new_parallelism):
        mine = subtask_range(new_parallelism, index)
        plan = plan_keyed_restore(handles, [(WIN, mine), (SUMS, mine)], may_adopt=True)
        restored: list[tuple[OperatorUid, int]] = []
        if plan.adopt is not None:
            kept = {(uid, g) for uid, r in plan.adopt.keep for g in r}
            deleted = {(uid, g) for uid, r in plan.adopt.deleted for g in r}
            held = {(uid, g) for uid, r in plan.adopt.handle.ranges for g in r}
            assert kept | deleted == held and not kept & deleted
            assert len(kept) / len(held) >= ADOPT_MIN_SHARE
            restored += kept
        for copy in plan.copies:
            held = {(uid, g) for uid, r in copy.handle.ranges for g in r}
            parts = [(uid, g) for uid, r in copy.parts for g in r]
            assert set(parts) <= held
            restored += parts
        assert sorted(restored) == sorted((uid, g) for uid in (WIN, SUMS) for g in mine)
        if old_parallelism == new_parallelism or (
            new_parallelism < old_parallelism and old_parallelism % new_parallelism == 0
        ):
            assert plan.adopt is not None and plan.adopt.deleted == ()

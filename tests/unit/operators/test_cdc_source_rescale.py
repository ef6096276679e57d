"""The CDC source's state restored from a savepoint or retained checkpoint (``restore_inherited_state``,
the union of every old subtask's state), at its own parallelism or another, as
``weir.core.cdc.redistribute`` decides (tests/unit/weir/core/test_cdc_rescale.py checks every case):
after the snapshot, subtask 0 takes the stream's position and the others idle; mid-snapshot, above
the snapshot's partitions each reader goes on with its own and the rest idle, below them the restore
is refused in one line before anything is read."""

from __future__ import annotations

import pytest

from tests.unit.conftest import MakeContext
from tests.unit.operators.test_inherited_state import inherited
from weir.core.cdc import IDLE_READER, CdcState, ChunkRead, Phase, XidSnapshot, encode_cdc_state
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.operators.base import NO_SIDE_OUTPUTS, InheritedState, StateNotRedistributableError, StreamOperator
from weir.operators.cdc_source import PostgresCdcSourceOperator

SPEC = PostgresCdcSourceSpec(("public.t",), "s", "s")


def _chunk(partition: int) -> ChunkRead:
    return ChunkRead("public.t", (9,), XidSnapshot(5, 5), 120, partition)


def mid_snapshot(parallelism: int) -> list[InheritedState]:
    """Each subtask's state mid-snapshot: one chunk of its partition read."""
    return [
        inherited(s, parallelism, encode_cdc_state(CdcState(Phase.SNAPSHOT, 100, (_chunk(s),), parallelism), "s"))
        for s in range(parallelism)
    ]


def streaming(parallelism: int) -> list[InheritedState]:
    """Subtask 0 streams (at 0/C8, a chunk of partition 1 still filtering), the readers handed over."""
    chunks = (_chunk(0), _chunk(parallelism - 1))
    states = [CdcState(Phase.STREAMING, 200, chunks, parallelism)]
    states += [CdcState(Phase.PARTITION_READ, 100, (_chunk(s),), parallelism) for s in range(1, parallelism)]
    return [inherited(s, parallelism, encode_cdc_state(state, "s")) for s, state in enumerate(states)]


def restored(make_context: MakeContext, subtask: int, parallelism: int, states: list[InheritedState]) -> CdcState:
    operator = PostgresCdcSourceOperator(SPEC)
    operator.setup(make_context("cdc", subtask, parallelism), None, NO_SIDE_OUTPUTS)  # type: ignore[arg-type]
    operator.restore_inherited_state(states)
    return operator._restored  # noqa: SLF001 - what the restore took


@pytest.mark.parametrize(("old", "new"), [(3, 2), (2, 1), (4, 1)])
def test_a_snapshot_below_its_partitions_is_refused_in_one_line(make_context: MakeContext, old: int, new: int) -> None:
    operator = PostgresCdcSourceOperator(SPEC)
    operator.setup(make_context("cdc", 0, new), None, NO_SIDE_OUTPUTS)  # type: ignore[arg-type]
    with pytest.raises(
        StateNotRedistributableError,
        match=f"^postgres cdc source 'cdc': the checkpoint was taken while {old} subtasks read the snapshot, .*"
        f"restore it at parallelism {old} or above .* new snapshot at parallelism {new}$",
    ):
        operator.restore_inherited_state(mid_snapshot(old))


@pytest.mark.parametrize(("old", "new"), [(1, 2), (2, 3), (2, 4)])
def test_a_snapshot_above_its_partitions_goes_on_in_the_first_subtasks(
    make_context: MakeContext, old: int, new: int
) -> None:
    for subtask in range(new):
        state = restored(make_context, subtask, new, mid_snapshot(old))
        if subtask < old:
            assert state == CdcState(Phase.SNAPSHOT, 100, (_chunk(subtask),), old), "its own partition, of old"
        else:
            assert state == IDLE_READER


@pytest.mark.parametrize(("old", "new"), [(2, 1), (2, 3), (3, 2), (1, 4)])
def test_after_the_snapshot_subtask_0_takes_the_position_and_the_others_idle(
    make_context: MakeContext, old: int, new: int
) -> None:
    position = CdcState(Phase.STREAMING, 200, (_chunk(0), _chunk(old - 1)), old)
    if old == 1:
        position = CdcState(Phase.STREAMING, 200, (_chunk(0), _chunk(0)), 1)
        states = [inherited(0, 1, encode_cdc_state(position, "s"))]
    else:
        states = streaming(old)
    assert restored(make_context, 0, new, states) == position, "the LSN and the chunks a later change may be in"
    for subtask in range(1, new):
        assert restored(make_context, subtask, new, states) == IDLE_READER


def test_at_its_own_parallelism_each_subtask_takes_its_own_state(make_context: MakeContext) -> None:
    for subtask in range(3):
        assert restored(make_context, subtask, 3, mid_snapshot(3)).chunks[0].partition == subtask


def test_a_checkpoint_missing_a_subtask_is_refused(make_context: MakeContext) -> None:
    with pytest.raises(StateNotRedistributableError, match=r"subtasks \[0, 2\] of 3: it is incomplete"):
        restored(make_context, 0, 2, [s for s in mid_snapshot(3) if s.subtask != 1])


def test_the_source_redistributes_its_own_state() -> None:
    """The rescale request's up-front check (``per_subtask_state``) leaves it to the source's restore."""
    assert PostgresCdcSourceOperator.restore_inherited_state is not StreamOperator.restore_inherited_state

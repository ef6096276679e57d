"""The CDC source's state at another parallelism: each subtask's state holds its own partition of a
parallel snapshot (or, in subtask 0, the stream's position), so it restores at the parallelism that
wrote it only, and another one is refused in one line before anything is read; the rescale request
refuses it up front (the operator keeps per-subtask state)."""

from __future__ import annotations

import pytest

from tests.unit.conftest import MakeContext
from tests.unit.operators.test_inherited_state import inherited
from weir.core.cdc import CdcState, ChunkRead, Phase, XidSnapshot, encode_cdc_state
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.operators.base import NO_SIDE_OUTPUTS, StateNotRedistributableError, StreamOperator
from weir.operators.cdc_source import PostgresCdcSourceOperator

SPEC = PostgresCdcSourceSpec(("public.t",), "s", "s")


def states(parallelism: int) -> list[bytes]:
    """Each subtask's state mid-snapshot: one chunk of its partition read."""
    return [
        encode_cdc_state(
            CdcState(Phase.SNAPSHOT, 100, (ChunkRead("public.t", (9,), XidSnapshot(5, 5), 120, s),), parallelism), "s"
        )
        for s in range(parallelism)
    ]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2), (1, 2), (2, 1)])
def test_a_mid_snapshot_state_at_another_parallelism_is_refused_in_one_line(
    make_context: MakeContext, old: int, new: int
) -> None:
    operator = PostgresCdcSourceOperator(SPEC)
    operator.setup(make_context("cdc", 0, new), None, NO_SIDE_OUTPUTS)  # type: ignore[arg-type]
    with pytest.raises(
        StateNotRedistributableError,
        match=f"^operator 'cdc' .* from parallelism {old} to {new}: restore it at parallelism {old}$",
    ):
        operator.restore_inherited_state([inherited(s, old, data) for s, data in enumerate(states(old))])


def test_at_its_own_parallelism_each_subtask_takes_its_own_state(make_context: MakeContext) -> None:
    for subtask in range(3):
        operator = PostgresCdcSourceOperator(SPEC)
        operator.setup(make_context("cdc", subtask, 3), None, NO_SIDE_OUTPUTS)  # type: ignore[arg-type]
        operator.restore_inherited_state([inherited(s, 3, d) for s, d in enumerate(states(3))])
        assert operator._restored.chunks[0].partition == subtask  # noqa: SLF001 - what the restore took


def test_the_rescale_request_sees_per_subtask_state() -> None:
    assert PostgresCdcSourceOperator.restore_inherited_state is StreamOperator.restore_inherited_state

"""A rescale's checkpoint is triggered forced aligned (``aligned``) in every mode, as a final one: the
job is redeployed at another parallelism from state alone, with no in-flight records to redistribute."""

from __future__ import annotations

import pytest

from weir.core.checkpointing import BarrierAlignment, CheckpointKind
from weir.core.ids import CheckpointId
from weir.taskmanager.checkpointer import barrier_alignment_of
from weir.taskmanager.mailbox import CheckpointRequest


@pytest.mark.parametrize(
    ("final", "aligned", "alignment"),
    [
        (False, False, BarrierAlignment.BY_MODE),
        (True, False, BarrierAlignment.FORCED_ALIGNED),
        (False, True, BarrierAlignment.FORCED_ALIGNED),
        (True, True, BarrierAlignment.FORCED_ALIGNED),
    ],
)
def test_a_rescale_s_or_a_final_checkpoint_is_forced_aligned(
    final: bool, aligned: bool, alignment: BarrierAlignment
) -> None:
    request = CheckpointRequest(CheckpointId(4), 1.0, CheckpointKind.CHECKPOINT, final, aligned=aligned)
    assert barrier_alignment_of(request) is alignment

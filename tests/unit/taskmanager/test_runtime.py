"""TaskManager runtime decisions that need no JobManager: the alignment a checkpointing mode means,
and an acknowledgement too large for a control message becoming a decline with its reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from taskmanager.barrier_aligner import AlignmentMode
from taskmanager.runtime import (
    AckReport,
    DeclineReport,
    Report,
    TaskManagerRuntime,
    alignment_for,
    oversized_ack_reason,
)
from taskmanager.task import ChainSnapshot, CheckpointAck, TaskAddress
from weir.core.checkpointing import CheckpointingMode
from weir.core.codec import checkpointing_mode_from_proto, checkpointing_mode_to_proto
from weir.core.transport import MAX_MESSAGE_BYTES


@pytest.mark.parametrize("text", ["exactly_once", "EXACTLY_ONCE", "exactly-once", " exactly_once"])
def test_every_spelling_of_exactly_once_aligns_barriers_on_the_taskmanager(text: str) -> None:
    """The JobManager accepted these spellings while the TaskManager compared the raw text and ran
    them unaligned: post-barrier records landed in the snapshot."""
    mode = CheckpointingMode.parse(text)
    assert mode is not None
    assert alignment_for(checkpointing_mode_from_proto(checkpointing_mode_to_proto(mode))) is AlignmentMode.EXACTLY_ONCE


def test_at_least_once_does_not_align() -> None:
    assert alignment_for(CheckpointingMode.AT_LEAST_ONCE) is AlignmentMode.AT_LEAST_ONCE


def test_an_acknowledgement_fits_below_the_limit_and_is_declined_above_it() -> None:
    assert oversized_ack_reason(1_000, MAX_MESSAGE_BYTES, 7) is None
    reason = oversized_ack_reason(MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES, 7)
    assert reason is not None and "checkpoint 7" in reason and f"{MAX_MESSAGE_BYTES:,}" in reason


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskManagerRuntime]:
    monkeypatch.setenv("WEIR_CHECKPOINT_DIR", f"file://{tmp_path / 'checkpoints'}")
    rt = TaskManagerRuntime("tm-test", "127.0.0.1:1", "127.0.0.1:1", 2, tmp_path / "run")
    yield rt
    rt.stop()


def test_an_oversized_acknowledgement_is_sent_as_a_decline_with_its_reason(runtime: TaskManagerRuntime) -> None:
    """It used to be handed to gRPC, refused as too large and dropped: the checkpoint timed out."""
    address = TaskAddress("job-1", "sink", 0, 1)
    huge = ChainSnapshot(address, 5, {"sink": b"x" * MAX_MESSAGE_BYTES}, (0, 127))
    sent: list[Report] = []

    class Reports:  # what would go to the JobManager
        put = sent.append

    runtime._reports = Reports()  # type: ignore[assignment]  # noqa: SLF001
    runtime._on_checkpoint(address, CheckpointAck(huge, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    assert [type(report) for report in sent] == [DeclineReport]
    decline = sent[0]
    assert isinstance(decline, DeclineReport)
    assert decline.request.checkpoint_id == 5 and "acknowledgement of checkpoint 5" in decline.request.reason
    small = ChainSnapshot(address, 6, {"sink": b"ok"}, (0, 127))
    runtime._on_checkpoint(address, CheckpointAck(small, 0.0, 0.0, 0.0, 0.0))  # noqa: SLF001
    assert [type(report) for report in sent] == [DeclineReport, AckReport]

"""`weir checkpoints JOB --detail CID` as text: offsets from the trigger, a bar per subtask, a mark
per channel on one scale; the slow channel and the slow upload show."""

from __future__ import annotations

from weir.core.checkpointing import ChannelBarrierTime, CheckpointKind, CheckpointStatus, SubtaskCheckpointTimeline
from weir.core.ids import CheckpointId, OperatorUid, SubtaskIndex
from weir.tools.checkpoint_timeline import bar, channel_bar, offsets_of, render_checkpoint_detail
from weir.tools.client import CheckpointDetail, CheckpointInfo, TaskCheckpointStats

T = 1_000.0  # the trigger, epoch seconds


def stats(
    uid: str, subtask: int, timeline: SubtaskCheckpointTimeline | None, acked_at: float | None
) -> TaskCheckpointStats:
    return TaskCheckpointStats(
        OperatorUid(uid), SubtaskIndex(subtask), 0.0, 0.0, 100, acked_at=acked_at, timeline=timeline
    )


SOURCE = stats("src", 0, SubtaskCheckpointTimeline(T + 0.002, (), T + 0.002, T + 0.003, T + 0.004), T + 0.010)
WINDOW = stats(
    "win",
    0,
    SubtaskCheckpointTimeline(
        first_barrier_at=T + 0.010,
        channels=(ChannelBarrierTime(0, "src", 0, T + 0.010), ChannelBarrierTime(1, "src", 1, T + 0.400)),
        alignment_end_at=T + 0.400,
        sync_end_at=T + 0.420,
        async_end_at=T + 0.900,  # a slow upload
    ),
    T + 1.000,
)


def detail(*tasks: TaskCheckpointStats, pending: tuple[tuple[str, int], ...] = ()) -> CheckpointDetail:
    info = CheckpointInfo(
        checkpoint_id=CheckpointId(12),
        status=CheckpointStatus.COMPLETED,
        kind=CheckpointKind.CHECKPOINT,
        trigger_time=T,
        duration_s=1.0,
        size_bytes=2048,
        failure="",
        tasks=tasks,
        external_path="s3://weir/job-1/checkpoints/chk-12/",
    )
    return CheckpointDetail(info, tuple((OperatorUid(u), SubtaskIndex(s)) for u, s in pending))


def test_offsets_are_milliseconds_after_the_trigger() -> None:
    offsets = offsets_of(WINDOW, T)
    assert (offsets.first_barrier, offsets.alignment_end, offsets.sync_end, offsets.async_end, offsets.ack) == (
        10,
        400,
        420,
        900,
        1000,
    )
    assert offsets.channels == ((0, "src#0", 10), (1, "src#1", 400))


def test_a_bar_draws_each_segment_in_proportion() -> None:
    offsets = offsets_of(WINDOW, T)
    drawn = bar(offsets, 1000, width=100)
    assert drawn == "." * 1 + "=" * 39 + "#" * 2 + "~" * 48 + "-" * 10
    assert channel_bar(400, 1000, width=10) == "    |     "
    assert channel_bar(None, 1000, width=10) == " " * 10


def test_the_detail_shows_the_summary_each_subtask_and_marks_the_slowest_channel() -> None:
    lines = render_checkpoint_detail(detail(SOURCE, WINDOW), "job-1", width=20)
    text = "\n".join(lines)
    assert lines[0].startswith("checkpoint 12 of job job-1: COMPLETED, aligned, triggered ")
    assert "1,000 ms end to end" in lines[1] and "2 of 2 subtasks acknowledged" in lines[1]
    assert "path: s3://weir/job-1/checkpoints/chk-12/" in text
    (window,) = [line for line in lines if line.startswith("win#0")]
    assert window.split()[1:6] == ["10", "400", "420", "900", "1,000"]
    assert window.endswith("|" + "=" * 8 + "~" * 10 + "-" * 2 + "|")  # the 20 ms sync part is under a cell
    (slow,) = [line for line in lines if "slowest" in line]
    assert slow.strip().startswith("ch 1 src#1") and slow.split()[3] == "400"
    (fast,) = [line for line in lines if line.strip().startswith("ch 0 src#0")]
    assert "slowest" not in fast
    (source,) = [line for line in lines if line.startswith("src#0")]
    assert source.split()[1:6] == ["2", "2", "3", "4", "10"]


def test_a_channel_that_ended_and_a_subtask_without_timeline_or_ack_are_told() -> None:
    ended = stats(
        "win",
        1,
        SubtaskCheckpointTimeline(T, (ChannelBarrierTime(0, "src", 0, None),), T + 0.1, T + 0.2, T + 0.3),
        None,
    )
    lines = render_checkpoint_detail(detail(ended, stats("old", 0, None, T + 0.5), pending=(("sink", 0),)), "j")
    text = "\n".join(lines)
    assert "ended before its barrier" in text
    assert "not acknowledged: sink#0" in text and "2 of 3 subtasks acknowledged" in text
    (old,) = [line for line in lines if line.startswith("old#0")]
    assert "(no timeline)" in old and old.split()[-1] == "500"


def test_a_checkpoint_no_subtask_acknowledged_says_so() -> None:
    lines = render_checkpoint_detail(detail(pending=(("src", 0),)), "j")
    assert lines[-1].startswith("no subtask acknowledged it")

"""One checkpoint's timeline as text (``weir checkpoints JOB --detail CID``): per subtask, the times of
its first barrier, each input channel's barrier, the end of alignment, of the synchronous and the
asynchronous part of its snapshot and the acknowledgement's arrival at the JobManager, as offsets in
milliseconds from the trigger, with a bar per subtask and a mark per channel on one scale, so that a
slow channel or a slow upload stands out. Pure: a view in, lines out.

The TaskManagers' times are their own wall clocks, the trigger and the ack the JobManager's: offsets
across machines include their clock difference (a mark before the trigger is drawn at its start).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from weir.core.checkpointing import CheckpointStatus, SubtaskCheckpointTimeline
from weir.tools.client import CheckpointDetail, TaskCheckpointStats

BAR_WIDTH: Final = 40
LEGEND: Final = (
    "bar: '.' until the first barrier, '=' alignment, '#' synchronous part, '~' asynchronous part (upload), "
    "'-' until the ack reached the JobManager; '|' a channel's barrier"
)
_SEGMENTS: Final = (".", "=", "#", "~", "-")


@dataclass(frozen=True)
class SubtaskOffsets:
    """One subtask's timeline as milliseconds after the trigger; None: not known."""

    name: str
    first_barrier: int | None
    channels: tuple[tuple[int, str, int | None], ...]  # (channel, upstream subtask's name, barrier)
    alignment_end: int | None
    sync_end: int | None
    async_end: int | None
    ack: int | None

    @property
    def marks(self) -> tuple[int | None, ...]:
        """The ends of the bar's segments, in order."""
        return (self.first_barrier, self.alignment_end, self.sync_end, self.async_end, self.ack)

    @property
    def last(self) -> int:
        known = [m for m in (*self.marks, *(c[2] for c in self.channels)) if m is not None]
        return max(known, default=0)


def _ms(at: float | None, trigger: float) -> int | None:
    return None if at is None else round((at - trigger) * 1000)


def offsets_of(task: TaskCheckpointStats, trigger: float) -> SubtaskOffsets:
    timeline: SubtaskCheckpointTimeline | None = task.timeline
    ack = _ms(task.acked_at, trigger)
    if timeline is None:
        return SubtaskOffsets(task.name, None, (), None, None, None, ack)
    return SubtaskOffsets(
        name=task.name,
        first_barrier=_ms(timeline.first_barrier_at, trigger),
        channels=tuple(
            (c.channel, f"{c.upstream_vertex}#{c.upstream_subtask}", _ms(c.barrier_at, trigger))
            for c in timeline.channels
        ),
        alignment_end=_ms(timeline.alignment_end_at, trigger),
        sync_end=_ms(timeline.sync_end_at, trigger),
        async_end=_ms(timeline.async_end_at, trigger),
        ack=ack,
    )


def _position(ms: int, scale_ms: int, width: int) -> int:
    return min(width - 1, max(0, ms * width // max(scale_ms, 1)))


def bar(offsets: SubtaskOffsets, scale_ms: int, width: int = BAR_WIDTH) -> str:
    """The subtask's segments on a ``width``-character scale of ``scale_ms``: each character is drawn
    as the segment its time falls in; after the ack, blank."""
    cells = [" "] * width
    start = 0
    for symbol, end in zip(_SEGMENTS, offsets.marks, strict=True):
        if end is None:
            continue
        end_cell = _position(end, scale_ms, width) if end < scale_ms else width
        for cell in range(start, max(start, end_cell)):
            cells[cell] = symbol
        start = max(start, end_cell)
    return "".join(cells)


def channel_bar(barrier_ms: int | None, scale_ms: int, width: int = BAR_WIDTH) -> str:
    cells = [" "] * width
    if barrier_ms is not None:
        cells[_position(barrier_ms, scale_ms, width)] = "|"
    return "".join(cells)


def _cell(ms: int | None) -> str:
    return "-" if ms is None else f"{ms:,}"


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _summary_lines(detail: CheckpointDetail, job_id: str) -> Iterator[str]:
    info = detail.checkpoint
    mode = "unaligned" if info.unaligned else "aligned" if info.tasks else "mode not known yet"
    yield (
        f"{info.kind.value} {info.checkpoint_id} of job {job_id}: {info.status}, {mode}, "
        f"triggered {_when(info.trigger_time)}"
    )
    took = f"{round(info.duration_s * 1000):,} ms end to end" if info.status is not CheckpointStatus.IN_PROGRESS else ""
    acked = f"{len(info.tasks)} of {len(info.tasks) + len(detail.pending)} subtasks acknowledged"
    inflight = f", {_size(info.inflight_bytes)} in flight" if info.unaligned else ""
    yield "  " + ", ".join(p for p in (took, f"state {_size(info.size_bytes)}{inflight}", acked) if p)
    if info.failure:
        yield f"  failure: {info.failure}"
    if info.external_path:
        yield f"  path: {info.external_path}"
    if detail.pending:
        yield "  not acknowledged: " + ", ".join(f"{uid}#{subtask}" for uid, subtask in detail.pending)


def render_checkpoint_detail(detail: CheckpointDetail, job_id: str, *, width: int = BAR_WIDTH) -> list[str]:
    """The checkpoint's summary, then per subtask (in vertex and subtask order) its times in ms after
    the trigger and its bar, and a line per input channel with its barrier's mark; the channel whose
    barrier came last at a subtask with several channels is marked ``slowest``."""
    lines = list(_summary_lines(detail, job_id))
    tasks = sorted(detail.checkpoint.tasks, key=lambda t: (t.vertex_uid, t.subtask))
    if not tasks:
        lines.append("no subtask acknowledged it (or the JobManager restarted since and kept no statistics)")
        return lines
    trigger = detail.checkpoint.trigger_time
    all_offsets = [offsets_of(t, trigger) for t in tasks]
    scale = max(max(o.last for o in all_offsets), 1)
    labels = [o.name for o in all_offsets] + [f"  ch {c[0]} {c[1]}" for o in all_offsets for c in o.channels]
    name_width = max(12, *(len(label) for label in labels))
    lines += [
        "",
        "times in ms after the trigger",
        LEGEND,
        f"{'subtask':<{name_width}} {'first barrier':>13} {'alignment end':>13} {'sync end':>9} "
        f"{'async end':>9} {'ack':>7}  |0{f'{scale:,} ms':>{width - 1}}|",
    ]
    for offsets in all_offsets:
        if offsets.first_barrier is None:
            lines.append(f"{offsets.name:<{name_width}} (no timeline) {'':>37} {_cell(offsets.ack):>7}")
            continue
        lines.append(
            f"{offsets.name:<{name_width}} {_cell(offsets.first_barrier):>13} {_cell(offsets.alignment_end):>13} "
            f"{_cell(offsets.sync_end):>9} {_cell(offsets.async_end):>9} {_cell(offsets.ack):>7}  "
            f"|{bar(offsets, scale, width)}|"
        )
        arrived = [c[2] for c in offsets.channels if c[2] is not None]
        slowest = max(arrived) if len(offsets.channels) > 1 and arrived else None
        for channel, upstream, barrier in offsets.channels:
            label = f"  ch {channel} {upstream}"
            note = "  slowest" if barrier is not None and barrier == slowest else ""
            if barrier is None:
                note = "  ended before its barrier"
            lines.append(
                f"{label:<{name_width}} {_cell(barrier):>13} {'':>13} {'':>9} {'':>9} {'':>7}  "
                f"|{channel_bar(barrier, scale, width)}|{note}"
            )
    return lines

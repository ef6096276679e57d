"""Which checkpoints a JobManager taking a job over may restore: those no deposed leader wrote late.

Under high availability every checkpoint's metadata names the leader term that wrote it
(``leader_term``, docs/formats.md). A leader checks its lease before each storage write, but not
atomically with it: a leader paused between the check and the write can land its metadata after a
newer leader took the job over. That late checkpoint is complete, yet the new leader never saw it: it
restored an older one, resolved the sinks as of that one (rolling back what the late checkpoint's
sinks had prepared) and may have deleted its objects as orphans. Restoring it later would lose output.

So each takeover leaves a fence in the job record (written conditionally before the new leader acts):
its term and the highest checkpoint id it listed. A checkpoint is stale when some fence has a higher
term than the checkpoint's and the checkpoint's id is above what that fence listed: it was written by
an older term after that takeover. Checkpoints of the new term, or any listed at the takeover, never
are. The decision is this pure function; ``weir.jobmanager.recovery`` reads, calls it and logs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from weir.core.ids import CheckpointId


@dataclass(frozen=True, order=True)
class TermFence:
    """A takeover: the leader of ``term`` listed the job's checkpoints up to ``checkpoints_through``
    (None: it found none) before it acted on the job."""

    term: int
    checkpoints_through: CheckpointId | None


@dataclass(frozen=True)
class WrittenCheckpoint:
    """A checkpoint's id and the leader term its metadata names (0: written without high availability)."""

    checkpoint_id: CheckpointId
    leader_term: int


def is_stale(checkpoint: WrittenCheckpoint, fences: Iterable[TermFence]) -> bool:
    """Written by an older term after a takeover that did not list it."""
    return any(
        fence.term > checkpoint.leader_term
        and (fence.checkpoints_through is None or checkpoint.checkpoint_id > fence.checkpoints_through)
        for fence in fences
    )


def stale_checkpoints(checkpoints: Iterable[WrittenCheckpoint], fences: Iterable[TermFence]) -> frozenset[CheckpointId]:
    """The ids of ``checkpoints`` a restore must ignore (see the module docstring)."""
    fence_list = tuple(fences)
    return frozenset(c.checkpoint_id for c in checkpoints if is_stale(c, fence_list))


def takeover_fence(term: int, listed: Iterable[CheckpointId]) -> TermFence:
    """The fence a leader of ``term`` leaves after listing (and keeping) the checkpoints ``listed``."""
    ids = tuple(listed)
    return TermFence(term, max(ids) if ids else None)


def with_fence(fences: Iterable[TermFence], fence: TermFence) -> tuple[TermFence, ...]:
    """``fences`` and ``fence``, by term; a term's fence is set once (its first takeover's listing)."""
    by_term = {f.term: f for f in fences}
    by_term.setdefault(fence.term, fence)
    return tuple(sorted(by_term.values()))

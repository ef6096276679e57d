"""Which restored snapshot a subtask opens as its database, and which key ranges it copies: a pure
decision over the keyed state handles, after Flink's ``RocksDBIncrementalRestoreOperation``.

Flink restores a single handle whose key-group range is the backend's by opening its files as the
new RocksDB instance (``restoreWithoutRescaling``): no entry is read. At another parallelism it opens
the handle that overlaps the new range best as the initial instance
(``RocksDBIncrementalCheckpointUtils.findTheBestStateHandleForInitial``), range-deletes the key groups
outside the new range (``clipDBWithKeyGroupRange``), and copies only the overlapping key groups of
every other handle from a temporary instance. Weir decides the same way:

- the handles are grouped by the local RocksDB checkpoint their files come from (subtasks of one
  TaskManager may share one); a checkpoint with no key group the subtask owns is not read at all;
- the checkpoint of which the subtask owns the largest share of key groups, if that share is at
  least :data:`ADOPT_MIN_SHARE`, is *adopted*: opened as the database, with the key groups it holds
  that the subtask does not own deleted (none at the same parallelism, nor at a scale-in where the
  old subtask's range lies inside the new one); a share below it would leave more dead entries in
  the database than copying saves;
- every other checkpoint's overlapping key groups are *copied*, entry by entry.

A database that is not pristine (it holds entries, or was snapshotted: see
``RocksDBStateBackend.pristine``) is never replaced: then everything is copied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from weir.core.ids import KeyGroup, OperatorUid
from weir.core.keygroups import KeyGroupRange
from weir.taskmanager.snapshot_handles import KeyedStateHandle, KeyRanges, SnapshotSource

ADOPT_MIN_SHARE: Final = 0.5
"""The least share of a restored checkpoint's key groups the subtask must own for the checkpoint to
be opened as its database (Flink's ``state.backend.rocksdb.restore-overlap-fraction-threshold``): 1.0
at the same parallelism and at a scale-in, 0.5 for each half of a scale-out by two."""

Parts = tuple[tuple[OperatorUid, KeyGroupRange], ...]


@dataclass(frozen=True)
class AdoptSnapshot:
    """Open ``handle``'s files as the database; keep ``keep``, range-delete ``deleted`` (and anything
    else the files hold outside ``keep``)."""

    handle: KeyedStateHandle
    keep: Parts
    deleted: Parts


@dataclass(frozen=True)
class CopyRanges:
    """Copy ``parts`` of ``handle``'s snapshot into the database, entry by entry."""

    handle: KeyedStateHandle
    parts: Parts


@dataclass(frozen=True)
class KeyedRestorePlan:
    adopt: AdoptSnapshot | None
    copies: tuple[CopyRanges, ...]

    @property
    def snapshots_used(self) -> int:
        return len(self.copies) + (self.adopt is not None)


@dataclass(frozen=True)
class _Candidate:
    source: SnapshotSource
    handle: KeyedStateHandle  # the first of the source's handles: every one lists the same files
    ranges: Parts  # the union of its handles' ranges
    overlap: Parts  # the part of them the subtask owns

    @property
    def share(self) -> float:
        return _key_groups(self.overlap) / max(1, _key_groups(self.ranges))


def plan_keyed_restore(
    handles: Iterable[KeyedStateHandle], wanted: KeyRanges, *, may_adopt: bool, min_share: float = ADOPT_MIN_SHARE
) -> KeyedRestorePlan:
    """The plan to restore the key ranges ``wanted`` from ``handles`` (which may be every handle of a
    checkpoint); ``may_adopt``: the database is pristine and may be replaced by a restored one."""
    candidates = _candidates(handles, tuple(wanted))
    adopted: _Candidate | None = None
    if may_adopt:
        eligible = [c for c in candidates if c.share >= min_share]
        # The largest share first (whole coverage when there is one), then the most bytes it saves copying.
        eligible.sort(key=lambda c: (-c.share, -c.share * c.handle.size_bytes, c.source))
        adopted = eligible[0] if eligible else None
    adopt = None
    if adopted is not None:
        adopt = AdoptSnapshot(adopted.handle, adopted.overlap, _subtract(adopted.ranges, adopted.overlap))
    copies = tuple(CopyRanges(c.handle, c.overlap) for c in candidates if c is not adopted)
    return KeyedRestorePlan(adopt, copies)


def _candidates(handles: Iterable[KeyedStateHandle], wanted: Parts) -> list[_Candidate]:
    by_source: dict[SnapshotSource, list[KeyedStateHandle]] = {}
    for handle in handles:
        if handle.overlap(wanted):
            by_source.setdefault(handle.snapshot, []).append(handle)
    out = []
    for source in sorted(by_source):
        group = by_source[source]
        ranges = _sorted({part for h in group for part in h.ranges})
        overlap = _sorted({part for h in group for part in h.overlap(wanted)})
        out.append(_Candidate(source, group[0], ranges, overlap))
    return out


def _sorted(parts: Iterable[tuple[OperatorUid, KeyGroupRange]]) -> Parts:
    return tuple(sorted(parts, key=lambda p: (p[0], p[1].start, p[1].end)))


def _key_groups(parts: Parts) -> int:
    return sum(len(r) for _, r in parts)


def _subtract(ranges: Parts, keep: Parts) -> Parts:
    """The key groups of ``ranges`` outside ``keep``, per operator."""
    out: list[tuple[OperatorUid, KeyGroupRange]] = []
    for uid, own in ranges:
        pieces = [own]
        for kept_uid, kept in keep:
            if kept_uid != uid:
                continue
            pieces = [rest for piece in pieces for rest in _minus(piece, kept)]
        out += [(uid, piece) for piece in pieces]
    return _sorted(out)


def _minus(piece: KeyGroupRange, cut: KeyGroupRange) -> list[KeyGroupRange]:
    if piece.intersection(cut) is None:
        return [piece]
    rest = []
    if piece.start < cut.start:
        rest.append(KeyGroupRange(piece.start, KeyGroup(cut.start - 1)))
    if cut.end < piece.end:
        rest.append(KeyGroupRange(KeyGroup(cut.end + 1), piece.end))
    return rest

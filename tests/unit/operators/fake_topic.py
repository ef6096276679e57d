"""An in-memory Kafka topic for the source's unit tests: each partition's records (offset = index),
the consumer group's committed offsets as commits leave them, and one reader per source subtask,
standing in for ``weir.connectors.kafka.PartitionReader`` (never a broker: unit tests need none)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest

from weir.operators import sources


@dataclass(frozen=True)
class FakeMessage:
    """A record of the topic as the consumer hands it over; its value names where it was read."""

    _partition: int
    _offset: int

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return json.dumps({"p": self._partition, "o": self._offset}).encode()

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000 + self._offset)


@dataclass(frozen=True)
class Commit:
    """One commit a reader sent to the consumer group."""

    reader: int
    offsets: Mapping[int, int]


@dataclass
class FakeTopic:
    """A topic of ``lengths[p]`` records in partition p; readers read it, commits land in ``group``."""

    lengths: list[int]
    group: dict[int, int] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)
    readers: list[FakeTopicReader] = field(default_factory=list)
    visible_partitions: int | None = None
    """The partition count the metadata reports, if not all of them (a topic being recreated)."""

    @property
    def partitions(self) -> int:
        return len(self.lengths) if self.visible_partitions is None else self.visible_partitions

    def grow(self, partitions: int) -> None:
        assert partitions >= len(self.lengths), "a Kafka topic's partitions only grow"
        self.lengths += [0] * (partitions - len(self.lengths))

    def append(self, partition: int, records: int) -> None:
        self.lengths[partition] += records

    def reader(self) -> FakeTopicReader:
        reader = FakeTopicReader(self, len(self.readers))
        self.readers.append(reader)
        return reader

    def serve(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make every Kafka source opened from now on read this topic, each with a reader of its own."""
        monkeypatch.setattr(sources.kafka, "partition_count", lambda _endpoints, _topic: self.partitions)
        monkeypatch.setattr(sources.kafka, "PartitionReader", lambda _endpoints, _topic, **_kw: self.reader())


@dataclass
class FakeTopicReader:
    """One source subtask's consumer: reads its assigned partitions from their positions, at most
    ``budget[p]`` records of partition p per ``consume`` when set (else up to the partition's end)."""

    topic: FakeTopic
    index: int
    positions: dict[int, int] = field(default_factory=dict)
    assigned_from: dict[int, int | None] = field(default_factory=dict)
    budget: dict[int, int] | None = None
    closed: bool = False

    def partition_count(self) -> int:
        return self.topic.partitions

    def end_offset(self, partition: int) -> int:
        return self.topic.lengths[partition]

    def offsets_for_time(self, partitions: Iterable[int], timestamp_ms: int) -> dict[int, int]:
        return {}

    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]:
        return {p: self.topic.group.get(p) for p in partitions}

    def cached_high_watermark(self, partition: int) -> int:
        return -1

    @staticmethod
    def is_end_of_partition(error: object) -> bool:
        return False

    def assign(self, next_offsets: Mapping[int, int | None]) -> None:
        self.positions, self.assigned_from = {}, {}
        self.add(next_offsets)

    def add(self, next_offsets: Mapping[int, int | None]) -> None:
        assert all(p < self.topic.partitions for p in next_offsets), f"assigned {dict(next_offsets)}: no such partition"
        self.assigned_from.update(next_offsets)
        self.positions.update({p: 0 if o is None else o for p, o in next_offsets.items()})

    def unassign(self, partition: int) -> None:
        del self.positions[partition]

    def consume(self, max_messages: int, timeout_s: float) -> list[FakeMessage]:
        out: list[FakeMessage] = []
        for p in sorted(self.positions):
            start = self.positions[p]
            end = self.topic.lengths[p]
            if self.budget is not None:
                end = min(end, start + self.budget.get(p, 0))
            end = min(end, start + max_messages - len(out))
            out += [FakeMessage(p, o) for o in range(start, end)]
            self.positions[p] = max(start, end)
        return out

    def commit(self, next_offsets: Mapping[int, int]) -> None:
        self.topic.commits.append(Commit(self.index, dict(next_offsets)))
        self.topic.group.update(next_offsets)

    def close(self) -> None:
        self.closed = True

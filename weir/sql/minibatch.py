"""Mini-batch of a GROUP BY without a window (Flink's ``table.exec.mini-batch.*``): the input rows
buffered per key, then each key's rows applied to its accumulators at once and one change emitted
per key instead of one per row.

:class:`MiniBatchBuffer` is the pure part (no clock of its own, no I/O): which rows wait, by key in
the order the keys first arrived, and when the buffer must be applied (flushed):

- **size**: the buffer holds ``size`` rows (``table.exec.mini-batch.size``): :meth:`MiniBatchBuffer.add`
  answers True;
- **latency**: ``allow_latency_ms`` (``table.exec.mini-batch.allow-latency``) after the first row of
  the buffer arrived (:meth:`MiniBatchBuffer.due_at`, a processing-time deadline);
- **checkpoint barrier** and **end of input**: always, before the operator's snapshot and before the
  end of the stream, so that a snapshot never holds a buffered row (exactly-once needs no buffer in
  the state) and a bounded job's last rows are applied.

A watermark reaching a non-empty buffer is held (the highest one) and forwarded right after the next
flush's output (:attr:`Drained.watermark`), so that no row the buffer emits later is behind a
watermark already forwarded; reaching an empty buffer, it passes at once."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class MiniBatchConfig:
    """``table.exec.mini-batch.allow-latency`` (ms, > 0) and ``table.exec.mini-batch.size`` (rows, > 0)."""

    allow_latency_ms: int
    size: int

    def __post_init__(self) -> None:
        if self.allow_latency_ms <= 0 or self.size <= 0:
            raise ValueError(f"a mini-batch needs a latency and a size above 0, got {self}")

    def __str__(self) -> str:
        return f"mini-batch {self.allow_latency_ms} ms / {self.size} rows"


@dataclass(frozen=True)
class Drained(Generic[K, V]):
    """What a flush applies: each key's buffered values in arrival order, the keys in the order
    they first arrived; then the watermark held while they waited (None: none)."""

    groups: tuple[tuple[K, tuple[V, ...]], ...]
    watermark: int | None


class MiniBatchBuffer(Generic[K, V]):
    """The rows of one operator's mini-batch, by key. The caller flushes (:meth:`drain`) when
    :meth:`add` answers True, when the processing time reaches :meth:`due_at`, before each snapshot
    and at the end of input."""

    __slots__ = ("_config", "_first_at", "_groups", "_held_watermark", "_rows")

    def __init__(self, config: MiniBatchConfig) -> None:
        self._config = config
        self._groups: dict[K, list[V]] = {}
        self._rows = 0
        self._first_at: int | None = None
        self._held_watermark: int | None = None

    def __len__(self) -> int:
        """The rows buffered."""
        return self._rows

    def add(self, key: K, value: V, now_ms: Callable[[], int]) -> bool:
        """Buffer ``value`` of ``key``; True when the buffer is full (flush now). ``now_ms`` is read
        only by the first row of a buffer (its latency deadline starts then)."""
        if self._first_at is None:
            self._first_at = now_ms()
        group = self._groups.get(key)
        if group is None:
            self._groups[key] = [value]
        else:
            group.append(value)
        self._rows += 1
        return self._rows >= self._config.size

    def due_at(self) -> int | None:
        """When (processing time, epoch ms) the buffer must be flushed for its latency; None: empty."""
        return None if self._first_at is None else self._first_at + self._config.allow_latency_ms

    def watermark(self, watermark: int) -> int | None:
        """A watermark arrived: the one to forward now (the buffer is empty), or None (held until
        the next flush, which answers the highest one held)."""
        if not self._rows:
            return watermark
        if self._held_watermark is None or watermark > self._held_watermark:
            self._held_watermark = watermark
        return None

    def drain(self) -> Drained[K, V]:
        """Everything buffered, and the held watermark; the buffer is empty afterwards."""
        drained = Drained(tuple((k, tuple(v)) for k, v in self._groups.items()), self._held_watermark)
        self._groups = {}
        self._rows = 0
        self._first_at = None
        self._held_watermark = None
        return drained


__all__ = ["Drained", "MiniBatchBuffer", "MiniBatchConfig"]

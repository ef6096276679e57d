"""Consumer lag of a Kafka source subtask: ``weir_kafka_source_lag_records{topic, partition}``.

The lag of a partition is its high watermark (the offset the next record written to it will get)
minus the offset the source reads next. The high watermark comes from librdkafka's cache, filled by
every fetch response (``Consumer.get_watermark_offsets(tp, cached=True)``), so updating the lag asks
the broker nothing. Under ``read_committed`` the high watermark also counts transaction markers and
records of open transactions, so on a transactionally written topic the lag is an upper bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import Gauge

from weir.core.metrics import TASK_LABELS

KAFKA_SOURCE_LAG = Gauge(
    "weir_kafka_source_lag_records",
    "Records in a Kafka partition the source has not read yet (high watermark - next offset)",
    (*TASK_LABELS, "topic", "partition"),
)

DEFAULT_MIN_INTERVAL_S = 1.0


def partition_lag(high_watermark: int, next_offset: int) -> int | None:
    """Records left to read, or None when the high watermark is not known yet (librdkafka answers a
    negative offset, OFFSET_INVALID, until the first fetch response for the partition)."""
    if high_watermark < 0:
        return None
    return max(0, high_watermark - max(0, next_offset))


def record_lag(labels: Sequence[str], topic: str, partition: int, high_watermark: int, next_offset: int) -> int | None:
    """Set the lag gauge of one partition read by the subtask with task labels ``labels``
    (``TaskMetrics.labels``: job, operator uid, subtask, TaskManager); answers the lag it set."""
    lag = partition_lag(high_watermark, next_offset)
    if lag is not None:
        KAFKA_SOURCE_LAG.labels(*labels, topic, str(partition)).set(lag)
    return lag


class KafkaSourceLag:
    """The lag gauges of one Kafka source subtask, refreshed at most every ``min_interval_s``.

    ``high_watermark(partition)`` reads librdkafka's cached high watermark; a source calls
    :meth:`maybe_update` after each poll and :meth:`remove` when it closes.
    """

    def __init__(
        self,
        labels: Sequence[str],
        topic: str,
        high_watermark: Callable[[int], int],
        *,
        min_interval_s: float = DEFAULT_MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._labels = tuple(labels)
        self._topic = topic
        self._high_watermark = high_watermark
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._next_update = float("-inf")
        self._partitions: set[int] = set()

    def maybe_update(self, partitions: Iterable[int], next_offsets: Mapping[int, int]) -> bool:
        """Refresh the lag of ``partitions`` (a partition not in ``next_offsets`` is read from offset
        0) when ``min_interval_s`` has passed since the last refresh; True when it refreshed."""
        now = self._clock()
        if now < self._next_update:
            return False
        self._next_update = now + self._min_interval_s
        for partition in partitions:
            lag = record_lag(
                self._labels,
                self._topic,
                partition,
                self._high_watermark(partition),
                next_offsets.get(partition, 0),
            )
            if lag is not None:
                self._partitions.add(partition)
        return True

    def finished(self, partition: int) -> None:
        """A bounded partition was read to its end: its lag is 0 from now on."""
        KAFKA_SOURCE_LAG.labels(*self._labels, self._topic, str(partition)).set(0)
        self._partitions.add(partition)

    def remove(self) -> None:
        """Drop this subtask's series (the source closed; another attempt gets its own)."""
        for partition in self._partitions:
            try:
                KAFKA_SOURCE_LAG.remove(*self._labels, self._topic, str(partition))
            except KeyError:
                pass
        self._partitions.clear()

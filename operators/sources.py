"""Replayable sources: Kafka partitions read from explicit offsets, and a deterministic generator.

A source's position (next offset per partition, next index) is its operator state: a checkpoint
holds it and a restore seeks to it. Consumer-group offset commits are never used.
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable
from typing import Any, assert_never

from connectors import kafka
from operators.base import SourceOperator
from operators.source_metrics import KafkaSourceLag
from weir.core.config import Endpoints
from weir.core.descriptors import GeneratorSourceSpec, KafkaSourceSpec, end_offsets_parameter
from weir.core.errors import JobDefinitionError, ServiceUnavailableError
from weir.core.watermarks import (
    MAX_WATERMARK,
    BoundedOutOfOrdernessWatermarks,
    PartitionStatusChange,
    PartitionWatermarks,
    WatermarkStatus,
)

IDLE_SOURCE_WAIT_S = 0.05
"""How long a Kafka source subtask with no partition waits between polls (it only checks control)."""


def json_deserializer(raw: bytes) -> Any:
    return json.loads(raw)


class Pacer:
    """Limits a source subtask to its share of ``records_per_second`` (None: no limit)."""

    def __init__(
        self, records_per_second: float | None, parallelism: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = parallelism / records_per_second if records_per_second else 0.0
        self._clock = clock
        self._started = clock()
        self._taken = 0

    def allowed(self, wanted: int) -> int:
        if not self._interval:
            return wanted
        due = int((self._clock() - self._started) / self._interval) - self._taken
        return max(0, min(wanted, due))

    def consumed(self, n: int) -> None:
        self._taken += n

    def wait_s(self) -> float:
        if not self._interval:
            return 0.0
        return max(0.0, self._started + (self._taken + 1) * self._interval - self._clock())


class KafkaSourceOperator(SourceOperator):
    """Reads the partitions p with p % parallelism == subtask, from the restored offsets or the start.

    Its watermark is the combination of per-partition watermarks (:class:`PartitionWatermarks`);
    with ``idle_timeout_ms`` a partition without records for that long (``clock``: monotonic seconds)
    stops holding it back, and the subtask reports IDLE (``watermark_status``) once every partition
    it reads is idle, or at once when it has none and the source is unbounded.
    """

    def __init__(self, spec: KafkaSourceSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self._spec = spec
        self._clock = clock
        self._next_offsets: dict[int, int] = {}
        self._end_offsets: dict[int, int] | None = None
        self._restored = False
        self._dlq: Any = None
        self._lag: KafkaSourceLag | None = None
        self.dead_lettered = 0

    def restore_state(self, data: bytes) -> None:
        state = pickle.loads(data)
        self._next_offsets = dict(state["next_offsets"])
        self._end_offsets = state["end_offsets"]
        self._restored = True

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        if self._dlq is not None:
            self._dlq.flush(30)  # dead letters of records before the barrier are durable with it
        return pickle.dumps({"next_offsets": dict(self._next_offsets), "end_offsets": self._end_offsets})

    def open(self) -> None:
        spec, ctx = self._spec, self.ctx
        endpoints = Endpoints.from_env()
        partitions = kafka.partition_count(endpoints, spec.topic)
        mine = [p for p in range(partitions) if p % ctx.parallelism == ctx.subtask]
        self._consumer = kafka.PartitionReader(endpoints, spec.topic, group_id=f"weir-{ctx.job_id}-{ctx.uid}")
        if self._end_offsets is None and spec.bounded:
            # The end of a bounded source is fixed once, by the JobManager at submit (kept in the job
            # record, so it survives every recovery); without it, the ends present now.
            fixed = ctx.parameters.get(end_offsets_parameter(ctx.uid))
            ends = {int(p): int(o) for p, o in json.loads(fixed).items()} if fixed else {}
            self._end_offsets = {}
            for p in mine:
                if p not in ends:
                    ends[p] = self._consumer.end_offset(p)
                self._end_offsets[p] = ends[p]
        self._active = {p for p in mine if not self._partition_done(p)}
        self._partition_watermarks = PartitionWatermarks(
            mine,
            spec.max_out_of_orderness_ms,
            spec.idle_timeout_ms,
            now=self._clock(),
            ended=[p for p in mine if p not in self._active],
        )
        self._emitted_watermark = self._partition_watermarks.current
        self._consumer.assign({p: self._next_offsets.get(p) for p in self._active})
        if ctx.metrics is not None:
            self._lag = KafkaSourceLag(ctx.metrics.labels, spec.topic, self._cached_high_watermark)
            for p in mine:
                if p not in self._active:
                    self._lag.finished(p)
        self._dlq = kafka.producer(endpoints, linger_ms=20) if spec.dead_letter_topic else None
        self._pacer = Pacer(spec.records_per_second, ctx.parallelism)
        ctx.log.info(
            "kafka_source_opened",
            topic=spec.topic,
            partitions=mine,
            restored=self._restored,
            offsets=self._next_offsets,
            end_offsets=self._end_offsets,
        )

    def _cached_high_watermark(self, partition: int) -> int:
        """The partition's high watermark as librdkafka's last fetch response gave it (no broker
        request); negative while unknown."""
        return self._consumer.cached_high_watermark(partition)

    def _partition_done(self, partition: int) -> bool:
        if self._end_offsets is None:
            return False
        return self._next_offsets.get(partition, 0) >= self._end_offsets.get(partition, 0)

    def watermark_status(self) -> WatermarkStatus:
        """IDLE: every partition this subtask reads is idle (or it reads none, unbounded, with an
        idle timeout); its consumers then leave it out of their watermark."""
        return self._partition_watermarks.status()

    def poll(self, max_records: int) -> bool:
        if not self._active:
            if not self._spec.bounded and self._spec.idle_timeout_ms is not None:
                # Unbounded with no partition here: stay (idle) instead of ending, as in Flink.
                return True
            self._finish_watermark()
            return False
        allowed = self._pacer.allowed(max_records)
        if allowed == 0:
            return True
        messages = self._consumer.consume(allowed, 0.05)
        self._pacer.consumed(len(messages))
        self.records_polled += len(messages)
        spec, emit = self._spec, self.output.emit
        deserialize, timestamp_of = spec.deserializer, spec.timestamp
        partition_watermarks = self._partition_watermarks
        watermarks, seen = partition_watermarks.generators, partition_watermarks.seen
        next_offsets = self._next_offsets
        ends = self._end_offsets  # None: unbounded, no partition ever ends
        for msg in messages:
            err = msg.error()
            partition = msg.partition()
            if err is not None:
                if self._consumer.is_end_of_partition(err):
                    next_offsets[partition] = max(next_offsets.get(partition, 0), msg.offset())
                    self._check_done(partition)
                    continue
                raise ServiceUnavailableError(f"kafka source {spec.topic}[{partition}]: {err}")
            offset = msg.offset()
            next_offsets[partition] = offset + 1
            raw = msg.value()
            try:
                value = deserialize(raw)
                ts = timestamp_of(value) if timestamp_of is not None else msg.timestamp()[1]
                if not isinstance(ts, int):
                    raise TypeError(f"timestamp must be an int (epoch ms), got {type(ts).__name__}")
            except Exception as exc:  # a malformed record never stops the job when a DLQ is set
                self._dead_letter(raw, msg.key(), f"{type(exc).__name__}: {exc}", partition, offset)
                self._check_done(partition)
                continue
            watermarks[partition].on_event(ts)
            seen.add(partition)
            emit(value, ts)
            if ends is not None and offset + 1 >= ends.get(partition, 0):
                self._check_done(partition)
        self._advance_watermark()
        if self._lag is not None:
            self._lag.maybe_update(self._active, self._next_offsets)
        return True

    def idle_wait_s(self) -> float:
        if not self._active:
            return IDLE_SOURCE_WAIT_S  # an idle subtask without partitions: nothing to poll for
        return self._pacer.wait_s()

    def _check_done(self, partition: int) -> None:
        if partition in self._active and self._partition_done(partition):
            self._active.discard(partition)
            self._partition_watermarks.end(partition)
            self._consumer.unassign(partition)
            if self._lag is not None:
                self._lag.finished(partition)

    def _advance_watermark(self) -> None:
        watermark, changes = self._partition_watermarks.advance(self._clock())
        for change in changes:
            self._log_partition_status(change)
        if watermark is not None and watermark > self._emitted_watermark:
            self._emitted_watermark = watermark
            self.output.emit_watermark(watermark)

    def _log_partition_status(self, change: PartitionStatusChange) -> None:
        spec = self._spec
        match change.status:
            case WatermarkStatus.IDLE:
                self.ctx.log.info(
                    "kafka_partition_idle",
                    topic=spec.topic,
                    partition=change.partition,
                    idle_timeout_ms=spec.idle_timeout_ms,
                    watermark=self._emitted_watermark,
                )
            case WatermarkStatus.ACTIVE:
                self.ctx.log.info(
                    "kafka_partition_active",
                    topic=spec.topic,
                    partition=change.partition,
                    watermark=self._emitted_watermark,
                )
            case _:
                assert_never(change.status)

    def _finish_watermark(self) -> None:
        if self._emitted_watermark < MAX_WATERMARK:
            self._emitted_watermark = MAX_WATERMARK
            self.output.emit_watermark(MAX_WATERMARK)

    def _dead_letter(self, raw: bytes | None, key: bytes | None, reason: str, partition: int, offset: int) -> None:
        spec = self._spec
        origin = f"{spec.topic}[{partition}]@{offset}"
        if self._dlq is None:
            raise JobDefinitionError(
                f"kafka source {self.ctx.uid!r}: malformed record at {origin}: {reason} "
                "(give the source a dead_letter_topic to keep running)"
            )
        envelope = {
            "reason": reason,
            "topic": spec.topic,
            "partition": partition,
            "offset": offset,
            "job_id": self.ctx.job_id,
            "operator_uid": self.ctx.uid,
            "value": None if raw is None else raw.decode("utf-8", errors="replace"),
        }
        assert spec.dead_letter_topic is not None
        self._dlq.produce(spec.dead_letter_topic, key=key, value=json.dumps(envelope).encode())
        self._dlq.poll(0)
        self.dead_lettered += 1
        if self.ctx.metrics is not None:
            self.ctx.metrics.dead_letters.inc()
        self.ctx.log.warning("record_dead_lettered", origin=origin, reason=reason, dlq=spec.dead_letter_topic)

    def close(self) -> None:
        if self._lag is not None:
            self._lag.remove()
            self._lag = None
        consumer = getattr(self, "_consumer", None)
        if consumer is not None:
            consumer.close()
        if getattr(self, "_dlq", None) is not None:
            self._dlq.flush(10)


class GeneratorSourceOperator(SourceOperator):
    """Record i is ``generate(i)``; subtask s owns i = s, s + p, s + 2p, ... (replayable by index)."""

    def __init__(self, spec: GeneratorSourceSpec) -> None:
        self._spec = spec
        self._next_k = 0

    def restore_state(self, data: bytes) -> None:
        self._next_k = pickle.loads(data)["next_k"]

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        return pickle.dumps({"next_k": self._next_k})

    def open(self) -> None:
        self._watermarks = BoundedOutOfOrdernessWatermarks(self._spec.max_out_of_orderness_ms)
        self._pacer = Pacer(self._spec.records_per_second, self.ctx.parallelism)
        self._finished = False

    def _index(self, k: int) -> int:
        return self.ctx.subtask + k * self.ctx.parallelism

    def idle_wait_s(self) -> float:
        return self._pacer.wait_s()

    def poll(self, max_records: int) -> bool:
        spec = self._spec
        if self._finished:
            return False
        limit = self._pacer.allowed(max_records)
        self._pacer.consumed(limit)
        self.records_polled += limit
        emit, generate, ts_of = self.output.emit, spec.generate, spec.timestamp
        for _ in range(limit):
            i = self._index(self._next_k)
            if spec.count is not None and i >= spec.count:
                self._finished = True
                self.output.emit_watermark(MAX_WATERMARK)
                return False
            value = generate(i)
            ts = ts_of(value) if ts_of is not None else None
            if ts is not None:
                self._watermarks.on_event(ts)
            emit(value, ts)
            self._next_k += 1
        if spec.count is not None and self._index(self._next_k) >= spec.count:
            self._finished = True
            self.output.emit_watermark(MAX_WATERMARK)
            return False
        watermark = self._watermarks.poll()
        if watermark is not None:
            self.output.emit_watermark(watermark)
        return True

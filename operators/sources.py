"""Replayable sources: Kafka partitions read from explicit offsets, and a deterministic generator.

A source's position (next offset per partition, next index) is its operator state: a checkpoint
holds it and a restore seeks to it. Positions are committed to the consumer group when a checkpoint
completes (for monitoring and ``Committed`` starts), never read back for recovery. The state is a
small versioned JSON document (``docs/formats.md``)::

    Kafka:     {"format": 1, "next_offsets": {"<partition>": offset}, "end_offsets": null | {...}}
    generator: {"format": 1, "next_k": int}

A Kafka source's partitions are dealt round-robin (:func:`kafka_partition_owner`), and each
partition's position lives in the state of its owner alone: a subtask keeps, snapshots and commits
only the positions of the partitions it reads. Restored into another job, at the same or another
parallelism, each new subtask takes its own partitions' positions from the union of every old
subtask's, each partition's taken from its old owner; a partition without a position there is read
from its beginning (docs/kafka-source.md). So the union of a generation's snapshots is the previous
generation's positions plus what it read, every partition once, through any number of restores.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any, Final, Protocol, assert_never

from weir.connectors import kafka
from weir.core import json_codec
from weir.core.columnar import BatchDecoder, Schema, partition_order
from weir.core.config import Endpoints
from weir.core.descriptors import (
    Committed,
    GeneratorSourceSpec,
    KafkaRecord,
    KafkaSourceSpec,
    OffsetReset,
    StartingOffsets,
    Timestamp,
    TimestampType,
    end_offsets_parameter,
    start_offsets_parameter,
)
from weir.core.documents import load_versioned, typed
from weir.core.errors import JobDefinitionError, SerializationError, ServiceUnavailableError
from weir.core.kafka_config import kafka_client_config
from weir.core.rejections import DEAD_LETTER_VALUE_BYTES, SourcePosition, truncate_utf8
from weir.core.watermarks import (
    MAX_WATERMARK,
    BoundedOutOfOrdernessWatermarks,
    PartitionStatusChange,
    PartitionWatermarks,
    WatermarkStatus,
)
from weir.operators.base import InheritedState, SourceOperator
from weir.operators.source_metrics import KafkaSourceLag

SOURCE_STATE_FORMAT: Final = 1

COLUMNAR_POLL_RECORDS: Final = 2000
"""Records a columnar Kafka source asks for per poll: one record batch of up to this many rows."""

IDLE_SOURCE_WAIT_S = 0.05
"""How long a Kafka source subtask with no partition waits between polls (it only checks control)."""


json_deserializer: Final = json_codec.decode
"""The default: one JSON document; raises as ``json.loads`` does (the codec itself: no call between)."""


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


# Start positions ---------------------------------------------------------------------------------


class StartOffsetLookup(Protocol):
    """What deciding start positions asks of Kafka (a PartitionReader)."""

    def end_offset(self, partition: int) -> int: ...
    def offsets_for_time(self, partitions: Iterable[int], timestamp_ms: int) -> dict[int, int]: ...
    def committed(self, partitions: Iterable[int]) -> dict[int, int | None]: ...


def decide_start_offsets(
    starting: StartingOffsets, partitions: Sequence[int], lookup: StartOffsetLookup
) -> dict[int, int | None]:
    """Where each partition starts (None: at its beginning), by the source's ``starting_offsets``."""
    match starting:
        case OffsetReset.EARLIEST:
            return dict.fromkeys(partitions, None)
        case OffsetReset.LATEST:
            return {p: lookup.end_offset(p) for p in partitions}
        case Timestamp(ms=ms):
            found = lookup.offsets_for_time(partitions, ms)
            return {p: found[p] if p in found else lookup.end_offset(p) for p in partitions}
        case Committed(reset=reset):
            committed = lookup.committed(partitions)
            missing = [p for p in partitions if committed.get(p) is None]
            fallback = decide_start_offsets(reset, missing, lookup)
            return {p: committed[p] if p not in fallback else fallback[p] for p in partitions}
        case _:
            assert_never(starting)


def encode_start_offsets(starts: Mapping[int, int | None]) -> str:
    """The JobManager's fixed start positions of a source, as a job parameter."""
    return json.dumps({str(p): starts[p] for p in sorted(starts)}, separators=(",", ":"))


def decode_start_offsets(text: str) -> dict[int, int | None]:
    try:
        return {int(p): (None if o is None else typed(o, int)) for p, o in typed(json.loads(text), dict).items()}
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"kafka source start offsets parameter is malformed: {exc}") from exc


class CheckpointPositions:
    """The positions each checkpoint's snapshot held, until it completes (commit them) or aborts.

    A completed checkpoint's positions cover every earlier one: those are dropped unsent."""

    def __init__(self) -> None:
        self._by_checkpoint: dict[int, dict[int, int]] = {}

    def taken(self, checkpoint_id: int, next_offsets: Mapping[int, int]) -> None:
        self._by_checkpoint[checkpoint_id] = dict(next_offsets)

    def completed(self, checkpoint_id: int) -> dict[int, int] | None:
        """The positions to commit for this completed checkpoint (None: its snapshot is not here)."""
        positions = self._by_checkpoint.pop(checkpoint_id, None)
        for earlier in [c for c in self._by_checkpoint if c < checkpoint_id]:
            del self._by_checkpoint[earlier]
        return positions

    def aborted(self, checkpoint_id: int) -> None:
        self._by_checkpoint.pop(checkpoint_id, None)

    @property
    def pending(self) -> list[int]:
        return sorted(self._by_checkpoint)


def kafka_partition_owner(partition: int, parallelism: int) -> int:
    """The subtask that reads ``partition`` at ``parallelism``: partitions are dealt round-robin (as
    Flink's ``KafkaSourceEnumerator.getSplitOwner``, without its topic hash: a source reads one
    topic). A partition's position lives in its owner's state alone, and only its owner commits it."""
    return partition % parallelism


def owned_offsets(offsets: Mapping[int, int], subtask: int, parallelism: int) -> dict[int, int]:
    """The entries of ``offsets`` (by partition) of the partitions ``subtask`` owns at ``parallelism``."""
    return {p: o for p, o in offsets.items() if kafka_partition_owner(p, parallelism) == subtask}


def kafka_record(topic: str, msg: Any) -> KafkaRecord:
    """A consumed message as the value a ``record_deserializer`` takes."""
    kind, ts = msg.timestamp()
    headers = msg.headers()
    return KafkaRecord(
        topic=topic,
        partition=msg.partition(),
        offset=msg.offset(),
        key=msg.key(),
        value=msg.value(),
        timestamp=ts,
        timestamp_type=TimestampType(kind),
        headers=tuple(headers) if headers else (),
    )


class KafkaSourceOperator(SourceOperator):
    """Reads the partitions p with p % parallelism == subtask (:func:`kafka_partition_owner`), from the
    restored offsets or the start; its state holds the positions of those partitions and no other.

    Its watermark is the combination of per-partition watermarks (:class:`PartitionWatermarks`);
    with ``idle_timeout_ms`` a partition without records for that long (``clock``: monotonic seconds)
    stops holding it back, and the subtask reports IDLE (``watermark_status``) once every partition
    it reads is idle, or at once when it has none and the source is unbounded.

    Partitions without a restored position start where the JobManager fixed them at submit (by
    ``starting_offsets``; decided here at open when it did not), and that position goes into the
    state; after a restore, a partition without a restored position is read from its beginning.
    With ``partition_discovery_interval_ms`` an unbounded source looks for new partitions on its poll
    loop and reads its own from their beginning. With ``commit_offsets_on_checkpoint`` a completed
    checkpoint's positions of the partitions this subtask reads are committed to the consumer group
    (asynchronously; a failure is logged).

    A restored position of a partition this subtask owns but the topic does not show now (fewer
    partitions than the state knows: a topic being recreated) stays in its state, unread and
    uncommitted, so that it is neither lost nor held twice.
    """

    def __init__(self, spec: KafkaSourceSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self._spec = spec
        self._clock = clock
        self._next_offsets: dict[int, int] = {}
        self._end_offsets: dict[int, int] | None = None
        self._restored = False
        self._reading: set[int] = set()  # the partitions of the topic this subtask reads (opened, discovered)
        self._dlq: Any = None
        self._lag: KafkaSourceLag | None = None
        self.dead_lettered = 0
        self._checkpoint_positions = CheckpointPositions()
        interval = spec.partition_discovery_interval_ms
        self._discovery_interval_s = None if spec.bounded or interval is None else interval / 1000.0
        self._next_discovery = 0.0
        self._known_partitions = 0
        self._decoder = _decoded_schema(spec).decoder(spec.timestamp_field) if spec.schema is not None else None
        # With max_record_bytes the deserializer checks the size first (no cost without it).
        self._deserialize, self._record_deserialize = spec.deserializer, spec.record_deserializer
        limit = spec.max_record_bytes
        if limit is not None:
            if self._record_deserialize is None:
                self._deserialize = _size_checked(spec.deserializer, limit, _value_size)
            else:
                self._record_deserialize = _size_checked(self._record_deserialize, limit, _record_size)
        if self._decoder is not None:
            self.poll_records = COLUMNAR_POLL_RECORDS

    def restore_state(self, data: bytes) -> None:
        """This subtask's own state (a restart of the job, same parallelism), of the partitions it
        owns: an entry for another partition is a stale copy (see :func:`inherited_kafka_source_state`)."""
        self._keep_own(*decode_kafka_source_state(data))

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        """The positions of the partitions this subtask owns at its parallelism, each taken from the
        old subtask that read it (:func:`inherited_kafka_source_state`); the others stay with the new
        subtasks that own them. No state (the old job had no source of this uid): a new source, which
        starts where its ``starting_offsets`` say."""
        if not states:
            return
        self._keep_own(*inherited_kafka_source_state(states))

    def _keep_own(self, next_offsets: Mapping[int, int], end_offsets: Mapping[int, int] | None) -> None:
        subtask, parallelism = self.ctx.subtask, self.ctx.parallelism
        self._next_offsets = owned_offsets(next_offsets, subtask, parallelism)
        self._end_offsets = None if end_offsets is None else owned_offsets(end_offsets, subtask, parallelism)
        self._restored = True

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        if self._dlq is not None:
            self._dlq.flush(30)  # dead letters of records before the barrier are durable with it
        if self._spec.commit_offsets_on_checkpoint:
            reading = self._reading
            self._checkpoint_positions.taken(
                checkpoint_id, {p: o for p, o in self._next_offsets.items() if p in reading}
            )
        return encode_kafka_source_state(self._next_offsets, self._end_offsets)

    def open(self) -> None:
        spec, ctx = self._spec, self.ctx
        cluster = kafka_client_config(Endpoints.from_env(), ctx.parameters, spec.properties)
        partitions = kafka.partition_count(cluster, spec.topic)
        mine = [p for p in range(partitions) if kafka_partition_owner(p, ctx.parallelism) == ctx.subtask]
        self._known_partitions = partitions
        self._reading = set(mine)
        self._consumer = kafka.PartitionReader(
            cluster, spec.topic, group_id=spec.group_id_for(ctx.job_name, ctx.uid), on_commit_error=self._commit_failed
        )
        self._place_unrestored([p for p in mine if p not in self._next_offsets])
        if spec.bounded:
            # The end of a bounded source is fixed once, by the JobManager at submit (kept in the job
            # record, so it survives every recovery); without it, the ends present now. A restored end
            # stays: the job reads to where it was meant to end when it started.
            fixed = ctx.parameters.get(end_offsets_parameter(ctx.uid))
            ends = {int(p): int(o) for p, o in json.loads(fixed).items()} if fixed else {}
            self._end_offsets = dict(self._end_offsets or {})
            for p in mine:
                if p not in self._end_offsets:
                    self._end_offsets[p] = ends[p] if p in ends else self._consumer.end_offset(p)
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
        self._dlq = kafka.producer(cluster, linger_ms=20) if spec.dead_letter_topic else None
        self._pacer = Pacer(spec.records_per_second, ctx.parallelism)
        if self._discovery_interval_s is not None:
            self._next_discovery = self._clock() + self._discovery_interval_s
        ctx.log.info(
            "kafka_source_opened",
            topic=spec.topic,
            partitions=mine,
            restored=self._restored,
            offsets=self._next_offsets,
            end_offsets=self._end_offsets,
            starting_offsets=str(spec.starting_offsets),
            kafka=cluster.redacted(),
        )
        unseen = sorted(p for p in self._next_offsets if p >= partitions)
        if unseen:
            ctx.log.warning(
                "kafka_source_positions_kept_unread",
                topic=spec.topic,
                partitions=unseen,
                partition_count=partitions,
                reason="the topic shows fewer partitions than the restored state: their positions stay in the state",
            )

    def _place_unrestored(self, partitions: list[int]) -> None:
        """Give the partitions without a restored position theirs. After a restore (a restart, or a
        new job from another's checkpoint) there is none to give: such a partition was never read
        past its beginning, or was created since, and is read from its beginning whatever the new
        job's ``starting_offsets`` (Flink reads a partition discovered after a restore from its
        earliest offset); starting it at a LATEST fixed at the new job's submit would skip records.
        Otherwise: the JobManager's fixed start (a partition it did not know of was created later:
        its beginning), else decided now from ``starting_offsets``. A start at the beginning is left
        out of the positions."""
        if not partitions or self._restored:
            return
        fixed = self.ctx.parameters.get(start_offsets_parameter(self.ctx.uid))
        if fixed is not None:
            known = decode_start_offsets(fixed)
            starts = {p: known.get(p) for p in partitions}
        else:
            starts = decide_start_offsets(self._spec.starting_offsets, partitions, self._consumer)
        for p, offset in starts.items():
            if offset is not None:
                self._next_offsets[p] = offset

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the positions of the completed checkpoint's snapshot to the consumer group."""
        positions = self._checkpoint_positions.completed(checkpoint_id)
        consumer = getattr(self, "_consumer", None)
        if positions and consumer is not None:
            consumer.commit(positions)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._checkpoint_positions.aborted(checkpoint_id)

    def _commit_failed(self, reason: str) -> None:
        self.ctx.log.warning("kafka_offset_commit_failed", topic=self._spec.topic, uid=self.ctx.uid, reason=reason)

    def _discover_partitions(self) -> None:
        """Look for partitions added to the topic; read this subtask's new ones from their beginning
        (offset 0: below the log start, the consumer resets to the earliest offset)."""
        assert self._discovery_interval_s is not None
        self._next_discovery = self._clock() + self._discovery_interval_s
        count = self._consumer.partition_count()
        if count <= self._known_partitions:
            return
        ctx = self.ctx
        found = [
            p for p in range(self._known_partitions, count) if kafka_partition_owner(p, ctx.parallelism) == ctx.subtask
        ]
        self._known_partitions = count
        if not found:
            return
        now = self._clock()
        self._reading.update(found)
        for p in found:
            self._next_offsets.setdefault(p, 0)  # a position kept while the topic did not show it stays
            self._active.add(p)
            self._partition_watermarks.add(p, now)
        self._consumer.add({p: self._next_offsets[p] for p in found})
        ctx.log.info("kafka_partitions_discovered", topic=self._spec.topic, partitions=found, partition_count=count)

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
        if self._discovery_interval_s is not None and self._clock() >= self._next_discovery:
            self._discover_partitions()
        if not self._active:
            if self._discovery_interval_s is not None:
                return True  # a partition may yet be added for this subtask
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
        if self._decoder is None:
            self._emit_records(messages)
        else:
            self._emit_batch(messages, self._decoder)
        self._advance_watermark()
        if self._lag is not None:
            self._lag.maybe_update(self._active, self._next_offsets)
        return True

    def _emit_records(self, messages: list[Any]) -> None:
        """Each message as one record."""
        spec, emit = self._spec, self.output.emit
        deserialize, timestamp_of = self._deserialize, spec.timestamp
        record_deserialize, topic = self._record_deserialize, spec.topic
        partition_watermarks = self._partition_watermarks
        watermarks, seen = partition_watermarks.generators, partition_watermarks.seen
        next_offsets = self._next_offsets
        ends = self._end_offsets  # None: unbounded, no partition ever ends
        for msg in messages:
            err = msg.error()
            partition = msg.partition()
            if err is not None:
                self._partition_event(msg, partition, err)
                continue
            offset = msg.offset()
            if ends is not None and offset >= ends.get(partition, 0):
                continue  # past a bounded partition's end (appended after it was fixed, same poll)
            next_offsets[partition] = offset + 1
            raw = msg.value()
            try:
                value = deserialize(raw) if record_deserialize is None else record_deserialize(kafka_record(topic, msg))
                ts = timestamp_of(value) if timestamp_of is not None else msg.timestamp()[1]
                if not isinstance(ts, int):
                    raise TypeError(f"timestamp must be an int (epoch ms), got {type(ts).__name__}")
            except Exception as exc:  # a malformed record never stops the job when a DLQ is set
                self._dead_letter(raw, msg.key(), f"{type(exc).__name__}: {exc}", partition, offset)
                self._check_done(partition)
                continue
            generator = watermarks[partition]
            if ts > generator.max_timestamp:  # generator.on_event(ts), inline: once per record
                generator.max_timestamp = ts
            seen.add(partition)
            emit(value, ts)
            if ends is not None and offset + 1 >= ends.get(partition, 0):
                self._check_done(partition)

    def position_in_flight(self) -> SourcePosition | None:
        """The topic, partition and offset of the record being emitted now, read from the frame of
        :meth:`_emit_records` on the stack (its loop keeps them in locals), so a record that passes
        costs nothing. None outside that loop: a record batch (columnar) carries many positions."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_code is _EMIT_RECORDS_CODE and frame.f_locals.get("self") is self:
                local = frame.f_locals
                return SourcePosition(self._spec.topic, local["partition"], local["offset"])
            frame = frame.f_back
        return None

    def _partition_event(self, msg: Any, partition: int, err: Any) -> None:
        """A message carrying an error: the end of its partition (the position moves there), or a
        broker error, which fails the task (retriable)."""
        if self._consumer.is_end_of_partition(err):
            self._next_offsets[partition] = max(self._next_offsets.get(partition, 0), msg.offset())
            self._check_done(partition)
            return
        raise ServiceUnavailableError(f"kafka source {self._spec.topic}[{partition}]: {err}")

    def _emit_batch(self, messages: list[Any], decoder: BatchDecoder) -> None:
        """The messages as one record batch (the columnar path): every value of the poll decoded in
        one call, a malformed record dead-lettered alone, each partition's watermark advanced by its
        latest event time, the rows partition by partition (offset order kept). A bounded
        partition's records past its end offset are left out. The common poll (no error message,
        nothing past an end, no size limit) costs three list comprehensions over the messages
        (errors, partitions, values), no statement per message."""
        if any([m.error() for m in messages]):
            messages = self._without_partition_events(messages)
        if not messages:
            return
        partitions = [m.partition() for m in messages]
        last = dict(zip(partitions, range(len(partitions)), strict=True))  # each partition's last message
        ends = self._end_offsets
        if ends is not None and any(messages[i].offset() >= ends.get(p, 0) for p, i in last.items()):
            messages = [m for m in messages if m.offset() < ends.get(m.partition(), 0)]
            partitions = [m.partition() for m in messages]
            last = dict(zip(partitions, range(len(partitions)), strict=True))
        next_offsets = self._next_offsets
        for partition, i in last.items():
            next_offsets[partition] = messages[i].offset() + 1
        values = [m.value() for m in messages]
        limit = self._spec.max_record_bytes
        if limit is not None and any(_value_size(v) > limit for v in values):
            messages = self._without_oversized(messages, limit)
            partitions, values = [m.partition() for m in messages], [m.value() for m in messages]
        records, bad = decoder.decode(values)
        if bad:
            for index, reason in bad:
                msg = messages[index]
                self._dead_letter(values[index], msg.key(), reason, partitions[index], msg.offset())
            refused = {index for index, _reason in bad}
            partitions = [p for i, p in enumerate(partitions) if i not in refused]
        batch = None
        if records:
            columns = decoder.columns(records)
            stamps = decoder.timestamps(columns)
            latest, order = partition_order(partitions, stamps)
            watermarks, seen = self._partition_watermarks.generators, self._partition_watermarks.seen
            for partition, ts in latest.items():
                watermarks[partition].on_event(ts)
                seen.add(partition)
            batch = decoder.batch(columns, order)
        for partition in last:
            self._check_done(partition)
        if batch is not None:
            self.output.emit(batch, None)

    def _without_partition_events(self, messages: list[Any]) -> list[Any]:
        """The messages that carry a record; each one carrying an error is handled
        (:meth:`_partition_event`)."""
        kept = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._partition_event(msg, msg.partition(), err)
            else:
                kept.append(msg)
        return kept

    def _without_oversized(self, messages: list[Any], limit: int) -> list[Any]:
        """The messages within ``limit`` bytes; the others are dead-lettered."""
        kept = []
        for msg in messages:
            size = _value_size(msg.value())
            if size > limit:
                reason = f"{OversizedRecordError.__name__}: {_oversized(size, limit)}"
                self._dead_letter(msg.value(), msg.key(), reason, msg.partition(), msg.offset())
            else:
                kept.append(msg)
        return kept

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
        value, cut = (
            (None, False)
            if raw is None
            else truncate_utf8(raw.decode("utf-8", errors="replace"), DEAD_LETTER_VALUE_BYTES)
        )
        envelope = {
            "reason": reason,
            "topic": spec.topic,
            "partition": partition,
            "offset": offset,
            "job_id": self.ctx.job_id,
            "operator_uid": self.ctx.uid,
            "value": value,
            "value_truncated": cut,  # an oversized record's dead letter carries its first bytes
        }
        assert spec.dead_letter_topic is not None
        self._dlq.produce(spec.dead_letter_topic, key=key, value=json_codec.encode(envelope))
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


_EMIT_RECORDS_CODE: Final = KafkaSourceOperator._emit_records.__code__


class OversizedRecordError(ValueError):
    """A Kafka record's value is longer than the source's ``max_record_bytes``."""


def _oversized(size: int, limit: int) -> str:
    return f"record value of {size} bytes is over the source's max_record_bytes of {limit}"


def _decoded_schema(spec: KafkaSourceSpec) -> Schema:
    """The fields a columnar source decodes: its schema's, or only those the job reads (its projection)
    and the event time; a field no operator reads is neither decoded nor checked."""
    assert spec.schema is not None
    if spec.projection is None:
        return spec.schema
    return spec.schema.project((*spec.projection, *((spec.timestamp_field,) if spec.timestamp_field else ())))


def _value_size(raw: bytes | None) -> int:
    return 0 if raw is None else len(raw)


def _record_size(record: KafkaRecord) -> int:
    return _value_size(record.value)


def _size_checked(deserialize: Callable[[Any], Any], limit: int, size_of: Callable[[Any], int]) -> Callable[[Any], Any]:
    """``deserialize`` that first refuses an input of more than ``limit`` bytes (OversizedRecordError)."""

    def checked(data: Any) -> Any:
        size = size_of(data)
        if size > limit:
            raise OversizedRecordError(_oversized(size, limit))
        return deserialize(data)

    return checked


class GeneratorSourceOperator(SourceOperator):
    """Record i is ``generate(i)``; subtask s owns i = s, s + p, s + 2p, ... (replayable by index)."""

    def __init__(self, spec: GeneratorSourceSpec) -> None:
        self._spec = spec
        self._next_k = 0

    def restore_state(self, data: bytes) -> None:
        document = load_versioned(
            data, "generator source state", SOURCE_STATE_FORMAT, "restore it with the Weir version that wrote it"
        )
        try:
            self._next_k = typed(document["next_k"], int)
        except (KeyError, TypeError) as exc:
            raise SerializationError(f"generator source state is malformed: {exc}") from exc

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        return json.dumps({"format": SOURCE_STATE_FORMAT, "next_k": self._next_k}).encode()

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


# Kafka source state --------------------------------------------------------------------------------

KafkaSourcePositions = tuple[dict[int, int], dict[int, int] | None]
"""(next offset by partition, end offset by partition or None for an unbounded source)."""


def encode_kafka_source_state(next_offsets: Mapping[int, int], end_offsets: Mapping[int, int] | None) -> bytes:
    def partitions(offsets: Mapping[int, int]) -> dict[str, int]:
        return {str(p): offsets[p] for p in sorted(offsets)}

    return json.dumps(
        {
            "format": SOURCE_STATE_FORMAT,
            "next_offsets": partitions(next_offsets),
            "end_offsets": partitions(end_offsets) if end_offsets is not None else None,
        },
        separators=(",", ":"),
    ).encode()


def decode_kafka_source_state(data: bytes) -> KafkaSourcePositions:
    """(next offset by partition, end offset by partition or None for an unbounded source)."""
    what = "kafka source state"
    document = load_versioned(data, what, SOURCE_STATE_FORMAT, "restore it with the Weir version that wrote it")
    try:
        ends = document["end_offsets"]
        return _offsets(document["next_offsets"]), (_offsets(ends) if ends is not None else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is malformed: {type(exc).__name__}: {exc}") from exc


def _offsets(value: Any) -> dict[int, int]:
    return {int(typed(p, str)): typed(o, int) for p, o in typed(value, dict).items()}


def merge_kafka_source_states(states: Sequence[bytes]) -> KafkaSourcePositions:
    """The union of several subtasks' positions (each partition was read by one of them). Raises
    SerializationError when two claim one partition at different offsets, or bounded and unbounded
    states are mixed."""
    return _union([decode_kafka_source_state(data) for data in states])


def inherited_kafka_source_state(states: Sequence[InheritedState]) -> KafkaSourcePositions:
    """The positions (and a bounded source's ends) of a whole old job: each partition's from the
    old subtask that owned it at the old parallelism (:func:`kafka_partition_owner`), so that each
    partition has one, as each of Flink's Kafka splits lives in exactly one reader's state. An entry
    an old subtask holds for a partition it did not own is a stale copy and is left out (checkpoints
    taken by subtasks that kept every inherited position, then read only their own, hold them).
    Raises SerializationError when bounded and unbounded states are mixed."""
    owned: list[KafkaSourcePositions] = []
    for state in states:
        nexts, ends = decode_kafka_source_state(state.data)
        owned.append(
            (
                owned_offsets(nexts, state.subtask, state.parallelism),
                None if ends is None else owned_offsets(ends, state.subtask, state.parallelism),
            )
        )
    return _union(owned)


def _union(decoded: Sequence[KafkaSourcePositions]) -> KafkaSourcePositions:
    bounded = {ends is not None for _nexts, ends in decoded}
    if len(bounded) > 1:
        raise SerializationError("kafka source state: bounded and unbounded subtask states are mixed")
    next_offsets: dict[int, int] = {}
    end_offsets: dict[int, int] = {}
    for nexts, ends in decoded:
        _merge_offsets("next", nexts, next_offsets)
        _merge_offsets("end", ends or {}, end_offsets)
    return next_offsets, (end_offsets if bounded == {True} else None)


def _merge_offsets(what: str, offsets: Mapping[int, int], into: dict[int, int]) -> None:
    for partition, offset in offsets.items():
        if into.setdefault(partition, offset) != offset:
            raise SerializationError(
                f"kafka source state: two subtasks hold {what} offsets {into[partition]} and {offset} for "
                f"partition {partition}: the checkpoint is inconsistent"
            )

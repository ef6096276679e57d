"""``weir test``: run a job in this process over records from files, no services, and with
``--failures`` check that failures and recovery do not change what it commits.

A run is the reference run's (``weir.tools.reference``): the job's own operators, chained and fed by
the same classes as a cluster's subtasks, at parallelism 1; each Kafka source replays the lines of
a file (one line = one record's value bytes, through the source's own deserializer and timestamp
function); sinks are captured per uid. This module adds what a cluster adds around that chain:

- **checkpoints** every ``checkpoint_every`` source records: as every call is synchronous, the
  moment between two source polls is a consistent cut (Flink's aligned barriers, with nothing in
  flight), so a checkpoint is every operator's ``snapshot_state`` plus a copy of the keyed state;
- **two-phase commit**: what a sink receives in the epoch before checkpoint ``k`` is committed when
  ``k`` completes (Flink's ``TwoPhaseCommitSinkFunction``); what an epoch whose checkpoint never
  completed emitted is dropped at a failure;
- **failures**: every operator instance is dropped, the job file is loaded again (a new process:
  module globals start over), its operators are rebuilt and restored from the last completed
  checkpoint (``restore_state``, keyed state copied back), and the sources resume at the
  checkpointed offsets (Flink's full-graph failover);
- **virtual processing time**: it advances ``ms_per_record`` per source record, processing-time
  timers fire as it passes them, and ``time.time``/``time.time_ns`` read it during a run (so a
  function that reads the wall clock differs between runs exactly when a replay moves it); the
  ``random`` module is seeded at the start of every run, so only a replay changes what it draws.

The failure points (:class:`FailurePoint`) are, for every checkpoint ``k``: halfway through the
epoch before it (restores ``k-1``), ``after_pre_commit`` (``k`` snapshotted, never completed:
restores ``k-1``), ``after_checkpoint_complete_before_commit`` (``k`` completed, the sinks not yet
told: restores ``k``, whose output is committed on recovery); and ``after_sink_end_of_input`` (the
input ended and the final checkpoint completed). The names are those of ``weir.core.crashpoints``.

With ``rescale`` (``--rescale N``), every failure point is run once more with its restore at
parallelism N (:class:`_RescaledAttempt`: the restore of ``weir run --from-savepoint -p N``), so
that state kept per subtask instead of per key shows as a divergence too.

A check compares each failure run's committed output with the failure-free run's: a multiset of
``(value, timestamp)`` per sink (for an upsert sink, the final table). On a divergence it names the
first operator, in the plan's order, whose committed output differs (every operator's output is
recorded, not only the sinks'), the failure point and the first differing record.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import gc
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, assert_never
from unittest import mock

from weir.api import GeneratorSourceSpec, KafkaSourceSpec, PostgresCdcSourceSpec
from weir.api.job_code import JobCode, PreparedArtifact, SourceCode, forget_job_modules, load_job, read_source_code
from weir.core import crashpoints
from weir.core.cdc import ChangeEvent
from weir.core.changelog import Delete
from weir.core.columnar import BatchKeys, FieldKey, channel_table, split_by_channel
from weir.core.errors import Fault, WeirError
from weir.core.ids import ChannelIndex, KeyGroup, SubtaskIndex
from weir.core.keygroups import KeyEncoder, KeyGroupRange, key_group_range_for_subtask
from weir.core.state_layout import dump_value, load_value
from weir.graph import OperatorKind, Transformation
from weir.operators.base import NO_SIDE_OUTPUTS, InheritedState, OperatorContext, Output, SideOutputs, StreamOperator
from weir.operators.keyed import ReadsProcessingTime
from weir.operators.sources import kafka_partition_owner
from weir.operators.windows import WindowAggregateOperator
from weir.plan import JobPlan, Vertex, build_plan
from weir.taskmanager.chain import ChainInput, OperatorChain
from weir.taskmanager.partitioners import create_partitioner
from weir.tools.cdc_input import CdcInput, read_change_events
from weir.tools.reference import (
    KafkaRecord,
    SinkCapture,
    SinkDescription,
    _ChainRun,
    _guard,
    _ignore,
    _ReplayKafkaSource,
    _Run,
    describe_sink,
)

VIRTUAL_EPOCH_MS = 1_704_067_200_000
"""Where virtual processing time starts (2024-01-01T00:00:00Z), the same in every run."""
RUN_SEED = 0
"""What the ``random`` module is seeded with at the start of every run."""
DEFAULT_CHECKPOINT_EVERY = 1000
MAX_KEY_GROUP = 2**31
"""Above any key group (max parallelism is at most 32768): the bound of a store that holds them all."""


class JobTestError(WeirError):
    """``weir test`` cannot run: a source given that the job lacks, a job source not given, bad input."""

    fault: Fault = Fault.USER


# Keyed state in memory ------------------------------------------------------------------------------


class MemoryKeyedStateStore:
    """One operator subtask's keyed state in a dict (``KeyedStateStore``): no cache, every write is
    stored. A key group outside the subtask's range is refused, as a subtask's RocksDB holds only its
    own: a record routed to the wrong subtask fails loudly instead of finding another's state."""

    def __init__(self, entries: dict[tuple[str, int], dict[bytes, Any]], key_groups: KeyGroupRange | None) -> None:
        self._entries = entries
        self._key_groups = key_groups
        self._first, self._last = (0, MAX_KEY_GROUP) if key_groups is None else (key_groups.start, key_groups.end)

    def _own(self, key_group: int) -> None:
        if not self._first <= key_group <= self._last:
            raise AssertionError(f"key group {key_group} is not in this subtask's key groups {self._key_groups}")

    def get(self, name: str, key_group: int, key: bytes) -> Any | None:
        if not self._first <= key_group <= self._last:  # _own, inline: once per record
            self._own(key_group)
        entries = self._entries.get((name, key_group))
        return None if entries is None else entries.get(key)

    def put(self, name: str, key_group: int, key: bytes, value: Any) -> None:
        if not self._first <= key_group <= self._last:
            self._own(key_group)
        entries = self._entries.get((name, key_group))
        if entries is None:
            entries = self._entries[name, key_group] = {}
        entries[key] = value

    def delete(self, name: str, key_group: int, key: bytes) -> None:
        self._own(key_group)
        entries = self._entries.get((name, key_group))
        if entries is not None:
            entries.pop(key, None)

    def items(self, name: str, key_group: int, prefix: bytes = b"") -> Iterator[tuple[bytes, Any]]:
        self._own(key_group)
        entries = self._entries.get((name, key_group), {})
        return iter([(k, entries[k]) for k in sorted(entries) if k.startswith(prefix)])

    def flush(self) -> int:
        return 0

    def clear_key_groups(self, key_groups: KeyGroupRange) -> None:
        for name, key_group in list(self._entries):
            if key_groups.start <= key_group <= key_groups.end:
                del self._entries[(name, key_group)]


KeyedSnapshot = dict[str, dict[tuple[str, int], dict[bytes, bytes]]]
"""Every operator's keyed state as stored bytes (``dump_value``), by uid."""


class MemoryStateBackend:
    """The keyed state of the one subtask of a test run (``KeyedStateBackend``). A snapshot stores
    every value as the RocksDB backend would (``dump_value``: a value that does not pickle fails as
    in a cluster) and a restore loads fresh copies, so a value mutated after a checkpoint never leaks
    into the restored state."""

    def __init__(self) -> None:
        self._by_uid: dict[str, dict[tuple[str, int], dict[bytes, Any]]] = {}

    def keyed_store(self, uid: str, *, key_groups: KeyGroupRange | None = None) -> MemoryKeyedStateStore:
        return MemoryKeyedStateStore(self._by_uid.setdefault(uid, {}), key_groups)

    def snapshot(self) -> KeyedSnapshot:
        return {
            uid: {address: {k: dump_value(v) for k, v in entries.items()} for address, entries in state.items()}
            for uid, state in self._by_uid.items()
        }

    def restore(self, snapshot: KeyedSnapshot | None) -> None:
        self._by_uid = {
            uid: {address: {k: load_value(v) for k, v in entries.items()} for address, entries in state.items()}
            for uid, state in (snapshot or {}).items()
        }


# Failure points -------------------------------------------------------------------------------------


class Phase(enum.Enum):
    MID_EPOCH = "mid_epoch"
    AFTER_PRE_COMMIT = crashpoints.AFTER_PRE_COMMIT
    AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT = crashpoints.AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT
    AFTER_SINK_END_OF_INPUT = crashpoints.AFTER_SINK_END_OF_INPUT


@dataclass(frozen=True)
class FailurePoint:
    """Where a failure is injected: ``phase`` of checkpoint ``checkpoint`` (for
    ``AFTER_SINK_END_OF_INPUT``: the final checkpoint)."""

    checkpoint: int
    phase: Phase

    def describe(self) -> str:
        match self.phase:
            case Phase.MID_EPOCH:
                return f"halfway through the records before checkpoint {self.checkpoint}"
            case Phase.AFTER_PRE_COMMIT:
                return f"{self.phase.value} of checkpoint {self.checkpoint} (snapshotted, not completed)"
            case Phase.AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT:
                return f"{self.phase.value} of checkpoint {self.checkpoint} (completed, sinks not yet told)"
            case Phase.AFTER_SINK_END_OF_INPUT:
                return f"{self.phase.value} (final checkpoint {self.checkpoint} completed)"
            case _:
                assert_never(self.phase)


# Inputs -----------------------------------------------------------------------------------------


def records_of_lines(lines: Sequence[bytes]) -> list[KafkaRecord]:
    """One Kafka record per line (partition 0, offsets in order; no key; timestamp 0: the source's
    timestamp function decides event time)."""
    return [KafkaRecord(0, offset, None, line, 0) for offset, line in enumerate(lines)]


@dataclass(frozen=True)
class Deserialized:
    """A Kafka source's input given as records already deserialized (a test's Python values): the
    source's deserializer is skipped, its timestamp function still decides event time. Each value is
    stored pickled (``dump_value``) and every replay reads a fresh copy, so a job that mutates its
    input in place cannot change what a later replay reads (as with bytes from Kafka)."""

    records: tuple[KafkaRecord, ...]

    @classmethod
    def of(cls, values: Iterable[Any]) -> Deserialized:
        return cls(tuple(KafkaRecord(0, offset, None, dump_value(v), 0) for offset, v in enumerate(values)))


@dataclass(frozen=True)
class SourceLines:
    """A source's input as the lines of a JSON lines file (or values given as such), read as the
    source's kind says: for a Kafka source one record's value bytes a line (through the source's
    deserializer); for a PostgreSQL CDC source one change event a line (``weir.tools.cdc_input``).
    Each reading is done once, whatever the number of runs."""

    lines: tuple[bytes, ...]
    origin: str
    """Where the lines come from, for errors: the file, or ``values``."""

    @classmethod
    def read(cls, path: Path) -> SourceLines:
        return cls(tuple(read_jsonl(path)), str(path))

    @functools.cached_property
    def kafka_records(self) -> list[KafkaRecord]:
        return records_of_lines(self.lines)

    def change_events(self, uid: str) -> CdcInput:
        found: CdcInput | None = self.__dict__.get("_change_events")
        if found is None:
            found = self.__dict__["_change_events"] = read_change_events(self.lines, f"source {uid!r} ({self.origin})")
        return found


SourceData = Sequence[KafkaRecord] | Deserialized | SourceLines | CdcInput
"""One source's input: a Kafka source's records whose values go through the source's deserializer,
or records already deserialized; lines read as the source's kind says; a CDC source's change events."""


def value_bytes(values: Iterable[bytes | str]) -> list[KafkaRecord]:
    """A Kafka source's input from a Python iterable of record values (``str`` encoded as UTF-8)."""
    return records_of_lines(lines_of(values).lines)


def lines_of(values: Iterable[bytes | str]) -> SourceLines:
    """A source's input from a Python iterable of lines (``str`` encoded as UTF-8): a Kafka source's
    record values, or a CDC source's change events in their JSON form."""
    lines: list[bytes] = []
    for value in values:
        match value:
            case bytes():
                lines.append(value)
            case str():
                lines.append(value.encode())
            case _:
                raise JobTestError(
                    f"a source's value must be bytes or str, got {type(value).__name__}: give deserialized "
                    "records as records= (the deserializer is then skipped)"
                )
    return SourceLines(tuple(lines), "values")


def read_jsonl(path: Path) -> list[bytes]:
    """The lines of a JSON lines file, each a record's value bytes (blank lines skipped)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JobTestError(f"cannot read source file {path}: {exc.strerror}") from exc
    return [line for line in data.splitlines() if line.strip()]


# One run ------------------------------------------------------------------------------------------


Record = tuple[Any, int | None]


class _Recorded:
    """What one operator emitted on its main output (``records``), and where each checkpoint cut it
    (``marks[k]``: how many records precede checkpoint ``k``)."""

    __slots__ = ("marks", "records")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.marks: dict[int, int] = {}


class _Tap:
    """An operator's output that records what passes (its main output only)."""

    __slots__ = ("_inner", "_records", "emit_watermark")

    def __init__(self, inner: Output, records: list[Record]) -> None:
        self._inner = inner
        self._records = records
        self.emit_watermark = inner.emit_watermark

    def emit(self, value: Any, timestamp: int | None) -> None:
        self._records.append((value, timestamp))
        self._inner.emit(value, timestamp)


class _RecordingSink(StreamOperator):
    def __init__(self, records: list[Record]) -> None:
        self._records = records

    def process(self, value: Any, timestamp: int | None) -> None:
        self._records.append((value, timestamp))


class _VirtualClock:
    def __init__(self) -> None:
        self.now_ms = VIRTUAL_EPOCH_MS

    def ms(self) -> int:
        return self.now_ms

    def seconds(self) -> float:
        return self.now_ms / 1000.0

    def ns(self) -> int:
        return self.now_ms * 1_000_000


def _may_have_timers(op: StreamOperator) -> bool:
    return type(op).next_processing_time is not StreamOperator.next_processing_time


class _Attempt(_Run):
    """One attempt of the job (from the start, or restored after a failure): the reference run's
    chain building, with every operator's output recorded, sinks recorded, Kafka sources replaying
    the given lines and processing time virtual."""

    def __init__(
        self,
        code: JobCode,
        parameters: dict[str, str],
        backend: MemoryStateBackend,
        inputs: Mapping[str, SourceData],
        recorded: dict[str, _Recorded],
        clock: _VirtualClock,
        parallelism: int = 1,
    ) -> None:
        forget_job_modules(code)  # a new process: the job's modules start over, their globals too
        graph = load_job(code, parameters, parallelism).graph
        sources = sorted(uid for uid, t in graph.transformations.items() if t.kind is OperatorKind.SOURCE)
        stray = sorted(set(inputs) - set(sources))
        if stray:
            raise JobTestError(
                f"input given for {stray[0]!r}, which is not a source of job {graph.job_name!r} "
                f"(its sources: {', '.join(sources) or 'none'})"
            )
        super().__init__(graph, parameters, backend, self._input_of)
        self._building = ""
        self._inputs = inputs
        self._recorded = recorded
        self._clock = clock
        self.descriptions: dict[str, SinkDescription] = {}
        self.plan = build_plan(graph)
        self.runs: list[_ChainRun] = self._chains(self.plan)
        self.order = list(dict.fromkeys(uid for run in self.runs for uid in run.chain.by_uid))
        self.timed = [
            (run, timers)
            for run in self.runs
            if (timers := [op.next_processing_time for op in run.chain.operators if _may_have_timers(op)])
        ]
        """The chains with an operator that can have processing-time timers, and those operators'
        ``next_processing_time``: the others' is StreamOperator's, always None (asked after every
        record, the rest would cost a call each for nothing)."""

    def _given(self, uid: str) -> Sequence[KafkaRecord]:
        """The records given for Kafka source ``uid`` that the subtask being built reads (here: all)."""
        if uid not in self._inputs:
            raise JobTestError(f"no input for Kafka source {uid!r}: give --source {uid}=FILE.jsonl")
        given = self._inputs[uid]
        match given:
            case Deserialized(records=records):
                return records
            case SourceLines():
                return given.kafka_records
            case CdcInput():
                raise JobTestError(f"source {uid!r} is a Kafka source: give its record values, not change events")
            case _:
                return given

    def _change_events(self, uid: str) -> CdcInput:
        """The change events given for PostgreSQL CDC source ``uid``."""
        if uid not in self._inputs:
            raise JobTestError(
                f"no input for postgres cdc source {uid!r}: give --source {uid}=CHANGES.jsonl (one change event a line)"
            )
        given = self._inputs[uid]
        match given:
            case CdcInput():
                return given
            case SourceLines():
                return given.change_events(uid)
            case Deserialized(records=records):
                return CdcInput.of(load_value(r.value) for r in records if r.value is not None)
            case _:
                raise JobTestError(f"source {uid!r} is a postgres cdc source: give change events, not Kafka records")

    def _input_of(self, _spec: KafkaSourceSpec) -> Sequence[KafkaRecord]:
        return self._given(self._building)

    def _deserialized_source(self, t: Transformation, given: Deserialized) -> StreamOperator:
        """The job's Kafka source replaying records given deserialized: its spec with the deserializer
        replaced by the unpickling of each given record (the timestamp function is the job's)."""
        spec = t.source_spec
        assert isinstance(spec, KafkaSourceSpec)
        if spec.schema is not None:
            raise JobTestError(
                f"Kafka source {t.uid!r} is columnar (schema=): give its input as value bytes, not records"
            )
        direct = dataclasses.replace(spec, deserializer=load_value, record_deserializer=None, max_record_bytes=None)
        return _ReplayKafkaSource(direct, self._given(t.uid))

    def _source(self, t: Transformation) -> StreamOperator:
        """The job's source ``t`` replaying its given input."""
        spec, given = t.source_spec, self._inputs.get(t.uid)
        match spec:
            case KafkaSourceSpec():
                if isinstance(given, Deserialized):
                    return self._deserialized_source(t, given)
                return super()._operator(t)
            case PostgresCdcSourceSpec():
                from weir.tools.cdc_replay import ReplayCdcSource  # the CDC source's module: psycopg

                return ReplayCdcSource(spec, t.uid, self._change_events(t.uid))
            case GeneratorSourceSpec():
                if given is not None:
                    raise JobTestError(f"source {t.uid!r} is a generator source: it takes no input")
                return super()._operator(t)
            case None:
                return super()._operator(t)
            case _:
                assert_never(spec)

    def _operator(self, t: Transformation) -> StreamOperator:
        recorded = self._recorded.setdefault(t.uid, _Recorded())
        if t.kind is OperatorKind.SINK:
            self.descriptions[t.uid] = describe_sink(t.factory(), t.name)
            return _RecordingSink(recorded.records)
        self._building = t.uid
        op = self._source(t) if t.kind is OperatorKind.SOURCE else super()._operator(t)
        if isinstance(op, WindowAggregateOperator):
            op._clock = self._clock.ms
        elif isinstance(op, ReadsProcessingTime):
            op.clock = self._clock.ms
        setup = op.setup

        def tapped_setup(ctx: Any, output: Output, side_outputs: SideOutputs = NO_SIDE_OUTPUTS) -> None:
            setup(ctx, _Tap(output, recorded.records), side_outputs)

        op.__dict__["setup"] = tapped_setup
        return op

    def open(self, states: Mapping[str, bytes]) -> None:
        job = self._graph.job_name
        for run in self.runs:
            run.chain.restore(states)
        self._open_all(job)

    def _open_all(self, job: str) -> None:
        for run in reversed(self.runs):
            run.chain.open(lambda uid, open_operator: _guard(job, f"opening {uid!r}", open_operator))

    def snapshot(self, checkpoint_id: int) -> dict[str, bytes]:
        job = self._graph.job_name
        states: dict[str, bytes] = {}
        for run in self.runs:
            states.update(_guard(job, f"snapshotting {run.uid!r}", run.chain.snapshot, checkpoint_id))
        return states

    def close(self) -> None:
        for run in self.runs:
            run.chain.close(_ignore)


def _only_channel(_key_group: KeyGroup | None) -> tuple[ChannelIndex, ...]:
    return (ChannelIndex(0),)


class _Exchange:
    """One producer subtask's output along one edge at parallelism above 1: what a cluster's record
    writer does (``weir.taskmanager.network.writer.RecordWriter``), in this process: the edge's
    partitioner (``create_partitioner``: a hash edge sends a record to the subtask owning its key
    group, ``weir.core.keygroups``) chooses the consumer subtasks, watermarks and the end of the
    stream go to every one, each into the consumer's input channel as the plan numbers it. A columnar
    operator's edge carries record batches: a hash edge splits each by the key group of its rows."""

    __slots__ = ("_batch_keys", "_channel_of", "_channels", "_key_group", "_key_selector", "_runs", "_select", "emit")

    def __init__(
        self, plan: JobPlan, vertex: Vertex, subtask: int, edge_index: int, runs: Mapping[tuple[str, int], _ChainRun]
    ) -> None:
        edge = vertex.outputs[edge_index]
        consumer = plan.vertices[edge.consumer_vertex]
        max_parallelism = plan.graph.max_parallelism
        outputs = sorted(
            (c for c in plan.output_channels(vertex.uid, subtask) if c.edge_index == edge_index),
            key=lambda c: c.channel,
        )
        self._channels = [(c.consumer_vertex, c.consumer_subtask, ChannelIndex(c.consumer_channel)) for c in outputs]
        self._select: Callable[[KeyGroup | None], tuple[ChannelIndex, ...]] = create_partitioner(
            edge.partitioning,
            subtask=SubtaskIndex(subtask),
            upstream_parallelism=vertex.parallelism,
            downstream_parallelism=consumer.parallelism,
            max_parallelism=max_parallelism,
        ).select_channels
        if len(outputs) == 1:  # one consumer subtask: no key to hash (as the record writer skips it)
            self._select = _only_channel
        self._key_selector = edge.key_selector if edge.key_selector is not None and len(outputs) > 1 else None
        self._key_group = KeyEncoder(max_parallelism).key_group
        self._runs = runs
        self.emit: Callable[[Any, int | None], None] = self._emit_record
        if edge.side_output is None and plan.graph.transformations[edge.producer_operator].columnar:
            # The edge carries record batches: partitioned on arrays, as the record writer does.
            self.emit = self._emit_batch
            if self._key_selector is not None:
                key = self._key_selector
                if not isinstance(key, FieldKey):
                    raise JobTestError(f"a columnar edge is keyed by a field name, not by {key!r}")
                self._batch_keys = BatchKeys(key.field, max_parallelism)
                self._channel_of = channel_table(lambda kg: self._select(KeyGroup(kg))[0], max_parallelism)

    def _emit_batch(self, batch: Any, timestamp: int | None) -> None:
        if self._key_selector is not None:
            channels = self._channel_of[self._batch_keys.key_groups(batch)]
            parts = split_by_channel(batch, channels, len(self._channels))
        else:
            parts = [(channel, batch) for channel in self._select(None)]
        for channel, part in parts:
            consumer, subtask, index = self._channels[channel]
            chain_input = self._runs[consumer, subtask].input
            assert chain_input is not None
            chain_input.record(index, part, timestamp)

    def _emit_record(self, value: Any, timestamp: int | None) -> None:
        key_selector = self._key_selector
        key_group = None if key_selector is None else self._key_group(key_selector(value))
        for channel in self._select(key_group):
            consumer, subtask, index = self._channels[channel]
            chain_input = self._runs[consumer, subtask].input
            assert chain_input is not None
            chain_input.record(index, value, timestamp)

    def emit_watermark(self, watermark: int) -> None:
        for consumer, subtask, index in self._channels:
            chain_input = self._runs[consumer, subtask].input
            assert chain_input is not None
            chain_input.watermark(index, watermark)

    def end_of_stream(self) -> None:
        for consumer, subtask, index in self._channels:
            self._runs[consumer, subtask].end_of_stream(index)


class _RescaledAttempt(_Attempt):
    """The attempt after a failure restored at another parallelism (``--rescale N``): the job loaded
    with default parallelism N, every vertex run as its N subtasks, each operator in its subtask's
    context (its key group range, ``key_group_range_for_subtask``), records exchanged between
    subtasks as the plan and its partitioners say. The checkpoint is handed over as a cluster hands
    a retained checkpoint to a job at another parallelism (``weir.core.rescale``): each subtask's
    keyed state store holds the key groups of its range (the old run's one subtask held them all);
    every subtask of an operator is given the union of its operator state
    (``restore_inherited_state``: a Kafka source keeps the positions of the partitions it owns, an
    operator whose state cannot be split refuses). A Kafka source subtask replays the given
    partitions it owns (``kafka_partition_owner``). A run has one failure, so this attempt runs to
    the end: its checkpoints only mark what is committed, none is restored."""

    def _given(self, uid: str) -> Sequence[KafkaRecord]:
        subtask, parallelism = self._subtask, self.plan.vertices[uid].parallelism
        return [r for r in super()._given(uid) if kafka_partition_owner(r.partition, parallelism) == subtask]

    def _chains(self, plan: JobPlan) -> list[_ChainRun]:
        built: dict[tuple[str, int], _ChainRun] = {}
        for vertex in reversed(plan.vertices.values()):  # consumers first: producers' edges lead to them
            for subtask in range(vertex.parallelism):
                self._subtask = subtask
                edges = [_Exchange(plan, vertex, subtask, i, built) for i in range(len(vertex.outputs))]
                channels = plan.input_channels(vertex.uid, subtask)
                chain = OperatorChain(
                    vertex,
                    lambda uid: self._operator(self._graph.transformations[uid]),
                    edges,
                    partial(self._subtask_context, vertex.parallelism, subtask),
                )
                chain_input = ChainInput(chain, [c.gate for c in channels]) if channels else None
                built[vertex.uid, subtask] = _ChainRun(chain, chain_input)
        return [built[uid, s] for uid, vertex in plan.vertices.items() for s in range(vertex.parallelism)]

    def _subtask_context(self, parallelism: int, subtask: int, uid: str) -> OperatorContext:
        max_parallelism = self._graph.max_parallelism
        key_groups = key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(subtask))
        return dataclasses.replace(
            self._context_of(uid), subtask=subtask, parallelism=parallelism, key_group_range=key_groups
        )

    def open(self, states: Mapping[str, bytes]) -> None:
        """The checkpoint of the parallelism-1 run (one old subtask owning every key group) given to
        each new subtask as its share."""
        job = self._graph.job_name
        full = KeyGroupRange(KeyGroup(0), KeyGroup(self._graph.max_parallelism - 1))
        inherited = {uid: [InheritedState(0, 1, full, data)] for uid, data in states.items()}
        for run in self.runs:
            step = f"restoring {run.uid!r} at parallelism {run.chain.vertex.parallelism}"
            _guard(job, step, run.chain.restore_inherited, inherited)
        self._open_all(job)

    def snapshot(self, checkpoint_id: int) -> dict[str, bytes]:
        super().snapshot(checkpoint_id)  # sinks pre-commit, caches flushed; never restored (see above)
        return {}


@dataclass
class _Checkpoint:
    checkpoint_id: int
    states: dict[str, bytes]
    keyed: KeyedSnapshot


@dataclass(frozen=True)
class _ResumePoint:
    """What a run holds when it passes a failure point, as the recovery after a failure there sees
    it: the last completed checkpoint (its operator state and keyed state as stored bytes), the id the
    next checkpoint takes, virtual processing time and the ``random`` module's state. A failure run
    at that point is the failure-free run up to it (the job is deterministic: a second failure-free
    run checks it), then a recovery from exactly this; so it starts here instead of replaying the
    prefix."""

    completed: _Checkpoint | None
    next_checkpoint: int
    now_ms: int
    random_state: object
    visited: int
    """How many failure points the run had passed, this one included."""


@dataclass
class RunOutput:
    """What one run committed: every operator's records (``by_operator``), in plan order (``order``),
    the sinks' descriptions, the checkpoints it completed and the failure injected (if any)."""

    order: list[str]
    by_operator: dict[str, list[Record]]
    sinks: dict[str, SinkDescription]
    checkpoints: int
    visited: tuple[FailurePoint, ...]
    """The failure points the run passed (after a failure, also those after the recovery)."""
    failure: FailurePoint | None = None
    failure_hit: bool = False
    rescaled_to: int | None = None
    """The parallelism the failure's restore ran at (None: the same, 1)."""
    marks: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per operator, how many of its records precede each checkpoint (``_Recorded.marks``)."""
    resume_points: dict[FailurePoint, _ResumePoint] = field(default_factory=dict)
    """A failure-free run's state at each failure point it passed: what a failure run there recovers
    from (:func:`run_once` with ``resume_from``)."""
    resumed_at: dict[str, int] = field(default_factory=dict)
    """A failure run resumed from the failure-free run's state: per operator, how many of its first
    records are the failure-free run's own (the same objects), committed before the recovery."""

    def sink_capture(self, uid: str) -> SinkCapture:
        records = self.by_operator[uid]
        return SinkCapture(uid, self.sinks[uid], [v for v, _ in records], [t for _, t in records])


@dataclass
class _Driver:
    code: JobCode
    parameters: dict[str, str]
    inputs: Mapping[str, SourceData]
    checkpoint_every: int
    ms_per_record: int
    failure: FailurePoint | None
    rescale: int | None = None
    backend: MemoryStateBackend = field(default_factory=MemoryStateBackend)
    clock: _VirtualClock = field(default_factory=_VirtualClock)
    recorded: dict[str, _Recorded] = field(default_factory=dict)
    completed: _Checkpoint | None = None
    next_checkpoint: int = 1
    hit: bool = False
    visited: list[FailurePoint] = field(default_factory=list)
    capture: bool = False
    """Keep a :class:`_ResumePoint` at every failure point passed (a failure-free run's)."""
    resume_points: dict[FailurePoint, _ResumePoint] = field(default_factory=dict)
    resume_from: RunOutput | None = None
    """The failure-free run whose state at ``failure`` this run recovers from (None: run from the start)."""
    resumed_at: dict[str, int] = field(default_factory=dict)

    def run(self) -> RunOutput:
        random.seed(RUN_SEED)
        clock = self.clock
        with (
            mock.patch("time.time", clock.seconds),
            mock.patch("time.time_ns", clock.ns),
        ):
            attempt = self._resume() if self.resume_from is not None else self._start({})
            try:
                while True:
                    outcome = self._drive(attempt)
                    if outcome is None:
                        break
                    attempt.close()
                    attempt = self._recover()
            finally:
                attempt.close()
        final = self.completed.checkpoint_id if self.completed else 0
        by_operator = {uid: r.records[: r.marks.get(final, 0)] for uid, r in self.recorded.items()}
        return RunOutput(
            attempt.order,
            by_operator,
            attempt.descriptions,
            final,
            tuple(self.visited),
            self.failure,
            self.hit,
            self.rescale if self.hit else None,
            {uid: dict(r.marks) for uid, r in self.recorded.items()},
            self.resume_points,
            self.resumed_at,
        )

    def _resume(self) -> _Attempt:
        """The failure at ``failure`` as it happens in a run from the start, without that run's
        prefix: the failure-free run's state at the point (its committed records, checkpoint, clock,
        random state) taken over, then the recovery."""
        reference, failure = self.resume_from, self.failure
        assert reference is not None and failure is not None
        point = reference.resume_points.get(failure)
        if point is None:
            raise JobTestError(f"the failure-free run never passed the failure point {failure.describe()}")
        for uid, records in reference.by_operator.items():
            recorded = self.recorded.setdefault(uid, _Recorded())
            recorded.records = list(records)
            recorded.marks = dict(reference.marks.get(uid, {}))
        self.completed = point.completed
        self.next_checkpoint = point.next_checkpoint
        self.clock.now_ms = point.now_ms
        random.setstate(point.random_state)  # type: ignore[arg-type]
        self.visited = list(reference.visited[: point.visited])
        self.hit = True
        attempt = self._recover()
        self.resumed_at = {uid: len(r.records) for uid, r in self.recorded.items()}
        return attempt

    def _start(self, states: Mapping[str, bytes]) -> _Attempt:
        attempt = _Attempt(self.code, self.parameters, self.backend, self.inputs, self.recorded, self.clock)
        attempt.open(states)
        return attempt

    def _start_rescaled(self, parallelism: int, states: Mapping[str, bytes]) -> _Attempt:
        attempt = _RescaledAttempt(
            self.code, self.parameters, self.backend, self.inputs, self.recorded, self.clock, parallelism
        )
        attempt.open(states)
        return attempt

    def _recover(self) -> _Attempt:
        """Every operator dropped; the job rebuilt from the last completed checkpoint (from the start
        when none completed): uncommitted output is dropped, keyed state copied back."""
        done = self.completed
        cut = done.checkpoint_id if done else 0
        for r in self.recorded.values():
            del r.records[r.marks.get(cut, 0) :]
            r.marks = {k: n for k, n in r.marks.items() if k <= cut}
        self.backend.restore(done.keyed if done else None)
        states = done.states if done else {}
        return self._start(states) if self.rescale is None else self._start_rescaled(self.rescale, states)

    def _fails_at(self, checkpoint: int, phase: Phase) -> bool:
        self.visited.append(FailurePoint(checkpoint, phase))
        if self.capture:
            self.resume_points[FailurePoint(checkpoint, phase)] = _ResumePoint(
                self.completed, self.next_checkpoint, self.clock.now_ms, random.getstate(), len(self.visited)
            )
        failure = self.failure
        if self.hit or failure is None or failure != FailurePoint(checkpoint, phase):
            return False
        self.hit = True
        return True

    def _drive(self, attempt: _Attempt) -> FailurePoint | None:
        """Run the attempt to its end (None) or to the injected failure (the point)."""
        job = attempt._graph.job_name
        active = [run for run in attempt.runs if run.chain.source is not None]
        since = 0
        every = self.checkpoint_every
        while active:
            still: list[_ChainRun] = []
            for run in active:
                source = run.chain.source
                assert source is not None
                if _guard(job, f"while source {run.uid!r} emitted", source.poll, 1):
                    still.append(run)
                else:
                    _guard(job, f"at the end of source {run.uid!r}", run.chain.end_input)
                self._advance_time(attempt)
                since += 1
                if since == every // 2 and self._fails_at(self.next_checkpoint, Phase.MID_EPOCH):
                    return FailurePoint(self.next_checkpoint, Phase.MID_EPOCH)
                if since >= every:
                    since = 0
                    point = self._checkpoint(attempt)
                    if point is not None:
                        return point
            active = still
        # The input ended: the final checkpoint commits the rest (Flink's final checkpoint).
        point = self._checkpoint(attempt)
        if point is None and self._fails_at(self.next_checkpoint - 1, Phase.AFTER_SINK_END_OF_INPUT):
            return FailurePoint(self.next_checkpoint - 1, Phase.AFTER_SINK_END_OF_INPUT)
        return point

    def _advance_time(self, attempt: _Attempt) -> None:
        """Virtual processing time moves on; a timer fires once time has passed its millisecond
        (Flink fires a processing-time timer for ``t`` no sooner than ``t + 1``): every record of
        millisecond ``t`` was processed before, so a window's last millisecond is in it, once."""
        self.clock.now_ms += self.ms_per_record
        passed = self.clock.now_ms - 1
        for run, timers in attempt.timed:
            for next_processing_time in timers:
                due = next_processing_time()
                if due is not None and due <= passed:
                    step = f"firing processing-time timers of {run.uid!r}"
                    _guard(attempt._graph.job_name, step, run.chain.on_processing_time, passed)
                    break

    def _checkpoint(self, attempt: _Attempt) -> FailurePoint | None:
        k = self.next_checkpoint
        self.next_checkpoint += 1
        job = attempt._graph.job_name
        snapshot = _Checkpoint(k, attempt.snapshot(k), self.backend.snapshot())
        for r in self.recorded.values():
            r.marks[k] = len(r.records)
        if self._fails_at(k, Phase.AFTER_PRE_COMMIT):
            return FailurePoint(k, Phase.AFTER_PRE_COMMIT)
        self.completed = snapshot
        if self._fails_at(k, Phase.AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT):
            return FailurePoint(k, Phase.AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT)
        for run in attempt.runs:
            _guard(job, f"notifying {run.uid!r} of checkpoint {k}", run.chain.notify_checkpoint_complete, k)
        return None


def job_code_of(job: Path | str | JobCode) -> JobCode:
    """A job file's code (its source, read once: every attempt loads the same bytes), or the code given
    (an artifact of many files, ``weir test --py-files``)."""
    match job:
        case SourceCode() | PreparedArtifact():
            return job
        case Path() | str():
            return read_source_code(Path(job))
        case unreachable:
            assert_never(unreachable)


def run_once(
    job: Path | str | JobCode,
    inputs: Mapping[str, SourceData],
    parameters: Mapping[str, str] | None = None,
    *,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    ms_per_record: int = 1,
    failure: FailurePoint | None = None,
    rescale: int | None = None,
    capture: bool = False,
    resume_from: RunOutput | None = None,
) -> RunOutput:
    """One run of the job over ``inputs`` (Kafka source uid -> records), with ``failure`` injected and
    its restore at parallelism ``rescale`` (None: 1, as before the failure). ``capture``: keep the
    run's state at every failure point (a failure-free run's, for ``resume_from``); ``resume_from``:
    the failure-free run (captured) whose state at ``failure`` the run takes over, recovering from it
    at once instead of running the records before the failure again (the same run, as the job is
    deterministic)."""
    if checkpoint_every < 2:
        raise JobTestError(f"checkpoint_every must be at least 2 records, got {checkpoint_every}")
    if rescale is not None and rescale < 1:
        raise JobTestError(f"rescale must be a parallelism of at least 1, got {rescale}")
    if resume_from is not None and failure is None:
        raise JobTestError("resume_from takes over the failure-free run at a failure point: give the failure")
    driver = _Driver(
        job_code_of(job),
        dict(parameters or {}),
        inputs,
        checkpoint_every,
        ms_per_record,
        failure,
        rescale,
        capture=capture,
        resume_from=resume_from,
    )
    return driver.run()


# Comparing runs -------------------------------------------------------------------------------------


USUAL_CAUSES = (
    "the usual causes: state kept outside managed state (a module global, a closure, an attribute of the "
    "function object: it is neither checkpointed nor restored), a side effect in a function (it is "
    "repeated when records are replayed), or nondeterminism (random numbers, the wall clock: a replay "
    "computes something else)"
)


_CANONICAL = json.JSONEncoder(sort_keys=True, default=repr)
"""``json.dumps(record, sort_keys=True, default=repr)``'s encoder, built once (``json.dumps`` with
arguments builds one per call, and every committed record of every run is encoded)."""


def canonical(record: Record) -> str:
    """A record as a comparable string: JSON with sorted keys, repr for what JSON cannot take."""
    return _CANONICAL.encode(record)


@dataclass(frozen=True)
class Divergence:
    """A failure run whose committed output differs from the failure-free run's."""

    point: FailurePoint | None  # None: a second failure-free run differed
    sink: str
    operator: str
    kind: str  # "extra" (only in the failure run) or "missing" (only in the failure-free run)
    record: str
    rescaled_to: int | None = None

    def describe(self) -> str:
        where = self.point.describe() if self.point else "none (a second failure-free run)"
        causes = USUAL_CAUSES
        if self.rescaled_to is not None:
            where += f", restored at parallelism {self.rescaled_to}"
            causes += "; restored at another parallelism: state kept per subtask instead of per key"
        return (
            f"divergence at operator {self.operator!r} (sink {self.sink!r} differs) with a failure {where}: "
            f"first differing record, {self.kind} in the failure run: {self.record}; {causes}"
        )


def _first_difference(expected: Sequence[Record], actual: Sequence[Record]) -> tuple[str, str] | None:
    want = collections.Counter(canonical(r) for r in expected)
    have = collections.Counter(canonical(r) for r in actual)
    if want == have:
        return None
    extra, missing = have - want, want - have
    for record in actual:
        c = canonical(record)
        if extra[c]:
            return "extra", c
    for record in expected:
        c = canonical(record)
        if missing[c]:
            return "missing", c
    raise AssertionError("counters differ but no record does")


class Expected:
    """The failure-free run's committed output, as every failure run is compared with it: each
    operator's records as canonical strings and their multiset, each upsert sink's final table,
    computed once. A failure run resumed from this run (``RunOutput.resumed_at``) shares its first
    records with it: their canonical strings, and the table they leave, are reused."""

    def __init__(self, reference: RunOutput) -> None:
        self.reference = reference
        self._canonical: dict[str, list[str]] = {}
        self._counts: dict[str, collections.Counter[str]] = {}
        self._tables: dict[tuple[str, int], dict[tuple[Any, ...], tuple[Any, ...]]] = {}

    def canonical(self, uid: str) -> list[str]:
        found = self._canonical.get(uid)
        if found is None:
            found = self._canonical[uid] = [canonical(r) for r in self.reference.by_operator.get(uid, [])]
        return found

    def counts(self, uid: str) -> collections.Counter[str]:
        found = self._counts.get(uid)
        if found is None:
            found = self._counts[uid] = collections.Counter(self.canonical(uid))
        return found

    def _shared(self, run: RunOutput, uid: str) -> int:
        return min(run.resumed_at.get(uid, 0), len(self.canonical(uid)))

    def run_counts(self, run: RunOutput, uid: str) -> collections.Counter[str]:
        records = run.by_operator.get(uid, [])
        shared = self._shared(run, uid)
        counts = collections.Counter(self.canonical(uid)[:shared])
        counts.update(canonical(r) for r in records[shared:])
        return counts

    def table(self, uid: str, length: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """The final table of the reference's first ``length`` records of upsert sink ``uid``."""
        found = self._tables.get((uid, length))
        if found is None:
            records = self.reference.by_operator[uid][:length]
            capture = SinkCapture(uid, self.reference.sinks[uid], [v for v, _ in records], [t for _, t in records])
            found = self._tables[uid, length] = capture.final_rows()
        return found

    def run_table(self, run: RunOutput, uid: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        shared = self._shared(run, uid)
        rest = run.by_operator.get(uid, [])[shared:]
        capture = SinkCapture(uid, self.reference.sinks[uid], [v for v, _ in rest], [t for _, t in rest])
        return capture.final_rows(self.table(uid, shared))

    def differs(self, run: RunOutput, uid: str) -> bool:
        return self.counts(uid) != self.run_counts(run, uid)

    def sink_differs(self, run: RunOutput, uid: str) -> bool:
        if self.reference.sinks[uid].kind == "postgres":
            return self.table(uid, len(self.reference.by_operator[uid])) != self.run_table(run, uid)
        return self.differs(run, uid)


def compare(reference: RunOutput | Expected, run: RunOutput) -> Divergence | None:
    """None when every sink committed the same as in the failure-free run; else the divergence,
    named by the first operator in plan order whose committed output differs."""
    expected = reference if isinstance(reference, Expected) else Expected(reference)
    first = expected.reference
    differing = [uid for uid in first.sinks if expected.sink_differs(run, uid)]
    if not differing:
        return None
    for uid in first.order:
        if not expected.differs(run, uid):
            continue
        difference = _first_difference(first.by_operator.get(uid, []), run.by_operator.get(uid, []))
        if difference is not None:
            kind, record = difference
            return Divergence(run.failure, differing[0], uid, kind, record, run.rescaled_to)
    return Divergence(run.failure, differing[0], differing[0], "extra", "(the final table differs)", run.rescaled_to)


YOUNG_GENERATION_THRESHOLD = 50_000
"""Allocations between two collections of the cyclic garbage collector's youngest generation during
:func:`check_job` (Python's default: 700)."""


class _CollectorPerRun:
    """The cyclic garbage collector during :func:`check_job`. A run allocates many containers that live
    until its end (every operator's recorded output, window state), which the collector, every 700
    allocations by default, traverses again and again: a third of the CPU of the example keyed
    aggregation's matrix. Here the youngest generation is collected every
    :data:`YOUNG_GENERATION_THRESHOLD` allocations; what is alive after the failure-free run (the
    imported modules, the inputs, the failure-free run kept to compare with) is frozen out of the
    collector's reach (``gc.freeze``); and each later run's cyclic garbage (its operator chains) is
    collected when it ends, so memory stays that of one run. Thresholds and the frozen objects are
    restored on exit; nothing is frozen when something else had frozen objects first."""

    def __enter__(self) -> _CollectorPerRun:
        self._thresholds = gc.get_threshold()
        self._frozen = False
        gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *self._thresholds[1:])
        return self

    def freeze_survivors(self) -> None:
        gc.collect()
        if gc.get_freeze_count() == 0:
            gc.freeze()
            self._frozen = True

    def run_ended(self) -> None:
        gc.collect()

    def __exit__(self, *_exc: object) -> None:
        if self._frozen:
            gc.unfreeze()
        gc.set_threshold(*self._thresholds)


@dataclass(frozen=True)
class JobTestReport:
    reference: RunOutput
    runs: int
    failure_points: tuple[FailurePoint, ...]
    divergences: tuple[Divergence, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.divergences


def check_job(
    job: Path | str | JobCode,
    inputs: Mapping[str, SourceData],
    parameters: Mapping[str, str] | None = None,
    *,
    failures: bool = False,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    ms_per_record: int = 1,
    stop_at_first: bool = True,
    rescale: int | None = None,
) -> JobTestReport:
    """Run the job without failures; with ``failures``, again without failures and once per failure
    point, each compared with the first run; with ``rescale``, once more per failure point with the
    restore at parallelism ``rescale``."""
    if rescale is not None and not failures:
        raise JobTestError("--rescale restores after the failures: give it with --failures")
    started = time.perf_counter()
    code = job_code_of(job)

    def once(
        failure: FailurePoint | None,
        parallelism: int | None = None,
        *,
        capture: bool = False,
        resume_from: RunOutput | None = None,
    ) -> RunOutput:
        return run_once(
            code,
            inputs,
            parameters,
            checkpoint_every=checkpoint_every,
            ms_per_record=ms_per_record,
            failure=failure,
            rescale=parallelism,
            capture=capture,
            resume_from=resume_from,
        )

    with _CollectorPerRun() as collector:
        reference = once(None, capture=failures)
        expected = Expected(reference)
        points = reference.visited if failures else ()
        divergences: list[Divergence] = []
        runs = 1
        if failures:
            collector.freeze_survivors()
            matrix: list[tuple[FailurePoint | None, int | None]] = [(None, None), *((p, None) for p in points)]
            if rescale is not None:
                matrix += [(point, rescale) for point in points]
            for point, parallelism in matrix:
                runs += 1
                # A failure run starts from the failure-free run's state at its failure point (the
                # same run as from the start, without replaying the records before it: the second
                # failure-free run, first in the matrix, checks that the job is deterministic).
                run = once(point, parallelism, resume_from=reference if point is not None else None)
                divergence = compare(expected, run)
                del run
                collector.run_ended()
                if divergence is not None:
                    divergences.append(divergence)
                    if stop_at_first:
                        break
    return JobTestReport(reference, runs, points, tuple(divergences), time.perf_counter() - started)


def _written(value: Any) -> Any:
    """What JSON cannot hold, as written: a change event in its JSON form, anything else its repr."""
    return value.to_json() if isinstance(value, ChangeEvent) else repr(value)


def write_outputs(output: RunOutput, directory: Path, *, as_written: bool = False) -> list[Path]:
    """Each sink's committed records as JSON lines ``{"value": ..., "timestamp": ...}`` in
    ``directory/<sink uid>.jsonl`` (a change event in its JSON form, another value JSON cannot hold
    as its repr). ``as_written``: each record as the sink writes it (:func:`written_records`), for a
    job whose values are the engine's own (a SQL script's rows and changes)."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for uid in output.sinks:
        path = directory / f"{uid.replace('/', '_')}.jsonl"
        lines = (
            written_records(output.sink_capture(uid))
            if as_written
            else [{"value": value, "timestamp": ts} for value, ts in output.by_operator.get(uid, [])]
        )
        with path.open("w") as f:
            for line in lines:
                f.write(json.dumps(line, default=_written) + "\n")
        written.append(path)
    return written


def _decoded(data: bytes | None) -> Any:
    """A Kafka record's key or value bytes as JSON when they are, else as text (None: a tombstone)."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


def written_records(capture: SinkCapture) -> list[dict[str, Any]]:
    """A sink's records as it writes them, each with its timestamp: a Kafka sink's value (and key,
    when it has a key function) through its serializer, read back as JSON; a PostgreSQL sink's row by
    column, or the key of a row it deletes (``{"delete": ...}``); another sink's value as received."""
    d = capture.description
    match d.kind:
        case "kafka":
            values = [{"value": _decoded(v)} for v in capture.serialized_values()]
            if d.key is not None:
                values = [{"key": _decoded(k), **v} for k, v in zip(capture.serialized_keys(), values, strict=True)]
        case "postgres":
            values = [
                {"delete": dict(zip(d.key_columns, row.key, strict=True))}
                if isinstance(row, Delete)
                else {"value": dict(zip(d.columns, row, strict=True))}
                for row in capture.rows()
            ]
        case _:
            values = [{"value": v} for v in capture.values]
    return [{**v, "timestamp": ts} for v, ts in zip(values, capture.timestamps, strict=True)]

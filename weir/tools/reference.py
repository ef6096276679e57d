"""Reference mode: run a job file's graph in this process over bounded input, and capture what each
sink would write.

The graph runs at parallelism 1, in one thread, with no network and no checkpoints: one instance of
every operator, built by the job's own factories (the runtime operators of ``operators``),
owning every key group ``0..max_parallelism-1``, with keyed state in a temporary RocksDB backend that
is deleted afterwards. The job's plan is driven as a cluster's subtasks drive it, by the same code:
each vertex is a :class:`~weir.taskmanager.chain.OperatorChain` (chain wiring, end of input), fed through
a :class:`~weir.taskmanager.chain.ChainInput` (each edge one input channel: watermarks, idleness, end of
stream); only the network between chains is replaced by a direct call.

Input is always bounded, whatever the job's ``bounded`` flag says:

- a Kafka source reads its topic from the beginning up to the last stable offsets present when the
  run starts, with read_committed (the records a cluster run reads). The records are replayed into
  the job's own ``KafkaSourceOperator``: the same deserializer, timestamps, per-partition watermarks
  and dead-letter decisions; dead letters are captured, never produced;
- a generator source with a ``count`` runs to its end, without its rate limit; an unbounded generator
  is an error.

Sinks are replaced by captures that keep each value in order, with what is needed to compare against
the real system (:class:`SinkDescription`): topic, serializer and key function of a Kafka sink;
table, columns, key columns and row function of a PostgreSQL sink. No sink connects to anything.

Determinism: the captured values equal a cluster run's output when the job is deterministic (its
functions depend only on their input) and no record is late. Watermarks are per partition and an
operator's watermark is the minimum over its inputs, so a record can only be late when it is behind
its own partition's watermark: more than the source's ``max_out_of_orderness_ms`` older than a record
before it in the same partition. Only for such a record does timing matter: the interleaving of
partitions (here round-robin, one record at a time; in a cluster whatever the subtasks' timing is)
and how soon watermarks travel (here after every record; in a cluster once per poll and network
flush) decide whether its window already fired. A columnar source (a schema: record batches) is
polled a run of its partition's records at a time, as a cluster's poll gives it a batch (one-row
batches cost a hundred times a record's work): a run ends before each record behind its partition's
watermark, so every such record still comes after its partition's watermark moved past the records
before it, as it does one record at a time. A source's ``idle_timeout_ms`` is not applied here
(every partition ends, which frees the watermark as idleness would); in a cluster a partition that
resumes after going idle may be behind the watermark, and its records late. The run counts the
records each window or join operator dropped as late (``late_records``); when that is not zero, a correct
cluster run may differ. Allowed lateness and out-of-orderness are the job's own.
"""

from __future__ import annotations

import collections
import dataclasses
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from weir.api import GeneratorSourceSpec, KafkaSourceSpec, LoadedJob, load_job_file, load_job_source
from weir.core.changelog import Delete, apply_changes, keys_changed
from weir.core.config import Endpoints
from weir.core.errors import Fault, WeirError
from weir.core.ids import ChannelIndex
from weir.core.kafka_config import KafkaClientConfig, Properties, kafka_client_config
from weir.core.keygroups import KeyGroup, KeyGroupRange
from weir.core.rejections import UserFunctionError
from weir.core.state_backend import KeyedStateBackend
from weir.core.watermarks import PartitionWatermarks
from weir.graph import LogicalGraph, OperatorKind, Transformation
from weir.operators.base import OperatorContext, StreamOperator
from weir.operators.joins import IntervalJoinOperator, WindowJoinOperator
from weir.operators.sinks import (
    FileSinkOperator,
    KafkaSinkOperator,
    PostgresUpsertSinkOperator,
    PrintSinkOperator,
)
from weir.operators.sources import GeneratorSourceOperator, KafkaSourceOperator, Pacer
from weir.operators.windows import WindowAggregateOperator
from weir.plan import JobPlan, NetworkEdge, build_plan
from weir.taskmanager.chain import ChainInput, OperatorChain

REFERENCE_JOB_ID = "reference"
SOURCE_BATCH = 1
"""Records per source poll. A source advances its watermark once per poll, so polling one record at
a time makes the run independent of batch sizes: the watermark follows every record."""
COLUMNAR_RUN = 2000
"""Records per poll of a columnar source at most: a run of one partition's records, cut before each
record behind its partition's watermark (``_ReplayKafkaSource``); the cluster's poll size
(``COLUMNAR_POLL_RECORDS``)."""

SinkKind = Literal["kafka", "postgres", "file", "print", "other"]


@dataclass(frozen=True)
class KafkaRecord:
    """One record of an input topic, as a read_committed consumer returns it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


KafkaInput = Callable[[str], Sequence[KafkaRecord]]
"""Reads a topic for a Kafka source: every committed record up to the end offsets present now."""

SourceInput = Callable[[KafkaSourceSpec], Sequence[KafkaRecord]]
"""Reads a Kafka source's topic (with the source's settings)."""


class ReferenceModeError(WeirError):
    """The job cannot run in reference mode, or its reference run failed (the job's code raised)."""

    fault: Fault = Fault.USER


@dataclass(frozen=True)
class SinkDescription:
    """What a sink writes where, so that its captured values can be compared with the real system."""

    kind: SinkKind
    target: str | None  # topic, table or file path
    serializer: Callable[[Any], bytes | None] | None = None  # kafka (None: a tombstone), file
    key: Callable[[Any], bytes | str | None] | None = None  # kafka
    columns: tuple[str, ...] = ()  # postgres
    key_columns: tuple[str, ...] = ()  # postgres
    to_row: Callable[[Any], tuple[Any, ...] | Delete] | None = None  # postgres
    version_column: str | None = None  # postgres: a stored row is only replaced by one of a version >= its own
    kafka_properties: Properties = ()  # kafka: the sink's own Kafka settings (over the job's)


@dataclass
class SinkCapture:
    """Every value one sink received, in order, and its description."""

    uid: str
    description: SinkDescription
    values: list[Any] = field(default_factory=list)
    timestamps: list[int | None] = field(default_factory=list)

    def serialized_values(self) -> list[bytes | None]:
        """The record values a Kafka (or file) sink writes, through the sink's own serializer."""
        serializer = self.description.serializer
        if serializer is None:
            raise ReferenceModeError(f"sink {self.uid!r} ({self.description.kind}) has no serializer")
        return [_call_user(self.uid, "serializer", serializer, v) for v in self.values]

    def serialized_keys(self) -> list[bytes | None]:
        key = self.description.key
        if key is None:
            return [None] * len(self.values)
        out: list[bytes | None] = []
        for v in self.values:
            k = _call_user(self.uid, "key function", key, v)
            out.append(k.encode() if isinstance(k, str) else k)
        return out

    def rows(self) -> list[tuple[Any, ...] | Delete]:
        """The changes a PostgreSQL sink writes, one per value, in order: a row to upsert or a ``Delete``."""
        to_row = self.description.to_row
        if to_row is None:
            raise ReferenceModeError(f"sink {self.uid!r} ({self.description.kind}) has no row function")
        out: list[tuple[Any, ...] | Delete] = []
        for v in self.values:
            change = _call_user(self.uid, "row function", to_row, v)
            out.append(change if isinstance(change, Delete) else tuple(change))
        return out

    def _key_index(self) -> list[int]:
        d = self.description
        return [d.columns.index(c) for c in d.key_columns]

    def final_rows(
        self, start: Mapping[tuple[Any, ...], tuple[Any, ...]] | None = None
    ) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """The table the changes leave, applied in order over the table ``start`` (None: empty): per
        key the last row upserted (with a version column the last row of the highest version), none
        for a key deleted after its last upsert."""
        d = self.description
        version = d.columns.index(d.version_column) if d.version_column else None
        return apply_changes(self.rows(), self._key_index(), version, start)

    def keys_changed(self) -> int:
        """Distinct keys the changes upsert or delete."""
        return keys_changed(self.rows(), self._key_index())


@dataclass(frozen=True)
class SourceSummary:
    uid: str
    kind: Literal["kafka", "generator"]
    topic: str | None
    records: int  # records read (Kafka) or generated
    dead_letters: tuple[dict[str, Any], ...] = ()  # the envelopes the source would send to its DLQ
    job_bounded: bool = True  # False: the job reads this source unbounded (reference mode bounds it)


@dataclass(frozen=True)
class ReferenceResult(Mapping[str, list[Any]]):
    """``result[sink_uid]`` is the list of values that sink would write; ``sinks`` adds each sink's
    description, ``sources`` what was read and dead-lettered, ``late_records`` the records each window
    operator dropped as late (non-zero: a cluster run may differ, see the module doc)."""

    job_name: str
    sinks: dict[str, SinkCapture]
    sources: dict[str, SourceSummary]
    late_records: dict[str, int]

    def __getitem__(self, uid: str) -> list[Any]:
        return self.sinks[uid].values

    def __iter__(self) -> Iterator[str]:
        return iter(self.sinks)

    def __len__(self) -> int:
        return len(self.sinks)

    @property
    def dead_lettered(self) -> int:
        return sum(len(s.dead_letters) for s in self.sources.values())


def run_reference(
    job_file: str | Path,
    parameters: Mapping[str, str] | None = None,
    *,
    kafka_input: KafkaInput | None = None,
    endpoints: Endpoints | None = None,
) -> ReferenceResult:
    """Run the job file in reference mode; see the module doc. Kafka sources read through
    ``kafka_input`` (default: the topic in Kafka at ``endpoints``)."""
    return run_loaded(load_job_file(job_file, parameters, 1), parameters, kafka_input=kafka_input, endpoints=endpoints)


def run_reference_source(
    source: str | bytes,
    parameters: Mapping[str, str] | None = None,
    *,
    file_name: str = "job.py",
    kafka_input: KafkaInput | None = None,
    endpoints: Endpoints | None = None,
) -> ReferenceResult:
    """Run a job file's source text in reference mode."""
    loaded = load_job_source(source, file_name, parameters, 1)
    return run_loaded(loaded, parameters, kafka_input=kafka_input, endpoints=endpoints)


def run_loaded(
    job: LoadedJob,
    parameters: Mapping[str, str] | None = None,
    *,
    kafka_input: KafkaInput | None = None,
    endpoints: Endpoints | None = None,
) -> ReferenceResult:
    """Run a loaded job's graph in reference mode (``parameters``: what its operators' context shows)."""
    given = dict(parameters or {})
    reader = (
        _topic_reader(kafka_input)
        if kafka_input is not None
        else _kafka_reader(kafka_client_config(endpoints or Endpoints.from_env(), given))
    )
    from weir.taskmanager.state import RocksDBStateBackend  # reference mode's state (weir test keeps it in memory)

    with tempfile.TemporaryDirectory(prefix="weir-reference-") as tmp:
        backend = RocksDBStateBackend(Path(tmp) / "state")
        try:
            return _Run(job.graph, given, backend, reader).execute()
        finally:
            backend.destroy()


def describe_sink(operator: Any, name: str) -> SinkDescription:
    """A sink operator's description, read from its public attributes (``topic``, ``serializer``,
    ``key``, ``table``, ``columns``, ``key_columns``, ``to_row``) or those of the seed's sinks."""

    def attr(*names: str) -> Any:
        for n in names:
            for candidate in (n, f"_{n}"):
                if hasattr(operator, candidate):
                    return getattr(operator, candidate)
        return None

    if isinstance(operator, PrintSinkOperator):
        return SinkDescription("print", None)
    if isinstance(operator, FileSinkOperator):
        return SinkDescription("file", attr("path"), serializer=attr("serializer"))
    kind: SinkKind
    if isinstance(operator, KafkaSinkOperator) or name.startswith("kafka-sink:"):
        kind = "kafka"
    elif isinstance(operator, PostgresUpsertSinkOperator) or name.startswith("postgres-sink:"):
        kind = "postgres"
    else:
        return SinkDescription("other", None)
    if kind == "kafka":
        description = SinkDescription(
            "kafka",
            attr("topic"),
            serializer=attr("serializer"),
            key=attr("key", "key_fn"),
            kafka_properties=tuple(attr("properties") or ()),
        )
        missing = [n for n, v in (("topic", description.target), ("serializer", description.serializer)) if v is None]
    else:
        description = SinkDescription(
            "postgres",
            attr("table"),
            columns=tuple(attr("columns") or ()),
            key_columns=tuple(attr("key_columns") or ()),
            to_row=attr("to_row"),
            version_column=attr("version_column"),
        )
        missing = [
            n
            for n, v in (
                ("table", description.target),
                ("columns", description.columns),
                ("key_columns", description.key_columns),
                ("to_row", description.to_row),
            )
            if not v
        ]
    if missing:
        raise WeirError(
            f"reference mode cannot read the {', '.join(missing)} of {kind} sink {type(operator).__name__} "
            f"({name}): the sink operator must expose them as attributes"
        )
    return description


# The run ------------------------------------------------------------------------------------------


class _QuietLog:
    """Operators log through ``ctx.log``; a reference run keeps stdout and stderr for its caller."""

    def bind(self, **_: Any) -> _QuietLog:
        return self

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return _ignore


def _ignore(*_args: Any, **_kwargs: Any) -> None:
    return None


class _DeadLetterCapture:
    """Stands in for a Kafka source's dead-letter producer: keeps the envelopes."""

    def __init__(self) -> None:
        self.envelopes: list[dict[str, Any]] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> None:
        import json

        self.envelopes.append(json.loads(value) if value is not None else {})

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0


@dataclass(frozen=True)
class _ReplayedMessage:
    record: KafkaRecord

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self.record.partition

    def offset(self) -> int:
        return self.record.offset

    def key(self) -> bytes | None:
        return self.record.key

    def value(self) -> bytes | None:
        return self.record.value

    def timestamp(self) -> tuple[int, int]:
        return (1, self.record.timestamp)  # TIMESTAMP_CREATE_TIME

    def headers(self) -> None:
        return None


class _ReplayConsumer:
    """Stands in for the source's consumer: hands out the records read up front, taking the partitions
    in turn (round-robin, ascending), so that a run is repeatable. Each turn gives a run of the
    partition's records, up to ``max_messages`` (one for a record-at-a-time source), ending before an
    offset in ``cuts`` (a record that must start a poll of its own)."""

    def __init__(
        self, by_partition: Mapping[int, Sequence[KafkaRecord]], cuts: Mapping[int, frozenset[int]] | None = None
    ) -> None:
        self._turns = collections.deque(
            (p, collections.deque(records)) for p, records in sorted(by_partition.items()) if records
        )
        self._cuts = cuts or {}

    def consume(self, max_messages: int, timeout_s: float) -> list[_ReplayedMessage]:
        if not self._turns:
            return []
        partition, records = self._turns.popleft()
        cuts = self._cuts.get(partition, frozenset())
        out = [_ReplayedMessage(records.popleft())]
        while records and len(out) < max_messages and records[0].offset not in cuts:
            out.append(_ReplayedMessage(records.popleft()))
        if records:
            self._turns.append((partition, records))
        return out

    def unassign(self, _partition: int) -> None:
        return None

    @staticmethod
    def is_end_of_partition(_error: object) -> bool:
        return False

    def close(self) -> None:
        return None


class _ReplayKafkaSource(KafkaSourceOperator):
    """The job's Kafka source operator, fed from records read up front instead of a live consumer.

    ``poll`` is the runtime's own: deserialization, timestamps, per-partition watermarks and dead
    letters are decided exactly as in a cluster. Only ``open`` differs: it holds every partition
    (parallelism 1), bounds each at the offset after its last record read, and sets no rate limit.
    It sets the fields the runtime's ``open`` sets, so it follows changes to them (the unit tests
    run it without a broker).
    """

    def __init__(self, spec: KafkaSourceSpec, records: Sequence[KafkaRecord]) -> None:
        # No idleness: it depends on wall time, and here every partition ends (which frees the
        # watermark as an idle partition would, without making the run depend on timing).
        # No partition discovery and no group commits either: the input is read up front, nothing is
        # committed anywhere. Every record read is replayed (starting_offsets is not applied).
        super().__init__(
            dataclasses.replace(
                spec, idle_timeout_ms=None, partition_discovery_interval_ms=None, commit_offsets_on_checkpoint=False
            )
        )
        self._records = records
        self.records_read = len(records)

    def open(self) -> None:
        spec = self._spec
        by_partition: dict[int, list[KafkaRecord]] = {}
        for record in sorted(self._records, key=lambda r: (r.partition, r.offset)):
            by_partition.setdefault(record.partition, []).append(record)
        self._end_offsets = {p: records[-1].offset + 1 for p, records in by_partition.items()}
        # Restored (``weir test --failures``): each partition resumes at its checkpointed offset.
        resume = self._next_offsets if self._restored else {}
        by_partition = {p: [r for r in records if r.offset >= resume.get(p, 0)] for p, records in by_partition.items()}
        self._next_offsets = dict(resume)
        self._active = {p for p, records in by_partition.items() if records}
        self._partition_watermarks = PartitionWatermarks(sorted(by_partition), spec.max_out_of_orderness_ms, None, 0.0)
        self._emitted_watermark = self._partition_watermarks.current
        # The read loop calls consume, unassign, is_end_of_partition and close, which the replay has.
        self._consumer = _ReplayConsumer(by_partition, self._late_cuts(by_partition))  # type: ignore[assignment]
        self._dlq = _DeadLetterCapture() if spec.dead_letter_topic else None
        self._pacer = Pacer(None, 1)  # no rate limit: the input is all there

    @property
    def replay_batch(self) -> int:
        """Records per poll: a run of one partition's for a columnar source, else one."""
        return COLUMNAR_RUN if self._decoder is not None else SOURCE_BATCH

    def _late_cuts(self, by_partition: Mapping[int, Sequence[KafkaRecord]]) -> dict[int, frozenset[int]]:
        """A columnar source's records behind their partition's watermark (max - bound - 1: event time
        more than the out-of-orderness behind a record before them), by partition: each starts a poll
        of its own, after the watermark of the records before it was emitted. A record the decoder
        refuses is dead-lettered and moves no watermark."""
        decoder = self._decoder
        if decoder is None:
            return {}
        slack = self._spec.max_out_of_orderness_ms
        cuts: dict[int, frozenset[int]] = {}
        for partition, records in by_partition.items():
            decoded, bad = decoder.decode([r.value for r in records])
            stamps = decoder.timestamps(decoder.columns(decoded))
            if stamps is None:
                continue  # no event time in the records: no watermark
            refused = {index for index, _reason in bad}
            good = [r.offset for i, r in enumerate(records) if i not in refused]
            behind: set[int] = set()
            latest: int | None = None
            for offset, stamp in zip(good, stamps, strict=True):
                if latest is not None and stamp + slack < latest:
                    behind.add(offset)
                latest = stamp if latest is None else max(latest, stamp)
            cuts[partition] = frozenset(behind)
        return cuts

    def dead_letter_envelopes(self) -> tuple[dict[str, Any], ...]:
        return tuple(self._dlq.envelopes) if isinstance(self._dlq, _DeadLetterCapture) else ()


class _CaptureSink(StreamOperator):
    def __init__(self, capture: SinkCapture) -> None:
        self.capture = capture
        self._values = capture.values
        self._timestamps = capture.timestamps

    def process(self, value: Any, timestamp: int | None) -> None:
        self._values.append(value)
        self._timestamps.append(timestamp)


class _ChainRun:
    """One vertex of the plan at parallelism 1: its operator chain and, unless it starts with a
    source, the input that feeds its head (the same classes a cluster's subtask drives)."""

    def __init__(self, chain: OperatorChain, chain_input: ChainInput | None) -> None:
        self.chain = chain
        self.input = chain_input

    @property
    def uid(self) -> str:
        return self.chain.vertex.uid

    def end_of_stream(self, channel: ChannelIndex) -> None:
        """One input channel ended; once all did, the chain's input ends (as a subtask's)."""
        chain_input = self.input
        assert chain_input is not None
        chain_input.end_of_stream(channel)
        if chain_input.all_ended:
            self.chain.end_input()


class _LocalChannel:
    """An edge between two chains, in this process: what a cluster's record writer, channel and input
    gate carry, handed to the consumer's input channel at once (after every record and watermark)."""

    __slots__ = ("_channel", "_consumer", "_input")

    def __init__(self, consumer: _ChainRun, channel: ChannelIndex) -> None:
        assert consumer.input is not None
        self._consumer = consumer
        self._input = consumer.input
        self._channel = channel

    def emit(self, value: Any, timestamp: int | None) -> None:
        self._input.record(self._channel, value, timestamp)

    def emit_watermark(self, watermark: int) -> None:
        self._input.watermark(self._channel, watermark)

    def end_of_stream(self) -> None:
        self._consumer.end_of_stream(self._channel)


class _Run:
    def __init__(
        self, graph: LogicalGraph, parameters: dict[str, str], backend: KeyedStateBackend, reader: SourceInput
    ) -> None:
        self._graph = graph
        self._parameters = parameters
        self._backend = backend
        self._reader = reader
        self._sinks: dict[str, SinkCapture] = {}
        self._generated: dict[str, int] = {}
        self._key_groups = KeyGroupRange(KeyGroup(0), KeyGroup(graph.max_parallelism - 1))

    def execute(self) -> ReferenceResult:
        graph = self._graph
        plan = build_plan(graph)
        runs = self._chains(plan)
        job = graph.job_name
        try:
            for run in reversed(runs):
                run.chain.open(lambda uid, open_operator: _guard(job, f"opening {uid!r}", open_operator))
            self._run_sources(runs)
        finally:
            for run in runs:
                run.chain.close(_ignore)  # closing must not hide the run's real outcome
        operators = {uid: op for run in runs for uid, op in run.chain.by_uid.items()}
        return ReferenceResult(
            job_name=job,
            sinks=self._sinks,
            sources=self._source_summaries(operators),
            late_records={
                uid: op.late_records_dropped
                for uid, op in operators.items()
                if isinstance(op, WindowAggregateOperator | WindowJoinOperator | IntervalJoinOperator)
            },
        )

    def _chains(self, plan: JobPlan) -> list[_ChainRun]:
        """Every vertex's chain, in the plan's (topological) order; each edge a local channel into the
        consumer's input channel numbered as in a cluster."""
        built: dict[str, _ChainRun] = {}
        for vertex in reversed(plan.vertices.values()):  # consumers first: producers' edges lead to them
            channels = plan.input_channels(vertex.uid, 0)
            edges = [
                _LocalChannel(built[edge.consumer_vertex], self._channel_of(plan, edge)) for edge in vertex.outputs
            ]
            chain = OperatorChain(
                vertex, lambda uid: self._operator(self._graph.transformations[uid]), edges, self._context_of
            )
            built[vertex.uid] = _ChainRun(chain, ChainInput(chain, [c.gate for c in channels]) if channels else None)
        return [built[uid] for uid in plan.vertices]

    @staticmethod
    def _channel_of(plan: JobPlan, edge: NetworkEdge) -> ChannelIndex:
        """The edge's input channel at its consumer: one channel per edge at parallelism 1."""
        return ChannelIndex(next(c.channel for c in plan.input_channels(edge.consumer_vertex, 0) if c.edge is edge))

    def _context_of(self, uid: str) -> OperatorContext:
        return OperatorContext(
            job_id=REFERENCE_JOB_ID,
            job_name=self._graph.job_name,
            uid=uid,
            subtask=0,
            parallelism=1,
            max_parallelism=self._graph.max_parallelism,
            attempt=0,
            key_group_range=self._key_groups,
            parameters=self._parameters,
            state=self._backend,
            log=_QuietLog(),
        )

    def _operator(self, t: Transformation) -> StreamOperator:
        """The operator a reference run uses for ``t``: the job's own, with sources fed from bounded
        input and sinks replaced by captures."""
        uid, op = t.uid, t.factory()
        if t.kind is OperatorKind.SINK:
            capture = SinkCapture(uid, describe_sink(op, t.name))
            self._sinks[uid] = capture
            return _CaptureSink(capture)
        if t.kind is not OperatorKind.SOURCE:
            return op
        declared = getattr(t, "source_spec", None) or getattr(op, "_spec", None)
        if isinstance(op, KafkaSourceOperator) and isinstance(declared, KafkaSourceSpec):
            return _ReplayKafkaSource(declared, self._reader(declared))
        if isinstance(op, GeneratorSourceOperator) and isinstance(declared, GeneratorSourceSpec):
            gen = declared
            if gen.count is None:
                raise ReferenceModeError(
                    f"reference mode needs bounded input: generator source {uid!r} has no count "
                    "(give from_generator a count)"
                )
            self._generated[uid] = gen.count
            return GeneratorSourceOperator(dataclasses.replace(gen, records_per_second=None))
        raise ReferenceModeError(
            f"reference mode cannot run source {uid!r} ({type(op).__name__}): only Kafka and generator sources"
        )

    def _run_sources(self, runs: list[_ChainRun]) -> None:
        """Poll the sources in turn, one record each (a columnar source: a run of records), until all
        ended; a source's end ends its chain's input, and each chain whose inputs all ended ends in turn."""
        job = self._graph.job_name
        active = [run for run in runs if run.chain.source is not None]
        while active:
            still: list[_ChainRun] = []
            for run in active:
                source = run.chain.source
                assert source is not None
                batch = source.replay_batch if isinstance(source, _ReplayKafkaSource) else SOURCE_BATCH
                if _guard(job, f"while source {run.uid!r} emitted", source.poll, batch):
                    still.append(run)
                else:
                    _guard(job, f"at the end of source {run.uid!r}", run.chain.end_input)
            active = still

    def _source_summaries(self, operators: Mapping[str, StreamOperator]) -> dict[str, SourceSummary]:
        out: dict[str, SourceSummary] = {}
        for uid, op in operators.items():
            if isinstance(op, _ReplayKafkaSource):
                out[uid] = SourceSummary(
                    uid, "kafka", op._spec.topic, op.records_read, op.dead_letter_envelopes(), op._spec.bounded
                )
            elif uid in self._generated:
                out[uid] = SourceSummary(uid, "generator", None, self._generated[uid])
        return out


def _guard(job_name: str, step: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run one step of the job's operators; the job's own code raising fails the run, as it fails a
    job (records flow synchronously downstream, so the step names the source that was emitting)."""
    try:
        return fn(*args)
    except UserFunctionError as exc:  # the record is named: the operator, function, exception, record
        raise ReferenceModeError(
            f"reference run of job {job_name!r} failed {step}: {exc.rejected.error_type}: {exc}"
        ) from exc
    except WeirError:
        raise
    except Exception as exc:
        raise ReferenceModeError(
            f"reference run of job {job_name!r} failed {step}: {type(exc).__name__}: {exc} "
            "(set WEIR_DEBUG=1 for the traceback)"
        ) from exc


def _call_user(uid: str, what: str, fn: Callable[[Any], Any], value: Any) -> Any:
    try:
        return fn(value)
    except Exception as exc:
        raise ReferenceModeError(f"sink {uid!r}: the {what} failed on {value!r}: {type(exc).__name__}: {exc}") from exc


def _topic_reader(kafka_input: KafkaInput) -> SourceInput:
    def read(spec: KafkaSourceSpec) -> Sequence[KafkaRecord]:
        return kafka_input(spec.topic)

    return read


def _kafka_reader(cluster: KafkaClientConfig) -> SourceInput:
    """Reads a source's topic with the job's Kafka settings (``cluster``), the source's own over them."""
    from weir.connectors import kafka

    def read(spec: KafkaSourceSpec) -> list[KafkaRecord]:
        source = cluster.merged(spec.properties)
        if kafka.topic_partition_count(source, spec.topic) is None:
            raise ReferenceModeError(f"kafka source topic {spec.topic!r} does not exist (check the job's parameters)")
        return [KafkaRecord(*r) for r in kafka.read_committed_records(source, spec.topic)]

    return read

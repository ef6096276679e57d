"""CPU microseconds per event of a job's record path, in one process, without a cluster.

``make bench-cpu`` (``python -m bench.cpu_bench [--events N] [--runs N] [--paths record,columnar]
[--profile PATH]``) runs the keyed aggregation (``examples/keyed_aggregation.py``, Kafka sink only)
on the per-record and the columnar path, each Nexmark job named with ``--nexmark q0,q5``, and each
Nexmark query in SQL named with ``--sql q5,q11-tumble`` (``bench/jobs/nexmark_sql.py``) per record and with
``SET 'weir.columnar' = 'true'``, through
the same operators and code a cluster runs, and reports the CPU time the process spent per input
event (``time.process_time``: every thread, so RocksDB's and pickling's work too; wall time is not
taken, it depends on what else runs on a shared machine).

What runs, per job, at parallelism ``--parallelism`` (3, as the benchmark's cluster):

- every vertex's subtasks as :class:`~weir.taskmanager.chain.OperatorChain` objects, keyed state in
  one RocksDB per subtask (``RocksDBStateBackend``), as a TaskManager builds them;
- each Kafka source subtask is the job's own ``KafkaSourceOperator`` (its deserializer or columnar
  decoder, timestamps, per-partition watermarks) fed by a stand-in consumer that hands out records
  made up front (the benchmark's data set: ``bench.dataset.event_bytes``, or Nexmark's JSON events),
  up to 500 per poll (the task's batch; a columnar source's own);
- each network edge is the task's own ``RecordWriter`` (partitioner, key groups, buffers of 1,000
  records), its buffers encoded as on the wire (pickle, Arrow IPC) and decoded by the consumer's
  ``read_buffer`` into its ``ChainInput``, except the channel to the consumer subtask of the same
  index, kept local (not encoded) as a TaskManager's local channel is under slot sharing; buffers
  are flushed every 6 polls of a source (about the 100 ms buffer timeout at the cluster's rate);
- a Kafka sink is the job's own transactional sink (epochs, the ledger, the records kept for the
  snapshot) with a stand-in producer: what librdkafka does with a record is not in the figure;
- a checkpoint every ``--checkpoint-every`` events: every subtask's snapshot (keyed state flushed to
  RocksDB, the sink's pre-commit and snapshot), then its completion (the sink's commit).

Not in the figure: gRPC and protobuf of remote buffers, librdkafka (consumer and producer), the
task's loop and mailbox, metrics, the JobManager. The cluster run (``make bench``) has those.

Each run waits behind a load gate first: up to ``--load-gate-s`` for the 1-minute load average to
fall to the core count; a run that starts above it is marked ``under_load`` (CPU time is less
disturbed by other work than wall time, but not immune: shared caches, frequency, hyperthreads).

Results: ``bench/results/cpu.json`` (every run, medians, the commit, the load) and a table on stdout.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import dataclasses
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from weir.api import KafkaSourceSpec, load_job_file
from weir.core.ids import ChannelIndex, SubtaskIndex
from weir.core.keygroups import KeyEncoder, key_group_range_for_subtask
from weir.core.watermarks import PartitionWatermarks
from weir.graph import OperatorKind, Transformation
from weir.operators.base import OperatorContext, StreamOperator
from weir.operators.sources import KafkaSourceOperator, Pacer
from weir.operators.transactional_sinks import TransactionalKafkaSinkOperator
from weir.plan import JobPlan, Vertex, build_plan
from weir.taskmanager.chain import ChainInput, OperatorChain
from weir.taskmanager.network.codec import EndOfStream, WatermarkEvent, read_buffer
from weir.taskmanager.network.output_channels import LocalOutputChannel
from weir.taskmanager.network.writer import NetworkOutput, RecordWriter
from weir.taskmanager.partitioners import create_partitioner
from weir.taskmanager.state import RocksDBStateBackend
from weir.wire import taskmanager_pb2

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "cpu.json"
KEYED_JOB: Final = ROOT / "examples" / "keyed_aggregation.py"
NEXMARK_DIR: Final = ROOT / "examples" / "nexmark"
SQL_JOB: Final = ROOT / "bench" / "jobs" / "nexmark_sql.py"
SOURCE_BATCH: Final = 500  # weir.taskmanager.default_actions.SOURCE_BATCH
FLUSH_EVERY_POLLS: Final = 6
FETCH_RUN: Final = 200
"""Records of one partition a stand-in consume hands out in a row (librdkafka returns a fetch's run)."""


# Stand-ins for Kafka ------------------------------------------------------------------------------


class _Message:
    """A consumed record, with the methods of confluent-kafka's Message the source calls."""

    __slots__ = ("_key", "_offset", "_partition", "_ts", "_value")

    def __init__(self, partition: int, offset: int, key: bytes | None, value: bytes, ts: int) -> None:
        self._partition, self._offset, self._key, self._value, self._ts = partition, offset, key, value, ts

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def headers(self) -> None:
        return None


class _Consumer:
    """Hands out each partition's records in runs of ``FETCH_RUN``, the partitions in turn."""

    def __init__(self, by_partition: dict[int, list[_Message]]) -> None:
        self._runs = collections.deque((p, iter(msgs)) for p, msgs in sorted(by_partition.items()) if msgs)

    def consume(self, max_messages: int, timeout_s: float) -> list[_Message]:
        out: list[_Message] = []
        while len(out) < max_messages and self._runs:
            p, it = self._runs[0]
            take = min(FETCH_RUN, max_messages - len(out))
            got = [m for _, m in zip(range(take), it, strict=False)]
            out.extend(got)
            self._runs.rotate(-1)
            if len(got) < take:
                self._runs.pop()  # rotated: the exhausted one is last now
        return out

    def unassign(self, _partition: int) -> None:
        return None

    @staticmethod
    def is_end_of_partition(_error: object) -> bool:
        return False

    def close(self) -> None:
        return None


class _BenchSource(KafkaSourceOperator):
    """The job's Kafka source operator over records made up front (its own poll and decoding)."""

    def __init__(self, spec: KafkaSourceSpec, messages: dict[int, list[_Message]]) -> None:
        super().__init__(
            dataclasses.replace(
                spec, idle_timeout_ms=None, partition_discovery_interval_ms=None, commit_offsets_on_checkpoint=False
            )
        )
        self._messages = messages

    def open(self) -> None:
        by_partition = self._messages
        self._end_offsets = {p: msgs[-1].offset() + 1 for p, msgs in by_partition.items()}
        self._next_offsets = {}
        self._active = set(by_partition)
        self._partition_watermarks = PartitionWatermarks(
            sorted(by_partition), self._spec.max_out_of_orderness_ms, None, 0.0
        )
        self._emitted_watermark = self._partition_watermarks.current
        self._consumer = _Consumer(by_partition)  # type: ignore[assignment]
        self._dlq = None
        self._pacer = Pacer(None, 1)


class _Producer:
    """Stands in for the transactional producer: takes records, sends nothing."""

    def __init__(self) -> None:
        self.produced = 0

    def begin(self) -> None:
        return None

    def produce(
        self, topic: str, value: bytes, key: bytes | None = None, timestamp: int | None = None, **_: Any
    ) -> None:
        self.produced += 1

    def poll(self) -> None:
        return None

    def flush(self, timeout_s: float) -> None:
        return None

    def commit(self, timeout_s: float) -> None:
        return None

    def abort(self, timeout_s: float) -> None:
        return None

    def close(self) -> None:
        return None


class _BenchKafkaSink(TransactionalKafkaSinkOperator):
    """The job's transactional Kafka sink with a stand-in producer and no marker topic."""

    def open(self) -> None:
        self._producer = _Producer()  # type: ignore[assignment]

    def _pre_commit_in_kafka(self, epoch: Any, deadline: Any) -> None:
        assert self._producer is not None
        self._producer.flush(deadline.remaining())

    def close(self) -> None:
        self._spill.close()


def _as_bench_sink(op: StreamOperator) -> StreamOperator:
    if type(op) is TransactionalKafkaSinkOperator:
        op.__class__ = _BenchKafkaSink
        return op
    return _DiscardSink()


class _DiscardSink(StreamOperator):
    """Any other sink: takes the records."""

    def process(self, value: Any, timestamp: int | None) -> None:
        return None


class _Log:
    def bind(self, **_: Any) -> _Log:
        return self

    def __getattr__(self, _name: str) -> Callable[..., None]:
        return _ignore


def _ignore(*_args: Any, **_kwargs: Any) -> None:
    return None


# Input ----------------------------------------------------------------------------------------------


def keyed_input(events: int) -> dict[int, list[_Message]]:
    """The keyed benchmark's events (``bench.dataset``), by partition, and each partition's sentinel."""
    from bench import dataset

    by_partition: dict[int, list[_Message]] = {p: [] for p in range(dataset.PARTITIONS)}
    for i in range(events):
        p, key, value = dataset.event_bytes(i)
        msgs = by_partition[p]
        msgs.append(_Message(p, len(msgs), key, value, 0))
    for p, msgs in by_partition.items():
        key, value = dataset.sentinel_bytes(p, events)
        msgs.append(_Message(p, len(msgs), key, value, 0))
    return by_partition


def nexmark_input(events: int, partitions: int = 8) -> dict[int, list[_Message]]:
    """Nexmark's JSON events, event n in partition n % 8 (docs/nexmark.md)."""
    from weir import nexmark

    config = nexmark.NexmarkConfig()
    by_partition: dict[int, list[_Message]] = {p: [] for p in range(partitions)}
    for n in range(events):
        msgs = by_partition[n % partitions]
        msgs.append(_Message(n % partitions, len(msgs), None, nexmark.event_json(n, config), 0))
    return by_partition


# The job, in this process -------------------------------------------------------------------------------


class _Channel(LocalOutputChannel):
    """A channel to one consumer subtask's input channel, queueing into the consumer's list: local
    (the producer's lists handed over) or, when ``encode``, as a remote channel's encoded message."""

    def __init__(self, inbox: list[tuple[int, Any]], consumer_channel: int) -> None:
        self._inbox = inbox
        self._consumer_channel = consumer_channel

    def send(self, buffer: Any) -> None:
        self._inbox.append((self._consumer_channel, buffer))

    def available(self) -> bool:
        return True

    def close(self, *, drain: bool = False) -> None:
        return None


class _RemoteChannel:
    __slots__ = ("_consumer_channel", "_inbox")

    def __init__(self, inbox: list[tuple[int, Any]], consumer_channel: int) -> None:
        self._inbox = inbox
        self._consumer_channel = consumer_channel

    def send(self, msg: taskmanager_pb2.DataMessage) -> None:
        # Off the wire: the consumer parses what the producer serialized (protobuf both ways).
        wire = taskmanager_pb2.DataMessage.FromString(msg.SerializeToString())
        self._inbox.append((self._consumer_channel, wire))

    def available(self) -> bool:
        return True

    def close(self, *, drain: bool = False) -> None:
        return None


@dataclasses.dataclass
class _Subtask:
    vertex: Vertex
    index: int
    chain: OperatorChain
    outputs: list[NetworkOutput]
    inbox: list[tuple[int, Any]]
    chain_input: ChainInput | None


class InProcessJob:
    """Every subtask of a job's plan in this process; see the module doc."""

    def __init__(self, job_file: Path, parameters: dict[str, str], parallelism: int, source_input: Any, tmp: Path):
        loaded = load_job_file(job_file, parameters, parallelism)
        self.graph = loaded.graph
        self.plan: JobPlan = build_plan(self.graph)
        self._parameters = parameters
        self._source_input = source_input
        self._tmp = tmp
        self.backends: list[RocksDBStateBackend] = []
        inboxes: dict[tuple[str, int], list[tuple[int, Any]]] = {
            (v.uid, s): [] for v in self.plan.vertices.values() for s in range(v.parallelism)
        }
        self.subtasks: list[_Subtask] = []
        for vertex in self.plan.vertices.values():
            for s in range(vertex.parallelism):
                self.subtasks.append(self._subtask(vertex, s, inboxes))

    def _subtask(self, vertex: Vertex, s: int, inboxes: dict[tuple[str, int], list[tuple[int, Any]]]) -> _Subtask:
        graph, plan = self.graph, self.plan
        outputs: list[NetworkOutput] = []
        for edge_index, edge in enumerate(vertex.outputs):
            consumer = plan.vertices[edge.consumer_vertex]
            channels: list[Any] = []
            for oc in plan.output_channels(vertex.uid, s):
                if oc.edge_index != edge_index:
                    continue
                inbox = inboxes[(oc.consumer_vertex, oc.consumer_subtask)]
                local = oc.consumer_subtask == s
                channels.append(
                    _Channel(inbox, oc.consumer_channel) if local else _RemoteChannel(inbox, oc.consumer_channel)
                )
            partitioner = create_partitioner(
                edge.partitioning,
                subtask=SubtaskIndex(s),
                upstream_parallelism=vertex.parallelism,
                downstream_parallelism=consumer.parallelism,
                max_parallelism=graph.max_parallelism,
            )
            key_selector = edge.key_selector if edge.key_selector is not None and len(channels) > 1 else None
            writer = RecordWriter(
                channels,
                partitioner,
                key_selector,
                KeyEncoder(graph.max_parallelism).key_group,
                flush_interval_s=3600.0,
                columnar=edge.side_output is None and graph.transformations[edge.producer_operator].columnar,
                max_parallelism=graph.max_parallelism,
            )
            outputs.append(NetworkOutput(writer))
        backend = RocksDBStateBackend(self._tmp / f"{vertex.uid}-{s}".replace(":", "_"))
        self.backends.append(backend)
        key_groups = key_group_range_for_subtask(graph.max_parallelism, vertex.parallelism, SubtaskIndex(s))

        def context_of(uid: str) -> OperatorContext:
            return OperatorContext(
                job_id="cpu-bench",
                job_name=graph.job_name,
                uid=uid,
                subtask=s,
                parallelism=vertex.parallelism,
                max_parallelism=graph.max_parallelism,
                attempt=0,
                key_group_range=key_groups,
                parameters=self._parameters,
                state=backend,
                log=_Log(),
            )

        chain = OperatorChain(
            vertex, lambda uid: self._operator(graph.transformations[uid], s, vertex), outputs, context_of
        )
        channels_in = plan.input_channels(vertex.uid, s)
        chain_input = ChainInput(chain, [c.gate for c in channels_in]) if channels_in else None
        return _Subtask(vertex, s, chain, outputs, inboxes[(vertex.uid, s)], chain_input)

    def _operator(self, t: Transformation, s: int, vertex: Vertex) -> StreamOperator:
        op = t.factory()
        if t.kind is OperatorKind.SINK:
            return _as_bench_sink(op)
        if t.kind is OperatorKind.SOURCE:
            spec = getattr(t, "source_spec", None) or getattr(op, "_spec", None)
            assert isinstance(op, KafkaSourceOperator) and isinstance(spec, KafkaSourceSpec), "Kafka sources only"
            mine = {p: msgs for p, msgs in self._source_input.items() if p % vertex.parallelism == s}
            return _BenchSource(spec, mine)
        return op

    def open(self) -> None:
        for sub in reversed(self.subtasks):
            sub.chain.open()

    def run(self, checkpoint_every: int) -> int:
        """Run every source to its end and every subtask after it; answers the records polled."""
        sources = [sub for sub in self.subtasks if sub.chain.source is not None]
        others = [sub for sub in self.subtasks if sub.chain.source is None]
        active = list(sources)
        polls = dict.fromkeys(range(len(sources)), 0)  # each source subtask's own polls
        polled = 0
        next_checkpoint = checkpoint_every
        checkpoint_id = 0
        while active:
            still = []
            for sub in active:
                source = sub.chain.source
                assert source is not None
                more = source.poll(source.poll_records or SOURCE_BATCH)
                if more:  # else it read all its input: its stream ends after the final checkpoint (a task's order)
                    still.append(sub)
                n = sources.index(sub)
                polls[n] += 1
                if polls[n] % FLUSH_EVERY_POLLS == 0:  # its buffers and its watermark out, as its timeout would
                    for out in sub.outputs:
                        out.flush()
            active = still
            self._pump(others)
            polled = sum(s.chain.source.records_polled for s in sources if s.chain.source is not None)
            if checkpoint_every and polled >= next_checkpoint:
                checkpoint_id += 1
                next_checkpoint += checkpoint_every
                self._checkpoint(checkpoint_id)
        for sub in sources:
            for out in sub.outputs:
                out.flush()
        while any(sub.inbox for sub in others):
            self._pump(others)
        checkpoint_id += 1
        self._checkpoint(checkpoint_id)  # the final checkpoint: every sink's output committed
        for sub in self.subtasks:  # then, in the plan's order, each chain's input ends, then its edges
            for op in sub.chain.operators:
                op.end_input()
            for out in sub.outputs:
                out.end_of_stream()
            self._pump(others)
        return polled

    def _checkpoint(self, checkpoint_id: int) -> None:
        for sub in self.subtasks:
            for out in sub.outputs:
                out.flush()
        others = [s for s in self.subtasks if s.chain.source is None]
        self._pump(others)
        for sub in self.subtasks:  # the plan's order: what a snapshot emits (a SQL mini-batch applied) reaches
            sub.chain.snapshot(checkpoint_id)  # the consumers before their own snapshot, as records before a barrier
            for out in sub.outputs:
                out.flush()
            self._pump(others)
        for sub in self.subtasks:
            sub.chain.notify_checkpoint_complete(checkpoint_id)

    def _pump(self, subtasks: Sequence[_Subtask]) -> None:
        for sub in subtasks:  # the plan's (topological) order
            inbox = sub.inbox
            if not inbox:
                continue
            chain_input = sub.chain_input
            assert chain_input is not None
            taken, inbox[:] = list(inbox), []
            for channel, message in taken:
                buffer = read_buffer(message)
                ch = ChannelIndex(channel)
                if buffer.values:
                    chain_input.records(ch, buffer.values, buffer.timestamps)
                match buffer.event:
                    case None:
                        pass
                    case WatermarkEvent(watermark=watermark):
                        chain_input.watermark(ch, watermark)
                    case EndOfStream():  # its chain's input and edges end in run(), after the final checkpoint
                        chain_input.end_of_stream(ch)
                    case other:
                        raise AssertionError(f"unexpected event {other!r}")
            for out in sub.outputs:
                out.flush()

    def sink_records(self) -> int:
        return sum(
            op._producer.produced  # type: ignore[attr-defined]
            for sub in self.subtasks
            for op in sub.chain.operators
            if isinstance(op, _BenchKafkaSink) and op._producer is not None
        )

    def close(self) -> None:
        for sub in self.subtasks:
            sub.chain.close(lambda _uid, _exc: None)
        for backend in self.backends:
            backend.destroy()


# Runs -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    job_file: Path
    parameters: dict[str, str]
    make_input: Callable[[int], dict[int, list[_Message]]]


def cases(
    paths: Sequence[str], nexmark: Sequence[str], sql: Sequence[str] = (), sql_mini_batch: bool = False
) -> list[Case]:
    out = []
    keyed = {"sink.postgres": "false", "source.bounded": "true"}
    for path in paths:
        match path:
            case "record":
                out.append(Case("keyed/record", KEYED_JOB, {**keyed, "columnar": "false"}, keyed_input))
            case "columnar":
                out.append(Case("keyed/columnar", KEYED_JOB, {**keyed, "columnar": "true"}, keyed_input))
            case _:
                raise SystemExit(f"unknown path {path!r}: record or columnar")
    for query in nexmark:
        params = {"source": "kafka", "source.topic": "nexmark", "source.bounded": "true", "sink": "kafka"}
        out.append(Case(f"nexmark/{query}", NEXMARK_DIR / f"{query}.py", params, nexmark_input))
    for query in sql:  # the query's SQL (bench/jobs/nexmark_sql.py): per record, SET 'weir.columnar', mini-batch
        for path, columnar, mini_batch in (("record", "false", "false"), ("columnar", "true", "false")) + (
            (("minibatch", "false", "true"),) if sql_mini_batch else ()
        ):
            params = {"query": query, "columnar": columnar, "mini_batch": mini_batch}
            out.append(Case(f"sql/{query}/{path}", SQL_JOB, params, nexmark_input))
    return out


def run_once(
    case: Case,
    messages: dict[int, list[_Message]],
    parallelism: int,
    checkpoint_every: int,
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="weir-cpu-bench-") as tmp:
        job = InProcessJob(case.job_file, dict(case.parameters), parallelism, messages, Path(tmp))
        try:
            job.open()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            if profile is not None:
                profile.enable()
            polled = job.run(checkpoint_every)
            if profile is not None:
                profile.disable()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            out = job.sink_records()
        finally:
            job.close()
    return {"events": polled, "cpu_s": cpu, "wall_s": wall, "us_per_event": cpu / polled * 1e6, "output": out}


def load_gate(deadline_s: float) -> dict[str, Any]:
    """Before a run: poll, up to ``deadline_s``, for the 1-minute load average to fall to the core
    count; the run is marked under load when it did not."""
    cores = os.cpu_count() or 1
    started = time.monotonic()
    while True:
        load = os.getloadavg()[0]
        waited = time.monotonic() - started
        if load <= cores or waited >= deadline_s:
            if waited >= 1.0 or load > cores:
                print(f"  load gate: load average {load:.2f} on {cores} cores after {waited:.0f} s", flush=True)
            return {"load_1m_at_start": round(load, 2), "waited_s": round(waited, 1), "under_load": load > cores}
        time.sleep(2.0)


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip() + ("-dirty" if _dirty() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _dirty() -> bool:
    status = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return bool(status.stdout.strip())


def top_functions(profile: cProfile.Profile, events: int, n: int = 25) -> str:
    """The ``n`` functions of most own time, each in µs per event (cProfile's own overhead included)."""
    stream = io.StringIO()
    stats = pstats.Stats(profile, stream=stream)
    rows = []
    for (file, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((tottime, cumtime, calls, f"{Path(file).name}:{line}({name})"))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    lines = [
        f"{'own us/ev':>9} {'cum us/ev':>9} {'calls/ev':>8}  function"
        f"   (total {total / events * 1e6:.2f} us/ev under the profiler)"
    ]
    for tottime, cumtime, calls, where in rows[:n]:
        lines.append(f"{tottime / events * 1e6:9.3f} {cumtime / events * 1e6:9.3f} {calls / events:8.3f}  {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3, help="runs per case, alternating between cases (median)")
    parser.add_argument("--paths", default="record,columnar", help="keyed job paths: record, columnar (or none)")
    parser.add_argument("--nexmark", default="", help="Nexmark queries to run too, e.g. q0,q5")
    parser.add_argument(
        "--sql",
        default="",
        help="Nexmark queries in SQL (bench/jobs/nexmark_sql.py), per record and columnar, e.g. q5,q11-tumble",
    )
    parser.add_argument(
        "--sql-mini-batch",
        action="store_true",
        help="each --sql query also with the mini-batch settings the Nexmark benchmark gives Flink (2 s / 50,000 rows)",
    )
    parser.add_argument("--parallelism", type=int, default=3)
    parser.add_argument("--checkpoint-every", type=int, default=100_000, help="events between checkpoints (0: none)")
    parser.add_argument("--profile", action="store_true", help="one profiled run per case: top functions per event")
    parser.add_argument("--load-gate-s", type=float, default=120.0, help="longest wait for the load to fall")
    parser.add_argument(
        "--note",
        default="",
        help="what tree was measured, when it is not a git checkout (with --compare: of the comparison)",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="no run: combine result files of two trees (each a comma-separated list, one file per round) "
        "into one document of medians and ratios per case, written to --output",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.compare:
        before, after = ([Path(f) for f in files.split(",")] for files in args.compare)
        document = compare(before, after) | {"note": args.note}
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(document, indent=2) + "\n")
        for name, c in document["cases"].items():
            print(f"{name:<18} {c['before_median']:6.2f} -> {c['after_median']:6.2f} us/event ({c['ratio']:.2f}x)")
        return 0
    paths = [p for p in args.paths.split(",") if p and p != "none"]
    chosen = cases(
        paths, [q for q in args.nexmark.split(",") if q], [q for q in args.sql.split(",") if q], args.sql_mini_batch
    )
    inputs = {c.name: c.make_input(args.events) for c in chosen}
    results: dict[str, list[dict[str, Any]]] = {c.name: [] for c in chosen}
    if args.profile:
        for case in chosen:
            profile = cProfile.Profile()
            run = run_once(case, inputs[case.name], args.parallelism, args.checkpoint_every, profile)
            print(f"== {case.name}: {run['us_per_event']:.2f} us/event under the profiler, {run['output']} out")
            print(top_functions(profile, run["events"]))
        return 0
    for _ in range(args.runs):
        for case in chosen:  # alternating, so a burst of load elsewhere touches every case alike
            gate = load_gate(args.load_gate_s)
            run = run_once(case, inputs[case.name], args.parallelism, args.checkpoint_every) | gate
            results[case.name].append(run)
            print(
                f"{case.name}: {run['us_per_event']:.2f} us/event CPU ({run['events']} events, {run['output']} out)"
                + (" UNDER LOAD" if gate["under_load"] else ""),
                flush=True,
            )
    load = list(_loadavg())
    summary = {
        name: {
            "median_us_per_event": statistics.median(r["us_per_event"] for r in runs),
            "runs_us_per_event": [round(r["us_per_event"], 3) for r in runs],
            "runs_under_load": sum(r["under_load"] for r in runs),
            "runs_load_1m_at_start": [r["load_1m_at_start"] for r in runs],
            "events": runs[0]["events"],
            "output_records": runs[0]["output"],
        }
        for name, runs in results.items()
    }
    print(f"\n{'case':<18} {'CPU us/event (median)':>22}  runs")
    for name, s in summary.items():
        print(f"{name:<18} {s['median_us_per_event']:>22.2f}  {s['runs_us_per_event']}")
    print(
        f"load average {load}"
        + (
            " (runs marked under load: see runs_under_load)"
            if any(s["runs_under_load"] for s in summary.values())
            else ""
        )
    )
    document = {
        "commit": git_commit(),
        "note": args.note,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "events": args.events,
        "parallelism": args.parallelism,
        "checkpoint_every": args.checkpoint_every,
        "load_average": load,
        "cores": os.cpu_count(),
        "under_load": any(r["under_load"] for runs in results.values() for r in runs),
        "cases": summary,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def compare(before: Sequence[Path], after: Sequence[Path]) -> dict[str, Any]:
    """One document from the result files of two trees measured in alternating rounds (``--runs 1``
    each, before and after in turn, so a burst of load elsewhere touches both alike): per case every
    round's figure, the medians, after / before, and how many rounds ran under load."""
    sides = {"before": [json.loads(p.read_text()) for p in before], "after": [json.loads(p.read_text()) for p in after]}
    cases: dict[str, Any] = {}
    for name in sides["before"][0]["cases"]:
        runs = {
            side: [r for doc in docs for r in doc["cases"][name]["runs_us_per_event"]] for side, docs in sides.items()
        }
        outputs = {doc["cases"][name]["output_records"] for docs in sides.values() for doc in docs}
        if len(outputs) != 1:
            raise SystemExit(f"{name}: the trees' outputs differ in size ({sorted(outputs)}): not the same job")
        medians = {side: statistics.median(r) for side, r in runs.items()}
        cases[name] = {
            "before_runs_us_per_event": runs["before"],
            "after_runs_us_per_event": runs["after"],
            "before_median": round(medians["before"], 3),
            "after_median": round(medians["after"], 3),
            "ratio": round(medians["after"] / medians["before"], 3),
            "runs_under_load": sum(d["cases"][name]["runs_under_load"] for docs in sides.values() for d in docs),
            "output_records": outputs.pop(),
        }
    return {
        "benchmark": "cpu-compare",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sides": {
            side: [
                {k: doc.get(k) for k in ("commit", "note", "at", "load_average", "under_load", "events", "parallelism")}
                for doc in docs
            ]
            for side, docs in sides.items()
        },
        "under_load": any(doc.get("under_load") for docs in sides.values() for doc in docs),
        "cases": cases,
    }


def _loadavg() -> Iterator[float]:
    try:
        yield from (float(x) for x in Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return


if __name__ == "__main__":
    sys.exit(main())

"""Records per second across Weir's data plane, from raw gRPC up to the whole keyed job.

``make bench-exchange`` (``.venv/bin/python -m bench.exchange_bench [--quick]``) measures, side by side:

(a) raw gRPC loopback: a bidi stream with generic (bytes in, bytes out) handlers, the client sending
    one pre-encoded blob of 1,000 records per message: the ceiling of the transport here;
(a2) the same, the client pickling each 1,000-record batch and the server unpickling it;
(b) one Weir TaskManager-to-TaskManager channel: a real TaskManagerRuntime and its gRPC servicer in
    this process with an InputGate registered; in a second process, a RecordWriter emitting records
    one by one into a RemoteOutputChannel; a consumer thread takes buffers off the gate and decodes
    them, so credits flow back as they do to a task (4 credits, 1,000 records per buffer);
(b2) one Weir local channel (producer and consumer subtask in one TaskManager): in this process, a
    producer thread's RecordWriter emitting into a LocalOutputChannel, a consumer thread taking
    buffers off the InputGate (same credits, no gRPC, no encoding);
(c) the whole keyed job (bench/jobs/generator_keyed.py) on a private local cluster: generator ->
    key_by -> 1 s tumbling count+sum -> discard, parallelism 3, records/s from RUNNING to FINISHED.

In (a), (a2) and (b) the producer runs in its own process and the rate is taken on the receiving
side, from the first batch received to the last (the first batch's records are not counted), so
connection set-up is excluded. Records are the keyed job's events, ``({"id", "key", "value", "ts"},
ts)``, each a distinct object (pickle would otherwise share one copy). Results:
``bench/results/exchange.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import grpc

from bench import provenance
from bench.harness import (
    JOBS_DIR,
    REPO_ROOT,
    RESULTS_DIR,
    BenchError,
    ProcessSampler,
    log,
    new_run_id,
    prepare_environment,
    private_cluster,
    remove_run_root,
)
from weir.core.transport import GRPC_OPTIONS
from weir.taskmanager.network.codec import end_of_stream_message, message_of, read_buffer
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.output_channels import LocalOutputChannel, RemoteOutputChannel
from weir.taskmanager.network.writer import RECORDS_PER_BUFFER, RecordWriter
from weir.wire import common_pb2, taskmanager_pb2, taskmanager_pb2_grpc

RAW_METHOD: Final = "/weir.bench.Loopback/Stream"
RECORD_POOL: Final = 4 * RECORDS_PER_BUFFER
JOB_ID: Final = "exchange-bench"
CONSUMER_UID: Final = "consumer"


@dataclass(frozen=True)
class Sizes:
    raw_batches: int
    channel_records: int
    job_events: int


FULL = Sizes(raw_batches=5_000, channel_records=1_500_000, job_events=1_000_000)
QUICK = Sizes(raw_batches=2_000, channel_records=500_000, job_events=300_000)


@dataclass(frozen=True)
class Figure:
    name: str
    records: int
    seconds: float
    records_per_s: float
    note: str = ""


def record_pool() -> list[tuple[dict[str, Any], int]]:
    """Distinct event records, as the keyed job ships them between its source and its window."""
    start = 1_700_000_000_000
    return [
        ({"id": f"e{i}", "key": f"key-{i % 1000:04d}", "value": i % 97, "ts": start + i // 10}, start + i // 10)
        for i in range(RECORD_POOL)
    ]


def batches(pool: list[tuple[dict[str, Any], int]]) -> Iterator[list[tuple[dict[str, Any], int]]]:
    while True:
        for start in range(0, len(pool), RECORDS_PER_BUFFER):
            yield pool[start : start + RECORDS_PER_BUFFER]


# (a) raw gRPC loopback --------------------------------------------------------------------------------


class _Receiver:
    """Counts records per stream, timing from the first batch received to the end of the stream."""

    def __init__(self, decode: bool) -> None:
        self.decode = decode
        self.done = threading.Event()
        self.figure: tuple[int, float] | None = None

    def stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        first_at: float | None = None
        counted = 0
        for blob in requests:
            if first_at is None:
                first_at = time.perf_counter()
                continue
            counted += len(pickle.loads(blob)) if self.decode else RECORDS_PER_BUFFER
        elapsed = time.perf_counter() - (first_at or time.perf_counter())
        self.figure = (counted, elapsed)
        self.done.set()
        yield b"done"


def _raw_sender(address: str, n_batches: int, encode_each: bool) -> None:
    """The client process: ``n_batches`` blobs of 1,000 records on one bidi stream."""
    pool = record_pool()
    fixed = pickle.dumps(pool[:RECORDS_PER_BUFFER], protocol=5)

    def blobs() -> Iterator[bytes]:
        source = batches(pool)
        for _ in range(n_batches):
            yield pickle.dumps(next(source), protocol=5) if encode_each else fixed

    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        call = channel.stream_stream(RAW_METHOD)
        for _ in call(blobs()):
            pass


def raw_loopback(n_batches: int, encode_each: bool) -> Figure:
    receiver = _Receiver(decode=encode_each)
    handler = grpc.method_handlers_generic_handler(
        "weir.bench.Loopback", {"Stream": grpc.stream_stream_rpc_method_handler(receiver.stream)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        sender = _spawn(_raw_sender, f"127.0.0.1:{port}", n_batches, encode_each)
        sender.join()
        if sender.exitcode != 0 or not receiver.done.wait(30):
            raise BenchError(f"raw gRPC sender exited with {sender.exitcode}")
    finally:
        server.stop(grace=1).wait()
    assert receiver.figure is not None
    records, seconds = receiver.figure
    name = "raw gRPC + pickle per batch" if encode_each else "raw gRPC loopback"
    note = "client pickles, server unpickles each batch" if encode_each else "one pre-encoded blob per message"
    return Figure(name, records, seconds, records / seconds, note)


# (b) one Weir channel -------------------------------------------------------------------------------


def _task_ref(vertex_uid: str) -> common_pb2.TaskRef:
    return common_pb2.TaskRef(job_id=JOB_ID, vertex_uid=vertex_uid, subtask=0)


def _channel_producer(address: str, n_records: int, done: multiprocessing.connection.Connection) -> None:
    """The producing TaskManager's side: a RecordWriter over one RemoteOutputChannel."""
    from weir.core.ids import SubtaskIndex
    from weir.graph import Partitioning
    from weir.taskmanager.partitioners import create_partitioner

    pool = record_pool()
    header = taskmanager_pb2.ChannelHeader(
        producer=_task_ref("producer"), consumer=_task_ref(CONSUMER_UID), consumer_channel=0, attempt=1
    )
    grpc_channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
    output = RemoteOutputChannel(grpc_channel, header, threading.Event())
    output.open()
    partitioner = create_partitioner(
        Partitioning.FORWARD,
        subtask=SubtaskIndex(0),
        upstream_parallelism=1,
        downstream_parallelism=1,
        max_parallelism=128,
    )
    writer = RecordWriter([output], partitioner, None, None, flush_interval_s=0.02)
    emit = writer.emit
    size = len(pool)
    for i in range(n_records):
        value, ts = pool[i % size]
        emit(value, ts)
    writer.flush()
    writer.broadcast_event(end_of_stream_message())
    done.recv()  # the consumer took the end of stream: half-close the request stream
    writer.close()
    done.recv()  # the consumer side ended its response stream: the call is over
    grpc_channel.close()


def weir_channel(n_records: int) -> Figure:
    from weir.taskmanager.runtime import TaskManagerRuntime
    from weir.taskmanager.service import TaskManagerServicer
    from weir.taskmanager.task_types import TaskAddress

    with tempfile.TemporaryDirectory(prefix="weir-exchange-") as tmp:
        os.environ["WEIR_CHECKPOINT_DIR"] = f"file://{tmp}/checkpoints"
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="tm-grpc"), options=GRPC_OPTIONS
        )
        port = server.add_insecure_port("127.0.0.1:0")
        # No JobManager: the runtime only reports task states and checkpoints, and there are none here.
        runtime = TaskManagerRuntime("bench-consumer", f"127.0.0.1:{port}", "127.0.0.1:9", 1, Path(tmp))
        taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(TaskManagerServicer(runtime), server)
        server.start()
        gate = InputGate([0])
        # What deploy() does for a task with inputs, without deploying one: make the gate reachable.
        address = TaskAddress(JOB_ID, CONSUMER_UID, 0, 1)
        runtime.channels.register(address, gate)
        parent_end, child_end = multiprocessing.get_context("spawn").Pipe()
        producer = _spawn(_channel_producer, f"127.0.0.1:{port}", n_records, child_end)
        try:
            received, seconds = _consume(gate, timeout_s=300)
            # Close as a finished producer and task do: the producer half-closes its stream, the
            # servicer's reader thread sees the end, then the gate ends the credit stream.
            parent_end.send("end of stream taken")
            _wait_reader_done(f"channel-in-{address}-0", timeout_s=10)
            gate.close()
            parent_end.send("credit stream closed")
            producer.join(30)
        finally:
            gate.close()
            if producer.is_alive():
                producer.terminate()
            server.stop(grace=1).wait()
            runtime.stop()
    if received != n_records:
        raise BenchError(f"the Weir channel delivered {received} of {n_records} records")
    counted = received - RECORDS_PER_BUFFER
    return Figure(
        "Weir TM-to-TM channel",
        counted,
        seconds,
        counted / seconds,
        "RecordWriter.emit per record -> pickle -> credits -> gRPC -> InputGate -> unpickle",
    )


def local_channel(n_records: int) -> Figure:
    """(b2): a producer thread and a consumer thread of one process, as two subtasks of one TaskManager."""
    from weir.core.ids import SubtaskIndex
    from weir.graph import Partitioning
    from weir.taskmanager.partitioners import create_partitioner

    pool = record_pool()
    gate = InputGate([0])
    header = taskmanager_pb2.ChannelHeader(
        producer=_task_ref("producer"), consumer=_task_ref(CONSUMER_UID), consumer_channel=0, attempt=1
    )
    output = LocalOutputChannel(header, threading.Event(), lambda ch: ch.connect(gate))
    available = threading.Condition()

    def wake() -> None:
        with available:
            available.notify_all()

    output.set_wakeup(wake)
    output.open()
    partitioner = create_partitioner(
        Partitioning.FORWARD,
        subtask=SubtaskIndex(0),
        upstream_parallelism=1,
        downstream_parallelism=1,
        max_parallelism=128,
    )
    writer = RecordWriter([output], partitioner, None, None, flush_interval_s=0.02)

    def produce() -> None:  # a task's loop: emit while the output is available, else wait for it
        emit, size = writer.emit, len(pool)
        for i in range(n_records):
            if i % RECORDS_PER_BUFFER == 0 and not writer.available():
                with available:
                    available.wait_for(writer.available, timeout=10)
            value, ts = pool[i % size]
            emit(value, ts)
        writer.flush()
        writer.broadcast_event(end_of_stream_message())
        writer.close(drain=True)

    producer = threading.Thread(target=produce, name="local-producer", daemon=True)
    producer.start()
    received, seconds = _consume(gate, timeout_s=300)
    producer.join(30)
    gate.close()
    if received != n_records:
        raise BenchError(f"the local channel delivered {received} of {n_records} records")
    counted = received - RECORDS_PER_BUFFER
    return Figure(
        "Weir local channel (same TM)",
        counted,
        seconds,
        counted / seconds,
        "RecordWriter.emit per record -> credits -> InputGate, in memory (two threads of one process)",
    )


def _wait_reader_done(thread_name: str, timeout_s: float) -> None:
    """Wait for the servicer thread reading one channel's requests (named by runtime.open_channel)."""
    deadline = time.monotonic() + timeout_s
    while any(t.name == thread_name for t in threading.enumerate()):
        if time.monotonic() > deadline:
            raise BenchError(f"the channel's reader thread {thread_name} did not end after the stream closed")
        time.sleep(0.01)


def _consume(gate: InputGate, timeout_s: float) -> tuple[int, float]:
    """Take buffers off the gate as a task does until end of stream: (records, seconds since the first)."""
    deadline = time.monotonic() + timeout_s
    received = 0
    first_at: float | None = None
    while time.monotonic() < deadline:
        item = gate.poll(0.5)
        if item is None:
            continue
        _channel, _gate, buffer = item
        msg = message_of(buffer)
        if msg.record_count:
            if first_at is None:
                first_at = time.perf_counter()
            received += len(read_buffer(buffer).values)
        if msg.event == taskmanager_pb2.EVENT_KIND_END_OF_STREAM:
            return received, time.perf_counter() - (first_at or time.perf_counter())
    raise BenchError(f"the Weir channel did not end within {timeout_s:.0f} s ({received} records received)")


# (c) the whole keyed job -------------------------------------------------------------------------------


def keyed_job(n_events: int) -> tuple[Figure, dict[str, Any]]:
    env = prepare_environment(new_run_id(), checkpoints_in_s3=False)
    failed = True
    with private_cluster(env) as cluster:
        sampler = ProcessSampler().start()
        sampler.track(cluster.process_pids())
        submitted = time.monotonic()
        job_id = cluster.submit(JOBS_DIR / "generator_keyed.py", {"events": str(n_events)}, 3)
        marks: dict[str, float] = {}

        def on_poll(status: Any) -> None:
            if "running" not in marks and status.tasks and all(t.state == "RUNNING" for t in status.tasks):
                marks["running"] = time.monotonic()

        status = cluster.wait_job(job_id, lambda s: s.summary.status == "FINISHED", 600, "FINISHED", on_poll)
        finished = time.monotonic()
        sampler.stop()
        failed = False
    remove_run_root(env, keep=failed)
    running = marks.get("running", submitted)
    seconds = finished - running
    figure = Figure(
        "keyed job on the local cluster",
        n_events,
        seconds,
        n_events / seconds,
        "generator -> key_by -> window count+sum -> discard, p=3, RUNNING to FINISHED",
    )
    detail = {
        "job_id": job_id,
        "submit_to_finished_s": finished - submitted,
        "submit_to_running_s": running - submitted,
        "records_out_of_sources": sum(t.records_out for t in status.tasks if t.vertex_uid == "generator"),
        "cluster_cpu_s": sampler.total_cpu_s(),
        "peak_rss_bytes": sampler.peak_rss_by_process(),
    }
    return figure, detail


# ---------------------------------------------------------------------------------------------------------


def _spawn(target: Any, *args: Any) -> multiprocessing.process.BaseProcess:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    return process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exchange_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts (a few seconds per figure)")
    parser.add_argument("--skip-job", action="store_true", help="only (a), (a2) and (b): no cluster")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "exchange.json")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    block = provenance.collect(REPO_ROOT, java=None)

    log(f"(a) raw gRPC loopback, {sizes.raw_batches:,} batches of {RECORDS_PER_BUFFER:,}")
    raw = raw_loopback(sizes.raw_batches, encode_each=False)
    log(f"(a2) raw gRPC with pickle per batch, {sizes.raw_batches:,} batches")
    raw_pickled = raw_loopback(sizes.raw_batches, encode_each=True)
    log(f"(b) one Weir channel, {sizes.channel_records:,} records")
    channel = weir_channel(sizes.channel_records)
    log(f"(b2) one Weir local channel, {sizes.channel_records:,} records")
    local = local_channel(sizes.channel_records)
    figures = [raw, raw_pickled, channel, local]
    job_detail: dict[str, Any] | None = None
    if not args.skip_job:
        log(f"(c) keyed job on a private cluster, {sizes.job_events:,} events")
        job, job_detail = keyed_job(sizes.job_events)
        figures.append(job)

    print()
    print(f"{'':34s} {'records/s':>14s} {'vs raw gRPC':>12s} {'vs previous':>12s}")
    previous: Figure | None = None
    for f in figures:
        vs_prev = f"{f.records_per_s / previous.records_per_s:11.3f}x" if previous else f"{'':>12s}"
        print(f"{f.name:34s} {f.records_per_s:14,.0f} {f.records_per_s / raw.records_per_s:11.3f}x {vs_prev}")
        previous = f
    print()

    document = {
        "benchmark": "exchange",
        "quick": args.quick,
        "provenance": provenance.finish(block),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
        "load_average_at_end": os.getloadavg(),
        "records_per_buffer": RECORDS_PER_BUFFER,
        "figures": [asdict(f) for f in figures],
        "ratios": {
            "weir_channel_vs_raw_grpc": channel.records_per_s / raw.records_per_s,
            "weir_channel_vs_raw_grpc_pickled": channel.records_per_s / raw_pickled.records_per_s,
            "local_channel_vs_weir_channel": local.records_per_s / channel.records_per_s,
            **(
                {
                    "keyed_job_vs_weir_channel": figures[-1].records_per_s / channel.records_per_s,
                    "keyed_job_vs_raw_grpc": figures[-1].records_per_s / raw.records_per_s,
                }
                if job_detail is not None
                else {}
            ),
        },
        "keyed_job": job_detail,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(args.output)
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        sys.exit(1)

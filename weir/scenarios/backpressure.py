"""``weir scenario backpressure``: the seed's backpressure scenario, aligned then unaligned, measured.

The driver (on the local cluster, checkpoints in the S3 bucket), for each mode, aligned (exactly once)
then unaligned (``-D checkpointing.unaligned=true``), on fresh topics: produces events at a steady rate
(the input rate; event time = production time) and runs examples/slow_sink_aggregation.py, the keyed
aggregation whose exactly-once Kafka sink writes at most ``sink.records_per_second`` results per second
per subtask, slower than the input needs; samples, every half second, the source topic's end offsets
and the records the source read (the source lag = end offset - position), and once the run is over
reads the checkpoint history (``weir checkpoints``: duration, alignment, start delay, in-flight bytes
persisted), each retained checkpoint's ``__inflight__`` state from the checkpoint storage, and the
sink's committed output, each result stamped with the time the sink wrote it.

The report shows per mode the checkpoint duration over time, the record latency (written - window
end), the measured input rate, sink rate and source-lag growth beside the formula ``backlog growth =
input rate - sustainable sink rate``; then both modes side by side.

What to expect (the design card's fourth scenario, Flink's FLIP-76): under backpressure an aligned
barrier waits behind the records queued in the channels, which the slow sink drains at its own pace,
so aligned checkpoints take about (queued records / sink rate) and grow while the queues fill;
unaligned barriers overtake the queues, so their checkpoints stay near the interval and persist the
overtaken records instead. Neither mode changes the rate at which the sink drains the backlog: the
record latency is not shortened by unaligned mode, and the backlog (source lag) grows at input rate -
sink rate in both.

A check fails when a measurement contradicts that in a way that indicates a bug or a run that proves
nothing: no checkpoint completed, no backpressure (the sink keeps up), the lag growth far from the
formula, unaligned checkpoints not shorter than aligned ones, unaligned latency clearly lower. When the
runtime cannot run unaligned checkpoints (the job fails on its first one), the unaligned half is
reported as unavailable, with the reason, and only the aligned half is judged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from rich.console import Console

from weir.connectors import kafka
from weir.connectors.object_storage import open_storage
from weir.core.checkpointing import CheckpointStatus
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.core.paths import locate_state
from weir.core.states import TaskState
from weir.core.task_state import decode_task_state, read_operator_states
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.scenarios.driving import EventProducer, cancel_unless_ended, wait_until
from weir.scenarios.framework import (
    EXAMPLES,
    JobSpec,
    Report,
    ReportBuilder,
    Scenario,
    ScenarioError,
    Table,
    UsageError,
    percentile,
)
from weir.scenarios.keyed_job import SOURCE_UID, KeyedJob
from weir.tools.client import CheckpointInfo, JobDetails, JobManagerClient
from weir.tools.events import EventSpec

NAME: Final = "backpressure"
JOB_FILE: Final = EXAMPLES / "slow_sink_aggregation.py"  # the keyed job with a slow sink, no PostgreSQL sink
INFLIGHT_STATE_NAME: Final = (
    "__inflight__"  # weir.taskmanager.inflight's operator-state name (tools never import taskmanager)
)
SAMPLE_S: Final = 0.5
MODES: Final = ("aligned", "unaligned")
OUTCOME: Final = (
    "Slow downstream work delays aligned barriers. Unaligned checkpoints can capture in-flight data and shorten "
    "checkpoint completion, but do not remove processing latency. Backlog growth = input records/s - sustainable "
    "sink records/s; unaligned checkpoints do not change that sign."
)


@dataclass(frozen=True)
class BackpressureConfig:
    events_per_second: int = 3_000  # the input rate (a multiple of 1000: event time advances 1 ms per 1/1000 of it)
    keys: int = 40
    window_ms: int = 250
    sink_records_per_second: int = 40  # per sink subtask
    parallelism: int = 2
    partitions: int = 4
    checkpoint_interval_s: float = 1.0
    run_s: float = 60.0  # per mode, at least
    # A run lasts until this many of its checkpoints completed too (at most ``timeout_s`` past ``run_s``):
    # how long the first aligned barrier waits depends on how much the source read before the queues were
    # full, more on a loaded machine (its buffers fill before their timeout), so a fixed run can end first.
    min_completed: int = 2
    # Rates and slopes are measured after this share of the run: by then the channels' queues, which
    # hold a bounded number of records (credits), are full and the source is held back to the sink's pace.
    warmup_fraction: float = 0.4
    topic_prefix: str = "backpressure"
    modes: tuple[str, ...] = MODES
    lag_tolerance: float = 0.2  # |measured lag growth - formula| within this share of the input rate
    unaligned_factor: float = 0.5  # under backpressure an unaligned checkpoint takes less than this x aligned
    timeout_s: float = 120.0

    @property
    def events_per_result(self) -> float:
        """Input events per window result: each key has a result per window."""
        return self.events_per_second * self.window_ms / 1000 / self.keys

    @property
    def sustainable_events_per_second(self) -> float:
        """The input rate the sink can keep up with, from its configured rate."""
        return self.sink_records_per_second * self.parallelism * self.events_per_result

    def job(self, mode: str) -> KeyedJob:
        """The keyed job's topics for this mode (``PREFIX-MODE-events`` ...), its slow-sink variant."""
        return KeyedJob.named(
            f"{self.topic_prefix}-{mode}",
            table=None,
            file=JOB_FILE,
            window_ms=self.window_ms,
            checkpoint_interval=f"{int(self.checkpoint_interval_s * 1000)}ms",
        )

    def spec(self, mode: str) -> JobSpec:
        return self.job(mode).spec(
            self.parallelism,
            extra={
                "sink.records_per_second": str(self.sink_records_per_second),
                "checkpointing.retained": "1000",  # every checkpoint stays readable: its in-flight bytes are measured
                "checkpointing.unaligned": "true" if mode == "unaligned" else "false",
            },
        )


# What one mode's run measured ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the job was submitted
    end_offsets: int  # the source topic's end offsets, summed: events produced
    read: int  # records the source subtasks emitted (read from Kafka)

    @property
    def lag(self) -> int:
        return self.end_offsets - self.read


@dataclass(frozen=True)
class CheckpointPoint:
    checkpoint_id: int
    t: float  # trigger time, seconds since the job was submitted
    status: str
    duration_s: float
    alignment_s: float  # the longest of its tasks
    start_delay_s: float
    slowest_task: str  # the task whose barrier came last (longest start delay)
    size_bytes: int
    inflight_bytes: int | None  # persisted in-flight state as the runtime reports it, summed over tasks
    inflight_stored: int | None = None  # the __inflight__ state found in the storage; None: not read
    unaligned: bool = False  # some task reported it persisted in-flight records


@dataclass(frozen=True)
class Written:
    """One committed result as the sink wrote it."""

    written_s: float  # seconds since the job was submitted
    latency_s: float  # written - window end (the window's events were produced by its end)
    count: int  # events it aggregates


@dataclass(frozen=True)
class ModeRun:
    mode: str
    job_id: str = ""
    unavailable: str = ""  # why the mode could not run in this runtime ("" when it ran)
    samples: tuple[Sample, ...] = ()
    checkpoints: tuple[CheckpointPoint, ...] = ()
    written: tuple[Written, ...] = ()
    duration_s: float = 0.0

    @property
    def available(self) -> bool:
        return not self.unavailable


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points; 0 with fewer than two distinct x."""
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


@dataclass(frozen=True)
class Measurement:
    """One mode's figures, over the steady part of its run (after the warm-up)."""

    mode: str
    completed: int
    failed: int
    duration_first_s: float  # median duration of the completed checkpoints in the first / last third
    duration_last_s: float
    duration_max_s: float
    # median duration of the checkpoints triggered after the warm-up (the last third's when none was):
    # what the modes are compared on, robust to the odd long checkpoint (a burst of window firings)
    duration_steady_s: float
    alignment_max_s: float
    start_delay_last_s: float  # median of the last third's longest start delay: the barriers' way to the tasks
    input_rate: float  # events/s, slope of the end offsets
    read_rate: float  # events/s the source read, slope of its records
    sink_results_rate: float  # results/s the sink wrote
    sink_events_rate: float  # events/s the sink's results aggregate
    lag_growth: float  # events/s, slope of the source lag
    lag_end: int
    latency_p50_s: float  # of results written in the comparison range
    latency_p95_s: float
    latency_max_s: float
    inflight_bytes: tuple[int, ...]  # per checkpoint read from storage
    written: int

    @property
    def formula_growth(self) -> float:
        return self.input_rate - self.sink_events_rate


def measure(run: ModeRun, config: BackpressureConfig, compare_until_s: float | None = None) -> Measurement:
    """The figures of one run: rates and slopes after the warm-up; latency of the results written
    between the warm-up and ``compare_until_s`` (both modes are compared over the same span)."""
    start = run.duration_s * config.warmup_fraction
    steady = [s for s in run.samples if s.t >= start]
    completed = sorted(
        (c for c in run.checkpoints if c.status == CheckpointStatus.COMPLETED.value), key=lambda c: c.checkpoint_id
    )
    third = max(1, len(completed) // 3)
    durations = [c.duration_s for c in completed]
    steady_durations = [c.duration_s for c in completed if c.t >= start] or durations[-third:]
    written = [w for w in run.written if w.written_s >= start]
    sink_span = (max(w.written_s for w in written) - start) if written else 0.0
    until = compare_until_s if compare_until_s is not None else float("inf")
    latencies = [w.latency_s for w in written if w.written_s <= until]
    inflight = tuple(c.inflight_bytes for c in completed if c.inflight_bytes is not None)
    return Measurement(
        mode=run.mode,
        completed=len(completed),
        failed=sum(1 for c in run.checkpoints if c.status == CheckpointStatus.FAILED.value),
        duration_first_s=statistics.median(durations[:third]) if durations else float("nan"),
        duration_last_s=statistics.median(durations[-third:]) if durations else float("nan"),
        duration_max_s=max(durations, default=float("nan")),
        duration_steady_s=statistics.median(steady_durations) if steady_durations else float("nan"),
        alignment_max_s=max((c.alignment_s for c in completed), default=0.0),
        start_delay_last_s=statistics.median([c.start_delay_s for c in completed[-third:]]) if completed else 0.0,
        input_rate=slope([(s.t, s.end_offsets) for s in steady]),
        read_rate=slope([(s.t, s.read) for s in steady]),
        sink_results_rate=len(written) / sink_span if sink_span > 0 else 0.0,
        sink_events_rate=sum(w.count for w in written) / sink_span if sink_span > 0 else 0.0,
        lag_growth=slope([(s.t, s.lag) for s in steady]),
        lag_end=run.samples[-1].lag if run.samples else 0,
        latency_p50_s=percentile(latencies, 0.5),
        latency_p95_s=percentile(latencies, 0.95),
        latency_max_s=max(latencies, default=float("nan")),
        inflight_bytes=inflight,
        written=len(run.written),
    )


def comparison_end(runs: Sequence[ModeRun]) -> float | None:
    """The latest write time every available run has committed output up to."""
    ends = [max(w.written_s for w in r.written) for r in runs if r.available and r.written]
    return min(ends) if ends else None


# The driver ---------------------------------------------------------------------------------------------


def _source_read(status: JobDetails) -> int:
    return sum(t.records_out for t in status.tasks if t.vertex_uid == SOURCE_UID)


def _completed(checkpoints: Sequence[CheckpointInfo]) -> int:
    return sum(1 for c in checkpoints if c.status == CheckpointStatus.COMPLETED.value)


def _running(status: JobDetails, mode: str) -> bool:
    if status.summary.is_terminal:
        raise ScenarioError(f"{mode}: job {status.summary.job_id} ended {status.summary.status}: {status.failure}")
    return bool(status.tasks) and all(t.state is TaskState.RUNNING for t in status.tasks)


def _unsupported(status: JobDetails) -> str:
    """The failure of a job the runtime could not checkpoint unaligned ("" for any other end)."""
    failure = str(status.failure or "")
    return failure if "UnsupportedCheckpointAction" in failure or "not supported" in failure else ""


def run_mode(
    endpoints: Endpoints, client: JobManagerClient, config: BackpressureConfig, mode: str, console: Console
) -> ModeRun:
    """One mode: fresh topics, the input at its rate, the job, sampled for ``run_s`` and on until
    ``min_completed`` checkpoints completed (or ``timeout_s`` more passed), then cancelled."""
    job = config.job(mode)
    job.recreate(endpoints, config.partitions)
    samples: list[Sample] = []
    checkpoints: tuple[CheckpointInfo, ...] = ()
    unavailable = ""
    job_spec = config.spec(mode)
    job_id = job_spec.submit(client)
    console.print(f"{mode}: job {job_id} {job_spec.command()}", soft_wrap=True, highlight=False)
    # The input starts once every task runs: a backlog produced while the job deploys (seconds on a
    # loaded machine) would be read in one burst, whose windows the slow sink then drains for tens of
    # seconds before the run reaches the steady state the formula describes.
    try:
        wait_until(lambda: _running(client.job_status(job_id), mode), config.timeout_s, f"job {job_id}'s tasks to run")
    except BaseException:
        cancel_unless_ended(client, job_id)
        raise
    spec = EventSpec(
        count=int(config.events_per_second * (config.run_s + 2 * config.timeout_s)),
        keys=config.keys,
        events_per_ms=config.events_per_second // 1000,
        start_ms=int(time.time() * 1000),  # event time = production time
    )
    producer = EventProducer(endpoints, job.source_topic, spec, config.events_per_second)
    producer.start()
    try:
        submitted_wall = time.time()
        submitted = time.monotonic()
        shown = 0.0
        completed = 0
        while (t := time.monotonic() - submitted) < config.run_s or (
            completed < config.min_completed and t < config.run_s + config.timeout_s
        ):
            status = client.job_status(job_id)
            if status.summary.status in ("FAILED", "CANCELED", "FINISHED"):
                unavailable = _unsupported(status) if mode == "unaligned" else ""
                if not unavailable:
                    raise ScenarioError(f"{mode}: job {job_id} ended {status.summary.status}: {status.failure}")
                break
            if t >= config.run_s and status.last_completed_checkpoint is not None:
                completed = _completed(client.list_checkpoints(job_id))
            produced = sum(kafka.end_offsets(endpoints, job.source_topic).values())
            samples.append(Sample(t, produced, _source_read(status)))
            if t - shown >= 5:
                shown = t
                console.print(
                    f"  t={t:4.0f}s produced {produced:,}, read {samples[-1].read:,}, lag {samples[-1].lag:,}, "
                    f"last completed checkpoint {status.last_completed_checkpoint}",
                    highlight=False,
                )
            time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - submitted - t)))  # the sampling period
        duration = time.monotonic() - submitted
        checkpoints = client.list_checkpoints(job_id)
        if not unavailable:
            client.cancel_job(job_id)
            wait_until(
                lambda: client.job_status(job_id).summary.is_terminal,
                config.timeout_s,
                f"job {job_id} to end after its cancellation",
                0.3,
            )
    finally:
        producer.stop()
    points = tuple(
        sorted((_checkpoint_point(c, submitted_wall, endpoints) for c in checkpoints), key=lambda c: c.checkpoint_id)
    )
    if unavailable:
        return ModeRun(mode, job_id, unavailable, tuple(samples), points, (), duration)
    written = _read_output(endpoints, job.sink_topic, submitted_wall)
    return ModeRun(mode, job_id, "", tuple(samples), points, written, duration)


def _checkpoint_point(c: CheckpointInfo, submitted_wall: float, endpoints: Endpoints) -> CheckpointPoint:
    return CheckpointPoint(
        checkpoint_id=int(c.checkpoint_id),
        t=c.trigger_time - submitted_wall,
        status=c.status.value,
        duration_s=c.duration_s,
        alignment_s=max((t.alignment_duration_s for t in c.tasks), default=0.0),
        start_delay_s=max((t.start_delay_s for t in c.tasks), default=0.0),
        slowest_task=max(c.tasks, key=lambda t: t.start_delay_s).name if c.tasks else "",
        size_bytes=c.size_bytes,
        inflight_bytes=c.inflight_bytes,
        inflight_stored=read_inflight_bytes(c.external_path, endpoints) if c.external_path else None,
        unaligned=c.unaligned,
    )


def read_inflight_bytes(path: str, endpoints: Endpoints | None = None) -> int | None:
    """The in-flight state a retained checkpoint persisted, summed over its tasks (0: none), read from
    the checkpoint storage with the decoders a restore uses; None when it cannot be read."""
    try:
        location = locate_state(path)
        storage = open_storage(location.root_uri, endpoints)
        checkpoint = decode_metadata(storage.get_bytes(location.metadata_key), location.metadata_key)
        total = 0
        for handle in checkpoint.task_states:
            document = decode_task_state(handle.inline_payload, f"{path} task {handle.task_id}")
            if INFLIGHT_STATE_NAME in document.operator_state_uids:
                states = read_operator_states(document.operator_state, storage.get_bytes)
                total += len(states.get(INFLIGHT_STATE_NAME, b""))
        return total
    except WeirError:
        return None


def _read_output(endpoints: Endpoints, topic: str, submitted_wall: float) -> tuple[Written, ...]:
    out: list[Written] = []
    for _p, _o, _k, value, _ts in kafka.read_committed_records(endpoints, topic):
        if value is None:
            continue
        r = json.loads(value)
        written_ms = r["written_ms"]
        out.append(Written(written_ms / 1000 - submitted_wall, (written_ms - r["window_end"]) / 1000, r["count"]))
    out.sort(key=lambda w: w.written_s)
    return tuple(out)


@dataclass(frozen=True)
class BackpressureRun:
    """Each mode's run, in the order they ran."""

    runs: Mapping[str, ModeRun]
    steps: tuple[str, ...] = ()


def drive(endpoints: Endpoints, config: BackpressureConfig, console: Console) -> BackpressureRun:
    """Both modes, one after the other, on the cluster already up."""
    runs: dict[str, ModeRun] = {}
    steps: list[str] = []
    with JobManagerClient(endpoints.jobmanager_address) as client:
        for mode in config.modes:
            console.rule(f"{mode} checkpoints")
            runs[mode] = run = run_mode(endpoints, client, config, mode, console)
            steps.append(
                f"{mode}: fresh topics {config.job(mode).source_topic}...; input at {config.events_per_second:,} "
                f"events/s; ran {config.spec(mode).command()} (job {run.job_id}) for {run.duration_s:.0f} s, "
                "sampling the source's lag every 0.5 s; read the checkpoint history, each retained checkpoint's "
                "in-flight state and the sink's committed output"
                + (f"; unavailable in this runtime: {run.unavailable}" if not run.available else "")
            )
    return BackpressureRun(runs, tuple(steps))


def measured_modes(config: BackpressureConfig, run: BackpressureRun) -> dict[str, Measurement]:
    """Each available mode's figures, latency compared over the span every mode has output for."""
    until = comparison_end(list(run.runs.values()))
    return {mode: measure(r, config, until) for mode, r in run.runs.items() if r.available}


# The checks ---------------------------------------------------------------------------------------------


def check(config: BackpressureConfig, run: BackpressureRun) -> Report:
    """What contradicts the expectation (a bug, or a run that proves nothing) fails a check."""
    report = ReportBuilder(NAME, OUTCOME)
    for text in run.steps:
        report.step(text)
    measured = measured_modes(config, run)
    for mode, r in run.runs.items():
        if r.available:
            report.table(_checkpoint_table(r))
        else:
            report.measured(
                f"{mode} mode",
                f"unavailable in this runtime: the job failed on its first unaligned "
                f"checkpoint: {r.unavailable}; only the aligned half is judged",
            )
    if measured:
        report.table(_modes_table(config, measured))
    report.measured(
        "configured",
        f"input {config.events_per_second:,} events/s, sink {config.sink_records_per_second} results/s x "
        f"{config.parallelism} subtasks x {config.events_per_result:g} events per result = "
        f"{config.sustainable_events_per_second:,.0f} events/s sustainable, so the backlog should grow "
        f"{config.events_per_second - config.sustainable_events_per_second:,.0f} events/s; checkpoint interval "
        f"{config.checkpoint_interval_s:g}s",
    )
    report.measured(
        "in-flight bytes",
        "the overtaken records' buffers as the runtime reports them per checkpoint (weir checkpoints), beside the "
        "size of the __inflight__ operator state (with its framing) of each retained checkpoint read back from the "
        "checkpoint storage; kind: unaligned when a task reported persisting in-flight records",
    )
    report.measured(
        "latency",
        "the sink's write time minus the window's end (a read_committed consumer sees a result only once its "
        "checkpoint completed, later by up to one checkpoint duration)",
    )
    v = report.verify
    for mode, m in measured.items():
        v(
            f"checkpoints-completed:{mode}",
            f"{mode}: checkpoints complete under backpressure",
            m.completed > 0,
            f"{m.completed} completed, {m.failed} failed",
            completed=m.completed,
            failed=m.failed,
        )
        v(
            f"sink-committed:{mode}",
            f"{mode}: the sink committed results",
            m.written > 0,
            f"{m.written:,} results committed",
            written=m.written,
        )
        v(
            f"backpressure:{mode}",
            f"{mode}: the run is backpressured: the source lag grows (the sink does not keep up)",
            m.lag_growth > 0.05 * m.input_rate,
            f"source lag {m.lag_growth:+,.0f} events/s at {m.input_rate:,.0f} events/s input (more than 5%)",
            lag_growth=m.lag_growth,
            input_rate=m.input_rate,
        )
        v(
            f"lag-follows-formula:{mode}",
            f"{mode}: the backlog grows at input rate - sink rate",
            abs(m.lag_growth - m.formula_growth) <= config.lag_tolerance * m.input_rate,
            f"source lag {m.lag_growth:,.0f} events/s, formula {m.formula_growth:,.0f} (input {m.input_rate:,.0f} "
            f"- sink {m.sink_events_rate:,.0f}), within {config.lag_tolerance:.0%} of the input rate",
            lag_growth=m.lag_growth,
            formula_growth=m.formula_growth,
            input_rate=m.input_rate,
            sink_events_rate=m.sink_events_rate,
            tolerance=config.lag_tolerance,
        )
    aligned, unaligned = measured.get("aligned"), measured.get("unaligned")
    if aligned and unaligned and aligned.completed and unaligned.completed:
        why = ""
        if unaligned.start_delay_last_s > config.checkpoint_interval_s:
            why = (
                f"; their barriers took {unaligned.start_delay_last_s:.2f}s to reach a task (start delay): an "
                "unaligned barrier overtakes the buffers queued in its channel, but the task takes it only "
                "between two buffers, and a buffer whose watermark closes windows holds the task until their "
                "results went through the slow sink (firing timers are not interrupted for a barrier, as "
                "Flink's interruptible timers, FLINK-20217, off by default, can be)"
            )
        shorter = unaligned.duration_steady_s < config.unaligned_factor * aligned.duration_steady_s
        v(
            "unaligned-shorter",
            "under backpressure unaligned checkpoints are clearly shorter than aligned ones",
            shorter,
            f"unaligned {unaligned.duration_steady_s:.2f}s vs aligned {aligned.duration_steady_s:.2f}s (median "
            f"after the warm-up; below {config.unaligned_factor:g}x)" + ("" if shorter else why),
            unaligned_s=unaligned.duration_steady_s,
            aligned_s=aligned.duration_steady_s,
            factor=config.unaligned_factor,
            unaligned_start_delay_s=unaligned.start_delay_last_s,
        )
        v(
            "unaligned-latency-not-lower",
            "unaligned checkpoints do not shorten record latency: the sink drains at its own pace in both modes",
            unaligned.latency_p50_s >= 0.7 * aligned.latency_p50_s,
            f"p50 unaligned {unaligned.latency_p50_s:.2f}s vs aligned {aligned.latency_p50_s:.2f}s (not below 70%)",
            unaligned_p50_s=unaligned.latency_p50_s,
            aligned_p50_s=aligned.latency_p50_s,
        )
    return report.build()


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.2f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.1f} KiB"


def _kind(c: CheckpointPoint) -> str:
    if c.unaligned:
        return "unaligned"
    return "aligned" if c.status == CheckpointStatus.COMPLETED.value else "-"


def _inflight(c: CheckpointPoint) -> str:
    def size(n: int | None) -> str:
        return "-" if n is None else _mib(n) if n else "0"

    return f"{size(c.inflight_bytes)} / {size(c.inflight_stored)}"


def _checkpoint_table(run: ModeRun) -> Table:
    return Table(
        f"{run.mode}: checkpoint duration over time (job {run.job_id})",
        (
            "checkpoint",
            "triggered at",
            "status",
            "kind",
            "duration",
            "max alignment",
            "max start delay (task)",
            "size",
            "in flight: reported / in storage",
        ),
        tuple(
            (
                str(c.checkpoint_id),
                f"{c.t:6.1f}s",
                c.status,
                _kind(c),
                f"{c.duration_s:.2f}s",
                f"{c.alignment_s:.2f}s",
                f"{c.start_delay_s:.2f}s ({c.slowest_task})",
                _mib(c.size_bytes),
                _inflight(c),
            )
            for c in run.checkpoints
        ),
    )


def _modes_table(config: BackpressureConfig, measured: Mapping[str, Measurement]) -> Table:
    modes = list(measured)
    rows: list[tuple[str, ...]] = []

    def row(label: str, fmt: str, attr: str) -> None:
        rows.append((label, *(fmt.format(getattr(measured[m], attr)) for m in modes)))

    row("checkpoints completed", "{:,}", "completed")
    row("checkpoints failed", "{:,}", "failed")
    row("checkpoint duration, first third (median)", "{:.2f}s", "duration_first_s")
    row("checkpoint duration, last third (median)", "{:.2f}s", "duration_last_s")
    row("checkpoint duration, after the warm-up (median)", "{:.2f}s", "duration_steady_s")
    row("checkpoint duration, max", "{:.2f}s", "duration_max_s")
    row("longest alignment", "{:.2f}s", "alignment_max_s")
    row("start delay, last third (median)", "{:.2f}s", "start_delay_last_s")
    rows.append(("in-flight bytes persisted (per checkpoint, max)", *(_inflight_summary(measured[m]) for m in modes)))
    row("record latency p50 (written - window end)", "{:.2f}s", "latency_p50_s")
    row("record latency p95", "{:.2f}s", "latency_p95_s")
    row("record latency max", "{:.2f}s", "latency_max_s")
    row("input rate (end offsets)", "{:,.0f} events/s", "input_rate")
    row("source read rate", "{:,.0f} events/s", "read_rate")
    row("sink rate (results written)", "{:,.1f} results/s", "sink_results_rate")
    row("sink rate (events those results aggregate)", "{:,.0f} events/s", "sink_events_rate")
    row("backlog growth = input - sink (formula)", "{:,.0f} events/s", "formula_growth")
    row("source lag growth (measured)", "{:,.0f} events/s", "lag_growth")
    row("source lag at the end", "{:,} events", "lag_end")
    return Table(
        f"both modes (steady part: after the first {config.warmup_fraction:.0%} of each run)", ("", *modes), tuple(rows)
    )


def _inflight_summary(m: Measurement) -> str:
    if not m.inflight_bytes:
        return "not read"
    return f"{_mib(max(m.inflight_bytes))} (median {_mib(int(statistics.median(m.inflight_bytes)))})"


# The command ----------------------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser, defaults: BackpressureConfig) -> None:
    parser.add_argument("--events-per-second", type=int, default=defaults.events_per_second)
    parser.add_argument(
        "--sink-records-per-second", type=int, default=defaults.sink_records_per_second, help="per sink subtask"
    )
    parser.add_argument("--seconds", type=float, default=defaults.run_s, help="each mode's run")
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--modes", default=",".join(MODES), help="aligned,unaligned (default both)")


def _configure(args: argparse.Namespace, defaults: BackpressureConfig) -> BackpressureConfig:
    if args.events_per_second % 1000:
        raise UsageError("--events-per-second must be a multiple of 1000")
    modes = tuple(m for m in args.modes.split(",") if m)
    if not modes or any(m not in MODES for m in modes):
        raise UsageError(f"--modes takes {', '.join(MODES)}")
    return replace(
        defaults,
        events_per_second=args.events_per_second,
        sink_records_per_second=args.sink_records_per_second,
        run_s=args.seconds,
        keys=args.keys,
        modes=modes,
    )


SCENARIO: Final = Scenario(
    name=NAME,
    title="backpressure, a slow sink, aligned then unaligned checkpoints",
    summary="a slow sink: aligned checkpoints slow down, unaligned ones do not, record latency stays",
    outcome=OUTCOME,
    defaults=BackpressureConfig(),
    arguments=_arguments,
    configure=_configure,
    jobs=lambda config: tuple(config.spec(mode) for mode in config.modes),
    drive=drive,
    check=check,
)

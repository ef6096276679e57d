"""``weir scenario barriers``: the seed's aligned checkpoint barriers, measured on a two-input job.

The driver (on the local cluster, checkpoints in the S3 bucket):

1. recreates the output topic;
2. starts two consumers of the output topic, one ``read_uncommitted`` and one ``read_committed``, each
   noting when it first saw each record (this host's clock);
3. runs examples/two_input_counts.py: two generator sources, ``orders`` (fast) and ``payments``
   (bursty: it pauses, so its barriers come late), into the keyed two-input operator ``counts``, which
   keeps per key and per input (records counted, last seq) in ValueState and sends each record,
   stamped with when it processed it, to the exactly-once Kafka sink; aligned checkpoints every few
   seconds, all retained;
4. once enough checkpoints completed, reads every completed checkpoint back from the checkpoint storage
   (the sources' positions: each input's next generator index) and, for the last few, the checkpoint's
   timeline (per subtask of ``counts`` and per input channel: when barrier N arrived, when alignment
   ended) and the keyed state of ``counts`` (the RocksDB snapshot, downloaded and scanned);
5. waits until read_committed shows the output of the last checkpoint, cancels the job.

With a gate directory (``BarriersConfig.gate``, what the tests use) the alignment holds are forced
rather than hoped for: :func:`force_holds` keeps each checkpoint's payments barrier back until the
orders source acknowledged it, plus ``forced_hold_ms``.

What must hold (the design card: "Barriers divide pre/post-checkpoint events. A multi-input operator
pauses already-barriered channels until the others catch up, then snapshots state"; "checkpoint
completion is a recovery point, not a claim that business output waited one checkpoint interval to
become visible"):

- a channel whose barrier N came first is held until the last channel's barrier N: held = alignment
  end - its barrier's arrival; no record after barrier N on a channel (seq at or above the source's
  position in checkpoint N) was processed before the alignment ended, none before it after its
  channel's barrier;
- checkpoint N's keyed state holds exactly the records before barrier N: per input the counts add up
  to the source's position, and per key and input (count, last seq) equal what the positions alone
  give (record seq of an input has key ``k{seq % keys}``; the expectation is computed from the
  positions, not from the job);
- a record is visible to read_committed only after the checkpoint that covers it (the first whose
  source position is beyond its seq) completed (the sink commits its transaction then), while
  read_uncommitted sees it a processing latency after it was created, far below the interval: the
  processing did not wait for the checkpoint, only the transactional commit did.

Times: ``created_ms`` and ``processed_ms`` are the TaskManagers' clocks, the barrier and alignment
times too, the completion time (trigger + duration) the JobManager's, the consumers' times this
process's: one host, one clock, in the local cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from rich.console import Console

from weir.connectors import kafka
from weir.core.checkpointing import CheckpointStatus
from weir.core.config import Endpoints
from weir.core.key_samples import KEY_SAMPLE_STATE
from weir.core.keygroups import KeyGroupRange, key_group_for_key
from weir.scenarios.driving import Arrival, TopicWatch, wait_until
from weir.scenarios.framework import (
    EXAMPLES,
    JobSpec,
    Report,
    ReportBuilder,
    Scenario,
    ScenarioError,
    Table,
    UsageError,
    distribution,
    percentile,
)
from weir.tools.client import CheckpointInfo, JobManagerClient
from weir.tools.drive import wait_for_job
from weir.tools.savepoint_inspect import LoadedSavepoint, decode_operator_state, dump_operator, load_savepoint

NAME: Final = "barriers"
JOB_FILE: Final = EXAMPLES / "two_input_counts.py"
INPUTS: Final = ("orders", "payments")  # the job's source uids, its ValueState names and the records' "input"
OPERATOR_UID: Final = "counts"
OUTCOME: Final = (
    "Barriers divide pre/post-checkpoint events. A multi-input operator pauses already-barriered channels "
    "until the others catch up, then snapshots state. Checkpoint completion is a recovery point, not a claim "
    "that business output waited one checkpoint interval to become visible."
)
CLOCK_TOLERANCE_S: Final = 0.005  # the JobManager's durations are rounded to the millisecond


@dataclass(frozen=True)
class BarriersConfig:
    keys: int = 20
    orders_rate: int = 1_000  # records/s
    payments_rate: int = 50
    # The payments source stops this long every payments_pause_every records (7/8 of its 400 ms budget
    # at 50/s): most triggers find it paused, so its barriers come up to that much later than orders'.
    payments_pause_ms: int = 350
    payments_pause_every: int = 20
    parallelism: int = 2  # of the two-input operator (and its chained sink)
    partitions: int = 2
    # Not a multiple of the payments source's 400 ms cycle (20 records at 50/s, paced from its start):
    # with a multiple, every trigger found the source at the same phase of its cycle, all of them
    # paused or none, and a run could show no hold at all (it did, under load).
    checkpoint_interval_s: float = 3.1
    checkpoints: int = 6  # run until this many completed
    inspected: int = 3  # the last ones: keyed state read back (every completed checkpoint's timeline is)
    min_hold_ms: float = 20.0  # some channel must be held this long, or the run did not exercise alignment
    sink_topic: str = "barriers-output"
    timeout_s: float = 180.0
    # Forced holds instead of hoped-for ones: with a gate directory (on the TaskManagers' host), each
    # checkpoint's payments barrier is held back until the orders source acknowledged it, plus
    # forced_hold_ms (see force_holds); payments_pause_ms can then be 0.
    gate: Path | None = None
    forced_hold_ms: float = 150.0

    def parameters(self) -> dict[str, str]:
        return {
            "keys": str(self.keys),
            "orders.rate": str(self.orders_rate),
            "payments.rate": str(self.payments_rate),
            "payments.pause_ms": str(self.payments_pause_ms),
            "payments.pause_every": str(self.payments_pause_every),
            "sink.topic": self.sink_topic,
            "checkpointing.interval": f"{round(self.checkpoint_interval_s * 1000)}ms",
            "checkpointing.retained": "1000",  # every checkpoint stays readable
            "restart.strategy": "none",  # a restart would replay: this scenario is about one clean run
        } | ({"payments.gate": str(self.gate)} if self.gate is not None else {})

    def spec(self) -> JobSpec:
        return JobSpec(JOB_FILE, self.parameters(), self.parallelism)


# What was measured -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointCut:
    """A completed checkpoint and where it cut each input: the source's next index (records before it
    are before barrier N)."""

    checkpoint_id: int
    trigger_time: float
    completed_at: float  # trigger + duration (JobManager clock)
    positions: Mapping[str, int]

    def before(self, input_name: str, seq: int) -> bool:
        return seq < self.positions.get(input_name, 0)


@dataclass(frozen=True)
class ChannelBarrier:
    """When barrier N reached one input channel of a subtask of the two-input operator."""

    channel: int
    upstream: str  # e.g. "orders#0"
    input_name: str  # the upstream vertex: which input
    barrier_at: float | None  # None: the channel ended first


@dataclass(frozen=True)
class SubtaskAlignment:
    subtask: int
    key_groups: KeyGroupRange
    channels: tuple[ChannelBarrier, ...]
    first_barrier_at: float
    alignment_end_at: float
    sync_end_at: float

    def held_s(self, channel: ChannelBarrier) -> float | None:
        """How long the channel was held: from its barrier until the alignment ended."""
        return None if channel.barrier_at is None else self.alignment_end_at - channel.barrier_at


@dataclass(frozen=True)
class InspectedCheckpoint:
    cut: CheckpointCut
    subtasks: tuple[SubtaskAlignment, ...]
    state: Mapping[tuple[str, str], tuple[int, int]] | None  # (key, input) -> (count, last seq); None: not read
    max_parallelism: int
    unaligned: bool = False

    def subtask_of(self, key: str) -> SubtaskAlignment | None:
        group = key_group_for_key(key, self.max_parallelism)
        for s in self.subtasks:
            if group in s.key_groups:
                return s
        return None


@dataclass(frozen=True)
class OutputRecord:
    """One record of the output topic, with when each consumer first saw it (epoch s; None: never)."""

    input_name: str
    seq: int
    key: str
    created_s: float
    processed_s: float
    uncommitted_at: float | None
    committed_at: float | None


# The expectation and the checks (pure) ------------------------------------------------------------


def expected_state(positions: Mapping[str, int], keys: int) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (key, input) the (count, last seq) of the records before the cut: record ``seq`` of an input
    has key ``k{seq % keys}``, and an input's records before the cut are seq 0..position-1."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for input_name, position in positions.items():
        for j in range(min(keys, position)):
            count = (position - j + keys - 1) // keys
            out[(f"k{j}", input_name)] = (count, j + (count - 1) * keys)
    return out


@dataclass(frozen=True)
class StateComparison:
    checkpoint_id: int
    totals: Mapping[str, int]  # input -> sum of the counts in the snapshot
    positions: Mapping[str, int]
    compared: int  # (key, input) entries expected
    mismatched: tuple[str, ...]

    @property
    def totals_match(self) -> bool:
        return all(self.totals.get(i, 0) == self.positions.get(i, 0) for i in set(self.totals) | set(self.positions))


def compare_state(inspected: InspectedCheckpoint, keys: int) -> StateComparison:
    expected = expected_state(inspected.cut.positions, keys)
    found = inspected.state or {}
    mismatched = [
        f"{key}/{name}: snapshot {found.get((key, name))}, expected {want}"
        for (key, name), want in sorted(expected.items())
        if found.get((key, name)) != want
    ]
    mismatched += [
        f"{key}/{name}: snapshot {v}, expected none" for (key, name), v in found.items() if (key, name) not in expected
    ]
    totals: dict[str, int] = defaultdict(int)
    for (_key, name), (count, _last) in found.items():
        totals[name] += count
    return StateComparison(
        inspected.cut.checkpoint_id, dict(totals), dict(inspected.cut.positions), len(expected), tuple(mismatched)
    )


@dataclass(frozen=True)
class HoldCheck:
    """Records processed on each side of barrier N at a subtask of the two-input operator."""

    checked: int  # (record, inspected checkpoint) pairs
    violations: tuple[str, ...]
    # waits (processed - created, s) of the records after barrier N on a held channel, created before the
    # alignment ended: they were held back (in the channel, or behind it in the sender's buffers)
    held: tuple[float, ...]
    held_by_channel: Mapping[tuple[int, int, str], int] = field(default_factory=dict)  # (checkpoint, subtask, input)

    @property
    def held_records(self) -> int:
        return len(self.held)


def check_holds(inspected: Sequence[InspectedCheckpoint], records: Iterable[OutputRecord]) -> HoldCheck:
    """No record after barrier N on its channel processed before the alignment ended; no record
    before barrier N processed after its channel's barrier arrived."""
    checked = 0
    violations: list[str] = []
    held: list[float] = []
    held_by_channel: dict[tuple[int, int, str], int] = defaultdict(int)
    records = list(records)
    for cp in inspected:
        for r in records:
            subtask = cp.subtask_of(r.key)
            if subtask is None:
                continue
            channel = next((c for c in subtask.channels if c.input_name == r.input_name), None)
            if channel is None or channel.barrier_at is None:
                continue
            checked += 1
            where = f"checkpoint {cp.cut.checkpoint_id} {OPERATOR_UID}#{subtask.subtask}: {r.input_name} seq {r.seq}"
            if cp.cut.before(r.input_name, r.seq):
                if r.processed_s > channel.barrier_at + CLOCK_TOLERANCE_S:
                    late = (r.processed_s - channel.barrier_at) * 1000
                    violations.append(f"{where} is before the barrier but was processed {late:.1f} ms after it")
            else:
                if r.processed_s < subtask.alignment_end_at - CLOCK_TOLERANCE_S:
                    early = (subtask.alignment_end_at - r.processed_s) * 1000
                    violations.append(
                        f"{where} is after the barrier but was processed {early:.1f} ms before the alignment ended"
                    )
                elif (
                    subtask.alignment_end_at - channel.barrier_at > CLOCK_TOLERANCE_S  # the channel was held
                    and r.created_s < subtask.alignment_end_at
                    and r.seq < _next_position(cp, r.input_name, inspected)
                ):
                    held.append(r.processed_s - r.created_s)
                    held_by_channel[(cp.cut.checkpoint_id, subtask.subtask, r.input_name)] += 1
    return HoldCheck(checked, tuple(violations), tuple(held), dict(held_by_channel))


def _next_position(cp: InspectedCheckpoint, input_name: str, inspected: Sequence[InspectedCheckpoint]) -> int:
    """The cut of the next inspected checkpoint (a record is counted as held once, at the first barrier after it)."""
    later = [c.cut.positions.get(input_name, 0) for c in inspected if c.cut.checkpoint_id > cp.cut.checkpoint_id]
    return min(later, default=sys.maxsize)


def covering(cuts: Sequence[CheckpointCut], input_name: str, seq: int) -> CheckpointCut | None:
    """The first completed checkpoint whose cut the record is before: its output commits with it."""
    for cut in sorted(cuts, key=lambda c: c.checkpoint_id):
        if cut.before(input_name, seq):
            return cut
    return None


@dataclass(frozen=True)
class Visibility:
    covered: int  # records before the last cut
    uncommitted_latency_s: tuple[float, ...]  # read_uncommitted first seen - created
    committed_latency_s: tuple[float, ...]  # read_committed first seen - created
    after_completion_s: tuple[float, ...]  # read_committed first seen - its checkpoint's completion
    committed_early: tuple[str, ...]  # seen by read_committed before its checkpoint completed
    uncommitted_before_completion: int  # seen by read_uncommitted before its checkpoint completed
    missing_committed: int  # before the last cut, never seen by read_committed
    duplicates_committed: int

    @property
    def share_uncommitted_before_completion(self) -> float:
        return self.uncommitted_before_completion / self.covered if self.covered else 0.0


def measure_visibility(
    cuts: Sequence[CheckpointCut], records: Iterable[OutputRecord], duplicates_committed: int = 0
) -> Visibility:
    by_id = sorted(cuts, key=lambda c: c.checkpoint_id)
    uncommitted: list[float] = []
    committed: list[float] = []
    after: list[float] = []
    early: list[str] = []
    before_completion = missing = covered = 0
    for r in records:
        cut = covering(by_id, r.input_name, r.seq)
        if cut is None:
            continue
        covered += 1
        if r.uncommitted_at is not None:
            uncommitted.append(r.uncommitted_at - r.created_s)
            before_completion += r.uncommitted_at < cut.completed_at
        if r.committed_at is None:
            missing += 1
            continue
        committed.append(r.committed_at - r.created_s)
        after.append(r.committed_at - cut.completed_at)
        if r.committed_at < cut.completed_at - CLOCK_TOLERANCE_S:
            early.append(
                f"{r.input_name} seq {r.seq} seen by read_committed "
                f"{(cut.completed_at - r.committed_at) * 1000:.0f} ms before checkpoint {cut.checkpoint_id} completed"
            )
    return Visibility(
        covered, tuple(uncommitted), tuple(committed), tuple(after), tuple(early), before_completion, missing,
        duplicates_committed,
    )  # fmt: skip


def records_expected(cuts: Sequence[CheckpointCut]) -> int:
    """Records before the last cut, all inputs."""
    if not cuts:
        return 0
    last = max(cuts, key=lambda c: c.checkpoint_id)
    return sum(last.positions.values())


# Reading the checkpoints back ----------------------------------------------------------------------


def read_cut(info: CheckpointInfo, endpoints: Endpoints | None = None) -> tuple[CheckpointCut, LoadedSavepoint]:
    """A retained checkpoint's source positions, read from the checkpoint storage with the decoders a restore uses."""
    loaded = load_savepoint(info.external_path, endpoints)
    positions: dict[str, int] = {}
    for task in loaded.tasks:
        for name in INPUTS:
            if name in task.operator_states:
                decoded = decode_operator_state(task.operator_states[name])
                if decoded.get("kind") != "generator-source":
                    raise ScenarioError(f"checkpoint {info.checkpoint_id}: source {name!r} state is {decoded}")
                positions[name] = positions.get(name, 0) + int(decoded["next_k"])
    if set(positions) != set(INPUTS):
        raise ScenarioError(f"checkpoint {info.checkpoint_id} ({info.external_path}) lacks a source's position")
    completed_at = info.trigger_time + info.duration_s
    return CheckpointCut(int(info.checkpoint_id), info.trigger_time, completed_at, positions), loaded


def read_keyed_state(path: str, endpoints: Endpoints | None = None) -> dict[tuple[str, str], tuple[int, int]]:
    """The two-input operator's ValueStates in the checkpoint's RocksDB snapshots: (key, input) -> (count, last seq)."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for line in dump_operator(path, OPERATOR_UID, endpoints=endpoints):
        if line.get("state") == KEY_SAMPLE_STATE:
            continue  # the records the operator keyed, sampled for weir upgrade check (weir.core.key_samples)
        if line.get("state") not in INPUTS or "value" not in line:
            raise ScenarioError(f"{path}: unexpected keyed entry of {OPERATOR_UID!r}: {line}")
        count, last = line["value"]
        out[(str(line["key"]), str(line["state"]))] = (int(count), int(last))
    return out


def inspect_checkpoint(
    client: JobManagerClient,
    job_id: str,
    cut: CheckpointCut,
    loaded: LoadedSavepoint,
    endpoints: Endpoints,
    *,
    keyed_state: bool,
) -> InspectedCheckpoint:
    """The checkpoint's timeline per subtask of the two-input operator, and (``keyed_state``) its keyed state."""
    detail = client.checkpoint_detail(job_id, cut.checkpoint_id)
    ranges = {
        int(t.document.subtask): (t.document.key_group_range, t.document.layout.max_parallelism)
        for t in loaded.tasks
        if t.document.vertex_uid == OPERATOR_UID
    }
    subtasks: list[SubtaskAlignment] = []
    max_parallelism = 128
    for task in detail.checkpoint.tasks:
        if task.vertex_uid != OPERATOR_UID:
            continue
        if task.timeline is None or int(task.subtask) not in ranges:
            raise ScenarioError(f"checkpoint {cut.checkpoint_id}: no timeline or state of {task.name}")
        key_groups, max_parallelism = ranges[int(task.subtask)]
        t = task.timeline
        subtasks.append(
            SubtaskAlignment(
                subtask=int(task.subtask),
                key_groups=key_groups,
                channels=tuple(
                    ChannelBarrier(
                        c.channel, f"{c.upstream_vertex}#{c.upstream_subtask}", c.upstream_vertex, c.barrier_at
                    )
                    for c in t.channels
                ),
                first_barrier_at=t.first_barrier_at,
                alignment_end_at=t.alignment_end_at,
                sync_end_at=t.sync_end_at,
            )
        )
    return InspectedCheckpoint(
        cut,
        tuple(sorted(subtasks, key=lambda s: s.subtask)),
        read_keyed_state(loaded.path, endpoints) if keyed_state else None,
        max_parallelism,
        unaligned=detail.checkpoint.unaligned,
    )


# The consumers' records (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What one consumer of the output topic saw: when it first saw each (input, seq), the record
    itself, and how many records it saw again (another offset with the same input and seq)."""

    first_seen: Mapping[tuple[str, int], float]
    records: Mapping[tuple[str, int], Mapping[str, Any]]
    duplicates: int


def seen(arrivals: Iterable[Arrival]) -> Seen:
    first: dict[tuple[str, int], float] = {}
    records: dict[tuple[str, int], Mapping[str, Any]] = {}
    duplicates = 0
    for a in arrivals:
        try:
            record = json.loads(a.value or b"")
            key = (str(record["input"]), int(record["seq"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ScenarioError(
                f"{a.topic} partition {a.partition} offset {a.offset} is no counts record: {exc}"
            ) from exc
        if key in first:
            duplicates += 1
            continue
        first[key] = a.at
        records[key] = record
    return Seen(first, records, duplicates)


def join_records(uncommitted: Seen, committed: Seen) -> tuple[OutputRecord, ...]:
    """Each record of the output topic with when each consumer first saw it."""
    out: list[OutputRecord] = []
    for key in uncommitted.records.keys() | committed.records.keys():
        r = uncommitted.records.get(key) or committed.records[key]
        out.append(
            OutputRecord(
                input_name=key[0],
                seq=key[1],
                key=str(r["key"]),
                created_s=float(r["created_ms"]) / 1000,
                processed_s=float(r["processed_ms"]) / 1000,
                uncommitted_at=uncommitted.first_seen.get(key),
                committed_at=committed.first_seen.get(key),
            )
        )
    return tuple(sorted(out, key=lambda r: (r.input_name, r.seq)))


# The driver ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BarriersRun:
    """Everything one run measured, for the checks and the tests."""

    job_id: str = ""
    restarts: int = 0
    checkpoints: tuple[CheckpointInfo, ...] = ()
    cuts: tuple[CheckpointCut, ...] = ()
    inspected: tuple[InspectedCheckpoint, ...] = ()
    records: tuple[OutputRecord, ...] = ()
    committed_duplicates: int = 0
    steps: tuple[str, ...] = ()


def drive(endpoints: Endpoints, config: BarriersConfig, console: Console) -> BarriersRun:
    """The job on the cluster already up, measured (steps 1 to 5 of the module's docstring)."""
    kafka.create_topics(endpoints, {config.sink_topic: config.partitions}, replace=True)
    stamp = time.time_ns()
    watchers = tuple(
        TopicWatch(endpoints, level, (config.sink_topic,), config.partitions, f"weir-scenario-barriers-{level}-{stamp}")
        for level in ("read_uncommitted", "read_committed")
    )
    uncommitted, committed = watchers
    started: list[TopicWatch] = []
    spec = config.spec()
    try:
        for watcher in watchers:
            watcher.start()
            started.append(watcher)
            watcher.wait_ready(30.0)
        with JobManagerClient(endpoints.jobmanager_address) as client:
            job_id = spec.submit(client)
            console.print(f"job {job_id} submitted: {spec.command()}", soft_wrap=True, highlight=False)
            try:
                run = _measure(client, endpoints, config, job_id, committed, console)
            finally:
                client.cancel_job(job_id)
                wait_for_job(client, job_id, lambda s: s.summary.is_terminal, 60.0, "its end after cancel")
    finally:
        for watcher in started:
            watcher.stop()
    committed_seen = seen(committed.arrivals())
    return replace(
        run,
        records=join_records(seen(uncommitted.arrivals()), committed_seen),
        committed_duplicates=committed_seen.duplicates,
        steps=(
            f"ran {spec.command()} (job {job_id}): orders at {config.orders_rate:,}/s and payments at "
            f"{config.payments_rate:,}/s (pausing {config.payments_pause_ms} ms every {config.payments_pause_every} "
            f"records) into the keyed two-input operator {OPERATOR_UID!r}, aligned checkpoints every "
            f"{config.checkpoint_interval_s:g}s, exactly-once Kafka sink on {config.sink_topic!r}"
            + (f"; payments barrier held back {config.forced_hold_ms:g} ms at a gate" if config.gate else ""),
            "watched the output topic with a read_uncommitted and a read_committed consumer, each noting when it "
            "first saw each record (created_ms, processed_ms and the barrier times are the TaskManagers' clocks, "
            "completion the JobManager's, first seen this process's: one host, one clock)",
            f"read {len(run.cuts)} completed checkpoints back: each one's source positions (checkpoint storage) and "
            f"timeline per channel of {OPERATOR_UID!r} (weir checkpoints --detail), and for checkpoints "
            f"{', '.join(str(cp.cut.checkpoint_id) for cp in run.inspected if cp.state is not None)} the keyed "
            f"state of {OPERATOR_UID!r} (RocksDB snapshots downloaded and scanned)",
        ),
    )


def _measure(
    client: JobManagerClient,
    endpoints: Endpoints,
    config: BarriersConfig,
    job_id: str,
    committed: TopicWatch,
    console: Console,
) -> BarriersRun:
    if config.gate is not None:
        force_holds(client, job_id, config.gate, config, console)
    status = wait_for_job(
        client,
        job_id,
        lambda s: (s.last_completed_checkpoint or 0) >= config.checkpoints,
        config.timeout_s,
        f"checkpoint {config.checkpoints} completed",
    )
    checkpoints = tuple(sorted(client.list_checkpoints(job_id), key=lambda c: c.checkpoint_id))
    done = [c for c in checkpoints if c.status is CheckpointStatus.COMPLETED and c.external_path]
    console.print(f"{len(done)} checkpoints completed; reading them back from the checkpoint storage")
    read = [read_cut(c, endpoints) for c in done]
    cuts = tuple(cut for cut, _ in read)
    with_state = {cut.checkpoint_id for cut, _ in read[-config.inspected :]}
    inspected = tuple(
        inspect_checkpoint(client, job_id, cut, loaded, endpoints, keyed_state=cut.checkpoint_id in with_state)
        for cut, loaded in read
    )
    want = records_expected(cuts)
    # the last checkpoint's output committed and read back (a record seen twice counts: a duplicate
    # fails the check on read_committed's output, it does not hang the wait)
    wait_until(
        lambda: committed.count() >= want,
        config.timeout_s,
        f"read_committed to show the {want:,} checkpointed records",
        0.1,
    )
    return BarriersRun(job_id, status.summary.restarts, checkpoints, cuts, inspected)


def force_holds(client: JobManagerClient, job_id: str, gate: Path, config: BarriersConfig, console: Console) -> None:
    """Until ``config.checkpoints`` completed: close the payments source's gate, wait until it waits
    and a checkpoint is pending on it alone of the sources (the orders source acknowledged, so its
    barrier is on its way to the two-input operator), keep the gate closed ``forced_hold_ms`` more,
    open it. Every such checkpoint's orders channels are held at least that long less the orders
    barrier's transit, so the run exercises alignment by construction, not by the timing of triggers."""
    closed, waiting = gate / "closed", gate / "waiting"
    deadline = time.monotonic() + config.timeout_s
    completed = 0

    def poll(what: str) -> None:
        if time.monotonic() > deadline:
            closed.unlink(missing_ok=True)
            raise ScenarioError(f"forcing alignment holds: timed out waiting for {what}")
        time.sleep(0.005)

    while completed < config.checkpoints:
        waiting.unlink(missing_ok=True)
        closed.touch()
        try:
            while not waiting.exists():
                poll("the payments source to wait at its gate")
            held = None
            while held is None:
                for info in client.list_checkpoints(job_id):
                    if info.status is not CheckpointStatus.IN_PROGRESS:
                        continue
                    pending = set(client.checkpoint_detail(job_id, info.checkpoint_id).pending)
                    if (INPUTS[1], 0) in pending and (INPUTS[0], 0) not in pending:
                        held = info.checkpoint_id
                        break
                else:
                    poll("a checkpoint the orders source acknowledged while payments waits")
            time.sleep(config.forced_hold_ms / 1000)  # the hold itself, not a wait for a condition
        finally:
            closed.unlink(missing_ok=True)
        console.print(f"checkpoint {held}: payments barrier held back {config.forced_hold_ms:g} ms after orders acked")
        while True:
            status = client.job_status(job_id)
            if status.summary.is_terminal:
                raise ScenarioError(f"the job ended {status.summary.status} while alignment holds were forced")
            if (status.last_completed_checkpoint or 0) >= held:
                completed = status.last_completed_checkpoint or 0
                break
            poll(f"checkpoint {held} to complete")


# The checks ---------------------------------------------------------------------------------------------


def check(config: BarriersConfig, run: BarriersRun) -> Report:
    """The card's outcome as checked statements, from what the run measured."""
    report = ReportBuilder(NAME, OUTCOME)
    for text in run.steps:
        report.step(text)
    hold = check_holds(run.inspected, run.records)
    states = tuple(compare_state(cp, config.keys) for cp in run.inspected if cp.state is not None)
    report.table(barrier_table(run, hold))
    report.table(state_table(states))

    completed = [c for c in run.checkpoints if c.status is CheckpointStatus.COMPLETED]
    failed = [c for c in run.checkpoints if c.status is CheckpointStatus.FAILED]
    unaligned = sum(c.unaligned for c in run.checkpoints)
    report.verify(
        "clean-run",
        "the job ran cleanly: the checkpoints completed, aligned, no restart (no replay)",
        len(completed) >= config.checkpoints and not failed and run.restarts == 0 and not unaligned,
        f"{len(completed)} completed (wanted {config.checkpoints}), {len(failed)} failed, "
        f"{unaligned} unaligned, {run.restarts} restarts",
        completed=len(completed),
        wanted=config.checkpoints,
        failed=len(failed),
        unaligned=unaligned,
        restarts=run.restarts,
    )

    # barriers per channel, holds
    holds = [h for cp in run.inspected for s in cp.subtasks for c in s.channels if (h := s.held_s(c)) is not None]
    incomplete = [
        f"{cp.cut.checkpoint_id}/{OPERATOR_UID}#{s.subtask}"
        for cp in run.inspected
        for s in cp.subtasks
        if {c.input_name for c in s.channels if c.barrier_at is not None} != set(INPUTS)
        or any(c.barrier_at is not None and c.barrier_at > s.alignment_end_at + CLOCK_TOLERANCE_S for c in s.channels)
    ]
    subtasks = sum(len(cp.subtasks) for cp in run.inspected)
    report.verify(
        "barriers-on-every-channel",
        "every subtask of the two-input operator got barrier N on a channel of each input, "
        "all before its alignment ended",
        bool(run.inspected) and subtasks == len(run.inspected) * config.parallelism and not incomplete,
        f"{subtasks} subtask timelines of {len(run.inspected)} checkpoints; "
        f"incomplete: {', '.join(incomplete) or 'none'}",
        subtask_timelines=subtasks,
        checkpoints=len(run.inspected),
        incomplete=tuple(incomplete),
    )
    longest = max(holds, default=0.0) * 1000
    report.measured("longest hold of an already-barriered channel", f"{longest:,.0f} ms")
    report.measured(
        "records held: after barrier N on a held channel, created before the alignment ended; processed - created",
        f"{hold.held_records:,} records; {distribution(hold.held)}",
    )
    report.verify(
        "alignment-exercised",
        "the run exercised alignment: a channel was held waiting for the other input's barrier, records behind it",
        longest >= config.min_hold_ms and hold.held_records > 0,
        f"longest hold {longest:,.0f} ms (at least {config.min_hold_ms:g}), {hold.held_records:,} records held",
        longest_hold_ms=longest,
        min_hold_ms=config.min_hold_ms,
        held_records=hold.held_records,
    )
    report.verify(
        "barriers-divide-events",
        "barriers divide the events: no post-barrier record processed before the alignment ended, "
        "no pre-barrier record after its channel's barrier",
        hold.checked > 0 and not hold.violations,
        f"{len(hold.violations):,} violations of {hold.checked:,} (record, checkpoint) pairs"
        + (f"; e.g. {hold.violations[0]}" if hold.violations else ""),
        violations=len(hold.violations),
        checked=hold.checked,
    )

    # the snapshot
    totals_off = [s for s in states if not s.totals_match]
    report.verify(
        "snapshot-totals",
        "the snapshot holds exactly the pre-barrier records: per input the counts in keyed state add up to "
        "the source position",
        bool(states) and not totals_off,
        "; ".join(
            f"chk {s.checkpoint_id}: "
            + ", ".join(f"{i} {s.totals.get(i, 0):,} = {s.positions.get(i, 0):,}" for i in INPUTS)
            for s in states
        ),
        checkpoints=tuple(
            {
                "checkpoint": s.checkpoint_id,
                **{f"{i}_counted": s.totals.get(i, 0) for i in INPUTS},
                **{f"{i}_position": s.positions.get(i, 0) for i in INPUTS},
            }
            for s in states
        ),
    )
    mismatched = [m for s in states for m in s.mismatched]
    compared = sum(s.compared for s in states)
    report.verify(
        "snapshot-per-key",
        "per key and input, (count, last seq) in the snapshot = the last pre-barrier record's, "
        "computed from the positions",
        compared > 0 and not mismatched,
        f"{len(mismatched):,} mismatched of {compared:,}" + (f"; e.g. {mismatched[0]}" if mismatched else ""),
        mismatched=len(mismatched),
        compared=compared,
    )

    # visibility
    v = measure_visibility(run.cuts, run.records, run.committed_duplicates)
    interval_ms = config.checkpoint_interval_s * 1000
    report.measured(
        "checkpoint completion (trigger -> metadata written)",
        distribution([c.duration_s for c in completed]) + f", interval {interval_ms:,.0f} ms",
    )
    if run.cuts:
        start = min(c.trigger_time for c in run.cuts)
        report.measured(
            "checkpoints: triggered -> completed (s after the first trigger)",
            ", ".join(
                f"{c.checkpoint_id}: {c.trigger_time - start:.2f} -> {c.completed_at - start:.2f}"
                for c in sorted(run.cuts, key=lambda c: c.checkpoint_id)
            ),
        )
    report.measured(
        "read_uncommitted visibility: first seen - created (processing latency)", distribution(v.uncommitted_latency_s)
    )
    report.measured("read_committed visibility: first seen - created", distribution(v.committed_latency_s))
    report.measured(
        "read_committed visibility: first seen - its checkpoint's completion (the commit)",
        distribution(v.after_completion_s),
    )
    expected = records_expected(run.cuts)
    report.verify(
        "committed-exactly-once",
        "read_committed holds each checkpointed record exactly once",
        v.covered > 0 and v.covered == expected and v.missing_committed == 0 and v.duplicates_committed == 0,
        f"{v.covered:,} records before the last cut (positions say {expected:,}): "
        f"{v.missing_committed:,} missing, {v.duplicates_committed:,} duplicates",
        covered=v.covered,
        expected=expected,
        missing=v.missing_committed,
        duplicates=v.duplicates_committed,
    )
    report.verify(
        "committed-after-completion",
        "completion is the recovery point the commit waits for: no record visible to read_committed before the "
        "checkpoint covering it completed",
        len(v.committed_latency_s) > 0 and not v.committed_early,
        f"{len(v.committed_early):,} early of {len(v.committed_latency_s):,}"
        + (f"; e.g. {v.committed_early[0]}" if v.committed_early else ""),
        early=len(v.committed_early),
        committed=len(v.committed_latency_s),
        min_after_completion_s=min(v.after_completion_s, default=None),
    )
    p50 = percentile(v.uncommitted_latency_s, 0.5) if v.uncommitted_latency_s else float("inf")
    p95 = percentile(v.uncommitted_latency_s, 0.95) if v.uncommitted_latency_s else float("inf")
    report.verify(
        "processing-did-not-wait",
        "processing did not wait for the checkpoint: read_uncommitted sees a record far below one interval "
        "after it was created (alignment holds included)",
        p95 * 1000 < interval_ms / 2,
        f"p95 {p95 * 1000:,.0f} ms < {interval_ms / 2:,.0f} ms (half the interval)",
        uncommitted_p50_s=p50,
        uncommitted_p95_s=p95,
        committed_p50_s=percentile(v.committed_latency_s, 0.5) if v.committed_latency_s else None,
        half_interval_s=interval_ms / 2000,
    )
    share = v.share_uncommitted_before_completion
    report.verify(
        "uncommitted-before-completion",
        "output was visible (uncommitted) before its checkpoint completed: only the commit waited for completion",
        share >= 0.9,
        f"{share:.1%} of {v.covered:,} records seen by read_uncommitted before their checkpoint completed "
        "(at least 90%)",
        share=share,
        covered=v.covered,
    )
    return report.build()


def _ms_after(at: float | None, trigger: float) -> str:
    return "-" if at is None else f"{(at - trigger) * 1000:,.0f}"


def barrier_table(run: BarriersRun, hold: HoldCheck) -> Table:
    rows: list[tuple[str, ...]] = []
    for cp in run.inspected:
        trigger = cp.cut.trigger_time
        for s in cp.subtasks:
            for n, c in enumerate(sorted(s.channels, key=lambda c: c.barrier_at or 0.0)):
                held = s.held_s(c)
                rows.append(
                    (
                        str(cp.cut.checkpoint_id) if n == 0 else "",
                        f"{OPERATOR_UID}#{s.subtask}" if n == 0 else "",
                        f"{c.channel} ({c.upstream})",
                        _ms_after(c.barrier_at, trigger),
                        "-" if held is None else f"{held * 1000:,.1f}",
                        f"{hold.held_by_channel.get((cp.cut.checkpoint_id, s.subtask, c.input_name), 0):,}",
                        _ms_after(s.alignment_end_at, trigger) if n == 0 else "",
                        _ms_after(s.sync_end_at, trigger) if n == 0 else "",
                    )
                )
    return Table(
        f"barriers per channel of {OPERATOR_UID!r} (TaskManager clock; held = alignment end - barrier)",
        (
            "checkpoint",
            "subtask",
            "channel (upstream)",
            "barrier arrived (ms after trigger)",
            "held until alignment end (ms)",
            "records held (after the barrier, created before the alignment end)",
            "alignment end (ms)",
            "snapshot done (ms)",
        ),
        tuple(rows),
    )


def state_table(states: Sequence[StateComparison]) -> Table:
    return Table(
        "the snapshot against the source positions",
        (
            "checkpoint",
            *(f"{i}: source position" for i in INPUTS),
            *(f"{i}: Σ counts in state" for i in INPUTS),
            "(key, input) entries = expected",
        ),
        tuple(
            (
                str(s.checkpoint_id),
                *(f"{s.positions.get(i, 0):,}" for i in INPUTS),
                *(f"{s.totals.get(i, 0):,}" for i in INPUTS),
                f"{s.compared - len(s.mismatched):,} of {s.compared:,}",
            )
            for s in states
        ),
    )


# The command ----------------------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser, defaults: BarriersConfig) -> None:
    parser.add_argument("--checkpoint-interval", type=float, default=defaults.checkpoint_interval_s, help="seconds")
    parser.add_argument("--checkpoints", type=int, default=defaults.checkpoints, help="run until this many completed")
    parser.add_argument(
        "--inspected", type=int, default=defaults.inspected, help="the last checkpoints whose keyed state is read"
    )
    parser.add_argument("--orders-rate", type=int, default=defaults.orders_rate)
    parser.add_argument("--payments-rate", type=int, default=defaults.payments_rate)
    parser.add_argument("--payments-pause-ms", type=int, default=defaults.payments_pause_ms)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--small", action="store_true", help="a short run: 2.3s interval, 4 checkpoints, 2 inspected")


def _configure(args: argparse.Namespace, defaults: BarriersConfig) -> BarriersConfig:
    config = replace(
        defaults,
        checkpoint_interval_s=2.3 if args.small else args.checkpoint_interval,
        checkpoints=4 if args.small else args.checkpoints,
        inspected=2 if args.small else args.inspected,
        orders_rate=args.orders_rate,
        payments_rate=args.payments_rate,
        payments_pause_ms=args.payments_pause_ms,
        keys=args.keys,
    )
    if config.inspected < 1 or config.inspected > config.checkpoints:
        raise UsageError("--inspected must be between 1 and --checkpoints")
    return config


SCENARIO: Final = Scenario(
    name=NAME,
    title="aligned checkpoint barriers on a two-input job",
    summary="a two-input job: per channel when barrier N arrived and how long it was held; the snapshot holds "
    "exactly the pre-barrier records; completion is a recovery point, not when output became visible",
    outcome=OUTCOME,
    defaults=BarriersConfig(),
    arguments=_arguments,
    configure=_configure,
    jobs=lambda config: (config.spec(),),
    drive=drive,
    check=check,
)

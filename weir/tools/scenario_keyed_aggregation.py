"""``weir scenario keyed-aggregation``: the seed's stateful keyed aggregation, its state and both sinks
checked against a reference computed from the input.

1. recreates the topics ``keyed-events`` (6 partitions), ``keyed-results``, ``keyed-dlq`` and the table
   ``keyed_results``;
2. runs examples/keyed_aggregation.py (keyed tumbling event-time windows, ``(count, sum)`` per key and
   window, a transactional Kafka sink and a two-phase-commit PostgreSQL sink) unbounded, a checkpoint
   every second, while the events are produced at a steady pace as live input, every
   ``--malformed-every``-th of them malformed (not JSON: the source dead-letters it);
3. once the windows have taken in every well-formed event and a checkpoint completed after that, stops
   the job with a savepoint (what ``weir stop JOB --savepoint-path DIR`` does): the windows the watermark
   closed have fired and are committed in both sinks, the others are still open, in the savepoint's
   keyed state;
4. reads the input back and computes, with a function of its own (not the job's code), each
   ``(key, window)``'s count and sum; the savepoint says each window subtask's watermark: a window whose
   last millisecond its subtask's watermark reached has fired, the others are open.

The outcome (the design card: "exactly-once means each logical event affects managed state once"):
both sinks hold exactly the fired windows with the reference's values (read_committed; no duplicate,
none missing, none unexpected, none mismatched), the savepoint's keyed state of ``window-count-sum``
holds exactly the open windows with the reference's accumulators, each sink and the state together
cover every window of the input once, so every well-formed event is counted exactly once; the
malformed events are in the dead-letter topic, once each; ``weir verify``'s own comparison (reference
mode, the job's code) and each sink's commit proof agree, with nothing prepared or open.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from weir.connectors import kafka, postgres
from weir.core.checkpointing import CheckpointStatus
from weir.core.config import Endpoints
from weir.core.errors import WeirError
from weir.core.keygroups import key_group_for_key
from weir.core.states import JobStatus
from weir.core.windows import window_start
from weir.operators.transactional_sinks import CommitMarker, marker_topic_name
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.drive import recreate_inputs, wait_for_job
from weir.tools.events import EventSpec, produce_events
from weir.tools.savepoint_inspect import WINDOW_STATE_NAME, dump_operator
from weir.tools.scenario_report import ScenarioReport, run_on_local_cluster
from weir.tools.scenario_upgrade import SavepointCut, read_savepoint
from weir.tools.verify import COMMIT_PROOF_TABLE, ProofEntry, SubtaskCommit, VerifyReport, last_commits, verify_job

JOB_FILE: Final = Path(__file__).resolve().parents[2] / "examples" / "keyed_aggregation.py"
WINDOW_UID: Final = "window-count-sum"
KAFKA_SINK_UID: Final = "kafka-sink"
POSTGRES_SINK_UID: Final = "postgres-sink"
COLUMNS: Final = ("key", "window_start", "window_end", "count", "sum")
TABLE_DEFINITION: Final = (
    "key text, window_start bigint, window_end bigint, count bigint, sum bigint, PRIMARY KEY (key, window_start)"
)
OUTCOME: Final = (
    "the stateful keyed window job: its state and both sinks equal a reference computed from the input; "
    "exactly-once means each logical event affects managed state once"
)
SAMPLES: Final = 5

WindowKey = tuple[str, int]  # (key, window start)


class ScenarioError(WeirError):
    """The scenario could not be run to its end (a job failed, the stop did not complete, ...)."""


@dataclass(frozen=True)
class ScenarioConfig:
    events: int = 40_000
    keys: int = 200
    events_per_second: int = 2_000  # the producer's pace; event time advances 1 ms per events_per_second/1000
    malformed_every: int = 1_000  # every n-th record produced is not JSON
    window_ms: int = 1000
    parallelism: int = 3
    partitions: int = 6
    checkpoint_interval: str = "1s"
    source_topic: str = "keyed-events"
    sink_topic: str = "keyed-results"
    dlq_topic: str = "keyed-dlq"
    table: str = "keyed_results"
    savepoint_dir: str = ""  # "": s3://<bucket>/scenario-keyed-aggregation/savepoints
    timeout_s: float = 300.0

    def parameters(self) -> dict[str, str]:
        return {
            "source.topic": self.source_topic,
            "sink.topic": self.sink_topic,
            "sink.table": self.table,
            "source.dlq_topic": self.dlq_topic,
            "source.bounded": "false",
            "window.size_ms": str(self.window_ms),
            "checkpointing.interval": self.checkpoint_interval,
        }

    def event_spec(self) -> EventSpec:
        return EventSpec(
            count=self.events,
            keys=self.keys,
            events_per_ms=max(1, self.events_per_second // 1000),
            malformed_every=self.malformed_every,
        )


# The reference (pure) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    key: str
    value: int
    ts: int


@dataclass(frozen=True)
class InputRecord:
    """A record of the input topic as read back: its position and the event, None when malformed."""

    partition: int
    offset: int
    event: Event | None


@dataclass(frozen=True)
class WindowResult:
    """One (key, window)'s aggregate, as the reference computes it or a sink or the state holds it."""

    key: str
    start: int
    end: int
    count: int
    sum: int

    @property
    def window(self) -> WindowKey:
        return (self.key, self.start)


def parse_input(value: bytes | None) -> Event | None:
    """The event in an input record, None when it is not a well-formed event: a JSON object with a str
    ``id`` and ``key`` and int ``value`` and ``ts`` (the job's rule, stated again: the checker is the spec)."""
    try:
        doc = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    kinds = {"id": str, "key": str, "value": int, "ts": int}
    if any(type(doc.get(name)) is not kind for name, kind in kinds.items()):
        return None
    return Event(doc["key"], doc["value"], doc["ts"])


def reference_windows(events: Iterable[Event], window_ms: int) -> dict[WindowKey, WindowResult]:
    """Each (key, tumbling window)'s count and sum over the events."""
    acc: dict[WindowKey, list[int]] = defaultdict(lambda: [0, 0])
    for e in events:
        a = acc[(e.key, window_start(e.ts, 0, window_ms))]
        a[0] += 1
        a[1] += e.value
    return {(k, s): WindowResult(k, s, s + window_ms, n, total) for (k, s), (n, total) in sorted(acc.items())}


@dataclass(frozen=True)
class Split:
    """The reference's windows split at the savepoint: fired (in the sinks) or open (in the state)."""

    fired: Mapping[WindowKey, WindowResult]
    open: Mapping[WindowKey, WindowResult]


def split_at_cut(windows: Mapping[WindowKey, WindowResult], watermark_of: Callable[[str], int]) -> Split:
    """A window fired when the watermark of the subtask holding its key reached its last millisecond
    (``end - 1``, as the window operator fires); the others are open."""
    fired: dict[WindowKey, WindowResult] = {}
    still_open: dict[WindowKey, WindowResult] = {}
    for w, r in windows.items():
        (fired if watermark_of(r.key) >= r.end - 1 else still_open)[w] = r
    return Split(fired, still_open)


@dataclass(frozen=True)
class Comparison:
    """What one place (a sink, the state) holds against the windows it must hold."""

    place: str
    expected: int
    found: int  # entries, records or rows read, unreadable ones included
    windows: frozenset[WindowKey]  # the windows found
    counted: int  # Σ count over the entries found (each entry once, duplicates included)
    duplicates: int
    missing: int
    unexpected: int
    mismatched: int
    samples: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        counts = (
            (self.duplicates, "duplicate(s)"),
            (self.missing, "missing"),
            (self.unexpected, "unexpected"),
            (self.mismatched, "mismatched"),
        )
        return [f"{n} {label}" for n, label in counts if n]

    @property
    def exact(self) -> bool:
        return not self.problems() and self.found == self.expected

    def numbers(self) -> str:
        return (
            f"{self.found:,} found = {self.expected:,} expected; {self.duplicates} duplicates, "
            f"{self.missing} missing, {self.unexpected} unexpected, {self.mismatched} mismatched"
        )


def compare_windows(
    place: str, expected: Mapping[WindowKey, WindowResult], found: Iterable[WindowResult | None]
) -> Comparison:
    """Per window exactly the expected result, once (``None`` in ``found``: an entry that does not parse)."""
    by_window: dict[WindowKey, list[WindowResult]] = defaultdict(list)
    shown: list[str] = []
    unreadable = 0
    for r in found:
        if r is None:
            unreadable += 1
            _sample(shown, "unreadable entry")
            continue
        by_window[r.window].append(r)
    duplicates = mismatched = 0
    for w, results in sorted(by_window.items()):
        if len(results) > 1:
            duplicates += len(results) - 1
            _sample(shown, f"duplicate: {w} found {len(results)}x")
        want = expected.get(w)
        if want is not None and any(r != want for r in results):
            mismatched += 1
            _sample(shown, f"mismatched: expected {want}, found {results}")
    missing = [w for w in expected if w not in by_window]
    unexpected = [w for w in by_window if w not in expected]
    for w in missing:
        _sample(shown, f"missing: {expected[w]}")
    for w in unexpected:
        _sample(shown, f"unexpected: {by_window[w]}")
    return Comparison(
        place=place,
        expected=len(expected),
        found=sum(len(r) for r in by_window.values()) + unreadable,
        windows=frozenset(by_window),
        counted=sum(r.count for results in by_window.values() for r in results),
        duplicates=duplicates,
        missing=len(missing),
        unexpected=len(unexpected) + unreadable,
        mismatched=mismatched,
        samples=tuple(shown),
    )


def _sample(samples: list[str], text: str) -> None:
    if len(samples) < SAMPLES:
        samples.append(text if len(text) <= 300 else text[:297] + "...")


@dataclass(frozen=True)
class Coverage:
    """A sink and the state together, against every window of the input."""

    sink: str
    windows: int  # of the input (the reference)
    covered: int  # windows in the sink or the state
    overlap: int  # windows both in the sink and the state (fired and still open: counted twice)
    outside: int  # windows in either that the input does not have
    counted: int  # Σ count over the sink and the state

    @property
    def exact(self) -> bool:
        return self.overlap == 0 and self.outside == 0 and self.covered == self.windows


def coverage(reference: Mapping[WindowKey, WindowResult], sink: Comparison, state: Comparison) -> Coverage:
    union = sink.windows | state.windows
    return Coverage(
        sink=sink.place,
        windows=len(reference),
        covered=len(union & reference.keys()),
        overlap=len(sink.windows & state.windows),
        outside=len(union - reference.keys()),
        counted=sink.counted + state.counted,
    )


# Reading what the run left (the parsing is pure) ------------------------------------------------------


def sink_record(value: bytes | None) -> WindowResult | None:
    """A Kafka result record, None when it is not one."""
    try:
        doc = json.loads(value or b"")
        return WindowResult(
            str(doc["key"]), int(doc["window_start"]), int(doc["window_end"]), int(doc["count"]), int(doc["sum"])
        )
    except (ValueError, KeyError, TypeError):
        return None


def sink_row(row: Sequence[Any]) -> WindowResult | None:
    """A PostgreSQL row of COLUMNS, None when a value is missing."""
    key, start, end, count, total = row
    if None in (key, start, end, count, total):
        return None
    return WindowResult(str(key), int(start), int(end), int(count), int(total))


@dataclass(frozen=True)
class StateEntry:
    subtask: int
    key_group: int
    result: WindowResult | None  # None: the entry does not read as a (count, sum) window


def state_entry(line: Mapping[str, Any]) -> StateEntry:
    """A ``savepoint_inspect.dump_operator`` line of the window state: key ``{"key", "window": [start,
    end]}``, value ``(key, (count, sum))``."""
    subtask, key_group = int(line["subtask"]), int(line["key_group"])
    try:
        key, window = line["key"]["key"], line["key"]["window"]
        stored_key, (count, total) = line["value"]
        if stored_key != key or not isinstance(key, str):
            return StateEntry(subtask, key_group, None)
        return StateEntry(subtask, key_group, WindowResult(key, int(window[0]), int(window[1]), int(count), int(total)))
    except (KeyError, TypeError, ValueError):
        return StateEntry(subtask, key_group, None)


def misplaced(entries: Iterable[StateEntry], max_parallelism: int) -> int:
    """Entries stored under a key group other than their key's."""
    return sum(
        1 for e in entries if e.result is not None and key_group_for_key(e.result.key, max_parallelism) != e.key_group
    )


@dataclass(frozen=True)
class DeadLetters:
    records: int
    distinct: int  # distinct (partition, offset) of the input they name
    of_malformed: int  # of those, positions of malformed input records


def dead_letters(values: Iterable[bytes | None], topic: str, malformed: set[tuple[int, int]]) -> DeadLetters:
    """The dead-letter topic's envelopes against the malformed input records' positions."""
    positions: list[tuple[int, int] | None] = []
    for value in values:
        try:
            doc = json.loads(value or b"")
            positions.append((int(doc["partition"]), int(doc["offset"])) if doc["topic"] == topic else None)
        except (ValueError, KeyError, TypeError):
            positions.append(None)
    distinct = {p for p in positions if p is not None}
    return DeadLetters(len(positions), len(distinct), len(distinct & malformed))


@dataclass(frozen=True)
class ProofSummary:
    """One sink's commit proof in one job, every commit of it, against the records the sink holds."""

    sink: str
    commits: int
    records: int  # Σ records over the commits
    repeated: int  # (subtask, checkpoint) committed more than once
    after_savepoint: int  # commits of a checkpoint after the savepoint (the job stopped there)
    not_completed: int  # commits of a checkpoint the job's checkpoint history shows as not completed
    last: tuple[SubtaskCommit, ...]  # per subtask its last commit (verify's reading)

    def accounts_for(self, found: int) -> bool:
        return self.records == found and self.repeated == self.after_savepoint == self.not_completed == 0


def summarize_proof(
    sink: str,
    entries: Sequence[ProofEntry],
    job_id: str,
    savepoint_id: int,
    history: Mapping[int, CheckpointStatus],
) -> ProofSummary:
    """``entries``: the proof's commits (of any job and sink; only ``job_id``'s of ``sink`` count).
    ``history``: the job's checkpoint history (the last ones only) by id."""
    own = [e for e in entries if e.job_id == job_id and e.operator_uid == sink]
    per = Counter((e.subtask, e.checkpoint_id) for e in own)
    return ProofSummary(
        sink=sink,
        commits=len(own),
        records=sum(e.records for e in own),
        repeated=sum(n - 1 for n in per.values()),
        after_savepoint=sum(1 for e in own if e.checkpoint_id > savepoint_id),
        not_completed=sum(
            1 for e in own if e.checkpoint_id in history and history[e.checkpoint_id] is not CheckpointStatus.COMPLETED
        ),
        last=last_commits(own, job_id, sink),
    )


def kafka_proof_entries(values: Iterable[bytes | None]) -> list[ProofEntry]:
    """The commit markers among a marker topic's record values (``CommitMarker``)."""
    out: list[ProofEntry] = []
    for value in values:
        m = CommitMarker.parse(value)
        if m is not None:
            out.append(ProofEntry(m.job_id, m.operator_uid, m.subtask, m.checkpoint_id, m.records, 0))
    return out


# Running it -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRun:
    job_id: str
    produced: int
    savepoint_id: int
    savepoint_path: str
    history: Mapping[int, CheckpointStatus]  # the job's checkpoint history (its last ones), savepoint included
    checkpoint_after_input: int  # the first checkpoint completed after the windows took in all the input
    window_records_in: int
    records_in_all_attempts: int
    restarts: int

    @property
    def checkpoints_completed(self) -> int:
        """Checkpoints completed before the savepoint, of those the history lists."""
        return sum(
            1 for cid, st in self.history.items() if st is CheckpointStatus.COMPLETED and cid != self.savepoint_id
        )


def run_keyed_aggregation_scenario(endpoints: Endpoints, config: ScenarioConfig, console: Console) -> ScenarioReport:
    """Everything but starting the cluster: inputs, the job on live input, stop with savepoint, the checks."""
    report = ScenarioReport("keyed-aggregation", OUTCOME)
    began = time.monotonic()
    savepoint_dir = config.savepoint_dir or f"s3://{endpoints.s3_bucket}/scenario-keyed-aggregation/savepoints"
    recreate_inputs(
        endpoints,
        {config.source_topic: config.partitions, config.sink_topic: 3, config.dlq_topic: 1},
        config.table,
        TABLE_DEFINITION,
    )
    _step(
        console,
        report,
        f"recreated topics {config.source_topic} ({config.partitions} partitions), {config.sink_topic}, "
        f"{config.dlq_topic} and table {config.table}",
    )
    run = _run_job(endpoints, config, savepoint_dir, console, report)

    records = read_input(endpoints, config.source_topic)
    events = [r.event for r in records if r.event is not None]
    malformed = {(r.partition, r.offset) for r in records if r.event is None}
    reference = reference_windows(events, config.window_ms)
    cut = read_savepoint(run.savepoint_path, endpoints)
    split = split_at_cut(reference, cut.watermark_of)
    end_offsets = kafka.end_offsets(endpoints, config.source_topic)
    _step(
        console,
        report,
        f"read the input back ({len(records):,} records) and computed the reference: {len(reference):,} "
        f"(key, window)s; split at the savepoint's window watermarks: {len(split.fired):,} fired, "
        f"{len(split.open):,} open",
    )

    entries = [state_entry(line) for line in dump_operator(run.savepoint_path, WINDOW_UID, endpoints=endpoints)]
    state = compare_windows("savepoint state", split.open, (e.result for e in entries))
    sinks = (_read_kafka(endpoints, config, split.fired), _read_postgres(endpoints, config, split.fired))
    dlq = dead_letters(
        (v for _p, _o, _k, v, _ts in kafka.read_committed_records(endpoints, config.dlq_topic)),
        config.source_topic,
        malformed,
    )
    _step(
        console,
        report,
        f"read the savepoint's keyed state of {WINDOW_UID!r} ({len(entries):,} entries), both sinks "
        f"(Kafka read_committed, the PostgreSQL table) and the dead-letter topic ({dlq.records:,} records)",
    )
    verified = verify_job(JOB_FILE, config.parameters(), job_id=run.job_id, endpoints=endpoints)
    proofs = _read_proofs(endpoints, run)
    _step(console, report, f"ran `weir verify {JOB_FILE.name} --job-id {run.job_id}` (reference mode, commit proofs)")

    _evidence(report, config, run, records, malformed, reference, split, cut, entries, sinks, dlq)
    report.tables.append(_comparison_table(split, state, sinks))
    _check(
        report, run, records, events, malformed, end_offsets, cut, split, state, sinks, dlq, entries, verified, proofs
    )
    for place in (state, *sinks):
        for line in place.samples:
            console.print(f"  {place.place}: {line}", soft_wrap=True, markup=False, highlight=False)
    report.measured("duration", f"{time.monotonic() - began:.1f} s")
    return report


def _step(console: Console, report: ScenarioReport, text: str) -> None:
    report.step(text)
    console.print(text, soft_wrap=True, highlight=False)


def _window_vertex(status: JobDetails) -> tuple[int, int]:
    """Records the window subtasks took in: in the current attempts, and in all attempts."""
    tasks = [t for t in status.tasks if t.vertex_uid == WINDOW_UID]
    return sum(t.records_in for t in tasks), sum(t.records_in_all_attempts for t in tasks)


def _run_job(
    endpoints: Endpoints, config: ScenarioConfig, savepoint_dir: str, console: Console, report: ScenarioReport
) -> JobRun:
    params = config.parameters()
    spec = config.event_spec()
    malformed = config.events // config.malformed_every if config.malformed_every else 0
    well_formed = config.events - malformed
    with JobManagerClient(endpoints.jobmanager_address) as client:
        job = client.submit_job(JOB_FILE, params, config.parallelism)
        _step(
            console,
            report,
            f"submitted job {job}: {JOB_FILE.name} -p {config.parallelism} "
            + " ".join(f"-D {k}={v}" for k, v in params.items()),
        )
        try:
            wait_for_job(client, job, lambda s: s.summary.status == JobStatus.RUNNING, config.timeout_s, "RUNNING")
            produced = produce_events(endpoints, config.source_topic, spec, records_per_second=config.events_per_second)
            _step(
                console,
                report,
                f"produced {produced:,} events at {config.events_per_second:,}/s ({config.keys} keys, every "
                f"{config.malformed_every}th malformed: {malformed}) as live input while the job ran",
            )
            status = wait_for_job(
                client,
                job,
                lambda s: _window_vertex(s)[0] >= well_formed,
                config.timeout_s,
                f"{well_formed:,} events into the windows",
            )
            after = status.last_completed_checkpoint or 0
            status = wait_for_job(
                client,
                job,
                lambda s: (s.last_completed_checkpoint or 0) > after,
                config.timeout_s,
                f"a checkpoint after {after}",
            )
            checkpoint_after_input = status.last_completed_checkpoint or 0
            _step(
                console,
                report,
                f"the windows took in all {well_formed:,} well-formed events; checkpoint {checkpoint_after_input} "
                "completed after that",
            )
            savepoint_id = client.trigger_savepoint(job, savepoint_dir, stop=True)
            info = client.wait_for_savepoint(job, savepoint_id, config.timeout_s)
            status = wait_for_job(client, job, lambda s: s.summary.status.terminal, config.timeout_s, "its end")
            if status.summary.status is not JobStatus.FINISHED:
                raise ScenarioError(f"job {job} is {status.summary.status} after its savepoint: {status.failure}")
            _step(
                console,
                report,
                f"stopped it with savepoint {savepoint_id} (`weir stop {job} --savepoint-path {savepoint_dir}`): "
                f"{info.external_path}; job {status.summary.status.value}",
            )
            history = {int(c.checkpoint_id): c.status for c in client.list_checkpoints(job)}
        except BaseException:
            _cancel_unless_ended(client, job)
            raise
    records_in, all_attempts = _window_vertex(status)
    return JobRun(
        job_id=job,
        produced=produced,
        savepoint_id=savepoint_id,
        savepoint_path=info.external_path,
        history=history,
        checkpoint_after_input=checkpoint_after_input,
        window_records_in=records_in,
        records_in_all_attempts=all_attempts,
        restarts=status.summary.restarts,
    )


def _cancel_unless_ended(client: JobManagerClient, job: str) -> None:
    """The scenario failed with its job still running: cancel it (a cluster shared with others keeps no
    stray job); the failure that got here is the one to report."""
    try:
        if not client.job_status(job).summary.status.terminal:
            client.cancel_job(job)
    except WeirError:
        pass


def read_input(endpoints: Endpoints, topic: str) -> list[InputRecord]:
    return [
        InputRecord(partition, offset, parse_input(value))
        for partition, offset, _key, value, _ts in kafka.read_committed_records(endpoints, topic)
    ]


def _read_kafka(endpoints: Endpoints, config: ScenarioConfig, fired: Mapping[WindowKey, WindowResult]) -> Comparison:
    found = [
        sink_record(value) for _p, _o, _k, value, _ts in kafka.read_committed_records(endpoints, config.sink_topic)
    ]
    return compare_windows(f"kafka {config.sink_topic}", fired, found)


def _read_postgres(endpoints: Endpoints, config: ScenarioConfig, fired: Mapping[WindowKey, WindowResult]) -> Comparison:
    with postgres.connect(endpoints, autocommit=True) as conn:
        rows = postgres.fetch_rows(conn, config.table, COLUMNS)
    return compare_windows(f"postgres {config.table}", fired, (sink_row(r) for r in rows))


def _read_proofs(endpoints: Endpoints, run: JobRun) -> tuple[ProofSummary, ...]:
    """Every commit of each sink in this job, from where the sinks write their proofs (as ``weir
    verify`` reads them): the Kafka sink's marker topic, the PostgreSQL sink's rows in its proof table."""
    topic = marker_topic_name(run.job_id, KAFKA_SINK_UID)
    markers = kafka_proof_entries(v for _p, _o, _k, v, _ts in kafka.read_committed_records(endpoints, topic))
    with postgres.connect(endpoints, autocommit=True) as conn:
        rows = postgres.sink_commit_rows(conn, COMMIT_PROOF_TABLE, [POSTGRES_SINK_UID]) or []
    table = [ProofEntry(job, uid, int(st), int(cp), int(n or 0), 0) for job, uid, st, cp, n, _at in rows]
    return tuple(
        summarize_proof(uid, entries, run.job_id, run.savepoint_id, run.history)
        for uid, entries in ((KAFKA_SINK_UID, markers), (POSTGRES_SINK_UID, table))
    )


# The report -------------------------------------------------------------------------------------------


def _evidence(
    report: ScenarioReport,
    config: ScenarioConfig,
    run: JobRun,
    records: Sequence[InputRecord],
    malformed: set[tuple[int, int]],
    reference: Mapping[WindowKey, WindowResult],
    split: Split,
    cut: SavepointCut,
    entries: Sequence[StateEntry],
    sinks: Sequence[Comparison],
    dlq: DeadLetters,
) -> None:
    m = report.measured
    m("events produced", f"{run.produced:,}")
    m("input records read back (read_committed)", f"{len(records):,}")
    m("malformed (not well-formed events)", f"{len(malformed):,}")
    m("well-formed events", f"{len(records) - len(malformed):,}")
    m("(key, window)s of the input (reference)", f"{len(reference):,} ({config.window_ms} ms tumbling windows)")
    m("windows fired at the savepoint (reference)", f"{len(split.fired):,}")
    m("windows open at the savepoint (reference)", f"{len(split.open):,}")
    m(
        "window watermarks in the savepoint",
        ", ".join(f"#{w.subtask} key groups {w.key_groups}: {_clock(w.watermark)}" for w in cut.window_watermarks)
        + " (a window fired when its last millisecond <= its subtask's watermark)",
    )
    m(f"keyed state entries of {WINDOW_UID!r} ({WINDOW_STATE_NAME!r})", f"{len(entries):,}")
    for s in sinks:
        m(f"records in {s.place}", f"{s.found:,}")
    m("dead-letter records", f"{dlq.records:,}")
    m(
        "window records in (current attempts / all attempts)",
        f"{run.window_records_in:,} / {run.records_in_all_attempts:,}",
    )
    m("restarts", run.restarts)
    m(
        "checkpoints completed before the savepoint",
        f"{run.checkpoints_completed} (of the {len(run.history)} the history lists, savepoint included)",
    )
    m("first checkpoint completed after all input was in the windows", run.checkpoint_after_input)
    m("savepoint id", run.savepoint_id)
    m("savepoint", run.savepoint_path)
    m("job", run.job_id)


def _clock(ms: int) -> str:
    """An event time (epoch ms) as UTC clock time, with its value."""
    return f"{datetime.fromtimestamp(ms / 1000, UTC).strftime('%H:%M:%S.%f')[:-3]} UTC ({ms})"


def _comparison_table(split: Split, state: Comparison, sinks: Sequence[Comparison]) -> Table:
    places = (*sinks, state)
    table = Table("", *(p.place for p in places), title="each place against the reference", title_justify="left")
    table.add_row("holds", *("fired windows" for _ in sinks), "open windows")
    table.add_row("expected (reference)", *(f"{len(split.fired):,}" for _ in sinks), f"{len(split.open):,}")
    table.add_row("found", *(f"{p.found:,}" for p in places))
    for label in ("duplicates", "missing", "unexpected", "mismatched"):
        table.add_row(label, *(str(getattr(p, label)) for p in places))
    table.add_row("Σ count", *(f"{p.counted:,}" for p in places))
    return table


def _check(
    report: ScenarioReport,
    run: JobRun,
    records: Sequence[InputRecord],
    events: Sequence[Event],
    malformed: set[tuple[int, int]],
    end_offsets: Mapping[int, int],
    cut: SavepointCut,
    split: Split,
    state: Comparison,
    sinks: Sequence[Comparison],
    dlq: DeadLetters,
    entries: Sequence[StateEntry],
    verified: VerifyReport,
    proofs: Sequence[ProofSummary],
) -> None:
    v = report.verify
    v(
        "the input read back is what was produced",
        len(records) == run.produced,
        f"{len(records):,} read = {run.produced:,} produced",
    )
    positions = {p: cut.next_offsets.get(p, 0) for p in end_offsets}
    v(
        "the savepoint's source positions are the input's end: the job had read all of it",
        positions == dict(end_offsets),
        f"positions Σ {sum(positions.values()):,} = end offsets Σ {sum(end_offsets.values()):,}"
        + ("" if positions == dict(end_offsets) else f" ({positions} vs {dict(end_offsets)})"),
    )
    v(
        "a checkpoint completed after all input was in the windows, and windows both fired and open at the savepoint",
        run.checkpoint_after_input > 0 and bool(split.fired) and bool(split.open),
        f"checkpoint {run.checkpoint_after_input}; {len(split.fired):,} fired, {len(split.open):,} open",
    )
    for s in sinks:
        v(f"{s.place} holds exactly the fired windows, with the reference's values", s.exact, s.numbers())
    bad = misplaced(entries, cut.max_parallelism)
    v(
        f"the savepoint's keyed state of {WINDOW_UID!r} holds exactly the open windows, with the reference's "
        "accumulators, each in its key's key group",
        state.exact and bad == 0,
        f"{state.numbers()}; {bad} in another key group",
    )
    for s in sinks:
        c = coverage({**split.fired, **split.open}, s, state)
        v(
            f"{s.place} and the state together: every (key, window) of the input once, none in both",
            c.exact,
            f"{c.covered:,} covered of {c.windows:,} windows; {c.overlap} in both, {c.outside} not of the input",
        )
        v(
            f"each well-formed event counted once ({s.place} + state)",
            c.counted == len(events),
            f"Σ count {s.counted:,} + {state.counted:,} = {c.counted:,}; well-formed events {len(events):,}",
        )
    v(
        "each malformed event is in the dead-letter topic, once",
        dlq.records == len(malformed) == dlq.distinct == dlq.of_malformed and bool(malformed),
        f"{dlq.records:,} dead letters ({dlq.distinct:,} distinct, {dlq.of_malformed:,} of malformed records) = "
        f"{len(malformed):,} malformed",
    )
    dead = sum(s.dead_lettered for s in verified.sources)
    v(
        "weir verify's reference mode dead-letters the same records",
        dead == len(malformed),
        f"{dead:,} = {len(malformed):,}",
    )
    for r in verified.sinks:
        v(
            f"weir verify {r.uid}: no duplicate, unexpected or mismatched; missing = the windows still open "
            "(reference mode fires every window at the end of the input)",
            r.duplicates == r.unexpected == r.mismatched == 0 and r.missing == len(split.open),
            f"{r.found:,} found of {r.expected:,}; {r.duplicates} duplicates, {r.unexpected} unexpected, "
            f"{r.mismatched} mismatched, {r.missing} missing = {len(split.open):,} open",
        )
        v(
            f"weir verify {r.uid}: nothing prepared or open",
            not r.open_transactions,
            f"{len(r.open_transactions)} ({r.open_transaction_method})",
        )
    found = {KAFKA_SINK_UID: sinks[0].found, POSTGRES_SINK_UID: sinks[1].found}
    for p in proofs:
        last = max((c.checkpoint_id for c in p.last), default=None)
        v(
            f"{p.sink}'s own commit proof accounts for every record it holds: each (subtask, checkpoint) "
            "committed once, none after the savepoint, none the job did not complete",
            p.accounts_for(found[p.sink]),
            f"Σ {p.records:,} records over {p.commits} commits = {found[p.sink]:,} found; {p.repeated} repeated, "
            f"{p.after_savepoint} after savepoint {run.savepoint_id}, {p.not_completed} not completed; "
            f"last committed {last}",
        )
    by_sink = {r.uid: r.commit_proof for r in verified.sinks}
    kafka_proof, postgres_proof = by_sink.get(KAFKA_SINK_UID), by_sink.get(POSTGRES_SINK_UID)
    mine = {p.sink: p.last for p in proofs}
    agree = (
        kafka_proof is not None
        and postgres_proof is not None
        and kafka_proof.available
        and kafka_proof.subtasks == postgres_proof.subtasks
        and kafka_proof.subtasks == mine.get(KAFKA_SINK_UID)
    )
    v(
        "weir verify: the two sinks' proofs agree, per subtask the same last committed checkpoint and records",
        agree,
        "; ".join(
            f"{uid}: {_commits_text(proof.subtasks) if proof is not None else 'none'}"
            for uid, proof in ((KAFKA_SINK_UID, kafka_proof), (POSTGRES_SINK_UID, postgres_proof))
        )
        + f" ({'; '.join(verified.reconciliation)})",
    )


def _commits_text(commits: Sequence[SubtaskCommit]) -> str:
    return ", ".join(f"#{c.subtask} checkpoint {c.checkpoint_id} ({c.records} records)" for c in commits) or "none"


def main(argv: Sequence[str] | None = None) -> int:
    defaults = ScenarioConfig()
    parser = argparse.ArgumentParser(prog="weir scenario keyed-aggregation", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--events-per-second", type=int, default=defaults.events_per_second)
    parser.add_argument("--malformed-every", type=int, default=defaults.malformed_every)
    parser.add_argument("--window-ms", type=int, default=defaults.window_ms)
    parser.add_argument("--parallelism", type=int, default=defaults.parallelism)
    parser.add_argument(
        "--savepoint-path", default="", help="default s3://<bucket>/scenario-keyed-aggregation/savepoints"
    )
    args = parser.parse_args(argv)
    config = replace(
        defaults,
        events=args.events,
        keys=args.keys,
        events_per_second=args.events_per_second,
        malformed_every=args.malformed_every,
        window_ms=args.window_ms,
        parallelism=args.parallelism,
        savepoint_dir=args.savepoint_path,
    )
    return run_on_local_cluster(
        "keyed-aggregation",
        "keyed aggregation, state and both sinks against a reference",
        lambda endpoints, console: run_keyed_aggregation_scenario(endpoints, config, console),
    )


if __name__ == "__main__":
    sys.exit(main())

"""``weir scenario keyed-aggregation``: the seed's stateful keyed aggregation, its state and both sinks
checked against a reference computed from the input.

The driver:

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
4. reads back the input, the savepoint (its cut and the window operator's keyed state), both sinks,
   the dead-letter topic and the sinks' commit proofs, and runs ``weir verify`` (reference mode).

The checks compute, with a function of their own (not the job's code), each ``(key, window)``'s count
and sum from the input; the savepoint says each window subtask's watermark: a window whose last
millisecond its subtask's watermark reached has fired, the others are open.

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
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from rich.console import Console

from weir.connectors import kafka, postgres
from weir.core.checkpointing import CheckpointStatus
from weir.core.config import Endpoints
from weir.core.keygroups import key_group_for_key
from weir.core.state_layout import WINDOW_STATE
from weir.core.states import JobStatus
from weir.operators.transactional_sinks import marker_topic_name
from weir.scenarios.driving import cancel_unless_ended
from weir.scenarios.framework import (
    JobSpec,
    Report,
    ReportBuilder,
    Scenario,
    ScenarioError,
    Table,
    clock,
)
from weir.scenarios.keyed_job import (
    KAFKA_SINK_UID,
    POSTGRES_SINK_UID,
    WINDOW_UID,
    Comparison,
    InputRecord,
    KeyedJob,
    SavepointCut,
    WindowKey,
    WindowResult,
    compare_results,
    counted,
    marker_entries,
    postgres_proof_entries,
    read_input,
    read_kafka_results,
    read_postgres_results,
    read_savepoint,
    reference_windows,
)
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.drive import wait_for_job
from weir.tools.events import EventSpec, produce_events
from weir.tools.savepoint_inspect import dump_operator
from weir.tools.verify import COMMIT_PROOF_TABLE, ProofEntry, SubtaskCommit, VerifyReport, last_commits, verify_job

NAME: Final = "keyed-aggregation"
OUTCOME: Final = (
    "the stateful keyed window job: its state and both sinks equal a reference computed from the input; "
    "exactly-once means each logical event affects managed state once"
)
SINKS: Final = (KAFKA_SINK_UID, POSTGRES_SINK_UID)


@dataclass(frozen=True)
class KeyedAggregationConfig:
    job: KeyedJob = KeyedJob.named("keyed")
    events: int = 40_000
    keys: int = 200
    events_per_second: int = 2_000  # the producer's pace; event time advances 1 ms per events_per_second/1000
    malformed_every: int = 1_000  # every n-th record produced is not JSON
    parallelism: int = 3
    partitions: int = 6
    savepoint_dir: str = ""  # "": s3://<bucket>/scenario-keyed-aggregation/savepoints
    timeout_s: float = 300.0

    def spec(self) -> JobSpec:
        return self.job.spec(self.parallelism)

    def event_spec(self) -> EventSpec:
        return EventSpec(
            count=self.events,
            keys=self.keys,
            events_per_ms=max(1, self.events_per_second // 1000),
            malformed_every=self.malformed_every,
        )

    @property
    def malformed(self) -> int:
        return self.events // self.malformed_every if self.malformed_every else 0


# What the run measured ----------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class StateEntry:
    subtask: int
    key_group: int
    result: WindowResult | None  # None: the entry does not read as a (count, sum) window


@dataclass(frozen=True)
class KeyedAggregationRun:
    """Everything the driver read back after stopping the job with a savepoint."""

    job: JobRun
    steps: tuple[str, ...]
    records: tuple[InputRecord, ...]  # the input, read_committed
    end_offsets: Mapping[int, int]  # the input topic's end offset per partition
    cut: SavepointCut
    state: tuple[StateEntry, ...]  # the savepoint's keyed state of the window operator
    kafka: tuple[WindowResult | None, ...]  # the results topic, read_committed
    postgres: tuple[WindowResult | None, ...]  # the results table
    dead_letters: tuple[bytes | None, ...]
    verified: VerifyReport
    proofs: Mapping[str, tuple[ProofEntry, ...]]  # per sink uid, the commits its proof holds
    duration_s: float


# The checks' arithmetic (pure) --------------------------------------------------------------------------


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


def coverage(
    reference: Mapping[WindowKey, WindowResult], sink: Comparison[WindowResult], state: Comparison[WindowResult]
) -> Coverage:
    union = sink.windows | state.windows
    return Coverage(
        sink=sink.place,
        windows=len(reference),
        covered=len(union & reference.keys()),
        overlap=len(sink.windows & state.windows),
        outside=len(union - reference.keys()),
        counted=counted(sink) + counted(state),
    )


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


# The driver ---------------------------------------------------------------------------------------------


def drive(endpoints: Endpoints, config: KeyedAggregationConfig, console: Console) -> KeyedAggregationRun:
    """Inputs, the job on live input, stop with a savepoint, and everything read back (the cluster is up)."""
    began = time.monotonic()
    steps: list[str] = []

    def step(text: str) -> None:
        steps.append(text)
        console.print(text, soft_wrap=True, highlight=False, markup=False)

    job = config.job
    savepoint_dir = config.savepoint_dir or f"s3://{endpoints.s3_bucket}/scenario-keyed-aggregation/savepoints"
    job.recreate(endpoints, config.partitions)
    step(f"recreated {job.describe(config.partitions)}")
    run = _run_job(endpoints, config, savepoint_dir, step)
    records = tuple(read_input(endpoints, job.source_topic))
    end_offsets = kafka.end_offsets(endpoints, job.source_topic)
    cut = read_savepoint(run.savepoint_path, endpoints)
    # the window state only (the operator also keeps its key samples, weir.core.key_samples)
    lines = dump_operator(run.savepoint_path, WINDOW_UID, state=WINDOW_STATE, endpoints=endpoints)
    state = tuple(state_entry(line) for line in lines)
    assert job.table is not None
    kafka_results = tuple(read_kafka_results(endpoints, job.sink_topic))
    postgres_results = tuple(read_postgres_results(endpoints, job.table))
    dlq = tuple(v for _p, _o, _k, v, _ts in kafka.read_committed_records(endpoints, job.dlq_topic))
    step(
        f"read back the input ({len(records):,} records), the savepoint's cut and keyed state of {WINDOW_UID!r} "
        f"({len(state):,} entries), both sinks (Kafka read_committed, the PostgreSQL table) and the dead-letter "
        f"topic ({len(dlq):,} records)"
    )
    verified = verify_job(job.file, job.parameters(), job_id=run.job_id, endpoints=endpoints)
    proofs = _read_proofs(endpoints, run.job_id)
    step(f"ran `weir verify {job.file.name} --job-id {run.job_id}` (reference mode, commit proofs)")
    return KeyedAggregationRun(
        run,
        tuple(steps),
        records,
        end_offsets,
        cut,
        state,
        kafka_results,
        postgres_results,
        dlq,
        verified,
        proofs,
        time.monotonic() - began,
    )


def _window_vertex(status: JobDetails) -> tuple[int, int]:
    """Records the window subtasks took in: in the current attempts, and in all attempts."""
    tasks = [t for t in status.tasks if t.vertex_uid == WINDOW_UID]
    return sum(t.records_in for t in tasks), sum(t.records_in_all_attempts for t in tasks)


def _run_job(
    endpoints: Endpoints, config: KeyedAggregationConfig, savepoint_dir: str, step: Callable[[str], None]
) -> JobRun:
    spec = config.spec()
    well_formed = config.events - config.malformed
    with JobManagerClient(endpoints.jobmanager_address) as client:
        job = spec.submit(client)
        step(f"submitted job {job}: {spec.command()}")
        try:
            wait_for_job(client, job, lambda s: s.summary.status == JobStatus.RUNNING, config.timeout_s, "RUNNING")
            produced = produce_events(
                endpoints, config.job.source_topic, config.event_spec(), records_per_second=config.events_per_second
            )
            step(
                f"produced {produced:,} events at {config.events_per_second:,}/s ({config.keys} keys, every "
                f"{config.malformed_every}th malformed: {config.malformed}) as live input while the job ran"
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
            step(
                f"the windows took in all {well_formed:,} well-formed events; checkpoint {checkpoint_after_input} "
                "completed after that"
            )
            savepoint_id = client.trigger_savepoint(job, savepoint_dir, stop=True)
            info = client.wait_for_savepoint(job, savepoint_id, config.timeout_s)
            status = wait_for_job(client, job, lambda s: s.summary.status.terminal, config.timeout_s, "its end")
            if status.summary.status is not JobStatus.FINISHED:
                raise ScenarioError(f"job {job} is {status.summary.status} after its savepoint: {status.failure}")
            step(
                f"stopped it with savepoint {savepoint_id} (`weir stop {job} --savepoint-path {savepoint_dir}`): "
                f"{info.external_path}; job {status.summary.status.value}"
            )
            history = {int(c.checkpoint_id): c.status for c in client.list_checkpoints(job)}
        except BaseException:
            cancel_unless_ended(client, job)
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


def _read_proofs(endpoints: Endpoints, job_id: str) -> dict[str, tuple[ProofEntry, ...]]:
    """Every commit of each sink in this job, from where the sinks write their proofs (as ``weir
    verify`` reads them): the Kafka sink's marker topic, the PostgreSQL sink's rows in its proof table."""
    topic = marker_topic_name(job_id, KAFKA_SINK_UID)
    markers = marker_entries(
        ((v, 0) for _p, _o, _k, v, _ts in kafka.read_committed_records(endpoints, topic)), KAFKA_SINK_UID
    )
    with postgres.connect(endpoints, autocommit=True) as conn:
        rows = postgres.sink_commit_rows(conn, COMMIT_PROOF_TABLE, [POSTGRES_SINK_UID]) or []
    return {KAFKA_SINK_UID: tuple(markers), POSTGRES_SINK_UID: tuple(postgres_proof_entries(rows))}


# The checks ---------------------------------------------------------------------------------------------


def check(config: KeyedAggregationConfig, run: KeyedAggregationRun) -> Report:
    """The card's outcome as checked statements, from what the run read back."""
    report = ReportBuilder(NAME, OUTCOME)
    for text in run.steps:
        report.step(text)
    job, records, cut = run.job, run.records, run.cut
    events = [r.event for r in records if r.event is not None]
    malformed = {(r.partition, r.offset) for r in records if r.event is None}
    reference = reference_windows(events, config.job.window_ms)
    split = split_at_cut(reference, cut.watermark_of)
    state = compare_results("savepoint state", split.open, (e.result for e in run.state))
    sinks = {
        KAFKA_SINK_UID: compare_results(f"kafka {config.job.sink_topic}", split.fired, run.kafka),
        POSTGRES_SINK_UID: compare_results(f"postgres {config.job.table}", split.fired, run.postgres),
    }
    dlq = dead_letters(run.dead_letters, config.job.source_topic, malformed)
    report.step(
        f"computed the reference from the input: {len(reference):,} (key, window)s; split at the savepoint's window "
        f"watermarks: {len(split.fired):,} fired, {len(split.open):,} open"
    )
    _evidence(report, config, run, malformed, reference, split, sinks.values(), dlq)
    report.table(_comparison_table(split, state, tuple(sinks.values())))
    for place in (state, *sinks.values()):
        for line in place.samples:
            report.note(f"{place.place}: {line}")
    v = report.verify
    v(
        "input-read-back",
        "the input read back is what was produced",
        len(records) == job.produced,
        f"{len(records):,} read = {job.produced:,} produced",
        read=len(records),
        produced=job.produced,
    )
    positions = {p: cut.next_offsets.get(p, 0) for p in run.end_offsets}
    v(
        "source-positions-at-end",
        "the savepoint's source positions are the input's end: the job had read all of it",
        positions == dict(run.end_offsets),
        f"positions Σ {sum(positions.values()):,} = end offsets Σ {sum(run.end_offsets.values()):,}"
        + ("" if positions == dict(run.end_offsets) else f" ({positions} vs {dict(run.end_offsets)})"),
        positions=sum(positions.values()),
        end_offsets=sum(run.end_offsets.values()),
    )
    v(
        "windows-fired-and-open",
        "a checkpoint completed after all input was in the windows, and windows both fired and open at the savepoint",
        job.checkpoint_after_input > 0 and bool(split.fired) and bool(split.open),
        f"checkpoint {job.checkpoint_after_input}; {len(split.fired):,} fired, {len(split.open):,} open",
        checkpoint_after_input=job.checkpoint_after_input,
        fired=len(split.fired),
        open=len(split.open),
    )
    for uid, s in sinks.items():
        v(
            f"sink-holds-fired-windows:{uid}",
            f"{s.place} holds exactly the fired windows, with the reference's values",
            s.exact,
            s.numbers(),
            **s.figures(),
        )
    bad = misplaced(run.state, cut.max_parallelism)
    v(
        "state-holds-open-windows",
        f"the savepoint's keyed state of {WINDOW_UID!r} holds exactly the open windows, with the reference's "
        "accumulators, each in its key's key group",
        state.exact and bad == 0,
        f"{state.numbers()}; {bad} in another key group",
        **state.figures(),
        misplaced=bad,
    )
    for uid, s in sinks.items():
        c = coverage(reference, s, state)
        v(
            f"sink-and-state-cover-input:{uid}",
            f"{s.place} and the state together: every (key, window) of the input once, none in both",
            c.exact,
            f"{c.covered:,} covered of {c.windows:,} windows; {c.overlap} in both, {c.outside} not of the input",
            covered=c.covered,
            windows=c.windows,
            overlap=c.overlap,
            outside=c.outside,
        )
        v(
            f"each-event-counted-once:{uid}",
            f"each well-formed event counted once ({s.place} + state)",
            c.counted == len(events),
            f"Σ count {counted(s):,} + {counted(state):,} = {c.counted:,}; well-formed events {len(events):,}",
            counted=c.counted,
            well_formed=len(events),
        )
    v(
        "dead-letters-once",
        "each malformed event is in the dead-letter topic, once",
        dlq.records == len(malformed) == dlq.distinct == dlq.of_malformed and bool(malformed),
        f"{dlq.records:,} dead letters ({dlq.distinct:,} distinct, {dlq.of_malformed:,} of malformed records) = "
        f"{len(malformed):,} malformed",
        dead_letters=dlq.records,
        distinct=dlq.distinct,
        of_malformed=dlq.of_malformed,
        malformed=len(malformed),
    )
    dead = sum(s.dead_lettered for s in run.verified.sources)
    v(
        "verify-dead-letters",
        "weir verify's reference mode dead-letters the same records",
        dead == len(malformed),
        f"{dead:,} = {len(malformed):,}",
        verify_dead_lettered=dead,
        malformed=len(malformed),
    )
    for r in run.verified.sinks:
        v(
            f"verify-missing-only-open:{r.uid}",
            f"weir verify {r.uid}: no duplicate, unexpected or mismatched; missing = the windows still open "
            "(reference mode fires every window at the end of the input)",
            r.duplicates == r.unexpected == r.mismatched == 0 and r.missing == len(split.open),
            f"{r.found:,} found of {r.expected:,}; {r.duplicates} duplicates, {r.unexpected} unexpected, "
            f"{r.mismatched} mismatched, {r.missing} missing = {len(split.open):,} open",
            found=r.found,
            expected=r.expected,
            duplicates=r.duplicates,
            unexpected=r.unexpected,
            mismatched=r.mismatched,
            missing=r.missing,
            open=len(split.open),
        )
        v(
            f"verify-nothing-open:{r.uid}",
            f"weir verify {r.uid}: nothing prepared or open",
            not r.open_transactions,
            f"{len(r.open_transactions)} ({r.open_transaction_method})",
            open_transactions=len(r.open_transactions),
        )
    summaries = {
        uid: summarize_proof(uid, run.proofs.get(uid, ()), job.job_id, job.savepoint_id, job.history) for uid in SINKS
    }
    for uid, p in summaries.items():
        found = sinks[uid].found
        last = max((c.checkpoint_id for c in p.last), default=None)
        v(
            f"commit-proof-accounts:{uid}",
            f"{uid}'s own commit proof accounts for every record it holds: each (subtask, checkpoint) "
            "committed once, none after the savepoint, none the job did not complete",
            p.accounts_for(found),
            f"Σ {p.records:,} records over {p.commits} commits = {found:,} found; {p.repeated} repeated, "
            f"{p.after_savepoint} after savepoint {job.savepoint_id}, {p.not_completed} not completed; "
            f"last committed {last}",
            records=p.records,
            commits=p.commits,
            found=found,
            repeated=p.repeated,
            after_savepoint=p.after_savepoint,
            not_completed=p.not_completed,
            last_committed=last,
        )
    by_sink = {r.uid: r.commit_proof for r in run.verified.sinks}
    kafka_proof, postgres_proof = by_sink.get(KAFKA_SINK_UID), by_sink.get(POSTGRES_SINK_UID)
    agree = (
        kafka_proof is not None
        and postgres_proof is not None
        and kafka_proof.available
        and kafka_proof.subtasks == postgres_proof.subtasks
        and kafka_proof.subtasks == summaries[KAFKA_SINK_UID].last
    )
    v(
        "proofs-agree",
        "weir verify: the two sinks' proofs agree, per subtask the same last committed checkpoint and records",
        agree,
        "; ".join(
            f"{uid}: {_commits_text(proof.subtasks) if proof is not None else 'none'}"
            for uid, proof in ((KAFKA_SINK_UID, kafka_proof), (POSTGRES_SINK_UID, postgres_proof))
        )
        + f" ({'; '.join(run.verified.reconciliation)})",
        **{
            uid: tuple((c.subtask, c.checkpoint_id, c.records) for c in proof.subtasks) if proof is not None else None
            for uid, proof in ((KAFKA_SINK_UID, kafka_proof), (POSTGRES_SINK_UID, postgres_proof))
        },
    )
    report.measured("duration", f"{run.duration_s:.1f} s")
    return report.build()


def _evidence(
    report: ReportBuilder,
    config: KeyedAggregationConfig,
    run: KeyedAggregationRun,
    malformed: set[tuple[int, int]],
    reference: Mapping[WindowKey, WindowResult],
    split: Split,
    sinks: Iterable[Comparison[WindowResult]],
    dlq: DeadLetters,
) -> None:
    m, job = report.measured, run.job
    m("events produced", f"{job.produced:,}")
    m("input records read back (read_committed)", f"{len(run.records):,}")
    m("malformed (not well-formed events)", f"{len(malformed):,}")
    m("well-formed events", f"{len(run.records) - len(malformed):,}")
    m("(key, window)s of the input (reference)", f"{len(reference):,} ({config.job.window_ms} ms tumbling windows)")
    m("windows fired at the savepoint (reference)", f"{len(split.fired):,}")
    m("windows open at the savepoint (reference)", f"{len(split.open):,}")
    m(
        "window watermarks in the savepoint",
        ", ".join(f"#{w.subtask} key groups {w.key_groups}: {clock(w.watermark)}" for w in run.cut.window_watermarks)
        + " (a window fired when its last millisecond <= its subtask's watermark)",
    )
    m(f"keyed state entries of {WINDOW_UID!r} ({WINDOW_STATE!r})", f"{len(run.state):,}")
    for s in sinks:
        m(f"records in {s.place}", f"{s.found:,}")
    m("dead-letter records", f"{dlq.records:,}")
    m(
        "window records in (current attempts / all attempts)",
        f"{job.window_records_in:,} / {job.records_in_all_attempts:,}",
    )
    m("restarts", job.restarts)
    m(
        "checkpoints completed before the savepoint",
        f"{job.checkpoints_completed} (of the {len(job.history)} the history lists, savepoint included)",
    )
    m("first checkpoint completed after all input was in the windows", job.checkpoint_after_input)
    m("savepoint id", job.savepoint_id)
    m("savepoint", job.savepoint_path)
    m("job", job.job_id)


def _comparison_table(
    split: Split, state: Comparison[WindowResult], sinks: Sequence[Comparison[WindowResult]]
) -> Table:
    places = (*sinks, state)
    rows = [
        ("holds", *("fired windows" for _ in sinks), "open windows"),
        ("expected (reference)", *(f"{len(split.fired):,}" for _ in sinks), f"{len(split.open):,}"),
        ("found", *(f"{p.found:,}" for p in places)),
        *(
            (label, *(str(getattr(p, label)) for p in places))
            for label in ("duplicates", "missing", "unexpected", "mismatched")
        ),
        ("Σ count", *(f"{counted(p):,}" for p in places)),
    ]
    return Table("each place against the reference", ("", *(p.place for p in places)), tuple(rows))


def _commits_text(commits: Sequence[SubtaskCommit]) -> str:
    return ", ".join(f"#{c.subtask} checkpoint {c.checkpoint_id} ({c.records} records)" for c in commits) or "none"


# The command ----------------------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser, defaults: KeyedAggregationConfig) -> None:
    parser.add_argument("--events", type=int, default=defaults.events)
    parser.add_argument("--keys", type=int, default=defaults.keys)
    parser.add_argument("--events-per-second", type=int, default=defaults.events_per_second)
    parser.add_argument("--malformed-every", type=int, default=defaults.malformed_every)
    parser.add_argument("--window-ms", type=int, default=defaults.job.window_ms)
    parser.add_argument("--parallelism", type=int, default=defaults.parallelism)
    parser.add_argument(
        "--savepoint-path", default="", help="default s3://<bucket>/scenario-keyed-aggregation/savepoints"
    )


def _configure(args: argparse.Namespace, defaults: KeyedAggregationConfig) -> KeyedAggregationConfig:
    return replace(
        defaults,
        job=defaults.job.with_(window_ms=args.window_ms),
        events=args.events,
        keys=args.keys,
        events_per_second=args.events_per_second,
        malformed_every=args.malformed_every,
        parallelism=args.parallelism,
        savepoint_dir=args.savepoint_path,
    )


SCENARIO: Final = Scenario(
    name=NAME,
    title="keyed aggregation, state and both sinks against a reference",
    summary="the stateful keyed window job: its state and both sinks equal a reference computed from the input",
    outcome=OUTCOME,
    defaults=KeyedAggregationConfig(),
    arguments=_arguments,
    configure=_configure,
    jobs=lambda config: (config.spec(),),
    drive=drive,
    check=check,
)

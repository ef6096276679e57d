"""``weir scenario two-phase-commit``: within checkpoint intervals, each sink's transaction as the outside
world sees it (open or prepared), then committed once its checkpoint completed; each sink's own proof.

The job (examples/two_sinks.py, parallelism 1) sends every event of a live generator, unchanged, to
the transactional Kafka sink (topic, one Kafka transaction per checkpoint epoch) and to the two-phase
PostgreSQL sink (table keyed by the event id, one prepared transaction per epoch), with a long
checkpoint interval. While it runs, watchers record when each thing became visible:

- a read_uncommitted and a read_committed consumer on the output topic (from offset 0), and a
  read_uncommitted one on the Kafka sink's marker topic: when each record reached each of them;
- a dedicated PostgreSQL session polling ``pg_prepared_xacts`` every millisecond: when each of the
  job's gids appeared and left, and, in one snapshot right after it appeared (and again after it
  left), the rows the table shows and the sink's proof rows;
- in the middle of interval N (checkpoint N-1 completed, barrier N not yet there): the output topic's
  last stable offset (LSO) and high watermark per partition. LSO < high watermark is the open
  transaction; its range [LSO, high watermark) is read from both consumers and the events in it are
  looked up in the table.

The epoch of checkpoint N on the output topic is [LSO in interval N, LSO in interval N+1) per
partition (one producer: a transaction's records are contiguous). The checks compare what each
watcher saw against the checkpoint times the JobManager reports and against the sinks' own proofs
(the commit marker of checkpoint N in the marker topic, the row of checkpoint N in
``weir_sink_commits``). The two sinks commit one after the other, never as one atomic transaction:
the timeline shows each sink's commit at its own instant.

The prepare -> commit window of the PostgreSQL sink is short (the JobManager persists the checkpoint
and notifies: some tens of ms here); the poller catches it from its own session without widening it,
and the run fails when it caught no prepared transaction in any observed checkpoint.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from rich.console import Console

from weir.connectors import kafka, postgres
from weir.core.checkpointing import CheckpointStatus
from weir.core.config import Endpoints
from weir.core.states import JobStatus
from weir.operators.transactional_sinks import CommitMarker, marker_topic_name
from weir.scenarios.driving import Arrival, Background, TopicWatch, cancel_unless_ended, wait_until
from weir.scenarios.framework import (
    EXAMPLES,
    JobSpec,
    Report,
    ReportBuilder,
    Scenario,
    ScenarioError,
    Table,
    millis,
)
from weir.scenarios.keyed_job import KAFKA_SINK_UID, POSTGRES_SINK_UID
from weir.tools.client import CheckpointInfo, JobManagerClient
from weir.tools.drive import recreate_inputs, wait_for_job
from weir.tools.verify import CommitProof, SubtaskCommit, reconcile, sink_transaction

NAME: Final = "two-phase-commit"
JOB_FILE: Final = EXAMPLES / "two_sinks.py"  # its sinks' uids are the keyed job's (keyed_job)
SUBTASK: Final = 0  # the job runs at parallelism 1: one transaction per sink at a time
TABLE_DEFINITION: Final = "id bigint PRIMARY KEY, key text NOT NULL, value bigint NOT NULL"
OUTCOME: Final = (
    "Kafka output can participate via connector transactions; a database sink may be idempotent or "
    "transactional under a separate contract. Writing both does not create one cross-system atomic commit. "
    "Every sink reports its own checkpoint/idempotency proof; reconciliation handles partial cross-sink success."
)
POLL_S: Final = 0.05

Ranges = Mapping[int, tuple[int, int]]  # partition -> [start, end) offsets


MAX_LATE_READS: Final = 2
"""How many times the observation starts again after a read that came too late (after its checkpoint
completed: the watching process stalled), before the late read stands and fails its check."""


@dataclass(frozen=True)
class TwoPhaseCommitConfig:
    events_per_second: int = 200
    checkpoint_interval_s: float = 5.0
    checkpoints: int = 3  # consecutive checkpoints observed in full
    partitions: int = 3
    sink_topic: str = "tpc-results"
    table: str = "tpc_results"
    prepared_poll_s: float = 0.001  # the pg_prepared_xacts poller's pause between two looks
    mid_interval: float = 0.4  # where in interval N the open transaction is read (share of the interval)
    timeout_s: float = 120.0

    def parameters(self) -> dict[str, str]:
        return {
            "source.rate": str(self.events_per_second),
            "sink.topic": self.sink_topic,
            "sink.table": self.table,
            "checkpointing.interval": f"{round(self.checkpoint_interval_s * 1000)}ms",
        }

    def spec(self) -> JobSpec:
        return JobSpec(JOB_FILE, self.parameters(), 1)  # parallelism 1: one transaction per sink at a time


# What the watchers saw (values) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """A record of the output topic as one consumer received it."""

    partition: int
    offset: int
    at: float  # wall clock, s
    event_id: int | None  # the event's id, None when the record is not an event


def received(arrivals: Iterable[Arrival], ranges: Ranges | None = None) -> tuple[Received, ...]:
    """The arrivals (within ``ranges``, if given) with their event ids."""
    return tuple(
        Received(a.partition, a.offset, a.at, _event_id(a.value))
        for a in arrivals
        if ranges is None or in_ranges(ranges, a.partition, a.offset)
    )


@dataclass(frozen=True)
class CheckpointTimes:
    checkpoint_id: int
    triggered: float
    completed: float | None  # None: not completed (yet, or failed)


@dataclass(frozen=True)
class OpenTransactionRead:
    """The output topic in the middle of interval N: its open transaction and who could read it."""

    checkpoint_id: int  # N: the checkpoint whose barrier closes this transaction
    at: float
    offsets: Ranges  # partition -> (last stable offset, high watermark)
    read_uncommitted: int  # records of [LSO, high watermark) the read_uncommitted consumer has received
    read_committed: int  # ... the read_committed consumer has received
    in_postgres: int  # of the events in that range, rows the table shows to another session
    completed_by_then: bool  # checkpoint N had completed when these reads were done

    @property
    def open_records(self) -> int:
        return sum(max(0, hw - lso) for lso, hw in self.offsets.values())

    @property
    def open_partitions(self) -> tuple[int, ...]:
        return tuple(p for p, (lso, hw) in sorted(self.offsets.items()) if lso < hw)


@dataclass(frozen=True)
class Visible:
    """What a session outside the sink saw in one snapshot: the table's rows and the sink's proof rows."""

    at: float
    rows: int
    proofs: Mapping[int, int]  # checkpoint id -> rows, from weir_sink_commits (this job, the sink)


@dataclass(frozen=True)
class PreparedSighting:
    """One gid of the job's PostgreSQL sink in pg_prepared_xacts, from the poller's session."""

    gid: str
    checkpoint_id: int  # as the gid names it
    subtask: int
    first_seen: float
    while_prepared: Visible  # read right after it was first seen
    prepared_at_snapshot: bool  # the gid was still prepared once that read's snapshot was taken
    gone_at: float | None = None
    after_commit: Visible | None = None  # read right after it left


@dataclass(frozen=True)
class Epoch:
    """Checkpoint N's epoch as the watchers saw it, in both sinks."""

    times: CheckpointTimes
    kafka_range: Ranges
    uncommitted: tuple[Received, ...]  # received by the read_uncommitted consumer, within the range
    committed: tuple[Received, ...]  # received by the read_committed consumer, within the range
    marker: CommitMarker | None  # the Kafka sink's proof (committed marker of this checkpoint)
    marker_seen_uncommitted: float | None  # when its marker (flushed at pre-commit) reached read_uncommitted
    postgres_proof_rows: int | None  # the PostgreSQL sink's proof (weir_sink_commits row)
    prepared: PreparedSighting | None
    kafka_events_in_postgres: int  # of the events the Kafka epoch holds, rows the table shows at the end

    @property
    def checkpoint_id(self) -> int:
        return self.times.checkpoint_id

    @property
    def first_uncommitted(self) -> float | None:
        return min((a.at for a in self.uncommitted), default=None)

    @property
    def kafka_commit_visible(self) -> float | None:
        return min((a.at for a in self.committed), default=None)

    @property
    def postgres_commit_visible(self) -> float | None:
        p = self.prepared
        return (
            None
            if p is None or p.after_commit is None or self.checkpoint_id not in p.after_commit.proofs
            else (p.after_commit.at)
        )

    def seen_before_completion(self, arrivals: Iterable[Received]) -> int:
        done = self.times.completed
        return sum(1 for a in arrivals if done is None or a.at < done)


def in_ranges(ranges: Ranges, partition: int, offset: int) -> bool:
    start, end = ranges.get(partition, (0, 0))
    return start <= offset < end


def epoch_range(this_interval: OpenTransactionRead, next_interval: OpenTransactionRead) -> Ranges:
    """Checkpoint N's records on the output topic: from the LSO in interval N (the first offset of its
    transaction, or where it would begin) to the LSO in interval N+1 (past its commit marker)."""
    return {p: (lso, next_interval.offsets.get(p, (lso, lso))[0]) for p, (lso, _hw) in this_interval.offsets.items()}


def committed_before(proofs: Mapping[int, int], checkpoint_id: int) -> int:
    """Rows the sink had committed before checkpoint ``checkpoint_id``, by its own proof rows."""
    return sum(rows for cp, rows in proofs.items() if cp < checkpoint_id)


# The checks (pure) -----------------------------------------------------------------------------------


def check_open_transactions(report: ReportBuilder, reads: Sequence[OpenTransactionRead]) -> None:
    ok = bool(reads) and all(
        r.open_records > 0
        and r.read_uncommitted == r.open_records
        and r.read_committed == 0
        and not r.completed_by_then
        for r in reads
    )
    report.verify(
        "open-kafka-transaction",
        "during interval N the Kafka transaction of checkpoint N is open: read_uncommitted sees its records, "
        "read_committed does not (same offsets, checkpoint N not completed yet)",
        ok,
        "; ".join(
            f"cp {r.checkpoint_id}: [LSO, HW) holds {r.open_records} on partitions {list(r.open_partitions)}, "
            f"read_uncommitted {r.read_uncommitted}, read_committed {r.read_committed}"
            + (" (checkpoint had completed!)" if r.completed_by_then else "")
            for r in reads
        )
        or "no interval read",
        intervals=tuple(
            {
                "checkpoint": r.checkpoint_id,
                "open_records": r.open_records,
                "open_partitions": r.open_partitions,
                "read_uncommitted": r.read_uncommitted,
                "read_committed": r.read_committed,
                "completed_by_then": r.completed_by_then,
            }
            for r in reads
        ),
    )
    report.verify(
        "open-events-not-in-postgres",
        "the same events are not in PostgreSQL for another session (the sink holds them until the barrier)",
        bool(reads) and all(r.in_postgres == 0 and r.open_records > 0 for r in reads),
        "; ".join(f"cp {r.checkpoint_id}: {r.in_postgres} of {r.open_records} events in the table" for r in reads)
        or "no interval read",
        intervals=tuple(
            {"checkpoint": r.checkpoint_id, "in_postgres": r.in_postgres, "open_records": r.open_records} for r in reads
        ),
    )


def check_prepared(report: ReportBuilder, epochs: Sequence[Epoch], job_id: str) -> None:
    caught = [e for e in epochs if e.prepared is not None]
    report.verify(
        "postgres-prepared-seen",
        "the PostgreSQL transaction of checkpoint N was seen prepared in pg_prepared_xacts (in at least one "
        "observed checkpoint), its gid naming job, sink, subtask 0 and checkpoint N",
        bool(caught)
        and all(
            (txn := sink_transaction(e.prepared.gid, POSTGRES_SINK_UID, job_id)) is not None
            and (txn.subtask, txn.checkpoint_id) == (SUBTASK, e.checkpoint_id)
            for e in caught
            if e.prepared is not None
        ),
        f"caught in {len(caught)} of {len(epochs)} checkpoints: "
        + (", ".join(e.prepared.gid for e in caught if e.prepared is not None) or "none"),
        caught=len(caught),
        checkpoints=len(epochs),
        gids=tuple(e.prepared.gid for e in caught if e.prepared is not None),
    )
    ordered = [e for e in caught if _prepared_in_order(e)]
    report.verify(
        "postgres-prepared-in-order",
        "it was prepared after checkpoint N was triggered and left pg_prepared_xacts only after it completed",
        bool(caught) and len(ordered) == len(caught),
        "; ".join(_prepared_window(e) for e in caught) or "none caught",
        caught=len(caught),
        in_order=len(ordered),
    )
    hidden = [e for e in caught if _hidden_while_prepared(e)]
    report.verify(
        "postgres-hidden-while-prepared",
        "while prepared, another session sees none of its rows: the table shows exactly the rows the proofs "
        "of earlier checkpoints count, and no proof row of checkpoint N",
        bool(caught) and len(hidden) == len(caught),
        "; ".join(_hidden_numbers(e) for e in caught) or "none caught",
        caught=len(caught),
        hidden=len(hidden),
    )


def _prepared_in_order(e: Epoch) -> bool:
    p, t = e.prepared, e.times
    return (
        p is not None
        and t.completed is not None
        and p.gone_at is not None
        and t.triggered <= p.first_seen
        and p.gone_at >= t.completed
    )


def _prepared_window(e: Epoch) -> str:
    p, t = e.prepared, e.times
    assert p is not None
    gone = "never" if p.gone_at is None else f"{millis(p.gone_at - t.triggered)}"
    done = "never" if t.completed is None else f"{millis(t.completed - t.triggered)}"
    return (
        f"cp {e.checkpoint_id}: prepared seen at +{millis(p.first_seen - t.triggered)}, completed +{done}, gone +{gone}"
    )


def _hidden_while_prepared(e: Epoch) -> bool:
    p = e.prepared
    return (
        p is not None
        and p.prepared_at_snapshot
        and e.checkpoint_id not in p.while_prepared.proofs
        and p.while_prepared.rows == committed_before(p.while_prepared.proofs, e.checkpoint_id)
    )


def _hidden_numbers(e: Epoch) -> str:
    p = e.prepared
    assert p is not None
    v = p.while_prepared
    return (
        f"cp {e.checkpoint_id}: table {v.rows:,} rows = proofs before {committed_before(v.proofs, e.checkpoint_id):,}, "
        f"proof of {e.checkpoint_id} {'present!' if e.checkpoint_id in v.proofs else 'absent'}, "
        + (
            "gid still prepared at the snapshot"
            if p.prepared_at_snapshot
            else "gid gone by the snapshot: proves nothing"
        )
    )


def check_committed(report: ReportBuilder, epochs: Sequence[Epoch]) -> None:
    kafka_ok = bool(epochs) and all(
        e.committed
        and len(e.committed) == len(e.uncommitted)
        and e.seen_before_completion(e.committed) == 0
        and e.seen_before_completion(e.uncommitted) > 0
        for e in epochs
    )
    report.verify(
        "kafka-committed-after-completion",
        "after checkpoint N completed, read_committed sees the epoch's records (all the read_uncommitted consumer "
        "saw), none before the completion",
        kafka_ok,
        "; ".join(
            f"cp {e.checkpoint_id}: read_uncommitted {len(e.uncommitted)} ({e.seen_before_completion(e.uncommitted)} "
            f"before completion), read_committed {len(e.committed)} ({e.seen_before_completion(e.committed)} before)"
            for e in epochs
        )
        or "no checkpoint observed",
        epochs=tuple(
            {
                "checkpoint": e.checkpoint_id,
                "read_uncommitted": len(e.uncommitted),
                "uncommitted_before_completion": e.seen_before_completion(e.uncommitted),
                "read_committed": len(e.committed),
                "committed_before_completion": e.seen_before_completion(e.committed),
            }
            for e in epochs
        ),
    )
    caught = [e for e in epochs if e.prepared is not None]
    pg_ok = bool(caught) and all(_postgres_committed(e) for e in caught)
    report.verify(
        "postgres-committed-after-completion",
        "after it completed, the prepared transaction committed: its gid left pg_prepared_xacts and its rows and "
        "proof row became visible together",
        pg_ok,
        "; ".join(_postgres_commit_numbers(e) for e in caught) or "none caught",
        caught=len(caught),
        committed=sum(1 for e in caught if _postgres_committed(e)),
    )


def _postgres_committed(e: Epoch) -> bool:
    p = e.prepared
    if p is None or p.after_commit is None or e.postgres_proof_rows is None:
        return False
    grown = p.after_commit.rows - p.while_prepared.rows
    return e.checkpoint_id in p.after_commit.proofs and grown == p.after_commit.proofs[e.checkpoint_id] > 0


def _postgres_commit_numbers(e: Epoch) -> str:
    p = e.prepared
    assert p is not None
    if p.after_commit is None:
        return f"cp {e.checkpoint_id}: never left pg_prepared_xacts"
    proof = p.after_commit.proofs.get(e.checkpoint_id)
    return (
        f"cp {e.checkpoint_id}: table {p.while_prepared.rows:,} -> {p.after_commit.rows:,} rows "
        f"(+{p.after_commit.rows - p.while_prepared.rows:,}), proof row {proof if proof is not None else 'absent'}"
    )


def check_proofs(report: ReportBuilder, epochs: Sequence[Epoch]) -> None:
    report.verify(
        "kafka-proof",
        "the Kafka sink's own proof: the commit marker of checkpoint N counts the records read_committed "
        "shows for that epoch",
        bool(epochs) and all(e.marker is not None and e.marker.records == len(e.committed) > 0 for e in epochs),
        "; ".join(
            f"cp {e.checkpoint_id}: marker {e.marker.records if e.marker is not None else 'absent'} = "
            f"read_committed {len(e.committed)}"
            for e in epochs
        )
        or "no checkpoint observed",
        epochs=tuple(
            {
                "checkpoint": e.checkpoint_id,
                "marker_records": e.marker.records if e.marker is not None else None,
                "read_committed": len(e.committed),
            }
            for e in epochs
        ),
    )
    caught = [e for e in epochs if e.prepared is not None]
    report.verify(
        "postgres-proof",
        "the PostgreSQL sink's own proof: its weir_sink_commits row of checkpoint N counts the rows that "
        "became visible with the commit",
        bool(caught) and all(_postgres_committed(e) and _proof_matches_growth(e) for e in caught),
        "; ".join(f"cp {e.checkpoint_id}: proof {e.postgres_proof_rows} = rows added {_growth(e)}" for e in caught)
        or "none caught",
        epochs=tuple(
            {"checkpoint": e.checkpoint_id, "proof_rows": e.postgres_proof_rows, "rows_added": _growth(e)}
            for e in caught
        ),
    )
    report.verify(
        "sinks-committed-same-events",
        "both sinks committed the same events for checkpoint N, in two separate commits: the proofs agree and "
        "the table holds every event of the Kafka epoch",
        bool(epochs)
        and all(
            e.marker is not None
            and e.postgres_proof_rows == e.marker.records
            and e.kafka_events_in_postgres == len(e.committed)
            for e in epochs
        ),
        "; ".join(
            f"cp {e.checkpoint_id}: marker {e.marker.records if e.marker else 'absent'}, proof row "
            f"{e.postgres_proof_rows}, {e.kafka_events_in_postgres} of {len(e.committed)} Kafka events in the table"
            for e in epochs
        )
        or "no checkpoint observed",
        epochs=tuple(
            {
                "checkpoint": e.checkpoint_id,
                "marker_records": e.marker.records if e.marker is not None else None,
                "proof_rows": e.postgres_proof_rows,
                "kafka_events_in_postgres": e.kafka_events_in_postgres,
                "read_committed": len(e.committed),
            }
            for e in epochs
        ),
    )


def _growth(e: Epoch) -> int | None:
    p = e.prepared
    return None if p is None or p.after_commit is None else p.after_commit.rows - p.while_prepared.rows


def _proof_matches_growth(e: Epoch) -> bool:
    return e.postgres_proof_rows is not None and e.postgres_proof_rows == _growth(e)


# The PostgreSQL watcher (a thread) ----------------------------------------------------------------------


def _event_id(value: bytes | None) -> int | None:
    try:
        return int(json.loads(value or b"")["id"])
    except (ValueError, KeyError, TypeError):
        return None


class PreparedWatch(Background):
    """A dedicated session polling pg_prepared_xacts for the job's PostgreSQL sink: when each gid
    appeared and left, and what another session saw right after each of those moments."""

    def __init__(self, endpoints: Endpoints, job_id: str, table: str, pause_s: float) -> None:
        super().__init__("scenario-pg-prepared")
        self._endpoints, self._job_id, self._pause_s = endpoints, job_id, pause_s
        self._table = table
        self._lock = threading.Lock()
        self._sightings: dict[str, PreparedSighting] = {}
        self.polls = 0

    def body(self, stop: threading.Event) -> None:
        with postgres.connect(self._endpoints, autocommit=True) as conn:
            postgres.ensure_commit_proof_table(conn)
            while not stop.is_set():
                gids = self._prepared(conn)
                now = time.time()
                self.polls += 1
                for gid in gids:
                    if gid not in self._sightings:
                        self._first_seen(conn, gid, now)
                for gid, s in list(self._sightings.items()):
                    if s.gone_at is None and gid not in gids:
                        with self._lock:
                            self._sightings[gid] = replace(
                                s, gone_at=now, after_commit=self._read(conn, s.checkpoint_id)[0]
                            )
                stop.wait(self._pause_s)

    def _prepared(self, conn: Any) -> set[str]:
        return {
            gid
            for gid, _at, _db in postgres.prepared_transactions(conn)
            if sink_transaction(gid, POSTGRES_SINK_UID, self._job_id) is not None
        }

    def _first_seen(self, conn: Any, gid: str, now: float) -> None:
        txn = sink_transaction(gid, POSTGRES_SINK_UID, self._job_id)
        assert txn is not None
        visible, prepared = self._read(conn, int(txn.checkpoint_id))
        still = gid in prepared
        with self._lock:
            self._sightings[gid] = PreparedSighting(gid, int(txn.checkpoint_id), int(txn.subtask), now, visible, still)

    def _read(self, conn: Any, checkpoint_id: int) -> tuple[Visible, frozenset[str]]:
        at = time.time()
        snapshot = table_snapshot(conn, self._table, self._job_id, checkpoint_id)
        return Visible(at, len(snapshot.ids), snapshot.proofs), snapshot.prepared

    def sightings(self) -> dict[int, PreparedSighting]:
        with self._lock:
            return {s.checkpoint_id: s for s in self._sightings.values()}


# The driver ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoPhaseCommitRun:
    """What the watchers saw: the open transaction read in the middle of each interval, and each
    observed checkpoint's epoch in both sinks."""

    job_id: str
    reads: Mapping[int, OpenTransactionRead]  # by N: read in interval N
    epochs: tuple[Epoch, ...]  # the checkpoints observed in full
    polls: int  # of pg_prepared_xacts
    steps: tuple[str, ...] = ()


def drive(endpoints: Endpoints, config: TwoPhaseCommitConfig, console: Console) -> TwoPhaseCommitRun:
    """The topic and table, the job, the watchers, the epochs (the cluster is up)."""
    steps: list[str] = []
    recreate_inputs(endpoints, {config.sink_topic: config.partitions}, config.table, TABLE_DEFINITION)
    steps.append(
        f"recreated topic {config.sink_topic} ({config.partitions} partitions) and table {config.table} "
        f"({TABLE_DEFINITION})"
    )
    spec = config.spec()
    with JobManagerClient(endpoints.jobmanager_address) as client:
        job_id = spec.submit(client)
        steps.append(f"submitted job {job_id}: {spec.command()}: every event to the Kafka sink and the PostgreSQL sink")
        console.print(f"job {job_id} submitted; watching {config.checkpoints} checkpoints", soft_wrap=True)
        try:
            run = _observe(endpoints, config, client, job_id, steps)
        finally:
            cancel_unless_ended(client, job_id)
    steps.append(f"cancelled job {job_id}")
    return replace(run, steps=tuple(steps))


def _observe(
    endpoints: Endpoints, config: TwoPhaseCommitConfig, client: JobManagerClient, job_id: str, steps: list[str]
) -> TwoPhaseCommitRun:
    wait_for_job(client, job_id, lambda s: s.summary.status == JobStatus.RUNNING, config.timeout_s, "RUNNING")
    markers = marker_topic_name(job_id, KAFKA_SINK_UID)
    wait_until(
        lambda: kafka.topic_partition_count(endpoints, markers) is not None, config.timeout_s, f"topic {markers}"
    )
    # the marker topic has one partition (parallelism 1)
    uncommitted = TopicWatch(
        endpoints, "read_uncommitted", (config.sink_topic, markers), config.partitions + 1, f"tpc-u-{job_id}"
    )
    committed = TopicWatch(endpoints, "read_committed", (config.sink_topic,), config.partitions, f"tpc-c-{job_id}")
    prepared = PreparedWatch(endpoints, job_id, config.table, config.prepared_poll_s)
    watchers: tuple[Background, ...] = (uncommitted, committed, prepared)
    for w in watchers:
        w.start()
    try:
        wait_until(lambda: uncommitted.ready.is_set() and committed.ready.is_set(), 30.0, "the consumers' partitions")
    except ScenarioError:
        for w in watchers:
            w.stop()
        raise
    started = time.time()
    steps.append(
        "started the watchers: a read_uncommitted consumer (output and marker topic), a read_committed consumer "
        "(output topic), a session of its own polling pg_prepared_xacts "
        f"({config.prepared_poll_s * 1000:g} ms between polls)"
    )
    reads: dict[int, OpenTransactionRead] = {}
    try:
        first = _first_checkpoint_after(client, job_id, started, config.timeout_s)
        last = first + config.checkpoints  # interval `last` is read for the end of the last epoch's range
        restarts = 0
        with postgres.connect(endpoints, autocommit=True) as conn:
            n = first
            while n <= last:
                previous = _wait_completed(client, job_id, n - 1, config.timeout_s)
                assert previous.completed is not None
                middle = previous.completed + config.mid_interval * config.checkpoint_interval_s
                wait_until(_reached(middle), config.timeout_s, f"the middle of interval {n}")
                reads[n] = _read_open_transaction(endpoints, config, client, job_id, n, uncommitted, committed, conn)
                if reads[n].completed_by_then and restarts < MAX_LATE_READS:
                    # This process was late (a stalled machine): the read is of a later transaction than
                    # interval n's, and the epochs' ranges would shift. Observe again from the next one.
                    restarts += 1
                    steps.append(
                        f"the read of interval {n} came after checkpoint {n} completed (this process was late): "
                        f"observing again from interval {n + 1}"
                    )
                    reads.clear()
                    first, last = n + 1, n + 1 + config.checkpoints
                n += 1
        resolved = time.monotonic() + 5.0 + config.checkpoint_interval_s  # one still prepared then fails a check
        while time.monotonic() < resolved and any(
            s.gone_at is None for cp, s in prepared.sightings().items() if first <= cp < last
        ):
            time.sleep(POLL_S)
    finally:
        for w in watchers:
            w.stop()
    elapsed = time.time() - started
    steps.append(
        f"read the open transaction in the middle of intervals {first}..{last}; observed checkpoints "
        f"{first}..{last - 1} in full; stopped the watchers ({prepared.polls:,} pg_prepared_xacts polls in "
        f"{elapsed:.1f} s: one every {elapsed / max(1, prepared.polls) * 1000:.1f} ms)"
    )
    times = {int(c.checkpoint_id): _times(c) for c in client.list_checkpoints(job_id)}
    epochs = _epochs(endpoints, config, job_id, range(first, last), times, reads, uncommitted, committed, prepared)
    return TwoPhaseCommitRun(job_id, reads, tuple(epochs), prepared.polls)


def _read_open_transaction(
    endpoints: Endpoints,
    config: TwoPhaseCommitConfig,
    client: JobManagerClient,
    job_id: str,
    checkpoint_id: int,
    uncommitted: TopicWatch,
    committed: TopicWatch,
    conn: Any,
) -> OpenTransactionRead:
    """In interval N: the open transaction's range, what each consumer holds of it, the table's share."""
    at = time.time()
    offsets = {
        p: (lso, hw)
        for p, (_low, lso, hw) in kafka.partition_offsets(endpoints, config.sink_topic, config.partitions).items()
    }
    total = sum(max(0, hw - lso) for lso, hw in offsets.values())
    deadline = time.monotonic() + 5.0
    seen = received(uncommitted.arrivals(config.sink_topic), offsets)
    while len(seen) < total and time.monotonic() < deadline:
        time.sleep(0.01)
        seen = received(uncommitted.arrivals(config.sink_topic), offsets)
    hidden = len(received(committed.arrivals(config.sink_topic), offsets))
    ids = [a.event_id for a in seen if a.event_id is not None]
    in_table = len(table_snapshot(conn, config.table, job_id, 0).ids & set(ids))
    done = any(
        c.checkpoint_id >= checkpoint_id and c.status is CheckpointStatus.COMPLETED
        for c in client.list_checkpoints(job_id)
    )
    return OpenTransactionRead(checkpoint_id, at, offsets, len(seen), hidden, in_table, done)


def _epochs(
    endpoints: Endpoints,
    config: TwoPhaseCommitConfig,
    job_id: str,
    checkpoints: Iterable[int],
    times: Mapping[int, CheckpointTimes],
    reads: Mapping[int, OpenTransactionRead],
    uncommitted: TopicWatch,
    committed: TopicWatch,
    prepared: PreparedWatch,
) -> list[Epoch]:
    marker_topic = marker_topic_name(job_id, KAFKA_SINK_UID)
    markers = {
        m.checkpoint_id: m
        for _p, _o, _k, value, _ts in kafka.read_committed_records(endpoints, marker_topic)
        if (m := CommitMarker.parse(value)) is not None and m.job_id == job_id and m.subtask == SUBTASK
    }
    flushed = {
        m.checkpoint_id: a.at
        for a in reversed(uncommitted.arrivals(marker_topic))
        if (m := CommitMarker.parse(a.value)) is not None and m.job_id == job_id
    }
    sightings = prepared.sightings()
    u_arrivals, c_arrivals = uncommitted.arrivals(config.sink_topic), committed.arrivals(config.sink_topic)
    out: list[Epoch] = []
    with postgres.connect(endpoints, autocommit=True) as conn:
        final = table_snapshot(conn, config.table, job_id, max(checkpoints, default=0))
        in_table, proofs = final.ids, final.proofs
        for n in checkpoints:
            ranges = epoch_range(reads[n], reads[n + 1])
            c_in = received(c_arrivals, ranges)
            ids = [a.event_id for a in c_in if a.event_id is not None]
            out.append(
                Epoch(
                    times=times.get(n, CheckpointTimes(n, 0.0, None)),
                    kafka_range=ranges,
                    uncommitted=received(u_arrivals, ranges),
                    committed=c_in,
                    marker=markers.get(n),
                    marker_seen_uncommitted=flushed.get(n),
                    postgres_proof_rows=proofs.get(n),
                    prepared=sightings.get(n),
                    kafka_events_in_postgres=len(in_table & set(ids)),
                )
            )
    return out


@dataclass(frozen=True)
class TableSnapshot:
    """What one snapshot of another session shows."""

    ids: frozenset[int]  # the event ids in the table
    proofs: Mapping[int, int]  # the PostgreSQL sink's proof rows of the job: checkpoint id -> rows
    prepared: frozenset[str]  # gids prepared when (or after) the snapshot was taken


def table_snapshot(conn: Any, table: str, job_id: str, through_checkpoint: int) -> TableSnapshot:
    """One repeatable-read transaction: its snapshot is taken at its first statement, which then lists
    pg_prepared_xacts (not MVCC: the live list), so a gid listed was still prepared after the snapshot
    was taken and its commit cannot be in it. Then the table's ids and the proof rows of checkpoints
    1..``through_checkpoint`` (by primary key: fast, the read runs inside a prepare -> commit window)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        prepared = frozenset(gid for gid, _at, _db in postgres.prepared_transactions(conn))
        ids = frozenset(int(row[0]) for row in postgres.fetch_rows(conn, table, ("id",)))
        proofs = {
            cp: rows
            for cp in range(1, through_checkpoint + 1)
            if (rows := postgres.committed_rows(conn, job_id, POSTGRES_SINK_UID, SUBTASK, cp)) is not None
        }
    finally:
        conn.execute("COMMIT")
    return TableSnapshot(ids, proofs, prepared)


def _times(c: CheckpointInfo) -> CheckpointTimes:
    done = c.trigger_time + c.duration_s if c.status is CheckpointStatus.COMPLETED else None
    return CheckpointTimes(int(c.checkpoint_id), c.trigger_time, done)


def _first_checkpoint_after(client: JobManagerClient, job_id: str, started: float, timeout_s: float) -> int:
    """The first checkpoint whose preceding checkpoint completed after the watchers started: its whole
    epoch is seen by them."""
    found: list[int] = []

    def completed_after() -> bool:
        done = [
            int(c.checkpoint_id)
            for c in client.list_checkpoints(job_id)
            if c.status is CheckpointStatus.COMPLETED and c.trigger_time + c.duration_s > started + 0.2
        ]
        found[:] = [min(done)] if done else []
        return bool(done)

    wait_until(completed_after, timeout_s, "a checkpoint to complete after the watchers started")
    return found[0] + 1


def _wait_completed(client: JobManagerClient, job_id: str, checkpoint_id: int, timeout_s: float) -> CheckpointTimes:
    found: list[CheckpointTimes] = []

    def completed() -> bool:
        status = client.job_status(job_id).summary.status
        if status.terminal:
            raise ScenarioError(f"job {job_id} ended {status} while the scenario watched it")
        found[:] = [
            _times(c)
            for c in client.list_checkpoints(job_id)
            if c.checkpoint_id == checkpoint_id and c.status is CheckpointStatus.COMPLETED
        ]
        return bool(found)

    wait_until(completed, timeout_s, f"checkpoint {checkpoint_id} to complete")
    return found[0]


def _reached(at: float) -> Callable[[], bool]:
    """Whether the wall clock has reached ``at``."""
    return lambda: time.time() >= at


# The report ---------------------------------------------------------------------------------------------


def check(config: TwoPhaseCommitConfig, run: TwoPhaseCommitRun) -> Report:
    """The card's outcome as checked statements over the observed epochs."""
    report = ReportBuilder(NAME, OUTCOME)
    for text in run.steps:
        report.step(text)
    epochs = run.epochs
    reads = [run.reads[e.checkpoint_id] for e in epochs if e.checkpoint_id in run.reads]
    report.table(_timeline(epochs))
    for r in reads:
        report.measured(
            f"interval {r.checkpoint_id}: open transaction (LSO, HW) per partition",
            ", ".join(f"p{p} {lso}..{hw}" for p, (lso, hw) in sorted(r.offsets.items())),
        )
    windows = [
        e.prepared.gone_at - e.prepared.first_seen
        for e in epochs
        if e.prepared is not None and e.prepared.gone_at is not None
    ]
    report.measured(
        "prepared state seen for (first seen -> gone)", ", ".join(millis(w) for w in windows) or "never caught"
    )
    report.measured("pg_prepared_xacts polls", f"{run.polls:,}")
    for e in epochs:
        k, p = e.kafka_commit_visible, e.postgres_commit_visible
        if k is not None and p is not None:
            first, second = ("Kafka", "PostgreSQL") if k <= p else ("PostgreSQL", "Kafka")
            report.measured(
                f"checkpoint {e.checkpoint_id}: partial cross-sink success",
                f"{first} committed {millis(abs(p - k))} before {second} (two commits, not one atomic commit)",
            )
    if epochs:
        kafka_proof = CommitProof(
            f"kafka topic {marker_topic_name(run.job_id, KAFKA_SINK_UID)}",
            run.job_id,
            tuple(
                SubtaskCommit(SUBTASK, e.checkpoint_id, e.marker.records) for e in epochs[-1:] if e.marker is not None
            ),
        )
        pg_proof = CommitProof(
            f"postgres table {postgres.COMMIT_PROOF_TABLE}",
            run.job_id,
            tuple(
                SubtaskCommit(SUBTASK, e.checkpoint_id, e.postgres_proof_rows)
                for e in epochs[-1:]
                if e.postgres_proof_rows is not None
            ),
        )
        for line in reconcile([(KAFKA_SINK_UID, kafka_proof), (POSTGRES_SINK_UID, pg_proof)]):
            report.measured(f"reconciliation of the proofs through checkpoint {epochs[-1].checkpoint_id}", line)
    check_open_transactions(report, reads)
    check_prepared(report, epochs, run.job_id)
    check_committed(report, epochs)
    check_proofs(report, epochs)
    return report.build()


def _timeline(epochs: Sequence[Epoch]) -> Table:
    rows: list[tuple[str, ...]] = []
    for e in epochs:
        t0 = e.times.triggered

        def rel(at: float | None, t0: float = t0) -> str:
            return "-" if at is None else f"{(at - t0) * 1000:+,.0f}"

        rows.append(
            (
                str(e.checkpoint_id),
                str(len(e.committed)),
                rel(e.first_uncommitted),
                "0",
                rel(e.marker_seen_uncommitted),
                rel(e.prepared.first_seen if e.prepared is not None else None),
                rel(e.times.completed),
                rel(e.kafka_commit_visible),
                rel(e.postgres_commit_visible),
            )
        )
    return Table(
        "timeline per checkpoint (ms after the checkpoint was triggered)",
        (
            "checkpoint",
            "records",
            "first record uncommitted",
            "triggered",
            "Kafka pre-commit (marker) seen",
            "PG prepared seen",
            "completed",
            "Kafka commit visible",
            "PG commit visible",
        ),
        tuple(rows),
    )


# The command ----------------------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser, defaults: TwoPhaseCommitConfig) -> None:
    parser.add_argument("--events-per-second", type=int, default=defaults.events_per_second)
    parser.add_argument("--checkpoint-interval", type=float, default=defaults.checkpoint_interval_s, help="seconds")
    parser.add_argument("--checkpoints", type=int, default=defaults.checkpoints, help="checkpoints observed in full")


def _configure(args: argparse.Namespace, defaults: TwoPhaseCommitConfig) -> TwoPhaseCommitConfig:
    return replace(
        defaults,
        events_per_second=args.events_per_second,
        checkpoint_interval_s=args.checkpoint_interval,
        checkpoints=args.checkpoints,
    )


SCENARIO: Final = Scenario(
    name=NAME,
    title="two-phase commit: the open Kafka transaction, the prepared PostgreSQL one, both committed",
    summary="within one checkpoint: the open Kafka transaction and the prepared PostgreSQL transaction, then both "
    "committed after completion; each sink's own proof",
    outcome=OUTCOME,
    defaults=TwoPhaseCommitConfig(),
    arguments=_arguments,
    configure=_configure,
    jobs=lambda config: (config.spec(),),
    drive=drive,
    check=check,
)

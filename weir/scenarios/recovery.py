"""``weir scenario recovery``: a TaskManager SIGKILLed after pre-commit, a sink committed ahead of the
other, and what recovery makes of both: duplicate execution, effects once.

1. recreates the topics ``recovery-events`` (3 partitions, one per source subtask), ``recovery-results``,
   ``recovery-dlq`` and the table ``recovery_results``, and produces the events (bounded input);
2. runs examples/keyed_aggregation.py (both sinks) at parallelism 3, a checkpoint every second, its
   source throttled (``source.records_per_second``) so that the run lasts, ``restart.strategy``
   fixed-delay;
3. **kill after pre-commit**: finds the TaskManager that runs PostgreSQL-sink subtask 0, polls
   ``pg_prepared_xacts`` until that subtask has prepared the transaction of a new checkpoint N (the
   sink prepares at the barrier, before its task acknowledges), and at once freezes the TaskManager
   (SIGSTOP to its process group); while it is frozen, records the prepared transactions, the open
   Kafka transactions and whether N completes at the JobManager (it can only if the acknowledgement
   had left); then SIGKILLs it. The supervisor restarts the TaskManager, the job restores its latest
   completed checkpoint: the prepared transaction must be committed if N completed, rolled back if not;
   the open Kafka transaction is aborted (its producer fenced) and its records re-produced;
4. **partial cross-sink success**: after the restore, once the next checkpoint N2 has been prepared by a
   PostgreSQL-sink subtask, ends that subtask's PostgreSQL session (``pg_terminate_backend`` of the
   session that owns the subtask in ``weir_sink_owners``; a prepared transaction outlives its session).
   When N2 completes, each task commits its Kafka sink first, then its PostgreSQL sink, whose
   ``COMMIT PREPARED`` fails on the ended session: the task fails. Between that and the restore, the
   sinks' own commit proofs (marker topic, ``weir_sink_commits``) show the Kafka sink at N2 and the
   PostgreSQL sink behind, N2 still prepared: ``weir verify``'s reconciliation says so. A SIGSTOP cannot
   show this (both sinks run in one task, one after the other, in one process); the session end makes
   the second commit fail deterministically, after the first succeeded. Bounded attempts;
5. once the job FINISHED: reads the results topic with read_uncommitted and read_committed, the window
   tasks' records over all attempts, both sinks, and runs ``weir verify`` (reference mode).

The checked outcome (each compares the run's measurements with what the input alone says):
aborted records exist (read_uncommitted sees records read_committed does not) and each of their
windows is committed exactly once; the window tasks received more records over all attempts than the
input holds (duplicate execution) while the table's counts add up to the input exactly (state counted
each input once); ``weir verify`` finds both sinks exact with nothing prepared or open; the job
restarted once per induced fault and finished; the proofs showed one sink ahead, and after the restore
the behind sink committed the checkpoint and the final reconciliation finds every sink at the same one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Final

from rich.console import Console

from weir.connectors import kafka, postgres
from weir.core.checkpointing import CheckpointStatus
from weir.core.config import Endpoints
from weir.core.states import JobStatus
from weir.operators.transactional_sinks import marker_topic_name
from weir.scenarios.driving import cancel_unless_ended, poll
from weir.scenarios.framework import Figure, JobSpec, Report, ReportBuilder, Scenario, ScenarioError, Table
from weir.scenarios.keyed_job import (
    KAFKA_SINK_UID,
    POSTGRES_SINK_UID,
    WINDOW_UID,
    KeyedJob,
    committed_checkpoints,
    marker_entries,
    prepared_epochs,
    proof_of,
    window_of,
)
from weir.tools.client import JobDetails, JobManagerClient
from weir.tools.drive import wait_for_job
from weir.tools.events import EventSpec, produce_events
from weir.tools.supervisor import cluster_dir, kill_process, local_status
from weir.tools.verify import (
    COMMIT_PROOF_TABLE,
    CommitProof,
    ProofEntry,
    SinkReport,
    VerifyReport,
    reconcile,
    sink_transaction,
    verify_job,
)

NAME: Final = "recovery"
OUTCOME: Final = (
    "After a task failure, Flink restores the latest completed checkpoint and rewinds replayable sources. "
    "Some records execute again, but managed state reflects each logical input once. Duplicate execution is "
    "expected; sink contract determines whether duplicate external effects appear; reconciliation handles "
    "partial cross-sink success."
)
PREPARED_POLL_S: Final = 0.002  # the poll interval of pg_prepared_xacts while waiting for a pre-commit


def recovery_job(prefix: str = "recovery", records_per_second: int = 2_000) -> KeyedJob:
    """The keyed job, bounded, its source throttled to ``records_per_second`` in all (the run lasts
    events / this, plus replays), fixed-delay restarts 4 s apart: the time there is to read the proofs
    between a failure and the restore."""
    return KeyedJob.named(
        prefix, bounded=True, records_per_second=records_per_second, window_ms=500, restart_delay="4s"
    )


@dataclass(frozen=True)
class RecoveryConfig:
    job: KeyedJob = recovery_job()
    events: int = 120_000
    keys: int = 400
    parallelism: int = 3
    partitions: int = 3  # one per source subtask: a subtask reading two drains one before the other, and its
    # watermark (their minimum) would hold the windows back until then
    sink_partitions: int = 3
    killed_subtask: int = 0  # the PostgreSQL-sink subtask whose TaskManager is killed after pre-commit
    freeze_s: float = 2.0  # how long the frozen TaskManager is watched (below the heartbeat timeout, 6 s)
    attempts: int = 4  # tries of each fault (a pre-commit missed by the poll, a commit faster than it)
    capture_s: float = 5.0  # how long the partial commit is looked for in the proofs
    timeout_s: float = 240.0

    @classmethod
    def small(cls, suffix: str = "") -> RecoveryConfig:
        """The integration test's size: about 30 s of input."""
        prefix = f"recovery-{suffix}" if suffix else "recovery"
        return cls(job=recovery_job(prefix, records_per_second=1_500), events=45_000, keys=200, timeout_s=150.0)

    def spec(self) -> JobSpec:
        return self.job.spec(self.parallelism)

    @property
    def table(self) -> str:
        assert self.job.table is not None
        return self.job.table

    def event_spec(self) -> EventSpec:
        """Event time advances 1 ms per event: faster than the wall clock at the throttled pace, so
        windows fire, and both sinks have a transaction to prepare, at every checkpoint."""
        return EventSpec(count=self.events, keys=self.keys, events_per_ms=1)


# Pure parts: what the topics, proofs and prepared transactions say ------------------------------------


OutputRecord = tuple[int, int, bytes | None]  # (partition, offset, value) of a results record


@dataclass(frozen=True)
class AbortedOutput:
    """The results topic read twice: read_uncommitted sees every record written, read_committed only
    those of committed transactions; the difference is what aborted transactions wrote."""

    uncommitted: int
    committed: int
    aborted: int  # records (by partition and offset) read_uncommitted sees and read_committed does not
    aborted_windows: int  # distinct windows among them
    committed_once: int  # of those windows, committed exactly once
    not_committed: int  # committed never
    committed_more: int  # committed more than once
    samples: tuple[str, ...] = ()


def aborted_output(
    uncommitted: Iterable[OutputRecord], committed: Iterable[OutputRecord], samples: int = 3
) -> AbortedOutput:
    """Compare the two reads of one topic by position; each aborted record's window is looked up among
    the committed records."""
    all_records = {(p, o): v for p, o, v in uncommitted}
    committed_records = {(p, o): v for p, o, v in committed}
    aborted = {position: v for position, v in all_records.items() if position not in committed_records}
    committed_windows = Counter(window_of(v) for v in committed_records.values())
    windows = {window_of(v) for v in aborted.values()}
    once = sum(1 for w in windows if committed_windows[w] == 1)
    never = [w for w in windows if committed_windows[w] == 0]
    more = [w for w in windows if committed_windows[w] > 1]
    shown = tuple(
        [f"aborted, never committed: {w}" for w in never[:samples]]
        + [f"aborted, committed {committed_windows[w]}x: {w}" for w in more[:samples]]
    )
    return AbortedOutput(
        len(all_records), len(committed_records), len(aborted), len(windows), once, len(never), len(more), shown
    )


def replayed_records(records_all_attempts: int, input_records: int) -> int:
    """Records the window tasks received beyond one per input record: those a restore replayed."""
    return records_all_attempts - input_records


@dataclass(frozen=True)
class ProofSnapshot:
    """Both sinks' commit proofs and the PostgreSQL sink's prepared transactions, read at one moment:
    PostgreSQL, then Kafka, then PostgreSQL again. The first PostgreSQL read is kept; ``stable`` when
    the second one answered the same, so that it held all through the Kafka read."""

    kafka: CommitProof
    postgres: CommitProof
    prepared: Mapping[int, tuple[int, ...]]  # postgres-sink subtask -> prepared epochs
    postgres_entries: tuple[ProofEntry, ...] = ()
    stable: bool = True  # PostgreSQL read the same before and after the Kafka read

    @property
    def reconciliation(self) -> list[str]:
        return reconcile([(KAFKA_SINK_UID, self.kafka), (POSTGRES_SINK_UID, self.postgres)])

    @property
    def kafka_last(self) -> int | None:
        return self.kafka.last_committed_checkpoint

    @property
    def postgres_last(self) -> int | None:
        return self.postgres.last_committed_checkpoint

    @property
    def settled(self) -> bool:
        """No subtask's Kafka proof behind its PostgreSQL proof. A task commits its Kafka sink first, but
        a read_committed reader sees the commit only once the transaction's markers reach the
        partition, a moment after the commit returned (and the PostgreSQL commit that follows it)."""
        kafka_last = {c.subtask: c.checkpoint_id for c in self.kafka.subtasks}
        return all(kafka_last.get(c.subtask, -1) >= c.checkpoint_id for c in self.postgres.subtasks)

    def behind(self, checkpoint_id: int) -> dict[int, tuple[int, ...]]:
        """The PostgreSQL-sink subtasks whose proof is below ``checkpoint_id`` while they hold prepared
        a transaction that can cover it: an epoch after their last commit, at or before the checkpoint
        (an epoch is named by the checkpoint it expects; after a restore it may be pre-committed at a
        later one)."""
        last = {c.subtask: c.checkpoint_id for c in self.postgres.subtasks}
        out: dict[int, tuple[int, ...]] = {}
        for subtask, epochs in self.prepared.items():
            done = last.get(subtask, 0)
            covering = tuple(e for e in epochs if done < e <= checkpoint_id)
            if done < checkpoint_id and covering:
                out[subtask] = covering
        return out

    def partial(self) -> int | None:
        """The checkpoint the Kafka sink committed and the PostgreSQL sink has only prepared (every
        PostgreSQL subtask behind it, at least one of them holding it prepared); None otherwise."""
        k, p = self.kafka_last, self.postgres_last
        if not self.stable or k is None or p is None or k <= p:
            return None
        return k if self.behind(k) else None


# The cluster's processes -------------------------------------------------------------------------------


def signal_taskmanager(name: str, sig: signal.Signals) -> int:
    """Send ``sig`` to a local-cluster child's process group (as kill_process does with SIGKILL);
    answers its pid."""
    status = local_status(cluster_dir())
    process = None if status is None else next((p for p in status.processes if p.name == name), None)
    if process is None or process.pid is None or not process.alive:
        raise ScenarioError(f"{name} is not running in the local cluster ({cluster_dir()})")
    os.killpg(process.pid, sig)
    return process.pid


def taskmanager_running(name: str) -> bool:
    status = local_status(cluster_dir())
    return status is not None and any(p.name == name and p.alive for p in status.processes)


def sink_task(status: JobDetails, table: str, subtask: int) -> tuple[str, str]:
    """(vertex uid, TaskManager id) of the task that runs PostgreSQL-sink ``subtask``."""
    name = f"postgres-sink:{table}"
    for task in status.tasks:
        if task.subtask == subtask and name in task.operator_names.split(" -> "):
            return task.vertex_uid, task.taskmanager_id
    raise ScenarioError(f"no task of job {status.summary.job_id} runs {name} subtask {subtask}")


# Reading the systems -----------------------------------------------------------------------------------


class Probe:
    """What the scenario reads during the run: one PostgreSQL session, the JobManager and Kafka."""

    def __init__(self, endpoints: Endpoints, client: JobManagerClient, config: RecoveryConfig, job_id: str) -> None:
        self.endpoints = endpoints
        self.client = client
        self.config = config
        self.job_id = job_id
        self.conn = postgres.connect(endpoints, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def prepared(self) -> dict[int, tuple[int, ...]]:
        gids = [gid for gid, _at, _db in postgres.prepared_transactions(self.conn)]
        return prepared_epochs(gids, POSTGRES_SINK_UID, self.job_id)

    def prepared_time(self, subtask: int, epoch: int) -> datetime | None:
        """When the sink subtask's transaction of ``epoch`` was prepared, if it is prepared now. After a
        rollback the subtask opens its next transaction under the same epoch (the ledger's next epoch
        follows the restored checkpoint), so the gid alone does not tell that transaction from the next."""
        for gid, prepared_at, _db in postgres.prepared_transactions(self.conn):
            txn = sink_transaction(gid, POSTGRES_SINK_UID, self.job_id)
            if txn is not None and int(txn.subtask) == subtask and int(txn.checkpoint_id) == epoch:
                return prepared_at if isinstance(prepared_at, datetime) else None
        return None

    def prepared_gids(self) -> list[str]:
        return [
            gid
            for gid, _at, _db in postgres.prepared_transactions(self.conn)
            if sink_transaction(gid, POSTGRES_SINK_UID, self.job_id) is not None
        ]

    def postgres_entries(self) -> list[ProofEntry]:
        """The PostgreSQL sink's commit proof rows of this job (``weir_sink_commits``)."""
        rows = self.conn.execute(
            f"SELECT subtask, checkpoint_id, rows FROM {COMMIT_PROOF_TABLE} WHERE job_id = %s AND operator_uid = %s",
            (self.job_id, POSTGRES_SINK_UID),
        ).fetchall()
        return [ProofEntry(self.job_id, POSTGRES_SINK_UID, int(s), int(cp), int(n or 0), 0) for s, cp, n in rows]

    def kafka_entries(self) -> list[ProofEntry]:
        topic = marker_topic_name(self.job_id, KAFKA_SINK_UID)
        if kafka.topic_partition_count(self.endpoints, topic) is None:
            return []
        records = kafka.read_committed_records(self.endpoints, topic)
        return marker_entries(((value, ts) for _p, _o, _k, value, ts in records), KAFKA_SINK_UID)

    def snapshot(self) -> ProofSnapshot:
        before = (self.postgres_entries(), self.prepared())
        kafka_entries = self.kafka_entries()
        after = (self.postgres_entries(), self.prepared())
        stable = sorted(map(_entry_key, before[0])) == sorted(map(_entry_key, after[0])) and before[1] == after[1]
        return ProofSnapshot(
            proof_of(
                f"kafka topic {marker_topic_name(self.job_id, KAFKA_SINK_UID)}",
                kafka_entries,
                self.job_id,
                KAFKA_SINK_UID,
            ),
            proof_of(f"postgres table {COMMIT_PROOF_TABLE}", before[0], self.job_id, POSTGRES_SINK_UID),
            before[1],
            tuple(before[0]),
            stable,
        )

    def owner_sessions(self) -> dict[int, int]:
        """Per PostgreSQL-sink subtask, the backend pid of the session that owns it now."""
        rows = self.conn.execute(
            f"SELECT subtask, backend_pid FROM {postgres.SINK_OWNER_TABLE} "
            "WHERE job_id = %s AND operator_uid = %s AND backend_pid IS NOT NULL",
            (self.job_id, POSTGRES_SINK_UID),
        ).fetchall()
        return {int(subtask): int(pid) for subtask, pid in rows}

    def end_session(self, pid: int) -> bool:
        row = self.conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
        return bool(row and row[0])

    def checkpoint_status(self, checkpoint_id: int) -> CheckpointStatus | None:
        for c in self.client.list_checkpoints(self.job_id):
            if c.checkpoint_id == checkpoint_id:
                return c.status
        return None

    def open_partitions(self) -> dict[int, int]:
        """Partitions of the results topic with an open transaction: records above the last stable offset."""
        offsets = kafka.partition_offsets(self.endpoints, self.config.job.sink_topic, self.config.sink_partitions)
        return {p: hw - lso for p, (_low, lso, hw) in offsets.items() if lso < hw}


def _entry_key(e: ProofEntry) -> tuple[str, str, int, int]:
    return (e.job_id, e.operator_uid, e.subtask, e.checkpoint_id)


def _running_after(probe: Probe, since: float, what: str, timeout_s: float) -> JobDetails:
    """The job RUNNING again after a restore later than ``since``, with a checkpoint completed after
    the restore (every task has opened its sinks, resolved the restored transactions, run a cycle)."""
    restored: int | None = None  # the last completed checkpoint when the restored job was first seen running

    def ready(s: JobDetails) -> bool:
        nonlocal restored
        if s.summary.status is not JobStatus.RUNNING or s.last_restore_at is None or s.last_restore_at <= since:
            return False
        if restored is None:
            restored = s.last_completed_checkpoint or 0
        return (s.last_completed_checkpoint or 0) > restored

    return wait_for_job(probe.client, probe.job_id, ready, timeout_s, what)


def _new_epoch(probe: Probe, subtask: int, last: int) -> int | None:
    """The epoch after checkpoint ``last`` that the sink subtask holds prepared now, if any."""
    return next((e for e in probe.prepared().get(subtask, ()) if e > last), None)


def _newest_checkpoint(probe: Probe) -> int:
    """The checkpoint triggered last (0: none yet)."""
    return max((c.checkpoint_id for c in probe.client.list_checkpoints(probe.job_id)), default=0)


def _checkpoint_completed(probe: Probe, checkpoint_id: int) -> bool:
    return probe.checkpoint_status(checkpoint_id) is CheckpointStatus.COMPLETED


class _SessionEnder:
    """One poll of the prepared transactions: end the owning session of each PostgreSQL-sink subtask
    that has just prepared an epoch after ``last``; done once every owner was ended, or ``rest_s``
    after the first (the subtasks prepare at the same barrier: one that has not prepared by then has
    nothing to prepare at it, or the checkpoint is over)."""

    def __init__(self, probe: Probe, last: int, owners: Mapping[int, int], rest_s: float = 2.0) -> None:
        self._probe, self._last, self._owners, self._rest_s = probe, last, owners, rest_s
        self.ended: dict[int, int] = {}  # subtask -> ended backend pid
        self._first_at: float | None = None

    def __call__(self) -> bool:
        for subtask, prepared in self._probe.prepared().items():
            new = [e for e in prepared if e > self._last]
            if new and subtask not in self.ended and subtask in self._owners:
                self._probe.end_session(self._owners[subtask])
                self.ended[subtask] = self._owners[subtask]
                self._first_at = self._first_at or time.monotonic()
        if self._owners and len(self.ended) >= len(self._owners):
            return True
        return self._first_at is not None and time.monotonic() - self._first_at >= self._rest_s


def _settled_snapshot(probe: Probe) -> ProofSnapshot | None:
    snapshot = probe.snapshot()
    return snapshot if snapshot.settled else None


def _completed_after(probe: Probe, last: int) -> int | None:
    """The first checkpoint after ``last`` that completed at the JobManager, if one has."""
    done = [
        c.checkpoint_id
        for c in probe.client.list_checkpoints(probe.job_id)
        if c.checkpoint_id > last and c.status is CheckpointStatus.COMPLETED
    ]
    return min(done, default=None)


class _Capture:
    """One read of the proofs: answers them (with the prepared gids) when they show ``checkpoint``
    committed by the Kafka sink and only prepared by the PostgreSQL sink; keeps the last read."""

    def __init__(self, probe: Probe, checkpoint: int) -> None:
        self._probe, self._checkpoint = probe, checkpoint
        self.last: ProofSnapshot | None = None

    def __call__(self) -> tuple[ProofSnapshot, list[str]] | None:
        self.last = snapshot = self._probe.snapshot()
        if snapshot.partial() == self._checkpoint:
            return snapshot, self._probe.prepared_gids()
        return None


# Step 3: SIGKILL after pre-commit ------------------------------------------------------------------------


@dataclass(frozen=True)
class KillOutcome:
    taskmanager: str
    pid: int
    subtask: int
    epoch: int  # the epoch (transaction) the frozen subtask had prepared
    checkpoint_id: int  # the checkpoint in flight at the freeze, whose barrier made it prepare
    prepared_at_kill: Mapping[int, tuple[int, ...]]  # the sink's prepared epochs while frozen
    open_partitions_at_kill: Mapping[int, int]  # results partitions -> records in open transactions
    completed_while_frozen: bool
    checkpoint_final_status: CheckpointStatus | None = None
    committed_after: bool = False  # the subtask's proof shows the checkpoint committed after the restore
    prepared_after: bool = False  # the transaction prepared at the kill is still prepared after the restore
    killed_at: float = 0.0
    attempts: int = 1

    @property
    def resolved_as_checkpoint_says(self) -> bool:
        completed = self.checkpoint_final_status is CheckpointStatus.COMPLETED
        return not self.prepared_after and self.committed_after == completed


def kill_after_pre_commit(probe: Probe, steps: list[str], console: Console) -> KillOutcome:
    config = probe.config
    subtask = config.killed_subtask
    for attempt in range(1, config.attempts + 1):
        status = wait_for_job(
            probe.client,
            probe.job_id,
            lambda s: s.summary.status is JobStatus.RUNNING and (s.last_completed_checkpoint or 0) >= 1,
            config.timeout_s,
            "a completed checkpoint",
        )
        vertex, taskmanager = sink_task(status, config.table, subtask)
        if not taskmanager_running(taskmanager):
            raise ScenarioError(f"{taskmanager} runs {vertex}#{subtask} but is not running")
        last = status.last_completed_checkpoint or 0
        epoch = poll(partial(_new_epoch, probe, subtask, last), 10.0, PREPARED_POLL_S)
        if epoch is None:
            raise ScenarioError(f"{POSTGRES_SINK_UID}#{subtask} prepared no transaction after checkpoint {last}")
        pid = signal_taskmanager(taskmanager, signal.SIGSTOP)
        frozen = True
        try:
            prepared = probe.prepared()
            prepared_at = probe.prepared_time(subtask, epoch)
            if epoch not in prepared.get(subtask, ()) or prepared_at is None:  # committed before the SIGSTOP
                console.print(f"attempt {attempt}: epoch {epoch} was committed before the freeze took; again")
                signal_taskmanager(taskmanager, signal.SIGCONT)
                frozen = False
                continue
            checkpoint = _newest_checkpoint(probe)
            steps.append(
                f"{POSTGRES_SINK_UID}#{subtask} (on {taskmanager}, pid {pid}) prepared its transaction (epoch {epoch}) "
                f"at the barrier of checkpoint {checkpoint} (pg_prepared_xacts): {taskmanager} frozen at once (SIGSTOP)"
            )
            open_partitions = probe.open_partitions()
            completed = poll(partial(_checkpoint_completed, probe, checkpoint), config.freeze_s, 0.05)
            killed_at = time.time()
        finally:
            if frozen:
                kill_process(cluster_dir(), taskmanager)  # SIGKILL ends a stopped process too
        steps.append(
            f"checkpoint {checkpoint} {'completed' if completed else 'did not complete'} at the JobManager while "
            f"{taskmanager} was frozen ({config.freeze_s:g} s): "
            + ("its acknowledgement had left" if completed else "its acknowledgement had not left")
            + f"; {taskmanager} SIGKILLed (pid {pid})"
        )
        console.print(
            f"[red]SIGKILL {taskmanager}[/] (pid {pid}) with checkpoint {checkpoint} prepared", highlight=False
        )
        _running_after(probe, killed_at, f"the restore after killing {taskmanager}", config.timeout_s)
        final_status = probe.checkpoint_status(checkpoint)
        entries = probe.postgres_entries()
        committed = checkpoint in committed_checkpoints(entries, probe.job_id, POSTGRES_SINK_UID, subtask)
        return KillOutcome(
            taskmanager,
            pid,
            subtask,
            epoch,
            checkpoint,
            prepared,
            open_partitions,
            bool(completed),
            final_status,
            committed,
            probe.prepared_time(subtask, epoch) == prepared_at,  # that transaction, not the next of its epoch
            killed_at,
            attempt,
        )
    raise ScenarioError(
        f"no prepared transaction of {POSTGRES_SINK_UID}#{subtask} held still in {config.attempts} tries"
    )


# Step 4: one sink committed, the other not yet ----------------------------------------------------------


@dataclass(frozen=True)
class PartialOutcome:
    checkpoint_id: int  # the checkpoint the Kafka sink committed and the PostgreSQL sink had only prepared
    ended_sessions: Mapping[int, int]  # postgres-sink subtask -> backend pid ended after its prepare
    during: ProofSnapshot
    prepared_during: tuple[str, ...]
    after: ProofSnapshot
    failed_at: float
    attempts: int

    @property
    def behind_subtasks(self) -> tuple[int, ...]:
        """The PostgreSQL-sink subtasks that held the checkpoint prepared, not committed."""
        return tuple(self.during.behind(self.checkpoint_id))

    @property
    def caught_up(self) -> bool:
        """After the restore every behind subtask committed the checkpoint and no longer holds the
        transaction it had prepared for it."""
        behind = self.during.behind(self.checkpoint_id)
        job_id = self.during.postgres.job_id or ""
        committed = all(
            self.checkpoint_id in committed_checkpoints(self.after.postgres_entries, job_id, POSTGRES_SINK_UID, s)
            for s in behind
        )
        still = any(set(epochs) & set(self.after.prepared.get(s, ())) for s, epochs in behind.items())
        return bool(behind) and committed and not still


def partial_commit(probe: Probe, steps: list[str], console: Console, since: float) -> PartialOutcome:
    config = probe.config
    for attempt in range(1, config.attempts + 1):
        status = _running_after(probe, since, "the job running again", config.timeout_s)
        last = status.last_completed_checkpoint or 0
        ender = _SessionEnder(probe, last, probe.owner_sessions())
        poll(ender, 10.0, PREPARED_POLL_S)
        failed_at = time.time()
        ended = ender.ended
        if not ended:
            raise ScenarioError(f"no {POSTGRES_SINK_UID} subtask prepared a transaction after checkpoint {last}")
        checkpoint = poll(partial(_completed_after, probe, last), config.capture_s, 0.02)
        capture = _Capture(probe, checkpoint) if checkpoint is not None else None
        found = poll(capture, config.capture_s, 0.02) if capture is not None else None
        if capture is None or found is None:
            seen = capture.last if capture is not None else None
            console.print(
                f"attempt {attempt}: no moment with {KAFKA_SINK_UID} at checkpoint {checkpoint} and "
                f"{POSTGRES_SINK_UID} behind (sessions ended of subtasks {sorted(ended)}; last proofs read: "
                + (
                    f"{KAFKA_SINK_UID} {seen.kafka_last}, {POSTGRES_SINK_UID} {seen.postgres_last}, prepared "
                    f"{dict(seen.prepared)}, stable {seen.stable}"
                    if seen is not None
                    else "none"
                )
                + "); again",
                soft_wrap=True,
                highlight=False,
            )
            since = failed_at
            continue
        during, gids = found
        assert checkpoint is not None  # found: captured at that checkpoint
        steps.append(
            f"after checkpoint {last}: ended the PostgreSQL session of {POSTGRES_SINK_UID} subtask(s) "
            f"{sorted(ended)} (pids {sorted(ended.values())}) right after each prepared checkpoint {checkpoint}; "
            f"at its completion each task committed {KAFKA_SINK_UID}, then failed on COMMIT PREPARED"
        )
        steps.append("read the commit proofs between that failure and the restore: " + "; ".join(during.reconciliation))
        _running_after(probe, failed_at, "the restore after the failed PostgreSQL commit", config.timeout_s)
        after = poll(partial(_settled_snapshot, probe), config.capture_s, 0.05) or probe.snapshot()
        steps.append("after the restore: " + "; ".join(after.reconciliation))
        return PartialOutcome(checkpoint, ended, during, tuple(gids), after, failed_at, attempt)
    raise ScenarioError(f"no partial cross-sink commit captured in {config.attempts} tries")


# The whole run -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecoveryRun:
    """What the driver measured: both faults, the job's end, the results topic read twice, the table's
    counts and ``weir verify``'s comparison."""

    job_id: str
    kill: KillOutcome
    partial: PartialOutcome
    final: JobDetails
    aborted: AbortedOutput
    records_all_attempts: int
    input_records: int
    table_count: int
    kafka_count: int
    verify: VerifyReport
    steps: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def replayed(self) -> int:
        return replayed_records(self.records_all_attempts, self.input_records)


def drive(endpoints: Endpoints, config: RecoveryConfig, console: Console) -> RecoveryRun:
    """Inputs, the job, both faults, the job's end and everything read back (the cluster is up)."""
    began = time.monotonic()
    timings: dict[str, float] = {}
    job = config.job
    job.recreate(endpoints, config.partitions, config.sink_partitions)
    produced = produce_events(endpoints, job.source_topic, config.event_spec())
    console.print(
        f"inputs: {produced:,} events ({config.keys} keys) in {job.source_topic} ({config.partitions} partitions); "
        f"results to {job.sink_topic} and table {job.table}",
        soft_wrap=True,
    )
    timings["inputs"] = time.monotonic() - began
    spec = config.spec()
    steps: list[str] = [
        f"produced {produced:,} events ({config.keys} keys) into {job.source_topic}; ran {spec.command()}: "
        f"bounded, throttled to {job.records_per_second:,}/s, a checkpoint every {job.checkpoint_interval}, "
        f"restart fixed-delay {job.restart_delay}"
    ]
    with JobManagerClient(endpoints.jobmanager_address) as client:
        job_id = spec.submit(client)
        console.print(f"job {job_id} submitted: {spec.command()}", soft_wrap=True, highlight=False)
        probe = Probe(endpoints, client, config, job_id)
        try:
            kill = kill_after_pre_commit(probe, steps, console)
            timings["kill and restore"] = time.monotonic() - began - sum(timings.values())
            partial_outcome = partial_commit(probe, steps, console, kill.killed_at)
            timings["partial commit and restore"] = time.monotonic() - began - sum(timings.values())
            final = wait_for_job(
                client, job_id, lambda s: s.summary.status is JobStatus.FINISHED, config.timeout_s, "its end"
            )
            timings["to the end"] = time.monotonic() - began - sum(timings.values())
            with postgres.connect(endpoints, autocommit=True) as conn:
                row = conn.execute(f'SELECT coalesce(sum(count), 0) FROM "{config.table}"').fetchone()
            table_count = int(row[0]) if row else 0
        except BaseException:
            cancel_unless_ended(client, job_id)  # leave no job of a broken run holding slots
            raise
        finally:
            probe.close()
    uncommitted = [(p, o, v) for p, o, _k, v in kafka.read_all(endpoints, job.sink_topic, "read_uncommitted")]
    committed = [(p, o, v) for p, o, _k, v, _ts in kafka.read_committed_records(endpoints, job.sink_topic)]
    aborted = aborted_output(uncommitted, committed)
    kafka_count = sum(json.loads(v or b"{}").get("count", 0) for _p, _o, v in committed)
    window_tasks = [t for t in final.tasks if t.vertex_uid == WINDOW_UID]
    if not window_tasks:
        raise ScenarioError(f"job {job_id} has no {WINDOW_UID} task")
    verified = verify_job(job.file, job.parameters(), job_id=job_id, endpoints=endpoints)
    timings["read and verify"] = time.monotonic() - began - sum(timings.values())
    steps.append(f"job FINISHED; read {job.sink_topic} twice (read_uncommitted, read_committed); ran weir verify")
    return RecoveryRun(
        job_id,
        kill,
        partial_outcome,
        final,
        aborted,
        sum(t.records_in_all_attempts for t in window_tasks),
        produced,
        table_count,
        kafka_count,
        verified,
        tuple(steps),
        timings,
    )


# The checks ---------------------------------------------------------------------------------------------


def check(config: RecoveryConfig, o: RecoveryRun) -> Report:
    """The run's evidence and the card's outcome as checked statements."""
    report = ReportBuilder(NAME, OUTCOME)
    for text in o.steps:
        report.step(text)
    report.table(proof_timeline(o.partial))

    k, p, a = o.kill, o.partial, o.aborted
    report.measured(
        "prepared at the SIGKILL (pg_prepared_xacts)",
        ", ".join(f"{POSTGRES_SINK_UID}#{s}: {list(e)}" for s, e in k.prepared_at_kill.items()) or "none",
    )
    report.measured(
        "open Kafka transactions at the SIGKILL",
        ", ".join(f"partition {part}: {n} records above the LSO" for part, n in k.open_partitions_at_kill.items())
        or "none",
    )
    report.measured(
        f"checkpoint {k.checkpoint_id} at the JobManager",
        f"{'completed' if k.completed_while_frozen else 'not completed'} while frozen; "
        f"finally {k.checkpoint_final_status.name if k.checkpoint_final_status else 'unknown'}",
    )
    report.measured(
        f"{POSTGRES_SINK_UID}#{k.subtask} checkpoint {k.checkpoint_id} (epoch {k.epoch}) after the restore",
        ("committed" if k.committed_after else "not committed")
        + (", still prepared" if k.prepared_after else ", not prepared"),
    )
    report.measured(
        "partial commit: sessions ended", ", ".join(f"#{s} pid {pid}" for s, pid in sorted(p.ended_sessions.items()))
    )
    report.measured("partial commit: prepared then", ", ".join(p.prepared_during) or "none")
    report.measured(
        "partial commit: proofs then",
        f"{KAFKA_SINK_UID} up to {p.during.kafka_last}, {POSTGRES_SINK_UID} up to {p.during.postgres_last}",
    )
    report.measured("reconciliation then (weir verify's)", " | ".join(p.during.reconciliation))
    report.measured("reconciliation after the restore", " | ".join(p.after.reconciliation))
    report.measured(
        f"{config.job.sink_topic} read_uncommitted / read_committed",
        f"{a.uncommitted:,} / {a.committed:,} records: {a.aborted:,} aborted ({a.aborted_windows:,} windows)",
    )
    report.measured(
        f"{WINDOW_UID} records, all attempts",
        f"{o.records_all_attempts:,} for {o.input_records:,} input events: {o.replayed:,} replayed",
    )
    report.measured("Σ count: table / Kafka (read_committed)", f"{o.table_count:,} / {o.kafka_count:,}")
    for s in o.verify.sinks:
        report.measured(
            f"weir verify {s.uid} ({s.target})",
            f"expected {s.expected:,}, found {s.found:,}; " + (", ".join(s.problems()) or "exact"),
        )
    report.measured("weir verify reconciliation (final)", " | ".join(o.verify.reconciliation))
    report.measured("restarts", o.final.summary.restarts)
    report.measured("timings", ", ".join(f"{name} {s:.1f}s" for name, s in o.timings.items()))
    for sample in a.samples:
        report.note(sample)

    v = report.verify
    v(
        "killed-after-pre-commit",
        "a TaskManager was SIGKILLed after pre-commit: its PostgreSQL sink subtask held the checkpoint's "
        "transaction prepared at the kill",
        k.epoch in k.prepared_at_kill.get(k.subtask, ()),
        f"{k.taskmanager} killed in checkpoint {k.checkpoint_id}; {POSTGRES_SINK_UID}#{k.subtask} prepared epochs "
        f"{list(k.prepared_at_kill.get(k.subtask, ()))} ∋ {k.epoch}",
        checkpoint=k.checkpoint_id,
        epoch=k.epoch,
        subtask=k.subtask,
        prepared_epochs=k.prepared_at_kill.get(k.subtask, ()),
    )
    final_name = k.checkpoint_final_status.name if k.checkpoint_final_status else "unknown"
    v(
        "prepared-resolved-as-checkpoint",
        "recovery resolved that prepared transaction as the checkpoint's outcome says (committed if it "
        "completed, rolled back if not)",
        k.resolved_as_checkpoint_says,
        f"checkpoint {k.checkpoint_id} {final_name}; {'committed' if k.committed_after else 'not committed'}, "
        f"{'still prepared' if k.prepared_after else 'not prepared'}",
        checkpoint_status=final_name,
        committed_after=k.committed_after,
        prepared_after=k.prepared_after,
    )
    v(
        "aborted-records-uncommitted-only",
        "the aborted transactions' records are seen by read_uncommitted only",
        a.aborted > 0,
        f"read_uncommitted {a.uncommitted:,} − read_committed {a.committed:,} = {a.aborted:,} aborted > 0",
        read_uncommitted=a.uncommitted,
        read_committed=a.committed,
        aborted=a.aborted,
    )
    v(
        "aborted-windows-committed-once",
        "every aborted record's window is committed exactly once",
        a.aborted_windows > 0 and a.committed_once == a.aborted_windows,
        f"{a.committed_once:,} of {a.aborted_windows:,} windows once; {a.not_committed} never, "
        f"{a.committed_more} more than once",
        aborted_windows=a.aborted_windows,
        committed_once=a.committed_once,
        not_committed=a.not_committed,
        committed_more=a.committed_more,
    )
    v(
        "duplicate-execution",
        "duplicate execution happened: the window tasks received records again after the restores",
        o.replayed > 0,
        f"{o.records_all_attempts:,} received over all attempts − {o.input_records:,} input = {o.replayed:,} > 0",
        records_all_attempts=o.records_all_attempts,
        input_records=o.input_records,
        replayed=o.replayed,
    )
    v(
        "state-counts-each-input-once",
        "managed state reflects each logical input once: the committed windows count every event once",
        o.table_count == o.input_records and o.kafka_count == o.input_records,
        f"Σ count table {o.table_count:,}, Kafka {o.kafka_count:,} = input {o.input_records:,}",
        table_count=o.table_count,
        kafka_count=o.kafka_count,
        input_records=o.input_records,
    )
    sinks = {s.uid: s for s in o.verify.sinks}
    v(
        "sinks-exact",
        "both sinks are exact (weir verify): no duplicate external effect, nothing left prepared or open",
        o.verify.ok and set(sinks) == {KAFKA_SINK_UID, POSTGRES_SINK_UID},
        "; ".join(
            f"{s.uid} {s.found:,}/{s.expected:,} " + (", ".join(s.problems()) or "exact") for s in sinks.values()
        ),
        **_sink_figures(sinks),
    )
    v(
        "restarted-and-finished",
        "the job restarted after each induced failure and finished",
        o.final.summary.status is JobStatus.FINISHED and o.final.summary.restarts >= 1 + p.attempts,
        f"{o.final.summary.status.name}, restarts {o.final.summary.restarts} ≥ {1 + p.attempts} (1 SIGKILL, "
        f"{p.attempts} failed PostgreSQL commit{'s' if p.attempts > 1 else ''})",
        status=o.final.summary.status.name,
        restarts=o.final.summary.restarts,
        induced_failures=1 + p.attempts,
    )
    v(
        "partial-cross-sink-success",
        f"partial cross-sink success: {KAFKA_SINK_UID} committed checkpoint N, {POSTGRES_SINK_UID} not yet "
        "(N prepared); weir verify's reconciliation says so",
        p.during.partial() == p.checkpoint_id and any("will commit" in line for line in p.during.reconciliation),
        f"N = {p.checkpoint_id}: {KAFKA_SINK_UID} up to {p.during.kafka_last}, {POSTGRES_SINK_UID} up to "
        f"{p.during.postgres_last}, prepared in subtasks {list(p.behind_subtasks)}",
        checkpoint=p.checkpoint_id,
        kafka_last=p.during.kafka_last,
        postgres_last=p.during.postgres_last,
        behind_subtasks=p.behind_subtasks,
        reconciliation=tuple(p.during.reconciliation),
    )
    final_lasts = {s.uid: s.commit_proof.last_committed_checkpoint for s in o.verify.sinks}
    v(
        "behind-sink-caught-up",
        "recovery caught the behind sink up: it committed N, and in the end every sink committed up to the "
        "same checkpoint",
        p.caught_up and len(set(final_lasts.values())) == 1 and None not in final_lasts.values(),
        f"{POSTGRES_SINK_UID} committed {p.checkpoint_id} in subtasks {list(p.behind_subtasks)}: "
        f"{'yes' if p.caught_up else 'no'}; final " + ", ".join(f"{u} {c}" for u, c in final_lasts.items()),
        caught_up=p.caught_up,
        final_last_committed=final_lasts,
    )
    return report.build()


def _sink_figures(sinks: Mapping[str, SinkReport]) -> dict[str, Figure]:
    out: dict[str, Figure] = {}
    for uid, s in sinks.items():
        figures: dict[str, Figure] = {"found": s.found, "expected": s.expected, "problems": tuple(s.problems())}
        out[uid] = figures
    return out


def proof_timeline(p: PartialOutcome) -> Table:
    """The commit proofs around the partial commit, per subtask."""
    return Table(
        "commit proofs",
        ("moment", "sink", "subtask: last committed checkpoint"),
        tuple(
            (moment, uid, ", ".join(f"#{c.subtask}: {c.checkpoint_id}" for c in proof.subtasks))
            for moment, snap in (("between failure and restore", p.during), ("after the restore", p.after))
            for uid, proof in ((KAFKA_SINK_UID, snap.kafka), (POSTGRES_SINK_UID, snap.postgres))
        ),
    )


# The command ----------------------------------------------------------------------------------------------


def _arguments(parser: argparse.ArgumentParser, defaults: RecoveryConfig) -> None:
    parser.add_argument("--small", action="store_true", help="the integration test's size (about 30 s of input)")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--records-per-second", type=int, default=None)


def _configure(args: argparse.Namespace, defaults: RecoveryConfig) -> RecoveryConfig:
    config = RecoveryConfig.small() if args.small else defaults
    if args.events is not None:
        config = replace(config, events=args.events)
    if args.records_per_second is not None:
        config = replace(config, job=config.job.with_(records_per_second=args.records_per_second))
    return config


SCENARIO: Final = Scenario(
    name=NAME,
    title="recovery (SIGKILL after pre-commit, a partial cross-sink commit)",
    summary="a TaskManager SIGKILLed after pre-commit: aborted records only for read_uncommitted, replay counted, "
    "state and both sinks exact, partial cross-sink success reconciled by weir verify",
    outcome=OUTCOME,
    defaults=RecoveryConfig(),
    arguments=_arguments,
    configure=_configure,
    jobs=lambda config: (config.spec(),),
    drive=drive,
    check=check,
)

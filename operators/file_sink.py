"""The exactly-once file sink: part files on S3 or in a directory, finished when a checkpoint
covering them completes (Flink's ``FileSink``, with its two-phase ``SinkWriter`` / ``Committer``).

Per sink subtask and bucket one part file is in progress at a time. It rolls (is closed, and the
next record of its bucket starts a new one) by size and by time (:class:`RollingPolicy`), and at
every checkpoint barrier. Closed part files belong to the sink transaction of their epoch
(:class:`~weir.operators.twophase.TwoPhaseCommitLedger`, as the Kafka and PostgreSQL sinks): the
barrier of checkpoint N pre-commits the epoch, its closed files' committables go into the snapshot
of N, and the notification of N's completion finishes them (completes the S3 multipart uploads, or
renames the hidden files). Recovery (``open`` after a restore, or the JobManager's resolution of an
ended job) finishes what the restored checkpoint lists and discards every other unfinished part file
of the subtask (``weir.operators.part_files.plan_part_recovery``). A reader of the path sees only
finished files, so only output of completed checkpoints, each record once.

With a :class:`~weir.operators.partition_commit.PartitionCommit` (the SQL ``'filesystem'`` sink's
``sink.partition-commit.*``), each completed checkpoint also records the subtask's progress in the
sink's storage and writes ``_SUCCESS`` into each partition every subtask is done with
(``weir.operators.partition_commit``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, assert_never

from weir.connectors.files import (
    DEFAULT_PART_BYTES,
    ClosedPartFile,
    Finished,
    PartFileStore,
    PartFileWriter,
    UnfinishedPartFile,
    open_part_file_store,
)
from weir.core.config import Endpoints
from weir.core.crashpoints import AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT, AFTER_PRE_COMMIT, crash_point
from weir.core.errors import Fault, SerializationError, WeirError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.metrics import SinkMetrics
from weir.core.rejections import FAIL, OnRecordError
from weir.core.watermarks import MAX_WATERMARK, MIN_WATERMARK
from weir.operators.base import (
    NO_PARAMETERS,
    NO_SIDE_OUTPUTS,
    InheritedState,
    OperatorContext,
    Output,
    SideOutputs,
    StreamOperator,
)
from weir.operators.part_files import (
    AlreadyFinished,
    DiscardPart,
    FileFormat,
    FileSinkSnapshot,
    FinishPart,
    FoundInProgress,
    PartFileName,
    PartLost,
    PendingPartFile,
    RollingPolicy,
    UploadedPart,
    check_bucket,
    describe,
    hourly_bucket,
    plan_part_recovery,
)
from weir.operators.partition_commit import (
    CommitProgress,
    PartitionCommit,
    PendingPartition,
    committable,
    progress_key,
)
from weir.operators.twophase import TransactionId, TwoPhaseCommitLedger

DEFAULT_ROW_GROUP_ROWS: Final = 10_000
DEFAULT_ROLLING: Final = RollingPolicy()
BucketAssigner = Callable[[Any, int | None], str]
"""A record (value, event timestamp ms or None) to its bucket, a relative folder such as ``dt=2026-12-04``."""


class PartFileLostError(WeirError):
    """A part file the restored checkpoint lists is neither unfinished nor finished any more:
    something outside the job deleted it (or aborted its upload). Its records are missing."""

    fault: Fault = Fault.EXTERNAL


class FileSinkEndOfInputError(WeirError):
    """The sink reached its end of input with part files no acknowledged checkpoint covers: a bug in
    Weir (the final checkpoint's barrier follows every record), not in the job."""

    fault: Fault = Fault.INTERNAL


def default_bucket(value: Any, timestamp: int | None) -> str:
    """By the hour of the record's timestamp, UTC (``dt=YYYY-MM-DD/hour=HH``); a record without one by
    the wall clock's hour."""
    return hourly_bucket(timestamp if timestamp is not None else int(time.time() * 1000))


def _success_key(bucket: str, success_file: str) -> str:
    return f"{bucket}/{success_file}" if bucket else success_file


def json_line(value: Any) -> bytes:
    """A JSONL record: compact JSON, one line."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class _Encoder:
    """Encoded records (a JSONL line, a Parquet row) into one part file's bytes."""

    def add(self, item: Any) -> None:
        raise NotImplementedError

    def flush_rows(self) -> None:
        """Write what is buffered (Parquet: a row group)."""

    def finish(self) -> None:
        """Write the file's end (Parquet: the footer)."""


class _Lines(_Encoder):
    """A row format's file (JSON Lines, CSV): each record's line as the serializer gave it."""

    def __init__(self, out: PartFileWriter) -> None:
        self._out = out

    def add(self, item: Any) -> None:
        self._out.write(item)


class _Parquet(_Encoder):
    """Rows buffered into row groups of ``row_group_rows``; the schema is the sink's (given, or
    inferred from its first row group and kept for every later part file of the subtask)."""

    def __init__(self, out: PartFileWriter, schema_holder: _SchemaHolder, row_group_rows: int, where: str) -> None:
        self._out = out
        self._schema = schema_holder
        self._rows: list[Mapping[str, Any]] = []
        self._row_group_rows = row_group_rows
        self._writer: Any = None
        self._where = where

    def add(self, item: Any) -> None:
        self._rows.append(item)
        if len(self._rows) >= self._row_group_rows:
            self.flush_rows()

    def flush_rows(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows, self._rows = self._rows, []
        try:
            table = pa.Table.from_pylist(rows, schema=self._schema.schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise SerializationError(
                f"{self._where}: {len(rows)} row(s) do not fit the Parquet schema "
                f"({self._schema.schema or 'inferred'}): {exc}; give the sink a schema that fits every record",
                fault="user",
            ) from exc
        if self._schema.schema is None:
            self._schema.schema = table.schema
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._out, table.schema)
        self._writer.write_table(table)

    def finish(self) -> None:
        self.flush_rows()
        if self._writer is not None:
            self._writer.close()


@dataclass
class _SchemaHolder:
    schema: Any = None  # a pyarrow.Schema once given or inferred


@dataclass
class _InProgress:
    name: PartFileName
    writer: PartFileWriter
    encoder: _Encoder
    opened_at_ms: int
    records: int = 0


@dataclass
class _EpochFiles:
    """The closed part files of one epoch (sink transaction), from its first record to its commit."""

    txn: TransactionId
    files: list[PendingPartFile] = field(default_factory=list)
    next_number: int = 0
    checkpoint_id: CheckpointId | None = None  # the barrier it was pre-committed at


class PartFileSinkOperator(StreamOperator):
    """Writes records into part files under ``path`` (``s3://bucket/prefix`` or a directory), exactly
    once: see the module's docstring and docs/sinks.md."""

    def __init__(
        self,
        path: str,
        file_format: FileFormat,
        *,
        bucket_assigner: BucketAssigner = default_bucket,
        rolling: RollingPolicy = DEFAULT_ROLLING,
        serializer: Callable[[Any], bytes] = json_line,
        schema: Any = None,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        s3_part_bytes: int = DEFAULT_PART_BYTES,
        on_error: OnRecordError = FAIL,
        clock: Callable[[], float] = time.time,
        partition_commit: PartitionCommit | None = None,
    ) -> None:
        self._path = path
        self._partition_commit = partition_commit
        self._format = file_format
        self._bucket_assigner = bucket_assigner
        self._rolling = rolling
        self._serializer = serializer
        self._schema = _SchemaHolder(schema)
        self._row_group_rows = row_group_rows
        self._s3_part_bytes = s3_part_bytes
        self.on_error = on_error
        self._clock = clock
        self._store: PartFileStore | None = None
        self._restored: FileSinkSnapshot | None = None

    def setup(self, ctx: OperatorContext, output: Output, side_outputs: SideOutputs = NO_SIDE_OUTPUTS) -> None:
        super().setup(ctx, output, side_outputs)
        self._task = TaskId(JobId(ctx.job_id), OperatorUid(ctx.uid), SubtaskIndex(ctx.subtask))
        self._ledger = TwoPhaseCommitLedger(self._task)
        self._taskmanager = str(getattr(ctx.metrics, "taskmanager", ""))
        self._metrics = SinkMetrics(ctx.job_id, ctx.job_name, ctx.uid, ctx.subtask, self._taskmanager)
        self._in_progress: dict[str, _InProgress] = {}  # by bucket
        self._current: _EpochFiles | None = None
        self._pending: dict[TransactionId, _EpochFiles] = {}  # pre-committed, oldest first
        # partition commit: the watermark at each barrier not yet completed, the watermark of the
        # latest completed one, and the partitions this subtask finished files in and has not committed
        self._watermark = MIN_WATERMARK
        self._barrier_watermarks: dict[int, int] = {}
        self._committed_watermark = MIN_WATERMARK
        self._partitions: dict[str, PendingPartition] = {}

    def _what(self, checkpoint_id: int | None = None) -> str:
        at = f" checkpoint {checkpoint_id}" if checkpoint_id is not None else ""
        return f"file sink {self.ctx.uid!r} of job {self.ctx.job_id} subtask {self.ctx.subtask}{at} ({self._path})"

    def _context(self, **extra: Any) -> dict[str, Any]:
        return {
            "job_id": self.ctx.job_id,
            "operator_uid": self.ctx.uid,
            "subtask": self.ctx.subtask,
            "taskmanager": self._taskmanager,
            **extra,
        }

    def validate_at_submit(self, endpoints: Endpoints, parameters: Mapping[str, str] = NO_PARAMETERS) -> None:
        """At submit: the path names a storage this sink writes (a bucket that answers). Creates nothing."""
        store = open_part_file_store(self._path, endpoints, self._s3_part_bytes)
        if store.uri.startswith("s3://"):
            store.open_storage()

    # Start and recovery ---------------------------------------------------------------------------

    def restore_state(self, data: bytes) -> None:
        self._restored = FileSinkSnapshot.from_bytes(data)

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        """A sink inherits no part files: the JobManager resolved the old job's as of the checkpoint
        before this job started (``weir.jobmanager.restoring``)."""
        if states:
            self.ctx.log.info("sink_state_not_inherited", old_subtasks=len(states))

    def open(self) -> None:
        store = open_part_file_store(self._path, Endpoints.from_env(), self._s3_part_bytes)
        store.open_storage()
        self._store = store
        self._recover(self._restored)
        self._restored = None

    def _recover(self, snapshot: FileSinkSnapshot | None) -> None:
        store = self._require_store()
        found: list[FoundInProgress] = []
        for unfinished in store.unfinished():
            if unfinished.upload_id is not None:
                name = PartFileName.parse(unfinished.key)
                if name is not None and name.task == self._task:
                    found.append(FoundInProgress(name, upload_id=unfinished.upload_id))
            elif (hidden := PartFileName.parse_in_progress(unfinished.key)) is not None and hidden[
                0
            ].task == self._task:
                found.append(FoundInProgress(hidden[0], attempt=hidden[1]))
        listed = [f for files in (snapshot.files.values() if snapshot else ()) for f in files]
        unfinished_keys = {f.name.key for f in found}
        finished = frozenset(
            f.name.key for f in listed if f.name.key not in unfinished_keys and store.exists(f.name.key)
        )
        self._ledger.recover(snapshot.ledger if snapshot is not None else None, {f.name.txn for f in found})
        actions = plan_part_recovery(self._task, snapshot, found, finished)
        lost: list[PendingPartFile] = []
        for action in actions:
            match action:
                case DiscardPart(item):
                    key = item.name.key if item.attempt is None else item.name.in_progress_key(item.attempt)
                    if store.discard(UnfinishedPartFile(key, item.upload_id)):
                        self._metrics.aborted.inc()
                case FinishPart(pending):
                    self._finish(pending)
                case AlreadyFinished():
                    pass
                case PartLost(pending):
                    lost.append(pending)
                case _:
                    assert_never(action)
        self.ctx.log.info(
            "file_sink_recovered",
            checkpoint_id=snapshot.ledger.checkpoint_id if snapshot is not None else None,
            actions=[describe(action) for action in actions],
            path=self._path,
        )
        if lost:
            raise PartFileLostError(
                f"{self._what()}: part file(s) {[f.name.key for f in lost]} of the restored checkpoint "
                f"{snapshot.ledger.checkpoint_id if snapshot else '-'} are neither unfinished nor finished: they were "
                "deleted (or their uploads aborted) outside this job, so their records are missing; rerun the job's "
                "input from before that checkpoint to rewrite them"
            )
        if snapshot is not None:
            for entry in snapshot.ledger.pending:
                self._ledger.committed(entry.txn)
            if self._partition_commit is not None:
                self._uncommitted_partitions(store, int(snapshot.ledger.checkpoint_id or 0))

    def _uncommitted_partitions(self, store: PartFileStore, checkpoint_id: int) -> None:
        """After a restore: every partition holding a finished part file of this sink (any subtask's)
        and no success file is pending again, first written now (the subtask that wrote it may be
        another one now, or may have committed it before the failure without a checkpoint since)."""
        policy = self._partition_commit
        assert policy is not None
        buckets = set()
        for key in store.finished_keys():
            name = PartFileName.parse(key)
            if name is not None and name.task.operator_uid == self.ctx.uid:
                buckets.add(name.bucket)
        now = self._now_ms()
        for bucket in sorted(buckets):
            if not store.exists(_success_key(bucket, policy.success_file)):
                self._partitions[bucket] = PendingPartition(now, checkpoint_id)

    def _require_store(self) -> PartFileStore:
        store = self._store
        if store is None:
            raise WeirError(f"{self._what()}: used before open()")
        return store

    def _finish(self, pending: PendingPartFile) -> Finished:
        closed = ClosedPartFile(
            pending.size, pending.upload_id, tuple((part.number, part.etag) for part in pending.parts)
        )
        hidden = pending.name.key if pending.attempt is None else pending.name.in_progress_key(pending.attempt)
        outcome = self._require_store().finish(pending.name.key, hidden, closed)
        if outcome is Finished.MISSING:
            raise PartFileLostError(
                f"{self._what()}: part file {pending.name.key} was closed for a checkpoint, but its "
                "upload (or hidden file) is gone and no finished file exists: it was removed outside this job"
            )
        return outcome

    # Records --------------------------------------------------------------------------------------

    def process_watermark(self, watermark: int) -> None:
        self._watermark = max(self._watermark, watermark)
        super().process_watermark(watermark)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def process(self, value: Any, timestamp: int | None) -> None:
        assigner = self._bucket_assigner
        try:
            bucket = check_bucket(assigner(value, timestamp))
        except Exception as exc:
            self.reject(assigner, exc, value, timestamp)
            return
        encode = self._encode
        try:
            item = encode(value)
        except Exception as exc:
            self.reject(encode, exc, value, timestamp)
            return
        part = self._in_progress.get(bucket) or self._start(bucket)
        part.encoder.add(item)
        part.records += 1
        if self._rolling.should_roll(part.writer.tell(), part.opened_at_ms, self._now_ms()):
            self._roll(bucket)

    def _encode(self, value: Any) -> Any:
        """The record as its part file takes it: a JSONL line (by the serializer), a Parquet row."""
        match self._format:
            case FileFormat.JSONL | FileFormat.CSV:
                line = self._serializer(value)
                return line if line.endswith(b"\n") else line + b"\n"
            case FileFormat.PARQUET:
                if not isinstance(value, Mapping):
                    raise TypeError(f"a Parquet file sink writes dicts of column to value, not {type(value).__name__}")
                return value
            case _:
                assert_never(self._format)

    def _start(self, bucket: str) -> _InProgress:
        epoch = self._current
        if epoch is None:
            epoch = self._current = _EpochFiles(self._ledger.begin())
        name = PartFileName(self._task, bucket, epoch.txn.checkpoint_id, epoch.next_number, self._format)
        epoch.next_number += 1
        writer = self._require_store().start(name.key, name.in_progress_key(self.ctx.attempt))
        encoder: _Encoder
        match self._format:
            case FileFormat.JSONL | FileFormat.CSV:
                encoder = _Lines(writer)
            case FileFormat.PARQUET:
                encoder = _Parquet(writer, self._schema, self._row_group_rows, f"{self._what()} part file {name.key}")
            case _:
                assert_never(self._format)
        part = self._in_progress[bucket] = _InProgress(name, writer, encoder, self._now_ms())
        return part

    def _roll(self, bucket: str) -> None:
        """Close the bucket's part file: it joins its epoch's closed files, pending from now on."""
        part = self._in_progress.pop(bucket)
        part.encoder.finish()
        closed = part.writer.close_part()
        epoch = self._current
        assert epoch is not None and epoch.txn == part.name.txn
        parts = tuple(UploadedPart(number, etag) for number, etag in closed.parts)
        attempt = self.ctx.attempt if closed.upload_id is None else None
        epoch.files.append(PendingPartFile(part.name, closed.upload_id, parts, closed.size, part.records, attempt))

    def next_processing_time(self) -> int | None:
        if not self._in_progress:
            return None
        return min(self._rolling.roll_due_at(part.opened_at_ms) for part in self._in_progress.values())

    def on_processing_time(self, now_ms: int) -> None:
        for bucket, part in list(self._in_progress.items()):
            if self._rolling.should_roll(part.writer.tell(), part.opened_at_ms, now_ms):
                self._roll(bucket)

    # Checkpoints ----------------------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        """The barrier: every in-progress part file is closed (Flink's OnCheckpointRollingPolicy), and
        the epoch's closed files become this checkpoint's committables."""
        cid = CheckpointId(checkpoint_id)
        for bucket in list(self._in_progress):
            self._roll(bucket)
        if self._partition_commit is not None:
            self._barrier_watermarks[checkpoint_id] = self._watermark
        pre = self._ledger.pre_commit(cid)
        if pre is not None:
            epoch = self._current
            assert epoch is not None and epoch.txn == pre.txn
            epoch.checkpoint_id = cid
            self._pending[epoch.txn] = epoch
            self._current = None
            self.ctx.log.info(
                "sink_transaction_precommitted",
                checkpoint_id=checkpoint_id,
                records=sum(f.records for f in epoch.files),
                part_files=[f.name.key for f in epoch.files],
                path=self._path,
            )
            crash_point(AFTER_PRE_COMMIT, **self._context(checkpoint_id=checkpoint_id))
        ledger = self._ledger.snapshot_state()
        files = {entry.txn.checkpoint_id: tuple(self._pending[entry.txn].files) for entry in ledger.pending}
        return FileSinkSnapshot(ledger, files).to_bytes()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        commits = self._ledger.on_checkpoint_complete(CheckpointId(checkpoint_id))
        if commits:
            self._commit(checkpoint_id, commits)
        if self._partition_commit is not None:
            self._commit_partitions(checkpoint_id, self._partition_commit)

    def _commit(self, checkpoint_id: int, commits: Sequence[Any]) -> None:
        crash_point(AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT, **self._context(checkpoint_id=checkpoint_id))
        for commit in commits:
            epoch = self._pending.pop(commit.txn)
            started = time.perf_counter()
            for pending in epoch.files:
                self._finish(pending)
                if self._partition_commit is not None:
                    held = self._partitions.get(pending.name.bucket)
                    first = self._now_ms() if held is None else held.first_written_ms
                    self._partitions[pending.name.bucket] = PendingPartition(first, checkpoint_id)
            records = sum(f.records for f in epoch.files)
            duration_s = time.perf_counter() - started
            self._metrics.on_commit(duration_s, records, (), time.time() * 1000.0)
            self.ctx.log.info(
                "sink_transaction_committed",
                checkpoint_id=epoch.checkpoint_id,
                duration_s=round(duration_s, 4),
                records=records,
                part_files=len(epoch.files),
                path=self._path,
            )
            self._ledger.committed(commit.txn)

    def _commit_partitions(self, checkpoint_id: int, policy: PartitionCommit) -> None:
        """Record this subtask's progress through ``checkpoint_id``, then write the success file of
        each partition :func:`~weir.operators.partition_commit.committable` answers, from every
        subtask's progress."""
        completed = [c for c in self._barrier_watermarks if c <= checkpoint_id]
        for c in completed:
            self._committed_watermark = max(self._committed_watermark, self._barrier_watermarks.pop(c))
        store = self._require_store()
        ctx = self.ctx
        folder = urllib.parse.quote(ctx.uid, safe="")
        mine = CommitProgress(
            ctx.job_id,
            ctx.subtask,
            ctx.parallelism,
            checkpoint_id,
            self._committed_watermark,
            ended=self._committed_watermark >= MAX_WATERMARK,
            partitions=dict(self._partitions),
        )
        store.put(progress_key(folder, ctx.subtask), mine.to_bytes())
        progresses: list[CommitProgress | None] = []
        for subtask in range(ctx.parallelism):
            if subtask == ctx.subtask:
                progresses.append(mine)
                continue
            key = progress_key(folder, subtask)
            data = store.get(key)
            other = None if data is None else CommitProgress.from_bytes(data, f"{self._what()}: {key}")
            same_job = other is not None and other.job_id == ctx.job_id and other.parallelism == ctx.parallelism
            progresses.append(other if same_job else None)
        committed = committable(policy, progresses, self._now_ms())
        for bucket in committed:
            store.put(_success_key(bucket, policy.success_file), b"")
            self._partitions.pop(bucket, None)
            self.ctx.log.info("partition_committed", checkpoint_id=checkpoint_id, partition=bucket, path=self._path)
        if committed:  # the others need not commit them again
            remaining = dataclasses.replace(mine, partitions=dict(self._partitions))
            store.put(progress_key(folder, ctx.subtask), remaining.to_bytes())

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The closed files stay pending: the next completed checkpoint's snapshot lists them too."""
        self._ledger.on_checkpoint_aborted(CheckpointId(checkpoint_id))

    def end_input(self) -> None:
        """Everything must be finished by now: the final checkpoint's barrier closed the last part
        files and its notification (which the task waits for) finished them (FLIP-147)."""
        left = [f.name.key for epoch in self._pending.values() for f in epoch.files]
        if self._current is not None:
            left += [f.name.key for f in self._current.files]
        left += [part.name.key for part in self._in_progress.values()]
        if left:
            raise FileSinkEndOfInputError(
                f"{self._what()}: end of input with part files no completed checkpoint finished ({left}); "
                "none of them is finished now and the task fails. This is a bug in Weir: report it with this task's log"
            )

    def close(self) -> None:
        """In-progress files are abandoned (no checkpoint lists them); closed ones stay for recovery."""
        for part in getattr(self, "_in_progress", {}).values():
            part.writer.abandon()
        if hasattr(self, "_in_progress"):
            self._in_progress.clear()
        metrics = getattr(self, "_metrics", None)
        if metrics is not None:
            metrics.remove()

"""The PostgreSQL CDC source operator: a snapshot of the tables, then their changes from a replication slot.

The decisions are :class:`weir.core.cdc.CdcProgress`'s and :func:`weir.core.cdc.decide_start`'s; the
server is behind ``weir.connectors.postgres_cdc``; this operator connects the two to the task:

- ``open`` decides, from the restored state and the slot it finds, to take the snapshot (it creates
  the slot there, so every checkpoint holds it), to go on with the snapshot's next chunk, or to
  resume decoding after the restored position;
- while the snapshot is read, each ``poll`` emits one chunk (one ``read`` event per row, at most
  ``chunk_size`` rows by primary key), so a checkpoint falls between two chunks and a restore goes
  on after the last chunk it holds (the slot stays at its consistent point meanwhile);
- every later ``poll`` decodes whole transactions and emits each (insert, update, delete events)
  at once, or skips it when it committed at or before the position (decoded again after a restore);
  a change that the chunk holding its row saw (committed before the chunk was read) is not emitted
  again;
- ``notify_checkpoint_complete`` advances the slot to the completed checkpoint's position;
- :func:`release_at_job_end` is the job's end (the JobManager calls it): the slot dropped or kept
  as :func:`weir.core.cdc.decide_slot_at_end` says.

At parallelism n > 1 the snapshot is read in parallel (docs/postgres-cdc-source.md, "A parallel
snapshot"): subtask 0 creates the slot and marks its session with :func:`weir.core.cdc.slot_mark`;
each subtask reads its key partition (:func:`weir.core.cdc.tables_read_by`) chunk by chunk; a
reader (subtask > 0) waits for the mark before its first chunk, and once a completed checkpoint
holds its whole partition writes its chunks into the WAL (:class:`weir.core.cdc.PartitionRead`);
subtask 0, its own partition read, gathers this run's announcements from a copy of the slot
(:class:`weir.core.cdc.SnapshotCollector`) and then streams alone: a replication slot has one
consumer.

Restored from a savepoint or retained checkpoint (``restore_inherited_state``, at any parallelism),
each subtask takes its share of the old subtasks' states as :func:`weir.core.cdc.redistribute`
decides (docs/postgres-cdc-source.md, "Rescale"): a subtask with nothing to read idles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, assert_never

from weir.connectors import postgres, postgres_cdc
from weir.core.cdc import (
    PARTITION_READ_PREFIX,
    SNAPSHOT_PENDING,
    AdvanceSlot,
    AnnouncePartition,
    AnnounceRestored,
    AwaitSlot,
    CdcProgress,
    CdcSourceError,
    CdcState,
    ChangeEvent,
    ChangeOp,
    ChunkRead,
    DropSlot,
    JobEnd,
    KeepSlot,
    Key,
    PartitionRead,
    Phase,
    Redistributed,
    RedistributionRefused,
    Resume,
    ResumeSnapshot,
    SnapshotCollector,
    SnapshotRun,
    StayIdle,
    TakeSnapshot,
    TransactionVerdict,
    decide_reader_start,
    decide_slot_at_end,
    decide_start,
    decode_cdc_state,
    decode_partition_read,
    encode_cdc_state,
    encode_partition_read,
    format_lsn,
    redistribute_stored,
    slot_mark,
    snapshot_partitions,
    tables_read_by,
)
from weir.core.config import Endpoints
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import JobDefinitionError
from weir.core.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Relation,
    Skipped,
    TupleValue,
    Update,
    decode_message,
)
from weir.operators.base import NO_PARAMETERS, InheritedState, SourceOperator, StateNotRedistributableError

IDLE_POLL_WAIT_S: Final = 0.2
"""How long the source waits before decoding again after a poll that found no committed change."""

POSTGRES_EPOCH_MS: Final = 946_684_800_000
"""2000-01-01T00:00:00Z in epoch ms: pgoutput's commit times count microseconds from it."""


class PostgresCdcSourceOperator(SourceOperator):
    """Emits :class:`~weir.core.cdc.ChangeEvent` values, stamped with their commit time (epoch ms;
    snapshot reads carry none). No watermarks."""

    def __init__(self, spec: PostgresCdcSourceSpec) -> None:
        self._spec = spec
        self._restored: CdcState = SNAPSHOT_PENDING
        self._idle = False

    def restore_state(self, data: bytes) -> None:
        self._restored = decode_cdc_state(data, self._spec.slot_name)

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        """This subtask's share of every old subtask's state (a savepoint or a retained checkpoint
        restored, at this parallelism or another), as :func:`weir.core.cdc.redistribute` decides;
        StateNotRedistributableError (one line) when it refuses."""
        if not states:
            return
        ctx = self.ctx
        by_subtask = sorted(states, key=lambda s: s.subtask)
        if [s.subtask for s in by_subtask] != list(range(by_subtask[0].parallelism)):
            raise StateNotRedistributableError(
                f"postgres cdc source {ctx.uid!r}: the checkpoint holds the state of subtasks "
                f"{[s.subtask for s in by_subtask]} of {by_subtask[0].parallelism}: it is incomplete"
            )
        stored = [s.data for s in by_subtask]
        decision = redistribute_stored(
            stored, self._spec.slot_name, ctx.parallelism, f"postgres cdc source {ctx.uid!r}"
        )
        match decision:
            case Redistributed(states=new):
                self._restored = new[ctx.subtask]
                if len(stored) != ctx.parallelism:
                    ctx.log.info(
                        "cdc_state_redistributed",
                        slot=self._spec.slot_name,
                        from_parallelism=len(stored),
                        to_parallelism=ctx.parallelism,
                        phase=self._restored.phase.value,
                    )
            case RedistributionRefused(reason=reason):
                raise StateNotRedistributableError(reason)
            case _:
                assert_never(decision)

    def validate_at_submit(self, endpoints: Endpoints, parameters: Mapping[str, str] = NO_PARAMETERS) -> None:
        """The tables exist and have a replica identity (one line otherwise)."""
        with postgres.connect(endpoints, read_only=True) as conn:
            postgres_cdc.captured_tables(conn, self._spec.tables)

    def open(self) -> None:
        ctx, spec = self.ctx, self._spec
        restored = self._restored
        self._partitions = snapshot_partitions(restored, ctx.parallelism)
        if self._partitions > 1:
            _check_parallel_snapshot(ctx.uid, self._partitions, ctx.parameters)
        self._endpoints = Endpoints.from_env()
        self._conn = postgres.connect(self._endpoints, autocommit=True, retry_for_s=10.0)
        self._tables = {t.qualified_name: t for t in postgres_cdc.captured_tables(self._conn, spec.tables)}
        chunked = {name: t.chunked for name, t in self._tables.items()}
        idle = restored.phase is Phase.IDLE
        self._read_tables = [] if idle else tables_read_by(list(self._tables), chunked, ctx.subtask, self._partitions)
        self._run = SnapshotRun(ctx.job_id, ctx.attempt)
        self._progress = CdcProgress(self._restored, self._partitions)
        self._reader: postgres_cdc.ChangeReader | None = None
        self._relations: dict[int, Relation] = {}
        self._chunk_reader: postgres_cdc.ChunkReader | None = None  # while the snapshot is read
        self._gathering: tuple[SnapshotCollector, postgres_cdc.ChangeReader] | None = None  # subtask 0, p > 1
        self._awaiting_slot = False  # a reader, until subtask 0 marks the slot as this run's
        if ctx.subtask > 0:
            self._open_reader()
            return
        self._decision = decide_start(
            self._restored, postgres_cdc.slot_found(self._conn, spec.slot_name), spec.slot_name
        )
        match self._decision:
            case TakeSnapshot():
                self._create_slot()
            case ResumeSnapshot(consistent_point=lsn):
                done = len(self._restored.chunks)
                ctx.log.info("cdc_snapshot_resumed", slot=spec.slot_name, lsn=format_lsn(lsn), chunks_read=done)
                self._mark_slot()
            case Resume(position=position):
                self._reader = postgres_cdc.ChangeReader(self._endpoints, spec.slot_name, spec.publication)
                ctx.log.info("cdc_resumed", slot=spec.slot_name, lsn=format_lsn(position))
            case _:
                assert_never(self._decision)

    def _create_slot(self) -> None:
        """Subtask 0 of a new snapshot, as it opens (before any checkpoint can hold its state): every
        state it checkpoints then holds the slot's consistent point, so no checkpoint pairs a reader's
        chunks (read after the slot's mark) with a subtask 0 that would create the slot anew, a later
        consistent point, on restore: the changes between a chunk's read and that point would be lost."""
        spec, ctx, progress = self._spec, self.ctx, self._progress
        assert isinstance(self._decision, TakeSnapshot)
        if self._decision.drop_existing:
            postgres_cdc.drop_slot(self._conn, spec.slot_name)
            ctx.log.info("cdc_slot_dropped", slot=spec.slot_name, reason="no completed checkpoint holds it")
        postgres_cdc.ensure_publication(self._conn, spec.publication, list(self._tables.values()), spec.slot_name)
        progress.slot_created(postgres_cdc.create_slot(self._conn, spec.slot_name))
        self._mark_slot()
        ctx.log.info(
            "cdc_snapshot_started",
            slot=spec.slot_name,
            lsn=format_lsn(progress.state.position or 0),
            tables=list(self._tables),
            one_chunk=[name for name, t in self._tables.items() if not t.chunked],
            partitions=self._partitions,
        )

    def _open_reader(self) -> None:
        """Subtask > 0 of a parallel snapshot: it reads its partition, announces it, then idles."""
        ctx, spec = self.ctx, self._spec
        decision = decide_reader_start(self._restored)
        match decision:
            case AwaitSlot():
                self._awaiting_slot = True
            case ResumeSnapshot(consistent_point=lsn):
                done = len(self._restored.chunks)
                ctx.log.info(
                    "cdc_snapshot_resumed",
                    slot=spec.slot_name,
                    lsn=format_lsn(lsn),
                    chunks_read=done,
                    partition=ctx.subtask,
                )
            case AnnounceRestored(chunks=chunks):
                self._announce(chunks)
                self._progress.partition_announced()
            case StayIdle():
                ctx.log.info("cdc_subtask_idle", slot=spec.slot_name, subtask=ctx.subtask)
            case _:
                assert_never(decision)

    def _mark_slot(self) -> None:
        """Subtask 0 of a parallel snapshot: the slot is this run's, the readers may read."""
        if self._partitions > 1:
            postgres_cdc.mark_session(self._conn, slot_mark(self._spec.slot_name, self._run))

    def poll(self, max_records: int) -> bool:
        reader = self._reader
        if reader is None:
            if self.ctx.subtask > 0:
                self._partition_step()
            else:
                self._snapshot_step()
            return True
        changes = reader.changes(max(max_records, self._spec.max_changes_per_poll))
        self._idle = not changes
        self._emit_transactions(changes, reader)
        if not changes or self._last_is_commit(changes):
            self._progress.decoded_through(reader.decoded_through())
        return True

    def idle_wait_s(self) -> float:
        return IDLE_POLL_WAIT_S if self._idle else 0.0

    def _snapshot_step(self) -> None:
        """Subtask 0: emit the next chunk, or, after the last, gather the readers' announcements
        (parallelism > 1) and start decoding."""
        spec, ctx, progress = self._spec, self.ctx, self._progress
        self._idle = False
        consistent_point = progress.state.position
        assert consistent_point is not None
        chunk = progress.next_chunk(self._read_tables)
        if chunk is not None:
            self._emit_chunk(chunk.table, chunk.after, consistent_point)
            chunk = progress.next_chunk(self._read_tables)
        if chunk is not None:
            return
        self._close_chunk_reader()
        others: tuple[ChunkRead, ...] = ()
        if self._partitions > 1:
            gathered = self._gather()
            if gathered is None:
                return
            others = gathered
        progress.snapshot_emitted(others)  # every chunk was emitted: stream from the consistent point
        self._reader = postgres_cdc.ChangeReader(self._endpoints, spec.slot_name, spec.publication)
        ctx.log.info(
            "cdc_snapshot_emitted",
            slot=spec.slot_name,
            lsn=format_lsn(consistent_point),
            chunks=len(progress.state.chunks),
            partitions=self._partitions,
        )

    def _gather(self) -> tuple[ChunkRead, ...] | None:
        """Subtask 0, its partition read: decode the slot (a temporary copy of it, from the consistent
        point) for this run's announcements (:class:`~weir.core.cdc.PartitionRead`); every reader's
        chunks once all have announced, else None (the next poll decodes on)."""
        spec = self._spec
        if self._gathering is None:
            collector = SnapshotCollector(spec.slot_name, self._run, self._partitions)
            copy = postgres_cdc.ChangeReader(self._endpoints, spec.slot_name, spec.publication, messages=True)
            self._gathering = (collector, copy)
        collector, copy = self._gathering
        changes = copy.changes(self._spec.max_changes_per_poll)
        self._idle = not changes
        for change in changes:
            if not change.data.startswith(b"M"):
                continue
            message = decode_message(change.data)
            if isinstance(message, LogicalMessage) and message.prefix == PARTITION_READ_PREFIX:
                announcement = decode_partition_read(message.content)
                if collector.offer(announcement):
                    self.ctx.log.info(
                        "cdc_partition_announced",
                        slot=spec.slot_name,
                        partition=announcement.subtask,
                        chunks=len(announcement.chunks),
                        missing=collector.missing,
                    )
        if collector.missing:
            return None
        copy.close()
        self._gathering = None
        return collector.chunks()

    def _partition_step(self) -> None:
        """A reader: wait for the slot of this run, then emit the partition's next chunk; after
        the last, wait for a checkpoint that holds it to complete (it then announces)."""
        spec, ctx, progress = self._spec, self.ctx, self._progress
        if self._awaiting_slot:
            if not postgres_cdc.session_marked(self._conn, slot_mark(spec.slot_name, self._run)):
                self._idle = True
                return
            found = postgres_cdc.slot_found(self._conn, spec.slot_name)
            if found is None:
                raise CdcSourceError(
                    f"postgres cdc source: replication slot {spec.slot_name!r} is gone while the snapshot is read; "
                    "the job restarts and reads it anew"
                )
            progress.slot_created(found.confirmed_flush)
            self._awaiting_slot = False
            ctx.log.info("cdc_partition_started", slot=spec.slot_name, partition=ctx.subtask, tables=self._read_tables)
        if progress.state.phase is not Phase.SNAPSHOT:
            self._idle = True  # read: the announcement follows a completed checkpoint
            return
        self._idle = False
        consistent_point = progress.state.position
        assert consistent_point is not None
        chunk = progress.next_chunk(self._read_tables)
        if chunk is not None:
            self._emit_chunk(chunk.table, chunk.after, consistent_point)
            return
        self._close_chunk_reader()
        progress.partition_read()
        ctx.log.info(
            "cdc_partition_read", slot=spec.slot_name, partition=ctx.subtask, chunks=len(progress.state.chunks)
        )

    def _announce(self, chunks: tuple[ChunkRead, ...]) -> None:
        """A reader: tell subtask 0, through the WAL, that its partition is read and checkpointed."""
        spec, ctx = self._spec, self.ctx
        announcement = PartitionRead(spec.slot_name, self._run, ctx.subtask, self._partitions, chunks)
        lsn = postgres_cdc.emit_message(self._conn, PARTITION_READ_PREFIX, encode_partition_read(announcement))
        ctx.log.info("cdc_partition_announcing", slot=spec.slot_name, partition=ctx.subtask, lsn=format_lsn(lsn))

    def _emit_chunk(self, name: str, after: Key | None, consistent_point: int) -> None:
        """One chunk's rows as ``read`` events (their LSN: the slot's consistent point, before every
        change the stream emits)."""
        emit, spec = self.output.emit, self._spec
        rows = 0

        def read(row: dict[str, Any]) -> None:
            nonlocal rows
            emit(ChangeEvent(ChangeOp.READ, name, None, row, consistent_point, None), None)
            rows += 1

        if self._chunk_reader is None:
            self._chunk_reader = postgres_cdc.ChunkReader(self._endpoints)
        partition, partitions = self.ctx.subtask, self._partitions
        chunk = self._chunk_reader.read(self._tables[name], after, spec.chunk_size, read, partition, partitions)
        self.records_polled += rows
        self._progress.chunk_emitted(chunk)
        self.ctx.log.debug("cdc_chunk_emitted", slot=spec.slot_name, table=name, rows=rows, last=chunk.upper is None)

    def _emit_transactions(
        self, changes: Sequence[postgres_cdc.DecodedChange], reader: postgres_cdc.ChangeReader
    ) -> None:
        pending: list[tuple[ChangeEvent, int | None]] = []
        xid: int | None = None
        commit_ms: int | None = None
        for change in changes:
            message = decode_message(change.data)
            match message:
                case Begin():
                    pending, xid = [], message.xid
                    commit_ms = POSTGRES_EPOCH_MS + message.commit_ts_us // 1000
                case Commit():
                    if self._progress.transaction(message.end_lsn) is TransactionVerdict.EMIT:
                        fresh = [(e, ts) for e, ts in pending if not self._seen(e, message.end_lsn)]
                        emit = self.output.emit
                        for event, ts in fresh:
                            emit(event, ts)
                        self.records_polled += len(fresh)
                    pending = []
                case Relation():
                    self._relations[message.relation_id] = message
                case Insert() | Update() | Delete():
                    captured = self._event(message, change.lsn, xid, reader)
                    if captured is not None:
                        pending.append((captured, commit_ms))
                case Skipped() | LogicalMessage():
                    pass  # the announcements are read before streaming
                case _:
                    assert_never(message)

    def _event(
        self, message: Insert | Update | Delete, lsn: int, xid: int | None, reader: postgres_cdc.ChangeReader
    ) -> ChangeEvent | None:
        relation = self._relations[message.relation_id]
        table = relation.qualified_name
        if table not in self._tables:
            return None  # published, not captured (a publication shared with other tables)
        match message:
            case Insert():
                return ChangeEvent(ChangeOp.INSERT, table, None, self._row(relation, message.new, reader), lsn, xid)
            case Update():
                before = None if message.old is None else self._row(relation, message.old, reader, message.old_is_key)
                after = self._row(relation, message.new, reader)
                return ChangeEvent(ChangeOp.UPDATE, table, before, after, lsn, xid)
            case Delete():
                before = self._row(relation, message.old, reader, message.old_is_key)
                return ChangeEvent(ChangeOp.DELETE, table, before, None, lsn, xid)
            case _:
                assert_never(message)

    @staticmethod
    def _row(
        relation: Relation,
        values: Sequence[TupleValue],
        reader: postgres_cdc.ChangeReader,
        key_only: bool = False,
    ) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for column, value in zip(relation.columns, values, strict=True):
            if value is UNCHANGED or (key_only and not column.key):
                continue
            row[column.name] = None if value is None else reader.load(column.type_oid, str(value))
        return row

    def _seen(self, event: ChangeEvent, commit_end: int) -> bool:
        """The snapshot's chunk of the event's row (each, for an update that moved it) read it."""
        if not self._progress.state.chunks:
            return False
        assert event.xid is not None
        table = self._tables[event.table]
        keys: list[Key | None] = []
        for row in (event.after, event.before):
            if row is None:
                continue
            if not table.chunked:
                keys.append(None)
            elif all(c in row for c in table.key_columns):
                keys.append(tuple(row[c] for c in table.key_columns))
        return self._progress.seen_by_snapshot(event.table, keys or [None], event.xid, commit_end)

    @staticmethod
    def _last_is_commit(changes: Sequence[postgres_cdc.DecodedChange]) -> bool:
        return isinstance(decode_message(changes[-1].data), Commit)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        return encode_cdc_state(self._progress.checkpoint_taken(checkpoint_id), self._spec.slot_name)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        action = self._progress.checkpoint_completed(checkpoint_id)
        match action:
            case None:
                pass
            case AdvanceSlot(lsn=lsn):
                if self._reader is not None:
                    self._reader.advance_slot(lsn)
                    self.ctx.log.debug("cdc_slot_advanced", slot=self._spec.slot_name, lsn=format_lsn(lsn))
            case AnnouncePartition(chunks=chunks):
                self._announce(chunks)
            case _:
                assert_never(action)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._progress.checkpoint_aborted(checkpoint_id)

    def _close_chunk_reader(self) -> None:
        chunk_reader, self._chunk_reader = getattr(self, "_chunk_reader", None), None
        if chunk_reader is not None:
            chunk_reader.close()

    def close(self) -> None:
        self._close_chunk_reader()
        gathering, self._gathering = getattr(self, "_gathering", None), None
        if gathering is not None:
            gathering[1].close()
        reader, self._reader = getattr(self, "_reader", None), None
        if reader is not None:
            reader.close()
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()


def _check_parallel_snapshot(uid: str, parallelism: int, parameters: Mapping[str, str]) -> None:
    """A parallel snapshot needs periodic checkpoints (a reader announces its partition once a
    checkpoint holding it completed) and aligned ones (an unaligned barrier overtakes the rows in
    flight, so a row's snapshot read and its first change, from two subtasks, could cross)."""
    if not parameters.get("checkpointing.interval"):
        raise JobDefinitionError(
            f"postgres cdc source {uid!r}: at parallelism {parallelism} the snapshot's readers hand over to the "
            "stream at a completed checkpoint; set checkpointing.interval, or run the source at parallelism 1"
        )
    if parameters.get("checkpointing.unaligned", "false").strip().lower() == "true":
        raise JobDefinitionError(
            f"postgres cdc source {uid!r}: at parallelism {parallelism} the snapshot needs aligned checkpoints "
            "(an unaligned barrier lets a row's change overtake its snapshot read from another subtask); "
            "set checkpointing.unaligned=false, or run the source at parallelism 1"
        )


def release_at_job_end(spec: PostgresCdcSourceSpec, end: JobEnd, endpoints: Endpoints, log: Any) -> None:
    """The job ended for good: drop the source's slot (and the publication it created) or keep it,
    as :func:`weir.core.cdc.decide_slot_at_end` says. Raises SlotDropError, naming the slot, when
    the drop fails (the JobManager retries it with the rest of the job's end)."""
    decision = decide_slot_at_end(end, spec.slot_retention)
    match decision:
        case DropSlot():
            released = postgres_cdc.release_slot(endpoints, spec.slot_name, spec.publication)
            log.info(
                "cdc_slot_released",
                slot=spec.slot_name,
                job_end=end.value,
                slot_dropped=released.slot_dropped,
                publication=spec.publication if released.publication_dropped else None,
            )
        case KeepSlot(reason=reason):
            log.info("cdc_slot_kept", slot=spec.slot_name, job_end=end.value, reason=reason)
        case _:
            assert_never(decision)


__all__ = ["PostgresCdcSourceOperator", "release_at_job_end"]

"""The job's PostgreSQL CDC source in ``weir test``, playing change events given as test data
(:class:`~weir.tools.cdc_input.CdcInput`) instead of reading a database.

It is the job's own source operator with the server taken away, as ``weir.tools.reference`` replays
a Kafka source: the position is the source's :class:`~weir.core.cdc.CdcProgress`, decided by the
same state machine (``decide_start``, ``slot_created``, ``next_chunk``/``chunk_emitted``,
``snapshot_emitted``, ``transaction``), and checkpointed and restored through the source's own
``snapshot_state``/``restore_state`` (the CDC source state's JSON, docs/formats.md). As in a
cluster:

- a start without a restored position takes the snapshot: each poll emits one chunk of reads
  (``chunk_size`` rows of one table, the tables in the source's order), so a checkpoint falls
  between chunks and a restore goes on after the last chunk it holds;
- then each poll emits one whole transaction (its changes, each stamped with the commit time), so a
  checkpoint falls between transactions; a restore in the streaming phase skips the transactions at
  or before the restored position (``TransactionVerdict.SKIP``), as the real source skips what it
  decodes again from its slot.

What differs: the "slot" is the given input, which holds every change from the start and is never
advanced (a restore always finds the changes after its position); a chunk's key range is the
positions of the table's reads in the input (test data names no primary key) and its snapshot sees
no transaction, so no given change is dropped as already read: the input is what the source
delivers. One poll is one chunk or one transaction (a cluster's poll may hold several): every
boundary where a cluster's checkpoint can fall is one here. A source given ``parallelism`` above 1
(a parallel snapshot) is played as one reader too: its reads, then its changes, in one stream.
When the given changes end, the source ends (a real CDC source never does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, assert_never

from weir.core.cdc import (
    CdcProgress,
    ChunkRead,
    Phase,
    Resume,
    ResumeSnapshot,
    SlotFound,
    TakeSnapshot,
    TransactionVerdict,
    XidSnapshot,
    decide_start,
)
from weir.core.descriptors import PostgresCdcSourceSpec
from weir.core.errors import JobDefinitionError
from weir.operators.cdc_source import PostgresCdcSourceOperator
from weir.tools.cdc_input import CdcInput, CdcInputError, qualified

SEES_NOTHING: Final = XidSnapshot(1, 1)
"""A replayed chunk's MVCC snapshot: no transaction is visible in it (no given change is dropped)."""


class ReplayCdcSource(PostgresCdcSourceOperator):
    """The job's CDC source operator over given change events (see the module doc)."""

    def __init__(self, spec: PostgresCdcSourceSpec, uid: str, given: CdcInput) -> None:
        super().__init__(spec)
        self._given = given
        self._captured = [qualified(t) for t in spec.tables]
        stray = sorted(given.tables() - set(self._captured))
        if stray:
            raise CdcInputError(
                f"source {uid!r}: a change event of table {stray[0]!r}, which the source does not capture "
                f"(it captures {', '.join(self._captured)})"
            )
        self._rows = {t: [e for e in given.reads if e.table == t] for t in self._captured}
        self._next_transaction = 0

    def open(self) -> None:
        ctx, spec = self.ctx, self._spec
        if ctx.parallelism != 1:
            raise JobDefinitionError(
                f"postgres cdc source {ctx.uid!r}: weir test plays a CDC source as one reader, and --rescale "
                f"would restore it at its parallelism {ctx.parallelism} (a parallel snapshot): test it without "
                "--rescale"
            )
        restored = self._restored
        self._progress = CdcProgress(restored)
        # The given input is a slot that holds every change from the start: never past a position.
        slot = None if restored.position is None else SlotFound(self._given.consistent_point)
        self._decision = decide_start(restored, slot, spec.slot_name)
        self._reader = None
        self._chunk_reader = None
        match self._decision:
            case TakeSnapshot() | ResumeSnapshot() | Resume():
                pass  # the snapshot's chunks, then the transactions after the position, poll by poll
            case _:
                assert_never(self._decision)

    def poll(self, max_records: int) -> bool:
        progress = self._progress
        if progress.state.position is None:
            progress.slot_created(self._given.consistent_point)
        match progress.state.phase:
            case Phase.SNAPSHOT:
                self._snapshot_step()
                return True
            case Phase.STREAMING:
                return self._emit_transaction()
            case Phase.PARTITION_READ | Phase.IDLE:  # a subtask > 0 of a parallel source: never here
                raise AssertionError("a replayed CDC source is one reader: no other subtask reads a partition")
            case _:
                assert_never(progress.state.phase)

    def _snapshot_step(self) -> None:
        """Emit the next chunk of reads; after the last, stream from the consistent point."""
        progress = self._progress
        chunk = progress.next_chunk(self._captured)
        if chunk is not None:
            rows = self._rows[chunk.table]
            first = 0 if chunk.after is None else _position(chunk.after) + 1
            last = min(first + self._spec.chunk_size, len(rows))
            emit = self.output.emit
            for event in rows[first:last]:
                emit(event, None)
            self.records_polled += last - first
            upper = (last - 1,) if last < len(rows) else None
            progress.chunk_emitted(ChunkRead(chunk.table, upper, SEES_NOTHING, self._given.consistent_point))
            chunk = progress.next_chunk(self._captured)
        if chunk is None:
            progress.snapshot_emitted()

    def _emit_transaction(self) -> bool:
        """Emit the next transaction after the position (False: the given changes ended)."""
        transactions = self._given.transactions
        while self._next_transaction < len(transactions):
            transaction = transactions[self._next_transaction]
            self._next_transaction += 1
            verdict = self._progress.transaction(transaction.commit_end)
            match verdict:
                case TransactionVerdict.EMIT:
                    emit = self.output.emit
                    for event in transaction.changes:
                        emit(event, transaction.commit_ms)
                    self.records_polled += len(transaction.changes)
                    return True
                case TransactionVerdict.SKIP:
                    continue  # emitted before the restored position
                case _:
                    assert_never(verdict)
        return False

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._progress.checkpoint_completed(checkpoint_id)  # no slot to advance: the input stays


def _position(key: Sequence[object]) -> int:
    (position,) = key
    assert isinstance(position, int)
    return position


__all__ = ["ReplayCdcSource"]

"""Change data capture from PostgreSQL: the change event, the source's position and its slot bookkeeping.

The PostgreSQL CDC source (``weir.api.postgres_cdc_source``) reads a consistent snapshot of its tables,
then the changes committed after the snapshot, decoded by logical replication (``pgoutput``) from a
replication slot. This module is its pure part, with no I/O:

- :class:`ChangeEvent`, the record the source emits, and its documented JSON form;
- :class:`CdcProgress`, the state machine of the source's position: which transactions it emits or
  skips, what each checkpoint holds, when the slot may be advanced (only for a completed checkpoint,
  so that a restore re-reads exactly from the checkpoint), and what a start does with the slot it
  finds (:func:`decide_start`);
- the parallel snapshot (source parallelism > 1): which rows each subtask reads
  (:func:`key_partition`, :func:`tables_read_by`), what a reader announces once a completed
  checkpoint holds its partition (:class:`PartitionRead`), and how subtask 0 gathers every
  partition's chunks before it streams (:class:`SnapshotCollector`);
- the source's state restored at another parallelism (:func:`redistribute`);
- the source state's versioned JSON (``docs/formats.md``).

The position is a WAL location (LSN): every transaction whose commit record ends at or before it has
been emitted; the source emits whole transactions only, so a checkpoint never falls inside one.
Debezium's and Flink CDC's PostgreSQL connectors keep the same position (the last committed
transaction's LSN, flushed to the slot as the checkpoint completes).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final, assert_never
from uuid import UUID

from weir.core.documents import load_versioned, typed
from weir.core.errors import Fault, JobDefinitionError, SerializationError, WeirError

CDC_SOURCE_STATE_FORMAT: Final = 4
PARTITION_READ_FORMAT: Final = 1
CHANGE_EVENT_FORMAT: Final = 1


class CdcSourceError(WeirError):
    """The replication slot cannot serve the source's position (dropped, or moved past the checkpoint
    restored): a restart cannot help; start the job anew (a new snapshot)."""

    fault: Fault = Fault.EXTERNAL


# LSNs -----------------------------------------------------------------------------------------------


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` as the 64-bit WAL position it names."""
    high, sep, low = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(lsn: int) -> str:
    """The 64-bit WAL position in PostgreSQL's text form (``'16/B374D848'``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# The change event ------------------------------------------------------------------------------------


class ChangeOp(enum.StrEnum):
    READ = "read"  # a row of the snapshot
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


Row = Mapping[str, Any]


@dataclass(frozen=True)
class ChangeEvent:
    """One change of one row (Debezium's change event envelope, without its schema).

    ``before``: the old row of an update or a delete as the table's replica identity gives it: the
    whole row under ``REPLICA IDENTITY FULL``; with the default (the primary key) the key columns of
    a delete, and of an update only when it changed the key (None otherwise); None for reads and
    inserts. ``after``: the new row of a read, an insert or an update (None for a delete); an
    unchanged TOASTed value of an update is absent from it. Values are as psycopg reads the columns'
    types. ``lsn``: the WAL position of the change's record (two changes of one row come in the
    order of their LSNs); for a read, the snapshot's consistent point, at or before every change's.
    ``xid``: the transaction id (None for a read)."""

    op: ChangeOp
    table: str  # schema-qualified: "public.orders"
    before: Row | None
    after: Row | None
    lsn: int
    xid: int | None

    @property
    def row(self) -> Row:
        """The row the change is about: ``after``, or for a delete ``before``."""
        row = self.after if self.after is not None else self.before
        assert row is not None, "a change event has a before or an after row"
        return row

    def to_json(self) -> dict[str, Any]:
        """The documented JSON form (docs/formats.md): values JSON has no type for are written as
        PostgreSQL's text of them (numeric, dates and times ISO 8601, uuid, bytea as ``\\x`` hex)."""
        return {
            "format": CHANGE_EVENT_FORMAT,
            "op": self.op.value,
            "table": self.table,
            "before": _json_row(self.before),
            "after": _json_row(self.after),
            "lsn": format_lsn(self.lsn),
            "xid": self.xid,
        }


def _json_row(row: Row | None) -> dict[str, Any] | None:
    return None if row is None else {name: json_value(value) for name, value in row.items()}


def json_value(value: Any) -> Any:
    """A column value as JSON holds it (see :meth:`ChangeEvent.to_json`)."""
    match value:
        case None | bool() | int() | float() | str():
            return value
        case Decimal() | UUID():
            return str(value)
        case datetime() | date() | time():
            return value.isoformat()
        case timedelta():
            return str(value)
        case bytes() | bytearray() | memoryview():
            return "\\x" + bytes(value).hex()
        case list() | tuple():
            return [json_value(v) for v in value]
        case dict():
            return {str(k): json_value(v) for k, v in value.items()}
        case _:
            return str(value)


# The position state machine --------------------------------------------------------------------------


class Phase(enum.StrEnum):
    SNAPSHOT = "snapshot"  # the snapshot's chunks are being read (or the slot is still to be created)
    PARTITION_READ = "partition-read"  # a reader (subtask > 0) read every chunk of its partition
    STREAMING = "streaming"  # every chunk was emitted; changes after ``position`` are next
    IDLE = "idle"  # a subtask > 0 with nothing to read: the source was restored at another parallelism


class KeyKind(enum.StrEnum):
    """A primary-key column type whose order Python reproduces exactly, so that a change's key is
    placed in the chunk that read it: integers (``smallint``, ``int``, ``bigint``), text (``text``,
    ``varchar``, read ordered byte-wise with ``COLLATE "C"``: UTF-8's byte order is code point
    order, Python's ``str`` order) and ``uuid`` (byte order, ``UUID``'s order)."""

    INTEGER = "integer"
    TEXT = "text"
    UUID = "uuid"


KeyValue = int | str | UUID
Key = tuple[KeyValue, ...]


def encode_key(key: Key) -> list[list[Any]]:
    """``[[kind, value], ...]``: a uuid as its text."""
    encoded: list[list[Any]] = []
    for value in key:
        match value:
            case bool():
                raise TypeError(f"not a key value: {value!r}")
            case int():
                encoded.append([KeyKind.INTEGER.value, value])
            case str():
                encoded.append([KeyKind.TEXT.value, value])
            case UUID():
                encoded.append([KeyKind.UUID.value, str(value)])
            case _:
                assert_never(value)
    return encoded


def decode_key(document: Any) -> Key:
    values: list[KeyValue] = []
    for item in typed(document, list):
        kind, value = typed(item, list)
        match KeyKind(typed(kind, str)):
            case KeyKind.INTEGER:
                values.append(typed(value, int))
            case KeyKind.TEXT:
                values.append(typed(value, str))
            case KeyKind.UUID:
                values.append(UUID(typed(value, str)))
    return tuple(values)


KEY_TEXT_SEPARATOR: Final = "\x1f"
"""Between the key columns' texts in :func:`key_text` (the unit separator; no key has to avoid it:
two keys whose texts collide only share a partition)."""


def key_text(key: Key) -> str:
    """The key as PostgreSQL's text of its columns (``::text``) joined by :data:`KEY_TEXT_SEPARATOR`:
    an integer in decimal, a text as it is, a uuid lower-case with hyphens."""
    texts: list[str] = []
    for value in key:
        match value:
            case bool():
                raise TypeError(f"not a key value: {value!r}")
            case int() | str():
                texts.append(str(value))
            case UUID():
                texts.append(str(value))
            case _:
                assert_never(value)
    return KEY_TEXT_SEPARATOR.join(texts)


def key_partition(key: Key, partitions: int) -> int:
    """The partition (the subtask, at source parallelism ``partitions``) whose reader reads the row
    with ``key`` in the snapshot: the first 32 bits of the MD5 of :func:`key_text`, modulo
    ``partitions``. The server computes the same in the chunk's query
    (``mod(('x' || substr(md5(concat_ws(E'\\x1f', k1::text, ...)), 1, 8))::bit(32)::bigint, p)``), so each
    subtask reads its partition's rows by key order and a decoded change is placed in its chunk.
    A hash spreads any key type evenly and needs no boundaries agreed between subtasks (which have
    no coordinator to agree through)."""
    if partitions < 1:
        raise ValueError(f"not a number of partitions: {partitions}")
    if partitions == 1:
        return 0
    digest = hashlib.md5(key_text(key).encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") % partitions


def tables_read_by(tables: Sequence[str], chunked: Mapping[str, bool], subtask: int, parallelism: int) -> list[str]:
    """The tables subtask ``subtask`` of ``parallelism`` reads in the snapshot, in order: its
    partition (:func:`key_partition`) of every chunked table, and the tables read in one chunk (no
    usable primary key) whose place among ``tables`` is ``subtask`` modulo ``parallelism``."""
    if not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} of parallelism {parallelism}")
    return [t for i, t in enumerate(tables) if chunked[t] or i % parallelism == subtask]


XID_SPAN: Final = 1 << 32


def widen_xid(xid: int, near: int) -> int:
    """The 64-bit transaction id (``xid8``) whose low 32 bits are ``xid`` (pgoutput's 32-bit xid),
    the one within 2^31 of ``near`` (a 64-bit xid of the same era: PostgreSQL keeps every live xid
    within 2^31 of the next one, its wraparound protection)."""
    if not 0 <= xid < XID_SPAN:
        raise ValueError(f"not a 32-bit transaction id: {xid}")
    candidate = (near & ~(XID_SPAN - 1)) | xid
    if candidate > near + XID_SPAN // 2:
        candidate -= XID_SPAN
    elif candidate < near - XID_SPAN // 2:
        candidate += XID_SPAN
    return candidate


@dataclass(frozen=True)
class XidSnapshot:
    """An MVCC snapshot as ``pg_current_snapshot()`` shows it (``xmin:xmax:xip,...``, 64-bit ids):
    a committed transaction is visible in it when its id is below ``xmin``, or below ``xmax`` and
    not among the ``in_progress`` ones (PostgreSQL's ``XidInMVCCSnapshot``, for top-level ids,
    which is what pgoutput's ``Begin`` carries)."""

    xmin: int
    xmax: int
    in_progress: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not 0 < self.xmin <= self.xmax or any(not self.xmin <= x < self.xmax for x in self.in_progress):
            raise ValueError(f"not a snapshot: {self.text()}")

    @classmethod
    def parse(cls, text: str) -> XidSnapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def text(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(str(x) for x in sorted(self.in_progress))}"

    def sees(self, xid: int) -> bool:
        """Whether committed transaction ``xid`` (32-bit, as decoded) is visible in the snapshot."""
        full = widen_xid(xid, self.xmax)
        return full < self.xmin or (full < self.xmax and full not in self.in_progress)


@dataclass(frozen=True)
class ChunkRead:
    """One chunk of a table's snapshot, read and emitted: the rows of partition ``partition``
    (:func:`key_partition`; always 0 at parallelism 1) whose key is above the previous chunk's
    ``upper`` of the table and partition (or every such row for the first) and at most ``upper``
    (None: no bound, the partition's last chunk), as ``snapshot`` saw them. ``wal_end``: the WAL
    insert position read after the snapshot was taken: every transaction the snapshot sees
    committed before it, so a transaction whose commit ends after it is one the chunk did not see.
    A table read in one chunk has one chunk, of the partition of the subtask that read it."""

    table: str
    upper: Key | None
    snapshot: XidSnapshot
    wal_end: int
    partition: int = 0


@dataclass(frozen=True)
class NextChunk:
    """Read ``table``'s rows with a key above ``after`` (None: from its first row)."""

    table: str
    after: Key | None


def next_chunk(tables: Sequence[str], chunks: Sequence[ChunkRead]) -> NextChunk | None:
    """The chunk to read after ``chunks`` (one subtask's, in the order read), tables in order; None:
    all were read."""
    last: dict[str, ChunkRead] = {}
    for chunk in chunks:
        last[chunk.table] = chunk
    for table in tables:
        latest = last.get(table)
        if latest is None:
            return NextChunk(table, None)
        if latest.upper is not None:
            return NextChunk(table, latest.upper)
    return None


def chunk_of(chunks: Sequence[ChunkRead], table: str, key: Key | None, partitions: int = 1) -> ChunkRead | None:
    """The chunk of ``table`` whose key range holds ``key`` (None: the table was read in one chunk,
    which holds every key); None when no chunk of the table is among ``chunks``. ``partitions``: the
    source parallelism the snapshot was read at; a key is in a chunk of its partition only, and
    ``chunks`` lists each partition's chunks in the order read."""
    partition = None if key is None else key_partition(key, partitions)
    for chunk in chunks:
        if chunk.table != table or (partition is not None and chunk.partition != partition):
            continue
        if chunk.upper is None:
            return chunk
        if key is None:
            raise ValueError(f"a key is needed to place a change of {table}, read in several chunks")
        if key <= chunk.upper:
            return chunk
    return None


@dataclass(frozen=True)
class CdcState:
    """What a checkpoint holds of the source.

    ``SNAPSHOT``: ``position`` is the slot's consistent point once the slot was created (None
    before), ``chunks`` the subtask's chunks emitted so far. ``PARTITION_READ`` (a reader, subtask
    > 0 of a parallel snapshot): every chunk of its partition was emitted; ``chunks`` are what it
    announces to subtask 0. ``STREAMING`` (subtask 0 only): ``position`` is the LSN through which
    every transaction was emitted or skipped; ``chunks`` the snapshot's chunks, of every partition,
    a transaction after ``position`` may still have been seen by (a change a chunk read is not
    emitted again), dropped once the position passed every chunk's ``wal_end``. ``IDLE`` (subtask >
    0, :data:`IDLE_READER`): nothing to read (:func:`redistribute`). ``partitions``: the source parallelism
    the snapshot is read at (1: one subtask reads every chunk), kept after a rescale."""

    phase: Phase
    position: int | None
    chunks: tuple[ChunkRead, ...] = ()
    partitions: int = 1

    def __post_init__(self) -> None:
        if self.partitions < 1 or any(not 0 <= c.partition < self.partitions for c in self.chunks):
            raise ValueError(f"chunks of partitions outside 0..{self.partitions - 1}")
        match self.phase:
            case Phase.SNAPSHOT:
                if self.position is None and self.chunks:
                    raise ValueError("a snapshot's chunks without its slot")
            case Phase.PARTITION_READ | Phase.STREAMING:
                if self.position is None:
                    raise ValueError(f"a {self.phase.value} state has no position")
            case Phase.IDLE:
                if self.position is not None or self.chunks:
                    raise ValueError("an idle subtask holds no position and no chunk")
            case _:
                assert_never(self.phase)


SNAPSHOT_PENDING: Final = CdcState(Phase.SNAPSHOT, None)
IDLE_READER: Final = CdcState(Phase.IDLE, None)
"""A subtask > 0 of a source restored at another parallelism than its snapshot's (:func:`redistribute`):
after the snapshot (subtask 0 streams alone), or above the snapshot's parallelism (its partitions
are the first subtasks'), it has nothing to read."""


@dataclass(frozen=True)
class SlotFound:
    """The replication slot as the server shows it at start."""

    confirmed_flush: int


@dataclass(frozen=True)
class TakeSnapshot:
    """Create the slot, then read the tables chunk by chunk and stream from the slot's consistent
    point. ``drop_existing``: a slot of that name is left from an attempt whose slot no completed
    checkpoint holds: drop it first."""

    drop_existing: bool


@dataclass(frozen=True)
class ResumeSnapshot:
    """The slot holds the restored consistent point: read the chunks after the restored ones."""

    consistent_point: int


@dataclass(frozen=True)
class Resume:
    """Decode from the slot, emitting the transactions that commit after ``position``."""

    position: int


StartDecision = TakeSnapshot | ResumeSnapshot | Resume


@dataclass(frozen=True)
class AwaitSlot:
    """A reader (subtask > 0) without a chunk read: wait until subtask 0 marks the slot as this
    run's (created, or restored, by it), then read the partition from its first chunk. Reading
    before could take a snapshot before the slot's consistent point (a slot left by an earlier
    attempt, which subtask 0 then drops): a transaction between the two would be in neither."""


@dataclass(frozen=True)
class AnnounceRestored:
    """A reader whose restored state holds its whole partition: the rows were emitted before the
    restored checkpoint's barrier, so announce the chunks (:class:`PartitionRead`) at once."""

    chunks: tuple[ChunkRead, ...]


@dataclass(frozen=True)
class StayIdle:
    """A subtask > 0 restored :data:`IDLE_READER`: it reads nothing (subtask 0 streams, or the snapshot's
    partitions are the first subtasks')."""


ReaderStartDecision = AwaitSlot | ResumeSnapshot | AnnounceRestored | StayIdle


def decide_reader_start(state: CdcState) -> ReaderStartDecision:
    """What a reader (subtask > 0 of a parallel snapshot) does with the state it restored
    (:data:`SNAPSHOT_PENDING` when none). A reader never streams, so its state is never
    ``STREAMING``; its slot is subtask 0's to check."""
    match state.phase:
        case Phase.SNAPSHOT:
            if state.position is None:
                return AwaitSlot()
            return ResumeSnapshot(state.position)
        case Phase.PARTITION_READ:
            return AnnounceRestored(state.chunks)
        case Phase.IDLE:
            return StayIdle()
        case Phase.STREAMING:
            raise ValueError("a reader's state is never streaming")
        case _:
            assert_never(state.phase)


def decide_start(state: CdcState, slot: SlotFound | None, slot_name: str) -> StartDecision:
    """What a start does with the state it restored (:data:`SNAPSHOT_PENDING` when none) and the
    slot it found. Raises CdcSourceError when the slot cannot give back the changes after the
    restored position: it is gone, or it was advanced past it (a restore of an older checkpoint
    than the last completed one, or another consumer of the slot)."""
    if state.position is None:
        return TakeSnapshot(drop_existing=slot is not None)
    position = state.position
    if slot is None:
        raise CdcSourceError(
            f"postgres cdc source: replication slot {slot_name!r} is gone, so the changes after the "
            f"checkpoint's LSN {format_lsn(position)} are lost; start the job without its "
            "checkpoint to take a new snapshot"
        )
    if slot.confirmed_flush > position:
        raise CdcSourceError(
            f"postgres cdc source: replication slot {slot_name!r} was advanced to "
            f"{format_lsn(slot.confirmed_flush)}, past the restored checkpoint's LSN "
            f"{format_lsn(position)}, so the changes between are lost (a restore of an older "
            "checkpoint, or another consumer of the slot); restore the latest checkpoint, or start "
            "the job without its checkpoint to take a new snapshot"
        )
    match state.phase:
        case Phase.SNAPSHOT:
            return ResumeSnapshot(position)
        case Phase.STREAMING:
            return Resume(position)
        case Phase.PARTITION_READ | Phase.IDLE:
            raise ValueError("subtask 0 streams: its state is never a reader's")
        case _:
            assert_never(state.phase)


@dataclass(frozen=True)
class AdvanceSlot:
    """A completed checkpoint's streaming position: move the slot to ``lsn``."""

    lsn: int


@dataclass(frozen=True)
class AnnouncePartition:
    """A completed checkpoint holds the reader's whole partition: every row it read went before
    that checkpoint's barrier, so it reached every operator downstream before anything subtask 0
    streams after the announcement (Flink CDC's enumerator likewise assigns the stream split only
    after a checkpoint completed once every snapshot split was finished: else a row's snapshot
    record and its later changes, from two subtasks, could cross)."""

    chunks: tuple[ChunkRead, ...]


CheckpointAction = AdvanceSlot | AnnouncePartition


class TransactionVerdict(enum.Enum):
    EMIT = "emit"
    SKIP = "skip"  # committed at or before the position: emitted before the restore


class CdcProgress:
    """The source's position and the checkpoints that hold it, until they complete or abort.

    Driven by the operator: ``slot_created(lsn)`` (subtask 0 created it; a reader found it marked
    as this run's), then ``chunk_emitted(chunk)`` after each chunk's rows; after the last,
    ``snapshot_emitted(others)`` (subtask 0, with the chunks every reader announced) or
    ``partition_read()`` (a reader, subtask > 0, which then only announces); then
    ``transaction(end)`` for each decoded transaction (emit it or skip it) and, for an emitted
    one, ``seen_by_snapshot`` for each of its changes while the snapshot's chunks may have read it;
    ``decoded_through(lsn)`` when the decoder has returned every transaction committed before
    ``lsn`` (quiet tables still move the position, so the slot does not hold WAL back);
    ``checkpoint_taken(id)`` at a barrier, ``checkpoint_completed(id)`` which answers what the
    completion calls for (:data:`CheckpointAction`: advance the slot, or announce the partition).
    ``partitions``: the source parallelism (each subtask's ``CdcProgress`` has its own state)."""

    def __init__(self, state: CdcState = SNAPSHOT_PENDING, partitions: int = 1) -> None:
        if state.position is not None and state.partitions != partitions and state.phase is not Phase.STREAMING:
            raise ValueError(
                f"a snapshot read at parallelism {state.partitions} cannot go on at parallelism {partitions}"
            )
        self._state = state
        self._partitions = partitions
        self._taken: dict[int, CdcState] = {}
        self._advanced: int | None = None
        self._announced = False  # a reader's partition, in this run

    @property
    def state(self) -> CdcState:
        return self._state

    @property
    def pending_checkpoints(self) -> list[int]:
        return sorted(self._taken)

    def slot_created(self, consistent_point: int) -> None:
        if self._state.phase is not Phase.SNAPSHOT or self._state.position is not None:
            raise ValueError("the slot was created already")
        self._state = CdcState(Phase.SNAPSHOT, consistent_point, partitions=self._partitions)

    def next_chunk(self, tables: Sequence[str]) -> NextChunk | None:
        """The chunk to read next of ``tables`` (the subtask's, :func:`tables_read_by`; None: every
        chunk was emitted)."""
        self._snapshot_position()
        return next_chunk(tables, self._state.chunks)

    def chunk_emitted(self, chunk: ChunkRead) -> None:
        """Every row of ``chunk`` was emitted."""
        self._snapshot_position()
        self._state = replace(self._state, chunks=(*self._state.chunks, chunk))

    def partition_announced(self) -> None:
        """A reader announced its partition in this run (at its start, from a restored state that
        holds all of it): no completed checkpoint announces it again."""
        if self._state.phase is not Phase.PARTITION_READ:
            raise ValueError("a partition is announced once read")
        self._announced = True

    def partition_read(self) -> None:
        """A reader (subtask > 0) emitted every chunk of its partition: the next completed
        checkpoint announces them (:class:`AnnouncePartition`)."""
        position = self._snapshot_position()
        if self._partitions == 1:
            raise ValueError("one subtask reads the whole snapshot: it streams, it has no partition to announce")
        self._state = CdcState(Phase.PARTITION_READ, position, self._state.chunks, self._partitions)

    def snapshot_emitted(self, others: Sequence[ChunkRead] = ()) -> None:
        """Every chunk was emitted: this subtask's and ``others`` (every reader's, as announced):
        stream from the slot's consistent point."""
        position = self._snapshot_position()
        chunks = (*self._state.chunks, *others)
        self._state = self._pruned(CdcState(Phase.STREAMING, position, chunks, self._partitions))

    def transaction(self, commit_end: int) -> TransactionVerdict:
        """A decoded transaction whose commit record ends at ``commit_end``: emit it (the position
        moves to its end) or skip it (it was emitted before the position)."""
        position = self._streaming_position()
        if commit_end <= position:
            return TransactionVerdict.SKIP
        self._state = self._pruned(replace(self._state, position=commit_end))
        return TransactionVerdict.EMIT

    def seen_by_snapshot(self, table: str, keys: Sequence[Key | None], xid: int, commit_end: int) -> bool:
        """Whether the change of an emitted transaction (``xid``, committed at ``commit_end``) to
        the rows of ``table`` with ``keys`` (an update's new and old key; None: the table was read
        in one chunk) is in the chunks that read those rows, each: then it is not emitted again.
        An update that moved a row from a chunk that saw it to one that did not is emitted."""
        self._streaming_position()
        if not keys:
            raise ValueError("a change has a key")
        for key in keys:
            chunk = chunk_of(self._state.chunks, table, key, self._state.partitions)
            if chunk is None or commit_end > chunk.wal_end or not chunk.snapshot.sees(xid):
                return False
        return True

    def decoded_through(self, lsn: int) -> None:
        """Every transaction that commits before ``lsn`` was handed to :meth:`transaction`."""
        if lsn > self._streaming_position():
            self._state = self._pruned(replace(self._state, position=lsn))

    def checkpoint_taken(self, checkpoint_id: int) -> CdcState:
        """The state checkpoint ``checkpoint_id`` holds (remembered until it completes or aborts)."""
        self._taken[checkpoint_id] = self._state
        return self._state

    def checkpoint_completed(self, checkpoint_id: int) -> CheckpointAction | None:
        """What the completion of ``checkpoint_id`` calls for (None: nothing, or its snapshot is not
        here). Its streaming position: :class:`AdvanceSlot` (unless the slot is there already; a
        snapshot's consistent point is never advanced past: the chunks' changes are decoded from
        it). A reader's whole partition: :class:`AnnouncePartition`, once a run (subtask 0 reads
        every message the WAL holds). Earlier checkpoints are covered by it and forgotten."""
        state = self._taken.pop(checkpoint_id, None)
        for earlier in [c for c in self._taken if c < checkpoint_id]:
            del self._taken[earlier]
        if state is None or state.position is None:
            return None
        match state.phase:
            case Phase.SNAPSHOT | Phase.IDLE:
                return None
            case Phase.PARTITION_READ:
                if self._announced:
                    return None
                self._announced = True
                return AnnouncePartition(state.chunks)
            case Phase.STREAMING:
                if self._advanced is not None and state.position <= self._advanced:
                    return None
                self._advanced = state.position
                return AdvanceSlot(state.position)
            case _:
                assert_never(state.phase)

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._taken.pop(checkpoint_id, None)

    @staticmethod
    def _pruned(state: CdcState) -> CdcState:
        """Streaming past every chunk's ``wal_end``, no chunk saw a transaction still to come."""
        assert state.position is not None
        if state.chunks and all(c.wal_end < state.position for c in state.chunks):
            return replace(state, chunks=())
        return state

    def _snapshot_position(self) -> int:
        if self._state.phase is not Phase.SNAPSHOT:
            raise ValueError("the snapshot was emitted already")
        if self._state.position is None:
            raise ValueError("the snapshot's chunks before its slot was created")
        return self._state.position

    def _streaming_position(self) -> int:
        if self._state.phase is not Phase.STREAMING or self._state.position is None:
            raise ValueError("changes before the snapshot was emitted")
        return self._state.position


# The parallel snapshot: a reader's announcement and subtask 0's gathering ---------------------------


@dataclass(frozen=True)
class SnapshotRun:
    """One run of the job's subtasks: every subtask of a job attempt restores the same checkpoint
    (a failover redeploys them all), so ``(job_id, attempt)`` names what they did together."""

    job_id: str
    attempt: int


def slot_mark(slot_name: str, run: SnapshotRun) -> str:
    """What subtask 0 sets as its session's ``application_name`` once the slot is this run's
    (created, or restored, by it), for the readers to wait on (:class:`AwaitSlot`): 63 characters at
    most, PostgreSQL's limit."""
    digest = hashlib.sha1(f"{slot_name}\x1f{run.job_id}\x1f{run.attempt}".encode(), usedforsecurity=False)
    return f"weir-cdc {digest.hexdigest()}"


@dataclass(frozen=True)
class PartitionRead:
    """A reader's announcement that its partition is read and that a completed checkpoint holds it:
    written into the WAL as a logical decoding message (``pg_logical_emit_message``, prefix
    :data:`PARTITION_READ_PREFIX`) and read by subtask 0 from the slot, which it decodes anyway.
    The WAL is the channel because Weir has no coordinator between a source's subtasks (Flink CDC's
    readers report finished splits to its enumerator)."""

    slot: str
    run: SnapshotRun
    subtask: int
    partitions: int
    chunks: tuple[ChunkRead, ...]


PARTITION_READ_PREFIX: Final = "weir-cdc-partition-read"


def _encode_chunk(chunk: ChunkRead) -> dict[str, Any]:
    return {
        "table": chunk.table,
        "partition": chunk.partition,
        "upper": None if chunk.upper is None else encode_key(chunk.upper),
        "snapshot": chunk.snapshot.text(),
        "wal_end": format_lsn(chunk.wal_end),
    }


def _decode_chunk(document: Any) -> ChunkRead:
    c = typed(document, dict)
    return ChunkRead(
        typed(c["table"], str),
        None if c["upper"] is None else decode_key(c["upper"]),
        XidSnapshot.parse(typed(c["snapshot"], str)),
        parse_lsn(typed(c["wal_end"], str)),
        typed(c.get("partition", 0), int),
    )


def encode_partition_read(announcement: PartitionRead) -> bytes:
    """``{"format": 1, "slot", "job_id", "attempt", "subtask", "partitions", "chunks": [...]}``, the
    chunks as in the source's state (docs/formats.md)."""
    document = {
        "format": PARTITION_READ_FORMAT,
        "slot": announcement.slot,
        "job_id": announcement.run.job_id,
        "attempt": announcement.run.attempt,
        "subtask": announcement.subtask,
        "partitions": announcement.partitions,
        "chunks": [_encode_chunk(c) for c in announcement.chunks],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_partition_read(data: bytes) -> PartitionRead:
    what = "postgres cdc partition-read message"
    document = load_versioned(data, what, (PARTITION_READ_FORMAT,), "every subtask of a job runs one Weir version")
    try:
        return PartitionRead(
            typed(document["slot"], str),
            SnapshotRun(typed(document["job_id"], str), typed(document["attempt"], int)),
            typed(document["subtask"], int),
            typed(document["partitions"], int),
            tuple(_decode_chunk(c) for c in typed(document["chunks"], list)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is malformed: {type(exc).__name__}: {exc}") from exc


class SnapshotCollector:
    """Subtask 0 of a parallel snapshot, its own partition read: gathers the readers' announcements
    (:class:`PartitionRead`) of this run from the decoded WAL until every reader's is there.

    Only this run's count: an announcement of an earlier attempt (or of another job on the same
    slot name) describes chunks whose rows a restore took back. Within the run, a reader announces
    again after each completed checkpoint until it learns nothing more (the announcements are the
    same), and the last one counts."""

    def __init__(self, slot_name: str, run: SnapshotRun, partitions: int) -> None:
        if partitions < 2:
            raise ValueError("one subtask reads the whole snapshot: nothing to gather")
        self._slot = slot_name
        self._run = run
        self._partitions = partitions
        self._by_subtask: dict[int, tuple[ChunkRead, ...]] = {}

    def offer(self, announcement: PartitionRead) -> bool:
        """Take ``announcement`` if it is this run's; answers whether it was."""
        if (
            announcement.slot != self._slot
            or announcement.run != self._run
            or announcement.partitions != self._partitions
            or not 0 < announcement.subtask < self._partitions
        ):
            return False
        if any(c.partition != announcement.subtask for c in announcement.chunks):
            raise ValueError(f"subtask {announcement.subtask} announced chunks of another partition")
        self._by_subtask[announcement.subtask] = announcement.chunks
        return True

    @property
    def missing(self) -> list[int]:
        """The readers whose announcement has not come yet."""
        return [s for s in range(1, self._partitions) if s not in self._by_subtask]

    def chunks(self) -> tuple[ChunkRead, ...]:
        """Every reader's chunks, by subtask, each in the order read; every reader must have announced."""
        if self.missing:
            raise ValueError(f"subtasks {self.missing} have not announced their partitions")
        return tuple(c for s in range(1, self._partitions) for c in self._by_subtask[s])


# Restoring at another parallelism -------------------------------------------------------------------


def snapshot_partitions(state: CdcState, parallelism: int) -> int:
    """The partitions a subtask restored with ``state`` at source parallelism ``parallelism`` reads
    its snapshot in: a restored snapshot's own (underway, handed over, or fixed by
    :func:`redistribute` for a reader that had not started), else, a new snapshot, one per subtask."""
    if state.position is not None or state.partitions > 1:
        return state.partitions
    return 1 if state.phase is Phase.IDLE else parallelism


@dataclass(frozen=True)
class Redistributed:
    """Each new subtask's state, by its index."""

    states: tuple[CdcState, ...]


@dataclass(frozen=True)
class RedistributionRefused:
    """The states cannot go on at the new parallelism: ``reason`` says why and what to do, in one line."""

    reason: str


Redistribution = Redistributed | RedistributionRefused


def redistribute(states: Sequence[CdcState], parallelism: int, source: str) -> Redistribution:
    """Every subtask's state of one source (``states``, by old subtask index: their number is the old
    parallelism) given to the source restored at ``parallelism`` (a savepoint or a retained checkpoint
    restored into a job whose source runs at another parallelism); ``source`` names it in a refusal.

    - at the same parallelism, each subtask takes its own state;
    - nothing read yet (no state holds the slot): the snapshot starts anew at ``parallelism``;
    - the snapshot handed over (subtask 0 streams): subtask 0's state is the whole position, the LSN
      through which every transaction was emitted and the chunks a later change may have been read
      by (placed by the partitions the snapshot was read at, which the state keeps): it goes to
      subtask 0, which decodes on from that LSN, so no change is lost or repeated; every other
      subtask is :data:`IDLE_READER` (the readers' announced chunks are in subtask 0's state);
    - mid-snapshot, at a parallelism at or above the snapshot's partitions: these are fixed when it
      starts (a row's is the hash of its key modulo their number), so the state of partition i's
      reader goes on in new subtask i (a reader that had not started is given the snapshot's
      partitions: :func:`snapshot_partitions`), and the subtasks above are :data:`IDLE_READER`;
    - mid-snapshot, below the snapshot's partitions: refused (each partition needs its reader, and
      a reader reads one partition).

    Raises SerializationError for states that are not one source's (a reader's state streaming,
    subtask 0's a reader's, a reader beyond the snapshot's partitions not idle)."""
    if parallelism < 1 or not states:
        raise ValueError(f"{len(states)} state(s) to parallelism {parallelism}")
    old = len(states)

    def damaged() -> SerializationError:
        phases = ", ".join(f"#{i} {s.phase.value}" for i, s in enumerate(states))
        return SerializationError(f"{source}: the subtasks' states ({phases}) are not those of one source")

    if states[0].phase in (Phase.PARTITION_READ, Phase.IDLE) or any(s.phase is Phase.STREAMING for s in states[1:]):
        raise damaged()
    if parallelism == old:
        return Redistributed(tuple(states))
    if all(s.position is None for s in states):
        return Redistributed((SNAPSHOT_PENDING,) * parallelism)
    if states[0].phase is Phase.STREAMING:
        return Redistributed((states[0], *(IDLE_READER,) * (parallelism - 1)))
    positioned = {s.partitions for s in states if s.position is not None}
    if len(positioned) != 1:
        raise damaged()
    (partitions,) = positioned
    # a reader before the slot holds the snapshot's partitions, or none (1) at the snapshot's own parallelism
    unstarted = {partitions, 1} if partitions == old else {partitions}
    if (
        partitions > old
        or any(s.phase is not Phase.IDLE for s in states[partitions:])
        or any(s.phase is Phase.SNAPSHOT and s.position is None and s.partitions not in unstarted for s in states)
    ):
        raise damaged()
    if parallelism >= partitions:
        readers = tuple(replace(s, partitions=partitions) if s.position is None else s for s in states[:partitions])
        return Redistributed((*readers, *(IDLE_READER,) * (parallelism - partitions)))
    return RedistributionRefused(
        f"{source}: the checkpoint was taken while {partitions} subtasks read the snapshot, each its partition "
        f"of the rows, which cannot be read by {parallelism}: restore it at parallelism {partitions} or above "
        "and rescale once the snapshot is done (the source logs cdc_snapshot_emitted), or start the job without "
        f"the checkpoint for a new snapshot at parallelism {parallelism}"
    )


def redistribute_stored(stored: Sequence[bytes], slot_name: str, parallelism: int, source: str) -> Redistribution:
    """:func:`redistribute` over the stored states (:func:`encode_cdc_state`, by old subtask index):
    what the source's restore runs, and ``weir upgrade check`` before it. Raises what
    :func:`decode_cdc_state` raises (a state of another slot, a malformed one)."""
    return redistribute([decode_cdc_state(data, slot_name) for data in stored], parallelism, source)


# The slot at the job's end ----------------------------------------------------------------------------


class SlotRetention(enum.StrEnum):
    """What happens to the source's replication slot (and the publication the source created) when
    its job ends for good (a restart keeps it: it holds the position the restored checkpoint needs).

    A slot left behind keeps every WAL segment after its position, until the server's disk fills,
    so Weir drops it unless something may still need it: ``UNLESS_SAVEPOINT`` (the default) keeps
    it only when the job stopped at a savepoint (``weir stop``), which a new job restores from the
    slot's position; ``ALWAYS_DROP`` drops it then too (such a savepoint then restores into the
    clear "slot is gone" error); ``KEEP`` never drops it (Flink CDC's default,
    ``slot.drop.on.stop=false``: the operator drops it)."""

    UNLESS_SAVEPOINT = "unless-savepoint"
    ALWAYS_DROP = "always-drop"
    KEEP = "keep"


class JobEnd(enum.Enum):
    """How a job ended for good."""

    FINISHED = "finished"  # every task finished its input (a CDC source never does: it is unbounded)
    STOPPED_AT_SAVEPOINT = "stopped-at-savepoint"  # weir stop: the savepoint completed, the job FINISHED
    CANCELED = "canceled"
    FAILED = "failed"  # the restart strategy gave up


@dataclass(frozen=True)
class DropSlot:
    """Drop the slot, and the publication when the source created it."""


@dataclass(frozen=True)
class KeepSlot:
    reason: str


SlotAtEnd = DropSlot | KeepSlot


def decide_slot_at_end(end: JobEnd, retention: SlotRetention) -> SlotAtEnd:
    """What the job's end does with the source's slot (see :class:`SlotRetention`)."""
    match retention:
        case SlotRetention.KEEP:
            return KeepSlot("the source keeps its slot (slot_retention='keep'): drop it when done")
        case SlotRetention.ALWAYS_DROP:
            return DropSlot()
        case SlotRetention.UNLESS_SAVEPOINT:
            match end:
                case JobEnd.STOPPED_AT_SAVEPOINT:
                    return KeepSlot("the job stopped at a savepoint, which resumes from the slot's position")
                case JobEnd.FINISHED | JobEnd.CANCELED | JobEnd.FAILED:
                    return DropSlot()
                case _:
                    assert_never(end)
        case _:
            assert_never(retention)


# The source state's JSON ----------------------------------------------------------------------------


def encode_cdc_state(state: CdcState, slot_name: str) -> bytes:
    """``{"format": 4, "slot": name, "phase": "snapshot" | "partition-read" | "streaming" | "idle", "lsn":
    null | "X/Y", "partitions": n, "chunks": [{"table", "partition", "upper": null | [[kind, value],
    ...], "snapshot": "xmin:xmax:xip,...", "wal_end": "X/Y"}, ...]}`` (docs/formats.md)."""
    lsn = None if state.position is None else format_lsn(state.position)
    document = {
        "format": CDC_SOURCE_STATE_FORMAT,
        "slot": slot_name,
        "phase": state.phase.value,
        "lsn": lsn,
        "partitions": state.partitions,
        "chunks": [_encode_chunk(c) for c in state.chunks],
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_cdc_state(data: bytes, slot_name: str) -> CdcState:
    """The state :func:`encode_cdc_state` wrote; format 3 (without the ``idle`` phase), 2 (one
    subtask: no ``partitions``, no chunk ``partition``) and 1 (without chunks) too. A state of another slot is refused
    (JobDefinitionError): its position means nothing in this slot."""
    what = "postgres cdc source state"
    document = load_versioned(
        data, what, (1, 2, 3, CDC_SOURCE_STATE_FORMAT), "restore it with the Weir version that wrote it"
    )
    try:
        slot = typed(document["slot"], str)
        phase = Phase(typed(document["phase"], str))
        if (document["format"] < 3 and phase is Phase.PARTITION_READ) or (
            document["format"] < 4 and phase is Phase.IDLE
        ):
            raise ValueError(f"phase {phase.value!r} in format {document['format']}")
        lsn = document["lsn"]
        chunks = tuple(_decode_chunk(c) for c in typed(document.get("chunks", []), list))
        partitions = typed(document.get("partitions", 1), int)
        state = CdcState(phase, None if lsn is None else parse_lsn(typed(lsn, str)), chunks, partitions)
    except (KeyError, TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is malformed: {type(exc).__name__}: {exc}") from exc
    if slot != slot_name:
        raise JobDefinitionError(
            f"postgres cdc source: the restored state is of replication slot {slot!r}, this source reads "
            f"{slot_name!r}; give the source its old slot name, or start the job without the checkpoint"
        )
    return state


__all__ = [
    "IDLE_READER",
    "Redistributed",
    "Redistribution",
    "RedistributionRefused",
    "StayIdle",
    "redistribute",
    "redistribute_stored",
    "snapshot_partitions",
    "CDC_SOURCE_STATE_FORMAT",
    "PARTITION_READ_FORMAT",
    "PARTITION_READ_PREFIX",
    "AdvanceSlot",
    "AnnouncePartition",
    "AnnounceRestored",
    "AwaitSlot",
    "CheckpointAction",
    "PartitionRead",
    "ReaderStartDecision",
    "SnapshotCollector",
    "SnapshotRun",
    "decide_reader_start",
    "decode_partition_read",
    "encode_partition_read",
    "key_partition",
    "key_text",
    "slot_mark",
    "tables_read_by",
    "CHANGE_EVENT_FORMAT",
    "KEY_TEXT_SEPARATOR",
    "SNAPSHOT_PENDING",
    "CdcProgress",
    "ChunkRead",
    "DropSlot",
    "JobEnd",
    "Key",
    "KeyKind",
    "KeepSlot",
    "NextChunk",
    "ResumeSnapshot",
    "SlotAtEnd",
    "SlotRetention",
    "XidSnapshot",
    "chunk_of",
    "decide_slot_at_end",
    "decode_key",
    "encode_key",
    "next_chunk",
    "widen_xid",
    "CdcSourceError",
    "CdcState",
    "ChangeEvent",
    "ChangeOp",
    "Phase",
    "Resume",
    "Row",
    "SlotFound",
    "StartDecision",
    "TakeSnapshot",
    "TransactionVerdict",
    "decide_start",
    "decode_cdc_state",
    "encode_cdc_state",
    "format_lsn",
    "json_value",
    "parse_lsn",
]

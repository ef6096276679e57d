"""Change data capture from PostgreSQL: the change event, the source's position and its slot bookkeeping.

The PostgreSQL CDC source (``weir.api.postgres_cdc_source``) reads a consistent snapshot of its tables,
then the changes committed after the snapshot, decoded by logical replication (``pgoutput``) from a
replication slot. This module is its pure part, with no I/O:

- :class:`ChangeEvent`, the record the source emits, and its documented JSON form;
- :class:`CdcProgress`, the state machine of the source's position: which transactions it emits or
  skips, what each checkpoint holds, when the slot may be advanced (only for a completed checkpoint,
  so that a restore re-reads exactly from the checkpoint), and what a start does with the slot it
  finds (:func:`decide_start`);
- the source state's versioned JSON (``docs/formats.md``).

The position is a WAL location (LSN): every transaction whose commit record ends at or before it has
been emitted; the source emits whole transactions only, so a checkpoint never falls inside one.
Debezium's and Flink CDC's PostgreSQL connectors keep the same position (the last committed
transaction's LSN, flushed to the slot as the checkpoint completes).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final, assert_never
from uuid import UUID

from weir.core.documents import load_versioned, typed
from weir.core.errors import Fault, JobDefinitionError, SerializationError, WeirError

CDC_SOURCE_STATE_FORMAT: Final = 2
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
    STREAMING = "streaming"  # every chunk was emitted; changes after ``position`` are next


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
    """One chunk of a table's snapshot, read and emitted: the rows whose key is above the previous
    chunk's ``upper`` of the table (or every row for the first) and at most ``upper`` (None: no
    bound, the table's last chunk), as ``snapshot`` saw them. ``wal_end``: the WAL insert position
    read after the snapshot was taken: every transaction the snapshot sees committed before it, so
    a transaction whose commit ends after it is one the chunk did not see."""

    table: str
    upper: Key | None
    snapshot: XidSnapshot
    wal_end: int


@dataclass(frozen=True)
class NextChunk:
    """Read ``table``'s rows with a key above ``after`` (None: from its first row)."""

    table: str
    after: Key | None


def next_chunk(tables: Sequence[str], chunks: Sequence[ChunkRead]) -> NextChunk | None:
    """The chunk to read after ``chunks`` (in the order read), tables in order; None: all were read."""
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


def chunk_of(chunks: Sequence[ChunkRead], table: str, key: Key | None) -> ChunkRead | None:
    """The chunk of ``table`` whose key range holds ``key`` (None: the table was read in one chunk,
    which holds every key); None when no chunk of the table is among ``chunks``."""
    for chunk in chunks:
        if chunk.table != table:
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
    before), ``chunks`` the chunks emitted so far. ``STREAMING``: ``position`` is the LSN through
    which every transaction was emitted or skipped; ``chunks`` the snapshot's chunks a transaction
    after ``position`` may still have been seen by (a change a chunk read is not emitted again),
    dropped once the position passed every chunk's ``wal_end``."""

    phase: Phase
    position: int | None
    chunks: tuple[ChunkRead, ...] = ()

    def __post_init__(self) -> None:
        match self.phase:
            case Phase.SNAPSHOT:
                if self.position is None and self.chunks:
                    raise ValueError("a snapshot's chunks without its slot")
            case Phase.STREAMING:
                if self.position is None:
                    raise ValueError("a streaming state has no position")
            case _:
                assert_never(self.phase)


SNAPSHOT_PENDING: Final = CdcState(Phase.SNAPSHOT, None)


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
        case _:
            assert_never(state.phase)


class TransactionVerdict(enum.Enum):
    EMIT = "emit"
    SKIP = "skip"  # committed at or before the position: emitted before the restore


class CdcProgress:
    """The source's position and the checkpoints that hold it, until they complete or abort.

    Driven by the operator: ``slot_created(lsn)``, then ``chunk_emitted(chunk)`` after each chunk's
    rows and ``snapshot_emitted()`` after the last; then ``transaction(end)`` for each decoded
    transaction (emit it or skip it) and, for an emitted one, ``seen_by_snapshot`` for each of its
    changes while the snapshot's chunks may have read it; ``decoded_through(lsn)`` when the decoder
    has returned every transaction committed before ``lsn`` (quiet tables still move the position,
    so the slot does not hold WAL back); ``checkpoint_taken(id)`` at a barrier,
    ``checkpoint_completed(id)`` which answers the LSN to advance the slot to (None: nothing to
    advance)."""

    def __init__(self, state: CdcState = SNAPSHOT_PENDING) -> None:
        self._state = state
        self._taken: dict[int, CdcState] = {}
        self._advanced: int | None = None

    @property
    def state(self) -> CdcState:
        return self._state

    @property
    def pending_checkpoints(self) -> list[int]:
        return sorted(self._taken)

    def slot_created(self, consistent_point: int) -> None:
        if self._state != SNAPSHOT_PENDING:
            raise ValueError("the slot was created already")
        self._state = CdcState(Phase.SNAPSHOT, consistent_point)

    def next_chunk(self, tables: Sequence[str]) -> NextChunk | None:
        """The chunk to read next (None: every chunk was emitted)."""
        self._snapshot_position()
        return next_chunk(tables, self._state.chunks)

    def chunk_emitted(self, chunk: ChunkRead) -> None:
        """Every row of ``chunk`` was emitted."""
        self._snapshot_position()
        self._state = replace(self._state, chunks=(*self._state.chunks, chunk))

    def snapshot_emitted(self) -> None:
        """Every chunk was emitted: stream from the slot's consistent point."""
        position = self._snapshot_position()
        self._state = self._pruned(CdcState(Phase.STREAMING, position, self._state.chunks))

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
            chunk = chunk_of(self._filters, table, key)
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

    def checkpoint_completed(self, checkpoint_id: int) -> int | None:
        """The LSN to advance the slot to now that ``checkpoint_id`` completed (None: the checkpoint's
        snapshot is not here, it holds no streaming position, or the slot is there already). Earlier
        checkpoints are covered by it and forgotten. A snapshot's consistent point is never advanced
        past: the chunks' changes are decoded from it."""
        state = self._taken.pop(checkpoint_id, None)
        for earlier in [c for c in self._taken if c < checkpoint_id]:
            del self._taken[earlier]
        if state is None or state.phase is Phase.SNAPSHOT or state.position is None:
            return None
        if self._advanced is not None and state.position <= self._advanced:
            return None
        self._advanced = state.position
        return state.position

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._taken.pop(checkpoint_id, None)

    @property
    def _filters(self) -> tuple[ChunkRead, ...]:
        return self._state.chunks

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
    """``{"format": 2, "slot": name, "phase": "snapshot" | "streaming", "lsn": null | "X/Y",
    "chunks": [{"table", "upper": null | [[kind, value], ...], "snapshot": "xmin:xmax:xip,...",
    "wal_end": "X/Y"}, ...]}`` (docs/formats.md)."""
    lsn = None if state.position is None else format_lsn(state.position)
    chunks = [
        {
            "table": c.table,
            "upper": None if c.upper is None else encode_key(c.upper),
            "snapshot": c.snapshot.text(),
            "wal_end": format_lsn(c.wal_end),
        }
        for c in state.chunks
    ]
    document = {
        "format": CDC_SOURCE_STATE_FORMAT,
        "slot": slot_name,
        "phase": state.phase.value,
        "lsn": lsn,
        "chunks": chunks,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_cdc_state(data: bytes, slot_name: str) -> CdcState:
    """The state :func:`encode_cdc_state` wrote (format 1, without chunks, too); a state of another
    slot is refused (JobDefinitionError): its position means nothing in this slot."""
    what = "postgres cdc source state"
    document = load_versioned(
        data, what, (1, CDC_SOURCE_STATE_FORMAT), "restore it with the Weir version that wrote it"
    )
    try:
        slot = typed(document["slot"], str)
        phase = Phase(typed(document["phase"], str))
        lsn = document["lsn"]
        chunks = tuple(
            ChunkRead(
                typed(c["table"], str),
                None if c["upper"] is None else decode_key(c["upper"]),
                XidSnapshot.parse(typed(c["snapshot"], str)),
                parse_lsn(typed(c["wal_end"], str)),
            )
            for c in typed(document.get("chunks", []), list)
        )
        state = CdcState(phase, None if lsn is None else parse_lsn(typed(lsn, str)), chunks)
    except (KeyError, TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is malformed: {type(exc).__name__}: {exc}") from exc
    if slot != slot_name:
        raise JobDefinitionError(
            f"postgres cdc source: the restored state is of replication slot {slot!r}, this source reads "
            f"{slot_name!r}; give the source its old slot name, or start the job without the checkpoint"
        )
    return state


__all__ = [
    "CDC_SOURCE_STATE_FORMAT",
    "CHANGE_EVENT_FORMAT",
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

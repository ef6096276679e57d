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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final, assert_never
from uuid import UUID

from weir.core.documents import load_versioned, typed
from weir.core.errors import Fault, JobDefinitionError, SerializationError, WeirError

CDC_SOURCE_STATE_FORMAT: Final = 1
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
    SNAPSHOT = "snapshot"  # the snapshot is still to be read (nothing emitted yet)
    STREAMING = "streaming"  # the snapshot was emitted; changes after ``position`` are next


@dataclass(frozen=True)
class CdcState:
    """What a checkpoint holds of the source: its phase and position (None before the snapshot)."""

    phase: Phase
    position: int | None

    def __post_init__(self) -> None:
        if (self.phase is Phase.SNAPSHOT) != (self.position is None):
            raise ValueError(f"a {self.phase.value} state has {'no' if self.position is None else 'a'} position")


SNAPSHOT_PENDING: Final = CdcState(Phase.SNAPSHOT, None)


@dataclass(frozen=True)
class SlotFound:
    """The replication slot as the server shows it at start."""

    confirmed_flush: int


@dataclass(frozen=True)
class TakeSnapshot:
    """Create the slot (with an exported snapshot), read the tables at it, then stream from the
    slot's consistent point. ``drop_existing``: a slot of that name is left from an attempt whose
    snapshot no completed checkpoint holds: drop it first."""

    drop_existing: bool


@dataclass(frozen=True)
class Resume:
    """Decode from the slot, emitting the transactions that commit after ``position``."""

    position: int


StartDecision = TakeSnapshot | Resume


def decide_start(state: CdcState, slot: SlotFound | None, slot_name: str) -> StartDecision:
    """What a start does with the state it restored (:data:`SNAPSHOT_PENDING` when none) and the
    slot it found. Raises CdcSourceError when the slot cannot give back the changes after the
    restored position: it is gone, or it was advanced past it (a restore of an older checkpoint
    than the last completed one, or another consumer of the slot)."""
    match state.phase:
        case Phase.SNAPSHOT:
            return TakeSnapshot(drop_existing=slot is not None)
        case Phase.STREAMING:
            assert state.position is not None
            if slot is None:
                raise CdcSourceError(
                    f"postgres cdc source: replication slot {slot_name!r} is gone, so the changes after the "
                    f"checkpoint's LSN {format_lsn(state.position)} are lost; start the job without its "
                    "checkpoint to take a new snapshot"
                )
            if slot.confirmed_flush > state.position:
                raise CdcSourceError(
                    f"postgres cdc source: replication slot {slot_name!r} was advanced to "
                    f"{format_lsn(slot.confirmed_flush)}, past the restored checkpoint's LSN "
                    f"{format_lsn(state.position)}, so the changes between are lost (a restore of an older "
                    "checkpoint, or another consumer of the slot); restore the latest checkpoint, or start "
                    "the job without its checkpoint to take a new snapshot"
                )
            return Resume(state.position)
        case _:
            assert_never(state.phase)


class TransactionVerdict(enum.Enum):
    EMIT = "emit"
    SKIP = "skip"  # committed at or before the position: emitted before the restore


class CdcProgress:
    """The source's position and the checkpoints that hold it, until they complete or abort.

    Driven by the operator: ``snapshot_emitted(lsn)`` after the snapshot's rows, ``transaction(end)``
    for each decoded transaction (emit it or skip it), ``decoded_through(lsn)`` when the decoder has
    returned every transaction committed before ``lsn`` (quiet tables still move the position, so the
    slot does not hold WAL back), ``checkpoint_taken(id)`` at a barrier, ``checkpoint_completed(id)``
    which answers the LSN to advance the slot to (None: nothing to advance)."""

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

    def snapshot_emitted(self, consistent_point: int) -> None:
        """Every row of the snapshot at the slot's ``consistent_point`` was emitted."""
        if self._state.phase is not Phase.SNAPSHOT:
            raise ValueError("the snapshot was emitted already")
        self._state = CdcState(Phase.STREAMING, consistent_point)

    def transaction(self, commit_end: int) -> TransactionVerdict:
        """A decoded transaction whose commit record ends at ``commit_end``: emit it (the position
        moves to its end) or skip it (it was emitted before the position)."""
        position = self._streaming_position()
        if commit_end <= position:
            return TransactionVerdict.SKIP
        self._state = CdcState(Phase.STREAMING, commit_end)
        return TransactionVerdict.EMIT

    def decoded_through(self, lsn: int) -> None:
        """Every transaction that commits before ``lsn`` was handed to :meth:`transaction`."""
        if lsn > self._streaming_position():
            self._state = CdcState(Phase.STREAMING, lsn)

    def checkpoint_taken(self, checkpoint_id: int) -> CdcState:
        """The state checkpoint ``checkpoint_id`` holds (remembered until it completes or aborts)."""
        self._taken[checkpoint_id] = self._state
        return self._state

    def checkpoint_completed(self, checkpoint_id: int) -> int | None:
        """The LSN to advance the slot to now that ``checkpoint_id`` completed (None: the checkpoint's
        snapshot is not here, it holds no position yet, or the slot is there already). Earlier
        checkpoints are covered by it and forgotten."""
        state = self._taken.pop(checkpoint_id, None)
        for earlier in [c for c in self._taken if c < checkpoint_id]:
            del self._taken[earlier]
        if state is None or state.position is None:
            return None
        if self._advanced is not None and state.position <= self._advanced:
            return None
        self._advanced = state.position
        return state.position

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._taken.pop(checkpoint_id, None)

    def _streaming_position(self) -> int:
        if self._state.position is None:
            raise ValueError("changes before the snapshot was emitted")
        return self._state.position


# The source state's JSON ----------------------------------------------------------------------------


def encode_cdc_state(state: CdcState, slot_name: str) -> bytes:
    """``{"format": 1, "slot": name, "phase": "snapshot" | "streaming", "lsn": null | "X/Y"}``."""
    lsn = None if state.position is None else format_lsn(state.position)
    document = {"format": CDC_SOURCE_STATE_FORMAT, "slot": slot_name, "phase": state.phase.value, "lsn": lsn}
    return json.dumps(document, separators=(",", ":")).encode()


def decode_cdc_state(data: bytes, slot_name: str) -> CdcState:
    """The state :func:`encode_cdc_state` wrote; a state of another slot is refused (JobDefinitionError):
    its position means nothing in this slot."""
    what = "postgres cdc source state"
    document = load_versioned(data, what, CDC_SOURCE_STATE_FORMAT, "restore it with the Weir version that wrote it")
    try:
        slot = typed(document["slot"], str)
        phase = Phase(typed(document["phase"], str))
        lsn = document["lsn"]
        state = CdcState(phase, None if lsn is None else parse_lsn(typed(lsn, str)))
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

"""The byte layout of keyed state: the one module that says how each entry of a keyed operator's
state is addressed and serialized, for the writers (the operators, through
``weir.core.state_backend``, and the RocksDB store of ``weir.taskmanager.state``) and every reader
(``weir savepoint info --keyed`` and ``dump``, ``weir plan``'s savepoint measure).

Quix Streams keeps this in ``state/serialization.py``, Arroyo in its table types; Flink splits it
between ``CompositeKeySerializationUtils`` (key group, key, namespace) and each state's
``TypeSerializer``. The bytes are a durable format (docs/formats.md, "Keyed state"): a savepoint
written by an earlier Weir restores into a later one, so nothing here changes without a new
format, and ``tests/unit/operators/test_state_bytes.py`` pins them with bytes written before this
module existed.

An entry of the task's RocksDB::

    <operator uid, UTF-8> 00 | <key group, u16 BE> | <state name, UTF-8> 00 | <state key>

so one operator's state in a range of key groups is one contiguous range of keys
(:func:`key_group_range_bounds`), which a restore deletes and copies whole. The state key starts with
the record key's bytes (``weir.core.keygroups.key_to_bytes``) and depends on the kind of state
(:data:`STATE_KINDS`):

- plain (a reduce's ``reduce``; a process function's ValueState, ListState, ReducingState,
  AggregatingState): the key's bytes;
- window (``win``): the key prefix (:func:`key_prefix`: u32 BE length, the key's bytes), then the
  window's start and end (i64 BE each);
- timer (``timers.event_time``, ``timers.processing_time``): the key prefix, then the time (i64 BE);
- map entry (a MapState, the joins' ``join.left`` and ``join.right``): the key prefix, then the
  entry key's bytes (``key_to_bytes``).

A value is a pickle (protocol 5, :func:`dump_value`) of what the state holds: a window's ``(key,
accumulator)``, a timer's ``(key,)`` (a None key is still told from a deleted timer), a MapState
entry's ``MapEntry(entry key, value)``, a value with a time to live as ``TtlValue(value,
last_access_ms)``. ``MapEntry`` and ``TtlValue`` are ``weir.operators.process_state``'s: a pickle
names a class by its module, so they stay where the stored bytes say they are. :func:`load_value`
also reads values pickled before Weir had one import root (``weir.core.serde.unpickle``).

Readers go through :func:`state_kind`: each state name the runtime writes has a :class:`StateKind`
whose key layout (:class:`KeyLayout`) tells a dump what follows the record key; a state the table
does not name (a process function's own) is read by guessing (:func:`guess_state_key`). A new kind of state
is one more entry of :data:`STATE_KINDS` (with its key layout), and every reader reads it.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from weir.core.errors import SerializationError
from weir.core.ids import KeyGroup
from weir.core.key_samples import KEY_SAMPLE_STATE
from weir.core.serde import unpickle

# State names ---------------------------------------------------------------------------------------

WINDOW_STATE: Final = "win"
"""A window operator's accumulators, one entry per (key, window): what a job's ``state_version`` versions."""
REDUCE_STATE: Final = "reduce"
"""A reduce's running value, one entry per key."""
EVENT_TIMERS: Final = "timers.event_time"
PROCESSING_TIMERS: Final = "timers.processing_time"
TIMER_STATES: Final = frozenset({EVENT_TIMERS, PROCESSING_TIMERS})
"""A process function's timers, one entry per (key, time): reserved, no process function's state takes them."""
JOIN_LEFT_BUFFER: Final = "join.left"
JOIN_RIGHT_BUFFER: Final = "join.right"
"""The joins' buffered records: MapStates of each key (window end, or timestamp -> records)."""
JOIN_LEFT_TIMES: Final = "join.left-times"
JOIN_RIGHT_TIMES: Final = "join.right-times"
"""An interval join's sorted timestamps of each key's buffered records (ValueStates)."""

# Entry keys ----------------------------------------------------------------------------------------

_SEPARATOR: Final = b"\x00"
"""Ends the operator uid and the state name in an entry key: neither may contain it."""
KEY_GROUP_BYTES: Final = 2
_LENGTH: Final = struct.Struct(">I")
_BOUNDS: Final = struct.Struct(">qq")
_TIME: Final = struct.Struct(">q")


def is_state_name(name: object) -> bool:
    """Whether ``name`` can name a state: a non-empty string without the separator of an entry key."""
    return isinstance(name, str) and bool(name) and _SEPARATOR.decode() not in name


def operator_prefix(uid: str) -> bytes:
    """What every entry of operator ``uid`` starts with."""
    return uid.encode("utf-8") + _SEPARATOR


def entry_key(operator: bytes, key_group: int, name: str, state_key: bytes) -> bytes:
    """The RocksDB key of state ``name``'s entry ``state_key`` in ``key_group``, for the operator
    whose :func:`operator_prefix` is ``operator``."""
    return b"".join((operator, key_group.to_bytes(KEY_GROUP_BYTES, "big"), name.encode("utf-8"), _SEPARATOR, state_key))


def key_group_range_bounds(uid: str, first: int, last: int) -> tuple[bytes, bytes]:
    """The RocksDB key range ``[start, end)`` of operator ``uid``'s state in key groups first..last."""
    prefix = operator_prefix(uid)
    return prefix + first.to_bytes(KEY_GROUP_BYTES, "big"), prefix + (last + 1).to_bytes(KEY_GROUP_BYTES, "big")


@dataclass(frozen=True, slots=True)
class KeyedEntry:
    """One stored entry of an operator's keyed state, as read back: its key group, state name, state
    key and value bytes (:func:`load_value` reads them; empty when the reader asked for keys only)."""

    key_group: KeyGroup
    state: str
    key: bytes
    value: bytes


def parse_entry(operator: bytes, full: bytes, value: bytes) -> KeyedEntry:
    """The entry at RocksDB key ``full`` of the operator whose :func:`operator_prefix` is
    ``operator``. Raises SerializationError for a key that is not one of its entries."""
    start = len(operator) + KEY_GROUP_BYTES
    uid = operator[: -len(_SEPARATOR)].decode("utf-8", "replace")
    if not full.startswith(operator) or len(full) < start:
        raise SerializationError(f"RocksDB key {full!r} is not an entry of operator {uid}")
    name, separator, state_key = full[start:].partition(_SEPARATOR)
    if not separator:
        raise SerializationError(f"RocksDB key {full!r} of operator {uid} has no state name")
    key_group = KeyGroup(int.from_bytes(full[len(operator) : start], "big"))
    return KeyedEntry(key_group, name.decode("utf-8", "replace"), state_key, value)


# State keys ----------------------------------------------------------------------------------------


def key_prefix(key_bytes: bytes) -> bytes:
    """The start of a composite state key (a window's, a timer's, a map entry's): the record key's
    bytes, length-prefixed so that what follows cannot be taken for part of the key."""
    return _LENGTH.pack(len(key_bytes)) + key_bytes


def split_key_prefix(state_key: bytes) -> tuple[bytes, bytes] | None:
    """``(record key bytes, what follows)`` of a state key that starts with a :func:`key_prefix`;
    None when it cannot (too short, or a length past its end)."""
    if len(state_key) < _LENGTH.size:
        return None
    end = _LENGTH.size + _LENGTH.unpack_from(state_key)[0]
    if end > len(state_key):
        return None
    return state_key[_LENGTH.size : end], state_key[end:]


def window_key(prefix: bytes, start: int, end: int) -> bytes:
    """The state key of window ``[start, end)`` of the key whose :func:`key_prefix` is ``prefix``."""
    return prefix + _BOUNDS.pack(start, end)


def window_key_suffix(start: int, end: int) -> bytes:
    """What follows the key prefix in the state key of window ``[start, end)``:
    ``window_key(prefix, start, end) == prefix + window_key_suffix(start, end)``."""
    return _BOUNDS.pack(start, end)


class WindowKeys:
    """:func:`window_key` remembering the last window's packed bounds: consecutive records mostly
    fall into the same window, so most state keys cost a concatenation."""

    __slots__ = ("_bounds", "_end", "_start")

    def __init__(self) -> None:
        self._start: int | None = None
        self._end: int | None = None
        self._bounds = b""

    def key(self, prefix: bytes, start: int, end: int) -> bytes:
        if start != self._start or end != self._end:
            self._start, self._end, self._bounds = start, end, _BOUNDS.pack(start, end)
        return prefix + self._bounds


def window_bounds(state_key: bytes) -> tuple[int, int]:
    """``(start, end)`` of a window's state key."""
    start, end = _BOUNDS.unpack_from(state_key, len(state_key) - _BOUNDS.size)
    return start, end


def window_key_prefix(state_key: bytes) -> bytes:
    """The :func:`key_prefix` part of a window's state key: what all windows of its key share."""
    return state_key[: len(state_key) - _BOUNDS.size]


def timer_key(prefix: bytes, time: int) -> bytes:
    """The state key of the timer at ``time`` of the key whose :func:`key_prefix` is ``prefix``."""
    return prefix + _TIME.pack(time)


def timer_time(state_key: bytes) -> int:
    """The time of a timer's state key."""
    time: int = _TIME.unpack_from(state_key, len(state_key) - _TIME.size)[0]
    return time


def map_entry_key(prefix: bytes, entry_key_bytes: bytes) -> bytes:
    """The state key of a MapState entry (its key's bytes ``entry_key_bytes``) of the key whose
    :func:`key_prefix` is ``prefix``; every entry of one key starts with ``prefix``."""
    return prefix + entry_key_bytes


# Values --------------------------------------------------------------------------------------------

VALUE_PICKLE_PROTOCOL: Final = 5
"""Fixed, not ``pickle.HIGHEST_PROTOCOL``: the stored bytes must not change with the interpreter."""


def dump_value(value: object) -> bytes:
    """A state's value as stored. Raises SerializationError (the user's fault) for a value that does
    not pickle (a lambda, an open file, a lock)."""
    try:
        return pickle.dumps(value, VALUE_PICKLE_PROTOCOL)
    except Exception as exc:
        raise SerializationError(
            f"cannot store a keyed state value of type {type(value).__qualname__}: {type(exc).__name__}: {exc}; "
            "state values must be picklable (no lambdas, open files, sockets or locks)",
            fault="user",
        ) from exc


def load_value(data: bytes) -> Any:
    """A value stored by :func:`dump_value` (or by a Weir before its one import root); raises what
    pickle raises (a class the value names may be gone)."""
    return unpickle(data)


# Reading state keys back ----------------------------------------------------------------------------


_INT_KEY_BYTES: Final = 8
"""How ``key_to_bytes`` encodes an int key of 64 bits."""


def read_key(key: bytes) -> Any:
    """A best-effort reading of a key's bytes (``key_to_bytes``): printable UTF-8 as a string, 8 bytes
    as an int, length-prefixed parts as a list (a tuple key), anything else as ``{"hex"}``. Not
    reversible in general: different keys may encode alike."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text
    if len(key) == _INT_KEY_BYTES:
        return int.from_bytes(key, "big", signed=True)
    parts = _length_prefixed(key)
    if parts is not None:
        return [read_key(p) for p in parts]
    return {"hex": key.hex()}


def guess_state_key(state_key: bytes) -> Any:
    """A reading of the state key of a state the layout does not name (a process function's own): a
    key prefix followed by more is taken for a MapState entry's (``{"key", "user_key"}``), anything
    else for a plain key (:func:`read_key`)."""
    plain = read_key(state_key)
    if not isinstance(plain, dict):
        return plain
    split = split_key_prefix(state_key)
    if split is not None and split[1]:
        return {"key": read_key(split[0]), "user_key": read_key(split[1])}
    return plain


def _length_prefixed(data: bytes) -> list[bytes] | None:
    parts: list[bytes] = []
    rest = data
    while rest:
        split = split_key_prefix(rest)
        if split is None:
            return None
        part, rest = split
        parts.append(part)
    return parts or None


class KeyLayout(Protocol):
    """How one kind of state lays its state keys out, for readers: the record key's bytes in a state
    key, and a JSON reading of the whole state key."""

    def record_key(self, state_key: bytes) -> bytes | None:
        """The record key's bytes; None when ``state_key`` does not have this layout."""
        ...

    def describe(self, state_key: bytes) -> Any | None:
        """A JSON reading of ``state_key``; None when it does not have this layout."""
        ...


@dataclass(frozen=True)
class PlainKey:
    """The state key is the record key's bytes."""

    def record_key(self, state_key: bytes) -> bytes | None:
        return state_key

    def describe(self, state_key: bytes) -> Any | None:
        return read_key(state_key)


@dataclass(frozen=True)
class PrefixedKey:
    """The state key is a :func:`key_prefix` followed by ``size`` bytes (any number when None),
    read by ``read_rest`` into a JSON object's field ``field``: ``{"key": …, field: …}``."""

    field: str
    size: int | None
    read_rest: Callable[[bytes], Any]

    def _split(self, state_key: bytes) -> tuple[bytes, bytes] | None:
        parts = split_key_prefix(state_key)
        if parts is None or (self.size is not None and len(parts[1]) != self.size):
            return None
        return parts

    def record_key(self, state_key: bytes) -> bytes | None:
        parts = self._split(state_key)
        return None if parts is None else parts[0]

    def describe(self, state_key: bytes) -> Any | None:
        parts = self._split(state_key)
        if parts is None:
            return None
        return {"key": read_key(parts[0]), self.field: self.read_rest(parts[1])}


def _read_bounds(rest: bytes) -> list[int]:
    return list(_BOUNDS.unpack(rest))


def _read_time(rest: bytes) -> int:
    time: int = _TIME.unpack(rest)[0]
    return time


PLAIN_KEY: Final = PlainKey()
WINDOW_KEY: Final = PrefixedKey("window", _BOUNDS.size, _read_bounds)
TIMER_KEY: Final = PrefixedKey("time", _TIME.size, _read_time)
MAP_ENTRY_KEY: Final = PrefixedKey("user_key", None, read_key)


@dataclass(frozen=True)
class GuessedKey:
    """A state the runtime does not name (a process function's own): a plain key or a MapState
    entry's, which the bytes alone do not always tell apart (:func:`guess_state_key`). The record
    key is taken to be the whole state key."""

    def record_key(self, state_key: bytes) -> bytes | None:
        return state_key

    def describe(self, state_key: bytes) -> Any | None:
        return guess_state_key(state_key)


GUESSED_KEY: Final = GuessedKey()


@dataclass(frozen=True)
class SampleSlotKey:
    """A key sample's state key: one byte, the slot in its key group (``weir.core.key_samples``);
    the record key is in the value."""

    def record_key(self, state_key: bytes) -> bytes | None:
        return None

    def describe(self, state_key: bytes) -> Any | None:
        return {"slot": state_key[0]} if len(state_key) == 1 else None


SAMPLE_SLOT_KEY: Final = SampleSlotKey()


@dataclass(frozen=True)
class StateKind:
    """One kind of keyed state the runtime writes: its name, the layout of its state keys and what
    its values hold (for the reader; the bytes are a pickle, :func:`load_value`)."""

    name: str
    key: KeyLayout
    value: str


def _kinds(kinds: Iterable[StateKind]) -> dict[str, StateKind]:
    return {kind.name: kind for kind in kinds}


STATE_KINDS: Final[dict[str, StateKind]] = _kinds(
    (
        StateKind(WINDOW_STATE, WINDOW_KEY, "(key, accumulator)"),
        StateKind(REDUCE_STATE, PLAIN_KEY, "the reduced value"),
        StateKind(EVENT_TIMERS, TIMER_KEY, "(key,)"),
        StateKind(PROCESSING_TIMERS, TIMER_KEY, "(key,)"),
        StateKind(JOIN_LEFT_BUFFER, MAP_ENTRY_KEY, "MapEntry(window end or timestamp, [records])"),
        StateKind(JOIN_RIGHT_BUFFER, MAP_ENTRY_KEY, "MapEntry(window end or timestamp, [records])"),
        StateKind(JOIN_LEFT_TIMES, PLAIN_KEY, "the sorted timestamps of the buffered records"),
        StateKind(JOIN_RIGHT_TIMES, PLAIN_KEY, "the sorted timestamps of the buffered records"),
        StateKind(KEY_SAMPLE_STATE, SAMPLE_SLOT_KEY, "a key sample (weir.core.key_samples)"),
    )
)
"""Every state name the runtime writes, by name. A process function's own states are not here."""


def state_kind(name: str) -> StateKind:
    """The kind of state ``name``; one the runtime does not name is a process function's state."""
    kind = STATE_KINDS.get(name)
    return kind if kind is not None else StateKind(name, GUESSED_KEY, "a process function's state value")


def describe_state_key(state: str, state_key: bytes) -> Any:
    """A JSON reading of an entry's state key, by its state's kind; a key that does not fit its
    kind's layout (a process function may name a state ``win``) is guessed at (:func:`guess_state_key`)."""
    described = state_kind(state).key.describe(state_key)
    return guess_state_key(state_key) if described is None else described


def record_key_of(state: str, state_key: bytes) -> bytes:
    """The record key's bytes in an entry's state key (the whole key when its kind cannot tell)."""
    record = state_kind(state).key.record_key(state_key)
    return state_key if record is None else record

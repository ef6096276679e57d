"""The keyed state kinds of a KeyedProcessFunction (Flink's ValueState, ListState, MapState,
ReducingState, AggregatingState), each scoped to the operator's current key and kept in its
``KeyedStateStore`` (``weir.core.state_backend``) under the state's name, with an optional time
to live.

What one key's state stores at its address ``(name, key group, state key)``, laid out by
``weir.core.state_layout``:

- ValueState: the value; ListState: the list; ReducingState: the reduced value; AggregatingState:
  the accumulator; each at the key's bytes;
- MapState: one address per entry (``state_layout.map_entry_key``: the key prefix, then the entry
  key's bytes), holding a :class:`MapEntry` (the entry's key is kept, so the map can be iterated).

With a :class:`~weir.core.process_functions.StateTtlConfig`, what is stored is wrapped in a
:class:`TtlValue` with the processing time it was last written (or read, ``ON_READ_AND_WRITE``). A
value stored without a TTL and read with one never expires until it is written again; one stored
with a TTL and read without one is visible.

:class:`TtlValue` and :class:`MapEntry` are part of the stored bytes (a pickle names a class by its
module and name): they stay here, as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from weir.core.keygroups import key_to_bytes
from weir.core.process_functions import (
    Clock,
    ReduceFunction,
    StateAggregateFunction,
    StateTtlConfig,
    TtlUpdateType,
)
from weir.core.state_backend import KeyedStateStore
from weir.core.state_layout import map_entry_key


class KeyScope(Protocol):
    """Whose state is accessed: the keyed operator, with its store and current key."""

    store: KeyedStateStore
    current_key_group: int
    current_key_bytes: bytes
    current_key_prefix: bytes


@dataclass(frozen=True, slots=True)
class TtlValue:
    """A stored value of a state with a time to live, and when (epoch ms, processing time) its time
    to live last started."""

    value: Any
    last_access_ms: int


@dataclass(frozen=True, slots=True)
class MapEntry:
    """One stored MapState entry: its key and its value."""

    key: Any
    value: Any


class Ttl:
    """A state's time to live, read against the operator's processing-time clock."""

    __slots__ = ("_clock", "_ttl_ms", "config", "refresh_on_read")

    def __init__(self, config: StateTtlConfig, clock: Clock) -> None:
        self.config = config
        self._ttl_ms = config.ttl_ms
        self.refresh_on_read = config.update_type is TtlUpdateType.ON_READ_AND_WRITE
        self._clock = clock

    def expired(self, stored: TtlValue, now_ms: int) -> bool:
        return now_ms >= stored.last_access_ms + self._ttl_ms

    def now(self) -> int:
        return self._clock()


def drop_expired(store: KeyedStateStore, name: str, key_groups: Iterable[int], ttl: Ttl) -> int:
    """Remove every expired value of state ``name`` in ``key_groups`` (the cleanup a snapshot runs);
    returns how many were removed."""
    now, removed = ttl.now(), 0
    for kg in key_groups:
        expired = [k for k, v in store.items(name, kg) if isinstance(v, TtlValue) and ttl.expired(v, now)]
        for key in expired:
            store.delete(name, kg, key)
        removed += len(expired)
    return removed


class KeyedState:
    """The base of every state kind: one state name of one operator, read and written for the
    operator's current key, through the TTL when there is one."""

    __slots__ = ("_name", "_scope", "_ttl")

    def __init__(self, scope: KeyScope, name: str, ttl: Ttl | None) -> None:
        self._scope = scope
        self._name = name
        self._ttl = ttl

    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> Ttl | None:
        return self._ttl

    def _read(self, key: bytes) -> Any | None:
        """The live value at ``key`` of the current key group (None: absent or expired; an expired
        one is removed)."""
        scope = self._scope
        return self._live(key, scope.store.get(self._name, scope.current_key_group, key))

    def _live(self, key: bytes, stored: Any) -> Any | None:
        """What is stored at ``key`` (``stored``), live: unwrapped from its TTL, None when it expired
        (then removed); a read that refreshes the TTL writes it back."""
        scope = self._scope
        if not isinstance(stored, TtlValue):
            return stored
        ttl = self._ttl
        if ttl is None:
            return stored.value
        now = ttl.now()
        if ttl.expired(stored, now):
            scope.store.delete(self._name, scope.current_key_group, key)
            return None
        if ttl.refresh_on_read and stored.last_access_ms != now:
            scope.store.put(self._name, scope.current_key_group, key, TtlValue(stored.value, now))
        return stored.value

    def _write(self, key: bytes, value: Any) -> None:
        scope = self._scope
        ttl = self._ttl
        scope.store.put(self._name, scope.current_key_group, key, value if ttl is None else TtlValue(value, ttl.now()))

    def _delete(self, key: bytes) -> None:
        scope = self._scope
        scope.store.delete(self._name, scope.current_key_group, key)


class ValueState(KeyedState):
    """One value per key."""

    __slots__ = ()

    def value(self) -> Any:
        """The current key's value; None when it has none (or it expired)."""
        return self._read(self._scope.current_key_bytes)

    def update(self, value: Any) -> None:
        self._write(self._scope.current_key_bytes, value)

    def clear(self) -> None:
        self._delete(self._scope.current_key_bytes)


class ListState(KeyedState):
    """A list of values per key, stored as one value."""

    __slots__ = ()

    def get(self) -> list[Any]:
        """A copy of the current key's list; empty when it has none (or it expired)."""
        stored = self._read(self._scope.current_key_bytes)
        return [] if stored is None else list(stored)

    def add(self, value: Any) -> None:
        self.add_all((value,))

    def add_all(self, values: Iterable[Any]) -> None:
        """Append ``values`` to the current key's list. The stored list grows in place (adding a
        row costs no copy of the rows before it) and is written back, so the store writes it at its
        next flush; every reader got a copy (:meth:`get`), so none sees it change."""
        added = list(values)
        if not added:
            return
        key = self._scope.current_key_bytes
        stored = self._read(key)
        if stored is None:
            self._write(key, added)
            return
        if type(stored) is not list:
            stored = list(stored)
        stored.extend(added)
        self._write(key, stored)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the current key's list with ``values`` (none: the list is cleared)."""
        replaced = list(values)
        if replaced:
            self._write(self._scope.current_key_bytes, replaced)
        else:
            self.clear()

    def clear(self) -> None:
        self._delete(self._scope.current_key_bytes)


class MapState(KeyedState):
    """A dictionary per key; each entry is its own stored value (and expires on its own).

    Iterating (``items``, ``keys``, ``values``) reads the database after writing the store's cache
    into it: it costs a flush, so keep it off the path of every record."""

    __slots__ = ()

    def _entry_key(self, user_key: Any) -> bytes:
        return map_entry_key(self._scope.current_key_prefix, key_to_bytes(user_key))

    def get(self, user_key: Any) -> Any:
        """The value of entry ``user_key``; None when there is none."""
        entry = self._read(self._entry_key(user_key))
        return entry.value if isinstance(entry, MapEntry) else entry

    def put(self, user_key: Any, value: Any) -> None:
        self._write(self._entry_key(user_key), MapEntry(user_key, value))

    def put_all(self, entries: Iterable[tuple[Any, Any]]) -> None:
        for user_key, value in entries:
            self.put(user_key, value)

    def contains(self, user_key: Any) -> bool:
        return self._read(self._entry_key(user_key)) is not None

    def remove(self, user_key: Any) -> None:
        self._delete(self._entry_key(user_key))

    def items(self) -> list[tuple[Any, Any]]:
        """Every live entry of the current key as (key, value), in the order of the keys' bytes."""
        scope = self._scope
        prefix = scope.current_key_prefix
        stored = list(scope.store.items(self._name, scope.current_key_group, prefix))
        entries = []
        for address, value in stored:  # as read by the scan: no second read of each entry
            entry = self._live(address, value)
            if isinstance(entry, MapEntry):
                entries.append((entry.key, entry.value))
        return entries

    def keys(self) -> list[Any]:
        return [k for k, _v in self.items()]

    def values(self) -> list[Any]:
        return [v for _k, v in self.items()]

    def is_empty(self) -> bool:
        return not self.items()

    def clear(self) -> None:
        """Remove every entry of the current key."""
        scope = self._scope
        for address, _v in list(scope.store.items(self._name, scope.current_key_group, scope.current_key_prefix)):
            self._delete(address)


class ReducingState(KeyedState):
    """Values of a key folded into one with ``reduce(accumulated, value)`` as they are added."""

    __slots__ = ("_reduce",)

    def __init__(self, scope: KeyScope, name: str, ttl: Ttl | None, reduce: ReduceFunction) -> None:
        super().__init__(scope, name, ttl)
        self._reduce = reduce

    def get(self) -> Any:
        """The reduction of the current key's values; None when none was added."""
        return self._read(self._scope.current_key_bytes)

    def add(self, value: Any) -> None:
        key = self._scope.current_key_bytes
        previous = self._read(key)
        self._write(key, value if previous is None else self._reduce(previous, value))

    def clear(self) -> None:
        self._delete(self._scope.current_key_bytes)


class AggregatingState(KeyedState):
    """Values of a key added into an accumulator (``create``, ``add``); reads as ``result(acc)``."""

    __slots__ = ("_aggregate",)

    def __init__(self, scope: KeyScope, name: str, ttl: Ttl | None, aggregate: StateAggregateFunction) -> None:
        super().__init__(scope, name, ttl)
        self._aggregate = aggregate

    def get(self) -> Any:
        """The result of the current key's accumulator; None when nothing was added."""
        acc = self._read(self._scope.current_key_bytes)
        return None if acc is None else self._aggregate.result(acc)

    def add(self, value: Any) -> None:
        key = self._scope.current_key_bytes
        acc = self._read(key)
        self._write(key, self._aggregate.add(self._aggregate.create() if acc is None else acc, value))

    def clear(self) -> None:
        self._delete(self._scope.current_key_bytes)

"""What a keyed operator codes against for its state: a :class:`KeyedStateBackend` hands each
operator of a subtask its :class:`KeyedStateStore`, addressed by state name, key group and state key.

Flink's operators code against ``KeyedStateBackend`` and never see RocksDB; so do Weir's. The
implementation is the task's RocksDB (``weir.taskmanager.state.RocksDBStateBackend``); the reference
run (``weir run --reference``) uses it too; ``weir test`` keeps keyed state in a dict
(``weir.tools.jobtest.MemoryStateBackend``) so that it can copy it at every checkpoint. How an
address and a value become bytes is ``weir.core.state_layout``'s, not the operators' and not the
store's caller's: an operator builds state keys with the layout's functions and hands the store
plain values.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from weir.core.keygroups import KeyGroupRange


class KeyedStateStore(Protocol):
    """One operator's keyed state within one subtask.

    Reads see the operator's own writes at once; writes reach the backend's storage at the latest at
    :meth:`flush` (a snapshot flushes first), so a store may keep them in a cache. A value is any
    picklable object (``weir.core.state_layout.dump_value``); None is a value, an absent entry reads
    as None."""

    def get(self, name: str, key_group: int, key: bytes) -> Any | None:
        """The value of state ``name`` at ``key`` in ``key_group``; None when there is none."""
        ...

    def put(self, name: str, key_group: int, key: bytes, value: Any) -> None: ...

    def delete(self, name: str, key_group: int, key: bytes) -> None:
        """Remove the entry, if there is one."""
        ...

    def items(self, name: str, key_group: int, prefix: bytes = b"") -> Iterator[tuple[bytes, Any]]:
        """Every ``(key, value)`` of state ``name`` in ``key_group`` whose key starts with ``prefix``,
        in the order of the keys' bytes (after a flush: it reads the storage)."""
        ...

    def flush(self) -> int:
        """Write every cached change to the storage; returns how many entries were written."""
        ...

    def clear_key_groups(self, key_groups: KeyGroupRange) -> None:
        """Drop this operator's state in ``key_groups``, cached and stored."""
        ...


class KeyedStateBackend(Protocol):
    """The keyed state of one subtask (Flink's ``KeyedStateBackend``): one store per operator."""

    def keyed_store(self, uid: str, *, key_groups: KeyGroupRange | None = None) -> KeyedStateStore:
        """The state of operator ``uid``. ``key_groups``: the subtask's own, so that a store that
        starts on none of its entries (a fresh subtask) may answer reads without the storage."""
        ...

"""Keyed operators: state per key in RocksDB, addressed by the key's key group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from operators.base import StreamOperator
from operators.basic import _TimestampedCollector
from weir.core.keygroups import KeyEncoder, key_to_bytes


class KeyedOperator(StreamOperator):
    """Sets the current key (bytes, key group, length-prefixed bytes) for each record before the
    subclass sees it; a :class:`KeyEncoder` remembers the encodings of keys seen before."""

    def __init__(self, key_selector: Callable[[Any], Any]) -> None:
        self._key_selector = key_selector
        self.current_key: Any = None
        self.current_key_bytes = b""
        self.current_key_group = 0
        self.current_key_prefix = b""  # the key bytes, length-prefixed: the start of composite state keys

    def open(self) -> None:
        key_groups = self.ctx.key_group_range
        self.store = self.ctx.state.keyed_store(self.ctx.uid, key_groups=(key_groups.start, key_groups.end))
        self._keys = KeyEncoder(self.ctx.max_parallelism)

    def set_current_key(self, value: Any) -> None:
        key = self._key_selector(value)
        self.current_key = key
        self.current_key_bytes, self.current_key_group, self.current_key_prefix = self._keys.encode(key)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self.store.flush()
        return None

    def end_input(self) -> None:
        self.store.flush()


class ReduceOperator(KeyedOperator):
    def __init__(self, fn: Callable[[Any, Any], Any], key_selector: Callable[[Any], Any]) -> None:
        super().__init__(key_selector)
        self._fn = fn

    def process(self, value: Any, timestamp: int | None) -> None:
        self.set_current_key(value)
        kg, kb = self.current_key_group, self.current_key_bytes
        previous = self.store.get("reduce", kg, kb)
        result = value if previous is None else self._fn(previous, value)
        self.store.put("reduce", kg, kb, result)
        self.output.emit(result, timestamp)


class ValueState:
    """One value per key (the operator's current key)."""

    __slots__ = ("_name", "_op")

    def __init__(self, op: KeyedOperator, name: str) -> None:
        self._op = op
        self._name = name

    def value(self) -> Any:
        op = self._op
        return op.store.get(self._name, op.current_key_group, op.current_key_bytes)

    def update(self, value: Any) -> None:
        op = self._op
        op.store.put(self._name, op.current_key_group, op.current_key_bytes, value)

    def clear(self) -> None:
        op = self._op
        op.store.delete(self._name, op.current_key_group, op.current_key_bytes)


class MapState:
    """A dictionary per key; each entry is its own RocksDB value."""

    __slots__ = ("_name", "_op")

    def __init__(self, op: KeyedOperator, name: str) -> None:
        self._op = op
        self._name = name

    def _key(self, user_key: Any) -> bytes:
        return self._op.current_key_prefix + key_to_bytes(user_key)

    def get(self, user_key: Any) -> Any:
        op = self._op
        return op.store.get(self._name, op.current_key_group, self._key(user_key))

    def put(self, user_key: Any, value: Any) -> None:
        op = self._op
        op.store.put(self._name, op.current_key_group, self._key(user_key), value)

    def remove(self, user_key: Any) -> None:
        op = self._op
        op.store.delete(self._name, op.current_key_group, self._key(user_key))


class KeyedProcessContext:
    """What a KeyedProcessFunction sees: the current key, its timestamp, and its state."""

    def __init__(self, op: KeyedOperator) -> None:
        self._op = op
        self.timestamp: int | None = None

    @property
    def key(self) -> Any:
        return self._op.current_key

    def value_state(self, name: str) -> ValueState:
        return ValueState(self._op, name)

    def map_state(self, name: str) -> MapState:
        return MapState(self._op, name)


class KeyedProcessOperator(KeyedOperator):
    def __init__(self, fn: Any, key_selector: Callable[[Any], Any]) -> None:
        super().__init__(key_selector)
        self._fn = fn

    def open(self) -> None:
        super().open()
        self._process_ctx = KeyedProcessContext(self)
        self._out = _TimestampedCollector(self.output.emit)
        open_fn = getattr(self._fn, "open", None)
        if callable(open_fn):
            open_fn(self._process_ctx)

    def process(self, value: Any, timestamp: int | None) -> None:
        self.set_current_key(value)
        self._process_ctx.timestamp = timestamp
        self._out.timestamp = timestamp
        self._fn.process_element(value, self._process_ctx, self._out)

"""Keyed operators: state per key in RocksDB, addressed by the key's key group."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from operators.base import StreamOperator
from operators.basic import _TimestampedCollector
from weir.core.keygroups import KeyEncoder, key_to_bytes
from weir.core.state_schema import StateSchema, StateSchemaError, StoredSchema, required_migrations

REDUCE_STATE = "reduce"


class KeyedOperator(StreamOperator):
    """Sets the current key (bytes, key group, length-prefixed bytes) for each record before the
    subclass sees it; a :class:`KeyEncoder` remembers the encodings of keys seen before.

    ``state_schemas``: the schema of each of its states (``weir.core.state_schema``); a state not
    named is version 1 pickle. They travel with every snapshot; a restore of older versions is told
    (:meth:`migrate_from`) and the restored values are migrated once, when the operator opens."""

    def __init__(self, key_selector: Callable[[Any], Any], state_schemas: Iterable[StateSchema] = ()) -> None:
        self._key_selector = key_selector
        self._state_schemas = {s.name: s for s in state_schemas}
        self._migrations: dict[str, int] = {}  # state name -> stored version, set by migrate_from
        self.current_key: Any = None
        self.current_key_bytes = b""
        self.current_key_group = 0
        self.current_key_prefix = b""  # the key bytes, length-prefixed: the start of composite state keys

    def open(self) -> None:
        key_groups = self.ctx.key_group_range
        self.store = self.ctx.state.keyed_store(self.ctx.uid, key_groups=(key_groups.start, key_groups.end))
        self._keys = KeyEncoder(self.ctx.max_parallelism)
        if self._migrations:
            self._migrate_restored_state()

    def state_schemas(self) -> tuple[StateSchema, ...]:
        """The declared schema of each state, by name order: what snapshots record."""
        return tuple(self._state_schemas[name] for name in sorted(self._state_schemas))

    def migrate_from(self, stored: Mapping[str, StoredSchema]) -> None:
        """The keyed state about to be restored was written with ``stored`` (by state name; one not
        named: version 1 pickle). Raises StateSchemaError when a state cannot be read; else the states
        of older versions are migrated when the operator opens, before the first record."""
        self._migrations = required_migrations(self.ctx.uid, stored, self.state_schemas())

    def migrate_value(self, schema: StateSchema, stored_version: int, value: Any) -> Any:
        """One restored value of state ``schema.name`` as the declared version's. An operator whose
        entries wrap the user's value (a window's ``(key, accumulator)``) overrides this."""
        assert schema.migrate is not None
        return schema.migrate(stored_version, value)

    def _migrate_restored_state(self) -> None:
        """Rewrite every restored entry of each state to migrate through ``migrate_value``, one key
        group at a time, so that no read at run time pays for it."""
        uid, store = self.ctx.uid, self.store
        for name, stored_version in sorted(self._migrations.items()):
            schema = self._state_schemas[name]
            what = f"operator {uid!r} state {name!r}"
            entries = 0
            for kg in self.ctx.key_group_range:
                try:
                    restored = list(store.items(name, kg))
                except Exception as exc:  # pickle.loads: a class the values name is gone or changed
                    raise StateSchemaError(
                        f"{what}: the {schema.serializer} serializer cannot read a value stored at version "
                        f"{stored_version}: {type(exc).__name__}: {exc}; restore it with the code that wrote it"
                    ) from exc
                for key, value in restored:
                    try:
                        migrated = self.migrate_value(schema, stored_version, value)
                    except Exception as exc:
                        raise StateSchemaError(
                            f"{what}: migrate from version {stored_version} to {schema.version} failed on a "
                            f"restored value: {type(exc).__name__}: {exc}; fix the migration"
                        ) from exc
                    store.put(name, kg, key, migrated)
                store.flush()
                entries += len(restored)
            self.ctx.log.info(
                "keyed_state_migrated",
                state=name,
                from_version=stored_version,
                to_version=schema.version,
                entries=entries,
            )
        self._migrations = {}

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
    def __init__(
        self,
        fn: Callable[[Any, Any], Any],
        key_selector: Callable[[Any], Any],
        state_schema: StateSchema | None = None,
    ) -> None:
        super().__init__(key_selector, [state_schema or StateSchema(REDUCE_STATE)])
        if self.state_schemas()[0].name != REDUCE_STATE:
            raise ValueError(f"a reduce's state is named {REDUCE_STATE!r}, not {self.state_schemas()[0].name!r}")
        self._fn = fn

    def process(self, value: Any, timestamp: int | None) -> None:
        self.set_current_key(value)
        kg, kb = self.current_key_group, self.current_key_bytes
        previous = self.store.get(REDUCE_STATE, kg, kb)
        result = value if previous is None else self._fn(previous, value)
        self.store.put(REDUCE_STATE, kg, kb, result)
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
    def __init__(self, fn: Any, key_selector: Callable[[Any], Any], state_schemas: Iterable[StateSchema] = ()) -> None:
        super().__init__(key_selector, state_schemas)
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

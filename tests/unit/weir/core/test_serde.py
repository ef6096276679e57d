from __future__ import annotations

import threading

import pytest

from weir.core.errors import SerializationError
from weir.core.serde import dumps_value, loads_value


def test_value_round_trip() -> None:
    for value in (None, 1, "text", b"raw", {"a": [1, 2.5, (3, None)]}, frozenset({1, 2}), 10**40):
        assert loads_value(dumps_value(value)) == value


def test_unpicklable_value_is_the_users_fault() -> None:
    with pytest.raises(SerializationError, match="cannot serialize value of type lock") as info:
        dumps_value(threading.Lock())
    assert info.value.fault == "user"
    with pytest.raises(SerializationError, match="cannot serialize"):
        dumps_value(lambda: 1)


def test_bad_value_bytes() -> None:
    with pytest.raises(SerializationError, match="cannot deserialize") as info:
        loads_value(b"\x80\x05garbage")
    assert info.value.fault == "internal"
    with pytest.raises(SerializationError):
        loads_value(dumps_value({"a": 1})[:-3])

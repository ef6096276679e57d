from __future__ import annotations

import pickle
import threading

import pytest

from weir.core.errors import SerializationError
from weir.core.serde import dumps_value, loads_value, unpickle
from weir.operators.process_state import TtlValue


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


def test_a_value_pickled_under_a_former_top_level_package_reads_back_under_weir() -> None:
    """Keyed state written before Weir had one import root names its classes ``operators.…`` (a
    state TTL's ``TtlValue``, say); that folder is now ``weir.operators`` and will not import as
    ``operators``."""
    value = TtlValue("v", 1234.5)
    # Protocol 0 names a class as text on a line of its own: the old name can be written in.
    old = pickle.dumps(value, protocol=0).replace(b"weir.operators.process_state", b"operators.process_state")
    assert b"weir.operators" not in old
    with pytest.raises(ImportError, match="import weir.operators, not operators"):
        pickle.loads(old)
    assert unpickle(old) == value and loads_value(old) == value

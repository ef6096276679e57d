"""User values as bytes: how records cross the data plane and how sinks keep epoch output.

A buffer of records travels as one pickle (protocol 5) of two parallel lists, values and timestamps
(``taskmanager.network.encode_records``): for batches of Python values this is faster than framing
each record (see docs/benchmarks.md).
"""

from __future__ import annotations

import pickle
from typing import Any, Final

from weir.core.errors import SerializationError

VALUE_PICKLE_PROTOCOL: Final = 5


def dumps_value(value: object) -> bytes:
    """Serialize a user value (pickle protocol 5). Raises SerializationError, the user's fault."""
    try:
        return pickle.dumps(value, protocol=VALUE_PICKLE_PROTOCOL)
    except Exception as exc:
        raise SerializationError(
            f"cannot serialize value of type {type(value).__qualname__}: {exc}; values must be picklable "
            "(no lambdas, open files, sockets or locks)",
            fault="user",
        ) from exc


def loads_value(data: bytes) -> Any:
    """The value serialized by :func:`dumps_value`. Raises SerializationError on bad bytes."""
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise SerializationError(
            f"cannot deserialize a value from {len(data)} bytes: {type(exc).__name__}: {exc}"
        ) from exc

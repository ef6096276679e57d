"""User values as bytes: how records cross the data plane and how sinks keep epoch output.

A buffer of records travels as one pickle (protocol 5) of two parallel lists, values and timestamps
(``weir.taskmanager.network.encode_records``): for batches of Python values this is faster than framing
each record (see docs/benchmarks.md).
"""

from __future__ import annotations

import io
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


_FORMER_ROOTS: Final = ("jobmanager", "taskmanager", "operators", "connectors")
"""Packages that were top-level before Weir had one import root (now ``weir.<name>``)."""


class _FormerRootsUnpickler(pickle.Unpickler):
    """Reads a value pickled before the one import root: a class it names under ``operators.…``
    (``TtlValue`` in keyed state, say) is looked up under ``weir.operators.…``."""

    def find_class(self, module: str, name: str) -> Any:
        root, _, rest = module.partition(".")
        if root in _FORMER_ROOTS:
            module = f"weir.{root}" + (f".{rest}" if rest else "")
        return super().find_class(module, name)


def unpickle(data: bytes) -> Any:
    """``pickle.loads``, also of a value pickled by a Weir before its one import root; raises what
    pickle raises."""
    try:
        return pickle.loads(data)
    except ImportError:  # a former top-level package: read again naming its classes under weir.
        return _FormerRootsUnpickler(io.BytesIO(data)).load()


def loads_value(data: bytes) -> Any:
    """The value serialized by :func:`dumps_value`. Raises SerializationError on bad bytes."""
    try:
        return unpickle(data)
    except Exception as exc:
        raise SerializationError(
            f"cannot deserialize a value from {len(data)} bytes: {type(exc).__name__}: {exc}"
        ) from exc

"""Reading Weir's versioned JSON documents (job records, checkpoint metadata, task state): one check
of the JSON, the object and the format number, and the typed field readers their decoders share."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from weir.core.errors import SerializationError

_T = TypeVar("_T")


def load_versioned(data: bytes, what: str, expected_format: int | tuple[int, ...], remedy: str) -> dict[str, Any]:
    """The JSON object in ``data`` if its ``format`` is ``expected_format`` (or one of them); else a
    SerializationError that names ``what`` and tells the reader ``remedy``."""
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SerializationError(f"{what} is not a JSON document ({exc}); it is not JSON at all: {remedy}") from exc
    if not isinstance(document, dict):
        raise SerializationError(f"{what} is not a JSON object: it has format {type(document).__name__!r}")
    found = document.get("format")
    readable = expected_format if isinstance(expected_format, tuple) else (expected_format,)
    if found not in readable:
        formats = "format " + str(readable[0]) if len(readable) == 1 else f"formats {list(readable)}"
        raise SerializationError(f"{what} has format {found!r}; this Weir reads {formats}: {remedy}")
    return document


def typed(value: Any, kind: type[_T]) -> _T:
    """``value`` if it is a ``kind`` (a bool is no int); TypeError otherwise."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)

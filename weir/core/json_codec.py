"""The JSON codec of Weir's records: the Kafka source's default deserializer and the Kafka, file and
transactional sinks' default serializer, and the dead-letter envelopes. One place, one library:
msgspec, chosen by ``make bench-json`` (docs/benchmarks.md, "JSON codecs"), ~7x the stdlib's speed
both ways on the benchmark's records.

``decode`` gives what ``json.loads`` gives, for every input. msgspec answers the records it accepts
(the same values: arbitrary-size ints stay ints, floats round the same); on anything it rejects the
stdlib decides, so a malformed record fails with the stdlib's exception and message as before
(``JSONDecodeError``, ``UnicodeDecodeError`` for invalid UTF-8, ``TypeError`` for a record without a
value), and what the stdlib accepts beyond RFC 8259 still decodes: ``NaN`` and ``Infinity``, a UTF-8
byte order mark, UTF-16 and UTF-32, lone surrogate escapes, numbers beyond a double.

``encode`` writes compact JSON with sorted keys, UTF-8 (non-ASCII characters as themselves, where
the stdlib's default escaped them: the same JSON values). What msgspec cannot write as the stdlib
would goes through the stdlib encoder instead (escaped ASCII): non-str dict keys, str subclasses,
lone surrogates, and non-finite floats (the stdlib's ``NaN``/``Infinity`` tokens where msgspec would
write ``null``). Unlike the stdlib, msgspec also writes some types JSON has no form for instead of
raising ``TypeError``: ``bytes`` (base64), sets (sorted arrays), ``datetime``/``date``/``time``,
``UUID`` and ``Decimal`` (strings), dataclasses and ``msgspec.Struct`` (objects).

``encode_in_order`` writes the same JSON with each object's fields in the order the dict holds them:
the bytes Flink's JSON format writes for a row (its fields in the row type's order), where the bytes
matter beyond the value (a Kafka record key, which a compacted topic and the partitioner compare as
bytes).
"""

from __future__ import annotations

import json
from math import isfinite as _isfinite
from typing import Any

import msgspec

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder(order="sorted").encode
_encode_in_order = msgspec.json.Encoder().encode  # dicts in insertion order
_DecodeError = msgspec.DecodeError
_stdlib_loads = json.loads
_L = ord("l")
_STDLIB = json.JSONEncoder(separators=(",", ":"), sort_keys=True)  # json.dumps with options builds one per call
_STDLIB_IN_ORDER = json.JSONEncoder(separators=(",", ":"))


def decode(raw: bytes | bytearray | memoryview | str) -> Any:
    """The value of one JSON document; raises as ``json.loads(raw)`` does."""
    try:
        return _decode(raw)
    except (_DecodeError, TypeError):
        return _stdlib_loads(raw)  # type: ignore[arg-type]  # the stdlib's answer: a value or its error


def encode(value: Any) -> bytes:
    """Compact JSON with sorted keys, UTF-8."""
    try:
        out = _encode(value)
    except (TypeError, ValueError):  # non-str keys, str subclasses, lone surrogates, unsupported types
        return _STDLIB.encode(value).encode()
    # msgspec writes NaN and ±Infinity as null. Looking for the byte "l" first (an int: one memchr) is
    # ~10x cheaper here than looking for b"null", and many records (the benchmark's results) have none.
    if _L in out and b"null" in out and _has_non_finite(value):
        return _STDLIB.encode(value).encode()
    return out


def encode_in_order(value: Any) -> bytes:
    """Compact JSON, UTF-8, each object's fields in the dict's order (``encode``'s fallbacks, unsorted)."""
    try:
        out = _encode_in_order(value)
    except (TypeError, ValueError):
        return _STDLIB_IN_ORDER.encode(value).encode()
    if _L in out and b"null" in out and _has_non_finite(value):
        return _STDLIB_IN_ORDER.encode(value).encode()
    return out


def _has_non_finite(value: Any) -> bool:
    """Whether a NaN or ±Infinity is anywhere in ``value`` (dicts, lists and tuples walked; a float
    subclass never gets here: msgspec refuses it, and the stdlib writes it)."""
    kind = type(value)
    if kind is float:
        return not _isfinite(value)
    if kind is dict or isinstance(value, dict):
        items: Any = value.values()
    elif kind is list or kind is tuple or isinstance(value, list | tuple):
        items = value
    else:
        return False
    for item in items:
        kind = type(item)
        if kind is str or kind is int or item is None or kind is bool:
            continue
        if kind is float:
            if not _isfinite(item):
                return True
        elif _has_non_finite(item):
            return True
    return False

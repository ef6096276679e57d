"""Bytes on the data plane: a batch of records framed as one blob, and user values as pickles.

A record is ``(key_group, timestamp_ms, payload)``: the key group (None on a non-keyed exchange), the
event timestamp in ms (None when the record has none) and the serialized value.

A batch is laid out by column so that encoding and decoding run in C loops, not per record in Python
(all integers little-endian)::

    header      magic "WB", version u8, key-group mode u8, timestamp mode u8, record count u32
    key groups  mode MIXED: one presence byte (0/1) per record; modes ALL and MIXED: u16 per record
    timestamps  mode MIXED: one presence byte (0/1) per record; modes ALL and MIXED: i64 per record
    lengths     u32 per record
    payloads    the payloads, back to back

A column's mode is NONE (every value is None), ALL (no value is None) or MIXED.
"""

from __future__ import annotations

import pickle
import struct
import sys
from array import array
from itertools import accumulate, repeat
from typing import Any, Final, TypeAlias

from weir.errors import SerializationError
from weir.ids import KeyGroup

Record: TypeAlias = tuple[KeyGroup | None, int | None, bytes]
"""``(key_group, timestamp_ms, payload)``."""

VALUE_PICKLE_PROTOCOL: Final = 5

_MAGIC = b"WB"
_VERSION = 1
_HEADER = struct.Struct("<2sBBBI")
_MODE_NONE = 0
_MODE_ALL = 1
_MODE_MIXED = 2
_SWAP = sys.byteorder != "little"
_PRESENCE = b"\x00\x01"


def _column(values: tuple[Any, ...], typecode: str, what: str) -> tuple[int, list[bytes]]:
    """Encode one nullable integer column: its mode and its byte parts."""
    try:
        if None not in values:
            column = array(typecode, values)
            if _SWAP:
                column.byteswap()
            return _MODE_ALL, [column.tobytes()]
        count = len(values)
        if values.count(None) == count:
            return _MODE_NONE, []
        presence = bytes([value is not None for value in values])
        column = array(typecode, [0 if value is None else value for value in values])
    except (TypeError, OverflowError) as exc:
        raise SerializationError(f"cannot encode record {what}: {exc}") from exc
    if _SWAP:
        column.byteswap()
    return _MODE_MIXED, [presence, column.tobytes()]


def encode_batch(records: list[Record]) -> bytes:
    """Frame records into one blob. Raises SerializationError for a value that does not fit."""
    count = len(records)
    if count == 0:
        return _HEADER.pack(_MAGIC, _VERSION, _MODE_NONE, _MODE_NONE, 0)
    try:
        key_groups, timestamps, payloads = zip(*records, strict=True)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"records must be (key_group, timestamp_ms, payload) triples: {exc}") from exc
    kg_mode, kg_parts = _column(key_groups, "H", "key group (must be None or in 0..65535)")
    ts_mode, ts_parts = _column(timestamps, "q", "timestamp (must be None or a 64-bit signed int)")
    try:
        lengths = array("I", map(len, payloads))
        body = b"".join(payloads)
    except (TypeError, OverflowError) as exc:
        raise SerializationError(f"record payloads must be bytes shorter than 4 GiB: {exc}") from exc
    if _SWAP:
        lengths.byteswap()
    return b"".join(
        [
            _HEADER.pack(_MAGIC, _VERSION, kg_mode, ts_mode, count),
            *kg_parts,
            *ts_parts,
            lengths.tobytes(),
            body,
        ]
    )


def _read_column(
    data: bytes, offset: int, count: int, mode: int, typecode: str, itemsize: int, what: str
) -> tuple[Any, int]:
    """Decode one nullable integer column at ``offset``: its values (an iterable) and the next offset."""
    if mode == _MODE_NONE:
        return repeat(None, count), offset
    if mode == _MODE_ALL:
        end = offset + count * itemsize
        column = array(typecode)
        column.frombytes(data[offset:end])
        if _SWAP:
            column.byteswap()
        return column.tolist(), end
    if mode == _MODE_MIXED:
        presence = data[offset : offset + count]
        if presence.translate(None, _PRESENCE):
            raise SerializationError(f"corrupt record batch: {what} presence bytes other than 0 and 1")
        start = offset + count
        end = start + count * itemsize
        column = array(typecode)
        column.frombytes(data[start:end])
        if _SWAP:
            column.byteswap()
        values = [value if present else None for value, present in zip(column, presence, strict=True)]
        return values, end
    raise SerializationError(f"corrupt record batch: unknown {what} column mode {mode}")


def decode_batch(data: bytes | bytearray | memoryview) -> list[Record]:
    """The records of a blob made by :func:`encode_batch`. Raises SerializationError on malformed bytes."""
    if type(data) is not bytes:
        data = bytes(data)
    size = len(data)
    if size < _HEADER.size:
        raise SerializationError(f"corrupt record batch: {size} bytes, shorter than the {_HEADER.size}-byte header")
    magic, version, kg_mode, ts_mode, count = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise SerializationError(f"not a record batch: magic {magic!r}, expected {_MAGIC!r}")
    if version != _VERSION:
        raise SerializationError(f"unsupported record batch version {version}; this Weir reads version {_VERSION}")
    # Check the fixed-size columns fit before reading them, so a corrupt count allocates nothing.
    fixed = _column_size(kg_mode, count, 2, "key group") + _column_size(ts_mode, count, 8, "timestamp") + 4 * count
    if _HEADER.size + fixed > size:
        raise SerializationError(
            f"corrupt record batch: {count} records need at least {_HEADER.size + fixed} bytes, got {size}"
        )
    if count == 0:
        if size != _HEADER.size:
            raise SerializationError(f"corrupt record batch: {size - _HEADER.size} bytes after 0 records")
        return []
    offset = _HEADER.size
    key_groups, offset = _read_column(data, offset, count, kg_mode, "H", 2, "key group")
    timestamps, offset = _read_column(data, offset, count, ts_mode, "q", 8, "timestamp")
    lengths = array("I")
    lengths.frombytes(data[offset : offset + 4 * count])
    if _SWAP:
        lengths.byteswap()
    bounds = list(accumulate(lengths, initial=offset + 4 * count))
    if bounds[-1] != size:
        raise SerializationError(
            f"corrupt record batch: payload lengths add up to {bounds[-1] - bounds[0]} bytes, "
            f"but {size - bounds[0]} follow"
        )
    return [
        (key_group, timestamp, data[start:end])
        for key_group, timestamp, start, end in zip(key_groups, timestamps, bounds, bounds[1:], strict=False)
    ]


def _column_size(mode: int, count: int, itemsize: int, what: str) -> int:
    if mode == _MODE_NONE:
        return 0
    if mode == _MODE_ALL:
        return count * itemsize
    if mode == _MODE_MIXED:
        return count * (itemsize + 1)
    raise SerializationError(f"corrupt record batch: unknown {what} column mode {mode}")


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

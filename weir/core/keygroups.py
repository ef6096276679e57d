"""Key groups: the unit of keyed state and of keyed partitioning.

A key hashes to one of ``max_parallelism`` key groups; each subtask of an operator with ``parallelism``
subtasks owns one contiguous range of key groups. The formulas are Flink's ``KeyGroupRangeAssignment``,
so ranges are contiguous, cover every key group exactly once, and a rescale moves whole key groups.

Key hashing must give the same answer in every process: it uses CRC-32 over a canonical byte encoding
of the key (see :func:`key_to_bytes`), never Python's per-process randomized ``hash()``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from weir.core.errors import JobDefinitionError
from weir.core.ids import KeyGroup, SubtaskIndex
from weir.core.state_layout import key_prefix

MAX_PARALLELISM_UPPER_BOUND = 1 << 15
"""Largest allowed max parallelism (as in Flink): key groups must fit in 15 bits."""

_crc32 = zlib.crc32
_pack_i64 = struct.Struct(">q").pack
_pack_u32 = struct.Struct(">I").pack
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """Key groups ``start..end``, both inclusive; never empty."""

    start: KeyGroup
    end: KeyGroup

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"invalid key group range {self.start}..{self.end}: need 0 <= start <= end")

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[KeyGroup]:
        return map(KeyGroup, range(self.start, self.end + 1))

    def __len__(self) -> int:
        return self.end - self.start + 1

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange | None:
        """The key groups in both ranges, or None when they are disjoint (used when rescaling state)."""
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start > end:
            return None
        return KeyGroupRange(KeyGroup(start), KeyGroup(end))

    def __str__(self) -> str:
        return f"[{self.start}..{self.end}]"


def check_parallelism(max_parallelism: int, parallelism: int) -> None:
    """Raise ValueError unless ``1 <= parallelism <= max_parallelism <= 32768``."""
    if not 0 < max_parallelism <= MAX_PARALLELISM_UPPER_BOUND:
        raise ValueError(f"max parallelism must be in 1..{MAX_PARALLELISM_UPPER_BOUND}, got {max_parallelism}")
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism must be in 1..max parallelism ({max_parallelism}), got {parallelism}; "
            "raise the operator's max parallelism or lower its parallelism"
        )


def key_group_for(key_bytes: bytes, max_parallelism: int) -> KeyGroup:
    """The key group of a key already encoded by :func:`key_to_bytes`."""
    if not 0 < max_parallelism <= MAX_PARALLELISM_UPPER_BOUND:
        raise ValueError(f"max parallelism must be in 1..{MAX_PARALLELISM_UPPER_BOUND}, got {max_parallelism}")
    return _crc32(key_bytes) % max_parallelism  # type: ignore[return-value]


def key_group_for_key(key: object, max_parallelism: int) -> KeyGroup:
    """The key group of a key as returned by a key selector: ``key_group_for(key_to_bytes(key), ...)``."""
    return key_group_for(key_to_bytes(key), max_parallelism)


PLAIN_KEY_ITEMS: Final = frozenset({str, int, bytes, type(None)})
"""The types of a tuple key's items that let the tuple be remembered: two equal tuples of these
items encode alike (no ``1`` beside ``1.0`` or ``True``)."""


class KeyEncoder:
    """A key's bytes (:func:`key_to_bytes`), key group and length-prefixed bytes (the start of
    composite state keys, ``weir.core.state_layout.key_prefix``), remembered for ``str``, ``int``
    and ``bytes`` keys and tuples of those and None (a SQL key): a key seen before costs one dict
    lookup instead of encoding and hashing. Up to ``memo_limit`` keys are kept, then all are
    forgotten at once. Other keys are encoded every time: equal values of different types (``1``,
    ``1.0``, ``True``) encode differently but would share one dict entry.
    """

    __slots__ = ("_max_parallelism", "_memo", "_memo_limit")

    def __init__(self, max_parallelism: int, memo_limit: int = 100_000) -> None:
        key_group_for(b"", max_parallelism)  # validates max_parallelism once
        self._max_parallelism = max_parallelism
        self._memo: dict[object, tuple[bytes, KeyGroup, bytes]] = {}
        self._memo_limit = memo_limit

    def encode(self, key: object) -> tuple[bytes, KeyGroup, bytes]:
        """(key bytes, key group, length-prefixed key bytes)."""
        kind = type(key)
        if kind is tuple and isinstance(key, tuple):  # the isinstance: for the type checker
            for item in key:
                if type(item) not in PLAIN_KEY_ITEMS:
                    return self._encode(key)
        elif not (kind is str or kind is int or kind is bytes):
            return self._encode(key)
        info = self._memo.get(key)
        if info is None:
            kb = plain_tuple_to_bytes(key) if kind is tuple else key_to_bytes(key)  # type: ignore[arg-type]
            info = kb, key_group_for(kb, self._max_parallelism), key_prefix(kb)
            if len(self._memo) >= self._memo_limit:
                self._memo.clear()
            self._memo[key] = info
        return info

    def key_group(self, key: object) -> KeyGroup:
        return self.encode(key)[1]

    def _encode(self, key: object) -> tuple[bytes, KeyGroup, bytes]:
        kb = key_to_bytes(key)
        return kb, key_group_for(kb, self._max_parallelism), key_prefix(kb)


_I64_ITEM_LENGTH: Final = struct.pack(">I", 8)
_NULL_ITEM: Final = struct.pack(">I", 4) + b"null"  # None as key_to_bytes encodes it (JSON), length-prefixed


def plain_tuple_to_bytes(key: tuple[str | int | bytes | None, ...]) -> bytes:
    """:func:`key_to_bytes` of a tuple whose items are all of :data:`PLAIN_KEY_ITEMS` (a SQL key),
    byte for byte, without its recursion and type tests: a one-column key of a 64-bit ``int`` (a
    SQL BIGINT) is one concatenation."""
    if len(key) == 1:
        only = key[0]
        if type(only) is int and _I64_MIN <= only <= _I64_MAX:
            return _I64_ITEM_LENGTH + _pack_i64(only)
    parts: list[bytes] = []
    append = parts.append
    for item in key:
        if type(item) is int and _I64_MIN <= item <= _I64_MAX:
            append(_I64_ITEM_LENGTH)
            append(_pack_i64(item))
        elif item is None:
            append(_NULL_ITEM)
        else:
            encoded = item.encode() if isinstance(item, str) else key_to_bytes(item)
            append(_pack_u32(len(encoded)))
            append(encoded)
    return b"".join(parts)


def key_to_bytes(key: object) -> bytes:
    """A canonical byte encoding of a key, identical in every process and on every machine.

    ``str`` is UTF-8; ``int`` is 8 bytes big-endian signed (minimal signed big-endian beyond 64 bits);
    ``bytes`` is taken as is; a ``tuple`` is the length-prefixed encodings of its items; any other
    JSON-serializable value (float, list, dict, None) is compact JSON with sorted keys. Different
    types may encode alike (``"a"`` and ``b"a"``): the encoding only chooses a key group.

    Raises JobDefinitionError for a key with no stable encoding (e.g. an arbitrary object).
    """
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, int):
        return _int_to_bytes(key)
    if isinstance(key, bytes):
        return key
    if isinstance(key, tuple):
        parts = []
        for item in key:
            encoded = key_to_bytes(item)
            parts.append(_pack_u32(len(encoded)))
            parts.append(encoded)
        return b"".join(parts)
    if isinstance(key, bytearray | memoryview):
        return bytes(key)
    try:
        return json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode()
    except (TypeError, ValueError) as exc:
        raise JobDefinitionError(
            f"key {key!r} of type {type(key).__qualname__} has no stable encoding: make the key selector "
            "return str, int, bytes, a tuple of those, or a JSON-serializable value"
        ) from exc


def _int_to_bytes(value: int) -> bytes:
    if _I64_MIN <= value <= _I64_MAX:
        return _pack_i64(value)
    return value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)


def key_group_range_for_subtask(max_parallelism: int, parallelism: int, subtask: SubtaskIndex) -> KeyGroupRange:
    """The contiguous key groups owned by ``subtask`` (Flink's computeKeyGroupRangeForOperatorIndex)."""
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= subtask < parallelism:
        raise ValueError(f"subtask index must be in 0..{parallelism - 1}, got {subtask}")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(KeyGroup(start), KeyGroup(end))


def subtask_for_key_group(max_parallelism: int, parallelism: int, key_group: KeyGroup) -> SubtaskIndex:
    """The subtask owning ``key_group`` (Flink's computeOperatorIndexForKeyGroup)."""
    check_parallelism(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key group must be in 0..{max_parallelism - 1}, got {key_group}")
    return SubtaskIndex(key_group * parallelism // max_parallelism)


def subtask_table(max_parallelism: int, parallelism: int) -> tuple[SubtaskIndex, ...]:
    """``table[key_group]`` is the owning subtask, for every key group: a lookup for the hot path."""
    check_parallelism(max_parallelism, parallelism)
    return tuple(SubtaskIndex(kg * parallelism // max_parallelism) for kg in range(max_parallelism))

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from weir.core.errors import JobDefinitionError
from weir.core.ids import KeyGroup, SubtaskIndex
from weir.core.keygroups import (
    MAX_PARALLELISM_UPPER_BOUND,
    KeyEncoder,
    KeyGroupRange,
    key_group_for,
    key_group_for_key,
    key_group_range_for_subtask,
    key_to_bytes,
    plain_tuple_to_bytes,
    subtask_for_key_group,
    subtask_table,
)

PAIRS = [
    (maxp, p)
    for maxp in (1, 2, 3, 7, 10, 128, 129, 1000, 4096, MAX_PARALLELISM_UPPER_BOUND)
    for p in (1, 2, 3, 4, 5, 7, 8, 13, 64, 100, 127, 128, 1000)
    if p <= maxp
] + [(5, 5), (32768, 32768), (32768, 32767)]

# Key groups for max parallelism 128 and 32768, computed once. They must never change: they decide
# where keyed state lives in every checkpoint.
STABLE_KEYS: list[object] = [
    "user-1",
    "user-2",
    "käse",
    0,
    1,
    -1,
    2**70,
    b"\x00\xff",
    ("a", 1),
    ("a", (b"b", 2)),
    {"b": 1, "a": [1.5, None]},
]
EXPECTED_128 = [20, 46, 119, 105, 127, 28, 41, 114, 30, 12, 66]
EXPECTED_32768 = [17940, 6062, 15095, 24425, 28671, 24348, 6057, 32114, 414, 9868, 21058]


@pytest.mark.parametrize(("max_parallelism", "parallelism"), PAIRS)
def test_ranges_partition_all_key_groups_contiguously(max_parallelism: int, parallelism: int) -> None:
    ranges = [key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(s)) for s in range(parallelism)]
    assert ranges[0].start == 0
    assert ranges[-1].end == max_parallelism - 1
    for previous, following in zip(ranges, ranges[1:], strict=False):
        assert following.start == previous.end + 1
    assert sum(len(r) for r in ranges) == max_parallelism
    sizes = {len(r) for r in ranges}
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("max_parallelism", "parallelism"), PAIRS)
def test_subtask_for_key_group_agrees_with_ranges(max_parallelism: int, parallelism: int) -> None:
    table = subtask_table(max_parallelism, parallelism)
    assert len(table) == max_parallelism
    for subtask in range(parallelism):
        key_range = key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(subtask))
        for key_group in (key_range.start, key_range.end, KeyGroup((key_range.start + key_range.end) // 2)):
            assert subtask_for_key_group(max_parallelism, parallelism, key_group) == subtask
            assert table[key_group] == subtask
    for index, owner in enumerate(table):
        assert index in key_group_range_for_subtask(max_parallelism, parallelism, owner)


def test_matches_flink_formulas_on_known_values() -> None:
    assert key_group_range_for_subtask(128, 3, SubtaskIndex(0)) == KeyGroupRange(KeyGroup(0), KeyGroup(42))
    assert key_group_range_for_subtask(128, 3, SubtaskIndex(1)) == KeyGroupRange(KeyGroup(43), KeyGroup(85))
    assert key_group_range_for_subtask(128, 3, SubtaskIndex(2)) == KeyGroupRange(KeyGroup(86), KeyGroup(127))
    assert subtask_for_key_group(128, 3, KeyGroup(42)) == 0
    assert subtask_for_key_group(128, 3, KeyGroup(43)) == 1


@pytest.mark.parametrize(
    ("max_parallelism", "parallelism", "match"),
    [
        (0, 1, "max parallelism"),
        (-3, 1, "max parallelism"),
        (MAX_PARALLELISM_UPPER_BOUND + 1, 1, "max parallelism"),
        (128, 0, "parallelism must be"),
        (128, 129, "parallelism must be"),
    ],
)
def test_invalid_parallelism_is_rejected(max_parallelism: int, parallelism: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(0))
    with pytest.raises(ValueError, match=match):
        subtask_for_key_group(max_parallelism, parallelism, KeyGroup(0))
    with pytest.raises(ValueError, match=match):
        subtask_table(max_parallelism, parallelism)


def test_out_of_range_subtask_and_key_group_are_rejected() -> None:
    with pytest.raises(ValueError, match="subtask index"):
        key_group_range_for_subtask(128, 4, SubtaskIndex(4))
    with pytest.raises(ValueError, match="key group"):
        subtask_for_key_group(128, 4, KeyGroup(128))
    with pytest.raises(ValueError, match="key group"):
        subtask_for_key_group(128, 4, KeyGroup(-1))
    with pytest.raises(ValueError, match="max parallelism"):
        key_group_for(b"k", 0)
    with pytest.raises(ValueError, match="max parallelism"):
        key_group_for(b"k", MAX_PARALLELISM_UPPER_BOUND + 1)


def test_key_group_range_behaves_like_a_collection() -> None:
    key_range = KeyGroupRange(KeyGroup(3), KeyGroup(6))
    assert list(key_range) == [3, 4, 5, 6]
    assert len(key_range) == 4
    assert 3 in key_range and 6 in key_range
    assert 2 not in key_range and 7 not in key_range and "3" not in key_range
    assert key_range.intersection(KeyGroupRange(KeyGroup(5), KeyGroup(9))) == KeyGroupRange(KeyGroup(5), KeyGroup(6))
    assert key_range.intersection(KeyGroupRange(KeyGroup(7), KeyGroup(9))) is None
    assert str(key_range) == "[3..6]"
    with pytest.raises(ValueError):
        KeyGroupRange(KeyGroup(4), KeyGroup(3))
    with pytest.raises(ValueError):
        KeyGroupRange(KeyGroup(-1), KeyGroup(3))


def test_key_group_is_in_range_and_spreads_keys() -> None:
    counts = Counter(key_group_for_key(f"user-{i}", 128) for i in range(64_000))
    assert set(counts) == set(range(128))
    assert min(counts.values()) > 400 and max(counts.values()) < 600
    int_counts = Counter(key_group_for_key(i, 100) for i in range(50_000))
    assert set(int_counts) == set(range(100))
    assert min(int_counts.values()) > 350 and max(int_counts.values()) < 650


def test_key_to_bytes_encodings() -> None:
    assert key_to_bytes("käse") == "käse".encode()
    assert key_to_bytes(1) == b"\x00" * 7 + b"\x01"
    assert key_to_bytes(-1) == b"\xff" * 8
    assert key_to_bytes(b"raw") == b"raw"
    assert key_to_bytes(bytearray(b"raw")) == b"raw"
    assert key_to_bytes(True) == key_to_bytes(1)
    assert key_to_bytes(2**63) != key_to_bytes(-(2**63))
    assert key_to_bytes(("a", "bc")) != key_to_bytes(("ab", "c"))
    assert key_to_bytes({"b": 1, "a": 2}) == key_to_bytes({"a": 2, "b": 1})
    assert key_to_bytes([1, 2]) == b"[1,2]"


def test_key_to_bytes_accepts_subclasses_of_basic_types() -> None:
    from enum import IntEnum, StrEnum

    class Color(StrEnum):
        RED = "red"

    class Size(IntEnum):
        BIG = 7

    assert key_to_bytes(Color.RED) == b"red"
    assert key_to_bytes(Size.BIG) == key_to_bytes(7)


def test_key_without_stable_encoding_is_a_user_error() -> None:
    with pytest.raises(JobDefinitionError, match="stable encoding") as info:
        key_to_bytes(object())
    assert info.value.fault == "user"


def test_literal_key_groups() -> None:
    assert [key_group_for_key(k, 128) for k in STABLE_KEYS] == EXPECTED_128
    assert [key_group_for_key(k, 32768) for k in STABLE_KEYS] == EXPECTED_32768


@pytest.mark.parametrize("hash_seed", ["0", "1", "12345", "random"])
def test_key_groups_are_stable_across_processes(hash_seed: str) -> None:
    script = (
        "import json, sys\n"
        "from weir.core.keygroups import key_group_for_key\n"
        f"keys = {STABLE_KEYS!r}\n"
        "print(json.dumps([[key_group_for_key(k, 128) for k in keys],"
        " [key_group_for_key(k, 32768) for k in keys]]))\n"
    )
    repo_root = Path(__file__).resolve().parents[4]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    groups_128, groups_32768 = json.loads(result.stdout)
    assert groups_128 == EXPECTED_128
    assert groups_32768 == EXPECTED_32768


def test_the_key_encoder_gives_what_the_functions_give_and_forgets_past_its_limit() -> None:
    encoder = KeyEncoder(128, memo_limit=3)
    keys: list[object] = ["a", 7, b"a", "a", 7.0, ("a", 7), [1, 2], "b", "c", "a"]
    for key in keys:
        kb = key_to_bytes(key)
        assert encoder.encode(key) == (kb, key_group_for(kb, 128), len(kb).to_bytes(4, "big") + kb), key
        assert encoder.key_group(key) == key_group_for_key(key, 128)
        assert len(encoder._memo) <= 3
    with pytest.raises(ValueError, match="max parallelism"):
        KeyEncoder(0)


def test_the_key_encoder_remembers_tuples_of_plain_items_and_tells_equal_keys_of_other_types_apart() -> None:
    """A SQL key is a tuple: remembered when its items are str, int, bytes or None; (1,) and (1.0,)
    are equal tuples that encode differently, and each gets its own encoding."""
    encoder = KeyEncoder(128)
    keys: list[object] = [(1,), (1.0,), (True,), (1,), ("a", None), ("a", None), (b"a", 2), ((1,),), (1, 2.5), (True,)]
    for key in keys:
        kb = key_to_bytes(key)
        assert encoder.encode(key) == (kb, key_group_for(kb, 128), len(kb).to_bytes(4, "big") + kb), key
    assert set(encoder._memo) == {(1,), ("a", None), (b"a", 2)}
    assert encoder.encode((1.0,))[0] != encoder.encode((1,))[0]  # equal keys, not one memo entry


def test_a_tuple_of_plain_items_encodes_as_key_to_bytes_encodes_it() -> None:
    """``plain_tuple_to_bytes`` (the encoder's path for SQL keys) gives key_to_bytes' bytes for every
    item kind and size: 64-bit ints at both ends, ints beyond 64 bits, str, bytes and None."""
    items: list[str | int | bytes | None] = [
        0,
        1,
        -1,
        2**63 - 1,
        -(2**63),
        2**63,
        -(2**63) - 1,
        2**100,
        "",
        "é",
        b"",
        b"\x00",
        None,
    ]
    keys: list[tuple[str | int | bytes | None, ...]] = [()]
    keys += [(a,) for a in items]
    keys += [(a, b) for a in items for b in items]
    keys += [(a, b, a) for a in items[:5] for b in items[-5:]]
    for key in keys:
        assert plain_tuple_to_bytes(key) == key_to_bytes(key), key
        encoder = KeyEncoder(128)
        kb = key_to_bytes(key)
        assert encoder.encode(key) == (kb, key_group_for(kb, 128), len(kb).to_bytes(4, "big") + kb), key
        assert encoder.encode(key) == (kb, key_group_for(kb, 128), len(kb).to_bytes(4, "big") + kb), key  # remembered

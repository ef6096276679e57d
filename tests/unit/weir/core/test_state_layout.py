"""The byte layout of keyed state (``weir.core.state_layout``): the literal bytes Weir has always
written, round trips of every part of an entry, the key ranges a restore copies, and how a reader
reads each kind of state key back."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest

from weir.core.errors import Fault, SerializationError
from weir.core.key_samples import KEY_SAMPLE_STATE
from weir.core.keygroups import KeyEncoder, key_to_bytes
from weir.core.state_layout import (
    EVENT_TIMERS,
    GUESSED_KEY,
    JOIN_LEFT_BUFFER,
    JOIN_LEFT_TIMES,
    JOIN_RIGHT_BUFFER,
    JOIN_RIGHT_TIMES,
    PROCESSING_TIMERS,
    REDUCE_STATE,
    STATE_KINDS,
    TIMER_STATES,
    WINDOW_STATE,
    KeyedEntry,
    WindowKeys,
    describe_state_key,
    dump_value,
    entry_key,
    guess_state_key,
    is_state_name,
    key_group_range_bounds,
    key_prefix,
    load_value,
    map_entry_key,
    operator_prefix,
    parse_entry,
    read_key,
    record_key_of,
    split_key_prefix,
    state_kind,
    timer_key,
    timer_time,
    window_bounds,
    window_key,
    window_key_prefix,
)

# The bytes below were written by Weir before this module existed (tests/unit/operators/test_state_bytes.py
# has the operators write and read them): the layout must build exactly them.

WINDOW_ENTRY = b"w\x00\x00Gwin\x00\x00\x00\x00\x05alice\x00\x00\x00\x00\x00\x00\x00\n\x00\x00\x00\x00\x00\x00\x00\x14"
WINDOW_VALUE = b"\x80\x05\x95\r\x00\x00\x00\x00\x00\x00\x00\x8c\x05alice\x94K\x07\x86\x94."
REDUCE_ENTRY = b"r\x00\x00freduce\x00\x00\x00\x00\x00\x00\x00\x00\x05"
REDUCE_VALUE = b"\x80\x05K\x05."
TIMER_ENTRY = b"p\x00\x00]timers.event_time\x00\x00\x00\x00\x01k\x00\x00\x00\x00\x00\x00\x03\xe8"
TIMER_VALUE = b"\x80\x05\x95\x07\x00\x00\x00\x00\x00\x00\x00\x8c\x01k\x94\x85\x94."
MAP_ENTRY = b"p\x00\x00]seen\x00\x00\x00\x00\x01k\x00\x00\x00\x00\x00\x00\x00\x0c"


def test_the_names_of_the_runtimes_states_are_pinned() -> None:
    assert (WINDOW_STATE, REDUCE_STATE, EVENT_TIMERS, PROCESSING_TIMERS) == (
        "win",
        "reduce",
        "timers.event_time",
        "timers.processing_time",
    )
    assert TIMER_STATES == {"timers.event_time", "timers.processing_time"}
    assert (JOIN_LEFT_BUFFER, JOIN_RIGHT_BUFFER, JOIN_LEFT_TIMES, JOIN_RIGHT_TIMES) == (
        "join.left",
        "join.right",
        "join.left-times",
        "join.right-times",
    )
    assert set(STATE_KINDS) == {
        WINDOW_STATE,
        REDUCE_STATE,
        *TIMER_STATES,
        JOIN_LEFT_BUFFER,
        JOIN_RIGHT_BUFFER,
        JOIN_LEFT_TIMES,
        JOIN_RIGHT_TIMES,
        KEY_SAMPLE_STATE,
    }
    assert KEY_SAMPLE_STATE == "weir.key-samples"
    assert describe_state_key(KEY_SAMPLE_STATE, b"\x05") == {"slot": 5}
    assert all(kind.name == name for name, kind in STATE_KINDS.items())


def test_a_state_name_cannot_hold_the_separator_that_ends_it() -> None:
    assert all(is_state_name(n) for n in ("win", "join.left-times", "ü", " "))
    assert not any(is_state_name(n) for n in ("", "a\x00b", None, 5, b"win"))


def test_the_layout_builds_the_pinned_bytes() -> None:
    alice = key_prefix(key_to_bytes("alice"))
    assert entry_key(operator_prefix("w"), 71, WINDOW_STATE, window_key(alice, 10, 20)) == WINDOW_ENTRY
    assert dump_value(("alice", 7)) == WINDOW_VALUE
    assert entry_key(operator_prefix("r"), 102, REDUCE_STATE, key_to_bytes(5)) == REDUCE_ENTRY
    assert dump_value(5) == REDUCE_VALUE
    k = key_prefix(key_to_bytes("k"))
    assert entry_key(operator_prefix("p"), 93, EVENT_TIMERS, timer_key(k, 1000)) == TIMER_ENTRY
    assert dump_value(("k",)) == TIMER_VALUE
    assert entry_key(operator_prefix("p"), 93, "seen", map_entry_key(k, key_to_bytes(12))) == MAP_ENTRY
    assert key_group_range_bounds("w", 0, 63) == (b"w\x00\x00\x00", b"w\x00\x00@")


def test_the_pinned_bytes_read_back() -> None:
    window = parse_entry(operator_prefix("w"), WINDOW_ENTRY, WINDOW_VALUE)
    assert (window.key_group, window.state) == (71, WINDOW_STATE)
    assert window_bounds(window.key) == (10, 20)
    assert split_key_prefix(window_key_prefix(window.key)) == (b"alice", b"")
    assert load_value(window.value) == ("alice", 7)
    timer = parse_entry(operator_prefix("p"), TIMER_ENTRY, TIMER_VALUE)
    assert (timer.key_group, timer.state, timer_time(timer.key)) == (93, EVENT_TIMERS, 1000)
    assert load_value(timer.value) == ("k",)
    assert parse_entry(operator_prefix("r"), REDUCE_ENTRY, REDUCE_VALUE) == KeyedEntry(
        102, REDUCE_STATE, key_to_bytes(5), REDUCE_VALUE
    )


def test_the_key_encoder_prefixes_keys_as_the_layout_does() -> None:
    encoder = KeyEncoder(128)
    for key in ("alice", 5, b"raw", ("a", 3), None, 2.5):
        kb, _kg, prefix = encoder.encode(key)
        assert prefix == key_prefix(kb)
        assert split_key_prefix(prefix) == (kb, b"")


def test_entry_keys_round_trip() -> None:
    rng = random.Random(7)
    names = [WINDOW_STATE, REDUCE_STATE, EVENT_TIMERS, "count", "join.left", "ü-state"]
    for _ in range(500):
        uid = rng.choice(["op", "window-count-sum", "a", "op2", "ünïcode"])
        key_group = rng.randrange(1 << 15)
        name = rng.choice(names)
        state_key = rng.randbytes(rng.randrange(0, 40))  # NUL bytes included: only the name ends at one
        value = rng.randbytes(8)
        entry = parse_entry(operator_prefix(uid), entry_key(operator_prefix(uid), key_group, name, state_key), value)
        assert entry == KeyedEntry(key_group, name, state_key, value)


def test_a_key_that_is_not_an_operators_entry_is_refused() -> None:
    with pytest.raises(SerializationError, match="is not an entry of operator op$"):
        parse_entry(operator_prefix("op"), b"other\x00\x00\x01win\x00k", b"")
    with pytest.raises(SerializationError, match="has no state name"):
        parse_entry(operator_prefix("op"), b"op\x00\x00\x01win-without-end", b"")
    with pytest.raises(SerializationError, match="is not an entry"):
        parse_entry(operator_prefix("op"), b"op\x00\x00", b"")


def test_a_key_group_range_holds_exactly_its_operators_entries_of_those_key_groups() -> None:
    """What a restore deletes and copies: the operator's entries of key groups first..last, not the
    next key group's, not another operator's (even one whose uid extends this one's)."""
    start, end = key_group_range_bounds("op", 3, 5)
    entries = (("a", b""), ("win", b"\xff" * 30), ("\U0010ffff", b"\x00"))
    inside = [entry_key(operator_prefix("op"), kg, name, key) for kg in (3, 4, 5) for name, key in entries]
    outside = [
        entry_key(operator_prefix("op"), 2, "zzz", b"\xff" * 10),
        entry_key(operator_prefix("op"), 6, "a", b""),
        entry_key(operator_prefix("op2"), 4, "a", b""),
        entry_key(operator_prefix("o"), 4, "a", b""),
    ]
    assert all(start <= key < end for key in inside)
    assert not any(start <= key < end for key in outside)
    last_start, last_end = key_group_range_bounds("op", 0, (1 << 15) - 1)
    assert last_start <= entry_key(operator_prefix("op"), (1 << 15) - 1, "a", b"\xff") < last_end


def test_state_keys_round_trip() -> None:
    rng = random.Random(11)
    for _ in range(300):
        kb = rng.randbytes(rng.randrange(0, 20))
        prefix = key_prefix(kb)
        start = rng.randrange(-(1 << 62), 1 << 62)
        end = start + rng.randrange(1, 1 << 20)
        window = window_key(prefix, start, end)
        assert window_bounds(window) == (start, end)
        assert window_key_prefix(window) == prefix
        assert split_key_prefix(window) == (kb, window[len(prefix) :])
        time = rng.randrange(-(1 << 63), 1 << 63)
        assert timer_time(timer_key(prefix, time)) == time
        entry = map_entry_key(prefix, key_to_bytes(time))
        assert entry.startswith(prefix) and split_key_prefix(entry) == (kb, key_to_bytes(time))


def test_window_keys_remember_the_last_bounds_and_answer_as_window_key() -> None:
    keys = WindowKeys()
    rng = random.Random(3)
    for _ in range(200):
        prefix = key_prefix(rng.choice([b"a", b"bb", b""]))
        start = rng.choice([0, 10, 20])
        end = start + rng.choice([10, 5])
        assert keys.key(prefix, start, end) == window_key(prefix, start, end)


def test_a_prefix_longer_than_its_key_is_not_split() -> None:
    assert split_key_prefix(b"\x00\x00") is None
    assert split_key_prefix(b"\x00\x00\x00\x09short") is None
    assert split_key_prefix(b"\x00\x00\x00\x00") == (b"", b"")


def test_values_round_trip_and_a_value_that_does_not_pickle_is_the_users_error() -> None:
    for value in (None, 0, -(1 << 70), "ü", b"\x00", (1, "a"), [1, [2]], {"a": {1, 2}}, 2.5):
        assert load_value(dump_value(value)) == value
        assert dump_value(value) == pickle.dumps(value, 5)
    with pytest.raises(SerializationError, match="cannot store a keyed state value of type function") as raised:
        dump_value(lambda: 1)
    assert raised.value.fault is Fault.USER


def test_a_value_pickled_before_the_one_import_root_reads() -> None:
    former = (  # TtlValue(3, 7) when it was operators.process_state.TtlValue
        b"\x80\x05\x954\x00\x00\x00\x00\x00\x00\x00\x8c\x17operators.process_state\x94\x8c\x08TtlValue"
        b"\x94\x93\x94)\x81\x94]\x94(K\x03K\x07eb."
    )
    restored = load_value(former)
    assert (type(restored).__module__, restored.value, restored.last_access_ms) == (
        "weir.operators.process_state",
        3,
        7,
    )


# Reading state keys back ----------------------------------------------------------------------------


def prefixed(key: Any) -> bytes:
    return key_prefix(key_to_bytes(key))


@pytest.mark.parametrize(
    ("state", "state_key", "read"),
    [
        (WINDOW_STATE, window_key(prefixed("u"), 10, 20), {"key": "u", "window": [10, 20]}),
        (EVENT_TIMERS, timer_key(prefixed(("a", 1)), 1000), {"key": ["a", 1], "time": 1000}),
        (PROCESSING_TIMERS, timer_key(prefixed(-3), -5), {"key": -3, "time": -5}),
        (JOIN_LEFT_BUFFER, map_entry_key(prefixed("k"), key_to_bytes(20)), {"key": "k", "user_key": 20}),
        (REDUCE_STATE, key_to_bytes("user-1"), "user-1"),
        (JOIN_RIGHT_TIMES, key_to_bytes(7), 7),
        ("seen", map_entry_key(prefixed("k"), key_to_bytes(12)), {"key": "k", "user_key": 12}),
        ("count", key_to_bytes(("a", 3)), ["a", 3]),
    ],
)
def test_each_kind_of_state_key_reads_back(state: str, state_key: bytes, read: Any) -> None:
    assert describe_state_key(state, state_key) == read


def test_a_state_key_that_does_not_fit_its_kind_is_guessed_at() -> None:
    """A process function may name its own ValueState ``win``: its keys are read as a guess."""
    assert describe_state_key(WINDOW_STATE, key_to_bytes("plain")) == "plain"
    assert describe_state_key(EVENT_TIMERS, prefixed("k") + b"\x01") == {"key": "k", "user_key": {"hex": "01"}}
    assert state_kind("my-state").key is GUESSED_KEY


def test_the_record_key_of_each_kind() -> None:
    assert record_key_of(WINDOW_STATE, window_key(prefixed("abc"), 0, 10)) == b"abc"
    assert record_key_of(EVENT_TIMERS, timer_key(prefixed("abc"), 5)) == b"abc"
    assert record_key_of(JOIN_LEFT_BUFFER, map_entry_key(prefixed("abc"), key_to_bytes(1))) == b"abc"
    assert record_key_of(REDUCE_STATE, b"abc") == b"abc"
    assert record_key_of(WINDOW_STATE, b"not a window key") == b"not a window key"
    assert record_key_of("my-state", prefixed("abc") + b"more") == prefixed("abc") + b"more"


def test_keys_are_read_back_from_their_encoding() -> None:
    assert read_key(key_to_bytes("user-1")) == "user-1"
    assert read_key(key_to_bytes(-5)) == -5
    assert read_key(key_to_bytes(("a", 3))) == ["a", 3]
    assert read_key(key_to_bytes({"a": [1, 2]})) == '{"a":[1,2]}'
    assert read_key(b"\x00\x01") == {"hex": "0001"}
    assert read_key(b"") == ""
    assert read_key(prefixed("k") + key_to_bytes(12)) == {"hex": (prefixed("k") + key_to_bytes(12)).hex()}


def test_a_process_functions_state_key_is_guessed_plain_or_map_entry() -> None:
    assert guess_state_key(key_to_bytes("user-1")) == "user-1"
    assert guess_state_key(key_to_bytes(("a", 3))) == ["a", 3]
    assert guess_state_key(prefixed("k") + key_to_bytes(12)) == {"key": "k", "user_key": 12}
    assert guess_state_key(prefixed("k") + key_to_bytes("x")) == {"key": "k", "user_key": "x"}
    assert guess_state_key(b"\x00\x01") == {"hex": "0001"}
    assert describe_state_key("my-map", prefixed("k") + key_to_bytes(12)) == {"key": "k", "user_key": 12}

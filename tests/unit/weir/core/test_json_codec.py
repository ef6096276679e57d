"""Weir's record JSON codec: msgspec's speed with the stdlib's answers, on good and bad input alike."""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict
from typing import Any

import pytest

from examples.keyed_aggregation import parse_event
from weir.core import json_codec
from weir.operators.sinks import json_serializer
from weir.operators.sources import json_deserializer

VALID = [
    b'{"id":"e1","key":"key-0001","value":42,"ts":1700000000000}',
    b'  {"a": [1, 2.5, -0.0, 1E5, 1e-400, true, false, null], "b": {"c": "\\u00e9\\n"}}\r\n',
    '{"é": "ü", "emoji": "\U0001f600"}'.encode(),
    b"123456789012345678901234567890",  # beyond 64 bits: an exact int, not a float
    b"-18446744073709551617",
    b'{"a":1,"a":2}',  # the last one wins
    b'"plain"',
    b"[]",
]
# What the stdlib accepts beyond RFC 8259; the codec must keep accepting it.
STDLIB_EXTENSIONS = [
    b'{"v": NaN}',
    b"[Infinity, -Infinity]",
    b"1e400",
    b'"\\ud800"',  # a lone surrogate escape
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    '{"s": 1}'.encode("utf-16"),
    '{"s": 1}'.encode("utf-32-le"),
]
MALFORMED: list[Any] = [
    b'{"a":1}x',  # trailing garbage
    b'{"a":1} {"b":2}',
    b"\xff\xfe\xfd",  # invalid UTF-8
    b'{"k": "\xc3"}',  # truncated UTF-8 sequence inside a string
    b"",
    b"   ",
    b"{not json",
    b'{"a":}',
    b"[1,]",
    b"nan",
    b'"a\x01b"',  # a raw control character
    b"1" * 5000,  # past the stdlib's int digit limit
    None,  # a record without a value (a tombstone)
    42,
]


def outcome(fn: Any, raw: Any) -> tuple[str, Any]:
    try:
        value = fn(raw)
    except Exception as exc:  # the exact exception is the point
        return ("raises", (type(exc), str(exc)))
    return ("value", repr(value))  # repr: NaN == NaN, and int 1 is not float 1.0


@pytest.mark.parametrize("raw", VALID + STDLIB_EXTENSIONS + MALFORMED)
def test_decode_answers_what_json_loads_answers(raw: Any) -> None:
    assert outcome(json_codec.decode, raw) == outcome(json.loads, raw)


def test_decode_keeps_big_ints_exact() -> None:
    assert json_codec.decode(b"[123456789012345678901234567890]") == [123456789012345678901234567890]
    assert type(json_codec.decode(b"1")) is int and type(json_codec.decode(b"1.0")) is float


def test_decode_matches_json_loads_on_mangled_records() -> None:
    """Random byte edits of the benchmark's events: every one decodes or fails exactly as json.loads."""
    rng = random.Random(16)
    base = VALID[0]
    for _ in range(3000):
        raw = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(raw))
            match rng.randrange(3):
                case 0:
                    raw[i] = rng.randrange(256)
                case 1:
                    del raw[i]
                case _:
                    raw.insert(i, rng.choice(b'{}[]",:0123456789.eE+-tfnul \\\x00\xff'))
        assert outcome(json_codec.decode, bytes(raw)) == outcome(json.loads, bytes(raw)), bytes(raw)


def test_the_source_default_and_the_example_use_the_codec() -> None:
    event = {"id": "e1", "key": "key-0001", "value": 42, "ts": 1700000000000}
    assert json_deserializer(VALID[0]) == event
    assert parse_event(VALID[0]) == event
    for raw, error in ((b'{"id":"e1"} trailing', json.JSONDecodeError), (b"\xff", UnicodeDecodeError)):
        with pytest.raises(error):
            parse_event(raw)
    with pytest.raises(ValueError, match="field 'value' must be int"):
        parse_event(b'{"id":"e1","key":"k","value":NaN,"ts":1}')  # NaN decodes (as before), then fails the check


def same_json(value: Any) -> Any:
    """``value`` as JSON gives it back: tuples as lists, keys as str."""
    return json.loads(json.dumps(value))


ENCODABLE = [
    {"key": "key-0001", "window_start": 1700000000000, "window_end": 1700000001000, "count": 8, "sum": 328},
    {"b": {"d": [1, 2.5, None, True], "c": "x"}, "a": (1, "two")},
    {"é": 'ü\n"\\', "emoji": "\U0001f600"},
    [2**64, -(2**70), 0.1, -0.0, 1e16, 5e-324],
    "plain",
    None,
]


@pytest.mark.parametrize("value", ENCODABLE)
def test_encode_writes_compact_sorted_json_of_the_same_values(value: Any) -> None:
    out = json_codec.encode(value)
    assert isinstance(out, bytes)
    assert json.loads(out) == same_json(value)
    if isinstance(value, dict):
        assert list(json.loads(out)) == sorted(value)


def test_encode_writes_utf8_and_sorts_nested_keys() -> None:
    assert json_codec.encode({"b": 1, "a": {"d": 2, "c": 3}}) == b'{"a":{"c":3,"d":2},"b":1}'
    assert json_codec.encode({"k": "é"}) == '{"k":"é"}'.encode()


@pytest.mark.parametrize(
    "value",
    [
        {"v": float("nan")},
        [float("inf"), {"w": -float("inf")}],
        OrderedDict(label=[1.5, (None, float("nan"))]),  # a dict subclass, nested in a tuple
        {"label": None, "values": [0.5, 2.5]},  # null, an "l", floats, and nothing non-finite
        {1: "int key", 2: "another"},
        {"s": "\ud800"},  # a lone surrogate: not UTF-8, the stdlib escapes it
        {"none": None, "x": 1.5},  # null without a non-finite float: msgspec's own answer
    ],
)
def test_encode_falls_back_to_the_stdlib_where_msgspec_would_differ(value: Any) -> None:
    stdlib = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
    assert json_codec.encode(value) == stdlib


@pytest.mark.parametrize("value", [*ENCODABLE, {"v": float("nan"), "a": 1}, {2: "int key", 1: "x"}, {"s": "\ud800"}])
def test_encode_in_order_writes_the_same_values_each_object_in_its_order(value: Any) -> None:
    out = json_codec.encode_in_order(value)
    decoded = json_codec.decode(out)
    if isinstance(value, dict):
        assert list(decoded) == [str(k) for k in value]
        assert (decoded == same_json(value)) or "v" in value  # NaN is not equal to itself
    else:
        assert decoded == same_json(value)


def test_encode_in_order_writes_compact_utf8_without_sorting() -> None:
    assert json_codec.encode_in_order({"b": 1, "a": {"d": 2, "c": 3}}) == b'{"b":1,"a":{"d":2,"c":3}}'
    assert json_codec.encode_in_order({"k": "é", "n": 2}) == '{"k":"é","n":2}'.encode()
    assert json_codec.encode_in_order({"w": 1, "v": float("nan")}) == b'{"w":1,"v":NaN}'  # the stdlib's tokens
    assert json_codec.encode_in_order({2: "x", 1: "y"}) == b'{"2":"x","1":"y"}'  # the stdlib's, unsorted


def test_non_finite_floats_keep_the_stdlib_tokens() -> None:
    out = json_codec.encode({"v": float("nan"), "w": float("inf")})
    assert out == b'{"v":NaN,"w":Infinity}'
    assert math.isnan(json_codec.decode(out)["v"])


def test_encode_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(TypeError):
        json_codec.encode({"o": object()})
    with pytest.raises(TypeError):
        json_codec.encode({1: "a", "b": 2})  # mixed key types cannot be sorted, as with the stdlib


def test_the_sink_default_is_the_codec() -> None:
    value = ENCODABLE[0]
    assert json_serializer(value) == json_codec.encode(value)
    assert json_codec.decode(json_serializer(value)) == value

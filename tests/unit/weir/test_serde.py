from __future__ import annotations

import os
import random
import struct
import threading

import pytest

from weir.errors import SerializationError
from weir.ids import KeyGroup
from weir.serde import Record, decode_batch, dumps_value, encode_batch, loads_value


def _random_records(rng: random.Random, count: int, kg_none: float, ts_none: float) -> list[Record]:
    return [
        (
            None if rng.random() < kg_none else KeyGroup(rng.randrange(32768)),
            None if rng.random() < ts_none else rng.randint(-(2**63), 2**63 - 1),
            rng.randbytes(rng.choice((0, 1, 10, 100, 1000))),
        )
        for _ in range(count)
    ]


def test_empty_batch_round_trip() -> None:
    blob = encode_batch([])
    assert decode_batch(blob) == []


def test_simple_round_trip() -> None:
    records: list[Record] = [
        (KeyGroup(0), 0, b""),
        (KeyGroup(32767), -1, b"payload"),
        (KeyGroup(5), 1_700_000_000_000, bytes(range(256))),
    ]
    assert decode_batch(encode_batch(records)) == records


@pytest.mark.parametrize(("kg_none", "ts_none"), [(0.0, 0.0), (1.0, 1.0), (0.5, 0.0), (0.0, 0.5), (0.3, 0.7)])
def test_random_round_trips_with_none_values(kg_none: float, ts_none: float) -> None:
    rng = random.Random(f"{kg_none}-{ts_none}")
    for count in (1, 2, 17, 1000):
        records = _random_records(rng, count, kg_none, ts_none)
        assert decode_batch(encode_batch(records)) == records


def test_single_none_values() -> None:
    records: list[Record] = [(None, None, b"a"), (KeyGroup(1), None, b"b"), (None, 5, b"c")]
    assert decode_batch(encode_batch(records)) == records


def test_big_payloads() -> None:
    records: list[Record] = [(KeyGroup(1), 1, os.urandom(5 * 1024 * 1024)), (None, None, b"x" * 70_000)]
    assert decode_batch(encode_batch(records)) == records


def test_decode_accepts_bytearray_and_memoryview() -> None:
    records: list[Record] = [(KeyGroup(3), 9, b"abc")]
    blob = encode_batch(records)
    assert decode_batch(bytearray(blob)) == records
    assert decode_batch(memoryview(blob)) == records
    assert all(type(payload) is bytes for _, _, payload in decode_batch(memoryview(blob)))


def test_encoding_is_deterministic_little_endian() -> None:
    blob = encode_batch([(KeyGroup(1), 2, b"xy")])
    assert blob == b"WB\x01\x01\x01" + struct.pack("<IHqI", 1, 1, 2, 2) + b"xy"


@pytest.mark.parametrize(
    ("records", "match"),
    [
        ([(KeyGroup(70_000), 1, b"x")], "key group"),
        ([(-1, 1, b"x")], "key group"),
        ([(None, 2**63, b"x")], "timestamp"),
        ([(None, 1.5, b"x")], "timestamp"),
        ([(None, None, "text")], "payload"),
        ([(None, None)], "triples"),
        ([(None, None, b"x", 4)], "triples"),
        ([None], "triples"),
    ],
)
def test_unencodable_records(records: list[Record], match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        encode_batch(records)


def test_malformed_bytes_are_rejected_clearly() -> None:
    blob = encode_batch([(KeyGroup(1), 2, b"payload"), (None, None, b"more")])
    with pytest.raises(SerializationError, match="shorter than"):
        decode_batch(b"")
    with pytest.raises(SerializationError, match="not a record batch"):
        decode_batch(b"XX" + blob[2:])
    with pytest.raises(SerializationError, match="version"):
        decode_batch(blob[:2] + b"\x09" + blob[3:])
    with pytest.raises(SerializationError, match="column mode"):
        decode_batch(blob[:3] + b"\x07" + blob[4:])
    with pytest.raises(SerializationError, match="corrupt"):
        decode_batch(blob[:-1])
    with pytest.raises(SerializationError, match="corrupt"):
        decode_batch(blob + b"\x00")
    with pytest.raises(SerializationError, match="need at least"):
        decode_batch(blob[:5] + struct.pack("<I", 2**32 - 1) + blob[9:])
    with pytest.raises(SerializationError, match="after 0 records"):
        decode_batch(encode_batch([]) + b"\x00")
    presence_offset = 9  # the first key-group presence byte in a MIXED column
    with pytest.raises(SerializationError, match="presence"):
        decode_batch(blob[:presence_offset] + b"\x02" + blob[presence_offset + 1 :])


def test_fuzzed_bytes_raise_only_serialization_errors() -> None:
    rng = random.Random(11)
    blobs = [
        encode_batch(_random_records(rng, count, kg_none, ts_none))
        for count, kg_none, ts_none in ((5, 0.0, 0.0), (8, 0.5, 0.5), (3, 1.0, 0.0), (0, 0.0, 0.0))
    ]
    for _ in range(3000):
        blob = bytearray(rng.choice(blobs))
        mutation = rng.random()
        if mutation < 0.4 and blob:
            for _ in range(rng.randint(1, 4)):
                blob[rng.randrange(len(blob))] = rng.randrange(256)
        elif mutation < 0.7:
            del blob[rng.randrange(len(blob) + 1) :]
        else:
            blob += rng.randbytes(rng.randint(1, 20))
        try:
            records = decode_batch(bytes(blob))
        except SerializationError:
            continue
        for key_group, timestamp, payload in records:
            assert key_group is None or 0 <= key_group < 65536
            assert timestamp is None or isinstance(timestamp, int)
            assert type(payload) is bytes


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

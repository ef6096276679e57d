"""The bytes keyed operators keep in RocksDB are a durable format (docs/formats.md, "Keyed state"):
a savepoint written by an earlier Weir restores into a later one. The literal entries below were
written by the operators before ``weir.core.state_layout`` took the layout over; the operators must
still write exactly them, and still read them back."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.unit.conftest import StartOperator
from weir.core.key_samples import KEY_SAMPLE_STATE, KeySample, sample_slot
from weir.core.process_functions import StateTtlConfig
from weir.core.state_layout import dump_value, load_value
from weir.core.windows import TumblingEventTimeWindows
from weir.operators.keyed import KeyedProcessContext, KeyedProcessOperator, ReduceOperator
from weir.operators.windows import WindowAggregateOperator
from weir.taskmanager.state import RocksDBStateBackend

NOW_MS = 1_700_000_000_000

WINDOW_ENTRIES = {
    b"w\x00\x00Gwin\x00\x00\x00\x00\x05alice\x00\x00\x00\x00\x00\x00\x00\n\x00\x00\x00\x00\x00\x00\x00\x14": (
        b"\x80\x05\x95\r\x00\x00\x00\x00\x00\x00\x00\x8c\x05alice\x94K\x07\x86\x94."
    ),
}
"""Window [10, 20) of key "alice" (key group 71) of operator "w", its accumulator 7."""

REDUCE_ENTRIES = {b"r\x00\x00freduce\x00\x00\x00\x00\x00\x00\x00\x00\x05": b"\x80\x05K\x05."}
"""Key 5 (key group 102) of the reduce "r": the reduced value 5."""

PROCESS_ENTRIES = {
    b"p\x00\x00]all\x00k": b"\x80\x05\x95\x06\x00\x00\x00\x00\x00\x00\x00]\x94K\x03a.",
    b"p\x00\x00]count\x00k": (
        b"\x80\x05\x95?\x00\x00\x00\x00\x00\x00\x00\x8c\x1cweir.operators.process_state\x94\x8c\x08TtlValue"
        b"\x94\x93\x94)\x81\x94]\x94(K\x03\x8a\x06\x00h\xe5\xcf\x8b\x01eb."
    ),
    b"p\x00\x00]seen\x00\x00\x00\x00\x01k\x00\x00\x00\x00\x00\x00\x00\x0c": (
        b"\x80\x05\x95@\x00\x00\x00\x00\x00\x00\x00\x8c\x1cweir.operators.process_state\x94\x8c\x08MapEntry"
        b"\x94\x93\x94)\x81\x94]\x94(K\x0c\x8c\x06twelve\x94eb."
    ),
    b"p\x00\x00]timers.event_time\x00\x00\x00\x00\x01k\x00\x00\x00\x00\x00\x00\x03\xe8": (
        b"\x80\x05\x95\x07\x00\x00\x00\x00\x00\x00\x00\x8c\x01k\x94\x85\x94."
    ),
    b"p\x00\x00]timers.processing_time\x00\x00\x00\x00\x01k\x00\x00\x00\x00\x00\x00\x07\xd0": (
        b"\x80\x05\x95\x07\x00\x00\x00\x00\x00\x00\x00\x8c\x01k\x94\x85\x94."
    ),
}
"""Key "k" (key group 93) of the process function "p": a ListState [3], a ValueState 3 with a time to
live written at NOW_MS, a MapState entry 12 -> "twelve", an event-time timer at 1000 and a
processing-time timer at 2000."""


class Sum:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: tuple[str, int]) -> int:
        return acc + value[1]

    def result(self, key: str, start: int, end: int, acc: int) -> tuple[str, int, int, int]:
        return key, start, end, acc


TTL = StateTtlConfig(timedelta(seconds=60))


class Writes:
    """Writes one value of each state kind and two timers for the record's key."""

    def process_element(self, value: tuple[str, int], ctx: KeyedProcessContext, out: Any) -> None:
        ctx.value_state("count", ttl=TTL).update(value[1])
        ctx.map_state("seen").put(12, "twelve")
        ctx.list_state("all").add(value[1])
        ctx.timer_service().register_event_time_timer(1000)
        ctx.timer_service().register_processing_time_timer(2000)


class Reads:
    """Emits what the states of the record's key hold, and the key of each timer that fires."""

    def process_element(self, value: tuple[str, int], ctx: KeyedProcessContext, out: Any) -> None:
        out.collect(
            (ctx.value_state("count", ttl=TTL).value(), ctx.map_state("seen").items(), ctx.list_state("all").get())
        )

    def on_timer(self, timestamp: int, ctx: KeyedProcessContext, out: Any) -> None:
        out.collect(("timer", ctx.key, timestamp))


def raw_entries(backend: RocksDBStateBackend) -> dict[bytes, bytes]:
    """Every entry but the key samples (pinned on their own below: they hold the key function's
    fingerprint, which differs between Python versions)."""
    return {k: v for k, v in backend.db.items() if SAMPLE_MARK not in k}


SAMPLE_MARK = KEY_SAMPLE_STATE.encode() + b"\x00"


def samples(backend: RocksDBStateBackend) -> dict[bytes, KeySample]:
    return {k: KeySample.from_stored(load_value(v)) for k, v in backend.db.items() if SAMPLE_MARK in k}


def write_raw(backend: RocksDBStateBackend, entries: dict[bytes, bytes]) -> None:
    for key, value in entries.items():
        backend.db[key] = value


def test_the_operators_write_the_pinned_bytes(
    state_backend: RocksDBStateBackend,
    start_operator: StartOperator,
) -> None:
    window = WindowAggregateOperator(Sum(), lambda v: v[0], TumblingEventTimeWindows(10), 0)
    start_operator(window, uid="w")
    window.process(("alice", 7), 12)
    window.snapshot_state(1)
    reduce = ReduceOperator(lambda a, b: a + b, lambda v: v)
    start_operator(reduce, uid="r")
    reduce.process(5, None)
    reduce.snapshot_state(1)
    process = KeyedProcessOperator(Writes(), lambda v: v[0], clock=lambda: NOW_MS)
    start_operator(process, uid="p")
    process.process(("k", 3), 5)
    process.snapshot_state(1)
    assert raw_entries(state_backend) == WINDOW_ENTRIES | REDUCE_ENTRIES | PROCESS_ENTRIES
    # One key sample per operator: the record as pickled and its key, in the key's key group, slot
    # adler32(key bytes) % 8.
    found = {
        k: (s.input_index, s.key_bytes, s.key_repr, load_value(s.record)) for k, s in samples(state_backend).items()
    }
    assert found == {
        b"w\x00\x00Gweir.key-samples\x00\x07": (0, b"alice", "'alice'", ("alice", 7)),
        b"r\x00\x00fweir.key-samples\x00" + sample_slot(b"\x00" * 7 + b"\x05"): (0, b"\x00" * 7 + b"\x05", "5", 5),
        b"p\x00\x00]weir.key-samples\x00" + sample_slot(b"k"): (0, b"k", "'k'", ("k", 3)),
    }


def test_a_key_sample_reads_the_pinned_bytes() -> None:
    """A stored sample is a pickle of built-in values only (docs/formats.md, "Key samples")."""
    stored = (
        b"\x80\x05\x95Z\x00\x00\x00\x00\x00\x00\x00(\x8c\x11weir.key-sample/1\x94K\x00\x8c\x1060309369be447031"
        b"\x94C\x05alice\x94\x8c\x07'alice'\x94C\x18\x80\x05\x95\r\x00\x00\x00\x00\x00\x00\x00\x8c\x05alice\x94K\x07"
        b"\x86\x94.\x94t\x94."
    )
    sample = KeySample.from_stored(load_value(stored))
    assert sample == KeySample(0, "60309369be447031", b"alice", "'alice'", dump_value(("alice", 7)))
    assert dump_value(sample.to_stored()) == stored


def test_a_window_reads_the_pinned_bytes(state_backend: RocksDBStateBackend, start_operator: StartOperator) -> None:
    write_raw(state_backend, WINDOW_ENTRIES)
    window = WindowAggregateOperator(Sum(), lambda v: v[0], TumblingEventTimeWindows(10), 0)
    out = start_operator(window, uid="w")
    window.process(("alice", 2), 15)
    window.process_watermark(19)
    assert out.values == [("alice", 10, 20, 9)]
    window.snapshot_state(2)
    assert raw_entries(state_backend) == {}  # fired and dropped


def test_a_reduce_reads_the_pinned_bytes(state_backend: RocksDBStateBackend, start_operator: StartOperator) -> None:
    write_raw(state_backend, REDUCE_ENTRIES)
    reduce = ReduceOperator(lambda a, b: a + b, lambda v: v)
    out = start_operator(reduce, uid="r")
    reduce.process(5, None)
    assert out.values == [10]


def test_a_process_function_reads_the_pinned_bytes(
    state_backend: RocksDBStateBackend, start_operator: StartOperator
) -> None:
    write_raw(state_backend, PROCESS_ENTRIES)
    process = KeyedProcessOperator(Reads(), lambda v: v[0], clock=lambda: NOW_MS + 1_000)
    out = start_operator(process, uid="p")
    process.process(("k", 0), 5)
    assert out.take() == [((3, [(12, "twelve")], [3]), 5)]
    process.process_watermark(1000)
    process.on_processing_time(2000)
    assert out.values == [("timer", "k", 1000), ("timer", "k", 2000)]

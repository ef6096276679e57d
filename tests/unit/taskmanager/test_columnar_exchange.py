"""A RecordWriter on a columnar edge: record batches partitioned by key group on arrays, buffered by
rows, sent as Arrow IPC to a remote channel and as the batches themselves to a local one."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pytest

from tests.unit.taskmanager.fakes import FakeChannel
from weir.core.columnar import FieldKey, Schema, encode_ipc, is_batch
from weir.core.errors import ProtocolError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import KeyEncoder
from weir.taskmanager.network import writer as record_writer
from weir.taskmanager.network.codec import (
    LocalBuffer,
    decode_message_records,
    encode_into,
    encode_records,
    read_buffer,
    watermark_message,
)
from weir.taskmanager.network.output_channels import LocalOutputChannel
from weir.taskmanager.network.writer import COLUMNAR_ROWS_PER_BUFFER, RecordWriter
from weir.taskmanager.partitioners import BroadcastPartitioner, KeyGroupPartitioner, RebalancePartitioner
from weir.wire import taskmanager_pb2

MAX_PARALLELISM = 128
DECODER = Schema.of({"key": str, "n": int, "ts": int}).decoder("ts")


def batch(rows: list[tuple[str, int]]) -> pa.RecordBatch:
    return DECODER.batch([[k for k, _ in rows], [n for _, n in rows], [n for _, n in rows]])


def columnar_writer(channels: list[Any], partitioner: Any, key_selector: Any = None) -> RecordWriter:
    return RecordWriter(
        channels,
        partitioner,
        key_selector,
        KeyEncoder(MAX_PARALLELISM).key_group,
        flush_interval_s=3600.0,
        columnar=True,
        max_parallelism=MAX_PARALLELISM,
    )


def rows_of(channel: FakeChannel) -> list[dict[str, Any]]:
    out = []
    for msg in channel.sent:
        for value in read_buffer(msg).values:
            assert is_batch(value)
            out += value.to_pylist()
    return out


def owner_of(key: str, parallelism: int) -> int:
    return KeyGroupPartitioner(MAX_PARALLELISM, parallelism).select_channels(
        KeyEncoder(MAX_PARALLELISM).key_group(key)
    )[0]


class FakeLocalChannel(LocalOutputChannel):
    """A LocalOutputChannel (so the writer hands it the batches unencoded) that keeps what it is sent."""

    def __init__(self) -> None:  # no gate, no thread
        self.sent: list[Any] = []

    def send(self, buffer: Any) -> None:
        self.sent.append(buffer)


def test_every_row_reaches_the_channel_owning_its_key_group_in_order() -> None:
    rng = random.Random(3)
    channels = [FakeChannel() for _ in range(4)]
    partitioner = KeyGroupPartitioner(MAX_PARALLELISM, 4)
    writer = columnar_writer(channels, partitioner, FieldKey("key"))
    emitted: list[tuple[str, int]] = []
    for _ in range(40):
        rows = [(f"user-{rng.randrange(37)}", len(emitted) + i) for i in range(rng.randrange(0, 200))]
        emitted += rows
        writer.emit(batch(rows), None)
    writer.flush()
    encoder = KeyEncoder(MAX_PARALLELISM)
    seen: dict[str, set[int]] = defaultdict(set)
    for index, channel in enumerate(channels):
        received = rows_of(channel)
        for row in received:
            seen[row["key"]].add(index)
            assert partitioner.select_channels(encoder.key_group(row["key"])) == (index,)
        per_key: dict[str, list[int]] = defaultdict(list)
        for row in received:
            per_key[row["key"]].append(row["n"])
        assert all(ns == sorted(ns) for ns in per_key.values())  # order per key kept
    assert all(len(owners) == 1 for owners in seen.values()) and len(seen) == 37
    assert sorted(row["n"] for c in channels for row in rows_of(c)) == list(range(len(emitted)))
    assert writer.records_out == len(emitted)
    for channel in channels:
        assert sum(msg.record_count for msg in channel.sent) == len(rows_of(channel))
        assert all(msg.encoding == taskmanager_pb2.RECORD_ENCODING_ARROW_IPC for msg in channel.sent)


def test_a_channel_sends_a_buffer_once_it_holds_the_rows_per_buffer() -> None:
    channels = [FakeChannel(), FakeChannel()]
    writer = columnar_writer(channels, KeyGroupPartitioner(MAX_PARALLELISM, 2), FieldKey("key"))
    key = next(k for i in range(100) if owner_of(k := f"key-{i}", 2) == 0)
    chunk = COLUMNAR_ROWS_PER_BUFFER // 4
    for i in range(3):
        writer.emit(batch([(key, i)] * chunk), None)
    assert channels[0].sent == [] and writer.buffered()
    writer.emit(batch([(key, 3)] * (chunk + 5)), None)  # over the limit: the four batches go as one buffer
    (msg,) = channels[0].sent
    assert msg.record_count == COLUMNAR_ROWS_PER_BUFFER + 5
    (one,) = read_buffer(msg).values
    assert one.num_rows == COLUMNAR_ROWS_PER_BUFFER + 5  # one IPC batch of the buffered batches
    assert not writer.buffered()
    writer.emit(batch([(key, 9)]), None)
    writer.flush()
    assert [m.record_count for m in channels[0].sent] == [COLUMNAR_ROWS_PER_BUFFER + 5, 1]
    assert channels[1].sent == []


def test_a_smaller_rows_per_buffer_is_honoured_per_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_writer, "COLUMNAR_ROWS_PER_BUFFER", 10)
    channels = [FakeChannel() for _ in range(3)]
    writer = columnar_writer(channels, BroadcastPartitioner(3))
    for i in range(7):
        writer.emit(batch([("k", i), ("k", i)]), None)
    for channel in channels:
        assert [m.record_count for m in channel.sent] == [10]
        assert [r["n"] for r in rows_of(channel)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert writer.records_out == 14  # rows emitted, not rows times channels


def test_a_remote_buffer_is_arrow_ipc_and_reads_back_as_the_batch() -> None:
    channel = FakeChannel()
    writer = columnar_writer([channel], RebalancePartitioner(SubtaskIndex(0), 1))
    first, second = batch([("a", 1), ("b", 2)]), batch([("c", 3)])
    writer.emit(first, None)
    writer.emit(second, None)
    writer.broadcast_event(watermark_message(77))
    (msg,) = channel.sent
    assert msg.encoding == taskmanager_pb2.RECORD_ENCODING_ARROW_IPC
    assert msg.record_count == 3 and msg.watermark == 77
    values, timestamps = decode_message_records(msg)
    assert timestamps == [None]
    (decoded,) = values
    assert decoded.to_pylist() == first.to_pylist() + second.to_pylist()
    assert decoded.schema.metadata == first.schema.metadata  # the event-time column travels with it
    buffer = read_buffer(msg)
    assert buffer.size_bytes == len(msg.records) > 0
    assert buffer.values[0].equals(decoded)
    assert type(buffer.event).__name__ == "WatermarkEvent"


def test_a_local_buffer_carries_its_batches_as_one_and_counts_their_rows() -> None:
    local = FakeLocalChannel()
    writer = columnar_writer([local], RebalancePartitioner(SubtaskIndex(0), 1))
    first, second = batch([("a", 1), ("b", 2)]), batch([("c", 3)])
    writer.emit(first, None)
    writer.emit(second, None)
    writer.flush()
    (buffer,) = local.sent
    assert isinstance(buffer, LocalBuffer)
    assert len(buffer.values) == 1 and buffer.timestamps == [None] and buffer.message.record_count == 3
    assert buffer.values[0].equals(pa.concat_batches([first, second]))  # the rows in order, one batch
    assert buffer.message.records == b""
    assert read_buffer(buffer).values == buffer.values


def test_a_columnar_edge_keyed_by_a_function_is_refused() -> None:
    with pytest.raises(ValueError, match="a columnar edge is keyed by a field name, not by"):
        columnar_writer([FakeChannel(), FakeChannel()], KeyGroupPartitioner(MAX_PARALLELISM, 2), lambda r: r["key"])


def test_a_parallelism_one_hash_edge_passes_the_batch_through() -> None:
    """The runtime gives a hash edge to one channel no key selector: the batch goes as it is."""
    local = FakeLocalChannel()
    writer = columnar_writer([local], KeyGroupPartitioner(MAX_PARALLELISM, 1), None)
    b = batch([("a", 1), ("b", 2), ("c", 3)])
    writer.emit(b, None)
    writer.flush()
    (buffer,) = local.sent
    assert buffer.values[0] is b and buffer.message.record_count == 3
    remote = FakeChannel()
    writer = columnar_writer([remote], KeyGroupPartitioner(MAX_PARALLELISM, 1), None)
    writer.emit(b, None)
    writer.flush()
    assert rows_of(remote) == b.to_pylist()


def test_a_keyed_edge_to_one_channel_also_keeps_every_row() -> None:
    channel = FakeChannel()
    writer = columnar_writer([channel], KeyGroupPartitioner(MAX_PARALLELISM, 1), FieldKey("key"))
    b = batch([("a", 1), ("b", 2), ("a", 3)])
    writer.emit(b, None)
    writer.flush()
    assert rows_of(channel) == b.to_pylist()


def test_rebalance_sends_whole_batches_round_robin() -> None:
    channels = [FakeChannel(), FakeChannel()]
    writer = columnar_writer(channels, RebalancePartitioner(SubtaskIndex(0), 2))
    for i in range(4):
        writer.emit(batch([("k", i)] * (i + 1)), None)
    writer.flush()
    assert sorted(len(rows_of(c)) for c in channels) == [4, 6]
    assert sorted(r["n"] for c in channels for r in rows_of(c)) == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]


def test_encode_into_and_decode_message_records_pick_the_encoding_by_value() -> None:
    msg = taskmanager_pb2.DataMessage()
    encode_into(msg, [{"a": 1}, "b"], [5, None])
    assert msg.encoding == taskmanager_pb2.RECORD_ENCODING_PICKLE and msg.record_count == 2
    assert decode_message_records(msg) == ([{"a": 1}, "b"], [5, None])
    assert decode_message_records(taskmanager_pb2.DataMessage()) == ([], [])
    unknown = taskmanager_pb2.DataMessage(records=encode_ipc([batch([("a", 1)])]), record_count=1, encoding=99)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="unknown record encoding 99"):
        decode_message_records(unknown)
    plain = taskmanager_pb2.DataMessage(records=encode_records([1], [2]), record_count=1)
    assert read_buffer(plain).values == [1]

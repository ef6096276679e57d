"""The in-flight document of an unaligned checkpoint: format 3 names the edge each output's buffers
were queued on; formats 2 and 1 are still read, and say so."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from weir.core.errors import SerializationError
from weir.core.ids import ChannelIndex, CheckpointId
from weir.core.inflight_state import (
    INFLIGHT_FORMAT,
    InflightState,
    InputOrigin,
    OutputTarget,
    decode_inflight,
    encode_inflight,
    queued_output_targets,
)
from weir.wire.taskmanager_pb2 import DataMessage

TOTALS = OutputTarget("totals", 0, "src")
LATE = OutputTarget("late", 1, "win", "late-events")


def blob(count: int) -> bytes:
    return DataMessage(records=b"r" * count, record_count=count).SerializeToString()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def count_records(_blob: bytes) -> int:
    raise AssertionError("only a format-1 buffer is counted")


def test_format_3_names_the_edge_of_every_output_and_round_trips() -> None:
    state = InflightState(
        CheckpointId(7),
        {ChannelIndex(0): (blob(1),)},
        {(0, 0): (blob(2),), (0, 1): (blob(3),), (1, 0): (blob(4),)},
        {ChannelIndex(0): InputOrigin(0, "events")},
        {0: TOTALS, 1: LATE},
    )
    data = encode_inflight(state)
    document = json.loads(data)
    assert document["format"] == INFLIGHT_FORMAT == 3
    fields = ("output", "channel", "consumer", "input", "operator", "side_output")
    assert [tuple(e[f] for f in fields) for e in document["output"]] == [
        (0, 0, "totals", 0, "src", None),
        (0, 1, "totals", 0, "src", None),
        (1, 0, "late", 1, "win", "late-events"),
    ]
    decoded = decode_inflight(data, "test", count_records)
    assert decoded == state and decoded.targets_named
    assert queued_output_targets(data, "test") == {0: TOTALS, 1: LATE}


def test_output_buffers_without_their_edge_are_never_written() -> None:
    with pytest.raises(SerializationError, match=r"output\(s\) \[1\] without the edge"):
        encode_inflight(
            InflightState(CheckpointId(7), {}, {(0, 0): (blob(1),), (1, 0): (blob(1),)}, targets={0: TOTALS})
        )


def _format_3(*outputs: dict[str, Any]) -> bytes:
    return json.dumps({"format": 3, "checkpoint_id": 7, "input": [], "output": list(outputs)}).encode()


ENTRY = {"output": 0, "channel": 0, "consumer": "totals", "input": 0, "operator": "src", "side_output": None}


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ([{k: v for k, v in ENTRY.items() if k != "consumer"} | {"buffers": []}], "KeyError: 'consumer'"),
        ([ENTRY | {"input": "0", "buffers": []}], "expected int"),
        (
            [ENTRY | {"buffers": []}, ENTRY | {"channel": 1, "consumer": "archive", "buffers": []}],
            "output 0 names two edges",
        ),
        ([ENTRY | {"buffers": []}, ENTRY | {"buffers": []}], "listed twice"),
    ],
)
def test_a_format_3_output_entry_that_does_not_name_one_edge_is_malformed(
    entries: list[dict[str, Any]], error: str
) -> None:
    for read in (lambda d: decode_inflight(d, "of task src#0", count_records), lambda d: queued_output_targets(d, "x")):
        with pytest.raises(SerializationError, match=f"malformed: .*{error}"):
            read(_format_3(*entries))


def test_a_format_2_document_is_read_with_its_outputs_named_by_index_only() -> None:
    old = json.dumps(
        {
            "format": 2,
            "checkpoint_id": 7,
            "input": [],
            "output": [
                {"output": 0, "channel": 0, "buffers": [b64(blob(1))]},
                {"output": 1, "channel": 0, "buffers": []},
            ],
        }
    ).encode()
    decoded = decode_inflight(old, "test", count_records)
    assert decoded.outputs == {(0, 0): (blob(1),), (1, 0): ()}
    assert decoded.targets == {} and not decoded.targets_named
    assert queued_output_targets(old, "test") == {0: None}  # output 1 holds nothing
    with pytest.raises(SerializationError, match="without the edge"):
        encode_inflight(decoded)


def test_a_format_1_document_has_no_outputs_and_its_record_blobs_are_counted() -> None:
    old = json.dumps({"format": 1, "checkpoint_id": 3, "channels": [{"channel": 1, "buffers": [b64(b"abc")]}]})
    decoded = decode_inflight(old.encode(), "test", len)
    assert decoded.channels == {1: (DataMessage(records=b"abc", record_count=3).SerializeToString(),)}
    assert queued_output_targets(old.encode(), "test") == {}
    with pytest.raises(SerializationError, match="format 9; this Weir reads formats"):
        queued_output_targets(b'{"format": 9}', "test")

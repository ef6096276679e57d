"""Checkpoint metadata: a versioned JSON document; another format or a damaged one is refused by key."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import pytest

from weir.core.checkpointing import CheckpointKind
from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing.metadata import ReadMetadata, decode_metadata, encode_metadata, read_metadata
from weir.jobmanager.checkpointing.pending import StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.errors import CheckpointProtocolError

FOLDER = "job-1/savepoints/sp-00000000000000000007/"
KEY = FOLDER + "_metadata"


def checkpoint() -> CompletedCheckpoint:
    job = JobId("job-1")
    return CompletedCheckpoint(
        checkpoint_id=CheckpointId(7),
        job_id=job,
        trigger_timestamp=1764578000.25,
        completion_timestamp=1764578001.5,
        task_states=(
            TaskStateHandle(
                TaskId(job, OperatorUid("sum"), SubtaskIndex(0)),
                objects=(
                    StateObject(FOLDER + "db/tm/db/000001/000009.sst", 900),
                    StateObject(FOLDER + "tasks/sum/00000", 16),
                ),
                inline_payload=b'{"format":1}',
            ),
            TaskStateHandle(TaskId(job, OperatorUid("sink"), SubtaskIndex(1)), sink_precommit=b"\x00txn"),
        ),
        metadata_key=KEY,
        kind=CheckpointKind.SAVEPOINT,
    )


def test_metadata_round_trips_and_is_json_with_a_format() -> None:
    data = encode_metadata(checkpoint())
    assert json.loads(data)["format"] == 2
    assert decode_metadata(data, KEY) == checkpoint()


def test_metadata_names_the_leader_term_that_wrote_it_and_format_1_reads_as_term_0() -> None:
    written = replace(checkpoint(), leader_term=5)
    data = encode_metadata(written)
    assert json.loads(data)["leader_term"] == 5 and decode_metadata(data, KEY) == written
    older = json.loads(data)
    older["format"] = 1
    del older["leader_term"]
    assert decode_metadata(json.dumps(older).encode(), KEY) == checkpoint()
    missing = json.loads(data)
    del missing["leader_term"]
    with pytest.raises(SerializationError, match="is malformed: KeyError"):
        decode_metadata(json.dumps(missing).encode(), KEY)


def test_a_savepoint_s_keys_are_relative_to_its_folder_so_it_can_be_moved() -> None:
    data = encode_metadata(checkpoint())
    keys = [o["key"] for t in json.loads(data)["tasks"] for o in t["objects"]]
    assert keys == ["db/tm/db/000001/000009.sst", "tasks/sum/00000"]
    moved = decode_metadata(data, "elsewhere/upgrade-1/_metadata")
    assert moved.object_keys == {
        "elsewhere/upgrade-1/db/tm/db/000001/000009.sst",
        "elsewhere/upgrade-1/tasks/sum/00000",
    }


def test_a_savepoint_referring_outside_its_folder_is_refused() -> None:
    outside = checkpoint().task_states[0]
    bad = CompletedCheckpoint(
        CheckpointId(7),
        JobId("job-1"),
        1.0,
        2.0,
        (
            TaskStateHandle(
                outside.task_id, objects=(StateObject("job-1/shared/tm/db/7-000009.sst", 900, reused=True),)
            ),
        ),
        KEY,
        CheckpointKind.SAVEPOINT,
    )
    with pytest.raises(CheckpointProtocolError, match="lies outside its folder"):
        encode_metadata(bad)


def test_an_unknown_format_is_refused_naming_the_key() -> None:
    document = json.loads(encode_metadata(checkpoint()))
    document["format"] = 99
    with pytest.raises(
        SerializationError, match=f"checkpoint metadata {KEY} has format 99; this Weir reads formats \\[1, 2\\]"
    ):
        decode_metadata(json.dumps(document).encode(), KEY)


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (pickle.dumps(checkpoint()), "is not a JSON document"),
        (b'"text"', "is not a JSON object"),
        (b'{"format": 1}', "is malformed: KeyError"),
        (encode_metadata(checkpoint()).replace(b'"savepoint"', b'"incremental"'), "is malformed: ValueError"),
        (encode_metadata(checkpoint()).replace(b'"reused":false', b'"reused":1'), "is malformed: TypeError"),
        (
            encode_metadata(checkpoint()).replace(
                b'"vertex_uid":"sink","subtask":1', b'"vertex_uid":"sum","subtask":0'
            ),
            "two states for one task",
        ),
    ],
)
def test_malformed_metadata_is_refused_naming_the_key(data: bytes, complaint: str) -> None:
    with pytest.raises(SerializationError, match=complaint) as raised:
        decode_metadata(data, KEY)
    assert KEY in str(raised.value)


def test_a_full_checkpoint_reads_back_as_full_and_a_document_without_full_as_not_full() -> None:
    written = replace(checkpoint(), full=True, leader_term=2)
    data = encode_metadata(written)
    assert json.loads(data)["full"] is True and json.loads(data)["format"] == 2
    assert decode_metadata(data, KEY) == written
    before = json.loads(data)
    del before["full"]  # written by a Weir before the field: still format 2
    assert decode_metadata(json.dumps(before).encode(), KEY) == replace(written, full=False)


def test_full_must_be_a_bool() -> None:
    document = json.loads(encode_metadata(checkpoint()))
    document["full"] = "yes"
    with pytest.raises(SerializationError, match=f"checkpoint metadata {KEY} is malformed: TypeError"):
        decode_metadata(json.dumps(document).encode(), KEY)


def test_read_metadata_names_the_format_the_object_was_written_in() -> None:
    data = encode_metadata(checkpoint())
    assert read_metadata(data, KEY) == ReadMetadata(checkpoint(), 2)
    older = json.loads(data)
    older["format"] = 1
    del older["leader_term"], older["full"]
    assert read_metadata(json.dumps(older).encode(), KEY) == ReadMetadata(checkpoint(), 1)

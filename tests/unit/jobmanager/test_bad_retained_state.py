"""`weir run --from-checkpoint` (or a savepoint's path) given damaged state: metadata cut short or
not JSON, a task-state document that is garbage or of an unknown format version. Each is refused at
submit with one clear error naming the object, and no job is created."""

from __future__ import annotations

import json

import pytest

from tests.unit.jobmanager.conftest import Harness
from tests.unit.jobmanager.test_restoring import OLD, retained_checkpoint, submit
from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing.metadata import encode_metadata
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint


def metadata_key(h: Harness) -> str:
    return h.jm.paths.metadata(OLD, CheckpointId(3))


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # an upload cut short
        lambda data: b"\x00\x01 not json",
        lambda data: b"",
    ],
)
def test_damaged_metadata_is_refused_naming_the_object(harness: Harness, damage: object) -> None:
    path, _document = retained_checkpoint(harness)
    key = metadata_key(harness)
    harness.storage.put_bytes(key, damage(harness.storage.get_bytes(key)))  # type: ignore[operator]
    with pytest.raises(SerializationError) as raised:
        submit(harness, path)
    assert key in str(raised.value)
    assert not harness.jm.jobs


def with_task_state(h: Harness, payload: bytes) -> str:
    path, _document = retained_checkpoint(h)
    key = metadata_key(h)
    checkpoint = CompletedCheckpoint(
        CheckpointId(3),
        OLD,
        1.0,
        2.0,
        (TaskStateHandle(TaskId(OLD, OperatorUid("gen"), SubtaskIndex(0)), inline_payload=payload),),
        key,
    )
    h.storage.put_bytes(key, encode_metadata(checkpoint))
    return path


def test_a_garbage_task_state_document_is_refused_naming_the_task_and_the_checkpoint(harness: Harness) -> None:
    path = with_task_state(harness, b"garbage, not a task state")
    with pytest.raises(
        SerializationError, match="task state of task old-job/gen#0 in checkpoint 3 of job old-job"
    ) as raised:
        submit(harness, path)
    assert "is not a JSON document" in str(raised.value)
    assert not harness.jm.jobs


def test_a_task_state_of_an_unknown_format_version_is_refused_with_where_it_was(harness: Harness) -> None:
    path, document = retained_checkpoint(harness)
    newer = json.loads(document)
    newer["format"] = 99  # written by a later Weir
    path = with_task_state(harness, json.dumps(newer).encode())
    with pytest.raises(
        SerializationError, match="task state of task old-job/gen#0 in checkpoint 3 of job old-job"
    ) as raised:
        submit(harness, path)
    assert "has format 99; this Weir reads format" in str(raised.value)
    assert "restore it with the Weir version that wrote it" in str(raised.value)
    assert not harness.jm.jobs

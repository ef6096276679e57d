"""The task-state document: versioned JSON, never a pickle; operator bytes stored as they are."""

from __future__ import annotations

import json
import pickle

import pytest

from weir.core.broadcast_state import BroadcastStateRef, content_digest
from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, KeyGroup
from weir.core.keygroups import KeyGroupRange
from weir.core.state_schema import StoredSchema
from weir.core.task_state import (
    InlineOperatorState,
    StoredOperatorState,
    SubtaskLayout,
    TaskStateDocument,
    decode_task_state,
    encode_task_state,
    pack_operator_states,
    read_operator_states,
    relative_operator_state,
)


def document(**overrides: object) -> TaskStateDocument:
    fields: dict[str, object] = {
        "job_id": "job-1",
        "vertex_uid": "sink",
        "subtask": 1,
        "attempt": 2,
        "checkpoint_id": CheckpointId(42),
        "layout": SubtaskLayout(2, 128, KeyGroupRange(KeyGroup(64), KeyGroup(127)), ("sink", "map"), ()),
        "operator_state": InlineOperatorState({"sink": b"\x00\xffbytes", "map": b""}),
        "keyed_state": {"taskmanager_id": "tm-1"},
    }
    fields.update(overrides)
    return TaskStateDocument(**fields)  # type: ignore[arg-type]


def test_an_inline_document_round_trips() -> None:
    original = document()
    data = encode_task_state(original)
    assert json.loads(data)["format"] == 2
    assert decode_task_state(data, "in the test") == original


def test_a_stored_document_round_trips_and_reads_each_operator_back() -> None:
    states = {"sink": b"s" * 30_000, "source": b"offsets"}
    handle, blob = pack_operator_states(states, "job-1/checkpoints/chk-42/tasks/sink/00001")
    original = document(operator_state=handle, keyed_state=None)
    decoded = decode_task_state(encode_task_state(original), "in the test")
    assert decoded == original
    assert read_operator_states(decoded.operator_state, {handle.key: blob}.__getitem__) == states


def test_a_stored_object_of_another_size_is_refused() -> None:
    handle, blob = pack_operator_states({"sink": b"abc"}, "k")
    with pytest.raises(SerializationError, match="operator state object k is 2 bytes, its handle says 3"):
        read_operator_states(handle, lambda _key: blob[:2])


def test_an_unknown_format_is_refused_with_where_it_was() -> None:
    data = json.loads(encode_task_state(document()))
    data["format"] = 4
    with pytest.raises(
        SerializationError, match=r"task state of sink#1 has format 4; this Weir reads formats \[2, 3\]"
    ):
        decode_task_state(json.dumps(data).encode(), "of sink#1")


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (pickle.dumps({"format": 2}), "is not a JSON document"),
        (b'{"format": 1, "task": {}}', r"has format 1; this Weir reads formats \[2, 3\]"),
        (b"[1]", "is not a JSON object"),
        (b'{"format": 2, "task": {}}', "is malformed"),
        (
            encode_task_state(document()).replace(b'"subtask":1', b'"subtask":"1"'),
            "is malformed: TypeError: expected int",
        ),
        (encode_task_state(document()).replace(b'"inline"', b'"both"'), "is malformed"),
        (encode_task_state(document()).replace(b"AP9ieXRlcw==", b"!!"), "is malformed"),
    ],
)
def test_a_malformed_document_is_refused(data: bytes, complaint: str) -> None:
    with pytest.raises(SerializationError, match=complaint):
        decode_task_state(data, "of sink#1")


def test_the_layout_carries_each_keyed_operators_state_schemas() -> None:
    layout = SubtaskLayout(
        2,
        128,
        KeyGroupRange(KeyGroup(0), KeyGroup(63)),
        ("window-count-sum", "sink"),
        ("window-count-sum",),
        {"window-count-sum": (StoredSchema("win", "pickle", 2),)},
    )
    data = encode_task_state(document(layout=layout))
    assert json.loads(data)["layout"]["state_schemas"] == {
        "window-count-sum": [{"name": "win", "serializer": "pickle", "version": 2}]
    }
    assert decode_task_state(data, "in the test").layout == layout


def test_a_document_without_state_schemas_still_decodes_and_names_none() -> None:
    """Written before schemas were recorded: every state counts as version 1 pickle on restore."""
    data = json.loads(encode_task_state(document()))
    del data["layout"]["state_schemas"]
    decoded = decode_task_state(json.dumps(data).encode(), "in the test")
    assert decoded.layout.state_schemas == {}
    assert decoded == document()


@pytest.mark.parametrize(
    "schemas",
    [[], {"op": {"name": "win"}}, {"op": [{"name": "win", "serializer": "pickle", "version": "2"}]}, {"op": [{}]}],
)
def test_malformed_state_schemas_are_refused(schemas: object) -> None:
    data = json.loads(encode_task_state(document()))
    data["layout"]["state_schemas"] = schemas
    with pytest.raises(SerializationError, match="is malformed"):
        decode_task_state(json.dumps(data).encode(), "of sink#1")


RULES = b"rules \x00\xff" * 3


def broadcast_ref(data: bytes = RULES, key_prefix: str = "job-1/checkpoints/chk-42/") -> BroadcastStateRef:
    digest = content_digest(data)
    return BroadcastStateRef("enrich", f"{key_prefix}broadcast/enrich/{digest}", len(data), digest)


@pytest.mark.parametrize("stored", [False, True], ids=["inline", "object"])
def test_a_document_with_broadcast_state_is_format_3_and_round_trips(stored: bool) -> None:
    ref = broadcast_ref()
    handle: InlineOperatorState | StoredOperatorState
    objects = {ref.key: RULES}
    if stored:
        handle, blob = pack_operator_states(
            {"sink": b"s"}, "job-1/checkpoints/chk-42/tasks/sink/00001", {"enrich": ref}
        )
        objects[handle.key] = blob
    else:
        handle = InlineOperatorState({"sink": b"s"}, {"enrich": ref})
    original = document(operator_state=handle)
    data = encode_task_state(original)
    assert json.loads(data)["format"] == 3 and b"rules" not in data
    decoded = decode_task_state(data, "in the test")
    assert decoded == original and decoded.operator_state_uids == ("sink", "enrich")
    assert read_operator_states(decoded.operator_state, objects.__getitem__) == {"sink": b"s", "enrich": RULES}


def test_a_format_2_document_naming_broadcast_state_is_refused() -> None:
    data = json.loads(encode_task_state(document(operator_state=InlineOperatorState({}, {"enrich": broadcast_ref()}))))
    data["format"] = 2
    with pytest.raises(
        SerializationError, match="is malformed: ValueError: operator_state.broadcast is written in format 3"
    ):
        decode_task_state(json.dumps(data).encode(), "of sink#1")


@pytest.mark.parametrize("found", [RULES[:-1], RULES[:-1] + b"!"], ids=["truncated", "replaced"])
def test_a_broadcast_state_object_that_is_not_its_content_is_refused(found: bytes) -> None:
    ref = broadcast_ref()
    with pytest.raises(
        SerializationError, match=f"broadcast state object {ref.key} of operator 'enrich' does not hold"
    ):
        read_operator_states(InlineOperatorState({}, {"enrich": ref}), lambda _key: found)


def test_a_savepoints_broadcast_state_key_is_relative_to_its_folder() -> None:
    folder = "job-1/savepoints/sp-43/"
    ref = broadcast_ref(key_prefix=folder)
    relative = relative_operator_state(InlineOperatorState({}, {"enrich": ref}), folder)
    assert relative.broadcast["enrich"].key == f"broadcast/enrich/{ref.sha256}"
    with pytest.raises(SerializationError, match="lies outside the savepoint folder"):
        relative_operator_state(InlineOperatorState({}, {"enrich": broadcast_ref()}), folder)

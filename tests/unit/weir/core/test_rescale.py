"""Which old subtasks' state each new subtask takes when a retained checkpoint is restored at another
parallelism, and the checks that refuse a restore that would lose or misplace state."""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import replace

import pytest

from weir.core.errors import SerializationError
from weir.core.ids import CheckpointId, KeyGroup, SubtaskIndex
from weir.core.inflight_state import InflightState, OutputTarget, encode_inflight
from weir.core.keygroups import KeyGroupRange, key_group_range_for_subtask, subtask_for_key_group
from weir.core.rescale import (
    StateAssignmentError,
    check_state_assignment,
    inherited_documents,
    key_group_sources,
    stateful_operator_uids,
)
from weir.core.task_state import (
    InlineOperatorState,
    StoredOperatorState,
    SubtaskLayout,
    TaskStateDocument,
    pack_operator_states,
)
from weir.wire.taskmanager_pb2 import DataMessage

MAX_PARALLELISM = 128


def ranges(parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> dict[int, KeyGroupRange]:
    return {s: key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(s)) for s in range(parallelism)}


@pytest.mark.parametrize(("old", "new"), list(itertools.product(range(1, 9), repeat=2)))
def test_every_key_group_of_a_new_subtask_comes_from_exactly_the_old_subtask_that_owned_it(old: int, new: int) -> None:
    old_ranges = ranges(old)
    taken: list[int] = []
    for subtask, new_range in ranges(new).items():
        sources = key_group_sources(new_range, old_ranges)
        # Exactly the old subtasks whose ranges overlap, each with the overlapping part, in order.
        overlapping = [s for s, r in old_ranges.items() if r.intersection(new_range) is not None]
        assert [source.old_subtask for source in sources] == overlapping
        covered = [kg for source in sources for kg in source.key_groups]
        assert covered == list(new_range), f"new subtask {subtask} of {new}"
        for source in sources:
            for kg in source.key_groups:
                assert subtask_for_key_group(MAX_PARALLELISM, old, KeyGroup(kg)) == source.old_subtask
        taken.extend(covered)
    # The new subtasks together take every key group once: none dropped, none restored twice.
    assert sorted(taken) == list(range(MAX_PARALLELISM))


def test_old_ranges_with_a_gap_are_refused() -> None:
    old = {0: KeyGroupRange(KeyGroup(0), KeyGroup(10)), 1: KeyGroupRange(KeyGroup(20), KeyGroup(127))}
    with pytest.raises(SerializationError, match="leave key groups 11..19 uncovered"):
        key_group_sources(KeyGroupRange(KeyGroup(0), KeyGroup(63)), old)


def test_old_ranges_missing_the_end_are_refused() -> None:
    old = {0: KeyGroupRange(KeyGroup(0), KeyGroup(100))}
    with pytest.raises(SerializationError, match="leave key groups 101..127 uncovered"):
        key_group_sources(KeyGroupRange(KeyGroup(64), KeyGroup(127)), old)


def test_overlapping_old_ranges_are_refused() -> None:
    old = {0: KeyGroupRange(KeyGroup(0), KeyGroup(70)), 1: KeyGroupRange(KeyGroup(64), KeyGroup(127))}
    with pytest.raises(SerializationError, match="overlap"):
        key_group_sources(KeyGroupRange(KeyGroup(0), KeyGroup(127)), old)


def document(
    vertex: str,
    subtask: int,
    parallelism: int,
    operators: tuple[str, ...],
    keyed: tuple[str, ...] = (),
    states: dict[str, bytes] | None = None,
    max_parallelism: int = MAX_PARALLELISM,
) -> TaskStateDocument:
    return TaskStateDocument(
        job_id="old-job",
        vertex_uid=vertex,
        subtask=subtask,
        attempt=1,
        checkpoint_id=CheckpointId(7),
        layout=SubtaskLayout(
            parallelism,
            max_parallelism,
            key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(subtask)),
            operators,
            keyed,
        ),
        operator_state=InlineOperatorState(states or {}),
    )


def old_job(parallelism: int = 3, max_parallelism: int = MAX_PARALLELISM) -> list[TaskStateDocument]:
    """A source chained with a map, then a keyed window chained with two sinks."""
    docs = [document("src", s, parallelism, ("src", "map"), states={"src": b"offsets"}) for s in range(parallelism)]
    docs += [
        document(
            "win",
            s,
            parallelism,
            ("win", "sink"),
            keyed=("win",),
            states={"win": b"wm", "sink": b"txn"},
            max_parallelism=max_parallelism,
        )
        for s in range(parallelism)
    ]
    return docs


def test_stateful_operators_are_the_keyed_ones_and_those_with_operator_state() -> None:
    assert stateful_operator_uids(old_job()[0]) == {"src"}
    assert stateful_operator_uids(old_job()[3]) == {"win", "sink"}


def test_each_new_vertex_inherits_every_old_subtask_that_ran_one_of_its_operators() -> None:
    # The new job chains differently: the map moved to the window's vertex.
    assigned = inherited_documents({"src": ("src",), "map": ("map", "win", "sink")}, old_job())
    assert [(d.vertex_uid, d.subtask) for d in assigned["src"]] == [("src", 0), ("src", 1), ("src", 2)]
    assert [(d.vertex_uid, d.subtask) for d in assigned["map"]] == [
        ("src", 0),
        ("src", 1),
        ("src", 2),
        ("win", 0),
        ("win", 1),
        ("win", 2),
    ]


def check(docs: list[TaskStateDocument], new: set[str], *, allow: bool = False, max_p: int = MAX_PARALLELISM) -> None:
    check_state_assignment(docs, new, {"win"} & new, max_p, allow_non_restored_state=allow, where="checkpoint 7")


def test_a_restore_that_keeps_every_stateful_operator_passes() -> None:
    check(old_job(), {"src", "win", "sink"})  # the map has no state: the new job may drop it


def test_state_of_an_operator_the_new_job_lacks_is_refused_unless_allowed() -> None:
    with pytest.raises(StateAssignmentError, match=r"operator\(s\) sink that the new job does not have"):
        check(old_job(), {"src", "map", "win"})
    check(old_job(), {"src", "map", "win"}, allow=True)


def test_keyed_state_of_another_max_parallelism_is_refused() -> None:
    with pytest.raises(StateAssignmentError, match="split into 128 key groups .* max parallelism 256"):
        check(old_job(), {"src", "win", "sink"}, max_p=256)


def test_a_checkpoint_missing_a_subtask_is_refused() -> None:
    docs = [d for d in old_job() if (d.vertex_uid, d.subtask) != ("win", 1)]
    with pytest.raises(SerializationError, match=r"vertex 'win' ran 3 subtask\(s\), the checkpoint holds .* \[0, 2\]"):
        check(docs, {"src", "win", "sink"})


def test_records_in_flight_restore_only_into_the_same_operator_chain_even_when_allowed() -> None:
    docs = old_job()
    docs[4] = document("win", 1, 3, ("win", "sink"), keyed=("win",), states={"win": b"wm", "__inflight__": b"{}"})

    def check_chains(chains: dict[str, tuple[str, ...]], allow: bool = False) -> None:
        check_state_assignment(
            docs,
            {"src", "win", "sink"},
            {"win"},
            MAX_PARALLELISM,
            allow_non_restored_state=allow,
            where="c",
            new_chains=chains,
        )

    check_chains({"src": ("src", "map"), "win": ("win", "sink")})  # in-flight records are no operator's state
    for allow in (False, True):
        with pytest.raises(StateAssignmentError, match=r"win#1, whose operator chain the new job does not have"):
            check_chains({"src": ("src", "map"), "win": ("win",), "sink": ("sink",)}, allow)


# Records an unaligned checkpoint holds in flight in a task's output, by the consumer they were for.

TOTALS = OutputTarget("totals", 0, "src")
ARCHIVE = OutputTarget("archive", 0, "src")


def _queued_for(targets: dict[int, OutputTarget], edges: tuple[int, ...]) -> bytes:
    """The source's in-flight document with one buffer queued on channel 0 of each of ``edges``."""
    buffer = DataMessage(records=b"x", record_count=1).SerializeToString()
    return encode_inflight(InflightState(CheckpointId(7), {}, {(e, 0): (buffer,) for e in edges}, targets=targets))


def _format_2_queued(edges: tuple[int, ...]) -> bytes:
    """The same in the format written before output buffers named their consumer."""
    buffer = base64.b64encode(DataMessage(records=b"x", record_count=1).SerializeToString()).decode()
    output = [{"output": e, "channel": 0, "buffers": [buffer]} for e in edges]
    return json.dumps({"format": 2, "checkpoint_id": 7, "input": [], "output": output}).encode()


def _check_outputs(
    inflight: bytes | StoredOperatorState,
    new_outputs: tuple[OutputTarget, ...],
    *,
    allow: bool = False,
    objects: dict[str, bytes] | None = None,
) -> None:
    """Restore a source subtask holding ``inflight`` into a job whose source sends to ``new_outputs``."""
    doc = document("src", 0, 1, ("src",))
    state = InlineOperatorState({"__inflight__": inflight}) if isinstance(inflight, bytes) else inflight
    check_state_assignment(
        [replace(doc, operator_state=state)],
        {"src", *(t.consumer for t in new_outputs)},
        (),
        MAX_PARALLELISM,
        allow_non_restored_state=allow,
        where="checkpoint 7 of job old-job",
        new_chains={"src": ("src",), **{t.consumer: (t.consumer,) for t in new_outputs}},
        new_outputs={"src": new_outputs, **{t.consumer: () for t in new_outputs}},
        read_object=(objects or {}).__getitem__,
    )


def test_inflight_output_records_pass_when_their_consumer_is_still_connected_wherever_it_now_is() -> None:
    audit = OutputTarget("audit", 0, "src")
    _check_outputs(_queued_for({0: TOTALS, 1: ARCHIVE}, (0, 1)), (audit, ARCHIVE, TOTALS))


def test_inflight_output_records_for_a_consumer_the_new_job_lacks_are_refused_unless_allowed() -> None:
    old = _queued_for({0: TOTALS, 1: ARCHIVE}, (0,))
    other_input = OutputTarget("totals", 1, "src")  # the consumer now takes this edge on its second input
    for outputs in ((ARCHIVE,), (ARCHIVE, other_input)):
        with pytest.raises(StateAssignmentError) as refused:
            _check_outputs(old, outputs)
        message = str(refused.value)
        assert "\n" not in message
        assert "checkpoint 7 of job old-job" in message and "src#0" in message and "totals" in message
        assert "--allow-non-restored-state" in message
        _check_outputs(old, outputs, allow=True)
    _check_outputs(_queued_for({0: TOTALS, 1: ARCHIVE}, (1,)), (ARCHIVE,))  # nothing was queued for totals


def test_inflight_state_stored_in_an_object_is_read_for_the_check() -> None:
    old = _queued_for({0: TOTALS}, (0,))
    stored, blob = pack_operator_states({"__inflight__": old}, "chk-7/tasks/src/00000")
    with pytest.raises(StateAssignmentError, match="totals"):
        _check_outputs(stored, (ARCHIVE,), objects={"chk-7/tasks/src/00000": blob})


def test_the_old_inflight_output_format_is_read_only_into_a_task_with_that_one_output() -> None:
    _check_outputs(_format_2_queued((0,)), (TOTALS,))
    _check_outputs(_format_2_queued(()), (OutputTarget("audit", 0, "src"), TOTALS))  # no output buffers at all
    for edges, outputs in (((0,), (OutputTarget("audit", 0, "src"), TOTALS)), ((1,), (TOTALS,))):
        for allow in (False, True):
            with pytest.raises(StateAssignmentError) as refused:
                _check_outputs(_format_2_queued(edges), outputs, allow=allow)
            message = str(refused.value)
            assert "\n" not in message
            assert "checkpoint 7 of job old-job" in message and "src#0" in message
            assert "savepoint" in message

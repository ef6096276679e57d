"""Broadcast state (``a.connect(rules.broadcast()).process(...)``): written only from the broadcast
side, read on the element side and in timers, checkpointed and restored at any parallelism."""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.api import BroadcastProcessFunction, Environment, KeyedBroadcastProcessFunction
from weir.core.errors import JobDefinitionError
from weir.core.serde import dumps_value
from weir.core.task_state import decode_task_state, read_operator_states
from weir.operators.base import InheritedState
from weir.operators.broadcast import (
    BroadcastProcessOperator,
    BroadcastStateWriteError,
    KeyedBroadcastProcessOperator,
)
from weir.taskmanager.task_host import restore_of
from weir.taskmanager.task_types import ChainRestore, TaskAddress
from weir.wire import taskmanager_pb2

RULES = 1  # the broadcast input
EVENTS = 0


class Threshold(BroadcastProcessFunction):
    """Rules ``(name, limit)``; an event ``(name, value)`` passes when its rule's limit is below it."""

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        name, limit = value
        ctx.broadcast_state("rules").put(name, limit)

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        name, amount = value
        limit = ctx.broadcast_state("rules").get(name)
        if limit is not None and amount > limit:
            out.collect((name, amount, limit))


class WritesOnTheElementSide(Threshold):
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        ctx.broadcast_state("rules").put(value[0], 0)


def test_the_element_side_reads_what_the_broadcast_side_wrote(start_operator: StartOperator) -> None:
    op = BroadcastProcessOperator(Threshold())
    out = start_operator(op, uid="alerts")
    op.process_input(EVENTS, ("cpu", 95), 1)  # no rule yet
    op.process_input(RULES, ("cpu", 90), 2)
    op.process_input(EVENTS, ("cpu", 95), 3)
    op.process_input(EVENTS, ("cpu", 85), 4)
    op.process_input(RULES, ("cpu", 99), 5)
    op.process_input(EVENTS, ("cpu", 95), 6)
    assert out.records == [(("cpu", 95, 90), 3)]


def test_a_write_on_the_element_side_fails_the_task_naming_the_state(start_operator: StartOperator) -> None:
    op = BroadcastProcessOperator(WritesOnTheElementSide())
    start_operator(op, uid="alerts")
    op.process_input(RULES, ("cpu", 90), 1)
    with pytest.raises(BroadcastStateWriteError, match="broadcast state 'rules' is read only in process_element"):
        op.process_input(EVENTS, ("cpu", 95), 2)


def test_the_broadcast_state_is_restored_at_the_same_and_at_another_parallelism(
    start_operator: StartOperator, make_context: MakeContext
) -> None:
    blobs = []
    for subtask in range(2):
        op = BroadcastProcessOperator(Threshold())
        start_operator(op, uid="alerts", subtask=subtask, parallelism=2)
        for rule in (("cpu", 90), ("disk", 50), ("cpu", 80)):
            op.process_input(RULES, rule, 1)
        blob = op.snapshot_state(7)
        assert blob is not None
        blobs.append(InheritedState(subtask, 2, make_context(subtask=subtask, parallelism=2).key_group_range, blob))

    same = BroadcastProcessOperator(Threshold())
    out = start_operator(same, uid="alerts", restore=blobs[1].data, subtask=1, parallelism=2)
    same.process_input(EVENTS, ("cpu", 85), 1)
    same.process_input(EVENTS, ("disk", 40), 1)
    assert out.values == [("cpu", 85, 80)]

    for subtask in range(3):
        scaled = BroadcastProcessOperator(Threshold())
        scaled_out_ctx = make_context("alerts", subtask=subtask, parallelism=3)
        output = CollectingOutput()
        scaled.setup(scaled_out_ctx, output)
        scaled.restore_inherited_state(blobs)
        scaled.open()
        scaled.process_input(EVENTS, ("disk", 60), 1)
        assert output.values == [("disk", 60, 50)], subtask


class FireAtEventTime(KeyedBroadcastProcessFunction):
    """Each event waits in its key's state for an event-time timer at its time, which reads the rule
    then (the broadcast input's watermark has passed its time: every rule before it arrived)."""

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        ctx.broadcast_state("factors").put(value[0], value[1])

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        ctx.list_state("waiting").add(value)
        ctx.timer_service().register_event_time_timer(ctx.timestamp)

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        factors = ctx.broadcast_state("factors")
        waiting = ctx.list_state("waiting")
        for key, amount in waiting.get():
            out.collect((key, amount * (factors.get(key) or 0)))
        waiting.clear()


def test_keyed_the_timer_reads_the_broadcast_state_and_it_survives_a_restore(start_operator: StartOperator) -> None:
    op = KeyedBroadcastProcessOperator(FireAtEventTime(), lambda v: v[0])
    out = start_operator(op, uid="scale")
    op.process_input(EVENTS, ("a", 2), 10)
    op.process_input(RULES, ("a", 100), 0)
    op.process_watermark(10)
    assert out.values == [("a", 200)]
    blob = op.snapshot_state(1)
    assert blob is not None

    restored = KeyedBroadcastProcessOperator(FireAtEventTime(), lambda v: v[0])
    out2 = start_operator(restored, uid="scale", restore=blob)
    restored.process_input(EVENTS, ("a", 3), 20)
    restored.process_watermark(20)
    assert out2.values == [("a", 300)]


def test_connect_needs_a_broadcast_stream_and_the_keyed_function_a_keyed_one() -> None:
    env = Environment("broadcast-job")
    events = env.from_collection([("cpu", 1)], uid="events")
    rules = env.from_collection([("cpu", 0)], uid="rules")
    with pytest.raises(JobDefinitionError, match=r"takes a broadcast stream as connect's argument"):
        events.connect(rules).process(Threshold(), uid="alerts")
    with pytest.raises(JobDefinitionError, match="needs a keyed stream"):
        events.connect(rules.broadcast()).process(FireAtEventTime(), uid="scale")
    events.connect(rules.broadcast()).process(Threshold(), uid="alerts")
    events.key_by(lambda v: v[0]).connect(rules.broadcast()).process(FireAtEventTime(), uid="scale")


class VersionedRules(BroadcastProcessFunction):
    """Each rule ``(name, limit)`` bumps its name's version: an update that depends on what came
    before (applying a rule twice, or missing one, changes the map)."""

    def process_broadcast_element(self, value: Any, ctx: Any, out: Any) -> None:
        name, limit = value
        rules = ctx.broadcast_state("rules")
        version, _ = rules.get(name) or (0, None)
        rules.put(name, (version + 1, limit))

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect((value, ctx.broadcast_state("rules").get(value)))


def test_at_an_unaligned_checkpoint_each_subtask_restores_its_own_copy_and_replays_its_own_in_flight_rules(
    start_operator: StartOperator,
) -> None:
    """Why each subtask checkpoints its own copy rather than one for all: an unaligned barrier
    overtakes the records queued before it, so at checkpoint 7 subtask 0 has applied both rules and
    subtask 1 only the first, the second lying in its input queue (its channel state, replayed to it
    after a restore). Subtask 1 restored from its own copy and replaying its own in-flight rule holds
    what an uninterrupted run holds; subtask 0's copy plus that replay would apply the rule twice."""
    first, second = ("cpu", 90), ("cpu", 80)
    uninterrupted = BroadcastProcessOperator(VersionedRules())
    expected = start_operator(uninterrupted, uid="alerts", subtask=1, parallelism=2)
    for rule in (first, second):
        uninterrupted.process_input(RULES, rule, 1)
    uninterrupted.process_input(EVENTS, "cpu", 2)
    assert expected.values == [("cpu", (2, 80))]

    subtask_0 = BroadcastProcessOperator(VersionedRules())
    start_operator(subtask_0, uid="alerts", subtask=0, parallelism=2)
    for rule in (first, second):
        subtask_0.process_input(RULES, rule, 1)
    subtask_1 = BroadcastProcessOperator(VersionedRules())
    start_operator(subtask_1, uid="alerts", subtask=1, parallelism=2)
    subtask_1.process_input(RULES, first, 1)
    copies = [subtask_0.snapshot_state(7), subtask_1.snapshot_state(7)]
    assert copies[0] is not None and copies[1] is not None
    assert copies[0] != copies[1]  # the copies differ at an unaligned checkpoint: neither stands for both

    restored = BroadcastProcessOperator(VersionedRules())
    out = start_operator(restored, uid="alerts", restore=copies[1], subtask=1, parallelism=2)
    restored.process_input(RULES, second, 1)  # subtask 1's in-flight rule, replayed
    restored.process_input(EVENTS, "cpu", 2)
    assert Counter(out.values) == Counter(expected.values)

    from_subtask_0 = BroadcastProcessOperator(VersionedRules())
    wrong = start_operator(from_subtask_0, uid="alerts", restore=copies[0], subtask=1, parallelism=2)
    from_subtask_0.process_input(RULES, second, 1)
    from_subtask_0.process_input(EVENTS, "cpu", 2)
    assert wrong.values == [("cpu", (3, 80))]  # the second rule applied twice


def previous_format_document(subtask: int, parallelism: int, rules: bytes) -> bytes:
    """A task-state document as the Weir before content-addressed broadcast state wrote it (format
    2): each subtask's copy inline, under the operator's uid, written out here by hand."""
    per = 128 // parallelism
    return json.dumps(
        {
            "format": 2,
            "task": {"job_id": "old-job", "vertex_uid": "alerts", "subtask": subtask, "attempt": 1},
            "layout": {
                "parallelism": parallelism,
                "max_parallelism": 128,
                "operator_uids": ["alerts"],
                "keyed_operator_uids": [],
                "state_schemas": {},
            },
            "checkpoint_id": 7,
            "key_group_range": [subtask * per, subtask * per + per - 1],
            "operator_state": {"inline": {"alerts": base64.b64encode(rules).decode("ascii")}},
            "keyed_state": None,
        }
    ).encode()


def test_a_savepoint_of_the_previous_format_restores_at_the_same_and_at_another_parallelism(
    make_context: MakeContext,
) -> None:
    """Its documents (format 2, every copy inline) restore through what a deployment reads: the same
    subtask its own copy, a job at parallelism 3 old subtask ``i mod 2``'s."""
    rules = dumps_value((1, {"rules": {"cpu": 80, "disk": 50}}))
    old = [previous_format_document(subtask, 2, rules) for subtask in range(2)]

    def started(op: BroadcastProcessOperator, subtask: int, parallelism: int) -> CollectingOutput:
        output = CollectingOutput()
        op.setup(make_context("alerts", subtask=subtask, parallelism=parallelism), output)
        return output

    same = BroadcastProcessOperator(Threshold())
    out = started(same, 1, 2)
    request = taskmanager_pb2.DeployTaskRequest(restore_checkpoint_id=7, restore_state_handle=old[1])
    restore = restore_of(TaskAddress("old-job", "alerts", 1, 2), request)
    assert isinstance(restore, ChainRestore)
    same.restore_state(read_operator_states(restore.operator_state, _no_storage)["alerts"])
    same.open()
    same.process_input(EVENTS, ("cpu", 85), 1)
    assert out.values == [("cpu", 85, 80)]

    documents = [decode_task_state(d, "of the previous format") for d in old]
    inherited = [
        InheritedState(d.subtask, d.layout.parallelism, d.key_group_range, data)
        for d in documents
        for uid, data in read_operator_states(d.operator_state, _no_storage).items()
        if uid == "alerts"
    ]
    for subtask in range(3):
        scaled = BroadcastProcessOperator(Threshold())
        out = started(scaled, subtask, 3)
        scaled.restore_inherited_state(inherited)
        scaled.open()
        scaled.process_input(EVENTS, ("disk", 60), 1)
        assert out.values == [("disk", 60, 50)], subtask


def _no_storage(key: str) -> bytes:
    raise AssertionError(f"the previous format keeps the broadcast state inline, yet {key} was read")

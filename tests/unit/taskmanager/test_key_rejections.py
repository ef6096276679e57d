"""A key selector raising on a record where a keyed edge takes the key (the producer's record
writer): the keyed operator the edge feeds handles the record as its ``on_error`` says."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from tests.unit.taskmanager.test_network import FakeChannel, writer_for
from weir.api import Environment
from weir.core.keygroups import KeyEncoder
from weir.core.rejections import DeadLetterOnError, OnRecordError, SourcePosition, UserFunctionError
from weir.operators.rejections import CapturedDeadLetters, RecordRejections
from weir.plan import build_plan
from weir.taskmanager.network.writer import RecordWriter
from weir.taskmanager.partitioners import KeyGroupPartitioner
from weir.taskmanager.task_host import key_rejected


def keyed_job(on_error: OnRecordError | None, job_default: OnRecordError | None = None) -> Any:
    env = Environment("job", parallelism=2)
    if job_default is not None:
        env.on_record_error(job_default)
    numbers = env.from_collection([{"k": "a", "v": 1}], uid="numbers")
    numbers.key_by(lambda r: r["k"]).reduce(lambda a, b: a, uid="latest", on_error=on_error).print(uid="out")
    plan = build_plan(env.graph)
    (edge,) = plan.vertices["numbers"].outputs
    return plan.graph, edge


def writer_with(on_error: OnRecordError | None, job_default: OnRecordError | None = None) -> Any:
    graph, edge = keyed_job(on_error, job_default)
    letters = CapturedDeadLetters()
    rejections = RecordRejections("job-1", 0, letters, structlog.get_logger("test"))
    rejections.locate_with(lambda: SourcePosition("events", 1, 9))
    channels = [FakeChannel(), FakeChannel()]
    writer = RecordWriter(
        channels,  # type: ignore[arg-type]
        KeyGroupPartitioner(128, 2),
        edge.key_selector,
        KeyEncoder(128).key_group,
        flush_interval_s=60.0,
        key_rejected=key_rejected(rejections, graph, edge),
    )
    return writer, channels, letters


def test_a_key_selector_raising_fails_with_the_keyed_operator_and_the_record_named() -> None:
    writer, _channels, _letters = writer_with(None)
    with pytest.raises(UserFunctionError) as raised:
        writer.emit({"v": 1}, 5)
    rejected = raised.value.rejected
    assert rejected.operator_uid == "latest" and rejected.reason == "KeyError: 'k'"
    assert rejected.position == SourcePosition("events", 1, 9) and rejected.timestamp == 5


@pytest.mark.parametrize("own, job", [(DeadLetterOnError("dlq"), None), (None, DeadLetterOnError("dlq"))])
def test_a_dead_lettered_key_drops_the_record_before_any_channel(
    own: OnRecordError | None, job: OnRecordError | None
) -> None:
    writer, channels, letters = writer_with(own, job)
    writer.emit({"v": 1}, 5)
    writer.emit({"k": "a", "v": 2}, 6)
    writer.flush()
    assert sum(len(c.records()) for c in channels) == 1 and writer.records_out == 1
    ((topic, _key, envelope),) = letters.letters
    assert topic == "dlq" and envelope["operator_uid"] == "latest" and envelope["offset"] == 9


def test_without_a_handler_the_key_selector_s_exception_passes_as_it_is() -> None:
    _graph, edge = keyed_job(None)
    writer = writer_for([FakeChannel(), FakeChannel()], KeyGroupPartitioner(128, 2), edge.key_selector)
    with pytest.raises(KeyError):
        writer.emit({"v": 1}, 5)

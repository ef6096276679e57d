"""Operators whose user function raises on a record: the record is named (fail) or dead-lettered
(the operator drops it and goes on); an exception that only passed up through the function, from an
operator chained after it, is not taken for the function's; the Kafka source tells a chained
operator the record's partition and offset."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from tests.unit.operators.test_sources import FakeConsumer, kafka_spec
from tests.unit.operators.test_sources import fake_kafka as fake_kafka  # the fixture
from weir.api import Environment
from weir.core.errors import JobDefinitionError, ServiceUnavailableError
from weir.core.rejections import FAIL, DeadLetterOnError, FailOnError, SourcePosition, UserFunctionError
from weir.core.windows import TumblingEventTimeWindows
from weir.operators.base import ChainOutput, StreamOperator
from weir.operators.basic import FilterOperator, FlatMapOperator, MapOperator, ProcessOperator
from weir.operators.keyed import KeyedProcessOperator, ReduceOperator
from weir.operators.rejections import (
    REJECTED_RECORDS,
    CapturedDeadLetters,
    KafkaDeadLetters,
    RecordRejections,
    forget_job_series,
    rejected_by_function,
)
from weir.operators.sources import KafkaSourceOperator
from weir.operators.windows import WindowAggregateOperator

DLQ = DeadLetterOnError("events-dlq")


def poison(value: Any) -> Any:
    if value == 3:
        raise ValueError("three is poison")
    return value * 10


def start_with_letters(
    op: StreamOperator, make_context: MakeContext, uid: str = "op", output: Any = None
) -> tuple[Any, CapturedDeadLetters]:
    """Set ``op`` up with a RecordRejections keeping its dead letters (counted under job-1/tm-test)."""
    letters = CapturedDeadLetters()
    ctx = make_context(uid)
    ctx.rejections = RecordRejections(
        ctx.job_id, ctx.subtask, letters, ctx.log, metric_labels=("job-1", "j", "tm-test")
    )
    out = CollectingOutput() if output is None else output
    op.setup(ctx, out)
    op.open()
    return out, letters


def test_failing_names_the_operator_function_exception_and_record(start_operator: StartOperator) -> None:
    op = MapOperator(poison)
    start_operator(op, uid="parse")
    with pytest.raises(UserFunctionError) as raised:
        op.process(3, 1000)
    rejected = raised.value.rejected
    assert (rejected.operator_uid, rejected.function, rejected.reason) == (
        "parse",
        "poison",
        "ValueError: three is poison",
    )
    assert (rejected.record, rejected.timestamp, rejected.position) == ("3", 1000, None)
    assert isinstance(raised.value.__cause__, ValueError)


def test_dead_lettering_drops_the_record_and_the_others_pass(make_context: MakeContext) -> None:
    op = MapOperator(poison, DLQ)
    out, letters = start_with_letters(op, make_context, "parse")
    before = REJECTED_RECORDS.labels("job-1", "j", "parse", "0", "tm-test", "dead_lettered")._value.get()
    with capture_logs() as logs:
        for v in range(6):
            op.process(v, v)
    assert out.values == [0, 10, 20, 40, 50]
    ((topic, key, envelope),) = letters.letters
    assert topic == "events-dlq" and key is None
    assert (envelope["reason"], envelope["operator_uid"], envelope["value"]) == (
        "ValueError: three is poison",
        "parse",
        "3",
    )
    assert (envelope["topic"], envelope["partition"], envelope["offset"]) == (None, None, None)
    after = REJECTED_RECORDS.labels("job-1", "j", "parse", "0", "tm-test", "dead_lettered")._value.get()
    assert after == before + 1
    (event,) = [e for e in logs if e["event"] == "record_rejected"]
    assert event["handling"] == "dead_lettered" and event["dlq"] == "events-dlq" and event["origin"] is None


def test_a_filter_and_a_flat_map_reject_like_a_map(make_context: MakeContext) -> None:
    filter_op, flat_op = FilterOperator(lambda v: poison(v) > 0, DLQ), FlatMapOperator(lambda v: [v, poison(v)], DLQ)
    kept, kept_letters = start_with_letters(filter_op, make_context)
    items, items_letters = start_with_letters(flat_op, make_context)
    for v in range(1, 5):
        filter_op.process(v, None)
        flat_op.process(v, None)
    assert kept.values == [1, 2, 4] and len(kept_letters.letters) == 1
    assert items.values == [1, 10, 2, 20, 4, 40] and len(items_letters.letters) == 1


def test_a_generator_s_items_before_it_raised_stay_emitted(make_context: MakeContext) -> None:
    def explode(v: int) -> Any:
        yield v
        raise ValueError("half way")

    op = FlatMapOperator(explode, DLQ)
    out, letters = start_with_letters(op, make_context)
    op.process(1, None)
    assert out.values == [1] and letters.letters[0][2]["reason"] == "ValueError: half way"


class Failing(StreamOperator):
    """A chained operator that is not a user function: a sink whose external system failed."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def process(self, value: Any, timestamp: int | None) -> None:
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("sink broke"), ServiceUnavailableError("kafka down")])
@pytest.mark.parametrize("handling", [FAIL, DLQ])
def test_an_error_of_a_chained_operator_passes_up_through_a_flat_map_untouched(
    make_context: MakeContext, error: Exception, handling: FailOnError | DeadLetterOnError
) -> None:
    sink = Failing(error)
    sink.setup(make_context("sink"), CollectingOutput())
    op = FlatMapOperator(lambda v: [v], handling)
    _out, letters = start_with_letters(op, make_context, "flat", output=ChainOutput(sink))
    with pytest.raises(type(error)) as raised:
        op.process(1, None)
    assert raised.value is error and not letters.letters


class Emitting:
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect(value)


def test_an_error_downstream_of_a_process_function_s_collector_is_not_the_function_s(make_context: MakeContext) -> None:
    sink = Failing(RuntimeError("sink broke"))
    sink.setup(make_context("sink"), CollectingOutput())
    op = ProcessOperator(Emitting(), DLQ)
    _out, letters = start_with_letters(op, make_context, "enrich", output=ChainOutput(sink))
    with pytest.raises(RuntimeError, match="sink broke"):
        op.process(1, None)
    assert not letters.letters


def test_a_record_rejected_downstream_is_named_by_the_operator_that_rejected_it(make_context: MakeContext) -> None:
    second = MapOperator(poison)
    second.setup(make_context("second"), CollectingOutput())
    first = FlatMapOperator(lambda v: [v])
    start_with_letters(first, make_context, "first", output=ChainOutput(second))
    with pytest.raises(UserFunctionError) as raised:
        first.process(3, None)
    assert raised.value.rejected.operator_uid == "second"


def test_rejected_by_function_reads_the_traceback() -> None:
    class Own:
        pass

    own = Own()
    try:
        poison(3)
    except ValueError as exc:
        assert rejected_by_function(exc, own, StreamOperator)
    assert not rejected_by_function(JobDefinitionError("weir's own"), own, StreamOperator)


def by_key(v: dict[str, Any]) -> str:
    return v["k"]


def test_a_keyed_reduce_names_the_key_and_a_failing_key_selector_the_record(start_operator: StartOperator) -> None:
    def add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        if b["v"] < 0:
            raise ValueError("negative")
        return {"k": a["k"], "v": a["v"] + b["v"]}

    op = ReduceOperator(add, by_key)
    start_operator(op, uid="sum")
    op.process({"k": "a", "v": 1}, 5)
    with pytest.raises(UserFunctionError) as raised:
        op.process({"k": "a", "v": -1}, 6)
    assert raised.value.rejected.key == "'a'" and raised.value.rejected.function.endswith("<locals>.add")
    with pytest.raises(UserFunctionError) as raised:
        op.process({"v": 1}, 7)  # no "k": the key selector raises
    assert raised.value.rejected.function == "by_key" and raised.value.rejected.key is None


class Counting:
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        if value["v"] == 3:
            raise ValueError("three")
        out.collect(value["v"])


def test_a_keyed_process_function_dead_letters_with_the_key(make_context: MakeContext) -> None:
    op = KeyedProcessOperator(Counting(), by_key, on_error=DLQ)
    out, letters = start_with_letters(op, make_context, "proc")
    for v in range(5):
        op.process({"k": "x", "v": v}, v)
    assert out.values == [0, 1, 2, 4]
    ((_topic, key, envelope),) = letters.letters
    assert key == b"'x'" and envelope["key"] == "'x'" and envelope["function"] == "Counting.process_element"


class Sum:
    def create(self) -> int:
        return 0

    def add(self, acc: int, v: dict[str, Any]) -> int:
        return acc + int(v["v"])  # "three" is poison

    def result(self, key: str, start: int, end: int, acc: int) -> tuple[str, int]:
        return (key, acc)


def test_a_window_aggregate_leaves_a_dead_lettered_record_out_of_its_window(make_context: MakeContext) -> None:
    op = WindowAggregateOperator(Sum(), by_key, TumblingEventTimeWindows(1000), 0, on_error=DLQ)
    out, letters = start_with_letters(op, make_context, "win")
    for ts, v in [(1, 1), (2, "three"), (3, 5)]:
        op.process({"k": "a", "v": v}, ts)
    op.process_watermark(2000)
    assert out.values == [("a", 6)]
    ((_topic, _key, envelope),) = letters.letters
    assert envelope["reason"].startswith("ValueError: invalid literal") and envelope["timestamp"] == 2


def test_a_map_chained_to_the_kafka_source_names_the_record_s_partition_and_offset(
    make_context: MakeContext, fake_kafka: Callable[[int], FakeConsumer]
) -> None:
    consumer = fake_kafka(2)
    source = KafkaSourceOperator(kafka_spec(idle_timeout_ms=None))
    parse = MapOperator(lambda e: 1 // (e["ts"] - 3000), DLQ)
    letters = CapturedDeadLetters()
    source_ctx, parse_ctx = make_context("events-source"), make_context("parse")
    rejections = RecordRejections("job-1", 0, letters, parse_ctx.log, position_in_flight=source.position_in_flight)
    source_ctx.rejections = parse_ctx.rejections = rejections
    out = CollectingOutput()
    parse.setup(parse_ctx, out)
    source.setup(source_ctx, ChainOutput(parse))
    parse.open()
    source.open()
    for partition, ts in [(0, 1000), (1, 2000), (1, 3000), (0, 4000)]:
        consumer.add(partition, ts)
    source.poll(10)
    assert out.values == [-1, -1, 0]  # 1 // (ts - 3000): the record at 3000 raised
    ((_topic, _key, envelope),) = letters.letters
    assert (envelope["topic"], envelope["partition"], envelope["offset"]) == ("events", 1, 1)
    assert json.loads(envelope["value"]) == {"ts": 3000}
    assert source.position_in_flight() is None  # outside the emit loop: not known, not made up
    parse.on_error = FAIL
    consumer.add(1, 3000)
    with pytest.raises(UserFunctionError) as raised:
        source.poll(10)
    assert raised.value.rejected.position == SourcePosition("events", 1, 2)
    assert "from events[1]@2" in str(raised.value)


def test_the_job_s_handling_is_every_operator_s_unless_it_has_its_own() -> None:
    env = Environment("job")
    numbers = env.from_collection([1, 2, 3], uid="numbers")
    numbers.map(poison, uid="a").map(poison, uid="b", on_error=FAIL).print(uid="out")
    env.on_record_error(DLQ)  # after the operators: read when their tasks build them
    ops = {uid: env.graph.transformations[uid].factory() for uid in ("a", "b")}
    assert ops["a"].on_error == DLQ and ops["b"].on_error == FAIL
    assert Environment("fresh").record_error_handling(None) == FAIL


def test_an_on_error_that_is_not_a_handling_is_refused_at_build() -> None:
    env = Environment("job")
    with pytest.raises(JobDefinitionError, match="operator 'a': on_error takes"):
        env.from_collection([1], uid="numbers").map(poison, uid="a", on_error="dead-letter")  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="on_record_error takes"):
        env.on_record_error("fail")  # type: ignore[arg-type]


class RecordingProducer:
    """What KafkaDeadLetters calls on its producer: every letter is acknowledged at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def produce(self, topic: str, *, key: bytes | None, value: bytes, on_delivery: Any) -> None:
        self.sent.append((topic, value))
        on_delivery(None, None)

    def flush(self, timeout: float) -> int:
        return 0


def test_a_dead_letter_topic_that_does_not_exist_fails_the_job_naming_topic_operator_and_record(
    make_context: MakeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    from weir.connectors import kafka
    from weir.core.config import Endpoints
    from weir.core.failures import Failure

    existing: set[str] = set()
    lookups: list[str] = []

    def partition_count(_endpoints: Any, topic: str, timeout_s: float = 10.0) -> int | None:
        lookups.append(topic)
        return 1 if topic in existing else None

    producer = RecordingProducer()
    monkeypatch.setattr(kafka, "topic_partition_count", partition_count)
    monkeypatch.setattr(kafka, "producer", lambda _endpoints, **_options: producer)
    ctx = make_context("parse")
    ctx.rejections = RecordRejections(ctx.job_id, ctx.subtask, KafkaDeadLetters(), ctx.log)
    op = MapOperator(poison, DLQ)
    op.setup(ctx, CollectingOutput())
    with pytest.raises(JobDefinitionError) as raised:
        op.process(3, 1000)
    bootstrap = Endpoints.from_env().kafka_bootstrap
    assert str(raised.value).startswith(
        "operator 'parse' (subtask 0) could not dead-letter a rejected record: dead-letter topic 'events-dlq' does "
        f"not exist at {bootstrap}: create it, then run the job again (the record: operator 'parse'"
    )
    assert not producer.sent
    failure = Failure.from_exception(raised.value)
    assert failure.retriable is False and failure.fault.value == "user"  # a restart cannot help
    existing.add("events-dlq")
    op.process(3, 1001)
    op.process(3, 1002)
    assert len(producer.sent) == 2 and lookups == ["events-dlq", "events-dlq"]  # found once, then not asked again


def test_an_ended_job_s_rejected_record_series_are_removed(make_context: MakeContext) -> None:
    """The TaskManager forgets a job that ended (forget_job): its series go, another job's stay."""
    counted: dict[str, dict[str, str]] = {}
    for job in ("job-ended", "job-running"):
        ctx = make_context("parse")
        rejections = RecordRejections(job, 0, CapturedDeadLetters(), ctx.log, metric_labels=(job, "j", "tm-forget"))
        op = MapOperator(poison, DLQ)
        ctx.rejections = rejections
        op.setup(ctx, CollectingOutput())
        op.open()
        op.process(3, 0)
        counted[job] = {
            "job_id": job,
            "job_name": "j",
            "operator_uid": "parse",
            "subtask": "0",
            "taskmanager": "tm-forget",
            "handling": "dead_lettered",
        }
        assert REGISTRY.get_sample_value("weir_rejected_records_total", counted[job]) == 1
    forget_job_series("job-ended")
    assert REGISTRY.get_sample_value("weir_rejected_records_total", counted["job-ended"]) is None
    assert REGISTRY.get_sample_value("weir_rejected_records_total", counted["job-running"]) == 1
    forget_job_series("job-ended")  # twice is harmless
    forget_job_series("job-running")

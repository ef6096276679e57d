"""The user functions of the sinks (a Kafka sink's serializer and key, a PostgreSQL sink's row):
a record one of them raises on is handled by the sink's ``on_error`` like any operator's; the
sink's own errors (the producer's, PostgreSQL's, an error raised in ``connectors``) pass up as they
are and are never dead-lettered."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from tests.unit.operators.test_rejections import DLQ
from weir.api import Environment
from weir.core import json_codec
from weir.core.errors import ServiceUnavailableError
from weir.core.rejections import FAIL, OnRecordError, UserFunctionError
from weir.operators.rejections import CapturedDeadLetters, RecordRejections
from weir.operators.sinks import KafkaSinkOperator, PostgresUpsertSinkOperator
from weir.operators.transactional_sinks import TransactionalKafkaSinkOperator, TwoPhasePostgresSinkOperator


class FakeProducer:
    """What KafkaSinkOperator.process calls on its producer; ``fail`` makes ``produce`` raise."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.produced: list[tuple[str, bytes, Any]] = []
        self.fail = fail

    def produce(self, topic: str, *, value: bytes, key: Any, timestamp: int, on_delivery: Any) -> None:
        if self.fail is not None:
            raise self.fail
        self.produced.append((topic, value, key))

    def poll(self, timeout: float) -> int:
        return 0


class FakeTransactionalProducer:
    """What TransactionalKafkaSinkOperator.process calls on its producer while an epoch is open."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes | None, bytes | None]] = []

    def begin(self) -> None:
        pass

    def produce(self, topic: str, value: bytes | None, key: bytes | None, timestamp: int | None) -> None:
        self.produced.append((topic, value, key))

    def poll(self) -> None:
        pass


def set_up(op: Any, make_context: MakeContext, uid: str = "sink") -> CapturedDeadLetters:
    """The sink bound to a context whose rejections keep the dead letters (``open`` is not called:
    it would connect)."""
    letters = CapturedDeadLetters()
    ctx = make_context(uid)
    ctx.rejections = RecordRejections(ctx.job_id, ctx.subtask, letters, ctx.log)
    op.setup(ctx, CollectingOutput())
    return letters


def picky_serializer(value: dict[str, Any]) -> bytes:
    return json_codec.encode({"n": int(value["n"])})


def kafka_sink(on_error: OnRecordError, producer: FakeProducer, key: Any = None) -> KafkaSinkOperator:
    op = KafkaSinkOperator("out", picky_serializer, key, on_error)
    op._producer = producer
    return op


def test_a_record_the_kafka_sink_s_serializer_raises_on_is_dead_lettered_and_the_others_written(
    make_context: MakeContext,
) -> None:
    producer = FakeProducer()
    op = kafka_sink(DLQ, producer)
    letters = set_up(op, make_context)
    for n in ("1", "two", "3"):
        op.process({"n": n}, 7)
    assert [value for _t, value, _k in producer.produced] == [b'{"n":1}', b'{"n":3}']
    ((topic, _key, envelope),) = letters.letters
    assert topic == "events-dlq" and envelope["function"] == "picky_serializer"
    assert envelope["operator_uid"] == "sink" and envelope["value"] == '{"n":"two"}' and envelope["timestamp"] == 7


def test_a_kafka_sink_s_key_function_raising_fails_naming_it(make_context: MakeContext) -> None:
    def key_of(value: dict[str, Any]) -> str:
        return value["id"]

    op = kafka_sink(FAIL, FakeProducer(), key=key_of)
    set_up(op, make_context)
    with pytest.raises(UserFunctionError) as raised:
        op.process({"n": "1"}, None)
    assert raised.value.rejected.function.endswith("<locals>.key_of")
    assert raised.value.rejected.reason == "KeyError: 'id'"


def test_the_producer_s_own_error_passes_up_and_is_never_dead_lettered(make_context: MakeContext) -> None:
    broken = RuntimeError("local queue broken")
    op = kafka_sink(DLQ, FakeProducer(fail=broken))
    letters = set_up(op, make_context)
    with pytest.raises(RuntimeError) as raised:
        op.process({"n": "1"}, None)
    assert raised.value is broken and not letters.letters


def connector_serializer() -> Any:
    """A serializer whose work is done in a ``weir.connectors`` module (a schema registry client, say)."""
    namespace: dict[str, Any] = {"__name__": "weir.connectors.registry"}
    exec("def lookup(value):\n    raise ConnectionError('registry down')\n", namespace)
    lookup = namespace["lookup"]

    def serialize(value: Any) -> bytes:
        return lookup(value)  # type: ignore[no-any-return]

    return serialize


def unavailable_serializer(value: Any) -> bytes:
    """A serializer that says its external system is down, as Weir's own errors say it."""
    raise ServiceUnavailableError("registry down")


@pytest.mark.parametrize(
    "serializer", [connector_serializer(), unavailable_serializer], ids=["raised-in-connectors", "weir-error"]
)
def test_an_external_system_s_error_under_the_serializer_is_not_the_record_s(
    make_context: MakeContext, serializer: Any
) -> None:
    producer = FakeProducer()
    op = KafkaSinkOperator("out", serializer, None, DLQ)
    op._producer = producer
    letters = set_up(op, make_context)
    with pytest.raises((ConnectionError, ServiceUnavailableError)):
        op.process({"n": 1}, None)
    assert not letters.letters and not producer.produced


def test_the_exactly_once_kafka_sink_drops_a_dead_lettered_record_before_its_epoch(make_context: MakeContext) -> None:
    op = TransactionalKafkaSinkOperator("out", picky_serializer, None, on_error=DLQ)
    letters = set_up(op, make_context)
    op.process({"n": "two"}, 3)
    assert op._current is None  # no epoch began, nothing was produced
    assert letters.letters[0][2]["function"] == "picky_serializer"
    op.on_error = FAIL
    with pytest.raises(UserFunctionError, match="picky_serializer raised ValueError"):
        op.process({"n": "two"}, 3)


def row_of(value: dict[str, Any]) -> tuple[Any, ...]:
    return (value["id"], value["total"])


@pytest.mark.parametrize(
    ("record", "reason"),
    [({"id": 1}, "KeyError: 'total'"), ({"id": 2, "total": 5, "extra": 1}, "TypeError: the row has 3 values")],
)
def test_a_record_the_postgres_row_function_raises_on_is_dead_lettered(
    make_context: MakeContext, record: dict[str, Any], reason: str
) -> None:
    def wide_row(value: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(value.values()) if "extra" in value else row_of(value)

    op = TwoPhasePostgresSinkOperator("totals", ("id", "total"), ("id",), wide_row, on_error=DLQ)
    letters = set_up(op, make_context)
    op.process({"id": 9, "total": 1}, None)
    op.process(record, None)
    assert op._current is not None and op._current.items.upserts() == [(9, 1)]
    ((_topic, _key, envelope),) = letters.letters
    assert envelope["reason"].startswith(reason) and envelope["function"].endswith("<locals>.wide_row")


def test_the_upsert_sink_fails_on_a_bad_row_by_default_naming_its_function(make_context: MakeContext) -> None:
    op = PostgresUpsertSinkOperator("totals", ("id", "total"), ("id",), row_of)
    set_up(op, make_context)
    op.process({"id": 1, "total": 2}, None)
    with pytest.raises(UserFunctionError) as raised:
        op.process({"id": 1}, None)
    assert raised.value.rejected.function == "row_of" and op._changes.upserts() == [(1, 2)]


def test_the_sink_builders_take_on_error_and_default_to_the_job_s() -> None:
    env = Environment("job")
    stream = env.from_collection([], uid="numbers")
    own = DLQ
    stream.sink_to_kafka("out", uid="k-eo")
    stream.sink_to_kafka("out", uid="k-alo", delivery="at_least_once", on_error=own)
    stream.sink_to_postgres("t", uid="p-2pc", columns=("id",), key_columns=("id",))
    stream.sink_to_postgres("t", uid="p-up", columns=("id",), key_columns=("id",), delivery="upsert", on_error=FAIL)
    env.on_record_error(DLQ)  # read when the tasks build their operators
    graph = env.graph.transformations
    handling = {uid: graph[uid].factory().on_error for uid in ("k-eo", "k-alo", "p-2pc", "p-up")}
    assert handling == {"k-eo": DLQ, "k-alo": own, "p-2pc": DLQ, "p-up": FAIL}
    with pytest.raises(Exception, match="on_error takes"):
        stream.sink_to_kafka("out", uid="bad", on_error="dlq")  # type: ignore[arg-type]


def test_the_postgres_sink_s_default_row_is_named_and_rejects_a_missing_column(make_context: MakeContext) -> None:
    env = Environment("job")
    env.from_collection([], uid="numbers").sink_to_postgres(
        "t", uid="p", columns=("id", "total"), key_columns=("id",), delivery="upsert"
    )
    op = env.graph.transformations["p"].factory()
    set_up(op, make_context, "p")
    with pytest.raises(UserFunctionError) as raised:
        op.process({"id": 1}, None)
    assert raised.value.rejected.function == "ColumnValues" and raised.value.rejected.reason == "KeyError: 'total'"


def none_serializer(value: Any) -> bytes:
    return None  # type: ignore[return-value] - what a serializer meaning "a tombstone" would return


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_serializer_returning_none_is_the_record_s_one_line_error_in_both_kafka_sinks(
    make_context: MakeContext, exactly_once: bool
) -> None:
    """The Kafka sinks write no null-value tombstones: the exactly-once sink failed with a bare
    TypeError in its epoch buffer, the at-least-once one wrote a null value; both refuse the record."""
    producer = FakeProducer()
    op: Any
    if exactly_once:
        op = TransactionalKafkaSinkOperator("out", none_serializer, None, on_error=FAIL)
    else:
        op = KafkaSinkOperator("out", none_serializer, None, FAIL)
        op._producer = producer
    set_up(op, make_context)
    with pytest.raises(UserFunctionError) as raised:
        op.process({"n": 1}, None)
    message = str(raised.value)
    assert "none_serializer raised TypeError: the serializer returned None for a record without a key" in message
    assert "\n" not in message
    assert not producer.produced
    if exactly_once:
        assert op._current is None


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_serializer_returning_none_with_a_key_writes_a_tombstone_in_both_kafka_sinks(
    make_context: MakeContext, exactly_once: bool
) -> None:
    """None for a keyed record is a tombstone (a null value: the key's delete in a compacted topic),
    beside the records with values, in order."""

    def serializer(value: dict[str, Any]) -> bytes | None:
        return None if value["deleted"] else json_codec.encode({"n": value["n"]})

    def key(value: dict[str, Any]) -> bytes:
        return json_codec.encode({"n": value["n"]})

    values = [{"n": 1, "deleted": False}, {"n": 1, "deleted": True}, {"n": 2, "deleted": False}]
    expected = [(key(v), None if v["deleted"] else json_codec.encode({"n": v["n"]})) for v in values]
    if exactly_once:
        producer = FakeTransactionalProducer()
        op: Any = TransactionalKafkaSinkOperator("out", serializer, key, on_error=FAIL)
        set_up(op, make_context)
        op._producer = producer
        for v in values:
            op.process(v, None)
        assert [(k, data) for k, data, _ts in op._current.items] == expected  # what a restore re-produces
        assert [(k, data) for _topic, data, k in producer.produced] == expected
    else:
        producer = FakeProducer()
        op = KafkaSinkOperator("out", serializer, key, FAIL)
        op._producer = producer
        set_up(op, make_context)
        for v in values:
            op.process(v, None)
        assert [(k, data) for _topic, data, k in producer.produced] == expected

"""The job API of the columnar path: a Kafka source with a schema, key_by a field, a window of
built-in aggregates, and the ``<uid>-records`` operator where a columnar stream meets a per-record one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import weir.api
from tests.unit.conftest import StartOperator
from weir.api import (
    ColumnarStream,
    Count,
    Environment,
    FieldKey,
    KeyedStream,
    Max,
    Mean,
    Min,
    Schema,
    Sum,
    TumblingEventTimeWindows,
    json_deserializer,
    load_job_file,
)
from weir.core.columnar import BuiltinAggregates, decode_pending_windows
from weir.core.errors import JobDefinitionError
from weir.core.state_layout import window_bounds
from weir.core.watermarks import MAX_WATERMARK
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning
from weir.operators.columnar import ColumnarWindowAggregateOperator, ToRecordsOperator
from weir.operators.windows import WindowAggregateOperator, pending_windows_of

FIELDS = {"id": str, "key": str, "value": int, "ts": int}
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "keyed_aggregation.py"


def columnar_source(env: Environment, uid: str = "events", **kwargs: Any) -> ColumnarStream:
    stream = env.from_kafka("events", uid=uid, schema=FIELDS, timestamp_field="ts", **kwargs)
    assert isinstance(stream, ColumnarStream)
    return stream


def edges_into(graph: LogicalGraph, uid: str) -> list[Edge]:
    return graph.inputs_of(uid)


def count_sum() -> dict[str, Any]:
    return {"count": Count(), "sum": Sum("value")}


# The columnar source ---------------------------------------------------------------------------------


def test_a_kafka_source_with_a_schema_is_columnar() -> None:
    env = Environment("j")
    events = columnar_source(env)
    t = env.graph.transformations["events"]
    assert t.columnar and t.kind is OperatorKind.SOURCE
    assert t.source_spec.schema == Schema.of(FIELDS) and t.source_spec.timestamp_field == "ts"
    assert events.schema == Schema.of(FIELDS)
    explicit = env.from_kafka("other", uid="other", schema=Schema.of(FIELDS), timestamp_field="ts")
    assert isinstance(explicit, ColumnarStream) and env.graph.transformations["other"].columnar
    plain = env.from_kafka("plain", uid="plain", deserializer=json_deserializer, timestamp=lambda e: e["ts"])
    assert not isinstance(plain, ColumnarStream) and not env.graph.transformations["plain"].columnar
    assert env.graph.transformations["plain"].source_spec.schema is None


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"schema": FIELDS, "timestamp_field": "ts", "deserializer": json_deserializer}, "leave deserializer"),
        ({"schema": FIELDS, "timestamp_field": "ts", "timestamp": lambda e: e["ts"]}, "leave deserializer"),
        ({"schema": FIELDS}, "a columnar source needs timestamp_field"),
        ({"timestamp_field": "ts"}, "timestamp_field needs a schema"),
        ({"schema": FIELDS, "timestamp_field": "key"}, "timestamp field 'key' must be an int field"),
        ({"schema": FIELDS, "timestamp_field": "when"}, "no field 'when'"),
        ({"schema": {"a": bytes}, "timestamp_field": "a"}, "is not one of str, int, float, bool"),
    ],
)
def test_a_bad_columnar_source_fails_the_build(kwargs: dict[str, Any], complaint: str) -> None:
    env = Environment("j")
    with pytest.raises(JobDefinitionError, match=complaint):
        env.from_kafka("events", uid="events", **kwargs)
    assert "events" not in env.graph.transformations


# key_by a field and the columnar window ---------------------------------------------------------------


def test_a_window_of_builtin_aggregates_stays_columnar() -> None:
    env = Environment("j", parallelism=2)
    keyed = columnar_source(env).key_by("key")
    out = keyed.window(TumblingEventTimeWindows(1000), allowed_lateness_ms=50).aggregate(count_sum(), uid="win")
    (edge,) = edges_into(env.graph, "win")
    assert edge.source_uid == "events" and edge.partitioning is Partitioning.HASH
    assert edge.key_selector == FieldKey("key")
    assert env.graph.transformations["win"].key_selector == FieldKey("key")
    assert not env.graph.transformations["win"].columnar  # it emits records (dicts)
    assert "events-records" not in env.graph.transformations
    op = env.graph.transformations["win"].factory()
    assert isinstance(op, ColumnarWindowAggregateOperator)
    assert op._lateness == 50 and op._assigner == TumblingEventTimeWindows(1000)
    assert op._aggregates.partials == ((None, "count"), ("value", "sum"))
    assert op.state_schemas()[0].name == "win"
    out.print(uid="out")  # its output is records: no conversion needed
    assert "events-records" not in env.graph.transformations
    assert [e.source_uid for e in edges_into(env.graph, "out")] == ["win"]
    env.graph.validate()


def test_the_columnar_window_operator_aggregates_the_batches_of_its_source(start_operator: StartOperator) -> None:
    env = Environment("j")
    (
        columnar_source(env)
        .key_by("key")
        .window(TumblingEventTimeWindows(10))
        .aggregate({"n": Count(), "lo": Min("value"), "hi": Max("value"), "avg": Mean("value")}, uid="win")
    )
    op = env.graph.transformations["win"].factory()
    out = start_operator(op, uid="win")
    decoder = Schema.of(FIELDS).decoder("ts")
    op.process(decoder.batch([["e1", "e2", "e3"], ["a", "a", "b"], [1, 3, 5], [1, 2, 3]]), None)
    op.process_watermark(MAX_WATERMARK)
    assert sorted(out.values, key=lambda r: r["key"]) == [
        {"key": "a", "window_start": 0, "window_end": 10, "n": 2, "lo": 1, "hi": 3, "avg": 2.0},
        {"key": "b", "window_start": 0, "window_end": 10, "n": 1, "lo": 5, "hi": 5, "avg": 5.0},
    ]


def source_projection(env: Environment, uid: str = "events") -> tuple[str, ...] | None:
    """The fields the source's spec says the job reads, checked against what its operator decodes."""
    t = env.graph.transformations[uid]
    spec = t.source_spec
    decoder = t.factory()._decoder
    wanted = Schema.of(FIELDS).names if spec.projection is None else {*spec.projection, "ts"}
    assert decoder.schema.names == tuple(n for n in Schema.of(FIELDS).names if n in wanted)
    return spec.projection  # type: ignore[no-any-return]


def test_a_source_read_only_by_columnar_windows_decodes_only_their_fields() -> None:
    env = Environment("j")
    events = columnar_source(env)
    windows = events.key_by("key").window(TumblingEventTimeWindows(10))
    windows.aggregate(count_sum(), uid="win")
    assert source_projection(env) == ("key", "value")
    events.key_by("id").window(TumblingEventTimeWindows(10)).aggregate({"n": Count()}, uid="by-id")
    assert source_projection(env) == ("id", "key", "value")


@pytest.mark.parametrize(
    "reads_records",
    [
        lambda events: events.map(lambda e: e, uid="m"),
        lambda events: events.key_by(lambda e: e["key"]),
        lambda events: events.rebalance(),
        lambda events: (
            events.key_by("key")
            .window(TumblingEventTimeWindows(10))
            .side_output_late_data(weir.api.OutputTag("late"))
            .aggregate(count_sum(), uid="late-win")
        ),
    ],
)
def test_a_source_whose_batches_become_records_decodes_every_field(reads_records: Callable[[Any], Any]) -> None:
    env = Environment("j")
    events = columnar_source(env)
    events.key_by("key").window(TumblingEventTimeWindows(10)).aggregate(count_sum(), uid="win")
    reads_records(events)
    assert source_projection(env) is None
    events.key_by("key").window(TumblingEventTimeWindows(10)).aggregate({"n": Count()}, uid="after")
    assert source_projection(env) is None  # records need every field, whatever comes after


def test_a_projected_source_takes_a_record_whatever_its_unread_fields_hold(start_operator: StartOperator) -> None:
    env = Environment("j")
    columnar_source(env).key_by("key").window(TumblingEventTimeWindows(10)).aggregate(count_sum(), uid="win")
    decoder = env.graph.transformations["events"].factory()._decoder
    good, bad = decoder.decode(
        [
            b'{"id": 7, "key": "a", "value": 1, "ts": 3}',  # id is not read: not checked
            b'{"key": "b", "value": 2, "ts": 4}',
            b'{"id": "x", "key": "c", "value": "2", "ts": 5}',  # value is read: refused
        ]
    )
    assert [list(column) for column in decoder.columns(good)] == [["a", "b"], [1, 2], [3, 4]]
    assert [(i, reason.split(":")[0]) for i, reason in bad] == [(2, "ValueError")]


def test_an_unknown_key_or_aggregate_field_fails_the_build() -> None:
    env = Environment("j")
    events = columnar_source(env)
    with pytest.raises(JobDefinitionError, match="no field 'user'"):
        events.key_by("user")
    windowed = events.key_by("key").window(TumblingEventTimeWindows(10))
    with pytest.raises(JobDefinitionError, match="no field 'amount'"):
        windowed.aggregate({"sum": Sum("amount")}, uid="win")
    with pytest.raises(JobDefinitionError, match="no field 'price'"):
        windowed.aggregate({"avg": Mean("price"), "n": Count()}, uid="win")
    with pytest.raises(JobDefinitionError, match="aggregate name 'key' is taken"):
        windowed.aggregate({"key": Count()}, uid="win")
    assert "win" not in env.graph.transformations


# Per-record consumers: the <uid>-records operator -------------------------------------------------------


def test_per_record_consumers_share_one_records_operator() -> None:
    env = Environment("j", parallelism=3)
    events = columnar_source(env, parallelism=2)
    events.map(lambda r: r["value"], uid="values").print(uid="out")
    events.filter(lambda r: r["value"] > 0, uid="positive")
    events.print(uid="raw")
    records = [t for t in env.graph.transformations.values() if t.uid.endswith("-records")]
    assert [t.uid for t in records] == ["events-records"]
    t = records[0]
    assert isinstance(t.factory(), ToRecordsOperator)
    assert t.parallelism == 2 and not t.columnar
    (source_edge,) = edges_into(env.graph, "events-records")
    assert source_edge.source_uid == "events" and source_edge.partitioning is Partitioning.FORWARD
    for uid in ("values", "positive", "raw"):
        (edge,) = edges_into(env.graph, uid)
        assert edge.source_uid == "events-records"
    assert [e.target_uid for e in env.graph.outputs_of("events")] == ["events-records"]
    env.graph.validate()


def test_key_by_a_function_on_a_columnar_stream_keys_its_records() -> None:
    env = Environment("j", parallelism=2)
    keyed = columnar_source(env).key_by(lambda r: r["key"].upper())
    assert isinstance(keyed, KeyedStream)
    keyed.reduce(lambda a, b: b, uid="latest")
    (edge,) = edges_into(env.graph, "latest")
    assert edge.source_uid == "events-records" and edge.partitioning is Partitioning.HASH
    assert edge.key_selector({"key": "a"}) == "A"
    assert not any(e.key_selector is not None for e in edges_into(env.graph, "events-records"))


def test_an_aggregate_function_on_a_columnar_keyed_stream_takes_records() -> None:
    class CountAndSum:
        def create(self) -> tuple[int, int]:
            return (0, 0)

        def add(self, acc: tuple[int, int], record: dict[str, Any]) -> tuple[int, int]:
            return (acc[0] + 1, acc[1] + record["value"])

        def result(self, key: str, start: int, end: int, acc: tuple[int, int]) -> tuple[str, int, int]:
            return key, acc[0], acc[1]

    env = Environment("j", parallelism=2)
    keyed = columnar_source(env).key_by("key")
    keyed.window(TumblingEventTimeWindows(10)).aggregate(CountAndSum(), uid="win")
    keyed.reduce(lambda a, b: b, uid="latest")
    op = env.graph.transformations["win"].factory()
    assert type(op) is WindowAggregateOperator
    for uid in ("win", "latest"):
        (edge,) = edges_into(env.graph, uid)
        assert edge.source_uid == "events-records" and edge.partitioning is Partitioning.HASH
        assert edge.key_selector == FieldKey("key")
    assert len([t for t in env.graph.transformations if t.endswith("-records")]) == 1
    env.graph.validate()


@pytest.mark.parametrize(
    "through",
    [
        lambda s: s.rebalance(),
        lambda s: s.broadcast(),
        lambda s: s.key_by("key").key_by(lambda r: r["id"]),
        lambda s: s.key_by("key").rebalance(),
    ],
    ids=["rebalance", "broadcast", "re-key", "keyed-rebalance"],
)
def test_a_repartitioned_columnar_stream_reaches_a_per_record_operator_as_records(
    through: Callable[[ColumnarStream], Any],
) -> None:
    env = Environment("j", parallelism=2)
    through(columnar_source(env)).map(lambda r: r["value"], uid="values")
    (edge,) = edges_into(env.graph, "values")
    assert edge.source_uid == "events-records"


def test_a_user_operator_named_like_the_records_operator_is_not_taken_for_it() -> None:
    env = Environment("j")
    env.from_generator(lambda i: i, uid="events-records", count=3)
    events = columnar_source(env)
    try:
        events.map(lambda r: r["value"], uid="values")
    except JobDefinitionError:
        return  # a clear build error would do as well
    (edge,) = edges_into(env.graph, "values")
    assert edge.source_uid != "events-records" or isinstance(
        env.graph.transformations["events-records"].factory(), ToRecordsOperator
    )
    assert any(e.source_uid == "events" for e in env.graph.edges)


def test_the_columnar_names_are_exported() -> None:
    for name in ("ColumnarStream", "Count", "Sum", "Min", "Max", "Mean", "Schema", "FieldKey", "load_job_file"):
        assert name in weir.api.__all__, name


# key_by a field on a per-record stream ------------------------------------------------------------------


def test_key_by_a_field_on_a_record_stream_works_with_builtin_aggregates(start_operator: StartOperator) -> None:
    env = Environment("j", parallelism=2)
    src = env.from_generator(
        lambda i: {"user": f"u{i % 3}", "amount": i}, uid="gen", count=30, timestamp=lambda e: e["amount"]
    )
    keyed = src.key_by("user")
    assert isinstance(keyed, KeyedStream) and not isinstance(keyed, ColumnarStream)
    keyed.window(TumblingEventTimeWindows(10)).aggregate({"n": Count(), "total": Sum("amount")}, uid="win")
    (edge,) = edges_into(env.graph, "win")
    assert edge.source_uid == "gen" and edge.key_selector == FieldKey("user")
    op = env.graph.transformations["win"].factory()
    assert type(op) is WindowAggregateOperator and isinstance(op._fn, BuiltinAggregates)
    out = start_operator(op, uid="win")
    for i in range(30):
        op.process({"user": f"u{i % 3}", "amount": i}, i)
    op.process_watermark(MAX_WATERMARK)
    results = sorted(out.values, key=lambda r: (r["window_start"], r["user"]))
    assert results[:3] == [
        {"user": "u0", "window_start": 0, "window_end": 10, "n": 4, "total": 18},
        {"user": "u1", "window_start": 0, "window_end": 10, "n": 3, "total": 12},
        {"user": "u2", "window_start": 0, "window_end": 10, "n": 3, "total": 15},
    ]
    assert len(results) == 9


def test_builtin_aggregates_keyed_by_a_function_put_the_key_under_key(start_operator: StartOperator) -> None:
    env = Environment("j")
    src = env.from_generator(lambda i: {"v": i}, uid="gen", count=1, timestamp=lambda e: e["v"])
    src.key_by(lambda e: e["v"] % 2).window(TumblingEventTimeWindows(10)).aggregate({"n": Count()}, uid="win")
    op = env.graph.transformations["win"].factory()
    out = start_operator(op, uid="win")
    op.process({"v": 3}, 3)
    op.process_watermark(MAX_WATERMARK)
    assert out.values == [{"key": 1, "window_start": 0, "window_end": 10, "n": 1}]


def test_key_by_takes_a_function_or_a_field_name() -> None:
    env = Environment("j")
    src = env.from_generator(lambda i: i, uid="gen", count=1)
    with pytest.raises(JobDefinitionError, match="key_by takes a function of the record or a field name, not 3"):
        src.key_by(3)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="non-empty str"):
        src.key_by("")


# The example job ------------------------------------------------------------------------------------


@pytest.mark.parametrize("columnar", ["true", "false"])
def test_the_keyed_aggregation_example_builds_on_both_paths(columnar: str) -> None:
    loaded = load_job_file(EXAMPLE, {"columnar": columnar}, parallelism=2)
    graph = loaded.graph
    graph.validate()
    source = graph.transformations["events-source"]
    assert source.columnar is (columnar == "true")
    window = graph.transformations["window-count-sum"]
    op = window.factory()
    (edge,) = graph.inputs_of("window-count-sum")
    assert edge.partitioning is Partitioning.HASH
    if columnar == "true":
        assert isinstance(op, ColumnarWindowAggregateOperator)
        assert edge.source_uid == "events-source" and edge.key_selector == FieldKey("key")
        assert not any(uid.endswith("-records") for uid in graph.transformations)
    else:
        assert type(op) is WindowAggregateOperator
        assert edge.source_uid == "key-value" and edge.key_selector(("k", 1)) == "k"
    assert {e.target_uid for e in graph.outputs_of("window-count-sum")} == {"kafka-sink", "postgres-sink"}


def test_both_example_paths_give_the_same_results_and_state(start_operator: StartOperator) -> None:
    """The window of each path, fed the same events, fires the same dicts and keeps (key, (count, sum))."""
    ops = {}
    for columnar in ("true", "false"):
        graph = load_job_file(EXAMPLE, {"columnar": columnar, "window.size_ms": "10"}).graph
        ops[columnar] = graph.transformations["window-count-sum"].factory()
    columnar_out = start_operator(ops["true"], uid="col")
    records_out = start_operator(ops["false"], uid="rec")
    events = [("e1", "a", 2, 1), ("e2", "b", 3, 4), ("e3", "a", 5, 12), ("e4", "a", 7, 8)]
    decoder = Schema.of(FIELDS).decoder("ts")
    ops["true"].process(decoder.batch([list(c) for c in zip(*events, strict=True)]), None)
    for _id, key, value, ts in events:
        ops["false"].process((key, value), ts)  # what the "project" map hands the window
    snapshots = {columnar: op.snapshot_state(1) for columnar, op in ops.items()}
    rec_state = {sk: v for kg in range(128) for sk, v in ops["false"].store.items("win", kg)}
    assert [v for kg in range(128) for _sk, v in ops["true"].store.items("win", kg)] == []
    rows = pending_windows_of(snapshots["true"] or b"")  # the columnar window keeps them in its operator state
    assert rows is not None
    pending = {(key, start, acc) for key, start, acc in decode_pending_windows(rows)}
    assert pending == {(key, window_bounds(sk)[0], acc) for sk, (key, acc) in rec_state.items()}
    assert sorted(rec_state.values()) == [("a", (1, 5)), ("a", (2, 9)), ("b", (1, 3))]
    for op in ops.values():
        op.process_watermark(MAX_WATERMARK)
    assert sorted(columnar_out.values, key=str) == sorted(records_out.values, key=str)
    assert len(records_out.values) == 3

"""Reference mode: a job's graph run in-process over bounded input, with its sinks captured.

No service is needed: sinks are captures and Kafka sources read injected records; any attempt to
reach Kafka or PostgreSQL fails the test.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from weir.connectors import kafka, postgres
from weir.core.errors import JobDefinitionError
from weir.operators.sinks import json_serializer
from weir.tools.reference import KafkaRecord, ReferenceModeError, run_reference, run_reference_source

WINDOW_JOB = """
from weir.api import Environment, TumblingEventTimeWindows


class CountAndSum:
    def create(self):
        return (0, 0)

    def add(self, acc, event):
        return (acc[0] + 1, acc[1] + event["value"])

    def result(self, key, start, end, acc):
        return {"key": key, "window_start": start, "window_end": end, "count": acc[0], "sum": acc[1]}


def event(i):
    return {"key": f"k{i % 7}", "value": i % 13, "ts": 10_000 + 3 * i}


def build(env: Environment) -> None:
    p = env.params
    events = env.from_generator(
        event, uid="gen", count=p.get_int("count", 1000), timestamp=lambda e: e["ts"],
        records_per_second=p.get_int("rate", 0) or None,
    )
    results = events.key_by(lambda e: e["key"]).window(TumblingEventTimeWindows(100)).aggregate(
        CountAndSum(), uid="window")
    results.sink_to_kafka("window-results", uid="kafka-sink", key=lambda r: r["key"])
    results.sink_to_postgres(
        "window_results", uid="postgres-sink",
        columns=("key", "window_start", "window_end", "count", "sum"), key_columns=("key", "window_start"))
    results.print(uid="print-sink")
"""

KAFKA_JOB = """
import json
from weir.api import Environment, TumblingEventTimeWindows


class Count:
    def create(self):
        return 0

    def add(self, acc, event):
        return acc + 1

    def result(self, key, start, end, acc):
        return [key, start, acc]


def build(env: Environment) -> None:
    p = env.params
    events = env.from_kafka(
        "events", uid="events-source", deserializer=json.loads, timestamp=lambda e: e["ts"],
        max_out_of_orderness_ms=p.get_int("ooo", 0), dead_letter_topic=p.get("dlq"),
    )
    events.key_by(lambda e: e["key"]).window(TumblingEventTimeWindows(10)).aggregate(
        Count(), uid="window").sink_to_kafka("counts", uid="kafka-sink")
"""


@pytest.fixture(autouse=True)
def no_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reference mode must never connect anything: every client factory fails the test."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("reference mode tried to reach an external service")

    for name in ("producer", "consumer", "admin", "topic_partition_count", "read_committed_records"):
        monkeypatch.setattr(kafka, name, refuse)
    monkeypatch.setattr(postgres, "connect", refuse)


@pytest.fixture
def job_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "window_job.py"
    path.write_text(WINDOW_JOB)
    yield path


def expected_windows(count: int) -> list[dict[str, Any]]:
    """The window job's results computed directly, without Weir."""
    acc: dict[tuple[str, int], tuple[int, int]] = {}
    for i in range(count):
        key, value, ts = f"k{i % 7}", i % 13, 10_000 + 3 * i
        start = ts - ts % 100
        n, total = acc.get((key, start), (0, 0))
        acc[(key, start)] = (n + 1, total + value)
    return [
        {"key": k, "window_start": s, "window_end": s + 100, "count": n, "sum": t} for (k, s), (n, t) in acc.items()
    ]


def by_window(values: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    out = {(v["key"], v["window_start"]): v for v in values}
    assert len(out) == len(values), "a window fired twice"
    return out


def test_window_aggregation_matches_a_direct_computation(job_file: Path) -> None:
    result = run_reference(job_file, {"count": "1000"})

    expected = by_window(expected_windows(1000))
    assert by_window(result["kafka-sink"]) == expected
    assert by_window(result["postgres-sink"]) == expected
    assert set(result) == {"kafka-sink", "postgres-sink", "print-sink"}
    assert result.late_records == {"window": 0}
    assert result.sources["gen"].records == 1000


def test_sinks_are_described_for_comparison_with_the_real_systems(job_file: Path) -> None:
    result = run_reference(job_file, {"count": "200"})

    kafka_sink = result.sinks["kafka-sink"]
    assert (kafka_sink.description.kind, kafka_sink.description.target) == ("kafka", "window-results")
    assert kafka_sink.serialized_values() == [json_serializer(v) for v in result["kafka-sink"]]
    assert kafka_sink.serialized_keys() == [v["key"].encode() for v in result["kafka-sink"]]

    pg = result.sinks["postgres-sink"]
    assert (pg.description.kind, pg.description.target) == ("postgres", "window_results")
    assert pg.description.key_columns == ("key", "window_start")
    assert pg.final_rows() == {
        (v["key"], v["window_start"]): (v["key"], v["window_start"], v["window_end"], v["count"], v["sum"])
        for v in expected_windows(200)
    }
    assert result.sinks["print-sink"].description.kind == "print"


def test_a_rate_limited_generator_runs_at_full_speed(job_file: Path) -> None:
    result = run_reference(job_file, {"count": "3000", "rate": "1"})  # 1 record/s would take an hour

    assert by_window(result["kafka-sink"]) == by_window(expected_windows(3000))


def test_an_unbounded_generator_is_refused() -> None:
    job = """
def build(env):
    env.from_generator(lambda i: i, uid="forever").print(uid="out")
"""
    with pytest.raises(ReferenceModeError, match="generator source 'forever' has no count"):
        run_reference_source(job)


def test_state_lives_in_a_temporary_directory_deleted_after_the_run(
    job_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))

    run_reference(job_file, {"count": "100"})

    assert list(scratch.iterdir()) == []


def test_a_failing_job_function_fails_the_run_with_the_job_named() -> None:
    job = """
def build(env):
    env.from_collection([1, 2, 0], uid="numbers").map(lambda x: 1 // x, uid="invert").print(uid="out")
"""
    with pytest.raises(ReferenceModeError, match=r"job 'job' failed while source 'numbers' emitted: ZeroDivisionError"):
        run_reference_source(job)


def test_union_of_two_sources_waits_for_both_watermarks() -> None:
    job = """
from weir.api import TumblingEventTimeWindows

class Sum:
    def create(self): return 0
    def add(self, acc, v): return acc + v["v"]
    def result(self, key, start, end, acc): return (key, start, acc)

def build(env):
    slow = env.from_generator(lambda i: {"v": 1, "ts": i}, uid="a", count=50, timestamp=lambda e: e["ts"])
    fast = env.from_generator(lambda i: {"v": 10, "ts": 10 * i}, uid="b", count=50, timestamp=lambda e: e["ts"])
    slow.union(fast, uid="both").key_by(lambda e: "all").window(TumblingEventTimeWindows(100)).aggregate(
        Sum(), uid="window").print(uid="out")
"""
    result = run_reference_source(job)

    # Source b's watermark runs ahead of a's; the union holds it back, so no record of a is late.
    assert result.late_records == {"window": 0}
    assert sorted(result["out"]) == [("all", 0, 50 + 100)] + [("all", s, 100) for s in range(100, 500, 100)]


# Kafka sources: records injected in place of the topic -------------------------------------------


def records(events: dict[int, list[Any]]) -> list[KafkaRecord]:
    """Records per partition; a str is written as is (malformed), anything else as JSON."""
    out = []
    for partition, values in events.items():
        for offset, value in enumerate(values):
            raw = value.encode() if isinstance(value, str) else json.dumps(value).encode()
            out.append(KafkaRecord(partition, offset, None, raw, 0))
    return out


def test_kafka_source_reads_every_partition_and_captures_dead_letters() -> None:
    topic: dict[int, list[Any]] = {
        0: [{"key": "a", "ts": t} for t in range(0, 30, 3)],
        1: [{"key": "b", "ts": t} for t in range(0, 30, 2)] + ["{not json"],
        2: ["nope", {"key": "a", "ts": 5}, {"key": "c", "ts": 29}],
    }
    seen: list[str] = []

    def read(name: str) -> list[KafkaRecord]:
        seen.append(name)
        return records(topic)

    result = run_reference_source(KAFKA_JOB, {"dlq": "events-dlq"}, kafka_input=read)

    assert seen == ["events"]
    expected: dict[tuple[str, int], int] = {}
    for values in topic.values():
        for v in values:
            if isinstance(v, dict):
                window = (v["key"], v["ts"] - v["ts"] % 10)
                expected[window] = expected.get(window, 0) + 1
    assert sorted(result["kafka-sink"]) == sorted([k, s, n] for (k, s), n in expected.items())
    source = result.sources["events-source"]
    assert source.records == sum(len(v) for v in topic.values())
    assert [(d["partition"], d["offset"]) for d in source.dead_letters] == [(2, 0), (1, 15)]
    assert all(d["reason"].startswith("JSONDecodeError") for d in source.dead_letters)
    assert result.dead_lettered == 2
    assert not source.job_bounded  # the job reads it unbounded; reference mode bounded it anyway


def test_kafka_source_without_dead_letter_topic_fails_on_a_malformed_record() -> None:
    with pytest.raises(JobDefinitionError, match="malformed record at events\\[0\\]@1"):
        run_reference_source(KAFKA_JOB, kafka_input=lambda _t: records({0: [{"key": "a", "ts": 1}, "bad"]}))


def test_records_behind_their_partition_watermark_are_reported_late() -> None:
    topic = {0: [{"key": "a", "ts": 5}, {"key": "a", "ts": 25}, {"key": "a", "ts": 3}]}

    late = run_reference_source(KAFKA_JOB, kafka_input=lambda _t: records(topic))
    tolerated = run_reference_source(KAFKA_JOB, {"ooo": "30"}, kafka_input=lambda _t: records(topic))

    assert late.late_records == {"window": 1}
    assert sorted(late["kafka-sink"]) == [["a", 0, 1], ["a", 20, 1]]
    assert tolerated.late_records == {"window": 0}
    assert sorted(tolerated["kafka-sink"]) == [["a", 0, 2], ["a", 20, 1]]


def test_a_versioned_postgres_sink_keeps_the_newest_row_per_key() -> None:
    job = """
def build(env):
    rows = [{"k": "a", "v": 2, "x": "new"}, {"k": "a", "v": 1, "x": "old"}, {"k": "b", "v": 1, "x": "only"}]
    stream = env.from_collection(rows, uid="rows")
    stream.sink_to_postgres("t", uid="versioned", columns=("k", "v", "x"), key_columns=("k",), version_column="v")
    stream.sink_to_postgres("t", uid="plain", columns=("k", "v", "x"), key_columns=("k",), delivery="upsert")
"""
    result = run_reference_source(job)

    assert result.sinks["versioned"].final_rows() == {("a",): ("a", 2, "new"), ("b",): ("b", 1, "only")}
    assert result.sinks["plain"].final_rows() == {("a",): ("a", 1, "old"), ("b",): ("b", 1, "only")}


# One executor, two drivers -----------------------------------------------------------------------


def test_the_reference_run_and_a_cluster_task_drive_the_same_operator_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """A change to OperatorChain's end of input is seen by a reference run and by a TaskManager's Task
    alike: both end each vertex's chain through it, so the two cannot drift."""
    from tests.unit.taskmanager.fakes import make_task
    from weir.core.states import TaskState
    from weir.taskmanager.chain import OperatorChain

    ended: list[str] = []
    end_input = OperatorChain.end_input

    def recorded(chain: OperatorChain) -> None:
        ended.append(chain.vertex.uid)
        end_input(chain)

    monkeypatch.setattr(OperatorChain, "end_input", recorded)
    job = """
def build(env):
    a = env.from_collection([1, 2], uid="a")
    b = env.from_collection([3], uid="b")
    a.union(b, uid="both").key_by(lambda v: v % 2).map(lambda v: v * 10, uid="tens").print(uid="out")
"""
    assert sorted(run_reference_source(job)["out"]) == [10, 20, 30]
    # Every vertex of the plan, each once its inputs ended: source b (one record) ends before a.
    assert ended == ["b", "a", "both", "tens"]

    harness = make_task("op", channels=1)
    assert harness.gate is not None
    from weir.taskmanager.network.codec import end_of_stream_message

    harness.gate.push(0, end_of_stream_message())
    harness.task.start()
    harness.wait_for_state(TaskState.FINISHED)
    assert ended[-1] == "op"


# A columnar Kafka source: polled in runs of a partition's records ---------------------------------

COLUMNAR_JOB = """
from weir.api import Count, Environment, TumblingEventTimeWindows


def build(env: Environment) -> None:
    events = env.from_kafka(
        "events", uid="events-source", schema={"key": str, "ts": int}, timestamp_field="ts",
        max_out_of_orderness_ms=env.params.get_int("ooo", 0),
    )
    events.key_by("key").window(TumblingEventTimeWindows(10)).aggregate({"n": Count()}, uid="window").sink_to_kafka(
        "counts", uid="kafka-sink")
"""


def window_counts(values: list[Any]) -> list[tuple[str, int, int]]:
    return sorted((v["key"], v["window_start"], v["n"]) for v in values)


def test_a_columnar_source_is_polled_in_runs_of_its_partitions_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """One poll per record made a one-row record batch per record (the columnar path's cost is per
    batch): a job restored after 400,000 events spent 89 s in its reference run. A run of a partition's
    records per poll gives the same windows."""
    from weir.tools import reference

    polls: list[int] = []
    poll = reference._ReplayKafkaSource.poll

    def counted(source: Any, max_records: int) -> bool:
        polls.append(max_records)
        return poll(source, max_records)

    monkeypatch.setattr(reference._ReplayKafkaSource, "poll", counted)
    events = [(f"k{i % 5}", 2 * i) for i in range(3000)]
    topic: dict[int, list[Any]] = {p: [{"key": k, "ts": ts} for k, ts in events] for p in range(3)}

    result = run_reference_source(COLUMNAR_JOB, kafka_input=lambda _t: records(topic))

    expected = Counter((k, ts - ts % 10) for k, ts in events * 3)
    assert window_counts(result["kafka-sink"]) == sorted((k, s, n) for (k, s), n in expected.items())
    assert result.late_records == {"window": 0}
    assert len(polls) <= 20, f"{len(polls)} polls for 9000 records"


@pytest.mark.parametrize("job", [KAFKA_JOB, COLUMNAR_JOB], ids=["records", "columnar"])
def test_records_behind_their_partition_watermark_are_late_on_both_paths(job: str) -> None:
    """A columnar source's run ends before a record behind its partition's watermark: that record is
    dropped as it is one record at a time (a run of all three would hold it before the watermark)."""
    topic = {0: [{"key": "a", "ts": 5}, {"key": "a", "ts": 25}, {"key": "a", "ts": 3}, {"key": "a", "ts": 27}]}

    late = run_reference_source(job, kafka_input=lambda _t: records(topic))
    tolerated = run_reference_source(job, {"ooo": "30"}, kafka_input=lambda _t: records(topic))

    def counts(values: list[Any]) -> list[tuple[str, int, int]]:
        return window_counts(values) if job is COLUMNAR_JOB else sorted(tuple(v) for v in values)

    assert late.late_records == {"window": 1}
    assert counts(late["kafka-sink"]) == [("a", 0, 1), ("a", 20, 2)]
    assert tolerated.late_records == {"window": 0}
    assert counts(tolerated["kafka-sink"]) == [("a", 0, 2), ("a", 20, 2)]

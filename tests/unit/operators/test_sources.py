"""The generator source driven directly, the Pacer's arithmetic with a fake clock, and the Kafka
source's idleness with a fake consumer and a fake clock."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.unit.conftest import CollectingOutput, StartOperator
from weir.api import Environment, GeneratorSourceSpec, KafkaSourceSpec
from weir.core.errors import JobDefinitionError
from weir.core.watermarks import MAX_WATERMARK, WatermarkStatus
from weir.operators import sources
from weir.operators.sources import GeneratorSourceOperator, KafkaSourceOperator, Pacer
from weir.tools.reference import KafkaRecord, run_reference_source


def spec(
    count: int | None,
    timestamp: Callable[[Any], int] | None = None,
    max_out_of_orderness_ms: int = 0,
) -> GeneratorSourceSpec:
    return GeneratorSourceSpec(
        generate=lambda i: {"i": i},
        count=count,
        timestamp=timestamp,
        max_out_of_orderness_ms=max_out_of_orderness_ms,
        records_per_second=None,
    )


def indices(out: CollectingOutput) -> list[int]:
    return [v["i"] for v in out.values]


def drain(source: GeneratorSourceOperator, max_records: int = 1000) -> int:
    polls = 1
    while source.poll(max_records):
        polls += 1
    return polls


@pytest.mark.parametrize(("subtask", "expected"), [(0, [0, 3, 6, 9]), (1, [1, 4, 7]), (2, [2, 5, 8])])
def test_subtask_s_of_p_emits_s_then_every_pth_index(
    start_operator: StartOperator, subtask: int, expected: list[int]
) -> None:
    source = GeneratorSourceOperator(spec(count=10))
    out = start_operator(source, uid="gen", subtask=subtask, parallelism=3)
    drain(source, max_records=2)
    assert indices(out) == expected
    assert out.records[0][1] is None  # no timestamp function: no timestamps


def test_a_bounded_source_ends_with_the_max_watermark(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=4))
    out = start_operator(source, uid="gen", subtask=0, parallelism=2)
    assert source.poll(2) is False  # indices 0 and 2: the end is known without another poll
    assert indices(out) == [0, 2]
    assert out.watermarks == [MAX_WATERMARK]
    assert source.poll(2) is False
    assert out.watermarks == [MAX_WATERMARK] and len(out.records) == 2


def test_the_end_found_mid_poll_emits_the_max_watermark_once(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=5))
    out = start_operator(source, uid="gen", subtask=1, parallelism=2)
    assert source.poll(10) is False
    assert indices(out) == [1, 3]
    assert out.watermarks == [MAX_WATERMARK]


def test_an_empty_subtask_finishes_at_once(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=2))
    out = start_operator(source, uid="gen", subtask=2, parallelism=3)
    assert source.poll(10) is False
    assert out.records == [] and out.watermarks == [MAX_WATERMARK]


def test_an_unbounded_source_keeps_going(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=None))
    out = start_operator(source, uid="gen")
    for _ in range(5):
        assert source.poll(100) is True
    assert indices(out) == list(range(500))
    assert out.watermarks == []


def test_restore_resumes_right_after_the_last_emitted_index(start_operator: StartOperator) -> None:
    before = GeneratorSourceOperator(spec(count=40))
    out_before = start_operator(before, uid="gen", subtask=1, parallelism=4)
    before.poll(3)
    snapshot = before.snapshot_state(1)
    assert snapshot is not None
    before.poll(2)  # emitted after the checkpoint: replayed after the restore
    assert indices(out_before) == [1, 5, 9, 13, 17]

    after = GeneratorSourceOperator(spec(count=40))
    out_after = start_operator(after, uid="gen", subtask=1, parallelism=4, restore=snapshot)
    drain(after)
    assert indices(out_after) == [13, 17, 21, 25, 29, 33, 37]
    assert indices(out_before)[:3] + indices(out_after) == list(range(1, 40, 4))
    assert out_after.watermarks == [MAX_WATERMARK]


def test_watermarks_follow_the_timestamps_minus_the_bound(start_operator: StartOperator) -> None:
    timestamps = spec(count=None, timestamp=lambda v: 1000 + 10 * v["i"], max_out_of_orderness_ms=5)
    source = GeneratorSourceOperator(timestamps)
    out = start_operator(source, uid="gen")
    source.poll(3)
    assert out.records[:3] == [({"i": 0}, 1000), ({"i": 1}, 1010), ({"i": 2}, 1020)]
    assert out.watermarks == [1020 - 5 - 1]
    source.poll(1)
    assert out.watermarks == [1014, 1024]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_pacer_allows_the_subtasks_share_of_the_rate() -> None:
    clock = FakeClock()
    pacer = Pacer(records_per_second=10, parallelism=2, clock=clock)  # 5/s for this subtask: one per 0.2 s
    assert pacer.allowed(100) == 0
    assert pacer.wait_s() == pytest.approx(0.2)
    clock.now += 0.5
    assert pacer.allowed(100) == 2
    assert pacer.allowed(1) == 1
    pacer.consumed(2)
    assert pacer.allowed(100) == 0
    assert pacer.wait_s() == pytest.approx(0.1)
    clock.now += 1.0
    assert pacer.allowed(100) == 5  # 7 due in 1.5 s, 2 taken
    pacer.consumed(1)
    assert pacer.allowed(100) == 4
    assert pacer.wait_s() == 0.0  # behind schedule: no wait


def test_pacer_does_not_bank_more_than_was_due() -> None:
    clock = FakeClock()
    pacer = Pacer(records_per_second=8, parallelism=1, clock=clock)
    clock.now += 1.0
    assert pacer.allowed(1000) == 8
    pacer.consumed(8)
    assert pacer.allowed(1000) == 0
    clock.now += 0.25
    assert pacer.allowed(1000) == 2


def test_pacer_without_a_rate_allows_everything() -> None:
    pacer = Pacer(records_per_second=None, parallelism=3, clock=FakeClock())
    assert pacer.allowed(1234) == 1234
    pacer.consumed(1234)
    assert pacer.allowed(7) == 7
    assert pacer.wait_s() == 0.0


# The Kafka source's idleness (Flink's withIdleness) ------------------------------------------------


@dataclass(frozen=True)
class FakeMessage:
    _partition: int
    _offset: int
    _value: bytes

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


class FakeConsumer:
    """Hands out what the test queued, then nothing (a live consumer with no new records)."""

    def __init__(self) -> None:
        self.queued: list[FakeMessage] = []
        self.assigned: list[int] = []
        self._offsets: dict[int, int] = {}

    def add(self, partition: int, ts: int) -> None:
        offset = self._offsets.get(partition, 0)
        self._offsets[partition] = offset + 1
        self.queued.append(FakeMessage(partition, offset, json.dumps({"ts": ts}).encode()))

    def assign(self, next_offsets: dict[int, int | None]) -> None:
        self.assigned = sorted(next_offsets)

    def consume(self, max_messages: int, timeout_s: float) -> list[FakeMessage]:
        out, self.queued = self.queued[:max_messages], self.queued[max_messages:]
        return out

    @staticmethod
    def is_end_of_partition(error: object) -> bool:
        return False

    def close(self) -> None:
        return None


def kafka_spec(idle_timeout_ms: int | None) -> KafkaSourceSpec:
    return KafkaSourceSpec(
        topic="events",
        bounded=False,
        deserializer=json.loads,
        timestamp=lambda e: e["ts"],
        max_out_of_orderness_ms=0,
        dead_letter_topic=None,
        idle_timeout_ms=idle_timeout_ms,
    )


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], FakeConsumer]:
    """Patch the source's Kafka access: a topic of ``partitions`` partitions read by a FakeConsumer."""
    consumer = FakeConsumer()

    def with_partitions(partitions: int) -> FakeConsumer:
        monkeypatch.setattr(sources.kafka, "partition_count", lambda _endpoints, _topic: partitions)
        monkeypatch.setattr(sources.kafka, "PartitionReader", lambda _endpoints, _topic, **_kw: consumer)
        return consumer

    return with_partitions


def test_an_empty_partition_goes_idle_and_no_longer_holds_the_watermark(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer]
) -> None:
    consumer, clock = fake_kafka(2), FakeClock(100.0)
    source = KafkaSourceOperator(kafka_spec(idle_timeout_ms=1000), clock=clock)
    with capture_logs() as logs:
        out = start_operator(source, uid="events-source")
        assert consumer.assigned == [0, 1]
        consumer.add(0, 5000)
        assert source.poll(10) is True
        assert out.watermarks == []  # partition 1 has no record: it holds the watermark at MIN
        clock.now += 0.999
        consumer.add(0, 6000)
        source.poll(10)
        assert out.watermarks == []
        clock.now += 0.001  # partition 1: 1000 ms without a record since the source opened
        consumer.add(0, 7000)
        source.poll(10)
        assert out.watermarks == [6999]
        assert source.watermark_status() is WatermarkStatus.ACTIVE  # partition 0 is still active
    idle = [e for e in logs if e["event"] == "kafka_partition_idle"]
    assert [(e["partition"], e["topic"], e["idle_timeout_ms"]) for e in idle] == [(1, "events", 1000)]


def test_an_idle_partitions_next_record_makes_it_active_without_moving_the_watermark_back(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer]
) -> None:
    consumer, clock = fake_kafka(2), FakeClock()
    source = KafkaSourceOperator(kafka_spec(idle_timeout_ms=500), clock=clock)
    with capture_logs() as logs:
        out = start_operator(source, uid="events-source")
        clock.now += 0.5
        consumer.add(0, 5000)
        source.poll(10)
        assert out.watermarks == [4999]
        consumer.add(1, 3000)  # partition 1 resumes, behind the watermark already emitted
        source.poll(10)
        consumer.add(0, 8000)
        consumer.add(1, 6000)
        source.poll(10)
        consumer.add(0, 9000)
        source.poll(10)
    assert out.watermarks == [4999, 5999]  # never back; partition 1 holds it again at 5999
    assert all(b > a for a, b in zip(out.watermarks, out.watermarks[1:], strict=False))
    active = [e["partition"] for e in logs if e["event"] == "kafka_partition_active"]
    assert active == [1]


def test_a_source_subtask_whose_partitions_are_all_idle_reports_idle_until_a_record(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer]
) -> None:
    consumer, clock = fake_kafka(4), FakeClock()
    source = KafkaSourceOperator(kafka_spec(idle_timeout_ms=200), clock=clock)
    out = start_operator(source, uid="events-source", subtask=3, parallelism=4)
    assert consumer.assigned == [3]  # the one partition of subtask 3: empty
    source.poll(10)
    assert source.watermark_status() is WatermarkStatus.ACTIVE
    clock.now += 0.2
    source.poll(10)
    assert source.watermark_status() is WatermarkStatus.IDLE
    assert out.watermarks == []
    consumer.add(3, 1234)
    source.poll(10)
    assert source.watermark_status() is WatermarkStatus.ACTIVE
    assert out.watermarks == [1233]


def test_an_unbounded_subtask_without_partitions_is_idle_and_keeps_running(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer]
) -> None:
    fake_kafka(2)
    source = KafkaSourceOperator(kafka_spec(idle_timeout_ms=100), clock=FakeClock())
    out = start_operator(source, uid="events-source", subtask=2, parallelism=3)
    assert source.watermark_status() is WatermarkStatus.IDLE
    assert source.poll(10) is True and source.idle_wait_s() > 0  # waits between polls, no busy loop
    assert out.watermarks == []


def test_without_an_idle_timeout_an_empty_partition_holds_the_watermark_forever(
    start_operator: StartOperator, fake_kafka: Callable[[int], FakeConsumer]
) -> None:
    consumer, clock = fake_kafka(2), FakeClock()
    source = KafkaSourceOperator(kafka_spec(idle_timeout_ms=None), clock=clock)
    out = start_operator(source, uid="events-source")
    for i in range(5):
        clock.now += 3600.0
        consumer.add(0, 1000 * i)
        source.poll(10)
    assert out.watermarks == []
    assert source.watermark_status() is WatermarkStatus.ACTIVE


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "1000"])
def test_from_kafka_refuses_an_idle_timeout_that_is_not_a_positive_int(bad: Any) -> None:
    env = Environment("job")
    with pytest.raises(JobDefinitionError, match="idle_timeout_ms must be a positive int"):
        env.from_kafka("events", uid="events-source", idle_timeout_ms=bad)


@pytest.mark.parametrize("good", [None, 1, 30_000])
def test_from_kafka_takes_a_positive_idle_timeout_or_none(good: int | None) -> None:
    env = Environment("job")
    env.from_kafka("events", uid="events-source", idle_timeout_ms=good)
    (t,) = env.graph.transformations.values()
    assert t.source_spec.idle_timeout_ms == good


IDLE_JOB = """
import json
from weir.api import Environment, TumblingEventTimeWindows


class Count:
    def create(self):
        return 0

    def add(self, acc, event):
        return acc + 1

    def result(self, key, start, end, acc):
        return [start, acc]


def build(env: Environment) -> None:
    events = env.from_kafka(
        "events", uid="events-source", deserializer=json.loads, timestamp=lambda e: e["ts"], idle_timeout_ms=50
    )
    events.key_by(lambda e: "all").window(TumblingEventTimeWindows(10)).aggregate(
        Count(), uid="window").sink_to_kafka("counts", uid="kafka-sink")
"""


def test_reference_mode_accepts_an_idle_timeout_and_stays_deterministic() -> None:
    records = [KafkaRecord(0, i, None, json.dumps({"ts": 3 * i}).encode(), 0) for i in range(10)]
    result = run_reference_source(IDLE_JOB, kafka_input=lambda _topic: records)
    assert result["kafka-sink"] == [[0, 4], [10, 3], [20, 3]]

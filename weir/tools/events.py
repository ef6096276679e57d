"""Demo and test input for the keyed aggregation: deterministic events produced into Kafka."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from weir.connectors import kafka
from weir.core.errors import ServiceUnavailableError


@dataclass(frozen=True)
class EventSpec:
    count: int = 100_000
    keys: int = 1000
    # Event time starts at the current second: records far in the past would be deleted by the
    # broker's time-based retention (7 days) while a test or demo still reads them.
    start_ms: int = field(default_factory=lambda: int(time.time()) * 1000)
    events_per_ms: int = 10  # event time advances 1 ms every this many events
    malformed_every: int = 0  # 0: none; n: every n-th record is not valid JSON
    min_value: int = 0  # values run min_value .. min_value + 96 (i % 97 above it); below 0 gives negatives


def events(spec: EventSpec) -> Iterator[dict[str, Any]]:
    for i in range(spec.count):
        yield {
            "id": f"e{i}",
            "key": f"key-{i % spec.keys:04d}",
            "value": spec.min_value + i % 97,
            "ts": spec.start_ms + i // spec.events_per_ms,
        }


def produce_events(
    endpoints: kafka.KafkaTarget,
    topic: str,
    spec: EventSpec,
    on_progress: Callable[[int], None] | None = None,
    *,
    records_per_second: float | None = None,
    progress_every: int = 10_000,
    stop: threading.Event | None = None,
) -> int:
    """Produce the events (keyed by their key) and return how many records were written.

    ``records_per_second``: paced, as live input arriving at that rate (None: as fast as possible);
    ``on_progress`` is called with each further ``progress_every`` records (and the rest at the end);
    ``stop`` set: stop producing early (what was produced is flushed). ``endpoints``: the endpoints'
    broker, or a job's Kafka configuration (a secured cluster)."""
    producer = kafka.producer(endpoints, linger_ms=20, batch_num_messages=10_000, enable_idempotence=True)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    started = time.monotonic()
    written = reported = 0
    for i, event in enumerate(events(spec)):
        if stop is not None and stop.is_set():
            break
        if records_per_second:
            ahead_s = started + i / records_per_second - time.monotonic()
            if ahead_s > 0:
                producer.poll(0)
                time.sleep(ahead_s)
        value = json.dumps(event).encode()
        if spec.malformed_every and i % spec.malformed_every == spec.malformed_every - 1:
            value = b"{not json " + value
        while True:
            try:
                producer.produce(topic, key=event["key"].encode(), value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        written += 1
        if written - reported >= progress_every:
            producer.poll(0)
            if on_progress is not None:
                on_progress(written - reported)
            reported = written
    remaining = producer.flush(60)
    if on_progress is not None and written > reported:
        on_progress(written - reported)
    if remaining or errors:
        raise ServiceUnavailableError(f"kafka: {remaining} events not delivered to {topic}: {errors[:3]}")
    return written

"""Load Nexmark events into a Kafka topic: ``python -m weir.tools.nexmark_load --topic T --events N``.

Event ``n`` (``weir.nexmark.event_json(n)``) goes to partition ``n % P`` with the key ``n`` in
ASCII digits: the reference's round-robin partitioning, made deterministic, so a load of the same
events is the same records in the same partitions and each partition's event time is monotone (a
Kafka source's per-partition watermarks need no out-of-orderness allowance). The topic is created
with ``--partitions`` when missing; an existing topic keeps its partition count. ``--first-event``
loads a later range (appending the next events to a topic already holding the first ones).

The records' Kafka timestamps are the producer's clock (event time is in the JSON's ``dateTime``):
a fixed event-time base far in the past would let the broker's time-based retention delete them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from weir import nexmark
from weir.connectors import kafka
from weir.core.config import Endpoints
from weir.core.errors import ServiceUnavailableError
from weir.nexmark import NexmarkConfig


@dataclass(frozen=True)
class NexmarkRecord:
    partition: int
    key: bytes
    value: bytes


class _Producer(Protocol):
    def produce(self, topic: str, *, value: bytes, key: bytes, partition: int, on_delivery: Any) -> None: ...

    def poll(self, timeout: float) -> int: ...

    def flush(self, timeout: float) -> int: ...


def records(first: int, count: int, partitions: int, config: NexmarkConfig) -> Iterator[NexmarkRecord]:
    """The records of events ``first .. first + count - 1``, in event order."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    for n in range(first, first + count):
        yield NexmarkRecord(n % partitions, str(n).encode(), nexmark.event_json(n, config))


def load(
    producer: _Producer,
    topic: str,
    partitions: int,
    count: int,
    *,
    first: int = 0,
    config: NexmarkConfig = nexmark.DEFAULT_CONFIG,
    on_progress: Callable[[int], None] | None = None,
    progress_every: int = 100_000,
    flush_timeout_s: float = 120.0,
) -> int:
    """Produce ``count`` events from ``first`` and wait for their delivery; returns the records
    written. Raises ServiceUnavailableError when some were not delivered."""
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    written = 0
    for record in records(first, count, partitions, config):
        while True:
            try:
                producer.produce(
                    topic, value=record.value, key=record.key, partition=record.partition, on_delivery=on_delivery
                )
                break
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.05)
        written += 1
        if written % progress_every == 0:
            producer.poll(0)
            if on_progress is not None:
                on_progress(written)
    remaining = producer.flush(flush_timeout_s)
    if remaining or errors:
        raise ServiceUnavailableError(
            f"kafka: {remaining or len(errors)} Nexmark events not delivered to {topic}: {errors[:3]}"
        )
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weir.tools.nexmark_load", description=__doc__.split("\n")[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--events", type=int, required=True, help="how many events to produce")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of a new topic (default 8)")
    parser.add_argument("--first-event", type=int, default=0, help="the first event number (default 0)")
    parser.add_argument("--events-per-second", type=int, default=NexmarkConfig.events_per_second)
    parser.add_argument("--base-time-ms", type=int, default=NexmarkConfig.base_time_ms)
    parser.add_argument("--seed", type=int, default=NexmarkConfig.seed)
    args = parser.parse_args(argv)
    config = NexmarkConfig(events_per_second=args.events_per_second, base_time_ms=args.base_time_ms, seed=args.seed)
    endpoints = Endpoints.from_env()
    partitions = kafka.ensure_topic(endpoints, args.topic, args.partitions)
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    started = time.monotonic()

    def progress(written: int) -> None:
        print(f"{written:,} events ({written / (time.monotonic() - started):,.0f}/s)", file=sys.stderr)

    written = load(
        producer, args.topic, partitions, args.events, first=args.first_event, config=config, on_progress=progress
    )
    elapsed = time.monotonic() - started
    print(
        f"produced Nexmark events {args.first_event:,}..{args.first_event + written - 1:,} into {args.topic} "
        f"({partitions} partitions) in {elapsed:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU per record of a transactional producer with and without a delivery callback per record.

``python -m bench.producer_delivery [--records N] [--rounds N] [--output PATH]``: per round, in
alternating order, one transactional producer (confluent-kafka, as ``weir.connectors.kafka``
configures the sink's: ``linger.ms`` 5) produces ``--records`` records of the keyed benchmark's
window results (~70 bytes, 1,000 keys, a new 3-partition topic) into one transaction, with
``on_delivery`` given per record (``callback``: what the Kafka sink did before) or not (``none``:
what it does now), polls every 1,000 records, flushes, commits. The figure is the process's CPU time
(``time.process_time``: librdkafka's threads too) from the first produce to the end of the flush,
per record. Results: ``bench/results/producer-delivery.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any, Final, Literal

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.cpu_bench import git_commit
from bench.provenance import utc_now
from weir.core.config import Endpoints

RESULTS: Final = Path(__file__).resolve().parent / "results" / "producer-delivery.json"
Mode = Literal["callback", "none"]
MODES: Final[tuple[Mode, Mode]] = ("callback", "none")
VALUE: Final = b'{"window_start": 1764920000000, "key": "key-123", "count": 8, "sum": 4012345}'


def run_once(bootstrap: str, mode: Mode, records: int) -> float:
    """CPU µs per record of producing ``records`` into one transaction and flushing it."""
    topic = f"bench-delivery-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        future.result()
    failed: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic, "linger.ms": 5})
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        keys = [b"key-%d" % (i % 1000) for i in range(records)]
        produce = producer.produce
        started = time.process_time()
        for i, key in enumerate(keys):
            while True:
                try:
                    if mode == "callback":
                        produce(topic, VALUE, key=key, timestamp=1000, on_delivery=delivered)
                    else:
                        produce(topic, VALUE, key=key, timestamp=1000)
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 1000 == 0:
                producer.poll(0)
        left = producer.flush(60)
        spent = time.process_time() - started
        producer.commit_transaction(30)
    finally:
        for future in admin.delete_topics([topic]).values():
            future.result()
    if left or failed:
        raise RuntimeError(f"{mode}: {left} record(s) not acknowledged, {len(failed)} failed")
    return spent / records * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    bootstrap = Endpoints.from_env().kafka_bootstrap
    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in order:
            runs[mode].append(round(run_once(bootstrap, mode, args.records), 3))
    medians = {mode: statistics.median(values) for mode, values in runs.items()}
    result = {
        "benchmark": "producer-delivery",
        "commit": git_commit(),
        "measured_at": utc_now(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "records": args.records,
        "cpu_us_per_record": runs,
        "median_cpu_us_per_record": medians,
        "none_over_callback": round(medians["none"] / medians["callback"], 3),
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    for mode in MODES:
        print(f"{mode:>9}: {medians[mode]:.2f} µs/record (runs {runs[mode]})")
    print(f"none / callback: {result['none_over_callback']}")


if __name__ == "__main__":
    main()

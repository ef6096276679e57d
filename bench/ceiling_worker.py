"""The ceiling: a bare confluent-kafka consumer reading the input topic to its end, nothing else.

One process of three (``--index I --of 3``), each reading the partitions ``p % of == index`` by static
assignment, as the raw limit does, with the same ``read_committed`` isolation. A message is counted
and dropped: no decoding, no parsing, no state, no output. What it reaches is what the broker serves
to a Python client on this machine, the line every other contender's figures are read against.

Stops at the end offsets present at start (the runner's throughput runs are bounded). Progress goes to
stdout as ``@progress <messages read>`` lines, ten times a second, then ``@done``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

BATCH = 10_000


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling_worker")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--of", type=int, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    args = parser.parse_args()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": False,
        }
    )
    mine = [p for p in range(args.partitions) if p % args.of == args.index]
    # The input is written without transactions, so its offsets hold no control records: the
    # partitions' messages are exactly end - low, and the count alone says when they are all read.
    expected = sum(high - low for low, high in (_watermarks(consumer, args.input, p) for p in mine))
    consumer.assign([TopicPartition(args.input, p, OFFSET_BEGINNING) for p in mine])
    consumed = [0]

    def report() -> None:
        while not stop.wait(0.1):
            print(f"@progress {consumed[0]}", flush=True)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    print("@ready", flush=True)
    while consumed[0] < expected and not stop.is_set():
        batch = consumer.consume(num_messages=BATCH, timeout=0.1)
        for msg in batch:  # only the error is looked at: the payload is not touched
            if msg.error() and msg.error().code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(f"consuming {args.input}: {msg.error()}")
        consumed[0] += len(batch)
    stop.set()
    reporter.join()  # its lines and the last ones must not interleave
    sys.stdout.write(f"@progress {consumed[0]}\n@done\n")
    sys.stdout.flush()
    consumer.close()
    return 0


def _watermarks(consumer: Consumer, topic: str, partition: int) -> tuple[int, int]:
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    return int(low), int(high)


if __name__ == "__main__":
    sys.exit(main())

"""The raw Python limit: confluent-kafka consume -> dict count+sum per (key, window) -> transactional produce.

One process of three (``--index I --of 3``): it reads the partitions ``p % of == index`` (static
assignment, no group rebalancing), keeps ``{window_start: {key: [count, sum]}}`` per partition in a
dict, closes a window when its partition's event time passes its end, and every second commits one
Kafka transaction holding the closed windows' results and the input offsets
(``send_offsets_to_transaction``). Nothing else: no state snapshots (a crash would lose the open
windows), no watermarks across partitions, no metrics. That makes it an upper bound for any Python
processor doing the same work with exactly-once output, not a system to run.

``--bounded`` stops at the end offsets present at start, after emitting every window. Progress goes
to stdout as ``@progress <events consumed>`` lines, ten times a second.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

import msgspec
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

WINDOW_MS = 1000
COMMIT_INTERVAL_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raw_worker")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--of", type=int, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--bounded", action="store_true")
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
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": f"{args.group}-{args.index}",
            "linger.ms": 5,
        }
    )
    mine = [p for p in range(args.partitions) if p % args.of == args.index]
    ends = (
        {p: consumer.get_watermark_offsets(TopicPartition(args.input, p), timeout=30)[1] for p in mine}
        if args.bounded
        else {}
    )
    consumer.assign([TopicPartition(args.input, p, OFFSET_BEGINNING) for p in mine])
    producer.init_transactions(30)
    producer.begin_transaction()

    windows: dict[int, dict[int, dict[str, list[int]]]] = {p: {} for p in mine}
    event_time: dict[int, int] = {p: -1 for p in mine}
    positions: dict[int, int] = {}
    consumed = [0]
    out_topic = args.output
    # The JSON library Weir's codec uses (weir/core/json_codec.py, chosen by bench/json_bench.py), called
    # directly: the ratio compares engines, not parsers.
    decode = msgspec.json.Decoder().decode
    encode = msgspec.json.Encoder().encode

    def emit_closed(p: int, up_to: int) -> None:
        """Produce every window of partition ``p`` that ends at or before ``up_to``."""
        open_windows = windows[p]
        for start in sorted(w for w in open_windows if w + WINDOW_MS <= up_to):
            for key, (count, total) in open_windows.pop(start).items():
                value = encode(
                    {"key": key, "window_start": start, "window_end": start + WINDOW_MS, "count": count, "sum": total}
                )
                while True:
                    try:
                        producer.produce(out_topic, value=value, key=key.encode())
                        break
                    except BufferError:
                        producer.poll(0.01)

    def commit(begin_next: bool = True) -> None:
        if positions:
            offsets = [TopicPartition(args.input, p, o) for p, o in positions.items()]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(60)
        if begin_next:
            producer.begin_transaction()

    def report() -> None:
        while not stop.wait(0.1):
            print(f"@progress {consumed[0]}", flush=True)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    print("@ready", flush=True)
    last_commit = time.monotonic()
    while not stop.is_set():
        for msg in consumer.consume(num_messages=1000, timeout=0.1):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consuming {args.input}: {msg.error()}")
            event = decode(msg.value())
            p = msg.partition()
            ts = event["ts"]
            start = ts - ts % WINDOW_MS
            per_key = windows[p].get(start)
            if per_key is None:
                per_key = windows[p][start] = {}
            acc = per_key.get(event["key"])
            if acc is None:
                per_key[event["key"]] = [1, event["value"]]
            else:
                acc[0] += 1
                acc[1] += event["value"]
            positions[p] = msg.offset() + 1
            consumed[0] += 1
            if ts > event_time[p]:
                previous = event_time[p]
                event_time[p] = ts
                if previous // WINDOW_MS != ts // WINDOW_MS:
                    emit_closed(p, ts - ts % WINDOW_MS)
        now = time.monotonic()
        if now - last_commit >= COMMIT_INTERVAL_S:
            commit()
            last_commit = now
        if args.bounded and all(positions.get(p, 0) >= end for p, end in ends.items()):
            for p in mine:
                emit_closed(p, sys.maxsize)
            break
    commit(begin_next=False)
    stop.set()
    reporter.join()  # its lines and the last ones must not interleave
    sys.stdout.write(f"@progress {consumed[0]}\n@done\n")
    sys.stdout.flush()
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Quix Streams contender: the keyed 1 s tumbling count+sum, exactly-once, output to Kafka.

One process of three in one consumer group. Event time is the payload's ``ts`` (a timestamp
extractor), windows close per partition (``final(closing_strategy="partition")``, the nearest to a
watermark), state lives in Quix's RocksDB stores backed by changelog topics, and the checkpoint
(transaction) commits every second, as Weir's checkpoints do. The output record has Weir's shape,
``{"key", "window_start", "window_end", "count", "sum"}``.

Quix Streams' PostgreSQL sink is at-least-once, so this contender writes to Kafka only. Progress
goes to stdout as ``@progress <messages processed>`` lines, ten times a second.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from quixstreams import Application
from quixstreams.dataframe.windows import Count, Sum


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quix_app")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()

    processed = [0]

    def on_processed(_topic: str, _partition: int, _offset: int) -> None:
        processed[0] += 1

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=1.0,
        state_dir=args.state_dir,
        loglevel="WARNING",
        on_message_processed=on_processed,
    )
    source = app.topic(args.input, key_deserializer="str", value_deserializer="json", timestamp_extractor=_event_time)
    sink = app.topic(args.output, key_serializer="str", value_serializer="json")
    sdf = app.dataframe(source)
    sdf = sdf.tumbling_window(duration_ms=1000).agg(count=Count(), sum=Sum("value")).final(closing_strategy="partition")
    sdf = sdf.apply(_as_result, metadata=True)
    sdf.to_topic(sink)

    stop = threading.Event()

    def report() -> None:
        while not stop.wait(0.1):
            print(f"@progress {processed[0]}", flush=True)

    threading.Thread(target=report, daemon=True).start()
    print("@ready", flush=True)
    try:
        app.run()
    finally:
        stop.set()
        print(f"@progress {processed[0]}", flush=True)
        print("@done", flush=True)
    return 0


def _event_time(value: Any, _headers: Any, _timestamp: int, _timestamp_type: Any) -> int:
    return int(value["ts"])


def _as_result(window: dict[str, Any], key: Any, _timestamp: int, _headers: Any) -> dict[str, Any]:
    return {
        "key": key,
        "window_start": window["start"],
        "window_end": window["end"],
        "count": window["count"],
        "sum": window["sum"],
    }


if __name__ == "__main__":
    sys.exit(main())

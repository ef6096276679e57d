"""Throughput of record batch framing: encode + decode of 1,000-record batches, 100-byte payloads.

Run: ``.venv/bin/python bench/serde_bench.py``. Prints records per second.
"""

from __future__ import annotations

import os
import time

from weir.ids import KeyGroup
from weir.serde import Record, decode_batch, encode_batch

BATCH_SIZE = 1_000
PAYLOAD_SIZE = 100
MIN_SECONDS = 2.0


def make_batch(with_nulls: bool) -> list[Record]:
    payload = os.urandom(PAYLOAD_SIZE)
    return [
        (
            None if with_nulls and i % 3 == 0 else KeyGroup(i % 128),
            None if with_nulls and i % 5 == 0 else 1_700_000_000_000 + i,
            payload,
        )
        for i in range(BATCH_SIZE)
    ]


def measure(batch: list[Record]) -> tuple[float, float, float]:
    """Records/s for encode, decode, and encode+decode."""
    encode_s = decode_s = 0.0
    batches = 0
    blob = encode_batch(batch)
    while encode_s + decode_s < MIN_SECONDS:
        t0 = time.perf_counter()
        blob = encode_batch(batch)
        t1 = time.perf_counter()
        decode_batch(blob)
        t2 = time.perf_counter()
        encode_s += t1 - t0
        decode_s += t2 - t1
        batches += 1
    records = batches * BATCH_SIZE
    return records / encode_s, records / decode_s, records / (encode_s + decode_s)


def main() -> None:
    for label, with_nulls in (("all key groups and timestamps", False), ("mixed None values", True)):
        encode_rate, decode_rate, both_rate = measure(make_batch(with_nulls))
        print(
            f"{label:32s} encode {encode_rate:>12,.0f} rec/s   decode {decode_rate:>12,.0f} rec/s   "
            f"encode+decode {both_rate:>12,.0f} rec/s"
        )


if __name__ == "__main__":
    main()

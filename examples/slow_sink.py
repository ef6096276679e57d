"""Backpressure: a fast generator into a deliberately slow sink.

The sink takes ``-D sink.delay_ms=`` (default 1) per record. Credits stop the source once the
channels' buffers are full, so the source slows down to the sink's pace and memory stays bounded.
"""

from __future__ import annotations

import time
from typing import Any

from weir.api import Environment


def build(env: Environment) -> None:
    delay_s = env.params.get_int("sink.delay_ms", 1) / 1000.0

    def slow_write(value: Any) -> None:
        time.sleep(delay_s)  # the deliberately slow external system

    events = env.from_generator(lambda i: {"i": i, "key": i % 100, "payload": "x" * 100}, uid="fast-source")
    events.rebalance().sink(slow_write, uid="slow-sink")

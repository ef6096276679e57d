"""A backpressured job whose checkpoints cannot complete in time (alert WeirCheckpointsFailing).

Unthrottled generators feed one map that sleeps ``-D sleep_ms`` (default 5) on each record: at most
200 records/s go through, far fewer than the sources make even on a busy machine, so the sources
wait for credit, and each barrier queues behind full input buffers for seconds. With ``-D
checkpointing.timeout=1ms`` a checkpoint expires at the JobManager's next tick unless every task
acknowledged it before (rare: the barrier must not have queued).
"""

from __future__ import annotations

import time
from typing import Any

from weir.api import Environment


def build(env: Environment) -> None:
    p = env.params
    sleep_s = p.get_int("sleep_ms", 5) / 1000

    def slow(value: Any) -> Any:
        time.sleep(sleep_s)
        return value

    records = env.from_generator(lambda i: {"i": i}, uid="numbers")
    slowed = records.rebalance().map(slow, uid="slow", parallelism=1)
    slowed.sink_to_file(p.get_str("output", "/tmp/weir-slow"), uid="file")

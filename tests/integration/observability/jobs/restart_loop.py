"""A job that fails on the same record in every attempt: a restart loop (alert WeirRestartLoop).

Generator -> map that raises at record ``fail_at`` -> file. With checkpoints every ``-D
checkpointing.interval`` the first attempt completes a few before it fails, so every later attempt
is a restore from the latest one (it fails again soon after, never completing another).
"""

from __future__ import annotations

from typing import Any

from weir.api import Environment


class InducedFailure(RuntimeError):
    """The failure this job is made to have."""


def build(env: Environment) -> None:
    p = env.params
    fail_at = p.get_int("fail_at", 40)

    def fail_at_record(i: int) -> Any:
        if i >= fail_at:
            raise InducedFailure(f"induced failure at record {i} (the job fails at {fail_at} in every attempt)")
        return {"i": i}

    records = env.from_generator(lambda i: i, uid="numbers", records_per_second=p.get_int("rate", 20))
    records.map(fail_at_record, uid="fail-at").sink_to_file(p.get_str("output", "/tmp/weir-restart-loop"), uid="file")

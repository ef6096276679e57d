"""A job whose PostgreSQL sink's row function is wrong (a TypeError in the job's own code): it fails
the same way in every attempt, so the job must end FAILED at once instead of restarting."""

from __future__ import annotations

from weir.api import Environment


def to_row(value: int) -> tuple[str, int]:
    return ("key-" + value, value)  # type: ignore[operator]  # str + int: the bug this job is made to have


def build(env: Environment) -> None:
    numbers = env.from_generator(lambda i: i, uid="numbers", count=None, records_per_second=200, parallelism=1)
    numbers.sink_to_postgres(
        env.params.get_str("sink.table", "bad_sink_rows"),
        uid="postgres-sink",
        columns=("key", "value"),
        key_columns=("key",),
        row=to_row,
        parallelism=1,
    )

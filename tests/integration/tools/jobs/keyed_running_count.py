"""A small keyed job for `weir plan`: generated records over ``-D keys=`` keys -> a running count per
key (keyed reduce, one state entry per key) -> file. One sink record per input record, so the sink
rate and the input rate are in the same records."""

from __future__ import annotations

from typing import Any

from weir.api import Environment


def build(env: Environment) -> None:
    p = env.params
    keys = p.get_int("keys", 37)

    def record(i: int) -> dict[str, Any]:
        return {"key": f"k{i % keys}", "n": 1}

    def add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        return {"key": a["key"], "n": a["n"] + b["n"]}

    numbers = env.from_generator(record, uid="numbers", records_per_second=p.get_int("rate", 50))
    numbers.key_by(lambda r: r["key"]).reduce(add, uid="running-count").sink_to_file(
        p.get_str("output", "/tmp/weir-plan-running-count"), uid="file"
    )

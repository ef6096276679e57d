"""A job for the REST API's tests: timestamped generators -> key_by -> a map that fails once, when
the test asks (``-D fail_request`` names a file the test creates; ``-D fail_done`` the file the map
creates as it fails, so the restarted attempt does not fail again) -> a file.

Two vertices (``numbers``, and ``fail-once -> file`` behind a hash edge), event time from the
records' wall-clock timestamps, so every subtask has a watermark.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from weir.api import Environment


class RequestedFailure(RuntimeError):
    """The failure the test asked for."""


def build(env: Environment) -> None:
    p = env.params
    request, done = Path(p.get_str("fail_request", "")), Path(p.get_str("fail_done", ""))

    def fail_once(record: dict[str, Any]) -> dict[str, Any]:
        if request.exists() and not done.exists():
            done.touch()
            raise RequestedFailure(f"failure requested by the test at record {record['i']}")
        return record

    numbers = env.from_generator(
        lambda i: {"i": i, "key": f"k{i % 500}", "ts": int(time.time() * 1000)},
        uid="numbers",
        timestamp=lambda record: record["ts"],
        records_per_second=p.get_int("rate", 200),
    )
    numbers.key_by(lambda r: r["key"]).map(fail_once, uid="fail-once").sink_to_file(
        p.get_str("output", "/tmp/weir-fail-on-request"), uid="file"
    )

"""The example jobs under `weir test --failures`, through the `weir_job` fixture: each commits the
same with a failure at every checkpoint and crash point as without (the keyed aggregation, on
both its paths, also restored at parallelism 3), and the keyed aggregation commits what plain Python computes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EVENTS = [{"id": str(i), "key": f"k{i % 7}", "value": i % 13, "ts": 1_000 + 37 * i} for i in range(400)]
LINES = [json.dumps(e).encode() for e in EVENTS]  # the records' values, as on the topic


def windows_in_python(size_ms: int) -> Counter[str]:
    """Per key and tumbling window: the count and sum of the events' values."""
    acc: dict[tuple[str, int], tuple[int, int]] = {}
    for e in EVENTS:
        start = e["ts"] // size_ms * size_ms
        count, total = acc.get((e["key"], start), (0, 0))
        acc[e["key"], start] = (count + 1, total + e["value"])
    return Counter(
        json.dumps({"key": k, "window_start": s, "window_end": s + size_ms, "count": c, "sum": v}, sort_keys=True)
        for (k, s), (c, v) in acc.items()
    )


def test_the_keyed_aggregation_commits_each_window_once_whatever_fails(weir_job: RunJob) -> None:
    run = weir_job(EXAMPLES / "keyed_aggregation.py", sources={"events-source": LINES}, checkpoint_every=50)
    for sink in ("kafka-sink", "postgres-sink"):
        assert Counter(json.dumps(r, sort_keys=True) for r in run.sinks[sink]) == windows_in_python(1000)
    report = run.with_failures(rescale=3)  # raises AssertionError with the divergence report
    assert len(report.failure_points) == 3 * (len(EVENTS) // 50 + 1)
    assert report.runs == 2 + 2 * len(report.failure_points)  # each point restored at parallelism 1 and 3


@pytest.mark.parametrize(
    ("job", "parameters", "rescale"),
    [
        ("keyed_aggregation.py", {"columnar": "true"}, 3),  # record batches split by key group at parallelism 3
        ("first_job.py", {}, None),
        ("upgrade_v1.py", {}, None),
        ("upgrade_v2.py", {}, None),
    ],
)
def test_an_example_job_commits_the_same_whatever_fails(
    weir_job: RunJob, job: str, parameters: dict[str, str], rescale: int | None
) -> None:
    run = weir_job(EXAMPLES / job, sources={"events-source": LINES}, parameters=parameters, checkpoint_every=100)
    assert run.sinks["kafka-sink"]
    run.with_failures(rescale=rescale)

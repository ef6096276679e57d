"""The example jobs under `weir test --failures`, through the `weir_job` fixture: each commits the
same with a failure at every checkpoint and crash point as without (the keyed aggregation, on
both its paths, also restored at parallelism 3), and the keyed aggregation and the CDC copy commit
what plain Python computes."""

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


def customer_changes() -> list[dict]:
    """A snapshot of 20 customers, then 60 transactions of inserts, updates and deletes."""
    changes: list[dict] = [
        {"op": "read", "table": "customers", "after": {"id": i, "name": f"c{i}", "email": f"c{i}@x"}} for i in range(20)
    ]
    rows = set(range(20))
    for t in range(60):
        key = (t * 7) % 30
        if key not in rows:
            change = {"op": "insert", "after": {"id": key, "name": f"n{t}", "email": f"n{t}@x"}}
            rows.add(key)
        elif t % 3 == 0:
            change = {"op": "delete", "before": {"id": key}}
            rows.remove(key)
        else:
            change = {"op": "update", "before": None, "after": {"id": key, "name": f"u{t}", "email": f"{t}@x"}}
        changes.append({**change, "table": "customers", "xid": 1000 + t, "ts_ms": 1_000 * t})
    return changes


def test_the_cdc_example_copies_the_table_and_numbers_each_change_once_whatever_fails(weir_job: RunJob) -> None:
    changes = customer_changes()
    lines = [json.dumps(c) for c in changes]
    run = weir_job(EXAMPLES / "customers_cdc.py", sources={"customers-cdc": lines}, checkpoint_every=7)
    table: dict[int, tuple] = {}
    versions: Counter[str] = Counter()
    seen: Counter[int] = Counter()
    for c in changes:
        row = c.get("after") or c["before"]
        if c["op"] == "delete":
            del table[row["id"]]
        else:
            table[row["id"]] = (row["id"], row["name"], row["email"])
        seen[row["id"]] += 1
        versions[json.dumps({"id": row["id"], "op": c["op"], "version": seen[row["id"]]}, sort_keys=True)] += 1
    copy = run.output.sink_capture("copy").final_rows()
    assert copy == {(k,): v for k, v in table.items()}
    assert Counter(json.dumps(v, sort_keys=True) for v in run.sinks["versions-sink"]) == versions
    # Each change once, in its JSON form: the table as the source names it, the positions the input
    # left out numbered (the reads at 0/1, the n-th change at 0/(1 + n)).
    lsns = [f"0/{1 + max(0, n - 19):X}" for n in range(len(changes))]
    written = [
        {
            "format": 1,
            "op": c["op"],
            "table": "public.customers",
            "before": c.get("before"),
            "after": c.get("after"),
            "lsn": lsn,
            "xid": c.get("xid"),
        }
        for c, lsn in zip(changes, lsns, strict=True)
    ]
    changelog = Counter(json.dumps(e.to_json(), sort_keys=True) for e in run.sinks["changelog"])
    assert changelog == Counter(json.dumps(w, sort_keys=True) for w in written)
    run.with_failures(rescale=3)  # the CDC source stays at parallelism 1

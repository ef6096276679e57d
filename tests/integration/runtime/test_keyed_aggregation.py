"""The seed's keyed aggregation on JobManager + 3 TaskManagers against real Kafka and PostgreSQL."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.integration.conftest import RECORD_PATHS, WeirCluster, create_topics, create_window_table, path_parameters
from weir.connectors import kafka
from weir.tools.events import EventSpec, events, produce_events

pytestmark = pytest.mark.integration

WINDOW_MS = 1000


def reference(spec: EventSpec) -> dict[tuple[str, int], tuple[int, int]]:
    """(key, window_start) -> (count, sum), computed here straight from the generated events."""
    result: dict[tuple[str, int], tuple[int, int]] = {}
    for i, event in enumerate(events(spec)):
        if spec.malformed_every and i % spec.malformed_every == spec.malformed_every - 1:
            continue
        start = event["ts"] - event["ts"] % WINDOW_MS
        count, total = result.get((event["key"], start), (0, 0))
        result[(event["key"], start)] = (count + 1, total + event["value"])
    return result


@pytest.mark.parametrize("path", RECORD_PATHS)
def test_100k_events_over_1k_keys_match_reference(weir_cluster: WeirCluster, unique: str, path: str) -> None:
    endpoints = weir_cluster.endpoints
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 6, sink: 3, dlq: 1})
    create_window_table(endpoints, table)
    spec = EventSpec(count=100_000, keys=1000, malformed_every=25_000)
    produce_events(endpoints, source, spec)

    job_id = weir_cluster.submit(
        "examples/keyed_aggregation.py",
        {
            "source.topic": source,
            "sink.topic": sink,
            "sink.table": table,
            "source.dlq_topic": dlq,
            "source.bounded": "true",
            **path_parameters(path),
        },
    )
    status = weir_cluster.wait_for(job_id)
    assert status.summary.status == "FINISHED", status

    expected = reference(spec)
    found = [json.loads(v) for _, _, _, v in kafka.read_all(endpoints, sink, "read_committed")]
    by_window = {(r["key"], r["window_start"]): (r["count"], r["sum"]) for r in found}
    assert len(found) == len(by_window), "duplicate window results in Kafka"
    assert by_window == expected
    assert all(r["window_end"] == r["window_start"] + WINDOW_MS for r in found)

    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f"SELECT key, window_start, window_end, count, sum FROM {table}").fetchall()
    assert {(k, s): (c, t) for k, s, _e, c, t in rows} == expected
    assert len(rows) == len(expected)

    dead = [json.loads(v) for _, _, _, v in kafka.read_all(endpoints, dlq, "read_uncommitted")]
    assert len(dead) == spec.count // spec.malformed_every
    assert all(d["reason"].startswith("JSONDecodeError") and d["topic"] == source for d in dead)

    per_taskmanager: dict[str, int] = {}
    for task in status.tasks:
        per_taskmanager[task.taskmanager_id] = (
            per_taskmanager.get(task.taskmanager_id, 0) + task.records_in + task.records_out
        )
    assert len(per_taskmanager) == 3 and all(n > 0 for n in per_taskmanager.values()), per_taskmanager

"""The seed's keyed aggregation on JobManager + 3 TaskManagers against real Kafka and PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.integration.conftest import (
    RECORD_PATHS,
    WeirCluster,
    assert_sinks_exact,
    create_topics,
    create_window_table,
    path_parameters,
)
from weir.connectors import kafka
from weir.tools.events import EventSpec, events, produce_events

pytestmark = pytest.mark.integration

WINDOW_MS = 1000


def reference(spec: EventSpec) -> Counter[str]:
    """The window results as whole records, computed here straight from the generated events (not by
    the operators the job and its reference run share)."""
    acc: dict[tuple[str, int], tuple[int, int]] = {}
    for i, event in enumerate(events(spec)):
        if spec.malformed_every and i % spec.malformed_every == spec.malformed_every - 1:
            continue
        start = event["ts"] - event["ts"] % WINDOW_MS
        count, total = acc.get((event["key"], start), (0, 0))
        acc[(event["key"], start)] = (count + 1, total + event["value"])
    return Counter(
        json.dumps({"key": k, "window_start": s, "window_end": s + WINDOW_MS, "count": c, "sum": t}, sort_keys=True)
        for (k, s), (c, t) in acc.items()
    )


@pytest.mark.parametrize("path", RECORD_PATHS)
def test_100k_events_over_1k_keys_match_reference(weir_cluster: WeirCluster, unique: str, path: str) -> None:
    endpoints = weir_cluster.endpoints
    source, sink, dlq, table = f"events-{unique}", f"results-{unique}", f"dlq-{unique}", f"window_results_{unique}"
    create_topics(endpoints, {source: 6, sink: 3, dlq: 1})
    create_window_table(endpoints, table)
    spec = EventSpec(count=100_000, keys=1000, malformed_every=25_000)
    produce_events(endpoints, source, spec)

    params = {
        "source.topic": source,
        "sink.topic": sink,
        "sink.table": table,
        "source.dlq_topic": dlq,
        "source.bounded": "true",
        **path_parameters(path),
    }
    job_id = weir_cluster.submit("examples/keyed_aggregation.py", params)
    status = weir_cluster.wait_for(job_id)
    assert status.summary.status == "FINISHED", status

    assert_sinks_exact("examples/keyed_aggregation.py", params, job_id, endpoints)  # both sinks, whole records
    committed = Counter(
        json.dumps(json.loads(v), sort_keys=True) for _, _, _, v in kafka.read_all(endpoints, sink, "read_committed")
    )
    expected = reference(spec)
    assert committed == expected, (
        sorted((committed - expected).elements())[:5],
        sorted((expected - committed).elements())[:5],
    )

    dead = [json.loads(v) for _, _, _, v in kafka.read_all(endpoints, dlq, "read_uncommitted")]
    assert len(dead) == spec.count // spec.malformed_every
    assert all(d["reason"].startswith("JSONDecodeError") and d["topic"] == source for d in dead)

    per_taskmanager: dict[str, int] = {}
    for task in status.tasks:
        per_taskmanager[task.taskmanager_id] = (
            per_taskmanager.get(task.taskmanager_id, 0) + task.records_in + task.records_out
        )
    assert len(per_taskmanager) == 3 and all(n > 0 for n in per_taskmanager.values()), per_taskmanager

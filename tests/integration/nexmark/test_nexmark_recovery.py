"""Nexmark q4 (closing prices: a keyed co-process with expiry timers, then a timer at the end of
event time), q5 (hot items: two window stages) and q8 (new users: window reduces and a window join) on
the session cluster at parallelism 3: a bounded read of a topic loaded by weir.tools.nexmark_load,
exactly-once Kafka sink, one TaskManager SIGKILLed mid-run once a checkpoint completed. The job
restores, finishes, and its committed output is exactly the plain-Python query's (a multiset: no
result lost, none twice)."""

from __future__ import annotations

import json
import random
import time

import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import WeirCluster, assert_sinks_exact, create_topics
from weir import nexmark as nx
from weir.connectors import kafka
from weir.tools import nexmark_reference as ref
from weir.tools.nexmark_load import load
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

EVENTS = 30_000
CONFIG = nx.NexmarkConfig(events_per_second=500)  # 60 s of event time: 30 sliding, 6 tumbling windows
PARTITIONS = 6
SINK_TOPIC_CONFIG = {"retention.ms": "-1"}
RECORDS_PER_SECOND = 2_500  # ~12 s of reading: the kill lands 3-4 s into it (load 6-10)


@pytest.mark.parametrize("query", ["q5", "q4", "q8"])
def test_a_taskmanager_kill_mid_run_leaves_the_committed_output_exact(
    weir_cluster: WeirCluster, unique: str, query: str
) -> None:
    endpoints = weir_cluster.endpoints
    source, sink, dlq = f"nexmark-{unique}", f"nexmark-{query}-{unique}", f"nexmark-dlq-{unique}"
    create_topics(endpoints, {source: PARTITIONS, dlq: 1})
    # The sink writes each result's event time (Nexmark's 2023 base) as its Kafka timestamp: the
    # broker's 7-day retention would delete committed results at its next check (every 5 min).
    assert kafka.create_topic(endpoints, sink, 3, 1, SINK_TOPIC_CONFIG)
    producer = kafka.producer(endpoints, linger_ms=50, batch_num_messages=10_000, enable_idempotence=True)
    assert load(producer, source, PARTITIONS, EVENTS, config=CONFIG) == EVENTS
    expected = ref.multiset(getattr(ref, query)([nx.event(n, CONFIG) for n in range(EVENTS)]))
    assert sum(expected.values()) >= (5 if query == "q4" else 20)  # q4: a row per category

    params = {
        "source": "kafka",
        "source.topic": source,
        "source.bounded": "true",
        "source.dlq_topic": dlq,
        "source.records_per_second": str(RECORDS_PER_SECOND),
        "sink": "kafka",
        "sink.topic": sink,
        "checkpointing.interval": "500ms",
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
    }
    job_id = weir_cluster.submit(f"examples/nexmark/{query}.py", params, parallelism=3)
    victim = f"taskmanager-{random.Random(unique).randint(1, 3)}"
    status = wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and (s.last_completed_checkpoint or 0) >= 2
            and process_running(weir_cluster, victim)
        ),
        f"two completed checkpoints and {victim} running",
    )
    killed_at, killed_wall = status.last_completed_checkpoint or 0, time.time()
    kill_process(weir_cluster.directory, victim)
    wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status in ("RUNNING", "FINISHED")
            and s.last_restore_at is not None
            and s.last_restore_at >= killed_wall
            and (s.last_completed_checkpoint or 0) >= killed_at
        ),
        f"recovery after killing {victim}",
    )
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 120)
    assert final.summary.status == "FINISHED", final.failure
    assert final.last_restore_at is not None and final.last_restore_at >= killed_wall, final.last_restore_at

    committed = [json.loads(value) for _, _, _, value in kafka.read_all(endpoints, sink) if value is not None]
    assert ref.multiset(committed) == expected  # against the plain-Python query
    # and through the one exactness helper: the reference run's records, the commit markers counting
    # the committed records, no transaction left open
    assert_sinks_exact(f"examples/nexmark/{query}.py", params, job_id, endpoints)

"""Broadcast state on the session cluster: a bounded rules stream broadcast to every subtask of a
keyed operator changes some keys' factors mid-run (a second batch of versions valid from a later
event time, arriving while events flow) and ends early; a TaskManager is SIGKILLed once checkpoints
completed after it ended; the restored subtasks know the rules only from the checkpointed broadcast
state (the rules source does not read them again); the job is then rescaled from 3 to 2 (each new
subtask inherits the broadcast state) and finishes with both sinks exact (``weir verify``)."""

from __future__ import annotations

import time
from collections import Counter

import psycopg
import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from tests.integration.runtime.jobs.broadcast_rules import KEYS
from weir.tools.events import EventSpec, events
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

JOB = "tests/integration/runtime/jobs/broadcast_rules.py"
EVENTS = 20_000
RULES = KEYS + KEYS // 5  # the first batch, then every fifth key's second version


def scaled_totals(spec: EventSpec, change_at_ms: int) -> Counter[tuple[str, int]]:
    """Each key's scaled values summed over the whole run, computed from the events and the job's
    two rule batches independently of the job: every fifth key's factor changes at ``change_at_ms``."""
    totals: Counter[str] = Counter()
    for e in events(spec):
        k = int(e["key"].removeprefix("key-"))
        factor = k % 11 + 2 if k % 5 == 0 and e["ts"] >= change_at_ms else k % 7 + 1
        totals[e["key"]] += e["value"] * factor
    return Counter(totals.items())


def test_changing_broadcast_rules_survive_a_kill_and_a_rescale_exactly_once(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    spec = EventSpec(count=EVENTS, keys=400)  # event time spans start_ms .. start_ms + 2000
    params = keyed_aggregation_inputs(
        endpoints, unique, EVENTS, records_per_second=1000, checkpoint_interval="500ms", spec=spec
    )
    change_at = spec.start_ms + 1000
    params |= {
        "restart.strategy": "fixed-delay",
        "restart.delay": "1s",
        "rules.change_at_ms": str(change_at),
        "rules.records_per_second": "200",
    }
    job_id = weir_cluster.submit(JOB, params, parallelism=3)

    victim = "taskmanager-2"
    rules_ended = wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING" and any(t.vertex_uid == "rules" and t.records_out >= RULES for t in s.tasks)
        ),
        "the rules stream to be read",
    )
    read = sum(t.records_out for t in rules_ended.tasks if t.vertex_uid == "events-source")
    assert 0 < read < EVENTS, f"the rules' second batch did not arrive while events flowed ({read} events read)"
    at = rules_ended.last_completed_checkpoint or 0
    wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING"
            and (s.last_completed_checkpoint or 0) >= at + 2
            and process_running(weir_cluster, victim)
        ),
        "two checkpoints after the rules were read",
    )
    killed_at = time.time()
    kill_process(weir_cluster.directory, victim)
    restored = wait_until(
        weir_cluster,
        job_id,
        lambda s: s.summary.status == "RUNNING" and (s.last_restore_at or 0) > killed_at,
        f"the job to restore after killing {victim}",
    )
    assert restored.summary.parallelism == 3
    weir_cluster.wait_for_taskmanagers()

    trigger_id = weir_cluster.client.rescale(job_id, 2)
    rescale = weir_cluster.client.wait_for_rescale(job_id, trigger_id, 120)
    assert (rescale.from_parallelism, rescale.to_parallelism) == (3, 2), rescale

    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure
    assert final.summary.parallelism == 2
    assert sorted(t.subtask for t in final.tasks if t.vertex_uid == "scale-by-rule") == [0, 1], final.tasks
    assert final.last_restore_at is not None and final.last_restore_at > killed_at
    assert_sinks_exact(JOB, params, job_id, endpoints)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT key, sum("sum") FROM "{params["sink.table"]}" GROUP BY key').fetchall()
    assert Counter((key, int(total)) for key, total in rows) == scaled_totals(spec, change_at)

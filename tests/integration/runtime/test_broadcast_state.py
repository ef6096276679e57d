"""Broadcast state on the session cluster: a bounded rules stream broadcast to every subtask of a
keyed operator ends early; a TaskManager is SIGKILLed once checkpoints completed after it ended; the
restored subtasks know the rules only from the checkpointed broadcast state (the rules source does
not read them again), and the job finishes with both sinks exact (``weir verify``)."""

from __future__ import annotations

import pytest

from tests.integration.checkpointing.test_recovery import process_running, wait_until
from tests.integration.conftest import WeirCluster, assert_sinks_exact, keyed_aggregation_inputs
from weir.tools.supervisor import kill_process

pytestmark = pytest.mark.integration

JOB = "tests/integration/runtime/jobs/broadcast_rules.py"
EVENTS = 20_000


def test_broadcast_state_survives_a_taskmanager_kill_exactly_once(weir_cluster: WeirCluster, unique: str) -> None:
    endpoints = weir_cluster.endpoints
    params = keyed_aggregation_inputs(endpoints, unique, EVENTS, records_per_second=2000, checkpoint_interval="500ms")
    params |= {"restart.strategy": "fixed-delay", "restart.delay": "1s"}
    job_id = weir_cluster.submit(JOB, params, parallelism=3)

    victim = "taskmanager-2"
    rules_ended = wait_until(
        weir_cluster,
        job_id,
        lambda s: (
            s.summary.status == "RUNNING" and any(t.vertex_uid == "rules" and t.records_out >= 400 for t in s.tasks)
        ),
        "the rules stream to be read",
    )
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
    kill_process(weir_cluster.directory, victim)
    final = wait_until(weir_cluster, job_id, lambda s: s.summary.status == "FINISHED", "the job to finish", 300)
    assert final.summary.status == "FINISHED", final.failure
    assert final.last_restore_at is not None, f"the job never restored after killing {victim}"
    assert_sinks_exact(JOB, params, job_id, endpoints)

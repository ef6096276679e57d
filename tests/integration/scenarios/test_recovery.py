"""The seed's recovery scenario on the session cluster, small (`weir scenario recovery` runs it larger):
a TaskManager frozen the moment its PostgreSQL sink subtask prepared a checkpoint's transaction, then
SIGKILLed; later a PostgreSQL commit failing after the Kafka sink of the same checkpoint committed.
Records ran twice, effects happened once, and the proofs showed one sink ahead until recovery."""

from __future__ import annotations

import pytest

from tests.integration.scenarios.conftest import Run
from weir.core.checkpointing import CheckpointStatus
from weir.scenarios.keyed_job import KAFKA_SINK_UID, POSTGRES_SINK_UID
from weir.scenarios.recovery import SCENARIO, RecoveryConfig

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def test_recovery_replays_records_yet_effects_happen_once_and_the_behind_sink_catches_up(
    unique: str, run_scenario: Run
) -> None:
    config = RecoveryConfig.small(unique)
    run, report, text = run_scenario(SCENARIO, config)
    assert report.ok, text
    assert len(report.checks) == 10, text

    kill = run.kill
    assert kill.epoch in kill.prepared_at_kill[config.killed_subtask], text
    resolved = report.check("prepared-resolved-as-checkpoint").numbers
    assert resolved["prepared_after"] is False, text
    assert resolved["committed_after"] == (kill.checkpoint_final_status is CheckpointStatus.COMPLETED), text

    aborted = report.check("aborted-windows-committed-once")
    assert aborted.number("not_committed") == aborted.number("committed_more") == 0, text
    assert report.check("aborted-records-uncommitted-only").number("aborted") > 0, text
    replay = report.check("duplicate-execution")
    assert replay.number("records_all_attempts") > replay.number("input_records") == config.events, text
    counts = report.check("state-counts-each-input-once")
    assert counts.number("table_count") == counts.number("kafka_count") == config.events, text

    partial = report.check("partial-cross-sink-success")
    checkpoint = partial.number("checkpoint")
    postgres_last = partial.numbers["postgres_last"]  # None: no commit of it yet
    assert partial.number("kafka_last") == checkpoint > (postgres_last if isinstance(postgres_last, int) else 0), text
    reconciliation = partial.numbers["reconciliation"]
    assert isinstance(reconciliation, tuple)
    assert any(f"{KAFKA_SINK_UID} committed up to {checkpoint}" in str(line) for line in reconciliation), text
    assert partial.numbers["behind_subtasks"] and report.check("behind-sink-caught-up").numbers["caught_up"] is True
    assert all(POSTGRES_SINK_UID in gid for gid in run.partial.prepared_during), text

    restarts = report.check("restarted-and-finished")
    assert restarts.numbers["status"] == "FINISHED", text
    assert restarts.number("restarts") >= restarts.number("induced_failures") == 1 + run.partial.attempts, text

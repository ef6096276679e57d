"""The seed's recovery scenario on the session cluster, small (`weir scenario recovery` runs it larger):
a TaskManager frozen the moment its PostgreSQL sink subtask prepared a checkpoint's transaction, then
SIGKILLed; later a PostgreSQL commit failing after the Kafka sink of the same checkpoint committed.
Records ran twice, effects happened once, and the proofs showed one sink ahead until recovery."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tests.integration.conftest import WeirCluster
from weir.core.checkpointing import CheckpointStatus
from weir.core.errors import WeirError
from weir.tools.scenario_recovery import (
    KAFKA_SINK_UID,
    POSTGRES_SINK_UID,
    RecoveryConfig,
    build_report,
    print_timeline,
    run_recovery,
)
from weir.tools.scenario_report import print_report

pytestmark = pytest.mark.integration  # `make scenarios` runs them full size


def test_recovery_replays_records_yet_effects_happen_once_and_the_behind_sink_catches_up(
    weir_cluster: WeirCluster, unique: str
) -> None:
    weir_cluster.wait_for_taskmanagers()  # an earlier test may have killed one
    config = RecoveryConfig.small(unique)
    output = io.StringIO()
    console = Console(file=output, width=160)
    try:
        outcome = run_recovery(weir_cluster.endpoints, config, console)
    except WeirError as exc:
        pytest.fail(f"{exc}\n{output.getvalue()}")
    weir_cluster.submitted.append(outcome.job_id)
    report = build_report(config, outcome)
    print_timeline(console, outcome)
    print_report(console, report)
    text = output.getvalue()
    assert report.ok, text

    kill = outcome.kill
    assert kill.epoch in kill.prepared_at_kill[config.killed_subtask], text
    assert not kill.prepared_after, text
    assert kill.committed_after == (kill.checkpoint_final_status is CheckpointStatus.COMPLETED), text

    assert outcome.aborted.aborted > 0 and outcome.aborted.not_committed == outcome.aborted.committed_more == 0, text
    assert outcome.records_all_attempts > outcome.input_records == config.events, text
    assert outcome.table_count == outcome.kafka_count == config.events, text

    partial = outcome.partial
    during = partial.during
    assert during.kafka_last == partial.checkpoint_id > (during.postgres_last or 0), text
    assert any(f"{KAFKA_SINK_UID} committed up to {partial.checkpoint_id}" in line for line in during.reconciliation)
    assert partial.behind_subtasks and partial.caught_up, text
    assert all(POSTGRES_SINK_UID in gid for gid in partial.prepared_during), text

    assert outcome.verify.ok, text
    assert outcome.final.summary.restarts >= 1 + partial.attempts, text  # the SIGKILL, each failed commit

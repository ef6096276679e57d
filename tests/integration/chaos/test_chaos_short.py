"""The short chaos run of `make test` (`make chaos` runs the long one): a few faults of each layer —
a TaskManager killed, a TaskManager paused past the heartbeat timeout, the PostgreSQL server and the
Kafka broker restarted, the S3 server paused and slowed, a TaskManager's local disk full (a tmpfs: a
machine that cannot mount one fails the test, it does not leave the fault out) — during a
sequence-numbered job; at the end every key's sequence is exact in both sinks, weir verify is exact,
nothing is left prepared, the job FINISHED."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tests.chaos.driver import ChaosConfig, run_chaos
from tests.chaos.faults import LocalDisks
from tests.chaos.schedule import FaultKind
from tests.integration.conftest import WeirCluster
from weir.core.config import run_dir
from weir.scenarios.framework import render_text

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # restarts Kafka and PostgreSQL, pauses S3: alone

# Read at collection, before the session's cluster fixture points WEIR_RUN_DIR at its own directory:
# the services' pid files stay where deploy/local/infra.sh started them.
SERVICES_RUN_DIR: Path = run_dir()

KINDS = (
    FaultKind.KILL_TASKMANAGER,
    FaultKind.PAUSE_TASKMANAGER,
    FaultKind.RESTART_POSTGRES,
    FaultKind.RESTART_KAFKA,
    FaultKind.PAUSE_S3,
    FaultKind.SLOW_S3,
    FaultKind.FILL_DISK,
)


def test_a_short_chaos_run_keeps_every_sequence_exact(weir_cluster: WeirCluster, unique: str) -> None:
    why_not = LocalDisks.unavailable()
    assert why_not is None, f"the fill-disk fault needs a tmpfs mount (run as root): {why_not}"
    weir_cluster.wait_for_taskmanagers()
    config = ChaosConfig(
        events=30_000,
        keys=120,
        records_per_second=250,  # ~120 s of input
        seed=20261201,
        faults=len(KINDS),
        kinds=KINDS,
        min_gap_s=8.0,
        checkpoint_interval="1s",
        finish_deadline_s=240.0,
        suffix=unique,
    )
    output = io.StringIO()
    console = Console(file=output, width=180)
    run = run_chaos(
        weir_cluster.endpoints, config, console, directory=weir_cluster.directory, services_run_dir=SERVICES_RUN_DIR
    )
    weir_cluster.submitted.append(run.job_id)
    report = run.report.build()
    render_text(console, report)
    text = output.getvalue()
    assert report.ok, text
    assert sorted(i.fault.kind.value for i in run.injected) == sorted(k.value for k in KINDS), text

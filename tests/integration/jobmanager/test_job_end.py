"""What the JobManager refuses at submit, how a user error ends a job, and what ending a job does to
its sinks' transactions: against the real cluster, Kafka and PostgreSQL."""

from __future__ import annotations

import re

import psycopg
import pytest

from tests.integration import polling
from tests.integration.conftest import REPO_ROOT, WeirCluster, create_topics, create_window_table
from weir.connectors import kafka
from weir.tools.cli import EXIT_USAGE, run_cli
from weir.tools.events import EventSpec, produce_events

pytestmark = pytest.mark.integration

KEYED_JOB = REPO_ROOT / "examples" / "keyed_aggregation.py"
BAD_SINK_JOB = REPO_ROOT / "tests" / "integration" / "jobmanager" / "jobs" / "bad_sink_function.py"


def keyed_params(unique: str, **extra: str) -> dict[str, str]:
    return {
        "source.topic": f"events-{unique}",
        "sink.topic": f"results-{unique}",
        "sink.table": f"window_results_{unique}",
        "source.dlq_topic": f"dlq-{unique}",
        "checkpointing.interval": "1s",
        **extra,
    }


def weir_run(params: dict[str, str], capsys: pytest.CaptureFixture[str], job: str = str(KEYED_JOB)) -> tuple[int, str]:
    args = ["run", job, "-p", "2", "--detach"]
    for key, value in params.items():
        args += ["-D", f"{key}={value}"]
    code = run_cli(args)
    return code, capsys.readouterr().err


def job_ids(weir_cluster: WeirCluster) -> set[str]:
    return {j.job_id for j in weir_cluster.client.list_jobs()}


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing-table", r"table 'window_results_\w+' does not exist"),
        ("missing-topic", r"topic 'events-\w+' does not exist"),
        ("checkpointing-off", r"would never commit; set -D checkpointing.interval"),
        ("at-least-once", r"cannot run with checkpointing.mode=at_least_once"),
    ],
)
def test_a_job_that_cannot_run_is_refused_at_submit_with_one_line(
    weir_cluster: WeirCluster, unique: str, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    endpoints = weir_cluster.endpoints
    params = keyed_params(unique)
    if case != "missing-topic":
        create_topics(endpoints, {f"events-{unique}": 2, f"results-{unique}": 2, f"dlq-{unique}": 1})
    else:
        create_topics(endpoints, {f"results-{unique}": 2, f"dlq-{unique}": 1})
    if case != "missing-table":
        create_window_table(endpoints, f"window_results_{unique}")
    if case == "checkpointing-off":
        del params["checkpointing.interval"]
    if case == "at-least-once":
        params["checkpointing.mode"] = "AT-LEAST-ONCE"
    before = job_ids(weir_cluster)
    code, err = weir_run(params, capsys)
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("weir: error: "), err
    assert re.search(message, lines[0]), lines[0]
    assert job_ids(weir_cluster) == before  # nothing started


def test_a_user_error_in_a_sink_fails_the_job_at_once(weir_cluster: WeirCluster, unique: str) -> None:
    table = f"bad_sink_{unique}"
    with psycopg.connect(weir_cluster.endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, value bigint)")
    job_id = weir_cluster.client.submit_job(
        BAD_SINK_JOB,
        {"sink.table": table, "checkpointing.interval": "1s", "restart.strategy": "exponential-delay"},
        1,
    )
    status = weir_cluster.wait_for(job_id, ("FAILED",), timeout_s=60)
    assert status.summary.status == "FAILED", status
    assert status.summary.restarts == 0
    failure = status.failure
    assert failure is not None and failure.type == "TypeError" and not failure.retriable
    assert failure.fault.value == "user"
    assert "postgres-sink" in failure.message or "numbers" in failure.message


def prepared_gids(weir_cluster: WeirCluster, job_id: str) -> list[str]:
    with psycopg.connect(weir_cluster.endpoints.postgres_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (f"weir:{job_id}:%",)).fetchall()
    return [gid for (gid,) in rows]


def open_transactions(weir_cluster: WeirCluster, topic: str) -> dict[int, tuple[int, int]]:
    offsets = kafka.partition_offsets(weir_cluster.endpoints, topic, 2)
    return {p: (lso, hw) for p, (_low, lso, hw) in offsets.items() if lso < hw}


def test_cancel_resolves_every_transaction_and_a_resubmitted_job_does_not_block(
    weir_cluster: WeirCluster, unique: str
) -> None:
    endpoints = weir_cluster.endpoints
    create_topics(endpoints, {f"events-{unique}": 2, f"results-{unique}": 2, f"dlq-{unique}": 1})
    create_window_table(endpoints, f"window_results_{unique}")
    produce_events(endpoints, f"events-{unique}", EventSpec(count=40_000, keys=50))
    params = keyed_params(unique, **{"source.records_per_second": "2000", "checkpointing.interval": "500ms"})
    job_id = weir_cluster.client.submit_job(KEYED_JOB, params, 2)

    def prepared_while_running() -> list[str]:
        status = weir_cluster.client.job_status(job_id)
        assert status.summary.status == "RUNNING", status.failure
        return prepared_gids(weir_cluster, job_id)

    polling.until("a checkpoint's rows prepared, waiting for its commit", 120, prepared_while_running, 0.05)
    weir_cluster.client.cancel_job(job_id)
    status = weir_cluster.wait_for(job_id, ("CANCELED",), timeout_s=120)
    assert status.summary.status == "CANCELED"
    assert prepared_gids(weir_cluster, job_id) == []
    assert open_transactions(weir_cluster, f"results-{unique}") == {}

    # The same job over the same keys again: no old row lock holds it up; it finishes its input (read
    # as fast as it goes: only the cancelled job needed the pace, to be running when cancelled).
    again = weir_cluster.client.submit_job(
        KEYED_JOB, {**params, "source.bounded": "true", "source.records_per_second": "0"}, 2
    )
    finished = weir_cluster.wait_for(again, ("FINISHED",), timeout_s=240)
    assert finished.summary.status == "FINISHED", finished.failure
    assert prepared_gids(weir_cluster, again) == []

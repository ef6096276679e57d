"""Submit-time rules over a job's descriptors (no external system): exactly-once sinks that could
never commit, Kafka transaction timeouts."""

from __future__ import annotations

import pytest

from jobmanager.checkpointing.config import parse_checkpoint_settings
from jobmanager.submit_checks import check_job_rules, job_is_bounded
from weir.api import Environment
from weir.core.descriptors import validate_transaction_timeout
from weir.core.errors import JobDefinitionError

# transaction.timeout.ms -------------------------------------------------------------------------


def test_a_timeout_covering_interval_and_restart_is_accepted() -> None:
    validate_transaction_timeout(900_000, checkpoint_interval_s=60, restart_allowance_s=300)
    validate_transaction_timeout(360_000, checkpoint_interval_s=60, restart_allowance_s=300)


def test_a_timeout_shorter_than_interval_plus_restart_is_rejected() -> None:
    with pytest.raises(JobDefinitionError, match=r"cannot cover a checkpoint interval of 60s plus a restart"):
        validate_transaction_timeout(300_000, checkpoint_interval_s=60, restart_allowance_s=300)


def test_a_timeout_above_the_broker_maximum_is_rejected() -> None:
    with pytest.raises(JobDefinitionError, match="transaction.max.timeout.ms"):
        validate_transaction_timeout(3_600_000, checkpoint_interval_s=10, restart_allowance_s=10)
    validate_transaction_timeout(
        3_600_000, checkpoint_interval_s=10, restart_allowance_s=10, broker_max_timeout_ms=3_600_000
    )
    with pytest.raises(JobDefinitionError, match="positive"):
        validate_transaction_timeout(0, checkpoint_interval_s=10, restart_allowance_s=10)


def test_the_graph_check_names_the_sink() -> None:
    env = Environment("j", parallelism=1)
    source = env.from_collection([1, 2], uid="src")
    source.sink_to_kafka("ok", uid="fine")
    source.sink_to_kafka("short", uid="too-short", transaction_timeout_ms=30_000)
    source.sink_to_kafka("plain", uid="plain", delivery="at_least_once")
    settings = parse_checkpoint_settings({"checkpointing.interval": "10s"})
    check_job_rules(env.graph, settings, restart_allowance_s=10)
    with pytest.raises(JobDefinitionError, match="kafka sink 'too-short'"):
        check_job_rules(env.graph, settings, restart_allowance_s=60)


def unbounded_job(delivery: str) -> Environment:
    env = Environment("j", parallelism=1)
    numbers = env.from_generator(lambda i: i, uid="numbers")  # no count: unbounded
    numbers.sink_to_kafka("out", uid="kafka-sink", delivery=delivery)  # type: ignore[arg-type]
    return env


def test_an_exactly_once_sink_on_an_unbounded_job_without_checkpoints_is_refused() -> None:
    env = unbounded_job("exactly_once")
    assert not job_is_bounded(env.graph)
    with pytest.raises(JobDefinitionError, match="would never commit"):
        check_job_rules(env.graph, parse_checkpoint_settings({}), restart_allowance_s=10)
    check_job_rules(unbounded_job("at_least_once").graph, parse_checkpoint_settings({}), restart_allowance_s=10)


def test_a_bounded_job_may_run_exactly_once_sinks_without_periodic_checkpoints() -> None:
    env = Environment("j", parallelism=1)
    env.from_collection([1, 2], uid="numbers").sink_to_kafka("out", uid="kafka-sink")
    assert job_is_bounded(env.graph)
    check_job_rules(env.graph, parse_checkpoint_settings({}), restart_allowance_s=10)


@pytest.mark.parametrize("mode", ["at_least_once", "AT-LEAST-ONCE"])
def test_exactly_once_sinks_are_refused_under_at_least_once_checkpoints(mode: str) -> None:
    settings = parse_checkpoint_settings({"checkpointing.interval": "1s", "checkpointing.mode": mode})
    with pytest.raises(JobDefinitionError, match="cannot run with checkpointing.mode=at_least_once"):
        check_job_rules(unbounded_job("exactly_once").graph, settings, restart_allowance_s=10)
    check_job_rules(unbounded_job("at_least_once").graph, settings, restart_allowance_s=10)

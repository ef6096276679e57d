"""Submission: load, fix the end offsets of bounded Kafka sources, check, place and deploy."""

from __future__ import annotations

import json
import textwrap
import threading

import pytest

from tests.unit.jobmanager.conftest import JOB, TM_A, Harness
from weir.api import load_job_source
from weir.core.descriptors import end_offsets_parameter
from weir.core.errors import JobDefinitionError
from weir.core.kafka_config import KafkaClientConfig
from weir.core.states import JobStatus
from weir.jobmanager.submission import SubmitRequest, fixed_source_ends

KAFKA_JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_kafka("numbers", uid="bounded", bounded=True).print(uid="out")
        env.from_kafka("events", uid="endless").print(uid="out2")
    """
).encode()


def test_only_bounded_kafka_sources_get_fixed_end_offsets() -> None:
    graph = load_job_source(KAFKA_JOB, "k.py").graph
    asked: list[str] = []

    def ends(cluster: KafkaClientConfig, topic: str) -> dict[int, int]:
        asked.append(topic)
        return {0: 5, 1: 9}

    fixed = fixed_source_ends(graph, KafkaClientConfig("broker:9092"), ends)
    assert asked == ["numbers"]
    assert fixed == {end_offsets_parameter("bounded"): json.dumps({0: 5, 1: 9})}
    assert json.loads(fixed[end_offsets_parameter("bounded")]) == {"0": 5, "1": 9}  # as weir.operators.sources reads it


def test_a_submitted_job_is_checked_recorded_and_deployed(harness: Harness) -> None:
    harness.end_offsets["numbers"] = {0: 3}
    job_id = harness.jm.submit(SubmitRequest("", "k.py", KAFKA_JOB, {"a": "b"}, parallelism=1))
    job = harness.jm.jobs[job_id]
    assert job.status is JobStatus.RUNNING and job.attempt == 1
    assert job.submission.job_name == job.loaded.graph.job_name  # the job's own name when none is given
    assert job.submission.parameters == {"a": "b", end_offsets_parameter("bounded"): json.dumps({0: 3})}
    assert [g.job_name for g in harness.checked] == [job.loaded.graph.job_name]
    assert {(address, attempt) for address, _, _, attempt in harness.gateway.named("deploy")} == {(TM_A, 1)}
    assert len(harness.gateway.named("deploy")) == len(job.tasks)
    record = harness.jm.records.load(harness.jm.paths.job_record(job.coordinator.job_id))
    assert record.attempt == 1 and record.status is JobStatus.RUNNING


def test_a_refused_job_is_neither_kept_nor_deployed(harness: Harness) -> None:
    def refuse(*_: object) -> None:
        raise JobDefinitionError("no table")

    harness.jm.submitter._check = refuse  # noqa: SLF001 - the check is injected at construction
    with pytest.raises(JobDefinitionError, match="no table"):
        harness.jm.submit(SubmitRequest("j", "j.py", JOB))
    assert harness.jm.jobs == {} and harness.gateway.named("deploy") == []


UNLOADABLE = {
    "hang": ("import time\n\ndef build(env):\n    time.sleep(3600)\n", "build(env) did not return within 2 s"),
    "exit": ("import sys\n\ndef build(env):\n    sys.exit()\n", "build(env) called sys.exit(None)"),
    "base": (
        "class Stop(BaseException):\n    pass\n\ndef build(env):\n    raise Stop('no more')\n",
        "build(env) failed: Stop: no more",
    ),
}


@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_a_job_that_hangs_exits_or_raises_a_base_exception_is_refused_within_the_deadline(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """The JobManager loads a submitted job in a child process with a deadline: its servicer thread
    neither hangs nor dies, and the job is neither kept nor deployed."""
    monkeypatch.setenv("WEIR_JOB_LOAD_TIMEOUT", "2")
    source, reason = UNLOADABLE[case]
    outcome: list[BaseException | str] = []

    def submit() -> None:
        try:
            outcome.append(harness.jm.submit(SubmitRequest("", f"{case}.py", source.encode())))
        except BaseException as exc:  # noqa: BLE001 - what escapes the submission is the point
            outcome.append(exc)

    worker = threading.Thread(target=submit, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), f"submitting {case}.py did not return within 30 s"
    assert len(outcome) == 1 and isinstance(outcome[0], JobDefinitionError), outcome
    assert str(outcome[0]) == f"job file {case}.py: {reason}"
    assert harness.jm.jobs == {} and harness.gateway.named("deploy") == []


# The job's Kafka settings ---------------------------------------------------------------------------

SECURED_JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_kafka("numbers", uid="bounded", bounded=True, properties={"client.id": "numbers"}).print(uid="out")
    """
).encode()

SECURED_PARAMETERS = {
    "kafka.bootstrap.servers": "secured:9093",
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.password": "${env:KAFKA_PASSWORD}",
}


def test_the_jobs_kafka_settings_reach_the_offset_reads_and_the_checks_as_given(harness: Harness) -> None:
    read_with: list[KafkaClientConfig] = []
    checked_with: list[dict[str, str]] = []

    def ends(cluster: KafkaClientConfig, topic: str) -> dict[int, int]:
        read_with.append(cluster)
        return {0: 3}

    harness.jm.submitter._read_end_offsets = ends  # noqa: SLF001 - the readers are injected at construction
    harness.jm.submitter._check = lambda graph, settings, allowance, parameters: checked_with.append(dict(parameters))  # noqa: SLF001
    job_id = harness.jm.submit(SubmitRequest("", "s.py", SECURED_JOB, SECURED_PARAMETERS, parallelism=1))

    assert read_with == [
        KafkaClientConfig(
            "secured:9093",
            (
                ("client.id", "numbers"),  # the source's own
                ("sasl.password", "${env:KAFKA_PASSWORD}"),  # unresolved: resolved by the client's maker
                ("security.protocol", "SASL_SSL"),
            ),
        )
    ]
    assert len(checked_with) == 1 and SECURED_PARAMETERS.items() <= checked_with[0].items()
    record = harness.jm.records.load(harness.jm.paths.job_record(harness.jm.jobs[job_id].coordinator.job_id))
    assert record.submission.parameters["kafka.sasl.password"] == "${env:KAFKA_PASSWORD}"  # the record keeps it


def test_a_literal_kafka_secret_is_refused_before_kafka_is_asked_or_anything_kept(harness: Harness) -> None:
    asked: list[str] = []
    harness.jm.submitter._read_end_offsets = lambda cluster, topic: asked.append(topic) or {0: 3}  # type: ignore[func-returns-value] # noqa: SLF001
    with pytest.raises(JobDefinitionError) as raised:
        harness.jm.submit(
            SubmitRequest("", "s.py", SECURED_JOB, {**SECURED_PARAMETERS, "kafka.sasl.password": "hunter2"})
        )
    assert str(raised.value).startswith(
        "job parameter kafka.sasl.password holds a literal secret: give ${env:NAME} (an environment variable of "
    )
    assert "hunter2" not in str(raised.value)
    assert asked == [] and harness.checked == [] and harness.jm.jobs == {}
    assert harness.gateway.named("deploy") == []
    stored = [p for p in harness.storage.root.rglob("*") if p.is_file()]
    assert not any(b"hunter2" in p.read_bytes() for p in stored)

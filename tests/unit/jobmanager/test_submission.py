"""Submission: load, fix the end offsets of bounded Kafka sources, check, place and deploy."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.unit.jobmanager.conftest import JOB, TM_A, Harness
from weir.api import load_job_source
from weir.core.descriptors import end_offsets_parameter
from weir.core.errors import JobDefinitionError
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

    def ends(topic: str) -> dict[int, int]:
        asked.append(topic)
        return {0: 5, 1: 9}

    fixed = fixed_source_ends(graph, ends)
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

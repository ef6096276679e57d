"""The ``weir_job`` pytest fixture (``weir.testing``): a job run in this process over Python values,
records already deserialized or a file, sinks per uid, and ``.with_failures()`` failing the test with
the divergence report. The jobs are those of the ``weir test`` bug corpus (tests/unit/weir/tools/test_jobtest.py);
no service is reached (its ``no_services`` fixture refuses every client)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.unit.weir.tools.test_jobtest import (
    GLOBAL_COUNTER,
    HEADER,
    KEYED_TOTAL,
    event_lines,
    no_services,  # noqa: F401 (autouse: every Kafka and PostgreSQL client refused)
)
from weir.tools.jobtest import Deserialized, JobTestError, check_job

if TYPE_CHECKING:  # the plugin module is imported by pytest_plugins, first (its asserts rewritten)
    from weir.testing import RunJob

pytest_plugins = ["weir.testing"]

RECORDS = 120
CHECKPOINT_EVERY = 20


def job(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(HEADER + body)
    return path


def totals(values: list[dict[str, object]]) -> Counter[str]:
    return Counter(json.dumps(v, sort_keys=True) for v in values)


def test_the_fixture_runs_a_job_over_python_values_and_answers_each_sink(tmp_path: Path, weir_job: RunJob) -> None:
    run = weir_job(job(tmp_path, KEYED_TOTAL), sources={"events": event_lines(RECORDS)})
    committed = run.sinks["sink"]
    assert len(committed) == RECORDS
    last = {v["user"]: v["total"] for v in committed}  # type: ignore[index]
    assert last == {f"u{u}": sum(i % 11 for i in range(RECORDS) if i % 5 == u) for u in range(5)}
    assert [ts for _, ts in run.records("sink")] == [1_000 + 10 * i for i in range(RECORDS)]  # the job's timestamps
    with pytest.raises(KeyError, match="no operator 'nope' in the job; its operators: events, enrich"):
        run.records("nope")


def test_records_already_deserialized_skip_the_deserializer_and_keep_the_timestamp_function(
    tmp_path: Path, weir_job: RunJob
) -> None:
    events = [json.loads(line) for line in event_lines(RECORDS)]
    from_values = weir_job(job(tmp_path, KEYED_TOTAL), records={"events": events})
    from_bytes = weir_job(job(tmp_path, KEYED_TOTAL), sources={"events": event_lines(RECORDS)})
    assert totals(from_values.sinks["sink"]) == totals(from_bytes.sinks["sink"])
    assert from_values.records("sink") == from_bytes.records("sink")  # event time from e["ts"], not the bytes


def test_a_file_and_str_values_are_inputs_too(tmp_path: Path, weir_job: RunJob) -> None:
    lines = event_lines(RECORDS)
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    from_file = weir_job(job(tmp_path, KEYED_TOTAL), sources={"events": source})
    from_str = weir_job(job(tmp_path, KEYED_TOTAL), sources={"events": (line.decode() for line in lines)})
    assert from_file.records("sink") == from_str.records("sink") and len(from_file.sinks["sink"]) == RECORDS


def test_bad_inputs_are_one_clear_error(tmp_path: Path, weir_job: RunJob) -> None:
    path = job(tmp_path, KEYED_TOTAL)
    with pytest.raises(JobTestError, match="must be bytes or str, got dict: give deserialized records as records="):
        weir_job(path, sources={"events": [{"id": 1}]})
    with pytest.raises(JobTestError, match="source 'events' is given twice"):
        weir_job(path, sources={"events": []}, records={"events": []})
    with pytest.raises(JobTestError, match="give an iterable of values or a Path, not one bytes"):
        weir_job(path, sources={"events": b'{"id": 1}'})


def test_with_failures_passes_a_correct_job_and_fails_a_buggy_one_with_the_report(
    tmp_path: Path, weir_job: RunJob
) -> None:
    good = weir_job(job(tmp_path, KEYED_TOTAL), sources={"events": event_lines(RECORDS)}, checkpoint_every=20)
    report = good.with_failures()
    assert report.ok and len(report.failure_points) == 3 * (RECORDS // CHECKPOINT_EVERY + 1)

    buggy = weir_job(job(tmp_path, GLOBAL_COUNTER), sources={"events": event_lines(RECORDS)}, checkpoint_every=20)
    with pytest.raises(AssertionError) as failed:
        buggy.with_failures()
    message = str(failed.value)
    assert "divergence at operator 'enrich' (sink 'sink' differs)" in message
    assert "after_checkpoint_complete_before_commit of checkpoint 1" in message and "outside managed state" in message


def test_check_job_takes_records_already_deserialized(tmp_path: Path) -> None:
    events = [json.loads(line) for line in event_lines(RECORDS)]
    report = check_job(
        job(tmp_path, GLOBAL_COUNTER),
        {"events": Deserialized.of(events)},
        failures=True,
        checkpoint_every=CHECKPOINT_EVERY,
    )
    assert [d.operator for d in report.divergences] == ["enrich"]

"""A pytest plugin for the people who write jobs: the ``weir_job`` fixture runs a job file in the test's
process, no services, over inputs given as Python values or files, and answers what each sink
committed; ``.with_failures()`` then runs ``weir test --failures`` over the same inputs and fails the
test with the divergence report.

Kafka Streams' ``TopologyTestDriver`` drives a topology in-process the same way, but injects no
failure; PyFlink's tests start a MiniCluster each. The engine is ``weir.tools.jobtest`` (the job's own
operators, chained as in a cluster, checkpoints between source records, virtual processing time);
this module only turns test inputs into its inputs and its report into an assertion.

Use it with ``pytest_plugins = ["weir.testing"]`` in the project's top-level ``conftest.py`` (or a
test module), or ``pytest -p weir.testing``::

    def test_totals(weir_job):
        run = weir_job("job.py", sources={"events": [b'{"user": "a", "amount": 3}']})
        assert run.sinks["totals"] == [...]
        run.with_failures()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from weir.tools.jobtest import (
    DEFAULT_CHECKPOINT_EVERY,
    Deserialized,
    JobTestError,
    JobTestReport,
    Record,
    RunOutput,
    SourceData,
    SourceLines,
    check_job,
    lines_of,
    run_once,
)

SourceValues = Path | Iterable[bytes | str]
"""A source's input as lines: a JSON lines file, or an iterable of lines (``bytes``; ``str`` is UTF-8
encoded). For a Kafka source each line is a record value, through the source's deserializer; for a
PostgreSQL CDC source each line is a change event in its JSON form (``weir.tools.cdc_input``)."""


def source_data(
    sources: Mapping[str, SourceValues] | None, records: Mapping[str, Iterable[Any]] | None
) -> dict[str, SourceData]:
    """``weir.tools.jobtest``'s inputs: ``sources`` as lines (value bytes, or change events' JSON),
    ``records`` already deserialized (a Kafka source's deserializer skipped; a CDC source's
    ``ChangeEvent`` values); a source given in both is an error."""
    inputs: dict[str, SourceData] = {}
    for uid, given in (sources or {}).items():
        match given:
            case Path():
                inputs[uid] = SourceLines.read(given)
            case str() | bytes():
                raise JobTestError(
                    f"source {uid!r}: give an iterable of values or a Path, not one {type(given).__name__}"
                )
            case _:
                inputs[uid] = lines_of(given)
    for uid, values in (records or {}).items():
        if uid in inputs:
            raise JobTestError(f"source {uid!r} is given twice: as sources= and as records=")
        inputs[uid] = Deserialized.of(values)
    return inputs


@dataclass(frozen=True)
class JobRun:
    """One failure-free run of a job: what each sink committed, and how to run it again with failures."""

    job_file: Path
    parameters: Mapping[str, str]
    inputs: Mapping[str, SourceData]
    checkpoint_every: int
    ms_per_record: int
    output: RunOutput

    @property
    def sinks(self) -> dict[str, list[Any]]:
        """Each sink's committed values, by sink uid, in the order committed."""
        return {uid: [value for value, _ in self.output.by_operator.get(uid, [])] for uid in self.output.sinks}

    def records(self, uid: str) -> list[Record]:
        """A sink's (or any operator's) committed ``(value, timestamp)`` pairs."""
        if uid not in self.output.by_operator:
            raise KeyError(f"no operator {uid!r} in the job; its operators: {', '.join(self.output.order)}")
        return list(self.output.by_operator[uid])

    def with_failures(self, *, rescale: int | None = None) -> JobTestReport:
        """``weir test --failures`` over the same inputs: a failure at every checkpoint and crash point
        (with ``rescale``, each also restored at that parallelism), committed output compared with the
        failure-free run's. Raises AssertionError with the divergence report; answers the report."""
        report = check_job(
            self.job_file,
            self.inputs,
            self.parameters,
            failures=True,
            checkpoint_every=self.checkpoint_every,
            ms_per_record=self.ms_per_record,
            rescale=rescale,
        )
        if not report.ok:
            divergences = "\n".join(d.describe() for d in report.divergences)
            raise AssertionError(
                f"weir test --failures over {self.job_file}: {report.runs} runs, "
                f"{len(report.failure_points)} failure points; {divergences}"
            )
        return report


def run_job(
    job_file: str | Path,
    *,
    sources: Mapping[str, SourceValues] | None = None,
    records: Mapping[str, Iterable[Any]] | None = None,
    parameters: Mapping[str, str] | None = None,
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    ms_per_record: int = 1,
) -> JobRun:
    """Run the job once, without failures, over ``sources`` (uid -> values or a JSON lines file) and
    ``records`` (uid -> already deserialized records); generator sources need no input."""
    path = Path(job_file)
    inputs = source_data(sources, records)
    params = dict(parameters or {})
    output = run_once(path, inputs, params, checkpoint_every=checkpoint_every, ms_per_record=ms_per_record)
    return JobRun(path, params, inputs, checkpoint_every, ms_per_record, output)


RunJob = Callable[..., JobRun]


@pytest.fixture
def weir_job() -> RunJob:
    """``weir_job(JOB.py, sources=..., records=..., parameters=...)``: the job run once in this process
    (:func:`run_job`); ``.sinks`` per uid, ``.with_failures()`` for the failure matrix."""
    return run_job

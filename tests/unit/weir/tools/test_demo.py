"""The demo finds the job it runs (it moved with weir/tools once and pointed at nothing)."""

from __future__ import annotations

from weir.tools.demo import JOB_FILE


def test_the_demo_job_file_exists() -> None:
    assert JOB_FILE.is_file(), JOB_FILE
    assert JOB_FILE.name == "keyed_aggregation.py"

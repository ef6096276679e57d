"""``weir run`` of a job file whose import or ``build(env)`` never returns, exits the interpreter or
raises a BaseException: one line on stderr, exit 2, within the load deadline, nothing submitted.

Each case runs the installed CLI in a child process: a hang or ``sys.exit`` in this process would
take the test run with it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weir.tools.cli import EXIT_USAGE

DEADLINE_S = 3

JOBS = {
    "hang": ("import time\n\ndef build(env):\n    time.sleep(3600)\n", "build(env) did not return within 3 s"),
    "exit": ("import sys\n\ndef build(env):\n    sys.exit(4)\n", "build(env) called sys.exit(4)"),
    "base": (
        "class Stop(BaseException):\n    pass\n\ndef build(env):\n    raise Stop('no more')\n",
        "build(env) failed: Stop: no more",
    ),
    "import_exit": ("import os\nos._exit(9)\n", "the job's process exited with code 9 while loading it"),
}


@pytest.mark.parametrize("case", sorted(JOBS))
def test_a_job_that_does_not_load_is_one_line_within_the_deadline(tmp_path: Path, case: str) -> None:
    source, reason = JOBS[case]
    job = tmp_path / f"{case}.py"
    job.write_text(source, encoding="utf-8")
    env = {
        **os.environ,
        "WEIR_JOB_LOAD_TIMEOUT": str(DEADLINE_S),
        "WEIR_JOBMANAGER_ADDRESS": "127.0.0.1:9",  # nothing answers: the job must be refused before
        "WEIR_RUN_DIR": str(tmp_path / "run"),
    }
    started = time.monotonic()
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "weir.tools.cli", "run", str(job)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"weir run of {case}.py did not return within 60 s")
    assert completed.stderr == f"weir: error: job file {job}: {reason}\n", completed.stderr
    assert completed.returncode == EXIT_USAGE
    assert time.monotonic() - started < DEADLINE_S + 30

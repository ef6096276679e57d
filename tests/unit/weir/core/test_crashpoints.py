"""Crash points: parsing, arming, counting and scoping are pure; the hard exit runs in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir.core import crashpoints
from weir.core.crashpoints import (
    AFTER_PRE_COMMIT,
    BEFORE_JOB_RECORD_CREATE,
    BETWEEN_SINK_COMMITS,
    EXIT_CODE,
    CrashPoints,
    CrashPointSpec,
    CrashPointSpecError,
    crash_point,
    parse_spec,
    specs_from_env,
)

REPO_ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(autouse=True)
def no_exit(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Record exits instead of leaving; the armed set starts empty and is reset after each test."""
    exits: list[int] = []
    monkeypatch.setattr(crashpoints, "_exit", exits.append)
    crashpoints.arm(())
    yield exits
    crashpoints.arm(())


def test_a_spec_names_a_point_with_optional_scope_and_count() -> None:
    assert parse_spec("after_pre_commit") == CrashPointSpec(AFTER_PRE_COMMIT)
    assert parse_spec("after_pre_commit:3") == CrashPointSpec(AFTER_PRE_COMMIT, count=3)
    assert parse_spec(" between_sink_commits@taskmanager-2#1:2 ") == CrashPointSpec(
        BETWEEN_SINK_COMMITS, count=2, taskmanager="taskmanager-2", subtask=1
    )
    assert parse_spec("after_pre_commit#0") == CrashPointSpec(AFTER_PRE_COMMIT, subtask=0)
    assert str(parse_spec("after_pre_commit@tm#1:2")) == "after_pre_commit@tm#1:2"


@pytest.mark.parametrize("text", ["after_pre_commit:0", "after_pre_commit:x", "after pre commit", "nope", ""])
def test_malformed_or_unknown_specs_are_refused(text: str) -> None:
    with pytest.raises(CrashPointSpecError):
        parse_spec(text)


def test_both_variables_arm_points() -> None:
    env = {
        "WEIR_CRASH_POINT": "after_pre_commit:2",
        "WEIR_CRASH_POINTS": "between_sink_commits#1, during_snapshot_upload",
    }
    assert specs_from_env(env) == (
        CrashPointSpec(AFTER_PRE_COMMIT, count=2),
        CrashPointSpec(BETWEEN_SINK_COMMITS, subtask=1),
        CrashPointSpec("during_snapshot_upload"),
    )
    assert specs_from_env({}) == ()


def test_the_count_th_matching_visit_fires_once() -> None:
    points = CrashPoints([CrashPointSpec(AFTER_PRE_COMMIT, count=3)])
    fired = [points.visit(AFTER_PRE_COMMIT, {}) for _ in range(5)]
    assert fired == [None, None, CrashPointSpec(AFTER_PRE_COMMIT, count=3), None, None]
    assert points.visit(BETWEEN_SINK_COMMITS, {}) is None


def test_only_visits_in_scope_count() -> None:
    spec = CrashPointSpec(AFTER_PRE_COMMIT, count=2, taskmanager="taskmanager-2", subtask=1)
    points = CrashPoints([spec])
    assert points.visit(AFTER_PRE_COMMIT, {"taskmanager": "taskmanager-1", "subtask": 1}) is None
    assert points.visit(AFTER_PRE_COMMIT, {"taskmanager": "taskmanager-2", "subtask": 0}) is None
    assert points.visit(AFTER_PRE_COMMIT, {"taskmanager": "taskmanager-2"}) is None
    assert points.visits(spec) == 0
    assert points.visit(AFTER_PRE_COMMIT, {"taskmanager": "taskmanager-2", "subtask": 1}) is None
    assert points.visit(AFTER_PRE_COMMIT, {"taskmanager": "taskmanager-2", "subtask": 1}) == spec


def test_an_unarmed_point_does_nothing(no_exit: list[int]) -> None:
    for _ in range(3):
        crash_point(AFTER_PRE_COMMIT, subtask=0)
    assert no_exit == []


def test_an_armed_point_exits_with_the_kill_code(no_exit: list[int]) -> None:
    crashpoints.arm([parse_spec("after_pre_commit#0:2")])
    crash_point(AFTER_PRE_COMMIT, subtask=1)
    crash_point(AFTER_PRE_COMMIT, subtask=0)
    assert no_exit == []
    crash_point(AFTER_PRE_COMMIT, subtask=0)
    assert no_exit == [EXIT_CODE]


def test_the_taskmanager_scope_defaults_to_the_process_name(
    no_exit: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_TASKMANAGER_ID", "taskmanager-3")
    crashpoints.arm([parse_spec("after_pre_commit@taskmanager-3")])
    crash_point(AFTER_PRE_COMMIT, taskmanager="taskmanager-1")
    assert no_exit == []
    crash_point(AFTER_PRE_COMMIT)
    assert no_exit == [EXIT_CODE]


def test_a_call_site_must_name_a_known_point() -> None:
    with pytest.raises(ValueError, match="not a known crash point"):
        crash_point("after_pre_comit")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


PROGRAM = """
import atexit, sys
from weir.core.crashpoints import crash_point
atexit.register(lambda: print("atexit ran"))
for i in range(1, 4):
    print(f"visit {i}", flush=True)
    crash_point("after_pre_commit", subtask=0, checkpoint_id=i)
print("survived", flush=True)
"""


def test_the_process_exits_hard_at_the_armed_visit() -> None:
    result = run_python(PROGRAM, WEIR_CRASH_POINT="after_pre_commit:2")
    assert result.returncode == EXIT_CODE
    assert "visit 2" in result.stdout and "visit 3" not in result.stdout
    assert "atexit ran" not in result.stdout  # os._exit: no cleanup
    log = result.stdout.splitlines()[-1]  # structlog's default: a console line on stdout
    assert "crash_point_hit" in log and "checkpoint_id=2" in log and "spec=after_pre_commit:2" in log


def test_the_process_runs_through_when_nothing_matches() -> None:
    result = run_python(PROGRAM, WEIR_CRASH_POINTS="after_pre_commit#5,between_sink_commits")
    assert result.returncode == 0, result.stderr
    assert "survived" in result.stdout and "atexit ran" in result.stdout


def test_a_bad_variable_fails_at_the_first_visit() -> None:
    result = run_python(PROGRAM, WEIR_CRASH_POINT="after_pre_comit")
    assert result.returncode == 1
    assert "unknown crash point 'after_pre_comit'" in result.stderr


def test_once_dir_disarms_a_point_that_already_fired(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from weir.core import crashpoints

    env = {"WEIR_CRASH_POINT": "after_pre_commit@taskmanager-2", "WEIR_CRASH_ONCE_DIR": str(tmp_path)}
    (spec,) = crashpoints.specs_from_env(env)
    assert crashpoints.specs_from_env(env) == (spec,)
    crashpoints._fired_marker(tmp_path, spec).touch()
    assert crashpoints.specs_from_env(env) == ()


def test_a_pause_point_is_armed_by_its_own_variable_with_the_same_specs() -> None:
    env = {"WEIR_PAUSE_POINTS": "before_job_record_create:2", "WEIR_CRASH_POINT": "after_pre_commit"}
    assert specs_from_env(env) == (
        CrashPointSpec(AFTER_PRE_COMMIT),
        CrashPointSpec(BEFORE_JOB_RECORD_CREATE, count=2, pause=True),
    )


def test_a_paused_process_stops_itself_and_goes_on_once_woken() -> None:
    """A real SIGSTOP: the child stops at the second visit (its state in /proc is 'T') and finishes
    once sent SIGCONT, without exiting at the point."""
    child = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "WEIR_PAUSE_POINTS": "after_pre_commit:2"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline() for _ in range(3)]  # visits 1 and 2, then the pause's log line
        assert lines[:2] == ["visit 1\n", "visit 2\n"] and "pause_point_hit" in lines[2], lines
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline and state != "T":
            state = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state == "T", "the process did not stop itself"
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0
    assert "pause_point_woken" in out and "visit 3" in out and "survived" in out

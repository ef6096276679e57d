"""deploy/local/infra.sh: one ``up`` or ``down`` at a time. Two callers at once (the workers of
``make test``'s parallel integration run each start the services) would each find a service down and
start it twice; the second waits for the first's lock instead."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

INFRA = Path(__file__).resolve().parents[3] / "deploy" / "local" / "infra.sh"
UNKNOWN = "no-such-service"  # fails at once, touching no real service


@pytest.mark.parametrize("command", ["up", "down"])
def test_infra_waits_for_the_lock_another_up_or_down_holds(command: str, tmp_path: Path) -> None:
    assert shutil.which("flock") is not None, "flock(1) is not installed (Debian package util-linux)"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "WEIR_RUN_DIR": str(run_dir)}
    with open(run_dir / "infra.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another infra.sh up holds it
        waiting = subprocess.Popen(
            [str(INFRA), command, UNKNOWN], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                waiting.wait(timeout=5)  # without the lock it ends within a fraction of that
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _, stderr = waiting.communicate(timeout=60)
    if command == "up":  # it went on once the lock was free, and failed on the unknown service
        assert waiting.returncode == 1 and f"{UNKNOWN}.sh" in stderr, stderr
    else:  # down stops what it can and succeeds
        assert waiting.returncode == 0, stderr


def test_status_takes_no_lock(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(run_dir / "infra.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(
            [str(INFRA), "status"],
            env={**os.environ, "WEIR_RUN_DIR": str(run_dir)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0 and f"WEIR_RUN_DIR={run_dir}" in done.stdout, done.stderr

"""deploy/local/lib.sh start_daemon: a service started by a script run under a lock (``flock LOCK
make test``) must not inherit, and so hold, that lock for as long as it runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

LIB = Path(__file__).resolve().parents[3] / "deploy" / "local" / "lib.sh"


def test_a_daemon_holds_no_descriptor_of_the_script_that_started_it(tmp_path: Path) -> None:
    assert shutil.which("flock") is not None, "flock(1) is not installed (Debian package util-linux)"
    lock = tmp_path / "outer.lock"
    script = f"""
set -e
export WEIR_RUN_DIR={tmp_path / "run"}
source {LIB}
start_daemon probe sleep 30
pid=$(cat "$(svc_pidfile probe)")
for _ in $(seq 50); do [[ "$(tr '\\0' ' ' < /proc/$pid/cmdline)" == "sleep 30 " ]] && break; sleep 0.1; done
echo "cmd=$(tr '\\0' ' ' < /proc/$pid/cmdline)"
echo "fds=$(ls /proc/$pid/fd | tr '\\n' ' ')"
echo "lock=$(ls -l /proc/$pid/fd | grep -c outer.lock || true)"
kill $pid
"""
    out = subprocess.run(
        ["flock", str(lock), "bash", "-c", script], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert "cmd=sleep 30" in out, out  # the recorded pid is the daemon itself
    assert "lock=0" in out, out
    fds = next(line for line in out.splitlines() if line.startswith("fds=")).split("=", 1)[1].split()
    assert sorted(int(fd) for fd in fds) == [0, 1, 2], out

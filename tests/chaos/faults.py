"""Carrying out a fault of the schedule on the local cluster and the local services.

Processes are signalled through the cluster's supervisor (SIGKILL, SIGSTOP/SIGCONT of a process
group, as ``docker kill`` / ``docker pause``); services are stopped and started with
``deploy/local/infra.sh`` and paused by SIGSTOP of their server's pid. Holding a fault for its
duration is the fault itself; whatever waits for an effect polls a condition with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import assert_never

from tests.chaos.schedule import Fault, FaultKind
from weir.tools.supervisor import signal_process

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "deploy" / "local" / "infra.sh"
SERVICE_START_TIMEOUT_S = 300.0


class FaultError(Exception):
    """A fault could not be injected or its service did not come back."""


@dataclass(frozen=True)
class Injected:
    fault: Fault
    started_at: float  # time.time() when the fault began
    ended_at: float  # when it was over: the kill sent, the process resumed, the service up again
    detail: str


@dataclass(frozen=True)
class Injector:
    cluster_dir: Path
    services_run_dir: Path  # where deploy/local keeps the services' pid files (never a test's private dir)

    def inject(self, fault: Fault) -> Injected:
        started = time.time()
        detail = self._carry_out(fault)
        return Injected(fault, started, time.time(), detail)

    def _carry_out(self, fault: Fault) -> str:
        match fault.kind:
            case FaultKind.KILL_TASKMANAGER | FaultKind.KILL_JOBMANAGER:
                pid = signal_process(self.cluster_dir, fault.target, signal.SIGKILL)
                return f"SIGKILL pid {pid}"
            case FaultKind.PAUSE_TASKMANAGER:
                pid = signal_process(self.cluster_dir, fault.target, signal.SIGSTOP)
                try:
                    _hold(fault.duration_s)
                finally:
                    os.killpg(pid, signal.SIGCONT)
                return f"SIGSTOP pid {pid}, SIGCONT after {fault.duration_s:.1f}s"
            case FaultKind.RESTART_KAFKA | FaultKind.RESTART_POSTGRES | FaultKind.RESTART_S3:
                self._infra("down", fault.target)
                try:
                    _hold(fault.duration_s)
                finally:
                    self._infra("up", fault.target)
                return f"stopped, down {fault.duration_s:.1f}s, started and healthy"
            case FaultKind.PAUSE_S3:
                pid = self._service_pid("s3")
                os.kill(pid, signal.SIGSTOP)
                try:
                    _hold(fault.duration_s)
                finally:
                    os.kill(pid, signal.SIGCONT)
                return f"SIGSTOP s3 pid {pid}, SIGCONT after {fault.duration_s:.1f}s"
            case _ as unreachable:
                assert_never(unreachable)

    def _infra(self, command: str, service: str) -> None:
        env = dict(os.environ, WEIR_RUN_DIR=str(self.services_run_dir))
        result = subprocess.run(
            [str(INFRA), command, service], env=env, capture_output=True, text=True, timeout=SERVICE_START_TIMEOUT_S
        )
        if result.returncode != 0:
            raise FaultError(f"infra.sh {command} {service} failed ({result.returncode}): {result.stderr[-2000:]}")

    def _service_pid(self, service: str) -> int:
        path = self.services_run_dir / service / f"{service}.pid"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError) as exc:
            raise FaultError(f"no pid of {service} in {path}: {exc}") from exc

    def heal(self) -> None:
        """After the run (also a failed one): every service up, every paused process resumed."""
        self._infra("up", "postgres")
        self._infra("up", "s3")
        self._infra("up", "kafka")
        try:
            os.kill(self._service_pid("s3"), signal.SIGCONT)
        except (FaultError, ProcessLookupError):
            pass


def _hold(seconds: float) -> None:
    """Keep a fault in place for its duration (the fault is the waiting)."""
    time.sleep(seconds)

"""Carrying out a fault of the schedule on the local cluster and the local services.

Processes are signalled through the cluster's supervisor (SIGKILL, SIGSTOP/SIGCONT of a process
group, as ``docker kill`` / ``docker pause``); services are stopped and started with
``deploy/local/infra.sh`` and paused by SIGSTOP of their server's pid (slowed by stopping it four
fifths of every half second). A TaskManager's local disk is a size-limited tmpfs mounted over its
directory for the run (``LocalDisks``), filled to the last byte for the fault. Holding a fault for its
duration is the fault itself; whatever waits for an effect polls a condition with a deadline.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import assert_never

from tests.chaos.schedule import TASKMANAGERS, Fault, FaultKind
from weir.tools.supervisor import signal_process

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "deploy" / "local" / "infra.sh"
SERVICE_START_TIMEOUT_S = 300.0
SLOW_PERIOD_S = 0.5  # a slowed server runs SLOW_RUNNING of every period, stopped the rest
SLOW_RUNNING = 0.2
LOCAL_DISK_SIZE = "1g"  # each TaskManager's tmpfs: room for its RocksDB files (WALs are preallocated)
FILLER_NAME = ".chaos-filler"
FILL_CHUNKS = (64 * 2**20, 2**20, 4096)


class FaultError(Exception):
    """A fault could not be injected or its service did not come back."""


@dataclass(frozen=True)
class Injected:
    fault: Fault
    started_at: float  # time.time() when the fault began
    ended_at: float  # when it was over: the kill sent, the process resumed, the service up again
    detail: str


@dataclass(frozen=True)
class LocalDisks:
    """Each TaskManager's local directory (``<run dir>/<taskmanager>``: the RocksDB databases of its task
    attempts) on a tmpfs of its own, for the run, so that a fault can fill one to the last byte without
    touching the machine's disk. Needs the right to mount (root, CAP_SYS_ADMIN): ``mount`` raises
    FaultError otherwise."""

    run_dir: Path  # the TaskManagers' WEIR_RUN_DIR
    size: str = LOCAL_DISK_SIZE

    @staticmethod
    def unavailable() -> str | None:
        """Why no tmpfs can be mounted here (None: it can), tried on a scratch directory."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="weir-chaos-mount-") as scratch:
            result = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m", "weir-chaos-probe", scratch], capture_output=True, text=True
            )
            if result.returncode != 0:
                return result.stderr.strip() or f"mount exited {result.returncode}"
            subprocess.run(["umount", scratch], capture_output=True)
        return None

    def directory(self, taskmanager: str) -> Path:
        return self.run_dir / taskmanager

    def mount(self) -> None:
        """Mount the tmpfs over each TaskManager's directory. A running TaskManager resolves its paths
        anew for every database it opens, so the task attempts of the run live on the tmpfs."""
        mounted: list[str] = []
        for taskmanager in TASKMANAGERS:
            target = self.directory(taskmanager)
            target.mkdir(parents=True, exist_ok=True)
            result = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={self.size}", f"weir-chaos-{taskmanager}", str(target)],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                for done in mounted:
                    self._unmount(done)
                raise FaultError(
                    f"cannot mount a tmpfs over {target} for the fill-disk fault (needs root/CAP_SYS_ADMIN): "
                    f"{result.stderr.strip() or result.returncode}"
                )
            mounted.append(taskmanager)

    def unmount(self) -> None:
        for taskmanager in TASKMANAGERS:
            self._unmount(taskmanager)

    def _unmount(self, taskmanager: str) -> None:
        # Lazy: a TaskManager may still hold a file open there; its next paths resolve on the disk.
        subprocess.run(["umount", "-l", str(self.directory(taskmanager))], capture_output=True)

    def fill(self, taskmanager: str) -> int:
        """Take every free byte of the TaskManager's tmpfs (it may be writing meanwhile): allocate in
        ever smaller chunks until not even a page is left; returns how many bytes were taken."""
        filler = self.directory(taskmanager) / FILLER_NAME
        taken = 0
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for chunk in FILL_CHUNKS:
                while True:
                    try:
                        os.posix_fallocate(fd, taken, chunk)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    taken += chunk
        finally:
            os.close(fd)
        return taken

    def free(self, taskmanager: str) -> None:
        (self.directory(taskmanager) / FILLER_NAME).unlink(missing_ok=True)


@dataclass(frozen=True)
class Injector:
    cluster_dir: Path
    services_run_dir: Path  # where deploy/local keeps the services' pid files (never a test's private dir)
    local_disks: LocalDisks | None = None  # mounted by the driver when the schedule fills disks

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
            case FaultKind.SLOW_S3:
                pid = self._service_pid("s3")
                periods = _slow_down(pid, fault.duration_s)
                return (
                    f"s3 pid {pid} running {SLOW_RUNNING:.0%} of each {SLOW_PERIOD_S:g}s for "
                    f"{fault.duration_s:.1f}s ({periods} periods)"
                )
            case FaultKind.FILL_DISK:
                if self.local_disks is None:
                    raise FaultError("fill-disk needs the TaskManagers' local disks mounted (LocalDisks)")
                taken = self.local_disks.fill(fault.target)
                try:
                    _hold(fault.duration_s)
                finally:
                    self.local_disks.free(fault.target)
                return f"local disk full ({taken / 2**20:,.0f} MiB taken), freed after {fault.duration_s:.1f}s"
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
        if self.local_disks is not None:
            for taskmanager in TASKMANAGERS:
                self.local_disks.free(taskmanager)


def _slow_down(pid: int, seconds: float) -> int:
    """Let the process run SLOW_RUNNING of every SLOW_PERIOD_S for ``seconds``; it is left running."""
    end = time.monotonic() + seconds
    periods = 0
    try:
        while time.monotonic() < end:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(SLOW_PERIOD_S * (1 - SLOW_RUNNING))
            os.kill(pid, signal.SIGCONT)
            time.sleep(SLOW_PERIOD_S * SLOW_RUNNING)
            periods += 1
    finally:
        os.kill(pid, signal.SIGCONT)
    return periods


def _hold(seconds: float) -> None:
    """Keep a fault in place for its duration (the fault is the waiting)."""
    time.sleep(seconds)

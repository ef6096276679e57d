"""The local-mode cluster: a JobManager and three TaskManagers as local processes, under a supervisor.

``weir cluster up`` starts a detached supervisor (``python -m weir.tools.supervisor supervise``) that spawns the
children, restarts one that exits (as docker compose's ``restart: unless-stopped``) and keeps
``state.json`` in the cluster directory (``$WEIR_RUN_DIR/cluster``) up to date::

    $WEIR_RUN_DIR/cluster/state.json         supervisor pid; each child's name, pid, log, restarts
    $WEIR_RUN_DIR/cluster/supervisor.log     the supervisor's own log
    $WEIR_RUN_DIR/cluster/<child>.log        each child's stdout and stderr, appended across restarts

The restart decision is the pure :meth:`RestartPolicy.decide`; :class:`Supervisor` is the thin loop
around ``subprocess.Popen`` that applies it. Each child runs in its own process group, so killing a
child also kills whatever it spawned.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Final, Literal

from weir.core.config import LOCAL_MODE, Endpoints, run_dir
from weir.core.errors import ClusterError, ClusterUnavailableError, UnknownProcessError

STATE_FILE: Final = "state.json"
LOCK_FILE: Final = "supervisor.lock"
SUPERVISOR_LOG: Final = "supervisor.log"
TASKMANAGERS: Final = 3
DEFAULT_RESTART_DELAY_S: Final = 2.0
DEFAULT_START_TIMEOUT_S: Final = 60.0
DEFAULT_STOP_TIMEOUT_S: Final = 10.0
POLL_INTERVAL_S: Final = 0.1
SPARE_AFTER_S: Final = 3.0
"""A child's warm spare starts this long after the child did, not beside it: on a small machine the
spare's imports would slow the child's own start-up (which a recovery waits for)."""
DEFAULT_SPARES: Final = ("jobmanager", *(f"taskmanager-{n}" for n in range(1, TASKMANAGERS + 1)))
"""The default children kept with a warm spare: the JobManager (a job waits for it after its restart)
and the TaskManagers (a job that needs the killed one's slots, and a reactive job growing back, wait
for it to register again: from a spare in about a second instead of its imports' several on a busy
machine)."""

ChildStatus = Literal["running", "restarting", "exited"]


def cluster_dir() -> Path:
    """``$WEIR_RUN_DIR/cluster``: the local cluster's state file and logs."""
    return run_dir() / "cluster"


# The children ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildSpec:
    """One supervised process: its name (``jobmanager``, ``taskmanager-N``) and command line."""

    name: str
    argv: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> ChildSpec:
        """``NAME=COMMAND LINE`` (shell-quoted), the form ``supervise --child`` takes."""
        name, sep, command = text.partition("=")
        argv = tuple(shlex.split(command))
        if not sep or not name or not argv:
            raise ValueError(f"child {text!r}: expected NAME=COMMAND")
        return cls(name=name, argv=argv)

    def format(self) -> str:
        return f"{self.name}={shlex.join(self.argv)}"

    @property
    def module(self) -> tuple[str, str, tuple[str, ...]] | None:
        """``(python, module, arguments)`` for a ``PYTHON -m MODULE ARGS...`` child (one a warm spare
        can stand in for), else None."""
        if len(self.argv) >= 3 and self.argv[1] == "-m":
            return self.argv[0], self.argv[2], self.argv[3:]
        return None


def jobmanager_port(endpoints: Endpoints) -> int:
    _, _, port = endpoints.jobmanager_address.rpartition(":")
    try:
        return int(port)
    except ValueError:
        raise ClusterError(
            f"WEIR_JOBMANAGER_ADDRESS={endpoints.jobmanager_address!r} has no port (expected host:port)"
        ) from None


def jobmanager_addresses(endpoints: Endpoints, standbys: int) -> tuple[str, ...]:
    """The JobManager's address and its ``standbys``' (the ports after its own, on the same host)."""
    host = endpoints.jobmanager_address.rpartition(":")[0]
    port = jobmanager_port(endpoints)
    return tuple(f"{host}:{port + k}" for k in range(standbys + 1))


def standby_metrics_port(endpoints: Endpoints, k: int) -> int:
    """Standby ``k``'s metrics port: the JobManager's minus ``k`` (0: the JobManager has none, nor do its
    standbys). Below it, not above: the TaskManagers' ports follow their base port, which is the
    JobManager's metrics port + 1 by default (19249, 19250 + n)."""
    return endpoints.jobmanager_metrics_port - k if endpoints.jobmanager_metrics_port else 0


def ha_environment(endpoints: Endpoints, standbys: int) -> dict[str, str]:
    """With standbys: every process of the cluster runs with high availability (the JobManagers contend
    for the lease, the TaskManagers and the tools follow whichever leads); none: nothing to add."""
    if standbys <= 0:
        return {}
    return {"WEIR_HA_ENABLED": "true", "WEIR_JOBMANAGER_ADDRESSES": ",".join(jobmanager_addresses(endpoints, standbys))}


def default_children(
    endpoints: Endpoints, taskmanagers: int = TASKMANAGERS, python: str = sys.executable, standbys: int = 0
) -> tuple[ChildSpec, ...]:
    """The JobManager, ``standbys`` standby JobManagers (``jobmanager-standby-K``: the JobManager's
    port + K, its REST port + K, its metrics port - K, :func:`standby_metrics_port`; run with
    :func:`ha_environment`) and ``taskmanagers`` TaskManagers; they read the other endpoints from WEIR_* vars."""
    jobmanager_args = [
        "--port",
        str(jobmanager_port(endpoints)),
        "--metrics-port",
        str(endpoints.jobmanager_metrics_port),
        "--rest-port",
        str(endpoints.jobmanager_rest_port),
    ]
    specs = [ChildSpec("jobmanager", (python, "-m", "weir.jobmanager", *jobmanager_args))]
    for k in range(1, standbys + 1):
        rest_port = endpoints.jobmanager_rest_port + k if endpoints.jobmanager_rest_port else 0
        metrics_port = standby_metrics_port(endpoints, k)
        standby = (
            *("--port", str(jobmanager_port(endpoints) + k)),
            *("--metrics-port", str(metrics_port), "--rest-port", str(rest_port)),
        )
        specs.append(ChildSpec(f"jobmanager-standby-{k}", (python, "-m", "weir.jobmanager", *standby)))
    for n in range(1, taskmanagers + 1):
        name = f"taskmanager-{n}"
        metrics_port = endpoints.taskmanager_metrics_base_port + n
        argv = (python, "-m", "weir.taskmanager", "--id", name, "--metrics-port", str(metrics_port))
        specs.append(ChildSpec(name, argv))
    return tuple(specs)


# The restart decision (pure) ---------------------------------------------------------------------


@dataclass(frozen=True)
class ChildExit:
    """A child stopped: ``returncode`` None when it could not even be started."""

    returncode: int | None
    started_at: float
    exited_at: float


@dataclass(frozen=True)
class RestartDecision:
    restart_at: float | None  # None: the child stays down
    crash_streak: int  # consecutive exits that each came soon after a start


@dataclass(frozen=True)
class RestartPolicy:
    """``restart: unless-stopped``: restart any exit, except while the supervisor stops.

    The first exit of a streak restarts at once: a JobManager or TaskManager that was killed is needed
    back as soon as possible (every second it is down is a second of the job's recovery), and a delay
    would only wait. A child that exits within ``stable_after_s`` of its start extends a crash streak;
    each further exit in a streak waits ``delay_s``, doubled each time up to ``max_delay_s`` (docker's
    back-off), so a crash loop does not spin.
    """

    restart: bool = True
    delay_s: float = DEFAULT_RESTART_DELAY_S
    max_delay_s: float = 30.0
    stable_after_s: float = 10.0

    def decide(self, exit: ChildExit, crash_streak: int, *, stopping: bool = False) -> RestartDecision:
        if stopping or not self.restart:
            return RestartDecision(restart_at=None, crash_streak=crash_streak)
        ran_s = exit.exited_at - exit.started_at
        streak = 1 if ran_s >= self.stable_after_s else crash_streak + 1
        delay = 0.0 if streak == 1 else max(self.delay_s, min(self.delay_s * 2 ** (streak - 2), self.max_delay_s))
        return RestartDecision(restart_at=exit.exited_at + delay, crash_streak=streak)


# The state file ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildRecord:
    name: str
    pid: int | None
    status: ChildStatus
    log: str
    restarts: int
    last_exit_code: int | None


@dataclass(frozen=True)
class SupervisorState:
    supervisor_pid: int
    started_at: float
    restart: bool
    restart_delay_s: float
    children: tuple[ChildRecord, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> SupervisorState:
        raw = json.loads(text)
        return cls(
            supervisor_pid=int(raw["supervisor_pid"]),
            started_at=float(raw["started_at"]),
            restart=bool(raw["restart"]),
            restart_delay_s=float(raw["restart_delay_s"]),
            children=tuple(ChildRecord(**c) for c in raw["children"]),
        )


def read_state(directory: Path) -> SupervisorState | None:
    """The supervisor's last written state, or None when no supervisor has written one."""
    path = directory / STATE_FILE
    try:
        return SupervisorState.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"{path} is corrupt ({exc}); stop stray processes and delete it") from exc


def _write_state(directory: Path, state: SupervisorState) -> None:
    path = directory / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json(), encoding="utf-8")
    os.replace(tmp, path)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; reaps it first when it is a child of this process (no zombies)."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A dead process its parent has not reaped yet (an orphan waits for init, which may be slow)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no /proc (not Linux) or already gone
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def supervisor_alive(directory: Path, state: SupervisorState) -> bool:
    """True while the supervisor named in ``state`` runs: its pid lives and it holds the lock file."""
    if not pid_alive(state.supervisor_pid):
        return False
    try:
        with open(directory / LOCK_FILE) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
    except FileNotFoundError:
        return False
    except BlockingIOError:
        return True
    return False  # nobody holds the lock: the pid was reused by an unrelated process


# The supervisor loop -----------------------------------------------------------------------------


class _Child:
    """The supervisor's mutable view of one child."""

    def __init__(self, spec: ChildSpec, log: Path) -> None:
        self.spec = spec
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.crash_streak = 0
        self.restart_at: float | None = None
        self.last_exit_code: int | None = None
        self.spare: subprocess.Popen[bytes] | None = None  # weir.tools.warm_spare, waiting for this child's argv
        self.spare_at: float | None = None  # when to start the next spare

    def record(self) -> ChildRecord:
        status: ChildStatus = (
            "running" if self.proc is not None else "restarting" if self.restart_at is not None else "exited"
        )
        return ChildRecord(
            name=self.spec.name,
            pid=self.proc.pid if self.proc is not None else None,
            status=status,
            log=str(self.log),
            restarts=self.restarts,
            last_exit_code=self.last_exit_code,
        )


class Supervisor:
    """Runs the children until ``stop`` is set, restarting them as ``policy`` decides."""

    def __init__(
        self,
        directory: Path,
        children: Sequence[ChildSpec],
        policy: RestartPolicy,
        *,
        poll_interval_s: float = POLL_INTERVAL_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] | None = None,
        spares: Collection[str] = (),
        spare_after_s: float = SPARE_AFTER_S,
    ) -> None:
        """``spares``: the children (by name) kept with a warm spare (``weir.tools.warm_spare``), which
        a restart hands the child's command line instead of starting Python cold; only a
        ``PYTHON -m MODULE`` child whose module runs under ``if __name__ == "__main__"`` (a package's
        ``__main__``, as Weir's JobManager and TaskManager) can have one: the spare imports it."""
        names = [c.name for c in children]
        if len(set(names)) != len(names):
            raise ClusterError(f"duplicate child names in {names}")
        self._directory = directory
        self._children = [_Child(spec, directory / f"{spec.name}.log") for spec in children]
        self._policy = policy
        self._poll_interval_s = poll_interval_s
        self._stop_timeout_s = stop_timeout_s
        self._clock = clock
        self._log = log or _log_to_stderr
        self._started_at = time.time()
        self._spares = frozenset(spares)
        self._spare_after_s = spare_after_s

    def run(self, stop: threading.Event) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        try:
            for child in self._children:
                self._spawn(child)
            self._save()
            while not stop.is_set():
                if self._step(self._clock(), stopping=False):
                    self._save()
                stop.wait(self._poll_interval_s)
        finally:
            self._log("stopping: terminating children")
            self._terminate_all()
            (self._directory / STATE_FILE).unlink(missing_ok=True)
        self._log("stopped")

    def _step(self, now: float, *, stopping: bool) -> bool:
        """Reap exited children and start due restarts (none while stopping: a child started then
        would be none of the children being terminated, and outlive the cluster); True when anything
        changed."""
        changed = False
        for child in self._children:
            if child.proc is not None:
                returncode = child.proc.poll()
                if returncode is not None:
                    self._exited(child, returncode, now, stopping=stopping)
                    changed = True
            elif child.restart_at is not None and now >= child.restart_at and not stopping:
                child.restarts += 1
                self._spawn(child)
                changed = True
            if not stopping:
                self._tend_spare(child, now)
        return changed

    def _tend_spare(self, child: _Child, now: float) -> None:
        """Start the child's spare when due; a spare that died is replaced after the same pause."""
        if child.spare is not None and child.spare.poll() is not None:
            self._log(f"{child.spec.name}'s warm spare {describe_exit(child.spare.returncode)}; starting another")
            child.spare = None
            child.spare_at = now + self._spare_after_s
        if child.spare is not None or child.spare_at is None or now < child.spare_at:
            return
        child.spare_at = None
        target = child.spec.module
        if target is None:
            return
        python, module, _args = target
        with open(child.log, "ab") as log:
            try:
                child.spare = subprocess.Popen(
                    (python, "-m", "weir.tools.warm_spare", module),
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    start_new_session=True,
                )
            except OSError as exc:
                self._log(f"cannot start a warm spare of {child.spec.name}: {exc}")
                return
        self._log(f"started a warm spare of {child.spec.name} (pid {child.spare.pid})")

    def _activate_spare(self, child: _Child) -> subprocess.Popen[bytes] | None:
        """Hand the waiting spare the child's arguments; the spare's process, None when there is no
        live spare (the child then starts cold)."""
        spare, child.spare = child.spare, None
        target = child.spec.module
        if spare is None or target is None or spare.poll() is not None or spare.stdin is None:
            if spare is not None:
                _signal_group(spare.pid, signal.SIGKILL)
            return None
        try:
            spare.stdin.write(json.dumps({"argv": list(target[2])}).encode() + b"\n")
            spare.stdin.close()
        except OSError:  # it died in between
            _signal_group(spare.pid, signal.SIGKILL)
            return None
        return spare

    def _exited(self, child: _Child, returncode: int | None, now: float, *, stopping: bool) -> None:
        if child.proc is not None:
            _signal_group(child.proc.pid, signal.SIGKILL)  # whatever the child left behind
        child.proc = None
        child.last_exit_code = returncode
        decision = self._policy.decide(
            ChildExit(returncode=returncode, started_at=child.started_at, exited_at=now),
            child.crash_streak,
            stopping=stopping,
        )
        child.crash_streak = decision.crash_streak
        child.restart_at = decision.restart_at
        if stopping:
            return
        if decision.restart_at is None:
            self._log(f"{child.spec.name} {describe_exit(returncode)}; not restarting (--no-restart)")
        else:
            self._log(f"{child.spec.name} {describe_exit(returncode)}; restarting in {decision.restart_at - now:.1f} s")

    def _spawn(self, child: _Child) -> None:
        now = self._clock()
        child.started_at = now
        child.restart_at = None
        if child.spec.name in self._spares:
            child.spare_at = now + self._spare_after_s
        with open(child.log, "ab") as log:
            log.write(f"--- weir supervisor: starting {child.spec.format()} (restart {child.restarts})\n".encode())
            log.flush()
            spare = self._activate_spare(child)
            if spare is not None:
                child.proc = spare
                self._log(f"started {child.spec.name} from its warm spare (pid {spare.pid}, restart {child.restarts})")
                return
            try:
                child.proc = subprocess.Popen(
                    child.spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    start_new_session=True,
                )
            except OSError as exc:
                log.write(f"--- weir supervisor: cannot start {child.spec.name}: {exc}\n".encode())
                self._log(f"cannot start {child.spec.name}: {exc}")
                self._exited(child, None, now, stopping=False)
                return
        self._log(f"started {child.spec.name} (pid {child.proc.pid}, restart {child.restarts})")

    def _terminate_all(self) -> None:
        for child in self._children:
            spare, child.spare, child.spare_at = child.spare, None, None
            if spare is not None:
                _signal_group(spare.pid, signal.SIGKILL)  # it holds nothing yet
                spare.wait()
        running = [c for c in self._children if c.proc is not None]
        for child in running:
            assert child.proc is not None
            _signal_group(child.proc.pid, signal.SIGTERM)
        deadline = self._clock() + self._stop_timeout_s
        while self._clock() < deadline and any(c.proc is not None for c in running):
            self._step(self._clock(), stopping=True)
            time.sleep(self._poll_interval_s)
        for child in running:
            if child.proc is not None:
                self._log(f"{child.spec.name} did not stop within {self._stop_timeout_s:.0f} s; killing it")
                _signal_group(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
                self._exited(child, child.proc.returncode, self._clock(), stopping=True)

    def _save(self) -> None:
        _write_state(
            self._directory,
            SupervisorState(
                supervisor_pid=os.getpid(),
                started_at=self._started_at,
                restart=self._policy.restart,
                restart_delay_s=self._policy.delay_s,
                children=tuple(c.record() for c in self._children),
            ),
        )


def describe_exit(returncode: int | None) -> str:
    """``exited with code 3``, ``was killed by SIGKILL`` or ``could not be started``."""
    if returncode is None:
        return "could not be started"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group a child leads (children start in their own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _log_to_stderr(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"{stamp} weir supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _exclusive_lock(directory: Path) -> Iterator[IO[str]]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_FILE, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(f"another cluster supervisor already runs in {directory}") from None
        yield lock


def supervise(
    directory: Path,
    children: Sequence[ChildSpec],
    policy: RestartPolicy,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    spares: Collection[str] = (),
) -> None:
    """Run a supervisor in this process until SIGTERM or SIGINT."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with _exclusive_lock(directory):
        Supervisor(directory, children, policy, stop_timeout_s=stop_timeout_s, spares=spares).run(stop)


# Operations for the CLI --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    pid: int | None
    alive: bool
    status: ChildStatus
    restarts: int
    last_exit_code: int | None
    log: str


@dataclass(frozen=True)
class LocalClusterStatus:
    directory: str
    supervisor_pid: int
    supervisor_alive: bool
    processes: tuple[ProcessStatus, ...]


def local_status(directory: Path) -> LocalClusterStatus | None:
    """What the state file says, with each pid checked; None when no supervisor state exists."""
    state = read_state(directory)
    if state is None:
        return None
    return LocalClusterStatus(
        directory=str(directory),
        supervisor_pid=state.supervisor_pid,
        supervisor_alive=supervisor_alive(directory, state),
        processes=tuple(
            ProcessStatus(
                name=c.name,
                pid=c.pid,
                alive=c.pid is not None and pid_alive(c.pid),
                status=c.status,
                restarts=c.restarts,
                last_exit_code=c.last_exit_code,
                log=c.log,
            )
            for c in state.children
        ),
    )


@dataclass(frozen=True)
class StartResult:
    already_running: bool
    status: LocalClusterStatus
    taskmanagers_alive: int | None  # None: the cluster was already up, not asked


def start_cluster(
    directory: Path,
    endpoints: Endpoints,
    *,
    restart: bool = True,
    restart_delay_s: float = DEFAULT_RESTART_DELAY_S,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    children: Sequence[ChildSpec] | None = None,
    spares: Collection[str] = DEFAULT_SPARES,
    standbys: int = 0,
) -> StartResult:
    """Start a detached supervisor and wait until the JobManager reports every TaskManager alive.

    ``children`` None runs :func:`default_children`. ``spares``: the children kept with a warm spare
    (by default the JobManager and the TaskManagers, ``DEFAULT_SPARES``). ``standbys``: standby
    JobManagers beside it (every process then runs with ``WEIR_HA_ENABLED``; the wait asks whichever
    leads). On failure the half-started cluster is stopped and the error names the logs to read.
    """
    existing = local_status(directory)
    if existing is not None and existing.supervisor_alive:
        return StartResult(already_running=True, status=existing, taskmanagers_alive=None)
    if existing is not None:
        stop_cluster(directory)  # a stale state file: clear up what its supervisor left behind
    specs = tuple(children) if children is not None else default_children(endpoints, standbys=standbys)
    if children is None:
        _require_ports_free(endpoints, standbys)
    expected = sum(1 for c in specs if c.name.startswith("taskmanager"))

    argv = ["--dir", str(directory), "--restart-delay", str(restart_delay_s)]
    if not restart:
        argv.append("--no-restart")
    for name in spares:
        argv += ["--spare", name]
    for spec in specs:
        argv += ["--child", spec.format()]
    supervisor_pid = _launch_supervisor(directory, argv, ha_environment(endpoints, standbys))
    try:
        addresses = ",".join(jobmanager_addresses(endpoints, standbys))
        alive = _wait_until_ready(directory, addresses, supervisor_pid, expected, timeout_s)
    except (ClusterError, KeyboardInterrupt):
        state = read_state(directory)
        if state is not None and state.supervisor_pid == supervisor_pid:  # not another `up`'s cluster
            stop_cluster(directory)
        _stop_pids([supervisor_pid], signal.SIGTERM, DEFAULT_STOP_TIMEOUT_S + 5.0)
        raise
    status = local_status(directory)
    assert status is not None
    return StartResult(already_running=False, status=status, taskmanagers_alive=alive)


def _launch_supervisor(directory: Path, args: Sequence[str], environment: Mapping[str, str]) -> int:
    """Start ``supervise`` through a launcher that exits at once (``supervise --detach``): the
    supervisor is then nobody's child here, runs in its own session and outlives ``weir cluster up``."""
    directory.mkdir(parents=True, exist_ok=True)
    launched = subprocess.run(
        [sys.executable, "-m", "weir.tools.supervisor", "supervise", "--detach", *args],
        # The local cluster is the local mode: its processes use the local S3 server unless told otherwise.
        # ``environment`` (high availability) goes to the supervisor, and from it to every child.
        env={**os.environ, LOCAL_MODE: os.environ.get(LOCAL_MODE) or "true", **environment},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    try:
        return int(launched.stdout.strip())
    except ValueError:
        reason = (launched.stderr.strip().splitlines() or [f"exit code {launched.returncode}"])[-1]
        raise ClusterError(f"could not launch the cluster supervisor: {reason}") from None


def _detach(args: Sequence[str], directory: Path) -> int:
    """The launcher's half of :func:`_launch_supervisor`: spawn the supervisor, print its pid."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / SUPERVISOR_LOG, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "weir.tools.supervisor", "supervise", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    print(proc.pid, flush=True)
    return proc.pid


def _stop_pids(pids: Sequence[int], sig: signal.Signals, timeout_s: float) -> None:
    """Send ``sig`` to each live pid, wait until they are gone; SIGKILL what outlives ``timeout_s``."""
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while _any_alive(pids) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)  # poll interval of a wait with a deadline
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait_until_ready(directory: Path, addresses: str, supervisor_pid: int, expected: int, timeout_s: float) -> int:
    from weir.tools.client import JobManagerClient  # grpc is not needed by the supervisor process

    supervisor_log = directory / SUPERVISOR_LOG
    deadline = time.monotonic() + timeout_s
    progress = "the JobManager did not answer"
    with JobManagerClient(addresses, timeout_s=2.0) as client:
        while True:
            if not pid_alive(supervisor_pid):
                raise ClusterError(f"the cluster supervisor exited during start-up; read {supervisor_log}")
            state = read_state(directory)
            if state is not None:
                dead = [c for c in state.children if c.status == "exited"]
                if dead:
                    raise ClusterError(
                        "; ".join(f"{c.name} {describe_exit(c.last_exit_code)} (read {c.log})" for c in dead)
                    )
            try:
                alive = len(client.cluster_status().alive_taskmanagers)
                if alive >= expected and state is not None and state.supervisor_pid == supervisor_pid:
                    return alive
                progress = f"{alive} of {expected} TaskManagers registered"
            except ClusterUnavailableError:
                pass
            if time.monotonic() >= deadline:
                logs = [str(supervisor_log)]
                if state is not None:
                    crashed = [f"{c.name} restarted {c.restarts} times" for c in state.children if c.restarts]
                    if crashed:
                        progress += f" ({', '.join(crashed)})"
                    logs += [c.log for c in state.children]
                raise ClusterError(
                    f"the cluster did not come up within {timeout_s:g} s: {progress}; read the logs: " + ", ".join(logs)
                )
            time.sleep(POLL_INTERVAL_S)  # poll interval of a wait with a deadline


def _cluster_ports(endpoints: Endpoints, standbys: int) -> dict[str, tuple[int, str]]:
    """What each process of the cluster listens on: what -> (port, the setting that moves it)."""
    return {
        "jobmanager": (jobmanager_port(endpoints), "WEIR_JOBMANAGER_ADDRESS"),
        "jobmanager metrics": (endpoints.jobmanager_metrics_port, "WEIR_JOBMANAGER_METRICS_PORT"),
        "jobmanager REST API": (endpoints.jobmanager_rest_port, "WEIR_JOBMANAGER_REST_PORT"),
        **{
            f"taskmanager-{n} metrics": (
                endpoints.taskmanager_metrics_base_port + n,
                "WEIR_TASKMANAGER_METRICS_BASE_PORT",
            )
            for n in range(1, TASKMANAGERS + 1)
        },
        **{
            f"jobmanager-standby-{k}": (jobmanager_port(endpoints) + k, "WEIR_JOBMANAGER_ADDRESS")
            for k in range(1, standbys + 1)
        },
        **{
            f"jobmanager-standby-{k} REST API": (endpoints.jobmanager_rest_port + k, "WEIR_JOBMANAGER_REST_PORT")
            for k in range(1, standbys + 1)
            if endpoints.jobmanager_rest_port
        },
        **{
            f"jobmanager-standby-{k} metrics": (standby_metrics_port(endpoints, k), "WEIR_JOBMANAGER_METRICS_PORT")
            for k in range(1, standbys + 1)
            if endpoints.jobmanager_metrics_port
        },
    }


def require_distinct_ports(endpoints: Endpoints, standbys: int) -> None:
    """Raises ClusterError when two of the cluster's processes would listen on one port."""
    owner: dict[int, str] = {}
    for what, (port, variable) in _cluster_ports(endpoints, standbys).items():
        if port and port in owner:
            raise ClusterError(f"port {port} is both {owner[port]} and {what}: move one (e.g. {variable})")
        owner[port] = what


def _require_ports_free(endpoints: Endpoints, standbys: int = 0) -> None:
    host = endpoints.jobmanager_address.rpartition(":")[0] or "127.0.0.1"
    if host not in ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]"):
        raise ClusterError(
            f"WEIR_JOBMANAGER_ADDRESS={endpoints.jobmanager_address} is not local; "
            "`weir cluster up` starts the JobManager on this machine"
        )
    require_distinct_ports(endpoints, standbys)
    ports = _cluster_ports(endpoints, standbys)
    for what, (port, variable) in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                raise ClusterError(
                    f"port 127.0.0.1:{port} ({what}) is already taken by another process: free it or set {variable}"
                )


@dataclass(frozen=True)
class StopResult:
    was_running: bool
    stopped: tuple[str, ...]


def stop_cluster(directory: Path, timeout_s: float = DEFAULT_STOP_TIMEOUT_S + 10.0) -> StopResult:
    """Stop the supervisor (which stops its children) and wait until every process is gone.

    When the supervisor is already dead (a stale state file), its surviving children are killed here.
    """
    state = read_state(directory)
    if state is None:
        return StopResult(was_running=False, stopped=())
    pids = {c.name: c.pid for c in state.children if c.pid is not None}
    was_running = supervisor_alive(directory, state)
    if was_running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.supervisor_pid, signal.SIGTERM)
    else:
        for pid in pids.values():
            _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    watched = [state.supervisor_pid, *pids.values()] if was_running else list(pids.values())
    while _any_alive(watched) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)  # poll interval of a wait with a deadline
    if _any_alive(watched):
        if was_running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.supervisor_pid, signal.SIGKILL)
        for pid in pids.values():
            _signal_group(pid, signal.SIGKILL)
    (directory / STATE_FILE).unlink(missing_ok=True)
    return StopResult(was_running=was_running, stopped=tuple(pids))


def _any_alive(pids: Sequence[int]) -> bool:
    return any(pid_alive(pid) for pid in pids)


def kill_process(directory: Path, name: str) -> int:
    """SIGKILL one child (and its process group), as ``docker kill``; answers the killed pid."""
    return signal_process(directory, name, signal.SIGKILL)


def signal_process(directory: Path, name: str, sig: signal.Signals) -> int:
    """Send ``sig`` to one child's process group: SIGKILL as ``docker kill``, SIGSTOP and SIGCONT as
    ``docker pause`` and ``unpause`` (a paused TaskManager is a partitioned zombie: alive, silent).
    Answers the child's pid."""
    status = local_status(directory)
    if status is None or not status.supervisor_alive:
        raise ClusterUnavailableError(f"no local cluster runs in {directory}: start it with `weir cluster up`")
    names = [p.name for p in status.processes]
    process = next((p for p in status.processes if p.name == name), None)
    if process is None:
        raise UnknownProcessError(f"unknown process {name!r}: valid names are {', '.join(names)}")
    if process.pid is None or not process.alive:
        raise ClusterError(f"{name} is not running ({process.status}); see {process.log}", fault="user")
    _signal_group(process.pid, sig)
    return process.pid


# `python -m weir.tools.supervisor supervise` --------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m weir.tools.supervisor")
    commands = parser.add_subparsers(dest="command", required=True)
    sup = commands.add_parser("supervise", help="run the local cluster's supervisor in the foreground")
    sup.add_argument("--dir", type=Path, default=None, help="cluster directory (default $WEIR_RUN_DIR/cluster)")
    sup.add_argument(
        "--restart-delay",
        type=float,
        default=DEFAULT_RESTART_DELAY_S,
        help="the back-off of a crash loop: a child that exits again soon after its restart waits this long "
        "(doubled each time); the first exit restarts at once",
    )
    sup.add_argument("--no-restart", action="store_true", help="leave a child that exits dead")
    sup.add_argument("--detach", action="store_true", help="start the supervisor in the background, print its pid")
    sup.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S)
    sup.add_argument(
        "--spare",
        action="append",
        default=[],
        metavar="NAME",
        help="keep a warm spare of this child (weir.tools.warm_spare) for its restarts; repeatable",
    )
    sup.add_argument(
        "--child", action="append", default=[], metavar="NAME=COMMAND", help="replace the default children"
    )
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    if args.detach:
        _detach([a for a in raw[1:] if a != "--detach"], args.dir or cluster_dir())
        return 0
    try:
        children = (
            tuple(ChildSpec.parse(c) for c in args.child) if args.child else default_children(Endpoints.from_env())
        )
        supervise(
            args.dir or cluster_dir(),
            children,
            RestartPolicy(restart=not args.no_restart, delay_s=args.restart_delay),
            stop_timeout_s=args.stop_timeout,
            spares=args.spare,
        )
    except (ValueError, ClusterError) as exc:
        _log_to_stderr(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

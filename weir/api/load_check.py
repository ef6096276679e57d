"""Load a job once in a child process with a deadline, before the process that asked loads it.

A job's import or ``build(env)`` is user code: it may never return, call ``sys.exit()``, raise a
``BaseException`` or end its interpreter (``os._exit``). ``weir run`` and the JobManager's submission
run it first here (``python -m weir.api.load_check``), as Flink's client runs a program's ``main`` in a
``PackagedProgram`` before it submits the job graph: whatever the code does, the asking process gets
one line within ``WEIR_JOB_LOAD_TIMEOUT`` seconds and stays as it was. The child's own stdout is
moved onto its stderr, so that what the job prints does not mix with the answer.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, assert_never

from weir.api.artifacts import MANIFEST, manifest_from_document
from weir.api.job_code import JobCode, PreparedArtifact, SourceCode, load_job
from weir.core.errors import JobDefinitionError
from weir.plan import build_plan, plan_document

_LOADING: Final = "loading"
_BUILDING: Final = "building"
_TIMED_OUT: Final = object()
STARTUP_TIMEOUT_S: Final = 60.0
"""How long the child may take to import Weir before the job's code runs (a loaded host is slow)."""


def _next(lines: queue.Queue[str | None], timeout_s: float) -> str | None | object:
    """The child's next line; None once its output ended; ``_TIMED_OUT`` after ``timeout_s``."""
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        return _TIMED_OUT


@dataclass(frozen=True)
class LoadCheck:
    job_name: str  # the name the job's graph has (its own, or the one asked for)
    plan: dict[str, Any]  # weir.plan.plan_document of its graph: what `weir info` prints


def _request(code: JobCode, parameters: Mapping[str, str], parallelism: int, job_name: str | None) -> dict[str, Any]:
    common = {"parameters": dict(parameters), "parallelism": parallelism, "job_name": job_name}
    match code:
        case SourceCode(file_name=file_name, source=source):
            return {**common, "file_name": file_name, "source": base64.b64encode(source).decode("ascii")}
        case PreparedArtifact():
            return {
                **common,
                "artifact_id": code.artifact_id,
                "directory": str(code.directory),
                "site": str(code.site) if code.site is not None else None,
                "distributions": dict(code.distributions),
            }
        case unreachable:
            assert_never(unreachable)


def _name(code: JobCode) -> str:
    match code:
        case SourceCode(file_name=file_name):
            return file_name
        case PreparedArtifact(manifest=manifest):
            return manifest.entry_name
        case unreachable:
            assert_never(unreachable)


def check_job_loads(
    code: JobCode,
    parameters: Mapping[str, str] | None,
    parallelism: int,
    job_name: str | None,
    timeout_s: float,
) -> LoadCheck:
    """Load the job in a child process; a job that does not load within ``timeout_s`` is a one-line
    JobDefinitionError (the child and what it started are killed)."""
    name = _name(code)
    request = json.dumps(_request(code, parameters or {}, parallelism, job_name)).encode()
    child = subprocess.Popen(
        [sys.executable, "-m", "weir.api.load_check"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: whatever the job started goes with it
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line.decode(errors="replace").rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=read, name="job-load-check", daemon=True)
    reader.start()
    assert child.stdin is not None
    answered: list[str] = []
    try:
        child.stdin.write(request)
        child.stdin.close()
        # The deadline runs from when the job's code starts, not while the interpreter imports Weir.
        phase = _next(lines, STARTUP_TIMEOUT_S)
        if phase == _LOADING:
            phase = _next(lines, timeout_s)
            if phase is _TIMED_OUT:
                raise JobDefinitionError(f"job file {name}: its import did not finish within {timeout_s:g} s")
            if phase == _BUILDING:
                phase = _next(lines, timeout_s)
                if phase is _TIMED_OUT:
                    raise JobDefinitionError(f"job file {name}: build(env) did not return within {timeout_s:g} s")
        if phase is _TIMED_OUT:
            raise JobDefinitionError(
                f"job file {name}: the process loading it did not start within {STARTUP_TIMEOUT_S:g} s"
            )
        if isinstance(phase, str):
            answered.append(phase)
    except BrokenPipeError:
        pass  # the child ended at once: its exit code says why
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    out_lines = answered
    results = [line for line in out_lines if line.startswith("{")]
    if not results:
        raise JobDefinitionError(
            f"job file {name}: the job's process exited with code {child.returncode} while loading it"
        )
    answer = json.loads(results[-1])
    if "error" in answer:
        raise JobDefinitionError(str(answer["error"]))
    return LoadCheck(job_name=str(answer["job_name"]), plan=dict(answer["plan"]))


def _code_of(request: Mapping[str, Any]) -> JobCode:
    if "source" in request:
        return SourceCode(str(request["file_name"]), base64.b64decode(request["source"]))
    directory = Path(request["directory"])
    manifest = manifest_from_document(json.loads((directory / MANIFEST).read_bytes()), str(directory))
    site = Path(request["site"]) if request["site"] is not None else None
    return PreparedArtifact(str(request["artifact_id"]), manifest, directory, site, dict(request["distributions"]))


def main() -> None:
    answer = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the job's prints go to stderr

    def building() -> None:
        answer.write(_BUILDING + "\n")
        answer.flush()

    request = json.loads(sys.stdin.buffer.read())
    answer.write(_LOADING + "\n")
    answer.flush()
    try:
        loaded = load_job(
            _code_of(request),
            request["parameters"],
            int(request["parallelism"]),
            request["job_name"],
            on_build=building,
        )
        plan = plan_document(build_plan(loaded.graph))
    except JobDefinitionError as exc:
        result: dict[str, Any] = {"error": str(exc)}
    except Exception as exc:  # the graph's validation, the artifact's folder: still one line
        result = {"error": f"job {request.get('file_name', request.get('artifact_id'))}: {type(exc).__name__}: {exc}"}
    else:
        result = {"job_name": loaded.graph.job_name, "plan": plan}
    answer.write(json.dumps(result) + "\n")
    answer.flush()
    os._exit(0)  # no atexit handler or thread of the job's may hold the answer back


if __name__ == "__main__":
    main()

"""Loading a job file: import its source as a module of its own and run its ``build(env)``; every
failure is a JobDefinitionError naming the file (Flink's ``PackagedProgram``)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from weir.api.environment import Environment
from weir.core.errors import JobDefinitionError
from weir.graph import LogicalGraph


@dataclass(frozen=True)
class LoadedJob:
    graph: LogicalGraph
    module: ModuleType


def load_job_source(
    source: bytes | str,
    file_name: str,
    parameters: Mapping[str, str] | None = None,
    parallelism: int = 1,
    job_name: str | None = None,
) -> LoadedJob:
    """Import a job file's source and run its ``build(env)``; any failure is a JobDefinitionError."""
    text = source.decode("utf-8") if isinstance(source, bytes) else source
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
    module_name = f"weir_job_{Path(file_name).stem.replace('-', '_')}_{digest}"
    module = ModuleType(module_name)
    module.__file__ = file_name
    try:
        code = compile(text, file_name, "exec")
    except SyntaxError as exc:
        raise JobDefinitionError(f"job file {file_name} does not compile: {exc.msg} (line {exc.lineno})") from exc
    sys.modules[module_name] = module  # so that pickle and dataclasses can find the job's classes
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise JobDefinitionError(f"job file {file_name} does not import: {type(exc).__name__}: {exc}") from exc
    build = getattr(module, "build", None)
    if not callable(build):
        raise JobDefinitionError(f"job file {file_name} defines no build(env) function")
    env = Environment(job_name or Path(file_name).stem, parameters, parallelism)
    try:
        build(env)
    except JobDefinitionError:
        raise
    except Exception as exc:
        raise JobDefinitionError(f"job file {file_name}: build(env) failed: {type(exc).__name__}: {exc}") from exc
    env.graph.validate()
    return LoadedJob(graph=env.graph, module=module)


def load_job_file(path: str | Path, parameters: Mapping[str, str] | None = None, parallelism: int = 1) -> LoadedJob:
    p = Path(path)
    if not p.is_file():
        raise JobDefinitionError(f"job file {p} does not exist")
    return load_job_source(p.read_bytes(), str(p), parameters, parallelism)


__all__ = ["LoadedJob", "load_job_file", "load_job_source"]

"""Loading a job file: import its source as a module of its own and run its ``build(env)``; every
failure is a JobDefinitionError naming the file (Flink's ``PackagedProgram``)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping
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
    on_build: Callable[[], None] | None = None,
) -> LoadedJob:
    """Import a job file's source and run its ``build(env)``; any failure is a JobDefinitionError.
    ``on_build``: called once the import is done, as ``build(env)`` starts."""
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
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # a job's sys.exit() or BaseException must not end the process
        sys.modules.pop(module_name, None)
        raise import_error(file_name, exc) from exc
    return run_build(module, file_name, parameters, parallelism, job_name or Path(file_name).stem, on_build)


def import_error(file_name: str, exc: BaseException) -> JobDefinitionError:
    """The one line for a job module that does not import (``exc``: what its import raised)."""
    if isinstance(exc, SystemExit):
        return JobDefinitionError(f"job file {file_name} does not import: it called sys.exit({exc.code!r})")
    return JobDefinitionError(f"job file {file_name} does not import: {type(exc).__name__}: {exc}")


def run_build(
    module: ModuleType,
    file_name: str,
    parameters: Mapping[str, str] | None,
    parallelism: int,
    job_name: str,
    on_build: Callable[[], None] | None = None,
) -> LoadedJob:
    """Call the imported job module's ``build(env)``; whatever it raises, ``sys.exit()`` and other
    BaseExceptions too (not an interrupt), is a JobDefinitionError naming the file."""
    build = getattr(module, "build", None)
    if not callable(build):
        raise JobDefinitionError(f"job file {file_name} defines no build(env) function")
    env = Environment(job_name, parameters, parallelism)
    if on_build is not None:
        on_build()
    try:
        build(env)
    except JobDefinitionError:
        raise
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except SystemExit as exc:
        raise JobDefinitionError(f"job file {file_name}: build(env) called sys.exit({exc.code!r})") from exc
    except BaseException as exc:
        raise JobDefinitionError(f"job file {file_name}: build(env) failed: {type(exc).__name__}: {exc}") from exc
    env.graph.validate()
    return LoadedJob(graph=env.graph, module=module)


def load_job_file(path: str | Path, parameters: Mapping[str, str] | None = None, parallelism: int = 1) -> LoadedJob:
    p = Path(path)
    if not p.is_file():
        raise JobDefinitionError(f"job file {p} does not exist")
    return load_job_source(p.read_bytes(), str(p), parameters, parallelism)


__all__ = ["LoadedJob", "import_error", "load_job_file", "load_job_source", "run_build"]

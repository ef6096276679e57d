"""A job's code in a process: one job file's source, or a job artifact (``weir.api.artifacts``)
unpacked into a local cache, its requirements installed, its modules imported under a namespace of
their own.

**Cache.** ``<run dir>/python-jobs/<artifact id>/`` holds the unpacked zip, once per artifact (the
id is the zip's SHA-256, checked against the bytes); ``<run dir>/python-jobs/site-<hash>/`` the
requirements, installed once per content hash of ``requirements.txt`` and the shipped wheels, with
``pip install --no-index --find-links wheels/ --target`` (offline: only what the job ships, as Flink's
``-pyreq requirements.txt#cached_dir``). Both are written into a temporary folder and renamed into
place, so processes sharing a run dir (the JobManager and TaskManagers of one host) never see half.

**Isolation.** A TaskManager runs the subtasks of many jobs in one Python process, so two jobs'
``helpers`` modules cannot both be ``sys.modules["helpers"]``. Each artifact's import root becomes the
package ``weir_job_<id prefix>`` (its ``__path__`` is the unpacked ``py/``), and each of the job's
modules is executed with an ``__import__`` of its own that resolves the job's top-level names
(``import helpers``, ``from pkg.sub import f``) inside that package. Pickle names the job's classes
and functions by those package names, so records of one job unpickle to that job's classes on every
TaskManager that runs it. Limits: code that imports through ``importlib.import_module("helpers")``
or reads ``sys.modules["helpers"]`` sees the process's modules, not the job's.

**Third-party requirements** are not namespaced (a C extension or a package that imports itself by
name through importlib would break): their installed folder goes onto ``sys.path``. One process then
holds one version of each distribution: a job whose requirements name another version of a
distribution this process already has (from the Weir installation or another job's requirements)
is refused with one line naming the package and both versions, never run against a mix.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import threading
import uuid
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, assert_never

from weir.api.artifacts import IMPORT_ROOT, ArtifactManifest, artifact_id, read_manifest
from weir.api.loading import LoadedJob, import_error, load_job_source, run_build
from weir.core.config import run_dir
from weir.core.errors import JobDefinitionError

PACKAGE_PREFIX: Final = "weir_job_"
_ID_PREFIX_CHARS: Final = 16
_ENTRY_MODULE: Final = "_weir_entry"


@dataclass(frozen=True)
class SourceCode:
    """A job of one file, its source shipped as it is (``weir run job.py``)."""

    file_name: str
    source: bytes


@dataclass(frozen=True)
class PreparedArtifact:
    """A job artifact unpacked in this host's cache, its requirements installed."""

    artifact_id: str
    manifest: ArtifactManifest
    directory: Path
    site: Path | None  # the installed requirements (None: the job has none)
    distributions: Mapping[str, str]  # what ``site`` holds: normalized distribution name -> version

    @property
    def package(self) -> str:
        return PACKAGE_PREFIX + self.artifact_id[:_ID_PREFIX_CHARS]


JobCode = SourceCode | PreparedArtifact


def read_source_code(path: Path) -> SourceCode:
    """A job file's code; one line naming the file when it cannot be read."""
    try:
        return SourceCode(str(path), path.read_bytes())
    except OSError as exc:
        message = "does not exist" if not path.exists() else f"cannot be read: {exc.strerror}"
        raise JobDefinitionError(f"job file {path} {message}") from exc


def default_cache() -> Path:
    return run_dir() / "python-jobs"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _move_into_place(temporary: Path, final: Path) -> None:
    try:
        temporary.rename(final)
    except OSError:  # another process put it there first: its copy holds the same bytes
        shutil.rmtree(temporary, ignore_errors=True)
        if not final.exists():
            raise


def prepare_artifact(
    data: bytes, *, expected_id: str | None = None, cache: Path | None = None, timeout_s: float = 300.0
) -> PreparedArtifact:
    """Unpack the artifact and install its requirements, each once per content hash; a bad
    artifact or a requirement that cannot be installed is a one-line JobDefinitionError."""
    actual = artifact_id(data)
    if expected_id is not None and actual != expected_id:
        raise JobDefinitionError(f"job artifact {expected_id} read back as {actual}: it is damaged")
    manifest = read_manifest(data, f"job artifact {actual[:12]}")
    root = cache if cache is not None else default_cache()
    root.mkdir(parents=True, exist_ok=True)
    directory = root / actual
    if not directory.exists():
        temporary = root / f".{actual}.{uuid.uuid4().hex}"
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(temporary)  # names checked by read_manifest
        (temporary / IMPORT_ROOT).mkdir(exist_ok=True)
        _move_into_place(temporary, directory)
    site = _install(manifest, directory, root, timeout_s) if manifest.requirements or manifest.install else None
    return PreparedArtifact(actual, manifest, directory, site, _distributions(site) if site is not None else {})


def _install(manifest: ArtifactManifest, directory: Path, root: Path, timeout_s: float) -> Path:
    digest = hashlib.sha256()
    for name in sorted({*manifest.wheels, *((manifest.requirements,) if manifest.requirements else ())}):
        digest.update(name.encode() + b"\0" + hashlib.sha256((directory / name).read_bytes()).digest())
    digest.update(repr(manifest.install).encode())
    site = root / f"site-{digest.hexdigest()[:32]}"
    if site.exists():
        return site
    temporary = root / f".{site.name}.{uuid.uuid4().hex}"
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        str(directory / "wheels"),
        "--target",
        str(temporary),
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--quiet",
        *(["-r", str(directory / manifest.requirements)] if manifest.requirements else []),
        *(str(directory / w) for w in manifest.install),
    ]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        raise JobDefinitionError(
            f"job {manifest.entry_name}: installing its requirements took over {timeout_s:g} s"
        ) from exc
    if completed.returncode != 0:
        shutil.rmtree(temporary, ignore_errors=True)
        errors = [line.strip() for line in completed.stderr.splitlines() if line.startswith("ERROR:")]
        reason = errors[0] if errors else (completed.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise JobDefinitionError(
            f"job {manifest.entry_name}: its requirements cannot be installed from the wheels it ships: {reason}"
        )
    _move_into_place(temporary, site)
    return site


def _distributions(site: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for info in sorted(site.glob("*.dist-info")):
        metadata = importlib.metadata.PathDistribution(info).metadata
        found[_normalize(metadata["Name"])] = metadata["Version"]
    return found


# The process's distributions -------------------------------------------------------------------------

_lock = threading.Lock()
_site_distributions: dict[str, tuple[str, str]] = {}  # name -> (version, the artifact that brought it)


def _environment_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_distributions(prepared: PreparedArtifact) -> None:
    """Refuse a job whose requirements name another version of a distribution this process holds."""
    with _lock:
        _check_locked(prepared)


def _check_locked(prepared: PreparedArtifact) -> None:
    for name, version in sorted(prepared.distributions.items()):
        held = _site_distributions.get(name)
        if held is not None and held[0] != version:
            raise JobDefinitionError(
                f"job {prepared.manifest.entry_name} needs {name} {version}, but another job running here "
                f"uses {name} {held[0]}: one process holds one version of a package"
            )
        if held is None:
            installed = _environment_version(name)
            if installed is not None and installed != version:
                raise JobDefinitionError(
                    f"job {prepared.manifest.entry_name} needs {name} {version}, but Weir's own environment "
                    f"has {name} {installed}: one process holds one version of a package"
                )


def _activate(prepared: PreparedArtifact) -> None:
    """Put the artifact's requirements on ``sys.path`` and its import root under its package."""
    with _lock:
        _check_locked(prepared)
        if prepared.site is not None:
            for name, version in prepared.distributions.items():
                _site_distributions.setdefault(name, (version, prepared.artifact_id))
            if str(prepared.site) not in sys.path:
                sys.path.append(str(prepared.site))
        if prepared.package not in sys.modules:
            _JobNamespace.register(prepared)


# Per-job module namespaces ------------------------------------------------------------------------


class _JobNamespace:
    """The package of one artifact's modules and the ``__import__`` its modules run with."""

    by_package: dict[str, _JobNamespace] = {}

    def __init__(self, prepared: PreparedArtifact) -> None:
        self.package = prepared.package
        self.root = prepared.directory / IMPORT_ROOT
        self.top_names = frozenset(
            p.stem if p.suffix == ".py" else p.name
            for p in self.root.iterdir()
            if (p.is_dir() and p.name.isidentifier()) or (p.suffix == ".py" and p.stem.isidentifier())
        )
        self.builtins: dict[str, Any] = dict(vars(builtins))
        self.builtins["__import__"] = self.import_

    @classmethod
    def register(cls, prepared: PreparedArtifact) -> None:
        namespace = cls(prepared)
        spec = importlib.machinery.ModuleSpec(prepared.package, None, is_package=True)
        spec.submodule_search_locations = [str(namespace.root)]
        package = importlib.util.module_from_spec(spec)
        package.__path__ = [str(namespace.root)]
        cls.by_package[prepared.package] = namespace
        sys.modules[prepared.package] = package
        if not any(isinstance(f, _JobFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _JobFinder())

    def import_(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,  # noqa: A002 - __import__'s signature
        locals: Mapping[str, Any] | None = None,  # noqa: A002
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> ModuleType:
        top = name.partition(".")[0]
        if level == 0 and top in self.top_names:
            module = __import__(f"{self.package}.{name}", globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[f"{self.package}.{top}"]
        return __import__(name, globals, locals, fromlist, level)


class _JobLoader(importlib.abc.Loader):
    """Runs a job module as its own loader would, with its namespace's ``__import__``."""

    def __init__(self, loader: Any, namespace: _JobNamespace) -> None:
        self._loader = loader
        self._namespace = namespace

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = self._namespace.builtins
        self._loader.exec_module(module)


class _JobFinder(importlib.abc.MetaPathFinder):
    """Finds ``weir_job_<id>.x.y`` in the artifact's import root; its loader gives the module the
    job's ``__import__``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        namespace = _JobNamespace.by_package.get(fullname.partition(".")[0])
        if namespace is None or "." not in fullname:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _JobLoader(spec.loader, namespace)
        return spec


# Loading ------------------------------------------------------------------------------------------


def load_job(
    code: JobCode,
    parameters: Mapping[str, str] | None = None,
    parallelism: int = 1,
    job_name: str | None = None,
    on_build: Callable[[], None] | None = None,
) -> LoadedJob:
    """Import the job's code in this process and run its ``build(env)`` (``weir.api.loading``);
    ``on_build``: called once its import is done."""
    match code:
        case SourceCode(file_name=file_name, source=source):
            return load_job_source(source, file_name, parameters, parallelism, job_name, on_build)
        case PreparedArtifact():
            return _load_artifact(code, parameters, parallelism, job_name, on_build)
        case unreachable:
            assert_never(unreachable)


def _load_artifact(
    prepared: PreparedArtifact,
    parameters: Mapping[str, str] | None,
    parallelism: int,
    job_name: str | None,
    on_build: Callable[[], None] | None,
) -> LoadedJob:
    _activate(prepared)
    manifest = prepared.manifest
    name = manifest.entry_name
    if manifest.entry_module is not None:
        default_name = manifest.entry_module.rpartition(".")[2]
        try:
            importlib.invalidate_caches()
            module = importlib.import_module(f"{prepared.package}.{manifest.entry_module}")
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            raise import_error(name, exc) from exc
    else:
        assert manifest.entry_file is not None  # read_manifest: one of the two
        path = prepared.directory / manifest.entry_file
        default_name = path.stem
        module_name = f"{prepared.package}.{_ENTRY_MODULE}_{path.stem}"
        module = ModuleType(module_name)
        module.__file__ = str(path)
        module.__package__ = prepared.package
        module.__dict__["__builtins__"] = _JobNamespace.by_package[prepared.package].builtins
        try:
            code = compile(path.read_bytes(), name, "exec")
        except SyntaxError as exc:
            raise JobDefinitionError(f"job file {name} does not compile: {exc.msg} (line {exc.lineno})") from exc
        sys.modules[module_name] = module
        try:
            exec(code, module.__dict__)
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            sys.modules.pop(module_name, None)
            raise import_error(name, exc) from exc
    return run_build(module, name, parameters, parallelism, job_name or default_name, on_build)


def forget_job_modules(code: JobCode) -> None:
    """Forget the modules of the job imported in this process, so that its next load imports them
    afresh, module globals included, as a new process would (``weir test`` between attempts). A job
    of one file is executed afresh at every load already; its other imports are not the job's."""
    match code:
        case SourceCode():
            return
        case PreparedArtifact(package=package):
            with _lock:
                for name in [m for m in sys.modules if m.startswith(package + ".")]:
                    del sys.modules[name]
                    parent, _, child = name.rpartition(".")
                    if parent in sys.modules and getattr(sys.modules[parent], child, None) is not None:
                        delattr(sys.modules[parent], child)
        case unreachable:
            assert_never(unreachable)


def cache_key(code: JobCode) -> bytes:
    """What identifies the code (for a process's cache of loaded jobs)."""
    match code:
        case SourceCode(source=source):
            return source
        case PreparedArtifact(artifact_id=identity):
            return identity.encode()
        case unreachable:
            assert_never(unreachable)


__all__ = [
    "JobCode",
    "PreparedArtifact",
    "SourceCode",
    "cache_key",
    "check_distributions",
    "default_cache",
    "forget_job_modules",
    "load_job",
    "prepare_artifact",
    "read_source_code",
]

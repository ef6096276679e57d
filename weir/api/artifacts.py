"""A job of many files as one artifact: the zip ``weir run --py-files/--py-requirements/--py-module``
builds, the JobManager stores beside the job record and every TaskManager fetches by its hash.

Flink ships a Python job's files the same way (PyFlink's ``-pyfs`` files go onto the Python worker's
path, ``-pyreq`` requirements are installed from the ``#cached_dir`` of wheels shipped with them);
Weir packs them into one content-addressed zip so that a JobManager that takes over, and a
TaskManager that joins later, run exactly the bytes the client sent.

Format 1 (``docs/formats.md``), a zip whose entries are sorted, dated 1980-01-01 and deflated, so
that the same files give the same bytes and the same id (the SHA-256 of the zip, hex)::

    weir-artifact.json     {"format": 1,
                            "entry": {"file": "job/<name>.py"} | {"module": "package.module"},
                            "requirements": "requirements.txt" | null,
                            "wheels": ["wheels/<name>.whl", ...],      # shipped wheels, sorted
                            "install": ["wheels/<name>.whl", ...]}     # of them, those --py-files named
    job/<name>.py          the job file (entry "file")
    py/...                 the import root: each --py-files directory's contents, each .py file,
                           each .zip's contents
    requirements.txt       --py-requirements
    wheels/*.whl           --py-files wheels and the wheels of ``--py-requirements FILE#DIR``

The manifest is read before anything of the zip is used; an unknown format, an entry outside these
folders or an absolute or ``..`` path is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from weir.core.errors import JobDefinitionError

ARTIFACT_FORMAT: Final = 1
MANIFEST: Final = "weir-artifact.json"
ENTRY_FOLDER: Final = "job"
IMPORT_ROOT: Final = "py"
WHEELS_FOLDER: Final = "wheels"
REQUIREMENTS_FILE: Final = "requirements.txt"
_ZIP_DATE: Final = (1980, 1, 1, 0, 0, 0)
_SKIPPED_PARTS: Final = frozenset({"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
_SKIPPED_SUFFIXES: Final = (".pyc", ".pyo")


@dataclass(frozen=True)
class ArtifactManifest:
    """What the artifact's ``weir-artifact.json`` says: its entry (a file or a module), its
    requirements file and its wheels (paths inside the zip)."""

    entry_file: str | None
    entry_module: str | None
    requirements: str | None
    wheels: tuple[str, ...]
    install: tuple[str, ...]

    @property
    def entry_name(self) -> str:
        """How messages name the job: its file's name, or ``-m package.module``."""
        if self.entry_file is not None:
            return PurePosixPath(self.entry_file).name
        return f"-m {self.entry_module}"

    def to_json(self) -> bytes:
        entry = {"file": self.entry_file} if self.entry_file is not None else {"module": self.entry_module}
        document = {
            "format": ARTIFACT_FORMAT,
            "entry": entry,
            "requirements": self.requirements,
            "wheels": list(self.wheels),
            "install": list(self.install),
        }
        return json.dumps(document, indent=1, sort_keys=True).encode()


@dataclass(frozen=True)
class JobArtifact:
    data: bytes
    manifest: ArtifactManifest

    @property
    def artifact_id(self) -> str:
        return artifact_id(self.data)


def artifact_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _refuse(message: str) -> JobDefinitionError:
    return JobDefinitionError(message)


def _files_of(directory: Path) -> Iterator[tuple[Path, PurePosixPath]]:
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.is_file() and not (_SKIPPED_PARTS & set(relative.parts)) and path.suffix not in _SKIPPED_SUFFIXES:
            yield path, PurePosixPath(*relative.parts)


def build_artifact(
    *,
    job_file: Path | None,
    py_module: str | None,
    py_files: Sequence[Path] = (),
    requirements: str | None = None,
    max_bytes: int,
) -> JobArtifact:
    """Pack the job's files; every problem (a missing file, two files for one path, an artifact over
    ``max_bytes``) is a one-line JobDefinitionError."""
    if (job_file is None) == (py_module is None):
        raise _refuse("give either a job file or --py-module package.module, not both nor neither")
    entries: dict[str, bytes] = {}

    def add(name: str, data: bytes, origin: Path) -> None:
        if name in entries and entries[name] != data:
            raise _refuse(f"--py-files: two different files for {name} (one is {origin})")
        entries[name] = data

    def read(path: Path, what: str) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise _refuse(f"{what} {path} cannot be read: {exc.strerror or exc}") from exc

    wheels: list[str] = []
    install: list[str] = []
    for given in py_files:
        if given.is_dir():
            for path, relative in _files_of(given):
                add(f"{IMPORT_ROOT}/{relative}", read(path, "--py-files"), path)
        elif given.suffix == ".whl":
            name = f"{WHEELS_FOLDER}/{given.name}"
            add(name, read(given, "--py-files wheel"), given)
            wheels.append(name)
            install.append(name)
        elif given.suffix == ".py":
            add(f"{IMPORT_ROOT}/{given.name}", read(given, "--py-files"), given)
        elif given.suffix in (".zip", ".egg"):
            try:
                with zipfile.ZipFile(io.BytesIO(read(given, "--py-files zip"))) as archive:
                    for info in archive.infolist():
                        if not info.is_dir():
                            add(f"{IMPORT_ROOT}/{_safe(info.filename, str(given))}", archive.read(info), given)
            except zipfile.BadZipFile as exc:
                raise _refuse(f"--py-files {given} is not a zip: {exc}") from exc
        elif not given.exists():
            raise _refuse(f"--py-files {given} does not exist")
        else:
            raise _refuse(f"--py-files {given}: expected a directory, a .py file, a .zip or a .whl")
    requirements_entry: str | None = None
    if requirements is not None:
        file_part, _, wheel_dir = requirements.partition("#")  # Flink's -pyreq requirements.txt#cached_dir
        entries[REQUIREMENTS_FILE] = read(Path(file_part), "--py-requirements")
        requirements_entry = REQUIREMENTS_FILE
        if wheel_dir:
            directory = Path(wheel_dir)
            if not directory.is_dir():
                raise _refuse(f"--py-requirements {requirements}: {wheel_dir} is not a directory of wheels")
            for path in sorted(directory.glob("*.whl")):
                add(f"{WHEELS_FOLDER}/{path.name}", read(path, "--py-requirements wheel"), path)
                wheels.append(f"{WHEELS_FOLDER}/{path.name}")
    entry_file: str | None = None
    if job_file is not None:
        entry_file = f"{ENTRY_FOLDER}/{job_file.name}"
        if not job_file.is_file():
            raise _refuse(f"job file {job_file} does not exist")
        entries[entry_file] = read(job_file, "job file")
    manifest = ArtifactManifest(
        entry_file=entry_file,
        entry_module=py_module,
        requirements=requirements_entry,
        wheels=tuple(sorted(set(wheels))),
        install=tuple(sorted(set(install))),
    )
    entries[MANIFEST] = manifest.to_json()
    data = _zip(entries)
    check_size(len(data), max_bytes, manifest.entry_name)
    return JobArtifact(data, manifest)


def check_size(size: int, max_bytes: int, name: str) -> None:
    if size > max_bytes:
        raise _refuse(
            f"job {name}: its artifact is {size:,} bytes, over the limit of {max_bytes:,} "
            "(WEIR_JOB_ARTIFACT_MAX_BYTES): ship fewer or smaller files"
        )


def _zip(entries: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, entries[name])
    return buffer.getvalue()


def _safe(name: str, where: str) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise _refuse(f"{where}: entry {name!r} is not a relative path inside it")
    return str(path)


def read_manifest(data: bytes, where: str) -> ArtifactManifest:
    """The manifest of an artifact's bytes, checked: every entry lies in the artifact's folders."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            document = json.loads(archive.read(MANIFEST))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise _refuse(f"{where} is not a Weir job artifact: {type(exc).__name__}: {exc}") from exc
    for name in names:
        _safe(name, where)
        if (
            name != MANIFEST
            and name != REQUIREMENTS_FILE
            and name.split("/")[0]
            not in (
                ENTRY_FOLDER,
                IMPORT_ROOT,
                WHEELS_FOLDER,
            )
        ):
            raise _refuse(f"{where}: entry {name!r} lies outside the artifact's folders")
    return manifest_from_document(document, where)


def manifest_from_document(document: object, where: str) -> ArtifactManifest:
    """The manifest of a ``weir-artifact.json`` document (read from the zip or its unpacked copy)."""
    if not isinstance(document, dict) or document.get("format") != ARTIFACT_FORMAT:
        found = document.get("format") if isinstance(document, dict) else None
        raise _refuse(f"{where}: artifact format {found!r} is not {ARTIFACT_FORMAT}")
    entry = document.get("entry") or {}
    manifest = ArtifactManifest(
        entry_file=entry.get("file"),
        entry_module=entry.get("module"),
        requirements=document.get("requirements"),
        wheels=tuple(document.get("wheels", ())),
        install=tuple(document.get("install", ())),
    )
    if (manifest.entry_file is None) == (manifest.entry_module is None):
        raise _refuse(f"{where}: its entry names neither one file nor one module")
    return manifest


__all__ = [
    "ARTIFACT_FORMAT",
    "ArtifactManifest",
    "JobArtifact",
    "artifact_id",
    "build_artifact",
    "check_size",
    "manifest_from_document",
    "read_manifest",
]

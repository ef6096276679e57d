"""Job submission over REST in Flink's shapes, with Weir's job artifact (``weir.api.artifacts``,
docs/formats.md) where Flink takes a jar: ``POST /jars/upload`` (multipart, field ``jarfile``), ``GET
/jars``, ``POST /jars/{jarid}/run``, ``DELETE /jars/{jarid}`` (Flink's ``JarUploadHandler``,
``JarListHandler``, ``JarRunHandler``, ``JarDeleteHandler``).

An upload is checked as the JobManager checks an artifact ``weir run`` sends (its size, its manifest,
every entry inside the artifact's folders) and kept in memory: Flink keeps its uploads in a local
directory that a restarted JobManager does not read again either. A run submits through the same
``JobManager.submit`` as the gRPC ``SubmitJob`` (the job loaded in a child process with a deadline,
its sinks and sources checked), so a job that does not load is refused in one line, as with ``weir run``.

The multipart body is read with the standard library's MIME parser: one form field of one request
does not warrant a multipart dependency in the JobManager.
"""

from __future__ import annotations

import email.parser
import email.policy
import shlex
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import PurePosixPath
from typing import Any, Final

from pydantic import ConfigDict, Field

from weir.api.artifacts import ArtifactManifest, check_size, read_manifest
from weir.api.job_code import check_distributions, prepare_artifact
from weir.api.load_check import check_job_loads
from weir.core.config import PythonJobSettings
from weir.core.errors import JobDefinitionError
from weir.graph import Partitioning
from weir.jobmanager.errors import UnknownJarError
from weir.jobmanager.messages import InputEdgeView, JobPlanView, OperatorView, VertexView
from weir.jobmanager.rest.views import Model, _api
from weir.jobmanager.submission import SubmitRequest

JARS_KEPT: Final = 20
"""Uploads kept, the newest; an older one goes (its jobs keep running: each stored its own copy)."""
JAR_FIELD: Final = "jarfile"


# Requests ------------------------------------------------------------------------------------------


class JarRunRequest(Model):
    """``POST /jars/{jarid}/run``: Flink's ``JarRunRequestBody``. ``entryClass`` may name the artifact's
    entry (its job file's name or its module), nothing else: an artifact has one entry. ``programArgs``
    and ``programArgsList`` are the job's ``-D key=value`` parameters, ``flinkConfiguration`` more of
    them; ``savepointPath`` and ``allowNonRestoredState`` as ``weir run --from-savepoint``. Flink's
    ``jobId`` (Weir draws its own ids), ``restoreMode`` and ``claimMode`` (Weir never claims another
    job's files) are taken and ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, validate_by_name=True, validate_by_alias=True)

    entry_class: str | None = Field(default=None, alias="entryClass")
    program_args: str | None = Field(default=None, alias="programArgs")
    program_args_list: list[str] | None = Field(default=None, alias="programArgsList")
    parallelism: int | None = Field(default=None, ge=1)
    job_id: str | None = Field(default=None, alias="jobId")
    allow_non_restored_state: bool | None = Field(default=None, alias="allowNonRestoredState")
    savepoint_path: str | None = Field(default=None, alias="savepointPath")
    restore_mode: str | None = Field(default=None, alias="restoreMode")
    claim_mode: str | None = Field(default=None, alias="claimMode")
    flink_configuration: dict[str, str] | None = Field(default=None, alias="flinkConfiguration")


# Answers -------------------------------------------------------------------------------------------


class JarUploaded(Model):
    """Flink's ``JarUploadResponseBody``: ``filename`` ends in the jar id (Flink's clients take the last
    path segment)."""

    filename: str
    status: str = "success"


class JarEntry(Model):
    name: str
    description: str | None = None


class JarFile(Model):
    id: str
    name: str
    uploaded: int  # epoch ms
    entry: list[JarEntry]


class JarList(Model):
    """Flink's ``JarListInfo``."""

    address: str
    files: list[JarFile]


class JarRunResponse(Model):
    """Flink's ``JarRunResponseBody``: the job's id in Flink's 32-hex form."""

    job_id: str = _api("jobid")


# The uploads ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UploadedJar:
    jar_id: str
    name: str
    uploaded_at: float  # seconds since the epoch
    data: bytes
    manifest: ArtifactManifest


def entry_name(manifest: ArtifactManifest) -> str:
    """The artifact's entry as ``entryClass`` names it: the job file's name, or the module."""
    if manifest.entry_file is not None:
        return PurePosixPath(manifest.entry_file).name
    return manifest.entry_module or ""


class Jars:
    """The uploaded artifacts, newest last, at most ``JARS_KEPT`` (Flink's upload directory)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._jars: OrderedDict[str, UploadedJar] = OrderedDict()
        self._clock = clock

    def upload(self, file_name: str, data: bytes) -> UploadedJar:
        """Check ``data`` as an artifact (JobDefinitionError, one line, when it is none) and keep it."""
        name = PurePosixPath(file_name.replace("\\", "/")).name or "job.zip"
        check_size(len(data), PythonJobSettings.from_env().job_artifact_max_bytes, name)
        manifest = read_manifest(data, f"the upload {name}")
        jar = UploadedJar(f"{uuid.uuid4()}_{name}", name, self._clock(), data, manifest)
        with self._lock:
            self._jars[jar.jar_id] = jar
            while len(self._jars) > JARS_KEPT:
                self._jars.popitem(last=False)
        return jar

    def get(self, jar_id: str) -> UploadedJar:
        with self._lock:
            jar = self._jars.get(jar_id)
        if jar is None:
            raise UnknownJarError(jar_id)
        return jar

    def delete(self, jar_id: str) -> None:
        with self._lock:
            if self._jars.pop(jar_id, None) is None:
                raise UnknownJarError(jar_id)

    def listing(self, address: str) -> JarList:
        with self._lock:
            jars = list(reversed(self._jars.values()))
        return JarList(
            address=address,
            files=[
                JarFile(
                    id=j.jar_id,
                    name=j.name,
                    uploaded=int(j.uploaded_at * 1000),
                    entry=[JarEntry(name=entry_name(j.manifest))],
                )
                for j in jars
            ],
        )


def submit_request(jar: UploadedJar, request: JarRunRequest) -> SubmitRequest:
    """What ``weir run`` would send for the artifact with these parameters (JobDefinitionError for a
    request Weir cannot carry out)."""
    entry = entry_name(jar.manifest)
    if request.entry_class is not None and request.entry_class not in (entry, jar.manifest.entry_name):
        raise JobDefinitionError(
            f"entryClass {request.entry_class!r}: the artifact {jar.name} runs its one entry, {entry!r}"
        )
    parameters = {
        **program_parameters(request.program_args, request.program_args_list),
        **(request.flink_configuration or {}),
    }
    return SubmitRequest(
        job_name="",
        job_file_name=jar.manifest.entry_name,
        job_source=b"",
        job_artifact=jar.data,
        parameters=parameters,
        parallelism=request.parallelism or 0,
        from_checkpoint=request.savepoint_path or "",
        allow_non_restored_state=bool(request.allow_non_restored_state),
    )


def plan_of(jar: UploadedJar, request: JarRunRequest) -> JobPlanView:
    """The plan of the uploaded artifact with these parameters, without running it (``weir info``):
    the artifact is prepared as for ``run`` and its ``build(env)`` called in a child process with a
    deadline; its plan gets a new job id, as Flink's does (it names no job)."""
    submit = submit_request(jar, request)
    settings = PythonJobSettings.from_env()
    code = prepare_artifact(jar.data, timeout_s=settings.job_load_timeout)
    check_distributions(code)
    parallelism = submit.parallelism or 1
    checked = check_job_loads(code, submit.parameters, parallelism, None, settings.job_load_timeout)
    return plan_view(checked.plan, uuid.uuid4().hex)


def plan_view(document: Mapping[str, Any], job_id: str) -> JobPlanView:
    """A ``weir.plan.plan_document`` as the read API's plan (``GET /jobs/{id}/plan``'s source): the
    operators' names from its nodes, a vertex's input edges from its head operator's predecessors."""
    nodes = {node["id"]: node for node in document["nodes"]}
    vertices = []
    for vertex in document["vertices"]:
        head = nodes[vertex["operators"][0]]
        side_outputs = {p["id"]: p.get("side_output") for p in head["predecessors"]}
        vertices.append(
            VertexView(
                uid=vertex["id"],
                parallelism=vertex["parallelism"],
                operators=tuple(OperatorView(uid, nodes[uid]["contents"]) for uid in vertex["operators"]),
                inputs=tuple(
                    InputEdgeView(
                        producer_vertex=edge["vertex"],
                        partitioning=Partitioning[edge["ship_strategy"]],
                        side_output=side_outputs.get(edge["operator"]),
                    )
                    for edge in vertex["inputs"]
                ),
            )
        )
    return JobPlanView(
        job_id=job_id,
        job_name=document["name"],
        vertices=tuple(vertices),
        max_parallelism=document["max_parallelism"],
    )


def program_parameters(program_args: str | None, program_args_list: Sequence[str] | None) -> dict[str, str]:
    """``-D key=value`` (or ``-Dkey=value``) arguments as parameters; a later key wins. Weir's jobs read
    nothing else from their command line (``env.params``), so any other argument is refused."""
    if program_args_list is not None:
        arguments = list(program_args_list)
    else:
        try:
            arguments = shlex.split(program_args or "")
        except ValueError as exc:
            raise JobDefinitionError(f"programArgs {program_args!r}: {exc}") from exc
    parameters: dict[str, str] = {}
    iterator = iter(arguments)
    for argument in iterator:
        if argument == "-D":
            item = next(iterator, None)
            if item is None:
                raise JobDefinitionError("programArgs: -D at the end, without key=value")
        elif argument.startswith("-D"):
            item = argument[2:]
        else:
            raise JobDefinitionError(
                f"programArgs: {argument!r}: a Weir job takes -D key=value parameters (env.params), nothing else"
            )
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise JobDefinitionError(f"programArgs: -D {item!r}: expected key=value")
        parameters[key.strip()] = value
    return parameters


def multipart_file(body: bytes, content_type: str, field: str) -> tuple[str, bytes]:
    """The file name and bytes of the form field ``field`` of a ``multipart/form-data`` body;
    JobDefinitionError when the body is no such form or has no such field."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise JobDefinitionError(
            f"an upload is a multipart/form-data request with the artifact in the field {field!r}, "
            f"not {content_type or 'a body without a content type'}"
        )
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if isinstance(message, EmailMessage) and message.is_multipart():
        for part in message.iter_parts():
            if part.get_param("name", header="content-disposition") == field:
                payload = part.get_payload(decode=True)
                if isinstance(payload, bytes):
                    return part.get_filename() or "job.zip", payload
    raise JobDefinitionError(f"the upload has no form field {field!r} holding the artifact (Flink's jarfile)")

"""The ``weir`` command line: run and inspect jobs, and run the local cluster.

Exit codes: 0 success; 1 failure (a job that FAILED or was CANCELED, not enough slots, an internal
error; for ``weir verify``, a discrepancy; for ``weir savepoint``, damaged state); 2 a user error
(bad arguments, a job file that does not load, an unknown job, a path with no savepoint); 3 no
cluster (no JobManager answers, or no local cluster runs; for ``weir verify``, Kafka or PostgreSQL
does not answer; for ``weir savepoint info`` and ``dump``, the checkpoint storage). Every error is
one line on stderr, ``weir: error: <reason>``; set ``WEIR_DEBUG=1`` to also get the traceback.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

import weir
from weir.core.config import Diagnostics, Endpoints, check_environment, client_environment, jobmanager_addresses
from weir.core.errors import (
    ClusterUnavailableError,
    CommandLineError,
    ConfigurationError,
    ServiceUnavailableError,
    WeirError,
)
from weir.core.extras import MissingServerExtraError, require_server, server_module_of
from weir.core.states import JobStatus, TaskState
from weir.tools import supervisor
from weir.tools.sql_job import job_file_name, read_script, sql_job_source

if TYPE_CHECKING:
    from weir.api.artifacts import JobArtifact
    from weir.api.job_code import JobCode
    from weir.core.failures import Failure
    from weir.tools.client import CheckpointInfo, ClusterStatus, JobDetails, JobManagerClient, JobSummary
    from weir.tools.savepoint_inspect import OperatorInfo, SavepointInfo
    from weir.tools.verify import VerifyReport

# Each command imports what it uses when it runs (the gRPC client, the job API, the Kafka, PostgreSQL
# and S3 clients, SQL, Arrow): `weir --help` and `weir test` pay only for their own; a test keeps it so
# (tests/unit/weir/tools/test_cli_imports.py).

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_NO_CLUSTER: Final = 3
EXIT_INTERRUPTED: Final = 130

FOLLOW_POLL_S: Final = 0.5
# While following a job, how long the JobManager may stay silent (e.g. restarting) before giving up.
FOLLOW_UNAVAILABLE_GRACE_S: Final = 30.0

app = typer.Typer(
    name="weir",
    help="Weir: a distributed stream processor. Run jobs on a JobManager and inspect them.",
    add_completion=True,
    pretty_exceptions_enable=False,
)
cluster_app = typer.Typer(
    help="The local cluster: a JobManager and 3 TaskManagers as supervised local processes.",
    pretty_exceptions_enable=False,
)
app.add_typer(cluster_app, name="cluster")

SAVEPOINT_TRIGGER: Final = "trigger"


SAVEPOINT_DISPOSE: Final = "dispose"
DISPOSE_OPTIONS: Final = ("--dispose", "-d")


class SavepointGroup(TyperGroup):
    """Flink's ``savepoint`` forms: ``weir savepoint JOB_ID [DIR]`` is ``weir savepoint trigger JOB_ID
    [DIR]`` (a first argument that names none of the group's commands, nor asks for its help, goes to
    ``trigger``); ``weir savepoint --dispose PATH`` (``-d``) is ``weir savepoint dispose PATH``."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if args and args[0] in DISPOSE_OPTIONS:
            args = [SAVEPOINT_DISPOSE, *args[1:]]
        elif args and args[0].startswith("--dispose="):
            args = [SAVEPOINT_DISPOSE, args[0].partition("=")[2], *args[1:]]
        elif args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [SAVEPOINT_TRIGGER, *args]
        return super().parse_args(ctx, args)


savepoint_app = typer.Typer(
    cls=SavepointGroup,
    help="Savepoints: trigger one on a running job (weir savepoint JOB_ID [DIR]), dispose of one (weir "
    "savepoint --dispose PATH), or read one, or a retained checkpoint, offline from the storage (info, dump).",
    pretty_exceptions_enable=False,
)
app.add_typer(savepoint_app, name="savepoint")
upgrade_app = typer.Typer(
    help="Upgrades: whether a new version of a job can take a savepoint's state (upgrade check), offline.",
    pretty_exceptions_enable=False,
)
app.add_typer(upgrade_app, name="upgrade")
cdc_app = typer.Typer(
    help="PostgreSQL CDC replication slots in the database of WEIR_POSTGRES_DSN: list them (slots), drop a "
    "leftover one (drop-slot). A slot no job reads keeps the server's WAL until it is dropped.",
    pretty_exceptions_enable=False,
)
app.add_typer(cdc_app, name="cdc")

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document to stdout.")]

_JOBMANAGER: Final = "weir.jobmanager"
_PROFILE: Final = "weir.profile"


_client_choices: ContextVar[dict[str, str] | None] = ContextVar("weir_client_choices", default=None)


def _remember(key: str) -> Any:
    """An option's callback that keeps its value for this run of the command (``run_cli``), wherever
    it was given: ``weir -m H:P list`` and ``weir list -m H:P`` reach the same client."""

    def remember(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
        choices = _client_choices.get()
        if value is not None and choices is not None:
            choices[key] = value
        return value

    return remember


JobManagerOption = Annotated[
    str | None,
    typer.Option(
        "--jobmanager",
        "-m",
        metavar="HOST:PORT",
        callback=_remember(_JOBMANAGER),
        expose_value=False,
        help="The JobManager to talk to, or a leader and its standbys comma-separated (wins over "
        "WEIR_JOBMANAGER_ADDRESSES, WEIR_JOBMANAGER_ADDRESS and the profile). As Flink's -m.",
    ),
]
ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        metavar="NAME",
        callback=_remember(_PROFILE),
        expose_value=False,
        help="The profile of the config file (WEIR_CONFIG, ~/.config/weir/config.toml) to use; wins over WEIR_PROFILE.",
    ),
]


def _stdout() -> Console:
    # Piped output keeps whole ids and paths: no terminal width to fit.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def _table(*headers: str, title: str | None = None) -> Table:
    table = Table(title=title)
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _jobmanager_flag(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise CommandLineError(f"-m {value!r}: expected host:port with a port in 1..65535")
    return value


def _client() -> JobManagerClient:
    """A client of the JobManager: the address from ``-m``, else the environment, else the profile,
    else the default; the token and TLS from the environment, else the profile (``client_environment``)."""
    from weir.core.transport_security import TransportSecurity
    from weir.tools.client import JobManagerClient

    meta = _client_choices.get() or {}
    environment = client_environment(meta.get(_PROFILE))
    flag = meta.get(_JOBMANAGER)
    # Several addresses (a leader and its standbys): the client calls whichever leads.
    if flag is not None:
        address = ",".join(_jobmanager_flag(a.strip()) for a in flag.split(","))
    else:
        address = ",".join(jobmanager_addresses(environment))
    return JobManagerClient(address, security=TransportSecurity.from_env(environment))


def _print_json(document: object) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def _error_line(message: str) -> None:
    sys.stderr.write(f"weir: error: {' '.join(message.splitlines())}\n")


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def _mode(unaligned: bool) -> str:
    """A checkpoint, or a task's part in it: unaligned when it persisted in-flight records."""
    return "unaligned" if unaligned else "aligned"


def parse_parameters(items: Sequence[str]) -> dict[str, str]:
    """``-D key=value`` items as a dict; a later key wins."""
    parameters: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandLineError(f"-D {item!r}: expected key=value")
        parameters[key.strip()] = value
    return parameters


# Root --------------------------------------------------------------------------------------------


def _print_version(value: bool) -> None:
    if value:
        _stdout().print(f"weir {weir.__version__}", soft_wrap=True)
        raise typer.Exit(EXIT_OK)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print Weir's version and exit."),
    ] = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    if ctx.invoked_subcommand is None:
        _stdout().print(ctx.get_help())


@cluster_app.callback(invoke_without_command=True)
def _cluster_root(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        _stdout().print(ctx.get_help())


@savepoint_app.callback(invoke_without_command=True)
def _savepoint_root(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        _stdout().print(ctx.get_help())


# Jobs --------------------------------------------------------------------------------------------


ParallelismOption = Annotated[
    int | None, typer.Option("--parallelism", "-p", min=1, help="Default parallelism of the job's operators.")
]
DetachOption = Annotated[
    bool, typer.Option("--detach", "--detached", "-d", help="Print the job id and return at once.")
]
DefineOption = Annotated[
    list[str] | None, typer.Option("-D", metavar="KEY=VALUE", help="A job parameter (repeatable).")
]
PyFilesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--py-files",
        "-pyfs",
        metavar="DIR|FILE.py|ZIP|WHEEL",
        help="Ship these with the job (repeatable, or comma-separated): a directory or .zip is an import "
        "root, a .py file a module, a .whl is installed. As Flink's -pyfs.",
    ),
]
PyRequirementsOption = Annotated[
    str | None,
    typer.Option(
        "--py-requirements",
        "-pyreq",
        metavar="requirements.txt[#WHEEL_DIR]",
        help="Install these requirements for the job, offline, from the wheels shipped with it (--py-files "
        "wheels, and those of WHEEL_DIR). As Flink's -pyreq.",
    ),
]
PyModuleOption = Annotated[
    str | None,
    typer.Option(
        "--py-module",
        "-pym",
        metavar="package.module",
        help="The job's module (defining build(env)) among --py-files, in place of JOB.py. As Flink's -pym.",
    ),
]
"""The options every command that submits or plans a job shares (one definition each)."""


def _job_code(
    job_file: Path | None, py_files: list[str] | None, py_requirements: str | None, py_module: str | None
) -> tuple[JobCode, JobArtifact | None]:
    """The job's code as `weir run` ships it: the job file's source, or (with --py-files,
    --py-requirements or --py-module) the artifact, unpacked and its requirements installed here,
    with the artifact itself."""
    from weir.api.artifacts import build_artifact
    from weir.api.job_code import prepare_artifact, read_source_code
    from weir.core.config import PythonJobSettings
    from weir.core.errors import JobDefinitionError

    settings = PythonJobSettings.from_env()
    shipped = [Path(p) for given in py_files or [] for p in given.split(",") if p]
    if shipped or py_requirements or py_module:
        artifact = build_artifact(
            job_file=job_file,
            py_module=py_module,
            py_files=shipped,
            requirements=py_requirements,
            max_bytes=settings.job_artifact_max_bytes,
        )
        return prepare_artifact(artifact.data, timeout_s=settings.job_load_timeout), artifact
    if job_file is None:
        raise JobDefinitionError("give a job file, or --py-module package.module with --py-files")
    return read_source_code(job_file), None


@app.command()
def run(
    job_file: Annotated[
        Path | None, typer.Argument(metavar="[JOB.py]", help="A job file defining build(env) (or --py-module).")
    ] = None,
    py_files: PyFilesOption = None,
    py_requirements: PyRequirementsOption = None,
    py_module: PyModuleOption = None,
    parallelism: ParallelismOption = None,
    detach: DetachOption = False,
    define: DefineOption = None,
    from_checkpoint: Annotated[
        str | None,
        typer.Option(
            "--from-savepoint",
            "--from-checkpoint",
            "--fromSavepoint",
            "-s",
            metavar="PATH",
            help="Start from this savepoint or retained checkpoint of another job (the path `weir savepoint`, "
            "`weir stop` or `weir checkpoints JOB_ID` prints), at any parallelism up to the max parallelism.",
        ),
    ] = None,
    allow_non_restored_state: Annotated[
        bool,
        typer.Option(
            "--allow-non-restored-state",
            "--allowNonRestoredState",
            "-n",
            help="With --from-savepoint: drop the state of operators the job no longer has (matched by uid).",
        ),
    ] = False,
    skip_upgrade_check: Annotated[
        bool,
        typer.Option(
            "--skip-upgrade-check",
            help="With --from-savepoint: submit without running `weir upgrade check` first (for emergencies: "
            "what it would refuse fails at restore, or loses state silently).",
        ),
    ] = False,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """Submit a job; without --detach, follow it until it FINISHES (exit 0), FAILS or is CANCELED (exit 1).
    With --from-savepoint, `weir upgrade check` runs first and a job it fails is not submitted (exit 2)."""
    from weir.api.load_check import check_job_loads
    from weir.core.config import PythonJobSettings

    parameters = parse_parameters(define or [])
    settings = PythonJobSettings.from_env()
    code, artifact = _job_code(job_file, py_files, py_requirements, py_module)
    # Fail fast, before the cluster is asked: loaded in a child process with a deadline.
    checked = check_job_loads(code, parameters, parallelism or 1, None, settings.job_load_timeout)
    if from_checkpoint is not None and not skip_upgrade_check:
        from weir.tools.upgrade_check import Severity, check_before_run

        full_report = " ".join(
            [
                "weir upgrade check",
                str(job_file) if job_file is not None else "JOB_V2.py",
                "--savepoint",
                from_checkpoint,
                *(["-n"] if allow_non_restored_state else []),
            ]
        )
        with _storage_answers():
            upgrade = check_before_run(
                code,
                from_checkpoint,
                full_report=full_report,
                parameters=parameters,
                parallelism=parallelism or 1,
                allow_non_restored_state=allow_non_restored_state,
            )
        for finding in upgrade.findings:
            if finding.severity is Severity.WARNING:
                sys.stderr.write(
                    f"weir: warning: upgrade check: {finding.kind.value} {finding.uid}: {finding.reason}\n"
                )
    with _client() as client:
        job_id = client.submit_job(
            job_file,
            parameters,
            parallelism,
            job_name=checked.job_name,
            from_checkpoint=from_checkpoint,
            allow_non_restored_state=allow_non_restored_state,
            artifact=artifact,
        )
        if detach:
            if json_output:
                _print_json({"job_id": job_id})
            else:
                _stdout().print(job_id, soft_wrap=True)
            return
        try:
            status = _follow(client, job_id)
        except KeyboardInterrupt:
            sys.stderr.write(f"weir: stopped following job {job_id}; it keeps running (`weir cancel {job_id}`)\n")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if json_output:
        _print_json(asdict(status))
    summary = status.summary
    if summary.status is JobStatus.FINISHED:
        if not json_output:
            _stdout().print(
                f"job {job_id} FINISHED: records in {status.records_in}, out {status.records_out}", soft_wrap=True
            )
        return
    _error_line(f"job {job_id} {summary.status}: {describe_failure(status.failure)}")
    raise typer.Exit(EXIT_FAILURE)


@app.command()
def package(
    job_file: Annotated[
        Path | None, typer.Argument(metavar="[JOB.py]", help="A job file defining build(env) (or --py-module).")
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the artifact (a .zip).")] = Path(
        "job.zip"
    ),
    py_files: PyFilesOption = None,
    py_requirements: PyRequirementsOption = None,
    py_module: PyModuleOption = None,
    json_output: JsonOption = False,
) -> None:
    """Write the job's artifact (the zip `weir run` sends, docs/formats.md) to a file, without a cluster:
    for `POST /jars/upload` (Flink's jar upload, docs/rest-api.md) or to keep the exact bytes a job ran."""
    from weir.api.artifacts import build_artifact
    from weir.core.config import PythonJobSettings
    from weir.core.errors import JobDefinitionError

    shipped = [Path(p) for given in py_files or [] for p in given.split(",") if p]
    artifact = build_artifact(
        job_file=job_file,
        py_module=py_module,
        py_files=shipped,
        requirements=py_requirements,
        max_bytes=PythonJobSettings.from_env().job_artifact_max_bytes,
    )
    try:
        output.write_bytes(artifact.data)
    except OSError as exc:
        raise JobDefinitionError(f"cannot write the artifact to {output}: {exc.strerror or exc}") from exc
    if json_output:
        _print_json({"path": str(output), "artifact_id": artifact.artifact_id, "entry": artifact.manifest.entry_name})
    else:
        _stdout().print(
            f"{output}: job {artifact.manifest.entry_name}, artifact {artifact.artifact_id}", soft_wrap=True
        )


@app.command()
def info(
    job_file: Annotated[
        Path | None, typer.Argument(metavar="[JOB.py]", help="A job file defining build(env) (or --py-module).")
    ] = None,
    py_files: PyFilesOption = None,
    py_requirements: PyRequirementsOption = None,
    py_module: PyModuleOption = None,
    parallelism: ParallelismOption = None,
    define: DefineOption = None,
    json_output: JsonOption = False,
) -> None:
    """Print the job's plan without running it: its operators with their parallelism and how records
    go between them, and the operator chains (vertices). As Flink's `flink info`; no cluster is asked."""
    from weir.api.load_check import check_job_loads
    from weir.core.config import PythonJobSettings

    parameters = parse_parameters(define or [])
    code, _ = _job_code(job_file, py_files, py_requirements, py_module)
    timeout_s = PythonJobSettings.from_env().job_load_timeout
    checked = check_job_loads(code, parameters, parallelism or 1, None, timeout_s)
    plan = checked.plan
    if json_output:
        _print_json(plan)
        return
    console = _stdout()
    console.print(
        escape(f"job {plan['name']}: default parallelism {plan['default_parallelism']}, max {plan['max_parallelism']}"),
        soft_wrap=True,
    )
    operators = _table("operator", "type", "name", "parallelism", "inputs", title="operators")
    for node in plan["nodes"]:
        inputs = ", ".join(f"{p['id']} ({p['ship_strategy']})" for p in node["predecessors"]) or "-"
        operators.add_row(
            escape(node["id"]), node["type"], escape(node["contents"]), str(node["parallelism"]), escape(inputs)
        )
    console.print(operators)
    vertices = _table("vertex", "operators (chained)", "parallelism", "inputs", title="vertices")
    for vertex in plan["vertices"]:
        inputs = ", ".join(f"{i['operator']} ({i['ship_strategy']})" for i in vertex["inputs"]) or "-"
        vertices.add_row(
            escape(vertex["id"]), escape(" -> ".join(vertex["operators"])), str(vertex["parallelism"]), escape(inputs)
        )
    console.print(vertices)


def _progress_line(status: JobDetails) -> str:
    running = sum(1 for t in status.tasks if t.state is TaskState.RUNNING)
    return (
        f"{status.summary.status}: {running}/{len(status.tasks)} tasks running, "
        f"in {status.records_in}, out {status.records_out}, "
        f"checkpoint {status.last_completed_checkpoint or '-'}, restarts {status.summary.restarts}"
    )


def _follow(client: JobManagerClient, job_id: str) -> JobDetails:
    """Poll the job's status until it is terminal. On a terminal, stderr shows a status line and one
    line per status change; otherwise stderr stays quiet, so that it holds only a final error line."""
    console = _stderr()
    interactive = console.is_terminal
    if interactive:
        console.print(f"submitted job {job_id}", soft_wrap=True)
    last_answer = time.monotonic()
    last_status = ""
    with console.status(f"job {job_id} submitted") as spinner:
        while True:
            try:
                status = client.job_status(job_id)
            except ClusterUnavailableError:
                if time.monotonic() - last_answer > FOLLOW_UNAVAILABLE_GRACE_S:
                    raise
                spinner.update(f"job {job_id}: the JobManager does not answer; retrying")
            else:
                last_answer = time.monotonic()
                if status.summary.status != last_status and interactive:
                    last_status = status.summary.status
                    console.print(f"job {job_id}: {last_status}", soft_wrap=True)
                if status.summary.is_terminal:
                    return status
                spinner.update(escape(_progress_line(status)))
            time.sleep(FOLLOW_POLL_S)  # the poll interval of the status line


RUNNING_STATUSES: Final = frozenset({JobStatus.RUNNING, JobStatus.RESTARTING, JobStatus.CANCELLING})
SCHEDULED_STATUSES: Final = frozenset({JobStatus.CREATED})


@app.command("list")
def list_jobs(
    running: Annotated[
        bool, typer.Option("--running", "-r", help="Only running jobs (RUNNING, RESTARTING, CANCELLING).")
    ] = False,
    scheduled: Annotated[
        bool, typer.Option("--scheduled", "-s", help="Only scheduled jobs (CREATED, not yet deployed).")
    ] = False,
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="Every job, ended ones too (the default).")] = False,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """List the JobManager's jobs: every one, or as Flink's `list`, -r running, -s scheduled (both: -r -s)."""
    with _client() as client:
        jobs = client.list_jobs()
    if (running or scheduled) and not all_jobs:
        wanted = (RUNNING_STATUSES if running else frozenset()) | (SCHEDULED_STATUSES if scheduled else frozenset())
        jobs = tuple(j for j in jobs if j.status in wanted)
    if json_output:
        _print_json({"jobs": [asdict(j) for j in jobs]})
        return
    if not jobs:
        _stdout().print("no jobs")
        return
    table = _table("job", "name", "status", "submitted", "parallelism", "restarts")
    for job in sorted(jobs, key=lambda j: j.submitted_at):
        table.add_row(
            job.job_id,
            escape(job.job_name),
            job.status,
            _when(job.submitted_at),
            str(job.parallelism),
            str(job.restarts),
        )
    _stdout().print(table)


def describe_failure(failure: Failure | None) -> str:
    """One line: the failure, whose fault it is, and whether the job restarts on it."""
    if failure is None:
        return "no failure reason given"
    retry = "retriable" if failure.retriable else "not retriable"
    return f"{failure} ({failure.fault.value} fault, {retry})"


def _summary_lines(summary: JobSummary, status: JobDetails) -> Iterator[str]:
    yield f"job {summary.job_id} ({escape(summary.job_name)}): [bold]{summary.status}[/bold]"
    yield (
        f"submitted {_when(summary.submitted_at)}, parallelism {summary.parallelism}, "
        f"restarts {summary.restarts}, last completed checkpoint {status.last_completed_checkpoint or '-'}, "
        f"last restore {_when(status.last_restore_at)}"
    )
    if status.failure is not None:
        yield f"failure: {escape(describe_failure(status.failure))}"
    if status.end is not None:
        yield f"end: {escape(status.end.describe())}"


@app.command()
def status(
    job_id: Annotated[str, typer.Argument(help="The job's id (`weir list`).")],
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """A job's status: summary, tasks with their TaskManager and record counts, last checkpoint."""
    with _client() as client:
        job = client.job_status(job_id)
    if json_output:
        _print_json(asdict(job))
        return
    console = _stdout()
    for line in _summary_lines(job.summary, job):
        console.print(line, soft_wrap=True)
    table = _table("task", "operators", "state", "taskmanager", "records in", "records out")
    failures = any(t.failure is not None for t in job.tasks)
    if failures:
        table.add_column("failure")
    for task in sorted(job.tasks, key=lambda t: (t.vertex_uid, t.subtask)):
        row = [
            escape(task.name),
            escape(task.operator_names),
            task.state.value if task.state is not None else "-",
            task.taskmanager_id or "-",
            str(task.records_in),
            str(task.records_out),
        ]
        table.add_row(*row, *([escape(str(task.failure) if task.failure else "")] if failures else []))
    console.print(table)


@app.command()
def cancel(
    job_id: Annotated[str, typer.Argument(help="The job's id (`weir list`).")],
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """Cancel a job."""
    with _client() as client:
        new_status = client.cancel_job(job_id)
    _stdout().print(f"job {job_id}: {new_status or 'cancel requested'}", soft_wrap=True)


SavepointTimeout = Annotated[
    float, typer.Option("--timeout", min=1.0, help="Seconds to wait for the savepoint to complete.")
]


def _print_savepoint(info: CheckpointInfo, job_id: str, json_output: bool, **extra: object) -> None:
    if json_output:
        _print_json({"job_id": job_id, "savepoint_id": info.checkpoint_id, "path": info.external_path, **extra})
    else:
        _stdout().print(f"savepoint {info.checkpoint_id} of job {job_id}: {info.external_path}", soft_wrap=True)


@app.command()
def stop(
    job_id: Annotated[str, typer.Argument(help="The job's id (`weir list`).")],
    savepoint_path: Annotated[
        str | None,
        typer.Option(
            "--savepoint-path",
            "--savepointPath",
            "-p",
            metavar="URI",
            help="Directory the savepoint goes to (a new folder in it); default -D savepoints.dir, else the "
            "job's folder in the checkpoint storage.",
        ),
    ] = None,
    drain: Annotated[
        bool, typer.Option("--drain", "-d", help="Advance event time to the end first, so every window fires.")
    ] = False,
    timeout_s: SavepointTimeout = 600.0,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """Take a savepoint and stop the job once it completed (FINISHED); print the savepoint's path."""
    with _client() as client:
        savepoint_id = client.trigger_savepoint(job_id, savepoint_path, stop=True, drain=drain)
        info = client.wait_for_savepoint(job_id, savepoint_id, timeout_s)
        deadline = time.monotonic() + timeout_s
        status = client.job_status(job_id)
        while not status.summary.status.terminal and time.monotonic() < deadline:
            time.sleep(0.2)
            status = client.job_status(job_id)
    _print_savepoint(info, job_id, json_output, status=status.summary.status.value)
    if status.summary.status is not JobStatus.FINISHED:
        _error_line(f"job {job_id} is {status.summary.status} after its savepoint: {describe_failure(status.failure)}")
        raise typer.Exit(EXIT_FAILURE)


@app.command()
def checkpoint(
    job_id: Annotated[str, typer.Argument(help="The running job's id (`weir list`).")],
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            "-full",
            help="A full checkpoint (as Flink's -full): every task uploads all its RocksDB files anew, so "
            "it references no file of an earlier checkpoint; later checkpoints reuse its files.",
        ),
    ] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1.0, help="Seconds to wait for the checkpoint to complete.")
    ] = 600.0,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """Trigger a checkpoint of a running job now, outside its interval, and print it once it completed
    (its path while it is retained). As Flink's `flink checkpoint JOB_ID`."""
    with _client() as client:
        checkpoint_id = client.trigger_checkpoint(job_id, full=full)
        info = client.wait_for_checkpoint(job_id, checkpoint_id, timeout_s)
    if json_output:
        _print_json(
            {
                "job_id": job_id,
                "checkpoint_id": info.checkpoint_id,
                "size_bytes": info.size_bytes,
                "path": info.external_path,
                "full": full,
            }
        )
        return
    where = f": {info.external_path}" if info.external_path else ""
    what = "full checkpoint" if full else "checkpoint"
    _stdout().print(
        f"{what} {info.checkpoint_id} of job {job_id} completed ({_size(info.size_bytes)}){where}", soft_wrap=True
    )


@app.command()
def rescale(
    job_id: Annotated[str, typer.Argument(help="The running job's id (`weir list`).")],
    parallelism: Annotated[
        int, typer.Option("--parallelism", "-p", min=1, help="The job's new parallelism (up to its max parallelism).")
    ],
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until every task runs at the new parallelism (or the rescale failed).")
    ] = False,
    timeout_s: Annotated[float, typer.Option("--timeout", min=1.0, help="Seconds to wait with --wait.")] = 600.0,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """Rescale a running job: it takes an aligned checkpoint, its sinks commit it, and it is redeployed at
    the new parallelism from it, under the same job id, exactly once. As Flink's `PATCH
    /jobs/:jobid/rescaling`. A request the job cannot take is refused before the job is touched."""
    with _client() as client:
        trigger_id = client.rescale(job_id, parallelism)
        info = client.wait_for_rescale(job_id, trigger_id, timeout_s) if wait else None
    if json_output:
        document: dict[str, object] = {"job_id": job_id, "trigger_id": trigger_id, "parallelism": parallelism}
        if info is not None:
            document |= {
                "phase": info.phase,
                "checkpoint_id": info.checkpoint_id,
                "from_parallelism": info.from_parallelism,
            }
        _print_json(document)
        return
    if info is None:
        _stdout().print(
            f"rescaling job {job_id} to parallelism {parallelism} (request {trigger_id}; `weir status {job_id}`)",
            soft_wrap=True,
        )
        return
    _stdout().print(
        f"job {job_id} rescaled from parallelism {info.from_parallelism} to {info.to_parallelism} "
        f"from checkpoint {info.checkpoint_id}",
        soft_wrap=True,
    )


@app.command()
def checkpoints(
    job_id: Annotated[str, typer.Argument(help="The job's id (`weir list`).")],
    checkpoint: Annotated[
        int | None, typer.Option("--checkpoint", "-c", help="Show per-task stats of this checkpoint.")
    ] = None,
    detail: Annotated[
        int | None,
        typer.Option(
            "--detail",
            metavar="CID",
            help="Show this checkpoint's timeline: per subtask, its first barrier, each input channel's "
            "barrier, the ends of alignment, of the sync and async parts and the ack, in ms after the trigger.",
        ),
    ] = None,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """A job's checkpoints, aligned or unaligned, with the in-flight bytes they persisted; per-task
    alignment, start delay and in-flight bytes of the latest (or --checkpoint) one; with --detail,
    one checkpoint's timeline."""
    if detail is not None:
        _checkpoint_detail(job_id, detail, json_output)
        return
    with _client() as client:
        infos = client.list_checkpoints(job_id)
    if json_output:
        documents = [
            {**asdict(c), "kind": c.kind.name, "unaligned": c.unaligned, "inflight_bytes": c.inflight_bytes}
            for c in infos
        ]
        _print_json({"job_id": job_id, "checkpoints": documents})
        return
    console = _stdout()
    if not infos:
        console.print(f"job {job_id} has no checkpoints yet", soft_wrap=True)
        return
    table = _table("id", "kind", "status", "triggered", "duration", "size", "mode", "in flight", "failure")
    for info in sorted(infos, key=lambda c: c.checkpoint_id):
        acked = bool(info.tasks)  # no task acknowledged yet: nothing tells aligned from unaligned
        table.add_row(
            str(info.checkpoint_id),
            info.kind.name + (" (full)" if info.full else ""),
            info.status,
            _when(info.trigger_time),
            _seconds(info.duration_s) if info.status != "IN_PROGRESS" else "-",
            _size(info.size_bytes),
            _mode(info.unaligned) if acked else "-",
            _size(info.inflight_bytes) if info.unaligned else "-",
            escape(info.failure),
        )
    console.print(table)
    retained = [c for c in sorted(infos, key=lambda c: c.checkpoint_id) if c.external_path]
    if retained:
        console.print("retained (weir run JOB.py --from-checkpoint PATH):", soft_wrap=True)
        for info in retained:
            console.print(f"  {info.checkpoint_id}  {escape(info.external_path)}", soft_wrap=True)
    picked = _pick_checkpoint(infos, checkpoint)
    if picked is None:
        if checkpoint is not None:
            raise CommandLineError(f"job {job_id} has no checkpoint {checkpoint}")
        return
    title = f"checkpoint {picked.checkpoint_id}: tasks" + (
        f" (unaligned, {_size(picked.inflight_bytes)} in flight)" if picked.unaligned else ""
    )
    tasks = _table("task", "mode", "alignment", "start delay", "state size", "in flight", title=title)
    for task in sorted(picked.tasks, key=lambda t: (t.vertex_uid, t.subtask)):
        tasks.add_row(
            escape(task.name),
            _mode(task.unaligned),
            _seconds(task.alignment_duration_s),
            _seconds(task.start_delay_s),
            _size(task.state_size_bytes),
            _size(task.inflight_bytes) if task.unaligned else "-",
        )
    console.print(tasks)


def _checkpoint_detail(job_id: str, checkpoint_id: int, json_output: bool) -> None:
    with _client() as client:
        found = client.checkpoint_detail(job_id, checkpoint_id)
    if json_output:
        _print_json({"job_id": job_id, **asdict(found)})
        return
    console = _stdout()
    from weir.tools.checkpoint_timeline import render_checkpoint_detail

    for line in render_checkpoint_detail(found, job_id):
        console.print(escape(line), soft_wrap=True)


@app.command()
def verify(
    job_file: Annotated[Path, typer.Argument(metavar="JOB.py", help="The job file the sinks were written by.")],
    define: DefineOption = None,
    job_id: Annotated[
        str | None,
        typer.Option("--job-id", help="Whose commit proofs and transactions to check (default: the latest)."),
    ] = None,
    earlier_job_id: Annotated[
        list[str] | None,
        typer.Option(
            "--earlier-job-id",
            help="A job whose output the sinks hold too: --job-id restored from it (repeatable; needs --job-id).",
        ),
    ] = None,
    commit_topic: Annotated[
        str | None,
        typer.Option(
            "--commit-topic",
            help="One Kafka commit proof topic to read instead of each sink's own marker topics.",
        ),
    ] = None,
    commit_table: Annotated[
        str | None,
        typer.Option("--commit-table", help="The PostgreSQL sinks' commit proof table [default: weir_sink_commits]."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Check a job's sinks against a reference run over its input: duplicates, missing or mismatched
    results, each sink's last committed checkpoint, transactions left open. Exit 1 on any discrepancy."""
    from weir.tools.verify import verify_job

    parameters = parse_parameters(define or [])
    try:
        report = verify_job(
            job_file,
            parameters,
            job_id=job_id,
            earlier_job_ids=tuple(earlier_job_id or ()),
            commit_topic=commit_topic,
            commit_table=commit_table,
        )
    except ServiceUnavailableError as exc:
        _error_line(str(exc))
        raise typer.Exit(EXIT_NO_CLUSTER) from None
    if json_output:
        _print_json(report.to_json())
    else:
        _print_verify_report(report)
    if not report.ok:
        _error_line(f"verify found discrepancies: {'; '.join(report.discrepancies())}")
        raise typer.Exit(EXIT_FAILURE)


def _functions_module(path: Path) -> tuple[str, dict[str, Any]]:
    """``--functions FILE.py``: its module name and the functions defined in it (imported here to plan)."""
    import importlib.util

    from weir.core.errors import JobDefinitionError
    from weir.sql.functions import defined_in

    name = path.stem
    if path.suffix != ".py" or not name.isidentifier() or not path.is_file():
        raise JobDefinitionError(f"--functions {path}: not a Python file with a module name (FILE.py)")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise JobDefinitionError(f"--functions {path}: {type(exc).__name__}: {exc}") from None
    return name, defined_in(module)


@app.command("sql")
def sql_command(
    script_file: Annotated[
        Path | None, typer.Argument(metavar="[FILE.sql]", help="A Flink SQL script (or -e).")
    ] = None,
    execute: Annotated[
        str | None, typer.Option("--execute", "-e", metavar="SQL", help="The script's text itself.")
    ] = None,
    explain_only: Annotated[
        bool, typer.Option("--explain", help="Print every INSERT's operators with their uids; submit nothing.")
    ] = False,
    functions_file: Annotated[
        Path | None,
        typer.Option(
            "--functions",
            metavar="FILE.py",
            help="Python functions the script calls by name: each public function and aggregate class "
            "(create/add/merge/result) defined in the file, which is shipped with the job.",
        ),
    ] = None,
    parallelism: ParallelismOption = None,
    detach: DetachOption = False,
    define: DefineOption = None,
    from_checkpoint: Annotated[
        str | None,
        typer.Option(
            "--from-savepoint",
            "--from-checkpoint",
            "-s",
            metavar="PATH",
            help="Start from this savepoint or retained checkpoint (the same SQL has the same operator uids).",
        ),
    ] = None,
    allow_non_restored_state: Annotated[
        bool,
        typer.Option(
            "--allow-non-restored-state", "-n", help="With --from-savepoint: drop the state of removed operators."
        ),
    ] = False,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """Submit a Flink SQL script as a job (docs/sql.md): CREATE TABLE, INSERT INTO ... SELECT, STATEMENT
    SET, SET. EXPLAIN statements (or --explain) print each INSERT's operators and uids. A construct
    Weir does not run is refused before anything is submitted: one line with its line:column (exit 2)."""
    import tempfile

    from weir.core.errors import JobDefinitionError
    from weir.sql import explain, plan_script

    if (script_file is None) == (execute is None):
        raise JobDefinitionError('give a SQL file or -e "SQL", one of them')
    if script_file is not None:
        script = read_script(script_file)
    else:
        assert execute is not None
        script = execute
    module, functions = _functions_module(functions_file) if functions_file is not None else (None, None)
    planned = plan_script(script, functions)
    if planned.explains or explain_only:
        _stdout().print(escape(explain(script, functions)), soft_wrap=True)
    if explain_only or not planned.inserts:
        return
    stem = script_file.stem if script_file is not None else "sql"
    name = planned.settings.get("pipeline.name", stem)
    if "parallelism.default" in planned.settings and parallelism is None:
        parallelism = int(planned.settings["parallelism.default"])
    with tempfile.TemporaryDirectory(prefix="weir-sql-") as folder:
        job_file = Path(folder) / job_file_name(name)
        job_file.write_text(sql_job_source(script, module), encoding="utf-8")
        run(
            job_file=job_file,
            py_files=None if functions_file is None else [str(functions_file)],
            py_requirements=None,
            py_module=None,
            parallelism=parallelism,
            detach=detach,
            define=define,
            from_checkpoint=from_checkpoint,
            allow_non_restored_state=allow_non_restored_state,
            skip_upgrade_check=False,
            json_output=json_output,
            jobmanager=jobmanager,
            profile=profile,
        )


@app.command("test")
def test_command(
    job_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="[JOB.py|SCRIPT.sql]",
            help="The job file to run (or --py-module), or a Flink SQL script (run as the job weir sql submits "
            "for it).",
        ),
    ] = None,
    py_files: PyFilesOption = None,
    py_requirements: PyRequirementsOption = None,
    py_module: PyModuleOption = None,
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            metavar="UID=FILE.jsonl",
            help="A source's input (repeatable): for a Kafka source one record value per line, through the source's "
            "deserializer; for a PostgreSQL CDC source one change event per line, in its JSON form. For a SQL "
            "script, the source of a table it reads, by the table's name or its uid (sql-source-TABLE).",
        ),
    ] = None,
    functions_file: Annotated[
        Path | None,
        typer.Option(
            "--functions",
            metavar="FILE.py",
            help="For a SQL script: the Python functions it calls by name, as weir sql --functions takes them.",
        ),
    ] = None,
    define: DefineOption = None,
    failures: Annotated[
        bool,
        typer.Option(
            "--failures", help="Also run once per checkpoint and crash point with a failure there; compare outputs."
        ),
    ] = False,
    rescale: Annotated[
        int | None,
        typer.Option(
            "--rescale",
            metavar="N",
            min=1,
            help="With --failures: also restore each failure point at parallelism N (key groups and operator "
            "state redistributed as a cluster does) and compare.",
        ),
    ] = None,
    checkpoint_every: Annotated[
        int,
        typer.Option(
            "--checkpoint-every",
            metavar="N",
            help="Source records between checkpoints (a CDC source's snapshot chunk or transaction counts as one).",
        ),
    ] = 1000,
    ms_per_record: Annotated[
        int, typer.Option("--ms-per-record", metavar="MS", help="How far virtual processing time moves per record.")
    ] = 1,
    out: Annotated[
        Path | None, typer.Option("--out", metavar="DIR", help="Write each sink's committed records as DIR/UID.jsonl.")
    ] = None,
) -> None:
    """Run a job, or a SQL script as its job, in this process over records from files, with no services;
    with --failures check that failures and recovery from checkpoints leave its committed output
    unchanged. Exit 1 on a divergence. A job of many files takes the options of weir run; its modules
    are imported afresh at every failure, as a restarted process would."""
    import tempfile

    given: list[tuple[str, Path]] = []
    for item in source or []:
        uid, sep, file = item.partition("=")
        if not sep or not uid.strip() or not file:
            raise CommandLineError(f"--source {item!r}: expected UID=FILE.jsonl")
        given.append((uid.strip(), Path(file)))
    run = functools.partial(
        _job_test,
        parameters=parse_parameters(define or []),
        failures=failures,
        rescale=rescale,
        checkpoint_every=checkpoint_every,
        ms_per_record=ms_per_record,
        out=out,
    )
    if job_file is None or job_file.suffix != ".sql":
        if functions_file is not None:
            raise CommandLineError("--functions FILE.py is for a SQL script: a job file imports its functions")
        run(_job_code(job_file, py_files, py_requirements, py_module)[0], given)
        return
    if py_files or py_requirements or py_module:
        raise CommandLineError(
            "--py-files, --py-requirements and --py-module are for a job file: a SQL script takes --functions FILE.py"
        )
    from weir.tools.sql_job import script_sources  # plans the script: the SQL parser, for a script only

    script = read_script(job_file)
    module, functions = _functions_module(functions_file) if functions_file is not None else (None, None)
    sources = script_sources(script, str(job_file), functions)
    inputs = [(sources.uid_of(name), path) for name, path in given]
    with tempfile.TemporaryDirectory(prefix="weir-test-sql-") as folder:
        sql_job = Path(folder) / job_file_name(job_file.stem)
        sql_job.write_text(sql_job_source(script, module), encoding="utf-8")
        # shipped as weir sql ships it: the functions file beside the job in its artifact
        shipped = None if functions_file is None else [str(functions_file)]
        run(_job_code(sql_job, shipped, None, None)[0], inputs, as_written=True)


def _job_test(
    job: JobCode,
    given: list[tuple[str, Path]],
    *,
    parameters: dict[str, str],
    failures: bool,
    rescale: int | None,
    checkpoint_every: int,
    ms_per_record: int,
    out: Path | None,
    as_written: bool = False,
) -> None:
    """``weir test`` over a job's code and its sources' input files (source uid -> file); ``as_written``:
    ``--out`` writes each record as its sink writes it (a SQL script's rows by column)."""
    from weir.tools.jobtest import SourceData, SourceLines, check_job, write_outputs

    inputs: dict[str, SourceData] = {}
    for uid, file in given:
        if uid in inputs:
            raise CommandLineError(f"--source {uid}={file}: source {uid!r} is given twice")
        inputs[uid] = SourceLines.read(file)
    report = check_job(
        job,
        inputs,
        parameters,
        failures=failures,
        checkpoint_every=checkpoint_every,
        ms_per_record=ms_per_record,
        rescale=rescale,
    )
    console = _stdout()
    for uid in report.reference.sinks:
        records = len(report.reference.by_operator.get(uid, []))
        console.print(f"sink {escape(uid)}: {records} records committed", soft_wrap=True)
    if out is not None:
        for path in write_outputs(report.reference, out, as_written=as_written):
            console.print(f"wrote {escape(str(path))}", soft_wrap=True)
    if failures:
        console.print(
            f"{report.runs} runs ({len(report.failure_points)} failure points, "
            f"{report.reference.checkpoints} checkpoints) in {_seconds(report.seconds)}",
            soft_wrap=True,
        )
    for divergence in report.divergences:
        _error_line(divergence.describe())
    if not report.ok:
        raise typer.Exit(EXIT_FAILURE)
    if failures:
        console.print("test: every failure run committed what the failure-free run did", soft_wrap=True)


def _print_verify_report(report: VerifyReport) -> None:
    console = _stdout()
    job = f"job id {report.job_id} ({report.job_id_from})" if report.job_id else "no job id (no commit proof)"
    console.print(f"verify {escape(report.job_name)} ({escape(report.job_file)}): {job}", soft_wrap=True)
    for source in report.sources:
        where = f"topic {source.topic}" if source.topic else source.kind
        console.print(
            f"source {escape(source.uid)}: {where}, {source.records} records, {source.dead_lettered} dead-lettered",
            soft_wrap=True,
        )
    counts = ("expected", "found", "duplicates", "missing", "unexpected", "mismatched")
    table = _table("sink", "target", *counts, "committed", "open transactions")
    for sink in report.sinks:
        proof = sink.commit_proof
        committed = (
            f"{proof.last_committed_checkpoint} ("
            + ", ".join(f"#{c.subtask}: {c.checkpoint_id}" for c in proof.subtasks)
            + ")"
            if proof.available
            else "no commit proof"
        )
        table.add_row(
            escape(sink.uid),
            escape(f"{sink.kind} {sink.target}"),
            str(sink.expected),
            str(sink.found),
            *(
                f"[red]{n}[/red]" if n else "0"
                for n in (sink.duplicates, sink.missing, sink.unexpected, sink.mismatched)
            ),
            committed,
            f"[red]{len(sink.open_transactions)}[/red]" if sink.open_transactions else "0",
        )
    console.print(table)
    for sink in report.sinks:
        for txn in sink.open_transactions:
            console.print(f"{escape(sink.uid)}: {escape(txn.detail)}", soft_wrap=True)
        for kind, samples in sink.samples.items():
            for sample in samples:
                console.print(f"{escape(sink.uid)}: {kind}: {escape(sample)}", soft_wrap=True)
    for line in report.reconciliation:
        console.print(f"reconciliation: {escape(line)}", soft_wrap=True)
    for skipped in report.skipped_sinks:
        console.print(f"not verified: {escape(skipped)}", soft_wrap=True)
    for warning in report.warnings:
        console.print(f"warning: {escape(warning)}", soft_wrap=True)
    methods = sorted({f"{s.kind}: {s.open_transaction_method}" for s in report.sinks})
    for method in methods:
        console.print(f"open transactions checked by {escape(method)}", soft_wrap=True)
    if report.ok:
        console.print("verify: every sink matches the reference run", soft_wrap=True)


def _pick_checkpoint(infos: Sequence[CheckpointInfo], checkpoint_id: int | None) -> CheckpointInfo | None:
    if checkpoint_id is not None:
        return next((c for c in infos if c.checkpoint_id == checkpoint_id), None)
    completed = [c for c in infos if c.status == "COMPLETED"]
    return max(completed, key=lambda c: c.checkpoint_id) if completed else None


# Savepoints --------------------------------------------------------------------------------------

SavepointPath = Annotated[
    str,
    typer.Argument(
        metavar="PATH",
        help="A savepoint folder or a retained checkpoint's external path (s3://..., file:///..., a directory).",
    ),
]


@savepoint_app.command(SAVEPOINT_TRIGGER)
def savepoint_trigger(
    job_id: Annotated[str, typer.Argument(help="The running job's id (`weir list`).")],
    directory: Annotated[
        str | None,
        typer.Argument(metavar="[DIR]", help="As --path (Flink's targetDirectory argument)."),
    ] = None,
    path: Annotated[
        str | None,
        typer.Option(
            "--path",
            metavar="URI",
            help="Directory the savepoint goes to (a new folder in it); default -D savepoints.dir, else the "
            "job's folder in the checkpoint storage.",
        ),
    ] = None,
    timeout_s: SavepointTimeout = 600.0,
    json_output: JsonOption = False,
    jobmanager: JobManagerOption = None,
    profile: ProfileOption = None,
) -> None:
    """Trigger a savepoint of a running job and print its path once it completed; the job goes on.
    Also `weir savepoint JOB_ID [DIR]`."""
    if directory is not None and path is not None:
        raise CommandLineError("give the savepoint's directory once: as DIR or as --path")
    path = path if path is not None else directory
    with _client() as client:
        savepoint_id = client.trigger_savepoint(job_id, path)
        info = client.wait_for_savepoint(job_id, savepoint_id, timeout_s)
    _print_savepoint(info, job_id, json_output)


@savepoint_app.command(SAVEPOINT_DISPOSE)
def savepoint_dispose(path: SavepointPath, json_output: JsonOption = False) -> None:
    """Delete a savepoint's files from the storage (its _metadata first), as Flink's `savepoint
    --dispose PATH`; refuses a path that is not a savepoint. Also `weir savepoint --dispose PATH`."""
    from weir.jobmanager.savepoint_disposal import dispose_savepoint

    with _storage_answers():
        disposed = dispose_savepoint(path if "://" in path else str(Path(path).absolute()))
    if json_output:
        _print_json(asdict(disposed))
        return
    _stdout().print(
        escape(
            f"disposed savepoint {disposed.savepoint_id} of job {disposed.job_id}: {disposed.files} files, "
            f"{disposed.path}"
        ),
        soft_wrap=True,
    )


@contextmanager
def _storage_answers() -> Iterator[None]:
    """The checkpoint storage not answering is exit 3, as Kafka or PostgreSQL for `weir verify`."""
    try:
        yield
    except ServiceUnavailableError as exc:
        _error_line(str(exc))
        raise typer.Exit(EXIT_NO_CLUSTER) from None


@savepoint_app.command("info")
def savepoint_info(
    path: SavepointPath,
    keyed: Annotated[
        bool,
        typer.Option(
            "--keyed", help="Also download the keyed state files and count each state's entries and key groups."
        ),
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """What a savepoint or retained checkpoint holds: job, checkpoint, subtasks, each operator's state."""
    from weir.tools.savepoint_inspect import savepoint_info as read_info

    with _storage_answers():
        info = read_info(path, keyed=keyed)
    if json_output:
        _print_json(info.to_json())
    else:
        _print_savepoint_info(info)


@savepoint_app.command("dump")
def savepoint_dump(
    path: SavepointPath,
    uid: Annotated[str, typer.Option("--uid", help="The operator whose state to print.")],
    state: Annotated[str | None, typer.Option("--state", help="Only the keyed state of this name.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=0, help="Print at most this many lines.")] = None,
) -> None:
    """An operator's state as JSON lines: keyed entries, else each subtask's decoded operator state."""
    from weir.tools.savepoint_inspect import dump_operator

    out = sys.stdout
    with _storage_answers():
        try:
            for line in dump_operator(path, uid, state=state, limit=limit):
                out.write(json.dumps(line, default=repr) + "\n")
            out.flush()
        except BrokenPipeError:  # `| head`: the reader has enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())


@upgrade_app.command("check")
def upgrade_check(
    job_file: Annotated[Path, typer.Argument(metavar="JOB_V2.py", help="The new version of the job.")],
    savepoint: Annotated[
        str,
        typer.Option("--savepoint", "-s", metavar="PATH", help="The savepoint (or retained checkpoint) to restore."),
    ],
    define: DefineOption = None,
    parallelism: ParallelismOption = None,
    allow_non_restored_state: Annotated[
        bool,
        typer.Option(
            "--allow-non-restored-state",
            "-n",
            help="As weir run: the state of operators the job no longer has may be dropped (a warning, not a failure).",
        ),
    ] = False,
    offline: Annotated[
        bool, typer.Option("--offline", help="Do not ask Kafka whether the job's dead-letter topics exist.")
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """PASS (exit 0) or FAIL (exit 1) with reasons: can JOB_V2.py restore from the savepoint (uids, max
    parallelism, state schemas, every stored value migrated and re-hashed, exactly-once sinks,
    dead-letter topics)? Reads only the job file and the checkpoint storage."""
    from weir.connectors import kafka
    from weir.core.kafka_config import kafka_client_config
    from weir.tools.upgrade_check import upgrade_check as check

    parameters = parse_parameters(define or [])
    topic_exists = None
    if not offline:
        cluster = kafka_client_config(Endpoints.from_env(), parameters)

        def topic_exists(topic: str) -> bool:
            return kafka.topic_partition_count(cluster, topic) is not None

    with _storage_answers():
        report = check(
            job_file,
            savepoint,
            parameters=parameters,
            parallelism=parallelism or 1,
            allow_non_restored_state=allow_non_restored_state,
            topic_exists=topic_exists,
        )
    if json_output:
        _print_json(report.to_json())
    else:
        out = _stdout()
        out.print(report.summary(), soft_wrap=True)
        for finding in report.findings:
            out.print(f"  {finding}", soft_wrap=True, markup=False)
    if not report.passed:
        raise typer.Exit(EXIT_FAILURE)


def _print_savepoint_info(info: SavepointInfo) -> None:
    from weir.core.task_state import StoredOperatorState

    console = _stdout()
    sp = info.savepoint
    c = sp.checkpoint
    relative = "the folder" if sp.keys_relative_to_folder else "the storage root"
    formats = info.formats
    console.print(
        escape(
            f"{c.kind.value}{' (full)' if c.full else ''} {c.checkpoint_id} of job {c.job_id} "
            f"(metadata format {formats['metadata']}, "
            f"task-state format {formats['task_state']})"
        ),
        soft_wrap=True,
    )
    console.print(
        escape(f"path {sp.path}: storage root {sp.root_uri}, metadata {sp.metadata_key}, keys relative to {relative}"),
        soft_wrap=True,
    )
    console.print(
        f"triggered {_when(c.trigger_timestamp)}, completed {_when(c.completion_timestamp)} "
        f"({_seconds(max(c.duration_s, 0.0))}); {len(sp.tasks)} subtasks, {len(c.object_keys)} objects, "
        f"{_size(c.total_size_bytes)}",
        soft_wrap=True,
    )
    for warning in info.warnings:
        console.print(f"warning: {escape(warning)}", soft_wrap=True)
    table = _table("task", "attempt", "key groups", "parallelism", "operators", "operator state", "keyed state")
    for task in sorted(sp.tasks, key=lambda t: (t.document.vertex_uid, t.document.subtask)):
        d = task.document
        stored = "object" if isinstance(d.operator_state, StoredOperatorState) else "inline"
        if d.operator_state.broadcast:
            stored += " + broadcast " + ", ".join(
                ref.sha256[:8] for _, ref in sorted(d.operator_state.broadcast.items())
            )
        op_bytes = sum(len(b) for b in task.operator_states.values())
        keyed = task.keyed
        table.add_row(
            escape(task.name),
            str(d.attempt),
            str(d.key_group_range),
            f"{d.layout.parallelism}/{d.layout.max_parallelism}",
            escape(", ".join(d.layout.operator_uids)),
            f"{stored}, {_size(op_bytes)}" if task.operator_states else "-",
            (
                f"{escape(keyed.taskmanager_id)} db {escape(keyed.db_incarnation)} snapshot {keyed.snapshot_index}: "
                f"{len(keyed.sst_files)} sst + {len(keyed.db_files)} files, {_size(keyed.size_bytes)}"
            )
            if keyed is not None
            else "-",
        )
    console.print(table)
    console.print("operators:", soft_wrap=True)
    for operator in info.operators:
        for line in _operator_lines(operator):
            console.print(escape(line), soft_wrap=True)
    if not info.keyed_scanned and any(o.keyed for o in info.operators):
        console.print("(keyed state names, entry counts and key groups present: --keyed)", soft_wrap=True)


def _operator_lines(operator: OperatorInfo) -> Iterator[str]:
    from weir.tools.savepoint_inspect import key_group_ranges_text

    yield f"  {operator.uid}{' (keyed)' if operator.keyed else ''}"
    for sub in operator.subtasks:
        parts: list[str] = []
        if sub.operator_state is not None:
            parts.append(_operator_state_text(sub.operator_state))
        if sub.keyed_handle is not None and sub.keyed_ranges:
            handle = sub.keyed_handle
            ranges = ", ".join(str(r) for r in sub.keyed_ranges)
            keyed = f"keyed state in key groups {ranges} ({len(handle.objects)} files, {_size(handle.size_bytes)})"
            if sub.states is not None:
                states = "; ".join(
                    f"{s.name}: {s.entries} entries in key groups {key_group_ranges_text(s.key_groups)}"
                    for s in sub.states
                )
                keyed += f": {states}" if states else ": no entries"
            parts.append(keyed)
        yield f"    #{sub.subtask}: {'; '.join(parts) if parts else 'no state'}"


def _offsets_text(offsets: dict[str, int]) -> str:
    return ", ".join(f"{p} -> {o}" for p, o in offsets.items()) or "none"


def _operator_state_text(state: dict[str, Any]) -> str:
    size = _size(state["size_bytes"])
    match state["kind"]:
        case "kafka-source":
            ends = state["end_offsets"]
            bound = f"; end offsets {_offsets_text(ends)}" if ends is not None else "; unbounded"
            return f"kafka source: next offsets {_offsets_text(state['next_offsets'])}{bound} ({size})"
        case "window":
            return f"window: watermark {state['watermark']} ({size})"
        case "generator-source":
            return f"generator source: next k {state['next_k']} ({size})"
        case "transactional-sink":
            pending = ", ".join(
                f"{p['transaction']} (epoch {p['epoch']}, pre-committed at {p['pre_committed_at']})"
                for p in state["pending_transactions"]
            )
            epochs = ", ".join(f"{e['checkpoint_id']}: {e['records']} records" for e in state["epochs"])
            text = (
                f"transactional sink: ledger at checkpoint {state['ledger_checkpoint_id']}, "
                f"{len(state['pending_transactions'])} pending{f' [{pending}]' if pending else ''}, "
                f"epochs {epochs or 'none'}"
            )
            if state["marker_topic"] is not None:
                text += (
                    f", markers in {state['marker_topic']} partition {state['marker_partition']} "
                    f"from offset {state['marker_floor']}"
                )
            return f"{text} ({size})"
    return f"opaque {state['size_bytes']} bytes"


# Planning ----------------------------------------------------------------------------------------


def _rate_option(flag: str, help_text: str) -> Any:
    return typer.Option(flag, min=0.0, help=help_text)


@app.command("plan")
def plan_command(
    job_id: Annotated[
        str | None, typer.Option("--job", metavar="JOB_ID", help="Measure the inputs of this running job.")
    ] = None,
    savepoint: Annotated[
        str | None,
        typer.Option(
            "--savepoint",
            metavar="PATH",
            help="Measure keys, aggregates per key and bytes per aggregate from a savepoint or retained checkpoint.",
        ),
    ] = None,
    operator: Annotated[
        str | None, typer.Option("--operator", metavar="UID", help="The keyed operator --savepoint measures.")
    ] = None,
    window_s: Annotated[
        float, typer.Option("--window", min=1.0, help="Seconds over which --job measures the rates (PromQL rate).")
    ] = 30.0,
    input_rate: Annotated[
        float | None, _rate_option("--input-rate", "Input records/s arriving at the sources.")
    ] = None,
    sink_rate: Annotated[
        float | None, _rate_option("--sink-rate", "Sustainable sink records/s (in input records).")
    ] = None,
    checkpoint_interval: Annotated[
        float | None, _rate_option("--checkpoint-interval", "Seconds between checkpoint triggers.")
    ] = None,
    checkpoint_duration: Annotated[
        float | None, _rate_option("--checkpoint-duration", "Seconds from a checkpoint's trigger to its completion.")
    ] = None,
    failure_detection: Annotated[
        float | None, _rate_option("--failure-detection", "Seconds until a failure is noticed.")
    ] = None,
    restart_delay: Annotated[
        float | None, _rate_option("--restart-delay", "Seconds the restart strategy waits before restarting.")
    ] = None,
    active_keys: Annotated[float | None, _rate_option("--active-keys", "Keys with state.")] = None,
    aggregates_per_key: Annotated[
        float | None, _rate_option("--aggregates-per-key", "Aggregates (windows, entries) retained per key.")
    ] = None,
    bytes_per_aggregate: Annotated[
        float | None, _rate_option("--bytes-per-aggregate", "Serialized bytes of one aggregate.")
    ] = None,
    restore_rate: Annotated[
        float | None, _rate_option("--restore-rate", "Bytes/s a restore downloads (optional; else not counted).")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Backlog growth, replay work after a failure, recovery time bound,
    state size. Inputs as flags, or measured (--job, --savepoint); a flag overrides a measurement.
    Dimensional formulas, not an SLA or a benchmark (docs/plan.md)."""
    from weir.tools import plan as formulas
    from weir.tools.plan_measure import make_plan

    flags = {
        "input_records_per_s": input_rate,
        "sink_records_per_s": sink_rate,
        "checkpoint_interval_s": checkpoint_interval,
        "checkpoint_duration_s": checkpoint_duration,
        "failure_detection_s": failure_detection,
        "restart_delay_s": restart_delay,
        "active_keys": active_keys,
        "aggregates_per_key": aggregates_per_key,
        "bytes_per_aggregate": bytes_per_aggregate,
        "restore_bytes_per_s": restore_rate,
    }
    with _storage_answers():
        run = make_plan(flags, job_id=job_id, savepoint_path=savepoint, operator_uid=operator, window_s=window_s)
    if json_output:
        _print_json(
            {
                "sources": {
                    name: {"value": f.value, "origin": f.origin.value, "how": f.how}
                    for name, f in run.resolved.figures.items()
                },
                "notes": list(run.notes),
                **run.plan.to_json(),
            }
        )
        return
    console = _stdout()
    inputs = _table("input", "value", "from", "how", title="inputs")
    for input_row in formulas.input_rows(run.resolved):
        inputs.add_row(*(escape(c) for c in input_row))
    console.print(inputs)
    results = _table("figure", "value", "formula", title="plan")
    for result_row in formulas.result_rows(run.plan):
        results.add_row(*(escape(c) for c in result_row))
    console.print(results)
    for note in run.notes:
        console.print(f"note: {escape(note)}", soft_wrap=True)
    console.print("assumptions:", soft_wrap=True)
    for assumption in run.plan.assumptions:
        console.print(f"  - {escape(assumption)}", soft_wrap=True)


# The local cluster -------------------------------------------------------------------------------


# Scenarios ---------------------------------------------------------------------------------------


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def scenario(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="NAME",
            help="keyed-aggregation, barriers, two-phase-commit, recovery, upgrade, backpressure; none: list them.",
        ),
    ] = None,
) -> int:
    """Run one of the end-to-end scenarios on the local cluster against the real services: it prints
    what it did, the evidence it measured and its outcome as PASS/FAIL (`--json`: one JSON
    document); exit 1 on FAIL. Arguments after NAME go to the scenario (`weir scenario NAME --help`)."""
    # The scenarios are harness code above the tools (weir.scenarios, which drives the cluster through
    # this package's client): the CLI launches them as a program rather than importing them.
    args = [] if name is None else [name, *ctx.args]
    return subprocess.run([sys.executable, "-m", "weir.scenarios", *args], check=False).returncode


@cluster_app.command("up")
def cluster_up(
    no_restart: Annotated[bool, typer.Option("--no-restart", help="Leave a process that exits dead.")] = False,
    restart_delay: Annotated[
        float,
        typer.Option(
            "--restart-delay",
            min=0.0,
            help="Back-off of a crash loop: seconds before a process that exits again soon after its restart "
            "is restarted (doubled each time); a first exit restarts at once.",
        ),
    ] = supervisor.DEFAULT_RESTART_DELAY_S,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="Seconds to wait for every TaskManager to register.")
    ] = supervisor.DEFAULT_START_TIMEOUT_S,
    standbys: Annotated[
        int,
        typer.Option(
            "--standbys",
            min=0,
            max=9,
            help="Standby JobManagers beside the leader (ports after the JobManager's and its REST port), "
            "every process with WEIR_HA_ENABLED: a standby takes over when the leader dies or stalls.",
        ),
    ] = 0,
) -> None:
    """Start the JobManager (and --standbys standby JobManagers) and 3 TaskManagers; return once every
    TaskManager is registered."""
    require_server("weir cluster up (the JobManager and the TaskManagers run from this environment)")
    directory = supervisor.cluster_dir()
    endpoints = Endpoints.from_env()
    with _stderr().status("starting the local cluster"):
        result = supervisor.start_cluster(
            directory,
            endpoints,
            restart=not no_restart,
            restart_delay_s=restart_delay,
            timeout_s=timeout,
            standbys=standbys,
        )
    console = _stdout()
    if result.already_running:
        console.print(
            f"the local cluster is already up (supervisor pid {result.status.supervisor_pid}, {directory})",
            soft_wrap=True,
        )
        return
    addresses = supervisor.jobmanager_addresses(endpoints, standbys)
    jobmanagers = (
        f"JobManagers at {', '.join(addresses)} (high availability: one leads, {standbys} on standby; "
        f"set WEIR_JOBMANAGER_ADDRESSES={','.join(addresses)} for the tools)"
        if standbys
        else f"JobManager at {endpoints.jobmanager_address}"
    )
    console.print(
        f"the local cluster is up: {jobmanagers}, {result.taskmanagers_alive} TaskManagers registered; "
        f"logs in {directory}",
        soft_wrap=True,
    )


@cluster_app.command("down")
def cluster_down() -> None:
    """Stop the local cluster and wait until its processes are gone."""
    directory = supervisor.cluster_dir()
    with _stderr().status("stopping the local cluster"):
        result = supervisor.stop_cluster(directory)
    if not result.was_running and not result.stopped:
        _stdout().print("no local cluster is running", soft_wrap=True)
    elif not result.was_running:
        _stdout().print(f"cleaned up a stale local cluster ({', '.join(result.stopped)})", soft_wrap=True)
    else:
        _stdout().print(f"the local cluster is down ({', '.join(result.stopped)} stopped)", soft_wrap=True)


@cluster_app.command("status")
def cluster_status(json_output: JsonOption = False) -> None:
    """The local processes (pid, alive, restarts, log) and the TaskManagers the JobManager knows."""
    directory = supervisor.cluster_dir()
    local = supervisor.local_status(directory)
    address = Endpoints.from_env().jobmanager_address
    remote: ClusterStatus | None
    from weir.tools.client import JobManagerClient

    try:
        with JobManagerClient(address, timeout_s=2.0) as client:
            remote = client.cluster_status()
    except ClusterUnavailableError:
        remote = None
    if json_output:
        _print_json(
            {
                "directory": str(directory),
                "local": asdict(local) if local is not None else None,
                "jobmanager": {
                    "address": address,
                    "answering": remote is not None,
                    "taskmanagers": [asdict(tm) for tm in remote.taskmanagers] if remote is not None else [],
                },
            }
        )
        return
    console = _stdout()
    if local is None:
        console.print(f"no local cluster is running ({directory})", soft_wrap=True)
    else:
        alive = "alive" if local.supervisor_alive else "[red]dead[/red] (stale state: run `weir cluster down`)"
        console.print(f"supervisor pid {local.supervisor_pid}: {alive}", soft_wrap=True)
        table = _table("process", "pid", "alive", "status", "restarts", "last exit", "log")
        for p in local.processes:
            table.add_row(
                p.name,
                str(p.pid) if p.pid is not None else "-",
                "yes" if p.alive else "[red]no[/red]",
                p.status,
                str(p.restarts),
                str(p.last_exit_code) if p.last_exit_code is not None else "-",
                p.log,
            )
        console.print(table)
    if remote is None:
        console.print(f"JobManager at {address}: not answering", soft_wrap=True)
        return
    console.print(f"JobManager at {address}: {len(remote.alive_taskmanagers)} TaskManagers alive", soft_wrap=True)
    tms = _table("taskmanager", "address", "alive", "slots free", "slots total", "last heartbeat")
    for tm in sorted(remote.taskmanagers, key=lambda t: t.taskmanager_id):
        tms.add_row(
            tm.taskmanager_id,
            tm.address,
            "yes" if tm.alive else "[red]no[/red]",
            str(tm.slots_free),
            str(tm.slots_total),
            f"{tm.last_heartbeat_age_s:.1f} s ago",
        )
    console.print(tms)


@cluster_app.command("kill")
def cluster_kill(name: Annotated[str, typer.Argument(help="jobmanager or taskmanager-1..3")]) -> None:
    """Send SIGKILL to one process of the local cluster, as `docker kill`; the supervisor restarts it."""
    pid = supervisor.kill_process(supervisor.cluster_dir(), name)
    _stdout().print(f"killed {name} (pid {pid})", soft_wrap=True)


# Entry point -------------------------------------------------------------------------------------


def exit_code_for(error: WeirError) -> int:
    if isinstance(error, ClusterUnavailableError):
        return EXIT_NO_CLUSTER
    return EXIT_USAGE if error.fault == "user" else EXIT_FAILURE


def _debug() -> bool:
    try:
        return Diagnostics.from_env().debug
    except ConfigurationError:
        return False  # run_cli reported it


@contextmanager
def _debug_traceback() -> Iterator[None]:
    try:
        yield
    except BaseException:
        if _debug():
            traceback.print_exc()
        raise


# CDC slots -----------------------------------------------------------------------------------------


@cdc_app.command("slots")
def cdc_slots(json_output: JsonOption = False) -> None:
    """Every logical (pgoutput) replication slot of the database: whether a session reads it now, the
    WAL it keeps, and the publication a Weir CDC source created for it (such a slot is Weir's)."""
    from weir.connectors import postgres, postgres_cdc

    with postgres.connect(Endpoints.from_env(), autocommit=True) as conn:
        slots = postgres_cdc.list_slots(conn)
    if json_output:
        _print_json({"format": 1, "slots": [asdict(s) for s in slots]})
        return
    table = _table("slot", "active", "WAL kept", "Weir publication")
    for slot in slots:
        wal = "-" if slot.retained_wal_bytes is None else _size(slot.retained_wal_bytes)
        table.add_row(escape(slot.slot), "yes" if slot.active else "no", wal, escape(slot.weir_publication or "-"))
    _stdout().print(table)


@cdc_app.command("drop-slot")
def cdc_drop_slot(
    slot: Annotated[str, typer.Argument(help="The slot's name (`weir cdc slots`).")],
    json_output: JsonOption = False,
) -> None:
    """Drop a replication slot no session reads, and the publication a Weir CDC source created for
    it. A job restored later from a checkpoint that needs the slot fails with "slot ... is gone"."""
    from weir.connectors import postgres, postgres_cdc

    endpoints = Endpoints.from_env()
    with postgres.connect(endpoints, autocommit=True) as conn:
        found = next((s for s in postgres_cdc.list_slots(conn) if s.slot == slot), None)
    if found is None:
        raise CommandLineError(f"no logical replication slot {slot!r} in this database (weir cdc slots lists them)")
    released = postgres_cdc.release_slot(endpoints, slot, found.weir_publication or slot)
    publication = found.weir_publication if released.publication_dropped else None
    if json_output:
        _print_json({"slot": slot, "dropped": released.slot_dropped, "publication_dropped": publication})
        return
    dropped = f"; publication {publication} dropped" if publication else ""
    _stdout().print(f"replication slot {slot} dropped{dropped}", soft_wrap=True)


def _rpc_error_code(exc: Exception) -> str | None:
    """The status code's name when ``exc`` is a failed gRPC call (None: it is not one). gRPC is only
    imported by the commands that call the JobManager: without it, no exception can be one."""
    grpc = sys.modules.get("grpc")
    if grpc is None or not isinstance(exc, grpc.RpcError):
        return None
    return str(exc.code().name) if isinstance(exc, grpc.Call) else "UNKNOWN"


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run one command and answer its exit code; errors become one ``weir: error:`` line on stderr."""
    command = typer.main.get_command(app)
    choices = _client_choices.set({})
    try:
        check_environment()  # a bad WEIR_* variable: one line, exit 2, before any command runs
        with _debug_traceback():
            result: Any = command.main(
                args=list(argv) if argv is not None else None, prog_name="weir", standalone_mode=False
            )
    except WeirError as exc:
        _error_line(str(exc))
        return exit_code_for(exc)
    except typer.TyperException as exc:  # usage errors (bad or missing arguments) and the like
        _error_line(exc.format_message())
        return int(getattr(exc, "exit_code", EXIT_USAGE))
    except (KeyboardInterrupt, typer.Abort):
        _error_line("interrupted")
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as exc:  # a command of the server install, run where only the client is
        module = server_module_of(exc)
        if module is None:
            _error_line(f"{type(exc).__name__}: {exc} (set WEIR_DEBUG=1 for the traceback)")
            return EXIT_FAILURE
        name = next((a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("-")), "")
        _error_line(str(MissingServerExtraError(f"weir {name}".strip(), module)))
        return EXIT_USAGE
    except Exception as exc:
        code = _rpc_error_code(exc)
        if code is not None:
            _error_line(f"a JobManager call failed with {code}")
            return EXIT_FAILURE
        _error_line(f"{type(exc).__name__}: {exc} (set WEIR_DEBUG=1 for the traceback)")
        return EXIT_FAILURE
    finally:
        _client_choices.reset(choices)
    return result if isinstance(result, int) else EXIT_OK


def main() -> None:
    sys.exit(run_cli())


if __name__ == "__main__":
    main()

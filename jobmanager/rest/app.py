"""The REST API's routes (``docs/rest-api.md``): thin, as the gRPC servicer. Each reads through the
``JobManager`` facade (which takes its lock), converts the views in ``weir.jobmanager.rest.views`` and lets
``weir.jobmanager.rest.errors`` answer every error. ``/`` and ``/web/...`` serve the web UI's files.

With tokens configured every API route requires ``Authorization: Bearer <token>`` (401 otherwise) of a
token holding the route's role (:data:`weir.core.roles.REST_ROUTE_ROLES`; 403 otherwise);
``/healthz`` (for probes), ``/openapi.json`` and the web UI's files stay open."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, assert_never

import structlog
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from weir import __version__
from weir.core.errors import AuthenticationError, PermissionDeniedError, UnknownJobError
from weir.core.log_files import LogSelector
from weir.core.roles import AccessTable, rest_route_role
from weir.core.thread_dump import thread_dump
from weir.core.transport_security import AuthDecision, authorize, refusal_message
from weir.jobmanager.errors import JobManagerNotReadyError, TaskManagerCallError, UnknownVertexError
from weir.jobmanager.manager import JobManager
from weir.jobmanager.messages import JobPlanView, JobStatusView, VertexView
from weir.jobmanager.rest import config, diagnostics, environment, errors, flink, jars, metrics, vertices, views
from weir.jobmanager.rest.ids import flink_job_id, flink_vertex_id, weir_job_id
from weir.jobmanager.rest.resource_requirements import validated_bounds

log = structlog.get_logger("weir.jobmanager")

WEB_DIR: Final = Path(__file__).with_name("web")
DEFAULT_MAX_EXCEPTIONS: Final = 20
BEARER: Final = HTTPBearer(auto_error=False, description="The cluster's token (WEIR_AUTH_TOKEN), when it has one.")

_ERROR: Final = {"model": views.ErrorBody}
NOT_FOUND: Final[dict[int | str, dict[str, Any]]] = {404: {**_ERROR, "description": "Unknown job"}}
BAD_REQUEST: Final[dict[int | str, dict[str, Any]]] = {400: {**_ERROR, "description": "Malformed request"}}
CONFLICT: Final[dict[int | str, dict[str, Any]]] = {409: {**_ERROR, "description": "Not possible in the job's state"}}
UNKNOWN_VERTEX: Final[dict[int | str, dict[str, Any]]] = {
    404: {**_ERROR, "description": "Unknown job, vertex or subtask"}
}
FLINK_VERSION_PREFIX: Final = "/v1"


def create_app(
    manager: JobManager,
    *,
    access: AccessTable | None = None,
    token: str | None = None,
    settings_overrides: Mapping[str, str] | None = None,
    known_leader: Callable[[], views.KnownLeader | None] | None = None,
    log_files: Callable[[], diagnostics.LogFiles] = diagnostics.process_log_files,
) -> FastAPI:
    """``access``: the tokens the API accepts and their roles (None: open); ``token``: one token with
    every role, instead; ``settings_overrides``: the ``WEIR_*`` settings the JobManager's command line
    set (``GET /jobmanager/config`` shows them over the environment's); ``known_leader``: under high
    availability, the leader this JobManager last read in the lease (a standby's ``/healthz`` names it);
    ``log_files``: where the JobManager's standard error and output are written (``/jobmanager/log``)."""
    if access is None and token is not None:
        access = AccessTable.single(token)
    app = FastAPI(
        title="Weir JobManager",
        version=__version__,
        description="Jobs, checkpoints, exceptions and TaskManagers of a Weir cluster (docs/rest-api.md).",
        openapi_url="/openapi.json",
        docs_url=None,  # Swagger UI and ReDoc load their assets from a CDN; the API serves nothing remote
        redoc_url=None,
    )
    errors.install(app)
    disposals = flink.Disposals()
    deletions = flink.DataSetDeletions()
    uploads = jars.Jars()

    def require_ready() -> None:
        if not manager.ready:
            what = "stopping" if manager.stopping else "still taking over its jobs from checkpoint storage"
            raise JobManagerNotReadyError(f"the JobManager is {what}; try again shortly")

    def require_token(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
    ) -> None:
        header = None if credentials is None else f"{credentials.scheme} {credentials.credentials}"
        route = request.scope.get("route")
        template = str(getattr(route, "path", request.url.path))
        needed = rest_route_role(request.method, template)
        decision = authorize(header, access, needed)
        if decision.allowed:
            return
        log.warning(
            "rest_request_refused",
            decision=decision.value,
            route=f"{request.method} {template}",
            needed=None if needed is None else needed.value,
        )
        message = refusal_message(decision, needed, f"{request.method} {template}")
        if decision is AuthDecision.FORBIDDEN:
            raise PermissionDeniedError(message)
        raise AuthenticationError(message)

    api = APIRouter(
        dependencies=[Depends(require_token), Depends(require_ready)],
        responses={
            401: {**_ERROR, "description": "No bearer token, or not the cluster's"},
            403: {**_ERROR, "description": "A token of the cluster's without the role the route needs"},
            503: {**_ERROR, "description": "The JobManager is not ready"},
        },
    )

    @app.get(
        "/healthz",
        response_model_exclude_none=True,
        responses={503: {"model": views.Health, "description": "Starting or stopping"}},
    )
    def healthz() -> views.Health:
        """For probes: 200 once the JobManager has taken over its jobs, 503 before and while it stops
        (a standby's 503 names the leader it knows: ``leader``)."""
        if not manager.ready:
            status = views.HealthStatus.STOPPING if manager.stopping else views.HealthStatus.STARTING
            leader = known_leader() if known_leader is not None else None
            body = views.health(status, None, (), leader).model_dump(mode="json", by_alias=True, exclude_none=True)
            return JSONResponse(body, status_code=503)  # type: ignore[return-value]  # documented above
        return views.health(views.HealthStatus.OK, manager.cluster_status(), manager.list_jobs())

    @api.get("/overview")
    def overview() -> views.Overview:
        return views.overview(manager.cluster_status(), manager.list_jobs())

    @api.get("/config")
    def dashboard_config() -> config.DashboardConfiguration:
        """Flink's ``DashboardConfiguration``: the web UI's refresh interval, the JobManager's time zone,
        Weir's version, what the UI offers."""
        return config.dashboard_configuration()

    @api.get("/jobmanager/config")
    def jobmanager_config() -> list[config.ConfigEntry]:
        """Flink's ``ClusterConfigurationInfo``: the JobManager's ``WEIR_*`` settings, secrets hidden."""
        return config.jobmanager_settings(None, settings_overrides)

    @api.get("/jobmanager/environment")
    def jobmanager_environment() -> environment.EnvironmentInfo:
        """Flink's ``EnvironmentInfo`` of the JobManager's process: the Python interpreter's version,
        machine and options in ``jvm``, its module search path (``sys.path``) as ``classpath``."""
        return environment.environment_info()

    @api.get("/datasets")
    def datasets() -> flink.DataSetList:
        """Flink's cluster datasets (a batch job's cached intermediate results): Weir keeps none."""
        return flink.DataSetList(data_sets=[])

    @api.delete("/datasets/{dataset_id}", status_code=202, responses=BAD_REQUEST)
    def delete_dataset(dataset_id: str) -> flink.TriggerResponse:
        """Flink's dataset deletion: Weir has no dataset to release, so it completes at once, as
        Flink's for a dataset it does not track; ``GET /datasets/delete/{request-id}`` answers it."""
        try:
            flink.data_set_id(dataset_id)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return flink.TriggerResponse(request_id=deletions.delete(dataset_id))

    @api.get(
        "/datasets/delete/{trigger_id}",
        responses={404: {**_ERROR, "description": "Unknown trigger id"}},
        response_model_exclude_none=True,
    )
    def dataset_deletion_status(trigger_id: str) -> flink.OperationResult:
        result = deletions.status(trigger_id)
        if result is None:
            raise HTTPException(404, f"no dataset deletion {trigger_id} (the last {flink.DISPOSALS_KEPT} are kept)")
        return result

    # Metrics (Flink's metrics handlers; weir.jobmanager.rest.metrics). The aggregating routes come
    # before the routes whose path parameter would take "metrics" for an id.
    @api.get("/jobmanager/metrics", response_model_exclude_none=True)
    def jobmanager_metrics(get: metrics.GetQuery = None) -> metrics.MetricList:
        """The JobManager's metrics (Flink's cluster gauges, its process's series)."""
        return metrics.metric_list(
            metrics.jobmanager_metrics(manager.cluster_status(), manager.list_jobs()), metrics.names(get)
        )

    @api.get("/taskmanagers/metrics", response_model_exclude_none=True, responses=BAD_REQUEST)
    def taskmanagers_metrics(
        get: metrics.GetQuery = None,
        agg: metrics.AggQuery = None,
        taskmanagers: Annotated[str | None, Query(description="Comma-separated TaskManager ids (all)")] = None,
    ) -> metrics.AggregatedMetricList:
        """The TaskManagers' metrics aggregated over them (``taskmanagers=`` chooses; all by default)."""
        chosen = metrics.selection(taskmanagers)
        statuses = running_statuses()
        scopes = [
            metrics.taskmanager_metrics(tm, statuses)
            for tm in manager.cluster_status().taskmanagers
            if chosen is None or tm.taskmanager_id in chosen
        ]
        return metrics.aggregated_list(scopes, metrics.names(get), metrics.aggregations(agg))

    @api.get("/jobs/metrics", response_model_exclude_none=True, responses=BAD_REQUEST)
    def jobs_metrics(
        get: metrics.GetQuery = None,
        agg: metrics.AggQuery = None,
        jobs: Annotated[str | None, Query(description="Comma-separated job ids, either form (all)")] = None,
    ) -> metrics.AggregatedMetricList:
        """The jobs' metrics aggregated over them (``jobs=`` chooses; all by default)."""
        chosen = metrics.selection(jobs)
        wanted = None if chosen is None else {weir_job_id(j) for j in chosen}
        scopes = []
        for summary in manager.list_jobs():
            if wanted is not None and summary.job_id not in wanted:
                continue
            try:
                scopes.append(
                    metrics.job_metrics(manager.job_status(summary.job_id), manager.list_checkpoints(summary.job_id))
                )
            except UnknownJobError:
                continue  # removed between the two reads
        return metrics.aggregated_list(scopes, metrics.names(get), metrics.aggregations(agg))

    def running_statuses() -> list[JobStatusView]:
        statuses = []
        for summary in manager.list_jobs():
            if summary.status.terminal:
                continue
            try:
                statuses.append(manager.job_status(summary.job_id))
            except UnknownJobError:
                continue
        return statuses

    @api.get(
        "/taskmanagers/{taskmanager_id}/metrics",
        response_model_exclude_none=True,
        responses={404: {**_ERROR, "description": "Unknown TaskManager"}},
    )
    def taskmanager_metrics(taskmanager_id: str, get: metrics.GetQuery = None) -> metrics.MetricList:
        """One TaskManager's metrics, as far as the JobManager knows them."""
        found = next((tm for tm in manager.cluster_status().taskmanagers if tm.taskmanager_id == taskmanager_id), None)
        if found is None:
            raise HTTPException(404, f"no TaskManager {taskmanager_id!r} (GET /taskmanagers lists them)")
        return metrics.metric_list(metrics.taskmanager_metrics(found, running_statuses()), metrics.names(get))

    # Logs and thread dumps (Flink's; weir.jobmanager.rest.diagnostics)
    no_file: Final[dict[int | str, dict[str, Any]]] = {404: {**_ERROR, "description": "No such log file"}}
    plain_text: Final[dict[int | str, dict[str, Any]]] = {200: {"content": {"text/plain": {}}}}

    @api.get("/jobmanager/logs")
    def jobmanager_logs() -> diagnostics.LogListInfo:
        """The JobManager's log files (Flink's ``LogListInfo``): the file its standard error and output
        go to when that is a file (``weir cluster up``'s ``jobmanager.log``); none otherwise."""
        return diagnostics.log_list(log_files())

    def serve_log(path: Path | None, what: str) -> FileResponse:
        if path is None or not path.is_file():
            raise HTTPException(404, f"the JobManager has no {what}: it logs to a terminal or a pipe, not a file")
        return FileResponse(path, media_type="text/plain")

    @api.get("/jobmanager/log", response_class=FileResponse, responses={**no_file, **plain_text})
    def jobmanager_log() -> FileResponse:
        """The JobManager's log (the file its standard error goes to), as text."""
        return serve_log(log_files().log, "log file")

    @api.get("/jobmanager/stdout", response_class=FileResponse, responses={**no_file, **plain_text})
    def jobmanager_stdout() -> FileResponse:
        """The file the JobManager's standard output goes to, as text."""
        return serve_log(log_files().stdout, "standard output file")

    @api.get("/jobmanager/logs/{filename}", response_class=FileResponse, responses={**no_file, **plain_text})
    def jobmanager_log_file(filename: str) -> FileResponse:
        """One file ``/jobmanager/logs`` lists (no other), as text."""
        return serve_log(log_files().named(filename), f"log file {filename!r} (GET /jobmanager/logs lists them)")

    @api.get("/jobmanager/thread-dump")
    def jobmanager_thread_dump() -> diagnostics.ThreadDumpInfo:
        """Every thread of the JobManager's process with its Python stack (Flink's ``ThreadDumpInfo``)."""
        return diagnostics.thread_dump_info(thread_dump())

    @api.get(
        "/taskmanagers/{taskmanager_id}/thread-dump",
        responses={
            404: {**_ERROR, "description": "Unknown TaskManager"},
            503: {**_ERROR, "description": "The TaskManager did not answer"},
        },
    )
    def taskmanager_thread_dump(taskmanager_id: str) -> diagnostics.ThreadDumpInfo:
        """Every thread of the TaskManager's process and of its slot workers, asked over its gRPC
        service (Flink's ``ThreadDumpInfo``)."""
        threads = manager.taskmanager_thread_dump(taskmanager_id)
        if threads is None:
            raise HTTPException(404, f"no TaskManager {taskmanager_id!r} (GET /taskmanagers lists them)")
        return diagnostics.thread_dump_info(threads)

    unknown_tm: Final[dict[int | str, dict[str, Any]]] = {
        404: {**_ERROR, "description": "Unknown TaskManager, or no such log file"},
        503: {**_ERROR, "description": "The TaskManager did not answer"},
    }

    @api.get("/taskmanagers/{taskmanager_id}/logs", responses=unknown_tm)
    def taskmanager_logs(taskmanager_id: str) -> diagnostics.LogListInfo:
        """The TaskManager's log files (Flink's ``LogListInfo``), asked over its gRPC service: the file its
        standard error and output go to when that is a file (``weir cluster up``'s ``taskmanager-N.log``)."""
        found = manager.taskmanager_logs(taskmanager_id)
        if found is None:
            raise HTTPException(404, f"no TaskManager {taskmanager_id!r} (GET /taskmanagers lists them)")
        return diagnostics.log_list(found)

    def serve_taskmanager_log(taskmanager_id: str, selector: LogSelector, name: str = "") -> StreamingResponse:
        try:
            chunks = manager.taskmanager_log(taskmanager_id, selector, name)
        except TaskManagerCallError as exc:
            if exc.code == "NOT_FOUND":
                raise HTTPException(404, f"TaskManager {taskmanager_id!r}: {exc.details}") from None
            raise
        if chunks is None:
            raise HTTPException(404, f"no TaskManager {taskmanager_id!r} (GET /taskmanagers lists them)")
        return StreamingResponse(chunks, media_type="text/plain")

    @api.get(
        "/taskmanagers/{taskmanager_id}/log",
        response_class=StreamingResponse,
        responses={**unknown_tm, **plain_text},
    )
    def taskmanager_log(taskmanager_id: str) -> StreamingResponse:
        """The TaskManager's log (the file its standard error goes to), as text, read over its gRPC service."""
        return serve_taskmanager_log(taskmanager_id, LogSelector.LOG)

    @api.get(
        "/taskmanagers/{taskmanager_id}/stdout",
        response_class=StreamingResponse,
        responses={**unknown_tm, **plain_text},
    )
    def taskmanager_stdout(taskmanager_id: str) -> StreamingResponse:
        """The file the TaskManager's standard output goes to, as text."""
        return serve_taskmanager_log(taskmanager_id, LogSelector.STDOUT)

    @api.get(
        "/taskmanagers/{taskmanager_id}/logs/{filename}",
        response_class=StreamingResponse,
        responses={**unknown_tm, **plain_text},
    )
    def taskmanager_log_file(taskmanager_id: str, filename: str) -> StreamingResponse:
        """One file ``/taskmanagers/{id}/logs`` lists (no other), as text."""
        return serve_taskmanager_log(taskmanager_id, LogSelector.NAMED, filename)

    @api.get("/taskmanagers")
    def taskmanagers() -> views.TaskManagers:
        return views.taskmanagers(manager.cluster_status())

    @api.get("/taskmanagers/{taskmanager_id}", responses={404: {**_ERROR, "description": "Unknown TaskManager"}})
    def taskmanager(taskmanager_id: str) -> views.TaskManagerDetails:
        """Flink's ``TaskManagerDetailsInfo`` of what the JobManager knows of the TaskManager."""
        details = views.taskmanager_details(manager.cluster_status(), taskmanager_id)
        if details is None:
            raise HTTPException(404, f"no TaskManager {taskmanager_id!r} (GET /taskmanagers lists them)")
        return details

    @api.get("/jobs")
    def jobs() -> views.Jobs:
        return views.jobs(manager.list_jobs())

    @api.get("/jobs/overview")
    def jobs_overview() -> views.JobsOverview:
        """Flink's job list (``flink list`` reads it): each job with its tasks' states counted."""
        statuses = []
        for summary in manager.list_jobs():
            try:
                statuses.append(manager.job_status(summary.job_id))
            except UnknownJobError:
                continue  # removed between the two reads
        return views.jobs_overview(statuses)

    @api.get("/jobs/{job_id}", responses=NOT_FOUND)
    def job(job_id: str) -> views.JobDetails:
        job_id = weir_job_id(job_id)
        return views.job_details(manager.job_status(job_id), manager.job_plan(job_id))

    @api.get("/jobs/{job_id}/status", responses=NOT_FOUND)
    def job_status_only(job_id: str) -> views.JobStatusInfo:
        """The job's status alone (Flink's ``JobStatusInfo``)."""
        return views.JobStatusInfo(status=manager.job_status(weir_job_id(job_id)).summary.status)

    @api.get("/jobs/{job_id}/resource-requirements", responses=NOT_FOUND)
    def resource_requirements(job_id: str) -> dict[str, views.VertexResourceRequirements]:
        """Each vertex's parallelism bounds (Flink's ``JobResourceRequirementsBody``, by Flink vertex id):
        both are the parallelism the vertex runs at; ``PUT`` changes it by a rescale."""
        return views.resource_requirements(manager.job_plan(weir_job_id(job_id)))

    @api.put("/jobs/{job_id}/resource-requirements", responses={**NOT_FOUND, **BAD_REQUEST, **CONFLICT})
    def update_resource_requirements(
        job_id: str, request: dict[str, views.VertexResourceRequirements]
    ) -> views.Accepted:
        """Flink's adaptive scheduler's new bounds per vertex (by Flink vertex id or uid; ``-1``: none), as
        a live rescale (``weir rescale``) to the highest parallelism within every bound of the vertices
        that follow the job's and the slots; nothing when the job runs within them already. Flink's
        validation errors: 400, one line each; bounds Weir cannot run the job within: 409, untouched."""
        job_id = weir_job_id(job_id)
        bounds = validated_bounds(manager.job_plan(job_id), request)
        trigger_id = manager.rescale_within(job_id, bounds)
        log.info("resource_requirements_updated", job_id=job_id, rescale_trigger_id=trigger_id)
        return views.Accepted()

    @api.get("/jobs/{job_id}/execution-result", responses=NOT_FOUND, response_model_exclude_none=True)
    def execution_result(job_id: str) -> flink.JobExecutionResult:
        """Flink's ``JobExecutionResultResponseBody`` (``flink run`` in attached mode polls it): IN_PROGRESS
        until the job ended, then COMPLETED with its ``job-execution-result``: its outcome
        (``application-status``), ``net-runtime`` and, for a FAILED job, the ``failure-cause``."""
        return flink.job_execution_result(manager.job_status(weir_job_id(job_id)))

    @api.patch("/jobs/{job_id}", status_code=202, responses={**NOT_FOUND, **BAD_REQUEST})
    def cancel(job_id: str, mode: views.CancelMode = views.CancelMode.CANCEL) -> views.Accepted:
        """Cancel the job (Flink's ``?mode=cancel``); its status shows when it is CANCELED."""
        match mode:
            case views.CancelMode.CANCEL:
                manager.cancel(weir_job_id(job_id))
            case _:
                assert_never(mode)
        return views.Accepted()

    @api.get("/jobs/{job_id}/jobmanager/config", responses=NOT_FOUND)
    def job_jobmanager_config(job_id: str) -> list[config.ConfigEntry]:
        """The settings of the JobManager running the job (Flink's, for a job's own JobManager): one
        JobManager runs every job of a Weir cluster, so ``GET /jobmanager/config``'s."""
        manager.job_status(weir_job_id(job_id))  # 404 for an unknown job
        return config.jobmanager_settings(None, settings_overrides)

    @api.get("/jobs/{job_id}/jobmanager/environment", responses=NOT_FOUND)
    def job_jobmanager_environment(job_id: str) -> environment.EnvironmentInfo:
        """The environment of the JobManager running the job: ``GET /jobmanager/environment``'s."""
        manager.job_status(weir_job_id(job_id))  # 404 for an unknown job
        return environment.environment_info()

    no_log_url: Final[dict[int | str, dict[str, Any]]] = {
        404: {**_ERROR, "description": "Always, as Flink's JobManager (its History Server serves log URLs)"}
    }

    @api.get("/jobs/{job_id}/jobmanager/log-url", responses=no_log_url, response_model=None)
    def job_jobmanager_log_url(job_id: str) -> None:
        """Flink's History Server answers a ``LogUrlResponse`` from ``historyserver.log.jobmanager.url-pattern``;
        Flink's JobManager does not register the route and answers 404, as Weir: ``GET /jobmanager/log``
        serves the log."""
        manager.job_status(weir_job_id(job_id))  # an unknown job's 404 first
        raise HTTPException(
            404,
            "no JobManager log URL: as Flink's JobManager, Weir serves none (Flink's History Server builds one "
            "from historyserver.log.jobmanager.url-pattern); GET /jobmanager/log serves the log",
        )

    @api.get("/jobs/{job_id}/taskmanagers/{taskmanager_id}/log-url", responses=no_log_url, response_model=None)
    def job_taskmanager_log_url(job_id: str, taskmanager_id: str) -> None:
        """As the JobManager's (``historyserver.log.taskmanager.url-pattern``): 404; ``GET
        /taskmanagers/{id}/log`` serves the TaskManager's log."""
        manager.job_status(weir_job_id(job_id))
        raise HTTPException(
            404,
            f"no log URL of TaskManager {taskmanager_id!r}: as Flink's JobManager, Weir serves none (Flink's "
            "History Server builds one from historyserver.log.taskmanager.url-pattern); "
            f"GET /taskmanagers/{taskmanager_id}/log serves the log",
        )

    @api.patch("/jobs/{job_id}/clientHeartbeat", status_code=202, responses={**NOT_FOUND, **BAD_REQUEST})
    def client_heartbeat(job_id: str, request: flink.ClientHeartbeatRequest) -> views.Accepted:
        """Flink's attached client's heartbeat (``JobClientHeartbeatRequestBody``): accepted for a known
        job; Weir does not cancel a job whose client stops beating (Flink's
        ``execution.shutdown-on-attached-exit``, which Weir does not have)."""
        job_id = weir_job_id(job_id)
        manager.job_status(job_id)  # 404 for an unknown job
        log.debug("client_heartbeat", job_id=job_id, expired_timestamp=request.expired_timestamp)
        return views.Accepted()

    @api.get("/jobs/{job_id}/config", responses=NOT_FOUND)
    def job_config(job_id: str) -> config.JobConfigInfo:
        """Flink's ``JobConfigInfo``: the job's parameters as given (a secret as its reference)."""
        return config.job_config(manager.job_config(weir_job_id(job_id)))

    @api.get("/jobs/{job_id}/plan", responses=NOT_FOUND)
    def plan(job_id: str) -> views.JobPlan:
        return views.job_plan(manager.job_plan(weir_job_id(job_id)))

    @api.get("/jobs/{job_id}/exceptions", responses={**NOT_FOUND, **BAD_REQUEST})
    def exceptions(
        job_id: str,
        max_exceptions: Annotated[int, Query(alias="maxExceptions", ge=1, le=1000)] = DEFAULT_MAX_EXCEPTIONS,
    ) -> views.JobExceptions:
        """The job's last failures, newest first (the last 100 are kept, also across JobManager restarts)."""
        job_id = weir_job_id(job_id)
        return views.job_exceptions(manager.exception_history(job_id), manager.job_plan(job_id), max_exceptions)

    @api.get("/jobs/{job_id}/checkpoints", responses=NOT_FOUND)
    def checkpoints(job_id: str) -> views.Checkpoints:
        return views.checkpoints(manager.list_checkpoints(weir_job_id(job_id)))

    @api.get("/jobs/{job_id}/checkpoints/config", responses=NOT_FOUND)
    def checkpoint_config(job_id: str) -> config.CheckpointConfigInfo:
        """Flink's ``CheckpointConfigInfo`` from the job's ``checkpointing.*`` settings."""
        return config.checkpoint_config(manager.job_config(weir_job_id(job_id)))

    @api.get(
        "/jobs/{job_id}/checkpoints/details/{checkpoint_id}",
        responses={404: {**_ERROR, "description": "Unknown job or checkpoint"}, **BAD_REQUEST},
    )
    def checkpoint_details(job_id: str, checkpoint_id: int) -> views.CheckpointDetails:
        job_id = weir_job_id(job_id)
        detail = manager.checkpoint_detail(job_id, checkpoint_id)
        tasks = [(t.vertex_uid, t.subtask) for t in manager.job_status(job_id).tasks]
        return views.checkpoint_details(detail, tasks)

    @api.get(
        "/jobs/{job_id}/checkpoints/details/{checkpoint_id}/subtasks/{vertex_id}",
        responses={404: {**_ERROR, "description": "Unknown job, checkpoint or vertex, or no statistics of it"}},
    )
    def checkpoint_subtasks(job_id: str, checkpoint_id: int, vertex_id: str) -> views.VertexCheckpointDetails:
        """Flink's ``TaskCheckpointStatisticsWithSubtaskDetails``: the vertex's part of the checkpoint and
        each subtask's acknowledgement (time, sizes, durations), the others pending."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        detail = manager.checkpoint_detail(job_id, checkpoint_id)
        subtasks = [t.subtask for t in manager.job_status(job_id).tasks if t.vertex_uid == found.uid]
        details = views.vertex_checkpoint_details(detail, found.uid, subtasks)
        if details is None:
            raise HTTPException(
                404, f"checkpoint {checkpoint_id} of job {job_id} has no statistics of vertex {vertex_id!r}"
            )
        return details

    @api.get("/jobs/{job_id}/vertices/{vertex_id}/taskmanagers", responses=UNKNOWN_VERTEX)
    def vertex_taskmanagers(job_id: str, vertex_id: str) -> vertices.VertexTaskManagers:
        """Flink's ``JobVertexTaskManagersInfo``: the vertex's subtasks by TaskManager, their aggregated
        state, summed IO metrics, counts per state and statistics over them."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        return vertices.vertex_taskmanagers(manager.job_status(job_id), found, manager.cluster_status())

    @api.get(
        "/jobs/{job_id}/vertices/{vertex_id}/backpressure",
        responses={404: {**_ERROR, "description": "Unknown job or vertex"}},
    )
    def backpressure(job_id: str, vertex_id: str) -> views.VertexBackpressure:
        """Each subtask's backpressured, busy and idle shares over its last heartbeat interval."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        return views.vertex_backpressure(manager.job_status(job_id), found.uid)

    def vertex_of(job_id: str, vertex_id: str) -> tuple[JobPlanView, VertexView]:
        plan = manager.job_plan(job_id)
        vertex = vertices.find_vertex(plan.vertices, vertex_id)
        if vertex is None:
            raise UnknownVertexError(job_id, vertex_id)
        return plan, vertex

    @api.get("/jobs/{job_id}/accumulators", responses=NOT_FOUND)
    def job_accumulators(
        job_id: str,
        include_serialized_value: Annotated[bool | None, Query(alias="includeSerializedValue")] = None,
    ) -> diagnostics.JobAccumulatorsInfo:
        """Flink's ``JobAccumulatorsInfo``: Weir has no user accumulators, so its lists are empty."""
        manager.job_status(weir_job_id(job_id))  # 404 for an unknown job
        return diagnostics.job_accumulators()

    @api.get("/jobs/{job_id}/vertices/{vertex_id}/accumulators", responses=UNKNOWN_VERTEX)
    def vertex_accumulators(job_id: str, vertex_id: str) -> diagnostics.JobVertexAccumulatorsInfo:
        """Flink's ``JobVertexAccumulatorsInfo``: empty, as Weir has no user accumulators."""
        _plan, found = vertex_of(weir_job_id(job_id), vertex_id)
        return diagnostics.vertex_accumulators(flink_vertex_id(found.uid))

    @api.get("/jobs/{job_id}/vertices/{vertex_id}/subtasks/accumulators", responses=UNKNOWN_VERTEX)
    def subtasks_accumulators(job_id: str, vertex_id: str) -> diagnostics.SubtasksAllAccumulatorsInfo:
        """Flink's ``SubtasksAllAccumulatorsInfo``: each subtask, none with accumulators."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        details = vertices.vertex_details(manager.job_status(job_id), found, 0, manager.cluster_status())
        subtasks = [(s.subtask, s.attempt, s.host) for s in details.subtasks]
        return diagnostics.subtasks_accumulators(flink_vertex_id(found.uid), found.parallelism, subtasks)

    @api.get("/jobs/{job_id}/metrics", response_model_exclude_none=True, responses=NOT_FOUND)
    def job_metrics(job_id: str, get: metrics.GetQuery = None) -> metrics.MetricList:
        """The job's metrics: uptime, restarts, checkpoint statistics (Flink's job scope)."""
        job_id = weir_job_id(job_id)
        return metrics.metric_list(
            metrics.job_metrics(manager.job_status(job_id), manager.list_checkpoints(job_id)), metrics.names(get)
        )

    @api.get("/jobs/{job_id}/vertices/{vertex_id}/metrics", response_model_exclude_none=True, responses=UNKNOWN_VERTEX)
    def vertex_metrics(job_id: str, vertex_id: str, get: metrics.GetQuery = None) -> metrics.MetricList:
        """The vertex's subtasks' metrics, each id prefixed with the subtask's index (``0.numRecordsIn``)."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        return metrics.metric_list(metrics.vertex_metrics(manager.job_status(job_id), found.uid), metrics.names(get))

    @api.get("/jobs/{job_id}/vertices/{vertex_id}/watermarks", responses=UNKNOWN_VERTEX)
    def vertex_watermarks(job_id: str, vertex_id: str) -> metrics.MetricList:
        """Each subtask's input watermark (ms; Flink's Long.MIN_VALUE before the first), as Flink's."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        return metrics.vertex_watermarks(manager.job_status(job_id), found.uid)

    @api.get(
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/metrics",
        response_model_exclude_none=True,
        responses={**UNKNOWN_VERTEX, **BAD_REQUEST},
    )
    def subtasks_metrics(
        job_id: str,
        vertex_id: str,
        get: metrics.GetQuery = None,
        agg: metrics.AggQuery = None,
        subtasks: Annotated[str | None, Query(description="Subtask indexes and ranges, e.g. 0,2-4 (all)")] = None,
    ) -> metrics.AggregatedMetricList:
        """The vertex's subtasks' metrics aggregated over them (``subtasks=`` chooses; all by default)."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        chosen = metrics.subtask_selection(subtasks)
        scopes = metrics.subtask_metrics(manager.job_status(job_id), found.uid, chosen)
        return metrics.aggregated_list(scopes, metrics.names(get), metrics.aggregations(agg))

    @api.get(
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}/metrics",
        response_model_exclude_none=True,
        responses={**UNKNOWN_VERTEX, **BAD_REQUEST},
    )
    def subtask_metrics(job_id: str, vertex_id: str, index: int, get: metrics.GetQuery = None) -> metrics.MetricList:
        """One subtask's metrics (Flink's task scope)."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        task = next(
            (t for t in manager.job_status(job_id).tasks if t.vertex_uid == found.uid and t.subtask == index), None
        )
        if task is None:
            raise HTTPException(404, f"vertex {vertex_id!r} of job {job_id} has no subtask {index}")
        return metrics.metric_list(metrics.task_metrics(task), metrics.names(get))

    @api.get("/jobs/{job_id}/vertices/{vertex_id}", responses=UNKNOWN_VERTEX)
    def vertex(job_id: str, vertex_id: str) -> vertices.VertexDetails:
        """Flink's ``JobVertexDetailsInfo``: the vertex and each subtask's state, place, times and records."""
        job_id = weir_job_id(job_id)
        plan, found = vertex_of(job_id, vertex_id)
        return vertices.vertex_details(
            manager.job_status(job_id), found, plan.max_parallelism, manager.cluster_status()
        )

    @api.get("/jobs/{job_id}/vertices/{vertex_id}/subtasktimes", responses=UNKNOWN_VERTEX)
    def subtask_times(job_id: str, vertex_id: str) -> vertices.VertexSubtaskTimes:
        """Flink's ``SubtasksTimesInfo``: when each subtask reached each state (as far as Weir records it)."""
        job_id = weir_job_id(job_id)
        _plan, found = vertex_of(job_id, vertex_id)
        return vertices.subtask_times(manager.job_status(job_id), found, manager.cluster_status())

    @api.get("/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}", responses={**UNKNOWN_VERTEX, **BAD_REQUEST})
    def subtask(job_id: str, vertex_id: str, index: int) -> vertices.SubtaskAttemptDetails:
        """Flink's ``SubtaskExecutionAttemptDetailsInfo`` of the subtask's current attempt."""
        return current_subtask(weir_job_id(job_id), vertex_id, index)

    @api.get(
        "/jobs/{job_id}/vertices/{vertex_id}/subtasks/{index}/attempts/{attempt}",
        responses={**UNKNOWN_VERTEX, **BAD_REQUEST},
    )
    def subtask_attempt(job_id: str, vertex_id: str, index: int, attempt: int) -> vertices.SubtaskAttemptDetails:
        """The subtask in one attempt: Weir keeps its current attempt only (another one: 404)."""
        details = current_subtask(weir_job_id(job_id), vertex_id, index)
        if details.attempt != attempt:
            raise HTTPException(
                404, f"subtask {index} of vertex {vertex_id!r} is in attempt {details.attempt}; Weir keeps no other"
            )
        return details

    def current_subtask(job_id: str, vertex_id: str, index: int) -> vertices.SubtaskAttemptDetails:
        _plan, found = vertex_of(job_id, vertex_id)
        details = vertices.subtask_of(manager.job_status(job_id), found.uid, index, manager.cluster_status())
        if details is None:
            raise HTTPException(404, f"vertex {vertex_id!r} of job {job_id} has no subtask {index}")
        return details

    @api.post("/jobs/{job_id}/savepoints", status_code=202, responses={**NOT_FOUND, **BAD_REQUEST, **CONFLICT})
    def savepoint(job_id: str, request: views.SavepointRequest | None = None) -> views.SavepointTriggered:
        """Start a savepoint (with ``cancel-job``: stop the job at it); ``GET .../savepoints/{request-id}``
        answers its outcome, the checkpoints show it too."""
        body = request if request is not None else views.SavepointRequest()
        savepoint_id = manager.trigger_savepoint(
            weir_job_id(job_id), body.target_directory or "", stop=body.cancel_job, drain=body.drain
        )
        return views.SavepointTriggered(request_id=flink.savepoint_trigger_id(savepoint_id))

    @api.post("/jobs/{job_id}/stop", status_code=202, responses={**NOT_FOUND, **BAD_REQUEST, **CONFLICT})
    def stop(job_id: str, request: flink.StopRequest | None = None) -> flink.TriggerResponse:
        """Flink's stop-with-savepoint (``flink stop``): the job FINISHES at the savepoint (with ``drain``,
        its event time advanced to the end first); the outcome as for a savepoint."""
        body = request if request is not None else flink.StopRequest()
        savepoint_id = manager.trigger_savepoint(
            weir_job_id(job_id), body.target_directory or "", stop=True, drain=body.drain
        )
        return flink.TriggerResponse(request_id=flink.savepoint_trigger_id(savepoint_id))

    @api.get(
        "/jobs/{job_id}/savepoints/{trigger_id}",
        responses={404: {**_ERROR, "description": "Unknown job or savepoint"}},
        response_model_exclude_none=True,
    )
    def savepoint_status(job_id: str, trigger_id: str) -> flink.OperationResult:
        """A savepoint's (or stop's) outcome by the ``request-id`` its trigger answered (Flink's shape)."""
        job_id = weir_job_id(job_id)
        checkpoint_id = flink.checkpoint_of_trigger(job_id, trigger_id)
        return flink.savepoint_status(manager.list_checkpoints(job_id), checkpoint_id)

    @api.post("/jobs/{job_id}/checkpoints", status_code=202, responses={**NOT_FOUND, **BAD_REQUEST, **CONFLICT})
    def trigger_checkpoint(job_id: str, request: flink.CheckpointTriggerRequest | None = None) -> flink.TriggerResponse:
        """Start a checkpoint now (Flink's ``flink checkpoint``, ``weir checkpoint``); ``GET
        .../checkpoints/{request-id}`` answers its outcome. A job that cannot take one now: 409."""
        body = request if request is not None else flink.CheckpointTriggerRequest()
        checkpoint_id = manager.trigger_checkpoint(weir_job_id(job_id), full=body.full)
        return flink.TriggerResponse(request_id=flink.savepoint_trigger_id(checkpoint_id))

    @api.get(
        "/jobs/{job_id}/checkpoints/{trigger_id}",
        responses={404: {**_ERROR, "description": "Unknown job or checkpoint"}},
        response_model_exclude_none=True,
    )
    def checkpoint_status(job_id: str, trigger_id: str) -> flink.OperationResult:
        """A checkpoint on request's outcome by the ``request-id`` its trigger answered (Flink's shape)."""
        job_id = weir_job_id(job_id)
        checkpoint_id = flink.checkpoint_of_trigger(job_id, trigger_id)
        return flink.checkpoint_status(manager.list_checkpoints(job_id), checkpoint_id)

    @api.patch("/jobs/{job_id}/rescaling", responses={**NOT_FOUND, **BAD_REQUEST, **CONFLICT})
    def rescale(
        job_id: str, parallelism: Annotated[int, Query(ge=1, description="The job's new parallelism")]
    ) -> flink.TriggerResponse:
        """Rescale a running job (Flink's rescaling, ``weir rescale``): it takes an aligned checkpoint,
        its sinks commit it, and it is redeployed at ``parallelism`` from it, exactly once; ``GET
        .../rescaling/{request-id}`` answers the outcome. A job that cannot be rescaled now: 409, untouched."""
        return flink.TriggerResponse(request_id=manager.rescale(weir_job_id(job_id), parallelism))

    @api.get(
        "/jobs/{job_id}/rescaling/{trigger_id}",
        responses={404: {**_ERROR, "description": "Unknown job or rescale"}},
        response_model_exclude_none=True,
    )
    def rescale_status(job_id: str, trigger_id: str) -> flink.OperationResult:
        """A rescale's outcome by the ``request-id`` its trigger answered (Flink's shape)."""
        return flink.rescale_status(manager.rescale_status(weir_job_id(job_id), trigger_id))

    @api.post(
        "/jars/upload",
        responses=BAD_REQUEST,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "required": [jars.JAR_FIELD],
                            "properties": {jars.JAR_FIELD: {"type": "string", "format": "binary"}},
                        }
                    }
                },
            }
        },
    )
    async def upload_jar(request: Request) -> jars.JarUploaded:
        """Upload a job artifact (``weir package``'s zip) in the form field ``jarfile``, as Flink takes a
        jar; refused (400) when it is no Weir artifact. ``POST /jars/{id}/run`` runs it."""
        file_name, data = jars.multipart_file(
            await request.body(), request.headers.get("content-type", ""), jars.JAR_FIELD
        )
        jar = await run_in_threadpool(uploads.upload, file_name, data)
        return jars.JarUploaded(filename=jar.jar_id)

    @api.get("/jars")
    def list_jars(request: Request) -> jars.JarList:
        """The uploaded artifacts, newest first, with their entries (Flink's ``JarListInfo``)."""
        return uploads.listing(str(request.base_url).rstrip("/"))

    @api.delete("/jars/{jar_id}", responses={404: {**_ERROR, "description": "Unknown jar"}})
    def delete_jar(jar_id: str) -> views.Accepted:
        uploads.delete(jar_id)
        return views.Accepted()

    @api.post(
        "/jars/{jar_id}/run",
        responses={404: {**_ERROR, "description": "Unknown jar, or savepoint"}, **BAD_REQUEST, **CONFLICT},
    )
    def run_jar(jar_id: str, request: jars.JarRunRequest | None = None) -> jars.JarRunResponse:
        """Submit the uploaded artifact as ``weir run`` does (the same checks: a job that does not load,
        a missing topic or table: 400); answers the job's id in Flink's form."""
        body = request if request is not None else jars.JarRunRequest()
        job_id = manager.submit(jars.submit_request(uploads.get(jar_id), body))
        return jars.JarRunResponse(job_id=flink_job_id(job_id))

    @api.get("/jars/{jar_id}/plan", responses={404: {**_ERROR, "description": "Unknown jar"}, **BAD_REQUEST})
    def jar_plan(
        jar_id: str,
        entry_class: Annotated[str | None, Query(alias="entry-class")] = None,
        program_arg: Annotated[
            str | None, Query(alias="programArg", description="Comma-separated: -D,key=value,... (Flink's)")
        ] = None,
        parallelism: Annotated[int | None, Query(ge=1)] = None,
    ) -> views.JobPlan:
        """The plan of an uploaded artifact without running it (Flink's jar plan, ``weir info``): its
        ``build(env)`` runs in a child process with a deadline, as for ``run``; a job that does not load: 400."""
        args = None if program_arg is None else [a for a in program_arg.split(",") if a]
        request = jars.JarRunRequest.model_validate(
            {"entryClass": entry_class, "programArgsList": args, "parallelism": parallelism}
        )
        return views.job_plan(jars.plan_of(uploads.get(jar_id), request))

    @api.post("/jars/{jar_id}/plan", responses={404: {**_ERROR, "description": "Unknown jar"}, **BAD_REQUEST})
    def jar_plan_post(jar_id: str, request: jars.JarRunRequest | None = None) -> views.JobPlan:
        """The same, with Flink's ``JarPlanRequestBody`` (``programArgsList``, ``flinkConfiguration``, ...)."""
        body = request if request is not None else jars.JarRunRequest()
        return views.job_plan(jars.plan_of(uploads.get(jar_id), body))

    @api.post("/savepoint-disposal", responses=BAD_REQUEST)
    def dispose(request: flink.DisposalRequest) -> flink.TriggerResponse:
        """Delete a savepoint folder (``flink savepoint -d PATH``); refused (400) for anything else."""
        return flink.TriggerResponse(request_id=disposals.dispose(request.savepoint_path))

    @api.get(
        "/savepoint-disposal/{trigger_id}",
        responses={404: {**_ERROR, "description": "Unknown trigger id"}},
        response_model_exclude_none=True,
    )
    def disposal_status(trigger_id: str) -> flink.OperationResult:
        result = disposals.status(trigger_id)
        if result is None:
            raise HTTPException(404, f"no savepoint disposal {trigger_id} (the last {flink.DISPOSALS_KEPT} are kept)")
        return result

    app.include_router(api)
    # Flink's clients ask under the REST API's version (RestAPIVersion V1): the same routes, documented once
    app.include_router(api, prefix=FLINK_VERSION_PREFIX, include_in_schema=False)

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        page = WEB_DIR / "index.html"
        if not page.is_file():
            raise HTTPException(404, f"the web UI is not installed ({page} is missing)")
        return FileResponse(page)

    app.mount("/web", StaticFiles(directory=WEB_DIR, check_dir=False), name="web")
    _document_errors_as_400(app)
    return app


def _document_errors_as_400(app: FastAPI) -> None:
    """FastAPI documents a malformed request as 422; this API answers 400 (``errors.install``), as
    documented on each route, so the generated 422 responses and their schemas go."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                openapi_version=app.openapi_version,
                description=app.description,
                routes=app.routes,
            )
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

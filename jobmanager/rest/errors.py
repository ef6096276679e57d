"""The one mapping of Weir's errors onto HTTP answers, as ``weir.jobmanager.service`` maps them onto gRPC
status codes: 404 for an unknown job, checkpoint or vertex, 400 for bad input, 409 for an operation
the job's state does not allow, 503 while the JobManager is not ready. Every error answers
``{"errors": ["message"]}`` (Flink's shape)."""

from __future__ import annotations

import traceback
from typing import Final

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from weir.core.errors import (
    AuthenticationError,
    JobDefinitionError,
    NotEnoughSlotsError,
    PermissionDeniedError,
    ServiceUnavailableError,
    UnknownCheckpointError,
    UnknownJobError,
    WeirError,
)
from weir.jobmanager.errors import (
    CheckpointRejectedError,
    ConfigError,
    JobManagerNotReadyError,
    MetricsQueryError,
    RescaleRejectedError,
    ResourceRequirementsError,
    SavepointDisposalError,
    SavepointRejectedError,
    TaskManagerCallError,
    UnknownJarError,
    UnknownRescaleError,
    UnknownVertexError,
)

log = structlog.get_logger("weir.jobmanager")

_STATUS_OF: Final[dict[type[WeirError], int]] = {
    AuthenticationError: 401,
    PermissionDeniedError: 403,
    UnknownJobError: 404,
    UnknownCheckpointError: 404,
    UnknownVertexError: 404,
    UnknownJarError: 404,
    UnknownRescaleError: 404,
    JobDefinitionError: 400,
    ConfigError: 400,
    SavepointDisposalError: 400,
    MetricsQueryError: 400,
    ResourceRequirementsError: 400,
    SavepointRejectedError: 409,
    CheckpointRejectedError: 409,
    RescaleRejectedError: 409,
    JobManagerNotReadyError: 503,
    NotEnoughSlotsError: 503,
    ServiceUnavailableError: 503,
    TaskManagerCallError: 503,  # a TaskManager asked for its thread dump did not answer
}


def http_status(exc: WeirError) -> int:
    """The HTTP status a WeirError answers with (500 for one no rule names: Weir's own fault)."""
    return next((code for kind, code in _STATUS_OF.items() if isinstance(exc, kind)), 500)


def error_response(status: int, *messages: str) -> JSONResponse:
    return JSONResponse({"errors": list(messages)}, status_code=status)


def _validation_messages(exc: RequestValidationError) -> list[str]:
    messages = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()))
        messages.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return messages or ["the request is malformed"]


def install(app: FastAPI) -> None:
    """Answer every error the routes raise, and every malformed request, in the API's shape."""

    @app.exception_handler(WeirError)
    async def weir_error(request: Request, exc: WeirError) -> JSONResponse:
        status = http_status(exc)
        if status == 500:
            log.error("rest_request_failed", path=request.url.path, error=str(exc), fault=exc.fault.value)
        messages = exc.problems if isinstance(exc, ResourceRequirementsError) else (str(exc),)
        response = error_response(status, *messages)
        if status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, *_validation_messages(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "rest_request_failed",
            path=request.url.path,
            error=f"{type(exc).__name__}: {exc}",
            traceback="".join(traceback.format_exception(exc, limit=8)),
        )
        return error_response(500, f"the JobManager failed to answer: {type(exc).__name__}: {exc}")

"""A stand-in REST server for the web UI's browser test: the UI's static files and JSON answers
shaped as the REST contract (docs/ui.md), for the cases a live cluster does not produce on demand
(a subtask without a timeline, a failed checkpoint, exceptions, an unknown job)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tests.integration import polling

WEB_DIR = Path(__file__).resolve().parents[3] / "jobmanager" / "rest" / "web"

T0 = 1_764_000_000_000  # the job's start
NOW = T0 + 754_000
JOB = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
SRC, AGG, DLQ = "src-uid", "agg-uid", "dlq-uid"
CP_TRIGGER = NOW - 4_000


def _subtask(i: int, tm: str, read: int, write: int, busy: float, bp: float, lag: int | None) -> dict[str, Any]:
    return {
        "subtask": i,
        "status": "RUNNING",
        "taskmanager_id": tm,
        "attempt": 1,
        "read-records": read,
        "write-records": write,
        "busyRatio": busy,
        "backPressuredRatio": bp,
        "idleRatio": round(1.0 - busy - bp, 2),
        "watermark": None if lag is None else NOW - lag,
        "watermark_lag": lag,
    }


def job_details(records_scale: int) -> dict[str, Any]:
    """GET /jobs/{id}; ``records_scale`` grows with each request so that rates show."""
    src = [_subtask(i, f"tm-{i + 1}", 0, 50_000 * records_scale + i, 0.2, 0.62, None) for i in range(2)]
    agg = [
        _subtask(i, f"tm-{i + 1}", 33_000 * records_scale, 120 * records_scale, 0.93, 0.0, 1_500 + 100 * i)
        for i in range(3)
    ]
    dlq = [_subtask(0, "tm-3", 7 * records_scale, 7 * records_scale, 0.01, 0.0, None)]
    vertex = lambda vid, name, p, subtasks: {  # noqa: E731
        "id": vid,
        "name": name,
        "parallelism": p,
        "status": "RUNNING",
        "tasks": {"CREATED": 0, "DEPLOYING": 0, "RUNNING": p, "FINISHED": 0, "CANCELED": 0, "FAILED": 0},
        "metrics": {
            "read-records": sum(t["read-records"] for t in subtasks),
            "write-records": sum(t["write-records"] for t in subtasks),
        },
        "subtasks": subtasks,
    }
    return {
        "jid": JOB,
        "name": "keyed-aggregation",
        "state": "RUNNING",
        "start-time": T0,
        "end-time": -1,
        "duration": NOW - T0,
        "now": NOW + 2_000 * records_scale,
        "parallelism": 3,
        "restarts": 1,
        "last_completed_checkpoint": 41,
        "failure": {
            "type": "TaskManagerLost",
            "message": "taskmanager tm-3 missed 5 heartbeats",
            "fault": "EXTERNAL",
            "retriable": True,
        },
        "vertices": [
            vertex(SRC, "kafka-source -> parse", 2, src),
            vertex(AGG, "window-aggregate -> kafka-sink", 3, agg),
            vertex(DLQ, "dlq-sink", 1, dlq),
        ],
        "status-counts": {"CREATED": 0, "DEPLOYING": 0, "RUNNING": 3, "FINISHED": 0, "CANCELED": 0, "FAILED": 0},
    }


PLAN = {
    "plan": {
        "jid": JOB,
        "name": "keyed-aggregation",
        "nodes": [
            {
                "id": SRC,
                "parallelism": 2,
                "operator": "kafka-source",
                "description": "kafka-source -> parse",
                "operators": [{"uid": "kafka-source", "name": "kafka-source"}, {"uid": "parse", "name": "parse"}],
                "inputs": [],
            },
            {
                "id": AGG,
                "parallelism": 3,
                "operator": "window-aggregate",
                "description": "window-aggregate -> kafka-sink",
                "operators": [
                    {"uid": "window-aggregate", "name": "window-aggregate"},
                    {"uid": "kafka-sink", "name": "kafka-sink"},
                ],
                "inputs": [{"num": 0, "id": SRC, "ship_strategy": "HASH", "side_output": None}],
            },
            {
                "id": DLQ,
                "parallelism": 1,
                "operator": "dlq-sink",
                "description": "dlq-sink",
                "operators": [{"uid": "dlq-sink", "name": "dlq-sink"}],
                "inputs": [{"num": 0, "id": SRC, "ship_strategy": "REBALANCE", "side_output": "malformed"}],
            },
        ],
    }
}


def _checkpoint(
    cid: int, status: str, trigger: int, duration: int | None, failure: str | None = None
) -> dict[str, Any]:
    return {
        "id": cid,
        "status": status,
        "is_savepoint": False,
        "checkpoint_type": "CHECKPOINT",
        "unaligned": False,
        "trigger_timestamp": trigger,
        "latest_ack_timestamp": None if duration is None else trigger + duration,
        "end_to_end_duration": duration,
        "state_size": 3_456_789 + cid,
        "num_subtasks": 6,
        "num_acknowledged_subtasks": 6 if status == "COMPLETED" else 4,
        "failure_message": failure,
        "external_path": f"s3://weir/checkpoints/{JOB}/chk-{cid}" if status == "COMPLETED" else None,
    }


HISTORY = [
    _checkpoint(
        42, "FAILED", CP_TRIGGER + 2_000, None, "checkpoint 42 expired after 10 s before all subtasks acknowledged"
    ),
    _checkpoint(41, "COMPLETED", CP_TRIGGER, 212),
    _checkpoint(40, "COMPLETED", CP_TRIGGER - 2_000, 180),
]
CHECKPOINTS = {
    "counts": {"restored": 1, "total": 42, "in_progress": 0, "completed": 40, "failed": 2},
    "latest": {
        "completed": HISTORY[1],
        "savepoint": None,
        "failed": HISTORY[0],
        "restored": {"id": 7, "restore_timestamp": T0 + 1_000, "is_savepoint": False},
    },
    "history": HISTORY,
}


def _timeline(
    first: int, channels: list[tuple[int, str, int, int]], align: int, sync: int, upload: int, ack: int
) -> dict[str, Any]:
    t = CP_TRIGGER
    return {
        "trigger_timestamp": t,
        "first_barrier_timestamp": t + first,
        "channels": [
            {"channel": c, "upstream_vertex": v, "upstream_subtask": u, "barrier_timestamp": t + at}
            for c, v, u, at in channels
        ],
        "alignment_end_timestamp": t + align,
        "sync_end_timestamp": t + sync,
        "async_end_timestamp": t + upload,
        "ack_timestamp": t + ack,
    }


def _detail_subtask(vid: str, i: int, timeline: dict[str, Any] | None, **durations: int) -> dict[str, Any]:
    return {
        "vertex_id": vid,
        "subtask": i,
        "status": "COMPLETED",
        "ack_timestamp": CP_TRIGGER + durations["ack"],
        "alignment_duration": durations["alignment"],
        "start_delay": durations["start"],
        "sync_duration": durations["sync"],
        "async_duration": durations["async_"],
        "state_size": 100_000 * (i + 1),
        "unaligned": False,
        "inflight_size": 0,
        "timeline": timeline,
    }


DETAILS_41 = {
    **HISTORY[1],
    "subtasks": [
        _detail_subtask(SRC, 0, _timeline(1, [], 1, 4, 30, 33), start=1, alignment=0, sync=3, async_=26, ack=33),
        _detail_subtask(SRC, 1, _timeline(2, [], 2, 5, 41, 44), start=2, alignment=0, sync=3, async_=36, ack=44),
        # agg 0: channel 1 (from src subtask 1) is the slowest channel
        _detail_subtask(
            AGG,
            0,
            _timeline(12, [(0, SRC, 0, 12), (1, SRC, 1, 95)], 95, 99, 140, 144),
            start=12,
            alignment=83,
            sync=4,
            async_=41,
            ack=144,
        ),
        # agg 1: the slowest upload
        _detail_subtask(
            AGG,
            1,
            _timeline(14, [(0, SRC, 0, 14), (1, SRC, 1, 30)], 30, 33, 205, 210),
            start=14,
            alignment=16,
            sync=3,
            async_=172,
            ack=210,
        ),
        # agg 2: no timeline recorded
        _detail_subtask(AGG, 2, None, start=13, alignment=20, sync=4, async_=50, ack=92),
        _detail_subtask(
            DLQ,
            0,
            _timeline(10, [(0, SRC, 0, 10), (1, SRC, 1, 18)], 18, 19, 21, 24),
            start=10,
            alignment=8,
            sync=1,
            async_=2,
            ack=24,
        ),
    ],
}

EXCEPTIONS = {
    "exceptionHistory": {
        "entries": [
            {
                "exceptionName": "TaskManagerLost",
                "message": "taskmanager tm-3 missed 5 heartbeats",
                "fault": "EXTERNAL",
                "retriable": True,
                "timestamp": T0 + 300_000,
                "taskName": None,
                "vertex_id": None,
                "subtask": None,
                "attempt": 1,
                "taskmanager_id": "tm-3",
            },
            {
                "exceptionName": "ValueError",
                "message": "invalid literal for int() with base 10: 'x'\n  in parse",
                "fault": "USER",
                "retriable": True,
                "timestamp": T0 + 100_000,
                "taskName": "kafka-source -> parse",
                "vertex_id": SRC,
                "subtask": 1,
                "attempt": 0,
                "taskmanager_id": "tm-2",
            },
        ],
        "truncated": False,
    }
}

TASKMANAGERS = {
    "taskmanagers": [
        {
            "id": f"tm-{n}",
            "path": f"127.0.0.1:{16200 + n}",
            "slotsNumber": 2,
            "freeSlots": 0 if n < 3 else 1,
            "timeSinceLastHeartbeat": 400 + n,
            "alive": True,
            "tasks": [{"job_id": JOB, "vertex_id": AGG, "subtask": n - 1, "attempt": 1, "status": "RUNNING"}],
        }
        for n in (1, 2, 3)
    ]
}


def _errors(status: int, message: str) -> JSONResponse:
    return JSONResponse({"errors": [message]}, status_code=status)


def create_app(token: str | None = None) -> Starlette:
    """``token``: every API route answers 401 without ``Authorization: Bearer <token>``, as the
    JobManager's does when it has one (the page and its assets stay open)."""
    counter = {"n": 0}

    def job(request: Request) -> JSONResponse:
        if request.path_params["jid"] != JOB:
            return _errors(404, f"job {request.path_params['jid']} not found")
        counter["n"] += 1
        return JSONResponse(job_details(counter["n"]))

    def only_job(body: dict[str, Any]):
        def handler(request: Request) -> JSONResponse:
            if request.path_params["jid"] != JOB:
                return _errors(404, f"job {request.path_params['jid']} not found")
            return JSONResponse(body)

        return handler

    def details(request: Request) -> JSONResponse:
        if request.path_params["jid"] != JOB:
            return _errors(404, f"job {request.path_params['jid']} not found")
        if request.path_params["cid"] != "41":
            return _errors(404, f"checkpoint {request.path_params['cid']} of job {JOB} not found")
        return JSONResponse(DETAILS_41)

    routes = [
        Route("/", lambda _: FileResponse(WEB_DIR / "index.html")),
        Mount("/web", app=StaticFiles(directory=WEB_DIR)),
        Route(
            "/overview",
            lambda _: JSONResponse(
                {
                    "taskmanagers": 3,
                    "slots-total": 6,
                    "slots-available": 1,
                    "jobs-running": 1,
                    "jobs-finished": 0,
                    "jobs-cancelled": 0,
                    "jobs-failed": 0,
                    "weir-version": "0.1.0",
                }
            ),
        ),
        Route(
            "/jobs",
            lambda _: JSONResponse(
                {
                    "jobs": [
                        {
                            "id": JOB,
                            "name": "keyed-aggregation",
                            "status": "RUNNING",
                            "start-time": T0,
                            "parallelism": 3,
                            "restarts": 1,
                        }
                    ]
                }
            ),
        ),
        Route("/taskmanagers", lambda _: JSONResponse(TASKMANAGERS)),
        Route("/jobs/{jid}", job),
        Route("/jobs/{jid}/plan", only_job(PLAN)),
        Route("/jobs/{jid}/checkpoints", only_job(CHECKPOINTS)),
        Route("/jobs/{jid}/checkpoints/details/{cid}", details),
        Route("/jobs/{jid}/exceptions", only_job(EXCEPTIONS)),
    ]
    if token is None:
        return Starlette(routes=routes)

    async def require_token(request: Request, call_next: Any) -> Any:
        if request.url.path == "/" or request.url.path.startswith("/web/"):
            return await call_next(request)
        if request.headers.get("authorization") != f"Bearer {token}":
            response = _errors(401, "this cluster needs its bearer token (WEIR_AUTH_TOKEN)")
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return await call_next(request)

    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=require_token)])


@contextmanager
def serve(token: str | None = None) -> Iterator[str]:
    """The harness on 127.0.0.1 (a free port) in a thread; answers its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(token), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="ui-harness", daemon=True)
    thread.start()
    polling.settle(10.0, lambda: server.started or not thread.is_alive(), bool, 0.05)
    if not server.started:
        raise RuntimeError(f"the UI harness did not start on 127.0.0.1:{port}")
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

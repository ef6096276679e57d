"""Structured logs (structlog): JSON lines for machines, console rendering on a terminal."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, assert_never

import structlog

from weir.core.config import Diagnostics, LogFormat

_process: str | None = None
"""This process's name (``jobmanager``, ``taskmanager-2``), set by :func:`configure`. A module value,
not a context variable: context variables do not reach the task, reporter and gRPC threads."""


def process_name() -> str | None:
    """The name every event of this process carries, once :func:`configure` ran."""
    return _process


def add_process(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: ``process=<name>`` on every event, from whichever thread logs it."""
    if _process is not None:
        event_dict.setdefault("process", _process)
    return event_dict


def configure(process: str, level: str | None = None) -> None:
    """Configure structlog once per process; every event carries the process name."""
    global _process
    _process = process
    settings = Diagnostics.from_env()
    match settings.log_format:
        case LogFormat.JSON:
            json_output = True
        case LogFormat.CONSOLE:
            json_output = False
        case None:
            json_output = not sys.stderr.isatty()
        case unreachable:
            assert_never(unreachable)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_process,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelName((level or settings.log_level).upper())
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Also in the main thread's context, where weir.core.crashpoints.process_name reads it.
    structlog.contextvars.bind_contextvars(process=process)
